/*
 * CPU forward: LayerNorm and RMSNorm over each row, rows split across an OpenMP team.
 *
 * Each row is streamed in chunks (no scratch beyond a few stack buffers, whatever the row
 * length): LayerNorm reads the row three times (mean, then the sum of squared deviations from
 * that mean, then y); RMSNorm twice (mean square, then y). The row passes after the first hit
 * L1/L2 for all but enormous rows. The mean is accumulated in double; the squared deviations
 * from that accurate mean in fp32 blocks summed in double (sum_squares_baseline), with a double
 * fallback for rows beyond fp32's range, which keeps the two-pass variance accurate even for
 * rows far from zero mean; y is computed in fp32 from these statistics
 * (normalize_store_baseline). Output of large problems is written with streaming stores.
 */
#include <float.h>
#include <math.h>

#include "cpu_internal.h"

/* Rows of at most this many elements (and their gamma and beta) are held as fp32 copies on the
 * stack: 3 * 16 KiB, which stays in L1/L2 and is modest for any thread's stack. */
#define FNORM_CPU_RESIDENT_COLS 4096

/* Independent accumulators in the row sums (a power of two). */
#define FNORM_CPU_LANES 16

/* The squared deviations are summed in fp32 over blocks of this many elements (a multiple of
 * FNORM_CPU_LANES), each block's sum then in double. */
#define FNORM_CPU_SQUARE_BLOCK 64

/* Rows shorter than this sum their squares in double: with few fp32 blocks the blocks' roundings
 * do not average out, and rstd could be off by more than an ulp. */
#define FNORM_CPU_SQUARES_MIN_COLS 1024

/* Below this mean square (per element) the fp32 squares may have lost bits to underflow, and the
 * row's squares are summed again in double. */
#define FNORM_CPU_SQUARES_MIN 0x1p-100

/* Stack buffers of one thread. */
typedef struct forward_buffers {
  float x[FNORM_CPU_RESIDENT_COLS];     /* the row as fp32; long rows: one chunk */
  float gamma[FNORM_CPU_RESIDENT_COLS]; /* gamma as fp32 (1 when NULL); long rows: one chunk */
  float beta[FNORM_CPU_RESIDENT_COLS];  /* beta as fp32 (0 when NULL); long rows: one chunk */
  float y[FNORM_CPU_CHUNK];
  float ones[FNORM_CPU_CHUNK];  /* stands in for a NULL gamma */
  float zeros[FNORM_CPU_CHUNK]; /* stands in for a NULL beta */
} forward_buffers;

/* ---------------------------------------------------------------------------------------------
 * Chunk kernels. Each exists in a portable form and, on x86, in an AVX2 form that does the same
 * operations in the same order (the vector lanes are the portable form's accumulators), so both
 * give bitwise the same results.
 * ------------------------------------------------------------------------------------------- */
/* Adds the accumulators pairwise in a fixed order. */
static double add_lanes(double *acc) {
  for (int width = FNORM_CPU_LANES / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; k++) {
      acc[k] += acc[k + width];
    }
  }
  return acc[0];
}

static float add_lanes_f32(float *acc) {
  for (int width = FNORM_CPU_LANES / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; k++) {
      acc[k] += acc[k + width];
    }
  }
  return acc[0];
}

/* Sum of v[0..n) in double. Sixteen independent accumulators hide the latency of the adds
 * without reassociating anything; the order is fixed, so the result is reproducible. */
static double sum_chunk(const float *restrict v, int n) {
  double acc[FNORM_CPU_LANES] = {0};
  int i = 0;
  for (; i + FNORM_CPU_LANES <= n; i += FNORM_CPU_LANES) {
    for (int k = 0; k < FNORM_CPU_LANES; k++) {
      acc[k] += (double)v[i + k];
    }
  }
  double tail = 0.0;
  for (; i < n; i++) {
    tail += (double)v[i];
  }
  return add_lanes(acc) + tail;
}

/* Sum of (v[i] - center)^2, all in double: the fallback for rows whose squares leave the range
 * of fp32 (see forward_rows). */
static double sum_squares_double(const float *restrict v, int n, double center) {
  double acc[FNORM_CPU_LANES] = {0};
  int i = 0;
  for (; i + FNORM_CPU_LANES <= n; i += FNORM_CPU_LANES) {
    for (int k = 0; k < FNORM_CPU_LANES; k++) {
      double d = (double)v[i + k] - center;
      acc[k] += d * d;
    }
  }
  double tail = 0.0;
  for (; i < n; i++) {
    double d = (double)v[i] - center;
    tail += d * d;
  }
  return add_lanes(acc) + tail;
}

/* Sum of v[0..n) in fp32 blocks of FNORM_CPU_SQUARE_BLOCK elements (sixteen lanes, added
 * pairwise), each block's sum folded into a double; the last n % FNORM_CPU_SQUARE_BLOCK elements
 * in double. Far cheaper than double per element; its error (a few fp32 roundings of each block's
 * sum) is removed by the correction that the squares pass measures (see forward_rows). */
static double sum_blocks(const float *restrict v, int n) {
  double total = 0.0;
  int i = 0;
  for (; i + FNORM_CPU_SQUARE_BLOCK <= n; i += FNORM_CPU_SQUARE_BLOCK) {
    float acc[FNORM_CPU_LANES] = {0};
    for (int j = 0; j < FNORM_CPU_SQUARE_BLOCK; j += FNORM_CPU_LANES) {
      for (int k = 0; k < FNORM_CPU_LANES; k++) {
        acc[k] += v[i + j + k];
      }
    }
    total += (double)add_lanes_f32(acc);
  }
  for (; i < n; i++) {
    total += (double)v[i];
  }
  return total;
}

/* The mean pass: chunk [start, start + n) of a row as floats (fp32 in place, else converted into
 * `buffer`), and its sum: in fp32 blocks (sum_blocks) when `blocks`, else in double (sum_chunk). */
static double load_sum_baseline(fnorm_dtype dtype, const void *base, int64_t start, int n,
                                float *buffer, int blocks) {
  const float *v = fnorm_cpu_load(dtype, base, start, n, buffer);
  return blocks ? sum_blocks(v, n) : sum_chunk(v, n);
}

/* Sums of d and of d^2, d = (v[i] - center_hi) - center_lo, for the variance around an accurate
 * center. d and d^2 are fp32 and summed in fp32 over blocks of FNORM_CPU_SQUARE_BLOCK elements
 * (sixteen lanes, added pairwise); each block's sums go into doubles. The squares are all
 * positive, so a block's sum is within a few fp32 roundings (relative) of exact, and the whole
 * sum, hence rstd, stays within about an fp32 ulp, at a fraction of the cost of double per
 * element. The sum of d is the mean's correction (the center came from fp32 blocks too). The
 * caller checks the results for overflow and underflow. The last n % FNORM_CPU_SQUARE_BLOCK
 * elements, too few for their roundings to average out, are done in double. Returns the sum of
 * squares and adds the sum of d to *deviation. */
static double sum_squares_baseline(const float *restrict v, int n, double center, float center_hi,
                                   float center_lo, double *deviation) {
  double total = 0.0;
  double linear = 0.0;
  int i = 0;
  for (; i + FNORM_CPU_SQUARE_BLOCK <= n; i += FNORM_CPU_SQUARE_BLOCK) {
    float acc[FNORM_CPU_LANES] = {0};
    float acc_d[FNORM_CPU_LANES] = {0};
    for (int j = 0; j < FNORM_CPU_SQUARE_BLOCK; j += FNORM_CPU_LANES) {
      for (int k = 0; k < FNORM_CPU_LANES; k++) {
        float d = (v[i + j + k] - center_hi) - center_lo;
        acc_d[k] += d;
        acc[k] += d * d;
      }
    }
    linear += (double)add_lanes_f32(acc_d);
    total += (double)add_lanes_f32(acc);
  }
  for (; i < n; i++) {
    double d = (double)v[i] - center; /* a short tail in double: too few terms to average out */
    linear += d;
    total += d * d;
  }
  *deviation += linear;
  return total;
}

/* y = ((x - center_hi) - center_lo) * rstd * gamma + beta in fp32, where center_hi + center_lo
 * is the double center split into two floats. x - center_hi is one rounding of the exact
 * difference, and center_lo restores the part of the center that fp32 cannot hold, so even for
 * rows far from zero mean (1e4 + N(0, 1)) y is within a few fp32 ulps of exact, at a fraction of
 * the cost of double arithmetic in this, the heaviest pass. Then stored as dtype. */
static void normalize_store_baseline(fnorm_dtype dtype, const float *restrict x,
                                     const float *restrict gamma, const float *restrict beta,
                                     void *y_row, int64_t start, int n, float center_hi,
                                     float center_lo, float rstd, int stream, float *scratch) {
  (void)stream;
  for (int i = 0; i < n; i++) {
    scratch[i] = ((x[i] - center_hi) - center_lo) * rstd * gamma[i] + beta[i];
  }
  fnorm_cpu_store(dtype, y_row, start, n, scratch);
}

static const float *load_baseline(fnorm_dtype dtype, const void *base, int64_t start, int count,
                                  float *buffer) {
  return fnorm_cpu_load(dtype, base, start, count, buffer);
}

static const float *load_param_baseline(fnorm_dtype dtype, const void *base, int64_t start,
                                        int count, float *buffer, const float *fill_buffer) {
  return fnorm_cpu_load_param(dtype, base, start, count, buffer, fill_buffer);
}

static void end_stores_baseline(int stream) {
  (void)stream;
}

#if FNORM_CPU_X86_DISPATCH
/* Adds 4 floats to 4 doubles each of acc_low and acc_high (lanes 4k..4k+3 of the portable
 * accumulators live in vector k). */
#define FNORM_ACCUMULATE_8(acc_low, acc_high, v)                                                   \
  do {                                                                                             \
    acc_low = _mm256_add_pd(acc_low, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));                  \
    acc_high = _mm256_add_pd(acc_high, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));              \
  } while (0)

FNORM_CPU_AVX2_TARGET static double add_lanes_avx2(__m256d acc0, __m256d acc1, __m256d acc2,
                                                   __m256d acc3) {
  double acc[FNORM_CPU_LANES];
  _mm256_storeu_pd(acc, acc0);
  _mm256_storeu_pd(acc + 4, acc1);
  _mm256_storeu_pd(acc + 8, acc2);
  _mm256_storeu_pd(acc + 12, acc3);
  return add_lanes(acc);
}

/* add_lanes_f32 on lanes 0..7 (acc0) and 8..15 (acc1): widths 8, 4, 2, 1. */
FNORM_CPU_AVX2_TARGET static inline float add_lanes_f32_avx2(__m256 acc0, __m256 acc1) {
  const __m256 w8 = _mm256_add_ps(acc0, acc1);
  const __m128 w4 = _mm_add_ps(_mm256_castps256_ps128(w8), _mm256_extractf128_ps(w8, 1));
  const __m128 w2 = _mm_add_ps(w4, _mm_movehl_ps(w4, w4));
  const __m128 w1 = _mm_add_ss(w2, _mm_shuffle_ps(w2, w2, 1));
  return _mm_cvtss_f32(w1);
}

/* 8 elements of a row at `source` as floats. */
FNORM_CPU_AVX2_TARGET static inline __m256 load_8(int dtype_code, const void *source) {
  switch (dtype_code) {
  case 1:
    return fnorm_cpu_avx2_from_bf16((const uint16_t *)source);
  case 2:
    return fnorm_cpu_avx2_from_f16((const uint16_t *)source);
  default:
    return _mm256_loadu_ps((const float *)source);
  }
}

/* load_sum_baseline. */
FNORM_CPU_AVX2_TARGET static double load_sum_avx2(fnorm_dtype dtype, const void *base,
                                                  int64_t start, int n, float *buffer, int blocks) {
  if (dtype == FNORM_DTYPE_SAME) {
    return 0.0; /* unreachable: dtypes are checked first */
  }
  const int code = dtype == FNORM_DTYPE_BF16 ? 1 : dtype == FNORM_DTYPE_F16 ? 2 : 0;
  const size_t elem = fnorm_cpu_dtype_bytes(dtype);
  const char *source = (const char *)base + (size_t)start * elem;
  const int keep = code != 0; /* converted values are stored for the later passes */
  int i = 0;
  double total = 0.0;
  if (blocks) {
    for (; i + FNORM_CPU_SQUARE_BLOCK <= n; i += FNORM_CPU_SQUARE_BLOCK) {
      __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0; /* lanes 0..7 and 8..15 */
      for (int j = i; j < i + FNORM_CPU_SQUARE_BLOCK; j += FNORM_CPU_LANES) {
        const __m256 v0 = load_8(code, source + (size_t)j * elem);
        const __m256 v1 = load_8(code, source + (size_t)(j + 8) * elem);
        if (keep) {
          _mm256_storeu_ps(buffer + j, v0);
          _mm256_storeu_ps(buffer + j + 8, v1);
        }
        acc0 = _mm256_add_ps(acc0, v0);
        acc1 = _mm256_add_ps(acc1, v1);
      }
      total += (double)add_lanes_f32_avx2(acc0, acc1);
    }
  } else {
    __m256d acc0 = _mm256_setzero_pd(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (; i + FNORM_CPU_LANES <= n; i += FNORM_CPU_LANES) {
      const __m256 v0 = load_8(code, source + (size_t)i * elem);
      const __m256 v1 = load_8(code, source + (size_t)(i + 8) * elem);
      if (keep) {
        _mm256_storeu_ps(buffer + i, v0);
        _mm256_storeu_ps(buffer + i + 8, v1);
      }
      FNORM_ACCUMULATE_8(acc0, acc1, v0);
      FNORM_ACCUMULATE_8(acc2, acc3, v1);
    }
    total = add_lanes_avx2(acc0, acc1, acc2, acc3);
  }
  /* The tail, converted the portable way and summed in double. */
  const float *v = fnorm_cpu_load(dtype, source, i, n - i, buffer + i) - i;
  double tail = 0.0;
  for (; i < n; i++) {
    tail += (double)v[i];
  }
  return total + tail;
}

/* d = (v - center_hi) - center_lo; acc_d += d; acc += d * d, on 8 lanes. */
#define FNORM_SQUARE_8(acc, acc_d, v, hi, lo)                                                      \
  do {                                                                                             \
    const __m256 d_ = _mm256_sub_ps(_mm256_sub_ps(v, hi), lo);                                     \
    acc_d = _mm256_add_ps(acc_d, d_);                                                              \
    acc = _mm256_add_ps(acc, _mm256_mul_ps(d_, d_));                                               \
  } while (0)

FNORM_CPU_AVX2_TARGET static double sum_squares_avx2(const float *restrict v, int n, double center,
                                                     float center_hi, float center_lo,
                                                     double *deviation) {
  const __m256 hi = _mm256_set1_ps(center_hi);
  const __m256 lo = _mm256_set1_ps(center_lo);
  double total = 0.0;
  double linear = 0.0;
  int i = 0;
  for (; i + FNORM_CPU_SQUARE_BLOCK <= n; i += FNORM_CPU_SQUARE_BLOCK) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0; /* lanes 0..7 and 8..15 */
    __m256 acc_d0 = acc0, acc_d1 = acc0;
    for (int j = 0; j < FNORM_CPU_SQUARE_BLOCK; j += FNORM_CPU_LANES) {
      FNORM_SQUARE_8(acc0, acc_d0, _mm256_loadu_ps(v + i + j), hi, lo);
      FNORM_SQUARE_8(acc1, acc_d1, _mm256_loadu_ps(v + i + j + 8), hi, lo);
    }
    linear += (double)add_lanes_f32_avx2(acc_d0, acc_d1);
    total += (double)add_lanes_f32_avx2(acc0, acc1);
  }
  for (; i < n; i++) {
    double d = (double)v[i] - center; /* a short tail in double: too few terms to average out */
    linear += d;
    total += d * d;
  }
  *deviation += linear;
  return total;
}

/* fnorm_cpu_avx2_to_bf16_16 for values known not to be NaN: the same rounding, without the
 * NaN select (one compare of all 16 values decides which form runs). */
FNORM_CPU_AVX2_TARGET static inline __m256i bf16_bits_no_nan(__m256 value) {
  const __m256i bits = _mm256_castps_si256(value);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb),
                           16);
}

FNORM_CPU_AVX2_TARGET static inline __m256i to_bf16_16_no_nan(__m256 v0, __m256 v1) {
  const __m256i packed = _mm256_packus_epi32(bf16_bits_no_nan(v0), bf16_bits_no_nan(v1));
  return _mm256_permute4x64_epi64(packed, 0xd8); /* the pack works within 128-bit halves */
}

/* normalize_store_baseline on 8 lanes. */
FNORM_CPU_AVX2_TARGET static inline __m256 normalize_8(const float *x, const float *gamma,
                                                       const float *beta, __m256 hi, __m256 lo,
                                                       __m256 rstd) {
  __m256 v = _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x), hi), lo);
  v = _mm256_mul_ps(_mm256_mul_ps(v, rstd), _mm256_loadu_ps(gamma));
  return _mm256_add_ps(v, _mm256_loadu_ps(beta));
}

FNORM_CPU_AVX2_TARGET static void
normalize_store_avx2(fnorm_dtype dtype, const float *restrict x, const float *restrict gamma,
                     const float *restrict beta, void *y_row, int64_t start, int n, float center_hi,
                     float center_lo, float rstd, int stream, float *scratch) {
  const __m256 hi = _mm256_set1_ps(center_hi);
  const __m256 lo = _mm256_set1_ps(center_lo);
  const __m256 r = _mm256_set1_ps(rstd);
  const size_t elem = fnorm_cpu_dtype_bytes(dtype);
  int i = 0;
  if (stream) {
    /* Streaming stores need 32-byte alignment: the unaligned head goes the portable way. */
    const uintptr_t target = (uintptr_t)y_row + (size_t)start * elem;
    while (i < n && ((target + (size_t)i * elem) & 31u) != 0) {
      i++;
    }
    normalize_store_baseline(dtype, x, gamma, beta, y_row, start, i, center_hi, center_lo, rstd, 0,
                             scratch);
  }
  /* One loop per dtype and store kind, so that no test is left inside a loop. */
  if (dtype == FNORM_DTYPE_F32) {
    float *y = (float *)y_row + start;
    if (stream) {
      for (; i + 8 <= n; i += 8) {
        _mm256_stream_ps(y + i, normalize_8(x + i, gamma + i, beta + i, hi, lo, r));
      }
    } else {
      for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, normalize_8(x + i, gamma + i, beta + i, hi, lo, r));
      }
    }
  } else if (dtype == FNORM_DTYPE_F16) {
    uint16_t *y = (uint16_t *)y_row + start;
    for (; i + 16 <= n; i += 16) {
      const __m256 v0 = normalize_8(x + i, gamma + i, beta + i, hi, lo, r);
      const __m256 v1 = normalize_8(x + i + 8, gamma + i + 8, beta + i + 8, hi, lo, r);
      const __m256i h = fnorm_cpu_avx2_to_f16_16(v0, v1);
      if (stream) {
        _mm256_stream_si256((__m256i *)(void *)(y + i), h);
      } else {
        _mm256_storeu_si256((__m256i *)(void *)(y + i), h);
      }
    }
  } else {
    uint16_t *y = (uint16_t *)y_row + start;
#define FNORM_BF16_LOOP(store)                                                                     \
  for (; i + 16 <= n; i += 16) {                                                                   \
    const __m256 v0 = normalize_8(x + i, gamma + i, beta + i, hi, lo, r);                          \
    const __m256 v1 = normalize_8(x + i + 8, gamma + i + 8, beta + i + 8, hi, lo, r);              \
    const __m256i h = _mm256_movemask_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q)) == 0                 \
                          ? to_bf16_16_no_nan(v0, v1)                                              \
                          : fnorm_cpu_avx2_to_bf16_16(v0, v1);                                     \
    store((__m256i *)(void *)(y + i), h);                                                          \
  }
    if (stream) {
      FNORM_BF16_LOOP(_mm256_stream_si256)
    } else {
      FNORM_BF16_LOOP(_mm256_storeu_si256)
    }
#undef FNORM_BF16_LOOP
  }
  normalize_store_baseline(dtype, x + i, gamma + i, beta + i, y_row, start + i, n - i, center_hi,
                           center_lo, rstd, 0, scratch);
}

FNORM_CPU_AVX2_TARGET static const float *load_avx2(fnorm_dtype dtype, const void *base,
                                                    int64_t start, int count, float *buffer) {
  return fnorm_cpu_load_avx2(dtype, base, start, count, buffer);
}

FNORM_CPU_AVX2_TARGET static const float *load_param_avx2(fnorm_dtype dtype, const void *base,
                                                          int64_t start, int count, float *buffer,
                                                          const float *fill_buffer) {
  return fnorm_cpu_load_param_avx2(dtype, base, start, count, buffer, fill_buffer);
}

/* Orders this thread's streaming stores before whatever follows (the end of the call). */
FNORM_CPU_AVX2_TARGET static void end_stores_avx2(int stream) {
  if (stream) {
    _mm_sfence();
  }
}
#endif

/* The row loop, once per variant: cpu_forward_impl.h uses FNORM_FORWARD_NAME(kernel). */
#define FNORM_FORWARD_NAME(name) name##_baseline
#define FNORM_FORWARD_TARGET
#include "cpu_forward_impl.h"
#undef FNORM_FORWARD_NAME
#undef FNORM_FORWARD_TARGET

#if FNORM_CPU_X86_DISPATCH
#define FNORM_FORWARD_NAME(name) name##_avx2
#define FNORM_FORWARD_TARGET FNORM_CPU_AVX2_TARGET
#include "cpu_forward_impl.h"
#undef FNORM_FORWARD_NAME
#undef FNORM_FORWARD_TARGET
#endif

static void forward_rows(const fnorm_problem *p, const fnorm_forward_args *a, int64_t first,
                         int64_t end, int simd, int stream, forward_buffers *buf) {
#if FNORM_CPU_X86_DISPATCH
  if (simd) {
    forward_rows_avx2(p, a, first, end, stream, buf);
    return;
  }
#else
  (void)simd;
#endif
  forward_rows_baseline(p, a, first, end, stream, buf);
}

fnorm_status fnorm_cpu_forward(const fnorm_problem *p, const fnorm_forward_args *a) {
  if (!fnorm_cpu_dtype_supported(p->dtype) || !fnorm_cpu_dtype_supported(p->param_dtype)) {
    return FNORM_ERR_UNSUPPORTED;
  }
  if (p->norm != FNORM_LAYERNORM && p->norm != FNORM_RMSNORM) {
    return FNORM_ERR_UNSUPPORTED;
  }
  const int64_t rows = p->rows;
  const int team = fnorm_cpu_team_size(p->cpu_threads, rows, p->cols);
  const int simd = fnorm_cpu_simd();
  const int stream = (uint64_t)rows * (uint64_t)p->cols * fnorm_cpu_dtype_bytes(p->dtype) >=
                     FNORM_CPU_STREAM_BYTES;
  if (team == 1) {
    forward_buffers buf;
    forward_rows(p, a, 0, rows, simd, stream, &buf);
    return FNORM_SUCCESS;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(team)
  {
    /* Contiguous row ranges, one per thread; each row is computed the same way whichever
     * thread gets it. */
    const int64_t threads = omp_get_num_threads();
    const int64_t thread = omp_get_thread_num();
    int64_t first, end;
    fnorm_cpu_split(rows, threads, thread, &first, &end);
    forward_buffers buf;
    forward_rows(p, a, first, end, simd, stream, &buf);
  }
#endif
  return FNORM_SUCCESS;
}
