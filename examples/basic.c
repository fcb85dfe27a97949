/*
 * basic.c: LayerNorm forward and backward with fusednorm, on the CPU and, when a GPU is
 * usable, on CUDA too. Every call's status is checked.
 *
 *   cc -std=c99 basic.c $(pkg-config --cflags --libs fusednorm) -o basic && ./basic
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <fusednorm.h>
#ifdef FNORM_EXAMPLE_CUDA
#include <cuda_runtime_api.h>
#endif

#define ROWS 4
#define COLS 8

/* Stops the program with the library's own words if a call fails. */
#define CHECK(call)                                                                                \
  do {                                                                                             \
    fnorm_status status_ = (call);                                                                 \
    if (status_ != FNORM_SUCCESS) {                                                                \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,                           \
              fnorm_status_name(status_), fnorm_status_string(status_));                           \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

typedef struct results {
  float y[ROWS][COLS], mean[ROWS], rstd[ROWS];
  float dx[ROWS][COLS], dgamma[COLS], dbeta[COLS];
} results;

/* Forward then backward on the CPU: host pointers, synchronous. */
static void run_cpu(const fnorm_desc *desc, const float x[ROWS][COLS], const float *gamma,
                    const float *beta, const float dy[ROWS][COLS], results *out) {
  fnorm_forward_args fa = {0};
  fnorm_backward_args ba = {0};
  size_t ws_bytes = 0;
  void *ws = NULL;

  fa.x = x;
  fa.gamma = gamma;
  fa.beta = beta;
  fa.y = out->y;
  fa.mean = out->mean; /* training: keep mean and rstd for the backward */
  fa.rstd = out->rstd;
  CHECK(fnorm_forward(desc, &fa, NULL));

  /* Query, allocate, call: the workspace belongs to the caller. */
  CHECK(fnorm_backward_workspace_size(desc, &ws_bytes));
  if (ws_bytes > 0 && (ws = malloc(ws_bytes)) == NULL) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  ba.dy = dy;
  ba.x = x;
  ba.mean = out->mean;
  ba.rstd = out->rstd;
  ba.gamma = gamma;
  ba.dx = out->dx;
  ba.dgamma = out->dgamma;
  ba.dbeta = out->dbeta;
  CHECK(fnorm_backward(desc, &ba, ws, ws_bytes, NULL));
  free(ws);
}

#ifdef FNORM_EXAMPLE_CUDA
#define CUDA_CHECK(call)                                                                           \
  do {                                                                                             \
    cudaError_t err_ = (call);                                                                     \
    if (err_ != cudaSuccess) {                                                                     \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_));     \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* The same on the GPU: device pointers and a stream; the calls are asynchronous. */
static void run_cuda(const fnorm_desc *cpu_desc, const float x[ROWS][COLS], const float *gamma,
                     const float *beta, const float dy[ROWS][COLS], results *out) {
  fnorm_desc desc = *cpu_desc;
  fnorm_forward_args fa = {0};
  fnorm_backward_args ba = {0};
  cudaStream_t stream;
  float *d_x, *d_gamma, *d_beta, *d_y, *d_mean, *d_rstd, *d_dy, *d_dx, *d_dgamma, *d_dbeta;
  void *d_ws = NULL;
  size_t ws_bytes = 0, mat = sizeof(float) * ROWS * COLS;

  desc.device = FNORM_DEVICE_CUDA;
  CUDA_CHECK(cudaStreamCreate(&stream));
  CUDA_CHECK(cudaMalloc((void **)&d_x, mat));
  CUDA_CHECK(cudaMalloc((void **)&d_y, mat));
  CUDA_CHECK(cudaMalloc((void **)&d_dy, mat));
  CUDA_CHECK(cudaMalloc((void **)&d_dx, mat));
  CUDA_CHECK(cudaMalloc((void **)&d_gamma, sizeof(float) * COLS));
  CUDA_CHECK(cudaMalloc((void **)&d_beta, sizeof(float) * COLS));
  CUDA_CHECK(cudaMalloc((void **)&d_dgamma, sizeof(float) * COLS));
  CUDA_CHECK(cudaMalloc((void **)&d_dbeta, sizeof(float) * COLS));
  CUDA_CHECK(cudaMalloc((void **)&d_mean, sizeof(float) * ROWS));
  CUDA_CHECK(cudaMalloc((void **)&d_rstd, sizeof(float) * ROWS));
  CUDA_CHECK(cudaMemcpy(d_x, x, mat, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_dy, dy, mat, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_gamma, gamma, sizeof(float) * COLS, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_beta, beta, sizeof(float) * COLS, cudaMemcpyHostToDevice));

  fa.x = d_x;
  fa.gamma = d_gamma;
  fa.beta = d_beta;
  fa.y = d_y;
  fa.mean = d_mean;
  fa.rstd = d_rstd;
  CHECK(fnorm_forward(&desc, &fa, (void *)stream));

  CHECK(fnorm_backward_workspace_size(&desc, &ws_bytes));
  if (ws_bytes > 0)
    CUDA_CHECK(cudaMalloc(&d_ws, ws_bytes));
  ba.dy = d_dy;
  ba.x = d_x;
  ba.mean = d_mean;
  ba.rstd = d_rstd;
  ba.gamma = d_gamma;
  ba.dx = d_dx;
  ba.dgamma = d_dgamma;
  ba.dbeta = d_dbeta;
  CHECK(fnorm_backward(&desc, &ba, d_ws, ws_bytes, (void *)stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));

  CUDA_CHECK(cudaMemcpy(out->y, d_y, mat, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(out->dx, d_dx, mat, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(out->mean, d_mean, sizeof(float) * ROWS, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(out->rstd, d_rstd, sizeof(float) * ROWS, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(out->dgamma, d_dgamma, sizeof(float) * COLS, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(out->dbeta, d_dbeta, sizeof(float) * COLS, cudaMemcpyDeviceToHost));

  cudaFree(d_ws);
  cudaFree(d_x);
  cudaFree(d_y);
  cudaFree(d_dy);
  cudaFree(d_dx);
  cudaFree(d_gamma);
  cudaFree(d_beta);
  cudaFree(d_dgamma);
  cudaFree(d_dbeta);
  cudaFree(d_mean);
  cudaFree(d_rstd);
  cudaStreamDestroy(stream);
}

static float max_diff(const float *a, const float *b, int n) {
  float worst = 0.0f;
  int k;
  for (k = 0; k < n; k++)
    if (!(fabsf(a[k] - b[k]) <= worst))
      worst = fabsf(a[k] - b[k]);
  return worst;
}
#endif

int main(void) {
  static float x[ROWS][COLS], dy[ROWS][COLS], gamma[COLS], beta[COLS];
  static results cpu;
  fnorm_desc desc;
  int i, j, ok = 1;

  for (i = 0; i < ROWS; i++)
    for (j = 0; j < COLS; j++) {
      x[i][j] = (float)(i + 1) * 0.5f + (float)((j * 7 + i * 3) % 11) * 0.25f;
      dy[i][j] = (float)((j * 5 + i) % 7) * 0.1f - 0.3f;
    }
  for (j = 0; j < COLS; j++) {
    gamma[j] = 1.0f;
    beta[j] = 0.0f;
  }

  printf("fusednorm %s\n", fnorm_version_string());
  CHECK(fnorm_desc_init(&desc, FNORM_DEVICE_CPU, FNORM_LAYERNORM, FNORM_DTYPE_F32, ROWS, COLS));
  run_cpu(&desc, x, gamma, beta, dy, &cpu);

  /* With gamma = 1 and beta = 0 every row of y has mean 0 and variance var/(var + eps). */
  for (i = 0; i < ROWS; i++) {
    double m = 0.0, v = 0.0;
    for (j = 0; j < COLS; j++)
      m += cpu.y[i][j];
    m /= COLS;
    for (j = 0; j < COLS; j++)
      v += (cpu.y[i][j] - m) * (cpu.y[i][j] - m);
    v /= COLS;
    printf("row %d: mean %.5f rstd %.5f -> y mean %+.2e, y variance %.6f\n", i, cpu.mean[i],
           cpu.rstd[i], m, v);
    if (fabs(m) > 1e-5 || fabs(v - 1.0) > 1e-3)
      ok = 0;
  }
  printf("dgamma[0..3] = %.5f %.5f %.5f %.5f\n", cpu.dgamma[0], cpu.dgamma[1], cpu.dgamma[2],
         cpu.dgamma[3]);

  if (fnorm_device_available(FNORM_DEVICE_CUDA) == FNORM_SUCCESS) {
#ifdef FNORM_EXAMPLE_CUDA
    static results gpu;
    float worst;
    run_cuda(&desc, x, gamma, beta, dy, &gpu);
    worst = max_diff(&gpu.y[0][0], &cpu.y[0][0], ROWS * COLS);
    if (max_diff(&gpu.dx[0][0], &cpu.dx[0][0], ROWS * COLS) > worst)
      worst = max_diff(&gpu.dx[0][0], &cpu.dx[0][0], ROWS * COLS);
    if (max_diff(gpu.dgamma, cpu.dgamma, COLS) > worst)
      worst = max_diff(gpu.dgamma, cpu.dgamma, COLS);
    printf("CUDA: largest difference from the CPU over y, dx, dgamma: %.3g\n", worst);
    if (!(worst <= 1e-5f))
      ok = 0;
#endif
  } else {
    printf("CUDA: not available (%s)\n",
           fnorm_status_name(fnorm_device_available(FNORM_DEVICE_CUDA)));
  }
  printf("%s\n", ok ? "ok" : "unexpected results");
  return ok ? 0 : 1;
}
