/*
 * libFuzzer target for the public API on the CPU backend.
 *
 * The input bytes choose a problem (norm, dtypes including invalid values, rows/cols from
 * small to huge or <= 0, strides including invalid ones, eps including bad ones, flags), which
 * pointers are NULL, misaligned, offset by one element or aliased, and the data. The target
 * allocates every buffer at its exact size (so AddressSanitizer sees any access outside it),
 * calls the forward, the workspace query and the backward, and checks:
 *  - a call that fails wrote nothing (every buffer bitwise unchanged), and inputs never change;
 *  - a call that this file's own model of the header's rules says is invalid fails, and one it
 *    says is valid succeeds (where the header leaves a case open, either is accepted);
 *  - on success with finite inputs, outputs are finite wherever the data's range guarantees it
 *    (values are multiples of 1/16 in [-8, 8], so only fp16 overflow could make an Inf).
 * A violated check prints what happened and aborts, which libFuzzer reports as a crash.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusednorm.h"

/* Buffers larger than this are not allocated: a valid problem that big is skipped. */
#define MAX_BUFFER_BYTES ((int64_t)4 << 20)
/* Bytes before each buffer's normal pointer: room to move it back one element or to an odd
 * address while staying inside the allocation. */
#define LEAD 16

typedef struct reader {
  const uint8_t *p;
  size_t n, at;
} reader;

/* The next input byte; 0 once the input is used up (so short inputs are plain cases). */
static uint8_t byte(reader *r) {
  return r->at < r->n ? r->p[r->at++] : 0;
}

static uint16_t word(reader *r) {
  return (uint16_t)(byte(r) | (byte(r) << 8));
}

enum expect { EXPECT_OK, EXPECT_FAIL, EXPECT_ANY };

static void die(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_api: %s: %s\n", what, detail);
  abort();
}

/* ------------------------------------------------------------------------------------------ */

enum { B_X, B_GAMMA, B_BETA, B_Y, B_MEAN, B_RSTD, B_DY, B_DX, B_DGAMMA, B_DBETA, N_BUFS };
static const char *const buf_names[N_BUFS] = {"x",    "gamma", "beta", "y",      "mean",
                                              "rstd", "dy",    "dx",   "dgamma", "dbeta"};

typedef struct buffer {
  unsigned char *alloc; /* LEAD + bytes */
  size_t bytes;
  unsigned char *snapshot;
} buffer;

/* Pointer modes. */
enum { P_NORMAL, P_NULL, P_ODD, P_HALF, P_BACK_ONE, N_PMODES };

static size_t dtype_bytes(int dtype) {
  return dtype == FNORM_DTYPE_F32 ? 4 : 2;
}

static int valid_dtype(int t) {
  return t == FNORM_DTYPE_F32 || t == FNORM_DTYPE_F16 || t == FNORM_DTYPE_BF16;
}

/* Elements spanned by rows x cols with a stride (0 = cols), or -1 if it is invalid. */
static int64_t extent(int64_t rows, int64_t cols, int64_t stride) {
  if (rows < 1 || cols < 1 || stride < 0 || (stride != 0 && stride < cols))
    return -1;
  if (stride == 0)
    stride = cols;
  if (rows - 1 > (INT64_MAX - cols) / stride)
    return -1;
  return (rows - 1) * stride + cols;
}

/* Whether a matrix and the same matrix moved by one element (same stride) share an element:
 * within a row when cols >= 2, across rows only when the stride is 1. */
static int shifted_overlaps(int64_t rows, int64_t cols, int64_t stride) {
  return cols >= 2 || ((stride == 0 ? cols : stride) == 1 && rows >= 2);
}

static int64_t pick_size(reader *r, int is_cols) {
  static const int64_t odd[] = {0, -1, INT64_MIN, (int64_t)1 << 40, INT64_MAX, (int64_t)1 << 31};
  uint8_t s = byte(r);
  if (s % 16 < 13)
    return is_cols ? 1 + (int64_t)(word(r) % (s % 4 == 0 ? 4100 : 300)) : 1 + byte(r) % 40;
  return odd[s % 6];
}

static int64_t pick_stride(reader *r, int64_t cols) {
  uint8_t s = byte(r);
  switch (s % 16) {
  case 0:
  case 1:
    /* valid, maybe equal to cols (cols itself may be any size) */
    return cols > INT64_MAX - 8 ? cols : cols + (int64_t)(byte(r) % 9);
  case 2:
    return cols > INT64_MIN ? cols - 1 : 0; /* invalid when >= 1, 0 = packed otherwise */
  case 3:
    return -(int64_t)(1 + byte(r) % 3);
  case 4:
    return INT64_MAX / 2; /* valid stride, extent overflows for rows > 2 */
  default:
    return 0;
  }
}

static float pick_eps(reader *r) {
  static const float bad[] = {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN};
  static const float good[] = {1e-5f, 1e-12f, 0.5f, 1e-30f, 1.0f, 3.0f};
  uint8_t s = byte(r);
  return s % 8 < 6 ? good[(s >> 3) % 6] : bad[(s >> 3) % 6];
}

static int pick_dtype(reader *r, int for_params) {
  uint8_t s = byte(r);
  if (s % 16 < 14)
    return for_params ? (s % 2 ? FNORM_DTYPE_F32 : FNORM_DTYPE_SAME) : 1 + s % 3;
  return (int)(int8_t)byte(r); /* anything, 0 and negatives included */
}

/* A value for the data: a multiple of 1/16 in [-8, 8), exact in every dtype. */
static double data_value(uint8_t b) {
  return (double)(int8_t)b / 16.0;
}

static void store(unsigned char *p, int dtype, double v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if (dtype == FNORM_DTYPE_F32) {
    memcpy(p, &f, 4);
  } else if (dtype == FNORM_DTYPE_BF16) {
    uint16_t h = (uint16_t)(bits >> 16); /* exact: the values have <= 8 significant bits */
    memcpy(p, &h, 2);
  } else {
    /* Exact fp16 of a multiple of 1/16 in [-8, 8): rebias the exponent, drop 13 zero bits. */
    uint16_t h = 0;
    if (f != 0.0f)
      h = (uint16_t)(((bits >> 16) & 0x8000u) | ((((bits >> 23) & 0xFFu) - 112u) << 10) |
                     ((bits >> 13) & 0x3FFu));
    memcpy(p, &h, 2);
  }
}

static int is_finite_elem(const unsigned char *p, int dtype) {
  if (dtype == FNORM_DTYPE_F32) {
    float f;
    memcpy(&f, p, 4);
    return isfinite(f);
  } else {
    uint16_t h;
    memcpy(&h, p, 2);
    return dtype == FNORM_DTYPE_F16 ? (h & 0x7C00u) != 0x7C00u : (h & 0x7F80u) != 0x7F80u;
  }
}

/* ------------------------------------------------------------------------------------------ */

typedef struct problem {
  fnorm_desc desc;
  int pdtype;          /* resolved param dtype, or an invalid value */
  int dtypes_ok;       /* dtype and param_dtype a valid combination */
  int size_ok;         /* rows, cols >= 1 and rows * cols does not overflow */
  int64_t ext[N_BUFS]; /* elements spanned by each buffer, -1 if its shape is invalid */
  int sized[N_BUFS];   /* allocated at its exact size */
  size_t esize[N_BUFS];
  buffer b[N_BUFS];
  int mode[N_BUFS];
} problem;

/* Descriptor fields every call checks: device, norm, dtypes, size, eps, flags. */
static int desc_ok(const problem *pr) {
  return pr->desc.device == FNORM_DEVICE_CPU &&
         (pr->desc.norm == FNORM_LAYERNORM || pr->desc.norm == FNORM_RMSNORM) && pr->dtypes_ok &&
         pr->size_ok && pr->desc.eps > 0.0f && isfinite(pr->desc.eps) && pr->desc.flags == 0;
}

static void *ptr_of(problem *pr, int k) {
  buffer *b = &pr->b[k];
  unsigned char *p = b->alloc + LEAD;
  switch (pr->mode[k]) {
  case P_NULL:
    return NULL;
  case P_ODD:
    return p - 1;
  case P_HALF: /* 2-byte aligned, not 4: misaligned only for 4-byte elements */
    return p - 2;
  case P_BACK_ONE: /* still aligned to the element, not to 16 bytes */
    return p - pr->esize[k];
  default:
    return p;
  }
}

/* A given pointer off its element alignment. */
static int off_alignment(const void *p, size_t esize) {
  return p != NULL && (uintptr_t)p % esize != 0;
}

static void snapshot_all(problem *pr) {
  int k;
  for (k = 0; k < N_BUFS; k++)
    memcpy(pr->b[k].snapshot, pr->b[k].alloc, LEAD + pr->b[k].bytes);
}

static void expect_unchanged(problem *pr, int k, const char *call) {
  if (memcmp(pr->b[k].snapshot, pr->b[k].alloc, LEAD + pr->b[k].bytes) != 0)
    die(call, buf_names[k]);
}

static void check_status(fnorm_status st, enum expect want, const char *call) {
  char detail[160];
  if (want == EXPECT_OK && st != FNORM_SUCCESS) {
    snprintf(detail, sizeof detail, "a valid call returned %s", fnorm_status_name(st));
    die(call, detail);
  }
  if (want == EXPECT_FAIL && st == FNORM_SUCCESS)
    die(call, "an invalid call returned FNORM_SUCCESS");
}

/* Every element of a [rows][stride] output (or a vector) is finite. */
static void expect_finite(const void *p, const char *name, int64_t rows, int64_t cols,
                          int64_t stride, int dtype, const char *call) {
  const unsigned char *base = (const unsigned char *)p;
  int64_t i, j;
  size_t es = dtype_bytes(dtype);
  if (stride == 0)
    stride = cols;
  for (i = 0; i < rows; i++)
    for (j = 0; j < cols; j++)
      if (!is_finite_elem(base + ((size_t)(i * stride + j)) * es, dtype)) {
        char detail[96];
        snprintf(detail, sizeof detail, "%s[%lld][%lld] is not finite with finite inputs", name,
                 (long long)i, (long long)j);
        die(call, detail);
      }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r;
  problem pr;
  int k, ops, alias, from_y, ws_mode, x_overwritten = 0;
  int64_t rows, cols;
  enum expect want;
  fnorm_status st;
  fnorm_forward_args fa;
  fnorm_backward_args ba;
  size_t ws_bytes = 0;
  unsigned char *ws_alloc = NULL;

  r.p = data;
  r.n = size;
  r.at = 0;
  memset(&pr, 0, sizeof pr);
  ops = byte(&r); /* bit 0: forward, bit 1: backward, bit 2: backward from y */
  alias = byte(&r) % 12;
  fnorm_desc_init(&pr.desc, FNORM_DEVICE_CPU, FNORM_LAYERNORM, FNORM_DTYPE_F32, 1, 1);
  {
    uint8_t s = byte(&r);
    pr.desc.norm = s % 32 == 31 ? (fnorm_norm)(s >> 5) : (fnorm_norm)(1 + s % 2);
    s = byte(&r);
    pr.desc.device = s % 32 == 31 ? (fnorm_device)(s >> 5) : FNORM_DEVICE_CPU;
  }
  pr.desc.dtype = (fnorm_dtype)pick_dtype(&r, 0);
  pr.desc.param_dtype = (fnorm_dtype)pick_dtype(&r, 1);
  rows = pr.desc.rows = pick_size(&r, 0);
  cols = pr.desc.cols = pick_size(&r, 1);
  pr.desc.x_stride = pick_stride(&r, cols);
  pr.desc.y_stride = pick_stride(&r, cols);
  pr.desc.dy_stride = pick_stride(&r, cols);
  pr.desc.dx_stride = pick_stride(&r, cols);
  pr.desc.eps = pick_eps(&r);
  pr.desc.cpu_threads = byte(&r) % 4;
  {
    uint8_t s = byte(&r);
    pr.desc.flags = s % 32 == 31 ? (uint32_t)1u << (s % 32) : 0u;
  }
  for (k = 0; k < N_BUFS; k++) {
    uint8_t s = byte(&r);
    pr.mode[k] = s % 8 < 5 ? P_NORMAL : (s % 8 == 5 ? P_BACK_ONE : (int)(1 + (s >> 3) % 3));
  }
  ws_mode = byte(&r) % 8;       /* 0: one byte short, 1: NULL, else exact */
  if (alias == 1 || alias == 2) /* in place: one stride for both */
    pr.desc.y_stride = pr.desc.x_stride;
  if (alias == 3 || alias == 4)
    pr.desc.dx_stride = pr.desc.dy_stride;

  if (getenv("FUZZ_API_VERBOSE") != NULL) { /* to triage a crash: what the bytes decoded to */
    fprintf(stderr,
            "ops=%d alias=%d device=%d norm=%d dtype=%d param=%d rows=%lld cols=%lld strides "
            "x=%lld y=%lld dy=%lld dx=%lld eps=%g threads=%d flags=%u ws_mode=%d modes",
            ops & 7, alias, (int)pr.desc.device, (int)pr.desc.norm, (int)pr.desc.dtype,
            (int)pr.desc.param_dtype, (long long)rows, (long long)cols, (long long)pr.desc.x_stride,
            (long long)pr.desc.y_stride, (long long)pr.desc.dy_stride, (long long)pr.desc.dx_stride,
            (double)pr.desc.eps, pr.desc.cpu_threads, (unsigned)pr.desc.flags, ws_mode);
    for (k = 0; k < N_BUFS; k++)
      fprintf(stderr, " %s=%d", buf_names[k], pr.mode[k]);
    fprintf(stderr, "\n");
  }

  /* Sizes: exact for a buffer whose own shape is valid (a valid problem too big is skipped),
   * a small stand-in otherwise (the library must then reject the call without touching it). */
  pr.pdtype =
      pr.desc.param_dtype == FNORM_DTYPE_SAME ? (int)pr.desc.dtype : (int)pr.desc.param_dtype;
  pr.dtypes_ok = valid_dtype((int)pr.desc.dtype) && (pr.desc.param_dtype == FNORM_DTYPE_SAME ||
                                                     pr.desc.param_dtype == FNORM_DTYPE_F32);
  pr.ext[B_X] = extent(rows, cols, pr.desc.x_stride);
  pr.ext[B_Y] = extent(rows, cols, pr.desc.y_stride);
  pr.ext[B_DY] = extent(rows, cols, pr.desc.dy_stride);
  pr.ext[B_DX] = extent(rows, cols, pr.desc.dx_stride);
  pr.ext[B_GAMMA] = pr.ext[B_BETA] = pr.ext[B_DGAMMA] = pr.ext[B_DBETA] = cols >= 1 ? cols : -1;
  pr.ext[B_MEAN] = pr.ext[B_RSTD] = rows >= 1 ? rows : -1;
  /* The problem's own size (packed): what every call needs whatever its strides. */
  pr.size_ok = extent(rows, cols, 0) >= 0 && pr.ext[B_MEAN] > 0;
  for (k = 0; k < N_BUFS; k++) {
    int is_data = k == B_X || k == B_Y || k == B_DY || k == B_DX;
    int is_stat = k == B_MEAN || k == B_RSTD;
    int64_t bytes = 64;
    pr.esize[k] = is_stat ? 4 : dtype_bytes(is_data ? (int)pr.desc.dtype : pr.pdtype);
    pr.sized[k] = pr.dtypes_ok && pr.size_ok && pr.ext[k] > 0;
    if (pr.sized[k]) {
      if (pr.ext[k] > MAX_BUFFER_BYTES / (int64_t)pr.esize[k])
        goto out; /* a valid buffer too big to allocate here */
      bytes = pr.ext[k] * (int64_t)pr.esize[k];
    }
    /* x and dy get room for the illegal "output one element past the input" aliases, so
     * that a library wrongly accepting them is caught by the status check, not by ASan. */
    pr.b[k].bytes = (size_t)bytes + (k == B_X || k == B_DY ? pr.esize[k] * 2 : 0);
  }
  for (k = 0; k < N_BUFS; k++) {
    pr.b[k].alloc = (unsigned char *)malloc(LEAD + pr.b[k].bytes);
    pr.b[k].snapshot = (unsigned char *)malloc(LEAD + pr.b[k].bytes);
    if (!pr.b[k].alloc || !pr.b[k].snapshot)
      goto out;
    memset(pr.b[k].alloc, 0xA5, LEAD + pr.b[k].bytes);
  }

  /* Data: inputs from the remaining bytes (cycled), gamma never zero (the backward from y
   * divides by it), rstd in (0, 4]. Outputs stay 0xA5. */
  {
    static const int inputs[] = {B_X, B_GAMMA, B_BETA, B_DY, B_MEAN, B_RSTD, B_Y};
    size_t rest = r.n > r.at ? r.n - r.at : 0, used = 0;
    for (k = 0; k < 7; k++) {
      int b = inputs[k];
      int dtype = b == B_MEAN || b == B_RSTD      ? FNORM_DTYPE_F32
                  : (b == B_GAMMA || b == B_BETA) ? pr.pdtype
                                                  : (int)pr.desc.dtype;
      int64_t e;
      unsigned char *base = pr.b[b].alloc + LEAD;
      if (!pr.sized[b])
        continue;
      for (e = 0; e < pr.ext[b]; e++) {
        uint8_t v = rest ? r.p[r.at + (used++ % rest)] : (uint8_t)(e * 37 + k);
        double value = data_value(v);
        if (b == B_GAMMA && value == 0.0)
          value = 1.0;
        if (b == B_RSTD)
          value = (double)(1 + v % 64) / 16.0;
        store(base + (size_t)e * pr.esize[b], dtype, value);
      }
    }
  }

  /* ---- forward ---- */
  if (ops & 1) {
    int is_ln = pr.desc.norm == FNORM_LAYERNORM;
    memset(&fa, 0, sizeof fa);
    fa.x = ptr_of(&pr, B_X);
    fa.gamma = (pr.mode[B_GAMMA] == P_NULL) ? NULL : ptr_of(&pr, B_GAMMA);
    fa.beta = (pr.mode[B_BETA] == P_NULL) ? NULL : ptr_of(&pr, B_BETA);
    fa.y = ptr_of(&pr, B_Y);
    fa.mean = (float *)ptr_of(&pr, B_MEAN);
    fa.rstd = (float *)ptr_of(&pr, B_RSTD);
    if (!is_ln && byte(&r) % 4 != 0)
      fa.mean = NULL; /* RMSNorm: usually no mean (a given one is an error) */
    if (alias == 1)
      fa.y = (void *)fa.x; /* in place: legal */
    if (alias == 2 && fa.x != NULL)
      fa.y = (unsigned char *)fa.x + pr.esize[B_X]; /* see shifted_overlaps */
    if (alias == 5 && fa.mean != NULL)
      fa.rstd = fa.mean; /* illegal */
    want = EXPECT_OK;
    if (!desc_ok(&pr) || pr.ext[B_X] < 0 || pr.ext[B_Y] < 0 || fa.x == NULL || fa.y == NULL ||
        (!is_ln && fa.mean != NULL) ||
        (alias == 2 && shifted_overlaps(rows, cols, pr.desc.x_stride)) ||
        (alias == 5 && fa.mean != NULL))
      want = EXPECT_FAIL;
    if (pr.dtypes_ok &&
        (off_alignment(fa.x, pr.esize[B_X]) || off_alignment(fa.y, pr.esize[B_X]) ||
         off_alignment(fa.gamma, pr.esize[B_GAMMA]) || off_alignment(fa.beta, pr.esize[B_GAMMA]) ||
         off_alignment(fa.mean, 4) || off_alignment(fa.rstd, 4)))
      want = EXPECT_FAIL;
    /* The forward need not check the backward's strides: a bad one there is left open. */
    if (want == EXPECT_OK && (pr.ext[B_DY] < 0 || pr.ext[B_DX] < 0))
      want = EXPECT_ANY;
    snapshot_all(&pr);
    st = fnorm_forward(&pr.desc, &fa, NULL);
    check_status(st, want, "fnorm_forward");
    for (k = 0; k < N_BUFS; k++)
      if (st != FNORM_SUCCESS ||
          (k != B_Y && k != B_MEAN && k != B_RSTD && !(k == B_X && (alias == 1 || alias == 2))))
        expect_unchanged(&pr, k,
                         st != FNORM_SUCCESS ? "failed fnorm_forward changed"
                                             : "fnorm_forward changed an input");
    if (st == FNORM_SUCCESS) {
      /* In place, x now holds y: the statistics no longer describe it, so the backward from
       * x may legitimately overflow (a constant row has rstd = 1/sqrt(eps)). */
      x_overwritten = alias == 1;
      if (alias != 1)
        expect_finite(fa.y, "y", rows, cols, pr.desc.y_stride, (int)pr.desc.dtype, "forward");
      if (fa.rstd)
        expect_finite(fa.rstd, "rstd", 1, rows, 0, FNORM_DTYPE_F32, "forward");
      if (fa.mean)
        expect_finite(fa.mean, "mean", 1, rows, 0, FNORM_DTYPE_F32, "forward");
    }
  }

  /* ---- workspace query and backward ---- */
  if (ops & 2) {
    int is_ln = pr.desc.norm == FNORM_LAYERNORM;
    enum expect want_desc = EXPECT_OK;
    size_t bytes = 12345;
    from_y = (ops >> 2) & 1;
    if (!desc_ok(&pr))
      want_desc = EXPECT_FAIL;
    else if (pr.ext[B_X] < 0 || pr.ext[B_Y] < 0 || pr.ext[B_DY] < 0 || pr.ext[B_DX] < 0)
      want_desc = EXPECT_ANY; /* a stride problem: the query may or may not look at it */
    st = fnorm_backward_workspace_size(&pr.desc, &bytes);
    check_status(st, want_desc, "fnorm_backward_workspace_size");
    if (st != FNORM_SUCCESS) {
      if (bytes != 12345)
        die("failed fnorm_backward_workspace_size", "wrote *bytes");
      goto out;
    }
    ws_bytes = bytes;
    if (ws_bytes > (size_t)MAX_BUFFER_BYTES * 4)
      goto out;
    ws_alloc = ws_bytes ? (unsigned char *)malloc(ws_bytes) : NULL;
    if (ws_bytes && ws_alloc == NULL)
      goto out;

    memset(&ba, 0, sizeof ba);
    ba.dy = ptr_of(&pr, B_DY);
    if (from_y) {
      ba.y = ptr_of(&pr, B_Y);
      ba.beta = (pr.mode[B_BETA] == P_NULL) ? NULL : ptr_of(&pr, B_BETA);
    } else {
      ba.x = ptr_of(&pr, B_X);
      ba.mean = is_ln ? (const float *)ptr_of(&pr, B_MEAN) : NULL;
    }
    ba.rstd = (const float *)ptr_of(&pr, B_RSTD);
    ba.gamma = (pr.mode[B_GAMMA] == P_NULL) ? NULL : ptr_of(&pr, B_GAMMA);
    ba.dx = ptr_of(&pr, B_DX);
    ba.dgamma = ptr_of(&pr, B_DGAMMA);
    ba.dbeta = ptr_of(&pr, B_DBETA);
    if (alias == 3)
      ba.dx = (void *)ba.dy; /* in place: legal */
    if (alias == 4 && ba.dy != NULL)
      ba.dx = (unsigned char *)ba.dy + pr.esize[B_DY]; /* see shifted_overlaps */
    if (alias == 6 && ba.dgamma != NULL)
      ba.dbeta = ba.dgamma; /* illegal */
    if (alias == 7 && !from_y)
      ba.y = ptr_of(&pr, B_Y); /* both x and y: illegal */
    if (alias == 8 && !from_y)
      ba.beta = ptr_of(&pr, B_BETA); /* beta with x: illegal */

    {
      /* Exactly one of x and y; x's stride or y's with it; mean with x for LayerNorm (ignored
       * otherwise); no beta with x. */
      int with_x = ba.x != NULL, with_y = ba.y != NULL;
      want = EXPECT_OK;
      if (!desc_ok(&pr) || pr.ext[B_DY] < 0 || ba.dy == NULL || ba.rstd == NULL ||
          with_x == with_y || (with_x && pr.ext[B_X] < 0) || (with_y && pr.ext[B_Y] < 0) ||
          (with_x && is_ln && ba.mean == NULL) || (with_x && ba.beta != NULL) ||
          (alias == 4 && shifted_overlaps(rows, cols, pr.desc.dy_stride)) ||
          (alias == 6 && ba.dgamma) || (ba.dx != NULL && pr.ext[B_DX] < 0))
        want = EXPECT_FAIL;
      if (pr.dtypes_ok &&
          (off_alignment(ba.dy, pr.esize[B_X]) || off_alignment(ba.x, pr.esize[B_X]) ||
           off_alignment(ba.y, pr.esize[B_X]) || off_alignment(ba.dx, pr.esize[B_X]) ||
           off_alignment(ba.gamma, pr.esize[B_GAMMA]) ||
           off_alignment(ba.beta, pr.esize[B_GAMMA]) ||
           off_alignment(ba.dgamma, pr.esize[B_GAMMA]) ||
           off_alignment(ba.dbeta, pr.esize[B_GAMMA]) ||
           (with_x && is_ln && off_alignment(ba.mean, 4)) || off_alignment(ba.rstd, 4)))
        want = EXPECT_FAIL;
      /* An ignored mean that is misaligned or overlaps an output is left open. */
      if (want == EXPECT_OK && ba.mean != NULL && !(with_x && is_ln))
        want = EXPECT_ANY;
    }
    /* Strides of buffers this call does not use (x's with y, y's with x, dx's without dx)
     * are left open. */
    if (want == EXPECT_OK && (pr.ext[B_X] < 0 || pr.ext[B_Y] < 0 || pr.ext[B_DX] < 0))
      want = EXPECT_ANY;
    if (ws_bytes > 0 && ws_mode < 2)
      want = EXPECT_FAIL; /* one byte short, or NULL */
    snapshot_all(&pr);
    st = fnorm_backward(&pr.desc, &ba, ws_mode == 1 ? NULL : ws_alloc,
                        ws_mode == 0 && ws_bytes > 0 ? ws_bytes - 1 : ws_bytes, NULL);
    check_status(st, want, "fnorm_backward");
    for (k = 0; k < N_BUFS; k++)
      if (st != FNORM_SUCCESS || (k != B_DX && k != B_DGAMMA && k != B_DBETA &&
                                  !(k == B_DY && (alias == 3 || alias == 4))))
        expect_unchanged(&pr, k,
                         st != FNORM_SUCCESS ? "failed fnorm_backward changed"
                                             : "fnorm_backward changed an input");
    /* Finite results: with the statistics of this x (or decoded ones, rstd <= 4), fp32/bf16
     * outputs hold any value these inputs can produce; fp16 ones (dx, or fp16 parameters)
     * can legitimately overflow. */
    if (st == FNORM_SUCCESS && pr.desc.dtype != FNORM_DTYPE_F16 && alias != 3 &&
        !(x_overwritten && ba.x != NULL)) {
      if (ba.dx)
        expect_finite(ba.dx, "dx", rows, cols, pr.desc.dx_stride, (int)pr.desc.dtype, "backward");
      if (pr.pdtype != FNORM_DTYPE_F16) {
        if (ba.dgamma)
          expect_finite(ba.dgamma, "dgamma", 1, cols, 0, pr.pdtype, "backward");
        if (ba.dbeta && alias != 6)
          expect_finite(ba.dbeta, "dbeta", 1, cols, 0, pr.pdtype, "backward");
      }
    }
  }

out:
  for (k = 0; k < N_BUFS; k++) {
    free(pr.b[k].alloc);
    free(pr.b[k].snapshot);
  }
  free(ws_alloc);
  return 0;
}
