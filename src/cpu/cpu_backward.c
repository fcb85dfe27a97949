/*
 * CPU backward of LayerNorm and RMSNorm.
 *
 * With xhat = (x - mean) * rstd (LayerNorm) or x * rstd (RMSNorm), or xhat = (y - beta) / gamma
 * when the forward's output is given instead of x, and g = dy * gamma:
 *   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
 *   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))
 *   dgamma[j] = sum_i dy[i][j] * xhat[i][j],   dbeta[j] = sum_i dy[i][j]
 *
 * Each row is streamed twice in chunks: once for the two row sums (and the dgamma/dbeta
 * contributions), once to write dx. Everything is computed in double and rounded once.
 *
 * Determinism: rows are grouped into blocks whose count and size depend only on (rows, cols).
 * Each block accumulates its own dgamma/dbeta partial sums, in row order, into the workspace;
 * the partials are then added in block order. So any thread count gives bitwise the same
 * result: a thread only decides which blocks it runs, never the order of any sum.
 */
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
  const uint64_t bytes_per_block_per_col = 2 * sizeof(double); /* dgamma and dbeta */
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
  /* blocks * 2 * cols doubles; blocks <= 64, so only cols can make this overflow. */
  uint64_t per_col = (uint64_t)layout.blocks * 2 * sizeof(double);
  if ((uint64_t)p->cols > (uint64_t)SIZE_MAX / per_col) {
    return FNORM_ERR_BAD_SIZE;
  }
  *bytes = (size_t)((uint64_t)p->cols * per_col);
  return FNORM_SUCCESS;
}

/* Stack buffers of one thread. */
typedef struct backward_buffers {
  float dy[FNORM_CPU_CHUNK];
  float input[FNORM_CPU_CHUNK]; /* x or y */
  float gamma[FNORM_CPU_CHUNK];
  float beta[FNORM_CPU_CHUNK];
  float dx[FNORM_CPU_CHUNK];
  float ones[FNORM_CPU_CHUNK];  /* stands in for a NULL gamma */
  float zeros[FNORM_CPU_CHUNK]; /* stands in for a NULL beta */
  double xhat[FNORM_CPU_CHUNK];
} backward_buffers;

/* What one row needs besides its data. */
typedef struct row_context {
  const fnorm_problem *p;
  const fnorm_backward_args *a;
  int from_x; /* x given (exact form), else y */
} row_context;

/* Loads one chunk of a row and computes its xhat into buf->xhat. Returns dy and gamma of the
 * chunk as floats. */
static void load_chunk(const row_context *c, const void *dy_row, const void *input_row,
                       int64_t start, int n, double center, double rstd, backward_buffers *buf,
                       const float **dy_out, const float **gamma_out) {
  const fnorm_problem *p = c->p;
  const float *dy = fnorm_cpu_load(p->dtype, dy_row, start, n, buf->dy);
  const float *input = fnorm_cpu_load(p->dtype, input_row, start, n, buf->input);
  const float *gamma =
      fnorm_cpu_load_param(p->param_dtype, c->a->gamma, start, n, buf->gamma, buf->ones);
  double *restrict xhat = buf->xhat;
  if (c->from_x) {
    for (int i = 0; i < n; i++) {
      xhat[i] = ((double)input[i] - center) * rstd;
    }
  } else {
    const float *beta =
        fnorm_cpu_load_param(p->param_dtype, c->a->beta, start, n, buf->beta, buf->zeros);
    for (int i = 0; i < n; i++) {
      xhat[i] = ((double)input[i] - (double)beta[i]) / (double)gamma[i];
    }
  }
  *dy_out = dy;
  *gamma_out = gamma;
}

/* One row: dx (when wanted) and the row's contribution to the block partials (when given). */
static void backward_row(const row_context *c, int64_t row, backward_buffers *buf,
                         double *restrict dgamma_partial, double *restrict dbeta_partial) {
  const fnorm_problem *p = c->p;
  const fnorm_backward_args *a = c->a;
  const int64_t cols = p->cols;
  const void *dy_row = fnorm_cpu_row(a->dy, p->dtype, p->dy_stride, row);
  const void *input_row = c->from_x ? fnorm_cpu_row(a->x, p->dtype, p->x_stride, row)
                                    : fnorm_cpu_row(a->y, p->dtype, p->y_stride, row);
  const double rstd = (double)a->rstd[row];
  /* The mean only enters xhat in the exact form of LayerNorm. */
  const double center = (c->from_x && p->norm == FNORM_LAYERNORM) ? (double)a->mean[row] : 0.0;
  const double *restrict xhat = buf->xhat;
  const float *dy;
  const float *gamma;

  double sum_g = 0.0;
  double sum_g_xhat = 0.0;
  for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
    int n = fnorm_cpu_chunk_length(cols, start);
    load_chunk(c, dy_row, input_row, start, n, center, rstd, buf, &dy, &gamma);
    for (int i = 0; i < n; i++) {
      double g = (double)dy[i] * (double)gamma[i];
      sum_g += g;
      sum_g_xhat += g * xhat[i];
    }
    if (dgamma_partial != NULL) {
      for (int i = 0; i < n; i++) {
        dgamma_partial[start + i] += (double)dy[i] * xhat[i];
      }
    }
    if (dbeta_partial != NULL) {
      for (int i = 0; i < n; i++) {
        dbeta_partial[start + i] += (double)dy[i];
      }
    }
  }
  if (a->dx == NULL) {
    return;
  }

  const double mean_g = p->norm == FNORM_LAYERNORM ? sum_g / (double)cols : 0.0;
  const double mean_g_xhat = sum_g_xhat / (double)cols;
  void *dx_row = fnorm_cpu_row_out(a->dx, p->dtype, p->dx_stride, row);
  /* With dx == dy (in place) each chunk is read completely before it is written, and the first
   * pass only read. */
  for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
    int n = fnorm_cpu_chunk_length(cols, start);
    load_chunk(c, dy_row, input_row, start, n, center, rstd, buf, &dy, &gamma);
    for (int i = 0; i < n; i++) {
      double g = (double)dy[i] * (double)gamma[i];
      buf->dx[i] = (float)(rstd * (g - mean_g - xhat[i] * mean_g_xhat));
    }
    fnorm_cpu_store(p->dtype, dx_row, start, n, buf->dx);
  }
}

static void fill_constants(backward_buffers *buf) {
  for (int i = 0; i < FNORM_CPU_CHUNK; i++) {
    buf->ones[i] = 1.0f;
    buf->zeros[i] = 0.0f;
  }
}

/* Rows [first, end) into the block's partials (either may be NULL), which start at zero. */
static void backward_block(const row_context *c, int64_t first, int64_t end, backward_buffers *buf,
                           double *dgamma_partial, double *dbeta_partial) {
  const int64_t cols = c->p->cols;
  for (int64_t j = 0; j < cols; j++) {
    if (dgamma_partial != NULL) {
      dgamma_partial[j] = 0.0;
    }
    if (dbeta_partial != NULL) {
      dbeta_partial[j] = 0.0;
    }
  }
  for (int64_t row = first; row < end; row++) {
    backward_row(c, row, buf, dgamma_partial, dbeta_partial);
  }
}

/* out[j] = sum over blocks b, in order, of partials[b * cols + j], for columns [first, end). */
static void reduce_partials(fnorm_dtype dtype, const double *partials, int64_t blocks, int64_t cols,
                            int64_t first, int64_t end, void *out) {
  float sums[FNORM_CPU_CHUNK];
  for (int64_t start = first; start < end; start += FNORM_CPU_CHUNK) {
    int n = end - start < FNORM_CPU_CHUNK ? (int)(end - start) : FNORM_CPU_CHUNK;
    for (int i = 0; i < n; i++) {
      double sum = 0.0;
      for (int64_t b = 0; b < blocks; b++) {
        sum += partials[b * cols + start + i];
      }
      sums[i] = (float)sum;
    }
    fnorm_cpu_store(dtype, out, start, n, sums);
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
  row_context c;
  c.p = p;
  c.a = a;
  c.from_x = a->x != NULL;

  if (a->dx == NULL && a->dgamma == NULL && a->dbeta == NULL) {
    return FNORM_SUCCESS; /* nothing asked for */
  }
  if (a->dgamma == NULL && a->dbeta == NULL) {
    /* No column sums: every row is independent, so split rows evenly. */
    const int team = fnorm_cpu_team_size(p->cpu_threads, rows, cols);
    if (team == 1) {
      backward_buffers buf;
      fill_constants(&buf);
      backward_block(&c, 0, rows, &buf, NULL, NULL);
      return FNORM_SUCCESS;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(team)
    {
      int64_t first, end;
      fnorm_cpu_split(rows, omp_get_num_threads(), omp_get_thread_num(), &first, &end);
      backward_buffers buf;
      fill_constants(&buf);
      backward_block(&c, first, end, &buf, NULL, NULL);
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
  double *dgamma_partials = (double *)workspace;
  double *dbeta_partials = dgamma_partials + layout.blocks * cols;
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
    fill_constants(&buf);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t b = 0; b < layout.blocks; b++) {
      int64_t first = b * layout.rows_per_block;
      int64_t end = first + layout.rows_per_block < rows ? first + layout.rows_per_block : rows;
      backward_block(&c, first, end, &buf, a->dgamma ? dgamma_partials + b * cols : NULL,
                     a->dbeta ? dbeta_partials + b * cols : NULL);
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
