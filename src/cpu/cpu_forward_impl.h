/*
 * The forward's row kernels, compiled once per instruction set: cpu_forward.c includes this file
 * with FNORM_FORWARD_NAME(name) (a suffix per variant) and FNORM_FORWARD_TARGET (a target
 * attribute, or nothing) defined. Every variant does the same operations in the same order, and
 * no variant lets the compiler fuse multiply-adds, so all of them give bitwise the same result.
 */

/* Adds the accumulators pairwise in a fixed order. */
FNORM_FORWARD_TARGET static double FNORM_FORWARD_NAME(add_lanes)(double *acc) {
  for (int width = FNORM_CPU_LANES / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; k++) {
      acc[k] += acc[k + width];
    }
  }
  return acc[0];
}

/* Sum of v[0..n) in double. Sixteen independent accumulators let the compiler vectorize the loop
 * without reassociating anything and hide the latency of the adds (four chains of 4 doubles
 * with AVX2); the order is fixed, so the result is reproducible. */
FNORM_FORWARD_TARGET static double FNORM_FORWARD_NAME(sum_chunk)(const float *restrict v, int n) {
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
  return FNORM_FORWARD_NAME(add_lanes)(acc) + tail;
}

/* Sum of (v[i] - center)^2 in double, same scheme as sum_chunk. */
FNORM_FORWARD_TARGET static double
FNORM_FORWARD_NAME(sum_squared_deviation_chunk)(const float *restrict v, int n, double center) {
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
  return FNORM_FORWARD_NAME(add_lanes)(acc) + tail;
}

/* y = ((x - center_hi) - center_lo) * rstd * gamma + beta in fp32, where center_hi + center_lo
 * is the double center split into two floats. x - center_hi is one rounding of the exact
 * difference, and center_lo restores the part of the center that fp32 cannot hold, so even for
 * rows far from zero mean (1e4 + N(0, 1)) y is within a few fp32 ulps of exact, at a fraction of
 * the cost of double arithmetic in this, the heaviest pass. */
FNORM_FORWARD_TARGET static void
FNORM_FORWARD_NAME(normalize_chunk)(const float *restrict x, const float *restrict gamma,
                                    const float *restrict beta, float *restrict y, int n,
                                    float center_hi, float center_lo, float rstd) {
  for (int i = 0; i < n; i++) {
    y[i] = ((x[i] - center_hi) - center_lo) * rstd * gamma[i] + beta[i];
  }
}

/* Chunk [start, start + n) of a row: from the resident fp32 copy when there is one, else
 * loaded (converted) into `scratch`. */
FNORM_FORWARD_TARGET static const float *
FNORM_FORWARD_NAME(chunk_of)(const float *resident, fnorm_dtype dtype, const void *base,
                             int64_t start, int n, float *scratch) {
  return resident != NULL ? resident + start : fnorm_cpu_load(dtype, base, start, n, scratch);
}

/* Rows [first, end). RMSNorm is LayerNorm with the center fixed at 0 instead of the mean. */
FNORM_FORWARD_TARGET static void FNORM_FORWARD_NAME(forward_rows)(const fnorm_problem *p,
                                                                  const fnorm_forward_args *a,
                                                                  int64_t first, int64_t end,
                                                                  forward_buffers *buf) {
  const int64_t cols = p->cols;
  /* Short rows are converted to fp32 once and then read from L1 by every pass; gamma and beta
   * once per call. Long rows are converted chunk by chunk in each pass. */
  const int resident = cols <= FNORM_CPU_RESIDENT_COLS;
  const float *gamma_resident = NULL;
  const float *beta_resident = NULL;
  for (int i = 0; i < FNORM_CPU_CHUNK; i++) {
    buf->ones[i] = 1.0f;
    buf->zeros[i] = 0.0f;
  }
  if (resident) {
    for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
      int n = fnorm_cpu_chunk_length(cols, start);
      memcpy(buf->gamma + start,
             fnorm_cpu_load_param(p->param_dtype, a->gamma, start, n, buf->y, buf->ones),
             (size_t)n * sizeof(float));
      memcpy(buf->beta + start,
             fnorm_cpu_load_param(p->param_dtype, a->beta, start, n, buf->y, buf->zeros),
             (size_t)n * sizeof(float));
    }
    gamma_resident = buf->gamma;
    beta_resident = buf->beta;
  }

  for (int64_t row = first; row < end; row++) {
    const void *x_row = fnorm_cpu_row(a->x, p->dtype, p->x_stride, row);
    void *y_row = fnorm_cpu_row_out(a->y, p->dtype, p->y_stride, row);
    const float *x_resident = NULL;
    if (resident) {
      if (p->dtype == FNORM_DTYPE_F32) {
        x_resident = (const float *)x_row;
      } else {
        for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
          int n = fnorm_cpu_chunk_length(cols, start);
          fnorm_cpu_load(p->dtype, x_row, start, n, buf->x + start);
        }
        x_resident = buf->x;
      }
    }

    double center = 0.0;
    if (p->norm == FNORM_LAYERNORM) {
      double sum = 0.0;
      for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
        int n = fnorm_cpu_chunk_length(cols, start);
        sum += FNORM_FORWARD_NAME(sum_chunk)(
            FNORM_FORWARD_NAME(chunk_of)(x_resident, p->dtype, x_row, start, n, buf->x), n);
      }
      center = sum / (double)cols;
    }
    double squares = 0.0;
    for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
      int n = fnorm_cpu_chunk_length(cols, start);
      squares += FNORM_FORWARD_NAME(sum_squared_deviation_chunk)(
          FNORM_FORWARD_NAME(chunk_of)(x_resident, p->dtype, x_row, start, n, buf->x), n, center);
    }
    const double rstd = 1.0 / sqrt(squares / (double)cols + (double)p->eps);
    if (a->mean != NULL) {
      a->mean[row] = (float)center;
    }
    if (a->rstd != NULL) {
      a->rstd[row] = (float)rstd;
    }

    const float center_hi = (float)center;
    const float center_lo = (float)(center - (double)center_hi);
    /* With y == x (in place) each chunk is read completely before it is written. */
    for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
      int n = fnorm_cpu_chunk_length(cols, start);
      const float *x = FNORM_FORWARD_NAME(chunk_of)(x_resident, p->dtype, x_row, start, n, buf->x);
      const float *gamma =
          gamma_resident != NULL
              ? gamma_resident + start
              : fnorm_cpu_load_param(p->param_dtype, a->gamma, start, n, buf->gamma, buf->ones);
      const float *beta =
          beta_resident != NULL
              ? beta_resident + start
              : fnorm_cpu_load_param(p->param_dtype, a->beta, start, n, buf->beta, buf->zeros);
      FNORM_FORWARD_NAME(normalize_chunk)
      (x, gamma, beta, buf->y, n, center_hi, center_lo, (float)rstd);
      fnorm_cpu_store(p->dtype, y_row, start, n, buf->y);
    }
  }
}
