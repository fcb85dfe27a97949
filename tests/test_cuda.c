/*
 * CUDA tests: every case runs on the GPU and on the CPU backend with the same inputs; the GPU
 * result is checked against the long-double reference and against the CPU's, and every
 * operation runs twice on the GPU and must give bitwise the same outputs. Plus a forward and
 * backward captured in a CUDA graph, and the argument checks with device pointers.
 *
 * The case lists are built even without CUDA, so that skipped cases are counted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cases.h"
#include "harness.h"
#include "rng.h"
#include "tests.h"

#ifdef FNORM_TESTS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* The GPU executor while CUDA runs, NULL while the cases are only counted as skipped. */
static const executor *gpu;

/* ------------------------------------------------------------------------------------------
 * The CUDA executor
 * ---------------------------------------------------------------------------------------- */
#ifdef FNORM_TESTS_HAVE_CUDA

static cudaStream_t test_stream;
static int cuda_broken; /* a sticky CUDA error: the context is unusable */

static void note_cuda_error(cudaError_t err) {
  if (err == cudaErrorIllegalAddress || err == cudaErrorLaunchFailure ||
      err == cudaErrorIllegalInstruction || err == cudaErrorMisalignedAddress ||
      err == cudaErrorHardwareStackError || err == cudaErrorAssert)
    cuda_broken = 1;
}

static int cuda_put(tbuf *t, void *stream) {
  cudaError_t err = cudaSuccess;
  if (t->dev == NULL) {
    err = cudaMalloc(&t->dev, t->bytes);
    if (err != cudaSuccess) {
      t->dev = NULL;
      note_cuda_error(err);
      return -1;
    }
  }
  /* The whole image: guards, gaps and poisoned output elements (the 0xFF of cudaMemset). */
  err = cudaMemcpyAsync(t->dev, t->host, t->bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream);
  if (err == cudaSuccess)
    err = cudaStreamSynchronize((cudaStream_t)stream);
  note_cuda_error(err);
  return err == cudaSuccess ? 0 : -1;
}

static int cuda_get(tbuf *t, void *stream) {
  cudaError_t err =
      cudaMemcpyAsync(t->host, t->dev, t->bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
  if (err == cudaSuccess)
    err = cudaStreamSynchronize((cudaStream_t)stream);
  note_cuda_error(err);
  return err == cudaSuccess ? 0 : -1;
}

static int cuda_sync(void *stream, char *message, size_t message_size) {
  cudaError_t err = cudaStreamSynchronize((cudaStream_t)stream);
  if (err == cudaSuccess)
    err = cudaGetLastError();
  if (err != cudaSuccess) {
    note_cuda_error(err);
    snprintf(message, message_size, "CUDA error after the call: %s (%s)", cudaGetErrorName(err),
             cudaGetErrorString(err));
    return -1;
  }
  return 0;
}

static void cuda_release(tbuf *t) {
  if (t->dev != NULL)
    cudaFree(t->dev);
  t->dev = NULL;
}

static void cuda_free_dev(void *dev) {
  cudaFree(dev);
}

static executor cuda_executor = {"cuda",   FNORM_DEVICE_CUDA, NULL,        cuda_put,
                                 cuda_get, cuda_sync,         cuda_release};
#endif /* FNORM_TESTS_HAVE_CUDA */

/* ------------------------------------------------------------------------------------------
 * Case lists
 * ---------------------------------------------------------------------------------------- */

static void gpu_case(const char *group, const tcase *c) {
  char desc[400];
  tcase_describe(c, desc, sizeof desc);
  if (!case_begin("%s %s", group, desc))
    return;
#ifdef FNORM_TESTS_HAVE_CUDA
  if (cuda_broken) {
    case_fail("the CUDA context is unusable after an earlier error");
    case_end();
    return;
  }
#endif
  run_case(c, gpu, &cpu_executor, 1);
  case_end();
}

/* gpu_case for the forward alone: a case that runs no forward is left out. */
static void gpu_forward_case(const char *group, const tcase *c) {
  tcase f = *c;
  if (!f.fwd)
    return;
  f.bwd_x = f.bwd_y = 0;
  gpu_case(group, &f);
}

static const int64_t sizes_full[] = {
    1,     2,      3,      4,      5,      6,      7,           8,     31,    32,    33,    63,
    64,    65,     96,     127,    128,    192,    129,         255,   256,   257,   383,   384,
    511,   512,    513,    767,    768,    1023,   1024,        1025,  1280,  1536,  2047,  2048,
    2049,  2304,   3000,   3072,   4095,   4096,   4097,        4608,  5120,  6143,  8191,  8192,
    8193,  12289,  16383,  16384,  16385,  20480,  24577,       32767, 32768, 32769, 65535, 65536,
    65537, 131071, 262144, 262147, 393224, 802816, 1048576 + 7, 32776};
/* Odd lengths take the one-element paths, multiples of 8 the 16-byte vector paths (and on
 * sm_90 the bulk-copy ring tier, a cluster per row from 16384 on); 802816 fp32 the streaming
 * forward, 16-bit the bulk-copy one (sm_90; elsewhere the staged one, as 16-bit 393224 on every
 * GPU). 1280, 1536, 2304 and 3072 fill the backward's 4 or 8 warps a row partly (or, 16-bit
 * 2304, go to the ring instead). 16-bit 4608 and 5120 take the ring's three stages; 16-bit
 * LayerNorm 20480 and 32768 the lean form's four vectors a thread (640 and 1024 threads). */
static const int64_t sizes_quick[] = {1,     7,      33,     128,    257,   1024,
                                      1025,  4096,   4097,   5120,   16384, 16385,
                                      65537, 262144, 262147, 393224, 802816};

/* Rows enough for the forward's CTA-per-row tier, which the dispatch takes only with at least
 * two rows per SM (vector rows of up to 32768 elements): 2 x 160 SMs, more than any supported
 * GPU has, so the case list stays the same on every device. Kept also under --quick, so that
 * compute-sanitizer sees that tier. */
enum { CTA_TIER_ROWS = 320 };

/* Rows enough for the forward warp tier to stage its rows a row ahead, which the dispatch does
 * for 16-byte rows of up to 4 vectors a lane in persistent CTAs (16-bit rows of 8 or 16 lanes)
 * once a full grid's warps (16 CTAs of 8 warps an SM) get 4 rows each: 4 x 16 x 8 x 160 SMs,
 * again more than any supported GPU needs. */
enum { STAGED_TIER_ROWS = 81920 };

/* Rows from which the forward warp tier gives 16-byte rows of a whole warp, and fp32 rows,
 * one-warp CTAs instead of persistent ones (64 rows an SM): 64 x 160 SMs. */
enum { ONE_WARP_ROWS = 10240 };

/* Rows from which fp32 backward rows past 8 warps go over a cluster of 8-warp CTAs (sm_90). */
enum { CLUSTER_TIER_ROWS = 4096 };

/* Rows from which 16-bit backward rows past the register ring's, and 16-bit rows with fp32 gamma
 * past the warp tier's, take the ring's RESIDENT form (sm_90, from x; 1.5 rows an SM): 160 SMs'
 * worth. */
enum { RESIDENT_TIER_ROWS = 240 };

/* Rows for a case of row length n: about `budget` elements, at most max_rows rows, at least
 * one. --quick (compute-sanitizer) caps every case at 2^13 elements and 16 rows. */
static int64_t rows_for(int64_t n, int64_t budget, int64_t max_rows) {
  if (g_opt.quick) {
    budget = budget < (1 << 13) ? budget : (1 << 13);
    max_rows = max_rows < 16 ? max_rows : 16;
  }
  return tcase_rows_for(n, budget, max_rows);
}

/* A case shape: dtype pair (index into combos), norm (into norms), row length. */
typedef struct {
  int combo, norm;
  int64_t cols;
} case_shape;

/* Forward-only cases of the shapes at `rows` rows; the first `first` also with aligned rows with
 * a gap and no gamma, beta, mean or rstd, and under --quick only those, without that variant. */
static void forward_cases(const case_shape *shapes, int count, int64_t rows, int first) {
  for (int s = 0; s < count && (!g_opt.quick || s < first); s++) {
    tcase c = tcase_default(norms[shapes[s].norm], combos[shapes[s].combo].dtype,
                            combos[shapes[s].combo].param_dtype, rows, shapes[s].cols);
    gpu_forward_case("cuda", &c);
    if (s < first && !g_opt.quick) {
      tcase_apply_layout(&c, 3, 1);
      c.gamma = c.beta = c.mean_out = c.rstd_out = 0;
      gpu_forward_case("cuda", &c);
    }
  }
}

/* The forward on a shape's hard inputs: a 1e4 offset or NaN/Inf in some rows (nonfinite_first:
 * that one; fp32 rows both, in that order), then in place if asked. */
static void forward_hard_cases(fnorm_norm norm, fnorm_dtype dt, int64_t rows, int64_t cols,
                               int nonfinite_first, int in_place) {
  tcase c = tcase_default(norm, dt, FNORM_DTYPE_SAME, rows, cols);
  c.input = nonfinite_first ? INPUT_NONFINITE_X : INPUT_OFFSET_1E4;
  gpu_forward_case("cuda", &c);
  if (dt == FNORM_DTYPE_F32) { /* fp32: both hard inputs */
    c.input = nonfinite_first ? INPUT_OFFSET_1E4 : INPUT_NONFINITE_X;
    gpu_forward_case("cuda", &c);
  }
  if (in_place) {
    c = tcase_default(norm, dt, FNORM_DTYPE_SAME, rows, cols);
    tcase_apply_layout(&c, 4, 1);
    gpu_forward_case("cuda", &c);
  }
}

/* A backward case without dx, then with dx alone (no dgamma or dbeta): a row kernel's two early
 * exits. c is left as it came. */
static void without_dx_then_dparams(tcase *c) {
  c->dx = 0;
  gpu_case("cuda", c);
  c->dx = 1;
  c->dgamma = c->dbeta = 0;
  gpu_case("cuda", c);
  c->dgamma = c->dbeta = 1;
}

static void cuda_sizes(void) {
  const int64_t *sizes = g_opt.quick ? sizes_quick : sizes_full;
  int n_sizes = g_opt.quick ? (int)(sizeof sizes_quick / sizeof sizes_quick[0])
                            : (int)(sizeof sizes_full / sizeof sizes_full[0]);
  int s, k, q;
  group_begin("cuda-sizes: every N, norm, dtype and param dtype; many rows, and 1..3 rows");
  for (s = 0; s < n_sizes; s++)
    for (q = 0; q < 2; q++)
      for (k = 0; k < N_COMBOS; k++) {
        int64_t n = sizes[s];
        tcase c = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype,
                                rows_for(n, 1 << 19, 4096), n);
        if (g_opt.quick && k != 0 && k != 4 && !(q == 1 && k == 1))
          continue;
        gpu_case("cuda", &c);
        /* Long rows also with 1, 2 or 3 rows: the grid has fewer blocks than SMs. */
        if (n >= 4096 && c.rows > 3) {
          c.rows = 1 + (s + k) % 3;
          gpu_case("cuda", &c);
        }
        /* Vector rows the CTA-per-row forward tier holds, and the first past it (32776):
         * the forward only, save for the first dtype pair, and past 8192 only for the two
         * pairs --quick keeps (run H: all of them doubled the group's time, to 207 s on an
         * H200, most of it the CPU oracle's). */
        if (n % 8 == 0 && n >= 1024 && n <= 32776 && c.rows < CTA_TIER_ROWS &&
            (n <= 8192 || k == 0 || k == 4)) {
          c.rows = CTA_TIER_ROWS;
          if (k != 0)
            c.bwd_x = c.bwd_y = 0;
          gpu_case("cuda", &c);
        }
      }
  /* The forward warp tier's persistent CTAs staging a row ahead (16-byte 16-bit rows of 8 or 16
   * lanes, up to 4 vectors a lane), and its one-warp CTAs (fp32 rows, and 16-byte rows of a
   * whole warp: 3, 4 and 8 vectors a lane), forward only: every dtype pair and norm, the row
   * lengths spread over the kernel shapes (run on an H200 with all three 16-bit lengths for
   * every pair, 38 staged cases took 135 s, most of it the CPU oracle's). */
  {
    static const case_shape staged[] = {{0, 0, 128}, {4, 0, 64}, {0, 1, 512}, {1, 0, 512},
                                        {1, 1, 64},  {2, 0, 64}, {2, 1, 384}, {3, 0, 384},
                                        {3, 1, 256}, {4, 1, 512}};
    static const case_shape one_warp[] = {{3, 0, 1024}, {1, 1, 768}, {4, 1, 2048}, {2, 0, 1024}};
    forward_cases(staged, (int)(sizeof staged / sizeof staged[0]), STAGED_TIER_ROWS, 2);
    /* Staged rows that fill their 8 or 16 lanes exactly (the FULL form), with rows not a
     * multiple of the rows a warp takes: the last warp's groups read stale stage slots and
     * must write nothing. */
    {
      static const case_shape staged_full[] = {{3, 0, 256}, {2, 1, 512}};
      forward_cases(staged_full, 2, STAGED_TIER_ROWS + 3, 0);
    }
    forward_cases(one_warp, (int)(sizeof one_warp / sizeof one_warp[0]), ONE_WARP_ROWS, 1);
    /* fp32 LayerNorm rows of 2048-4096 with 64 rows an SM: the CTA-per-row kernel reading x
     * again for y (its FULL form). */
    {
      static const case_shape reread_ln[] = {{0, 0, 2048}, {0, 0, 4096}};
      forward_cases(reread_ln, 2, ONE_WARP_ROWS, 1);
    }
    /* The CTA-per-row kernel's lean form (two CTAs of up to 1024 threads an SM, x read again
     * for y): 16-bit RMSNorm rows past 16384 (also with fp32 gamma), 16-bit-gamma RMSNorm rows
     * of 8193-16384, and fp32 RMSNorm rows of 8193-16384, from 2 rows an SM (CTA_TIER_ROWS);
     * rows that fill the threads exactly (the FULL form) and rows that do not (20000, 12000).
     * Under --quick the first alone. */
    {
      static const case_shape lean[] = {{3, 1, 20000}, {1, 1, 12288}, {2, 1, 24576},
                                        {4, 1, 32768}, {0, 1, 12000}, {0, 1, 16384}};
      forward_cases(lean, (int)(sizeof lean / sizeof lean[0]), CTA_TIER_ROWS, 1);
    }
    /* ... and 16-bit-gamma RMSNorm rows of 2049-8192 from 2^25 elements on (8192 rows of 4096,
     * 5600 of 6000, 4096 of 8192), and 16-bit-gamma LayerNorm rows of 2049-4096 with 64 rows an
     * SM (ONE_WARP_ROWS; 3000 does not fill its threads; 4096, at 2^25 elements, takes the
     * packed rows form). Not under --quick. */
    {
      static const case_shape lean_rms[] = {{3, 1, 4096}}, lean_rms2[] = {{1, 1, 6000}},
                              lean_rms3[] = {{1, 1, 8192}},
                              lean_ln[] = {{3, 0, 4096}, {1, 0, 3000}};
      forward_cases(lean_rms, 1, 8192, 0);
      forward_cases(lean_rms2, 1, 5600, 0);
      forward_cases(lean_rms3, 1, 4096, 0);
      forward_cases(lean_ln, 2, ONE_WARP_ROWS, 0);
    }
  }
  /* The forward bulk-copy kernel (16-bit rows past 65536 vectors on sm_90: a cluster of up to
   * 16 CTAs a row, as many clusters as are resident, 16 of 8 on an H200, each looping over rows
   * and refilling its pieces with the next row's): more rows than clusters, so that a cluster
   * takes a second row; 600008 leaves the last CTA a shorter chunk. Under --quick the first
   * alone. */
  {
    static const case_shape bulk_form[] = {{3, 0, 802816}, {2, 1, 600008}};
    forward_cases(bulk_form, 1, 19, 1);
    forward_cases(bulk_form + 1, 1, 40, 0);
  }
  /* The forward hold kernel (fp32 RMSNorm rows past the register kernel's on sm_90, not in place:
   * each row held whole in shared memory, cut into chunks over one cooperative launch of two
   * CTAs an SM, hold_shape), beside the same LayerNorm rows (802816: the spread kernel, one
   * cooperative launch of a CTA an SM, each a chunk of every row; 300004 and 2^20 the streaming
   * kernel; in tuning builds with FNORM_TUNE_FWD_HOLD=2 the hold kernel's LayerNorm form): 802816
   * (RMSNorm: 33 chunks of 6082 vectors, 8 rows at a time on an H200; LayerNorm: 132 chunks, y
   * three rows behind) at 19 rows (a last round of 3 rows), with explicit
   * strides and no gamma, beta, mean or rstd too; 300004 at 80 rows (a shorter last chunk); 2^20
   * at one row (over every CTA); the 1e4 offset, NaN/Inf rows, and in place (the streaming
   * kernel instead); RMSNorm with beta too. Under --quick 802816 alone. */
  {
    static const case_shape hold_form[] = {{0, 0, 802816}, {0, 1, 802816},  {0, 0, 300004},
                                           {0, 1, 300004}, {0, 0, 1048576}, {0, 1, 1048576}};
    forward_cases(hold_form, 2, 19, 2);
    { /* RMSNorm with beta (the usual RMSNorm case has none) */
      tcase c = tcase_default(FNORM_RMSNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, 19, 802816);
      c.beta = 1;
      gpu_forward_case("cuda", &c);
    }
    if (!g_opt.quick) {
      forward_cases(hold_form + 2, 2, 80, 0);
      forward_cases(hold_form + 4, 2, 1, 0);
      forward_hard_cases(FNORM_LAYERNORM, FNORM_DTYPE_F32, 24, 802816, 0, 1);
      forward_hard_cases(FNORM_RMSNORM, FNORM_DTYPE_F32, 24, 802816, 1, 0);
    }
  }
  /* The lean form over a cluster (sm_90, persistent: as many clusters as are resident, each
   * looping over rows): 16-bit rows of 32769-65535 elements (over 4 CTAs of up to 512 threads,
   * about 200 clusters resident on an H200; 240 rows) and of 262144-524288 (over 16, 33 clusters
   * resident; 40 rows), RMSNorm with 16-bit gamma, LayerNorm also with fp32 gamma. 40968 and
   * 327688 (RMSNorm) leave the last CTA a shorter chunk (LayerNorm takes the form only where every
   * CTA's chunk fills its threads). 16-bit LayerNorm rows of 65536-262143 take it too (sweep
   * 68): bf16 65536 (240 rows), fp16 with fp32 gamma 131072 (40 rows). RMSNorm 131072 and fp32
   * rows take it in tuning builds only (FNORM_TUNE_FWD_LEAN_CL=3), fp32 LayerNorm with the 1e4
   * offset; and in place. fp16 LayerNorm with fp16 gamma and beta takes its GB variant (A/B run
   * DH): 40960 and 65536 at 240 rows, 262144 at 40. Under --quick the first alone. */
  {
    static const case_shape lean_cl4[] = {{3, 1, 40968}, {1, 0, 40960}, {3, 0, 49152},
                                          {1, 1, 57344}, {4, 0, 40960}, {3, 0, 65536},
                                          {1, 0, 65536}};
    static const case_shape lean_cl16[] = {{3, 0, 262144}, {1, 1, 262144}, {3, 1, 327688},
                                           {1, 0, 524288}, {2, 0, 262144}, {2, 0, 131072},
                                           {1, 0, 262144}};
    static const case_shape lean_tune[] = {{3, 0, 131072}, {0, 1, 131072}};
    forward_cases(lean_cl4, (int)(sizeof lean_cl4 / sizeof lean_cl4[0]), 240, 1);
    /* bf16 LayerNorm with bf16 gamma and beta takes the FULL forms' GB variant (presence known at
     * compile time: runs CA, CC): 65536 over a cluster, and under --quick too. */
    if (g_opt.quick) {
      forward_cases(lean_cl4 + 5, 1, 240, 1);
    } else {
      forward_cases(lean_cl16, (int)(sizeof lean_cl16 / sizeof lean_cl16[0]), 40, 0);
      forward_cases(lean_tune, 2, 80, 0);
      tcase c = tcase_default(FNORM_LAYERNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, 80, 65536);
      c.input = INPUT_OFFSET_1E4;
      gpu_forward_case("cuda", &c);
      c = tcase_default(FNORM_LAYERNORM, FNORM_DTYPE_BF16, FNORM_DTYPE_SAME, 240, 49152);
      tcase_apply_layout(&c, 4, 1); /* in place */
      gpu_forward_case("cuda", &c);
    }
  }
  /* The lean form on the rows sweeps 61-62 gave it, at CTA_TIER_ROWS rows: LayerNorm in its
   * FULL form (four vectors a thread, centred two at a time) on 16-bit rows of 8193-16384 with
   * 16-bit gamma and of 16385-32768 with fp32 gamma (a multiple of 1024: 320-1024 threads) and
   * on fp32 rows of 5120-16384 (a multiple of 512; 8704: 544 threads); RMSNorm on 16-bit rows
   * with fp32 gamma of 10241-16384 (12296: the last vector of a thread's four not in the row).
   * fp32 12288 also with the 1e4 offset, bf16 12288 also in place. Under --quick the first
   * alone. */
  {
    static const case_shape lean_ln[] = {
        {1, 0, 10240}, {0, 0, 12288}, {3, 0, 12288}, {3, 0, 16384}, {1, 0, 16384}, {0, 0, 8704},
        {0, 0, 5120},  {4, 0, 20480}, {2, 0, 32768}, {2, 1, 12288}, {4, 1, 14336}, {4, 1, 12296}};
    forward_cases(lean_ln, 12, CTA_TIER_ROWS, 2);
    if (g_opt.quick) { /* bf16 16384 in one CTA: the GB variant without a cluster */
      forward_cases(lean_ln + 3, 1, CTA_TIER_ROWS, 1);
    } else {
      tcase c =
          tcase_default(FNORM_LAYERNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, CTA_TIER_ROWS, 12288);
      c.input = INPUT_OFFSET_1E4;
      gpu_forward_case("cuda", &c);
      c = tcase_default(FNORM_LAYERNORM, FNORM_DTYPE_BF16, FNORM_DTYPE_SAME, CTA_TIER_ROWS, 12288);
      tcase_apply_layout(&c, 4, 1); /* in place */
      gpu_forward_case("cuda", &c);
    }
  }
  /* The forward's rows form (fwd_rows_kernel, sweeps 63, 69, 70, 100): 16-byte rows of 32, 96,
   * 128 or 256 vectors over a warp (fp32 also 192), rows of 64 vectors (fp32 256, 16-bit 512) and
   * 16-bit rows of 32 or 48 over half a warp, with
   * 256 rows an SM and 2^25 elements or more, several a one-warp CTA: more than 256 x 160 SMs rows
   * and 2^25 elements, so that the case list is the same on every GPU, and one row more, so that
   * the last CTA's rows run past the last row (at half a warp a row, the second half's rows all
   * past it); the first two also strided without gamma/beta, bf16 LayerNorm 512 also in place,
   * the fp32 LayerNorm rows also on a 1e4 offset.
   * Under --quick the first alone. */
  {
    static const case_shape rows_form[] = {
        {3, 0, 256},  {1, 1, 384},  {0, 0, 128},  {3, 1, 512},  {0, 1, 256}, {1, 0, 1024},
        {3, 0, 1024}, {0, 0, 512},  {1, 1, 256},  {3, 0, 384},  {3, 1, 768}, {1, 0, 768},
        {0, 0, 384},  {0, 1, 1024}, {1, 0, 2048}, {3, 1, 2048}, {0, 1, 768}, {0, 0, 768},
        {0, 0, 256},  {3, 0, 512},  {1, 1, 512}};
    for (s = 0; s < (int)(sizeof rows_form / sizeof rows_form[0]); s++) {
      const int64_t cols = rows_form[s].cols;
      const int64_t rows =
          ((int64_t)1 << 25) / cols > 256 * 160 ? ((int64_t)1 << 25) / cols + 1 : 256 * 160 + 1;
      forward_cases(rows_form + s, 1, rows, s < 2);
      if (s == 3 && !g_opt.quick) {
        tcase c = tcase_default(FNORM_LAYERNORM, FNORM_DTYPE_BF16, FNORM_DTYPE_SAME, rows, cols);
        tcase_apply_layout(&c, 4, 1); /* in place */
        gpu_forward_case("cuda", &c);
      }
      /* fp32 LayerNorm rows on a 1e4 offset: the statistics' centring */
      if (rows_form[s].combo == 0 && rows_form[s].norm == 0 && !g_opt.quick) {
        tcase c = tcase_default(FNORM_LAYERNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, rows, cols);
        c.input = INPUT_OFFSET_1E4;
        gpu_forward_case("cuda", &c);
      }
      if (g_opt.quick)
        break;
    }
  }
  /* The forward's packed rows form (fwd_rows_packed_kernel): the rows packed_rows_shape names
   * with gamma in their dtype (16-bit LayerNorm 4096 and 5120 over a warp, 8192 over 4 warps
   * from 2^27 elements, 16384 and 32768 over 8, RMSNorm 16384 and 32768 over 8, from 2^25; fp32
   * LayerNorm 5120 over 5 warps and 8192 over 8, from 2^25, also on both hard inputs), a row a CTA,
   * 16-bit rows held as their 16-bit words. Each also with aligned strides and no gamma/beta or
   * statistics (forward_cases), then on a 1e4 offset (even entries) or with NaN/Inf in some rows
   * (odd ones), and in place (the first two and the RMSNorm ones). fp32 gamma keeps the other tiers
   * (the cases above). Under --quick the first alone. The last seven are 16-bit rows of 2-8 chunks
   * of 16384 or 32768 elements, which its cluster form takes on sm_90 where plan_forward plans it
   * (RMSNorm in chunks of 32768, kFwdPackedCl: fp16 262144 over 8 CTAs, bf16 65536 over 2; tuning
   * builds FNORM_TUNE_FWD_PACKED_CL=1 or 2 and FNORM_TUNE_FWD_PACKED_CL_LN=1 or 2 take the others:
   * LayerNorm 65536 over 2 or 4 CTAs, 262144 over 8, 49152 over 3 chunks of 16384, RMSNorm 32768
   * over 2, which other builds run in one CTA); elsewhere they test the tiers that take them. */
  {
    static const case_shape packed_form[] = {
        {3, 0, 4096},  {1, 0, 5120},   {1, 0, 4096},   {3, 0, 5120},  {3, 0, 8192},  {1, 0, 16384},
        {3, 0, 32768}, {3, 1, 16384},  {1, 1, 16384},  {0, 0, 5120},  {0, 0, 8192},  {3, 0, 65536},
        {1, 0, 65536}, {1, 1, 262144}, {3, 0, 262144}, {3, 0, 49152}, {3, 1, 32768}, {3, 1, 65536}};
    for (s = 0; s < (int)(sizeof packed_form / sizeof packed_form[0]); s++) {
      const int64_t cols = packed_form[s].cols;
      const fnorm_norm norm = norms[packed_form[s].norm];
      const int64_t min_elements =
          packed_form[s].combo != 0 && norm == FNORM_LAYERNORM && cols == 8192 ? (int64_t)1 << 27
                                                                               : (int64_t)1 << 25;
      const int64_t rows = (min_elements + cols - 1) / cols;
      const fnorm_dtype dt = combos[packed_form[s].combo].dtype;
      forward_cases(packed_form + s, 1, rows, 1);
      if (g_opt.quick)
        break;
      forward_hard_cases(norm, dt, rows, cols, s % 2, s < 2 || norm == FNORM_RMSNORM);
    }
  }
  /* The forward's batch tier (fwd_batch_kernel, sm_90; fwd_batch_shape): rows of 65536 and 262144
   * with gamma in their dtype from 2^25 elements (16-bit LayerNorm 262144 from 2^27; 16-bit
   * RMSNorm 65536 below 2^26), a cluster of 8 or 16 CTAs a row, persistent: 16-bit rows two a
   * round (two stages; LayerNorm 262144 three, deferred), fp32 65536 two a round and 262144 one
   * (the deferred form, three stages),
   * LayerNorm and RMSNorm. One row past those elements, so that the last round of two has a row
   * past the last. Each also with aligned strides and no gamma/beta or
   * statistics (forward_cases), then on a 1e4 offset (even entries) or with NaN/Inf in some rows
   * (odd ones; fp32 both), and in place. Under --quick the first alone. Elsewhere they test the
   * tiers that take them. */
  {
    static const case_shape batch_fwd[] = {{3, 0, 65536},  {1, 1, 65536},  {0, 0, 65536},
                                           {0, 1, 262144}, {1, 0, 262144}, {3, 1, 262144},
                                           {0, 0, 262144}, {0, 1, 65536}};
    for (s = 0; s < (int)(sizeof batch_fwd / sizeof batch_fwd[0]); s++) {
      const int64_t cols = batch_fwd[s].cols;
      const int ln16 = batch_fwd[s].norm == 0 && batch_fwd[s].combo != 0;
      const int64_t rows = ((int64_t)1 << (ln16 && cols == 262144 ? 27 : 25)) / cols + 1;
      forward_cases(batch_fwd + s, 1, rows, 1);
      if (g_opt.quick)
        break;
      forward_hard_cases(norms[batch_fwd[s].norm], combos[batch_fwd[s].combo].dtype, rows, cols,
                         s % 2, 1);
    }
  }
  /* 16-bit LayerNorm on a 1e4 offset in the forms whose correction sum is taken from the
   * thread's plain sum (centred_sum_from_sum): the packed rows form (fp16 16384 and 32768; its
   * bf16 offset cases above sum exactly, bf16 values near 1e4 being multiples of 64), the rows
   * form (fp16 2048, 64 values a lane) and the lean form over a cluster (fp16 65536 and 262144);
   * and fp16 5120 in the packed form, whose lanes hold 160 values (not a power of two, so the
   * thread's own mean rounds and Chan's update keeps its cross term). fp16 values near 1e4 are
   * multiples of 8, whose sums of a row round in fp32. Not under --quick. */
  if (!g_opt.quick) {
    static const int64_t offset_rows[][2] = {{16384, 2048}, {32768, 1024}, {2048, 40961},
                                             {65536, 240},  {262144, 40},  {5120, 6554}};
    for (s = 0; s < (int)(sizeof offset_rows / sizeof offset_rows[0]); s++)
      forward_hard_cases(FNORM_LAYERNORM, FNORM_DTYPE_F16, offset_rows[s][1], offset_rows[s][0], 0,
                         0);
  }
  /* The forward's loop form (fwd_loop_kernel): fp32 RMSNorm rows of 2048-4096 with fp32 gamma
   * from 2^25 elements, in one step of four vectors a thread (tuning builds' FNORM_TUNE_FWD_LOOP
   * puts other RMSNorm rows on it too): 2048 and 4096 (CTAs of 128 and 256 threads filled
   * exactly), 3072 and 2052 (the last thread's vectors partly past the row). Each also with
   * aligned strides and no gamma or statistics (forward_cases), on a 1e4 offset, with NaN/Inf in
   * some rows, and in place. Under --quick the first alone. */
  {
    static const case_shape loop_form[] = {{0, 1, 2048}, {0, 1, 4096}, {0, 1, 3072}, {0, 1, 2052}};
    for (s = 0; s < (int)(sizeof loop_form / sizeof loop_form[0]); s++) {
      const int64_t cols = loop_form[s].cols;
      const int64_t rows = (((int64_t)1 << 25) + cols - 1) / cols;
      forward_cases(loop_form + s, 1, rows, 1);
      if (g_opt.quick)
        break;
      forward_hard_cases(FNORM_RMSNORM, FNORM_DTYPE_F32, rows, cols, 0, 1);
    }
  }
  /* The loop kernel's full form: RMSNorm rows with gamma in their dtype and two rows an SM or
   * more (321: past two rows an SM on 160 SMs, so that the case list is the same on every GPU):
   * fp32 32768 (one step of eight vectors a thread of 1024), 65536 (two steps), 8192 (one step
   * at 256 threads), 5120 (at 160; at 320 of four vectors, 13108 rows: from 2^26), 16384 (at 512,
   * 2048 rows: the plan takes it from 2^25 elements), bf16 and fp16 65536 (at 1024, 1024 rows: from
   * 2^26), 32768 (at 512, 4096 rows: from 2^27), 16384 (at 256, 8192 rows) and 8192 (at 256 in one
   * step of four vectors, 8192 rows: from 2^26); and its LayerNorm kernel (fwd_loop_ln_kernel) on
   * fp32 LayerNorm 8192, 16384 and 32768 (256, 512 and 1024 threads, the row in one step; 321,
   * 2048 and 1024 rows: the plan takes the last two from 2^25 elements). Each
   * also with aligned strides and no gamma or statistics (forward_cases), on a 1e4 offset, with
   * NaN/Inf in some rows, and in place. Under --quick fp32 32768 alone. */
  {
    static const case_shape full_form[] = {
        {0, 1, 32768}, {0, 1, 65536}, {0, 1, 8192},  {0, 1, 5120},  {0, 1, 16384}, {3, 1, 32768},
        {1, 1, 32768}, {3, 1, 65536}, {1, 1, 65536}, {3, 1, 16384}, {1, 1, 16384}, {0, 0, 8192},
        {0, 0, 16384}, {0, 0, 32768}, {3, 1, 8192},  {1, 1, 8192}};
    for (s = 0; s < (int)(sizeof full_form / sizeof full_form[0]); s++) {
      /* (rows from which the plan takes each: 2^25 elements for fp32 16384, 2^26 for 16-bit
       * 65536 and 8192, 2^27 for 16-bit 16384 and 32768) */
      const int64_t cols = full_form[s].cols;
      const int is16 = full_form[s].combo != 0;
      const int64_t rows = is16 && cols == 8192 ? ((int64_t)1 << 26) / cols
                           : is16               ? ((int64_t)1 << (cols <= 32768 ? 27 : 26)) / cols
                           : cols == 16384 || (cols == 32768 && full_form[s].norm == 0)
                               ? ((int64_t)1 << 25) / cols
                               : 321;
      forward_cases(full_form + s, 1, rows, 1);
      if (g_opt.quick)
        break;
      forward_hard_cases(norms[full_form[s].norm], combos[full_form[s].combo].dtype, rows,
                         full_form[s].cols, 0, 1);
    }
    if (!g_opt.quick) { /* fp32 RMSNorm 5120 from 2^26 elements: 320 threads x 4 vectors */
      static const case_shape wide5120 = {0, 1, 5120};
      forward_cases(&wide5120, 1, 13108, 1);
      forward_hard_cases(norms[1], combos[0].dtype, 13108, 5120, 0, 1);
    }
  }
  /* fp32 backward rows past 8 warps (N = 4097-32768) from CLUSTER_TIER_ROWS rows on: from y
   * over a cluster of 2, 4 or 8 8-warp CTAs on sm_90 (from x the ring; elsewhere the ring or
   * the row tier), the last CTA's chunk shorter where the row does not split evenly (8196,
   * 16392), once with aligned rows with a gap and no gamma/beta. Also the forward and the
   * backward from x. Not under --quick (its rows are too few for the tier): --filter 'M=4096 '
   * picks them. */
  if (!g_opt.quick) {
    static const struct {
      int norm;
      int64_t cols;
    } clustered[] = {{0, 5120}, {1, 8196}, {0, 16392}};
    for (s = 0; s < 3; s++) {
      tcase c = tcase_default(norms[clustered[s].norm], FNORM_DTYPE_F32, FNORM_DTYPE_SAME,
                              CLUSTER_TIER_ROWS, clustered[s].cols);
      gpu_case("cuda", &c);
      if (s == 0) {
        tcase_apply_layout(&c, 3, 1);
        c.gamma = c.beta = 0;
        gpu_case("cuda", &c);
      }
    }
  }
  /* Backward rows past the register ring's (16-bit: more than 16384 16-byte vectors; fp32: more
   * than 32768, N = 131073-262144), and 16-bit rows with fp32 gamma past the warp tier's up to
   * 640 vectors (5120; 65536 takes the register ring since sweep 64), with RESIDENT_TIER_ROWS
   * rows: the ring's RESIDENT form on sm_90 from x (from y, and elsewhere, the stream tier or the
   * register ring), in CTAs of up to 512 and up to 128 threads; 131080 leaves the last of 16
   * CTAs a shorter chunk, 16392 the last of 8, fp32 163848 (two stages) the last of 16; fp32
   * 262144 and 196616, which the form would hold in one stage, take the hold tier instead. Not
   * under --quick (too few rows; racecheck ran the same kernel forced on at 1-16 rows in a tuning
   * build): --filter 'M=240 ' picks them. */
  if (!g_opt.quick) {
    static const case_shape resident[] = {
        {3, 0, 262144}, {1, 1, 262144}, {4, 1, 131080}, {2, 0, 131080}, {2, 1, 5120},
        {4, 0, 16392},  {4, 1, 65536},  {0, 0, 262144}, {0, 1, 196616}, {0, 0, 163848}};
    for (s = 0; s < (int)(sizeof resident / sizeof resident[0]); s++) {
      tcase c = tcase_default(norms[resident[s].norm], combos[resident[s].combo].dtype,
                              combos[resident[s].combo].param_dtype, RESIDENT_TIER_ROWS,
                              resident[s].cols);
      gpu_case("cuda", &c);
    }
  }
  /* The backward hold tier (bwd_hold_kernel: fp32 rows from x past the ring's on sm_90, and
   * those its RESIDENT form would hold in one stage, each row held whole in shared memory, cut
   * into chunks of at least kBwdHoldMinChunk vectors over one cooperative launch of a CTA an SM,
   * hold_shape; from y, and elsewhere, the stream tier or the ring): 2^20 (66 chunks of 3972
   * vectors, the last 3964, 2 rows at a time on 132 SMs) at 19 rows, so that each CTA takes 9-10
   * rows and its parts' mbarrier phases and the posts' two terms go round; also with aligned
   * strides and no gamma, without dx, without dgamma and dbeta, on a 1e4 offset, with NaN/Inf in
   * dy, and in place (dx over dy); RMSNorm also without dbeta (the kernel's RMS form) and with
   * dbeta; LayerNorm 2^20 + 4 (an odd count of vectors, the last chunk 3965) at 40 rows;
   * RMSNorm 524288 (33 chunks, 4 rows at a time) at 8 rows; LayerNorm 2^21 at one row (132
   * chunks, over every CTA).
   * The ring's RESIDENT cases below add 262144 and 196616 at 240 rows. Under --quick
   * (compute-sanitizer) RMSNorm 2^20 at 3 rows alone. */
  {
    static const case_shape hold_bwd[] = {
        {0, 0, 1048576}, {0, 1, 1048576}, {0, 0, 1048580}, {0, 1, 524288}, {0, 0, 2097152}};
    static const int64_t hold_rows[] = {19, 19, 40, 8, 1};
    for (s = 0; s < (int)(sizeof hold_bwd / sizeof hold_bwd[0]); s++) {
      const int q = hold_bwd[s].norm;
      tcase c = tcase_default(norms[q], combos[hold_bwd[s].combo].dtype,
                              combos[hold_bwd[s].combo].param_dtype, g_opt.quick ? 3 : hold_rows[s],
                              hold_bwd[s].cols);
      c.fwd = c.bwd_y = 0;
      if (g_opt.quick) {
        if (s == 1)
          gpu_case("cuda", &c);
        continue;
      }
      gpu_case("cuda", &c);
      if (s == 1) { /* RMSNorm without dbeta: the RMS form */
        c.dbeta = 0;
        gpu_case("cuda", &c);
      }
      if (s != 0)
        continue;
      tcase_apply_layout(&c, 3, 1);
      c.gamma = c.beta = 0;
      gpu_case("cuda", &c);
      c = tcase_default(norms[q], FNORM_DTYPE_F32, FNORM_DTYPE_SAME, hold_rows[s],
                        hold_bwd[s].cols);
      c.fwd = c.bwd_y = 0;
      without_dx_then_dparams(&c);
      c.input = INPUT_OFFSET_1E4;
      gpu_case("cuda", &c);
      c.input = INPUT_NONFINITE_DY;
      gpu_case("cuda", &c);
      c.input = INPUT_NORMAL;
      tcase_apply_layout(&c, 4, 1);
      gpu_case("cuda", &c);
    }
  }
  /* The backward ring (16-byte rows past the warp tier's, sm_90) over many rows a CTA or a
   * cluster, 2^24 elements a case: each CTA takes 12 or more rows, so the ring's stages and its
   * row sums' two slots and mbarrier phases go round several times (the cases above give most
   * CTAs one to three rows). 5120: three stages; 32768: a cluster of 4 a row; RMSNorm 12288:
   * the RMS form; bf16 8192 once more with strided rows; fp32 65536 and 131072: four vectors a
   * thread past 8192 vectors (kRingVptWide), a cluster of 8 and of 16. Not under --quick. */
  if (!g_opt.quick) {
    static const case_shape ring_rows[] = {{3, 0, 8192}, {1, 1, 12288}, {3, 0, 32768},
                                           {1, 0, 5120}, {0, 1, 65536}, {0, 0, 131072}};
    for (s = 0; s < 6; s++) {
      tcase c = tcase_default(norms[ring_rows[s].norm], combos[ring_rows[s].combo].dtype,
                              combos[ring_rows[s].combo].param_dtype,
                              ((int64_t)1 << 24) / ring_rows[s].cols, ring_rows[s].cols);
      gpu_case("cuda", &c);
      if (s == 0) {
        tcase_apply_layout(&c, 3, 1);
        gpu_case("cuda", &c);
      }
    }
  }
  /* The backward's batch tier (bwd_batch_kernel, sm_90, from x; batch_shape): 16-bit
   * LayerNorm and RMSNorm rows of 5120 (4 rows a round) and 8192 (2), LayerNorm rows of 16384,
   * 32768 and 65536 (2, over a cluster of 2, 8 and 16 CTAs; 65536 up to 2^26 elements) with 16-bit
   * gamma, from 2^25 elements (RMSNorm rows of 16384 and 32768 test the ring's RMS form, which
   * takes them); 8192-65536 with one row more, so that the last round has a row past the last
   * (5120: 6554 rows, two past). The backward
   * from x only (from y takes other tiers), each also with aligned strided rows (with a gap) and no
   * gamma/beta, and on a 1e4 offset (even entries) or with NaN/Inf in dy (odd ones); the first two
   * also without dx and with dx alone (the kernel's two early exits); RMSNorm also without dbeta
   * (the kernel's RMS form; with dbeta the general one). Under --quick the first alone. */
  {
    static const case_shape batch[] = {{3, 0, 5120},  {1, 0, 8192},  {1, 1, 5120},  {3, 1, 8192},
                                       {1, 0, 5120},  {3, 0, 8192},  {3, 0, 16384}, {1, 1, 32768},
                                       {1, 0, 32768}, {3, 1, 16384}, {3, 0, 65536}, {1, 0, 65536}};
    for (s = 0; s < (int)(sizeof batch / sizeof batch[0]); s++) {
      const int64_t cols = batch[s].cols;
      const int64_t rows = (((int64_t)1 << 25) + cols - 1) / cols + (cols >= 8192);
      const fnorm_norm norm = norms[batch[s].norm];
      const fnorm_dtype dt = combos[batch[s].combo].dtype;
      tcase c = tcase_default(norm, dt, FNORM_DTYPE_SAME, rows, cols);
      c.bwd_y = 0;
      gpu_case("cuda", &c);
      if (g_opt.quick)
        break;
      if (s < 2)
        without_dx_then_dparams(&c);
      if (norm == FNORM_RMSNORM) {
        c.dbeta = 0;
        gpu_case("cuda", &c);
        c.dbeta = 1;
      }
      tcase_apply_layout(&c, 3, 1);
      c.gamma = c.beta = 0;
      gpu_case("cuda", &c);
      c = tcase_default(norm, dt, FNORM_DTYPE_SAME, rows, cols);
      c.bwd_y = 0;
      c.input = s % 2 ? INPUT_NONFINITE_DY : INPUT_OFFSET_1E4;
      gpu_case("cuda", &c);
    }
  }
  if (!g_opt.quick) {
    /* Two full-size problems (2^24 elements). */
    tcase c = tcase_default(FNORM_LAYERNORM, FNORM_DTYPE_BF16, FNORM_DTYPE_F32, 4096, 4096);
    gpu_case("cuda", &c);
    c = tcase_default(FNORM_RMSNORM, FNORM_DTYPE_F16, FNORM_DTYPE_SAME, 2048, 8192);
    gpu_case("cuda", &c);
  }
  group_end();
}

static void cuda_rows(void) {
  static const int64_t rows[] = {1, 2, 3, 7, 64, 127, 1000, 4097};
  /* 1024, 2048 and 4096: the backward warp tier with a row over 2, 4 and 8 warps, whose CTAs
   * get uneven rows when M is small. 256 and 512: rows that fill 8 or 16 lanes exactly (the
   * warp tiers' FULL forms), several to a warp, the last warp's groups partly past the last row
   * when M is not a multiple. */
  static const int64_t cols[] = {64, 1024, 2048, 4096, 4097, 256, 512};
  int r, s, v;
  group_begin("cuda-rows: M from 1 to 4097 (dgamma/dbeta reductions across blocks)");
  for (s = 0; s < 7; s++)
    for (r = 0; r < 8; r++)
      for (v = 0; v < 2; v++) {
        tcase c = v == 0 ? tcase_default(FNORM_LAYERNORM, FNORM_DTYPE_BF16, FNORM_DTYPE_F32,
                                         rows[r], cols[s])
                         : tcase_default(FNORM_RMSNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, rows[r],
                                         cols[s]);
        if (g_opt.quick && (rows[r] > 64 || s == 4))
          continue;
        gpu_case("cuda", &c);
      }
  group_end();
}

static void cuda_options(void) {
  static const int64_t sizes[] = {127, 1024, 4097, 65537};
  int s, k, q;
  group_begin("cuda-options: gamma/beta present or absent, outputs skipped, param dtype, eps");
  for (s = 0; s < 4; s++)
    for (q = 0; q < 2; q++)
      for (k = 0; k < N_COMBOS; k++) {
        int64_t n = sizes[s];
        tcase base = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype,
                                   rows_for(n, 1 << 16, 64), n);
        if (g_opt.quick && (s == 3 || (k != 0 && k != 4)))
          continue;
        tcase_option_variants(&base, "cuda", gpu_case);
      }
  for (q = 0; q < 2; q++) {
    tcase c = tcase_default(norms[q], FNORM_DTYPE_F32, FNORM_DTYPE_F32, 33, 1024);
    gpu_case("cuda", &c);
  }
  /* The forward's CTA-per-row tier (enough rows) with the forward's options, for the two dtype
   * pairs --quick keeps elsewhere; not under --quick (compute-sanitizer's racecheck took over a
   * minute on them), where cuda-sizes has this tier. */
  for (q = 0; q < 2 && !g_opt.quick; q++)
    for (k = 0; k < N_COMBOS; k++) {
      tcase base =
          tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype, CTA_TIER_ROWS, 4096);
      if (k != 0 && k != 4)
        continue;
      tcase_option_variants(&base, "cuda", gpu_forward_case);
    }
  group_end();
}

static void cuda_layouts(void) {
  /* 2048 and 4096: the backward's row over 4 and over 8 warps. */
  static const int64_t sizes[] = {1, 7, 128, 1031, 2048, 4096, 32769};
  int s, k, q, v;
  group_begin("cuda-layouts: strided rows, pointers off 16-byte alignment, in place");
  for (s = 0; s < 7; s++)
    for (q = 0; q < 2; q++)
      for (k = 0; k < N_COMBOS; k++) {
        int64_t n = sizes[s];
        for (v = 0; v < N_LAYOUTS; v++) {
          tcase c = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype,
                                  rows_for(n, 1 << 17, 300), n);
          tcase_apply_layout(&c, v, 1);
          if (g_opt.quick && (s == 6 || (k != 0 && k != 4) || v == 3 || v == 4))
            continue;
          gpu_case("cuda", &c);
          /* 4096 also with rows enough for the forward's CTA-per-row tier. */
          if (n == 4096 && !g_opt.quick && (k == 0 || k == 4)) {
            c = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype, CTA_TIER_ROWS, n);
            tcase_apply_layout(&c, v, 1);
            (k == 0 ? gpu_case : gpu_forward_case)("cuda", &c);
          }
        }
      }
  group_end();
}

static void cuda_hard_inputs(void) {
  static const int64_t offset_sizes[] = {1024, 4096, 65536, 262144};
  static const int64_t nonfinite_sizes[] = {7, 128, 1031, 8193, 65537};
  int s, k, q, v;
  group_begin("cuda-hard-inputs: 1e4 + N(0,1) in fp32, NaN/Inf confined, legacy stream");
  for (s = 0; s < 4; s++)
    for (q = 0; q < 2; q++) {
      tcase c = tcase_default(norms[q], FNORM_DTYPE_F32, FNORM_DTYPE_SAME,
                              rows_for(offset_sizes[s], 1 << 18, 64), offset_sizes[s]);
      c.input = INPUT_OFFSET_1E4;
      if (g_opt.quick && s >= 2)
        continue;
      gpu_case("cuda", &c);
      if (offset_sizes[s] == 4096) { /* the forward's CTA-per-row tier */
        c.rows = CTA_TIER_ROWS;
        gpu_case("cuda", &c);
      }
    }
  for (s = 0; s < 5; s++)
    for (q = 0; q < 2; q++)
      for (k = 0; k < N_COMBOS; k++)
        for (v = 0; v < 2; v++) {
          tcase c = tcase_default(norms[q], combos[k].dtype, combos[k].param_dtype, 6,
                                  nonfinite_sizes[s]);
          c.input = v == 0 ? INPUT_NONFINITE_X : INPUT_NONFINITE_DY;
          if (g_opt.quick && (s >= 3 || (k != 0 && k != 4)))
            continue;
          gpu_case("cuda", &c);
        }
  for (q = 0; q < 2; q++) {
    tcase c = tcase_default(norms[q], FNORM_DTYPE_BF16, FNORM_DTYPE_F32, 100, 2048);
    c.use_null_stream = 1;
    gpu_case("cuda", &c);
  }
  group_end();
}

/* ------------------------------------------------------------------------------------------
 * CUDA graph capture, and argument checks with device pointers
 * ---------------------------------------------------------------------------------------- */

/* A graph case's name (graph_case's, and the same when only counted): norm, dtype, param dtype,
 * N, M. */
#define GRAPH_CASE_NAME "cuda graph %s %s/p%s N=%lld M=%lld: forward+backward captured and replayed"

#ifdef FNORM_TESTS_HAVE_CUDA

enum { G_X, G_GAMMA, G_BETA, G_Y, G_MEAN, G_RSTD, G_DY, G_DX, G_DGAMMA, G_DBETA, G_COUNT };

typedef struct graph_bufs {
  void *dev[G_COUNT];
  size_t bytes[G_COUNT];
  void *ws;
  size_t ws_bytes;
} graph_bufs;

static cudaError_t upload_random(void *dev, size_t count, fnorm_dtype t, rng *r, double center) {
  size_t es = fnorm_dtype_size(t), k;
  unsigned char *host = (unsigned char *)malloc(count * es);
  cudaError_t err;
  if (host == NULL)
    return cudaErrorMemoryAllocation;
  for (k = 0; k < count; k++)
    store_elem(host + k * es, t, center + 0.5 * rng_normal(r) + 1e-3);
  err = cudaMemcpy(dev, host, count * es, cudaMemcpyHostToDevice);
  free(host);
  /* A pageable upload may still be in flight when cudaMemcpy returns, and the test stream
   * does not wait for the legacy stream. */
  if (err == cudaSuccess)
    err = cudaDeviceSynchronize();
  return err;
}

static fnorm_status launch_fwd_bwd(const fnorm_desc *d, graph_bufs *b, cudaStream_t s) {
  fnorm_forward_args f;
  fnorm_backward_args g;
  fnorm_status st;
  memset(&f, 0, sizeof f);
  f.x = b->dev[G_X];
  f.gamma = b->dev[G_GAMMA];
  f.beta = d->norm == FNORM_LAYERNORM ? b->dev[G_BETA] : NULL;
  f.y = b->dev[G_Y];
  f.mean = d->norm == FNORM_LAYERNORM ? (float *)b->dev[G_MEAN] : NULL;
  f.rstd = (float *)b->dev[G_RSTD];
  st = fnorm_forward(d, &f, s);
  if (st != FNORM_SUCCESS)
    return st;
  memset(&g, 0, sizeof g);
  g.dy = b->dev[G_DY];
  g.x = b->dev[G_X];
  g.mean = f.mean;
  g.rstd = f.rstd;
  g.gamma = b->dev[G_GAMMA];
  g.dx = b->dev[G_DX];
  g.dgamma = b->dev[G_DGAMMA];
  g.dbeta = b->dev[G_DBETA];
  return fnorm_backward(d, &g, b->ws, b->ws_bytes, s);
}

static cudaError_t poison_outputs(graph_bufs *b, cudaStream_t s) {
  int k;
  for (k = G_Y; k < G_COUNT; k++) {
    cudaError_t err;
    if (k == G_DY)
      continue;
    err = cudaMemsetAsync(b->dev[k], 0xFF, b->bytes[k], s);
    if (err != cudaSuccess)
      return err;
  }
  return cudaStreamSynchronize(s);
}

/* Copies every output back, concatenated. */
static cudaError_t download_outputs(graph_bufs *b, unsigned char *host) {
  int k;
  for (k = G_Y; k < G_COUNT; k++) {
    cudaError_t err;
    if (k == G_DY)
      continue;
    err = cudaMemcpy(host, b->dev[k], b->bytes[k], cudaMemcpyDeviceToHost);
    if (err != cudaSuccess)
      return err;
    host += b->bytes[k];
  }
  return cudaSuccess;
}

#define GRAPH_CHECK(expr)                                                                          \
  do {                                                                                             \
    cudaError_t err_ = (expr);                                                                     \
    if (err_ != cudaSuccess) {                                                                     \
      note_cuda_error(err_);                                                                       \
      case_fail("%s: %s (%s)", #expr, cudaGetErrorName(err_), cudaGetErrorString(err_));           \
      goto cleanup;                                                                                \
    }                                                                                              \
  } while (0)

static void graph_case(fnorm_norm norm, fnorm_dtype dtype, fnorm_dtype param_dtype, int64_t rows,
                       int64_t cols) {
  graph_bufs b;
  fnorm_desc d;
  fnorm_status st;
  cudaStream_t s = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  unsigned char *direct = NULL, *replay = NULL, *first = NULL;
  size_t out_bytes = 0, es = fnorm_dtype_size(dtype);
  size_t pes = fnorm_dtype_size(param_dtype == FNORM_DTYPE_SAME ? dtype : param_dtype);
  rng r;
  int k, round;
  if (!case_begin(GRAPH_CASE_NAME, norm_name(norm), dtype_name(dtype), dtype_name(param_dtype),
                  (long long)cols, (long long)rows))
    return;
  memset(&b, 0, sizeof b);
  if (cuda_broken) {
    case_fail("the CUDA context is unusable after an earlier error");
    case_end();
    return;
  }
  r = rng_seeded(case_seed());
  fnorm_desc_init(&d, FNORM_DEVICE_CUDA, norm, dtype, rows, cols);
  d.param_dtype = param_dtype;
  b.bytes[G_X] = b.bytes[G_Y] = b.bytes[G_DY] = b.bytes[G_DX] = (size_t)(rows * cols) * es;
  b.bytes[G_GAMMA] = b.bytes[G_BETA] = b.bytes[G_DGAMMA] = b.bytes[G_DBETA] = (size_t)cols * pes;
  b.bytes[G_MEAN] = b.bytes[G_RSTD] = (size_t)rows * 4;
  for (k = 0; k < G_COUNT; k++)
    if (k >= G_Y && k != G_DY)
      out_bytes += b.bytes[k];
  GRAPH_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (k = 0; k < G_COUNT; k++)
    GRAPH_CHECK(cudaMalloc(&b.dev[k], b.bytes[k]));
  st = fnorm_backward_workspace_size(&d, &b.ws_bytes);
  if (st != FNORM_SUCCESS) {
    case_fail("workspace query: %s", fnorm_status_name(st));
    goto cleanup;
  }
  if (b.ws_bytes > 0)
    GRAPH_CHECK(cudaMalloc(&b.ws, b.ws_bytes));
  direct = (unsigned char *)malloc(out_bytes);
  replay = (unsigned char *)malloc(out_bytes);
  first = (unsigned char *)malloc(out_bytes);
  if (!direct || !replay || !first) {
    case_fail("out of host memory");
    goto cleanup;
  }
  GRAPH_CHECK(upload_random(b.dev[G_GAMMA], (size_t)cols,
                            param_dtype == FNORM_DTYPE_SAME ? dtype : param_dtype, &r, 1.0));
  GRAPH_CHECK(upload_random(b.dev[G_BETA], (size_t)cols,
                            param_dtype == FNORM_DTYPE_SAME ? dtype : param_dtype, &r, 0.0));
  GRAPH_CHECK(upload_random(b.dev[G_DY], (size_t)(rows * cols), dtype, &r, 0.0));

  /* Capture once (the inputs' contents do not matter to the capture). */
  GRAPH_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  st = launch_fwd_bwd(&d, &b, s);
  {
    cudaError_t end = cudaStreamEndCapture(s, &graph);
    if (st != FNORM_SUCCESS) {
      case_fail("under capture: a call returned %s", fnorm_status_name(st));
      goto cleanup;
    }
    GRAPH_CHECK(end);
  }
#if CUDART_VERSION >= 12000
  GRAPH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
#else
  GRAPH_CHECK(cudaGraphInstantiate(&exec, graph, NULL, NULL, 0));
#endif

  /* Twice, with different x: the replay must equal a direct call bitwise each time (so it
   * really recomputes from the buffers' current contents). */
  for (round = 0; round < 2; round++) {
    GRAPH_CHECK(upload_random(b.dev[G_X], (size_t)(rows * cols), dtype, &r, round ? -0.7 : 0.3));
    GRAPH_CHECK(poison_outputs(&b, s));
    st = launch_fwd_bwd(&d, &b, s);
    if (st != FNORM_SUCCESS) {
      case_fail("direct call returned %s", fnorm_status_name(st));
      goto cleanup;
    }
    GRAPH_CHECK(cudaStreamSynchronize(s));
    GRAPH_CHECK(download_outputs(&b, direct));
    GRAPH_CHECK(poison_outputs(&b, s));
    GRAPH_CHECK(cudaGraphLaunch(exec, s));
    GRAPH_CHECK(cudaStreamSynchronize(s));
    GRAPH_CHECK(download_outputs(&b, replay));
    if (memcmp(direct, replay, out_bytes) != 0)
      case_fail("round %d: the graph replay differs from the direct call", round);
    if (round == 0)
      memcpy(first, replay, out_bytes);
    else if (memcmp(first, replay, out_bytes) == 0)
      case_fail("the replay with new x gave the same outputs as with the old x");
  }
cleanup:
  if (exec)
    cudaGraphExecDestroy(exec);
  if (graph)
    cudaGraphDestroy(graph);
  for (k = 0; k < G_COUNT; k++)
    if (b.dev[k])
      cudaFree(b.dev[k]);
  if (b.ws)
    cudaFree(b.ws);
  if (s)
    cudaStreamDestroy(s);
  free(direct);
  free(replay);
  free(first);
  case_end();
}

/* Bad arguments with device pointers: the status, and device memory left alone. */
static void device_bad_input_case(const char *what, int which) {
  enum { M = 4, N = 64, REGION = 4096 };
  unsigned char *dev = NULL, *before = NULL, *after = NULL, *ws;
  size_t bytes, ws_bytes = 0;
  fnorm_desc d;
  fnorm_forward_args f;
  fnorm_backward_args b;
  fnorm_status st, want;
  if (!case_begin("cuda bad-input %s", what))
    return;
  fnorm_desc_init(&d, FNORM_DEVICE_CUDA, FNORM_LAYERNORM, FNORM_DTYPE_F32, M, N);
  st = fnorm_backward_workspace_size(&d, &ws_bytes);
  if (st != FNORM_SUCCESS) {
    case_fail("workspace query: %s", fnorm_status_name(st));
    goto cleanup;
  }
  bytes = REGION * 8 + (ws_bytes + 255) / 256 * 256 + 256;
  before = (unsigned char *)malloc(bytes);
  after = (unsigned char *)malloc(bytes);
  if (!before || !after || cudaMalloc((void **)&dev, bytes) != cudaSuccess) {
    case_fail("allocation failed");
    goto cleanup;
  }
  memset(before, 0x3C, bytes);
  if (cudaMemcpy(dev, before, bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    case_fail("cudaMemcpy failed");
    goto cleanup;
  }
  ws = dev + 8 * REGION;
  memset(&f, 0, sizeof f);
  f.x = dev;
  f.gamma = dev + REGION;
  f.y = dev + 2 * REGION;
  f.mean = (float *)(dev + 3 * REGION);
  f.rstd = (float *)(dev + 4 * REGION);
  memset(&b, 0, sizeof b);
  b.dy = dev + 5 * REGION;
  b.x = dev;
  b.mean = f.mean;
  b.rstd = f.rstd;
  b.dx = dev + 6 * REGION;
  b.dgamma = dev + 7 * REGION;
  switch (which) {
  case 0:
    f.x = NULL;
    want = FNORM_ERR_NULL_POINTER;
    st = fnorm_forward(&d, &f, test_stream);
    break;
  case 1:
    f.y = dev + 2 * REGION + 2;
    want = FNORM_ERR_MISALIGNED;
    st = fnorm_forward(&d, &f, test_stream);
    break;
  case 2:
    f.y = dev + 4;
    want = FNORM_ERR_ALIASING;
    st = fnorm_forward(&d, &f, test_stream);
    break;
  case 3:
    d.eps = 0.0f;
    want = FNORM_ERR_BAD_EPS;
    st = fnorm_forward(&d, &f, test_stream);
    break;
  case 4:
    b.dgamma = b.dx;
    want = FNORM_ERR_ALIASING;
    st = fnorm_backward(&d, &b, ws_bytes ? ws : NULL, ws_bytes, test_stream);
    break;
  default:
    if (ws_bytes == 0) {
      case_skip("the CUDA backend needs no workspace for this shape");
      goto cleanup;
    }
    want = FNORM_ERR_WORKSPACE_TOO_SMALL;
    st = fnorm_backward(&d, &b, ws, ws_bytes - 1, test_stream);
    break;
  }
  if (st != want)
    case_fail("returned %s, want %s", fnorm_status_name(st), fnorm_status_name(want));
  if (cudaStreamSynchronize(test_stream) != cudaSuccess ||
      cudaMemcpy(after, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    case_fail("CUDA error after the call");
  else if (memcmp(before, after, bytes) != 0)
    case_fail("device memory changed although the call failed");
cleanup:
  if (dev)
    cudaFree(dev);
  free(before);
  free(after);
  case_end();
}
#endif /* FNORM_TESTS_HAVE_CUDA */

/* Counts (when skipping) or runs the special cases. */
static void cuda_special(void) {
  static const char *const bad_names[6] = {
      "forward x=NULL", "forward y misaligned",  "forward y overlapping x",
      "forward eps=0",  "backward dgamma == dx", "backward workspace one byte too small"};
  /* (RMSNorm fp32 802816: the forward's hold kernel, a cooperative launch, on sm_90; LayerNorm
   * fp32 802816: the forward's spread kernel, likewise; LayerNorm fp32 2^20: the backward's hold
   * tier, a cooperative launch followed by the finalize) */
  static const problem_shape graphs[] = {
      {FNORM_LAYERNORM, FNORM_DTYPE_BF16, FNORM_DTYPE_F32, 300, 1024},
      {FNORM_RMSNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, 7, 16385},
      {FNORM_RMSNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, 19, 802816},
      {FNORM_LAYERNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, 19, 802816},
      {FNORM_LAYERNORM, FNORM_DTYPE_F32, FNORM_DTYPE_SAME, 19, 1048576}};
  int k;
  group_begin("cuda-special: CUDA graph capture, argument checks with device pointers");
  for (k = 0; k < (int)(sizeof graphs / sizeof graphs[0]); k++) {
#ifdef FNORM_TESTS_HAVE_CUDA
    if (gpu != NULL) {
      graph_case(graphs[k].norm, graphs[k].dtype, graphs[k].param_dtype, graphs[k].rows,
                 graphs[k].cols);
      continue;
    }
#endif
    case_begin(GRAPH_CASE_NAME, norm_name(graphs[k].norm), dtype_name(graphs[k].dtype),
               dtype_name(graphs[k].param_dtype), (long long)graphs[k].cols,
               (long long)graphs[k].rows);
  }
  for (k = 0; k < 6; k++) {
#ifdef FNORM_TESTS_HAVE_CUDA
    if (gpu != NULL) {
      device_bad_input_case(bad_names[k], k);
      continue;
    }
#endif
    case_begin("cuda bad-input %s", bad_names[k]);
  }
  group_end();
}

static void cuda_groups(void) {
  cuda_special();
  cuda_sizes();
  cuda_rows();
  cuda_options();
  cuda_layouts();
  cuda_hard_inputs();
}

void run_cuda_tests(void) {
  char reason[256];
  fnorm_status st;
  reason[0] = '\0';
  if (g_opt.cpu_only) {
    snprintf(reason, sizeof reason, "--cpu-only");
  } else {
    st = fnorm_device_available(FNORM_DEVICE_CUDA);
    if (st != FNORM_SUCCESS)
      snprintf(reason, sizeof reason, "fnorm_device_available(FNORM_DEVICE_CUDA) = %s (%s)",
               fnorm_status_name(st), fnorm_status_string(st));
  }
#ifndef FNORM_TESTS_HAVE_CUDA
  if (reason[0] == '\0')
    snprintf(reason, sizeof reason, "the tests were built without the CUDA runtime");
#endif
  if (reason[0] != '\0') {
    printf("CUDA tests skipped: %s\n", reason);
    gpu = NULL;
    skip_all_begin(reason);
    cuda_groups();
    skip_all_end();
    return;
  }
#ifdef FNORM_TESTS_HAVE_CUDA
  {
    cudaError_t err = cudaStreamCreateWithFlags(&test_stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
      group_begin("cuda-setup");
      if (case_begin("cuda setup: create a stream")) {
        case_fail("cudaStreamCreateWithFlags: %s", cudaGetErrorString(err));
        case_end();
      }
      group_end();
      return;
    }
    {
      struct cudaDeviceProp prop;
      int device = 0;
      if (cudaGetDevice(&device) == cudaSuccess &&
          cudaGetDeviceProperties(&prop, device) == cudaSuccess)
        printf("CUDA device %d: %s, sm_%d%d, %d SMs\n", device, prop.name, prop.major, prop.minor,
               prop.multiProcessorCount);
    }
    cuda_executor.stream = (void *)test_stream;
    tbuf_device_free = cuda_free_dev;
    gpu = &cuda_executor;
    cuda_groups();
    gpu = NULL;
    cudaStreamDestroy(test_stream);
  }
#endif
}
