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
 * Mode `rows` (lead 49, sessions 56-57): ncu33 found the backward's batch kernel asking L2 for
 * every sector of x and dy twice at bf16 rows of 16384 (a cluster of 2 CTAs a row), once at rows
 * of 8192 (a CTA a row), with the same cp.async instructions. This mode runs that kernel's memory
 * skeleton alone: persistent 256-thread CTAs, one an SM, each thread copying its 4 vectors of dy
 * and x of 2 rows a round into shared memory by cp.async (2 stages), one __syncthreads a round,
 * then dx = x + dy (bf16) from what it copied, over 2^27 elements. Cases: rows of 8192 a CTA,
 * launched plain and as clusters of 2; rows of 16384 over a cluster's pair, with what the batch
 * kernel adds as mode bits (a cluster barrier a round; its exchange by st.async and mbarrier; its
 * mean and rstd loads); and the stages `shift` bytes past a 128-byte line. Each is checked
 * (sampled rows against the host) before it is timed; its rate (3 * M * N * 2 bytes) against
 * cudaMemcpyAsync of half those bytes (counted read and written: the same bytes moved), and where
 * its stages start in the CTA's shared memory. Session 57 (bench/tune/ncu34.txt, H200): the
 * stages' place in a line decides it. On a line or 64 bytes in, every case reads x and dy from
 * L2 once and runs at 95-98% of the copy; 16 bytes in, 89-91%; 80 bytes in (before `shift`,
 * when the probe's 80 bytes of static arrays put them there), every case read twice at 81-83%.
 * Run it under ncu with -k regex:rows_copy and lts__t_sectors_srcunit_tex_op_read.sum.
 *
 * Mode `ring` (session 57, for lead 50): the backward ring kernel's copies alone. Run FZ had the
 * ring's short chunks (16-bit RMSNorm 2048 and 4096, fp32 5120) 4-5 points slower with their
 * stages on a 128-byte line than 96 bytes into one, where its long chunks gained. Persistent CTAs
 * (as many as fit), each a row of `chunk` vectors at a time: thread 0 copies the row's dy and x
 * into one of two stages by bulk copies on the stage's mbarrier, every thread writes dx = x + dy
 * of its vectors from the stage, a CTA barrier frees it. The ring's chunk and thread counts at
 * 2048, 4096, 5120 (fp32) and 16384, the stages 0, 32, 64 and 96 bytes into a line; each case
 * checked before it is timed.
 *
 * Build: nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o clusterprobe clusterprobe.cu
 * Run:   ./clusterprobe > clusterprobe.csv;  ./clusterprobe copy > clusterprobe-copy.csv;
 *        ./clusterprobe rows > clusterprobe-rows.csv;  ./clusterprobe ring > clusterprobe-ring.csv
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "probe_common.cuh"

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
constexpr size_t kRowsSmem = (size_t)2 * kRowsARound * 2 * kChunkVecs * 16 + 128; /* 2 stages,
                                                                                and a shift */

/* Mode bits of rows_copy (split 2 only but kStats): */
enum RowsMode {
  kBarrier = 1,  /* a cluster barrier a round */
  kExchange = 2, /* the batch kernel's exchange a round: st.async of a float4 into each peer's
                    slot with complete_tx on its mbarrier, a wait on this CTA's, the slots read */
  kStats = 4     /* the batch kernel's row_stats: every thread loads two floats a row (ones) */
};

/* split: the CTAs that share a row (1, or 2: a cluster's pair, each a chunk of kChunkVecs);
 * mode: RowsMode bits. Rows of split * kChunkVecs vectors. */
__global__ void __launch_bounds__(kRowThreads, 1)
    rows_copy(const uint4 *x, const uint4 *dy, uint4 *dx, const float *ones, long long rows,
              int split, int mode, int shift, unsigned *base) {
  /* [stage][row of the round][dy, x][kChunkVecs], `shift` bytes past a 128-byte boundary */
  extern __shared__ __align__(128) uint4 stage_raw[];
  uint4 *const stage = stage_raw + shift / 16;
  if (blockIdx.x == 0 && threadIdx.x == 0)
    *base = smem_u32(stage);     /* where the stages start in the CTA's shared memory */
  __shared__ float4 xslot[2][2]; /* [slot][rank]: the exchange's values */
  __shared__ unsigned long long xbar[2];
  unsigned crank = 0;
  const bool xchg = split > 1 && (mode & kExchange);
  if (split > 1)
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(crank));
  if (xchg) {
    mbar_init_ones(xbar, 2);
    cluster_sync_all();
  }
  const long long row_vecs = (long long)split * kChunkVecs, v0 = (long long)crank * kChunkVecs;
  const long long unit = blockIdx.x / split, nunits = gridDim.x / split;
  const long long rounds = (rows + kRowsARound - 1) / kRowsARound;
  const int t = threadIdx.x;
  auto slot = [&](int s, int j, int arr, int k) {
    return stage + ((s * kRowsARound + j) * 2 + arr) * kChunkVecs + k * kRowThreads + t;
  };
  float scale[2][kRowsARound]; /* (kStats) the rows' loaded factors, by stage */
  auto issue = [&](int s, long long q) {
#pragma unroll
    for (int j = 0; j < kRowsARound; ++j) {
      const long long row = q * kRowsARound + j;
      float f = 1.f;
      if (q < rounds && row < rows) {
#pragma unroll
        for (int k = 0; k < kRowVpt; ++k) {
          const long long v = row * row_vecs + v0 + k * kRowThreads + t;
          cp_async_16(slot(s, j, 0, k), dy + v);
          cp_async_16(slot(s, j, 1, k), x + v);
        }
        if (mode & kStats)
          f = ones[row] * ones[rows + row]; /* two loads a row, as mean and rstd */
      }
      if (s == 0)
        scale[0][j] = f;
      else
        scale[1][j] = f;
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  issue(0, unit);
  int cur = 0, xround = 0;
  for (long long q = unit; q < rounds; q += nunits) { /* (uniform over a cluster) */
    issue(cur ^ 1, q + nunits); /* that stage's last round: read by this thread, in order */
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    __syncthreads(); /* the batch kernel's one barrier a round */
    if ((mode & kBarrier) && split > 1)
      cluster_sync_all();
    float add = 0.f;
    if (xchg) { /* slots alternate; a peer posts round r + 2 only after this CTA posted r + 1,
                   which follows its barrier after every read of round r's slot */
      const int xs = xround & 1;
      const uint32_t bar = smem_u32(&xbar[xs]);
      if (threadIdx.x == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                     "r"(2 * 16)
                     : "memory");
      if (threadIdx.x < 2) {
        uint32_t ra, rb;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                     : "=r"(ra)
                     : "r"(smem_u32(&xslot[xs][crank])), "r"(threadIdx.x));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                     : "=r"(rb)
                     : "r"(bar), "r"(threadIdx.x));
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, "
                     "%3, %4}, [%5];" ::"r"(ra),
                     "f"(0.f), "f"(0.f), "f"(0.f), "f"(0.f), "r"(rb)
                     : "memory");
      }
      mbar_wait_parity(bar, (uint32_t)(xround >> 1) & 1u);
      add = xslot[xs][0].x + xslot[xs][1].x; /* 0: the sum leaves dx as it was */
      ++xround;
    }
#pragma unroll
    for (int j = 0; j < kRowsARound; ++j) {
      const long long row = q * kRowsARound + j;
      const float f = cur == 0 ? scale[0][j] : scale[1][j];
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
            po[w] = __float22bfloat162_rn(
                make_float2((__low2float(pa[w]) + __low2float(pb[w])) * f + add,
                            (__high2float(pa[w]) + __high2float(pb[w])) * f + add));
          dx[row * row_vecs + v0 + k * kRowThreads + t] = o;
        }
    }
    cur ^= 1;
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  if (xchg) /* no CTA leaves while a peer may still write its slots */
    cluster_sync_all();
}

/* Modes rows and ring: 2^27 bf16 values of x and dy in [-1, 1) (never all zeros) on the host and
 * the device, dx, and the copy they are measured against: cudaMemcpyAsync of 1.5 * 2^28 bytes,
 * as many read + written as a kernel reading x and dy and writing dx. */
struct CopyData {
  static constexpr long long elems = 1ll << 27, bytes = elems * 2;
  std::vector<uint16_t> hx, hdy;
  uint4 *x = nullptr, *dy = nullptr, *dx = nullptr, *cx = nullptr;
  float copy_ms = 0.f;
  explicit CopyData(uint32_t seed) : hx(elems), hdy(elems) {
    uint32_t r = seed;
    for (long long i = 0; i < elems; ++i) {
      r = r * 1664525u + 1013904223u;
      hx[i] = f32_to_bf16((float)(r >> 8) / 8388608.f - 1.f);
      r = r * 1664525u + 1013904223u;
      hdy[i] = f32_to_bf16((float)(r >> 8) / 8388608.f - 1.f);
    }
    cudaMalloc(&x, bytes);
    cudaMalloc(&dy, bytes);
    cudaMalloc(&dx, bytes);
    cudaMalloc(&cx, 3 * bytes);
    cudaMemcpy(x, hx.data(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(dy, hdy.data(), bytes, cudaMemcpyHostToDevice);
    const size_t half = (size_t)(3 * bytes / 2);
    copy_ms = median_launch_ms(
        [&] { cudaMemcpyAsync(cx, (char *)cx + half, half, cudaMemcpyDeviceToDevice); });
    printf("# cudaMemcpyAsync of %zu bytes: %.1f GB/s (read + written)\n", half,
           2.0 * half / copy_ms / 1e6);
  }
  ~CopyData() {
    cudaFree(x);
    cudaFree(dy);
    cudaFree(dx);
    cudaFree(cx);
  }
  /* Whether dx holds x + dy (the sum in fp32, rounded once) in rows 0, 1, one in the middle and
   * the last of `rows` rows of `cols` values. */
  bool dx_checks(long long rows, long long cols) const {
    const long long check_rows[] = {0, 1, rows / 2 + 1, rows - 1};
    std::vector<uint16_t> out(cols);
    for (long long row : check_rows) {
      cudaMemcpy(out.data(), (const char *)dx + row * cols * 2, cols * 2, cudaMemcpyDeviceToHost);
      for (long long i = 0; i < cols; ++i) {
        const long long g = row * cols + i;
        if (out[i] != f32_to_bf16(bf16_to_f32(hx[g]) + bf16_to_f32(hdy[g])))
          return false;
      }
    }
    return true;
  }
};

static int rows_mode(int sms) {
  CopyData d(12345u);
  const long long elems = CopyData::elems, bytes = CopyData::bytes;
  printf("case,cols,rows,cluster_launch,split,mode,shift,stage_offset,ctas,us,gbps,pct_of_memcpy,"
         "check\n");
  unsigned *base = nullptr, hbase = 0;
  cudaMalloc(&base, sizeof(unsigned));
  float *ones = nullptr; /* kStats' factors: 2 * rows (the most rows a case has) of 1.0f */
  {
    const std::vector<float> h(2 * (elems / (kChunkVecs * 8)), 1.f);
    cudaMalloc(&ones, h.size() * sizeof(float));
    cudaMemcpy(ones, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  cudaFuncSetAttribute(rows_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kRowsSmem);
  struct Case {
    const char *name;
    int cl, split, mode, shift;
  };
  const Case cases[] = {{"rows8192", 1, 1, 0, 0},
                        {"rows8192-cluster2", 2, 1, 0, 0},
                        {"rows16384-pair", 2, 2, 0, 0},
                        {"rows16384-pair-barrier", 2, 2, kBarrier, 0},
                        {"rows16384-pair-exchange-stats", 2, 2, kExchange | kStats, 0},
                        {"rows8192-shift16", 1, 1, 0, 16},
                        {"rows8192-shift64", 1, 1, 0, 64},
                        {"rows16384-pair-exchange-stats-shift16", 2, 2, kExchange | kStats, 16}};
  int failed = 0;
  for (const Case &c : cases) {
    const long long cols = (long long)c.split * kChunkVecs * 8, rows = elems / cols;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    cluster_config(cfg, attr, sms - sms % c.cl, kRowThreads, kRowsSmem, c.cl);
    if (c.cl == 1)
      cfg.numAttrs = 0;            /* a plain launch, not a cluster of one */
    cudaMemset(d.dx, 0xff, bytes); /* poisoned: an element not written fails the check */
    cudaError_t e =
        cudaLaunchKernelEx(&cfg, rows_copy, (const uint4 *)d.x, (const uint4 *)d.dy, d.dx,
                           (const float *)ones, rows, c.split, c.mode, c.shift, base);
    if (e == cudaSuccess)
      e = cudaDeviceSynchronize();
    bool ok = e == cudaSuccess;
    if (ok)
      cudaMemcpy(&hbase, base, sizeof(unsigned), cudaMemcpyDeviceToHost);
    ok = ok && d.dx_checks(rows, cols);
    if (!ok) {
      printf("%s,%lld,%lld,%d,%d,%d,%d,,%d,,,,FAILED (%s)\n", c.name, cols, rows, c.cl, c.split,
             c.mode, c.shift, (int)cfg.gridDim.x, cudaGetErrorString(e));
      cudaGetLastError();
      ++failed;
      continue;
    }
    const float ms = median_launch_ms([&] {
      cudaLaunchKernelEx(&cfg, rows_copy, (const uint4 *)d.x, (const uint4 *)d.dy, d.dx,
                         (const float *)ones, rows, c.split, c.mode, c.shift, base);
    });
    printf("%s,%lld,%lld,%d,%d,%d,%d,%u,%d,%.1f,%.1f,%.1f,OK\n", c.name, cols, rows, c.cl, c.split,
           c.mode, c.shift, hbase, (int)cfg.gridDim.x, 1000.0 * ms, 3.0 * bytes / ms / 1e6,
           100.0 * d.copy_ms / ms);
    fflush(stdout);
  }
  cudaFree(ones);
  cudaFree(base);
  return failed || cudaGetLastError() != cudaSuccess ? 1 : 0;
}

/* ---- mode ring: the ring kernel's copies (bulk copies into two stages), by the stages' place
 * in a 128-byte line ---- */
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
               "[%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

/* Rows of `chunk` 16-byte vectors, a CTA each at a time (persistent): thread 0 copies a row's dy
 * and x into a stage by two bulk copies on the stage's mbarrier, two stages, the next row's in
 * flight; every thread waits for the stage, writes dx = x + dy of its vectors, and the CTA's
 * barrier frees the stage for the row two ahead. The stages start `shift` bytes past a line. */
__global__ void ring_copy(const uint4 *x, const uint4 *dy, uint4 *dx, long long rows, int chunk,
                          int shift) {
  extern __shared__ __align__(128) uint4 ring_raw[];
  __shared__ unsigned long long full[2];
  uint4 *const ring = ring_raw + shift / 16; /* stage s: dy at 2s * chunk, x at (2s + 1) * chunk */
  const int t = threadIdx.x, nt = blockDim.x;
  mbar_init_ones(full, 2);
  __syncthreads();
  const uint32_t bytes = (uint32_t)chunk * 16;
  auto issue = [&](int s, long long row) {
    const uint32_t bar = smem_u32(&full[s]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(2 * bytes)
                 : "memory");
    bulk_copy(smem_u32(ring + 2 * s * chunk), dy + row * chunk, bytes, bar);
    bulk_copy(smem_u32(ring + (2 * s + 1) * chunk), x + row * chunk, bytes, bar);
  };
  if (t == 0)
    for (int s = 0; s < 2; ++s)
      if (blockIdx.x + (long long)s * gridDim.x < rows)
        issue(s, blockIdx.x + (long long)s * gridDim.x);
  int k = 0;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x, ++k) {
    const int s = k & 1;
    mbar_wait_parity(smem_u32(&full[s]), (uint32_t)(k >> 1) & 1u);
    for (int i = t; i < chunk; i += nt) {
      const uint4 a = ring[2 * s * chunk + i], b = ring[(2 * s + 1) * chunk + i];
      uint4 o;
      const __nv_bfloat162 *pa = reinterpret_cast<const __nv_bfloat162 *>(&a);
      const __nv_bfloat162 *pb = reinterpret_cast<const __nv_bfloat162 *>(&b);
      __nv_bfloat162 *po = reinterpret_cast<__nv_bfloat162 *>(&o);
#pragma unroll
      for (int w = 0; w < 4; ++w)
        po[w] = __float22bfloat162_rn(make_float2(__low2float(pa[w]) + __low2float(pb[w]),
                                                  __high2float(pa[w]) + __high2float(pb[w])));
      dx[row * chunk + i] = o;
    }
    __syncthreads(); /* every thread has read stage s */
    const long long next = row + 2 * (long long)gridDim.x;
    if (t == 0 && next < rows)
      issue(s, next);
  }
}

static int ring_mode(int sms) {
  CopyData d(777u);
  const long long elems = CopyData::elems, bytes = CopyData::bytes;
  printf("chunk_vecs,threads,shift,ctas_an_sm,us,gbps,pct_of_memcpy,check\n");
  cudaFuncSetAttribute(ring_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  cudaFuncSetAttribute(ring_copy, cudaFuncAttributePreferredSharedMemoryCarveout,
                       cudaSharedmemCarveoutMaxShared);
  /* the ring's shapes: 16-bit RMSNorm 2048 (256 vectors, 128 threads) and 4096 (512, 256), fp32
   * 5120 (640, 320), 16-bit 16384 (1024, 512) */
  const int shapes[][2] = {{256, 128}, {512, 256}, {640, 320}, {1024, 512}};
  int failed = 0;
  for (const auto &sh : shapes) {
    const int chunk = sh[0], threads = sh[1];
    const long long rows = elems / (chunk * 8);
    for (int shift : {0, 32, 64, 96}) {
      const size_t smem = (size_t)4 * chunk * 16 + 128;
      int per_sm = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ring_copy, threads, smem);
      const int grid = per_sm * sms;
      cudaMemset(d.dx, 0xff, bytes); /* poisoned: an element not written fails the check */
      ring_copy<<<grid, threads, smem>>>(d.x, d.dy, d.dx, rows, chunk, shift);
      cudaError_t e = cudaDeviceSynchronize();
      bool ok = e == cudaSuccess && grid > 0;
      ok = ok && d.dx_checks(rows, (long long)chunk * 8);
      if (!ok) {
        printf("%d,%d,%d,%d,,,,FAILED (%s)\n", chunk, threads, shift, per_sm,
               cudaGetErrorString(e));
        cudaGetLastError();
        ++failed;
        continue;
      }
      const float ms = median_launch_ms(
          [&] { ring_copy<<<grid, threads, smem>>>(d.x, d.dy, d.dx, rows, chunk, shift); });
      printf("%d,%d,%d,%d,%.1f,%.1f,%.1f,OK\n", chunk, threads, shift, per_sm, 1000.0 * ms,
             3.0 * bytes / ms / 1e6, 100.0 * d.copy_ms / ms);
      fflush(stdout);
    }
  }
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
  if (argc > 1 && strcmp(argv[1], "ring") == 0)
    return ring_mode(sms);
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
