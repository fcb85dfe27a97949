/*
 * Shared machinery of the numeric tests: guarded tensor buffers, the description of one test
 * case, input generation, the long-double reference and the checks, and the executors that
 * run a case on the CPU backend or (test_cuda.c) on a GPU.
 */
#ifndef FNORM_TESTS_CASES_H
#define FNORM_TESTS_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "fusednorm.h"

/* Every buffer is an "image": GUARD_BYTES before and after the elements, and between rows
 * when the stride exceeds cols. Output elements start as POISON_BYTE (a NaN in every dtype),
 * so an element the library fails to write fails its value check. Bytes that are not
 * elements hold the buffer's fill byte and must still hold it after every call. */
#define GUARD_BYTES 64
#define POISON_BYTE 0xFF
#define OUTPUT_FILL_BYTE 0xA5
/* Input padding is NaN, so that a kernel reading past a row turns its results into NaN. */
#define INPUT_FILL_BYTE 0xFF

typedef struct tbuf {
  unsigned char *alloc; /* what malloc returned; NULL for an absent buffer */
  unsigned char *host;  /* the image, 64-byte aligned */
  size_t bytes;         /* image size */
  size_t lead;          /* bytes from the image start to element [0][0] */
  size_t esize;         /* bytes per element */
  int64_t rows, cols, stride;
  unsigned char fill; /* the byte of everything that is not an element */
  void *dev;          /* device mirror of the image (CUDA executor), or NULL */
} tbuf;

/* Input patterns. */
enum {
  INPUT_NORMAL = 0,      /* rows of random mean and scale */
  INPUT_OFFSET_1E4 = 1,  /* 1e4 + N(0,1): catastrophic cancellation for a naive variance */
  INPUT_NONFINITE_X = 2, /* NaN/Inf in some rows of x (forward) */
  INPUT_NONFINITE_DY = 3 /* NaN/Inf in some elements of dy (backward) */
};

typedef struct tcase {
  fnorm_norm norm;
  fnorm_dtype dtype;
  fnorm_dtype param_dtype; /* as given to the descriptor: FNORM_DTYPE_SAME or _F32 */
  int64_t rows, cols;
  int64_t x_stride, y_stride, dy_stride, dx_stride; /* as given to the descriptor: 0 packed */
  int offset;            /* elements by which every data pointer is moved off 64-byte alignment */
  int gamma, beta;       /* parameters present (beta goes to the backward from y only) */
  int mean_out;          /* forward writes mean (LayerNorm only) */
  int rstd_out;          /* forward writes rstd */
  int fwd;               /* run the forward */
  int bwd_x, bwd_y;      /* run the backward from x, from y */
  int dx, dgamma, dbeta; /* backward outputs requested */
  int inplace;           /* forward y == x, backward dx == dy (strides forced equal) */
  int input;             /* INPUT_* */
  float eps;
  int cpu_threads;
  int use_null_stream; /* CUDA: run on the legacy default stream instead of the test stream */
} tcase;

/* A case with LayerNorm/fp32 defaults: gamma and beta, stats written, forward and both
 * backwards with every output. */
tcase tcase_default(fnorm_norm norm, fnorm_dtype dtype, fnorm_dtype param_dtype, int64_t rows,
                    int64_t cols);
/* A problem of a table of cases: norm, dtypes and size. */
typedef struct problem_shape {
  fnorm_norm norm;
  fnorm_dtype dtype, param_dtype;
  int64_t rows, cols;
} problem_shape;
/* Rows for a case of row length n: budget / n elements' worth, clamped to [1, max_rows]. */
int64_t tcase_rows_for(int64_t n, int64_t budget, int64_t max_rows);
/* Appends a description of the case (for case names). */
void tcase_describe(const tcase *c, char *out, size_t out_size);

/* Every supported (dtype, param_dtype) pair; f32 with an explicit f32 param_dtype is the same
 * computation as SAME and is covered in the options groups. And both norms. */
typedef struct dtype_combo {
  fnorm_dtype dtype, param_dtype;
} dtype_combo;
#define N_COMBOS 5
extern const dtype_combo combos[N_COMBOS];
extern const fnorm_norm norms[2];

/* The option variants of `base`, each passed to run(group, case) in a fixed order: gamma/beta
 * present or absent (4), forward statistics written or skipped (up to 3 besides the default),
 * each backward output alone and in combinations (6), and a large and a tiny eps (2). */
void tcase_option_variants(const tcase *base, const char *group,
                           void (*run)(const char *group, const tcase *c));

/* Layout variant v (0 <= v < N_LAYOUTS) of c, whose rows are c->cols long: strides, pointers
 * off alignment, in place, one row with a huge stride. Variant 3 gives explicit strides: equal
 * to cols, or with wide_aligned the next multiple of 8 elements above cols + 8 (aligned rows
 * with a gap, which the 16-byte vector paths take). */
#define N_LAYOUTS 7
void tcase_apply_layout(tcase *c, int v, int wide_aligned);

/* Where a case runs. The CPU executor has no device hooks; the CUDA one mirrors every buffer
 * image on the device before a call and copies it back after. */
typedef struct executor {
  const char *name;
  fnorm_device device;
  void *stream;
  /* Copy an image to the device (allocating its mirror); 0 on success. */
  int (*put)(tbuf *t, void *stream);
  /* Copy an image back from the device; 0 on success. */
  int (*get)(tbuf *t, void *stream);
  /* Waits for the stream; 0 on success, else writes a message. */
  int (*sync)(void *stream, char *message, size_t message_size);
  void (*release)(tbuf *t);
} executor;

extern const executor cpu_executor;

/* Runs one test case (after case_begin) on `e` and checks it against the long-double
 * reference. If `also` is given (the CPU when `e` is the GPU), runs it there too and compares
 * the two; if `repeat`, runs every operation twice on `e` and requires bitwise equality. */
void run_case(const tcase *c, const executor *e, const executor *also, int repeat);

/* Runs the forward and the backward (from x) of a CPU case with each of `threads` as
 * cpu_threads, checks the first run against the reference and requires every other run to
 * give bitwise the same outputs. */
void run_thread_determinism(const tcase *c, const int *threads, int n_threads);

/* ---- building blocks, also used by the special-purpose tests ---- */

double dtype_eps(fnorm_dtype t);
const char *dtype_name(fnorm_dtype t);
const char *norm_name(fnorm_norm n);
fnorm_dtype resolved_param_dtype(const tcase *c);

int tbuf_init(tbuf *t, int64_t rows, int64_t cols, int64_t stride, size_t esize, int offset,
              unsigned char fill);
void tbuf_poison(tbuf *t);
int tbuf_clone(tbuf *dst, const tbuf *src);
void tbuf_free(tbuf *t);
/* Set by the CUDA executor: frees a buffer's device mirror in tbuf_free. */
extern void (*tbuf_device_free)(void *dev);
void *tbuf_elem(const tbuf *t, int64_t row, int64_t col);
/* Pointer to element [0][0] on the executor's side. */
void *tbuf_ptr(const tbuf *t, const executor *e);
/* 1 if every non-element byte still holds the fill byte; else 0 and the first bad offset. */
int tbuf_layout_intact(const tbuf *t, size_t *bad_offset);
uint64_t bytes_hash(const void *p, size_t n);

double load_elem(const void *p, fnorm_dtype t);
void store_elem(void *p, fnorm_dtype t, double v);

/* Long-double forward of one row (contiguous or strided via `stride`), for finite-difference
 * checks and the special tests. y may be NULL. */
void ref_forward_row(fnorm_norm norm, int64_t n, const long double *x, const long double *gamma,
                     const long double *beta, long double eps, long double *y, long double *mean,
                     long double *rstd);

#endif /* FNORM_TESTS_CASES_H */
