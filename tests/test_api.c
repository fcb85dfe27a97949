/* The API surface: version, status names, descriptor, device query, and every bad input, each
 * asserting its specific status and that no byte of any buffer changed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cases.h"
#include "harness.h"
#include "tests.h"

/* ------------------------------------------------------------------------------------------ */

static void test_version_and_names(void) {
  group_begin("api: version, status names and strings, dtype sizes, descriptor, devices");
  if (case_begin("api version macros match the linked library")) {
    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", FNORM_VERSION_MAJOR, FNORM_VERSION_MINOR,
             FNORM_VERSION_PATCH);
    if (fnorm_version_number() != (unsigned)FNORM_VERSION_NUMBER)
      case_fail("fnorm_version_number() = %u, FNORM_VERSION_NUMBER = %d", fnorm_version_number(),
                FNORM_VERSION_NUMBER);
    if (FNORM_VERSION_NUMBER !=
        FNORM_VERSION_MAJOR * 10000 + FNORM_VERSION_MINOR * 100 + FNORM_VERSION_PATCH)
      case_fail("FNORM_VERSION_NUMBER is not MAJOR*10000 + MINOR*100 + PATCH");
    if (fnorm_version_string() == NULL || strcmp(fnorm_version_string(), FNORM_VERSION_STRING))
      case_fail("fnorm_version_string() = \"%s\", FNORM_VERSION_STRING = \"%s\"",
                fnorm_version_string() ? fnorm_version_string() : "(null)", FNORM_VERSION_STRING);
    if (strcmp(FNORM_VERSION_STRING, expect))
      case_fail("FNORM_VERSION_STRING \"%s\" is not \"%s\"", FNORM_VERSION_STRING, expect);
    case_end();
  }
  if (case_begin("api status names and strings for every code and unknown values")) {
#define CHECK_STATUS_(name, value, text)                                                           \
  if (strcmp(fnorm_status_name(name), #name) != 0)                                                 \
    case_fail("fnorm_status_name(%d) = \"%s\", want \"%s\"", value, fnorm_status_name(name),       \
              #name);                                                                              \
  if (strcmp(fnorm_status_string(name), text) != 0)                                                \
    case_fail("fnorm_status_string(%d) = \"%s\", want \"%s\"", value, fnorm_status_string(name),   \
              text);
    FNORM_STATUS_TABLE(CHECK_STATUS_)
#undef CHECK_STATUS_
    {
      static const int unknown[] = {17, 99, -1, 1000000};
      int k;
      for (k = 0; k < 4; k++) {
        const char *name = fnorm_status_name((fnorm_status)unknown[k]);
        const char *text = fnorm_status_string((fnorm_status)unknown[k]);
        if (name == NULL || strcmp(name, "FNORM_STATUS_UNKNOWN"))
          case_fail("fnorm_status_name(%d) = \"%s\"", unknown[k], name ? name : "(null)");
        if (text == NULL || strcmp(text, "unknown status"))
          case_fail("fnorm_status_string(%d) = \"%s\"", unknown[k], text ? text : "(null)");
      }
    }
    case_end();
  }
  if (case_begin("api fnorm_dtype_size")) {
    if (fnorm_dtype_size(FNORM_DTYPE_F32) != 4 || fnorm_dtype_size(FNORM_DTYPE_F16) != 2 ||
        fnorm_dtype_size(FNORM_DTYPE_BF16) != 2 || fnorm_dtype_size(FNORM_DTYPE_SAME) != 0 ||
        fnorm_dtype_size((fnorm_dtype)99) != 0 || fnorm_dtype_size((fnorm_dtype)-1) != 0)
      case_fail("sizes: f32 %zu f16 %zu bf16 %zu same %zu 99 %zu -1 %zu",
                fnorm_dtype_size(FNORM_DTYPE_F32), fnorm_dtype_size(FNORM_DTYPE_F16),
                fnorm_dtype_size(FNORM_DTYPE_BF16), fnorm_dtype_size(FNORM_DTYPE_SAME),
                fnorm_dtype_size((fnorm_dtype)99), fnorm_dtype_size((fnorm_dtype)-1));
    case_end();
  }
  if (case_begin("api fnorm_desc_init sets every field and checks nothing else")) {
    fnorm_desc d;
    fnorm_status st;
    memset(&d, 0xFF, sizeof d);
    st = fnorm_desc_init(&d, FNORM_DEVICE_CPU, FNORM_RMSNORM, FNORM_DTYPE_BF16, 7, 9);
    if (st != FNORM_SUCCESS || d.device != FNORM_DEVICE_CPU || d.norm != FNORM_RMSNORM ||
        d.dtype != FNORM_DTYPE_BF16 || d.rows != 7 || d.cols != 9 ||
        d.param_dtype != FNORM_DTYPE_SAME || d.eps != 1e-5f || d.x_stride != 0 || d.y_stride != 0 ||
        d.dy_stride != 0 || d.dx_stride != 0 || d.cpu_threads != 0 || d.flags != 0)
      case_fail("fields after fnorm_desc_init are not as documented (status %s)",
                fnorm_status_name(st));
    st = fnorm_desc_init(&d, (fnorm_device)99, (fnorm_norm)77, (fnorm_dtype)55, -5, 0);
    if (st != FNORM_SUCCESS || d.device != (fnorm_device)99 || d.rows != -5)
      case_fail("fnorm_desc_init with invalid values: %s, want FNORM_SUCCESS (it checks only "
                "desc)",
                fnorm_status_name(st));
    st = fnorm_desc_init(NULL, FNORM_DEVICE_CPU, FNORM_LAYERNORM, FNORM_DTYPE_F32, 1, 1);
    if (st != FNORM_ERR_NULL_POINTER)
      case_fail("fnorm_desc_init(NULL) = %s, want FNORM_ERR_NULL_POINTER", fnorm_status_name(st));
    case_end();
  }
  if (case_begin("api fnorm_device_available")) {
    fnorm_status st = fnorm_device_available(FNORM_DEVICE_CPU);
    static const int bad[] = {0, 3, 99, -1};
    int k;
    if (st != FNORM_SUCCESS)
      case_fail("CPU: %s, want FNORM_SUCCESS", fnorm_status_name(st));
    st = fnorm_device_available(FNORM_DEVICE_CUDA);
#ifdef FNORM_TESTS_HAVE_CUDA
    if (st != FNORM_SUCCESS && st != FNORM_ERR_NO_DEVICE)
      case_fail("CUDA (built): %s, want FNORM_SUCCESS or FNORM_ERR_NO_DEVICE",
                fnorm_status_name(st));
#else
    if (st != FNORM_ERR_NOT_BUILT)
      case_fail("CUDA (not built): %s, want FNORM_ERR_NOT_BUILT", fnorm_status_name(st));
#endif
    for (k = 0; k < 4; k++) {
      st = fnorm_device_available((fnorm_device)bad[k]);
      if (st != FNORM_ERR_BAD_DEVICE)
        case_fail("device %d: %s, want FNORM_ERR_BAD_DEVICE", bad[k], fnorm_status_name(st));
    }
    case_end();
  }
  group_end();
}

/* ------------------------------------------------------------------------------------------
 * Bad inputs. All buffers live in one arena; it is snapshotted before each call and must be
 * bitwise the same after a call that returned an error.
 * ---------------------------------------------------------------------------------------- */

enum { R_X, R_Y, R_GAMMA, R_BETA, R_MEAN, R_RSTD, R_DY, R_DX, R_DGAMMA, R_DBETA, R_WS, N_REGIONS };
static const char *const region_names[N_REGIONS] = {
    "x", "y", "gamma", "beta", "mean", "rstd", "dy", "dx", "dgamma", "dbeta", "workspace"};

typedef struct arena {
  unsigned char *alloc, *base, *snapshot;
  size_t region_bytes, bytes;
  int64_t rows, cols;
  fnorm_dtype dtype, param_dtype;
  size_t ws_bytes; /* the workspace query's answer for the base descriptor */
  fnorm_desc desc;
  fnorm_forward_args fwd;
  fnorm_backward_args bwd;
} arena;

static unsigned char *region(arena *a, int r) {
  return a->base + (size_t)r * a->region_bytes;
}

/* A valid problem: LayerNorm, rows x cols, every buffer in its own region; room in every
 * region for a stride of 2*cols. */
static int arena_init(arena *a, fnorm_norm norm, fnorm_dtype dtype, fnorm_dtype param_dtype,
                      int64_t rows, int64_t cols) {
  size_t es = fnorm_dtype_size(dtype);
  size_t pes = fnorm_dtype_size(param_dtype == FNORM_DTYPE_SAME ? dtype : param_dtype);
  int64_t k;
  fnorm_status st;
  memset(a, 0, sizeof *a);
  a->rows = rows;
  a->cols = cols;
  a->dtype = dtype;
  a->param_dtype = param_dtype;
  fnorm_desc_init(&a->desc, FNORM_DEVICE_CPU, norm, dtype, rows, cols);
  a->desc.param_dtype = param_dtype;
  st = fnorm_backward_workspace_size(&a->desc, &a->ws_bytes);
  if (st != FNORM_SUCCESS)
    return -1;
  a->region_bytes = ((size_t)(rows * cols * 2) * 4 + 256 + 63) / 64 * 64;
  if (a->region_bytes < (a->ws_bytes + 256 + 63) / 64 * 64)
    a->region_bytes = (a->ws_bytes + 256 + 63) / 64 * 64;
  a->bytes = a->region_bytes * N_REGIONS;
  a->alloc = (unsigned char *)malloc(a->bytes + 64);
  a->snapshot = (unsigned char *)malloc(a->bytes);
  if (a->alloc == NULL || a->snapshot == NULL)
    return -1;
  a->base = a->alloc + (64 - (uintptr_t)a->alloc % 64) % 64;
  memset(a->base, POISON_BYTE, a->bytes);
  /* Inputs get valid values (x varies along the row, so the problem is well posed). */
  for (k = 0; k < rows * cols; k++) {
    store_elem(region(a, R_X) + (size_t)k * es, dtype, 0.25 * (double)(k % 7) - 0.5);
    store_elem(region(a, R_DY) + (size_t)k * es, dtype, 0.125 * (double)(k % 5) - 0.25);
  }
  for (k = 0; k < cols; k++) {
    fnorm_dtype pd = param_dtype == FNORM_DTYPE_SAME ? dtype : param_dtype;
    store_elem(region(a, R_GAMMA) + (size_t)k * pes, pd, 1.0 + 0.0625 * (double)(k % 3));
    store_elem(region(a, R_BETA) + (size_t)k * pes, pd, 0.0625 * (double)(k % 4));
  }
  for (k = 0; k < rows; k++) {
    float mean = 0.25f, rstd = 1.5f;
    memcpy(region(a, R_MEAN) + 4 * k, &mean, 4);
    memcpy(region(a, R_RSTD) + 4 * k, &rstd, 4);
  }
  /* y holds a valid forward output for the backward from y (it is an input there). */
  for (k = 0; k < rows * cols; k++)
    store_elem(region(a, R_Y) + (size_t)k * es, dtype, 0.5 - 0.125 * (double)(k % 9));
  a->fwd.x = region(a, R_X);
  a->fwd.gamma = region(a, R_GAMMA);
  a->fwd.beta = region(a, R_BETA);
  a->fwd.y = region(a, R_Y);
  a->fwd.mean = norm == FNORM_LAYERNORM ? (float *)region(a, R_MEAN) : NULL;
  a->fwd.rstd = (float *)region(a, R_RSTD);
  a->bwd.dy = region(a, R_DY);
  a->bwd.x = region(a, R_X);
  a->bwd.mean = norm == FNORM_LAYERNORM ? (const float *)region(a, R_MEAN) : NULL;
  a->bwd.rstd = (const float *)region(a, R_RSTD);
  a->bwd.gamma = region(a, R_GAMMA);
  a->bwd.dx = region(a, R_DX);
  a->bwd.dgamma = region(a, R_DGAMMA);
  a->bwd.dbeta = region(a, R_DBETA);
  return 0;
}

static void arena_free(arena *a) {
  free(a->alloc);
  free(a->snapshot);
}

static void arena_snapshot(arena *a) {
  memcpy(a->snapshot, a->base, a->bytes);
}

static void arena_expect_unchanged(arena *a) {
  size_t k;
  for (k = 0; k < a->bytes; k++)
    if (a->base[k] != a->snapshot[k]) {
      case_fail("byte %zu of the %s buffer changed although the call failed", k % a->region_bytes,
                region_names[k / a->region_bytes]);
      return;
    }
}

static int status_is(fnorm_status got, fnorm_status want, fnorm_status also_ok) {
  return got == want || got == also_ok;
}

static void report_status(const char *call, fnorm_status got, fnorm_status want,
                          fnorm_status also_ok) {
  if (status_is(got, want, also_ok))
    return;
  if (also_ok != want)
    case_fail("%s returned %s, want %s or %s", call, fnorm_status_name(got),
              fnorm_status_name(want), fnorm_status_name(also_ok));
  else
    case_fail("%s returned %s, want %s", call, fnorm_status_name(got), fnorm_status_name(want));
}

/* The three calls with one bad input; `also_ok` names a second acceptable status where the
 * header leaves the choice open (it equals `want` everywhere else). */
static void expect_fwd2(arena *a, const char *what, const fnorm_desc *d,
                        const fnorm_forward_args *args, fnorm_status want, fnorm_status also_ok) {
  if (!case_begin("api bad-input forward %s/%s: %s", norm_name(a->desc.norm), dtype_name(a->dtype),
                  what))
    return;
  arena_snapshot(a);
  report_status("fnorm_forward", fnorm_forward(d, args, NULL), want, also_ok);
  if (want != FNORM_SUCCESS)
    arena_expect_unchanged(a);
  case_end();
}

static void expect_fwd(arena *a, const char *what, const fnorm_desc *d,
                       const fnorm_forward_args *args, fnorm_status want) {
  expect_fwd2(a, what, d, args, want, want);
}

static void expect_bwd2(arena *a, const char *what, const fnorm_desc *d,
                        const fnorm_backward_args *args, void *ws, size_t ws_bytes,
                        fnorm_status want, fnorm_status also_ok) {
  if (!case_begin("api bad-input backward %s/%s: %s", norm_name(a->desc.norm), dtype_name(a->dtype),
                  what))
    return;
  arena_snapshot(a);
  report_status("fnorm_backward", fnorm_backward(d, args, ws, ws_bytes, NULL), want, also_ok);
  if (want != FNORM_SUCCESS)
    arena_expect_unchanged(a);
  case_end();
}

static void expect_bwd(arena *a, const char *what, const fnorm_desc *d,
                       const fnorm_backward_args *args, fnorm_status want) {
  expect_bwd2(a, what, d, args, a->ws_bytes ? region(a, R_WS) : NULL, a->ws_bytes, want, want);
}

/* The workspace query with a bad descriptor: the same status, and *bytes left alone. */
static void expect_ws2(arena *a, const char *what, const fnorm_desc *d, fnorm_status want,
                       fnorm_status also_ok) {
  size_t bytes = (size_t)0x5EED5EEDu;
  fnorm_status st;
  if (!case_begin("api bad-input workspace-size %s/%s: %s", norm_name(a->desc.norm),
                  dtype_name(a->dtype), what))
    return;
  st = fnorm_backward_workspace_size(d, &bytes);
  report_status("fnorm_backward_workspace_size", st, want, also_ok);
  if (st != FNORM_SUCCESS && bytes != (size_t)0x5EED5EEDu)
    case_fail("the failed query wrote *bytes (%zu)", bytes);
  case_end();
}

static void expect_all2(arena *a, const char *what, const fnorm_desc *d, fnorm_status want,
                        fnorm_status also_ok) {
  expect_fwd2(a, what, d, &a->fwd, want, also_ok);
  expect_bwd2(a, what, d, &a->bwd, a->ws_bytes ? region(a, R_WS) : NULL, a->ws_bytes, want,
              also_ok);
  expect_ws2(a, what, d, want, also_ok);
}

static void expect_all(arena *a, const char *what, const fnorm_desc *d, fnorm_status want) {
  expect_all2(a, what, d, want, want);
}

static void bad_descriptors(arena *a) {
  fnorm_desc d;
  char what[96];
  int k;
  static const int64_t bad_sizes[] = {0, -1, INT64_MIN};
  static const float bad_eps[] = {0.0f, -0.0f, -1.0f, -1e-30f, NAN, INFINITY, -INFINITY};
  static const int bad_dtypes[] = {0, 4, 99, -1};
  static const int bad_devices[] = {0, 3, 99, -1};
  static const int bad_norms[] = {0, 3, -1};
  static const uint32_t bad_flags[] = {1u, 2u, 0x80000000u};

  for (k = 0; k < 3; k++) {
    d = a->desc;
    d.rows = bad_sizes[k];
    snprintf(what, sizeof what, "rows=%lld", (long long)bad_sizes[k]);
    expect_all(a, what, &d, FNORM_ERR_BAD_SIZE);
    d = a->desc;
    d.cols = bad_sizes[k];
    snprintf(what, sizeof what, "cols=%lld", (long long)bad_sizes[k]);
    expect_all(a, what, &d, FNORM_ERR_BAD_SIZE);
  }
  /* Sizes whose element or byte count overflows. */
  d = a->desc;
  d.rows = d.cols = (int64_t)1 << 40;
  expect_all(a, "rows=cols=2^40 (elements overflow)", &d, FNORM_ERR_BAD_SIZE);
  d = a->desc;
  d.rows = 1;
  d.cols = (int64_t)1 << 62;
  expect_all(a, "rows=1 cols=2^62 (bytes overflow)", &d, FNORM_ERR_BAD_SIZE);
  d = a->desc;
  d.rows = INT64_MAX;
  d.cols = 2;
  expect_all(a, "rows=INT64_MAX cols=2", &d, FNORM_ERR_BAD_SIZE);
  /* A valid stride whose extent overflows: the header's "matrix size overflows", though a
   * library may fairly call it a bad stride. */
  d = a->desc;
  d.rows = (int64_t)1 << 33;
  d.cols = 1;
  d.x_stride = d.y_stride = d.dy_stride = d.dx_stride = (int64_t)1 << 31;
  expect_all2(a, "rows=2^33 strides=2^31 (extent overflows)", &d, FNORM_ERR_BAD_SIZE,
              FNORM_ERR_BAD_STRIDE);

  for (k = 0; k < 7; k++) {
    d = a->desc;
    d.eps = bad_eps[k];
    snprintf(what, sizeof what, "eps=%g", (double)bad_eps[k]);
    expect_all(a, what, &d, FNORM_ERR_BAD_EPS);
  }
  for (k = 0; k < 4; k++) {
    d = a->desc;
    d.dtype = (fnorm_dtype)bad_dtypes[k];
    snprintf(what, sizeof what, "dtype=%d", bad_dtypes[k]);
    expect_all(a, what, &d, FNORM_ERR_BAD_DTYPE);
    d = a->desc;
    d.param_dtype = (fnorm_dtype)(bad_dtypes[k] == 0 ? 98 : bad_dtypes[k]);
    snprintf(what, sizeof what, "param_dtype=%d", (int)d.param_dtype);
    expect_all(a, what, &d, FNORM_ERR_BAD_DTYPE);
  }
  {
    /* Combinations: only SAME and F32 are valid param dtypes. */
    static const int pairs[4][2] = {{FNORM_DTYPE_BF16, FNORM_DTYPE_F16},
                                    {FNORM_DTYPE_F16, FNORM_DTYPE_BF16},
                                    {FNORM_DTYPE_F32, FNORM_DTYPE_F16},
                                    {FNORM_DTYPE_F32, FNORM_DTYPE_BF16}};
    for (k = 0; k < 4; k++) {
      d = a->desc;
      d.dtype = (fnorm_dtype)pairs[k][0];
      d.param_dtype = (fnorm_dtype)pairs[k][1];
      snprintf(what, sizeof what, "dtype=%s param_dtype=%s", dtype_name(d.dtype),
               dtype_name(d.param_dtype));
      expect_all(a, what, &d, FNORM_ERR_BAD_DTYPE);
    }
  }
  for (k = 0; k < 4; k++) {
    d = a->desc;
    d.device = (fnorm_device)bad_devices[k];
    snprintf(what, sizeof what, "device=%d", bad_devices[k]);
    expect_all(a, what, &d, FNORM_ERR_BAD_DEVICE);
  }
  for (k = 0; k < 3; k++) {
    d = a->desc;
    d.norm = (fnorm_norm)bad_norms[k];
    snprintf(what, sizeof what, "norm=%d", bad_norms[k]);
    expect_all(a, what, &d, FNORM_ERR_BAD_NORM);
  }
  for (k = 0; k < 3; k++) {
    d = a->desc;
    d.flags = bad_flags[k];
    snprintf(what, sizeof what, "flags=0x%x", (unsigned)bad_flags[k]);
    expect_all(a, what, &d, FNORM_ERR_BAD_FLAGS);
  }
  /* A zeroed descriptor is rejected (which check fires first is the library's choice). */
  if (case_begin("api bad-input forward: zeroed descriptor")) {
    fnorm_status st;
    memset(&d, 0, sizeof d);
    arena_snapshot(a);
    st = fnorm_forward(&d, &a->fwd, NULL);
    if (st == FNORM_SUCCESS)
      case_fail("a zeroed descriptor was accepted");
    arena_expect_unchanged(a);
    case_end();
  }
#ifndef FNORM_TESTS_HAVE_CUDA
  d = a->desc;
  d.device = FNORM_DEVICE_CUDA;
  expect_all(a, "device=CUDA in a build without CUDA", &d, FNORM_ERR_NOT_BUILT);
#endif
}

static void bad_strides(arena *a) {
  fnorm_desc d;
  fnorm_backward_args b;
  int64_t c = a->cols;
  /* forward: x and y */
  d = a->desc;
  d.x_stride = -1;
  expect_fwd(a, "x_stride=-1", &d, &a->fwd, FNORM_ERR_BAD_STRIDE);
  d = a->desc;
  d.x_stride = INT64_MIN;
  expect_fwd(a, "x_stride=INT64_MIN", &d, &a->fwd, FNORM_ERR_BAD_STRIDE);
  d = a->desc;
  d.y_stride = -c;
  expect_fwd(a, "y_stride=-cols", &d, &a->fwd, FNORM_ERR_BAD_STRIDE);
  d = a->desc;
  d.x_stride = c - 1;
  expect_fwd(a, "x_stride=cols-1", &d, &a->fwd, FNORM_ERR_BAD_STRIDE);
  d = a->desc;
  d.y_stride = 1;
  expect_fwd(a, "y_stride=1", &d, &a->fwd, FNORM_ERR_BAD_STRIDE);
  /* backward: dy, dx, x (from x) and y (from y) */
  d = a->desc;
  d.dy_stride = -1;
  expect_bwd(a, "dy_stride=-1", &d, &a->bwd, FNORM_ERR_BAD_STRIDE);
  expect_ws2(a, "dy_stride=-1", &d, FNORM_ERR_BAD_STRIDE, FNORM_ERR_BAD_STRIDE);
  d = a->desc;
  d.dx_stride = -1;
  expect_bwd(a, "dx_stride=-1", &d, &a->bwd, FNORM_ERR_BAD_STRIDE);
  d = a->desc;
  d.dy_stride = c - 1;
  expect_bwd(a, "dy_stride=cols-1", &d, &a->bwd, FNORM_ERR_BAD_STRIDE);
  d = a->desc;
  d.dx_stride = 1;
  expect_bwd(a, "dx_stride=1", &d, &a->bwd, FNORM_ERR_BAD_STRIDE);
  d = a->desc;
  d.x_stride = c - 1;
  expect_bwd(a, "x_stride=cols-1", &d, &a->bwd, FNORM_ERR_BAD_STRIDE);
  d = a->desc;
  d.y_stride = -3;
  b = a->bwd;
  b.x = NULL;
  b.y = region(a, R_Y);
  expect_bwd(a, "from y, y_stride=-3", &d, &b, FNORM_ERR_BAD_STRIDE);
}

static void bad_pointers(arena *a) {
  fnorm_forward_args f;
  fnorm_backward_args b;
  size_t bytes;
  fnorm_status st;
  int is_ln = a->desc.norm == FNORM_LAYERNORM;

  expect_fwd(a, "desc=NULL", NULL, &a->fwd, FNORM_ERR_NULL_POINTER);
  expect_fwd(a, "args=NULL", &a->desc, NULL, FNORM_ERR_NULL_POINTER);
  f = a->fwd;
  f.x = NULL;
  expect_fwd(a, "x=NULL", &a->desc, &f, FNORM_ERR_NULL_POINTER);
  f = a->fwd;
  f.y = NULL;
  expect_fwd(a, "y=NULL", &a->desc, &f, FNORM_ERR_NULL_POINTER);

  expect_bwd(a, "desc=NULL", NULL, &a->bwd, FNORM_ERR_NULL_POINTER);
  expect_bwd(a, "args=NULL", &a->desc, NULL, FNORM_ERR_NULL_POINTER);
  b = a->bwd;
  b.dy = NULL;
  expect_bwd(a, "dy=NULL", &a->desc, &b, FNORM_ERR_NULL_POINTER);
  b = a->bwd;
  b.rstd = NULL;
  expect_bwd(a, "rstd=NULL", &a->desc, &b, FNORM_ERR_NULL_POINTER);
  b = a->bwd;
  b.x = NULL;
  expect_bwd(a, "x=NULL and y=NULL", &a->desc, &b, FNORM_ERR_NULL_POINTER);
  if (is_ln) {
    b = a->bwd;
    b.mean = NULL;
    expect_bwd(a, "LayerNorm from x with mean=NULL", &a->desc, &b, FNORM_ERR_NULL_POINTER);
  }
  if (case_begin("api bad-input workspace-size %s/%s: desc=NULL, bytes=NULL",
                 norm_name(a->desc.norm), dtype_name(a->dtype))) {
    bytes = (size_t)0x5EED5EEDu;
    st = fnorm_backward_workspace_size(NULL, &bytes);
    report_status("fnorm_backward_workspace_size(NULL, &bytes)", st, FNORM_ERR_NULL_POINTER,
                  FNORM_ERR_NULL_POINTER);
    if (bytes != (size_t)0x5EED5EEDu)
      case_fail("the failed query wrote *bytes");
    st = fnorm_backward_workspace_size(&a->desc, NULL);
    report_status("fnorm_backward_workspace_size(desc, NULL)", st, FNORM_ERR_NULL_POINTER,
                  FNORM_ERR_NULL_POINTER);
    case_end();
  }

  /* Arguments this operation does not take. */
  if (!is_ln) {
    f = a->fwd;
    f.mean = (float *)region(a, R_MEAN);
    expect_fwd(a, "RMSNorm with mean", &a->desc, &f, FNORM_ERR_BAD_ARGUMENT);
  }
  b = a->bwd;
  b.beta = region(a, R_BETA);
  expect_bwd(a, "beta given with x", &a->desc, &b, FNORM_ERR_BAD_ARGUMENT);
  b = a->bwd;
  b.y = region(a, R_Y);
  expect_bwd(a, "both x and y given", &a->desc, &b, FNORM_ERR_BAD_ARGUMENT);
}

/* Pointers off their element alignment: odd byte addresses, and 2-byte aligned addresses
 * for fp32 buffers. */
static void misaligned(arena *a) {
  size_t es = fnorm_dtype_size(a->dtype);
  size_t pes = fnorm_dtype_size(a->param_dtype == FNORM_DTYPE_SAME ? a->dtype : a->param_dtype);
  size_t off[2];
  int k;
  char what[96];
  off[0] = 1;
  off[1] = 2;
  for (k = 0; k < 2; k++) {
    fnorm_forward_args f;
    fnorm_backward_args b;
    size_t o = off[k];
#define MIS_FWD(field, reg, type, size)                                                            \
  if (o % (size) != 0) {                                                                           \
    f = a->fwd;                                                                                    \
    f.field = (type)(region(a, reg) + o);                                                          \
    snprintf(what, sizeof what, #field " at +%zu bytes", o);                                       \
    expect_fwd(a, what, &a->desc, &f, FNORM_ERR_MISALIGNED);                                       \
  }
#define MIS_BWD(field, reg, type, size)                                                            \
  if (o % (size) != 0) {                                                                           \
    b = a->bwd;                                                                                    \
    b.field = (type)(region(a, reg) + o);                                                          \
    snprintf(what, sizeof what, #field " at +%zu bytes", o);                                       \
    expect_bwd(a, what, &a->desc, &b, FNORM_ERR_MISALIGNED);                                       \
  }
    MIS_FWD(x, R_X, const void *, es)
    MIS_FWD(y, R_Y, void *, es)
    MIS_FWD(gamma, R_GAMMA, const void *, pes)
    MIS_FWD(beta, R_BETA, const void *, pes)
    if (a->fwd.mean) {
      MIS_FWD(mean, R_MEAN, float *, 4)
    }
    MIS_FWD(rstd, R_RSTD, float *, 4)
    MIS_BWD(dy, R_DY, const void *, es)
    MIS_BWD(x, R_X, const void *, es)
    if (a->bwd.mean) {
      MIS_BWD(mean, R_MEAN, const float *, 4)
    }
    MIS_BWD(rstd, R_RSTD, const float *, 4)
    MIS_BWD(gamma, R_GAMMA, const void *, pes)
    MIS_BWD(dx, R_DX, void *, es)
    MIS_BWD(dgamma, R_DGAMMA, void *, pes)
    MIS_BWD(dbeta, R_DBETA, void *, pes)
    if (o % es != 0) {
      b = a->bwd;
      b.x = NULL;
      b.y = region(a, R_Y) + o;
      b.beta = region(a, R_BETA);
      snprintf(what, sizeof what, "from y, y at +%zu bytes", o);
      expect_bwd(a, what, &a->desc, &b, FNORM_ERR_MISALIGNED);
    }
    if (o % pes != 0) {
      b = a->bwd;
      b.x = NULL;
      b.y = region(a, R_Y);
      b.beta = region(a, R_BETA) + o;
      snprintf(what, sizeof what, "from y, beta at +%zu bytes", o);
      expect_bwd(a, what, &a->desc, &b, FNORM_ERR_MISALIGNED);
    }
#undef MIS_FWD
#undef MIS_BWD
  }
}

static void aliasing(arena *a) {
  size_t es = fnorm_dtype_size(a->dtype);
  int64_t c = a->cols;
  fnorm_forward_args f;
  fnorm_backward_args b;
  fnorm_desc d;
  /* forward */
  f = a->fwd;
  f.y = region(a, R_X) + es;
  expect_fwd(a, "y = x + 1 element", &a->desc, &f, FNORM_ERR_ALIASING);
  f = a->fwd;
  f.y = region(a, R_X) + (size_t)(a->rows * c - 1) * es;
  expect_fwd(a, "y starts at x's last element", &a->desc, &f, FNORM_ERR_ALIASING);
  f = a->fwd;
  f.x = region(a, R_Y) + (size_t)(a->rows * c - 1) * es;
  expect_fwd(a, "x starts at y's last element", &a->desc, &f, FNORM_ERR_ALIASING);
  d = a->desc;
  d.y_stride = 2 * c;
  f = a->fwd;
  f.y = region(a, R_X);
  expect_fwd(a, "y == x with y_stride != x_stride", &d, &f, FNORM_ERR_ALIASING);
  f = a->fwd;
  f.y = (void *)f.gamma;
  expect_fwd(a, "y over gamma", &a->desc, &f, FNORM_ERR_ALIASING);
  f = a->fwd;
  f.beta = region(a, R_Y) + es * (size_t)c;
  expect_fwd(a, "beta inside y's second row", &a->desc, &f, FNORM_ERR_ALIASING);
  f = a->fwd;
  f.rstd = (float *)region(a, R_X) + 1;
  expect_fwd(a, "rstd inside x", &a->desc, &f, FNORM_ERR_ALIASING);
  f = a->fwd;
  f.rstd = (float *)(region(a, R_Y) + es * (size_t)c);
  expect_fwd(a, "rstd inside y", &a->desc, &f, FNORM_ERR_ALIASING);
  if (f.mean != NULL) {
    f = a->fwd;
    f.rstd = f.mean + 1;
    expect_fwd(a, "rstd = mean + 1 (overlap)", &a->desc, &f, FNORM_ERR_ALIASING);
    f = a->fwd;
    f.rstd = f.mean;
    expect_fwd(a, "rstd == mean", &a->desc, &f, FNORM_ERR_ALIASING);
  }
  /* backward */
  b = a->bwd;
  b.dx = region(a, R_X);
  expect_bwd(a, "dx == x", &a->desc, &b, FNORM_ERR_ALIASING);
  b = a->bwd;
  b.dx = region(a, R_DY) + es;
  expect_bwd(a, "dx = dy + 1 element", &a->desc, &b, FNORM_ERR_ALIASING);
  d = a->desc;
  d.dx_stride = 2 * c;
  b = a->bwd;
  b.dx = region(a, R_DY);
  expect_bwd(a, "dx == dy with dx_stride != dy_stride", &d, &b, FNORM_ERR_ALIASING);
  b = a->bwd;
  b.dgamma = region(a, R_DX) + es * (size_t)c;
  expect_bwd(a, "dgamma inside dx", &a->desc, &b, FNORM_ERR_ALIASING);
  b = a->bwd;
  b.dbeta = b.dgamma;
  expect_bwd(a, "dbeta == dgamma", &a->desc, &b, FNORM_ERR_ALIASING);
  b = a->bwd;
  b.dbeta = (unsigned char *)b.dgamma +
            fnorm_dtype_size(a->param_dtype == FNORM_DTYPE_SAME ? a->dtype : a->param_dtype);
  expect_bwd(a, "dbeta = dgamma + 1 element", &a->desc, &b, FNORM_ERR_ALIASING);
  b = a->bwd;
  b.dgamma = (void *)b.gamma;
  expect_bwd(a, "dgamma == gamma", &a->desc, &b, FNORM_ERR_ALIASING);
  b = a->bwd;
  b.rstd = (const float *)(region(a, R_DX) + 8);
  expect_bwd(a, "rstd inside dx", &a->desc, &b, FNORM_ERR_ALIASING);
  b = a->bwd;
  b.dbeta = region(a, R_DY) + es * (size_t)c;
  expect_bwd(a, "dbeta inside dy", &a->desc, &b, FNORM_ERR_ALIASING);
  b = a->bwd;
  b.x = NULL;
  b.y = region(a, R_Y);
  b.dx = region(a, R_Y) + es;
  expect_bwd(a, "from y, dx = y + 1 element", &a->desc, &b, FNORM_ERR_ALIASING);
  if (b.mean != NULL) {
    b = a->bwd;
    b.dgamma = (void *)(b.mean + 1);
    expect_bwd(a, "dgamma inside mean", &a->desc, &b, FNORM_ERR_ALIASING);
  }
}

static void workspace_checks(void) {
  /* The CPU backend may need no workspace for small shapes; look for one that does. */
  static const int64_t shapes[][2] = {{4, 8}, {64, 1024}, {1024, 256}, {4096, 64}};
  arena a;
  int k, found = 0;
  for (k = 0; k < 4 && !found; k++) {
    if (arena_init(&a, FNORM_LAYERNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, shapes[k][0],
                   shapes[k][1]) != 0) {
      arena_free(&a);
      continue;
    }
    if (a.ws_bytes > 0)
      found = 1;
    else
      arena_free(&a);
  }
  if (!found) {
    if (case_begin("api bad-input backward: workspace too small, NULL, misaligned")) {
      case_skip("the CPU backend needs no workspace for any probed shape");
      case_end();
    }
    return;
  }
  expect_bwd2(&a, "workspace_bytes = query - 1", &a.desc, &a.bwd, region(&a, R_WS), a.ws_bytes - 1,
              FNORM_ERR_WORKSPACE_TOO_SMALL, FNORM_ERR_WORKSPACE_TOO_SMALL);
  expect_bwd2(&a, "workspace_bytes = 0", &a.desc, &a.bwd, region(&a, R_WS), 0,
              FNORM_ERR_WORKSPACE_TOO_SMALL, FNORM_ERR_WORKSPACE_TOO_SMALL);
  expect_bwd2(&a, "workspace = NULL with workspace_bytes = query", &a.desc, &a.bwd, NULL,
              a.ws_bytes, FNORM_ERR_NULL_POINTER, FNORM_ERR_NULL_POINTER);
  expect_bwd2(&a, "workspace at +8 bytes (not 16-byte aligned)", &a.desc, &a.bwd,
              region(&a, R_WS) + 8, a.ws_bytes, FNORM_ERR_MISALIGNED, FNORM_ERR_MISALIGNED);
  expect_bwd2(&a, "workspace larger than the query", &a.desc, &a.bwd, region(&a, R_WS),
              a.ws_bytes + 64, FNORM_SUCCESS, FNORM_SUCCESS);
  arena_free(&a);
}

/* ------------------------------------------------------------------------------------------
 * Legal layouts that a careless overlap check would reject, and arguments that are ignored.
 * ---------------------------------------------------------------------------------------- */

/* A backward whose mean the call must ignore (from y, or RMSNorm), with `st` the status of its
 * setup: run it into dx1 as given, then with a NaN mean into dx2; dx must be the same. */
static void expect_mean_ignored(const fnorm_desc *d, fnorm_backward_args *b, void *ws,
                                size_t ws_bytes, fnorm_status st, float *dx1, float *dx2,
                                float *nan_mean, int rows, int cols) {
  b->dx = dx1;
  if (st == FNORM_SUCCESS)
    st = fnorm_backward(d, b, ws, ws_bytes, NULL);
  memset(nan_mean, 0xFF, (size_t)rows * sizeof *nan_mean);
  b->mean = nan_mean;
  b->dx = dx2;
  if (st == FNORM_SUCCESS)
    st = fnorm_backward(d, b, ws, ws_bytes, NULL);
  if (st != FNORM_SUCCESS)
    case_fail("a call returned %s", fnorm_status_name(st));
  else if (memcmp(dx1, dx2, (size_t)rows * (size_t)cols * sizeof *dx1) != 0)
    case_fail("dx depends on the (ignored) mean");
}

static void legal_layouts(void) {
  enum { M = 5, N = 24 };
  float buf[M][2 * N], buf2[M][2 * N], x[M][N], dy[M][N], rstd[M], mean[M], gamma[N];
  float dx_plain[M][N], dg_plain[N], db_plain[N], dg[N], db[N];
  long double xl[N], gl[N], yl[N], lmean, lrstd;
  fnorm_desc d;
  fnorm_forward_args f;
  fnorm_backward_args b;
  fnorm_status st;
  int i, j;
  size_t ws_bytes = 0;
  void *ws = NULL;
  for (i = 0; i < M; i++)
    for (j = 0; j < N; j++) {
      x[i][j] = (float)(0.1 * i - 0.07 * j + 0.003 * j * j);
      dy[i][j] = (float)(0.05 * ((i * 7 + j * 3) % 11) - 0.2);
    }
  for (j = 0; j < N; j++)
    gamma[j] = (float)(1.0 + 0.01 * j);

  fnorm_desc_init(&d, FNORM_DEVICE_CPU, FNORM_LAYERNORM, FNORM_DTYPE_F32, M, N);
  if (fnorm_backward_workspace_size(&d, &ws_bytes) != FNORM_SUCCESS ||
      (ws_bytes > 0 && (ws = malloc(ws_bytes + 16)) == NULL))
    ws_bytes = (size_t)-1;
  /* mean and rstd for the backward calls below, from a plain forward. */
  memset(&f, 0, sizeof f);
  f.x = x;
  f.y = dx_plain;
  f.gamma = gamma;
  f.mean = mean;
  f.rstd = rstd;
  if (fnorm_forward(&d, &f, NULL) != FNORM_SUCCESS)
    ws_bytes = (size_t)-1;

  if (case_begin("api legal: forward x and y interleaved halves of one [rows][2N] buffer")) {
    memset(buf, 0xFF, sizeof buf);
    for (i = 0; i < M; i++)
      memcpy(buf[i], x[i], sizeof x[i]);
    d.x_stride = d.y_stride = 2 * N;
    memset(&f, 0, sizeof f);
    f.x = &buf[0][0];
    f.y = &buf[0][N];
    f.gamma = gamma;
    st = fnorm_forward(&d, &f, NULL);
    if (st != FNORM_SUCCESS) {
      case_fail("fnorm_forward returned %s, want FNORM_SUCCESS", fnorm_status_name(st));
    } else {
      for (i = 0; i < M; i++) {
        for (j = 0; j < N; j++) {
          xl[j] = x[i][j];
          gl[j] = gamma[j];
        }
        ref_forward_row(FNORM_LAYERNORM, N, xl, gl, NULL, (long double)d.eps, yl, &lmean, &lrstd);
        for (j = 0; j < N; j++) {
          if (memcmp(&buf[i][j], &x[i][j], 4) != 0)
            case_fail("x[%d][%d] changed", i, j);
          if (!(fabsl(buf[i][N + j] - yl[j]) <= 1e-5L * (1.0L + fabsl(yl[j]))))
            case_fail("y[%d][%d] = %.9g, want %.9Lg", i, j, (double)buf[i][N + j], yl[j]);
        }
      }
    }
    case_end();
  }
  d.x_stride = d.y_stride = 0;

  if (ws_bytes == (size_t)-1) {
    if (case_begin("api legal: backward layouts")) {
      case_fail("setup failed: the packed forward or the workspace query did not succeed");
      case_end();
    }
    free(ws);
    return;
  }
  /* The plain backward, for comparison. */
  memset(&b, 0, sizeof b);
  b.dy = dy;
  b.x = x;
  b.mean = mean;
  b.rstd = rstd;
  b.gamma = gamma;
  b.dx = dx_plain;
  b.dgamma = dg_plain;
  b.dbeta = db_plain;
  st = fnorm_backward(&d, &b, ws, ws_bytes, NULL);
  if (case_begin("api legal: backward dy and dx interleaved halves of one [rows][2N] buffer")) {
    if (st != FNORM_SUCCESS) {
      case_fail("the plain backward returned %s", fnorm_status_name(st));
    } else {
      memset(buf2, 0xFF, sizeof buf2);
      for (i = 0; i < M; i++)
        memcpy(buf2[i], dy[i], sizeof dy[i]);
      d.dy_stride = d.dx_stride = 2 * N;
      b.dy = &buf2[0][0];
      b.dx = &buf2[0][N];
      b.dgamma = dg;
      b.dbeta = db;
      st = fnorm_backward(&d, &b, ws, ws_bytes, NULL);
      d.dy_stride = d.dx_stride = 0;
      if (st != FNORM_SUCCESS)
        case_fail("fnorm_backward returned %s, want FNORM_SUCCESS", fnorm_status_name(st));
      else
        for (i = 0; i < M; i++)
          if (memcmp(&buf2[i][N], dx_plain[i], sizeof dx_plain[i]) != 0 ||
              memcmp(buf2[i], dy[i], sizeof dy[i]) != 0)
            case_fail("row %d: dx differs from the packed call's, or dy changed", i);
      if (st == FNORM_SUCCESS &&
          (memcmp(dg, dg_plain, sizeof dg) != 0 || memcmp(db, db_plain, sizeof db) != 0))
        case_fail("dgamma/dbeta differ from the packed call's");
    }
    case_end();
  }
  if (case_begin("api legal: backward x and dx interleaved halves of one [rows][2N] buffer")) {
    memset(buf2, 0xFF, sizeof buf2);
    for (i = 0; i < M; i++)
      memcpy(buf2[i], x[i], sizeof x[i]);
    d.x_stride = d.dx_stride = 2 * N;
    memset(&b, 0, sizeof b);
    b.dy = dy;
    b.x = &buf2[0][0];
    b.mean = mean;
    b.rstd = rstd;
    b.gamma = gamma;
    b.dx = &buf2[0][N];
    st = fnorm_backward(&d, &b, ws, ws_bytes, NULL);
    d.x_stride = d.dx_stride = 0;
    if (st != FNORM_SUCCESS)
      case_fail("fnorm_backward returned %s, want FNORM_SUCCESS", fnorm_status_name(st));
    else
      for (i = 0; i < M; i++)
        if (memcmp(&buf2[i][N], dx_plain[i], sizeof dx_plain[i]) != 0)
          case_fail("row %d: dx differs from the packed call's", i);
    case_end();
  }
  if (case_begin("api legal: LayerNorm backward from y ignores mean")) {
    float y[M][N], dx1[M][N], dx2[M][N], nan_mean[M];
    memset(&f, 0, sizeof f);
    f.x = x;
    f.y = y;
    f.gamma = gamma;
    f.rstd = rstd;
    st = fnorm_forward(&d, &f, NULL);
    memset(&b, 0, sizeof b);
    b.dy = dy;
    b.y = y;
    b.rstd = rstd;
    b.gamma = gamma;
    expect_mean_ignored(&d, &b, ws, ws_bytes, st, &dx1[0][0], &dx2[0][0], nan_mean, M, N);
    case_end();
  }
  free(ws);
  ws = NULL;
  d.norm = FNORM_RMSNORM;
  if (fnorm_backward_workspace_size(&d, &ws_bytes) != FNORM_SUCCESS ||
      (ws_bytes > 0 && (ws = malloc(ws_bytes)) == NULL))
    return;
  if (case_begin("api legal: RMSNorm backward from x ignores mean")) {
    float dx1[M][N], dx2[M][N], nan_mean[M];
    memset(&f, 0, sizeof f);
    f.x = x;
    f.y = dx1; /* scratch for the forward's y */
    f.rstd = rstd;
    st = fnorm_forward(&d, &f, NULL);
    memset(&b, 0, sizeof b);
    b.dy = dy;
    b.x = x;
    b.rstd = rstd;
    expect_mean_ignored(&d, &b, ws, ws_bytes, st, &dx1[0][0], &dx2[0][0], nan_mean, M, N);
    case_end();
  }
  free(ws);
}

void run_api_tests(void) {
  static const struct {
    fnorm_norm norm;
    fnorm_dtype dtype, param_dtype;
  } bases[] = {{FNORM_LAYERNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME},
               {FNORM_RMSNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME},
               {FNORM_LAYERNORM, FNORM_DTYPE_BF16, FNORM_DTYPE_F32},
               {FNORM_RMSNORM, FNORM_DTYPE_F16, FNORM_DTYPE_SAME}};
  int k;
  test_version_and_names();
  group_begin("api-bad-input: each bad argument gives its status and writes nothing");
  for (k = 0; k < 4; k++) {
    arena a;
    if (arena_init(&a, bases[k].norm, bases[k].dtype, bases[k].param_dtype, 4, 8) != 0) {
      if (case_begin("api bad-input setup %s/%s", norm_name(bases[k].norm),
                     dtype_name(bases[k].dtype))) {
        case_fail("could not set up the base problem (workspace query failed or no memory)");
        case_end();
      }
      arena_free(&a);
      continue;
    }
    if (k < 2)
      bad_descriptors(&a);
    bad_strides(&a);
    bad_pointers(&a);
    misaligned(&a);
    aliasing(&a);
    arena_free(&a);
  }
  workspace_checks();
  group_end();
  group_begin("api-legal: layouts and arguments that must be accepted");
  legal_layouts();
  group_end();
}
