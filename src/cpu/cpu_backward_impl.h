/*
 * The backward's row loop, compiled once per instruction set: cpu_backward.c includes this file
 * with FNORM_BACKWARD_NAME(name) (a suffix per variant, naming that variant's chunk kernels) and
 * FNORM_BACKWARD_TARGET (a target attribute, or nothing) defined. Every variant does the same
 * operations in the same order, so all of them give bitwise the same result.
 */

/* gamma and (from y) beta of chunk [start, start + n): slices of the resident fp32 copies for
 * short rows, else loaded (converted) into the chunk buffers. NULL parameters were filled with
 * 1 and 0 by the caller, once. */
FNORM_BACKWARD_TARGET static void
FNORM_BACKWARD_NAME(chunk_params)(const row_context *c, backward_buffers *buf, int64_t start, int n,
                                  const float **gamma, const float **beta) {
  const fnorm_problem *p = c->p;
  if (c->resident) {
    *gamma = buf->gamma + start;
    *beta = c->from_x ? NULL : buf->beta + start;
    return;
  }
  *gamma = c->a->gamma != NULL
               ? FNORM_BACKWARD_NAME(load)(p->param_dtype, c->a->gamma, start, n, buf->gamma)
               : buf->gamma;
  *beta = NULL;
  if (!c->from_x) {
    *beta = c->a->beta != NULL
                ? FNORM_BACKWARD_NAME(load)(p->param_dtype, c->a->beta, start, n, buf->beta)
                : buf->beta;
  }
}

/* gamma and beta as fp32 for the whole call: converted once for short rows; for long rows
 * only a NULL parameter is filled (with 1 or 0), the others are loaded chunk by chunk. */
FNORM_BACKWARD_TARGET static void FNORM_BACKWARD_NAME(setup_params)(const row_context *c,
                                                                    backward_buffers *buf) {
  const fnorm_problem *p = c->p;
  const int64_t cols = p->cols;
  const int64_t filled = c->resident ? cols : FNORM_CPU_CHUNK;
  if (c->a->gamma == NULL) {
    for (int64_t j = 0; j < filled; j++) {
      buf->gamma[j] = 1.0f;
    }
  }
  if (!c->from_x && c->a->beta == NULL) {
    for (int64_t j = 0; j < filled; j++) {
      buf->beta[j] = 0.0f;
    }
  }
  if (!c->resident) {
    return;
  }
  for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
    int n = fnorm_cpu_chunk_length(cols, start);
    if (c->a->gamma != NULL) {
      const float *g = FNORM_BACKWARD_NAME(load)(p->param_dtype, c->a->gamma, start, n, buf->dx);
      memcpy(buf->gamma + start, g, (size_t)n * sizeof(float));
    }
    if (!c->from_x && c->a->beta != NULL) {
      const float *b = FNORM_BACKWARD_NAME(load)(p->param_dtype, c->a->beta, start, n, buf->dx);
      memcpy(buf->beta + start, b, (size_t)n * sizeof(float));
    }
  }
}

/* The double fallback of one row (see row_is_fast): both row sums and dx again, all in double,
 * rounded once. The block partials were already updated by the first pass. */
FNORM_BACKWARD_TARGET static void
FNORM_BACKWARD_NAME(row_double)(const row_context *c, backward_buffers *buf, const void *dy_row,
                                const void *input_row, void *dx_row, double center, double rstd) {
  const fnorm_problem *p = c->p;
  const int64_t cols = p->cols;
  double sum_g = 0.0;
  double sum_g_xhat = 0.0;
  for (int pass = 0; pass < 2; pass++) {
    const double mean_g = p->norm == FNORM_LAYERNORM ? sum_g / (double)cols : 0.0;
    const double mean_g_xhat = sum_g_xhat / (double)cols;
    for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
      int n = fnorm_cpu_chunk_length(cols, start);
      const float *gamma;
      const float *beta;
      FNORM_BACKWARD_NAME(chunk_params)(c, buf, start, n, &gamma, &beta);
      const float *dy = FNORM_BACKWARD_NAME(load)(p->dtype, dy_row, start, n, buf->dy);
      const float *input = FNORM_BACKWARD_NAME(load)(p->dtype, input_row, start, n, buf->input);
      for (int i = 0; i < n; i++) {
        const double xhat = beta == NULL ? ((double)input[i] - center) * rstd
                                         : ((double)input[i] - (double)beta[i]) / (double)gamma[i];
        const double g = (double)dy[i] * (double)gamma[i];
        if (pass == 0) {
          sum_g += g;
          sum_g_xhat += g * xhat;
        } else {
          buf->dx[i] = (float)(rstd * (g - mean_g - xhat * mean_g_xhat));
        }
      }
      if (pass == 1) {
        /* With dx == dy (in place) the chunk has been read completely. */
        fnorm_cpu_store(p->dtype, dx_row, start, n, buf->dx);
      }
    }
  }
}

/* The group accumulators added into the block's double partials, and cleared: elementwise, so
 * any vectorization the compiler chooses gives the same values. */
FNORM_BACKWARD_TARGET static void FNORM_BACKWARD_NAME(fold_group)(const block_partials *bp,
                                                                  int64_t cols) {
  double *restrict dgamma = bp->dgamma;
  double *restrict dbeta = bp->dbeta;
  float *restrict dgamma32 = bp->dgamma32;
  float *restrict dbeta32 = bp->dbeta32;
  for (int64_t j = 0; j < cols; j++) {
    dgamma[j] += (double)dgamma32[j];
    dbeta[j] += (double)dbeta32[j];
    dgamma32[j] = 0.0f;
    dbeta32[j] = 0.0f;
  }
}

/* Rows [first, end): dx (when wanted) and, unless bp is NULL, their dgamma/dbeta contributions:
 * [first, end) is then one row block, whose partials (all zero at first) are accumulated in row
 * order, in fp32 over groups of FNORM_CPU_GROUP_ROWS rows counted from first, each group's sums
 * then added into the block's double partials. */
FNORM_BACKWARD_TARGET static void FNORM_BACKWARD_NAME(backward_rows)(const row_context *c,
                                                                     int64_t first, int64_t end,
                                                                     const block_partials *bp,
                                                                     backward_buffers *buf) {
  const fnorm_problem *p = c->p;
  const fnorm_backward_args *a = c->a;
  const int64_t cols = p->cols;
  FNORM_BACKWARD_NAME(setup_params)(c, buf);

  for (int64_t row = first; row < end; row++) {
    const void *dy_row = fnorm_cpu_row(a->dy, p->dtype, p->dy_stride, row);
    const void *input_row = c->from_x ? fnorm_cpu_row(a->x, p->dtype, p->x_stride, row)
                                      : fnorm_cpu_row(a->y, p->dtype, p->y_stride, row);
    const float rstd = a->rstd[row];
    /* The mean only enters xhat in the exact form of LayerNorm. */
    const float center = (c->from_x && p->norm == FNORM_LAYERNORM) ? a->mean[row] : 0.0f;
    const int64_t offset_step = c->resident ? FNORM_CPU_CHUNK : 0;

    /* Pass 1: xhat and g, the two row sums, and the column contributions. */
    row_stats stats = {0.0, 0.0, 0.0f};
    for (int64_t start = 0, offset = 0; start < cols;
         start += FNORM_CPU_CHUNK, offset += offset_step) {
      int n = fnorm_cpu_chunk_length(cols, start);
      const float *gamma;
      const float *beta;
      FNORM_BACKWARD_NAME(chunk_params)(c, buf, start, n, &gamma, &beta);
      FNORM_BACKWARD_NAME(pass1)
      (p->dtype, n, dy_row, input_row, start, gamma, beta, center, rstd, buf->xhat + offset,
       buf->g + offset, &stats, bp != NULL ? bp->dgamma32 + start : NULL,
       bp != NULL ? bp->dbeta32 + start : NULL, buf);
    }
    if (bp != NULL &&
        ((row - first) % FNORM_CPU_GROUP_ROWS == FNORM_CPU_GROUP_ROWS - 1 || row == end - 1)) {
      FNORM_BACKWARD_NAME(fold_group)(bp, cols);
    }
    if (a->dx == NULL) {
      continue;
    }
    void *dx_row = fnorm_cpu_row_out(a->dx, p->dtype, p->dx_stride, row);
    if (!row_is_fast(&stats)) {
      FNORM_BACKWARD_NAME(row_double)
      (c, buf, dy_row, input_row, dx_row, (double)center, (double)rstd);
      continue;
    }

    /* Pass 2: dx in fp32 from the resident xhat and g (short rows), or from a chunk computed
     * again exactly as in pass 1 (long rows; with dx == dy each chunk is read completely before
     * it is written). */
    const int64_t elem = (int64_t)fnorm_cpu_dtype_bytes(p->dtype);
    /* The next row's pointers exist only when there is a next row: forming them past the last
     * row could overflow the address arithmetic with a huge (valid) stride. */
    const int has_next = row + 1 < end;
    const void *next_dy_row =
        has_next ? fnorm_cpu_row(a->dy, p->dtype, p->dy_stride, row + 1) : NULL;
    const void *next_input_row = !has_next   ? NULL
                                 : c->from_x ? fnorm_cpu_row(a->x, p->dtype, p->x_stride, row + 1)
                                             : fnorm_cpu_row(a->y, p->dtype, p->y_stride, row + 1);
    const float mean_g = p->norm == FNORM_LAYERNORM ? (float)(stats.sum_g / (double)cols) : 0.0f;
    const float mean_g_xhat = (float)(stats.sum_g_xhat / (double)cols);
    for (int64_t start = 0, offset = 0; start < cols;
         start += FNORM_CPU_CHUNK, offset += offset_step) {
      int n = fnorm_cpu_chunk_length(cols, start);
      if (!c->resident) {
        const float *gamma;
        const float *beta;
        row_stats unused = {0.0, 0.0, 0.0f};
        FNORM_BACKWARD_NAME(chunk_params)(c, buf, start, n, &gamma, &beta);
        FNORM_BACKWARD_NAME(pass1)
        (p->dtype, n, dy_row, input_row, start, gamma, beta, center, rstd, buf->xhat, buf->g,
         &unused, NULL, NULL, buf);
      }
      if (c->resident && has_next) {
        /* This pass reads only the stack, so the hardware prefetchers idle: fetch the next
         * row's chunk of dy and x (or y) meanwhile, so that its first pass finds it cached. */
        FNORM_BACKWARD_NAME(prefetch)(next_dy_row, start * elem, (size_t)n * elem);
        FNORM_BACKWARD_NAME(prefetch)(next_input_row, start * elem, (size_t)n * elem);
      }
      FNORM_BACKWARD_NAME(dx_store)
      (p->dtype, n, buf->g + offset, buf->xhat + offset, mean_g, mean_g_xhat, rstd, dx_row, start,
       c->stream, buf->dx);
    }
  }
  FNORM_BACKWARD_NAME(end_stores)(c->stream);
}
