/* Numeric tests of the CPU backend against the long-double reference, and the self-tests of
 * the tests' own fp16/bf16 conversions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cases.h"
#include "halfconv.h"
#include "harness.h"
#include "rng.h"
#include "tests.h"

/* Names, runs and closes one CPU case. */
static void cpu_case(const char *group, const tcase *c) {
  char desc[400];
  tcase_describe(c, desc, sizeof desc);
  if (!case_begin("%s %s", group, desc))
    return;
  run_case(c, &cpu_executor, NULL, 0);
  case_end();
}

/* ------------------------------------------------------------------------------------------ */

static void test_conversions(void) {
  uint32_t h;
  group_begin("conversions (the tests' own fp16/bf16 rounding)");
  if (case_begin("conv f16 round trip of all 65536 values")) {
    for (h = 0; h < 65536; h++) {
      float f = f16_to_f32((uint16_t)h);
      uint16_t back = f32_to_f16(f);
      int is_nan = ((h & 0x7C00u) == 0x7C00u) && (h & 0x03FFu);
      if (is_nan ? !isnan(f) || ((back & 0x7C00u) != 0x7C00u) || !(back & 0x03FFu) : back != h) {
        case_fail("0x%04x -> %.9g -> 0x%04x", (unsigned)h, (double)f, (unsigned)back);
        break;
      }
    }
    case_end();
  }
  if (case_begin("conv f16 ties round to even, near-ties to nearest")) {
    /* Between consecutive positive finite halves a and a+1: the midpoint goes to the even
     * one, a float just below it to a, just above it to a+1. */
    for (h = 0; h < 0x7BFF; h++) {
      float lo = f16_to_f32((uint16_t)h), hi = f16_to_f32((uint16_t)(h + 1));
      float mid = (float)(((double)lo + (double)hi) / 2.0);
      uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
      if (f32_to_f16(mid) != even || f32_to_f16(nextafterf(mid, 0.0f)) != h ||
          f32_to_f16(nextafterf(mid, 1e9f)) != h + 1 || f32_to_f16(-mid) != (even | 0x8000u)) {
        case_fail("around the midpoint of 0x%04x and 0x%04x", (unsigned)h, (unsigned)(h + 1));
        break;
      }
    }
    if (f32_to_f16(65519.0f) != 0x7BFF || f32_to_f16(65520.0f) != 0x7C00 ||
        f32_to_f16(1e10f) != 0x7C00 || f32_to_f16(-INFINITY) != 0xFC00 || f32_to_f16(1e-10f) != 0 ||
        f32_to_f16(5.9604644775390625e-8f) != 1 ||
        f32_to_f16(2.98023223876953125e-8f) != 0 || /* 2^-25: a tie, to even (zero) */
        f32_to_f16(1.0f) != 0x3C00 || f32_to_f16(-2.0f) != 0xC000 ||
        f32_to_f16(6.103515625e-5f) != 0x0400 || !isnan(f16_to_f32(f32_to_f16(NAN))))
      case_fail("a fixed fp16 value converts wrongly");
    case_end();
  }
  if (case_begin("conv bf16 ties to even, round trip, overflow")) {
    static const struct {
      uint32_t in;
      uint16_t out;
    } table[] = {{0x3F800000u, 0x3F80}, {0x3F808000u, 0x3F80}, {0x3F818000u, 0x3F82},
                 {0x3F808001u, 0x3F81}, {0x3F807FFFu, 0x3F80}, {0xBF818000u, 0xBF82},
                 {0x7F7FFFFFu, 0x7F80}, {0x7F7F7FFFu, 0x7F7F}, {0x7F800000u, 0x7F80},
                 {0x00000001u, 0x0000}, {0x00008000u, 0x0000}, {0x00018000u, 0x0002}};
    size_t k;
    for (k = 0; k < sizeof table / sizeof table[0]; k++)
      if (f32_to_bf16(f32_from_bits(table[k].in)) != table[k].out)
        case_fail("bf16(0x%08x) = 0x%04x, want 0x%04x", (unsigned)table[k].in,
                  (unsigned)f32_to_bf16(f32_from_bits(table[k].in)), (unsigned)table[k].out);
    for (h = 0; h < 65536; h++) {
      float f = bf16_to_f32((uint16_t)h);
      if (!isnan(f) && f32_to_bf16(f) != h) {
        case_fail("bf16 0x%04x does not round-trip", (unsigned)h);
        break;
      }
      if (isnan(f) && !isnan(bf16_to_f32(f32_to_bf16(f)))) {
        case_fail("bf16 NaN 0x%04x does not stay NaN", (unsigned)h);
        break;
      }
    }
    case_end();
  }
  group_end();
}

/* ------------------------------------------------------------------------------------------ */

static const int64_t sizes_full[] = {1,   2,   3,    5,    7,    31,   97,   127,
                                     128, 129, 1000, 1023, 1024, 1031, 4096, 65536};
static const int64_t sizes_quick[] = {1, 3, 7, 31, 128, 129, 1031, 4096};

static void test_sizes(void) {
  const int64_t *sizes = g_opt.quick ? sizes_quick : sizes_full;
  int n_sizes = g_opt.quick ? (int)(sizeof sizes_quick / sizeof sizes_quick[0])
                            : (int)(sizeof sizes_full / sizeof sizes_full[0]);
  int s, k, q;
  group_begin("cpu-sizes: every N, norm, dtype and param dtype; forward, backward from x and y");
  for (s = 0; s < n_sizes; s++)
    for (q = 0; q < 2; q++)
      for (k = 0; k < N_COMBOS; k++) {
        int64_t n = sizes[s];
        tcase c = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype,
                                tcase_rows_for(n, g_opt.quick ? 1 << 14 : 1 << 17, 64), n);
        cpu_case("cpu", &c);
      }
  /* One row of 2^20 + 3: the long-row path and a reduction over a million elements. */
  for (q = 0; q < 2; q++)
    for (k = 0; k < N_COMBOS; k++) {
      tcase c = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype, 1, (1 << 20) + 3);
      if (g_opt.quick && k != 0 && k != 4)
        continue;
      cpu_case("cpu", &c);
    }
  group_end();
}

/* ------------------------------------------------------------------------------------------ */

static void test_option_variants(void) {
  static const int64_t sizes[] = {7, 129, 1031};
  int s, k, q;
  group_begin("cpu-options: gamma/beta present or absent, outputs skipped, param dtype, eps");
  for (s = 0; s < 3; s++) {
    if (g_opt.quick && s == 2)
      continue;
    for (q = 0; q < 2; q++)
      for (k = 0; k < N_COMBOS; k++) {
        int64_t n = sizes[s];
        tcase base = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype, 9, n);
        tcase_option_variants(&base, "cpu", cpu_case);
      }
    /* f32 data with param_dtype given explicitly as f32 */
    for (q = 0; q < 2; q++) {
      tcase c = tcase_default(norms[q], FNORM_DTYPE_F32, FNORM_DTYPE_F32, 9, sizes[s]);
      cpu_case("cpu", &c);
    }
  }
  group_end();
}

/* ------------------------------------------------------------------------------------------ */

static void test_rows(void) {
  static const int64_t one_row[] = {1, 5, 128, 4096};
  static const int64_t many_rows[] = {1, 2, 7, 32, 129};
  int s, k, q;
  group_begin("cpu-rows: M = 1 and M = 3000");
  for (s = 0; s < 4; s++)
    for (q = 0; q < 2; q++)
      for (k = 0; k < N_COMBOS; k++) {
        tcase c = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype, 1, one_row[s]);
        cpu_case("cpu", &c);
      }
  for (s = 0; s < 5; s++)
    for (q = 0; q < 2; q++)
      for (k = 0; k < N_COMBOS; k++) {
        tcase c = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype,
                                g_opt.quick ? 700 : 3000, many_rows[s]);
        if (g_opt.quick && (k == 1 || k == 3))
          continue;
        cpu_case("cpu", &c);
      }
  group_end();
}

/* ------------------------------------------------------------------------------------------ */

static void test_layouts(void) {
  static const int64_t sizes[] = {1, 7, 128, 1031};
  int s, k, q, v;
  group_begin("cpu-layouts: strided rows, pointers off 16-byte alignment, in place");
  for (s = 0; s < 4; s++)
    for (q = 0; q < 2; q++)
      for (k = 0; k < N_COMBOS; k++) {
        int64_t n = sizes[s];
        for (v = 0; v < N_LAYOUTS; v++) {
          tcase c = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype, 5, n);
          tcase_apply_layout(&c, v, 0);
          if (g_opt.quick && k != 0 && k != 4 && v != 1 && v != 5)
            continue;
          cpu_case("cpu", &c);
        }
      }
  group_end();
}

/* ------------------------------------------------------------------------------------------ */

static void test_hard_inputs(void) {
  static const int64_t offset_sizes[] = {1024, 4096, 65536};
  static const int64_t nonfinite_sizes[] = {1, 7, 128, 1031};
  int s, k, q, v;
  group_begin("cpu-hard-inputs: 1e4 + N(0,1) in fp32, NaN/Inf confined to their row");
  for (s = 0; s < 3; s++)
    for (q = 0; q < 2; q++) {
      tcase c = tcase_default(norms[q], FNORM_DTYPE_F32, FNORM_DTYPE_SAME, 4, offset_sizes[s]);
      c.input = INPUT_OFFSET_1E4;
      cpu_case("cpu", &c);
    }
  for (s = 0; s < 4; s++)
    for (q = 0; q < 2; q++)
      for (k = 0; k < N_COMBOS; k++)
        for (v = 0; v < 2; v++) {
          tcase c = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype, 6,
                                  nonfinite_sizes[s]);
          c.input = v == 0 ? INPUT_NONFINITE_X : INPUT_NONFINITE_DY;
          cpu_case("cpu", &c);
        }
  group_end();
}

/* ------------------------------------------------------------------------------------------
 * Finite differences: the backward must be the derivative of the forward. The loss is
 * L = sum(dy * y); its derivative by each x, gamma and beta entry is estimated by central
 * differences of the long-double forward and compared with the library's dx, dgamma and
 * dbeta (fp32). The step for x is relative to its row's spread (1/rstd), so that the
 * O(h^2) error stays ~1e-8 of the gradient even for rows of nearly equal values.
 * ---------------------------------------------------------------------------------------- */

static long double fd_loss(fnorm_norm norm, int64_t m, int64_t n, const long double *x,
                           const long double *gamma, const long double *beta, const long double *dy,
                           long double eps, long double *yrow) {
  long double loss = 0.0L;
  int64_t i, j;
  for (i = 0; i < m; i++) {
    ref_forward_row(norm, n, x + i * n, gamma, beta, eps, yrow, NULL, NULL);
    for (j = 0; j < n; j++)
      loss += dy[i * n + j] * yrow[j];
  }
  return loss;
}

static void fd_case(fnorm_norm norm, int64_t n, int from_y) {
  enum { M = 3 };
  const float eps = 1e-5f;
  float *x, *y, *dy, *dx, *gamma, *beta, *dgamma, *dbeta, mean[M], rstd[M];
  long double *xl, *gl, *bl, *dyl, *yrow, *fd;
  fnorm_desc desc;
  fnorm_forward_args fa;
  fnorm_backward_args ba;
  fnorm_status st;
  size_t ws_bytes = 0;
  void *ws = NULL;
  rng r;
  int64_t i, j, k, total = M * n + 2 * n;
  double worst = 0.0;

  if (!case_begin("cpu finite-difference %s N=%lld M=%d f32 gamma beta from-%s", norm_name(norm),
                  (long long)n, M, from_y ? "y" : "x"))
    return;
  r = rng_seeded(case_seed());
  x = (float *)calloc((size_t)(7 * M * n + 4 * n), sizeof(float));
  xl = (long double *)calloc((size_t)(3 * M * n + 3 * n + total), sizeof(long double));
  if (x == NULL || xl == NULL) {
    case_fail("out of host memory");
    free(x);
    free(xl);
    case_end();
    return;
  }
  y = x + M * n;
  dy = y + M * n;
  dx = dy + M * n;
  gamma = dx + M * n;
  beta = gamma + n;
  dgamma = beta + n;
  dbeta = dgamma + n;
  gl = xl + M * n;
  bl = gl + n;
  dyl = bl + n;
  yrow = dyl + M * n;
  fd = yrow + n;
  for (j = 0; j < n; j++) {
    gamma[j] = (float)rng_range(&r, 0.5, 1.5);
    beta[j] = (float)rng_range(&r, -0.5, 0.5);
    gl[j] = gamma[j];
    bl[j] = beta[j];
  }
  for (k = 0; k < M * n; k++) {
    x[k] = (float)(0.3 + rng_normal(&r));
    dy[k] = (float)rng_normal(&r);
    xl[k] = x[k];
    dyl[k] = dy[k];
  }

  fnorm_desc_init(&desc, FNORM_DEVICE_CPU, norm, FNORM_DTYPE_F32, M, n);
  desc.eps = eps;
  memset(&fa, 0, sizeof fa);
  fa.x = x;
  fa.gamma = gamma;
  fa.beta = beta;
  fa.y = y;
  fa.mean = norm == FNORM_LAYERNORM ? mean : NULL;
  fa.rstd = rstd;
  st = fnorm_forward(&desc, &fa, NULL);
  if (st == FNORM_SUCCESS)
    st = fnorm_backward_workspace_size(&desc, &ws_bytes);
  if (st == FNORM_SUCCESS && ws_bytes > 0 && (ws = malloc(ws_bytes)) == NULL)
    st = FNORM_ERR_NULL_POINTER;
  if (st == FNORM_SUCCESS) {
    memset(&ba, 0, sizeof ba);
    ba.dy = dy;
    ba.rstd = rstd;
    ba.gamma = gamma;
    if (from_y) {
      ba.y = y;
      ba.beta = beta;
    } else {
      ba.x = x;
      ba.mean = fa.mean;
    }
    ba.dx = dx;
    ba.dgamma = dgamma;
    ba.dbeta = dbeta;
    st = fnorm_backward(&desc, &ba, ws, ws_bytes, NULL);
  }
  free(ws);
  if (st != FNORM_SUCCESS) {
    case_fail("forward/backward returned %s", fnorm_status_name(st));
  } else {
    /* Central differences of L by every x, gamma and beta entry. */
    long double *params[3];
    int64_t counts[3];
    long double scale = 0.0L;
    int p;
    params[0] = xl;
    params[1] = gl;
    params[2] = bl;
    counts[0] = M * n;
    counts[1] = counts[2] = n;
    k = 0;
    for (p = 0; p < 3; p++)
      for (i = 0; i < counts[p]; i++) {
        long double keep = params[p][i], up, down, h = 1e-3L, row_rstd;
        if (p == 0) {
          ref_forward_row(norm, n, xl + (i / n) * n, gl, bl, eps, NULL, NULL, &row_rstd);
          h = 1e-4L / row_rstd;
        }
        params[p][i] = keep + h;
        up = fd_loss(norm, M, n, xl, gl, bl, dyl, eps, yrow);
        params[p][i] = keep - h;
        down = fd_loss(norm, M, n, xl, gl, bl, dyl, eps, yrow);
        params[p][i] = keep;
        fd[k] = (up - down) / (2.0L * h);
        scale += fabsl(fd[k]);
        k++;
      }
    scale /= (long double)total;
    /* fp32 results against an O(h^2) ~ 1e-9 estimate: 2e-5 of the gradient scale is far
     * above fp32 rounding and far below any wrong term of the formula. */
    for (k = 0; k < total; k++) {
      const float *lib =
          k < M * n ? dx + k : (k < M * n + n ? dgamma + (k - M * n) : dbeta + (k - M * n - n));
      double err = fabs((double)(*lib - fd[k]));
      double tol = 2e-5 * (double)(fabsl(fd[k]) + scale);
      if (err / tol > worst)
        worst = err / tol;
      if (!(err <= tol))
        case_fail("%s[%lld]: library %.9g, finite difference %.9Lg (err %.3g, tol %.3g)",
                  k < M * n ? "dx" : (k < M * n + n ? "dgamma" : "dbeta"),
                  (long long)(k < M * n ? k : (k < M * n + n ? k - M * n : k - M * n - n)),
                  (double)*lib, fd[k], err, tol);
    }
    case_note_ratio(worst);
  }
  free(x);
  free(xl);
  case_end();
}

static void test_finite_differences(void) {
  static const int64_t sizes[] = {1, 2, 8, 33};
  int s, q, from_y;
  group_begin("cpu-finite-difference: backward vs derivative of the long-double forward");
  for (s = 0; s < 4; s++)
    for (q = 0; q < 2; q++)
      for (from_y = 0; from_y < 2; from_y++)
        fd_case(norms[q], sizes[s], from_y);
  group_end();
}

/* ------------------------------------------------------------------------------------------ */

static void test_determinism(void) {
  static const int threads[] = {1, 2, 0, 3};
  static const problem_shape shapes[] = {
      {FNORM_LAYERNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, 3000, 256},
      {FNORM_LAYERNORM, FNORM_DTYPE_BF16, FNORM_DTYPE_F32, 1000, 4099},
      {FNORM_RMSNORM, FNORM_DTYPE_F16, FNORM_DTYPE_SAME, 3000, 64},
      {FNORM_RMSNORM, FNORM_DTYPE_BF16, FNORM_DTYPE_F32, 257, 1031}};
  int k;
  group_begin("cpu-determinism: cpu_threads = 1, 2, default, 3 give bitwise the same outputs");
  for (k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++) {
    char desc[400];
    tcase c = tcase_default(shapes[k].norm, shapes[k].dtype, shapes[k].param_dtype,
                            g_opt.quick ? shapes[k].rows / 4 : shapes[k].rows, shapes[k].cols);
    tcase_describe(&c, desc, sizeof desc);
    if (!case_begin("cpu determinism %s", desc))
      continue;
    run_thread_determinism(&c, threads, (int)(sizeof threads / sizeof threads[0]));
    case_end();
  }
  group_end();
}

void run_cpu_tests(void) {
  test_conversions();
  test_sizes();
  test_option_variants();
  test_rows();
  test_layouts();
  test_hard_inputs();
  test_finite_differences();
  test_determinism();
}
