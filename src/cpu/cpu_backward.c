/*
 * CPU backward of LayerNorm and RMSNorm.
 *
 * With xhat = (x - mean) * rstd (LayerNorm) or x * rstd (RMSNorm), or xhat = (y - beta) / gamma
 * when the forward's output is given instead of x, and g = dy * gamma:
 *   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))
 *   dgamma[j] = sum_i dy[i][j] * xhat[i][j],   dbeta[j] = sum_i dy[i][j]
 *
 * Short rows (up to FNORM_CPU_RESIDENT_COLS) are read from memory once: the first pass converts
 * dy and x (or y) chunk by chunk, keeps xhat and g as fp32 copies on the stack, sums g and
 * g * xhat (fp32 blocks of 64 elements added into double) and adds dy * xhat and dy into the
 * dgamma/dbeta partials (double); the second pass computes dx in fp32 from the copies and rounds
 * it once to the output dtype. Long rows are streamed twice, the second pass recomputing xhat and
 * g exactly as the first did. A row whose g is out of fp32's comfortable range, or whose sums are
 * not finite, gets its dx in double instead (row_is_fast). The row loop exists in a portable and,
 * on x86, an AVX2 + F16C form (cpu_backward_impl.h) that give bitwise the same results.
 *
 * Determinism: rows are grouped into blocks whose count and size depend only on (rows, cols).
 * Each block accumulates its own dgamma/dbeta partial sums, in row order, into the workspace;
 * the partials are then added in block order. So any thread count gives bitwise the same
 * result: a thread only decides which blocks it runs, never the order of any sum.
 */
#include <math.h>

#include "cpu_internal.h"

/* At most this many row blocks, and at most this many bytes of partial sums: enough blocks to
 * keep any CPU's cores busy, few enough that the final reduction and the workspace stay small. */
#define FNORM_CPU_MAX_BLOCKS 64
#define FNORM_CPU_MAX_PARTIAL_BYTES ((uint64_t)64 << 20)

typedef struct block_layout {
  int64_t blocks;
  int64_t rows_per_block;
} block_layout;

/* Depends on rows and cols only, never on the thread count. */
static block_layout layout_blocks(int64_t rows, int64_t cols) {
  /* dgamma and dbeta: a double partial and an fp32 group accumulator each */
  const uint64_t bytes_per_block_per_col = 2 * (sizeof(double) + sizeof(float));
  uint64_t by_memory = FNORM_CPU_MAX_PARTIAL_BYTES / bytes_per_block_per_col / (uint64_t)cols;
  int64_t blocks = FNORM_CPU_MAX_BLOCKS;
  if ((uint64_t)blocks > by_memory) {
    blocks = (int64_t)by_memory;
  }
  if (blocks > rows) {
    blocks = rows;
  }
  if (blocks < 1) {
    blocks = 1;
  }
  block_layout layout;
  layout.rows_per_block = rows / blocks + (rows % blocks != 0);
  layout.blocks = rows / layout.rows_per_block + (rows % layout.rows_per_block != 0);
  return layout;
}

fnorm_status fnorm_cpu_backward_workspace_size(const fnorm_problem *p, size_t *bytes) {
  block_layout layout = layout_blocks(p->rows, p->cols);
  /* blocks * 2 * cols doubles and as many floats; blocks <= 64, so only cols can make this
   * overflow. */
  uint64_t per_col = (uint64_t)layout.blocks * 2 * (sizeof(double) + sizeof(float));
  if ((uint64_t)p->cols > (uint64_t)SIZE_MAX / per_col) {
    return FNORM_ERR_BAD_SIZE;
  }
  *bytes = (size_t)((uint64_t)p->cols * per_col);
  return FNORM_SUCCESS;
}

/* Rows of at most this many elements keep their xhat and g (and gamma, and beta for the backward
 * from y) as fp32 copies on the stack, 4 * 16 KiB, so that the second pass reads nothing from
 * memory. Longer rows are streamed in chunks by both passes. */
#define FNORM_CPU_RESIDENT_COLS 4096

/* Independent fp32 accumulators in the row sums (a power of two). */
#define FNORM_CPU_LANES 16

/* The row sums are accumulated in fp32 over blocks of this many elements (a multiple of
 * FNORM_CPU_LANES), each block's sum then in double. */
#define FNORM_CPU_SUM_BLOCK 64

/* A row whose largest |g| lies outside [FNORM_CPU_G_MIN, FNORM_CPU_G_MAX] (and is not 0), or
 * whose row sums are not finite, gets its dx in double (see row_is_fast). */
#define FNORM_CPU_G_MIN 0x1p-100f
#define FNORM_CPU_G_MAX 0x1p100f

/* dgamma and dbeta are accumulated in fp32 over groups of this many rows of a block (at most
 * this many roundings of fp32, relative to the sum of the terms' magnitudes, fewer than the
 * 4 + 2 log2(rows) fp32 eps a reduction over the rows is allowed), each group's sums then added
 * into the block's double partials. */
#define FNORM_CPU_GROUP_ROWS 8

/* Stack buffers of one thread. */
typedef struct backward_buffers {
  float gamma[FNORM_CPU_RESIDENT_COLS]; /* fp32 gamma (1 when NULL); long rows: one chunk */
  float beta[FNORM_CPU_RESIDENT_COLS];  /* from y: fp32 beta (0 when NULL); long rows: a chunk */
  float xhat[FNORM_CPU_RESIDENT_COLS];  /* the row's xhat; long rows: one chunk */
  float g[FNORM_CPU_RESIDENT_COLS];     /* the row's dy * gamma; long rows: one chunk */
  float dy[FNORM_CPU_CHUNK];
  float input[FNORM_CPU_CHUNK]; /* x or y */
  float dx[FNORM_CPU_CHUNK];
} backward_buffers;

/* One row block's dgamma and dbeta partials (double) and the fp32 accumulators of its current
 * group of rows, [cols] each, in the workspace. Both are accumulated whichever of dgamma and
 * dbeta is asked for. */
typedef struct block_partials {
  double *dgamma;
  double *dbeta;
  float *dgamma32;
  float *dbeta32;
} block_partials;

/* What the rows need besides their data. */
typedef struct row_context {
  const fnorm_problem *p;
  const fnorm_backward_args *a;
  int from_x;   /* x given (exact form), else y */
  int resident; /* cols <= FNORM_CPU_RESIDENT_COLS */
  int stream;   /* dx is written with streaming stores where possible */
} row_context;

/* A row's sums, accumulated over its chunks in column order. */
typedef struct row_stats {
  double sum_g;      /* sum of g = dy * gamma */
  double sum_g_xhat; /* sum of g * xhat */
  float max_g;       /* max |g| (only decides between fp32 and double; see row_is_fast) */
} row_stats;

/* Whether fp32 is accurate for the row's dx: sums finite (no NaN or Inf anywhere, nothing
 * overflowed) and |g| in a range where fp32 neither overflows nor loses bits to underflow. An
 * all-zero g (a row with no gradient) is exact in fp32. Otherwise the row is done in double. */
static int row_is_fast(const row_stats *s) {
  return isfinite(s->sum_g) && isfinite(s->sum_g_xhat) && s->max_g <= FNORM_CPU_G_MAX &&
         (s->max_g >= FNORM_CPU_G_MIN || s->max_g == 0.0f);
}

/* ---------------------------------------------------------------------------------------------
 * Chunk kernels. Each exists in a portable form and, on x86, in an AVX2 form that does the same
 * operations in the same order (the vector lanes are the portable form's accumulators; the
 * elementwise operations are the same IEEE operations), so both give bitwise the same results.
 *
 * The first pass over a chunk [start, start + n) of a row (pass1_*):
 *  - xhat: with beta NULL from x, (x - center) * rstd (one rounding of the exact difference, one
 *    of the product); otherwise from y, (y - beta) / gamma. g = dy * gamma. All in fp32, stored
 *    into xhat[0, n) and g[0, n) for the second pass.
 *  - the row sums of g and g * xhat (row_sums_baseline) and max |g|, into *s.
 *  - unless dgamma32 is NULL: dgamma32 += dy * xhat and dbeta32 += dy, the fp32 accumulators of
 *    the current group of rows (see fold_group).
 * ------------------------------------------------------------------------------------------- */
/* Elements [0, n) of xhat and g, elementwise. */
static void prepare_range(int n, const float *restrict dy, const float *restrict input,
                          const float *restrict gamma, const float *restrict beta, float center,
                          float rstd, float *restrict xhat, float *restrict g) {
  if (beta == NULL) {
    for (int i = 0; i < n; i++) {
      xhat[i] = (input[i] - center) * rstd;
    }
  } else {
    for (int i = 0; i < n; i++) {
      xhat[i] = (input[i] - beta[i]) / gamma[i];
    }
  }
  for (int i = 0; i < n; i++) {
    g[i] = dy[i] * gamma[i];
  }
}

/* Elements [0, n) of the group accumulators, elementwise (dgamma32 NULL: none). */
static void partials_range(int n, const float *restrict dy, const float *restrict xhat,
                           float *restrict dgamma32, float *restrict dbeta32) {
  if (dgamma32 == NULL) {
    return;
  }
  for (int i = 0; i < n; i++) {
    dgamma32[i] += dy[i] * xhat[i];
    dbeta32[i] += dy[i];
  }
}

static float add_lanes_f32(float *acc) {
  for (int width = FNORM_CPU_LANES / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; k++) {
      acc[k] += acc[k + width];
    }
  }
  return acc[0];
}

/* Elements [0, n) after a chunk's full blocks: too few for their fp32 roundings to average out,
 * so summed in double, one element at a time. Also their max |g|. */
static void row_sums_tail(int n, const float *restrict g, const float *restrict xhat,
                          row_stats *s) {
  for (int i = 0; i < n; i++) {
    s->sum_g += (double)g[i];
    s->sum_g_xhat += (double)g[i] * (double)xhat[i]; /* exact product */
    const float magnitude = fabsf(g[i]);
    s->max_g = magnitude > s->max_g ? magnitude : s->max_g;
  }
}

/* Adds a chunk's sum of g and of g * xhat to the row's: g and g * xhat are summed in fp32 over
 * blocks of FNORM_CPU_SUM_BLOCK elements (sixteen lanes, added pairwise), each block's sum then
 * in double. A block's sum is within a few fp32 roundings of exact relative to the sum of its
 * terms' magnitudes, which is all dx needs: its error is measured against those magnitudes
 * anyway (the cancellation in g - mean(g) - xhat * mean(g xhat) is inherent). Also max |g|
 * (exact and independent of the order, NaN aside; a NaN makes the sums NaN, which decides
 * alone). */
static void row_sums_baseline(int n, const float *restrict g, const float *restrict xhat,
                              row_stats *s) {
  int i = 0;
  for (; i + FNORM_CPU_SUM_BLOCK <= n; i += FNORM_CPU_SUM_BLOCK) {
    float acc_g[FNORM_CPU_LANES] = {0};
    float acc_gx[FNORM_CPU_LANES] = {0};
    for (int j = 0; j < FNORM_CPU_SUM_BLOCK; j += FNORM_CPU_LANES) {
      for (int k = 0; k < FNORM_CPU_LANES; k++) {
        acc_g[k] += g[i + j + k];
        acc_gx[k] += g[i + j + k] * xhat[i + j + k];
      }
    }
    s->sum_g += (double)add_lanes_f32(acc_g);
    s->sum_g_xhat += (double)add_lanes_f32(acc_gx);
  }
  float max_g = s->max_g;
  for (int k = 0; k < i; k++) {
    const float magnitude = fabsf(g[k]);
    max_g = magnitude > max_g ? magnitude : max_g;
  }
  s->max_g = max_g;
  row_sums_tail(n - i, g + i, xhat + i, s);
}

static void pass1_baseline(fnorm_dtype dtype, int n, const void *dy_row, const void *input_row,
                           int64_t start, const float *gamma, const float *beta, float center,
                           float rstd, float *xhat, float *g, row_stats *s, float *dgamma32,
                           float *dbeta32, backward_buffers *buf) {
  const float *dy = fnorm_cpu_load(dtype, dy_row, start, n, buf->dy);
  const float *input = fnorm_cpu_load(dtype, input_row, start, n, buf->input);
  prepare_range(n, dy, input, gamma, beta, center, rstd, xhat, g);
  row_sums_baseline(n, g, xhat, s);
  partials_range(n, dy, xhat, dgamma32, dbeta32);
}

/* Elements [0, n) of a chunk's dx = ((g - mean_g) - xhat * mean_g_xhat) * rstd, in fp32, into
 * out. */
static void dx_range(int n, const float *restrict g, const float *restrict xhat, float mean_g,
                     float mean_g_xhat, float rstd, float *restrict out) {
  for (int i = 0; i < n; i++) {
    out[i] = ((g[i] - mean_g) - xhat[i] * mean_g_xhat) * rstd;
  }
}

/* dx of a chunk, rounded once to dtype and stored at [start, start + n) of dx_row. */
static void dx_store_baseline(fnorm_dtype dtype, int n, const float *restrict g,
                              const float *restrict xhat, float mean_g, float mean_g_xhat,
                              float rstd, void *dx_row, int64_t start, int stream, float *scratch) {
  (void)stream;
  dx_range(n, g, xhat, mean_g, mean_g_xhat, rstd, scratch);
  fnorm_cpu_store(dtype, dx_row, start, n, scratch);
}

static const float *load_baseline(fnorm_dtype dtype, const void *base, int64_t start, int count,
                                  float *buffer) {
  return fnorm_cpu_load(dtype, base, start, count, buffer);
}

static void end_stores_baseline(int stream) {
  (void)stream;
}

#if FNORM_CPU_X86_DISPATCH
#define FNORM_CPU_AVX2_INLINE FNORM_CPU_AVX2_TARGET static inline __attribute__((always_inline))

/* 8 elements of a row of dtype from element i on, as floats. */
FNORM_CPU_AVX2_INLINE __m256 load8_avx2(fnorm_dtype dtype, const void *base, int64_t i) {
  if (dtype == FNORM_DTYPE_F32) {
    return _mm256_loadu_ps((const float *)base + i);
  }
  if (dtype == FNORM_DTYPE_BF16) {
    return fnorm_cpu_avx2_from_bf16((const uint16_t *)base + i);
  }
  return fnorm_cpu_avx2_from_f16((const uint16_t *)base + i);
}

/* add_lanes_f32 of the 16 lanes lo (0..7) and hi (8..15): widths 8, 4, 2, 1. */
FNORM_CPU_AVX2_INLINE float add_lanes_avx2(__m256 lo, __m256 hi) {
  const __m256 w8 = _mm256_add_ps(lo, hi);
  const __m128 w4 = _mm_add_ps(_mm256_castps256_ps128(w8), _mm256_extractf128_ps(w8, 1));
  const __m128 w2 = _mm_add_ps(w4, _mm_movehl_ps(w4, w4));
  const __m128 w1 = _mm_add_ss(w2, _mm_shuffle_ps(w2, w2, 1));
  return _mm_cvtss_f32(w1);
}

/* pass1_baseline on the chunk's full blocks, with dtype, from_x (beta == NULL) and partials
 * (dgamma32 != NULL) constant in each inlined copy. Returns how many elements it did. */
FNORM_CPU_AVX2_INLINE int pass1_blocks_avx2(fnorm_dtype dtype, int from_x, int partials, int n,
                                            const void *dy_row, const void *input_row,
                                            int64_t start, const float *restrict gamma,
                                            const float *restrict beta, float center, float rstd,
                                            float *restrict xhat, float *restrict g, row_stats *s,
                                            float *restrict dgamma32, float *restrict dbeta32) {
  const __m256 magnitude_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 c = _mm256_set1_ps(center);
  const __m256 r = _mm256_set1_ps(rstd);
  __m256 max_g = _mm256_setzero_ps();
  int i = 0;
  for (; i + FNORM_CPU_SUM_BLOCK <= n; i += FNORM_CPU_SUM_BLOCK) {
    __m256 acc_g[2], acc_gx[2]; /* lanes 0..7 and 8..15 */
    acc_g[0] = acc_g[1] = acc_gx[0] = acc_gx[1] = _mm256_setzero_ps();
    for (int j = i; j < i + FNORM_CPU_SUM_BLOCK; j += FNORM_CPU_LANES) {
      for (int h = 0; h < 2; h++) {
        const int k = j + 8 * h;
        const __m256 dy = load8_avx2(dtype, dy_row, start + k);
        const __m256 input = load8_avx2(dtype, input_row, start + k);
        const __m256 gm = _mm256_loadu_ps(gamma + k);
        const __m256 xh = from_x
                              ? _mm256_mul_ps(_mm256_sub_ps(input, c), r)
                              : _mm256_div_ps(_mm256_sub_ps(input, _mm256_loadu_ps(beta + k)), gm);
        const __m256 gg = _mm256_mul_ps(dy, gm);
        _mm256_storeu_ps(xhat + k, xh);
        _mm256_storeu_ps(g + k, gg);
        acc_g[h] = _mm256_add_ps(acc_g[h], gg);
        acc_gx[h] = _mm256_add_ps(acc_gx[h], _mm256_mul_ps(gg, xh));
        max_g = _mm256_max_ps(max_g, _mm256_and_ps(gg, magnitude_mask));
        if (partials) {
          /* Both loads before both stores: the two accumulators may lie a multiple of 4 KiB
           * apart, and a load behind a store to an address that matches in its low 12 bits
           * waits for that store. */
          const __m256 dgamma = _mm256_loadu_ps(dgamma32 + k);
          const __m256 dbeta = _mm256_loadu_ps(dbeta32 + k);
          _mm256_storeu_ps(dgamma32 + k, _mm256_add_ps(dgamma, _mm256_mul_ps(dy, xh)));
          _mm256_storeu_ps(dbeta32 + k, _mm256_add_ps(dbeta, dy));
        }
      }
    }
    s->sum_g += (double)add_lanes_avx2(acc_g[0], acc_g[1]);
    s->sum_g_xhat += (double)add_lanes_avx2(acc_gx[0], acc_gx[1]);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, max_g);
  for (int k = 0; k < 8; k++) {
    s->max_g = lanes[k] > s->max_g ? lanes[k] : s->max_g;
  }
  return i;
}

#define FNORM_PASS1_BLOCKS(dt)                                                                     \
  (from_x ? (partials ? pass1_blocks_avx2(dt, 1, 1, FNORM_PASS1_ARGS)                              \
                      : pass1_blocks_avx2(dt, 1, 0, FNORM_PASS1_ARGS))                             \
          : (partials ? pass1_blocks_avx2(dt, 0, 1, FNORM_PASS1_ARGS)                              \
                      : pass1_blocks_avx2(dt, 0, 0, FNORM_PASS1_ARGS)))
#define FNORM_PASS1_ARGS                                                                           \
  n, dy_row, input_row, start, gamma, beta, center, rstd, xhat, g, s, dgamma32, dbeta32

FNORM_CPU_AVX2_TARGET static void
pass1_avx2(fnorm_dtype dtype, int n, const void *dy_row, const void *input_row, int64_t start,
           const float *gamma, const float *beta, float center, float rstd, float *xhat, float *g,
           row_stats *s, float *dgamma32, float *dbeta32, backward_buffers *buf) {
  const int from_x = beta == NULL;
  const int partials = dgamma32 != NULL;
  int done = 0;
  switch (dtype) {
  case FNORM_DTYPE_F32:
    done = FNORM_PASS1_BLOCKS(FNORM_DTYPE_F32);
    break;
  case FNORM_DTYPE_F16:
    done = FNORM_PASS1_BLOCKS(FNORM_DTYPE_F16);
    break;
  case FNORM_DTYPE_BF16:
    done = FNORM_PASS1_BLOCKS(FNORM_DTYPE_BF16);
    break;
  case FNORM_DTYPE_SAME:
    return; /* unreachable: dtypes are checked first */
  }
  /* The tail after the full blocks, the portable way. */
  const int rest = n - done;
  const float *dy = fnorm_cpu_load(dtype, dy_row, start + done, rest, buf->dy);
  const float *input = fnorm_cpu_load(dtype, input_row, start + done, rest, buf->input);
  prepare_range(rest, dy, input, gamma + done, beta != NULL ? beta + done : NULL, center, rstd,
                xhat + done, g + done);
  row_sums_tail(rest, g + done, xhat + done, s);
  partials_range(rest, dy, xhat + done, partials ? dgamma32 + done : NULL,
                 partials ? dbeta32 + done : NULL);
}
#undef FNORM_PASS1_BLOCKS
#undef FNORM_PASS1_ARGS

/* dx_range on 8 lanes. */
FNORM_CPU_AVX2_INLINE __m256 dx_8(const float *g, const float *xhat, __m256 mean_g,
                                  __m256 mean_g_xhat, __m256 rstd) {
  const __m256 centered = _mm256_sub_ps(_mm256_loadu_ps(g), mean_g);
  return _mm256_mul_ps(_mm256_sub_ps(centered, _mm256_mul_ps(_mm256_loadu_ps(xhat), mean_g_xhat)),
                       rstd);
}

FNORM_CPU_AVX2_TARGET static void dx_store_avx2(fnorm_dtype dtype, int n, const float *restrict g,
                                                const float *restrict xhat, float mean_g,
                                                float mean_g_xhat, float rstd, void *dx_row,
                                                int64_t start, int stream, float *scratch) {
  const __m256 mg = _mm256_set1_ps(mean_g);
  const __m256 mgx = _mm256_set1_ps(mean_g_xhat);
  const __m256 r = _mm256_set1_ps(rstd);
  const size_t elem = fnorm_cpu_dtype_bytes(dtype);
  int i = 0;
  if (stream) {
    /* Streaming stores need 32-byte alignment: the unaligned head goes the portable way. */
    const uintptr_t target = (uintptr_t)dx_row + (size_t)start * elem;
    while (i < n && ((target + (size_t)i * elem) & 31u) != 0) {
      i++;
    }
    dx_store_baseline(dtype, i, g, xhat, mean_g, mean_g_xhat, rstd, dx_row, start, 0, scratch);
  }
  if (dtype == FNORM_DTYPE_F32) {
    float *dx = (float *)dx_row + start;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = dx_8(g + i, xhat + i, mg, mgx, r);
      if (stream) {
        _mm256_stream_ps(dx + i, v);
      } else {
        _mm256_storeu_ps(dx + i, v);
      }
    }
  } else {
    uint16_t *dx = (uint16_t *)dx_row + start;
    const int bf16 = dtype == FNORM_DTYPE_BF16;
    for (; i + 16 <= n; i += 16) {
      const __m256 v0 = dx_8(g + i, xhat + i, mg, mgx, r);
      const __m256 v1 = dx_8(g + i + 8, xhat + i + 8, mg, mgx, r);
      const __m256i h = bf16 ? fnorm_cpu_avx2_to_bf16_16(v0, v1) : fnorm_cpu_avx2_to_f16_16(v0, v1);
      if (stream) {
        _mm256_stream_si256((__m256i *)(void *)(dx + i), h);
      } else {
        _mm256_storeu_si256((__m256i *)(void *)(dx + i), h);
      }
    }
  }
  dx_store_baseline(dtype, n - i, g + i, xhat + i, mean_g, mean_g_xhat, rstd, dx_row, start + i, 0,
                    scratch);
}

FNORM_CPU_AVX2_TARGET static const float *load_avx2(fnorm_dtype dtype, const void *base,
                                                    int64_t start, int count, float *buffer) {
  return fnorm_cpu_load_avx2(dtype, base, start, count, buffer);
}

/* Orders this thread's streaming stores before whatever follows (the end of the call). */
FNORM_CPU_AVX2_TARGET static void end_stores_avx2(int stream) {
  if (stream) {
    _mm_sfence();
  }
}
#endif

/* The row loop, once per variant: cpu_backward_impl.h uses FNORM_BACKWARD_NAME(kernel). */
#define FNORM_BACKWARD_NAME(name) name##_baseline
#define FNORM_BACKWARD_TARGET
#include "cpu_backward_impl.h"
#undef FNORM_BACKWARD_NAME
#undef FNORM_BACKWARD_TARGET

#if FNORM_CPU_X86_DISPATCH
#define FNORM_BACKWARD_NAME(name) name##_avx2
#define FNORM_BACKWARD_TARGET FNORM_CPU_AVX2_TARGET
#include "cpu_backward_impl.h"
#undef FNORM_BACKWARD_NAME
#undef FNORM_BACKWARD_TARGET
#endif

static void backward_rows(const row_context *c, int simd, int64_t first, int64_t end,
                          const block_partials *bp, backward_buffers *buf) {
#if FNORM_CPU_X86_DISPATCH
  if (simd) {
    backward_rows_avx2(c, first, end, bp, buf);
    return;
  }
#else
  (void)simd;
#endif
  backward_rows_baseline(c, first, end, bp, buf);
}

/* out[j] = sum over blocks b, in order, of partials[b * cols + j], for columns [first, end):
 * each column's sum in the same order as ever, a chunk of columns at a time (so that the inner
 * loop runs along contiguous memory). */
static void reduce_partials(fnorm_dtype dtype, const double *partials, int64_t blocks, int64_t cols,
                            int64_t first, int64_t end, void *out) {
  double sums[FNORM_CPU_CHUNK];
  float rounded[FNORM_CPU_CHUNK];
  for (int64_t start = first; start < end; start += FNORM_CPU_CHUNK) {
    int n = end - start < FNORM_CPU_CHUNK ? (int)(end - start) : FNORM_CPU_CHUNK;
    for (int i = 0; i < n; i++) {
      sums[i] = 0.0;
    }
    for (int64_t b = 0; b < blocks; b++) {
      const double *partial = partials + b * cols + start;
      for (int i = 0; i < n; i++) {
        sums[i] += partial[i];
      }
    }
    for (int i = 0; i < n; i++) {
      rounded[i] = (float)sums[i];
    }
    fnorm_cpu_store(dtype, out, start, n, rounded);
  }
}

fnorm_status fnorm_cpu_backward(const fnorm_problem *p, const fnorm_backward_args *a,
                                void *workspace, size_t workspace_bytes) {
  if (!fnorm_cpu_dtype_supported(p->dtype) || !fnorm_cpu_dtype_supported(p->param_dtype)) {
    return FNORM_ERR_UNSUPPORTED;
  }
  if (p->norm != FNORM_LAYERNORM && p->norm != FNORM_RMSNORM) {
    return FNORM_ERR_UNSUPPORTED;
  }
  const int64_t rows = p->rows;
  const int64_t cols = p->cols;
  const int simd = fnorm_cpu_simd();
  row_context c;
  c.p = p;
  c.a = a;
  c.from_x = a->x != NULL;
  c.resident = cols <= FNORM_CPU_RESIDENT_COLS;
  c.stream = a->dx != NULL && (uint64_t)rows * (uint64_t)cols * fnorm_cpu_dtype_bytes(p->dtype) >=
                                  FNORM_CPU_STREAM_BYTES;

  if (a->dx == NULL && a->dgamma == NULL && a->dbeta == NULL) {
    return FNORM_SUCCESS; /* nothing asked for */
  }
  if (a->dgamma == NULL && a->dbeta == NULL) {
    /* No column sums: every row is independent, so split rows evenly. */
    const int team = fnorm_cpu_team_size(p->cpu_threads, rows, cols);
    if (team == 1) {
      backward_buffers buf;
      backward_rows(&c, simd, 0, rows, NULL, &buf);
      return FNORM_SUCCESS;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(team)
    {
      int64_t first, end;
      fnorm_cpu_split(rows, omp_get_num_threads(), omp_get_thread_num(), &first, &end);
      backward_buffers buf;
      backward_rows(&c, simd, first, end, NULL, &buf);
    }
#endif
    return FNORM_SUCCESS;
  }

  const block_layout layout = layout_blocks(rows, cols);
  size_t needed = 0;
  fnorm_status status = fnorm_cpu_backward_workspace_size(p, &needed);
  if (status != FNORM_SUCCESS) {
    return status;
  }
  if (workspace_bytes < needed || workspace == NULL) {
    return FNORM_ERR_WORKSPACE_TOO_SMALL; /* the front end checks this; kept as a guard */
  }
  /* The workspace: the double partials of dgamma, then of dbeta, then the fp32 group
   * accumulators of dgamma, then of dbeta, each [blocks][cols]. */
  double *dgamma_partials = (double *)workspace;
  double *dbeta_partials = dgamma_partials + layout.blocks * cols;
  float *dgamma_groups = (float *)(dbeta_partials + layout.blocks * cols);
  float *dbeta_groups = dgamma_groups + layout.blocks * cols;
#ifdef _OPENMP
  const int block_team =
      fnorm_cpu_team_size(p->cpu_threads, layout.blocks, layout.rows_per_block * cols);
  const int column_team = fnorm_cpu_team_size(p->cpu_threads, cols, layout.blocks);
#endif

#ifdef _OPENMP
#pragma omp parallel num_threads(block_team) if (block_team > 1)
#endif
  {
    backward_buffers buf;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t b = 0; b < layout.blocks; b++) {
      int64_t first = b * layout.rows_per_block;
      int64_t end = first + layout.rows_per_block < rows ? first + layout.rows_per_block : rows;
      block_partials bp;
      bp.dgamma = dgamma_partials + b * cols;
      bp.dbeta = dbeta_partials + b * cols;
      bp.dgamma32 = dgamma_groups + b * cols;
      bp.dbeta32 = dbeta_groups + b * cols;
      for (int64_t j = 0; j < cols; j++) {
        bp.dgamma[j] = 0.0;
        bp.dbeta[j] = 0.0;
        bp.dgamma32[j] = 0.0f;
        bp.dbeta32[j] = 0.0f;
      }
      backward_rows(&c, simd, first, end, &bp, &buf);
    }
  }

#ifdef _OPENMP
#pragma omp parallel num_threads(column_team) if (column_team > 1)
#endif
  {
    int64_t first = 0, end = cols;
#ifdef _OPENMP
    fnorm_cpu_split(cols, omp_get_num_threads(), omp_get_thread_num(), &first, &end);
#endif
    if (a->dgamma != NULL) {
      reduce_partials(p->param_dtype, dgamma_partials, layout.blocks, cols, first, end, a->dgamma);
    }
    if (a->dbeta != NULL) {
      reduce_partials(p->param_dtype, dbeta_partials, layout.blocks, cols, first, end, a->dbeta);
    }
  }
  return FNORM_SUCCESS;
}
