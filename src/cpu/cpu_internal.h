/*
 * Shared helpers of the CPU backend: portable fp16/bf16 conversions, the chunked row loaders and
 * stores, and the OpenMP team size. Everything here is static inline so that each kernel file
 * gets its own copy that the compiler can inline into its inner loops.
 */
#ifndef FNORM_CPU_INTERNAL_H
#define FNORM_CPU_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* x86-64 with GCC or Clang: the kernels are also built for AVX2 and picked at run time. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define FNORM_CPU_X86_DISPATCH 1
static inline int fnorm_cpu_has_avx2(void) {
  __builtin_cpu_init(); /* idempotent; needed if this ever runs before constructors */
  return __builtin_cpu_supports("avx2");
}
#else
#define FNORM_CPU_X86_DISPATCH 0
#endif

/* Rows are streamed in chunks of this many elements: small enough that a float copy of one chunk
 * of every operand fits on the stack and in L1, large enough that per-chunk overhead vanishes.
 * Chunk boundaries depend only on cols, so results do not depend on the thread count. */
#define FNORM_CPU_CHUNK 1024

/* Below this many elements in total a parallel region costs more than it saves. */
#define FNORM_CPU_MIN_PARALLEL_ELEMENTS 32768

/* ---------------------------------------------------------------------------------------------
 * Bit casts (memcpy is the portable, aliasing-safe way; compilers turn it into a move).
 * ------------------------------------------------------------------------------------------- */
static inline float fnorm_cpu_bits_to_f32(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

static inline uint32_t fnorm_cpu_f32_to_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

/* ---------------------------------------------------------------------------------------------
 * bfloat16: the top half of a binary32.
 * ------------------------------------------------------------------------------------------- */
static inline float fnorm_cpu_bf16_to_f32(uint16_t h) {
  return fnorm_cpu_bits_to_f32((uint32_t)h << 16);
}

/* Round to nearest even by adding 0x7fff plus the lowest kept bit; a carry out of the mantissa
 * correctly bumps the exponent, and the largest finite values round up to Inf. NaN is kept NaN
 * (made quiet) because the rounding add could otherwise carry it into Inf. */
static inline uint16_t fnorm_cpu_f32_to_bf16(float value) {
  uint32_t bits = fnorm_cpu_f32_to_bits(value);
  uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return (uint16_t)(((bits & 0x7fffffffu) > 0x7f800000u) ? quiet_nan : rounded);
}

/* ---------------------------------------------------------------------------------------------
 * IEEE binary16.
 * ------------------------------------------------------------------------------------------- */
/* Branch-free selects so that the loop over a chunk vectorizes. Subnormal halves are converted
 * through an exact integer-to-float conversion rather than through an fp32 denormal, so the
 * result stays right even when the caller runs with denormals-are-zero. */
static inline float fnorm_cpu_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t magnitude = h & 0x7fffu;
  uint32_t normal = (magnitude << 13) + 0x38000000u;  /* rebias the exponent: 127 - 15 */
  uint32_t inf_nan = (magnitude << 13) | 0x7f800000u; /* keeps the NaN payload, quiet bit too */
  float subnormal = (float)magnitude * 0x1p-24f;      /* exact: magnitude < 2^10 here */
  uint32_t bits = magnitude >= 0x7c00u ? inf_nan : normal;
  bits = magnitude < 0x0400u ? fnorm_cpu_f32_to_bits(subnormal) : bits;
  return fnorm_cpu_bits_to_f32(bits | sign);
}

/* Round to nearest even. 65520 (halfway between 65504, the largest half, and 65536) and above
 * round to Inf; below 2^-14 the result is subnormal and is rounded with integer arithmetic. */
static inline uint16_t fnorm_cpu_f32_to_f16(float value) {
  uint32_t bits = fnorm_cpu_f32_to_bits(value);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t magnitude = bits & 0x7fffffffu;
  uint32_t result;
  if (magnitude > 0x7f800000u) {
    result = 0x7e00u | ((magnitude >> 13) & 0x03ffu); /* NaN: quiet, top of the payload kept */
  } else if (magnitude >= 0x477ff000u) {
    result = 0x7c00u; /* Inf, or finite and rounds past the largest half */
  } else if (magnitude >= 0x38800000u) {
    /* Normal half: rebias the exponent, then round away the low 13 mantissa bits. */
    result = (magnitude - 0x38000000u + 0x0fffu + ((magnitude >> 13) & 1u)) >> 13;
  } else {
    /* Subnormal half or zero: the value in units of 2^-24 is mantissa >> shift. */
    uint32_t shift = 126u - (magnitude >> 23);
    if (shift > 24u) {
      result = 0; /* below 2^-25: rounds to zero (2^-25 itself ties to the even zero) */
    } else {
      uint32_t mantissa = (magnitude & 0x007fffffu) | 0x00800000u;
      uint32_t remainder = mantissa & ((1u << shift) - 1u);
      uint32_t halfway = 1u << (shift - 1u);
      result = mantissa >> shift;
      if (remainder > halfway || (remainder == halfway && (result & 1u))) {
        result += 1u; /* may reach 0x400, the smallest normal: still the right encoding */
      }
    }
  }
  return (uint16_t)(sign | result);
}

/* ---------------------------------------------------------------------------------------------
 * Chunk loads and stores. `base` is a row (or a parameter vector) of `dtype`; elements
 * [start, start + count) are read or written, count <= FNORM_CPU_CHUNK.
 * ------------------------------------------------------------------------------------------- */
/* Returns the chunk as floats: fp32 data is used in place, other dtypes are converted into
 * `buffer`. */
static inline const float *fnorm_cpu_load(fnorm_dtype dtype, const void *base, int64_t start,
                                          int count, float *buffer) {
  switch (dtype) {
  case FNORM_DTYPE_F32:
    return (const float *)base + start;
  case FNORM_DTYPE_F16: {
    const uint16_t *source = (const uint16_t *)base + start;
    for (int i = 0; i < count; i++) {
      buffer[i] = fnorm_cpu_f16_to_f32(source[i]);
    }
    return buffer;
  }
  case FNORM_DTYPE_BF16: {
    const uint16_t *source = (const uint16_t *)base + start;
    for (int i = 0; i < count; i++) {
      buffer[i] = fnorm_cpu_bf16_to_f32(source[i]);
    }
    return buffer;
  }
  case FNORM_DTYPE_SAME:
    break;
  }
  /* Unreachable: the backends reject other dtypes before any load. Zeros keep it harmless. */
  memset(buffer, 0, (size_t)count * sizeof *buffer);
  return buffer;
}

/* Like fnorm_cpu_load, for an optional parameter vector: NULL reads as `fill` (1 for gamma, 0 for
 * beta), which the caller has written into `fill_buffer` once. */
static inline const float *fnorm_cpu_load_param(fnorm_dtype dtype, const void *base, int64_t start,
                                                int count, float *buffer,
                                                const float *fill_buffer) {
  return base != NULL ? fnorm_cpu_load(dtype, base, start, count, buffer) : fill_buffer;
}

static inline void fnorm_cpu_store(fnorm_dtype dtype, void *base, int64_t start, int count,
                                   const float *values) {
  switch (dtype) {
  case FNORM_DTYPE_F32:
    memcpy((float *)base + start, values, (size_t)count * sizeof *values);
    return;
  case FNORM_DTYPE_F16: {
    uint16_t *target = (uint16_t *)base + start;
    for (int i = 0; i < count; i++) {
      target[i] = fnorm_cpu_f32_to_f16(values[i]);
    }
    return;
  }
  case FNORM_DTYPE_BF16: {
    uint16_t *target = (uint16_t *)base + start;
    for (int i = 0; i < count; i++) {
      target[i] = fnorm_cpu_f32_to_bf16(values[i]);
    }
    return;
  }
  case FNORM_DTYPE_SAME:
    break;
  }
  /* Unreachable (dtypes are checked first); writing nothing is the safe choice. */
}

/* Whether the backend has kernels for this dtype (x/y/dy/dx or parameters). */
static inline int fnorm_cpu_dtype_supported(fnorm_dtype dtype) {
  switch (dtype) {
  case FNORM_DTYPE_F32:
  case FNORM_DTYPE_F16:
  case FNORM_DTYPE_BF16:
    return 1;
  case FNORM_DTYPE_SAME:
    break;
  }
  return 0;
}

static inline size_t fnorm_cpu_dtype_bytes(fnorm_dtype dtype) {
  return dtype == FNORM_DTYPE_F32 ? 4u : 2u;
}

/* Row `row` of a strided matrix. The front end has checked that the offset fits. */
static inline const void *fnorm_cpu_row(const void *base, fnorm_dtype dtype, int64_t stride,
                                        int64_t row) {
  return (const char *)base + (size_t)(row * stride) * fnorm_cpu_dtype_bytes(dtype);
}

static inline void *fnorm_cpu_row_out(void *base, fnorm_dtype dtype, int64_t stride, int64_t row) {
  return (char *)base + (size_t)(row * stride) * fnorm_cpu_dtype_bytes(dtype);
}

static inline int fnorm_cpu_chunk_length(int64_t cols, int64_t start) {
  int64_t left = cols - start;
  return left < FNORM_CPU_CHUNK ? (int)left : FNORM_CPU_CHUNK;
}

/* The OpenMP team for `work_items` independent items of `elements_per_item` elements each:
 * the OpenMP default, capped by desc.cpu_threads and by the number of items, and 1 for small
 * problems. Results never depend on it. */
static inline int fnorm_cpu_team_size(int cpu_threads, int64_t work_items,
                                      int64_t elements_per_item) {
#ifdef _OPENMP
  int team = omp_get_max_threads();
  if (cpu_threads > 0 && cpu_threads < team) {
    team = cpu_threads;
  }
  if (work_items < team) {
    team = (int)work_items;
  }
  if (work_items <= FNORM_CPU_MIN_PARALLEL_ELEMENTS / elements_per_item) {
    team = 1;
  }
  return team < 1 ? 1 : team;
#else
  (void)cpu_threads;
  (void)work_items;
  (void)elements_per_item;
  return 1;
#endif
}

/* The contiguous share [*first, *end) of `count` items that part `part` of `parts` takes
 * (sizes differ by at most one; no product that could overflow). */
static inline void fnorm_cpu_split(int64_t count, int64_t parts, int64_t part, int64_t *first,
                                   int64_t *end) {
  int64_t base = count / parts;
  int64_t extra = count % parts;
  *first = part * base + (part < extra ? part : extra);
  *end = *first + base + (part < extra ? 1 : 0);
}

#endif /* FNORM_CPU_INTERNAL_H */
