/*
 * Internal interface between the public front end (src/api.c) and the backends.
 *
 * The front end checks every argument (NULL, sizes, strides, dtypes, eps, flags, alignment,
 * aliasing, workspace size) before it calls a backend, so a backend may assume a valid,
 * resolved problem: strides >= cols, param_dtype never FNORM_DTYPE_SAME, and for the
 * backward exactly one of args->x / args->y set. A backend still ends every dispatch ladder
 * in FNORM_ERR_UNSUPPORTED rather than falling through.
 */
#ifndef FNORM_INTERNAL_H
#define FNORM_INTERNAL_H

#include "fusednorm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fnorm_problem {
  fnorm_norm norm;
  int64_t rows;
  int64_t cols;
  fnorm_dtype dtype;       /* x, y, dy, dx */
  fnorm_dtype param_dtype; /* gamma, beta, dgamma, dbeta; resolved, never FNORM_DTYPE_SAME */
  float eps;
  int64_t x_stride; /* resolved: >= cols */
  int64_t y_stride;
  int64_t dy_stride;
  int64_t dx_stride;
  int cpu_threads;
} fnorm_problem;

/* CPU backend: src/cpu/ */
fnorm_status fnorm_cpu_forward(const fnorm_problem *p, const fnorm_forward_args *a);
fnorm_status fnorm_cpu_backward_workspace_size(const fnorm_problem *p, size_t *bytes);
fnorm_status fnorm_cpu_backward(const fnorm_problem *p, const fnorm_backward_args *a,
                                void *workspace, size_t workspace_bytes);

/* CUDA backend: src/cuda/ (only when built with CUDA; api.c answers FNORM_ERR_NOT_BUILT
 * otherwise). */
fnorm_status fnorm_cuda_available(void);
fnorm_status fnorm_cuda_forward(const fnorm_problem *p, const fnorm_forward_args *a, void *stream);
fnorm_status fnorm_cuda_backward_workspace_size(const fnorm_problem *p, size_t *bytes);
fnorm_status fnorm_cuda_backward(const fnorm_problem *p, const fnorm_backward_args *a,
                                 void *workspace, size_t workspace_bytes, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* FNORM_INTERNAL_H */
