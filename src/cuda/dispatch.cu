/*
 * CUDA dispatch: reads the current device's properties (no caching: the library keeps no
 * global state), has plan.cu choose the vector width and the tier for the problem, and
 * switches on the dtype pair. Every ladder ends in FNORM_ERR_UNSUPPORTED.
 *
 * The choices depend only on the problem, the pointers' alignment and the device, so the
 * same call on the same device always runs the same kernels in the same order: the results
 * are bitwise reproducible.
 */
#include <stdlib.h>
#include <type_traits>

#include "kernels.cuh"

using namespace fnorm_cuda;

namespace {

fnorm_status device_info(DeviceInfo *d) {
  if (cudaGetDevice(&d->device) != cudaSuccess) {
    cudaGetLastError();
    return FNORM_ERR_NO_DEVICE;
  }
  if (cudaDeviceGetAttribute(&d->sm_count, cudaDevAttrMultiProcessorCount, d->device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&d->cc_major, cudaDevAttrComputeCapabilityMajor, d->device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&d->max_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                             d->device) != cudaSuccess ||
      cudaDeviceGetAttribute(&d->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                             d->device) != cudaSuccess)
    return FNORM_ERR_CUDA;
  /* Leave room for the kernels' static shared memory (reduction scratch, ring barriers). */
  d->max_smem_optin -= 2048;
  return FNORM_SUCCESS;
}

template <typename F> fnorm_status by_dtype(const fnorm_problem *p, F &&f) {
  switch (p->dtype) {
  case FNORM_DTYPE_F32:
    if (p->param_dtype == FNORM_DTYPE_F32)
      return f((float *)nullptr, (float *)nullptr);
    return FNORM_ERR_UNSUPPORTED;
  case FNORM_DTYPE_F16:
    if (p->param_dtype == FNORM_DTYPE_F16)
      return f((f16 *)nullptr, (f16 *)nullptr);
    if (p->param_dtype == FNORM_DTYPE_F32)
      return f((f16 *)nullptr, (float *)nullptr);
    return FNORM_ERR_UNSUPPORTED;
  case FNORM_DTYPE_BF16:
    if (p->param_dtype == FNORM_DTYPE_BF16)
      return f((bf16 *)nullptr, (bf16 *)nullptr);
    if (p->param_dtype == FNORM_DTYPE_F32)
      return f((bf16 *)nullptr, (float *)nullptr);
    return FNORM_ERR_UNSUPPORTED;
  default:
    return FNORM_ERR_UNSUPPORTED;
  }
}

} // namespace

extern "C" fnorm_status fnorm_cuda_available(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    return FNORM_ERR_NO_DEVICE;
  }
  return FNORM_SUCCESS;
}

extern "C" fnorm_status fnorm_cuda_forward(const fnorm_problem *p, const fnorm_forward_args *a,
                                           void *stream) {
  DeviceInfo dev;
  fnorm_status s = device_info(&dev);
  if (s != FNORM_SUCCESS)
    return s;
  const void *row_ptrs[2] = {a->x, a->y};
  const int64_t strides[2] = {p->x_stride, p->y_stride};
  const void *params[2] = {a->gamma, a->beta};
  const int vec = choose_vec(p, row_ptrs, strides, 2, params, 2);
  const bool gamma_beta = a->gamma != NULL && a->beta != NULL;
  const Plan plan = plan_forward(p, vec, dev, a->x != a->y, gamma_beta);
  FwdParams k = {};
  k.x = a->x;
  k.y = a->y;
  k.gamma = a->gamma;
  k.beta = a->beta;
  k.mean = a->mean;
  k.rstd = a->rstd;
  k.rows = p->rows;
  k.cols = p->cols;
  k.x_stride = p->x_stride;
  k.y_stride = p->y_stride;
  k.eps = p->eps;
  k.layernorm = p->norm == FNORM_LAYERNORM;
  cudaStream_t st = (cudaStream_t)stream;
  auto launch = [&](const Plan &pl) {
    return by_dtype(p, [&](auto *t, auto *pt) {
      return launch_forward<std::remove_pointer_t<decltype(t)>,
                            std::remove_pointer_t<decltype(pt)>>(pl, k, st);
    });
  };
  s = launch(plan);
  /* The hold and spread kernels' cooperative launch needs every CTA it plans resident at once;
   * where the device refuses it (fewer SMs given to this process than it has, say), the rows go
   * to the kernel they take without it. */
  if (s != FNORM_SUCCESS && (plan.mode == MODE_HOLD || plan.mode == MODE_SPREAD))
    s = launch(plan_forward(p, vec, dev, false, gamma_beta));
  return s;
}

extern "C" fnorm_status fnorm_cuda_backward_workspace_size(const fnorm_problem *p, size_t *bytes) {
  DeviceInfo dev;
  fnorm_status s = device_info(&dev);
  if (s != FNORM_SUCCESS)
    return s;
  *bytes = backward_workspace_bytes(p, dev);
  return FNORM_SUCCESS;
}

extern "C" fnorm_status fnorm_cuda_backward(const fnorm_problem *p, const fnorm_backward_args *a,
                                            void *workspace, size_t workspace_bytes, void *stream) {
  DeviceInfo dev;
  fnorm_status s = device_info(&dev);
  if (s != FNORM_SUCCESS)
    return s;
  const bool from_y = a->x == nullptr;
  const void *xy = from_y ? a->y : a->x;
  const int64_t xy_stride = from_y ? p->y_stride : p->x_stride;
  const void *row_ptrs[3] = {a->dy, xy, a->dx};
  const int64_t strides[3] = {p->dy_stride, xy_stride, p->dx_stride};
  const void *params[2] = {a->gamma, from_y ? a->beta : nullptr};
  /* As the forward's: where the device refuses the hold tier's cooperative launch, the rows go to
   * the tier they take without it (launch_backward, before its finalize: nothing has run yet, so
   * an in-place dx has not overwritten dy). The hold plan's workspace covers that plan's. */
  Plan without_hold = {};
  Plan plan = plan_backward(p, choose_vec(p, row_ptrs, strides, 3, params, 2), dev, from_y, true,
                            &without_hold);
  if (from_y)
    plan_backward_from_y(plan, p, a->beta != nullptr, dev);
  if (plan.ws_bytes > workspace_bytes)
    return FNORM_ERR_WORKSPACE_TOO_SMALL;
  BwdParams k = {};
  k.dy = a->dy;
  k.xy = xy;
  k.mean = a->mean;
  k.rstd = a->rstd;
  k.gamma = a->gamma;
  k.beta = a->beta;
  k.dx = a->dx;
  k.rows = p->rows;
  k.cols = p->cols;
  k.dy_stride = p->dy_stride;
  k.xy_stride = xy_stride;
  k.dx_stride = p->dx_stride;
  k.layernorm = p->norm == FNORM_LAYERNORM;
  k.from_y = from_y ? (plan.fast_div ? 2 : 1) : 0;
  cudaStream_t st = (cudaStream_t)stream;
  const bool hold = plan.tier == TIER_ROW && plan.mode == MODE_HOLD;
  return by_dtype(p, [&](auto *t, auto *pt) {
    return launch_backward<std::remove_pointer_t<decltype(t)>, std::remove_pointer_t<decltype(pt)>>(
        plan, k, a->dgamma, a->dbeta, workspace, st, hold ? &without_hold : nullptr);
  });
}
