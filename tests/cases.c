#include "cases.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "halfconv.h"
#include "harness.h"
#include "rng.h"

const executor cpu_executor = {"cpu", FNORM_DEVICE_CPU, NULL, NULL, NULL, NULL, NULL};

/* ------------------------------------------------------------------------------------------
 * The oracle's work split over threads
 *
 * Making a case's inputs, its long-double reference and the comparison of every element took
 * most of a large case's time, one core of many (the library's own CPU run is parallel): the
 * GPU suite's cases of 2^25 elements spent 3-5 s each there. Where the tests are built with
 * OpenMP (the library's), rows are split into a fixed number of blocks, whatever the thread
 * count, each block's results kept apart and then combined in block order, so that a case's
 * inputs, reference and report are the same on any machine. Nothing inside a block calls the
 * harness (case_fail and friends are not thread-safe).
 * ---------------------------------------------------------------------------------------- */

#ifdef _OPENMP
#define TESTS_PARALLEL_FOR _Pragma("omp parallel for schedule(dynamic, 1)")
#else
#define TESTS_PARALLEL_FOR
#endif

/* Blocks a loop over n rows (or columns) is cut into (at most PAR_BLOCKS_MAX), and block b's
 * first index. */
enum { PAR_BLOCKS_MAX = 256 };
static int64_t par_blocks(int64_t n) {
  return n < PAR_BLOCKS_MAX ? n : PAR_BLOCKS_MAX;
}
static int64_t par_lo(int64_t n, int64_t nblk, int64_t b) {
  return (int64_t)((long double)n * (long double)b / (long double)nblk);
}

/* ------------------------------------------------------------------------------------------
 * dtypes
 * ---------------------------------------------------------------------------------------- */

/* Machine epsilon (the spacing of numbers at 1) of each storage dtype. */
double dtype_eps(fnorm_dtype t) {
  switch (t) {
  case FNORM_DTYPE_F16:
    return 9.765625e-4; /* 2^-10 */
  case FNORM_DTYPE_BF16:
    return 7.8125e-3; /* 2^-7 */
  default:
    return (double)FLT_EPSILON; /* 2^-23 */
  }
}

/* The spacing of the smallest (subnormal) numbers: the absolute rounding error floor. */
static double dtype_min_spacing(fnorm_dtype t) {
  switch (t) {
  case FNORM_DTYPE_F16:
    return 5.9604644775390625e-8; /* 2^-24 */
  case FNORM_DTYPE_BF16:
    return 9.183549615799121e-41; /* 2^-133 */
  default:
    return 1.401298464324817e-45; /* 2^-149 */
  }
}

const char *dtype_name(fnorm_dtype t) {
  switch (t) {
  case FNORM_DTYPE_SAME:
    return "same";
  case FNORM_DTYPE_F32:
    return "f32";
  case FNORM_DTYPE_F16:
    return "f16";
  case FNORM_DTYPE_BF16:
    return "bf16";
  }
  return "?";
}

const char *norm_name(fnorm_norm n) {
  return n == FNORM_LAYERNORM ? "ln" : n == FNORM_RMSNORM ? "rms" : "?";
}

fnorm_dtype resolved_param_dtype(const tcase *c) {
  return c->param_dtype == FNORM_DTYPE_SAME ? c->dtype : c->param_dtype;
}

static size_t esize_of(fnorm_dtype t) {
  return t == FNORM_DTYPE_F32 ? 4 : 2;
}

double load_elem(const void *p, fnorm_dtype t) {
  if (t == FNORM_DTYPE_F32) {
    float f;
    memcpy(&f, p, sizeof f);
    return f;
  } else {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return t == FNORM_DTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
}

void store_elem(void *p, fnorm_dtype t, double v) {
  float f = (float)v;
  if (t == FNORM_DTYPE_F32) {
    memcpy(p, &f, sizeof f);
  } else {
    uint16_t h = t == FNORM_DTYPE_F16 ? f32_to_f16(f) : f32_to_bf16(f);
    memcpy(p, &h, sizeof h);
  }
}

/* The value v takes once stored in dtype t. */
static double quantize(fnorm_dtype t, double v) {
  unsigned char tmp[4];
  store_elem(tmp, t, v);
  return load_elem(tmp, t);
}

/* 4 + 2 log2(n): the reduction-depth allowance of a tolerance, in units of fp32 eps. A sum of
 * n terms computed pairwise or in blocks in fp32 has a relative error (to the sum of the
 * absolute values) of about log2(n) eps, which this covers with room to spare. */
static double reduction_factor(int64_t n) {
  int depth = 0;
  while (depth < 62 && ((int64_t)1 << depth) < n)
    depth++;
  return 4.0 + 2.0 * depth;
}

/* ------------------------------------------------------------------------------------------
 * Buffers
 * ---------------------------------------------------------------------------------------- */

int tbuf_init(tbuf *t, int64_t rows, int64_t cols, int64_t stride, size_t esize, int offset,
              unsigned char fill) {
  size_t extent = ((size_t)(rows - 1) * (size_t)stride + (size_t)cols) * esize;
  memset(t, 0, sizeof *t);
  t->rows = rows;
  t->cols = cols;
  t->stride = stride;
  t->esize = esize;
  t->fill = fill;
  t->lead = GUARD_BYTES + (size_t)offset * esize;
  t->bytes = t->lead + extent + GUARD_BYTES;
  t->alloc = (unsigned char *)malloc(t->bytes + 64);
  if (t->alloc == NULL)
    return -1;
  t->host = t->alloc + (64 - (uintptr_t)t->alloc % 64) % 64;
  memset(t->host, fill, t->bytes);
  return 0;
}

void *tbuf_elem(const tbuf *t, int64_t row, int64_t col) {
  return t->host + t->lead + ((size_t)row * (size_t)t->stride + (size_t)col) * t->esize;
}

void *tbuf_ptr(const tbuf *t, const executor *e) {
  if (t->alloc == NULL)
    return NULL;
  if (e->put != NULL)
    return (unsigned char *)t->dev + t->lead;
  return t->host + t->lead;
}

void tbuf_poison(tbuf *t) {
  int64_t i;
  for (i = 0; i < t->rows; i++)
    memset(tbuf_elem(t, i, 0), POISON_BYTE, (size_t)t->cols * t->esize);
}

int tbuf_clone(tbuf *dst, const tbuf *src) {
  *dst = *src;
  dst->dev = NULL;
  dst->alloc = (unsigned char *)malloc(src->bytes + 64);
  if (dst->alloc == NULL)
    return -1;
  dst->host = dst->alloc + (64 - (uintptr_t)dst->alloc % 64) % 64;
  memcpy(dst->host, src->host, src->bytes);
  return 0;
}

void (*tbuf_device_free)(void *dev);

void tbuf_free(tbuf *t) {
  if (t->dev != NULL && tbuf_device_free != NULL)
    tbuf_device_free(t->dev);
  free(t->alloc);
  memset(t, 0, sizeof *t);
}

static int range_is(const unsigned char *p, size_t from, size_t to, unsigned char b, size_t *bad) {
  size_t k;
  for (k = from; k < to; k++)
    if (p[k] != b) {
      *bad = k;
      return 0;
    }
  return 1;
}

int tbuf_layout_intact(const tbuf *t, size_t *bad_offset) {
  size_t pos = 0, row_bytes = (size_t)t->cols * t->esize;
  int64_t i;
  for (i = 0; i < t->rows; i++) {
    size_t start = t->lead + (size_t)i * (size_t)t->stride * t->esize;
    if (!range_is(t->host, pos, start, t->fill, bad_offset))
      return 0;
    pos = start + row_bytes;
  }
  return range_is(t->host, pos, t->bytes, t->fill, bad_offset);
}

uint64_t bytes_hash(const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  uint64_t h = 1469598103934665603ull;
  size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    uint64_t w;
    memcpy(&w, b + k, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  for (; k < n; k++)
    h = (h ^ b[k]) * 0x100000001B3ull;
  return h;
}

/* ------------------------------------------------------------------------------------------
 * Case description
 * ---------------------------------------------------------------------------------------- */

const dtype_combo combos[N_COMBOS] = {{FNORM_DTYPE_F32, FNORM_DTYPE_SAME},
                                      {FNORM_DTYPE_F16, FNORM_DTYPE_SAME},
                                      {FNORM_DTYPE_F16, FNORM_DTYPE_F32},
                                      {FNORM_DTYPE_BF16, FNORM_DTYPE_SAME},
                                      {FNORM_DTYPE_BF16, FNORM_DTYPE_F32}};
const fnorm_norm norms[2] = {FNORM_LAYERNORM, FNORM_RMSNORM};

void tcase_option_variants(const tcase *base, const char *group,
                           void (*run)(const char *group, const tcase *c)) {
  int v;
  /* gamma, beta: both, weight without bias, none, bias without weight */
  for (v = 0; v < 4; v++) {
    tcase c = *base;
    c.gamma = (v == 0 || v == 1);
    c.beta = (v == 0 || v == 3);
    c.dgamma = c.gamma;
    c.dbeta = c.beta;
    run(group, &c);
  }
  /* forward statistics: the on/off patterns other than the default (RMSNorm has no mean) */
  for (v = 0; v < 3; v++) {
    tcase c = *base;
    c.bwd_x = c.bwd_y = 0;
    c.mean_out = v & 1;
    c.rstd_out = (v >> 1) & 1;
    if (c.mean_out && base->norm == FNORM_RMSNORM)
      continue;
    run(group, &c);
  }
  /* backward outputs: each alone, and pairs */
  for (v = 1; v < 7; v++) {
    tcase c = *base;
    c.fwd = 0;
    c.beta = 1; /* dbeta needs no beta, but the backward from y uses it when given */
    c.dx = v & 1;
    c.dgamma = (v >> 1) & 1;
    c.dbeta = (v >> 2) & 1;
    run(group, &c);
  }
  /* eps: large and tiny */
  {
    tcase c = *base;
    c.eps = 0.5f;
    run(group, &c);
    c.eps = 1e-12f;
    run(group, &c);
  }
}

void tcase_apply_layout(tcase *c, int v, int wide_aligned) {
  const int64_t n = c->cols;
  switch (v) {
  case 0: /* every stride different and larger than cols */
    c->x_stride = n + 3;
    c->y_stride = n + 5;
    c->dy_stride = n + 1;
    c->dx_stride = 2 * n + 7;
    break;
  case 1: /* the same, with every pointer one element off alignment */
    c->x_stride = n + 3;
    c->y_stride = n + 5;
    c->dy_stride = n + 1;
    c->dx_stride = 2 * n + 7;
    c->offset = 1;
    break;
  case 2: /* packed rows, pointers one element off */
    c->offset = 1;
    break;
  case 3: /* explicit strides */
    c->x_stride = c->y_stride = c->dy_stride = c->dx_stride =
        wide_aligned ? (n + 8 + 7) / 8 * 8 : n;
    break;
  case 4: /* in place, packed */
    c->inplace = 1;
    break;
  case 5: /* in place, strided, off alignment */
    c->inplace = 1;
    c->x_stride = n + 2;
    c->dy_stride = n + 4;
    c->offset = 1;
    break;
  case 6: /* one row with a huge (valid) stride: nothing may step to a next row */
    c->rows = 1;
    c->x_stride = c->y_stride = c->dy_stride = c->dx_stride = INT64_MAX;
    break;
  default:
    break;
  }
}

int64_t tcase_rows_for(int64_t n, int64_t budget, int64_t max_rows) {
  int64_t m = budget / n;
  return m < 1 ? 1 : (m > max_rows ? max_rows : m);
}

tcase tcase_default(fnorm_norm norm, fnorm_dtype dtype, fnorm_dtype param_dtype, int64_t rows,
                    int64_t cols) {
  tcase c;
  memset(&c, 0, sizeof c);
  c.norm = norm;
  c.dtype = dtype;
  c.param_dtype = param_dtype;
  c.rows = rows;
  c.cols = cols;
  c.gamma = 1;
  c.beta = norm == FNORM_LAYERNORM;
  c.mean_out = norm == FNORM_LAYERNORM;
  c.rstd_out = 1;
  c.fwd = c.bwd_x = c.bwd_y = 1;
  c.dx = c.dgamma = 1;
  c.dbeta = c.beta;
  c.eps = 1e-5f;
  return c;
}

void tcase_describe(const tcase *c, char *out, size_t out_size) {
  size_t n = 0;
#define APPEND(...)                                                                                \
  do {                                                                                             \
    if (n < out_size)                                                                              \
      n += (size_t)snprintf(out + n, out_size - n, __VA_ARGS__);                                   \
  } while (0)
  APPEND("%s %s/p%s N=%lld M=%lld", norm_name(c->norm), dtype_name(c->dtype),
         dtype_name(c->param_dtype), (long long)c->cols, (long long)c->rows);
  APPEND(" ops=%s%s%s", c->fwd ? "F" : "", c->bwd_x ? "Bx" : "", c->bwd_y ? "By" : "");
  APPEND(" gamma=%d beta=%d", c->gamma, c->beta);
  if (c->fwd)
    APPEND(" mean=%d rstd=%d", c->mean_out, c->rstd_out);
  if (c->bwd_x || c->bwd_y)
    APPEND(" dx=%d dgamma=%d dbeta=%d", c->dx, c->dgamma, c->dbeta);
  if (c->x_stride || c->y_stride || c->dy_stride || c->dx_stride)
    APPEND(" strides x=%lld y=%lld dy=%lld dx=%lld", (long long)c->x_stride, (long long)c->y_stride,
           (long long)c->dy_stride, (long long)c->dx_stride);
  if (c->offset)
    APPEND(" offset=%d", c->offset);
  if (c->inplace)
    APPEND(" inplace");
  if (c->input == INPUT_OFFSET_1E4)
    APPEND(" input=1e4+N(0,1)");
  if (c->input == INPUT_NONFINITE_X)
    APPEND(" input=nonfinite-x");
  if (c->input == INPUT_NONFINITE_DY)
    APPEND(" input=nonfinite-dy");
  if (c->eps != 1e-5f)
    APPEND(" eps=%g", (double)c->eps);
  if (c->cpu_threads)
    APPEND(" threads=%d", c->cpu_threads);
  if (c->use_null_stream)
    APPEND(" stream=legacy");
#undef APPEND
}

/* ------------------------------------------------------------------------------------------
 * Inputs and reference statistics
 * ---------------------------------------------------------------------------------------- */

typedef struct case_data {
  tcase c;                  /* with in-place strides made equal */
  fnorm_dtype pdtype;       /* resolved param dtype */
  int64_t xs, ys, dys, dxs; /* resolved strides */
  tbuf x, gamma, beta, dy, mean_in, rstd_in, y_in;
  long double *mean_ref, *rstd_ref, *absmean_ref; /* forward reference statistics, per row */
  /* INPUT_NONFINITE_*: 1 = a NaN in the row, 2 = an infinity at bad_col */
  unsigned char *row_bad;
  int64_t *bad_col;
  unsigned char *col_bad; /* INPUT_NONFINITE_DY: columns of dgamma/dbeta that see a NaN/Inf */
} case_data;

static void case_data_free(case_data *d) {
  tbuf_free(&d->x);
  tbuf_free(&d->gamma);
  tbuf_free(&d->beta);
  tbuf_free(&d->dy);
  tbuf_free(&d->mean_in);
  tbuf_free(&d->rstd_in);
  tbuf_free(&d->y_in);
  free(d->mean_ref);
  free(d->rstd_ref);
  free(d->absmean_ref);
  free(d->row_bad);
  free(d->bad_col);
  free(d->col_bad);
}

/* A random value as stored in t, never zero: uniform in [a, b), or normal with mean a and
 * standard deviation b. */
static double nonzero_value(rng *r, fnorm_dtype t, double a, double b, int normal) {
  for (;;) {
    double v = quantize(t, normal ? a + b * rng_normal(r) : rng_range(r, a, b));
    if (v != 0.0)
      return v;
  }
}

void ref_forward_row(fnorm_norm norm, int64_t n, const long double *x, const long double *gamma,
                     const long double *beta, long double eps, long double *y, long double *mean,
                     long double *rstd) {
  long double m = 0.0L, s = 0.0L;
  int64_t j;
  if (norm == FNORM_LAYERNORM) {
    for (j = 0; j < n; j++)
      m += x[j];
    m /= (long double)n;
    for (j = 0; j < n; j++)
      s += (x[j] - m) * (x[j] - m);
  } else {
    for (j = 0; j < n; j++)
      s += x[j] * x[j];
  }
  s = 1.0L / sqrtl(s / (long double)n + eps);
  if (y != NULL)
    for (j = 0; j < n; j++)
      y[j] = (x[j] - m) * s * (gamma ? gamma[j] : 1.0L) + (beta ? beta[j] : 0.0L);
  if (mean != NULL)
    *mean = m;
  if (rstd != NULL)
    *rstd = s;
}

static int case_data_init(case_data *d, const tcase *c0) {
  const tcase *c;
  rng r;
  int64_t i, j, M = c0->rows, N = c0->cols;
  size_t es;
  memset(d, 0, sizeof *d);
  d->c = *c0;
  if (d->c.inplace) {
    d->c.y_stride = d->c.x_stride;
    d->c.dx_stride = d->c.dy_stride;
  }
  /* Non-finite x is a forward test (a backward from it has nothing finite to compare), and
   * non-finite dy a backward one. */
  if (d->c.input == INPUT_NONFINITE_X)
    d->c.bwd_x = d->c.bwd_y = 0;
  if (d->c.input == INPUT_NONFINITE_DY)
    d->c.fwd = 0;
  c = &d->c;
  d->pdtype = resolved_param_dtype(c);
  es = esize_of(c->dtype);
  d->xs = c->x_stride ? c->x_stride : N;
  d->ys = c->y_stride ? c->y_stride : N;
  d->dys = c->dy_stride ? c->dy_stride : N;
  d->dxs = c->dx_stride ? c->dx_stride : N;
  r = rng_seeded(case_seed());

  d->mean_ref = (long double *)calloc((size_t)M, sizeof(long double));
  d->rstd_ref = (long double *)calloc((size_t)M, sizeof(long double));
  d->absmean_ref = (long double *)calloc((size_t)M, sizeof(long double));
  d->row_bad = (unsigned char *)calloc((size_t)M, 1);
  d->bad_col = (int64_t *)calloc((size_t)M, sizeof(int64_t));
  d->col_bad = (unsigned char *)calloc((size_t)N, 1);
  if (!d->mean_ref || !d->rstd_ref || !d->absmean_ref || !d->row_bad || !d->bad_col || !d->col_bad)
    return -1;

  if (tbuf_init(&d->x, M, N, d->xs, es, c->offset, INPUT_FILL_BYTE) ||
      tbuf_init(&d->dy, M, N, d->dys, es, c->offset, INPUT_FILL_BYTE) ||
      tbuf_init(&d->mean_in, 1, M, M, 4, c->offset, INPUT_FILL_BYTE) ||
      tbuf_init(&d->rstd_in, 1, M, M, 4, c->offset, INPUT_FILL_BYTE))
    return -1;
  if (c->gamma && tbuf_init(&d->gamma, 1, N, N, esize_of(d->pdtype), c->offset, INPUT_FILL_BYTE))
    return -1;
  if (c->beta && tbuf_init(&d->beta, 1, N, N, esize_of(d->pdtype), c->offset, INPUT_FILL_BYTE))
    return -1;
  if (c->bwd_y && tbuf_init(&d->y_in, M, N, d->ys, es, c->offset, INPUT_FILL_BYTE))
    return -1;

  /* Parameters: gamma around 1 and never 0 (the backward from y divides by it), beta small. */
  for (j = 0; j < N; j++) {
    if (c->gamma)
      store_elem(tbuf_elem(&d->gamma, 0, j), d->pdtype, nonzero_value(&r, d->pdtype, 0.5, 1.5, 0));
    if (c->beta)
      store_elem(tbuf_elem(&d->beta, 0, j), d->pdtype, nonzero_value(&r, d->pdtype, -0.5, 0.5, 0));
  }
  /* x: each row with its own mean and spread, so that per-row statistics are exercised. Each
   * row draws from its own stream (the case's seed and the row), so that rows are made in
   * parallel and the same on any thread count. */
  {
    const uint64_t seed = case_seed();
    const int64_t nblk = par_blocks(M);
    TESTS_PARALLEL_FOR
    for (i = 0; i < nblk; i++) {
      int64_t q, k;
      for (q = par_lo(M, nblk, i); q < par_lo(M, nblk, i + 1); q++) {
        rng rr = rng_seeded(rng_mix(seed ^ rng_mix((uint64_t)q + 1)));
        double shift = rng_range(&rr, -1.0, 1.0), scale = rng_range(&rr, 0.5, 2.0);
        if (c->input == INPUT_OFFSET_1E4) {
          shift = 1e4;
          scale = 1.0;
        }
        for (k = 0; k < N; k++)
          store_elem(tbuf_elem(&d->x, q, k), c->dtype,
                     nonzero_value(&rr, c->dtype, shift, scale, 1));
        for (k = 0; k < N; k++)
          store_elem(tbuf_elem(&d->dy, q, k), c->dtype, nonzero_value(&rr, c->dtype, 0.0, 1.0, 1));
      }
    }
  }
  if (c->input == INPUT_NONFINITE_X) {
    /* Row 1: a NaN; row 3: +Inf; row 4: -Inf (rows that exist). */
    static const int bad_rows[3] = {1, 3, 4};
    static const double bad_values[3] = {NAN, INFINITY, -INFINITY};
    int k;
    for (k = 0; k < 3; k++) {
      int64_t row = bad_rows[k], col = (k == 0) ? N / 2 : (k == 1 ? 0 : N - 1);
      if (row >= M)
        continue;
      store_elem(tbuf_elem(&d->x, row, col), c->dtype, bad_values[k]);
      d->row_bad[row] = (unsigned char)(k == 0 ? 1 : 2);
      d->bad_col[row] = col;
    }
  }
  if (c->input == INPUT_NONFINITE_DY) {
    /* dy[0][N-1] = NaN and dy[2][0] = +Inf: those rows of dx, those columns of dgamma/dbeta. */
    store_elem(tbuf_elem(&d->dy, 0, N - 1), c->dtype, NAN);
    d->row_bad[0] = 1;
    d->bad_col[0] = N - 1;
    d->col_bad[N - 1] = 1;
    if (M > 2) {
      store_elem(tbuf_elem(&d->dy, 2, 0), c->dtype, INFINITY);
      d->row_bad[2] = 2;
      d->bad_col[2] = 0;
      d->col_bad[0] = 1;
    }
  }

  /* Reference statistics from the stored (quantized) x, and the backward's fp32 inputs. */
  {
    long double *g = (long double *)malloc((size_t)N * sizeof(long double));
    long double *b = (long double *)malloc((size_t)N * sizeof(long double));
    const int64_t nblk = par_blocks(M);
    unsigned char failed[PAR_BLOCKS_MAX] = {0}; /* a block's own flag: no memory for its buffers */
    if (!g || !b) {
      free(g);
      free(b);
      return -1;
    }
    for (j = 0; j < N; j++) {
      g[j] = c->gamma ? load_elem(tbuf_elem(&d->gamma, 0, j), d->pdtype) : 1.0;
      b[j] = c->beta ? load_elem(tbuf_elem(&d->beta, 0, j), d->pdtype) : 0.0;
    }
    TESTS_PARALLEL_FOR
    for (i = 0; i < nblk; i++) {
      long double *row = (long double *)malloc((size_t)N * sizeof(long double));
      long double *yrow = (long double *)malloc((size_t)N * sizeof(long double));
      int64_t q, k;
      if (!row || !yrow) {
        failed[i] = 1;
      } else {
        for (q = par_lo(M, nblk, i); q < par_lo(M, nblk, i + 1); q++) {
          long double absum = 0.0L;
          float mf, rf;
          for (k = 0; k < N; k++) {
            row[k] = load_elem(tbuf_elem(&d->x, q, k), c->dtype);
            absum += fabsl(row[k]);
          }
          ref_forward_row(c->norm, N, row, g, b, (long double)c->eps, yrow, &d->mean_ref[q],
                          &d->rstd_ref[q]);
          d->absmean_ref[q] = absum / (long double)N;
          mf = (float)d->mean_ref[q];
          rf = (float)d->rstd_ref[q];
          memcpy(tbuf_elem(&d->mean_in, 0, q), &mf, 4);
          memcpy(tbuf_elem(&d->rstd_in, 0, q), &rf, 4);
          if (c->bwd_y)
            for (k = 0; k < N; k++)
              store_elem(tbuf_elem(&d->y_in, q, k), c->dtype, (double)yrow[k]);
        }
      }
      free(row);
      free(yrow);
    }
    free(g);
    free(b);
    for (i = 0; i < nblk; i++)
      if (failed[i])
        return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------------------------------
 * Error tracking: every element is compared; the worst one (by error/tolerance) is reported.
 * ---------------------------------------------------------------------------------------- */

typedef struct err_track {
  long checked, bad;
  double worst_ratio;
  int64_t row, col;
  double got, tol;
  long double want;
} err_track;

static void track(err_track *t, int64_t row, int64_t col, double got, long double want,
                  double tol) {
  double err = fabs(got - (double)want);
  double ratio = err / tol;
  t->checked++;
  if (!(err <= tol)) { /* also true when got (or want) is NaN */
    t->bad++;
    if (isnan(ratio))
      ratio = INFINITY;
  } else if (isnan(ratio)) {
    ratio = 0.0; /* 0 / 0: exact where nothing was allowed */
  }
  if (t->checked == 1 || ratio > t->worst_ratio) {
    t->worst_ratio = ratio;
    t->row = row;
    t->col = col;
    t->got = got;
    t->want = want;
    t->tol = tol;
  }
}

/* src's elements added to dst's, src coming after them (as if tracked in one pass over both). */
static void track_merge(err_track *dst, const err_track *src) {
  const long checked = dst->checked + src->checked, bad = dst->bad + src->bad;
  if (src->checked == 0)
    return;
  if (dst->checked == 0 || src->worst_ratio > dst->worst_ratio)
    *dst = *src;
  dst->checked = checked;
  dst->bad = bad;
}

static void track_report(const err_track *t, const char *op, const char *what) {
  if (t->checked == 0)
    return;
  case_note_ratio(t->worst_ratio);
  if (g_opt.verbose > 1)
    printf("     %s: %s: worst err/tol %.3g at row %lld col %lld (err %.3g, tol %.3g)\n", op, what,
           t->worst_ratio, (long long)t->row, (long long)t->col, fabs(t->got - (double)t->want),
           t->tol);
  if (t->bad == 0)
    return;
  case_fail("%s: %s: %ld of %ld elements out of tolerance; worst at row %lld col %lld: got "
            "%.9g want %.9Lg (err %.3g, tol %.3g)",
            op, what, t->bad, t->checked, (long long)t->row, (long long)t->col, t->got, t->want,
            fabs(t->got - (double)t->want), t->tol);
}

/* A value the library must have made non-finite (NaN/Inf confined to its row/column). */
static void expect_nonfinite(const char *op, const char *what, int64_t row, int64_t col,
                             double got) {
  if (isfinite(got))
    case_fail("%s: %s[%lld][%lld] = %.9g should be NaN or Inf (its input was)", op, what,
              (long long)row, (long long)col, got);
}

static void check_layout(const char *op, const char *what, const tbuf *t) {
  size_t bad;
  if (t->alloc != NULL && !tbuf_layout_intact(t, &bad))
    case_fail("%s: %s: byte %zu of its image (guard or gap between rows, element area starts "
              "at %zu) was overwritten: 0x%02x",
              op, what, bad, t->lead, t->host[bad]);
}

/* ------------------------------------------------------------------------------------------
 * Executing one operation
 * ---------------------------------------------------------------------------------------- */

typedef struct op_result {
  tbuf out[3]; /* forward: y, mean, rstd. backward: dx, dgamma, dbeta */
  fnorm_status status;
} op_result;

static const char *const fwd_out_names[3] = {"y", "mean", "rstd"};
static const char *const bwd_out_names[3] = {"dx", "dgamma", "dbeta"};

static void op_result_free(op_result *r) {
  int k;
  for (k = 0; k < 3; k++)
    tbuf_free(&r->out[k]);
}

static void *stream_of(const executor *e, const tcase *c) {
  return c->use_null_stream ? NULL : e->stream;
}

static int put(const executor *e, const tcase *c, tbuf *t) {
  if (e->put == NULL || t->alloc == NULL)
    return 0;
  return e->put(t, stream_of(e, c));
}

/* Hash of a buffer's image where the executor keeps it. */
static int image_hash(const executor *e, const tcase *c, const tbuf *t, uint64_t *hash) {
  tbuf copy;
  int rc;
  if (e->get == NULL || t->alloc == NULL) {
    *hash = t->alloc ? bytes_hash(t->host, t->bytes) : 0;
    return 0;
  }
  copy = *t;
  copy.alloc = (unsigned char *)malloc(t->bytes + 64);
  if (copy.alloc == NULL)
    return -1;
  copy.host = copy.alloc + (64 - (uintptr_t)copy.alloc % 64) % 64;
  rc = e->get(&copy, stream_of(e, c));
  *hash = bytes_hash(copy.host, copy.bytes);
  free(copy.alloc);
  return rc;
}

/* Runs the call, waits, brings outputs back and checks that inputs and layouts are intact.
 * inputs: the buffers the call reads (their images must not change). Returns 0 if the
 * executor worked (whatever the status), -1 if it failed (already reported). */
static int finish_call(const executor *e, const tcase *c, const char *op, tbuf *const *inputs,
                       int n_inputs, const uint64_t *hashes_before, op_result *r,
                       const char *const *out_names, tbuf *ws) {
  char message[256];
  int k;
  if (e->sync != NULL && e->sync(stream_of(e, c), message, sizeof message) != 0) {
    case_fail("%s on %s: %s", op, e->name, message);
    return -1;
  }
  for (k = 0; k < 3; k++)
    if (e->get != NULL && r->out[k].alloc != NULL && e->get(&r->out[k], stream_of(e, c)) != 0) {
      case_fail("%s on %s: copying %s back failed", op, e->name, out_names[k]);
      return -1;
    }
  if (ws != NULL && e->get != NULL && ws->alloc != NULL && e->get(ws, stream_of(e, c)) != 0) {
    case_fail("%s on %s: copying the workspace back failed", op, e->name);
    return -1;
  }
  for (k = 0; k < n_inputs; k++) {
    uint64_t h;
    if (inputs[k]->alloc == NULL)
      continue;
    if (image_hash(e, c, inputs[k], &h) != 0) {
      case_fail("%s on %s: copying an input back failed", op, e->name);
      return -1;
    }
    if (h != hashes_before[k])
      case_fail("%s on %s: input buffer #%d (or its guard bytes) was modified", op, e->name, k);
  }
  {
    char where[96];
    snprintf(where, sizeof where, "%s on %s", op, e->name);
    for (k = 0; k < 3; k++)
      check_layout(where, out_names[k], &r->out[k]);
    if (ws != NULL)
      check_layout(where, "workspace", ws);
  }
  return 0;
}

static void fill_desc(fnorm_desc *desc, const executor *e, const case_data *d) {
  const tcase *c = &d->c;
  fnorm_desc_init(desc, e->device, c->norm, c->dtype, c->rows, c->cols);
  desc->param_dtype = c->param_dtype;
  desc->eps = c->eps;
  desc->x_stride = c->x_stride;
  desc->y_stride = c->y_stride;
  desc->dy_stride = c->dy_stride;
  desc->dx_stride = c->dx_stride;
  desc->cpu_threads = c->cpu_threads;
}

static int exec_forward(const executor *e, case_data *d, op_result *r) {
  const tcase *c = &d->c;
  tbuf *inputs[3];
  uint64_t hashes[3];
  int n_inputs = 0, k;
  fnorm_desc desc;
  fnorm_forward_args a;
  memset(r, 0, sizeof *r);
  if (c->inplace ? tbuf_clone(&r->out[0], &d->x)
                 : tbuf_init(&r->out[0], c->rows, c->cols, d->ys, esize_of(c->dtype), c->offset,
                             OUTPUT_FILL_BYTE)) {
    case_fail("forward: out of host memory");
    return -1;
  }
  if (!c->inplace)
    tbuf_poison(&r->out[0]);
  for (k = 1; k <= 2; k++) {
    if (!(k == 1 ? c->mean_out : c->rstd_out))
      continue;
    if (tbuf_init(&r->out[k], 1, c->rows, c->rows, 4, c->offset, OUTPUT_FILL_BYTE)) {
      case_fail("forward: out of host memory");
      return -1;
    }
    tbuf_poison(&r->out[k]);
  }
  if (!c->inplace)
    inputs[n_inputs++] = &d->x;
  inputs[n_inputs++] = &d->gamma;
  inputs[n_inputs++] = &d->beta;
  for (k = 0; k < n_inputs; k++)
    hashes[k] = inputs[k]->alloc ? bytes_hash(inputs[k]->host, inputs[k]->bytes) : 0;
  for (k = 0; k < n_inputs; k++)
    if (put(e, c, inputs[k]) != 0) {
      case_fail("forward on %s: copying inputs to the device failed", e->name);
      return -1;
    }
  for (k = 0; k < 3; k++)
    if (put(e, c, &r->out[k]) != 0) {
      case_fail("forward on %s: copying outputs to the device failed", e->name);
      return -1;
    }

  fill_desc(&desc, e, d);
  memset(&a, 0, sizeof a);
  a.y = tbuf_ptr(&r->out[0], e);
  a.x = c->inplace ? a.y : tbuf_ptr(&d->x, e);
  a.gamma = tbuf_ptr(&d->gamma, e);
  a.beta = tbuf_ptr(&d->beta, e);
  a.mean = (float *)tbuf_ptr(&r->out[1], e);
  a.rstd = (float *)tbuf_ptr(&r->out[2], e);
  r->status = fnorm_forward(&desc, &a, stream_of(e, c));
  return finish_call(e, c, "forward", inputs, n_inputs, hashes, r, fwd_out_names, NULL);
}

static int exec_backward(const executor *e, case_data *d, int from_y, op_result *r) {
  const tcase *c = &d->c;
  const char *op = from_y ? "backward-from-y" : "backward";
  tbuf *inputs[7];
  uint64_t hashes[7];
  int n_inputs = 0, k, rc;
  fnorm_desc desc;
  fnorm_backward_args a;
  fnorm_status st;
  size_t ws_bytes = 0;
  tbuf ws;
  int dx_shares_dy = c->inplace && c->dx;
  memset(r, 0, sizeof *r);
  memset(&ws, 0, sizeof ws);

  if (c->dx) {
    if (dx_shares_dy ? tbuf_clone(&r->out[0], &d->dy)
                     : tbuf_init(&r->out[0], c->rows, c->cols, d->dxs, esize_of(c->dtype),
                                 c->offset, OUTPUT_FILL_BYTE)) {
      case_fail("%s: out of host memory", op);
      return -1;
    }
    if (!dx_shares_dy)
      tbuf_poison(&r->out[0]);
  }
  for (k = 1; k <= 2; k++) {
    if (!(k == 1 ? c->dgamma : c->dbeta))
      continue;
    if (tbuf_init(&r->out[k], 1, c->cols, c->cols, esize_of(d->pdtype), c->offset,
                  OUTPUT_FILL_BYTE)) {
      case_fail("%s: out of host memory", op);
      return -1;
    }
    tbuf_poison(&r->out[k]);
  }

  fill_desc(&desc, e, d);
  st = fnorm_backward_workspace_size(&desc, &ws_bytes);
  if (st != FNORM_SUCCESS) {
    case_fail("%s on %s: workspace query returned %s", op, e->name, fnorm_status_name(st));
    return -1;
  }
  if (ws_bytes > 0) {
    /* Poisoned: the workspace must never be read before it is written. */
    if (tbuf_init(&ws, 1, (int64_t)ws_bytes, (int64_t)ws_bytes, 1, 0, OUTPUT_FILL_BYTE)) {
      case_fail("%s: out of host memory (workspace of %zu bytes)", op, ws_bytes);
      return -1;
    }
    tbuf_poison(&ws);
  }

  if (!dx_shares_dy)
    inputs[n_inputs++] = &d->dy;
  inputs[n_inputs++] = from_y ? &d->y_in : &d->x;
  if (!from_y && c->norm == FNORM_LAYERNORM)
    inputs[n_inputs++] = &d->mean_in;
  inputs[n_inputs++] = &d->rstd_in;
  inputs[n_inputs++] = &d->gamma;
  if (from_y)
    inputs[n_inputs++] = &d->beta;
  for (k = 0; k < n_inputs; k++)
    hashes[k] = inputs[k]->alloc ? bytes_hash(inputs[k]->host, inputs[k]->bytes) : 0;
  rc = 0;
  for (k = 0; k < n_inputs; k++)
    rc |= put(e, c, inputs[k]);
  for (k = 0; k < 3; k++)
    rc |= put(e, c, &r->out[k]);
  rc |= put(e, c, &ws);
  if (rc != 0) {
    case_fail("%s on %s: copying buffers to the device failed", op, e->name);
    tbuf_free(&ws);
    return -1;
  }

  memset(&a, 0, sizeof a);
  a.dx = tbuf_ptr(&r->out[0], e);
  a.dy = dx_shares_dy ? a.dx : tbuf_ptr(&d->dy, e);
  if (from_y) {
    a.y = tbuf_ptr(&d->y_in, e);
    a.beta = tbuf_ptr(&d->beta, e);
  } else {
    a.x = tbuf_ptr(&d->x, e);
    if (c->norm == FNORM_LAYERNORM)
      a.mean = (const float *)tbuf_ptr(&d->mean_in, e);
  }
  a.rstd = (const float *)tbuf_ptr(&d->rstd_in, e);
  a.gamma = tbuf_ptr(&d->gamma, e);
  a.dgamma = tbuf_ptr(&r->out[1], e);
  a.dbeta = tbuf_ptr(&r->out[2], e);
  r->status = fnorm_backward(&desc, &a, tbuf_ptr(&ws, e), ws_bytes, stream_of(e, c));
  rc = finish_call(e, c, op, inputs, n_inputs, hashes, r, bwd_out_names, &ws);
  tbuf_free(&ws);
  return rc;
}

/* ------------------------------------------------------------------------------------------
 * Checks against the reference
 * ---------------------------------------------------------------------------------------- */

/* Tolerances. An element computed in fp32 (or wider) and then rounded to nearest in the
 * output dtype differs from the exact answer by at most half a unit of the output dtype
 * (0.5 * eps_out * |want|, or half the subnormal spacing) plus the fp32 arithmetic error,
 * bounded by reduction_factor * eps_fp32 * cond, where cond sums the magnitudes the
 * computation goes through (so cancellation is allowed for, and nothing more). A kernel that
 * truncates, or rounds an intermediate to 16 bits, exceeds this. */

/* check_forward's trackers: y, mean and rstd against the reference, then against the other run. */
enum { TRACK_Y, TRACK_MEAN, TRACK_RSTD, TRACK_OY, TRACK_OMEAN, TRACK_ORSTD, TRACK_FWD };

static void check_forward(const case_data *d, const op_result *r, const op_result *other,
                          const char *op) {
  const tcase *c = &d->c;
  int64_t i, j, b, N = c->cols;
  const int64_t nblk = par_blocks(c->rows);
  double eps_out = dtype_eps(c->dtype), floor_out = dtype_min_spacing(c->dtype);
  double eps32 = (double)FLT_EPSILON, red = reduction_factor(N);
  err_track t[TRACK_FWD], (*blk)[TRACK_FWD];
  int strict = c->input == INPUT_OFFSET_1E4;
  char op2[160];
  memset(t, 0, sizeof t);
  snprintf(op2, sizeof op2, "%s vs cpu", op);
  blk = (err_track(*)[TRACK_FWD])calloc((size_t)(nblk > 0 ? nblk : 1), sizeof *blk);
  if (!blk) {
    case_fail("%s: out of host memory for the comparison", op);
    return;
  }

  /* The finite rows, a block of rows at a time. */
  TESTS_PARALLEL_FOR
  for (b = 0; b < nblk; b++) {
    err_track *tb = blk[b];
    int64_t q, k;
    for (q = par_lo(c->rows, nblk, b); q < par_lo(c->rows, nblk, b + 1); q++) {
      long double mean = d->mean_ref[q], rstd = d->rstd_ref[q], absmean = d->absmean_ref[q];
      if (d->row_bad[q])
        continue;
      if (c->norm == FNORM_RMSNORM)
        absmean = 0.0L; /* no mean is subtracted: nothing to cancel */
      for (k = 0; k < N; k++) {
        long double x = load_elem(tbuf_elem(&d->x, q, k), c->dtype);
        long double g = c->gamma ? load_elem(tbuf_elem(&d->gamma, 0, k), d->pdtype) : 1.0L;
        long double be = c->beta ? load_elem(tbuf_elem(&d->beta, 0, k), d->pdtype) : 0.0L;
        long double xhat = (x - mean) * rstd;
        long double want = xhat * g + be;
        /* xhat's error: from x - mean (or x*rstd - mean*rstd) and the mean's own sum. For the
         * 1e4 + N(0,1) input the brief asks for a few fp32 ulps of the answer: the error
         * allowed is relative to xhat (~1), not to x*rstd (~1e4), so the statistics must not
         * lose the low bits of x (shifted or compensated sums; fp32 x - mean is exact). */
        double xerr = strict ? (double)(fabsl(xhat) + 1.0L) : (double)((fabsl(x) + absmean) * rstd);
        double cond = fabs((double)g) * (xerr + fabs((double)xhat)) + fabs((double)be);
        double tol = 0.5 * (eps_out * fabs((double)want) + floor_out) + red * eps32 * cond;
        double got = load_elem(tbuf_elem(&r->out[0], q, k), c->dtype);
        track(&tb[TRACK_Y], q, k, got, want, tol);
        if (other)
          track(&tb[TRACK_OY], q, k, got, load_elem(tbuf_elem(&other->out[0], q, k), c->dtype),
                2 * tol);
      }
      if (r->out[1].alloc) {
        double tol = eps32 * fabs((double)mean) + red * eps32 * (double)d->absmean_ref[q];
        double got = load_elem(tbuf_elem(&r->out[1], 0, q), FNORM_DTYPE_F32);
        track(&tb[TRACK_MEAN], 0, q, got, mean, tol);
        if (other)
          track(&tb[TRACK_OMEAN], 0, q, got,
                load_elem(tbuf_elem(&other->out[1], 0, q), FNORM_DTYPE_F32), 2 * tol);
      }
      if (r->out[2].alloc) {
        double tol = red * eps32 * (double)rstd;
        double got = load_elem(tbuf_elem(&r->out[2], 0, q), FNORM_DTYPE_F32);
        track(&tb[TRACK_RSTD], 0, q, got, rstd, tol);
        if (other)
          track(&tb[TRACK_ORSTD], 0, q, got,
                load_elem(tbuf_elem(&other->out[2], 0, q), FNORM_DTYPE_F32), 2 * tol);
      }
    }
  }
  for (b = 0; b < nblk; b++)
    for (j = 0; j < TRACK_FWD; j++)
      track_merge(&t[j], &blk[b][j]);
  free(blk);
  /* NaN in a row: all of that row's outputs are NaN/Inf. Inf: at least its element. */
  for (i = 0; i < c->rows; i++) {
    if (d->row_bad[i] == 1) {
      for (j = 0; j < N; j++)
        expect_nonfinite(op, "y", i, j, load_elem(tbuf_elem(&r->out[0], i, j), c->dtype));
      if (r->out[1].alloc)
        expect_nonfinite(op, "mean", 0, i, load_elem(tbuf_elem(&r->out[1], 0, i), FNORM_DTYPE_F32));
      if (r->out[2].alloc)
        expect_nonfinite(op, "rstd", 0, i, load_elem(tbuf_elem(&r->out[2], 0, i), FNORM_DTYPE_F32));
    } else if (d->row_bad[i]) {
      expect_nonfinite(op, "y", i, d->bad_col[i],
                       load_elem(tbuf_elem(&r->out[0], i, d->bad_col[i]), c->dtype));
    }
  }
  track_report(&t[TRACK_Y], op, "y");
  track_report(&t[TRACK_MEAN], op, "mean");
  track_report(&t[TRACK_RSTD], op, "rstd");
  track_report(&t[TRACK_OY], op2, "y");
  track_report(&t[TRACK_OMEAN], op2, "mean");
  track_report(&t[TRACK_ORSTD], op2, "rstd");
}

/* Element (i, j) of the backward's reference: dy, gamma, and xhat with the bound of its error
 * (from y: recomputed as (y - beta) / gamma); mean and rstd are row i's inputs. */
static void bwd_ref_elem(const case_data *d, int from_y, int strict, int64_t i, int64_t j,
                         long double mean, long double rstd, long double *dy, long double *g,
                         long double *xhat, long double *xerr) {
  const tcase *c = &d->c;
  *dy = load_elem(tbuf_elem(&d->dy, i, j), c->dtype);
  *g = c->gamma ? load_elem(tbuf_elem(&d->gamma, 0, j), d->pdtype) : 1.0L;
  if (from_y) {
    long double b = c->beta ? load_elem(tbuf_elem(&d->beta, 0, j), d->pdtype) : 0.0L;
    long double y = load_elem(tbuf_elem(&d->y_in, i, j), c->dtype);
    *xhat = (y - b) / *g;
    *xerr = (fabsl(y) + fabsl(b)) / fabsl(*g);
  } else {
    long double x = load_elem(tbuf_elem(&d->x, i, j), c->dtype);
    *xhat = (x - mean) * rstd;
    *xerr = strict ? fabsl(*xhat) + 1.0L : (fabsl(x) + fabsl(mean)) * rstd;
  }
}

/* Row i's mean (LayerNorm from x; else 0) and rstd, as the backward takes them. */
static void bwd_ref_stats(const case_data *d, int from_y, int64_t i, long double *mean,
                          long double *rstd) {
  *rstd = load_elem(tbuf_elem(&d->rstd_in, 0, i), FNORM_DTYPE_F32);
  *mean = 0.0L;
  if (!from_y && d->c.norm == FNORM_LAYERNORM)
    *mean = load_elem(tbuf_elem(&d->mean_in, 0, i), FNORM_DTYPE_F32);
}

static void check_backward(const case_data *d, int from_y, const op_result *r,
                           const op_result *other, const char *op) {
  const tcase *c = &d->c;
  int64_t i, j, b, N = c->cols, M = c->rows;
  const int64_t nblk = par_blocks(M), nblk_cols = par_blocks(N);
  double eps_out = dtype_eps(c->dtype), floor_out = dtype_min_spacing(c->dtype);
  double eps_p = dtype_eps(d->pdtype), floor_p = dtype_min_spacing(d->pdtype);
  double eps32 = (double)FLT_EPSILON, red_n = reduction_factor(N), red_m = reduction_factor(M);
  long double *cols = NULL;
  int strict = c->input == INPUT_OFFSET_1E4;  /* see check_forward */
  unsigned char failed[PAR_BLOCKS_MAX] = {0}; /* a block's own flag: no memory for its buffers */
  err_track tdx, tdg, tdb, odx, odg, odb, (*blk)[2] = NULL;
  char op2[160];
  memset(&tdx, 0, sizeof tdx);
  tdg = tdb = odx = odg = odb = tdx;
  snprintf(op2, sizeof op2, "%s vs cpu", op);

  /* dx, a block of rows at a time: each row's sums, then its elements (the rows with a NaN or
   * an infinity in dy after). */
  if (r->out[0].alloc) {
    blk = (err_track(*)[2])calloc((size_t)(nblk > 0 ? nblk : 1), sizeof *blk);
    if (!blk) {
      case_fail("%s: out of host memory for the comparison", op);
      return;
    }
    TESTS_PARALLEL_FOR
    for (b = 0; b < nblk; b++) {
      long double *xhat = (long double *)malloc((size_t)N * sizeof(long double));
      long double *xerr = (long double *)malloc((size_t)N * sizeof(long double));
      long double *gr = (long double *)malloc((size_t)N * sizeof(long double));
      int64_t q, k;
      if (!xhat || !xerr || !gr)
        failed[b] = 1;
      for (q = par_lo(M, nblk, b); q < par_lo(M, nblk, b + 1) && !failed[b]; q++) {
        long double mean, rstd, n = (long double)N;
        long double sum_g = 0, sum_gx = 0, sum_abs_g = 0, sum_abs_gx = 0, sum_abs_g_xerr = 0;
        long double mg, mgx;
        double a, bt, be;
        if (d->row_bad[q])
          continue;
        bwd_ref_stats(d, from_y, q, &mean, &rstd);
        for (k = 0; k < N; k++) {
          long double dy, g;
          bwd_ref_elem(d, from_y, strict, q, k, mean, rstd, &dy, &g, &xhat[k], &xerr[k]);
          gr[k] = dy * g;
          sum_g += gr[k];
          sum_gx += gr[k] * xhat[k];
          sum_abs_g += fabsl(gr[k]);
          sum_abs_gx += fabsl(gr[k] * xhat[k]);
          sum_abs_g_xerr += fabsl(gr[k]) * xerr[k];
        }
        mg = c->norm == FNORM_LAYERNORM ? sum_g / n : 0.0L;
        mgx = sum_gx / n;
        a = (double)(sum_abs_g / n);
        bt = (double)(sum_abs_gx / n);
        be = (double)(sum_abs_g_xerr / n);
        for (k = 0; k < N; k++) {
          long double want = rstd * (gr[k] - mg - xhat[k] * mgx);
          double cond = (double)rstd * (fabs((double)gr[k]) + a + (double)xerr[k] * bt +
                                        fabs((double)xhat[k]) * (bt + be));
          double tol = 0.5 * (eps_out * fabs((double)want) + floor_out) + red_n * eps32 * cond;
          double got = load_elem(tbuf_elem(&r->out[0], q, k), c->dtype);
          track(&blk[b][0], q, k, got, want, tol);
          if (other)
            track(&blk[b][1], q, k, got, load_elem(tbuf_elem(&other->out[0], q, k), c->dtype),
                  2 * tol);
        }
      }
      free(xhat);
      free(xerr);
      free(gr);
    }
    for (b = 0; b < nblk; b++) {
      track_merge(&tdx, &blk[b][0]);
      track_merge(&odx, &blk[b][1]);
      if (failed[b]) {
        case_fail("%s: out of host memory for the reference", op);
        goto done;
      }
    }
    for (i = 0; i < M; i++)
      if (d->row_bad[i])
        expect_nonfinite(op, "dx", i, d->bad_col[i],
                         load_elem(tbuf_elem(&r->out[0], i, d->bad_col[i]), c->dtype));
  }

  /* dgamma and dbeta: their reference sums (and the sums of magnitudes that bound their error),
   * a block of columns at a time, each column over the rows in order. */
  if (r->out[1].alloc || r->out[2].alloc) {
    cols = (long double *)calloc((size_t)N * 4, sizeof(long double));
    if (!cols) {
      case_fail("%s: out of host memory for the reference", op);
      goto done;
    }
    TESTS_PARALLEL_FOR
    for (b = 0; b < nblk_cols; b++) {
      const int64_t lo = par_lo(N, nblk_cols, b), hi = par_lo(N, nblk_cols, b + 1);
      int64_t q, k;
      for (q = 0; q < M; q++) {
        long double mean, rstd;
        bwd_ref_stats(d, from_y, q, &mean, &rstd);
        for (k = lo; k < hi; k++) {
          long double dy, g, xhat, xerr;
          if (d->col_bad[k])
            continue;
          bwd_ref_elem(d, from_y, strict, q, k, mean, rstd, &dy, &g, &xhat, &xerr);
          cols[k] += dy * xhat;                            /* dgamma */
          cols[N + k] += fabsl(dy) * (fabsl(xhat) + xerr); /* its cond */
          cols[2 * N + k] += dy;                           /* dbeta */
          cols[3 * N + k] += fabsl(dy);                    /* its cond */
        }
      }
    }
  }
  for (j = 0; j < N && cols; j++) {
    int k;
    for (k = 1; k <= 2; k++) {
      const long double want = cols[(k - 1) * 2 * N + j];
      double cond = (double)cols[(k - 1) * 2 * N + N + j];
      double tol, got;
      if (!r->out[k].alloc)
        continue;
      got = load_elem(tbuf_elem(&r->out[k], 0, j), d->pdtype);
      if (d->col_bad[j]) {
        expect_nonfinite(op, bwd_out_names[k], 0, j, got);
        continue;
      }
      tol = 0.5 * (eps_p * fabs((double)want) + floor_p) + red_m * eps32 * cond;
      track(k == 1 ? &tdg : &tdb, 0, j, got, want, tol);
      if (other)
        track(k == 1 ? &odg : &odb, 0, j, got,
              load_elem(tbuf_elem(&other->out[k], 0, j), d->pdtype), 2 * tol);
    }
  }
  track_report(&tdx, op, "dx");
  track_report(&tdg, op, "dgamma");
  track_report(&tdb, op, "dbeta");
  track_report(&odx, op2, "dx");
  track_report(&odg, op2, "dgamma");
  track_report(&odb, op2, "dbeta");
done:
  free(blk);
  free(cols);
}

/* Bitwise equality of two runs' outputs (the determinism the header promises). */
static void check_same_bits(const op_result *a, const op_result *b, const char *const *names,
                            const char *op) {
  int k;
  for (k = 0; k < 3; k++) {
    size_t n;
    if (!a->out[k].alloc)
      continue;
    for (n = 0; n < a->out[k].bytes; n++)
      if (a->out[k].host[n] != b->out[k].host[n])
        break;
    if (n < a->out[k].bytes)
      case_fail("%s: run-to-run: %s differs bitwise (first at image byte %zu)", op, names[k], n);
  }
}

/* ------------------------------------------------------------------------------------------
 * One case
 * ---------------------------------------------------------------------------------------- */

static void run_op(case_data *d, int which, const executor *e, const executor *also, int repeat) {
  static const char *const op_names[3] = {"forward", "backward", "backward-from-y"};
  const char *const *names = which == 0 ? fwd_out_names : bwd_out_names;
  op_result r, r_also, r_again;
  char op[96];
  int have_also = 0;
  snprintf(op, sizeof op, "%s on %s", op_names[which], e->name);
  memset(&r_also, 0, sizeof r_also);
  memset(&r_again, 0, sizeof r_again);
  if ((which == 0 ? exec_forward(e, d, &r) : exec_backward(e, d, which == 2, &r)) != 0)
    goto done;
  if (r.status != FNORM_SUCCESS) {
    case_fail("%s returned %s (%s)", op, fnorm_status_name(r.status),
              fnorm_status_string(r.status));
    goto done;
  }
  if (also != NULL) {
    if ((which == 0 ? exec_forward(also, d, &r_also)
                    : exec_backward(also, d, which == 2, &r_also)) != 0)
      goto done;
    if (r_also.status != FNORM_SUCCESS)
      case_fail("%s on %s returned %s", op_names[which], also->name,
                fnorm_status_name(r_also.status));
    else
      have_also = 1;
  }
  if (which == 0)
    check_forward(d, &r, have_also ? &r_also : NULL, op);
  else
    check_backward(d, which == 2, &r, have_also ? &r_also : NULL, op);
  if (repeat) {
    if ((which == 0 ? exec_forward(e, d, &r_again) : exec_backward(e, d, which == 2, &r_again)) !=
        0)
      goto done;
    if (r_again.status != r.status)
      case_fail("%s: second run returned %s", op, fnorm_status_name(r_again.status));
    else
      check_same_bits(&r, &r_again, names, op);
  }
done:
  op_result_free(&r);
  op_result_free(&r_also);
  op_result_free(&r_again);
}

void run_case(const tcase *c, const executor *e, const executor *also, int repeat) {
  case_data d;
  if (case_data_init(&d, c) != 0) {
    case_fail("out of host memory for the inputs");
  } else {
    if (d.c.fwd)
      run_op(&d, 0, e, also, repeat);
    if (d.c.bwd_x)
      run_op(&d, 1, e, also, repeat);
    if (d.c.bwd_y)
      run_op(&d, 2, e, also, repeat);
  }
  case_data_free(&d);
}

void run_thread_determinism(const tcase *c, const int *threads, int n_threads) {
  case_data d;
  op_result first_fwd, first_bwd, fwd, bwd;
  int k;
  memset(&first_fwd, 0, sizeof first_fwd);
  memset(&first_bwd, 0, sizeof first_bwd);
  if (case_data_init(&d, c) != 0) {
    case_fail("out of host memory for the inputs");
    goto done;
  }
  for (k = 0; k < n_threads; k++) {
    char op[64];
    d.c.cpu_threads = threads[k];
    snprintf(op, sizeof op, "cpu_threads=%d", threads[k]);
    memset(&fwd, 0, sizeof fwd);
    memset(&bwd, 0, sizeof bwd);
    if (exec_forward(&cpu_executor, &d, &fwd) != 0 ||
        exec_backward(&cpu_executor, &d, 0, &bwd) != 0) {
      op_result_free(&fwd);
      op_result_free(&bwd);
      break;
    }
    if (fwd.status != FNORM_SUCCESS || bwd.status != FNORM_SUCCESS) {
      case_fail("%s: forward returned %s, backward %s", op, fnorm_status_name(fwd.status),
                fnorm_status_name(bwd.status));
      op_result_free(&fwd);
      op_result_free(&bwd);
      break;
    }
    if (k == 0) {
      check_forward(&d, &fwd, NULL, op);
      check_backward(&d, 0, &bwd, NULL, op);
      first_fwd = fwd;
      first_bwd = bwd;
    } else {
      check_same_bits(&first_fwd, &fwd, fwd_out_names, op);
      check_same_bits(&first_bwd, &bwd, bwd_out_names, op);
      op_result_free(&fwd);
      op_result_free(&bwd);
    }
  }
done:
  op_result_free(&first_fwd);
  op_result_free(&first_bwd);
  case_data_free(&d);
}
