/*
 * Forward kernels: LayerNorm and RMSNorm, one pass over x (read once, y written once).
 *
 *  fwd_warp_kernel    rows of up to 256 vectors: GROUP lanes per row (several rows per warp for
 *                     short rows), VPT vectors per lane held in registers; persistent 8-warp
 *                     CTAs, or (16-byte rows of a warp, fp32 rows, many rows) a one-warp CTA
 *                     for each warp's rows.
 *  fwd_rows_kernel    many 16-byte rows of 32-256 vectors (rows_form_shape): one-warp CTAs,
 *                     not persistent, each taking a few rows at once over the whole warp or,
 *                     16-bit rows of 256 and 384 elements, over each half of it.
 *                     fwd_rows_packed_kernel: 16-bit LayerNorm rows of 4096-32768 and RMSNorm
 *                     rows of 16384 and 32768 (below 2^27 elements) and 65536 (below 2^26),
 *                     fp32 LayerNorm rows of 5120 (and 8192, which fwd_loop_ln_kernel
 *                     takes first since A/B run CW; FNORM_TUNE_FWD_LOOP=0 in tuning builds
 *                     gives them back) (packed_rows_shape), a row a CTA of 1-8 warps in
 *                     registers, 16-bit rows held as their words and converted again on each
 *                     pass.
 *  fwd_cta_kernel     16-byte rows one CTA of up to 1024 threads holds (32768 elements), when
 *                     there are at least two rows an SM: a CTA per row, not persistent.
 *                     fwd_cta_reread_kernel (fp32 RMSNorm rows of up to 8191, those of
 *                     2048-4096 below 2^25 elements) holds the row only until its statistics
 *                     are known and reads it again, from L2, for y. fwd_loop_kernel (fp32
 *                     RMSNorm rows of 2048-4096 from 2^25 elements, and in its full form fp32
 *                     RMSNorm rows of 5120, 8192, 16384 (from 2^25), 32768 and 65536 and
 *                     16-bit ones of 8192-65536 (loop_full_form_threads)) reads it as
 *                     torch.compile's kernels do: evict-last in L1 and L2 for the statistics,
 *                     evict-first for y; fwd_loop_ln_kernel the same for fp32 LayerNorm rows
 *                     of 8192, 16384 and 32768 (the last two from 2^25 elements).
 *                     fwd_lean_kernel (RMSNorm rows of 2049-32768 as sweep 52 measured them,
 *                     those of 16384 and 32768 from 2^25 elements on the packed form,
 *                     16-bit LayerNorm rows of up to 4096 and of 8193-32768, fp32 LayerNorm
 *                     rows of 5120-16384 (sweeps 61-62)) fits 32 registers, two CTAs of 1024
 *                     threads an SM, and reads x again for y from L1. Its clustered form
 *                     (sm_90, persistent) takes 16-bit rows of 32769-65535 and 262144-524288
 *                     elements over up to 16 CTAs (sweeps 59-60).
 *  fwd_batch_kernel   rows of 65536 and 262144 with gamma in their dtype from 2^25 elements
 *                     (sm_90; fwd_batch_shape): a cluster of 8 or 16 CTAs a row, persistent,
 *                     one or two rows a round staged by cp.async, gamma and beta in registers.
 *  fwd_reg_kernel     other rows up to 16 * 512 * 32 elements: a CTA, or a cluster of up to 16
 *                     CTAs (sm_90), per row, persistent, the row in registers and the next
 *                     row's loads in flight.
 *  fwd_row_kernel     longer rows: a CTA, or a cluster of CTAs that share the row through
 *                     distributed shared memory (sm_90), each CTA owning one contiguous chunk.
 *                     STAGED copies the chunk into shared memory with cp.async (many bytes in
 *                     flight, no register cost) and computes from there; otherwise the chunk is
 *                     re-read from global memory for each pass (L2 usually still holds it).
 *  fwd_stream_kernel  fp32 vector rows too long for the register kernel (16-bit ones take
 *                     fwd_bulk_kernel or fwd_row_kernel): each CTA streams its chunk once for the
 *                     statistics and once for y, the second pass mostly from L2.
 *  fwd_hold_kernel    fp32 RMSNorm vector rows too long for the register kernel (sm_90, not in
 *                     place): each row held whole in shared memory, cut into chunks over every
 *                     resident CTA of one cooperative launch, the chunks' statistics posted
 *                     through y (the call has no workspace).
 *  fwd_spread_kernel  fp32 LayerNorm vector rows of about 634K-1014K elements (sm_90, not in
 *                     place): one CTA an SM, each owning the same chunk of every row (gamma and
 *                     beta in registers for the launch), rows staged in shared memory several
 *                     deep, the chunks' statistics posted through y and y written three rows
 *                     behind them.
 *  fwd_bulk_kernel    16-bit vector rows past 2^16 vectors (sm_90) whose chunk a CTA's shared
 *                     memory holds: a cluster per row, the chunk copied in by bulk copies piece
 *                     by piece, each piece refilled with the next row's once its y is out.
 * fwd_warp_kernel, fwd_cta_kernel and fwd_reg_kernel also have a FULL form, for rows that their
 * threads' vectors fill exactly (every row of the benchmark grid): no per-vector tests. The
 * launcher picks it where A/B runs AH1-AH3 measured it faster (see each kernel).
 *
 * Statistics, all in fp32 and in fixed orders. LayerNorm in the register tiers: each thread
 * centres its values on their own mean and the lanes, warps and a cluster's CTAs are combined
 * by Chan's update (cta_ln_stats, ln_cluster_stats); fwd_reg_kernel reduces the CTA's sum, then
 * the sums centred on the CTA's mean, and combines a cluster's CTAs the same way;
 * fwd_warp_kernel and fwd_row_kernel reduce sum(x), then sum(x - m1) and sum((x - m1)^2)
 * (ln_stats). RMSNorm reduces sum(x^2).
 *
 * Tried and dropped (bench/tune/): a bulk-copy ring like the backward's (slower than the
 * register kernel at every N on an H200), 16 instead of 32 elements a thread, L2 bulk
 * prefetches rows ahead (no gain; the disabled code alone cost the warp tier 10 points),
 * clusters of fwd_cta_kernel for longer rows (slower than fwd_reg_kernel), the streaming kernel
 * for fwd_cta_kernel's rows (18-62% of the copy), the reread form for LayerNorm and 16-bit
 * rows (its register budget spills them; sweeps 33, 35 and 50), and for the warp tier's staged
 * 16-bit rows of 8-16 lanes a grid of only the resident CTAs or a 64-register bound for a
 * fourth CTA an SM (A/B runs AA1-AA2: 4-10% slower), and for fp32 rows past the register
 * kernel's an L2 form of the streaming kernel (one CTA an SM, so that x's second read hits L2;
 * sweep 56: 7 clusters of 16 resident, 35-50% of the copy against 54-66%), the bulk-copy
 * kernel (sweep 57: LayerNorm 8-14 points slower, for the same reason), and each row cut over
 * every resident CTA of one cooperative launch, statistics posted through y (sweep 58, its code
 * in bench/tune/sweep58-grid-kernel.patch: x read once, but 45-50% against 54% for LayerNorm
 * 64 x 802816, the per-row posts and waits costing more than the second read).
 */
#include "kernels.cuh"

namespace fnorm_cuda {

/* One thread of the row writes its mean and rstd, where the caller asked for them. */
__device__ __forceinline__ void store_row_stats(const FwdParams &a, int64_t row, float mean,
                                                float rstd) {
  if (a.mean)
    a.mean[row] = mean;
  if (a.rstd)
    a.rstd[row] = rstd;
}

/* STAGED (16-byte vectors, chosen by plan_forward): each lane copies its own vectors of its next
 * row into shared memory with cp.async while it works on this one, as bwd_warp_kernel does (no
 * barrier: a lane reads back only its own copies), so two rows' loads are in flight a warp.
 * PARAM_SMEM (16-byte rows; planned on staged fp32 and 16-bit LayerNorm rows, sweep 29; on the
 * other 16-byte rows in tuning builds only): gamma and beta as fp32 in shared memory after the
 * stages, filled once a CTA, as the backward warp tier reads them.
 * FULL (16-byte rows of exactly GROUP * VPT vectors, every row of the main grid): every lane's
 * every vector lies in the row, so the kernel has no column test, no zeroed values and no
 * masked sums; a group past the last row loads the last row (or, staged, reads whatever its
 * slot holds) and stores nothing. Four partial sums keep each sum's chain short; LayerNorm
 * keeps x - m1 in place and writes ((x - m1) * rstd - c * rstd) * gamma + beta, two fused
 * multiply-adds an element. A/B runs AH1-AH2 (H200, 2^27 elements, against the tree before,
 * builds alternated): 16-bit LayerNorm N = 2048 +1.7 to +2.2%, bf16 768 +1.2%, 256-512 0 to +0.9%,
 * the rest within 0.5%; graph preset (M = 4096) fp16 1024 LayerNorm +2.9%, RMSNorm +4%. */
template <typename T, typename P, int VEC, int GROUP, int VPT, bool STAGED = false,
          bool PARAM_SMEM = false, bool FULL = false>
__global__ void __launch_bounds__(256) fwd_warp_kernel(FwdParams a) {
  constexpr int EPT = VEC * VPT;
  constexpr int ROWS_PER_WARP = 32 / GROUP;
  static_assert(!STAGED || VEC * sizeof(T) == 16, "staging copies 16-byte vectors");
  static_assert(!PARAM_SMEM || VEC % 4 == 0, "parameters from shared memory: 16-byte rows");
  static_assert(!FULL || VEC * sizeof(T) == 16, "full rows: 16-byte vectors");
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  /* STAGED: stage s, vector k of thread t at (s * VPT + k) * blockDim.x + t. */
  Pack<T, VEC> *stage = reinterpret_cast<Pack<T, VEC> *>(dyn_smem);
  const int lane = threadIdx.x % GROUP;
  const int group_in_warp = (threadIdx.x % 32) / GROUP;
  const int64_t warp_id = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int64_t nwarps = (int64_t)gridDim.x * blockDim.x / 32;
  const int64_t step = nwarps * ROWS_PER_WARP;
  const T *x = (const T *)a.x;
  T *y = (T *)a.y;
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  const float inv_n = count_rcp((float)a.cols);
  auto slot = [&](int s, int k) { return stage + (s * VPT + k) * (int)blockDim.x + threadIdx.x; };
  /* Whether vector k of the lane lies in the row (always, for FULL rows). */
  auto in_row = [&](int k) { return FULL || ((int64_t)k * GROUP + lane) * VEC < a.cols; };
  /* Copies the thread's vectors of row `row` into stage s (one commit group, maybe empty). */
  auto issue = [&](int s, int64_t row) {
    if (row < a.rows)
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (in_row(k))
          cp_async_16(slot(s, k), x + row * a.x_stride + ((int64_t)k * GROUP + lane) * VEC);
    cp_async_commit();
  };
  [[maybe_unused]] float *sparam =
      reinterpret_cast<float *>(dyn_smem + (STAGED ? (size_t)2 * VPT * blockDim.x * 16 : 0));
  if constexpr (PARAM_SMEM) {
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
      sparam[c] = gamma ? to_f32(gamma[c]) : 1.f;
      sparam[a.cols + c] = beta ? to_f32(beta[c]) : 0.f;
    }
    __syncthreads();
  }
  int stg = 0; /* the stage this row is in */
  if constexpr (STAGED)
    issue(0, warp_id * ROWS_PER_WARP + group_in_warp);

  /* The loop bound is uniform across the warp, so every lane reaches every shuffle. */
  for (int64_t base = warp_id * ROWS_PER_WARP; base < a.rows; base += step) {
    const int64_t row = base + group_in_warp;
    const bool row_ok = row < a.rows;
    if constexpr (STAGED) {
      issue(stg ^ 1, row + step);
      cp_async_wait(1); /* this row's group has landed */
    }
    /* FULL rows load without a branch: a group past the last row reads the last row. */
    const T *xr = x + (FULL && !row_ok ? a.rows - 1 : row) * a.x_stride;
    float v[EPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t col = ((int64_t)k * GROUP + lane) * VEC;
      if (FULL || (row_ok && in_row(k))) {
        if constexpr (STAGED) {
          const Pack<T, VEC> pk = *slot(stg, k); /* one access */
          unpack_f32<T, VEC>(pk, &v[k * VEC]);
        } else {
          load_stream_f32<T, VEC>(xr + col, &v[k * VEC]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          v[k * VEC + e] = 0.f;
      }
    }
    stg ^= 1;
    /* y = v * rstd + shift (then * gamma + beta): LayerNorm's v is x - m1 by then. */
    float rstd, shift = 0.f, mean_out = 0.f;
    float p[4] = {0.f, 0.f, 0.f, 0.f};
    if (a.layernorm) {
#pragma unroll
      for (int j = 0; j < EPT; ++j) /* (the first four terms start the sums: no 0 + x) */
        p[j & 3] = j < 4 ? v[j] : p[j & 3] + v[j];
      float s[1] = {(p[0] + p[1]) + (p[2] + p[3])};
      group_sum<GROUP, 1>(s);
      const float m1 = s[0] * inv_n;
      float q1[4] = {0.f, 0.f, 0.f, 0.f}, q2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const bool ok = in_row(k);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int j = k * VEC + e;
          v[j] -= m1;
          const float d = ok ? v[j] : 0.f;
          q1[j & 3] = j < 4 ? d : q1[j & 3] + d;
          q2[j & 3] = j < 4 ? d * d : fmaf(d, d, q2[j & 3]);
        }
      }
      float t[2] = {(q1[0] + q1[1]) + (q1[2] + q1[3]), (q2[0] + q2[1]) + (q2[2] + q2[3])};
      group_sum<GROUP, 2>(t);
      const LnStats st = ln_stats(m1, t[0], t[1], inv_n, a.eps);
      rstd = st.rstd;
      shift = -st.c * st.rstd;
      mean_out = st.m1 + st.c;
    } else {
#pragma unroll
      for (int j = 0; j < EPT; ++j)
        p[j & 3] = j < 4 ? v[j] * v[j] : fmaf(v[j], v[j], p[j & 3]);
      float s[1] = {(p[0] + p[1]) + (p[2] + p[3])};
      group_sum<GROUP, 1>(s);
      rstd = 1.f / sqrtf(s[0] * inv_n + a.eps);
    }
    if (!row_ok)
      continue;
    if (lane == 0)
      store_row_stats(a, row, mean_out, rstd);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int64_t col = ((int64_t)k * GROUP + lane) * VEC;
      if (in_row(k)) {
        float g[VEC], b[VEC], out[VEC];
        if constexpr (PARAM_SMEM) {
          load_smem_f32<VEC>(sparam + col, g);
          load_smem_f32<VEC>(sparam + a.cols + col, b);
        } else {
          load_param<P, VEC>(gamma, col, 1.f, g);
          load_param<P, VEC>(beta, col, 0.f, b);
        }
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          out[e] = fmaf(fmaf(v[k * VEC + e], rstd, shift), g[e], b[e]);
        store_vec<T, VEC>(y + row * a.y_stride + col, out);
      }
    }
  }
}

/* The sum of v[0..N) (SQUARES: of their squares) in four interleaved partial sums, which keep
 * each chain of additions short; the first four terms start the sums (no 0 + x). */
template <int N, bool SQUARES> __device__ __forceinline__ float sum4(const float *v) {
  float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if constexpr (SQUARES)
      p[j & 3] = j < 4 ? v[j] * v[j] : fmaf(v[j], v[j], p[j & 3]);
    else
      p[j & 3] = j < 4 ? v[j] : p[j & 3] + v[j];
  }
  return (p[0] + p[1]) + (p[2] + p[3]);
}

/* torch.compile's shape for short rows (ncu13): one-warp CTAs, not persistent, each taking R
 * rows at a time, each row over all 32 lanes (LANES 16: each half of the warp its own R rows,
 * each over the half; LANES 8, tuning builds: each quarter) at VPL 16-byte vectors a lane,
 * every row's loads issued first, x and y without cache hints; rows of exactly LANES * VPL
 * vectors (FULL). Rows past the last load the last row and store nothing. Planned on the 16-byte
 * rows rows_form_shape names with 256 rows an SM and 2^25 elements or more, R = fwd_rows_per_cta.
 * A/B run AS (H200, release builds alternated, 2^27 elements, against the warp tier's staged
 * persistent kernel and its one-warp CTAs): 16-bit LayerNorm 256 91.8% -> 93.6%, 512 92.3% ->
 * 95.5%, 1024 93.3% -> 96.6%; 16-bit RMSNorm 256-1024 93.9-95.4% -> 97.2-97.5%; fp32 128-512
 * +2.8 to +5.5 points. The staged kernel's rows of 8 or 16 lanes also carry several rows a
 * warp, but issue 26% more instructions (ncu13); within L2 (40960 rows of 256) it stays ahead.
 * Sweep 69: 16-bit rows of 384 over half a warp (LANES 16), 3 vectors a lane, +2 to +4 points
 * over the staged kernel; 16-bit 256 at 2 a lane over half a warp +0.5 to +5 over 1 a lane
 * over the warp; rows of 96 and 256 vectors at 3 and 8 a lane +1 to +3.5. The warp's loop is
 * uniform, half-warps past the last row included, since the shuffles take all 32 lanes.
 * LN: the norm known at compile time, a kernel each (RMSNorm's forms then hold 50-96 registers
 * against 72-165 shared with LayerNorm's); A/B run BI (H200) measured them level (-0.3 to
 * +0.5 points), and sweep 74 kept R for RMSNorm's rows as fwd_rows_per_cta has it. */
template <typename T, typename P, int VEC, int VPL, int R, int LANES, bool LN>
__global__ void __launch_bounds__(32) fwd_rows_kernel(FwdParams a) {
  static_assert(LANES == 8 || LANES == 16 || LANES == 32,
                "a row over a quarter, a half or the whole warp");
  constexpr int EPR = VEC * VPL;     /* elements a lane holds of each row */
  constexpr int RW = R * 32 / LANES; /* rows the warp takes at a time */
  const int lane = threadIdx.x % LANES;
  const int64_t half_row = (int64_t)(threadIdx.x / LANES) * R;
  const T *x = (const T *)a.x;
  T *y = (T *)a.y;
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  const float inv_n = count_rcp((float)a.cols);
  for (int64_t base = (int64_t)blockIdx.x * RW; base < a.rows; base += (int64_t)gridDim.x * RW) {
    const int64_t row0 = base + half_row;
    float v[R][EPR];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = row0 + r < a.rows ? row0 + r : a.rows - 1;
#pragma unroll
      for (int k = 0; k < VPL; ++k)
        load_vec<T, VEC>(x + row * a.x_stride + (int64_t)(k * LANES + lane) * VEC, &v[r][k * VEC]);
    }
    float rstd[R], shift[R], mean_out[R];
    if constexpr (LN) {
      /* sum(x - m1): 16-bit rows from the lane's plain sum (centred_sum_from_sum) */
      constexpr bool kCentredSum = sizeof(T) == 4;
      float s[R], own[R];
#pragma unroll
      for (int r = 0; r < R; ++r)
        s[r] = own[r] = sum4<EPR, false>(v[r]);
      group_sum<LANES, R>(s);
      float t[2 * R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float m1 = s[r] * inv_n;
#pragma unroll
        for (int j = 0; j < EPR; ++j)
          v[r][j] -= m1;
        t[2 * r] =
            kCentredSum ? sum4<EPR, false>(v[r]) : centred_sum_from_sum(own[r], (float)EPR, m1);
        t[2 * r + 1] = sum4<EPR, true>(v[r]);
      }
      group_sum<LANES, 2 * R>(t);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const LnStats st = ln_stats(s[r] * inv_n, t[2 * r], t[2 * r + 1], inv_n, a.eps);
        rstd[r] = st.rstd;
        shift[r] = -st.c * st.rstd;
        mean_out[r] = st.m1 + st.c;
      }
    } else {
      float s[R];
#pragma unroll
      for (int r = 0; r < R; ++r)
        s[r] = sum4<EPR, true>(v[r]);
      group_sum<LANES, R>(s);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        rstd[r] = 1.f / sqrtf(s[r] * inv_n + a.eps);
        shift[r] = mean_out[r] = 0.f; /* (shift unused: RMSNorm's y is x * rstd * gamma + beta) */
      }
    }
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (row0 + r < a.rows)
          store_row_stats(a, row0 + r, mean_out[r], rstd[r]);
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int64_t col = (int64_t)(k * LANES + lane) * VEC;
      float g[VEC], b[VEC];
      load_param<P, VEC>(gamma, col, 1.f, g);
      load_param<P, VEC>(beta, col, 0.f, b);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (row0 + r >= a.rows)
          break;
        float out[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          out[e] = LN ? fmaf(fmaf(v[r][k * VEC + e], rstd[r], shift[r]), g[e], b[e])
                      : fmaf(v[r][k * VEC + e] * rstd[r], g[e], b[e]);
        store_vec<T, VEC>(y + (row0 + r) * a.y_stride + col, out);
      }
    }
  }
}

/* A 16-bit word's two elements as fp32, by one of three instruction sequences (PASS 0-2). A
 * kernel that holds its row as packed 16-bit words and converts it once a pass must not let the
 * compiler keep one pass's floats for the next (which would need twice the registers: the packed
 * LayerNorm rows of 5120 spilled at 255 registers with one sequence for every pass, and took
 * 130 with three; launchprobe). bf16: shift and mask, byte permutes, the permutes' operands
 * swapped; fp16: cvt of the word, of the word xor `zero` and of the word plus `zero`, where
 * `zero` is 0 at run time but not known to be to the compiler. */
template <typename T, int PASS>
__device__ __forceinline__ float2 word_f32(uint32_t w, uint32_t zero) {
  if constexpr (std::is_same<T, bf16>::value) {
    (void)zero;
    if constexpr (PASS == 0)
      return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    else if constexpr (PASS == 1)
      return make_float2(__uint_as_float(__byte_perm(w, 0u, 0x1044)),
                         __uint_as_float(__byte_perm(w, 0u, 0x3244)));
    else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      float lo, hi;
      asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.bf16 %0, l;\n cvt.f32.bf16 %1, h;}"
          : "=f"(lo), "=f"(hi)
          : "r"(w));
      return make_float2(lo, hi);
#else
      return make_float2(__uint_as_float(__byte_perm(0u, w, 0x5400)),
                         __uint_as_float(__byte_perm(0u, w, 0x7600)));
#endif
    }
  } else {
    static_assert(std::is_same<T, f16>::value, "16-bit words");
    const uint32_t v = PASS == 0 ? w : PASS == 1 ? w ^ zero : w + zero;
    __half2 h;
    memcpy(&h, &v, 4);
    return __half22float2(h);
  }
}

/* Two floats rounded to a 16-bit word (x low), by one paired conversion (store_vec converts
 * each element alone, then packs them: three instructions for this one's one). */
template <typename T> __device__ __forceinline__ uint32_t f32_word(float lo, float hi) {
  uint32_t w;
  if constexpr (std::is_same<T, bf16>::value) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&w, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&w, &h, 4);
  }
  return w;
}

/* The warps' sums of a row over WPR warps: each warp's lane 0 posts its K values, and every
 * thread adds the WPR posts in warp order (the same order on every run). WPR 1: nothing. */
template <int WPR, int K> __device__ __forceinline__ void warps_sum(float (&v)[K], float *post) {
  if constexpr (WPR > 1) {
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0)
#pragma unroll
      for (int j = 0; j < K; ++j)
        post[j * WPR + warp] = v[j];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < K; ++j) {
      float t = post[j * WPR];
#pragma unroll
      for (int i = 1; i < WPR; ++i)
        t += post[j * WPR + i];
      v[j] = t;
    }
  }
}

/* Pair e of a 16-byte vector as fp32: a 16-bit vector's word e (e < 4, word_f32's sequence
 * PASS), an fp32 vector's elements 2e and 2e + 1 (e < 2). */
template <typename T, int PASS>
__device__ __forceinline__ float2 pair_f32(const uint4 &v, int e, uint32_t zero) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (sizeof(T) == 4) {
    (void)zero;
    return make_float2(__uint_as_float(w[2 * e]), __uint_as_float(w[2 * e + 1]));
  } else {
    return word_f32<T, PASS>(w[e], zero);
  }
}

/* A row a CTA of WPR warps (packed_rows_shape: 16-bit LayerNorm 4096 and 5120 over one warp, 8192
 * over 4, 16384 and 32768 over 8; 16-bit RMSNorm 16384 and 32768 over 8; fp32 LayerNorm 5120 over 5
 * and 8192 over 8), not persistent, VPL 16-byte vectors a lane in registers: a 16-bit row held as
 * its 16-bit words (64-80 registers, where fwd_rows_kernel's floats would take twice that) and
 * converted again on each pass (word_f32, by pairs: pair_f32): LayerNorm's sum, its sums centred on
 * the first mean (ln_stats; 16-bit rows: the squares about the thread's own mean, A/B run DQ of
 * session 42: bf16 32768 +1.3 points, the rest level), y from (x - m1) - c (the centring's
 * accuracy: y as x * rstd - mean * rstd in one FMA, as launchprobe first had it, was 0.5 points
 * faster and wrong by several ulps on offset rows); RMSNorm's sum of squares, y. The warps' sums
 * meet in shared memory (warps_sum).
 * G and B: gamma and beta given (in x's dtype), read per row where y is computed; they and y's
 * 16-byte stores are volatile, so that the compiler neither hoists all of a row's gamma/beta loads
 * nor sinks its stores, which held their registers; y's pairs are rounded by one paired conversion
 * each (f32_word). No loop over rows (a loop took the rows of 5120 from 114 registers to 168-190).
 * A/B run of session 29 (H200, release builds of 555273a and of this tree alternated, fnbench, 2^27
 * elements; % of the copy): LayerNorm bf16 4096 92.9 -> 95.6, 5120 93.2 -> 95.5, 8192 91.8 -> 93.8,
 * 16384 92.5 -> 95.0, 32768 89.3 -> 91.1; fp16 4096 94.7 -> 95.5, 5120 94.6 -> 95.2, 8192 92.0 ->
 * 93.8, 16384 92.8 -> 94.9, 32768 90.5 -> 93.6; RMSNorm 16384 bf16 93.8 -> 96.2, fp16 94.0 -> 96.0.
 * At 2^25-2^26 elements +0.5 to +4.6, but LayerNorm 8192 -3.6 at 4096 rows and level at 8192
 * (packed_rows_min_elements). RMSNorm 32768 (A/B run CG, session 34, against the lean kernel): 2^27
 * elements +0.3 to +0.5 (bf16 94.8 -> 95.3), 2^26 +2.2 to +2.4, 2^25 +3.6 to +4.0. LayerNorm 8192
 * over 4 warps of 8 vectors a lane instead of 2 of 16 (sweep 83, session 34, tuning build):
 * 93.6-93.8 -> 95.3-95.5. fp32 LayerNorm (launchprobe's form, H200, 2^27 elements): 5120 over 5
 * warps 98.0% of the copy and 8192 over 8 97.0%, where the lean form ran 94.1%; fp32 4096, 16384
 * and 32768 and fp32 RMSNorm were level or slower there. CL (sm_90): a row over a cluster launched
 * a row, each CTA a chunk of CHUNK elements (16-bit RMSNorm rows of 2-8 chunks of 32768:
 * packed_rows_shape, kFwdPackedCl); the CTAs' sums meet in one exchange through distributed shared
 * memory (cluster_exchange_once), added in rank order (LayerNorm: ChunkStats, ln_rank_combine), so
 * every CTA gets the same bits. Sweeps 76-77 (H200, tuning builds, 2^27 elements, % of the copy,
 * the kernels planned before -> this form): RMSNorm bf16 65536 84.3 -> 90.2, 131072 83.9 -> 86.3,
 * 262144 80.0 -> 82.7, 524288 (over 16 CTAs; not planned, clusters stop at 8) 72.3 -> 77.5; fp16
 * 84.8 -> 89.1, 84.6 -> 85.5, 80.1 -> 82.3, 72.9 -> 77.4 (at 2^25 elements +1.6 to +6.8). Chunks of
 * 16384 lost 2-8 points (RMSNorm 32768 94.9 -> 86.9); LayerNorm moved -1.7 to +3.6 (bf16 65536 77
 * -> 80, fp16 79 -> 79) and stays on the other kernels, whose one-CTA rows of 32768 run 91-93.5%.
 * Where the exchange's cost goes (both 256-thread CTAs of an SM wait on their clusters) was not
 * profiled. */
template <typename T, int VPL, int WPR, bool LN, bool G, bool B, bool CL>
__global__ void __launch_bounds__(32 * WPR) fwd_rows_packed_kernel(FwdParams a) {
  constexpr int VEC = 16 / (int)sizeof(T), PAIRS = VEC / 2; /* elements, pairs a vector */
  /* CL: the CTA's chunk of the row, CHUNK elements (the whole row without CL) */
  constexpr int CHUNK = VPL * WPR * 32 * VEC;
  /* the posts of the warps' sums: LayerNorm's plain sum, then two centred ones (no barrier
   * between the second posts and the first's reads: they use other slots) */
  __shared__ float post[3 * WPR];
  __shared__ float4 xslots[CL ? 16 : 1]; /* CL: the cluster's exchange (cluster_exchange_once) */
  int csize = 1, crank = 0;
  if constexpr (CL) {
    cluster_shape(csize, crank);
    cluster_start(csize);
  }
  const int lane = WPR > 1 ? threadIdx.x % 32 : threadIdx.x;
  const int warp = WPR > 1 ? threadIdx.x / 32 : 0;
  const int64_t c0 = (int64_t)crank * CHUNK; /* the chunk's first column */
  const T *x = (const T *)a.x + c0;
  T *y = (T *)a.y + c0;
  const T *gamma = G ? (const T *)a.gamma + c0 : nullptr;
  const T *beta = B ? (const T *)a.beta + c0 : nullptr;
  const float inv_n = count_rcp((float)a.cols);
  /* LayerNorm's first mean and centred sums: over the CTA's chunk (CL), combined over the
   * cluster as ChunkStats; over the row otherwise */
  const float inv_first = CL ? 1.f / (float)CHUNK : inv_n;
  const uint32_t zero = (uint32_t)(a.cols < 0); /* 0: the plan takes only cols > 0 */
  /* the grid: a CTA, or a cluster of CTAs, a row (plan_forward) */
  const int64_t row = CL ? blockIdx.x / csize : blockIdx.x;
  /* vector k of the thread: the CTA's k-th 32 * WPR vectors, warp by warp */
  uint4 v[VPL];
#pragma unroll
  for (int k = 0; k < VPL; ++k)
    v[k] = *reinterpret_cast<const uint4 *>(x + row * a.x_stride +
                                            (int64_t)((k * WPR + warp) * 32 + lane) * VEC);
  /* 16-bit LayerNorm (kOwnMean): the squares centred on the thread's own mean mt = own / n, so
   * that the pass over the row need not wait for the CTA's sum and its barrier; then Chan's update
   * to the squares about m1 (below; own is exact in fp32 while the thread's values span few
   * binades, centred_sum_from_sum). */
  constexpr bool kOwnMean = LN && sizeof(T) == 2;
  constexpr float kValues = (float)(VPL * VEC); /* values a thread holds */
  float m1 = 0.f, own = 0.f, mt = 0.f; /* LayerNorm: the first mean; the thread's sum and mean */
  float s[1] = {0.f};
  if constexpr (LN) {
    float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
#pragma unroll
      for (int e = 0; e < PAIRS; ++e) {
        const float2 f = pair_f32<T, 0>(v[k], e, zero);
        p[(2 * e) & 3] += f.x;
        p[(2 * e + 1) & 3] += f.y;
      }
    }
    own = (p[0] + p[1]) + (p[2] + p[3]);
    s[0] = own;
    group_sum<32, 1>(s);
    if constexpr (kOwnMean) {
      mt = own * (1.f / kValues);
    } else {
      warps_sum<WPR, 1>(s, post);
      m1 = s[0] * inv_first;
    }
  }
  /* LayerNorm: sum(x - m1) (16-bit rows: from the plain sum, centred_sum_from_sum) and
   * sum((x - m1)^2) (16-bit rows: about mt); RMSNorm: sum(x^2) */
  constexpr bool kCentredSum = LN && !kOwnMean; /* (fp32 rows) */
  const float centre = kOwnMean ? mt : m1;
  float c2[2] = {0.f, 0.f}, q2[2] = {0.f, 0.f};
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
#pragma unroll
    for (int e = 0; e < PAIRS; ++e) {
      constexpr int PASS = LN ? 1 : 0; /* (RMSNorm's first pass over the row) */
      const float2 f = pair_f32<T, PASS>(v[k], e, zero);
      const float d0 = f.x - centre, d1 = f.y - centre;
      if constexpr (kCentredSum) {
        c2[0] += d0;
        c2[1] += d1;
      }
      q2[0] = fmaf(d0, d0, q2[0]);
      q2[1] = fmaf(d1, d1, q2[1]);
    }
  }
  if constexpr (kOwnMean) {
    warps_sum<WPR, 1>(s, post);
    m1 = s[0] * inv_first;
  }
  float rstd, shift, mean_out;
  if constexpr (LN) {
    const float t0 = kCentredSum ? c2[0] + c2[1] : centred_sum_from_sum(own, kValues, m1);
    /* sum((x - m1)^2) = sum((x - mt)^2) + (mt - m1) (2 e + n (mt - m1)), e = sum(x - mt) =
     * s - n mt: 0 where n is a power of two (mt = s / n exactly), one FMA otherwise (5120: 160
     * values a lane); n (mt - m1) + e is t0 */
    constexpr bool kPow2 = ((VPL * VEC) & (VPL * VEC - 1)) == 0;
    const float te = kOwnMean && !kPow2 ? t0 + fmaf(-kValues, mt, own) : t0;
    float t[2] = {t0, kOwnMean ? fmaf(mt - m1, te, q2[0] + q2[1]) : q2[0] + q2[1]};
    group_sum<32, 2>(t);
    warps_sum<WPR, 2>(t, post + WPR);
    if constexpr (CL) {
      /* the chunk's mean m1 + c and sum of squared deviations, combined over the cluster in
       * rank order (ln_rank_combine): y from (x - m1) - off. (Sweep 77: one CTA barrier
       * instead of two, each thread's values centred on their own mean and combined by Chan's
       * update as in fwd_lean_kernel, was level on bf16 rows and 2-3.6 points slower on fp16.) */
      ChunkStats cs;
      cs.ref = m1;
      cs.c = t[0] * inv_first;
      cs.m2 = t[1] - t[0] * cs.c;
      cs.n = (float)CHUNK;
      cluster_exchange_once(make_float4(cs.ref, cs.c, cs.m2, cs.n), xslots, csize);
      const RowStats st = ln_rank_combine(cs, xslots, csize, inv_n, a.eps);
      rstd = st.rstd;
      shift = -st.off * st.rstd;
      mean_out = st.mean;
    } else {
      const LnStats st = ln_stats(m1, t[0], t[1], inv_n, a.eps);
      rstd = st.rstd;
      shift = -st.c * st.rstd;
      mean_out = st.m1 + st.c;
    }
  } else {
    float t[1] = {q2[0] + q2[1]};
    group_sum<32, 1>(t);
    warps_sum<WPR, 1>(t, post);
    if constexpr (CL) { /* the chunks' sums of squares, added in rank order */
      cluster_exchange_once(make_float4(t[0], 0.f, 0.f, 0.f), xslots, csize);
      t[0] = rank_sum(xslots, csize);
    }
    rstd = 1.f / sqrtf(t[0] * inv_n + a.eps);
    shift = mean_out = 0.f; /* (RMSNorm's mean is stored as 0) */
  }
  if (threadIdx.x == 0 && crank == 0)
    store_row_stats(a, row, mean_out, rstd);
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int64_t col = (int64_t)((k * WPR + warp) * 32 + lane) * VEC;
    uint4 g4 = make_uint4(0u, 0u, 0u, 0u), b4 = make_uint4(0u, 0u, 0u, 0u);
    if (G)
      g4 = load_words_in_place(gamma + col);
    if (B)
      b4 = load_words_in_place(beta + col);
    uint32_t o[4];
#pragma unroll
    for (int e = 0; e < PAIRS; ++e) {
      const float2 f = pair_f32<T, 2>(v[k], e, zero);
      const float2 g = G ? pair_f32<T, 0>(g4, e, zero) : make_float2(1.f, 1.f);
      const float2 b = B ? pair_f32<T, 0>(b4, e, zero) : make_float2(0.f, 0.f);
      const float y0 =
          LN ? fmaf(fmaf(f.x - m1, rstd, shift), g.x, b.x) : fmaf(f.x * rstd, g.x, b.x);
      const float y1 =
          LN ? fmaf(fmaf(f.y - m1, rstd, shift), g.y, b.y) : fmaf(f.y * rstd, g.y, b.y);
      if constexpr (sizeof(T) == 4) {
        o[2 * e] = __float_as_uint(y0);
        o[2 * e + 1] = __float_as_uint(y1);
      } else {
        o[e] = f32_word<T>(y0, y1);
      }
    }
    store_words_in_place(y + row * a.y_stride + col, o);
  }
}

/* A CTA, or a cluster of CTAs (sm_90), per row, the row held in registers: thread t of CTA
 * rank r owns vectors t + k * blockDim.x (k < VPT) of chunk r. Persistent: while a row is
 * reduced and written, the next row's loads are already in flight (raw, in registers), so
 * the barriers of the reductions never leave the memory system idle, and x goes from DRAM to
 * registers without touching shared memory (whose bandwidth the staged kernel runs out of). */
/* How fwd_reg_kernel's CTA sums add the warps' sums (cta_sum_slot): measured best on an H200. */
template <typename T> constexpr int kRegWarpSum = sizeof(T) == 4 ? WARPS_LANES : WARPS_MIXED;

/* ONEBAR (planned on fp32 LayerNorm rows in CTAs of more than 256 threads; sweeps 41-42): the
 * chunk statistics as the CTA-per-row kernel takes them (cta_ln_stats: each thread centred on
 * its own mean, combined by Chan's update behind one barrier) instead of two sums behind two
 * barriers. */
/* LN_ONLY: a LayerNorm-only form (the norm known at compile time; its stores compute
 * (x - mc) * rstd - off * rstd in two instructions), for LayerNorm rows; otherwise the norm is
 * read at run time, as RMSNorm rows take it. ncu7 (bf16 N = 65536) had the kernel issue-bound,
 * 0.64 warp instructions a cycle a scheduler, LayerNorm executing 32% more than RMSNorm; A/B run
 * AC1: LayerNorm-only 16-bit +3 to +4 points, fp32 level to +0.5. An RMSNorm-only form was 30
 * points slower (its next row's loads compiled to half-word inserts into the previous row's
 * registers right after each load, which wait for it: the prefetch stalled), so RMSNorm keeps
 * the run-time form, whose machine code did not change. */
/* FULL (planned on LayerNorm rows and 16-bit RMSNorm rows; see launch_forward_vec): every CTA's
 * chunk is exactly blockDim.x * VPT vectors, so every thread owns all its vectors: no per-vector
 * tests, and LayerNorm's chunk mean by a reciprocal taken once a kernel instead of an IEEE
 * division every row. */
template <typename T, typename P, int VEC, int VPT, bool LN_ONLY = false, bool ONEBAR = false,
          bool FULL = false>
__device__ __forceinline__ void fwd_reg_body(const FwdParams &a, int64_t chunk_vecs) {
  const bool layernorm = LN_ONLY || a.layernorm;
  __shared__ RingRed red;
  int csize, crank;
  cluster_shape(csize, crank);
  ring_red_init(red, csize);
  const int64_t nvec = a.cols / VEC;
  const int64_t v0 = (int64_t)crank * chunk_vecs;
  const int64_t count = chunk_count(nvec, chunk_vecs, crank);
  const int64_t cluster_id = blockIdx.x / csize, nclusters = gridDim.x / csize;
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  const float inv_n = count_rcp((float)a.cols);
  bool mine[VPT];
  int nmine = 0;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    mine[k] = FULL || threadIdx.x + (int64_t)k * blockDim.x < count;
    nmine += mine[k];
  }
  [[maybe_unused]] LnCounts counts = {};
  if constexpr (ONEBAR && FULL) {
    counts = ln_counts_full<VPT * VEC>(count * VEC);
  } else if constexpr (ONEBAR) {
    counts = ln_counts(nmine * VEC, count * VEC);
  }
  [[maybe_unused]] const float inv_count = FULL ? 1.f / (float)(count * VEC) : 0.f;
  Pack<T, VEC> cur[VPT], nxt[VPT];
  auto load_row = [&](Pack<T, VEC>(&dst)[VPT], int64_t row) {
    const T *src = (const T *)a.x + row * a.x_stride + v0 * VEC;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (mine[k])
        dst[k] = load_stream<T, VEC>(src + (threadIdx.x + (int64_t)k * blockDim.x) * VEC);
  };
  int round = 0, xround = 0;
  if (cluster_id < a.rows)
    load_row(cur, cluster_id);
  for (int64_t row = cluster_id; row < a.rows; row += nclusters) {
    if (row + nclusters < a.rows)
      load_row(nxt, row + nclusters);
    /* fp32 rows are read from the registers they were loaded into; 16-bit rows are converted
     * once into a float copy (measured on an H200: converting on each pass instead cost up to
     * 20 points, the copy costs fp32 rows 10). Four partial sums keep the chains short. */
    constexpr bool COPY = sizeof(T) < 4;
    float v[COPY ? VEC * VPT : 1];
    /* to_f32, not pack_f32: with it this kernel's bf16 rows (N = 65536, 262144) ran 30-38%
     * slower (run Z2, H200), where the other kernels were level or faster. */
    if constexpr (COPY) {
#pragma unroll
      for (int k = 0; k < VPT; ++k)
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          v[k * VEC + e] = mine[k] ? to_f32(cur[k].v[e]) : 0.f;
    }
    auto x_at = [&](int k, int e) {
      if constexpr (COPY)
        return v[k * VEC + e];
      else
        return mine[k] ? to_f32(cur[k].v[e]) : 0.f;
    };
    /* LayerNorm: the CTA's chunk mean mc, then the sums centred on it (two barriers inside the
     * CTA), then one exchange across the cluster (ln_cluster_stats). */
    float mc = 0.f, c = 0.f, rstd, mean_out = 0.f;
    if (ONEBAR && layernorm) {
      const ChunkStats cs =
          cta_ln_stats<VPT, VEC, kRegWarpSum<T>>(x_at, x_at, mine, counts, red.warp, round);
      const RowStats st = ln_cluster_stats(cs, red, xround, csize, inv_n, a.eps);
      mc = cs.ref;
      c = st.off;
      rstd = st.rstd;
      mean_out = st.mean;
    } else if (layernorm) {
      float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < VPT; ++k)
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          p[(k * VEC + e) & 3] += x_at(k, e);
      float s[1] = {(p[0] + p[1]) + (p[2] + p[3])};
      cta_sum<1, kRegWarpSum<T>>(s, red, round);
      if constexpr (FULL)
        mc = s[0] * inv_count;
      else
        mc = count > 0 ? s[0] / (float)(count * VEC) : 0.f;
      float q1[4] = {0.f, 0.f, 0.f, 0.f}, q2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < VPT; ++k)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float d = mine[k] ? x_at(k, e) - mc : 0.f;
          q1[(k * VEC + e) & 3] += d;
          q2[(k * VEC + e) & 3] = fmaf(d, d, q2[(k * VEC + e) & 3]);
        }
      float t[2] = {(q1[0] + q1[1]) + (q1[2] + q1[3]), (q2[0] + q2[1]) + (q2[2] + q2[3])};
      cta_sum<2, kRegWarpSum<T>>(t, red, round);
      ChunkStats cs;
      cs.ref = mc;
      cs.n = (float)(count * VEC);
      cs.c = FULL ? t[0] * inv_count : count > 0 ? t[0] * count_rcp(cs.n) : 0.f;
      cs.m2 = t[1] - t[0] * cs.c;
      const RowStats st = ln_cluster_stats(cs, red, xround, csize, inv_n, a.eps);
      c = st.off;
      rstd = st.rstd;
      mean_out = st.mean;
    } else {
      float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < VPT; ++k)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float xv = x_at(k, e);
          p[(k * VEC + e) & 3] = fmaf(xv, xv, p[(k * VEC + e) & 3]);
        }
      float s[1] = {(p[0] + p[1]) + (p[2] + p[3])};
      cta_sum<1, kRegWarpSum<T>>(s, red, round);
      rstd = 1.f / sqrtf(cluster_sum(s[0], red, xround, csize) * inv_n + a.eps);
    }
    if (crank == 0 && threadIdx.x == 0)
      store_row_stats(a, row, mean_out, rstd);
    [[maybe_unused]] const float shift = -c * rstd;
    T *yr = (T *)a.y + row * a.y_stride + v0 * VEC;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (!mine[k])
        continue;
      const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
      float g[VEC], b[VEC], out[VEC];
      load_param<P, VEC>(gamma, (v0 + i) * VEC, 1.f, g);
      load_param<P, VEC>(beta, (v0 + i) * VEC, 0.f, b);
#pragma unroll
      for (int e = 0; e < VEC; ++e) { /* x - mc - off (LN; mc = off = 0 for RMS) */
        const float xhat =
            LN_ONLY ? fmaf(x_at(k, e) - mc, rstd, shift) : ((x_at(k, e) - mc) - c) * rstd;
        out[e] = fmaf(xhat, g[e], b[e]);
      }
      store_vec<T, VEC, sizeof(T) == 2>(yr + i * VEC, out);
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      cur[k] = nxt[k];
  }
  cluster_barrier(csize);
}

/* MAXT: the CTA size the kernel is built for (1024: tuning builds' FNORM_TUNE_FWD_REG_WIDE form,
 * fp32 rows at half the vectors a thread). */
template <typename T, typename P, int VEC, int VPT, bool LN_ONLY = false, bool ONEBAR = false,
          bool FULL = false, int MAXT = 512>
__global__ void __launch_bounds__(MAXT) fwd_reg_kernel(FwdParams a, int64_t chunk_vecs) {
  fwd_reg_body<T, P, VEC, VPT, LN_ONLY, ONEBAR, FULL>(a, chunk_vecs);
}

/* A CTA per row (16-byte vectors, rows one CTA of up to 1024 threads holds), the row in
 * registers, VPT vectors a thread, not persistent: rows follow each other through the CTAs
 * resident on an SM (up to 2048 threads), so one row's reductions overlap other rows' loads
 * without a prefetch copy in registers. Few registers, one barrier a row (cta_ln_stats), the
 * norm a template parameter. Measured on an H200 (bench/tune/, sweeps 8 and 9): faster than
 * fwd_reg_kernel at every such row length, which Nsight Compute showed latency-bound at 25%
 * occupancy; splitting longer rows over a cluster of these CTAs was slower than fwd_reg. */
/* REREAD: the thread keeps its vectors as loaded (16-bit ones take half the registers of
 * floats) only until the statistics are known, and reads them again for y, from L2 (the first
 * read marks them evict-last, the second evict-first): fewer registers, more resident CTAs.
 * (LayerNorm's counts taken after the row's loads instead of before them were 1.8 points
 * slower to 2.5 faster, by dtype: sweep 41.) */
/* FULL: rows of exactly blockDim.x * VPT vectors (every row of the main grid), so every thread
 * owns all VPT of its vectors: no tests, and the thread's and warp's counts are constants. */
template <typename T, typename P, int VEC, int VPT, bool LN, bool REREAD, bool FULL = false>
__device__ __forceinline__ void fwd_cta_body(const FwdParams &a) {
  __shared__ __align__(16) float warp[2][32][4];
  const int64_t nvec = a.cols / VEC;
  bool mine[VPT];
  int nmine = 0;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    mine[k] = FULL || threadIdx.x + k * blockDim.x < nvec;
    nmine += mine[k];
  }
  LnCounts counts;
  if constexpr (FULL) {
    counts = ln_counts_full<VPT * VEC>(a.cols);
  } else {
    counts = ln_counts(nmine * VEC, nvec * VEC);
  }
  const float inv_n = count_rcp((float)a.cols);
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  int round = 0;
  [[maybe_unused]] uint64_t keep = 0, drop = 0;
  if constexpr (REREAD) {
    keep = l2_policy_keep();
    drop = l2_policy_drop();
  }
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T *xr = (const T *)a.x + row * a.x_stride;
    /* The row's values: as floats (v), or as loaded (raw, REREAD); zero where not mine. */
    float v[REREAD ? 1 : VPT * VEC];
    Pack<T, VEC> raw[REREAD ? VPT : 1];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if constexpr (REREAD) {
        if (mine[k]) {
          raw[k] = load_hinted<T, VEC>(xr + (threadIdx.x + k * blockDim.x) * VEC, keep);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            raw[k].v[e] = from_f32<T>(0.f);
        }
      } else if (mine[k]) {
        load_stream_f32<T, VEC>(xr + (threadIdx.x + k * blockDim.x) * VEC, &v[k * VEC]);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          v[k * VEC + e] = 0.f;
      }
    }
    auto x_at = [&](int k, int e) {
      if constexpr (REREAD)
        return pack_f32<T, VEC>(raw[k], e);
      else
        return v[k * VEC + e];
    };
    /* LayerNorm's second pass over the values: REREAD converts them again. */
    auto x_again = [&](int k, int e) {
      if constexpr (REREAD)
        return reconvert<T, VEC>(raw[k], e);
      else
        return v[k * VEC + e];
    };
    float ref = 0.f, c = 0.f, rstd;
    if constexpr (LN) {
      const ChunkStats cs = cta_ln_stats<VPT, VEC>(x_at, x_again, mine, counts, warp, round);
      float var = cs.m2 * inv_n;
      var = var < 0.f ? 0.f : var; /* not fmaxf: a NaN stays NaN */
      ref = cs.ref;
      c = cs.c;
      rstd = 1.f / sqrtf(var + a.eps);
    } else {
      float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int k = 0; k < VPT; ++k)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float xv = x_at(k, e);
          p[(k * VEC + e) & 3] = fmaf(xv, xv, p[(k * VEC + e) & 3]);
        }
      float s[1] = {(p[0] + p[1]) + (p[2] + p[3])};
      cta_sum_slot<1>(s, warp, round & 1);
      ++round;
      rstd = 1.f / sqrtf(s[0] * inv_n + a.eps);
    }
    if (threadIdx.x == 0)
      store_row_stats(a, row, ref + c, rstd);
    const float shift = -c * rstd;
    T *yr = (T *)a.y + row * a.y_stride;
    if constexpr (REREAD) { /* all of the thread's loads in flight before its first store */
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (mine[k])
          raw[k] = load_hinted<T, VEC>(xr + (threadIdx.x + k * blockDim.x) * VEC, drop);
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if (!mine[k])
        continue;
      const int i = threadIdx.x + k * blockDim.x;
      float g[VEC], b[VEC], out[VEC];
      load_param<P, VEC>(gamma, (int64_t)i * VEC, 1.f, g);
      load_param<P, VEC>(beta, (int64_t)i * VEC, 0.f, b);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        /* LN: (x - ref - c) * rstd as one fma after the exact-ish difference x - ref. */
        const float xv = x_at(k, e);
        const float xhat = LN ? fmaf(xv - ref, rstd, shift) : xv * rstd;
        out[e] = fmaf(xhat, g[e], b[e]);
      }
      store_vec<T, VEC>(yr + (int64_t)i * VEC, out);
    }
  }
}

template <typename T, typename P, int VEC, int VPT, bool LN, bool FULL = false>
__global__ void __launch_bounds__(1024) fwd_cta_kernel(FwdParams a) {
  fwd_cta_body<T, P, VEC, VPT, LN, false, FULL>(a);
}

/* The REREAD form at no more than REGS registers a thread (40: three CTAs of 512 threads an
 * SM; tuning builds also have 32, 48 and 64: sweep 50, rows of 16384-32768 at 64, 0.4-17
 * points slower than the form that holds the row, fp32 RMSNorm 16384 3.7 faster). (Sweeps 38 and 40
 * also capped the form that holds the row, at 32-48 registers and 8-16 elements a thread: no gain
 * anywhere, and up to 37 points lost.) */
template <typename T, typename P, int VEC, int VPT, bool LN, int REGS, bool FULL = false>
__global__ void __maxnreg__(REGS) fwd_cta_reread_kernel(FwdParams a) {
  fwd_cta_body<T, P, VEC, VPT, LN, true, FULL>(a);
}

/* The moments of the N vectors a thread holds as loaded (vector k the thread's k-th of the
 * row; a vector past nvec, unless FULL, counts as absent): m, their mean's first estimate (the
 * sum times inv_n, 1 / n, n the values present), rel, its correction, and m2, the sum of squares
 * about m + rel. Two passes over the registers, the second converting the packs again: they pass
 * through an empty asm first, so that the compiler does not keep the first pass's floats. Vector
 * k of thread t is the row's t + k * stride (0: blockDim.x; fwd_spread_kernel's data threads are
 * fewer than its CTA's). */
template <typename T, int VEC, int N, bool FULL>
__device__ __forceinline__ void held_moments(Pack<T, VEC> (&raw)[N], int64_t nvec, float n,
                                             float inv_n, float &m, float &rel, float &m2,
                                             int stride = 0) {
  float p0 = 0.f, p1 = 0.f;
#pragma unroll
  for (int k = 0; k < N; ++k)
#pragma unroll
    for (int e = 0; e < VEC; e += 2) {
      p0 += pack_f32<T, VEC>(raw[k], e);
      p1 += pack_f32<T, VEC>(raw[k], e + 1);
    }
  const float s = p0 + p1;
  m = s * inv_n;
#pragma unroll
  for (int k = 0; k < N; ++k)
    opaque(raw[k]);
  /* the correction's sum of the centred values: FULL 16-bit values from s
   * (centred_sum_from_sum; the forms that test their vectors keep it: holding s took them from
   * 24 bytes of stack to 32) */
  constexpr bool kCentredSum = sizeof(T) == 4 || !FULL;
  float d0 = 0.f, d1 = 0.f, q0 = 0.f, q1 = 0.f;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const bool mine =
        FULL || threadIdx.x + (int64_t)k * (stride ? (unsigned)stride : blockDim.x) < nvec;
#pragma unroll
    for (int e = 0; e < VEC; e += 2) {
      const float x0 = mine ? pack_f32<T, VEC>(raw[k], e) - m : 0.f;
      const float x1 = mine ? pack_f32<T, VEC>(raw[k], e + 1) - m : 0.f;
      if constexpr (kCentredSum) {
        d0 += x0;
        d1 += x1;
      }
      q0 = fmaf(x0, x0, q0);
      q1 = fmaf(x1, x1, q1);
    }
  }
  const float s1 = kCentredSum ? d0 + d1 : centred_sum_from_sum(s, n, m);
  rel = s1 * inv_n;
  m2 = (q0 + q1) - s1 * rel;
}

/* A CTA a row in at most 32 registers a thread (MINB = 2: two CTAs of 1024 threads an SM), x
 * read twice: once for the statistics, then again for y, mostly from L1 (the first read keeps
 * the row there, the second marks it evict-first). Two CTAs an SM overlap one row's reductions
 * with the other's loads. torch.compile's kernel for 16-bit RMSNorm rows of 32768 works this
 * way (32 registers, two CTAs an SM: ncu9 in sweep 50, H200), at 99% of the copy where the
 * CTA-per-row kernel above (64 registers, one CTA) ran 80%.
 * RMSNorm: the sum of squares from the vectors as loaded, four at a time. LayerNorm (VPT <= 4:
 * the thread's vectors held as loaded, centred on the thread's mean, then Chan's combination
 * over the CTA behind one barrier, as cta_ln_stats; the FULL form of four vectors centres them
 * two at a time). FULL: every thread's VPT vectors lie in the row (no tests; LayerNorm's counts
 * are constants).
 * CL (sm_90): rows longer than one CTA holds this way, over a cluster of such CTAs, each taking
 * an even chunk of the row (FULL: every CTA's chunk exactly its threads' vectors); the CTAs'
 * statistics meet in one exchange through distributed shared memory, in rank order
 * (ln_cluster_stats, cluster_sum), so every CTA gets the same bits. */
template <typename T, typename P, int VEC, int VPT, bool LN, int MINB, bool FULL = false,
          bool CL = false, bool GB = false>
__global__ void __launch_bounds__(1024, MINB) fwd_lean_kernel(FwdParams a) {
  static_assert(!LN || VPT <= 4, "LayerNorm holds the thread's vectors");
  static_assert(!GB || (LN && FULL), "GB: the FULL LayerNorm form with gamma and beta given");
  /* y by one 16-byte store a vector (store_vec) in the forms whose stores the compiler split
   * (clustered; RMSNorm at 32 elements a thread) and where run BC measured it faster (LayerNorm
   * at 32 elements a thread with fp32 gamma: 16-bit 32768 +5 points; with 16-bit gamma it lost
   * 2 and keeps the copy). */
  constexpr bool kLeanOneStore = CL || (VPT * VEC == 32 && (!LN || sizeof(P) == 4));
  __shared__ __align__(16) float warp[2][32][4];
  /* CL: the CTA's chunk of the row, vectors [v0, v0 + nvec) (the whole row without CL). */
  int csize = 1, crank = 0;
  int64_t v0 = 0, nvec = a.cols / VEC;
  if constexpr (CL) {
    cluster_shape(csize, crank);
    ring_red_init(cluster_red_slots(), csize);
    const int64_t chunk = (nvec + csize - 1) / csize;
    v0 = (int64_t)crank * chunk;
    nvec = chunk_count(nvec, chunk, crank);
  }
  [[maybe_unused]] int xround = 0;
  const float inv_n = count_rcp((float)a.cols);
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  if constexpr (CL) {
    gamma = gamma ? gamma + v0 * VEC : nullptr;
    beta = beta ? beta + v0 * VEC : nullptr;
  }
  [[maybe_unused]] LnCounts counts = {};
  if constexpr (LN && FULL) {
    counts = ln_counts_full<VPT * VEC>(CL ? nvec * VEC : a.cols);
  } else if constexpr (LN) {
    int nmine = 0;
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      nmine += threadIdx.x + k * blockDim.x < nvec;
    counts = ln_counts(nmine * VEC, CL ? nvec * VEC : a.cols);
  }
  int round = 0;
  const int64_t first = CL ? blockIdx.x / csize : blockIdx.x;
  const int64_t step = CL ? gridDim.x / csize : gridDim.x;
  for (int64_t row = first; row < a.rows; row += step) {
    const T *xr = (const T *)a.x + row * a.x_stride + v0 * VEC;
    float mean = 0.f, c = 0.f, rstd;
    if constexpr (LN) {
      /* The thread's moments: mt, its mean's first estimate, rel, the correction, m2t, the sum
       * of squares about mt + rel; then combined over the CTA (cta_ln_combine). */
      float mt, rel, m2t;
      if constexpr (FULL && VPT == 4) {
        /* Four vectors a thread (rows of 32 16-bit elements a thread): centred two at a time,
         * each pair on its own mean, the pairs merged by Chan's update (equal counts h: the M2
         * term delta^2 * h / 2). Centring all four on one mean spilled in 32 registers (sweep
         * 52: -20 to -30 points; 104 bytes with the y pass below); this form spills none on
         * sm_80 or sm_90. (ptxas still issues the four loads first, 16 registers of packed
         * values; the empty asm only orders the two pairs' sums.) */
        constexpr float h = 2.f * VEC, inv_h = 1.f / h;
        float bm[2], br[2], bq[2];
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          Pack<T, VEC> raw[2];
#pragma unroll
          for (int k = 0; k < 2; ++k)
            raw[k] = load_l1<T, VEC, false>(xr + (threadIdx.x + (int64_t)(2 * b + k) * blockDim.x) *
                                                     VEC);
          held_moments<T, VEC, 2, true>(raw, nvec, h, inv_h, bm[b], br[b], bq[b]);
          asm volatile("" ::: "memory");
        }
        const float delta = (bm[1] - bm[0]) + (br[1] - br[0]);
        mt = bm[0];
        rel = fmaf(0.5f, delta, br[0]);
        m2t = (bq[0] + bq[1]) + (0.5f * h) * delta * delta;
      } else {
        Pack<T, VEC> raw[VPT];
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
          if (FULL || i < nvec) {
            raw[k] = load_l1<T, VEC, false>(xr + i * VEC);
          } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e)
              raw[k].v[e] = from_f32<T>(0.f);
          }
        }
        /* (At 4 16-bit vectors a thread this form spills in 32 registers, 130-220 bytes; it is
         * planned at up to 2.) */
        held_moments<T, VEC, VPT, FULL>(raw, nvec, counts.nt, counts.inv_nt, mt, rel, m2t);
      }
      const ChunkStats cs = cta_ln_combine(mt, rel, m2t, counts, warp, round);
      mean = cs.ref;
      if constexpr (CL) {
        /* (rank 0's reference is the row's: its mean + off is the row mean it stores) */
        const RowStats st = ln_cluster_stats(cs, cluster_red_slots(), xround, csize, inv_n, a.eps);
        c = st.off;
        rstd = st.rstd;
      } else {
        c = cs.c;
        float var = cs.m2 * inv_n;
        var = var < 0.f ? 0.f : var; /* not fmaxf: a NaN stays NaN */
        rstd = 1.f / sqrtf(var + a.eps);
      }
    } else {
      float p0 = 0.f, p1 = 0.f;
#pragma unroll
      for (int k0 = 0; k0 < VPT; k0 += 4) {
        Pack<T, VEC> raw[4];
#pragma unroll
        for (int u = 0; u < 4 && k0 + u < VPT; ++u) {
          const int64_t i = threadIdx.x + (int64_t)(k0 + u) * blockDim.x;
          if (FULL || i < nvec) {
            raw[u] = load_l1<T, VEC, false>(xr + i * VEC);
          } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e)
              raw[u].v[e] = from_f32<T>(0.f);
          }
        }
#pragma unroll
        for (int u = 0; u < 4 && k0 + u < VPT; ++u)
          add_squares<T, VEC>(raw[u], p0, p1);
      }
      float s[1] = {p0 + p1};
      cta_sum_slot<1>(s, warp, round & 1);
      ++round;
      if constexpr (CL)
        s[0] = cluster_sum(s[0], cluster_red_slots(), xround, csize);
      rstd = 1.f / sqrtf(s[0] * inv_n + a.eps);
    }
    if (threadIdx.x == 0 && crank == 0)
      store_row_stats(a, row, mean + c, rstd);
    const float shift = -c * rstd;
    T *yr = (T *)a.y + row * a.y_stride + v0 * VEC;
    /* 16-bit rows of two vectors a thread load both of x's first (written as below, the
     * compiler spilled there; written so, it spills at four vectors and on fp32 rows). */
    constexpr bool X_FIRST = sizeof(T) == 2 && VPT == 2;
    Pack<T, VEC> again[X_FIRST ? VPT : 1];
    if constexpr (X_FIRST) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
        if (FULL || i < nvec)
          again[k] = load_l1<T, VEC, true>(xr + i * VEC);
      }
    }
    /* (LayerNorm at four vectors: a vector at a time, not unrolled; unrolled, the compiler
     * loads the next vector's x, gamma and beta early and spills in 32 registers) */
    constexpr int Y_UNROLL = LN && VPT == 4 ? 1 : VPT;
#pragma unroll Y_UNROLL
    for (int k = 0; k < VPT; ++k) {
      const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
      if (!FULL && i >= nvec)
        break;
      const Pack<T, VEC> pk =
          X_FIRST ? again[X_FIRST ? k : 0] : load_l1<T, VEC, true>(xr + i * VEC);
      float g[VEC], b[VEC], out[VEC];
      if constexpr (GB) { /* gamma and beta given (fwd_lean_full) */
        /* (their address made here: hoisted to the kernel's start, it spilled 8 bytes in the
         * clustered form; A/B run DF on an H100: bf16 LayerNorm 65536 +0.9 to +1.8 points,
         * 262144 +2.3 to +2.8, 24576 at 2^25 -0.4) */
        const int64_t gi = made_here(i) * VEC;
        load_vec<P, VEC>(gamma + gi, g);
        load_vec<P, VEC>(beta + gi, b);
      } else {
        load_param<P, VEC>(gamma, i * VEC, 1.f, g);
        load_param<P, VEC>(beta, i * VEC, 0.f, b);
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float xv = pack_f32<T, VEC>(pk, e);
        const float xhat = LN ? fmaf(xv - mean, rstd, shift) : xv * rstd;
        out[e] = fmaf(xhat, g[e], b[e]);
      }
      store_vec<T, VEC, kLeanOneStore>(yr + i * VEC, out);
    }
  }
  if constexpr (CL)
    cluster_barrier(csize);
}

/* The chunk of a row owned by one CTA: vectors [v0, v0 + count) of the row. */
template <typename T, int VEC, bool STAGED>
__device__ __forceinline__ void chunk_load(const Pack<T, VEC> *stage, const T *row_chunk, int64_t i,
                                           float *out) {
  if (STAGED) {
    const Pack<T, VEC> pk = stage[i]; /* one access */
    unpack_f32<T, VEC>(pk, out);
  } else {
    load_vec<T, VEC>(row_chunk + i * VEC, out);
  }
}

/* Persistent: cluster c handles rows c, c + nclusters, ... With nbuf == 2 the copy of the
 * next row into the other stage is in flight while this row is reduced and written, so the
 * memory system never waits on the reductions' barriers. */
template <typename T, typename P, int VEC, bool STAGED>
__global__ void __launch_bounds__(512) fwd_row_kernel(FwdParams a, int64_t chunk_vecs, int nbuf) {
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ ReduceSmem<2> red;
  Pack<T, VEC> *stages = reinterpret_cast<Pack<T, VEC> *>(dyn_smem);
  int csize, crank;
  cluster_shape(csize, crank);
  row_sum_init(red, csize);
  const int64_t nvec = a.cols / VEC;
  const int64_t v0 = (int64_t)crank * chunk_vecs;
  const int64_t count = chunk_count(nvec, chunk_vecs, crank);
  const int64_t cluster_id = blockIdx.x / csize, nclusters = gridDim.x / csize;
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  const float inv_n = count_rcp((float)a.cols);
  int round = 0, buf = 0;
  if (STAGED && nbuf == 2 && cluster_id < a.rows)
    stage_issue<T, VEC>(stages, (const T *)a.x + cluster_id * a.x_stride + v0 * VEC, count);

  for (int64_t row = cluster_id; row < a.rows; row += nclusters) {
    const T *xr = (const T *)a.x + row * a.x_stride + v0 * VEC;
    T *yr = (T *)a.y + row * a.y_stride + v0 * VEC;
    const Pack<T, VEC> *stage = stages + buf * chunk_vecs;
    if (STAGED) {
      const int64_t next = row + nclusters;
      if (nbuf == 1) {
        stage_issue<T, VEC>(stages, xr, count);
        cp_async_wait(0);
      } else if (next < a.rows) {
        stage_issue<T, VEC>(stages + (buf ^ 1) * chunk_vecs,
                            (const T *)a.x + next * a.x_stride + v0 * VEC, count);
        cp_async_wait(1);
      } else {
        cp_async_wait(0);
      }
      __syncthreads();
    }
    float m1 = 0.f, c = 0.f, rstd;
    if (a.layernorm) {
      float s[2] = {0.f, 0.f};
#pragma unroll 4
      for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
        float f[VEC];
        chunk_load<T, VEC, STAGED>(stage, xr, i, f);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          s[0] += f[e];
      }
      row_sum<2>(s, red, round, 0, csize);
      m1 = s[0] * inv_n;
      float t[2] = {0.f, 0.f};
#pragma unroll 4
      for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
        float f[VEC];
        chunk_load<T, VEC, STAGED>(stage, xr, i, f);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float d = f[e] - m1;
          t[0] += d;
          t[1] += d * d;
        }
      }
      row_sum<2>(t, red, round, 0, csize);
      const LnStats st = ln_stats(m1, t[0], t[1], inv_n, a.eps);
      c = st.c;
      rstd = st.rstd;
    } else {
      float s[2] = {0.f, 0.f};
#pragma unroll 4
      for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
        float f[VEC];
        chunk_load<T, VEC, STAGED>(stage, xr, i, f);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          s[0] += f[e] * f[e];
      }
      row_sum<2>(s, red, round, 0, csize);
      rstd = 1.f / sqrtf(s[0] * inv_n + a.eps);
    }
    if (crank == 0 && threadIdx.x == 0)
      store_row_stats(a, row, m1 + c, rstd);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const int64_t col = (v0 + i) * VEC;
      float f[VEC], g[VEC], b[VEC], out[VEC];
      chunk_load<T, VEC, STAGED>(stage, xr, i, f);
      load_param<P, VEC>(gamma, col, 1.f, g);
      load_param<P, VEC>(beta, col, 0.f, b);
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        out[e] = fmaf(((f[e] - m1) - c) * rstd, g[e], b[e]);
      store_vec<T, VEC>(yr + i * VEC, out);
    }
    if (STAGED) {
      __syncthreads(); /* this stage is read completely before a later row's copy lands in it */
      if (nbuf == 2)
        buf ^= 1;
    }
  }
  cluster_barrier(csize);
}

/* The row's statistics in the streaming and bulk-copy kernels, from each thread's part of the
 * chunk: LayerNorm from its values' mean base + rel and their squared deviations m2 (combined by
 * Chan's update over the CTA and the cluster), RMSNorm from its sum of squares ssq. x normalizes
 * as ((x - ref) - off) * rstd (ref and off 0 for RMSNorm). */
struct ChunkNorm {
  float ref, off, rstd, mean;
};
template <bool LN>
__device__ __forceinline__ ChunkNorm chunk_norm(float base, float rel, float m2, float ssq,
                                                const LnCounts &counts, RingRed &red, int &round,
                                                int &xround, int csize, float inv_n, float eps) {
  ChunkNorm cn = {0.f, 0.f, 0.f, 0.f};
  if constexpr (LN) {
    const ChunkStats cs = cta_ln_combine(base, rel, m2, counts, red.warp, round);
    const RowStats st = ln_cluster_stats(cs, red, xround, csize, inv_n, eps);
    cn.ref = cs.ref;
    cn.off = st.off;
    cn.rstd = st.rstd;
    cn.mean = st.mean;
  } else {
    float v[1] = {ssq};
    cta_sum<1>(v, red, round);
    cn.rstd = 1.f / sqrtf(cluster_sum(v[0], red, xround, csize) * inv_n + eps);
  }
  return cn;
}

/* fp32 rows longer than a cluster's registers (FNORM_TUNE_FWD_STREAM selects it for other
 * rows in tuning builds), a cluster of CTAs per row (sm_90), each streaming its contiguous chunk
 * twice: once from DRAM for the statistics, with STREAM_BATCH vectors a thread in flight, and once
 * in reverse order (what was read last is likeliest still in L2) to write y. LayerNorm: each thread
 * reduces batches of its values shifted by its first value, two-pass within the batch, merged by
 * Chan's update; the threads, warps and the cluster's CTAs are then combined as in the register
 * tiers. It replaces, for fp32, the staged kernel's load / reduce / write phases, which run in turn
 * with one CTA an SM (sweep 11, H200, 64 x 802816 fp32: 1527 -> 1942 GB/s LayerNorm, 1806 -> 2095
 * RMSNorm; bf16 RMSNorm 167 x 802816 was slower, 1815 -> 1112, and stayed staged; on sm_90
 * those rows now take fwd_bulk_kernel). Each batch is
 * held as loaded and the loops are not unrolled, so that the kernel fits MINB = 4 CTAs an SM (32
 * registers); with hints, the first read marks x evict-last in L2 and the second evict-first, as
 * torch.compile's kernels do (sweep 39: 64 x 802816 fp32 RMSNorm 53.8% -> 57.9% of the copy,
 * LayerNorm 49.8% -> 50.7%; on rows the CTA and register kernels take, 12-94% against 54-99%). */
constexpr int STREAM_BATCH = 4;

/* Adds the squares of N vectors as loaded to PARTS partial sums, element e to acc[e % PARTS]
 * (the streaming kernel keeps 4, fwd_loop_kernel 2). */
template <typename T, int VEC, int N, int PARTS>
__device__ __forceinline__ void add_squares(const Pack<T, VEC> (&raw)[N], float (&acc)[PARTS]) {
#pragma unroll
  for (int u = 0; u < N; ++u)
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float xv = pack_f32<T, VEC>(raw[u], e);
      acc[e % PARTS] = fmaf(xv, xv, acc[e % PARTS]);
    }
}

template <typename T, typename P, int VEC, bool LN, int MINB>
__global__ void __launch_bounds__(512, MINB)
    fwd_stream_kernel(FwdParams a, int64_t chunk_vecs, int hints) {
  __shared__ RingRed red;
  int csize, crank;
  cluster_shape(csize, crank);
  ring_red_init(red, csize);
  const int64_t nvec = a.cols / VEC;
  const int64_t v0 = (int64_t)crank * chunk_vecs;
  const int64_t count = chunk_count(nvec, chunk_vecs, crank);
  /* This thread's vectors of the chunk: threadIdx.x + j * blockDim.x, j < nj. */
  const int64_t nj =
      count > (int64_t)threadIdx.x ? (count - threadIdx.x + blockDim.x - 1) / blockDim.x : 0;
  const LnCounts counts = ln_counts((int)(nj * VEC), count * VEC);
  const float inv_n = count_rcp((float)a.cols);
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  /* hints: the first read evict-last, the second evict-first; else both at normal priority. */
  const uint64_t first = hints ? l2_policy_keep() : l2_policy_normal();
  const uint64_t second = hints ? l2_policy_drop() : l2_policy_normal();
  int round = 0, xround = 0;
  for (int64_t row = blockIdx.x / csize; row < a.rows; row += gridDim.x / csize) {
    const T *xr = (const T *)a.x + row * a.x_stride + v0 * VEC;
    /* Pass 1: statistics, from the values as loaded (16-bit ones in half the registers). */
    float shift = 0.f, mean = 0.f, m2 = 0.f, n = 0.f, ssq[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 1 /* STREAM_BATCH vectors in flight; unrolled, the loop costs registers */
    for (int64_t j = 0; j < nj; j += STREAM_BATCH) {
      Pack<T, VEC> raw[STREAM_BATCH];
      const int nb = (int)(nj - j < STREAM_BATCH ? nj - j : STREAM_BATCH);
#pragma unroll
      for (int u = 0; u < STREAM_BATCH; ++u) {
        if (u < nb) {
          raw[u] = load_hinted<T, VEC>(xr + (threadIdx.x + (j + u) * blockDim.x) * VEC, first);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            raw[u].v[e] = from_f32<T>(0.f);
        }
      }
      if constexpr (LN) {
        if (j == 0)
          shift = pack_f32<T, VEC>(raw[0], 0);
        float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int u = 0; u < STREAM_BATCH; ++u)
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            p[e & 3] += u < nb ? pack_f32<T, VEC>(raw[u], e) - shift : 0.f;
        const float fb = (float)(nb * VEC);
        const float mb = ((p[0] + p[1]) + (p[2] + p[3])) * count_rcp(fb);
        float q[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int u = 0; u < STREAM_BATCH; ++u)
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const float d = u < nb ? (reconvert<T, VEC>(raw[u], e) - shift) - mb : 0.f;
            q[e & 3] = fmaf(d, d, q[e & 3]);
          }
        const float m2b = (q[0] + q[1]) + (q[2] + q[3]);
        const float n2 = n + fb, r = count_rcp(n2), dm = mb - mean;
        mean = fmaf(dm, fb * r, mean); /* Chan's update; exact at the first batch (n = 0) */
        m2 = m2 + m2b + dm * dm * (n * fb * r);
        n = n2;
      } else {
        add_squares<T, VEC, STREAM_BATCH, 4>(raw, ssq);
      }
    }
    const ChunkNorm cn = chunk_norm<LN>(shift, mean, m2, (ssq[0] + ssq[1]) + (ssq[2] + ssq[3]),
                                        counts, red, round, xround, csize, inv_n, a.eps);
    const float ref = cn.ref, off = cn.off, rstd = cn.rstd;
    if (crank == 0 && threadIdx.x == 0)
      store_row_stats(a, row, cn.mean, rstd);
    /* Pass 2: y, last-read vectors first. */
    T *yr = (T *)a.y + row * a.y_stride + v0 * VEC;
#pragma unroll 1
    for (int64_t j = nj - 1; j >= 0; --j) {
      const int64_t i = threadIdx.x + j * blockDim.x;
      const Pack<T, VEC> pk = load_hinted<T, VEC>(xr + i * VEC, second);
      float g[VEC], b[VEC], out[VEC];
      load_param<P, VEC>(gamma, (v0 + i) * VEC, 1.f, g);
      load_param<P, VEC>(beta, (v0 + i) * VEC, 0.f, b);
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        out[e] = fmaf(((pack_f32<T, VEC>(pk, e) - ref) - off) * rstd, g[e], b[e]);
      store_vec<T, VEC, true>(yr + i * VEC, out);
    }
  }
  cluster_barrier(csize);
}

/* One of fwd_loop_kernel's x vectors with L1 priority L1P (1 evict-last, 2 evict-first), with
 * the L2 policy pol or (NO_L2, kLoopNoL2) none. */
template <typename T, int VEC, int L1P, bool NO_L2>
__device__ __forceinline__ Pack<T, VEC> loop_load(const T *p, uint64_t pol) {
  if constexpr (NO_L2)
    return load_l1<T, VEC, L1P == 2>(p);
  else
    return load_hinted_l1<T, VEC, L1P>(p, pol);
}

/* A step of the full forms' vectors (fwd_loop_kernel, fwd_loop_ln_kernel): vector u of the
 * thread's step at xs + u * THREADS vectors, constant offsets from one address, with L1 priority
 * L1P and L2 policy pol (or, NO_L2, none); no tests (rows of whole steps). */
template <typename T, int VEC, int STEP, int THREADS, int L1P, bool NO_L2>
__device__ __forceinline__ void full_step_load(Pack<T, VEC> (&raw)[STEP], const T *xs,
                                               uint64_t pol) {
#pragma unroll
  for (int u = 0; u < STEP; ++u)
    raw[u] = loop_load<T, VEC, L1P, NO_L2>(xs + u * THREADS * VEC, pol);
}

/* The y pass of the full forms (fwd_loop_kernel's and fwd_loop_ln_kernel's): x read again a step
 * at a time (L1 evict-first, L2 policy pol unless NO_L2), gamma and beta by movable loads
 * (FREE_PARAMS) or plain ones, y = norm(x) * gamma + beta stored a 16-byte vector at a time by
 * asm (ONE_STORE) or as plain copies. norm(x) is the row's normalization of one value.
 * STAGED_U: gamma and beta of the first STAGED_U vectors of each thread's first step come from
 * `staged` ([STAGED_U][THREADS] 16-byte packs of gamma, then the same of beta) instead. */
template <typename T, typename P, int VEC, int STEP, int THREADS, bool NO_L2, bool FREE_PARAMS,
          bool ONE_STORE, int STAGED_U = 0, typename Norm>
__device__ __forceinline__ void full_row_y(const T *xr, T *yr, int64_t nvec, const P *gamma,
                                           const P *beta, uint64_t pol, const Norm &norm,
                                           const uint4 *staged = nullptr) {
  static_assert(STAGED_U == 0 || sizeof(P) * VEC == 16, "staged: a 16-byte pack a vector");
  for (int64_t j = threadIdx.x; j < nvec; j += STEP * THREADS) {
    const T *xs = xr + j * VEC;
    T *ys = yr + j * VEC;
    Pack<T, VEC> raw[STEP];
    full_step_load<T, VEC, STEP, THREADS, 2, NO_L2>(raw, xs, pol);
#pragma unroll
    for (int u = 0; u < STEP; ++u) {
      const int64_t col = (j + u * THREADS) * VEC;
      float g[VEC], b[VEC], out[VEC];
      if (STAGED_U > u && j < THREADS) { /* the first step's u-th vector: gamma and beta staged */
        Pack<P, VEC> pk;
        const uint4 rg = staged[u * THREADS + j], rb = staged[(STAGED_U + u) * THREADS + j];
        memcpy(&pk, &rg, sizeof pk);
        unpack_f32<P, VEC>(pk, g);
        memcpy(&pk, &rb, sizeof pk);
        unpack_f32<P, VEC>(pk, b);
      } else if constexpr (FREE_PARAMS) {
        load_param_free<P, VEC>(gamma, col, 1.f, g);
        load_param_free<P, VEC>(beta, col, 0.f, b);
      } else {
        load_param<P, VEC>(gamma, col, 1.f, g);
        load_param<P, VEC>(beta, col, 0.f, b);
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        out[e] = fmaf(norm(pack_f32<T, VEC>(raw[u], e)), g[e], b[e]);
      store_vec<T, VEC, ONE_STORE>(ys + u * THREADS * VEC, out);
    }
  }
}

/* A step of fwd_loop_kernel's vectors (j + u * blockDim.x, u < STEP) with L1 priority L1P, those
 * past the row zero. */
template <typename T, int VEC, int STEP, int L1P, bool NO_L2 = false>
__device__ __forceinline__ void loop_step_load(Pack<T, VEC> (&raw)[STEP], const T *xr, int64_t j,
                                               int64_t nvec, uint64_t pol) {
#pragma unroll
  for (int u = 0; u < STEP; ++u) {
    const int64_t i = j + (int64_t)u * blockDim.x;
    if (i < nvec) {
      raw[u] = loop_load<T, VEC, L1P, NO_L2>(xr + i * VEC, pol);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        raw[u].v[e] = from_f32<T>(0.f);
    }
  }
}

/* RMSNorm rows in torch.compile's shape (ncu18, ncu20): a CTA a row (the grid strides over rows),
 * a loop over the row of STEP vectors a thread a step, x read evict-last in L1 and L2 for the
 * sum of squares and again evict-first for y (mostly from L1), gamma through L1; no cluster or
 * merge work. Planned for fp32 RMSNorm rows of 2048-4096 (plan_forward), a single step of four
 * vectors a thread there: sweep 86 (H200, tuning build, 2^27 elements) 65536 x 2048 97.6% ->
 * 99.8-100.0% of the copy, 32768 x 4096 98.2-98.3% -> 100.6% (fwd_cta_reread_kernel of the same
 * shape before, 48 registers, plain loads). Elsewhere it lost: in one step of 256-512 threads
 * (fp32 8192 -0.7 points, 16-bit 8192 -4 to -5.5) and looping (fp32 32768 92.6% -> 79-90%,
 * 16-bit RMSNorm 16384-65536 7-46 points); bf16 4096 +1.1, fp16 level (not planned). Tuning
 * builds (FNORM_TUNE_FWD_LOOP) have every 16-byte RMSNorm form, at 1, 2, 4 or 8 vectors a step.
 * PIPE (tuning builds, FNORM_TUNE_FWD_LOOP_PIPE=1): both loops issue the next step's loads before
 * they use this step's vectors, two steps in flight a thread (sweep 87: 0.4-46 points under the
 * planned kernels). At one vector a step the kernel fits 32 registers, so two 1024-thread CTAs
 * an SM, whose two rows of fp32 32768 overflow L1 (ncu21: 19.6% L1 hits against torch.compile's
 * 44.6% at one CTA an SM); held to one CTA (FNORM_TUNE_FWD_LOOP_SMEM) it lacks loads in flight,
 * and eight vectors in one step won only on fp32 16384 at 2^27 (sweep 89, A/B run CM).
 * FORM (LoopForm bits, kernels.cuh): what torch.compile's Triton kernel for fp32 RMSNorm 32768
 * does differently (its SASS, session 37: 1024 threads, the row in one step of eight 16-byte
 * loads a thread issued back to back at constant offsets, gamma's loads of the y pass issued ahead
 * of its stores). The full form (kLoopFull + kLoopFreeParams, STEP 8) is that: rows of whole
 * steps of 1024 threads, no tests, one address a step, gamma read by movable asm. Planned for
 * fp32 RMSNorm 32768 and 65536 (plan_forward): sweep 91 (H200, tuning build, 2^27) 32768 92.5% ->
 * 98.3% (torch.compile 98.6%), 65536 85.3% -> 90.0%; the full form alone 94.1%, movable gamma
 * loads alone (the looping form) lost 6. Sweep 90: no L2 policy (kLoopNoL2) level to -2.5,
 * plain stores -3 to -16, gamma/beta of a step read first (kLoopParamsFirst) spills (21%).
 * Sweeps 92 and 94 (tuning builds) ran the full form at 160-512 threads (kLoopFull512, 256,
 * 128 and 160: the thread count that fills a row in one step); A/B runs CR, CS and CU (release
 * builds) planned it for fp32 RMSNorm 5120-16384 and 16-bit RMSNorm 16384-65536, each from the
 * size where it stopped losing (plan.cu, loop_full_form_threads); sweep 99 and A/B run CY at four
 * vectors a step (STEP 4, 256 threads) for 16-bit RMSNorm 8192 from 2^26 elements (96.7% ->
 * 98.4-99.1%). A LayerNorm form of the full form
 * at one step (the row read once, its values held in registers for the mean, the centred sum of
 * squares and y) lost 2-5 points to the planned kernels on fp32 LayerNorm 8192-32768 (sweep 93) and
 * was removed; fwd_loop_ln_kernel (below) reads x twice instead, as this kernel does. */
template <typename T, typename P, int VEC, int STEP, bool PIPE = false, int FORM = 0>
__global__ void __launch_bounds__(1024, 1) fwd_loop_kernel(FwdParams a) {
  constexpr bool no_l2 = (FORM & kLoopNoL2) != 0;
  constexpr bool full = (FORM & kLoopFull) != 0;
  constexpr bool free_params = (FORM & kLoopFreeParams) != 0;
  constexpr int kFullThreads = loop_full_threads(FORM);
  __shared__ __align__(16) float warp[2][32][1];
  const int64_t nvec = a.cols / VEC;
  const int64_t span = (int64_t)STEP * blockDim.x;
  const float inv_n = 1.f / (float)a.cols;
  const uint64_t keep = l2_policy_keep(), drop = l2_policy_drop();
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  int slot = 0;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T *xr = (const T *)a.x + row * a.x_stride;
    float acc[2] = {0.f, 0.f};
    if constexpr (PIPE) {
      Pack<T, VEC> cur[STEP];
      loop_step_load<T, VEC, STEP, 1>(cur, xr, threadIdx.x, nvec, keep);
      for (int64_t j = threadIdx.x; j < nvec; j += span) {
        Pack<T, VEC> nxt[STEP];
        loop_step_load<T, VEC, STEP, 1>(nxt, xr, j + span, nvec, keep);
        add_squares<T, VEC, STEP, 2>(cur, acc);
#pragma unroll
        for (int u = 0; u < STEP; ++u)
          cur[u] = nxt[u];
      }
    } else if constexpr (full) {
      for (int64_t j = threadIdx.x; j < nvec; j += STEP * kFullThreads) {
        const T *xs = xr + j * VEC;
        Pack<T, VEC> raw[STEP];
        full_step_load<T, VEC, STEP, kFullThreads, 1, no_l2>(raw, xs, keep);
        add_squares<T, VEC, STEP, 2>(raw, acc);
      }
    } else {
      for (int64_t j = threadIdx.x; j < nvec; j += span) {
        Pack<T, VEC> raw[STEP];
        loop_step_load<T, VEC, STEP, 1, no_l2>(raw, xr, j, nvec, keep);
        add_squares<T, VEC, STEP, 2>(raw, acc);
      }
    }
    float v[1] = {acc[0] + acc[1]};
    cta_sum_slot<1, 1>(v, warp, slot); /* (the slots alternate: a row's barrier separates them) */
    slot ^= 1;
    const float rstd = 1.f / sqrtf(v[0] * inv_n + a.eps);
    if (threadIdx.x == 0)
      store_row_stats(a, row, 0.f, rstd);
    T *yr = (T *)a.y + row * a.y_stride;
    if constexpr (full) {
      full_row_y<T, P, VEC, STEP, kFullThreads, no_l2, free_params, (FORM & kLoopPlainStore) == 0>(
          xr, yr, nvec, gamma, beta, drop, [rstd](float x) { return x * rstd; });
    } else { /* (not instantiated for the full forms, which end above) */
      [[maybe_unused]] Pack<T, VEC> ahead[PIPE ? STEP : 1];
      if constexpr (PIPE)
        loop_step_load<T, VEC, STEP, 2>(ahead, xr, threadIdx.x, nvec, drop);
      for (int64_t j = threadIdx.x; j < nvec; j += span) {
        Pack<T, VEC> raw[STEP];
        if constexpr (PIPE) {
#pragma unroll
          for (int u = 0; u < STEP; ++u)
            raw[u] = ahead[u];
          loop_step_load<T, VEC, STEP, 2>(ahead, xr, j + span, nvec, drop);
        } else {
#pragma unroll
          for (int u = 0; u < STEP; ++u) {
            const int64_t i = j + (int64_t)u * blockDim.x;
            if (i < nvec)
              raw[u] = loop_load<T, VEC, 2, no_l2>(xr + i * VEC, drop);
          }
        }
        if constexpr ((FORM & kLoopParamsFirst) != 0) {
          float g[STEP][VEC], b[STEP][VEC];
#pragma unroll
          for (int u = 0; u < STEP; ++u) {
            const int64_t i = j + (int64_t)u * blockDim.x;
            if (i < nvec) {
              load_param<P, VEC>(gamma, i * VEC, 1.f, g[u]);
              load_param<P, VEC>(beta, i * VEC, 0.f, b[u]);
            }
          }
#pragma unroll
          for (int u = 0; u < STEP; ++u) {
            const int64_t i = j + (int64_t)u * blockDim.x;
            if (i < nvec) {
              float out[VEC];
#pragma unroll
              for (int e = 0; e < VEC; ++e)
                out[e] = fmaf(pack_f32<T, VEC>(raw[u], e) * rstd, g[u][e], b[u][e]);
              store_vec<T, VEC, (FORM & kLoopPlainStore) == 0>(yr + i * VEC, out);
            }
          }
        } else {
#pragma unroll
          for (int u = 0; u < STEP; ++u) {
            const int64_t i = j + (int64_t)u * blockDim.x;
            if (i < nvec) {
              float g[VEC], b[VEC], out[VEC];
              if constexpr (free_params) {
                load_param_free<P, VEC>(gamma, i * VEC, 1.f, g);
                load_param_free<P, VEC>(beta, i * VEC, 0.f, b);
              } else {
                load_param<P, VEC>(gamma, i * VEC, 1.f, g);
                load_param<P, VEC>(beta, i * VEC, 0.f, b);
              }
#pragma unroll
              for (int e = 0; e < VEC; ++e)
                out[e] = fmaf(pack_f32<T, VEC>(raw[u], e) * rstd, g[e], b[e]);
              store_vec<T, VEC, (FORM & kLoopPlainStore) == 0>(yr + i * VEC, out);
            }
          }
        }
      }
    }
  }
}

/* LayerNorm rows in fwd_loop_kernel's full form (FORM with kLoopFull and kLoopLn; its thread bits
 * and kLoopNoL2 as there): a CTA a row, steps of 32 values a thread in 16-byte vectors at constant
 * offsets, x read twice, evict-last for the statistics and evict-first (mostly from L1) for y, as
 * torch.compile's LayerNorm kernels read it (ncu18: Welford partials, a CTA a row). The
 * statistics keep the accuracy contract: each thread centres a step's values on their own mean
 * in registers (thread_moments), merges its steps by Chan's update relative to its first step's
 * mean, and the threads are combined by cta_ln_combine behind one barrier, so no sum of squares
 * is taken about a mean far from the data. gamma/beta are read by movable asm
 * (load_param_free). Rows must be whole steps of the CTA (loop_full_fits, the plan's vpt 32 / VEC).
 * Planned for fp32 LayerNorm 8192-32768 in one step (plan.cu, loop_full_form_threads): sweep 95 and
 * A/B run CW (H200) 8192 96.3% -> 97.8%, 16384 96.1% -> 98.0%, 32768 86.1% -> 89.7% of the copy at
 * 2^27 elements. 16-bit rows lost 3-27 points (four vectors a step; eight spill under 64
 * registers, and with 80-128 registers, sweep 97, they still lost save on two fp16 cells), and so
 * did longer fp32 rows in several steps, steps of 16 values (sweep 96: level at best) and a
 * cluster a row (sweep 98: 6-25 points); their code is in bench/tune/. */
template <typename T, typename P, int VEC, int FORM, int STAGED_U = 0>
__global__ void __launch_bounds__(1024, 1) fwd_loop_ln_kernel(FwdParams a) {
  static_assert((FORM & kLoopFull) && (FORM & kLoopLn), "the LayerNorm full form");
  /* 32 values a thread a step (8 fp32 vectors, 4 of 16-bit ones: eight 16-bit vectors spill
   * under the 64 registers of 1024 threads) */
  constexpr int kStep = 32 / VEC, kThreads = loop_full_threads(FORM);
  constexpr bool no_l2 = (FORM & kLoopNoL2) != 0;
  constexpr float kStepValues = (float)(kStep * VEC);
  __shared__ __align__(16) float warp[2][32][4];
  const int64_t nvec = a.cols / VEC;
  const uint64_t keep = l2_policy_keep(), drop = l2_policy_drop();
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  /* every thread holds cols / kThreads values of a row */
  const LnCounts counts = ln_counts_uniform((float)(a.cols / kThreads), a.cols);
  bool mine[kStep];
#pragma unroll
  for (int u = 0; u < kStep; ++u)
    mine[u] = true;
  /* STAGED_U (kFwdLoopLnStaged; gamma and beta given): their first STAGED_U vectors of each
   * thread's step (its own: read back by it alone, so no barrier) in shared memory for the launch,
   * the rest from L2 every row as before: [STAGED_U][kThreads] gamma, then the same for beta */
  extern __shared__ uint4 staged_params[];
#pragma unroll
  for (int u = 0; u < STAGED_U; ++u) {
    const int64_t col = ((int64_t)u * kThreads + threadIdx.x) * VEC;
    staged_params[u * kThreads + threadIdx.x] = load_words_in_place(gamma + col);
    staged_params[(STAGED_U + u) * kThreads + threadIdx.x] = load_words_in_place(beta + col);
  }
  int round = 0;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T *xr = (const T *)a.x + row * a.x_stride;
    /* the thread's values have mean base + rel and squared deviations m2 over `steps` steps */
    float base = 0.f, rel = 0.f, m2 = 0.f, steps = 0.f;
    for (int64_t j = threadIdx.x; j < nvec; j += kStep * kThreads) {
      const T *xs = xr + j * VEC;
      Pack<T, VEC> raw[kStep];
      full_step_load<T, VEC, kStep, kThreads, 1, no_l2>(raw, xs, keep);
      /* (the second pass converts the values again rather than hold them as floats) */
      const auto x_at = [&](int k, int e) { return pack_f32<T, VEC>(raw[k], e); };
      const auto x_again = [&](int k, int e) { return reconvert<T, VEC>(raw[k], e); };
      float ms, rs, m2s;
      thread_moments<kStep, VEC>(x_at, x_again, mine, 1.f / kStepValues, ms, rs, m2s);
      if (steps == 0.f) {
        base = ms;
        rel = rs;
        m2 = m2s;
      } else { /* Chan: steps * kStepValues values so far, kStepValues more */
        const float d = ((ms - base) + rs) - rel, w = 1.f / (steps + 1.f);
        rel = fmaf(d, w, rel);
        m2 += fmaf(d * d * kStepValues * steps, w, m2s);
      }
      steps += 1.f;
    }
    const ChunkStats cs = cta_ln_combine(base, rel, m2, counts, warp, round);
    /* 1 / cols and y's row made here (made_here), not held across the statistics: held, one of
     * them spilled at the 64-register cap (8 bytes of stack; ncu24: 34 MB more L2 writes at fp32
     * 16384 x 8192), and A/B run DD measured the kernel without it 0.4-1.7 points faster */
    const RowStats st = ln_rank_combine(cs, nullptr, 1, 1.f / (float)made_here(a.cols), a.eps);
    if (threadIdx.x == 0)
      store_row_stats(a, row, st.mean, st.rstd);
    T *yr = (T *)a.y + made_here(row) * a.y_stride;
    full_row_y<T, P, VEC, kStep, kThreads, no_l2, true, true, STAGED_U>(
        xr, yr, nvec, gamma, beta, drop,
        [&cs, &st](float x) { return ((x - cs.ref) - st.off) * st.rstd; }, staged_params);
  }
}

/* fwd_loop_ln_kernel (1024 threads) with staged parameters (kFwdLoopLnStaged), as plan_forward
 * plans it: plan.smem bytes of dynamic shared memory and plan.carveout, set before the occupancy
 * calculation sizes the persistent grid (the CTAs resident at once, at most -plan.grid), each CTA
 * keeping its staged parameters for every row it takes. (Not launch_kernel: its
 * kernel_attributes asks for the largest carve-out, which would leave L1 less than the row.) */
static fnorm_status launch_loop_staged(void (*k)(FwdParams), const Plan &plan, const FwdParams &a,
                                       cudaStream_t stream) {
  if (kernel_attributes(k, plan.smem, 1) != FNORM_SUCCESS ||
      (plan.carveout > 0 && cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                 plan.carveout) != cudaSuccess)) {
    cudaGetLastError();
    return FNORM_ERR_CUDA;
  }
  int64_t units = 0;
  const fnorm_status st = persistent_units(k, plan.threads, plan.smem, 1, -plan.grid, &units);
  if (st != FNORM_SUCCESS)
    return st;
  return launch_prepared(k, units, plan.threads, plan.smem, 1, stream, a);
}

/* fwd_loop_ln_kernel by FORM: 536 at 1024 threads, 568 at 512, 600 at 256 (release builds: fp32
 * rows with fp32 parameters, plan_forward's loop_full_form_threads), and in tuning builds also
 * 664 at 128 and 792 at 160; NULL for any other. */
template <typename T, typename P, int VEC> static void (*fwd_loop_ln_pick(int form))(FwdParams) {
  constexpr int ln = kLoopFull + kLoopFreeParams + kLoopLn;
  if constexpr (kTuningBuild || (std::is_same<T, float>::value && std::is_same<P, float>::value)) {
    switch (form) {
    case ln:
      return fwd_loop_ln_kernel<T, P, VEC, ln>;
    case ln + kLoopFull512:
      return fwd_loop_ln_kernel<T, P, VEC, ln + kLoopFull512>;
    case ln + kLoopFull256:
      return fwd_loop_ln_kernel<T, P, VEC, ln + kLoopFull256>;
    }
  }
  if constexpr (kTuningBuild) {
    switch (form) {
    case ln + kLoopFull128:
      return fwd_loop_ln_kernel<T, P, VEC, ln + kLoopFull128>;
    case ln + kLoopFull160:
      return fwd_loop_ln_kernel<T, P, VEC, ln + kLoopFull160>;
    }
  }
  (void)form;
  return nullptr;
}

/* fwd_loop_kernel's FORM (tuning builds: 1, 2, 4, 8, 16, 24, 25, 28, 56 or 88, 152 (the full
 * form at 128 threads) or 280 (160) at eight vectors, 1048 (320) at four, 2072 (640) at two) at
 * STEP vectors a step; NULL for any other. */
template <typename T, typename P, int VEC, int STEP>
static void (*fwd_loop_form_pick(int form))(FwdParams) {
  switch (form) {
  case 1:
    return fwd_loop_kernel<T, P, VEC, STEP, false, 1>;
  case 2:
    return fwd_loop_kernel<T, P, VEC, STEP, false, 2>;
  case 4:
    return fwd_loop_kernel<T, P, VEC, STEP, false, 4>;
  case 8:
    return fwd_loop_kernel<T, P, VEC, STEP, false, 8>;
  case 16:
    return fwd_loop_kernel<T, P, VEC, STEP, false, 16>;
  case 24:
    return fwd_loop_kernel<T, P, VEC, STEP, false, 24>;
  case 25:
    return fwd_loop_kernel<T, P, VEC, STEP, false, 25>;
  case 28:
    return fwd_loop_kernel<T, P, VEC, STEP, false, 28>;
  case 56:
    return fwd_loop_kernel<T, P, VEC, STEP, false, 56>;
  case 88:
    return fwd_loop_kernel<T, P, VEC, STEP, false, 88>;
  case 152: /* (eight vectors a step only: rows of 1024 and 1280 vectors in one step) */
    return STEP == 8 ? fwd_loop_kernel<T, P, VEC, 8, false, 152> : nullptr;
  case 280:
    return STEP == 8 ? fwd_loop_kernel<T, P, VEC, 8, false, 280> : nullptr;
  case 1048: /* (320 and 640 threads at four and two vectors a step: fp32 5120 in one step;
                release builds have 1048 too, fwd_loop_full_pick) */
    return STEP == 4 ? fwd_loop_kernel<T, P, VEC, 4, false, 1048> : nullptr;
  case 2072:
    return STEP == 2 ? fwd_loop_kernel<T, P, VEC, 2, false, 2072> : nullptr;
  default:
    return nullptr;
  }
}

/* Release builds' full forms of fwd_loop_kernel (plan_forward's loop_full_form_threads and
 * loop_full_form_vpt) by FORM and vectors a step: kLoopFull + kLoopFreeParams at 1024, 512 and 256
 * threads, and at 160 for fp32 rows, eight vectors a step; four vectors at 256 threads for 16-bit
 * rows (RMSNorm 8192) and at 320 for fp32 rows (RMSNorm 5120); NULL for any other. */
template <typename T, typename P, int VEC>
static void (*fwd_loop_full_pick(int form, int vpt))(FwdParams) {
  constexpr int full = kLoopFull + kLoopFreeParams;
  if (vpt == 4) {
    if constexpr (sizeof(T) == 2) {
      if (form == full + kLoopFull256)
        return fwd_loop_kernel<T, P, VEC, 4, false, full + kLoopFull256>;
    } else {
      if (form == full + kLoopFull320)
        return fwd_loop_kernel<T, P, VEC, 4, false, full + kLoopFull320>;
    }
    return nullptr;
  }
  if (vpt != 8)
    return nullptr;
  switch (form) {
  case full:
    return fwd_loop_kernel<T, P, VEC, 8, false, full>;
  case full + kLoopFull512:
    return fwd_loop_kernel<T, P, VEC, 8, false, full + kLoopFull512>;
  case full + kLoopFull256:
    return fwd_loop_kernel<T, P, VEC, 8, false, full + kLoopFull256>;
  case full + kLoopFull160:
    if constexpr (std::is_same<T, float>::value)
      return fwd_loop_kernel<T, P, VEC, 8, false, full + kLoopFull160>;
    else
      return nullptr;
  default:
    return nullptr;
  }
}

/* The forward batch kernel's CTAs an SM, by the bytes of its stages: two where they fit twice
 * (16-bit rows of 65536). */
constexpr int fwd_batch_ctas_an_sm(int stages, int rows, int threads, int vpt) {
  return stages * rows * threads * vpt * 16 <= 96 * 1024 ? 2 : 1;
}

/* ---- the batch tier (sm_90): rows of exactly a cluster's vectors, R rows a round ----
 * The backward's batch tier (bwd_batch_kernel) in the forward's shape, for the long rows whose
 * other kernels stay 6-15 points under the copy (run FV, H200: 16-bit LayerNorm 65536 81-82%,
 * fp32 LayerNorm 65536 and 262144 85-86%). A cluster of CL CTAs of THREADS threads a row, each
 * owning VPT vectors a thread of it, persistent: each cluster loops over rounds of R rows.
 * Every thread copies its own vectors of the round S - 1 rounds ahead into shared memory by
 * cp.async (stages from a line, smem_on_line) and reads back only what it copied, so that the
 * stages need no barrier; it holds gamma and beta for its vectors in registers for the whole
 * launch (read once, where the other kernels re-read them from L1 for every row). Statistics
 * as the lean form's (each thread's values centred on their own mean, held_moments, combined by
 * Chan's update over the warp, the CTA and the cluster in fixed order: every CTA gets the same
 * bits), the R rows of a round behind one __syncthreads; LayerNorm exchanges a float4 a row
 * (a RingRed each), RMSNorm its R sums of squares in one. Only warp 0 merges the CTA's
 * LayerNorm terms (it alone posts them), and every warp combines the cluster's relative to rank
 * 0's reference: ncu35 (bf16 LayerNorm 262144) had counted 17 instructions an element, a shuffle
 * among them, where RMSNorm takes about 11; with the word reads below and the exchange's wait
 * suspended rather than spinning, 14 in ncu36, whose build also took x * rstd - mean * rstd as
 * one fma in the y pass (an instruction an element fewer; not kept: it lost the 16-bit rows of
 * a 1e4 offset, whose rstd is large, to the rounding of mean * rstd). With DEFER (three stages: the
 * shapes of three stages in fwd_batch_shape) each round's y pass waits one round, so that the
 * cluster's exchange overlaps the next round's first pass, as the backward batch kernel's rows of
 * 65536. bench/tune/fwdprobe.cu (lead 52, run in session 58) chose the shapes; A/B run GB measured
 * them in the library (fwd_batch_shape has both). */
template <typename T, int THREADS, int VPT, int R, int S, int CL, bool LN, bool DEFER = S == 3>
__global__ void __launch_bounds__(THREADS, fwd_batch_ctas_an_sm(S, R, THREADS, VPT))
    fwd_batch_kernel(FwdParams a) {
  constexpr int VEC = 16 / (int)sizeof(T), EPT = VEC * VPT, NV = THREADS * VPT;
  static_assert((S == 2 || S == 3) && (!DEFER || S == 3),
                "a round ahead; the deferred form holds one round longer");
  static_assert(CL >= 2 && CL <= 16 && R >= 1 && R <= 4 && THREADS % 32 == 0,
                "a cluster a row; one float4 of sums a round (RMSNorm)");
  using V = Pack<T, VEC>;
  int csize = 1, crank = 0;
  cluster_shape(csize, crank);
  constexpr int NRED = LN ? R : 1;
  __shared__ RingRed red[NRED];
#pragma unroll
  for (int j = 0; j < NRED; ++j)
    ring_red_init(red[j], CL);
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  V *const stage = reinterpret_cast<V *>(smem_on_line(dyn_smem)); /* [S][R][NV] */
  const int t = threadIdx.x;
  const int64_t col0 = (int64_t)crank * NV * VEC;
  const int64_t unit = blockIdx.x / CL, step = gridDim.x / CL;
  const int64_t rounds = (a.rows + R - 1) / R;
  const T *x = (const T *)a.x;
  T *y = (T *)a.y;
  auto slot = [&](int s, int j, int k) { return stage + (s * R + j) * NV + k * THREADS + t; };
  auto col_of = [&](int k) { return col0 + ((int64_t)k * THREADS + t) * VEC; };
  auto issue = [&](int s, int64_t q) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t row = q * R + j;
      if (q < rounds && row < a.rows)
#pragma unroll
        for (int k = 0; k < VPT; ++k)
          cp_async_16(slot(s, j, k), x + row * a.x_stride + col_of(k));
    }
    cp_async_commit();
  };
  V gp[VPT], bp[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const T *g = (const T *)a.gamma, *b = (const T *)a.beta;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      gp[k].v[e] = from_f32<T>(1.f);
      bp[k].v[e] = from_f32<T>(0.f);
    }
    if (g)
      gp[k] = *reinterpret_cast<const V *>(g + col_of(k));
    if (b)
      bp[k] = *reinterpret_cast<const V *>(b + col_of(k));
  }
  const LnCounts counts = ln_counts_full<EPT>((int64_t)NV * VEC);
  const float inv_n = count_rcp((float)a.cols);
  int par = 0, xround = 0;
  /* A round's rows' statistics: LayerNorm, the row's RowStats against ref, rank 0's reference
   * (st.off the mean's offset from it); RMSNorm, rstd alone. */
  struct Rows {
    float ref[R];
    RowStats st[R];
  };
  /* The first pass over stage c (round q): LayerNorm, each warp's terms of each row posted to
   * red[j].warp[par]; RMSNorm, the thread's sums of squares into ssq. */
  auto first_pass = [&](int c, int64_t q, float(&ssq)[R]) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      /* A row past the last (the last round's) reads whatever its slot holds: its statistics
       * are exchanged but never used, and its y is not stored. Read as whole words: a select
       * of zeros for it cost the 16-bit forms 21 byte permutes a row (ncu35). */
      V raw[VPT];
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const uint4 w = *reinterpret_cast<const uint4 *>(slot(c, j, k));
        memcpy(&raw[k], &w, 16);
      }
      if constexpr (LN) {
        float mt, rel, m2t;
        held_moments<T, VEC, VPT, true>(raw, NV, counts.nt, counts.inv_nt, mt, rel, m2t);
        warp_ln_post(mt, rel, m2t, counts, red[j].warp[par][t >> 5]);
      } else {
        float p0 = 0.f, p1 = 0.f;
#pragma unroll
        for (int k = 0; k < VPT; ++k)
          add_squares<T, VEC>(raw[k], p0, p1);
        ssq[j] = p0 + p1;
      }
    }
  };
  /* Round r's exchange read: the rows' statistics. */
  auto wait_rows = [&](int r, Rows &rows) {
    if constexpr (LN) {
      /* Every row's slots first, then their combinations, which the compiler may interleave.
       * Relative to rank 0's reference (a ChunkStats of it alone: st.off is then the mean's
       * offset from it), so that only the CTA's warp 0, which posts, merges the CTA's terms.
       * That reference is one thread's mean of its values, as the CTA's own was: the y pass's
       * x - ref and off are as near the data as before. */
      const float4 *slots[R];
#pragma unroll
      for (int j = 0; j < R; ++j)
        slots[j] = red[j].cta[cluster_wait<true>(red[j], r)];
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const ChunkStats rank0 = {slots[j][0].x, 0.f, 0.f, 0.f};
        rows.ref[j] = rank0.ref;
        rows.st[j] = ln_rank_combine(rank0, slots[j], CL, inv_n, a.eps);
      }
    } else {
      float sums[R];
      rank_sums<R>(red[0].cta[cluster_wait<true>(red[0], r)], CL, sums);
#pragma unroll
      for (int j = 0; j < R; ++j)
        rows.st[j].rstd = 1.f / sqrtf(sums[j] * inv_n + a.eps);
    }
  };
  /* After the first pass: the CTA's terms of each row behind one __syncthreads (with `wait`,
   * before it, the previous round's exchange read into `last` (wait_rows), so that the barrier
   * stands between those reads and the post that reuses their slots), then this round's post. */
  auto cta_post = [&](float(&ssq)[R], bool wait, Rows &last) {
    if (wait)
      wait_rows(xround - 1, last);
    if constexpr (LN) {
      __syncthreads();
      /* Only warp 0's threads post (cluster_send); the other warps skip the merge. (The warp's
       * index through a shuffle: the compiler then knows the branch whole for each warp, where
       * on t < 32 it wraps the merge's shuffles in code for a divided warp.) */
      const int warp = __shfl_sync(0xffffffffu, t >> 5, 0);
#pragma unroll
      for (int j = 0; j < R; ++j) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (warp == 0) {
          const ChunkStats cs = cta_ln_merge(red[j].warp[par], counts);
          v = make_float4(cs.ref, cs.c, cs.m2, cs.n);
        }
        int xr = xround; /* (each row's RingRed in the same round) */
        cluster_post(v, red[j], xr, CL);
      }
    } else {
      cta_sum_slot<R, 4>(ssq, red[0].warp, par);
      int xr = xround;
      cluster_post(float4_of(ssq), red[0], xr, CL);
    }
    ++xround;
    par ^= 1;
  };
  /* y of stage c (round q) from its rows' statistics. */
  auto y_pass = [&](int c, int64_t q, const Rows &r) {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t row = q * R + j;
      if (row >= a.rows)
        break;
      const float rstd = r.st[j].rstd, ref = LN ? r.ref[j] : 0.f;
      const float shift = LN ? -r.st[j].off * rstd : 0.f;
      if (crank == 0 && t == 0)
        store_row_stats(a, row, LN ? r.st[j].mean : 0.f, rstd);
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const V pk = *slot(c, j, k);
        float out[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float xv = pack_f32<T, VEC, true>(pk, e);
          const float xhat = LN ? fmaf(xv - ref, rstd, shift) : xv * rstd;
          out[e] = fmaf(xhat, pack_f32<T, VEC, true>(gp[k], e), pack_f32<T, VEC, true>(bp[k], e));
        }
        store_vec<T, VEC, true>(y + row * a.y_stride + col_of(k), out);
      }
    }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    issue(s, unit + s * step);
  int cur = 0;
  Rows rows = {}, held = {};
  float ssq[R];
  if constexpr (!DEFER) {
    for (int64_t q = unit; q < rounds; q += step) { /* (uniform over the cluster) */
      /* The stage S - 1 rounds ahead held the round before this one, which this thread has read
       * (its own copies only). */
      issue((cur + S - 1) % S, q + (S - 1) * step);
      cp_async_wait_n<S - 1>(); /* this round's group has landed */
      first_pass(cur, q, ssq);
      cta_post(ssq, false, held);
      wait_rows(xround - 1, rows);
      y_pass(cur, q, rows);
      cur = (cur + 1) % S;
    }
  } else {
    /* Round q: its first pass; the wait for round q - 1's exchange and its statistics (before
     * the barrier); round q's post; round q - 1's y pass; its stage refilled S - 1 rounds ahead
     * of q. A stage holds its round from the issue until a round after its first pass. */
    int64_t q = unit;
    for (; q < rounds; q += step) {
      cp_async_wait_n<S - 2>(); /* this round's group has landed */
      const bool deferred = q != unit;
      first_pass(cur, q, ssq);
      cta_post(ssq, deferred, held);
      const int prev = (cur + S - 1) % S;
      if (deferred)
        y_pass(prev, q - step, held);
      /* (rows is never written: wait_rows fills held before each y pass. The reset stays
       * because A/B run GI measured the code with it; without it the deferred forms' machine
       * code differs, and the fp16 form's spill grows from 92 to 160 bytes: ptxas, session 60.) */
      held = rows;
      issue(prev, q + (S - 1) * step);
      cur = (cur + 1) % S;
    }
    if (q != unit) { /* the last round's y pass */
      wait_rows(xround - 1, held);
      y_pass((cur + S - 1) % S, q - step, held);
    }
  }
  cp_async_wait_n<0>(); /* (only empty groups can be pending) */
  cluster_barrier(CL);  /* no CTA leaves while a peer may still write its slots */
}

/* ---- a CTA's chunk of a row staged in shared memory by bulk copies, in parts (sm_90) ----
 * fwd_bulk_kernel and fwd_hold_kernel: the chunk's `count` vectors, thread t's vectors
 * t + k * nt (k < kt), part p the rounds k in [p * kp, p * kp + kp) (vectors [lo(p), lo(p + 1))
 * of the chunk; a part with none is never issued or waited on). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
struct StagedChunk {
  int count, nt, kt, kp;
};
__device__ __forceinline__ StagedChunk staged_chunk(int count, int parts) {
  StagedChunk c;
  c.count = count;
  c.nt = (int)blockDim.x;
  c.kt = (count + c.nt - 1) / c.nt;
  c.kp = (c.kt + parts - 1) / parts;
  return c;
}
__device__ __forceinline__ int staged_lo(const StagedChunk &c, int p) {
  return min(c.count, p * c.kp * c.nt);
}
/* Part p of the chunk of row `row` (x_chunk: the chunk's start in row 0) into the stage, on
 * mbarrier full[p] (by one thread). */
template <typename T, int VEC>
__device__ __forceinline__ void staged_issue(const StagedChunk &c, Pack<T, VEC> *stage,
                                             unsigned long long *full, const T *x_chunk,
                                             int64_t x_stride, int p, int64_t row) {
  const int lo = staged_lo(c, p), hi = staged_lo(c, p + 1);
  if (lo < hi) {
    const uint32_t bytes = (uint32_t)(hi - lo) * (uint32_t)sizeof(Pack<T, VEC>);
    mbar_expect(&full[p], bytes);
    bulk_load(stage + lo, x_chunk + row * x_stride + (int64_t)lo * VEC, bytes, &full[p]);
  }
}
/* The thread's values of part p added into s4: their sum (LN) or their sum of squares. */
template <typename T, int VEC, bool LN>
__device__ __forceinline__ void staged_part_sums(const StagedChunk &c, const Pack<T, VEC> *stage,
                                                 int p, float (&s4)[4]) {
  const int kend = min(c.kt, (p + 1) * c.kp);
  for (int k = p * c.kp; k < kend; ++k) {
    const int i = (int)threadIdx.x + k * c.nt;
    if (i >= c.count)
      break;
    float f[VEC];
    unpack_f32<T, VEC>(stage[i], f);
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      s4[e & 3] = LN ? s4[e & 3] + f[e] : fmaf(f[e], f[e], s4[e & 3]);
  }
}
/* The thread's sum (LN) or sum of squares over the chunk's `parts` parts, each waited for on
 * full[p] at `phase` as it lands. */
template <typename T, int VEC, bool LN>
__device__ __forceinline__ float staged_sums(const StagedChunk &c, const Pack<T, VEC> *stage,
                                             unsigned long long *full, int parts, uint32_t phase) {
  float s4[4] = {0.f, 0.f, 0.f, 0.f};
  for (int p = 0; p < parts; ++p) {
    if (staged_lo(c, p) >= staged_lo(c, p + 1))
      break;
    mbar_wait(&full[p], phase);
    staged_part_sums<T, VEC, LN>(c, stage, p, s4);
  }
  return (s4[0] + s4[1]) + (s4[2] + s4[3]);
}
/* Once every thread is done with part p's y, the part takes row `next`'s copy (none past the
 * last row; `next < rows` is the same in every thread of the CTA). */
template <typename T, int VEC>
__device__ __forceinline__ void staged_refill(const StagedChunk &c, Pack<T, VEC> *stage,
                                              unsigned long long *full, const T *x_chunk,
                                              int64_t x_stride, int p, int64_t next, int64_t rows) {
  if (next >= rows)
    return;
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_proxy_async();
    staged_issue<T, VEC>(c, stage, full, x_chunk, x_stride, p, next);
  }
}
/* LayerNorm: the thread's values centred on base (their mean, a second pass over the stage):
 * their mean is base + rel, their squared deviations m2t. */
template <typename T, int VEC>
__device__ __forceinline__ void staged_centred(const StagedChunk &c, const Pack<T, VEC> *stage,
                                               float base, float inv_nt, float &rel, float &m2t) {
  float q1[4] = {0.f, 0.f, 0.f, 0.f}, q2[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = (int)threadIdx.x; i < c.count; i += c.nt) {
    float f[VEC];
    unpack_f32<T, VEC>(stage[i], f);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float d = f[e] - base;
      q1[e & 3] += d;
      q2[e & 3] = fmaf(d, d, q2[e & 3]);
    }
  }
  const float s1 = (q1[0] + q1[1]) + (q1[2] + q1[3]);
  rel = s1 * inv_nt;
  m2t = ((q2[0] + q2[1]) + (q2[2] + q2[3])) - s1 * rel;
}
/* y of part p from the stage, ((x - ref) - off) * rstd * gamma + beta, into yr (the chunk's
 * start in y; v0 its first vector in the row), BATCH vectors' gamma and beta loaded before their
 * stores. */
template <typename T, typename P, int VEC, int BATCH>
__device__ __forceinline__ void staged_write_part(const StagedChunk &c, const Pack<T, VEC> *stage,
                                                  const P *gamma, const P *beta, T *yr, int64_t v0,
                                                  int p, float ref, float off, float rstd) {
  const int kend = min(c.kt, (p + 1) * c.kp);
  for (int k = p * c.kp; k < kend; k += BATCH) {
    float g[BATCH][VEC], b[BATCH][VEC];
#pragma unroll
    for (int u = 0; u < BATCH; ++u) {
      const int i = (int)threadIdx.x + (k + u) * c.nt;
      if (k + u < kend && i < c.count) {
        load_param<P, VEC>(gamma, (v0 + i) * VEC, 1.f, g[u]);
        load_param<P, VEC>(beta, (v0 + i) * VEC, 0.f, b[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < BATCH; ++u) {
      const int i = (int)threadIdx.x + (k + u) * c.nt;
      if (k + u < kend && i < c.count) {
        float f[VEC], out[VEC];
        unpack_f32<T, VEC>(stage[i], f);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          out[e] = fmaf(((f[e] - ref) - off) * rstd, g[u][e], b[u][e]);
        store_vec<T, VEC>(yr + (int64_t)i * VEC, out);
      }
    }
  }
}
#endif

/* 16-bit rows past 2^16 vectors whose chunk fits in one CTA's shared memory (sm_90, plan_forward;
 * up to 16 x 225 KiB, 1.8 million elements): a cluster of CTAs per row, one CTA an SM by its
 * shared memory, persistent. Each CTA's chunk of x arrives by bulk copies, one per piece (whole
 * rounds of the CTA's vectors, `pieces` of them), is read from shared memory for the statistics
 * and again for y, and each piece is refilled with the CTA's chunk of its next row as soon as
 * its y is written: x is read from DRAM once, and the next row's reads overlap this row's
 * writes, where the staged kernel's cp.async copy of the whole chunk, its statistics and its
 * stores ran in turn. LayerNorm: each thread's values are centred on their own mean (two passes
 * over the stage), combined by Chan's update over the CTA and the cluster. */
template <typename T, typename P, int VEC, bool LN>
__global__ void __launch_bounds__(512, 1)
    fwd_bulk_kernel(FwdParams a, int64_t chunk_vecs, int pieces) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  typedef Pack<T, VEC> V;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ RingRed red;
  __shared__ unsigned long long full[kBulkMaxPieces];
  V *stage = reinterpret_cast<V *>(dyn_smem);
  int csize, crank;
  cluster_shape(csize, crank);
  const int64_t nvec = a.cols / VEC;
  const int64_t v0 = (int64_t)crank * chunk_vecs;
  const int count = (int)chunk_count(nvec, chunk_vecs, crank);
  const int nt = (int)blockDim.x;
  /* The thread's vectors: i = threadIdx.x + k * nt, k < kt; piece p: k in [p * kp, p * kp + kp). */
  const int kt = (count + nt - 1) / nt;
  const int kp = (kt + pieces - 1) / pieces;
  const int64_t cluster_id = blockIdx.x / csize, nclusters = gridDim.x / csize;
  bulk_barriers_init(full, pieces, red, csize);
  const T *xchunk = (const T *)a.x + v0 * VEC;
  const StagedChunk c = {count, nt, kt, kp};
  /* Vectors [lo, hi) of the chunk are piece p; a piece with none is never issued or waited on. */
  auto piece_lo = [&](int p) { return staged_lo(c, p); };
  if (threadIdx.x == 0 && cluster_id < a.rows)
    for (int p = 0; p < pieces; ++p)
      staged_issue<T, VEC>(c, stage, full, xchunk, a.x_stride, p, cluster_id);
  const int mine = count > (int)threadIdx.x ? (count - (int)threadIdx.x + nt - 1) / nt : 0;
  const LnCounts counts = ln_counts(mine * VEC, (int64_t)count * VEC);
  const float inv_n = count_rcp((float)a.cols);
  const P *gamma = (const P *)a.gamma;
  const P *beta = (const P *)a.beta;
  int round = 0, xround = 0;
  uint32_t phase = 0;
  for (int64_t row = cluster_id; row < a.rows; row += nclusters) {
    /* Statistics: the first pass waits for each piece in turn. (inline, not staged_sums: as that
     * call the compiler orders LayerNorm's second pass differently, not measured) */
    float s4[4] = {0.f, 0.f, 0.f, 0.f};
    for (int p = 0; p < pieces; ++p) {
      if (piece_lo(p) >= piece_lo(p + 1))
        break;
      mbar_wait(&full[p], phase);
      staged_part_sums<T, VEC, LN>(c, stage, p, s4);
    }
    const float s = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    /* LayerNorm: the thread's values centred on their own mean (a second pass over them). */
    float base = 0.f, rel = 0.f, m2t = 0.f;
    if constexpr (LN) {
      base = s * counts.inv_nt;
      staged_centred<T, VEC>(c, stage, base, counts.inv_nt, rel, m2t);
    }
    const ChunkNorm cn =
        chunk_norm<LN>(base, rel, m2t, s, counts, red, round, xround, csize, inv_n, a.eps);
    const float ref = cn.ref, off = cn.off, rstd = cn.rstd;
    if (crank == 0 && threadIdx.x == 0)
      store_row_stats(a, row, cn.mean, rstd);
    /* y, a piece at a time; each piece then takes the next row's copy. gamma and beta of four
     * vectors are loaded before their stores (with one CTA an SM, a load queued behind each
     * store would leave the SM waiting on L2 once a vector). */
    T *yr = (T *)a.y + row * a.y_stride + v0 * VEC;
    const int64_t next = row + nclusters;
    for (int p = 0; p < pieces; ++p) {
      if (piece_lo(p) >= piece_lo(p + 1))
        break;
      /* (inline, not staged_write_part<4>: as that call the compiler reordered this kernel and
       * bf16 LayerNorm rows ran 1.7-4.2 points slower, A/B run ED on an H100) */
      const int kend = min(kt, (p + 1) * kp);
      for (int k = p * kp; k < kend; k += 4) {
        float g[4][VEC], b[4][VEC];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int i = (int)threadIdx.x + (k + u) * nt;
          if (k + u < kend && i < count) {
            load_param<P, VEC>(gamma, (v0 + i) * VEC, 1.f, g[u]);
            load_param<P, VEC>(beta, (v0 + i) * VEC, 0.f, b[u]);
          }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int i = (int)threadIdx.x + (k + u) * nt;
          if (k + u < kend && i < count) {
            float f[VEC], out[VEC];
            unpack_f32<T, VEC>(stage[i], f);
#pragma unroll
            for (int e = 0; e < VEC; ++e)
              out[e] = fmaf(((f[e] - ref) - off) * rstd, g[u][e], b[u][e]);
            store_vec<T, VEC>(yr + (int64_t)i * VEC, out);
          }
        }
      }
      staged_refill<T, VEC>(c, stage, full, xchunk, a.x_stride, p, next, a.rows);
    }
    phase ^= 1u;
  }
  cluster_barrier(csize);
#else
  (void)a;
  (void)chunk_vecs;
  (void)pieces;
#endif
}

/* fp32 RMSNorm rows too long for a cluster to hold in registers (N > 262144; sm_90, not in
 * place; plan_forward; LayerNorm rows in tuning builds): each row held whole on chip, cut into
 * `pieces` chunks over the CTAs of one cooperative launch of the CTAs resident at once (two an SM,
 * hold_shape), `slots` rows at a time: CTA b takes chunk b % pieces of rows b / pieces, b / pieces
 * + slots, ... As in fwd_bulk_kernel, the chunk arrives in shared memory by bulk copies in `parts`,
 * is read there for the statistics and again for y, and each part is refilled with the CTA's chunk
 * of its next row as soon as its y is written: x is read from DRAM once, and the next row's reads
 * overlap this row's writes. The streaming kernel reads x twice (ncu11: 371-391 MB for 205.5 MB at
 * 64 x 802816); a cluster of 16 holds such a row only at one CTA an SM, 7 clusters at once (sweeps
 * 56-57); sweep 58 cut rows over the whole GPU with x read again from L2, a few vectors a
 * thread a row, and its per-row posts and waits cost more than the second read saved. Here a
 * CTA holds up to 111 KiB of a row, so the post and wait come once for that many bytes.
 *
 * The chunks' statistics meet through y, since the call has no workspace (as sweep 58's did).
 * LayerNorm (tuning builds): the first `pieces` 16-byte slots of every chunk of a row in y
 * receive each chunk's (ref, c, m2, n), and the next slot's first word counts them. A CTA writes
 * its slot into every chunk of the row, each followed by a release add to that chunk's count; the
 * chunk's own CTA waits (acquire) for all `pieces`, reads the slots and only then overwrites
 * them with y. RMSNorm: the first `pieces` 8-byte words of every chunk of a row receive each
 * chunk's sum of squares beside a set flag in one 64-bit store, and the chunk's CTA polls each
 * word until its flag is set, with no count to add to or wait on (A/B run EN: +0.2 to +1.1
 * points on fp32 802816-2^20). Each CTA clears its chunk's counts (words) for all its rows
 * before one grid-wide barrier (its first row's copies already in flight). Every CTA combines
 * the posts in piece order with the same code, so all chunks of a row get the same statistics,
 * whatever the timing. */
/* PER_SM: the CTAs an SM it is built for, of 2 * kHoldThreads / PER_SM threads (release builds
 * 2; tuning builds also 4, FNORM_TUNE_FWD_HOLD_SM). */
template <typename T, typename P, int VEC, bool LN, int PER_SM = 2>
__global__ void __launch_bounds__(2 * kHoldThreads / PER_SM, PER_SM)
    fwd_hold_kernel(FwdParams a, int64_t chunk_vecs, int pieces, int parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  typedef Pack<T, VEC> V;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ RingRed red;
  __shared__ unsigned long long full[kBulkMaxPieces];
  __shared__ float4 terms[2];
  V *stage = reinterpret_cast<V *>(dyn_smem);
  const int piece = (int)(blockIdx.x % (unsigned)pieces);
  const int64_t slot = blockIdx.x / (unsigned)pieces, nslots = gridDim.x / (unsigned)pieces;
  const int64_t nvec = a.cols / VEC;
  const int64_t v0 = (int64_t)piece * chunk_vecs;
  const int count = (int)chunk_count(nvec, chunk_vecs, piece);
  const StagedChunk c = staged_chunk(count, parts);
  bulk_barriers_init(full, parts, red, 1);
  const T *xchunk = (const T *)a.x + v0 * VEC;
  /* Chunk `at` of `row` in y as 16-byte slots, and the count of the posts it has received. */
  auto post_slots = [&](int64_t row, int at) {
    return reinterpret_cast<float4 *>((T *)a.y + row * a.y_stride + (int64_t)at * chunk_vecs * VEC);
  };
  auto post_count = [&](int64_t row, int at) {
    return reinterpret_cast<unsigned *>(post_slots(row, at) + pieces);
  };
  if (threadIdx.x == 0 && slot < a.rows)
    for (int p = 0; p < parts; ++p)
      staged_issue<T, VEC>(c, stage, full, xchunk, a.x_stride, p, slot);
  /* RMSNorm: the chunk's words (a flagged sum of squares for each chunk) cleared instead */
  auto post_words = [&](int64_t row, int at) {
    return reinterpret_cast<unsigned long long *>(post_slots(row, at));
  };
  if constexpr (LN) {
    for (int64_t row = slot + (int64_t)threadIdx.x * nslots; row < a.rows;
         row += (int64_t)c.nt * nslots)
      *post_count(row, piece) = 0u;
  } else {
    const int64_t mine_rows = slot < a.rows ? (a.rows - slot + nslots - 1) / nslots : 0;
    for (int64_t j = threadIdx.x; j < mine_rows * pieces; j += c.nt)
      post_words(slot + (j / pieces) * nslots, piece)[j % pieces] = 0ull;
  }
  cg::this_grid().sync(); /* every count (word) cleared before any post */
  const int mine = count > (int)threadIdx.x ? (count - (int)threadIdx.x + c.nt - 1) / c.nt : 0;
  const LnCounts counts = ln_counts(mine * VEC, (int64_t)count * VEC);
  const float inv_n = count_rcp((float)a.cols);
  int round = 0, term = 0;
  uint32_t phase = 0;
  for (int64_t row = slot; row < a.rows; row += nslots) {
    /* The chunk's statistics: the first pass waits for each part in turn. */
    const float s = staged_sums<T, VEC, LN>(c, stage, full, parts, phase);
    float4 post;
    if constexpr (LN) { /* the thread's values centred on their own mean, then the CTA's */
      const float base = s * counts.inv_nt;
      float rel, m2t;
      staged_centred<T, VEC>(c, stage, base, counts.inv_nt, rel, m2t);
      const ChunkStats cs = cta_ln_combine(base, rel, m2t, counts, red.warp, round);
      post = make_float4(cs.ref, cs.c, cs.m2, cs.n);
    } else {
      float v[1] = {s};
      cta_sum<1>(v, red, round);
      post = make_float4(v[0], 0.f, 0.f, 0.f);
    }
    /* Post the chunk's statistics to every chunk of the row (RMSNorm: as one 64-bit word, the
     * sum's bits beside a set flag, a single-copy-atomic store with no count). */
    for (int t = (int)threadIdx.x; t < pieces; t += c.nt) {
      if constexpr (LN) {
        __stcg(post_slots(row, t) + piece, post);
        post_count_add(post_count(row, t));
      } else {
        post_flagged(post_words(row, t) + piece, post.x);
      }
    }
    /* Warp 0 waits for the row's posts, combines them and hands the row's terms to the CTA. */
    if (threadIdx.x < 32) {
      const int lane = (int)threadIdx.x;
      if constexpr (LN)
        warp_wait_count(post_count(row, piece), (unsigned)pieces, lane);
      const float4 *slots = post_slots(row, piece);
      float4 res = make_float4(0.f, 0.f, 0.f, 0.f);
      if constexpr (LN) {
        /* Chan's combination of the chunks relative to chunk 0's reference, as
         * ln_cluster_stats combines a cluster's CTAs. */
        const float mref = __ldcg(&slots[0].x);
        float sc[1] = {0.f}, m2[1] = {0.f};
        for (int r = lane; r < pieces; r += 32) {
          const float4 q = __ldcg(slots + r);
          sc[0] += q.w * ((q.x - mref) + q.y);
        }
        group_sum<32, 1>(sc);
        const float cr = sc[0] * inv_n;
        for (int r = lane; r < pieces; r += 32) {
          const float4 q = __ldcg(slots + r);
          const float e = ((q.x - mref) + q.y) - cr;
          m2[0] += fmaf(q.w * e, e, q.z);
        }
        group_sum<32, 1>(m2);
        float var = m2[0] * inv_n;
        var = var < 0.f ? 0.f : var; /* not fmaxf: a NaN stays NaN */
        /* x normalizes as ((x - ref) - off) * rstd with this chunk's own ref */
        res = make_float4(post.x, cr - (post.x - mref), 1.f / sqrtf(var + a.eps), mref + cr);
      } else {
        /* each lane waits for its chunks' flagged words */
        float ss[1] = {0.f};
        const unsigned long long *words = post_words(row, piece);
        for (int r = lane; r < pieces; r += 32)
          ss[0] += wait_flagged(words + r);
        group_sum<32, 1>(ss);
        res.z = 1.f / sqrtf(ss[0] * inv_n + a.eps);
      }
      if (lane == 0)
        terms[term] = res;
    }
    __syncthreads(); /* the slots read before any y overwrites them */
    const float4 res = terms[term];
    term ^= 1; /* the barriers of the next row's sums separate this read from that slot's write */
    const float ref = res.x, off = res.y, rstd = res.z;
    if (piece == 0 && threadIdx.x == 0)
      store_row_stats(a, row, res.w, rstd);
    /* y, a part at a time; each part then takes the next row's copy. */
    T *yr = (T *)a.y + row * a.y_stride + v0 * VEC;
    const int64_t next = row + nslots;
    for (int p = 0; p < parts; ++p) {
      if (staged_lo(c, p) >= staged_lo(c, p + 1))
        break;
      staged_write_part<T, P, VEC, 2>(c, stage, (const P *)a.gamma, (const P *)a.beta, yr, v0, p,
                                      ref, off, rstd);
      staged_refill<T, VEC>(c, stage, full, xchunk, a.x_stride, p, next, a.rows);
    }
    phase ^= 1u;
  }
#else
  (void)a;
  (void)chunk_vecs;
  (void)pieces;
  (void)parts;
#endif
}

/* Launches fwd_hold_kernel: the rows cut again (hold_shape) by the CTAs the device holds at
 * once at the plan's shared memory, as one cooperative launch (every CTA resident, which the
 * grid-wide barrier and the waits for other chunks' posts need). */
template <typename T, typename P, int VEC>
static fnorm_status launch_hold(const Plan &plan, const FwdParams &a, cudaStream_t stream) {
  void (*k)(FwdParams, int64_t, int, int) = nullptr;
  if (plan.threads == kHoldThreads && !a.layernorm)
    k = fwd_hold_kernel<T, P, VEC, false>;
  if constexpr (kTuningBuild) { /* LayerNorm rows (FNORM_TUNE_FWD_HOLD=2), four CTAs an SM */
    if (plan.threads == kHoldThreads && a.layernorm)
      k = fwd_hold_kernel<T, P, VEC, true>;
    if (plan.threads == kHoldThreads / 2)
      k = a.layernorm ? fwd_hold_kernel<T, P, VEC, true, 4> : fwd_hold_kernel<T, P, VEC, false, 4>;
  }
  if (!k)
    return FNORM_ERR_UNSUPPORTED;
  int64_t ctas = 0;
  const fnorm_status st = resident_ctas(k, plan.threads, plan.smem, INT32_MAX, &ctas);
  if (st != FNORM_SUCCESS)
    return st;
  HoldShape hs;
  if (!hold_shape(a.cols / VEC, a.rows, ctas, (int64_t)(plan.smem / 16), &hs))
    return FNORM_ERR_UNSUPPORTED;
  return launch_cooperative(k, (int64_t)hs.pieces * hs.slots, plan.threads, (size_t)hs.chunk * 16,
                            stream, a, hs.chunk, hs.pieces, plan.nbuf);
}

/* ---- rows spread over every SM (MODE_SPREAD, sm_90; plan_spread) ----
 * Few rows too long for a cluster to hold (fp32 64 x 802816: 3.2 MB a row), where the hold
 * kernel pays a meeting of its chunks each row with nothing else in flight (67-68% of the copy,
 * RMSNorm) and the streaming kernel reads x twice (56%, LayerNorm). Here each of `gridDim.x`
 * CTAs (one an SM, one cooperative launch) owns the same `chunk` vectors of every row, so gamma
 * and beta stay in its registers for the launch, and it takes every row in turn:
 *   - row i's chunk is copied into shared memory `stages` rows ahead by cp.async (each thread
 *     its own vectors, which only it reads back: no barrier guards a stage);
 *   - its statistics (RMSNorm: the sum of squares; LayerNorm: the chunk's mean as an offset
 *     from the row's first value, which every CTA copies beside its chunk, and the sum of squared
 *     deviations from that mean, each thread centred on its own mean and combined by Chan's
 *     update) go, as one 64-bit word (single-copy atomic: a reader that sees its flag bits sees
 *     its value), to slot `g` of every CTA's posting area for the row: the first gridDim.x words
 *     of that CTA's chunk of the row in y, which it overwrites with y once it has read them;
 *   - y of row i - `defer` is written: its words were posted `defer` rows ago, so the wait
 *     for the other CTAs overlaps this CTA's next rows (the loads of stages - defer - 1 rows
 *     are in flight meanwhile).
 * One barrier a row. The last warp holds no data: after the barrier it merges the data warps'
 * terms of row i and posts them, then reads the words of the row the next iteration writes
 * (loaded an iteration earlier) and combines them, so that neither the posts' latency nor the
 * merges stand between the data warps' first pass and their y pass (with the combination in a
 * data warp before the barrier, A/B run GM measured a fixed cost of about 1.3 us a row). Planned
 * on fp32 LayerNorm rows alone (plan_forward: A/B run GO, H200, 64 x 802816 55.5% -> 70.7% of
 * the copy); its RMSNorm form ran at 50-51% there against the hold kernel's 67-70%, which no
 * change measured so far explains (the pause in the poll, run GO, did not move it), and its
 * 16-bit forms lost or were level.
 * The words are cleared by their owner before one grid-wide barrier (the first rows' copies
 * already in flight). Every CTA combines the words of a row in the same fixed order (lane l
 * adds words l, l + 32, ..., then a butterfly), so every chunk of the row gets the same
 * statistics, whatever the timing. Sweep 58 had cut rows over the whole GPU with x read again
 * from L2 for y and gamma re-read every row, and lost to the streaming kernel; here x is read
 * once and held on chip, and gamma and beta never re-read. Not in place (the posts go into y). */
template <typename T, typename P, int VEC, int VPT, bool LN>
__global__ void __launch_bounds__(kSpreadMaxThreads + 32, 1)
    fwd_spread_kernel(FwdParams a, int chunk, int stages, int defer) {
  typedef Pack<T, VEC> V;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ float warp_terms[2][32][4];
  __shared__ float2 row_terms[2]; /* (mean offset from the row's reference, rstd) */
  __shared__ float row_ref[8];    /* LayerNorm: row i's reference (its first value) at [i & 7] */
  V *const stage = reinterpret_cast<V *>(dyn_smem);    /* [stages][chunk] */
  V *const ref_slot = stage + (int64_t)stages * chunk; /* [stages]: each row's first vector */
  const int t = (int)threadIdx.x, lane = t & 31, warp = t >> 5;
  const int dt = (int)blockDim.x - 32, ndw = dt >> 5; /* data threads; the last warp controls */
  const bool control = t >= dt;
  const int ncta = (int)gridDim.x, g = (int)blockIdx.x;
  const int64_t nvec = a.cols / VEC, v0 = (int64_t)g * chunk;
  const int count = (int)(nvec - v0 < chunk ? nvec - v0 : chunk);
  const int lookahead = stages - defer - 1; /* rows in flight beyond the one being read */
  const T *x = (const T *)a.x;
  T *y = (T *)a.y;
  /* CTA h's posting area of row `row` (its chunk's first words in y) */
  auto area = [&](int64_t row, int h) {
    return reinterpret_cast<unsigned long long *>(y + row * a.y_stride + (int64_t)h * chunk * VEC);
  };
  bool mine[VPT];
  int nmine = 0;
  float gp[VPT][VEC], bp[VPT][VEC];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int i = t + k * dt;
    mine[k] = !control && i < count;
    nmine += mine[k] ? 1 : 0;
    load_param<P, VEC>(mine[k] ? (const P *)a.gamma : nullptr, (v0 + (mine[k] ? i : 0)) * VEC, 1.f,
                       gp[k]);
    load_param<P, VEC>(mine[k] ? (const P *)a.beta : nullptr, (v0 + (mine[k] ? i : 0)) * VEC, 0.f,
                       bp[k]);
  }
  auto issue = [&](int64_t row) {
    if (row < a.rows) {
      V *s = stage + (int)(row % stages) * chunk;
      const T *xr = x + row * a.x_stride + v0 * VEC;
#pragma unroll
      for (int k = 0; k < VPT; ++k)
        if (mine[k])
          cp_async_16(s + t + k * dt, xr + (int64_t)(t + k * dt) * VEC);
      if (LN && t == 0)
        cp_async_16(ref_slot + row % stages, x + row * a.x_stride);
    }
    cp_async_commit(); /* (empty past the last row: one group an iteration) */
  };
  if (!control)
    for (int r = 0; r <= lookahead; ++r)
      issue(r);
  for (int64_t j = t; j < a.rows * ncta; j += (int64_t)blockDim.x)
    area(j / ncta, g)[j % ncta] = 0ull;
  cg::this_grid().sync(); /* every posting word cleared before any post */
  const LnCounts counts = ln_counts(nmine * VEC, (int64_t)count * VEC);
  const float inv_n = count_rcp((float)a.cols);
  /* the control warp's words of the row it combines next (0: not yet read) */
  unsigned long long w[kSpreadMaxWords];
#pragma unroll
  for (int k = 0; k < kSpreadMaxWords; ++k)
    w[k] = 0ull;
  auto load_words = [&](int64_t row) {
#pragma unroll
    for (int k = 0; k < kSpreadMaxWords; ++k)
      if (lane + 32 * k < ncta)
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];"
                     : "=l"(w[k])
                     : "l"(area(row, g) + lane + 32 * k)
                     : "memory");
  };
  if (control && defer == 1)
    load_words(0);
  for (int64_t i = 0; i < a.rows + defer; ++i) {
    const int par = (int)(i & 1);
    const int64_t prow = i - defer; /* the row whose y this iteration writes */
    if (!control && i < a.rows) {
      cp_async_wait_upto(lookahead); /* row i's group has landed */
      const V *s = stage + (int)(i % stages) * chunk;
      V raw[VPT];
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (mine[k]) {
          raw[k] = s[t + k * dt];
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            raw[k].v[e] = from_f32<T>(0.f);
        }
      }
      if constexpr (LN) {
        /* (vectors stride by the data threads: blockDim.x counts the control warp too) */
        float mt, rel, m2t;
        held_moments<T, VEC, VPT, false>(raw, count, counts.nt, counts.inv_nt, mt, rel, m2t, dt);
        warp_ln_post(mt, rel, m2t, counts, warp_terms[par][warp]);
      } else {
        float p0 = 0.f, p1 = 0.f;
#pragma unroll
        for (int k = 0; k < VPT; ++k)
          add_squares<T, VEC>(raw[k], p0, p1);
        float ss[1] = {p0 + p1};
        group_sum<32, 1>(ss);
        if (lane == 0)
          warp_terms[par][warp][0] = ss[0];
      }
    }
    __syncthreads();
    if (control) {
      if (i < a.rows) {
        /* The data warps' terms of row i (warp r's in lane r), posted to every CTA's area of
         * the row. */
        unsigned long long word;
        if constexpr (LN) {
          const ChunkStats cs = cta_ln_merge_warps(warp_terms[par], counts, ndw);
          const float ref = pack_f32<T, VEC>(ref_slot[i % stages], 0);
          if (lane == 0)
            row_ref[i & 7] = ref;
          const float d = (cs.ref - ref) + cs.c;
          const float m2c = cs.m2 < 0.f ? 0.f : cs.m2; /* (rounding; the sign bit is the flag) */
          word =
              ((unsigned long long)(__float_as_uint(m2c) | 0x80000000u) << 32) | __float_as_uint(d);
        } else {
          float ss[1] = {lane < ndw ? warp_terms[par][lane][0] : 0.f};
          group_sum<32, 1>(ss);
          word = (1ull << 32) | __float_as_uint(ss[0]);
        }
        for (int h = lane; h < ncta; h += 32)
          asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(area(i, h) + g), "l"(word)
                       : "memory");
      }
      /* The statistics of the row the next iteration writes, from its words: each lane waits
       * for its words' flags (mostly loaded an iteration ago), then the fixed-order sums. */
      const int64_t nrow = prow + 1;
      if (nrow >= 0 && nrow < a.rows) {
#pragma unroll
        for (int k = 0; k < kSpreadMaxWords; ++k)
          if (lane + 32 * k < ncta)
            while (!(w[k] >> 32)) {
              /* (a pause between reads: every CTA's control warp polling at once slowed the
               * posts they wait for, A/B runs GM-GN) */
              __nanosleep(128);
              asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];"
                           : "=l"(w[k])
                           : "l"(area(nrow, g) + lane + 32 * k)
                           : "memory");
            }
        float2 res;
        if constexpr (LN) {
          /* word: the chunk's mean as an offset from the row's reference (low half), its sum
           * of squared deviations with the sign bit set as the flag (high half) */
          auto values_of = [&](int h) { /* CTA h's values a row */
                                        const int64_t left = nvec - (int64_t)h * chunk;
                                        return (float)((left < chunk ? left : chunk) * VEC);
          };
          float sc[1] = {0.f};
#pragma unroll
          for (int k = 0; k < kSpreadMaxWords; ++k)
            if (lane + 32 * k < ncta)
              sc[0] = fmaf(values_of(lane + 32 * k), __uint_as_float((unsigned)w[k]), sc[0]);
          group_sum<32, 1>(sc);
          const float cr = sc[0] * inv_n;
          float m2[1] = {0.f};
#pragma unroll
          for (int k = 0; k < kSpreadMaxWords; ++k)
            if (lane + 32 * k < ncta) {
              const float e = __uint_as_float((unsigned)w[k]) - cr;
              m2[0] += fmaf(values_of(lane + 32 * k) * e, e,
                            __uint_as_float((unsigned)(w[k] >> 32) & 0x7fffffffu));
            }
          group_sum<32, 1>(m2);
          float var = m2[0] * inv_n;
          var = var < 0.f ? 0.f : var; /* not fmaxf: a NaN stays NaN */
          res = make_float2(cr, 1.f / sqrtf(var + a.eps));
        } else {
          float ss[1] = {0.f};
#pragma unroll
          for (int k = 0; k < kSpreadMaxWords; ++k)
            if (lane + 32 * k < ncta)
              ss[0] += __uint_as_float((unsigned)w[k]);
          group_sum<32, 1>(ss);
          res = make_float2(0.f, 1.f / sqrtf(ss[0] * inv_n + a.eps));
        }
        if (lane == 0)
          row_terms[par ^ 1] = res;
      }
      /* the words of the row after it, read now so that they are in hand next iteration */
      if (nrow + 1 >= 0 && nrow + 1 < a.rows)
        load_words(nrow + 1);
    } else {
      if (prow >= 0) {
        /* y of prow (its statistics combined by the control warp before the barrier: y may
         * overwrite the words) */
        const float2 rt = row_terms[par];
        const float ref = LN ? row_ref[prow & 7] : 0.f, off = rt.x, rstd = rt.y;
        if (g == 0 && t == 0)
          store_row_stats(a, prow, LN ? ref + off : 0.f, rstd);
        const V *s = stage + (int)(prow % stages) * chunk;
        T *yr = y + prow * a.y_stride + v0 * VEC;
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          if (mine[k]) {
            const V pk = s[t + k * dt];
            float out[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              const float xv = pack_f32<T, VEC>(pk, e);
              const float xhat = LN ? ((xv - ref) - off) * rstd : xv * rstd;
              out[e] = fmaf(xhat, gp[k][e], bp[k][e]);
            }
            store_vec<T, VEC>(yr + (int64_t)(t + k * dt) * VEC, out);
          }
        }
      }
      issue(prow + stages); /* into prow's stage, which this thread has read */
    }
  }
  cp_async_wait_n<0>(); /* (only empty groups can be pending) */
}

/* Launches fwd_spread_kernel: one cooperative launch of plan.grid CTAs, one an SM, each a chunk of
 * plan.chunk vectors of every row (plan_spread), plan.nbuf stages, y written plan.variant rows
 * behind the statistics. */
template <typename T, typename P, int VEC>
static fnorm_status launch_spread(const Plan &plan, const FwdParams &a, cudaStream_t stream) {
  constexpr int VPT = fwd_spread_vpt(VEC);
  void (*k)(FwdParams, int, int, int) = a.layernorm ? fwd_spread_kernel<T, P, VEC, VPT, true>
                                                    : fwd_spread_kernel<T, P, VEC, VPT, false>;
  if (plan.vpt != VPT || plan.grid > 32 * kSpreadMaxWords ||
      (int64_t)(plan.threads - 32) * VPT < plan.chunk)
    return FNORM_ERR_UNSUPPORTED;
  int64_t ctas = 0;
  const fnorm_status st = resident_ctas(k, plan.threads, plan.smem, INT32_MAX, &ctas);
  if (st != FNORM_SUCCESS)
    return st;
  if (ctas < plan.grid)
    return FNORM_ERR_UNSUPPORTED; /* (the dispatch then plans without it) */
  return launch_cooperative(k, plan.grid, plan.threads, plan.smem, stream, a, (int)plan.chunk,
                            plan.nbuf, plan.variant);
}

/* fwd_reg_kernel's form for the plan (nullptr if none), at VPT vectors a thread in CTAs of up
 * to MAXT threads. LayerNorm rows: the LayerNorm-only form; RMSNorm rows: the run-time form.
 * full: every CTA's chunk exactly its threads' vectors. The FULL forms, on LayerNorm rows and
 * 16-bit RMSNorm rows: A/B runs AH2-AH3 (H200, 2^27 elements, builds alternated), LayerNorm
 * 16-bit N = 24576-262144 +6 to +18%, fp32 +4 to +38% (262144: 63% -> 87% of the copy), 64 rows
 * of 65536-262144 +8 to +16%; 16-bit RMSNorm +1 to +13% (bf16 32768 -1.1%); fp32 RMSNorm lost
 * 18-29% at N = 40960-262144 (the stall of the RMSNorm-only form above), so it keeps the form
 * with tests. */
template <typename T, typename P, int VEC, int VPT, int MAXT>
static void (*fwd_reg_pick(const Plan &plan, const FwdParams &a))(FwdParams, int64_t) {
  const bool full = VEC * sizeof(T) == 16 && plan.chunk == (int64_t)plan.threads * VPT &&
                    a.cols == plan.chunk * plan.cluster * VEC;
  void (*k)(FwdParams, int64_t) = a.layernorm
                                      ? fwd_reg_kernel<T, P, VEC, VPT, true, false, false, MAXT>
                                      : fwd_reg_kernel<T, P, VEC, VPT, false, false, false, MAXT>;
  if constexpr (VEC * sizeof(T) == 16) {
    if (full && a.layernorm)
      k = fwd_reg_kernel<T, P, VEC, VPT, true, false, true, MAXT>;
    if constexpr (sizeof(T) == 2)
      if (full && !a.layernorm)
        k = fwd_reg_kernel<T, P, VEC, VPT, false, false, true, MAXT>;
  }
  /* ONEBAR: planned on fp32 LayerNorm rows (tuning builds: on all LayerNorm rows). */
  if (plan.variant) {
    k = nullptr;
    if constexpr (sizeof(T) == 4 || kTuningBuild)
      if (a.layernorm) {
        k = fwd_reg_kernel<T, P, VEC, VPT, true, true, false, MAXT>;
        if constexpr (VEC * sizeof(T) == 16)
          if (full)
            k = fwd_reg_kernel<T, P, VEC, VPT, true, true, true, MAXT>;
      }
  }
  return k;
}

/* The warp tier's kernel for `group` lanes a row and VPT vectors a lane (nullptr if none); PSM:
 * the experimental form with gamma/beta in shared memory (tuning builds only); FULL: rows of
 * exactly group * VPT vectors. */
template <typename T, typename P, int VEC, int VPT, bool STAGED, bool PSM = false,
          bool FULL = false>
static void (*fwd_warp_group(int group))(FwdParams) {
  switch (group) {
  case 32:
    return fwd_warp_kernel<T, P, VEC, 32, VPT, STAGED, PSM, FULL>;
  case 16:
    return fwd_warp_kernel<T, P, VEC, 16, VPT, STAGED, PSM, FULL>;
  case 8:
    return fwd_warp_kernel<T, P, VEC, 8, VPT, STAGED, PSM, FULL>;
  case 4:
    return fwd_warp_kernel<T, P, VEC, 4, VPT, STAGED, PSM, FULL>;
  default:
    return nullptr;
  }
}

/* The warp tier's kernel for the plan's lanes a row and vectors a lane (nullptr if none). */
template <typename T, typename P, int VEC, bool STAGED, bool PSM = false, bool FULL = false>
static void (*fwd_warp_pick(const Plan &plan))(FwdParams) {
  if (plan.vpt == 8 && plan.group == 32) {
    if constexpr (!STAGED) /* plan_forward stages up to 4 vectors a lane */
      return fwd_warp_kernel<T, P, VEC, 32, 8, false, PSM, FULL>;
    return nullptr;
  }
  if (plan.vpt == 4)
    return fwd_warp_group<T, P, VEC, 4, STAGED, PSM, FULL>(plan.group);
  if constexpr (VEC > 1) {
    if (plan.vpt == 3)
      return fwd_warp_group<T, P, VEC, 3, STAGED, PSM, FULL>(plan.group);
  }
  return nullptr;
}

/* The same with FULL chosen by the row: 16-byte rows of exactly the plan's lanes times vectors
 * take the form without column tests. */
template <typename T, typename P, int VEC, bool STAGED, bool PSM = false>
static void (*fwd_warp_pick_full(const Plan &plan, int64_t cols))(FwdParams) {
  if constexpr (VEC * sizeof(T) == 16)
    if (cols == (int64_t)plan.group * plan.vpt * VEC)
      return fwd_warp_pick<T, P, VEC, STAGED, PSM, true>(plan);
  return fwd_warp_pick<T, P, VEC, STAGED, PSM>(plan);
}

/* fwd_cta_reread_kernel at a register budget the plan names (nullptr if none). */
template <typename T, typename P, int VEC, int VPT, bool LN, bool FULL = false>
static void (*fwd_cta_reread_pick(int regs))(FwdParams) {
  if (regs == 40)
    return fwd_cta_reread_kernel<T, P, VEC, VPT, LN, 40, FULL>;
  if (regs == 48)
    return fwd_cta_reread_kernel<T, P, VEC, VPT, LN, 48, FULL>;
  if constexpr (kTuningBuild) {
    if (regs == 32)
      return fwd_cta_reread_kernel<T, P, VEC, VPT, LN, 32, FULL>;
    if (regs == 64)
      return fwd_cta_reread_kernel<T, P, VEC, VPT, LN, 64, FULL>;
  }
  return nullptr;
}

/* The CTA-per-row kernel for the norm; reread: 0, or the register budget of the form that reads
 * x again for y. Release builds have the reread forms plan_forward asks for (fp32 RMSNorm, 16
 * elements a thread), tuning builds all (nullptr if none). */
template <typename T, typename P, int VEC, int VPT>
static void (*fwd_cta_pick(bool ln, int reread, bool full))(FwdParams) {
  /* FULL on LayerNorm rows: A/B run AH1 (H200, 2^27 elements): 16-bit N = 5120-32768 +1.1 to
   * +8.4%, fp32 8192 and 32768 +1.1 and +4.2%; RMSNorm was level (-1 to +0.7%), so it keeps the
   * one form. */
  if (!reread && full && ln)
    return fwd_cta_kernel<T, P, VEC, VPT, true, true>;
  if (!reread)
    return ln ? fwd_cta_kernel<T, P, VEC, VPT, true> : fwd_cta_kernel<T, P, VEC, VPT, false>;
  if constexpr (kTuningBuild) /* (full LayerNorm rows: the same form as release builds) */
    return ln ? (full ? fwd_cta_reread_pick<T, P, VEC, VPT, true, true>(reread)
                      : fwd_cta_reread_pick<T, P, VEC, VPT, true>(reread))
              : fwd_cta_reread_pick<T, P, VEC, VPT, false>(reread);
  /* fp32 LayerNorm rows are planned for it only when full (the FULL form); RMSNorm rows keep
   * the form with tests (A/B run AH5: its FULL form lost 9-11% at N = 5120-8192). */
  if constexpr (sizeof(T) == 4 && VPT == 2 * kCtaMinVpt<T>) {
    if (ln)
      return full ? fwd_cta_reread_pick<T, P, VEC, VPT, true, true>(reread) : nullptr;
    return fwd_cta_reread_pick<T, P, VEC, VPT, false>(reread);
  }
  return nullptr;
}

/* fwd_rows_kernel at VPL vectors a lane, R rows a CTA (a half-warp's rows at LANES 16):
 * release builds have the planned shapes (rows_form_shape, fwd_rows_per_cta), tuning builds
 * also VPL 1, 2, 3, 4, 6, 8 at 32 lanes and 2-4 at 16, R 1, 2, 4 and 8 (nullptr if none). */
template <typename T, int VEC, int VPL, int LANES> constexpr bool rows_form_planned() {
  int lanes = 0, vpl = 0;
  rows_form_shape(LANES * VPL, VEC, (int)sizeof(T), lanes, vpl);
  return lanes == LANES && vpl == VPL;
}
template <typename T, typename P, int VEC, int VPL, int R, int LANES, bool LN>
static void (*fwd_rows_one())(FwdParams) {
  if constexpr ((kTuningBuild && (LANES == 32 || (LANES == 16 && VPL >= 2 && VPL <= 4) ||
                                  (LANES == 8 && (VPL == 4 || VPL == 8)))) ||
                (rows_form_planned<T, VEC, VPL, LANES>() && R == fwd_rows_per_cta(!LN, LANES, VPL)))
    return fwd_rows_kernel<T, P, VEC, VPL, R, LANES, LN>;
  return nullptr;
}
template <typename T, typename P, int VEC, int VPL, int LANES, bool LN>
static void (*fwd_rows_pick_r(int r))(FwdParams) {
  switch (r) {
  case 1:
    return fwd_rows_one<T, P, VEC, VPL, 1, LANES, LN>();
  case 2:
    return fwd_rows_one<T, P, VEC, VPL, 2, LANES, LN>();
  case 4:
    return fwd_rows_one<T, P, VEC, VPL, 4, LANES, LN>();
  case 8:
    return fwd_rows_one<T, P, VEC, VPL, 8, LANES, LN>();
  default:
    return nullptr;
  }
}
template <typename T, typename P, int VEC, int LANES, bool LN>
static void (*fwd_rows_pick_vpl(int vpl, int r))(FwdParams) {
  switch (vpl) {
  case 1:
    return fwd_rows_pick_r<T, P, VEC, 1, LANES, LN>(r);
  case 2:
    return fwd_rows_pick_r<T, P, VEC, 2, LANES, LN>(r);
  case 4:
    return fwd_rows_pick_r<T, P, VEC, 4, LANES, LN>(r);
  case 3:
    return fwd_rows_pick_r<T, P, VEC, 3, LANES, LN>(r);
  case 6:
    return fwd_rows_pick_r<T, P, VEC, 6, LANES, LN>(r);
  case 8:
    return fwd_rows_pick_r<T, P, VEC, 8, LANES, LN>(r);
  default:
    return nullptr;
  }
}
template <typename T, typename P, int VEC>
static void (*fwd_rows_pick(bool ln, int lanes, int vpl, int r))(FwdParams) {
  if (lanes == 32)
    return ln ? fwd_rows_pick_vpl<T, P, VEC, 32, true>(vpl, r)
              : fwd_rows_pick_vpl<T, P, VEC, 32, false>(vpl, r);
  if (lanes == 16)
    return ln ? fwd_rows_pick_vpl<T, P, VEC, 16, true>(vpl, r)
              : fwd_rows_pick_vpl<T, P, VEC, 16, false>(vpl, r);
  if constexpr (kTuningBuild)
    if (lanes == 8)
      return ln ? fwd_rows_pick_vpl<T, P, VEC, 8, true>(vpl, r)
                : fwd_rows_pick_vpl<T, P, VEC, 8, false>(vpl, r);
  return nullptr;
}

/* fwd_lean_kernel's FULL form; with gb (gamma and beta given) on bf16 LayerNorm rows, and on fp16
 * LayerNorm rows over a cluster, the form that knows it at compile time (GB): its y pass neither
 * tests the pointers nor fills defaults (95 -> 65 instructions a vector at 65536 over a cluster).
 * Only there: A/B run CA (H200) gave bf16 LayerNorm 65536 and 262144 +1.3 and +2.0 points, but
 * fp16 LayerNorm 40960-262144 -0.8..-1.5 and 16-bit RMSNorm 32768 -2.3. The clustered GB form
 * spilled 8 bytes then (the y pass's gamma and beta address, gone since A/B run DF); without the
 * spill A/B run DH (H200, 2^25-2^27 elements) gave fp16 LayerNorm 65536 +2.0 to +2.4 points and
 * 262144 +2.7 to +3.0 over the cluster. fp16 rows in one CTA keep the form that tests. */
template <typename T, typename P, int VEC, int VPT, bool LN, bool CL>
static void (*fwd_lean_full(bool gb))(FwdParams) {
  if constexpr (LN && std::is_same<T, P>::value &&
                (std::is_same<T, __nv_bfloat16>::value || (CL && std::is_same<T, __half>::value)))
    if (gb)
      return fwd_lean_kernel<T, P, VEC, VPT, LN, 2, true, CL, true>;
  return fwd_lean_kernel<T, P, VEC, VPT, LN, 2, true, CL>;
}

/* fwd_lean_kernel for the norm and whether the row is full (nullptr if none: LayerNorm holds
 * at most 4 vectors a thread); gb as fwd_lean_full. */
template <typename T, typename P, int VEC, int VPT>
static void (*fwd_lean_pick(bool ln, bool full, bool cl, bool gb))(FwdParams) {
  if (cl) {
    /* The clustered form, planned on 16-bit rows at 32 elements a thread (RMSNorm: with 16-bit
     * gamma); tuning builds also have fp32 rows (LayerNorm at 16). LayerNorm rows take its FULL
     * form (plan_forward). */
    if constexpr ((VPT * VEC == 32 && (kTuningBuild || sizeof(T) == 2)) ||
                  (kTuningBuild && VPT * VEC == 16 && VPT <= 4)) {
      if (!ln) {
        if constexpr (kTuningBuild || sizeof(P) == 2)
          return full ? fwd_lean_full<T, P, VEC, VPT, false, true>(gb)
                      : fwd_lean_kernel<T, P, VEC, VPT, false, 2, false, true>;
        return nullptr;
      }
      if constexpr (VPT <= 4)
        if (full)
          return fwd_lean_full<T, P, VEC, VPT, true, true>(gb);
    }
    return nullptr;
  }
  if (!ln)
    return full ? fwd_lean_full<T, P, VEC, VPT, false, false>(gb)
                : fwd_lean_kernel<T, P, VEC, VPT, false, 2>;
  /* LayerNorm: planned on 16-bit rows with 16-bit gamma, and where four vectors a thread fill
   * the row exactly (FULL) on 16-bit rows with fp32 gamma and on fp32 rows (tuning builds: all) */
  if constexpr (VPT <= 4 && (kTuningBuild || (sizeof(T) == 2 && sizeof(P) == 2)))
    return full ? fwd_lean_full<T, P, VEC, VPT, true, false>(gb)
                : fwd_lean_kernel<T, P, VEC, VPT, true, 2>;
  if constexpr (VPT == 4 && sizeof(P) == 4)
    if (full)
      return fwd_lean_full<T, P, VEC, VPT, true, false>(gb);
  return nullptr;
}

/* The streaming kernel at the plan's CTAs an SM (min_blocks): release builds have the library's
 * 4 (at most 32 registers), tuning builds also 1 (the kernel's own count, 46-96) and 2 (nullptr
 * if none). */
template <typename T, typename P, int VEC, bool LN>
static void (*fwd_stream_minb(int min_blocks))(FwdParams, int64_t, int) {
  if (min_blocks == 4)
    return fwd_stream_kernel<T, P, VEC, LN, 4>;
  if constexpr (kTuningBuild) {
    if (min_blocks == 1)
      return fwd_stream_kernel<T, P, VEC, LN, 1>;
    if (min_blocks == 2)
      return fwd_stream_kernel<T, P, VEC, LN, 2>;
  }
  return nullptr;
}
template <typename T, typename P, int VEC>
static void (*fwd_stream_pick(bool ln, const Plan &plan))(FwdParams, int64_t, int) {
  return ln ? fwd_stream_minb<T, P, VEC, true>(plan.min_blocks)
            : fwd_stream_minb<T, P, VEC, false>(plan.min_blocks);
}

/* fwd_rows_packed_kernel for the gamma and beta given: each presence known at compile time
 * (tested in the loop instead, the compiler hoisted and unswitched the loop's loads and
 * conversions, and bf16 LayerNorm 4096 ran 92.5% of the copy against 95.6%; session 29). */
template <typename T, int VPL, int WPR, bool LN, bool CL = false>
static void (*fwd_rows_packed_gb(const FwdParams &a))(FwdParams) {
  return a.gamma ? (a.beta ? fwd_rows_packed_kernel<T, VPL, WPR, LN, true, true, CL>
                           : fwd_rows_packed_kernel<T, VPL, WPR, LN, true, false, CL>)
                 : (a.beta ? fwd_rows_packed_kernel<T, VPL, WPR, LN, false, true, CL>
                           : fwd_rows_packed_kernel<T, VPL, WPR, LN, false, false, CL>);
}
/* ... for the shapes plan_forward takes to it (packed_rows_shape); nullptr for any other */
template <typename T>
static void (*fwd_rows_packed_pick(const Plan &plan, const FwdParams &a))(FwdParams) {
  const int wpr = plan.threads / 32;
  if constexpr (sizeof(T) == 4) {
    if (plan.cluster > 1)
      return nullptr;
    if (a.layernorm && plan.vpt == 8 && wpr == 5)
      return fwd_rows_packed_gb<T, 8, 5, true>(a);
    if (a.layernorm && plan.vpt == 8 && wpr == 8)
      return fwd_rows_packed_gb<T, 8, 8, true>(a);
    return nullptr;
  } else {
    if (plan.cluster > 1) {
      /* sm_90: RMSNorm rows in chunks of 32768 elements over 8 warps (kFwdPackedCl); tuning
       * builds also chunks of 16384 and LayerNorm rows (sweeps 76-77: not planned) */
      if (wpr == 8 && plan.vpt == 16 && !a.layernorm)
        return fwd_rows_packed_gb<T, 16, 8, false, true>(a);
      if constexpr (kTuningBuild) {
        if (wpr == 8 && plan.vpt == 8)
          return a.layernorm ? fwd_rows_packed_gb<T, 8, 8, true, true>(a)
                             : fwd_rows_packed_gb<T, 8, 8, false, true>(a);
        if (wpr == 8 && plan.vpt == 16)
          return fwd_rows_packed_gb<T, 16, 8, true, true>(a);
      }
      return nullptr;
    }
    if (a.layernorm) {
      if (plan.vpt == 16 && wpr == 1)
        return fwd_rows_packed_gb<T, 16, 1, true>(a);
      if (plan.vpt == 20 && wpr == 1)
        return fwd_rows_packed_gb<T, 20, 1, true>(a);
      if (plan.vpt == 8 && wpr == 4)
        return fwd_rows_packed_gb<T, 8, 4, true>(a);
      if (plan.vpt == 8 && wpr == 8)
        return fwd_rows_packed_gb<T, 8, 8, true>(a);
      if (plan.vpt == 16 && wpr == 8)
        return fwd_rows_packed_gb<T, 16, 8, true>(a);
      return nullptr;
    }
    if (plan.vpt == 8 && wpr == 8)
      return fwd_rows_packed_gb<T, 8, 8, false>(a);
    if (plan.vpt == 16 && wpr == 8)
      return fwd_rows_packed_gb<T, 16, 8, false>(a);
    return nullptr;
  }
}

/* The batch kernel for rows of COLS in fwd_batch_shape's shape (which must have one); tuning
 * builds also its other stage forms (FORM: fwd_batch_form_stages). */
template <typename T, int64_t COLS, bool LN, int FORM = 0>
static void (*fwd_batch_at())(FwdParams) {
  constexpr BatchShape sh = fwd_batch_shape_of(COLS, (int)sizeof(T), LN);
  constexpr int S = FORM ? fwd_batch_form_stages(FORM) : sh.stages;
  constexpr bool DEFER = FORM ? FORM == 2 : sh.stages == 3;
  return fwd_batch_kernel<T, sh.threads, sh.vpt, sh.rows, S, sh.cluster, LN, DEFER>;
}
template <typename T, int64_t COLS, bool LN> static void (*fwd_batch_form(int form))(FwdParams) {
  if constexpr (kTuningBuild) {
    if (form == 1)
      return fwd_batch_at<T, COLS, LN, 1>();
    if (form == 2)
      return fwd_batch_at<T, COLS, LN, 2>();
    if (form == 3)
      return fwd_batch_at<T, COLS, LN, 3>();
  }
  return form == 0 ? fwd_batch_at<T, COLS, LN>() : nullptr;
}
/* The batch kernel for rows of `cols` (fwd_batch_shape's lengths) in the plan's form (Plan
 * variant: 0 the planned one), or nullptr. */
template <typename T> static void (*fwd_batch_pick(int64_t cols, bool ln, int form))(FwdParams) {
  if (cols == 65536)
    return ln ? fwd_batch_form<T, 65536, true>(form) : fwd_batch_form<T, 65536, false>(form);
  if (cols == 262144)
    return ln ? fwd_batch_form<T, 262144, true>(form) : fwd_batch_form<T, 262144, false>(form);
  return nullptr;
}

template <typename T, typename P, int VEC>
static fnorm_status launch_forward_vec(const Plan &plan, const FwdParams &a, cudaStream_t stream) {
  if (plan.tier == TIER_BATCH) {
    /* The kernel's shape must be the plan's (fwd_batch_shape), and the row exactly its vectors. */
    int threads = 0, vpt = 0, round_rows = 0, stages = 0, cluster = 0;
    fwd_batch_shape(a.cols, (int)sizeof(T), a.layernorm != 0, threads, vpt, round_rows, stages,
                    cluster);
    void (*k)(FwdParams) = nullptr;
    if constexpr (VEC * sizeof(T) == 16 && std::is_same<T, P>::value)
      k = fwd_batch_pick<T>(a.cols, a.layernorm != 0, plan.variant);
    if (plan.variant)
      stages = fwd_batch_form_stages(plan.variant);
    if (!k || plan.threads != threads || plan.vpt != vpt || plan.round_rows != round_rows ||
        plan.nbuf != stages || plan.cluster != cluster ||
        a.cols != (int64_t)threads * vpt * VEC * cluster)
      return FNORM_ERR_UNSUPPORTED;
    return launch_kernel(k, plan.grid, plan.threads, plan.smem, plan.cluster, stream, a);
  }
  if (plan.tier == TIER_WARP) {
    if constexpr (VEC * sizeof(T) == 16) {
      if constexpr (std::is_same<T, P>::value)
        if (plan.packed) { /* fwd_rows_packed_kernel: a row a CTA, or a cluster of plan.cluster
                              CTAs, of plan.threads */
          void (*k)(FwdParams) = fwd_rows_packed_pick<T>(plan, a);
          if (!k)
            return FNORM_ERR_UNSUPPORTED;
          return launch_kernel(k, plan.grid, plan.threads, 0, plan.cluster, stream, a);
        }
      if (plan.packed)
        return FNORM_ERR_UNSUPPORTED;
      if (plan.variant > 0) { /* fwd_rows_kernel: plan.variant rows a one-warp CTA */
        void (*k)(FwdParams) =
            fwd_rows_pick<T, P, VEC>(a.layernorm != 0, plan.group, plan.vpt, plan.variant);
        if (!k)
          return FNORM_ERR_UNSUPPORTED;
        return launch_kernel(k, plan.grid, 32, 0, 1, stream, a);
      }
    }
    /* param_smem: planned on staged rows (other 16-byte rows in tuning builds only); gamma and
     * beta then follow the stages in shared memory as fp32. */
    const bool psm = plan.param_smem != 0;
    void (*k)(FwdParams) = psm ? nullptr : fwd_warp_pick_full<T, P, VEC, false>(plan, a.cols);
    size_t smem = 0;
    if constexpr (VEC * sizeof(T) == 16) {
      if (plan.staged) { /* two stages of vpt 16-byte vectors a thread */
        k = psm ? fwd_warp_pick_full<T, P, VEC, true, true>(plan, a.cols)
                : fwd_warp_pick_full<T, P, VEC, true>(plan, a.cols);
        smem = (size_t)2 * plan.vpt * plan.threads * 16;
      }
      if constexpr (kTuningBuild)
        if (psm && !plan.staged)
          k = fwd_warp_pick_full<T, P, VEC, false, true>(plan, a.cols);
      if (psm)
        smem += (size_t)2 * a.cols * sizeof(float);
    }
    if (!k)
      return FNORM_ERR_UNSUPPORTED;
    return launch_kernel(k, plan.grid, plan.threads, smem, 1, stream, a);
  }
  if (plan.tier == TIER_ROW && plan.mode == MODE_CTA) {
    if constexpr (VEC * sizeof(T) == 16) {
      constexpr int V1 = kCtaMinVpt<T>;
      void (*k)(FwdParams) = nullptr;
      if (plan.variant) { /* the lean form: two CTAs of up to 1024 threads an SM */
        /* (over a cluster of plan.cluster CTAs, each a chunk of plan.chunk vectors) */
        const bool cl = plan.cluster > 1;
        const bool full = a.cols == (int64_t)plan.threads * plan.vpt * plan.cluster * VEC;
        const bool ln = a.layernorm != 0;
        const bool gb = a.gamma && a.beta;
        if (plan.vpt == V1)
          k = fwd_lean_pick<T, P, VEC, V1>(ln, full, cl, gb);
        else if (plan.vpt == 2 * V1)
          k = fwd_lean_pick<T, P, VEC, 2 * V1>(ln, full, cl, gb);
        else if (plan.vpt == 4 * V1)
          k = fwd_lean_pick<T, P, VEC, 4 * V1>(ln, full, cl, gb);
        if (k)
          return launch_kernel(k, plan.grid, plan.threads, 0, plan.cluster, stream, a);
        return FNORM_ERR_UNSUPPORTED;
      }
      /* Rows of exactly the CTA's threads times vectors: the form without tests. */
      const bool full = a.cols == (int64_t)plan.threads * plan.vpt * VEC;
      if (plan.vpt == V1)
        k = fwd_cta_pick<T, P, VEC, V1>(a.layernorm != 0, plan.reread, full);
      else if (plan.vpt == 2 * V1)
        k = fwd_cta_pick<T, P, VEC, 2 * V1>(a.layernorm != 0, plan.reread, full);
      else if (plan.vpt == 4 * V1)
        k = fwd_cta_pick<T, P, VEC, 4 * V1>(a.layernorm != 0, plan.reread, full);
      if (k)
        return launch_kernel(k, plan.grid, plan.threads, 0, 1, stream, a);
    }
    return FNORM_ERR_UNSUPPORTED;
  }
  if (plan.tier == TIER_ROW && plan.mode == MODE_LOOP) { /* fwd_loop_kernel, fwd_loop_ln_kernel */
    if constexpr (VEC * sizeof(T) == 16) {
      constexpr int full1024 = kLoopFull + kLoopFreeParams;
      if (plan.smem > 0) { /* the staged form: plan_forward's fp32 LayerNorm 32768 */
        if constexpr (std::is_same<T, float>::value && std::is_same<P, float>::value &&
                      kFwdLoopLnStaged > 0)
          if (a.layernorm && a.gamma && a.beta && plan.variant == 8 + full1024 + kLoopLn &&
              plan.grid < 0 && plan.smem == kFwdLoopLnStagedBytes &&
              loop_full_fits(plan, full1024 + kLoopLn, a.cols, VEC))
            return launch_loop_staged(
                fwd_loop_ln_kernel<float, float, 4, full1024 + kLoopLn, kFwdLoopLnStaged>, plan, a,
                stream);
        return FNORM_ERR_UNSUPPORTED;
      }
      void (*k)(FwdParams) = nullptr;
      if constexpr (kTuningBuild) { /* every form; variant 1 the PIPE one, 8 + FORM the rest */
        const bool pipe = plan.variant == 1;
        int form = plan.variant > 8 ? plan.variant - 8 : 0;
        /* the full forms need their threads (loop_full_threads) and rows of whole steps; others
         * run the form without kLoopFull's bits (16 or the plain loop) */
        if (form & kLoopFull && !loop_full_fits(plan, form, a.cols, VEC))
          form &= kLoopFreeParams;
        if (form & kLoopLn) /* LayerNorm rows only, in steps of 32 values */
          k = a.layernorm && plan.vpt * VEC == 32 ? fwd_loop_ln_pick<T, P, VEC>(form) : nullptr;
        else if (a.layernorm)
          k = nullptr;
        else if (form && plan.vpt == 1)
          k = fwd_loop_form_pick<T, P, VEC, 1>(form);
        else if (form && plan.vpt == 2)
          k = fwd_loop_form_pick<T, P, VEC, 2>(form);
        else if (form && plan.vpt == 4)
          k = fwd_loop_form_pick<T, P, VEC, 4>(form);
        else if (form && plan.vpt == 8)
          k = fwd_loop_form_pick<T, P, VEC, 8>(form);
        else if (form)
          k = nullptr;
        else if (plan.vpt == 1)
          k = pipe ? fwd_loop_kernel<T, P, VEC, 1, true> : fwd_loop_kernel<T, P, VEC, 1>;
        else if (plan.vpt == 2)
          k = pipe ? fwd_loop_kernel<T, P, VEC, 2, true> : fwd_loop_kernel<T, P, VEC, 2>;
        else if (plan.vpt == 4)
          k = pipe ? fwd_loop_kernel<T, P, VEC, 4, true> : fwd_loop_kernel<T, P, VEC, 4>;
        else if (plan.vpt == 8 && !pipe)
          k = fwd_loop_kernel<T, P, VEC, 8>;
      } else if constexpr (std::is_same<T, P>::value) { /* gamma in the rows' dtype */
        if constexpr (std::is_same<T, float>::value) {
          if (!a.layernorm && plan.vpt == 4 && plan.variant == 0) /* fp32 2048-4096 */
            k = fwd_loop_kernel<T, P, VEC, 4>;
        }
        /* the full forms: their threads and rows of whole steps (loop_full_fits) */
        if (!k && plan.variant > 8 && loop_full_fits(plan, plan.variant - 8, a.cols, VEC)) {
          const int form = plan.variant - 8;
          if (form & kLoopLn) /* LayerNorm rows only, in steps of 32 values */
            k = a.layernorm && plan.vpt * VEC == 32 ? fwd_loop_ln_pick<T, P, VEC>(form) : nullptr;
          else if (!a.layernorm)
            k = fwd_loop_full_pick<T, P, VEC>(form, plan.vpt);
        }
      }
      if (k)
        return launch_kernel(k, plan.grid, plan.threads, plan.smem, 1, stream, a);
    }
    return FNORM_ERR_UNSUPPORTED;
  }
  if (plan.tier == TIER_ROW && plan.mode == MODE_STREAM) {
    if constexpr (VEC * sizeof(T) == 16) {
      void (*k)(FwdParams, int64_t, int) = fwd_stream_pick<T, P, VEC>(a.layernorm != 0, plan);
      if (k)
        return launch_kernel(k, plan.grid, plan.threads, 0, plan.cluster, stream, a, plan.chunk,
                             plan.hints);
    }
    return FNORM_ERR_UNSUPPORTED;
  }
  if (plan.tier == TIER_ROW && plan.mode == MODE_HOLD) {
    if constexpr (VEC * sizeof(T) == 16 && (kTuningBuild || sizeof(T) == 4))
      return launch_hold<T, P, VEC>(plan, a, stream);
    return FNORM_ERR_UNSUPPORTED;
  }
  if (plan.tier == TIER_ROW && plan.mode == MODE_SPREAD) {
    if constexpr (VEC * sizeof(T) == 16)
      return launch_spread<T, P, VEC>(plan, a, stream);
    return FNORM_ERR_UNSUPPORTED;
  }
  if (plan.tier == TIER_ROW && plan.mode == MODE_BULK) {
    if constexpr (VEC * sizeof(T) == 16 && (kTuningBuild || sizeof(T) == 2)) {
      void (*k)(FwdParams, int64_t, int) =
          a.layernorm ? fwd_bulk_kernel<T, P, VEC, true> : fwd_bulk_kernel<T, P, VEC, false>;
      return launch_kernel(k, plan.grid, plan.threads, plan.smem, plan.cluster, stream, a,
                           plan.chunk, plan.nbuf);
    }
    return FNORM_ERR_UNSUPPORTED;
  }
  if (plan.tier == TIER_ROW && plan.mode == MODE_REG) {
    constexpr int VPT = fwd_reg_vpt(VEC);
    void (*k)(FwdParams, int64_t) = nullptr;
    if (plan.vpt == VPT)
      k = fwd_reg_pick<T, P, VEC, VPT, 512>(plan, a);
    /* Tuning builds (FNORM_TUNE_FWD_REG_WIDE=1): fp32 rows at half the vectors a thread in CTAs
     * of up to 1024 threads, the same forms otherwise. */
    if constexpr (kTuningBuild && sizeof(T) == 4 && VEC == 4)
      if (plan.vpt == VPT / 2)
        k = fwd_reg_pick<T, P, VEC, VPT / 2, 1024>(plan, a);
    if (k)
      return launch_kernel(k, plan.grid, plan.threads, 0, plan.cluster, stream, a, plan.chunk);
    return FNORM_ERR_UNSUPPORTED;
  }
  if (plan.tier == TIER_ROW) {
    if (plan.mode == MODE_STAGED)
      return launch_kernel(fwd_row_kernel<T, P, VEC, true>, plan.grid, plan.threads, plan.smem,
                           plan.cluster, stream, a, plan.chunk, plan.nbuf);
    return launch_kernel(fwd_row_kernel<T, P, VEC, false>, plan.grid, plan.threads, plan.smem,
                         plan.cluster, stream, a, plan.chunk, plan.nbuf);
  }
  return FNORM_ERR_UNSUPPORTED;
}

template <typename T, typename P>
fnorm_status launch_forward(const Plan &plan, const FwdParams &a, cudaStream_t stream) {
  constexpr int VEC = 16 / sizeof(T);
  if (plan.vec == VEC)
    return launch_forward_vec<T, P, VEC>(plan, a, stream);
  if (plan.vec == 1)
    return launch_forward_vec<T, P, 1>(plan, a, stream);
  return FNORM_ERR_UNSUPPORTED;
}

template fnorm_status launch_forward<float, float>(const Plan &, const FwdParams &, cudaStream_t);
template fnorm_status launch_forward<f16, f16>(const Plan &, const FwdParams &, cudaStream_t);
template fnorm_status launch_forward<f16, float>(const Plan &, const FwdParams &, cudaStream_t);
template fnorm_status launch_forward<bf16, bf16>(const Plan &, const FwdParams &, cudaStream_t);
template fnorm_status launch_forward<bf16, float>(const Plan &, const FwdParams &, cudaStream_t);

} // namespace fnorm_cuda
