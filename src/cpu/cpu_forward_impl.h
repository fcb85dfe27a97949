/*
 * The forward's row loop, compiled once per instruction set: cpu_forward.c includes this file
 * with FNORM_FORWARD_NAME(name) (a suffix per variant, naming that variant's chunk kernels) and
 * FNORM_FORWARD_TARGET (a target attribute, or nothing) defined. Every variant does the same
 * operations in the same order, so all of them give bitwise the same result.
 */

/* Chunk [start, start + n) of a row: from the resident fp32 copy when there is one, else
 * loaded (converted) into `scratch`. */
FNORM_FORWARD_TARGET static const float *
FNORM_FORWARD_NAME(chunk_of)(const float *resident, fnorm_dtype dtype, const void *base,
                             int64_t start, int n, float *scratch) {
  return resident != NULL ? resident + start
                          : FNORM_FORWARD_NAME(load)(dtype, base, start, n, scratch);
}

/* Rows [first, end). RMSNorm is LayerNorm with the center fixed at 0 instead of the mean. */
FNORM_FORWARD_TARGET static void
FNORM_FORWARD_NAME(forward_rows)(const fnorm_problem *p, const fnorm_forward_args *a, int64_t first,
                                 int64_t end, int stream, forward_buffers *buf) {
  const int64_t cols = p->cols;
  const fnorm_dtype dtype = p->dtype;
  /* Short rows are converted to fp32 once and then read from L1 by every pass; gamma and beta
   * once per call. Long rows are converted chunk by chunk in each pass. */
  const int resident = cols <= FNORM_CPU_RESIDENT_COLS;
  /* fp32 blocks of squares for rows long enough that their roundings average out. */
  const int fp32_squares = cols >= FNORM_CPU_SQUARES_MIN_COLS;
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
             FNORM_FORWARD_NAME(load_param)(p->param_dtype, a->gamma, start, n, buf->y, buf->ones),
             (size_t)n * sizeof(float));
      memcpy(buf->beta + start,
             FNORM_FORWARD_NAME(load_param)(p->param_dtype, a->beta, start, n, buf->y, buf->zeros),
             (size_t)n * sizeof(float));
    }
    gamma_resident = buf->gamma;
    beta_resident = buf->beta;
  }

  for (int64_t row = first; row < end; row++) {
    const void *x_row = fnorm_cpu_row(a->x, dtype, p->x_stride, row);
    void *y_row = fnorm_cpu_row_out(a->y, dtype, p->y_stride, row);
    /* fp32 rows are read in place; other resident rows are converted by the first pass. */
    const float *x_resident = NULL;

    double center = 0.0;
    if (p->norm == FNORM_LAYERNORM) {
      /* With fp32_squares the sum is taken in fp32 blocks and corrected by the squares pass;
       * a sum that overflowed fp32 (finite data beyond about 2^127 / 64) is taken again in
       * double. */
      double sum = 0.0;
      for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
        int n = fnorm_cpu_chunk_length(cols, start);
        sum += FNORM_FORWARD_NAME(load_sum)(dtype, x_row, start, n,
                                            resident ? buf->x + start : buf->x, fp32_squares);
      }
      if (fp32_squares && !isfinite(sum)) {
        sum = 0.0;
        for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
          int n = fnorm_cpu_chunk_length(cols, start);
          sum += FNORM_FORWARD_NAME(load_sum)(dtype, x_row, start, n, buf->y, 0);
        }
      }
      center = sum / (double)cols;
    } else if (resident && dtype != FNORM_DTYPE_F32) {
      for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
        int n = fnorm_cpu_chunk_length(cols, start);
        FNORM_FORWARD_NAME(load)(dtype, x_row, start, n, buf->x + start);
      }
    }
    if (resident) {
      x_resident = dtype == FNORM_DTYPE_F32 ? (const float *)x_row : buf->x;
    }

    double squares = 0.0;
    /* Squares around the center in fp32 blocks, with the sum of the deviations d. For
     * LayerNorm the center moves by their mean, m = sum(d) / cols (which removes the fp32
     * roundings of the mean pass), and sum((d - m)^2) = sum(d^2) - cols * m^2. Should m not be
     * tiny against the spread (sum(d^2) would then have lost relative accuracy to
     * cancellation), the squares are taken again around the corrected center; a second round
     * always suffices, as m is then far below an fp32 rounding of the center. */
    for (int round = 0; round < 2 && fp32_squares; round++) {
      const float center_hi = (float)center;
      const float center_lo = (float)(center - (double)center_hi);
      double deviation = 0.0;
      squares = 0.0;
      for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
        int n = fnorm_cpu_chunk_length(cols, start);
        squares += FNORM_FORWARD_NAME(sum_squares)(
            FNORM_FORWARD_NAME(chunk_of)(x_resident, dtype, x_row, start, n, buf->x), n, center,
            center_hi, center_lo, &deviation);
      }
      if (p->norm != FNORM_LAYERNORM || !isfinite(center) || !isfinite(deviation) ||
          !isfinite(squares)) {
        break; /* RMSNorm's center stays 0; non-finite rows are left to the checks below */
      }
      const double shift = deviation / (double)cols;
      center += shift;
      const double moved = shift * deviation; /* cols * m^2 */
      if (moved <= squares * 0x1p-10) {
        squares -= moved;
        break;
      }
    }
    if (!fp32_squares ||
        (!(squares >= FNORM_CPU_SQUARES_MIN * (double)cols && squares <= DBL_MAX) &&
         isfinite(center))) {
      /* Short rows, or the fp32 squares overflowed or lost precision to underflow (|x - mean|
       * beyond about 2^60 or below 2^-50): squares in double, which can do neither. */
      squares = 0.0;
      for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
        int n = fnorm_cpu_chunk_length(cols, start);
        squares += sum_squares_double(
            FNORM_FORWARD_NAME(chunk_of)(x_resident, dtype, x_row, start, n, buf->x), n, center);
      }
    }
    /* The center as an unevaluated sum of two floats (see normalize_store_baseline). */
    const float center_hi = (float)center;
    const float center_lo = (float)(center - (double)center_hi);
    const double rstd = 1.0 / sqrt(squares / (double)cols + (double)p->eps);
    if (a->mean != NULL) {
      a->mean[row] = (float)center;
    }
    if (a->rstd != NULL) {
      a->rstd[row] = (float)rstd;
    }

    /* With y == x (in place) each chunk is read completely before it is written. This pass
     * reads x from L1 (resident rows) or L2 (long rows, read by the passes before), so the
     * next row is prefetched meanwhile (its pointer is formed only when there is a next row:
     * a huge valid stride could overflow it otherwise). */
    const void *next_x_row =
        row + 1 < end ? fnorm_cpu_row(a->x, dtype, p->x_stride, row + 1) : NULL;
    const int64_t elem = (int64_t)fnorm_cpu_dtype_bytes(dtype);
    for (int64_t start = 0; start < cols; start += FNORM_CPU_CHUNK) {
      int n = fnorm_cpu_chunk_length(cols, start);
      if (next_x_row != NULL) {
        FNORM_FORWARD_NAME(prefetch)(next_x_row, start * elem, (size_t)n * elem);
      }
      const float *x = FNORM_FORWARD_NAME(chunk_of)(x_resident, dtype, x_row, start, n, buf->x);
      const float *gamma = gamma_resident != NULL
                               ? gamma_resident + start
                               : FNORM_FORWARD_NAME(load_param)(p->param_dtype, a->gamma, start, n,
                                                                buf->gamma, buf->ones);
      const float *beta = beta_resident != NULL
                              ? beta_resident + start
                              : FNORM_FORWARD_NAME(load_param)(p->param_dtype, a->beta, start, n,
                                                               buf->beta, buf->zeros);
      FNORM_FORWARD_NAME(normalize_store)
      (dtype, x, gamma, beta, y_row, start, n, center_hi, center_lo, (float)rstd, stream, buf->y);
    }
  }
  FNORM_FORWARD_NAME(end_stores)(stream);
}
