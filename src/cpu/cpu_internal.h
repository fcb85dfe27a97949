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

/* No multiply-add contraction in this backend: the portable and the SIMD variants must round
 * every product and every sum the same way to give bitwise the same results. (GCC does not
 * contract in ISO C mode, which the build uses; Clang needs to be told.) */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* x86 with GCC or Clang: the kernels are also built for AVX2 + F16C and picked at run time.
 * Defining FNORM_CPU_NO_SIMD builds the portable kernels only (to test them against the SIMD
 * ones: both give bitwise the same results). */
#if !defined(FNORM_CPU_NO_SIMD) && (defined(__x86_64__) || defined(__i386__)) &&                   \
    (defined(__GNUC__) || defined(__clang__))
#define FNORM_CPU_X86_DISPATCH 1
#include <cpuid.h>
#include <immintrin.h>
/* Target attribute of the AVX2 kernels. FMA is left out on purpose (see FP_CONTRACT above). */
#define FNORM_CPU_AVX2_TARGET __attribute__((target("avx2,f16c")))
static inline int fnorm_cpu_has_avx2(void) {
  __builtin_cpu_init(); /* idempotent; needed if this ever runs before constructors */
  if (!__builtin_cpu_supports("avx2")) {
    return 0; /* also false when the OS does not save the AVX state */
  }
#if defined(__clang__)
  /* Clang's __builtin_cpu_supports does not know "f16c": ask CPUID (leaf 1, ECX bit 29). */
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
#else
  return __builtin_cpu_supports("f16c");
#endif
}
#else
#define FNORM_CPU_X86_DISPATCH 0
#endif

/* Whether to run the SIMD kernels (asked once per call, before any parallel region). */
static inline int fnorm_cpu_simd(void) {
#if FNORM_CPU_X86_DISPATCH
  return fnorm_cpu_has_avx2() != 0;
#else
  return 0;
#endif
}

/* Outputs of at least this many bytes in total are written with non-temporal (streaming)
 * stores where the SIMD kernels can: they would not stay in the caches anyway, and streaming
 * saves reading every output line before it is overwritten. Smaller outputs stay cached for
 * whatever reads them next. */
#ifndef FNORM_CPU_STREAM_BYTES
#define FNORM_CPU_STREAM_BYTES ((uint64_t)8 << 20)
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
  uint32_t normal = (magnitude << 13) + 0x38000000u; /* rebias the exponent: 127 - 15 */
  /* Inf stays Inf; a NaN keeps its payload and is made quiet, as the F16C conversion does. */
  uint32_t inf_nan = (magnitude << 13) | (magnitude > 0x7c00u ? 0x7fc00000u : 0x7f800000u);
  float subnormal = (float)magnitude * 0x1p-24f; /* exact: magnitude < 2^10 here */
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

#if FNORM_CPU_X86_DISPATCH
/* ---------------------------------------------------------------------------------------------
 * AVX2 + F16C forms of the chunk loads and stores. They give bitwise the same values as the
 * portable ones above (F16C converts exactly as fnorm_cpu_f16_to_f32 / fnorm_cpu_f32_to_f16 do,
 * round to nearest even, NaN made quiet; the bf16 rounding is the same integer arithmetic).
 * ------------------------------------------------------------------------------------------- */
/* fnorm_cpu_f32_to_bf16 on each lane, the result in the low half of each 32-bit lane. */
FNORM_CPU_AVX2_TARGET static inline __m256i fnorm_cpu_avx2_bf16_bits(__m256 value) {
  const __m256i bits = _mm256_castps_si256(value);
  const __m256i high = _mm256_srli_epi32(bits, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(value, value, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

/* 8 floats to 8 bf16. Every lane is <= 0xffff, so the unsigned saturation of the pack never
 * triggers. */
FNORM_CPU_AVX2_TARGET static inline __m128i fnorm_cpu_avx2_to_bf16(__m256 value) {
  const __m256i result = fnorm_cpu_avx2_bf16_bits(value);
  return _mm_packus_epi32(_mm256_castsi256_si128(result), _mm256_extracti128_si256(result, 1));
}

/* 16 floats (v0 then v1) to 16 bf16. */
FNORM_CPU_AVX2_TARGET static inline __m256i fnorm_cpu_avx2_to_bf16_16(__m256 v0, __m256 v1) {
  const __m256i packed =
      _mm256_packus_epi32(fnorm_cpu_avx2_bf16_bits(v0), fnorm_cpu_avx2_bf16_bits(v1));
  return _mm256_permute4x64_epi64(packed, 0xd8); /* the pack works within 128-bit halves */
}

/* 16 floats (v0 then v1) to 16 fp16, round to nearest even. */
FNORM_CPU_AVX2_TARGET static inline __m256i fnorm_cpu_avx2_to_f16_16(__m256 v0, __m256 v1) {
  return _mm256_insertf128_si256(
      _mm256_castsi128_si256(_mm256_cvtps_ph(v0, _MM_FROUND_TO_NEAREST_INT)),
      _mm256_cvtps_ph(v1, _MM_FROUND_TO_NEAREST_INT), 1);
}

/* 8 bf16 to 8 floats. */
FNORM_CPU_AVX2_TARGET static inline __m256 fnorm_cpu_avx2_from_bf16(const uint16_t *source) {
  const __m128i half = _mm_loadu_si128((const __m128i *)(const void *)source);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

/* 8 fp16 to 8 floats. */
FNORM_CPU_AVX2_TARGET static inline __m256 fnorm_cpu_avx2_from_f16(const uint16_t *source) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)source));
}

/* As fnorm_cpu_load. */
FNORM_CPU_AVX2_TARGET static inline const float *
fnorm_cpu_load_avx2(fnorm_dtype dtype, const void *base, int64_t start, int count, float *buffer) {
  const uint16_t *source = (const uint16_t *)base + start;
  int i = 0;
  switch (dtype) {
  case FNORM_DTYPE_F32:
    return (const float *)base + start;
  case FNORM_DTYPE_F16:
    for (; i + 8 <= count; i += 8) {
      _mm256_storeu_ps(buffer + i, fnorm_cpu_avx2_from_f16(source + i));
    }
    for (; i < count; i++) {
      buffer[i] = fnorm_cpu_f16_to_f32(source[i]);
    }
    return buffer;
  case FNORM_DTYPE_BF16:
    for (; i + 8 <= count; i += 8) {
      _mm256_storeu_ps(buffer + i, fnorm_cpu_avx2_from_bf16(source + i));
    }
    for (; i < count; i++) {
      buffer[i] = fnorm_cpu_bf16_to_f32(source[i]);
    }
    return buffer;
  case FNORM_DTYPE_SAME:
    break;
  }
  return fnorm_cpu_load(dtype, base, start, count, buffer);
}

FNORM_CPU_AVX2_TARGET static inline const float *
fnorm_cpu_load_param_avx2(fnorm_dtype dtype, const void *base, int64_t start, int count,
                          float *buffer, const float *fill_buffer) {
  return base != NULL ? fnorm_cpu_load_avx2(dtype, base, start, count, buffer) : fill_buffer;
}

/* As fnorm_cpu_store. With `stream`, the aligned body is written with non-temporal stores (the
 * caller ends its work with _mm_sfence); the values written are the same either way. */
FNORM_CPU_AVX2_TARGET static inline void fnorm_cpu_store_avx2(fnorm_dtype dtype, void *base,
                                                              int64_t start, int count,
                                                              const float *values, int stream) {
  int i = 0;
  if (dtype == FNORM_DTYPE_F32) {
    float *target = (float *)base + start;
    if (!stream) {
      memcpy(target, values, (size_t)count * sizeof *values);
      return;
    }
    for (; i < count && ((uintptr_t)(target + i) & 31u) != 0; i++) {
      target[i] = values[i];
    }
    for (; i + 8 <= count; i += 8) {
      _mm256_stream_ps(target + i, _mm256_loadu_ps(values + i));
    }
    for (; i < count; i++) {
      target[i] = values[i];
    }
    return;
  }
  if (dtype != FNORM_DTYPE_F16 && dtype != FNORM_DTYPE_BF16) {
    return; /* unreachable, as in fnorm_cpu_store */
  }
  uint16_t *target = (uint16_t *)base + start;
  const int bf16 = dtype == FNORM_DTYPE_BF16;
  if (stream) {
    for (; i < count && ((uintptr_t)(target + i) & 15u) != 0; i++) {
      target[i] = bf16 ? fnorm_cpu_f32_to_bf16(values[i]) : fnorm_cpu_f32_to_f16(values[i]);
    }
  }
  for (; i + 8 <= count; i += 8) {
    const __m256 value = _mm256_loadu_ps(values + i);
    const __m128i half =
        bf16 ? fnorm_cpu_avx2_to_bf16(value) : _mm256_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT);
    if (stream) {
      _mm_stream_si128((__m128i *)(void *)(target + i), half);
    } else {
      _mm_storeu_si128((__m128i *)(void *)(target + i), half);
    }
  }
  for (; i < count; i++) {
    target[i] = bf16 ? fnorm_cpu_f32_to_bf16(values[i]) : fnorm_cpu_f32_to_f16(values[i]);
  }
}
#endif /* FNORM_CPU_X86_DISPATCH */

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

/* Asks for bytes [offset, offset + bytes) of base to be brought into L2 (L1 holds the row
 * being finished): a hint, which the portable form does without. The row loops call it while
 * a pass reads only cached data, when the hardware prefetchers would otherwise idle. */
static inline void prefetch_baseline(const void *base, int64_t offset, size_t bytes) {
  (void)base;
  (void)offset;
  (void)bytes;
}

#if FNORM_CPU_X86_DISPATCH
FNORM_CPU_AVX2_TARGET static inline void prefetch_avx2(const void *base, int64_t offset,
                                                       size_t bytes) {
  const char *first = (const char *)base + offset;
  for (size_t k = 0; k < bytes; k += 64) {
    _mm_prefetch(first + k, _MM_HINT_T1);
  }
}
#endif

#endif /* FNORM_CPU_INTERNAL_H */
