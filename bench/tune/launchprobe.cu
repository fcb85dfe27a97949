/*
 * launchprobe: where the 16-bit rows form's fixed 2.5-3.8 us a launch against cudaMemcpy goes
 * (RESULTS, "A launch's fixed cost"). A stand-alone tuning probe, not part of the library: it
 * times, at several sizes, cudaMemcpyAsync against copy kernels of our own in different launch
 * shapes, and against kernels of the rows form's shape (one-warp CTAs, R rows a CTA, VPL
 * 16-byte vectors a lane, every row's loads first) that copy, or scale each row by its
 * RMSNorm rstd (a warp's sum of squares), in CTAs of one or four warps. If a copy kernel of
 * the rows form's shape loses the same fixed time, the shape costs it; if only the kernel with
 * the row sum does, the reduction's latency at the start and the end of a launch does.
 *
 * Build: nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o launchprobe launchprobe.cu
 * Run:   ./launchprobe > probe.csv   (columns: kernel,bytes_a_side,us,gbps,pct_of_memcpy)
 *        ./launchprobe inflight > inflight.csv   (2^28 bytes a side; the copies' and the rows
 *        shape's CTAs an SM capped by dynamic shared memory: bytes in flight an SM against time)
 *        ./launchprobe packed > packed.csv   (a packed rows form of LayerNorm and RMSNorm, bf16
 *        rows of 4096-8192, against the copy)
 *        ./launchprobe packed_cta > packed_cta.csv   (the packed form over 2-16 warps a row,
 *        bf16 rows of 8192-32768)
 *        ./launchprobe f32_cta > f32_cta.csv   (the same shape for fp32 rows of 2048-32768)
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                   \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* Persistent grid-stride copy, four vectors a thread an iteration, loads before stores. */
__global__ void gs_copy(const uint4 *__restrict__ s, uint4 *__restrict__ d, int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v0 = s[i], v1 = s[i + stride], v2 = s[i + 2 * stride], v3 = s[i + 3 * stride];
    d[i] = v0;
    d[i + stride] = v1;
    d[i + 2 * stride] = v2;
    d[i + 3 * stride] = v3;
  }
  for (; i < n; i += stride)
    d[i] = s[i];
}

/* Persistent grid-stride copy, one vector a thread an iteration. */
__global__ void gs_copy1(const uint4 *__restrict__ s, uint4 *__restrict__ d, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    d[i] = s[i];
}

/* Non-persistent copy: each thread V vectors of consecutive 256-thread slices. */
template <int V>
__global__ void flat_copy(const uint4 *__restrict__ s, uint4 *__restrict__ d, int64_t n) {
  const int64_t base = (int64_t)blockIdx.x * blockDim.x * V + threadIdx.x;
  uint4 v[V];
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (base + k * blockDim.x < n)
      v[k] = s[base + k * blockDim.x];
#pragma unroll
  for (int k = 0; k < V; ++k)
    if (base + k * blockDim.x < n)
      d[base + k * blockDim.x] = v[k];
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* The rows form's shape: each warp R rows of 32 * VPL vectors at a time (bf16, 8 a vector);
 * CTAs of W warps. MATH: y = x * rstd of the row (fp32), else a plain copy. */
template <int VPL, int R, int W, bool MATH>
__global__ void __launch_bounds__(32 * W)
    rows_kernel(const uint4 *__restrict__ s, uint4 *__restrict__ d, int64_t rows, float inv_n) {
  constexpr int VPR = 32 * VPL; /* vectors a row */
  const int lane = threadIdx.x % 32;
  const int64_t row0 = ((int64_t)blockIdx.x * W + threadIdx.x / 32) * R;
  if (row0 >= rows)
    return;
  uint4 v[R][VPL];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r < rows ? row0 + r : rows - 1;
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      v[r][k] = s[row * VPR + k * 32 + lane];
  }
  float scale[R];
  if constexpr (MATH) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < VPL; ++k) {
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v[r][k]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(h[e]);
          acc = fmaf(f.x, f.x, fmaf(f.y, f.y, acc));
        }
      }
      scale[r] = acc;
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
      scale[r] = rsqrtf(warp_sum(scale[r]) * inv_n + 1e-5f);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (row0 + r >= rows)
      break;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      uint4 o = v[r][k];
      if constexpr (MATH) {
        __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&o);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float2 f = __bfloat1622float2(h[e]);
          h[e] = __floats2bfloat162_rn(f.x * scale[r], f.y * scale[r]);
        }
      }
      d[(row0 + r) * VPR + k * 32 + lane] = o;
    }
  }
}

/* bf16 pair -> floats, in a different instruction sequence on each pass (PASS 0: shift and mask,
 * 1: byte permutes, 2: cvt), so that ptxas does not keep one pass's floats for the next (the
 * same sequence each time took the rows of 5120 and 8192 to 255 registers and spills) */
template <int PASS> __device__ __forceinline__ float2 bf2f(uint32_t w) {
  if constexpr (PASS == 0) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else if constexpr (PASS == 1) {
    return make_float2(__uint_as_float(__byte_perm(w, 0u, 0x1044)),
                       __uint_as_float(__byte_perm(w, 0u, 0x3244)));
  } else {
    float a, b;
    asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.bf16 %0, l;\n cvt.f32.bf16 %1, h;}"
        : "=f"(a), "=f"(b)
        : "r"(w));
    return make_float2(a, b);
  }
}

/* A lane's sums of (x - m) and of (x - m)^2 over its packed bf16 words (sequence PASS); with m
 * 0, its sum and its sum of squares (the one not used is not computed). */
template <int VPL, int PASS>
__device__ __forceinline__ float2 packed_centred(const uint4 (&v)[VPL], float m) {
  float c0 = 0.f, c1 = 0.f, q0 = 0.f, q1 = 0.f;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const uint32_t *w = &v[k].x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = bf2f<PASS>(w[e]);
      const float dx = f.x - m, dy = f.y - m;
      c0 += dx;
      c1 += dy;
      q0 = fmaf(dx, dx, q0);
      q1 = fmaf(dy, dy, q1);
    }
  }
  return make_float2(c0 + c1, q0 + q1);
}

/* Both of a pair summed over the warp. */
__device__ __forceinline__ float2 warp_sum2(float2 t) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    t.x += __shfl_xor_sync(0xffffffffu, t.x, o);
    t.y += __shfl_xor_sync(0xffffffffu, t.y, o);
  }
  return t;
}

/* A 16-byte vector read where it stands (volatile: not hoisted with the rest of the row's). */
__device__ __forceinline__ uint4 load_in_place(const uint4 *p) {
  uint4 u;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "l"(p));
  return u;
}

/* y of a packed bf16 vector x: ((x - sub) * rstd + shift) * g + b, stored where it stands. */
__device__ __forceinline__ void store_y_packed(const uint4 &x, const uint4 &g4, const uint4 &b4,
                                               float sub, float rstd, float shift, uint4 *dst) {
  const uint32_t *w = &x.x, *gw = &g4.x, *bw = &b4.x;
  uint4 o;
  uint32_t *ow = &o.x;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = bf2f<2>(w[e]), g = bf2f<0>(gw[e]), b = bf2f<0>(bw[e]);
    const __nv_bfloat162 h = __floats2bfloat162_rn(fmaf(fmaf(f.x - sub, rstd, shift), g.x, b.x),
                                                   fmaf(fmaf(f.y - sub, rstd, shift), g.y, b.y));
    ow[e] = *reinterpret_cast<const uint32_t *>(&h);
  }
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(o.x), "r"(o.y), "r"(o.z),
               "r"(o.w)
               : "memory");
}

/* A row of 32 * VPL bf16 vectors a warp, W warps a CTA, the row held packed (bf16, 4 registers
 * a vector) and converted on each pass: LayerNorm (LN: the mean, then the centred squares and
 * their sum's correction) or RMSNorm, gamma and beta (GB) read per row (from L1) or not, mean
 * and rstd stored by lane 0. What a packed rows form would cost against the copy. */
template <int VPL, int W, bool LN, bool GB, bool ACC = false>
__global__ void __launch_bounds__(32 * W)
    rows_norm_packed(const uint4 *__restrict__ s, uint4 *__restrict__ d,
                     const uint4 *__restrict__ gamma, const uint4 *__restrict__ beta,
                     float *__restrict__ stats, int64_t rows, float inv_n) {
  constexpr int VPR = 32 * VPL;
  const int lane = threadIdx.x % 32;
  const int64_t row = (int64_t)blockIdx.x * W + threadIdx.x / 32;
  if (row >= rows)
    return;
  uint4 v[VPL];
#pragma unroll
  for (int k = 0; k < VPL; ++k)
    v[k] = s[row * VPR + k * 32 + lane];
  float mean = 0.f, rstd, m1 = 0.f, cm_out = 0.f;
  if constexpr (LN) {
    mean = warp_sum(packed_centred<VPL, 0>(v, 0.f).x) * inv_n;
    const float2 cq = warp_sum2(packed_centred<VPL, 1>(v, mean));
    const float c = cq.x, q = cq.y;
    const float cm = c * inv_n;
    m1 = mean;
    cm_out = cm;
    mean += cm;
    rstd = rsqrtf(fmaxf(q * inv_n - cm * cm, 0.f) + 1e-5f);
  } else { /* the sum of squares: packed_centred about 0 (its other sum unused) */
    rstd = rsqrtf(warp_sum(packed_centred<VPL, 0>(v, 0.f).y) * inv_n + 1e-5f);
  }
  if (lane == 0) {
    stats[2 * row] = mean;
    stats[2 * row + 1] = rstd;
  }
  /* ACC: y from (x - m1) - c, as the library computes it (exact centring); else x * rstd -
   * mean * rstd in one FMA, which loses the centring's accuracy on offset rows */
  const float shift = ACC ? -cm_out * rstd : -mean * rstd;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    uint4 g4 = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u),
          b4 = make_uint4(0, 0, 0, 0);
    if constexpr (GB) { /* loaded where used, not all hoisted to the top */
      g4 = load_in_place(gamma + k * 32 + lane);
      b4 = load_in_place(beta + k * 32 + lane);
    }
    /* (sub 0: f - 0.f is f, exactly) */
    store_y_packed(v[k], g4, b4, ACC ? m1 : 0.f, rstd, shift, d + row * VPR + k * 32 + lane);
  }
}

/* The packed rows form over WPR warps a row (a CTA a row): each warp VPL vectors a lane of the
 * row's 32 * VPL * WPR, the warps' sums met in shared memory behind a barrier (two for
 * LayerNorm). Accurate form ((x - m1) - c). RMS: RMSNorm. */
template <int VPL, int WPR, bool RMS>
__global__ void __launch_bounds__(32 * WPR)
    rows_norm_packed_cta(const uint4 *__restrict__ s, uint4 *__restrict__ d,
                         const uint4 *__restrict__ gamma, const uint4 *__restrict__ beta,
                         float *__restrict__ stats, int64_t rows, float inv_n) {
  constexpr int VPR = 32 * VPL * WPR;
  __shared__ float red[2][2][WPR];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = blockIdx.x;
  uint4 v[VPL];
#pragma unroll
  for (int k = 0; k < VPL; ++k)
    v[k] = s[row * VPR + (k * WPR + warp) * 32 + lane];
  float m1 = 0.f, rstd, cm = 0.f;
  if constexpr (!RMS) {
    float t = warp_sum(packed_centred<VPL, 0>(v, 0.f).x);
    if (lane == 0)
      red[0][0][warp] = t;
    __syncthreads();
    t = 0.f;
#pragma unroll
    for (int i = 0; i < WPR; ++i)
      t += red[0][0][i];
    m1 = t * inv_n;
  }
  float2 cq = warp_sum2(packed_centred<VPL, 1>(v, m1));
  float c = cq.x, q = cq.y;
  if (lane == 0) {
    red[1][0][warp] = c;
    red[1][1][warp] = q;
  }
  __syncthreads();
  c = q = 0.f;
#pragma unroll
  for (int i = 0; i < WPR; ++i) {
    c += red[1][0][i];
    q += red[1][1][i];
  }
  if constexpr (RMS) {
    rstd = rsqrtf(q * inv_n + 1e-5f);
  } else {
    cm = c * inv_n;
    rstd = rsqrtf(fmaxf(q * inv_n - cm * cm, 0.f) + 1e-5f);
  }
  if (threadIdx.x == 0) {
    stats[2 * row] = m1 + cm;
    stats[2 * row + 1] = rstd;
  }
  const float shift = -cm * rstd;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int vi = (k * WPR + warp) * 32 + lane;
    store_y_packed(v[k], load_in_place(gamma + vi), load_in_place(beta + vi), RMS ? 0.f : m1, rstd,
                   shift, d + row * VPR + vi);
  }
}

/* fp32 rows in registers, a CTA of WPR warps a row, VPL float4s a lane (vector (k * WPR + warp)
 * * 32 + lane), gamma/beta read where y is computed and y stored in place (volatile), LayerNorm
 * in the accurate form ((x - m1) - c) or RMSNorm: the packed form's shape for fp32 rows. */
__device__ __forceinline__ float4 load4_in_place(const float4 *p) {
  float4 u;
  asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(u.x), "=f"(u.y), "=f"(u.z), "=f"(u.w)
               : "l"(p));
  return u;
}

template <int VPL, int WPR, bool RMS>
__global__ void __launch_bounds__(32 * WPR)
    rows_norm_f32_cta(const float4 *__restrict__ s, float4 *__restrict__ d,
                      const float4 *__restrict__ gamma, const float4 *__restrict__ beta,
                      float *__restrict__ stats, int64_t rows, float inv_n) {
  constexpr int VPR = 32 * VPL * WPR;
  __shared__ float red[3][WPR];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = blockIdx.x;
  float4 v[VPL];
#pragma unroll
  for (int k = 0; k < VPL; ++k)
    v[k] = s[row * VPR + (k * WPR + warp) * 32 + lane];
  float m1 = 0.f;
  if constexpr (!RMS) {
    float a = 0.f;
#pragma unroll
    for (int k = 0; k < VPL; ++k)
      a += (v[k].x + v[k].y) + (v[k].z + v[k].w);
    a = warp_sum(a);
    if (lane == 0)
      red[0][warp] = a;
    __syncthreads();
    a = 0.f;
#pragma unroll
    for (int i = 0; i < WPR; ++i)
      a += red[0][i];
    m1 = a * inv_n;
  }
  float c = 0.f, q = 0.f;
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const float e[4] = {v[k].x - m1, v[k].y - m1, v[k].z - m1, v[k].w - m1};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      c += e[j];
      q = fmaf(e[j], e[j], q);
    }
  }
  const float2 cq = warp_sum2(make_float2(c, q));
  if (lane == 0) {
    red[1][warp] = cq.x;
    red[2][warp] = cq.y;
  }
  __syncthreads();
  c = q = 0.f;
#pragma unroll
  for (int i = 0; i < WPR; ++i) {
    c += red[1][i];
    q += red[2][i];
  }
  const float cm = RMS ? 0.f : c * inv_n;
  const float rstd = rsqrtf(fmaxf(q * inv_n - cm * cm, 0.f) + 1e-5f), shift = -cm * rstd;
  if (threadIdx.x == 0) {
    stats[2 * row] = m1 + cm;
    stats[2 * row + 1] = rstd;
  }
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int vi = (k * WPR + warp) * 32 + lane;
    const float4 g = load4_in_place(gamma + vi), b = load4_in_place(beta + vi);
    float4 o;
    o.x = fmaf(fmaf(v[k].x - m1, rstd, shift), g.x, b.x);
    o.y = fmaf(fmaf(v[k].y - m1, rstd, shift), g.y, b.y);
    o.z = fmaf(fmaf(v[k].z - m1, rstd, shift), g.z, b.z);
    o.w = fmaf(fmaf(v[k].w - m1, rstd, shift), g.w, b.w);
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(d + row * VPR + vi), "f"(o.x),
                 "f"(o.y), "f"(o.z), "f"(o.w)
                 : "memory");
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
};

/* Median over 9 timings of 10 launches each, after 3 warm-up launches: us a launch. */
template <typename F> static double time_us(F launch) {
  static Timer t;
  for (int i = 0; i < 3; ++i)
    launch();
  CK(cudaDeviceSynchronize());
  std::vector<double> v;
  for (int rep = 0; rep < 9; ++rep) {
    CK(cudaEventRecord(t.a));
    for (int i = 0; i < 10; ++i)
      launch();
    CK(cudaEventRecord(t.b));
    CK(cudaEventSynchronize(t.b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t.a, t.b));
    v.push_back(ms * 1000.0 / 10);
  }
  CK(cudaGetLastError());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static __global__ void fill(uint16_t *p, int64_t n, uint32_t seed) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    /* a bf16 in [1, 2) with a random mantissa and sign */
    p[i] = (uint16_t)(0x3f80u | (h & 0x7fu) | ((h >> 8) & 0x8000u));
  }
}

/* Resident CTAs an SM of a kernel with `smem` bytes of dynamic shared memory (which is how the
 * in-flight mode caps them). */
template <typename K> static int per_sm(K kernel, int threads, size_t smem) {
  int n = 0;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  return n;
}

/* Dynamic shared memory that caps a kernel at `ctas` CTAs an SM (0: no cap). */
static size_t smem_for(int ctas) {
  return ctas ? (size_t)(225 * 1024 / ctas) & ~(size_t)1023 : 0;
}

/* cudaMemcpyAsync of `bytes` device to device: us a copy (time_us). */
static double memcpy_us(void *dst, const void *src, int64_t bytes) {
  return time_us([&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
}

/* A row of the packed modes' CSV (kernel,n,us,pct_of_copy), against the copy's us. */
static void print_row(const char *name, int64_t n, double us, double copy_us) {
  printf("%s,%lld,%.2f,%.2f\n", name, (long long)n, us, 100.0 * copy_us / us);
  fflush(stdout);
}

/* The in-flight mode: copies of 2^28 bytes a side (2^27 bf16) in shapes that hold different
 * bytes in flight an SM (resident threads x vectors a thread x 16). */
static void inflight(void *src, void *dst, int sms) {
  const int64_t bytes = (int64_t)1 << 28;
  const uint4 *s = (const uint4 *)src;
  uint4 *d = (uint4 *)dst;
  const int64_t nvec = bytes / 16, rows512 = bytes / 2 / 512;
  const double ref = memcpy_us(dst, src, bytes);
  printf("kernel,ctas_an_sm_cap,ctas_an_sm,kib_in_flight_an_sm,us,pct_of_memcpy\n");
  printf("memcpy,0,0,0,%.2f,100.00\n", ref);
  auto row = [&](const char *name, int cap, int resident, double kib, double us) {
    printf("%s,%d,%d,%.0f,%.2f,%.2f\n", name, cap, resident, kib, us, 100.0 * ref / us);
    fflush(stdout);
  };
  for (int cap : {0, 6, 4, 3, 2}) {
    const size_t sm = smem_for(cap);
    int r = per_sm(flat_copy<1>, 256, sm);
    row("flat_copy_v1", cap, r, r * 256 * 16 / 1024.0,
        time_us([&] { flat_copy<1><<<(unsigned)((nvec + 255) / 256), 256, sm>>>(s, d, nvec); }));
    r = per_sm(flat_copy<2>, 256, sm);
    row("flat_copy_v2", cap, r, r * 256 * 32 / 1024.0,
        time_us([&] { flat_copy<2><<<(unsigned)((nvec + 511) / 512), 256, sm>>>(s, d, nvec); }));
    r = per_sm(flat_copy<4>, 256, sm);
    row("flat_copy_v4", cap, r, r * 256 * 64 / 1024.0,
        time_us([&] { flat_copy<4><<<(unsigned)((nvec + 1023) / 1024), 256, sm>>>(s, d, nvec); }));
    r = per_sm(gs_copy1, 256, sm);
    row("gs_copy1", cap, r, r * 256 * 16 / 1024.0,
        time_us([&] { gs_copy1<<<r * sms, 256, sm>>>(s, d, nvec); }));
  }
  for (int cap : {0, 24, 16, 12, 8}) {
    const size_t sm = smem_for(cap);
    int r = per_sm(rows_kernel<2, 1, 1, false>, 32, sm);
    row("rows512_copy_r1", cap, r, r * 1.0, time_us([&] {
          rows_kernel<2, 1, 1, false><<<(unsigned)rows512, 32, sm>>>(s, d, rows512, 1.f / 512);
        }));
    r = per_sm(rows_kernel<2, 2, 1, false>, 32, sm);
    row("rows512_copy_r2", cap, r, r * 2.0, time_us([&] {
          rows_kernel<2, 2, 1, false>
              <<<(unsigned)((rows512 + 1) / 2), 32, sm>>>(s, d, rows512, 1.f / 512);
        }));
    r = per_sm(rows_kernel<2, 4, 1, false>, 32, sm);
    row("rows512_copy_r4", cap, r, r * 4.0, time_us([&] {
          rows_kernel<2, 4, 1, false>
              <<<(unsigned)((rows512 + 3) / 4), 32, sm>>>(s, d, rows512, 1.f / 512);
        }));
    r = per_sm(rows_kernel<2, 4, 1, true>, 32, sm);
    row("rows512_rms_r4", cap, r, r * 4.0, time_us([&] {
          rows_kernel<2, 4, 1, true>
              <<<(unsigned)((rows512 + 3) / 4), 32, sm>>>(s, d, rows512, 1.f / 512);
        }));
  }
}

/* gamma then beta, `cols` random bf16 each, and room for `rows` rows' mean and rstd. */
static void alloc_params(int64_t cols, int64_t rows, uint4 **gb, float **stats) {
  CK(cudaMalloc(gb, 2 * cols * 2));
  CK(cudaMalloc(stats, rows * 2 * sizeof(float)));
  fill<<<64, 256>>>((uint16_t *)*gb, 2 * cols, 777u);
}

/* The packed mode: rows of 4096, 5120 and 8192 bf16 (2^27 elements), LayerNorm and RMSNorm in
 * the packed rows form, with and without gamma/beta, in CTAs of 1 and 4 warps. */
static void packed(void *src, void *dst, int sms, bool one) {
  (void)sms;
  const int64_t bytes = (int64_t)1 << 28;
  const uint4 *s = (const uint4 *)src;
  uint4 *d = (uint4 *)dst;
  uint4 *gb = nullptr;
  float *stats = nullptr;
  alloc_params(8192, bytes / 2 / 4096, &gb, &stats);
  const double ref = memcpy_us(dst, src, bytes);
  const double ref2 =
      memcpy_us(dst, src, bytes - (1 << 20)) * (double)bytes / (double)(bytes - (1 << 20));
  const double best = ref < ref2 ? ref : ref2;
  printf("kernel,n,us,pct_of_copy\n");
  print_row("memcpy", 0, ref, best);
  /* the worst error of y's row 1 against a double reference, in bf16 units of y's magnitude */
  auto check = [&](int n, bool ln, bool with_gb) {
    std::vector<uint16_t> hx(n), hy(n), hg(n), hb(n);
    CK(cudaMemcpy(hx.data(), (const uint16_t *)src + n, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hy.data(), (const uint16_t *)dst + n, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hg.data(), gb, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), (const uint16_t *)gb + 8192, n * 2, cudaMemcpyDeviceToHost));
    auto f = [](uint16_t u) {
      uint32_t w = (uint32_t)u << 16;
      float r;
      memcpy(&r, &w, 4);
      return (double)r;
    };
    double m = 0, q = 0;
    for (int i = 0; i < n; ++i)
      m += f(hx[i]);
    m = ln ? m / n : 0;
    for (int i = 0; i < n; ++i)
      q += (f(hx[i]) - m) * (f(hx[i]) - m);
    const double r = 1 / sqrt(q / n + 1e-5);
    double worst = 0;
    for (int i = 0; i < n; ++i) {
      const double ref = (f(hx[i]) - m) * r * (with_gb ? f(hg[i]) : 1) + (with_gb ? f(hb[i]) : 0);
      const double e = fabs(f(hy[i]) - ref) / (fabs(ref) * 0.0078125 + 1e-3);
      worst = e > worst ? e : worst;
    }
    return worst;
  };
#define PK(VPL, W, LN, GB, ACC, NAME)                                                              \
  do {                                                                                             \
    const int64_t rows = bytes / 2 / (256 * VPL);                                                  \
    const uint4 *g = gb, *b = gb + 8192 / 8;                                                       \
    const double us = time_us([&] {                                                                \
      rows_norm_packed<VPL, W, LN, GB, ACC><<<(unsigned)((rows + W - 1) / W), 32 * W>>>(           \
          s, d, g, b, stats, rows, 1.f / (256 * VPL));                                             \
    });                                                                                            \
    CK(cudaDeviceSynchronize());                                                                   \
    print_row(NAME, 256 * VPL, us, best);                                                          \
    fprintf(stderr, "%s %d: error %.3f bf16 ulps\n", NAME, 256 * VPL, check(256 * VPL, LN, GB));   \
  } while (0)
  if (one) { /* the LayerNorm kernels with gamma/beta at 4096 alone (for ncu) */
    PK(16, 1, true, true, false, "ln_gb_w1");
    PK(16, 1, true, true, true, "ln_gb_acc_w1");
    PK(20, 1, true, true, true, "ln_gb_acc_w1");
    return;
  }
  PK(16, 1, false, false, false, "rms_w1");
  PK(16, 4, false, false, false, "rms_w4");
  PK(16, 1, false, true, false, "rms_gb_w1");
  PK(16, 4, false, true, false, "rms_gb_w4");
  PK(16, 1, true, false, false, "ln_w1");
  PK(16, 4, true, false, false, "ln_w4");
  PK(16, 1, true, true, false, "ln_gb_w1");
  PK(16, 4, true, true, false, "ln_gb_w4");
  PK(16, 2, true, true, false, "ln_gb_w2");
  PK(20, 1, true, true, false, "ln_gb_w1");
  PK(20, 4, true, true, false, "ln_gb_w4");
  PK(20, 1, false, true, false, "rms_gb_w1");
  PK(20, 4, false, true, false, "rms_gb_w4");
  PK(32, 1, true, true, false, "ln_gb_w1");
  PK(32, 4, true, true, false, "ln_gb_w4");
  PK(32, 1, false, true, false, "rms_gb_w1");
  PK(32, 4, false, true, false, "rms_gb_w4");
#undef PK
  CK(cudaFree(gb));
  CK(cudaFree(stats));
}

/* The packed CTA mode: bf16 rows of 8192-32768 (2^27 elements) in the packed form over 2-16
 * warps a row, LayerNorm and RMSNorm with gamma/beta; gamma/beta buffers of 32768. */
static void packed_cta(void *src, void *dst) {
  const int64_t bytes = (int64_t)1 << 28;
  const uint4 *s = (const uint4 *)src;
  uint4 *d = (uint4 *)dst;
  uint4 *gb = nullptr;
  float *stats = nullptr;
  alloc_params(32768, bytes / 2 / 8192, &gb, &stats);
  const double ref = memcpy_us(dst, src, bytes);
  printf("kernel,n,us,pct_of_copy\n");
  print_row("memcpy", 0, ref, ref);
#define PC(VPL, WPR, RMS, NAME)                                                                    \
  do {                                                                                             \
    const int64_t n = 256 * VPL * WPR, rows = bytes / 2 / n;                                       \
    const double us = time_us([&] {                                                                \
      rows_norm_packed_cta<VPL, WPR, RMS>                                                          \
          <<<(unsigned)rows, 32 * WPR>>>(s, d, gb, gb + 32768 / 8, stats, rows, 1.f / n);          \
    });                                                                                            \
    CK(cudaDeviceSynchronize());                                                                   \
    print_row(NAME, n, us, ref);                                                                   \
  } while (0)
  PC(16, 1, false, "ln_w1_v16");
  PC(16, 2, false, "ln_w2_v16");
  PC(8, 4, false, "ln_w4_v8");
  PC(16, 4, false, "ln_w4_v16");
  PC(8, 8, false, "ln_w8_v8");
  PC(16, 8, false, "ln_w8_v16");
  PC(8, 16, false, "ln_w16_v8");
  PC(16, 2, true, "rms_w2_v16");
  PC(16, 4, true, "rms_w4_v16");
  PC(8, 8, true, "rms_w8_v8");
  PC(16, 8, true, "rms_w8_v16");
  PC(8, 16, true, "rms_w16_v8");
#undef PC
  CK(cudaFree(gb));
  CK(cudaFree(stats));
}

/* The fp32 mode: fp32 rows of 2048-32768 (2^27 elements) in registers over 1-32 warps a row,
 * LayerNorm and RMSNorm with gamma/beta. */
static void f32_cta(void *src, void *dst) {
  const int64_t bytes = (int64_t)1 << 29; /* 2^27 fp32 */
  uint4 *gb = nullptr;
  float *stats = nullptr;
  alloc_params(2 * 32768, bytes / 4 / 2048, &gb, &stats); /* 32768 floats each */
  const float4 *s = (const float4 *)src, *g = (const float4 *)gb, *b = g + 32768 / 4;
  float4 *d = (float4 *)dst;
  const double ref = memcpy_us(dst, src, bytes);
  printf("kernel,n,us,pct_of_copy\n");
  print_row("memcpy", 0, ref, ref);
#define PF(VPL, WPR, RMS, NAME)                                                                    \
  do {                                                                                             \
    const int64_t n = 128 * VPL * WPR, rows = bytes / 4 / n;                                       \
    const double us = time_us([&] {                                                                \
      rows_norm_f32_cta<VPL, WPR, RMS>                                                             \
          <<<(unsigned)rows, 32 * WPR>>>(s, d, g, b, stats, rows, 1.f / n);                        \
    });                                                                                            \
    CK(cudaDeviceSynchronize());                                                                   \
    print_row(NAME, n, us, ref);                                                                   \
  } while (0)
  PF(16, 1, false, "ln_w1_v16");   /* 2048 */
  PF(8, 4, false, "ln_w4_v8");     /* 4096 */
  PF(16, 2, false, "ln_w2_v16");   /* 4096 */
  PF(10, 4, false, "ln_w4_v10");   /* 5120 */
  PF(8, 5, false, "ln_w5_v8");     /* 5120 */
  PF(8, 8, false, "ln_w8_v8");     /* 8192 */
  PF(16, 4, false, "ln_w4_v16");   /* 8192 */
  PF(8, 16, false, "ln_w16_v8");   /* 16384 */
  PF(16, 8, false, "ln_w8_v16");   /* 16384 */
  PF(8, 32, false, "ln_w32_v8");   /* 32768 */
  PF(16, 16, false, "ln_w16_v16"); /* 32768 */
  PF(8, 4, true, "rms_w4_v8");     /* 4096 */
  PF(8, 5, true, "rms_w5_v8");     /* 5120 */
  PF(8, 8, true, "rms_w8_v8");     /* 8192 */
  PF(8, 16, true, "rms_w16_v8");   /* 16384 */
  PF(16, 16, true, "rms_w16_v16"); /* 32768 */
#undef PF
  CK(cudaFree(gb));
  CK(cudaFree(stats));
}

int main(int argc, char **argv) {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  fprintf(stderr, "device %s, %d SMs\n", prop.name, sms);
  const int64_t max_bytes = (int64_t)1 << 29;
  void *src = nullptr, *dst = nullptr;
  CK(cudaMalloc(&src, max_bytes));
  CK(cudaMalloc(&dst, max_bytes));
  fill<<<4 * sms, 256>>>((uint16_t *)src, max_bytes / 2, 12345u);
  CK(cudaDeviceSynchronize());
  int gs_per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&gs_per_sm, gs_copy, 256, 0));
  if (argc > 1 && !strcmp(argv[1], "inflight")) {
    inflight(src, dst, sms);
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "f32_cta")) {
    f32_cta(src, dst);
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "packed_cta")) {
    packed_cta(src, dst);
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "packed")) {
    packed(src, dst, sms, argc > 2);
    return 0;
  }
  printf("kernel,bytes_a_side,us,gbps,pct_of_memcpy\n");
  for (int64_t bytes = (int64_t)1 << 26; bytes <= max_bytes; bytes <<= 1) {
    const uint4 *s = (const uint4 *)src;
    uint4 *d = (uint4 *)dst;
    const int64_t nvec = bytes / 16;
    struct Res {
      const char *name;
      double us;
    };
    std::vector<Res> res;
    res.push_back({"memcpy", memcpy_us(dst, src, bytes)});
    res.push_back({"memcpy_less_1MiB", memcpy_us(dst, src, bytes - (1 << 20))});
    res.back().us *= (double)bytes / (double)(bytes - (1 << 20)); /* scaled to the full bytes */
    res.push_back(
        {"gs_copy_resident", time_us([&] { gs_copy<<<gs_per_sm * sms, 256>>>(s, d, nvec); })});
    res.push_back({"gs_copy_4x_resident",
                   time_us([&] { gs_copy<<<4 * gs_per_sm * sms, 256>>>(s, d, nvec); })});
    res.push_back({"flat_copy_v1", time_us([&] {
                     flat_copy<1><<<(unsigned)((nvec + 255) / 256), 256>>>(s, d, nvec);
                   })});
    res.push_back({"flat_copy_v4", time_us([&] {
                     flat_copy<4><<<(unsigned)((nvec + 1023) / 1024), 256>>>(s, d, nvec);
                   })});
    /* rows_kernel over rows of N bf16, R rows a warp, W warps a CTA */
#define ROWS(NAME, N, VPL, R, W, MATH)                                                             \
  res.push_back({NAME, time_us([&] {                                                               \
                   const int64_t rows = bytes / 2 / N;                                             \
                   rows_kernel<VPL, R, W, MATH>                                                    \
                       <<<(unsigned)((rows + R * W - 1) / (R * W)), 32 * W>>>(s, d, rows,          \
                                                                              1.f / N);            \
                 })})
    /* rows of 512 (64 vectors, 2 a lane), 4 rows a warp, as the rows form's RMSNorm 512 */
    ROWS("rows512_copy_w1", 512, 2, 4, 1, false);
    ROWS("rows512_rms_w1", 512, 2, 4, 1, true);
    ROWS("rows512_copy_w4", 512, 2, 4, 4, false);
    ROWS("rows512_rms_w4", 512, 2, 4, 4, true);
    ROWS("rows512_rms_w8", 512, 2, 4, 8, true);
    /* rows of 4096 over one warp (16 vectors a lane), a row a warp */
    ROWS("rows4096_rms_w1", 4096, 16, 1, 1, true);
    ROWS("rows4096_rms_w4", 4096, 16, 1, 4, true);
#undef ROWS
    const double ref = res[0].us;
    for (const Res &r : res)
      printf("%s,%lld,%.2f,%.1f,%.2f\n", r.name, (long long)bytes, r.us, 2.0 * bytes / r.us / 1e3,
             100.0 * ref / r.us);
    fflush(stdout);
  }
  /* check the last launch's output (rows4096_rms_w4 at max_bytes): a row's RMS of y ~ 1 */
  std::vector<uint16_t> h(4096);
  CK(cudaMemcpy(h.data(), dst, 4096 * 2, cudaMemcpyDeviceToHost));
  double ss = 0;
  for (uint16_t u : h) {
    uint32_t w = (uint32_t)u << 16;
    float f;
    memcpy(&f, &w, 4);
    ss += (double)f * f;
  }
  fprintf(stderr, "check: rms of y's first row %.4f (expect ~1)\n", sqrt(ss / 4096));
  return 0;
}
