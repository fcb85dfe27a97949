/*
 * CPU forward: LayerNorm and RMSNorm over each row, rows split across an OpenMP team.
 *
 * Each row is streamed in chunks (no scratch beyond a few stack buffers, whatever the row
 * length): LayerNorm reads the row three times (mean, then the sum of squared deviations from
 * that mean, then y); RMSNorm twice (mean square, then y). The row passes after the first hit
 * L1/L2 for all but enormous rows. Statistics are accumulated in double, which keeps the
 * two-pass variance accurate even for rows far from zero mean and cannot overflow for any fp32
 * input; y is computed in fp32 from the double statistics (see normalize_chunk).
 */
#include <math.h>

#include "cpu_internal.h"

/* Rows of at most this many elements (and their gamma and beta) are held as fp32 copies on the
 * stack: 3 * 16 KiB, which stays in L1/L2 and is modest for any thread's stack. */
#define FNORM_CPU_RESIDENT_COLS 4096

/* Independent double accumulators in the row sums (a power of two). */
#define FNORM_CPU_LANES 16

/* Stack buffers of one thread. */
typedef struct forward_buffers {
  float x[FNORM_CPU_RESIDENT_COLS];     /* the row as fp32; long rows: one chunk */
  float gamma[FNORM_CPU_RESIDENT_COLS]; /* gamma as fp32 (1 when NULL); long rows: one chunk */
  float beta[FNORM_CPU_RESIDENT_COLS];  /* beta as fp32 (0 when NULL); long rows: one chunk */
  float y[FNORM_CPU_CHUNK];
  float ones[FNORM_CPU_CHUNK];  /* stands in for a NULL gamma */
  float zeros[FNORM_CPU_CHUNK]; /* stands in for a NULL beta */
} forward_buffers;

/* The portable variant, built for the compiler's baseline instruction set. */
#define FNORM_FORWARD_NAME(name) name##_baseline
#define FNORM_FORWARD_TARGET
#include "cpu_forward_impl.h"
#undef FNORM_FORWARD_NAME
#undef FNORM_FORWARD_TARGET

#if FNORM_CPU_X86_DISPATCH
/* The same code for AVX2 (4 doubles or 8 floats a vector, and the byte/word widening loads the
 * bf16/fp16 conversions need), chosen at run time. No FMA, to stay bitwise equal to the
 * baseline. */
#define FNORM_FORWARD_NAME(name) name##_avx2
#define FNORM_FORWARD_TARGET __attribute__((target("avx2")))
#include "cpu_forward_impl.h"
#undef FNORM_FORWARD_NAME
#undef FNORM_FORWARD_TARGET
#endif

static void forward_rows(const fnorm_problem *p, const fnorm_forward_args *a, int64_t first,
                         int64_t end, forward_buffers *buf) {
#if FNORM_CPU_X86_DISPATCH
  if (fnorm_cpu_has_avx2()) {
    forward_rows_avx2(p, a, first, end, buf);
    return;
  }
#endif
  forward_rows_baseline(p, a, first, end, buf);
}

fnorm_status fnorm_cpu_forward(const fnorm_problem *p, const fnorm_forward_args *a) {
  if (!fnorm_cpu_dtype_supported(p->dtype) || !fnorm_cpu_dtype_supported(p->param_dtype)) {
    return FNORM_ERR_UNSUPPORTED;
  }
  if (p->norm != FNORM_LAYERNORM && p->norm != FNORM_RMSNORM) {
    return FNORM_ERR_UNSUPPORTED;
  }
  const int64_t rows = p->rows;
  const int team = fnorm_cpu_team_size(p->cpu_threads, rows, p->cols);
  if (team == 1) {
    forward_buffers buf;
    forward_rows(p, a, 0, rows, &buf);
    return FNORM_SUCCESS;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(team)
  {
    /* Contiguous row ranges, one per thread; each row is computed the same way whichever
     * thread gets it. */
    const int64_t threads = omp_get_num_threads();
    const int64_t thread = omp_get_thread_num();
    int64_t first, end;
    fnorm_cpu_split(rows, threads, thread, &first, &end);
    forward_buffers buf;
    forward_rows(p, a, first, end, &buf);
  }
#endif
  return FNORM_SUCCESS;
}
