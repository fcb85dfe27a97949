/*
 * bwdprobe: does a backward that reduces R rows behind one CTA barrier, instead of one, take
 * back the per-row cost that holds 16-bit LayerNorm rows of 5120-16384 at 84-88% of the copy
 * (RESULTS, "Backward, 16-bit rows the ring takes": the CTA-wide sum of a row cost the ring's
 * skeleton 14-16 points, the dgamma/dbeta accumulators 8-10)? A stand-alone tuning probe, not
 * part of the library.
 *
 * The kernel: bf16 LayerNorm backward from x (dx, and dgamma/dbeta partials), rows of exactly
 * T * VPT 16-byte vectors. Persistent CTAs of T threads; a round is R rows at once, each thread
 * owning the same VPT vectors of each of the R rows, so the R rows share the thread's fp32
 * dgamma/dbeta accumulators and one CTA barrier. Each thread copies its own vectors of the
 * round S - 1 ahead into shared memory with cp.async (no barrier: it reads back only what it
 * copied), and reads them there twice: once for the row sums and the accumulators, once for dx,
 * so that registers hold only gamma and the accumulators. The R rows' 2R sums meet in one
 * exchange a round (warp shuffles, one slot a warp, one __syncthreads, slots alternating).
 * Then one partial row a CTA, added by a finalize kernel in CTA order (deterministic).
 *
 * Checked against a double-precision host reference (dx of four rows, dgamma and dbeta of all
 * columns) before it is timed. Timed with CUDA events, 20 launches, median of 7, kernel plus
 * finalize, against cudaMemcpyAsync of the same bytes (3 * M * N * 2, read + written).
 *
 * Build: nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o bwdprobe bwdprobe.cu
 * Run:   ./bwdprobe > bwdprobe.csv
 *        (columns: n,rows,threads,vpt,rows_a_round,stages,gamma_smem,ctas_an_sm,us,gbps,
 *        pct_of_copy,check)
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                   \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

__device__ __forceinline__ unsigned smem_u32(const void *p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
/* 16 bytes global -> shared; src_bytes 0 fills zeros (a row past the last). */
__device__ __forceinline__ void cp16(void *dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ float bf_lo(uint32_t w) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf_hi(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack8(const uint4 v, float *f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = bf_lo(w[i]);
    f[2 * i + 1] = bf_hi(w[i]);
  }
}
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t *>(&h);
}

template <int R, int T, int VPT, int S, bool GSM>
__global__ void __launch_bounds__(T)
    bwd_batch(const uint4 *__restrict__ x, const uint4 *__restrict__ dy,
              const uint4 *__restrict__ gamma, const float *__restrict__ mean,
              const float *__restrict__ rstd, uint4 *__restrict__ dx, float *__restrict__ partial,
              int64_t rows, float inv_n) {
  static_assert(S >= 2, "a round ahead at least");
  constexpr int NV = T * VPT; /* 16-byte vectors a row */
  constexpr int W = T / 32;
  constexpr int EPT = VPT * 8;
  extern __shared__ __align__(16) uint4 stage[]; /* [S][R][2 (dy, x)][NV] */
  __shared__ float red[2][W][2 * R];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  auto slot = [&](int s, int j, int arr, int k) -> uint4 * {
    return stage + ((s * R + j) * 2 + arr) * NV + k * T + t;
  };
  const int64_t rounds = (rows + R - 1) / R;
  /* Copies the thread's vectors of round q into stage s, and returns its rows' mean and rstd. */
  float qmu[S][R], qrs[S][R];
  auto issue = [&](int s, int64_t q) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t row = q * R + j;
      const bool ok = q < rounds && row < rows;
      const int64_t rr = ok ? row : 0;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        cp16(slot(s, j, 0, k), dy + rr * NV + k * T + t, ok ? 16 : 0);
        cp16(slot(s, j, 1, k), x + rr * NV + k * T + t, ok ? 16 : 0);
      }
      const float m = ok ? mean[rr] : 0.f, r = ok ? rstd[rr] : 0.f;
#pragma unroll
      for (int u = 0; u < S; ++u) /* (a compile-time index: the queue stays in registers) */
        if (u == s)
          qmu[u][j] = m, qrs[u][j] = r;
    }
    cp_commit();
  };
  /* GSM: gamma as fp32 in shared memory after the stages, read there each pass, instead of
   * EPT registers a thread. */
  float *sgm = reinterpret_cast<float *>(stage + S * R * 2 * NV);
  float gm[GSM ? 1 : EPT], ag[EPT], ab[EPT];
  auto gam = [&](int k, int e) -> float {
    if constexpr (GSM)
      return sgm[(k * T + t) * 8 + e];
    else
      return gm[k * 8 + e];
  };
  if constexpr (GSM) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      float f[8];
      unpack8(gamma[k * T + t], f);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        sgm[(k * T + t) * 8 + e] = f[e]; /* (read back by this thread only) */
    }
  } else {
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      unpack8(gamma[k * T + t], &gm[k * 8]);
  }
#pragma unroll
  for (int e = 0; e < EPT; ++e)
    ag[e] = ab[e] = 0.f;
  const int64_t q0 = blockIdx.x, qstep = gridDim.x;
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    issue(s, q0 + s * qstep);
  int cur = 0, par = 0;
  for (int64_t q = q0; q < rounds; q += qstep) {
    /* Stage (cur + S - 1) % S held the round before this one, which this thread has read. */
    const int nxt = (cur + S - 1) % S;
    issue(nxt, q + (S - 1) * qstep);
    cp_wait<S - 1>(); /* this round's group has landed */
    float mu[R], rs[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      mu[j] = 0.f, rs[j] = 0.f;
#pragma unroll
      for (int s = 0; s < S; ++s)
        if (s == cur)
          mu[j] = qmu[s][j], rs[j] = qrs[s][j];
    }
    float sums[2 * R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        float d[8], xv[8];
        unpack8(*slot(cur, j, 0, k), d);
        unpack8(*slot(cur, j, 1, k), xv);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float xh = (xv[e] - mu[j]) * rs[j];
          const float g = d[e] * gam(k, e);
          s0 += g;
          s1 = fmaf(g, xh, s1);
          ag[k * 8 + e] = fmaf(d[e], xh, ag[k * 8 + e]);
          ab[k * 8 + e] += d[e];
        }
      }
      sums[2 * j] = s0;
      sums[2 * j + 1] = s1;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int i = 0; i < 2 * R; ++i)
        sums[i] += __shfl_xor_sync(0xffffffffu, sums[i], o);
    if (lane == 0)
#pragma unroll
      for (int i = 0; i < 2 * R; ++i)
        red[par][warp][i] = sums[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2 * R; ++i)
      sums[i] = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w)
#pragma unroll
      for (int i = 0; i < 2 * R; ++i)
        sums[i] += red[par][w][i];
    par ^= 1;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t row = q * R + j;
      if (row >= rows)
        break;
      const float f = rs[j] * inv_n, c0 = sums[2 * j] * f, c1 = sums[2 * j + 1] * f;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        float d[8], xv[8];
        unpack8(*slot(cur, j, 0, k), d);
        unpack8(*slot(cur, j, 1, k), xv);
        uint32_t o[4];
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          const float xa = (xv[e] - mu[j]) * rs[j], xb = (xv[e + 1] - mu[j]) * rs[j];
          const float ga = d[e] * gam(k, e), gb = d[e + 1] * gam(k, e + 1);
          o[e / 2] = pack2(fmaf(ga, rs[j], -fmaf(xa, c1, c0)), fmaf(gb, rs[j], -fmaf(xb, c1, c0)));
        }
        dx[row * NV + k * T + t] = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
    cur = (cur + 1) % S;
  }
  cp_wait<0>();
  float *pg = partial + (int64_t)blockIdx.x * NV * 8;
  float *pb = partial + ((int64_t)gridDim.x + blockIdx.x) * NV * 8;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    float4 *g4 = reinterpret_cast<float4 *>(pg + (int64_t)(k * T + t) * 8);
    float4 *b4 = reinterpret_cast<float4 *>(pb + (int64_t)(k * T + t) * 8);
    g4[0] = make_float4(ag[k * 8], ag[k * 8 + 1], ag[k * 8 + 2], ag[k * 8 + 3]);
    g4[1] = make_float4(ag[k * 8 + 4], ag[k * 8 + 5], ag[k * 8 + 6], ag[k * 8 + 7]);
    b4[0] = make_float4(ab[k * 8], ab[k * 8 + 1], ab[k * 8 + 2], ab[k * 8 + 3]);
    b4[1] = make_float4(ab[k * 8 + 4], ab[k * 8 + 5], ab[k * 8 + 6], ab[k * 8 + 7]);
  }
}

/* dgamma, dbeta (bf16) from the partial rows, added in CTA order. */
__global__ void finalize(const float *__restrict__ partial, int64_t nparts, int64_t cols,
                         __nv_bfloat16 *dg, __nv_bfloat16 *db) {
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols)
    return;
  float g = 0.f, b = 0.f;
  for (int64_t p = 0; p < nparts; ++p) {
    g += partial[p * cols + c];
    b += partial[(nparts + p) * cols + c];
  }
  dg[c] = __float2bfloat16(g);
  db[c] = __float2bfloat16(b);
}

static float bf2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

struct Problem {
  int64_t rows, cols;
  std::vector<uint16_t> hx, hdy, hg;
  std::vector<float> hmu, hrs;
  uint4 *x, *dy, *gamma, *dx;
  float *mean, *rstd;
  __nv_bfloat16 *dg, *db;
  std::vector<double> ref_dg, ref_db;
};

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <int R, int T, int VPT, int S, bool GSM = false>
static void run(Problem &p, double copy_gbps, int sms) {
  constexpr int NV = T * VPT;
  if (p.cols != (int64_t)NV * 8) {
    fprintf(stderr, "shape mismatch\n");
    exit(1);
  }
  auto k = bwd_batch<R, T, VPT, S, GSM>;
  const size_t smem = (size_t)S * R * 2 * NV * 16 + (GSM ? (size_t)NV * 32 : 0);
  if (smem > 227 * 1024) {
    fprintf(stderr, "skip T=%d VPT=%d R=%d S=%d: %zu bytes of shared memory\n", T, VPT, R, S, smem);
    return;
  }
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, T, smem));
  if (per_sm < 1) {
    fprintf(stderr, "skip T=%d VPT=%d R=%d S=%d: not resident\n", T, VPT, R, S);
    return;
  }
  const int64_t rounds = (p.rows + R - 1) / R;
  const int grid = (int)std::min<int64_t>((int64_t)sms * per_sm, rounds);
  float *partial;
  CK(cudaMalloc(&partial, (size_t)2 * grid * p.cols * 4));
  const float inv_n = 1.f / (float)p.cols;
  auto launch = [&]() {
    k<<<grid, T, smem>>>(p.x, p.dy, p.gamma, p.mean, p.rstd, p.dx, partial, p.rows, inv_n);
    finalize<<<(unsigned)((p.cols + 255) / 256), 256>>>(partial, grid, p.cols, p.dg, p.db);
  };
  /* check */
  CK(cudaMemset(p.dx, 0xff, (size_t)p.rows * p.cols * 2));
  CK(cudaMemset(p.dg, 0xff, (size_t)p.cols * 2));
  CK(cudaMemset(p.db, 0xff, (size_t)p.cols * 2));
  launch();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  double worst = 0.0;
  {
    std::vector<uint16_t> dgo(p.cols), dbo(p.cols), row(p.cols);
    CK(cudaMemcpy(dgo.data(), p.dg, p.cols * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dbo.data(), p.db, p.cols * 2, cudaMemcpyDeviceToHost));
    for (int64_t c = 0; c < p.cols; ++c) {
      worst =
          std::max(worst, std::fabs(bf2f(dgo[c]) - p.ref_dg[c]) / (std::fabs(p.ref_dg[c]) + 1.0));
      worst =
          std::max(worst, std::fabs(bf2f(dbo[c]) - p.ref_db[c]) / (std::fabs(p.ref_db[c]) + 1.0));
    }
    const int64_t check_rows[4] = {0, 1, p.rows / 2 + 1, p.rows - 1};
    for (int64_t r : check_rows) {
      CK(cudaMemcpy(row.data(), (const char *)p.dx + r * p.cols * 2, p.cols * 2,
                    cudaMemcpyDeviceToHost));
      double s0 = 0, s1 = 0;
      const double mu = p.hmu[r], rs = p.hrs[r];
      for (int64_t c = 0; c < p.cols; ++c) {
        const double xh = (bf2f(p.hx[r * p.cols + c]) - mu) * rs;
        const double g = bf2f(p.hdy[r * p.cols + c]) * (double)bf2f(p.hg[c]);
        s0 += g;
        s1 += g * xh;
      }
      for (int64_t c = 0; c < p.cols; ++c) {
        const double xh = (bf2f(p.hx[r * p.cols + c]) - mu) * rs;
        const double g = bf2f(p.hdy[r * p.cols + c]) * (double)bf2f(p.hg[c]);
        const double ref = rs * (g - (s0 + xh * s1) / (double)p.cols);
        worst = std::max(worst, std::fabs(bf2f(row[c]) - ref) / (std::fabs(ref) + 1.0));
      }
    }
  }
  const bool ok = worst < 2e-2;
  /* time */
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> ts;
  for (int rep = 0; rep < 7; ++rep) {
    launch();
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 20; ++i)
      launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms * 1000.0 / 20);
  }
  const double us = median(ts);
  const double gbps = 3.0 * p.rows * p.cols * 2 / (us * 1e3);
  printf("%lld,%lld,%d,%d,%d,%d,%d,%d,%.2f,%.1f,%.2f,%s %.2g\n", (long long)p.cols,
         (long long)p.rows, T, VPT, R, S, (int)GSM, per_sm, us, gbps, 100.0 * gbps / copy_gbps,
         ok ? "ok" : "FAIL", worst);
  fflush(stdout);
  CK(cudaFree(partial));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

static double copy_gbps_of(size_t bytes_a_side) {
  void *a, *b;
  CK(cudaMalloc(&a, bytes_a_side));
  CK(cudaMalloc(&b, bytes_a_side));
  CK(cudaMemset(a, 1, bytes_a_side));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> ts;
  for (int rep = 0; rep < 7; ++rep) {
    CK(cudaMemcpyAsync(b, a, bytes_a_side, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 20; ++i)
      CK(cudaMemcpyAsync(b, a, bytes_a_side, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms * 1000.0 / 20);
  }
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return 2.0 * bytes_a_side / (median(ts) * 1e3);
}

static void setup(Problem &p, int64_t cols, int64_t elements) {
  p.cols = cols;
  p.rows = elements / cols;
  const int64_t n = p.rows * cols;
  p.hx.resize(n);
  p.hdy.resize(n);
  p.hg.resize(cols);
  p.hmu.resize(p.rows);
  p.hrs.resize(p.rows);
  uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)cols;
  auto rnd = [&]() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return (double)(s >> 11) * (1.0 / 9007199254740992.0);
  };
  for (int64_t c = 0; c < cols; ++c)
    p.hg[c] = f2bf((float)(0.5 + rnd()));
  for (int64_t i = 0; i < n; ++i) {
    p.hx[i] = f2bf((float)(4.0 * rnd() - 2.0 + 0.5));
    p.hdy[i] = f2bf((float)(2.0 * rnd() - 1.0));
  }
  p.ref_dg.assign(cols, 0.0);
  p.ref_db.assign(cols, 0.0);
  for (int64_t r = 0; r < p.rows; ++r) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < cols; ++c)
      m += bf2f(p.hx[r * cols + c]);
    m /= cols;
    for (int64_t c = 0; c < cols; ++c) {
      const double d = bf2f(p.hx[r * cols + c]) - m;
      v += d * d;
    }
    v /= cols;
    p.hmu[r] = (float)m;
    p.hrs[r] = (float)(1.0 / std::sqrt(v + 1e-5));
    for (int64_t c = 0; c < cols; ++c) {
      const double xh = (bf2f(p.hx[r * cols + c]) - (double)p.hmu[r]) * p.hrs[r];
      const double d = bf2f(p.hdy[r * cols + c]);
      p.ref_dg[c] += d * xh;
      p.ref_db[c] += d;
    }
  }
  CK(cudaMalloc(&p.x, n * 2));
  CK(cudaMalloc(&p.dy, n * 2));
  CK(cudaMalloc(&p.dx, n * 2));
  CK(cudaMalloc(&p.gamma, cols * 2));
  CK(cudaMalloc(&p.mean, p.rows * 4));
  CK(cudaMalloc(&p.rstd, p.rows * 4));
  CK(cudaMalloc(&p.dg, cols * 2));
  CK(cudaMalloc(&p.db, cols * 2));
  CK(cudaMemcpy(p.x, p.hx.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(p.dy, p.hdy.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(p.gamma, p.hg.data(), cols * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(p.mean, p.hmu.data(), p.rows * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(p.rstd, p.hrs.data(), p.rows * 4, cudaMemcpyHostToDevice));
}

static void teardown(Problem &p) {
  CK(cudaFree(p.x));
  CK(cudaFree(p.dy));
  CK(cudaFree(p.dx));
  CK(cudaFree(p.gamma));
  CK(cudaFree(p.mean));
  CK(cudaFree(p.rstd));
  CK(cudaFree(p.dg));
  CK(cudaFree(p.db));
}

/* Sets up rows of `cols` (2^27 elements), measures the copy of their bytes, runs `body` on
 * them and frees them. */
template <class F> static void with_rows(int64_t cols, F body) {
  Problem p;
  setup(p, cols, (int64_t)1 << 27);
  body(p, copy_gbps_of((size_t)3 * p.rows * p.cols));
  teardown(p);
}

/* The shapes of both calls that wrote results/h200-bwdprobe.csv (its `call` column). */
int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  printf(
      "n,rows,threads,vpt,rows_a_round,stages,gamma_smem,ctas_an_sm,us,gbps,pct_of_copy,check\n");
  with_rows(4096, [&](Problem &p, double cp) {
    run<1, 256, 2, 2>(p, cp, sms);
    run<2, 256, 2, 2>(p, cp, sms);
    run<4, 256, 2, 2>(p, cp, sms);
    run<2, 128, 4, 2>(p, cp, sms);
  });
  with_rows(5120, [&](Problem &p, double cp) {
    run<1, 320, 2, 2>(p, cp, sms);
    run<1, 320, 2, 3>(p, cp, sms);
    run<2, 320, 2, 2>(p, cp, sms);
    run<3, 320, 2, 2>(p, cp, sms);
    run<4, 320, 2, 2>(p, cp, sms);
    run<4, 320, 2, 2, true>(p, cp, sms);
    run<5, 320, 2, 2>(p, cp, sms);
    run<2, 320, 2, 3>(p, cp, sms);
    run<3, 320, 2, 3>(p, cp, sms);
    run<2, 160, 4, 2>(p, cp, sms);
    run<4, 160, 4, 2>(p, cp, sms);
    run<4, 160, 4, 2, true>(p, cp, sms);
    run<2, 640, 1, 2>(p, cp, sms);
  });
  with_rows(8192, [&](Problem &p, double cp) {
    run<1, 512, 2, 2>(p, cp, sms);
    run<1, 512, 2, 3>(p, cp, sms);
    run<2, 512, 2, 2>(p, cp, sms);
    run<3, 512, 2, 2, true>(p, cp, sms);
    run<2, 256, 4, 2>(p, cp, sms);
    run<2, 256, 4, 2, true>(p, cp, sms);
    run<2, 256, 4, 3>(p, cp, sms);
    run<3, 256, 4, 2>(p, cp, sms);
    run<2, 128, 8, 2, true>(p, cp, sms);
    run<1, 1024, 1, 2>(p, cp, sms);
  });
  with_rows(16384, [&](Problem &p, double cp) {
    run<1, 1024, 2, 2>(p, cp, sms);
    run<1, 1024, 2, 3>(p, cp, sms);
    run<1, 512, 4, 3>(p, cp, sms);
    run<1, 512, 4, 3, true>(p, cp, sms);
    run<1, 256, 8, 3, true>(p, cp, sms);
    run<1, 256, 8, 2, true>(p, cp, sms);
  });
  return 0;
}
