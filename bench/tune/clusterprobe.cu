/*
 * clusterprobe: how many clusters of a shape the device keeps resident at once, and so how many
 * SMs a persistent clustered launch leaves idle (lead 16 of bench/RESULTS.md: the backward batch
 * tier's rows of 65536 over 16 CTAs of 128 threads, two an SM, lost 4.2 points to the ring's 8
 * CTAs of 512 at 2048 rows). A stand-alone tuning probe, not part of the library.
 *
 * For each shape (threads a CTA, CTAs an SM as the shape's shared memory bounds them, cluster
 * size) it prints cudaOccupancyMaxActiveBlocksPerMultiprocessor, cudaOccupancyMaxActiveClusters,
 * the CTAs that many clusters hold against the SMs' room, and then launches that many clusters
 * of a kernel that records the SM each CTA ran on, to count the SMs that had none.
 *
 * Mode `copy`: whether the SMs such a launch leaves idle bound it. A persistent copy kernel of
 * 512-thread CTAs, launched as that many clusters (so on the same SMs), each thread moving U
 * 16-byte vectors a step (U loads issued, then U stores), copies 2^29 bytes; its rate against
 * cudaMemcpyAsync of the same bytes (both the median of 20), for U = 2, 4, 8 and 16 (a row with
 * 0 CTAs: no cluster of that kernel fits, as for U = 16, whose registers exceed an SM's at 512
 * threads).
 *
 * Mode `rows` (lead 49, session 56): ncu33 found the backward's batch kernel asking L2 for every
 * sector of x and dy twice at bf16 rows of 16384 (a cluster of 2 CTAs a row), once at rows of
 * 8192 (a CTA a row), with the same cp.async instructions. This mode runs that kernel's memory
 * skeleton alone: persistent 256-thread CTAs, one an SM, each thread copying its 4 vectors of dy
 * and x of 2 rows a round into shared memory by cp.async (2 stages), one __syncthreads a round,
 * then dx = x + dy (bf16) from what it copied, over 2^27 elements. Four cases: rows of 8192 a
 * CTA, launched plain and as clusters of 2 (is it the cluster launch?), and rows of 16384 over
 * a cluster's pair, without and with a cluster barrier a round (the row split, and the batch
 * kernel's exchange as a barrier). Each is checked (sampled rows against the host) before it is
 * timed; its rate (3 * M * N * 2 bytes) against cudaMemcpyAsync of half those bytes (counted read
 * and written: the same bytes moved). Under ncu (-k regex:rows_copy, lts__t_sectors_op_read.sum and
 * lts__t_sectors_srcunit_tex.sum) it says which case doubles the L2 reads.
 *
 * Build: nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o clusterprobe clusterprobe.cu
 * Run:   ./clusterprobe > clusterprobe.csv;  ./clusterprobe copy > clusterprobe-copy.csv;
 *        ./clusterprobe rows > clusterprobe-rows.csv
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

__global__ void record_sm(int *sm_of_cta) {
  extern __shared__ unsigned char smem[];
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  if (threadIdx.x == 0) {
    smem[0] = (unsigned char)sm; /* touch the dynamic shared memory the shape reserves */
    sm_of_cta[blockIdx.x] = (int)sm;
  }
  /* stay resident long enough that every cluster of the launch is on the device at once */
  const long long t0 = clock64();
  while (clock64() - t0 < 20000000) {
  }
}

/* A launch of `grid` CTAs of `threads` in clusters of cl, with smem bytes of dynamic shared memory
 * (attr must outlive cfg). */
static void cluster_config(cudaLaunchConfig_t &cfg, cudaLaunchAttribute (&attr)[1], int grid,
                           int threads, size_t smem, int cl) {
  cfg = cudaLaunchConfig_t{};
  cfg.gridDim = dim3(grid, 1, 1);
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cl;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
}

template <int U>
__global__ void copy_steps(const float4 *__restrict__ src, float4 *dst, long long n) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0)
    smem[0] = 0;
  const long long step = (long long)gridDim.x * blockDim.x * U;
  for (long long base = (long long)blockIdx.x * blockDim.x * U + threadIdx.x; base < n;
       base += step) {
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = base + (long long)u * blockDim.x;
      if (i < n)
        v[u] = src[i];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = base + (long long)u * blockDim.x;
      if (i < n)
        dst[i] = v[u];
    }
  }
}

/* The median time of 20 calls of launch() (after 3 more), each between two events. */
template <typename F> static float median_launch_ms(F launch) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> t;
  for (int it = 0; it < 23; ++it) {
    cudaEventRecord(e0);
    launch();
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    if (it >= 3)
      t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <int U>
static void copy_case(int per_sm, int cl, int smem_sm, const float4 *src, float4 *dst, long long n,
                      float memcpy_ms) {
  const size_t smem = (size_t)(smem_sm / (per_sm + 1) + 1024);
  cudaFuncSetAttribute(copy_steps<U>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(copy_steps<U>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr[1];
  cluster_config(cfg, attr, cl, 512, smem, cl);
  int nclusters = 0;
  if (cudaOccupancyMaxActiveClusters(&nclusters, copy_steps<U>, &cfg) != cudaSuccess ||
      nclusters < 1) {
    cudaGetLastError();
    printf("%d,%d,%d,0,,\n", U, per_sm, cl);
    return;
  }
  cfg.gridDim = dim3(nclusters * cl, 1, 1);
  const float ms = median_launch_ms([&] { cudaLaunchKernelEx(&cfg, copy_steps<U>, src, dst, n); });
  printf("%d,%d,%d,%d,%.1f,%.1f\n", U, per_sm, cl, nclusters * cl, 2.0 * n * 16 / ms / 1e6,
         100.0 * memcpy_ms / ms);
}

static int copy_mode(int smem_sm) {
  const long long bytes = 1ll << 29, n = bytes / 16;
  float4 *src = nullptr, *dst = nullptr;
  cudaMalloc(&src, bytes);
  cudaMalloc(&dst, bytes);
  cudaMemset(src, 1, bytes);
  const float mc =
      median_launch_ms([&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice); });
  printf("# cudaMemcpyAsync of 2^29 bytes: %.1f GB/s\n", 2.0 * bytes / mc / 1e6);
  printf("vectors_a_step,ctas_per_sm,cluster,ctas,gbps,pct_of_memcpy\n");
  const int per_sm_list[] = {1, 2};
  const int clusters[] = {1, 2, 4, 8, 16};
  for (int per_sm : per_sm_list)
    for (int cl : clusters) {
      copy_case<2>(per_sm, cl, smem_sm, src, dst, n, mc);
      copy_case<4>(per_sm, cl, smem_sm, src, dst, n, mc);
      copy_case<8>(per_sm, cl, smem_sm, src, dst, n, mc);
      copy_case<16>(per_sm, cl, smem_sm, src, dst, n, mc);
    }
  cudaFree(src);
  cudaFree(dst);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

/* ---- mode rows: the batch kernel's memory skeleton ---- */
constexpr int kRowThreads = 256, kRowVpt = 4, kRowsARound = 2;
constexpr int kChunkVecs = kRowThreads * kRowVpt; /* a CTA's 16-byte vectors of a row */
constexpr size_t kRowsSmem = (size_t)2 * kRowsARound * 2 * kChunkVecs * 16; /* 2 stages */

__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

/* split: the CTAs that share a row (1, or 2: a cluster's pair, each a chunk of kChunkVecs);
 * sync: a cluster barrier a round (split 2). Rows of split * kChunkVecs vectors. */
__global__ void __launch_bounds__(kRowThreads, 1)
    rows_copy(const uint4 *x, const uint4 *dy, uint4 *dx, long long rows, int split, int sync) {
  extern __shared__ uint4 stage[]; /* [stage][row of the round][dy, x][kChunkVecs] */
  unsigned crank = 0;
  if (split > 1)
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(crank));
  const long long row_vecs = (long long)split * kChunkVecs, v0 = (long long)crank * kChunkVecs;
  const long long unit = blockIdx.x / split, nunits = gridDim.x / split;
  const long long rounds = (rows + kRowsARound - 1) / kRowsARound;
  const int t = threadIdx.x;
  auto slot = [&](int s, int j, int arr, int k) {
    return stage + ((s * kRowsARound + j) * 2 + arr) * kChunkVecs + k * kRowThreads + t;
  };
  auto issue = [&](int s, long long q) {
#pragma unroll
    for (int j = 0; j < kRowsARound; ++j) {
      const long long row = q * kRowsARound + j;
      if (q < rounds && row < rows)
#pragma unroll
        for (int k = 0; k < kRowVpt; ++k) {
          const long long v = row * row_vecs + v0 + k * kRowThreads + t;
          cp_async_16(slot(s, j, 0, k), dy + v);
          cp_async_16(slot(s, j, 1, k), x + v);
        }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  issue(0, unit);
  int cur = 0;
  for (long long q = unit; q < rounds; q += nunits) { /* (uniform over a cluster) */
    issue(cur ^ 1, q + nunits); /* that stage's last round: read by this thread, in order */
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    __syncthreads(); /* the batch kernel's one barrier a round */
    if (sync && split > 1)
      asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
#pragma unroll
    for (int j = 0; j < kRowsARound; ++j) {
      const long long row = q * kRowsARound + j;
      if (row < rows)
#pragma unroll
        for (int k = 0; k < kRowVpt; ++k) {
          const uint4 a = *slot(cur, j, 0, k), b = *slot(cur, j, 1, k);
          uint4 o;
          const __nv_bfloat162 *pa = reinterpret_cast<const __nv_bfloat162 *>(&a);
          const __nv_bfloat162 *pb = reinterpret_cast<const __nv_bfloat162 *>(&b);
          __nv_bfloat162 *po = reinterpret_cast<__nv_bfloat162 *>(&o);
#pragma unroll
          for (int w = 0; w < 4; ++w) /* the sum in fp32, rounded once, as the host's check */
            po[w] = __float22bfloat162_rn(make_float2(__low2float(pa[w]) + __low2float(pb[w]),
                                                      __high2float(pa[w]) + __high2float(pb[w])));
          dx[row * row_vecs + v0 + k * kRowThreads + t] = o;
        }
    }
    cur ^= 1;
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

static float bf16_to_f32(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t f32_to_bf16(float f) { /* round to nearest even (finite values) */
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static int rows_mode(int sms) {
  const long long elems = 1ll << 27, bytes = elems * 2;
  std::vector<uint16_t> hx(elems), hdy(elems);
  uint32_t r = 12345u;
  for (long long i = 0; i < elems; ++i) { /* values in [-1, 1), never all zeros */
    r = r * 1664525u + 1013904223u;
    hx[i] = f32_to_bf16((float)(r >> 8) / 8388608.f - 1.f);
    r = r * 1664525u + 1013904223u;
    hdy[i] = f32_to_bf16((float)(r >> 8) / 8388608.f - 1.f);
  }
  uint4 *x = nullptr, *dy = nullptr, *dx = nullptr, *cx = nullptr;
  cudaMalloc(&x, bytes);
  cudaMalloc(&dy, bytes);
  cudaMalloc(&dx, bytes);
  cudaMalloc(&cx, 3 * bytes);
  cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(dy, hdy.data(), bytes, cudaMemcpyHostToDevice);
  /* the copy: 1.5 * bytes, so as many bytes read + written as the kernel's 3 * bytes */
  const size_t half = (size_t)(3 * bytes / 2);
  const float mc = median_launch_ms(
      [&] { cudaMemcpyAsync(cx, (char *)cx + half, half, cudaMemcpyDeviceToDevice); });
  printf("# cudaMemcpyAsync of %zu bytes: %.1f GB/s (read + written)\n", half,
         2.0 * half / mc / 1e6);
  printf("case,cols,rows,cluster_launch,split,cluster_barrier,ctas,us,gbps,pct_of_memcpy,check\n");
  cudaFuncSetAttribute(rows_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kRowsSmem);
  struct Case {
    const char *name;
    int cl, split, sync;
  };
  const Case cases[] = {{"rows8192", 1, 1, 0},
                        {"rows8192-cluster2", 2, 1, 0},
                        {"rows16384-pair", 2, 2, 0},
                        {"rows16384-pair-barrier", 2, 2, 1}};
  int failed = 0;
  for (const Case &c : cases) {
    const long long cols = (long long)c.split * kChunkVecs * 8, rows = elems / cols;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    cluster_config(cfg, attr, sms - sms % c.cl, kRowThreads, kRowsSmem, c.cl);
    if (c.cl == 1)
      cfg.numAttrs = 0;          /* a plain launch, not a cluster of one */
    cudaMemset(dx, 0xff, bytes); /* poisoned: an element not written fails the check */
    cudaError_t e = cudaLaunchKernelEx(&cfg, rows_copy, (const uint4 *)x, (const uint4 *)dy, dx,
                                       rows, c.split, c.sync);
    if (e == cudaSuccess)
      e = cudaDeviceSynchronize();
    bool ok = e == cudaSuccess;
    if (ok) { /* rows 0, 1, one in the middle and the last, whole */
      const long long check_rows[] = {0, 1, rows / 2 + 1, rows - 1};
      std::vector<uint16_t> out(cols);
      for (long long row : check_rows) {
        cudaMemcpy(out.data(), (const char *)dx + row * cols * 2, cols * 2, cudaMemcpyDeviceToHost);
        for (long long i = 0; i < cols && ok; ++i) {
          const long long g = row * cols + i;
          ok = out[i] == f32_to_bf16(bf16_to_f32(hx[g]) + bf16_to_f32(hdy[g]));
        }
      }
    }
    if (!ok) {
      printf("%s,%lld,%lld,%d,%d,%d,%d,,,,FAILED (%s)\n", c.name, cols, rows, c.cl, c.split, c.sync,
             (int)cfg.gridDim.x, cudaGetErrorString(e));
      cudaGetLastError();
      ++failed;
      continue;
    }
    const float ms = median_launch_ms([&] {
      cudaLaunchKernelEx(&cfg, rows_copy, (const uint4 *)x, (const uint4 *)dy, dx, rows, c.split,
                         c.sync);
    });
    printf("%s,%lld,%lld,%d,%d,%d,%d,%.1f,%.1f,%.1f,OK\n", c.name, cols, rows, c.cl, c.split,
           c.sync, (int)cfg.gridDim.x, 1000.0 * ms, 3.0 * bytes / ms / 1e6, 100.0 * mc / ms);
    fflush(stdout);
  }
  cudaFree(x);
  cudaFree(dy);
  cudaFree(dx);
  cudaFree(cx);
  return failed || cudaGetLastError() != cudaSuccess ? 1 : 0;
}

int main(int argc, char **argv) {
  int dev = 0, sms = 0, smem_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, dev);
  cudaFuncSetAttribute(record_sm, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  printf("# %s, %d SMs, %d bytes of shared memory an SM\n", prop.name, sms, smem_sm);
  if (argc > 1 && strcmp(argv[1], "copy") == 0)
    return copy_mode(smem_sm);
  if (argc > 1 && strcmp(argv[1], "rows") == 0)
    return rows_mode(sms);
  printf("threads,ctas_per_sm,cluster,smem_bytes,blocks_per_sm,max_clusters,ctas,room,"
         "sms_used,sms_idle\n");
  const int threads_list[] = {128, 256, 512};
  const int per_sm_list[] = {1, 2, 4};
  const int clusters[] = {1, 2, 4, 8, 16};
  std::vector<int> host(4096);
  int *dsm = nullptr;
  cudaMalloc(&dsm, 4096 * sizeof(int));
  for (int threads : threads_list)
    for (int per_sm : per_sm_list)
      for (int cl : clusters) {
        /* shared memory that allows per_sm CTAs an SM and no more (1 KiB a CTA is reserved) */
        const size_t smem = (size_t)(smem_sm / (per_sm + 1) + 1024);
        if (smem > 227 * 1024)
          continue;
        cudaFuncSetAttribute(record_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        int blocks = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, record_sm, threads, smem);
        cudaLaunchConfig_t cfg;
        cudaLaunchAttribute attr[1];
        cluster_config(cfg, attr, cl, threads, smem, cl);
        int nclusters = 0;
        if (cudaOccupancyMaxActiveClusters(&nclusters, record_sm, &cfg) != cudaSuccess) {
          cudaGetLastError();
          nclusters = -1;
        }
        int used = 0;
        const int ctas = nclusters > 0 ? nclusters * cl : 0;
        if (ctas > 0 && ctas <= 4096) {
          cfg.gridDim = dim3(ctas, 1, 1);
          if (cudaLaunchKernelEx(&cfg, record_sm, dsm) == cudaSuccess &&
              cudaDeviceSynchronize() == cudaSuccess) {
            cudaMemcpy(host.data(), dsm, ctas * sizeof(int), cudaMemcpyDeviceToHost);
            std::vector<int> seen(sms, 0);
            for (int i = 0; i < ctas; ++i)
              if (host[i] >= 0 && host[i] < sms)
                seen[host[i]] = 1;
            for (int s : seen)
              used += s;
          } else {
            cudaGetLastError();
            used = -1;
          }
        }
        printf("%d,%d,%d,%zu,%d,%d,%d,%d,%d,%d\n", threads, per_sm, cl, smem, blocks, nclusters,
               ctas, blocks * sms, used, used >= 0 ? sms - used : -1);
        fflush(stdout);
      }
  cudaFree(dsm);
  return 0;
}
