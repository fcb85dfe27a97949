/*
 * Backward kernels: dx, dgamma and dbeta of LayerNorm and RMSNorm.
 *
 * With xhat = (x - mean) * rstd (RMSNorm: x * rstd), or (y - beta) / gamma when the backward is
 * given y, and g = dy * gamma:
 *   dx     = rstd * (g - (sum(g) + xhat * sum(g * xhat)) / N)      (RMSNorm: no sum(g) term)
 *   dgamma = sum over rows of dy * xhat,   dbeta = sum over rows of dy.
 *
 * dx needs two reductions along the row; dgamma/dbeta reduce down the columns. The row kernels
 * are persistent: each CTA (or cluster) keeps fp32 dgamma/dbeta accumulators for the columns it
 * owns across all the rows it processes, so x and dy are read exactly once, and at the end
 * writes one partial row to the workspace. finalize_kernel then adds the partials in a fixed
 * order: no atomics anywhere, so the results are bitwise reproducible.
 *
 *  bwd_warp_kernel   rows of up to 32 * VPT vectors (16-byte rows: 256 * VPT, over up to 8
 *                    warps), GROUP lanes per row, accumulators in registers (one partial per
 *                    CTA); 16-byte rows arrive through a two-stage cp.async ring in shared
 *                    memory, a row ahead, and rows of a warp or more read gamma/beta from
 *                    shared memory. On sm_90, fp32 rows from y of up to 8 x 256 * VPT vectors
 *                    (N = 32768) over a cluster of such 8-warp CTAs (one partial per cluster).
 *                    A FULL form, without per-vector tests, takes rows the lanes' vectors fill
 *                    exactly: fp32 rows and 16-bit rows of one warp (A/B runs AH1-AH3).
 *  bwd_ring_kernel   sm_90, 16-byte vectors, longer rows up to 16 * 1024 vectors (131072
 *                    16-bit or 65536 fp32 elements): a CTA or a cluster per row, dy and x
 *                    streamed through a ring of shared-memory stages by bulk copies, the
 *                    accumulators in registers (one partial per cluster), added while the
 *                    warps' row sums meet on an mbarrier; LayerNorm from y
 *                    reads beta from shared memory. Its RESIDENT form takes rows past those
 *                    (up to 16 * 512 * 32 elements: 16-bit N = 262144, fp32 past 131072
 *                    up to 262144), and 16-bit rows with
 *                    fp32 gamma of up to 640 vectors (in CTAs of 128 threads), from x, each
 *                    CTA's chunk of dy and x kept in the stage and read there twice (with
 *                    one stage, each thread refilling its own vectors as it finishes them).
 *  bwd_batch_kernel  sm_90, 16-bit rows of 5120 and 8192 from x with 16-bit gamma, from 2^25
 *                    elements (batch_shape): a CTA a row, 2-4 rows a round sharing one CTA
 *                    barrier and the accumulators, each thread's vectors staged by its own
 *                    cp.async rounds ahead and read twice from shared memory; LayerNorm rows
 *                    of 16384 over a cluster of 2 such CTAs, of 32768 and 65536 (up to 2^26
 *                    elements) over 8 and 16 CTAs of 128 threads, two an SM; rows of 65536
 *                    in three stages, each round's dx a round late, behind the next round's
 *                    first pass, so that the cluster's exchange of its sums overlaps work.
 *  bwd_reg_kernel    the same rows up to 512 vectors where the ring does not apply (sm_80, or
 *                    one-element access): a CTA per row, dy and x arriving through a
 *                    two-stage cp.async ring; the row lanes of a cluster (sm_90) fold their
 *                    accumulators into one partial.
 *  bwd_hold_kernel   sm_90, fp32 16-byte rows from x past the ring's RESIDENT form in two
 *                    stages (N > 185920) that hold_shape cuts in long chunks: each row held
 *                    whole in shared memory, cut into chunks over the CTAs of one cooperative
 *                    launch (a CTA an SM), the chunks' row sums meeting through the workspace;
 *                    x and dy read once, the accumulators in registers (one partial per slot).
 *  stream kernels    all other rows, of any length: row sums per chunk (bwd_rowpart_kernel,
 *                    bwd_rowsum_kernel), then a column pass computing dx and the partials
 *                    (bwd_colpass_kernel). x and dy are read twice, but the kernels have no
 *                    per-row barrier.
 */
#include "kernels.cuh"

namespace fnorm_cuda {

/* xhat and g for VEC elements. RMS: an RMSNorm row from x, known at compile time (xhat = x *
 * rstd, without the zero mean). */
template <int VEC, bool RMS = false>
__device__ __forceinline__ void bwd_elems(const float *dy, const float *xy, const float *gm,
                                          const float *bt, float mu, float rs, int from_y,
                                          float *xh, float *g) {
  /* Two loops behind one uniform branch: a select inside one loop would have the compiler
   * evaluate the division on every element of the common (x) path too. from_y 2 (16-bit rows):
   * __fdividef, a reciprocal and a product (2 ulp, far below y's own rounding to 8 or 11 bits),
   * where the IEEE division adds a check and a slow-path branch to every element; sweep 41
   * (H200, 2^27 elements): 16-bit from y +3 to +14 points (N = 1024-32768), fp32 0 to +3, which
   * keeps the exact division. */
  if (from_y == 2) {
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      xh[e] = __fdividef(xy[e] - bt[e], gm[e]);
  } else if (from_y) {
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      xh[e] = (xy[e] - bt[e]) / gm[e];
  } else if (RMS) {
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      xh[e] = xy[e] * rs;
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      xh[e] = (xy[e] - mu) * rs;
  }
#pragma unroll
  for (int e = 0; e < VEC; ++e)
    g[e] = dy[e] * gm[e];
}

/* dx = rstd * (g - (s0 + xhat * s1) / N) of one element, with the row's factors folded once a
 * row (c0 = rstd * s0 / N, c1 = rstd * s1 / N): two fused multiply-adds an element, where the
 * unfolded form took four operations (A/B run AG1). */
struct DxRow {
  float rs, c0, c1;
};
__device__ __forceinline__ DxRow dx_row(float rs, float s0, float s1, float inv_n) {
  const float f = rs * inv_n;
  return DxRow{rs, s0 * f, s1 * f};
}
__device__ __forceinline__ float dx_elem(const DxRow &r, float g, float xh) {
  return fmaf(g, r.rs, -fmaf(xh, r.c1, r.c0));
}
/* RMSNorm (s0 = 0): rstd * (g - xhat * s1 / N). */
template <bool RMS> __device__ __forceinline__ float dx_elem(const DxRow &r, float g, float xh) {
  return RMS ? fmaf(g, r.rs, -(xh * r.c1)) : dx_elem(r, g, xh);
}

/* The from-y mode the library plans for rows of T (BwdParams::from_y: 2, __fdividef, on 16-bit
 * rows; 1, IEEE division, on fp32 ones; plan.fast_div), the one besides from x (0) that release
 * builds compile the warp tier and the ring for. */
template <typename T> constexpr int kPlannedFromY = sizeof(T) == 2 ? 2 : 1;

/* Per-row values the element loop needs. */
__device__ __forceinline__ void row_stats(const BwdParams &a, int64_t row, float &mu, float &rs,
                                          int from_y) {
  rs = a.rstd[row];
  mu = (a.layernorm && !from_y) ? a.mean[row] : 0.f;
}
__device__ __forceinline__ void row_stats(const BwdParams &a, int64_t row, float &mu, float &rs) {
  row_stats(a, row, mu, rs, a.from_y);
}

/* A thread's share of a row's two sums (of g, and of g * xhat), each kept as four partial sums
 * (short dependency chains), a vector at a time; RMS: only the second. row_terms_total folds
 * them in a fixed order. */
template <int VEC, bool RMS>
__device__ __forceinline__ void row_terms_add(float (&p0)[4], float (&p1)[4], const float *g,
                                              const float *xh) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    if (!RMS)
      p0[e & 3] += g[e];
    p1[e & 3] = fmaf(g[e], xh[e], p1[e & 3]);
  }
}
__device__ __forceinline__ void row_terms_total(const float (&p0)[4], const float (&p1)[4],
                                                float (&sums)[2]) {
  sums[0] = (p0[0] + p0[1]) + (p0[2] + p0[3]);
  sums[1] = (p1[0] + p1[1]) + (p1[2] + p1[3]);
}

/* A row's two sums (of g, and of g * xhat) over the CTA. RMS (an RMSNorm kernel): the first
 * is 0, and only the second is added, a value a warp instead of two. */
template <bool RMS>
__device__ __forceinline__ void row_sums(float (&sums)[2], bool layernorm, RingRed &red,
                                         int &round) {
  if constexpr (RMS) {
    float s1[1] = {sums[1]};
    cta_sum<1>(s1, red, round);
    sums[0] = 0.f;
    sums[1] = s1[0];
  } else {
    if (!layernorm)
      sums[0] = 0.f;
    cta_sum<2>(sums, red, round);
  }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* row_sums in two halves around work that does not need the sums, for the ring: the warps'
 * sums go to the slot and every thread arrives on `bar` (an mbarrier of one arrival a thread)
 * without waiting (row_sums_post); row_sums_collect waits for the round's phase and adds the
 * slot. A warp that reaches the sum early goes on with its dgamma/dbeta accumulators instead of
 * idling at a CTA barrier. The slots alternate as in cta_sum: no warp can write a slot again
 * before every thread has arrived in the round between, after reading it. Each thread's own
 * arrival (release) orders its reads of the stage before the refill that follows the phase. */
template <bool RMS>
__device__ __forceinline__ void row_sums_post(float (&sums)[2], bool layernorm, RingRed &red,
                                              unsigned long long *bar, int round) {
  if (RMS || !layernorm)
    sums[0] = 0.f;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, slot = round & 1;
  if constexpr (RMS) {
    float s1[1] = {sums[1]};
    group_sum<32, 1>(s1);
    sums[1] = s1[0];
  } else {
    group_sum<32, 2>(sums);
  }
  if (lane == 0) {
    red.warp[slot][w][0] = sums[0];
    red.warp[slot][w][1] = sums[1];
  }
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
template <bool RMS>
__device__ __forceinline__ void row_sums_collect(float (&sums)[2], RingRed &red,
                                                 unsigned long long *bar, int &round) {
  const int lane = threadIdx.x & 31, nwarps = blockDim.x >> 5, slot = round & 1;
  mbar_wait(bar, (uint32_t)slot);
  if constexpr (RMS) {
    float s1[1] = {lane < nwarps ? red.warp[slot][lane][1] : 0.f};
    group_sum<32, 1>(s1);
    sums[0] = 0.f;
    sums[1] = s1[0];
  } else {
    sums[0] = lane < nwarps ? red.warp[slot][lane][0] : 0.f;
    sums[1] = lane < nwarps ? red.warp[slot][lane][1] : 0.f;
    group_sum<32, 2>(sums);
  }
  ++round;
}
#endif

/* Writes the dgamma/dbeta accumulators of the vectors a thread owns (t + k * blockDim.x of
 * its chunk, k < VPT) into partial row `part` (gamma) and nparts + part (beta), in whole 16-byte
 * words where the vector has 4 or 8 elements (the row, the chunk and the workspace are then
 * 16-byte aligned). Scalar stores of 8-element vectors, each lane's 32 bytes beside its
 * neighbours', wrote every 32-byte sector of the partial rows in eight pieces: ncu (session 53,
 * H200, bf16 LayerNorm 512 x 262144, the ring's RESIDENT form) had the row kernel 293 us with
 * them against 248 us without dgamma and dbeta, at the same instructions and DRAM bytes give or
 * take the partial rows' 15 MB, and 180 MB more L2 traffic. With 8-element vectors a warp's 32
 * vectors are 256 consecutive columns: the lanes swap halves (shuffles) so that each of the two
 * stores a vector writes 512 consecutive bytes. Each float4 goes out as one st.global.v4
 * (store_f32x4_in_place): written as float4 copies, the compiler split them into four 32-bit stores
 * in the ring, hold and batch kernels (cuobjdump, session 54; ncu31 measured what split dx stores
 * cost the batch tier). Called by every thread of the CTA (the shuffles take whole warps; the CTAs
 * have whole warps). */
template <int VEC, int VPT, bool RMS = false>
__device__ __forceinline__ void write_partials(const BwdParams &a, int64_t part, int64_t v0,
                                               const bool (&mine)[VPT], const float *acc_g,
                                               const float *acc_b) {
  float *pg = a.partial + part * a.cols + v0 * VEC;
  float *pb = a.partial + (a.nparts + part) * a.cols + v0 * VEC;
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
    if constexpr (VEC == 8) {
      const unsigned owned = __ballot_sync(kAll, mine[k]);
      const int64_t first = i - lane; /* the warp's first vector */
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        /* this lane stores half (lane & 1) of the vector of lane `src` */
        const int src = h * 16 + (lane >> 1);
        const bool hi = lane & 1;
        float g[4], b[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float glo = __shfl_sync(kAll, acc_g[k * 8 + e], src);
          const float ghi = __shfl_sync(kAll, acc_g[k * 8 + 4 + e], src);
          g[e] = hi ? ghi : glo;
          if constexpr (!RMS) {
            const float blo = __shfl_sync(kAll, acc_b[k * 8 + e], src);
            const float bhi = __shfl_sync(kAll, acc_b[k * 8 + 4 + e], src);
            b[e] = hi ? bhi : blo;
          }
        }
        if ((owned >> src) & 1u) {
          const int64_t at = (first + src) * 8 + (hi ? 4 : 0);
          store_f32x4_in_place(pg + at, g[0], g[1], g[2], g[3]);
          if constexpr (!RMS) /* (RMS kernels run only without dbeta: never read) */
            store_f32x4_in_place(pb + at, b[0], b[1], b[2], b[3]);
        }
      }
    } else if (mine[k]) {
      if constexpr (VEC == 4) {
        store_f32x4_in_place(pg + i * 4, acc_g[k * 4], acc_g[k * 4 + 1], acc_g[k * 4 + 2],
                             acc_g[k * 4 + 3]);
        if constexpr (!RMS)
          store_f32x4_in_place(pb + i * 4, acc_b[k * 4], acc_b[k * 4 + 1], acc_b[k * 4 + 2],
                               acc_b[k * 4 + 3]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          pg[i * VEC + e] = acc_g[k * VEC + e];
          if constexpr (!RMS)
            pb[i * VEC + e] = acc_b[k * VEC + e];
        }
      }
    }
  }
}

/* With 16-byte vectors each lane copies its own vectors of the next row into shared memory
 * with cp.async while it works on this one (STAGED), so a warp has two rows' loads in flight at
 * no register cost; a lane reads back only what it copied itself, so no barrier is needed.
 * GROUP lanes share a row: 4 to 32, or on 16-byte rows 64, 128 or 256, the row's warps then
 * adding their sums through shared memory behind a named barrier of just those warps (no
 * CTA-wide barrier a row, as the ring has).
 * CLUSTER (sm_90, GROUP 256; fp32 rows, see plan_backward): a cluster of such CTAs shares each
 * row, each CTA owning an even chunk of its vectors; the CTAs add their sums through
 * distributed shared memory (cluster_exchange) in rank order, and each writes its chunk of the
 * cluster's partial row. */
/* FULL (16-byte rows of exactly GROUP * VPT vectors, no cluster): every lane's every vector lies
 * in the row, so the kernel has no column tests and no zeroed values; a group past the last row
 * reads whatever its stage slot holds and neither stores nor accumulates. */
template <typename T, typename P, int VEC, int GROUP, int VPT, bool PARAM_SMEM = false,
          bool CLUSTER = false, int FROM_Y = -1, bool FULL = false, bool RMS = false>
__global__ void __launch_bounds__(256) bwd_warp_kernel(BwdParams a) {
  /* FROM_Y >= 0: a.from_y fixed at compile time (bwd_warp_built), as in bwd_ring_kernel; RMS
   * as there (RMSNorm rows from x without dbeta). */
  const int from_y = FROM_Y >= 0 ? FROM_Y : a.from_y;
  pdl_allow_dependents();
  constexpr int EPT = VEC * VPT;
  constexpr int SPAN = GROUP > 32 ? GROUP : 32; /* threads that share the loop's row base */
  constexpr int ROWS_PER_SPAN = SPAN / GROUP;
  constexpr int WARPS_PER_ROW = SPAN / 32;
  static_assert(GROUP <= 256 && 256 % GROUP == 0, "a row's lanes within the CTA");
  static_assert(!CLUSTER || (GROUP == 256 && PARAM_SMEM), "clusters of 8-warp rows");
  /* The CTA's part of the row: vectors [v0, v0 + count) of it, columns [col0, col_end); the
   * whole row, and the CTA its own unit of rows, without CLUSTER. */
  int csize = 1, crank = 0;
  int64_t col0 = 0, col_end = a.cols;
  if constexpr (CLUSTER) {
    cluster_shape(csize, crank);
    const int64_t nvec = a.cols / VEC, chunk = (nvec + csize - 1) / csize;
    const int64_t v0 = (int64_t)crank * chunk;
    const int64_t count = v0 < nvec ? (nvec - v0 < chunk ? nvec - v0 : chunk) : 0;
    col0 = v0 * VEC;
    col_end = col0 + count * VEC;
    ring_red_init(cluster_red_slots(), csize);
  }
  const int64_t unit = CLUSTER ? blockIdx.x / csize : blockIdx.x; /* the CTA or cluster */
  const int64_t nunits = CLUSTER ? gridDim.x / csize : gridDim.x;
  int xround = 0;
  __shared__ float xchg[2][WARPS_PER_ROW > 1 ? 8 : 1][2]; /* [row parity][warp in CTA][sum] */
  int parity = 0;
  constexpr bool STAGED = VEC * sizeof(T) == 16;
  static_assert(!FULL || (STAGED && !CLUSTER), "full rows: 16-byte rows, no cluster");
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  /* STAGED: stage s, array r (0 dy, 1 x or y), vector k of thread t at
   * ((s * 2 + r) * VPT + k) * blockDim.x + t; afterwards blockDim.x * EPT floats for the fold. */
  Pack<T, VEC> *stage = reinterpret_cast<Pack<T, VEC> *>(dyn_smem);
  float *red = reinterpret_cast<float *>(dyn_smem);
  const int lane = threadIdx.x % GROUP;
  const int group_in_span = (threadIdx.x % SPAN) / GROUP;
  const int64_t span_id = (unit * blockDim.x + threadIdx.x) / SPAN;
  const int64_t nspans = nunits * blockDim.x / SPAN;
  const int64_t step = nspans * ROWS_PER_SPAN;
  const T *dy = (const T *)a.dy;
  const T *xy = (const T *)a.xy;
  T *dx = (T *)a.dx;
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  const float inv_n = count_rcp((float)a.cols);
  float acc_g[EPT], acc_b[EPT];
#pragma unroll
  for (int j = 0; j < EPT; ++j)
    acc_g[j] = acc_b[j] = 0.f;
  auto slot = [&](int s, int r, int k) {
    return stage + ((s * 2 + r) * VPT + k) * (int)blockDim.x + threadIdx.x;
  };
  /* Copies the thread's vectors of row `row` into stage s (one commit group, maybe empty). */
  auto issue = [&](int s, int64_t row) {
    if (row < a.rows)
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int64_t col = col0 + ((int64_t)k * GROUP + lane) * VEC;
        if (FULL || col < col_end) {
          cp_async_16(slot(s, 0, k), dy + row * a.dy_stride + col);
          cp_async_16(slot(s, 1, k), xy + row * a.xy_stride + col);
        }
      }
    cp_async_commit();
  };
  /* PARAM_SMEM (16-byte rows): gamma (and beta, from y) as fp32 in shared memory after the
   * stages, filled once a CTA and read there for every row instead of from global memory: ncu
   * showed the global reads' latency (long-scoreboard stalls) holding the rows back, and
   * sweep 26 (H200) measured +5 to +15 points at N = 768-2048. */
  [[maybe_unused]] float *sparam =
      reinterpret_cast<float *>(dyn_smem + (size_t)4 * VPT * blockDim.x * 16);
  const int64_t pcols = col_end - col0; /* columns of sparam's gamma (then beta) */
  if constexpr (PARAM_SMEM) {
    for (int64_t c = threadIdx.x; c < pcols; c += blockDim.x) {
      sparam[c] = gamma ? to_f32(gamma[col0 + c]) : 1.f;
      if (from_y)
        sparam[pcols + c] = beta ? to_f32(beta[col0 + c]) : 0.f;
    }
    __syncthreads();
  }
  int stg = 0; /* the stage this row is in */
  float nmu = 0.f, nrs = 0.f;
  const int64_t first = span_id * ROWS_PER_SPAN + group_in_span;
  if constexpr (STAGED)
    issue(0, first);
  if (first < a.rows)
    row_stats(a, first, nmu, nrs, from_y);

  /* The loop bound is uniform over the CTA (its first row), so every lane reaches every
   * shuffle and barrier, and every warp passes as many named barriers as the others before the
   * fold's CTA-wide ones (racecheck flagged the fold when the CTA's last spans had a row less
   * than its first). A span past the last row runs its round with row_ok false. */
  const int64_t cta_first = unit * (blockDim.x / SPAN) * ROWS_PER_SPAN;
  for (int64_t base = cta_first; base < a.rows; base += step) {
    const int64_t row = base + (first - cta_first);
    const bool row_ok = row < a.rows;
    const float mu = nmu, rs = nrs;
    if (row + step < a.rows) /* the next row's mean and rstd, a row ahead like its data */
      row_stats(a, row + step, nmu, nrs, from_y);
    if constexpr (STAGED) {
      issue(stg ^ 1, row + step);
      cp_async_wait(1); /* this row's group has landed */
    }
    float d[EPT], xh[EPT], g[EPT];
    float sums[2] = {0.f, 0.f};
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t col = col0 + ((int64_t)k * GROUP + lane) * VEC;
      if (FULL || (row_ok && col < col_end)) {
        float xv[VEC], gm[VEC], bt[VEC];
        if constexpr (STAGED) {
          const Pack<T, VEC> pd = *slot(stg, 0, k), px = *slot(stg, 1, k);
          unpack_f32<T, VEC>(pd, &d[k * VEC]);
          unpack_f32<T, VEC>(px, xv);
        } else {
          load_stream_f32<T, VEC>(dy + row * a.dy_stride + col, &d[k * VEC]);
          load_stream_f32<T, VEC>(xy + row * a.xy_stride + col, xv);
        }
        if constexpr (PARAM_SMEM) {
          static_assert(VEC % 4 == 0, "16-byte rows");
#pragma unroll
          for (int q = 0; q < VEC / 4; ++q) {
            const float4 gv = *reinterpret_cast<const float4 *>(sparam + (col - col0) + 4 * q);
            gm[4 * q] = gv.x, gm[4 * q + 1] = gv.y, gm[4 * q + 2] = gv.z, gm[4 * q + 3] = gv.w;
            if (from_y) {
              const float4 bv =
                  *reinterpret_cast<const float4 *>(sparam + pcols + (col - col0) + 4 * q);
              bt[4 * q] = bv.x, bt[4 * q + 1] = bv.y, bt[4 * q + 2] = bv.z, bt[4 * q + 3] = bv.w;
            } else {
              bt[4 * q] = bt[4 * q + 1] = bt[4 * q + 2] = bt[4 * q + 3] = 0.f;
            }
          }
        } else {
          load_param<P, VEC>(gamma, col, 1.f, gm);
          load_param<P, VEC>(from_y ? beta : nullptr, col, 0.f, bt);
        }
        bwd_elems<VEC, RMS>(&d[k * VEC], xv, gm, bt, mu, rs, from_y, &xh[k * VEC], &g[k * VEC]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          d[k * VEC + e] = xh[k * VEC + e] = g[k * VEC + e] = 0.f;
      }
    }
    stg ^= 1;
    float gx[EPT];
#pragma unroll
    for (int j = 0; j < EPT; ++j)
      gx[j] = g[j] * xh[j];
    sums[0] = RMS || !a.layernorm ? 0.f : tree_sum<EPT>(g);
    sums[1] = tree_sum<EPT>(gx);
    /* The row's sums over its lanes: v, the last K of sums in place (RMS: the second alone;
     * the first is 0). */
    constexpr int K = RMS ? 1 : 2, K0 = 2 - K;
    float(&v)[K] = *reinterpret_cast<float(*)[K]>(sums + K0);
    if constexpr (WARPS_PER_ROW == 1) {
      group_sum<GROUP, K>(v);
    } else {
      /* Each warp's sums into this row's parity slot; the slot of the other parity may still
       * be read by a warp of the previous row, none can still read this one: a warp writes it
       * again only after the next row's barrier, which every warp of the row reaches only
       * after its reads here. Added in warp order (deterministic). */
      group_sum<32, K>(v);
      const int w = threadIdx.x / 32, w0 = (threadIdx.x / GROUP) * WARPS_PER_ROW;
      if (threadIdx.x % 32 == 0)
#pragma unroll
        for (int k = 0; k < K; ++k)
          xchg[parity][w][K0 + k] = v[k];
      named_barrier(1 + threadIdx.x / GROUP, GROUP);
#pragma unroll
      for (int k = 0; k < K; ++k)
        v[k] = 0.f;
#pragma unroll
      for (int r = 0; r < WARPS_PER_ROW; ++r)
#pragma unroll
        for (int k = 0; k < K; ++k)
          v[k] += xchg[parity][w0 + r][K0 + k];
      parity ^= 1;
    }
    if constexpr (CLUSTER) {
      /* The row's CTAs add their sums, in rank order. The barrier above (all 256 threads)
       * stands between this exchange and the previous row's reads of its slots. */
      RingRed &cr = cluster_red_slots();
      const int xs = cluster_exchange(make_float4(sums[0], sums[1], 0.f, 0.f), cr, xround, csize);
      sums[0] = sums[1] = 0.f;
      for (int r = 0; r < csize; ++r) {
        sums[0] += cr.cta[xs][r].x;
        sums[1] += cr.cta[xs][r].y;
      }
    }
    if (!row_ok)
      continue;
    const DxRow dr = dx_row(rs, sums[0], sums[1], inv_n);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t col = col0 + ((int64_t)k * GROUP + lane) * VEC;
      if (FULL || col < col_end) {
        float out[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int j = k * VEC + e;
          out[e] = dx_elem<RMS>(dr, g[j], xh[j]);
          acc_g[j] += d[j] * xh[j];
          if (!RMS)
            acc_b[j] += d[j];
        }
        if (dx)
          store_vec<T, VEC>(dx + row * a.dx_stride + col, out);
      }
    }
  }
  if constexpr (STAGED)
    cp_async_wait(0); /* (only empty groups can be pending) before the fold reuses the stages */
  if constexpr (CLUSTER)
    cluster_barrier(csize); /* no CTA leaves while another may still write its slots */
  if (!a.want_dparams)
    return;
  /* Fold the CTA's row groups (which all own the same columns) in a fixed order. */
  const int groups = blockDim.x / GROUP;
  const int group = threadIdx.x / GROUP;
  const int width = GROUP * EPT; /* columns covered by one group */
  __syncthreads();               /* every thread is past its last read of the stages */
  for (int which = 0; which < (RMS ? 1 : 2); ++which) { /* (RMS: no dbeta wanted) */
    const float *acc = which == 0 ? acc_g : acc_b;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        red[group * width + (k * GROUP + lane) * VEC + e] = acc[k * VEC + e];
    __syncthreads();
    float *out = a.partial + ((int64_t)which * a.nparts + unit) * a.cols + col0;
    for (int c = threadIdx.x; c < width && c < col_end - col0; c += blockDim.x) {
      float sum = 0.f;
      for (int r = 0; r < groups; ++r)
        sum += red[r * width + c];
      out[c] = sum;
    }
    __syncthreads();
  }
}

/* The batch tier: rows of exactly THREADS * VPT 16-byte vectors (16-bit rows batch_shape names,
 * from x), a CTA per row, persistent. A round is R rows at once: every thread owns the same VPT
 * vectors of each of them, so the R rows share its fp32 dgamma/dbeta accumulators and one CTA
 * barrier, where the ring pays a CTA-wide sum (and its wait) for every row. Each thread copies
 * its own vectors of the round S - 1 ahead into shared memory with cp.async (no barrier: it
 * reads back only what it copied) and reads them there twice, for the row sums and the
 * accumulators and then for dx, so that its registers hold only gamma and the accumulators
 * (the warp tier keeps dy, xhat and g of its row in registers, which caps it at 16 elements a
 * thread). The rows' 2R sums (RMS: R) meet in one exchange a round: warp shuffles, a slot a
 * warp, one __syncthreads, added in warp order; the slots alternate by round, so a warp
 * writes a slot again only after the next round's barrier, which every warp passes after its
 * reads of it. Rows past the last are neither copied nor read (the branch is uniform over the
 * CTA: every thread's round has the same rows). bwdprobe (bench/tune/) chose the shapes. A/B
 * run BN2 (H200, tuning build, the tier against the ring, % of the copy at 2^26 / 2^27
 * elements): LayerNorm bf16 5120 77.9 -> 88.9 / 85.4 -> 91.1, 8192 78.5 -> 90.2 / 88.1 ->
 * 95.1, fp16 5120 79.0 -> 88.7 / 86.5 -> 90.8, 8192 78.4 -> 88.4 / 88.2 -> 93.3; RMSNorm 5120
 * +2 to +4.5, 8192 +2.5 to +8; fp16 LayerNorm 4096 x 8192 through graph replay 63.7 -> 79.8,
 * RMSNorm 77.4 -> 90.3. Its shapes over a cluster, and what they gained: batch_shape. */
template <typename T, typename P, int THREADS, int VPT, int R, int S, bool RMS, int CL = 1>
__global__ void __launch_bounds__(THREADS, 1) bwd_batch_kernel(BwdParams a) {
  pdl_allow_dependents();
  constexpr int VEC = 16 / (int)sizeof(T), EPT = VEC * VPT, NV = THREADS * VPT;
  constexpr int W = THREADS / 32, K = RMS ? 1 : 2; /* sums a row */
  static_assert(S >= 2 && S <= 8 && THREADS % 32 == 0, "a round ahead at least; whole warps");
  static_assert(CL == 1 || K * R <= 4, "a cluster's CTAs exchange one float4 a round");
  /* CL > 1 (sm_90): a cluster of CL such CTAs shares each row, CTA rank c owning its vectors
   * [c * NV, (c + 1) * NV); their sums meet through distributed shared memory in rank order
   * (cluster_exchange), and each writes its chunk of the cluster's partial row. */
  int crank = 0, xround = 0;
  if constexpr (CL > 1) {
    int csize = 1;
    cluster_shape(csize, crank);
    ring_red_init(cluster_red_slots(), CL);
  }
  const int64_t col0 = (int64_t)crank * NV * VEC;
  const int64_t unit = blockIdx.x / CL, nunits = gridDim.x / CL;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  /* [S][R][dy, x][NV], from a line (smem_on_line) */
  Pack<T, VEC> *stage = reinterpret_cast<Pack<T, VEC> *>(smem_on_line(dyn_smem));
  __shared__ float xchg[2][W][K * R];
  const int t = threadIdx.x;
  auto slot = [&](int s, int j, int arr, int k) {
    return stage + ((s * R + j) * 2 + arr) * NV + k * THREADS + t;
  };
  const T *dy = (const T *)a.dy, *x = (const T *)a.xy;
  T *dx = (T *)a.dx;
  const int64_t rounds = (a.rows + R - 1) / R;
  /* The staged rounds' mean and rstd, a register queue indexed by stage at compile time. */
  float qmu[S][R], qrs[S][R];
  auto issue = [&](int s, int64_t q) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t row = q * R + j;
      float mu = 0.f, rs = 0.f;
      if (q < rounds && row < a.rows) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int64_t col = col0 + ((int64_t)k * THREADS + t) * VEC;
          cp_async_16(slot(s, j, 0, k), dy + row * a.dy_stride + col);
          cp_async_16(slot(s, j, 1, k), x + row * a.xy_stride + col);
        }
        row_stats(a, row, mu, rs, 0);
      }
#pragma unroll
      for (int u = 0; u < S; ++u)
        if (u == s)
          qmu[u][j] = mu, qrs[u][j] = rs;
    }
    cp_async_commit();
  };
  /* gamma held as its 16-bit words and widened at each use: half the registers of fp32 values,
   * level to 0.5 points faster (A/B run BN3: bf16 LayerNorm 8192 +0.3, RMSNorm 8192 +0.3 to
   * +3, 5120 level). */
  static_assert(sizeof(P) == sizeof(T) && sizeof(T) == 2, "16-bit rows, gamma in their dtype");
  float acc_g[EPT], acc_b[RMS ? 1 : EPT];
  Pack<P, VEC> gp[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (a.gamma) {
      gp[k] = *reinterpret_cast<const Pack<P, VEC> *>((const P *)a.gamma + col0 +
                                                      ((int64_t)k * THREADS + t) * VEC);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        gp[k].v[e] = from_f32<P>(1.f);
    }
  }
  auto gam = [&](int k, int e) { return pack_f32<P, VEC>(gp[k], e); };
#pragma unroll
  for (int e = 0; e < EPT; ++e) {
    acc_g[e] = 0.f;
    if constexpr (!RMS)
      acc_b[e] = 0.f;
  }
  const float inv_n = count_rcp((float)a.cols);
  const int64_t step = nunits;
  int cur = 0, parity = 0;
  /* Stage c's round's mean and rstd (from the queue). */
  auto stats_of = [&](int c, float(&mu)[R], float(&rs)[R]) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      mu[j] = rs[j] = 0.f;
#pragma unroll
      for (int u = 0; u < S; ++u)
        if (u == c)
          mu[j] = qmu[u][j], rs[j] = qrs[u][j];
    }
  };
  /* The cluster's sums of a round from its exchange slot xs, in rank order. */
  auto cluster_sums = [&](int xs, float(&sums)[K * R]) {
    if constexpr (CL > 1) /* (K * R <= 4 then: one float4 a CTA) */
      rank_sums<K * R>(cluster_red_slots().cta[xs], CL, sums);
  };
  /* The first pass over stage c (round q): the accumulators, and the CTA's sums of each row
   * (every thread gets them) after one __syncthreads. With `wait_prev` (clusters), before that
   * barrier: the wait for the previous round's exchange, its sums read into `held`. */
  float held[K * R]; /* (clusters) the previous round's sums, once its exchange is read */
  auto first_pass = [&](int c, int64_t q, const float(&mu)[R], const float(&rs)[R],
                        float(&sums)[K * R], bool wait_prev) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      float s0 = 0.f, s1 = 0.f;
      if (q * R + j < a.rows) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          float d[VEC], xv[VEC];
          unpack_f32<T, VEC>(*slot(c, j, 0, k), d);
          unpack_f32<T, VEC>(*slot(c, j, 1, k), xv);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const float xh = RMS ? xv[e] * rs[j] : (xv[e] - mu[j]) * rs[j];
            const float g = d[e] * gam(k, e);
            if constexpr (!RMS) {
              s0 += g;
              acc_b[k * VEC + e] += d[e];
            }
            s1 = fmaf(g, xh, s1);
            acc_g[k * VEC + e] = fmaf(d[e], xh, acc_g[k * VEC + e]);
          }
        }
      }
      if constexpr (RMS) {
        sums[j] = s1;
      } else {
        sums[2 * j] = a.layernorm ? s0 : 0.f;
        sums[2 * j + 1] = s1;
      }
    }
    group_sum<32, K * R>(sums);
    const int warp = t >> 5;
    if ((t & 31) == 0)
#pragma unroll
      for (int i = 0; i < K * R; ++i)
        xchg[parity][warp][i] = sums[i];
    if constexpr (CL > 1)
      if (wait_prev)
        cluster_sums(cluster_wait(cluster_red_slots(), xround - 1), held);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < K * R; ++i)
      sums[i] = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w)
#pragma unroll
      for (int i = 0; i < K * R; ++i)
        sums[i] += xchg[parity][w][i];
    parity ^= 1;
  };
  /* The second pass over stage c (round q): dx from the row sums. */
  auto second_pass = [&](int c, int64_t q, const float(&mu)[R], const float(&rs)[R],
                         const float(&sums)[K * R]) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t row = q * R + j;
      if (row >= a.rows || !dx)
        break;
      const DxRow dr = dx_row(rs[j], RMS ? 0.f : sums[K * j], sums[K * j + K - 1], inv_n);
      /* LayerNorm: dx = g * rstd - xhat * c1 - c0 as g * rstd + (x - mean) * x1 - c0 with
       * x1 = -rstd * c1: the same centred x - mean, its two products with rstd and c1 taken in the
       * other order (no cancellation; run BX's fold of the mean into the constant had one), one
       * instruction an element fewer (A/B run CC, H200: +0.2..+1.2 points at 16-bit 5120-32768
       * but bf16 8192 -0.5). RMSNorm keeps dx_elem: the same rewrite lost 2 and 5 points at 8192.
       */
      const float x1 = -rs[j] * dr.c1;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        float d[VEC], xv[VEC], out[VEC];
        unpack_f32<T, VEC>(*slot(c, j, 0, k), d);
        unpack_f32<T, VEC>(*slot(c, j, 1, k), xv);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float g = d[e] * gam(k, e);
          out[e] = RMS ? dx_elem<RMS>(dr, g, xv[e] * rs[j])
                       : fmaf(g, dr.rs, fmaf(xv[e] - mu[j], x1, -dr.c0));
        }
        /* ONE_STORE: as a Pack copy the compiler split the first of a row's vectors into 32-,
         * 32- and 64-bit stores in the clustered forms (ncu31), where the one-CTA form at 8192
         * kept them whole. A/B run FP (H200, with write_partials' stores whole too): 16-bit
         * LayerNorm 16384 +1.4 and +2.3 points, 32768 +1.4 and +1.6 at 2^27 elements. (The
         * clustered rows' extra L2 reads, which ncu31 saw beside the split stores, remain:
         * ncu33.) */
        store_vec<T, VEC, true>(dx + row * a.dx_stride + col0 + ((int64_t)k * THREADS + t) * VEC,
                                out);
      }
    }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    issue(s, unit + s * step);
  if constexpr (CL == 1 || S == 2) {
    for (int64_t q = unit; q < rounds; q += step) { /* (uniform over the cluster) */
      /* The stage S - 1 rounds ahead held the round before this one, which this thread has
       * read (its own copies only). */
      issue((cur + S - 1) % S, q + (S - 1) * step);
      cp_async_wait_n<S - 1>(); /* this round's group has landed */
      float mu[R], rs[R], sums[K * R];
      stats_of(cur, mu, rs);
      first_pass(cur, q, mu, rs, sums, false);
      if constexpr (CL > 1) {
        /* The first pass's __syncthreads stands between this exchange and the previous
         * round's reads of its slots (cluster_exchange); every CTA of the cluster runs every
         * round. */
        cluster_sums(cluster_exchange(float4_of(sums), cluster_red_slots(), xround, CL), sums);
      }
      second_pass(cur, q, mu, rs, sums);
      cur = (cur + 1) % S;
    }
  } else {
    /* A cluster's rows in S = 3 stages (rows of 65536; batch_shape has the measurements): each
     * round's second pass waits one round, so that the exchange of its sums overlaps the next
     * round's first pass. Round q: its first pass; the wait for round
     * q - 1's exchange and the reads of its slot, before the first pass's barrier (which then
     * stands between those reads and the post that reuses the slot, cluster_post); round q's
     * post; round q - 1's second pass; and its stage refilled S - 1 rounds ahead of q. So a
     * stage holds its round from the issue until a round after its first pass: S is 3 (two
     * rounds in flight, the deferred one held). Rounds are uniform over the cluster. */
    static_assert(CL == 1 || S == 3, "the deferred second pass: three stages");
    int64_t q = unit;
    for (; q < rounds; q += step) {
      cp_async_wait_n<S - 2>(); /* this round's group has landed */
      const bool deferred = q != unit;
      float mu[R], rs[R], sums[K * R];
      stats_of(cur, mu, rs);
      first_pass(cur, q, mu, rs, sums, deferred);
      cluster_post(float4_of(sums), cluster_red_slots(), xround, CL);
      const int prev = (cur + S - 1) % S;
      if (deferred) {
        stats_of(prev, mu, rs);
        second_pass(prev, q - step, mu, rs, held);
      }
      issue(prev, q + (S - 1) * step);
      cur = (cur + 1) % S;
    }
    if (q != unit) { /* the last round's second pass */
      const int prev = (cur + S - 1) % S;
      float mu[R], rs[R], sums[K * R];
      stats_of(prev, mu, rs);
      cluster_sums(cluster_wait(cluster_red_slots(), xround - 1), sums);
      second_pass(prev, q - step, mu, rs, sums);
    }
  }
  cp_async_wait_n<0>(); /* (only empty groups can be pending) */
  if constexpr (CL > 1)
    cluster_barrier(CL); /* no CTA leaves while a peer may still write its slots */
  if (!a.want_dparams)
    return;
  /* The CTA's partial row: its threads own disjoint columns, all of them in the row; each warp
   * store writes 512 consecutive bytes (write_partials). A/B run FK (H200), LayerNorm's against
   * each thread's own two float4s a vector, 32 bytes apart across the lanes: 0 to +1.7 points at
   * 2^27 elements (bf16 16384 85.5 -> 87.2, 8192 94.7 -> 95.8), up to +2.9 at 2^25; RMSNorm 8192
   * then lost 2.0 (bf16) and 0.9 (fp16), when write_partials' float4 stores were still split in
   * four by the compiler (ncu31); with them whole (lead 47, A/B run FP) RMSNorm's form takes it
   * too: 8192 -0.9 (bf16) and -0.5 (fp16) at 2^27, +1.1 and +1.2 at 2^25, 16384-65536 +0.2 to
   * +0.9 at 2^27. */
  bool mine[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k)
    mine[k] = true;
  write_partials<VEC, VPT, RMS>(a, unit, (int64_t)crank * NV, mine, acc_g, acc_b);
}

/* The batch kernel for rows of `cols` (batch_shape's shapes, 16-bit rows with gamma in their
 * dtype), or nullptr. */
template <typename T, typename P> static void (*bwd_batch_pick(int64_t cols, bool rms))(BwdParams) {
  if constexpr (sizeof(T) == 2 && std::is_same<T, P>::value) {
    if (cols == 5120)
      return rms ? bwd_batch_kernel<T, P, 320, 2, 4, 2, true>
                 : bwd_batch_kernel<T, P, 320, 2, 4, 2, false>;
    if (cols == 8192)
      return rms ? bwd_batch_kernel<T, P, 256, 4, 2, 2, true>
                 : bwd_batch_kernel<T, P, 256, 4, 2, 2, false>;
    if (cols == 16384)
      return rms ? bwd_batch_kernel<T, P, 256, 4, 2, 2, true, 2>
                 : bwd_batch_kernel<T, P, 256, 4, 2, 2, false, 2>;
    if (cols == 32768)
      return rms ? bwd_batch_kernel<T, P, 128, 4, 2, 2, true, 8>
                 : bwd_batch_kernel<T, P, 128, 4, 2, 2, false, 8>;
    if (cols == 65536)
      return rms ? bwd_batch_kernel<T, P, 128, 4, 2, 3, true, 16>
                 : bwd_batch_kernel<T, P, 128, 4, 2, 3, false, 16>;
  }
  return nullptr;
}

/* Rows of up to 16 * 512 * EPT elements. The cluster is csplit x crows CTAs: CTA rank =
 * lane * csplit + split. The csplit CTAs of a lane share one row (each owns a chunk of its
 * columns); the crows lanes work on different rows, and at the end fold their accumulators
 * through distributed shared memory, so that the cluster writes one partial row: crows times
 * fewer partials to write and re-read. Each thread keeps its VPT vectors of dy and x, and its
 * dgamma/dbeta accumulators, in registers. */
template <typename T, typename P, int VEC, int VPT>
__global__ void __launch_bounds__(512, 1)
    bwd_reg_kernel(BwdParams a, int64_t chunk_vecs, int csplit) {
  pdl_allow_dependents();
  constexpr int EPT = VEC * VPT;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ ReduceSmem<2> red;
  int csize, crank;
  cluster_shape(csize, crank);
  row_sum_init(red, csize);
  const int crows = csize / csplit, split = crank % csplit, lane = crank / csplit;
  const int64_t nvec = a.cols / VEC;
  const int64_t v0 = (int64_t)split * chunk_vecs;
  const int64_t count = chunk_count(nvec, chunk_vecs, split);
  const int64_t cluster_id = blockIdx.x / csize, nclusters = gridDim.x / csize;
  const int64_t step = nclusters * crows;
  const P *gamma = (const P *)a.gamma;
  const P *beta = a.from_y ? (const P *)a.beta : nullptr;
  const float inv_n = count_rcp((float)a.cols);
  bool mine[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k)
    mine[k] = threadIdx.x + (int64_t)k * blockDim.x < count;
  float acc_g[EPT], acc_b[EPT];
#pragma unroll
  for (int j = 0; j < EPT; ++j)
    acc_g[j] = acc_b[j] = 0.f;
  /* The rows' dy and x (or y) arrive through a two-stage ring in shared memory filled by
   * cp.async: the next row is in flight while this one is worked on, at no register cost (a
   * register prefetch leaves too few registers, and the compiler then delays the loads).
   * Stage b holds dy at ring + 2b * chunk and x (or y) at ring + (2b + 1) * chunk. */
  Pack<T, VEC> *ring = reinterpret_cast<Pack<T, VEC> *>(dyn_smem);
  auto issue = [&](int b, int64_t r) {
    stage_issue<T, VEC>(ring + 2 * b * chunk_vecs, (const T *)a.dy + r * a.dy_stride + v0 * VEC,
                        count);
    stage_issue<T, VEC>(ring + (2 * b + 1) * chunk_vecs,
                        (const T *)a.xy + r * a.xy_stride + v0 * VEC, count);
  };
  int round = 0, buf = 0;
  /* The row's mean and rstd are prefetched with its data: a load that waited until the row
   * is worked on would put a full memory latency on every row. */
  float cmu = 0.f, crs = 0.f, nmu = 0.f, nrs = 0.f;
  if (cluster_id * crows + lane < a.rows) {
    issue(0, cluster_id * crows + lane);
    row_stats(a, cluster_id * crows + lane, cmu, crs);
  }
  /* The loop bound is uniform over the cluster, so every CTA joins every cluster barrier. */
  for (int64_t base = cluster_id * crows; base < a.rows; base += step) {
    const int64_t row = base + lane;
    const bool ok = row < a.rows;
    Pack<T, VEC> cdy[VPT], cxy[VPT];
    if (ok) { /* uniform over the CTA */
      if (row + step < a.rows) {
        issue(buf ^ 1, row + step);
        row_stats(a, row + step, nmu, nrs);
        asm volatile("cp.async.wait_group 2;\n" ::: "memory"); /* this row's two groups */
      } else {
        cp_async_wait(0);
      }
      __syncthreads();
      const Pack<T, VEC> *sdy = ring + 2 * buf * chunk_vecs, *sxy = sdy + chunk_vecs;
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (mine[k]) {
          cdy[k] = sdy[threadIdx.x + k * blockDim.x];
          cxy[k] = sxy[threadIdx.x + k * blockDim.x];
        }
      /* The stage is rewritten two rows on, after row_sum's barrier has passed. */
      buf ^= 1;
    }
    /* dy and xhat stay in registers between the passes; g = dy * gamma is recomputed (gamma
     * comes from L1) rather than kept, which would spill. */
    float d[EPT], xh[EPT];
    float s[2] = {0.f, 0.f};
    const float mu = cmu, rs = crs;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (ok && mine[k]) {
        const int64_t col = (v0 + threadIdx.x + (int64_t)k * blockDim.x) * VEC;
        float xv[VEC], gm[VEC], bt[VEC], g[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          d[k * VEC + e] = pack_f32<T, VEC>(cdy[k], e);
          xv[e] = pack_f32<T, VEC>(cxy[k], e);
        }
        load_param<P, VEC>(gamma, col, 1.f, gm);
        load_param<P, VEC>(beta, col, 0.f, bt);
        bwd_elems<VEC>(&d[k * VEC], xv, gm, bt, mu, rs, a.from_y, &xh[k * VEC], g);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          s[0] += g[e];
          s[1] += g[e] * xh[k * VEC + e];
        }
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          d[k * VEC + e] = xh[k * VEC + e] = 0.f;
      }
    }
    if (!a.layernorm)
      s[0] = 0.f;
    row_sum<2>(s, red, round, lane * csplit, csplit);
    if (ok) {
      const DxRow dr = dx_row(rs, s[0], s[1], inv_n);
      T *dxr = a.dx ? (T *)a.dx + row * a.dx_stride + v0 * VEC : nullptr;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (!mine[k])
          continue;
        const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
        float out[VEC], gm[VEC];
        load_param<P, VEC>(gamma, (v0 + i) * VEC, 1.f, gm);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int j = k * VEC + e;
          out[e] = dx_elem(dr, d[j] * gm[e], xh[j]);
          acc_g[j] += d[j] * xh[j];
          acc_b[j] += d[j];
        }
        if (dxr)
          store_vec<T, VEC>(dxr + i * VEC, out);
      }
    }
    cmu = nmu;
    crs = nrs;
  }
  if (a.want_dparams) {
    if (crows == 1) {
      write_partials<VEC, VPT>(a, cluster_id, v0, mine, acc_g, acc_b);
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      float *pg = a.partial + cluster_id * a.cols + v0 * VEC;
      float *pb = a.partial + (a.nparts + cluster_id) * a.cols + v0 * VEC;
      /* Lanes hold the same columns: park the accumulators in shared memory ([VEC][chunk]),
       * then lane l folds vectors [lo, hi) of the chunk over all lanes, in lane order. */
      float *fold_g = reinterpret_cast<float *>(dyn_smem); /* the ring, now free */
      float *fold_b = fold_g + chunk_vecs * VEC;
      __syncthreads();
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (mine[k]) {
          const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            fold_g[e * chunk_vecs + i] = acc_g[k * VEC + e];
            fold_b[e * chunk_vecs + i] = acc_b[k * VEC + e];
          }
        }
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();
      const int64_t per = (count + crows - 1) / crows;
      const int64_t lo = lane * per, hi = lo + per < count ? lo + per : count;
      for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          float g = 0.f, b = 0.f;
          for (int r = 0; r < crows; ++r) {
            g += cluster.map_shared_rank(fold_g, r * csplit + split)[e * chunk_vecs + i];
            b += cluster.map_shared_rank(fold_b, r * csplit + split)[e * chunk_vecs + i];
          }
          pg[i * VEC + e] = g;
          pb[i * VEC + e] = b;
        }
#endif
    }
  }
  cluster_barrier(csize);
}

/* Rows of up to 16 * 512 * VPT vectors, sm_90: a CTA, or a cluster of CTAs, per row, dy and x
 * (or y) streaming through a ring of `nstages` shared-memory stages filled by bulk copies that
 * thread 0 issues up to nstages rows ahead. Thread t owns vectors t + k * blockDim.x (k < VPT)
 * of its CTA's chunk: it copies them into registers once the stage lands (the stage is then
 * refilled at once), keeps gamma and its dgamma/dbeta accumulators in registers across all
 * rows, and needs one reduction a row (one exchange across the cluster). At the end each CTA
 * writes its chunk of the cluster's partial row.
 * The register form adds its accumulators between its arrival at the row's sum and the wait
 * for it (row_sums_post, row_sums_collect): A/B run AT1 (H200, 2^27 elements) 16-bit RMSNorm
 * N = 8192-65536 +9 to +13.5 points, LayerNorm 2304-16384 +7 to +12 (5120 -3 to -4).
 * BETA_SMEM (LayerNorm from y): beta as fp32 in shared memory after the stages, each thread
 * its own vectors, instead of from global memory every row (sweep 30: the ring at 55-60% of the
 * copy there, against 81-85% for the warp tier's clusters, which read it from shared memory;
 * sweep 31: +6 to +22 points at N = 5120-8192). */
/* RESIDENT: the thread's vectors stay in the stage, read there once for the row's sums and again
 * for dx, so VPT is 32 elements; gamma as fp32 in shared memory after the stages (before beta);
 * the stage is refilled after the second pass, behind a barrier, by one bulk copy, or, with one
 * stage (ring_fill: fp32 rows past N = 185920), by each thread for its own vectors as soon as it
 * has used them (cp.async, a group a vector; sweep 79: +7 to +9 points at fp32 196608-262144).
 * Planned, from x with 1.5 rows an SM or more, for rows past the register ring's (else the stream
 * tier, which reads dy and x twice from memory): sweeps 41-42 (H200, 2^27 elements), 16-bit N =
 * 196608 and 262144 +6 to +9 points (bf16 with fp32 gamma +4), from y -3 to -13; sweep 43 (bf16
 * 262144): 256 rows +4, 160 rows -0.9, 132 -2.4 (64 rows, sweep 42: -6); fp32 262144 -6 then, +2.1
 * to +2.4 in sweep 78 (after the RMS form and the split row sums; see plan_backward). And for
 * 16-bit rows with fp32 gamma within the register ring's reach, in CTAs of 128 threads: there the
 * register ring runs 6-17 points below its rows with 16-bit gamma (probe 47), and sweep 48 measured
 * RESIDENT +5 to +11 points at N = 5120-65536 save 8192 (-2 to -3); with 16-bit gamma it lost
 * 3-8 (sweep 44). Tuning builds have it for all dtypes and from y
 * (FNORM_TUNE_BWD_RING_RESIDENT=2). */
template <typename T, typename P, int VEC, int VPT, bool BETA_SMEM = false, bool RESIDENT = false,
          int FROM_Y = -1, bool RMS = false>
__global__ void __launch_bounds__(512, 1)
    bwd_ring_kernel(BwdParams a, int64_t chunk_vecs, int nstages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* FROM_Y >= 0: a.from_y known at compile time, so the kernel holds only its own element path
   * (-1, tuning builds' other combinations: all three behind run-time branches). RMS: RMSNorm
   * rows from x without dbeta (launch_backward), so without the first sum and the dbeta
   * accumulators. */
  const int from_y = FROM_Y >= 0 ? FROM_Y : a.from_y;
  pdl_allow_dependents();
  constexpr int EPT = VEC * VPT;
  constexpr int GPT = RESIDENT ? 1 : EPT; /* gamma held in registers */
  typedef Pack<T, VEC> V;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ RingRed red;
  __shared__ unsigned long long full[kRingMaxStages];
  __shared__ unsigned long long sumbar;      /* the register form's row sums (row_sums_post) */
  V *ring = reinterpret_cast<V *>(dyn_smem); /* stage s: dy at 2s * chunk, x at (2s + 1) * chunk */
  int csize, crank;
  cluster_shape(csize, crank);
  const int64_t nvec = a.cols / VEC;
  const int64_t v0 = (int64_t)crank * chunk_vecs;
  const int count = (int)chunk_count(nvec, chunk_vecs, crank);
  const uint32_t bytes = (uint32_t)count * (uint32_t)sizeof(V);
  const int64_t cluster_id = blockIdx.x / csize, nclusters = gridDim.x / csize;
  if (threadIdx.x == 0) /* visible to the CTA after bulk_barriers_init's barrier */
    mbar_init(&sumbar, blockDim.x);
  bulk_barriers_init(full, nstages, red, csize);
  const T *dychunk = (const T *)a.dy + v0 * VEC;
  const T *xychunk = (const T *)a.xy + v0 * VEC;
  auto issue = [&](int s, int64_t row) {
    mbar_expect(&full[s], 2 * bytes);
    bulk_load(ring + 2 * s * chunk_vecs, dychunk + row * a.dy_stride, bytes, &full[s]);
    bulk_load(ring + (2 * s + 1) * chunk_vecs, xychunk + row * a.xy_stride, bytes, &full[s]);
  };
  /* RESIDENT with one stage and ring_fill: each thread copies its own vectors into the stage
   * (cp.async, a group a vector k) and refills each with the next row's as soon as it has read
   * it for dx, so that the next row's copy overlaps this row's second pass instead of waiting
   * for the CTA's barrier and one bulk copy. A thread reads back only the slots it copied: no
   * barrier, no mbarrier. */
  const bool tfill = RESIDENT && a.ring_fill && nstages == 1;
  if (threadIdx.x == 0 && count > 0 && !tfill)
    for (int s = 0; s < nstages; ++s) {
      const int64_t row = cluster_id + (int64_t)s * nclusters;
      if (row < a.rows)
        issue(s, row);
    }
  /* (tfill) vector k of this thread for `row`, or nothing past the rows; one group a vector */
  [[maybe_unused]] auto fill_vec = [&](int k, int64_t row) {
    const int i = threadIdx.x + k * blockDim.x;
    if (row < a.rows && i < count) {
      cp_async_16(ring + i, dychunk + row * a.dy_stride + (int64_t)i * VEC);
      cp_async_16(ring + chunk_vecs + i, xychunk + row * a.xy_stride + (int64_t)i * VEC);
    }
    cp_async_commit();
  };
  if constexpr (RESIDENT)
    if (tfill)
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        fill_vec(k, cluster_id);
  const P *gamma = (const P *)a.gamma;
  const P *beta = from_y ? (const P *)a.beta : nullptr;
  const float inv_n = count_rcp((float)a.cols);
  /* RESIDENT: gamma's fp32 chunk, then beta's (BETA_SMEM); else beta's alone. */
  [[maybe_unused]] float *sgamma =
      reinterpret_cast<float *>(dyn_smem + (size_t)2 * nstages * chunk_vecs * sizeof(V));
  [[maybe_unused]] float *sbeta = sgamma + (RESIDENT ? chunk_vecs * VEC : 0);
  bool mine[VPT];
  float gm[GPT], acc_g[EPT], acc_b[EPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    mine[k] = i < count;
    if (mine[k]) {
      if constexpr (RESIDENT) { /* read back only by this thread: no barrier */
        float g[VEC];
        load_param<P, VEC>(gamma, (v0 + i) * VEC, 1.f, g);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          sgamma[(int64_t)i * VEC + e] = g[e];
      } else {
        load_param<P, VEC>(gamma, (v0 + i) * VEC, 1.f, &gm[k * VEC]);
      }
      if constexpr (BETA_SMEM) { /* read back only by this thread: no barrier */
        float bt[VEC];
        load_param<P, VEC>(beta, (v0 + i) * VEC, 0.f, bt);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          sbeta[(int64_t)i * VEC + e] = bt[e];
      }
    } else if constexpr (!RESIDENT) {
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        gm[k * VEC + e] = 0.f;
    }
  }
#pragma unroll
  for (int j = 0; j < EPT; ++j)
    acc_g[j] = acc_b[j] = 0.f;
  /* The row's mean and rstd are loaded a row ahead, so their latency hides behind a row. */
  float cmu = 0.f, crs = 0.f;
  if (cluster_id < a.rows)
    row_stats(a, cluster_id, cmu, crs, from_y);
  int round = 0, xround = 0, s = 0;
  uint32_t phase = 0;
  for (int64_t row = cluster_id; row < a.rows; row += nclusters) {
    const float mu = cmu, rs = crs;
    if (row + nclusters < a.rows)
      row_stats(a, row + nclusters, cmu, crs, from_y);
    if (count > 0 && !tfill)
      mbar_wait(&full[s], phase);
    const V *sdy = ring + 2 * s * chunk_vecs, *sxy = sdy + chunk_vecs;
    if constexpr (RESIDENT) {
      /* dy, x (or y), gamma, beta of the thread's vector k: xhat and g = dy * gamma. */
      auto elems = [&](int k, float *d, float *xh, float *g) {
        const int i = threadIdx.x + k * blockDim.x;
        const V pd = sdy[i], px = sxy[i]; /* one access each */
        float xv[VEC], gk[VEC], bt[VEC];
        unpack_f32<T, VEC>(pd, d);
        unpack_f32<T, VEC>(px, xv);
        load_smem_f32<VEC>(sgamma + (int64_t)i * VEC, gk);
        if constexpr (BETA_SMEM)
          load_smem_f32<VEC>(sbeta + (int64_t)i * VEC, bt);
        else
          load_param<P, VEC>(beta, (v0 + i) * VEC, 0.f, bt);
        bwd_elems<VEC, RMS>(d, xv, gk, bt, mu, rs, from_y, xh, g);
      };
      float p0[4] = {0.f, 0.f, 0.f, 0.f}, p1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (mine[k]) {
          float d[VEC], xh[VEC], g[VEC];
          if (tfill) /* vector k's group has landed (one group a vector, in order) */
            cp_async_wait_upto(VPT - 1 - k);
          elems(k, d, xh, g);
          row_terms_add<VEC, RMS>(p0, p1, g, xh);
        }
      float sums[2];
      row_terms_total(p0, p1, sums);
      row_sums<RMS>(sums, a.layernorm, red, round);
      cluster_sum2<sizeof(T) == 2>(sums, red, xround, csize);
      const DxRow dr = dx_row(rs, sums[0], sums[1], inv_n);
      T *dxr = a.dx ? (T *)a.dx + row * a.dx_stride + v0 * VEC : nullptr;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (mine[k]) {
          float d[VEC], xh[VEC], g[VEC], out[VEC];
          elems(k, d, xh, g);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            out[e] = dx_elem<RMS>(dr, g[e], xh[e]);
            acc_g[k * VEC + e] += d[e] * xh[e];
            if (!RMS)
              acc_b[k * VEC + e] += d[e];
          }
          if (dxr)
            store_vec<T, VEC>(dxr + (int64_t)(threadIdx.x + k * blockDim.x) * VEC, out);
        }
        /* After the values read from vector k's slots are used (so the reads are done): its
         * refill with the next row's vector k. */
        if (tfill)
          fill_vec(k, row + nclusters);
      }
      __syncthreads(); /* every thread is done with the stage */
      if (threadIdx.x == 0 && count > 0 && !tfill) {
        const int64_t next = row + (int64_t)nstages * nclusters;
        if (next < a.rows) {
          fence_proxy_async();
          issue(s, next);
        }
      }
      if (++s == nstages) {
        s = 0;
        phase ^= 1u;
      }
    } else {
      float d[EPT], xh[EPT];
      /* Four partial sums each: short dependency chains without holding g for the whole row. */
      float p0[4] = {0.f, 0.f, 0.f, 0.f}, p1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (mine[k]) {
          const int i = threadIdx.x + k * blockDim.x;
          const V pd = sdy[i], px = sxy[i];
          float xv[VEC], bt[VEC], g[VEC];
          unpack_f32<T, VEC>(pd, &d[k * VEC]);
          unpack_f32<T, VEC>(px, xv);
          if constexpr (BETA_SMEM) {
            load_smem_f32<VEC>(sbeta + (int64_t)i * VEC, bt);
          } else {
            load_param<P, VEC>(beta, (v0 + i) * VEC, 0.f, bt);
          }
          bwd_elems<VEC, RMS>(&d[k * VEC], xv, &gm[k * VEC], bt, mu, rs, from_y, &xh[k * VEC], g);
          row_terms_add<VEC, RMS>(p0, p1, g, &xh[k * VEC]);
        } /* (d and xh of vectors not the thread's are never read: no zeroing each row) */
      }
      float sums[2];
      row_terms_total(p0, p1, sums);
      row_sums_post<RMS>(sums, a.layernorm, red, &sumbar, round);
      /* dgamma/dbeta need only dy and xhat: added while the other warps reach the sum. */
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (mine[k])
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const int j = k * VEC + e;
            acc_g[j] += d[j] * xh[j];
            if (!RMS)
              acc_b[j] += d[j];
          }
      row_sums_collect<RMS>(sums, red, &sumbar, round);
      if (threadIdx.x == 0 && count > 0) {
        const int64_t next = row + (int64_t)nstages * nclusters;
        if (next < a.rows) {
          fence_proxy_async();
          issue(s, next);
        }
      }
      if (++s == nstages) {
        s = 0;
        phase ^= 1u;
      }
      cluster_sum2<sizeof(T) == 2>(sums, red, xround, csize);
      const DxRow dr = dx_row(rs, sums[0], sums[1], inv_n);
      T *dxr = a.dx ? (T *)a.dx + row * a.dx_stride + v0 * VEC : nullptr;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (!mine[k])
          continue;
        const int i = threadIdx.x + k * blockDim.x;
        float out[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int j = k * VEC + e;
          out[e] = dx_elem<RMS>(dr, d[j] * gm[j], xh[j]);
        }
        if (dxr)
          store_vec<T, VEC>(dxr + (int64_t)i * VEC, out);
      }
    }
  }
  if constexpr (RESIDENT)
    if (tfill)
      cp_async_wait_n<0>(); /* (only empty groups can be pending) */
  if (a.want_dparams)
    write_partials<VEC, VPT, RMS>(a, cluster_id, v0, mine, acc_g, acc_b);
  cluster_barrier(csize);
#else
  (void)a;
  (void)chunk_vecs;
  (void)nstages;
  __trap(); /* dispatched on sm_90 and newer only */
#endif
}

/* ---- hold tier: rows past the ring's, each held whole over one cooperative launch (sm_90) ----
 *
 * 16-byte rows from x that the ring's clusters cannot hold (N past 262144) took the stream tier,
 * which reads x and dy twice (its ceiling 60% of the copy; 53% measured at 64 x 802816 fp32, run
 * DY), and fp32 rows past 185920 the RESIDENT form in one stage (66% at 512 x 262144). Here, as in
 * the forward's fwd_hold_kernel, each row is cut into `pieces` chunks over the
 * CTAs resident at once (hold_shape), `slots` rows at a time: CTA b takes chunk b % pieces of rows
 * b / pieces, b / pieces + slots, ... Its chunk of dy and x arrives in shared memory by bulk
 * copies, one part (one round of the threads' vectors, on its own mbarrier) at a time; the first
 * pass adds the chunk's two row sums and the dgamma/dbeta accumulators, the chunks' sums meet
 * through the workspace, and the second pass writes dx from the same stage, each part then
 * refilled with the CTA's chunk of its next row: x and dy are read from DRAM once, and the next
 * row's reads overlap this row's dx. As in the ring's RESIDENT form, the accumulators of the
 * CTA's fixed columns stay in registers across all its rows (VPT vectors a thread) and gamma's
 * fp32 chunk in shared memory beside the stage; one partial row a slot.
 *
 * The chunks meet through `posts` ([rows][pieces] pairs of sums) and `counts` ([rows]): a CTA
 * writes its pair, then adds 1 to the row's count (release); warp 0 of every chunk waits for the
 * count to reach `pieces` (acquire) and adds the pairs in piece order with the same code, so every
 * chunk of a row gets the same sums whatever the timing. The counts are zeroed by each slot's
 * first CTA before one grid-wide barrier (its first row's copies already in flight). Not from y
 * (the dispatch plans it from x only). PER_SM: the CTAs an SM it is built for (release builds 1,
 * as the RESIDENT form; tuning builds also 2 at half the vectors, FNORM_TUNE_BWD_HOLD_SM).
 * STAGES: rows a CTA has in shared memory at once (release builds 1; tuning builds also 2, at
 * four vectors a thread, FNORM_TUNE_BWD_HOLD_STAGES). With one, the next row's copy waits for
 * this row's dx; with two it is in flight all through this row's work, but each CTA holds half
 * the columns, and that lost more than the overlap gained: A/B run EK (H200, 2^27 elements) fp32
 * 262144 62.8-63.3% of the copy against one stage's 74.8-76.6% (sweep 108), 802816 47-49%
 * against 51-55%. */
template <typename T, typename P, int VEC, int VPT, int PER_SM, bool RMS, int STAGES>
__global__ void __launch_bounds__(kHoldThreads, PER_SM)
    bwd_hold_kernel(BwdParams a, int64_t chunk_vecs, int pieces, float2 *posts, unsigned *counts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(STAGES * VPT <= kBulkMaxPieces,
                "a part (mbarrier) a round of the threads' vectors");
  constexpr int EPT = VEC * VPT;
  typedef Pack<T, VEC> V;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ RingRed red;
  __shared__ unsigned long long full[STAGES * VPT];
  __shared__ float2 terms[2];
  const int nt = (int)blockDim.x;
  const int piece = (int)(blockIdx.x % (unsigned)pieces);
  const int64_t slot = blockIdx.x / (unsigned)pieces, nslots = gridDim.x / (unsigned)pieces;
  const int64_t nvec = a.cols / VEC;
  const int64_t v0 = (int64_t)piece * chunk_vecs;
  const int count = (int)chunk_count(nvec, chunk_vecs, piece);
  /* Shared memory from a line (smem_on_line): stage s's dy at 2s * chunk_vecs and x at
   * (2s + 1) * chunk_vecs (16-byte vectors), then gamma's fp32 chunk. */
  V *const stages = reinterpret_cast<V *>(smem_on_line(dyn_smem));
  float *sgamma = reinterpret_cast<float *>(stages + 2 * STAGES * chunk_vecs);
  const T *dychunk = (const T *)a.dy + v0 * VEC;
  const T *xchunk = (const T *)a.xy + v0 * VEC;
  bulk_barriers_init(full, STAGES * VPT, red, 1);
  /* Part k of stage s: vectors [k * nt, (k + 1) * nt) of the chunk, thread t's k-th, on mbarrier
   * full[s * VPT + k]; a part with none is never issued or waited on. */
  auto part_lo = [&](int k) { return min(count, k * nt); };
  auto issue = [&](int st, int k, int64_t row) {
    const int lo = part_lo(k), hi = part_lo(k + 1);
    if (lo < hi) {
      const uint32_t bytes = (uint32_t)(hi - lo) * (uint32_t)sizeof(V);
      unsigned long long *bar = &full[st * VPT + k];
      V *sdy = stages + 2 * st * chunk_vecs;
      mbar_expect(bar, 2 * bytes);
      bulk_load(sdy + lo, dychunk + row * a.dy_stride + (int64_t)lo * VEC, bytes, bar);
      bulk_load(sdy + chunk_vecs + lo, xchunk + row * a.xy_stride + (int64_t)lo * VEC, bytes, bar);
    }
  };
  if (threadIdx.x == 0)
    for (int st = 0; st < STAGES; ++st)
      if (slot + st * nslots < a.rows)
#pragma unroll
        for (int k = 0; k < VPT; ++k)
          issue(st, k, slot + st * nslots);
  if (piece == 0)
    for (int64_t row = slot + (int64_t)threadIdx.x * nslots; row < a.rows;
         row += (int64_t)nt * nslots)
      counts[row] = 0u;
  const P *gamma = (const P *)a.gamma;
  bool mine[VPT];
  float acc_g[EPT], acc_b[EPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int i = (int)threadIdx.x + k * nt;
    mine[k] = i < count;
    if (mine[k]) { /* read back only by this thread: no barrier */
      float g[VEC];
      load_param<P, VEC>(gamma, (v0 + i) * VEC, 1.f, g);
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        sgamma[(int64_t)i * VEC + e] = g[e];
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      acc_g[k * VEC + e] = acc_b[k * VEC + e] = 0.f;
  }
  cg::this_grid().sync(); /* every count zeroed before any post */
  const float inv_n = count_rcp((float)a.cols);
  int round = 0, term = 0, st = 0;
  uint32_t phase = 0;
  for (int64_t row = slot; row < a.rows; row += nslots) {
    const V *sdy = stages + 2 * st * chunk_vecs, *sx = sdy + chunk_vecs;
    float mu, rs;
    row_stats(a, row, mu, rs, 0);
    /* dy, xhat and g of the thread's vector k, from the stage (both passes) */
    auto elems = [&](int k, float *d, float *xh, float *g) {
      const int i = (int)threadIdx.x + k * nt;
      float xv[VEC], gm[VEC];
      unpack_f32<T, VEC>(sdy[i], d);
      unpack_f32<T, VEC>(sx[i], xv);
      load_smem_f32<VEC>(sgamma + (int64_t)i * VEC, gm);
      bwd_elems<VEC, RMS>(d, xv, gm, nullptr, mu, rs, 0, xh, g);
    };
    /* First pass: the chunk's sums of g and g * xhat, and dgamma/dbeta, each part as it lands. */
    float p0[4] = {0.f, 0.f, 0.f, 0.f}, p1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (part_lo(k) >= part_lo(k + 1))
        break;
      mbar_wait(&full[st * VPT + k], phase);
      if (mine[k]) {
        float d[VEC], xh[VEC], g[VEC];
        elems(k, d, xh, g);
        row_terms_add<VEC, RMS>(p0, p1, g, xh);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          acc_g[k * VEC + e] = fmaf(d[e], xh[e], acc_g[k * VEC + e]);
          if (!RMS)
            acc_b[k * VEC + e] += d[e];
        }
      }
    }
    float sums[2];
    row_terms_total(p0, p1, sums);
    row_sums<RMS>(sums, a.layernorm, red, round);
    /* Post the chunk's sums; warp 0 waits for the row's, adds them and hands them to the CTA. */
    if (threadIdx.x == 0) {
      __stcg(posts + row * pieces + piece, make_float2(sums[0], sums[1]));
      post_count_add(counts + row);
    }
    if (threadIdx.x < 32) {
      const int lane = (int)threadIdx.x;
      warp_wait_count(counts + row, (unsigned)pieces, lane);
      float tot[2] = {0.f, 0.f};
      for (int r = lane; r < pieces; r += 32) {
        const float2 q = __ldcg(posts + row * pieces + r);
        tot[0] += q.x;
        tot[1] += q.y;
      }
      group_sum<32, 2>(tot);
      if (lane == 0)
        terms[term] = make_float2(tot[0], tot[1]);
    }
    __syncthreads();
    const float2 tot = terms[term];
    term ^= 1; /* the next row's barriers separate this read from that slot's next write */
    const DxRow dr = dx_row(rs, RMS || !a.layernorm ? 0.f : tot.x, tot.y, inv_n);
    /* Second pass: dx, a part at a time; each part then takes the copy of the stage's next row
     * (with two stages the row after next: the next row's copy has been in flight since this
     * row's began, through its sums, its wait for the other chunks and its dx). */
    T *dxr = a.dx ? (T *)a.dx + row * a.dx_stride + v0 * VEC : nullptr;
    const int64_t next = row + STAGES * nslots;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (part_lo(k) >= part_lo(k + 1))
        break;
      if (mine[k] && dxr) {
        const int i = (int)threadIdx.x + k * nt;
        float d[VEC], xh[VEC], g[VEC], out[VEC];
        elems(k, d, xh, g);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          out[e] = dx_elem<RMS>(dr, g[e], xh[e]);
        store_vec<T, VEC>(dxr + (int64_t)i * VEC, out);
      }
      if (next < a.rows) {
        __syncthreads(); /* every thread done with part k */
        if (threadIdx.x == 0) {
          fence_proxy_async();
          issue(st, k, next);
        }
      }
    }
    if (++st == STAGES) {
      st = 0;
      phase ^= 1u;
    }
  }
  if (a.want_dparams)
    write_partials<VEC, VPT, RMS>(a, slot, v0, mine, acc_g, acc_b);
#else
  (void)a;
  (void)chunk_vecs;
  (void)pieces;
  (void)posts;
  (void)counts;
  __trap(); /* dispatched on sm_90 and newer only */
#endif
}

/* ---- stream tier: rows of any length ---- */

/* Block b handles row b / nchunks, vectors [chunk * chunk_vecs, ...) of it: partial sums of g
 * and g * xhat into rowpart[b][2]. */
template <typename T, typename P, int VEC>
__global__ void __launch_bounds__(256)
    bwd_rowpart_kernel(BwdParams a, int64_t chunk_vecs, int64_t nchunks, float *rowpart) {
  __shared__ ReduceSmem<2> red;
  const int64_t nvec = a.cols / VEC;
  const P *gamma = (const P *)a.gamma;
  const P *beta = a.from_y ? (const P *)a.beta : nullptr;
  int round = 0;
  for (int64_t b = blockIdx.x; b < a.rows * nchunks; b += gridDim.x) {
    const int64_t row = b / nchunks, v0 = (b % nchunks) * chunk_vecs;
    const int64_t v1 = v0 + chunk_vecs < nvec ? v0 + chunk_vecs : nvec;
    float mu, rs;
    row_stats(a, row, mu, rs);
    float s[2] = {0.f, 0.f};
#pragma unroll 4
    for (int64_t v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
      const int64_t col = v * VEC;
      float d[VEC], xv[VEC], gm[VEC], bt[VEC], xh[VEC], g[VEC];
      load_stream_f32<T, VEC>((const T *)a.dy + row * a.dy_stride + col, d);
      load_stream_f32<T, VEC>((const T *)a.xy + row * a.xy_stride + col, xv);
      load_param<P, VEC>(gamma, col, 1.f, gm);
      load_param<P, VEC>(beta, col, 0.f, bt);
      bwd_elems<VEC>(d, xv, gm, bt, mu, rs, a.from_y, xh, g);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        s[0] += g[e];
        s[1] += g[e] * xh[e];
      }
    }
    row_sum<2>(s, red, round, 0, 1);
    if (threadIdx.x == 0) {
      rowpart[2 * b] = a.layernorm ? s[0] : 0.f;
      rowpart[2 * b + 1] = s[1];
    }
  }
}

__global__ void bwd_rowsum_kernel(const float *rowpart, int64_t rows, int64_t nchunks,
                                  float *rowsum) {
  for (int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; row < rows;
       row += (int64_t)gridDim.x * blockDim.x) {
    float s0 = 0.f, s1 = 0.f;
    for (int64_t c = 0; c < nchunks; ++c) {
      s0 += rowpart[2 * (row * nchunks + c)];
      s1 += rowpart[2 * (row * nchunks + c) + 1];
    }
    rowsum[2 * row] = s0;
    rowsum[2 * row + 1] = s1;
  }
}

/* Block (cb, part): vector column cb * blockDim.x + threadIdx.x, rows of part `part`. */
template <typename T, typename P, int VEC>
__global__ void __launch_bounds__(256)
    bwd_colpass_kernel(BwdParams a, const float *rowsum, int64_t rows_per_part) {
  pdl_allow_dependents();
  const int64_t nvec = a.cols / VEC;
  const int64_t ncb = (nvec + blockDim.x - 1) / blockDim.x;
  const int64_t part = blockIdx.x / ncb;
  const int64_t v = (blockIdx.x % ncb) * blockDim.x + threadIdx.x;
  if (v >= nvec)
    return;
  const int64_t col = v * VEC;
  const float inv_n = count_rcp((float)a.cols);
  float gm[VEC], bt[VEC], acc_g[VEC], acc_b[VEC];
  load_param<P, VEC>((const P *)a.gamma, col, 1.f, gm);
  load_param<P, VEC>(a.from_y ? (const P *)a.beta : nullptr, col, 0.f, bt);
#pragma unroll
  for (int e = 0; e < VEC; ++e)
    acc_g[e] = acc_b[e] = 0.f;
  const int64_t r0 = part * rows_per_part;
  const int64_t r1 = r0 + rows_per_part < a.rows ? r0 + rows_per_part : a.rows;
#pragma unroll 4
  for (int64_t row = r0; row < r1; ++row) {
    float mu, rs;
    row_stats(a, row, mu, rs);
    const DxRow dr = dx_row(rs, rowsum[2 * row], rowsum[2 * row + 1], inv_n);
    float d[VEC], xv[VEC], xh[VEC], g[VEC], out[VEC];
    load_stream_f32<T, VEC>((const T *)a.dy + row * a.dy_stride + col, d);
    load_stream_f32<T, VEC>((const T *)a.xy + row * a.xy_stride + col, xv);
    bwd_elems<VEC>(d, xv, gm, bt, mu, rs, a.from_y, xh, g);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      out[e] = dx_elem(dr, g[e], xh[e]);
      acc_g[e] += d[e] * xh[e];
      acc_b[e] += d[e];
    }
    if (a.dx)
      store_vec<T, VEC>((T *)a.dx + row * a.dx_stride + col, out);
  }
  if (a.want_dparams) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      a.partial[part * a.cols + col + e] = acc_g[e];
      a.partial[(a.nparts + part) * a.cols + col + e] = acc_b[e];
    }
  }
}

/* dgamma[c] (blockIdx.y 0) or dbeta[c] (1) = sum over p of partial[p][c], p in a fixed
 * interleaving: lane ty adds p = ty, ty + blockDim.y, ..., then the lanes are added in order
 * ty = 0, 1, ...: a fixed order whatever the timing, so the results are bitwise the same from
 * run to run. A block covers blockDim.x * W columns with blockDim.y lanes (launch_backward):
 * with few columns (small problems) narrower blocks put more CTAs and more loads in flight
 * (ncu4: at N = 1024 blocks of 32 columns ran 32 CTAs, 10 us, as long as the backward). W
 * columns a thread: 1, or 4 (plan.fin_vec: 16-byte loads; cols a multiple of 4, the workspace
 * 16-byte aligned, blockDim.x * blockDim.y at most 256), which ncu29 and A/B run FH (session 53)
 * measured on rows of 16384 columns and more: one float a thread read 17 MB of partial rows in
 * 15.8 us at bf16 LayerNorm 512 x 262144. */
template <typename P, int W>
__global__ void __launch_bounds__(1024)
    finalize_kernel(const float *partial, int64_t nparts, int64_t cols, P *dgamma, P *dbeta) {
  static_assert(W == 1 || W == 4, "1 or 4 columns a thread");
  __shared__ float4 red[1024 / 4]; /* [lane][column of the block] */
  P *out = blockIdx.y == 0 ? dgamma : dbeta;
  if (!out) /* uniform over the block */
    return;
  pdl_wait_prerequisites(); /* the row kernel's partials (launch_backward) */
  const int64_t col = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * W;
  const float *src = partial + (int64_t)blockIdx.y * nparts * cols;
  float s[W];
#pragma unroll
  for (int j = 0; j < W; ++j)
    s[j] = 0.f;
  if (col < cols) /* (W 4: cols a multiple of 4, so all four columns lie in the row) */
#pragma unroll 8
    for (int64_t p = threadIdx.y; p < nparts; p += blockDim.y) {
      if constexpr (W == 4) {
        const float4 v = *reinterpret_cast<const float4 *>(src + p * cols + col);
        s[0] += v.x;
        s[1] += v.y;
        s[2] += v.z;
        s[3] += v.w;
      } else {
        s[0] += src[p * cols + col];
      }
    }
  if (blockDim.y == 1) {
    if (col < cols)
#pragma unroll
      for (int j = 0; j < W; ++j)
        out[col + j] = from_f32<P>(s[j]);
    return;
  }
  float *redf = reinterpret_cast<float *>(red);
  const int slot = threadIdx.y * blockDim.x + threadIdx.x;
  if constexpr (W == 4)
    red[slot] = make_float4(s[0], s[1], s[2], s[3]);
  else
    redf[slot] = s[0];
  __syncthreads();
  if (threadIdx.y == 0 && col < cols)
#pragma unroll
    for (int j = 0; j < W; ++j) {
      float t = 0.f;
      for (int r = 0; r < (int)blockDim.y; ++r)
        t += redf[(r * blockDim.x + threadIdx.x) * W + j];
      out[col + j] = from_f32<P>(t);
    }
}

/* The warp tier's kernel for GROUP lanes a row and a.from_y, or nullptr where that form is not
 * built. Rows over 2, 4 or 8 warps (64, 128 or 256 lanes) need 16-byte vectors. 16-byte rows of a
 * warp or more read gamma/beta from shared memory (PARAM_SMEM, sweep 26); tuning builds also keep
 * their global-memory form, to compare (FNORM_TUNE_BWD_PARAM_SMEM=0). Shorter rows and rows of
 * single elements read global memory. from_y as bwd_ring_from: fixed at compile time for the
 * paths the library plans, the run-time form for tuning builds' other combinations (A/B run AG1,
 * H200: 16-bit N = 256-768 +1 to +9%, from y +1 to +5%, but 16-bit from x N = 1024-2048 -1 to
 * -5% with the same registers and occupancy). From x, RMSNorm rows without dbeta (rms) have
 * kernels of their own (RMS), save the clustered form. */
template <typename T, typename P, int VEC, int VPT, bool PARAM_SMEM, int GROUP,
          bool CLUSTER = false>
static void (*bwd_warp_built(int from_y, bool full = false, bool rms = false))(BwdParams) {
  constexpr bool WIDE = VEC * sizeof(T) == 16;
  constexpr bool BUILT =
      GROUP < 32 ? !PARAM_SMEM : (PARAM_SMEM || !WIDE || kTuningBuild) && (GROUP == 32 || WIDE);
  constexpr int Y = kPlannedFromY<T>;
  if constexpr (BUILT) {
    /* Rows of exactly GROUP * VPT vectors: the form without column tests, on fp32 rows and on
     * 16-bit rows of one warp. A/B run AH1 (H200, 2^27 elements, builds alternated): fp32 N =
     * 256-4096 +0.1 to +0.8%, 16-bit N = 512 (32 lanes) +1.7 to +2.4%; but 16-bit 256 (16
     * lanes) -0.9 to -2.2%, 2048 (4 warps) -0.6 to -1.3%, 4096 (8 warps) -4.8 to -6.9%, with
     * registers and occupancy unchanged. */
    if constexpr (WIDE && !CLUSTER && (sizeof(T) == 4 || GROUP == 32))
      if (full) {
        if (from_y == 0)
          return rms ? bwd_warp_kernel<T, P, VEC, GROUP, VPT, PARAM_SMEM, false, 0, true, true>
                     : bwd_warp_kernel<T, P, VEC, GROUP, VPT, PARAM_SMEM, false, 0, true>;
        if (from_y == Y)
          return bwd_warp_kernel<T, P, VEC, GROUP, VPT, PARAM_SMEM, false, Y, true>;
      }
    if (from_y == 0 && rms && !CLUSTER)
      return bwd_warp_kernel<T, P, VEC, GROUP, VPT, PARAM_SMEM, false, 0, false, true>;
    if (from_y == 0)
      return bwd_warp_kernel<T, P, VEC, GROUP, VPT, PARAM_SMEM, CLUSTER, 0>;
    if (from_y == Y)
      return bwd_warp_kernel<T, P, VEC, GROUP, VPT, PARAM_SMEM, CLUSTER, Y>;
    if constexpr (kTuningBuild)
      return bwd_warp_kernel<T, P, VEC, GROUP, VPT, PARAM_SMEM, CLUSTER, -1>;
  }
  return nullptr;
}

/* The same for `group` lanes a row (nullptr for any other count). */
template <typename T, typename P, int VEC, int VPT, bool PARAM_SMEM>
static void (*bwd_warp_group(int group, int from_y, bool full, bool rms))(BwdParams) {
  switch (group) {
  case 4:
    return bwd_warp_built<T, P, VEC, VPT, PARAM_SMEM, 4>(from_y, full, rms);
  case 8:
    return bwd_warp_built<T, P, VEC, VPT, PARAM_SMEM, 8>(from_y, full, rms);
  case 16:
    return bwd_warp_built<T, P, VEC, VPT, PARAM_SMEM, 16>(from_y, full, rms);
  case 32:
    return bwd_warp_built<T, P, VEC, VPT, PARAM_SMEM, 32>(from_y, full, rms);
  case 64:
    return bwd_warp_built<T, P, VEC, VPT, PARAM_SMEM, 64>(from_y, full, rms);
  case 128:
    return bwd_warp_built<T, P, VEC, VPT, PARAM_SMEM, 128>(from_y, full, rms);
  case 256:
    return bwd_warp_built<T, P, VEC, VPT, PARAM_SMEM, 256>(from_y, full, rms);
  default:
    return nullptr;
  }
}

/* The ring kernel for a.from_y: built with it fixed (FROM_Y) for the paths the library plans
 * (from x; from y by __fdividef on 16-bit rows, by IEEE division on fp32 rows; the RESIDENT form
 * from x only; beta from shared memory from y only), so that each kernel holds one element path;
 * from x, RMSNorm rows without dbeta (rms) take a kernel of their own (RMS).
 * Tuning builds take their other combinations (FNORM_TUNE_BWD_FAST_DIV, _RING_RESIDENT=2) through
 * the form that branches at run time; release builds have none (nullptr). */
template <typename T, typename P, int VEC, int VPT, bool BETA_SMEM, bool RESIDENT>
static void (*bwd_ring_from(int from_y, bool rms))(BwdParams, int64_t, int) {
  constexpr int Y = kPlannedFromY<T>;
  if constexpr (!BETA_SMEM)
    if (from_y == 0)
      return rms ? bwd_ring_kernel<T, P, VEC, VPT, false, RESIDENT, 0, true>
                 : bwd_ring_kernel<T, P, VEC, VPT, false, RESIDENT, 0>;
  if constexpr (!RESIDENT)
    if (from_y == Y)
      return bwd_ring_kernel<T, P, VEC, VPT, BETA_SMEM, false, Y>;
  if constexpr (kTuningBuild)
    return bwd_ring_kernel<T, P, VEC, VPT, BETA_SMEM, RESIDENT, -1>;
  return nullptr;
}

/* A persistent launch of a row kernel that writes one dgamma/dbeta partial row a cluster (or
 * CTA): as many clusters as are resident at once, at most max_units (the workspace's bound), with
 * a.nparts set to their count for the kernel and the finalize. */
template <typename... KArgs, typename... Args>
static fnorm_status launch_parts(void (*k)(KArgs...), int threads, size_t smem, int cluster,
                                 int64_t max_units, cudaStream_t stream, BwdParams &a,
                                 Args... rest) {
  int64_t units = 0;
  const fnorm_status st = kernel_attributes(k, smem, cluster) != FNORM_SUCCESS
                              ? FNORM_ERR_CUDA
                              : persistent_units(k, threads, smem, cluster, max_units, &units);
  if (st != FNORM_SUCCESS)
    return st;
  a.nparts = units;
  return launch_prepared(k, units * cluster, threads, smem, cluster, stream, a, rest...);
}

/* Launches bwd_hold_kernel: the rows cut again (hold_shape) by the CTAs the device holds at once
 * at the plan's shared memory, as one cooperative launch (every CTA resident, which the grid-wide
 * barrier and the waits for other chunks' posts need), with a.nparts set to its slots. */
template <typename T, typename P, int VEC>
static fnorm_status launch_bwd_hold(const Plan &plan, BwdParams &a, char *ws, bool rms,
                                    cudaStream_t stream) {
  void (*k)(BwdParams, int64_t, int, float2 *, unsigned *) = nullptr;
  constexpr int VPT1 = bwd_hold_vpt(VEC, 1, 1); /* one stage, a CTA an SM */
  /* (release builds plan fp32 rows only, so build no other) */
  if constexpr (sizeof(T) == 4 || kTuningBuild)
    if (plan.nbuf == 1 && plan.vpt == VPT1 && !a.from_y)
      k = rms ? bwd_hold_kernel<T, P, VEC, VPT1, 1, true, 1>
              : bwd_hold_kernel<T, P, VEC, VPT1, 1, false, 1>;
  if constexpr (kTuningBuild) { /* two stages, or two CTAs an SM (FNORM_TUNE_BWD_HOLD_*) */
    constexpr int VPT2 = bwd_hold_vpt(VEC, 1, 2), VPT1H = bwd_hold_vpt(VEC, 2, 1);
    if (plan.nbuf == 2 && plan.vpt == VPT2 && !a.from_y)
      k = rms ? bwd_hold_kernel<T, P, VEC, VPT2, 1, true, 2>
              : bwd_hold_kernel<T, P, VEC, VPT2, 1, false, 2>;
    if (plan.nbuf == 1 && plan.vpt == VPT1H && !a.from_y)
      k = rms ? bwd_hold_kernel<T, P, VEC, VPT1H, 2, true, 1>
              : bwd_hold_kernel<T, P, VEC, VPT1H, 2, false, 1>;
  }
  if (!k || plan.threads != kHoldThreads)
    return FNORM_ERR_UNSUPPORTED;
  int64_t ctas = 0;
  /* (at most the plan's CTAs: the workspace holds the slots and pieces of a cut over those) */
  const fnorm_status st = resident_ctas(k, plan.threads, plan.smem, plan.nchunks, &ctas);
  if (st != FNORM_SUCCESS)
    return st;
  HoldShape hs;
  if (!hold_shape(a.cols / VEC, a.rows, ctas, (int64_t)plan.vpt * plan.threads, &hs) ||
      hs.slots > plan.nparts || hs.pieces > plan.nchunks)
    return FNORM_ERR_UNSUPPORTED;
  a.nparts = hs.slots;
  return launch_cooperative(k, (int64_t)hs.pieces * hs.slots, plan.threads,
                            (size_t)hs.chunk * bwd_hold_vec_bytes(VEC, plan.nbuf) + kDynSmemLinePad,
                            stream, a, hs.chunk, hs.pieces,
                            reinterpret_cast<float2 *>(ws + plan.ws_rowpart),
                            reinterpret_cast<unsigned *>(ws + plan.ws_rowsum));
}

template <typename T, typename P, int VEC>
static fnorm_status launch_backward_vec(const Plan &plan, BwdParams &a, char *ws, bool rms,
                                        cudaStream_t stream) {
  if (plan.tier == TIER_RING) {
    if constexpr (VEC * sizeof(T) == 16) {
      /* param_smem: beta from shared memory (from y; set by the dispatch where it fits). */
      void (*k)(BwdParams, int64_t, int) =
          plan.param_smem ? bwd_ring_from<T, P, VEC, kRingVpt, true, false>(a.from_y, rms)
                          : bwd_ring_from<T, P, VEC, kRingVpt, false, false>(a.from_y, rms);
      int vpt = kRingVpt;
      if constexpr (sizeof(T) == 4) /* fp32 rows past 8192 vectors, from x (plan_backward) */
        if (plan.vpt == kRingVptWide && !plan.variant) {
          vpt = kRingVptWide;
          k = a.from_y || plan.param_smem || rms
                  ? nullptr
                  : bwd_ring_kernel<T, P, VEC, kRingVptWide, false, false, 0>;
        }
      if (plan.variant) { /* RESIDENT: planned on rows from x (plan_backward) */
        constexpr int RV = ring_resident_vpt(VEC);
        k = nullptr;
        vpt = RV;
        if constexpr (kTuningBuild) /* (and from y, with beta from shared memory) */
          k = plan.param_smem ? bwd_ring_from<T, P, VEC, RV, true, true>(a.from_y, rms)
                              : bwd_ring_from<T, P, VEC, RV, false, true>(a.from_y, rms);
        else
          k = plan.param_smem ? nullptr : bwd_ring_from<T, P, VEC, RV, false, true>(a.from_y, rms);
      }
      if (!k)
        return FNORM_ERR_UNSUPPORTED;
      if (plan.vpt != vpt || (plan.param_smem && !a.from_y) ||
          (plan.thread_fill && !(plan.variant && plan.nbuf == 1)))
        return FNORM_ERR_UNSUPPORTED;
      a.ring_fill = plan.thread_fill;
      return launch_parts(k, plan.threads, plan.smem, plan.cluster, plan.nparts, stream, a,
                          plan.chunk, plan.nbuf);
    }
    return FNORM_ERR_UNSUPPORTED; /* the ring needs 16-byte vectors */
  }
  if (plan.tier == TIER_BATCH) {
    /* The kernel's shape must be the plan's (batch_shape), and the row exactly its vectors. */
    int threads = 0, vpt = 0, round_rows = 0, stages = 0, cluster = 0;
    batch_shape(a.cols, (int)sizeof(T), threads, vpt, round_rows, stages, cluster);
    void (*k)(BwdParams) = VEC * sizeof(T) == 16 ? bwd_batch_pick<T, P>(a.cols, rms) : nullptr;
    if (!k || a.from_y || plan.threads != threads || plan.vpt != vpt ||
        plan.round_rows != round_rows || plan.nbuf != stages || plan.cluster != cluster ||
        a.cols != (int64_t)threads * vpt * VEC * cluster)
      return FNORM_ERR_UNSUPPORTED;
    return launch_parts(k, plan.threads, plan.smem, cluster, plan.nparts, stream, a);
  }
  if (plan.tier == TIER_WARP) {
    constexpr int VPT = 16 / VEC;
    void (*k)(BwdParams) = nullptr;
    /* 16-byte rows of exactly the plan's lanes times vectors (no cluster): no column tests. */
    const bool full = VEC * sizeof(T) == 16 && plan.cluster <= 1 &&
                      a.cols == (int64_t)plan.group * plan.vpt * VEC;
    if (plan.vpt == VPT && !plan.param_smem)
      k = bwd_warp_group<T, P, VEC, VPT, false>(plan.group, a.from_y, full, rms);
    if constexpr (VEC * sizeof(T) == 16)
      if (plan.vpt == VPT && plan.param_smem)
        k = bwd_warp_group<T, P, VEC, VPT, true>(plan.group, a.from_y, full, rms);
    /* A cluster of 8-warp CTAs a row: fp32 rows (16-bit ones in tuning builds only). */
    const int cl = plan.cluster > 1 ? plan.cluster : 1;
    if (cl > 1) {
      k = nullptr;
      if constexpr (VEC * sizeof(T) == 16 && (sizeof(T) == 4 || kTuningBuild))
        if (plan.vpt == VPT && plan.group == 256 && plan.param_smem)
          k = bwd_warp_built<T, P, VEC, VPT, true, 256, true>(a.from_y);
    }
    if (!k)
      return FNORM_ERR_UNSUPPORTED;
    /* The plan's stages (or fold buffer), then gamma (and beta, from y) as fp32 for the CTA's
     * columns: the row's, or its chunk of the cluster's. */
    size_t smem = plan.smem;
    const int64_t pcols = cl > 1 ? (a.cols / VEC + cl - 1) / cl * VEC : a.cols;
    if (plan.param_smem)
      smem += (size_t)(a.from_y ? 2 : 1) * pcols * sizeof(float);
    /* The CTAs (clusters) loop over their rows, so more than fit at once (registers allow 2 CTAs
     * an SM) only make a second wave and more partial rows to write and add. */
    const int64_t units = plan.grid / cl;
    if (!plan.resident) /* (tuning builds: FNORM_TUNE_BWD_RESIDENT=0) */
      return launch_kernel(k, units * cl, plan.threads, smem, cl, stream, a);
    return launch_parts(k, plan.threads, smem, cl, units, stream, a);
  }
  if (plan.tier == TIER_ROW && plan.mode == MODE_HOLD) {
    if constexpr (VEC * sizeof(T) == 16)
      return launch_bwd_hold<T, P, VEC>(plan, a, ws, rms, stream);
    return FNORM_ERR_UNSUPPORTED; /* the hold tier needs 16-byte vectors */
  }
  if (plan.tier == TIER_ROW && plan.mode == MODE_REG) {
    constexpr int VPT = bwd_reg_vpt(VEC);
    if (plan.vpt != VPT)
      return FNORM_ERR_UNSUPPORTED;
    return launch_kernel(bwd_reg_kernel<T, P, VEC, VPT>, plan.grid, plan.threads, plan.smem,
                         plan.cluster * plan.cluster_rows, stream, a, plan.chunk, plan.cluster);
  }
  if (plan.tier == TIER_STREAM) {
    float *rowpart = reinterpret_cast<float *>(ws + plan.ws_rowpart);
    float *rowsum = reinterpret_cast<float *>(ws + plan.ws_rowsum);
    int64_t blocks = a.rows * plan.nchunks;
    if (blocks > (1 << 20))
      blocks = 1 << 20;
    fnorm_status s = launch_kernel(bwd_rowpart_kernel<T, P, VEC>, blocks, 256, 0, 1, stream, a,
                                   plan.chunk, plan.nchunks, rowpart);
    if (s != FNORM_SUCCESS)
      return s;
    int64_t rblocks = (a.rows + 255) / 256;
    if (rblocks > (1 << 20))
      rblocks = 1 << 20;
    s = launch_kernel(bwd_rowsum_kernel, rblocks, 256, 0, 1, stream, (const float *)rowpart, a.rows,
                      plan.nchunks, rowsum);
    if (s != FNORM_SUCCESS)
      return s;
    return launch_kernel(bwd_colpass_kernel<T, P, VEC>, plan.grid, plan.threads, 0, 1, stream, a,
                         (const float *)rowsum, plan.rows_per_part);
  }
  return FNORM_ERR_UNSUPPORTED;
}

template <typename T, typename P>
fnorm_status launch_backward(const Plan &planned, BwdParams args, void *dgamma, void *dbeta,
                             void *workspace, cudaStream_t stream, const Plan *fallback) {
  constexpr int VEC = 16 / sizeof(T);
  char *ws = static_cast<char *>(workspace);
  args.want_dparams = dgamma != nullptr || dbeta != nullptr;
  BwdParams a;
  /* The row kernels of a plan, with a set for them and the finalize. */
  auto row_kernels = [&](const Plan &plan) {
    a = args;
    a.partial = reinterpret_cast<float *>(ws + plan.ws_partial);
    a.nparts = plan.nparts;
    /* RMSNorm without dbeta (a beta is optional) on the kernels of its own (RMS), where planned */
    const bool rms = plan.rms_form && !a.layernorm && dbeta == nullptr;
    if (plan.vec == VEC)
      return launch_backward_vec<T, P, VEC>(plan, a, ws, rms, stream);
    if (plan.vec == 1)
      return launch_backward_vec<T, P, 1>(plan, a, ws, rms, stream);
    return FNORM_ERR_UNSUPPORTED;
  };
  const Plan *used = &planned;
  fnorm_status s = row_kernels(planned);
  /* The hold tier's cooperative launch refused: nothing of this call has run yet (the finalize
   * follows), so the fallback plan runs it instead. */
  if (s != FNORM_SUCCESS && fallback) {
    used = fallback;
    s = row_kernels(*fallback);
  }
  const Plan &plan = *used;
  if (s != FNORM_SUCCESS || !a.want_dparams)
    return s;
  /* Lanes: the partial rows, up to 1024 threads a block (256 at four columns a thread) /
   * fin_cols; threads across the columns: fin_cols, more while the block has fewer than 256
   * threads (few partial rows, as the stream tier has: blocks of one warp made 64 x 802816 fp32
   * 2 points slower). */
  const int w = plan.fin_vec == 4 ? 4 : 1;
  int fcols = plan.fin_cols == 16 ? 16 : 32;
  int lanes = 1;
  while (lanes < 1024 / w / fcols && lanes < a.nparts)
    lanes *= 2;
  while (fcols * lanes < 256)
    fcols *= 2;
  const int64_t blocks = (a.cols + (int64_t)fcols * w - 1) / ((int64_t)fcols * w);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks, 2, 1); /* y: dgamma, dbeta */
  cfg.blockDim = dim3((unsigned)fcols, (unsigned)lanes, 1);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (plan.fin_pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  if (cudaLaunchKernelEx(&cfg, w == 4 ? finalize_kernel<P, 4> : finalize_kernel<P, 1>,
                         (const float *)a.partial, a.nparts, a.cols, (P *)dgamma,
                         (P *)dbeta) != cudaSuccess)
    return FNORM_ERR_CUDA;
  return cudaGetLastError() == cudaSuccess ? FNORM_SUCCESS : FNORM_ERR_CUDA;
}

template fnorm_status launch_backward<float, float>(const Plan &, BwdParams, void *, void *, void *,
                                                    cudaStream_t, const Plan *);
template fnorm_status launch_backward<f16, f16>(const Plan &, BwdParams, void *, void *, void *,
                                                cudaStream_t, const Plan *);
template fnorm_status launch_backward<f16, float>(const Plan &, BwdParams, void *, void *, void *,
                                                  cudaStream_t, const Plan *);
template fnorm_status launch_backward<bf16, bf16>(const Plan &, BwdParams, void *, void *, void *,
                                                  cudaStream_t, const Plan *);
template fnorm_status launch_backward<bf16, float>(const Plan &, BwdParams, void *, void *, void *,
                                                   cudaStream_t, const Plan *);

} // namespace fnorm_cuda
