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
 * Build: nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o clusterprobe clusterprobe.cu
 * Run:   ./clusterprobe > clusterprobe.csv;  ./clusterprobe copy > clusterprobe-copy.csv
 */
#include <cuda_runtime.h>

#include <algorithm>
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
