/*
 * Device utilities shared by the forward and backward kernels: dtype conversion, vector
 * access, asynchronous copies into shared memory, and deterministic reductions over a group
 * of lanes, a CTA and a thread-block cluster.
 *
 * Every reduction here adds in a fixed order that depends only on the launch shape, never on
 * timing, so results are bitwise reproducible. The warp butterfly gives every lane the same
 * bits because each pairwise step computes a+b on one lane and b+a on the other, which IEEE
 * addition makes equal.
 */
#ifndef FNORM_CUDA_COMMON_CUH
#define FNORM_CUDA_COMMON_CUH

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "internal.h"

namespace fnorm_cuda {

namespace cg = cooperative_groups;

typedef __nv_bfloat16 bf16;
typedef __half f16;

/* ---- conversions (round to nearest even on the way down) ---- */
__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(f16 v) {
  return __half2float(v);
}
__device__ __forceinline__ float to_f32(bf16 v) {
  return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <> __device__ __forceinline__ f16 from_f32<f16>(float v) {
  return __float2half_rn(v);
}
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float v) {
  return __float2bfloat16_rn(v);
}

/* VEC consecutive elements moved as one access (16 bytes for the vector paths). */
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Pack { T v[VEC]; };

/* Element e of a pack as fp32. A bf16 element is widened straight from the 32-bit word that
 * holds it with its neighbour (the low one shifted up, the high one masked: one instruction
 * each, where the compiler's per-element conversion takes two for the high one). Exact.
 * HALF_WORDS: fp16 elements too are read from their 32-bit word (its low or high half), so that a
 * pack held across a loop stays four words: read an element at a time, fwd_batch_kernel's fp16
 * gamma and beta took a register an element and its three-stage LayerNorm form spilled. */
template <typename T, int VEC, bool HALF_WORDS = false>
__device__ __forceinline__ float pack_f32(const Pack<T, VEC> &pk, int e) {
  if constexpr (std::is_same<T, bf16>::value && VEC % 2 == 0) {
    unsigned w;
    memcpy(&w, &pk.v[e & ~1], 4);
    return __uint_as_float(e & 1 ? w & 0xffff0000u : w << 16);
  } else if constexpr (HALF_WORDS && std::is_same<T, f16>::value && VEC % 2 == 0) {
    unsigned w;
    memcpy(&w, &pk.v[e & ~1], 4);
    __half2 h;
    memcpy(&h, &w, 4);
    return e & 1 ? __high2float(h) : __low2float(h);
  } else {
    return to_f32(pk.v[e]);
  }
}

/* A pack's elements as fp32 (pack_f32). */
template <typename T, int VEC>
__device__ __forceinline__ void unpack_f32(const Pack<T, VEC> &pk, float *out) {
#pragma unroll
  for (int e = 0; e < VEC; ++e)
    out[e] = pack_f32<T, VEC>(pk, e);
}

/* A pack's squares added into two partial sums, even elements into p0 and odd into p1 (RMSNorm's
 * sum of squares, two chains of fmas). */
template <typename T, int VEC>
__device__ __forceinline__ void add_squares(const Pack<T, VEC> &pk, float &p0, float &p1) {
#pragma unroll
  for (int e = 0; e < VEC; e += 2) {
    const float x0 = pack_f32<T, VEC>(pk, e), x1 = pack_f32<T, VEC>(pk, e + 1);
    p0 = fmaf(x0, x0, p0);
    p1 = fmaf(x1, x1, p1);
  }
}

/* K <= 4 values as one float4, zero past them (what a CTA sends its cluster in one exchange). */
template <int K> __device__ __forceinline__ float4 float4_of(const float (&v)[K]) {
  static_assert(K >= 1 && K <= 4, "a float4's components");
  float w[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < K; ++i)
    w[i] = v[i];
  return make_float4(w[0], w[1], w[2], w[3]);
}

/* A row vector read once: bypass L1 (ld.global.L1::no_allocate), so that the streams of
 * x and dy do not evict gamma and beta, which every row re-reads from L1. */
template <typename T, int VEC> __device__ __forceinline__ Pack<T, VEC> load_stream(const T *p) {
  Pack<T, VEC> pk;
  if constexpr (sizeof(Pack<T, VEC>) == 16) {
    uint4 u;
    asm("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(p));
    memcpy(&pk, &u, 16);
  } else if constexpr (sizeof(Pack<T, VEC>) == 4) {
    unsigned u;
    asm("ld.global.L1::no_allocate.u32 %0, [%1];" : "=r"(u) : "l"(p));
    memcpy(&pk, &u, 4);
  } else {
    unsigned short u;
    asm("ld.global.L1::no_allocate.u16 %0, [%1];" : "=h"(u) : "l"(p));
    memcpy(&pk, &u, 2);
  }
  return pk;
}

/* ---- scalar helpers ---- */
/* 1/x for a count of values (x >= 1): the hardware reciprocal, within an ulp (exact for powers
 * of two), one instruction where the IEEE division takes a dozen and a branch. */
__device__ __forceinline__ float count_rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

/* v, as a value the compiler cannot relate to anything computed before: what is computed from it
 * is computed where it stands, not carried in a register from the start of a loop (the compiler's
 * induction variables and hoisted invariants), which at a kernel's register cap can spill. */
__device__ __forceinline__ int64_t made_here(int64_t v) {
  asm volatile("" : "+l"(v));
  return v;
}

/* L2 eviction policies for a row read twice in quick succession (sm_80+): the first read marks
 * its lines evict-last, so that they are still in L2 for the second, which marks them
 * evict-first, since nothing reads them again. */
__device__ __forceinline__ uint64_t l2_policy_keep() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint64_t l2_policy_drop() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ uint64_t l2_policy_normal() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

/* Element e of a loaded pack as fp32, as pack_f32, but converted by an instruction the compiler
 * cannot merge with an earlier conversion of the same element: a kernel that converts its 16-bit
 * values again (one instruction an element) rather than hold them as floats (twice the
 * registers). */
template <typename T, int VEC>
__device__ __forceinline__ float reconvert(const Pack<T, VEC> &pk, int e) {
  if constexpr (sizeof(T) == 4) {
    return to_f32(pk.v[e]);
  } else {
    unsigned w;
    memcpy(&w, &pk.v[e & ~1], 4);
    float f;
    if constexpr (std::is_same<T, bf16>::value) {
      if (e & 1)
        asm volatile("and.b32 %0, %1, 0xffff0000;" : "=f"(f) : "r"(w));
      else
        asm volatile("shl.b32 %0, %1, 16;" : "=f"(f) : "r"(w));
    } else {
      const unsigned short h = (unsigned short)(e & 1 ? w >> 16 : w & 0xffffu);
      asm volatile("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    }
    return f;
  }
}

/* A 16-byte row vector read past L1 with an L2 policy (l2_policy_keep, _drop or _normal). */
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_hinted(const T *p, uint64_t pol) {
  static_assert(sizeof(Pack<T, VEC>) == 16, "16-byte vectors");
  Pack<T, VEC> pk;
  uint4 u;
  asm("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
      : "l"(p), "l"(pol));
  memcpy(&pk, &u, 16);
  return pk;
}

/* As load_hinted, but allocating in L1 (a row read again soon by the same CTA), with L1's
 * eviction priority L1P: 1 evict-last (the first of two reads), 2 evict-first (the last). */
template <typename T, int VEC, int L1P>
__device__ __forceinline__ Pack<T, VEC> load_hinted_l1(const T *p, uint64_t pol) {
  static_assert(sizeof(Pack<T, VEC>) == 16, "16-byte vectors");
  static_assert(L1P == 1 || L1P == 2, "evict-last or evict-first");
  Pack<T, VEC> pk;
  uint4 u;
  if constexpr (L1P == 1)
    asm("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(p), "l"(pol));
  else
    asm("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(p), "l"(pol));
  memcpy(&pk, &u, 16);
  return pk;
}

/* The pack's registers, as far as the compiler knows, changed: values computed from it before
 * are not reused after (no instruction is emitted). */
template <typename T, int VEC> __device__ __forceinline__ void opaque(Pack<T, VEC> &pk) {
  static_assert(sizeof(Pack<T, VEC>) % 4 == 0, "whole 32-bit words");
  unsigned w[sizeof(Pack<T, VEC>) / 4];
  memcpy(w, &pk, sizeof(w));
#pragma unroll
  for (int i = 0; i < (int)(sizeof(w) / 4); ++i)
    asm volatile("" : "+r"(w[i]));
  memcpy(&pk, w, sizeof(w));
}

/* A 16-byte row vector through L1: kept there (evict-last) for a second read of the same row
 * soon after, or marked for eviction first (its last read). No L2 policy register. */
template <typename T, int VEC, bool LAST_READ>
__device__ __forceinline__ Pack<T, VEC> load_l1(const T *p) {
  static_assert(sizeof(Pack<T, VEC>) == 16, "16-byte vectors");
  Pack<T, VEC> pk;
  uint4 u;
  if constexpr (LAST_READ)
    asm("ld.global.L1::evict_first.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(p));
  else
    asm("ld.global.L1::evict_last.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(p));
  memcpy(&pk, &u, 16);
  return pk;
}

template <typename T, int VEC>
__device__ __forceinline__ void load_stream_f32(const T *p, float *out) {
  unpack_f32<T, VEC>(load_stream<T, VEC>(p), out);
}

template <typename T, int VEC> __device__ __forceinline__ void load_vec(const T *p, float *out) {
  const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC> *>(p); /* one access */
  unpack_f32<T, VEC>(pk, out);
}

/* Four 32-bit words stored as one st.global.v4 at p (16-byte aligned), where it stands in the
 * code (volatile: the compiler neither splits nor moves it). */
__device__ __forceinline__ void store_words_in_place(void *p, const uint32_t (&w)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]),
               "r"(w[3])
               : "memory");
}

/* Four floats stored as one st.global.v4 at p (16-byte aligned), as store_words_in_place. */
__device__ __forceinline__ void store_f32x4_in_place(float *p, float a, float b, float c, float d) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

/* A 16-byte vector of read-only data (gamma, beta) read where it stands in the code (volatile:
 * not hoisted with the rest of a row's loads, which would hold their registers). */
__device__ __forceinline__ uint4 load_words_in_place(const void *p) {
  uint4 u;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "l"(p));
  return u;
}

/* VEC values converted to T and stored at p (aligned to the pack). ONE_STORE: a 16-byte pack goes
 * out as one st.global.v4. Written as a copy of the Pack, the compiler split the stores of some
 * kernels' vectors into 16- and 32-bit stores (ptxas merged them into four 32-bit STGs a vector:
 * four times the store instructions and L2 write requests): fwd_reg_kernel's (half its vectors),
 * the clustered fwd_lean_kernel's and its 32-element RMSNorm form's, fwd_stream_kernel's,
 * fwd_row_kernel's, and one vector in eight of fwd_rows_kernel's at 8 rows a CTA. A/B run BC
 * (H200, release builds, 2^27 elements) built every kernel with ONE_STORE against the copy: 16-bit
 * RMSNorm 65536-262144 +2 to +4 points, 16-bit rows with fp32 gamma 32768-262144 +3 to +10, fp32
 * 64 x 802816 +1 to +2.6; but in kernels whose stores were whole already the asm form moved the
 * schedule and lost up to 25 points (fwd_reg_kernel's fp32 RMSNorm 262144, fwd_cta_reread_kernel's
 * fp32 rows -4 to -5, fwd_cta_kernel's 16-bit LayerNorm -1.2, fwd_warp_kernel's fp16 LayerNorm
 * 4096 x 1024 under graph replay -4.6). So only the forms run BC and run BD measured level or
 * faster take it (fwd_reg_kernel on 16-bit rows, fwd_lean_kernel's named forms,
 * fwd_stream_kernel); fwd_row_kernel and the rows form, not measured, keep the copy. */
template <typename T, int VEC, bool ONE_STORE = false>
__device__ __forceinline__ void store_vec(T *p, const float *in) {
  Pack<T, VEC> pk;
#pragma unroll
  for (int e = 0; e < VEC; ++e)
    pk.v[e] = from_f32<T>(in[e]);
  if constexpr (ONE_STORE && sizeof(Pack<T, VEC>) == 16) {
    uint32_t w[4];
    memcpy(w, &pk, 16);
    store_words_in_place(p, w);
  } else {
    *reinterpret_cast<Pack<T, VEC> *>(p) = pk;
  }
}

/* A parameter vector (gamma or beta); NULL reads as `fill`. */
template <typename P, int VEC>
__device__ __forceinline__ void load_param(const P *p, int64_t col, float fill, float *out) {
  if (p) {
    load_vec<P, VEC>(p + col, out);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      out[e] = fill;
  }
}

/* As load_param, through the read-only path as asm the compiler may move (not volatile, no
 * memory clobber): it can issue a row's parameter loads ahead of the stores of y, which it may not
 * do for plain loads that could alias y. The vector spans whole 16-byte words.
 * Such asm is, to the compiler, a pure function of its address, free to run where the source
 * says not to: in fwd_reg_kernel (A/B run EH, session 47) it hoisted these loads out of the row
 * loop, above `if (p)`, and the RMSNorm forms read beta's NULL and faulted. Its release callers
 * (the loop kernels' full forms, rows of whole steps: no bounds test) compile with every such
 * load predicated on p (cuobjdump of the sm_90 and sm_80 code, session 47); their no-gamma cases
 * run them with NULL gamma and beta. A new caller, or the tuning builds' loop forms with a bounds
 * test, needs the same check. Making the address always valid instead (a stand-in for NULL, the
 * column chosen before the bounds test) cost 0.8-5 points (A/B run EI). */
template <typename P, int VEC>
__device__ __forceinline__ void load_param_free(const P *p, int64_t col, float fill, float *out) {
  static_assert(sizeof(P) * VEC % 16 == 0, "whole 16-byte words");
  constexpr int kWords = (int)(sizeof(P) * VEC / 16);
  if (p) {
    uint4 u[kWords];
#pragma unroll
    for (int w = 0; w < kWords; ++w)
      asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
          : "=r"(u[w].x), "=r"(u[w].y), "=r"(u[w].z), "=r"(u[w].w)
          : "l"(p + col + w * (16 / (int)sizeof(P))));
    Pack<P, VEC> pk;
    memcpy(&pk, u, sizeof(pk));
    unpack_f32<P, VEC>(pk, out);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      out[e] = fill;
  }
}

/* VEC fp32 values from shared memory (gamma/beta kept there as fp32), 16 bytes at a time;
 * src 16-byte aligned. */
template <int VEC> __device__ __forceinline__ void load_smem_f32(const float *src, float *out) {
  static_assert(VEC % 4 == 0, "whole float4s");
#pragma unroll
  for (int q = 0; q < VEC / 4; ++q) {
    const float4 v = *reinterpret_cast<const float4 *>(src + 4 * q);
    out[4 * q] = v.x, out[4 * q + 1] = v.y, out[4 * q + 2] = v.z, out[4 * q + 3] = v.w;
  }
}

/* ---- asynchronous global -> shared copies (sm_80+) ---- */
__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Wait until at most N (0 to 7, known at compile time) of this thread's committed groups are
 * in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait_n() {
  static_assert(N >= 0 && N < 8, "cp.async.wait_group takes 0 to 7 here");
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* ... for n (0 to 7) that unrolling makes a constant: at most n in flight (N the largest n). */
template <int N = 7> __device__ __forceinline__ void cp_async_wait_upto(int n) {
  if constexpr (N > 0) {
    if (n >= N)
      cp_async_wait_n<N>();
    else
      cp_async_wait_upto<N - 1>(n);
  } else {
    cp_async_wait_n<0>();
  }
}
/* ... for `pending` 0 or 1 known at run time. */
__device__ __forceinline__ void cp_async_wait(int pending) {
  if (pending)
    cp_async_wait_n<1>();
  else
    cp_async_wait_n<0>();
}

/* Start copying `count` vectors from global memory into a shared-memory stage, as one
 * committed group of cp.async (16-byte vectors) or as plain copies (narrower ones, which are
 * complete when the copying thread moves on). */
template <typename T, int VEC>
__device__ __forceinline__ void stage_issue(Pack<T, VEC> *stage, const T *src, int64_t count) {
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    if (sizeof(Pack<T, VEC>) == 16)
      cp_async_16(&stage[i], src + i * VEC);
    else
      stage[i] = *reinterpret_cast<const Pack<T, VEC> *>(src + i * VEC);
  }
  cp_async_commit();
}

/* Vectors in chunk `rank` of a row of nvec vectors cut into chunks of chunk_vecs: chunk_vecs,
 * fewer for the last chunk, none past the row's end. */
__device__ __forceinline__ int64_t chunk_count(int64_t nvec, int64_t chunk_vecs, int64_t rank) {
  const int64_t lo = rank * chunk_vecs;
  return lo < nvec ? (nvec - lo < chunk_vecs ? nvec - lo : chunk_vecs) : 0;
}

/* ---- reductions ---- */

/* Pairwise sum of a thread's N values: a tree of depth log2(N) instead of a chain of N
 * dependent additions, and more accurate. */
template <int N> __device__ __forceinline__ float tree_sum(const float *a) {
  if constexpr (N == 1)
    return a[0];
  else
    return tree_sum<N / 2>(a) + tree_sum<N - N / 2>(a + N / 2);
}

/* Programmatic dependent launch (sm_90; no-ops before). The backward's row kernels let the
 * dgamma/dbeta finalize, launched with programmatic stream serialization, be scheduled as soon as
 * every one of their CTAs has started, so that its launch overlaps their work instead of
 * following their end; the finalize then waits in pdl_wait_prerequisites until they have all
 * finished and their partials are visible (griddepcontrol.wait: the whole grid, memory
 * included). A kernel launched without the attribute returns from the wait at once. */
__device__ __forceinline__ void pdl_allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Barrier of `count` threads (a multiple of 32) on hardware barrier `id` (1 to 15; 0 is
 * __syncthreads'): orders the shared-memory accesses of just those threads. */
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

/* Sum over aligned groups of WIDTH lanes (a power of two <= 32); every lane gets the sum.
 * All 32 lanes of the warp must call it. */
template <int WIDTH, int K> __device__ __forceinline__ void group_sum(float (&v)[K]) {
#pragma unroll
  for (int off = WIDTH / 2; off > 0; off >>= 1)
#pragma unroll
    for (int k = 0; k < K; ++k)
      v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
}

/* Two sums held in halves of the warp (lanes 0-15 the first, 16-31 the second; every lane of a
 * half the same bits) back into both values of every lane: one shuffle. */
__device__ __forceinline__ void halves_to_both(float mine, float (&v)[2]) {
  const bool hi = threadIdx.x & 16;
  const float other = __shfl_xor_sync(0xffffffffu, mine, 16);
  v[0] = hi ? other : mine;
  v[1] = hi ? mine : other;
}

/* Shared scratch for block/cluster sums: two slots so that consecutive reductions need one
 * barrier each (a slot is rewritten only after every thread has passed the barrier that
 * follows its last read). The cluster part receives each CTA's sums by st.async, counted by
 * an mbarrier per slot. */
template <int K> struct ReduceSmem {
  float warp[2][32][K];
  float cta[2][16][K];
  unsigned long long bar[2];
};

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* Dynamic shared memory from a 128-byte line. A kernel's dynamic block starts where its static
 * shared memory ends, 16-byte aligned, so its place in a line is whatever the static arrays
 * leave: 16 bytes in the backward's clustered batch LayerNorm kernels (bwd_batch_kernel with
 * CL > 1, whose cluster slots the one-CTA form lacks), 80 in their RMSNorm forms, 64 in
 * RMSNorm's one-CTA form at 5120, 96 in the backward's hold kernel. Copies landing off a line
 * cost the batch kernel up to 10 points: at bf16 LayerNorm 8192 x 16384 its SMs asked L2 for
 * 33.6 million sectors against 16.8 million at 16384 x 8192, whose stages start on a line
 * (ncu33 and lead 49, session 57; bench/tune/clusterprobe.cu `rows`, the batch kernel's copies
 * alone on an H200: stages 80 bytes into a line doubled the L2 sectors and ran at 81-83% of the
 * copy, 16 bytes in 89-91%, on a line or 64 in 95-98%). The kernels measured faster on a line
 * take smem_on_line(dyn_smem) as their start, and their launches ask kDynSmemLinePad bytes more:
 * bwd_batch_kernel and the backward's hold kernel (A/B run GA, session 58, H200, against the
 * stages where the static arrays left them: batch LayerNorm 16384 +6.1 to +6.5 points, 32768
 * +6.1 to +9.4, RMSNorm 5120 +2.9 to +3.0 at 2^27, the hold kernel's fp32 262144 +0.8 to +5.2,
 * the rest level).
 * (`extern __shared__ __align__(128)` would move the start in every kernel of a file at once:
 * the extern arrays of a file share one alignment. A/B run FW and run FZ (H200) measured that
 * (bench/tune/lead49-dyn-smem-128.patch): batch LayerNorm 16384 +6.4 points, 32768 +9.6,
 * RMSNorm 5120 +2.8, the hold kernel's fp32 262144 +1.9 and +5.6, but the ring's short chunks
 * -3.8 (fp32 5120) and -4.5 (16-bit RMSNorm 2048 and 4096), the forward level.) */
constexpr int kDynSmemLine = 128;
constexpr int kDynSmemLinePad = kDynSmemLine - 16;
__device__ __forceinline__ unsigned char *smem_on_line(unsigned char *dyn) {
  /* dyn is 16-byte aligned, so the step to the next line is a multiple of 16 below 128: masked
   * with 112, the compiler sees that too and keeps the 16-byte accesses whole */
  return dyn + ((0u - smem_addr(dyn)) & (uint32_t)kDynSmemLinePad);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t cluster_addr(uint32_t local, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
  return r;
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* mbarriers by shared-memory address (a CTA's own, or a peer's through cluster_addr). */
__device__ __forceinline__ void mbar_expect_at(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
/* SUSPEND: each try_wait may suspend the thread up to 10 ms (a time hint; it resumes as the phase
 * completes), where the plain try_wait gives up sooner and the loop spins: fwd_batch_kernel's
 * LayerNorm form spent 4% of its issued instructions in that loop (ncu35). */
template <bool SUSPEND = false>
__device__ __forceinline__ void mbar_wait_at(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    if constexpr (SUSPEND)
      asm volatile("{\n .reg .pred p;\n"
                   " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
                   " selp.u32 %0, 1, 0, p;\n}"
                   : "=r"(done)
                   : "r"(bar), "r"(parity), "r"(10000000u)
                   : "memory");
    else
      asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                   " selp.u32 %0, 1, 0, p;\n}"
                   : "=r"(done)
                   : "r"(bar), "r"(parity)
                   : "memory");
  } while (!done);
}
#endif

/* How cta_sum_slot adds the warps' sums: every thread in a loop over the warps (broadcast
 * reads of shared memory), or lane r taking warp r's and a second butterfly adding them, or the
 * loop up to 8 warps and the butterfly beyond. Measured on an H200 (bench/tune/, sweeps 8-10):
 * the butterfly is fastest in every kernel but the 16-bit fwd_reg_kernel, where the mixed form
 * measured best and the butterfly alone 20-30 points slower (why was not profiled; the same
 * code change moved that kernel's instruction schedule and register count). */
enum WarpSum { WARPS_LOOP = 0, WARPS_LANES = 1, WARPS_MIXED = 2 };

/* Sum of K values over the CTA through one slot of per-warp scratch (KW >= K floats a warp);
 * every thread gets the same bits. Every thread of the CTA calls it. */
template <int K, int KW, int HOW = WARPS_LANES>
__device__ __forceinline__ void cta_sum_slot(float (&v)[K], float (&warp)[2][32][KW], int slot) {
  group_sum<32, K>(v);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < K; ++k)
      warp[slot][w][k] = v[k];
  __syncthreads();
  if (HOW == WARPS_LOOP || (HOW == WARPS_MIXED && nwarps <= 8)) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float s = 0.f;
      for (int r = 0; r < nwarps; ++r)
        s += warp[slot][r][k];
      v[k] = s;
    }
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k)
      v[k] = lane < nwarps ? warp[slot][lane][k] : 0.f;
    group_sum<32, K>(v);
  }
}

/* Before the first row_sum over a cluster: the mbarriers exist before any CTA signals them. */
template <int K> __device__ __forceinline__ void row_sum_init(ReduceSmem<K> &sm, int cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster > 1) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < 2; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&sm.bar[s]))
                     : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cg::this_cluster().sync();
  }
#else
  (void)sm;
  (void)cluster;
#endif
}

/* Sum over the CTA, then over the `count` CTAs of the cluster with ranks [first, first +
 * count) when count > 1 (every CTA of the group must then call it, in the same round, after
 * row_sum_init). Every thread of the CTA must call it, with the same `round`, which it then
 * advances. Every thread gets the same bits.
 *
 * The cluster step sends the CTA's sums to each CTA of the group with st.async, which
 * completes on the receiver's mbarrier; the receiver waits on that barrier alone. A cluster
 * barrier would do too, but its release semantics make each CTA wait for its own outstanding
 * memory operations, the next row's prefetch among them, on every row. */
template <int K>
__device__ __forceinline__ void row_sum(float (&v)[K], ReduceSmem<K> &sm, int &round, int first,
                                        int count) {
  static_assert(K == 2, "the cluster step sends two floats");
  const int slot = round & 1;
  cta_sum_slot<K>(v, sm.warp, slot);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (count > 1) {
    const uint32_t bar = smem_addr(&sm.bar[slot]);
    const uint32_t me = cluster_rank() - (uint32_t)first;
    if (threadIdx.x == 0)
      mbar_expect_at(bar, (uint32_t)(count * K * 4));
    if ((int)threadIdx.x < count) {
      const uint32_t peer = (uint32_t)first + threadIdx.x;
      asm volatile(
          "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::
              "r"(cluster_addr(smem_addr(&sm.cta[slot][me][0]), peer)),
          "f"(v[0]), "f"(v[1]), "r"(cluster_addr(bar, peer))
          : "memory");
    }
    /* The k-th use of a slot completes the barrier's phase of parity k & 1. */
    mbar_wait_at(bar, (uint32_t)(round >> 1) & 1u);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float s = 0.f;
      for (int r = 0; r < count; ++r)
        s += sm.cta[slot][r][k];
      v[k] = s;
    }
  }
#else
  (void)first;
  (void)count;
#endif
  ++round;
}

/* Most stages a ring kernel's shared memory holds. */
constexpr int kRingMaxStages = 8;

/* ---- bulk-copy rings (sm_90): rows staged in shared memory by the copy engine ----
 *
 * A ring of S stages, each filled by one cp.async.bulk per array (a whole chunk of a row, one
 * instruction issued by one thread) and completed on the stage's mbarrier. Many rows are in
 * flight at no register and almost no instruction cost, which the register-prefetching and
 * cp.async kernels could not achieve together. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(unsigned long long *bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}
/* One arrival that also announces `bytes` of incoming copies for the current phase. */
__device__ __forceinline__ void mbar_expect(unsigned long long *bar, uint32_t bytes) {
  mbar_expect_at(smem_addr(bar), bytes);
}
__device__ __forceinline__ void mbar_wait(unsigned long long *bar, uint32_t parity) {
  mbar_wait_at(smem_addr(bar), parity);
}
/* Copy `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory into
 * this CTA's shared memory, completing on `bar`. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, uint32_t bytes,
                                          unsigned long long *bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
               "[%3];" ::"r"(smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
/* Orders this CTA's earlier generic-proxy accesses to shared memory (the reads of a stage)
 * before later async-proxy writes to it (the next bulk copy into that stage). */
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
#endif

/* ---- posts counted in global memory (the backward hold tier, and the forward hold kernel's
 * LayerNorm form in tuning builds; one cooperative launch) ----
 * A CTA writes what it posts, then adds 1 to the count (release: the post is visible to whoever
 * sees the count); warp 0 of a CTA that needs `n` posts waits for the count (lane 0 spins relaxed)
 * and then each lane acquires it, so that its own reads of the posts follow every post. */
__device__ __forceinline__ void post_count_add(unsigned *count) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
}
/* Every lane of the waiting warp calls it, with its lane index. */
__device__ __forceinline__ void warp_wait_count(const unsigned *count, unsigned n, int lane) {
  unsigned seen = 0;
  if (lane == 0)
    do {
      asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
    } while (seen < n);
  __syncwarp();
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
}

/* ---- posts as flagged words (the forward hold kernel's RMSNorm form) ----
 * A float posted beside a set flag in one 64-bit store, which is single-copy atomic: a reader
 * that sees the flag sees the value, so it polls the word itself, with no count to add to and no
 * acquire (A/B run EN: +0.2 to +1.1 points over the count there). The words are cleared to 0
 * before a grid-wide barrier that precedes every post, and each is posted once a launch. */
__device__ __forceinline__ void post_flagged(unsigned long long *word, float v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(word),
               "l"((1ull << 32) | __float_as_uint(v))
               : "memory");
}
__device__ __forceinline__ float wait_flagged(const unsigned long long *word) {
  unsigned long long w;
  do {
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(w) : "l"(word) : "memory");
  } while (!(w >> 32));
  return __uint_as_float((unsigned)w);
}

/* Shared scratch of the ring kernels' reductions: warp partials (two slots, one barrier per
 * sum) and the cluster exchange (two slots of up to 16 CTAs x 4 floats, filled by st.async and
 * counted on an mbarrier per slot). */
struct RingRed {
  float warp[2][32][4];
  float4 cta[2][16];
  unsigned long long xbar[2];
};

/* A RingRed in function-scope shared memory, for kernels that exchange across a cluster only in
 * some of their forms (only the kernels that call it have it). */
__device__ __forceinline__ RingRed &cluster_red_slots() {
  __shared__ RingRed red;
  return red;
}

/* Sum K <= 4 values over the CTA (every thread gets the same bits). Every thread calls it;
 * `round` alternates the slot. */
template <int K, int HOW = WARPS_LANES>
__device__ __forceinline__ void cta_sum(float (&v)[K], RingRed &sm, int &round) {
  cta_sum_slot<K, 4, HOW>(v, sm.warp, round & 1);
  ++round;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* This CTA's four values into slot `slot` of every CTA of the cluster, completing on each one's
 * exchange mbarrier `bar` (this CTA's address of it), whose bytes thread 0 expects here. */
__device__ __forceinline__ void cluster_send(float4 v, RingRed &sm, int slot, uint32_t bar,
                                             int csize) {
  const uint32_t me = cluster_rank();
  if (threadIdx.x == 0)
    mbar_expect_at(bar, (uint32_t)(csize * 16));
  if ((int)threadIdx.x < csize) {
    const uint32_t peer = threadIdx.x;
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, "
        "[%5];" ::"r"(cluster_addr(smem_addr(&sm.cta[slot][me]), peer)),
        "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(cluster_addr(bar, peer))
        : "memory");
  }
}
#endif
/* The cluster's exchange of four values a CTA, in rounds. cluster_exchange(v, sm, xround, csize)
 * gives every CTA of the cluster (size csize) this CTA's v: afterwards sm.cta[slot][r] holds CTA
 * r's, for every r; it returns the slot. Every CTA calls it in the same round (`xround`, which it
 * advances), after a __syncthreads since its previous call (which the caller's cta_sum
 * provides), and after the ring's mbarrier initialization. cluster_post and cluster_wait are its
 * two halves, for a kernel that does other work between them: cluster_post(v, sm, xround, csize)
 * sends round xround's values (and advances xround), cluster_wait(sm, r) waits for round r's and
 * returns its slot. The slots alternate, so a CTA posts round r + 2 only after a __syncthreads
 * that follows every thread's last read of round r's slot (a peer posts round r + 2 only once
 * this CTA has posted r + 1). */
__device__ __forceinline__ void cluster_post(float4 v, RingRed &sm, int &xround, int csize) {
  const int slot = xround & 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cluster_send(v, sm, slot, smem_addr(&sm.xbar[slot]), csize);
#else
  (void)csize;
  sm.cta[slot][0] = v;
#endif
  ++xround;
}
template <bool SUSPEND = false>
__device__ __forceinline__ int cluster_wait(RingRed &sm, int round) {
  const int slot = round & 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  mbar_wait_at<SUSPEND>(smem_addr(&sm.xbar[slot]), (uint32_t)(round >> 1) & 1u);
#else
  (void)sm;
#endif
  return slot;
}
__device__ __forceinline__ int cluster_exchange(float4 v, RingRed &sm, int &xround, int csize) {
  const int round = xround;
  cluster_post(v, sm, xround, csize);
  return cluster_wait(sm, round);
}

/* Cluster geometry of the calling CTA: (1, 0) without a cluster or before sm_90. */
__device__ __forceinline__ void cluster_shape(int &size, int &rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::cluster_group cluster = cg::this_cluster();
  size = (int)cluster.num_blocks();
  rank = (int)cluster.block_rank();
#else
  size = 1;
  rank = 0;
#endif
}

/* Barrier over the whole cluster (no-op without one). Also keeps a CTA's shared memory alive
 * until the rest of its cluster has read it. */
__device__ __forceinline__ void cluster_barrier(int cluster_size) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster_size > 1)
    cg::this_cluster().sync();
#else
  (void)cluster_size;
#endif
}

/* The exchange of kernels launched a cluster a row (one exchange a launch, so no mbarrier and
 * no slot reuse): every thread calls cluster_start() first thing, which arrives on the cluster
 * barrier without waiting, and cluster_exchange_once(v, slots, csize) later: it waits for that
 * phase (every CTA of the cluster running, so its shared memory may be written), stores v into
 * slots[rank] of every CTA, and meets the cluster at the barrier again (release/acquire), after
 * which slots[r] holds rank r's values in every CTA. No CTA touches another's shared memory
 * after it, so the CTAs may exit at once. Without a cluster (or before sm_90) slots[0] = v. */
__device__ __forceinline__ void cluster_start(int csize) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (csize > 1)
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#else
  (void)csize;
#endif
}
__device__ __forceinline__ void cluster_exchange_once(float4 v, float4 *slots, int csize) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (csize > 1) {
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    if ((int)threadIdx.x < csize) {
      const uint32_t to = cluster_addr(smem_addr(&slots[cluster_rank()]), threadIdx.x);
      asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(to), "f"(v.x),
                   "f"(v.y), "f"(v.z), "f"(v.w)
                   : "memory");
    }
    asm volatile(
        "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
            : "memory");
    return;
  }
#else
  (void)csize;
#endif
  slots[0] = v;
}

/* LayerNorm statistics from the two reductions the kernels perform: first the plain sum
 * (giving a first mean m1), then S1 = sum(x - m1) and S2 = sum((x - m1)^2). Centring on m1
 * keeps S2 free of cancellation; the correction c = S1/N repairs the rounding in m1, and the
 * kernels normalize (x - m1) - c, which stays accurate even for x = 1e4 + N(0,1). */
struct LnStats {
  float m1, c, rstd;
};
__device__ __forceinline__ LnStats ln_stats(float m1, float s1, float s2, float inv_n, float eps) {
  LnStats st;
  st.m1 = m1;
  st.c = s1 * inv_n;
  float var = s2 * inv_n - st.c * st.c;
  var = var < 0.f ? 0.f : var; /* not fmaxf: a NaN must stay NaN so the row's rstd shows it */
  st.rstd = 1.f / sqrtf(var + eps);
  return st;
}

/* S1 = sum(x - m1) over a thread's n 16-bit values, from their plain sum s, in one rounding
 * (the FMA holds n * m1 exactly), where a sum of the n centred values costs an add a value. It is
 * the same number: s is exact in fp32 while the values' binades span less than 17 - log2(n)
 * (bf16) or 14 - log2(n) (fp16), and then so is every step but the last; where they span more,
 * s rounds about as often as the centred sum does (both add values up to the largest). fp32
 * values keep the centred sum: their plain sum rounds at every add, off by many of the centred
 * sum's ulps on a row far from zero (x = 1e4 + N(0,1)). */
__device__ __forceinline__ float centred_sum_from_sum(float s, float n, float m1) {
  return fmaf(-n, m1, s);
}

/* Before the first cluster_exchange: the exchange barriers exist before any CTA signals them. */
__device__ __forceinline__ void ring_red_init(RingRed &red, int csize) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (csize > 1) {
    if (threadIdx.x == 0) {
      mbar_init(&red.xbar[0], 1);
      mbar_init(&red.xbar[1], 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cg::this_cluster().sync();
  }
#else
  (void)red;
  (void)csize;
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* The bulk-copy kernels' mbarriers (thread 0): `n` stage barriers of one arrival each and the
 * cluster exchange's, visible to the whole cluster before any copy or exchange signals them. */
__device__ __forceinline__ void bulk_barriers_init(unsigned long long *full, int n, RingRed &red,
                                                   int csize) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < n; ++s)
      mbar_init(&full[s], 1);
    mbar_init(&red.xbar[0], 1);
    mbar_init(&red.xbar[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (csize > 1)
    cg::this_cluster().sync();
}
#endif

/* A chunk of a row (a CTA's values): mean ref + c, sum of squared deviations m2, n values. */
struct ChunkStats {
  float ref, c, m2, n;
};
/* Counts of valid values, fixed for a kernel's lifetime: the thread's (nt), its warp's (nw) and
 * its CTA's (ncta), with reciprocals (0 for a count of 0), so that no row divides. */
struct LnCounts {
  float nt, inv_nt, nw, inv_nw, ncta, inv_ncta;
};
__device__ __forceinline__ LnCounts ln_counts(int values_thread, int64_t values_cta) {
  LnCounts n;
  n.nt = (float)values_thread;
  float w[1] = {n.nt};
  group_sum<32, 1>(w);
  n.nw = w[0];
  n.ncta = (float)values_cta;
  n.inv_nt = n.nt > 0.f ? count_rcp(n.nt) : 0.f;
  n.inv_nw = n.nw > 0.f ? count_rcp(n.nw) : 0.f;
  n.inv_ncta = n.ncta > 0.f ? count_rcp(n.ncta) : 0.f;
  return n;
}
/* The same where every thread holds values_thread values (rows of whole steps of a CTA's
 * threads): no shuffle is needed. */
__device__ __forceinline__ LnCounts ln_counts_uniform(float values_thread, int64_t values_cta) {
  LnCounts n;
  n.nt = values_thread;
  n.inv_nt = count_rcp(n.nt);
  n.nw = 32.f * n.nt;
  n.inv_nw = count_rcp(n.nw);
  n.ncta = (float)values_cta;
  n.inv_ncta = count_rcp(n.ncta);
  return n;
}
/* The same where every thread holds EPT values (no thread's vector outside the chunk): the
 * thread's and warp's counts are constants, and no shuffle is needed. */
template <int EPT> __device__ __forceinline__ LnCounts ln_counts_full(int64_t values_cta) {
  constexpr float nt = (float)EPT, nw = 32.f * (float)EPT;
  LnCounts n;
  n.nt = nt;
  n.inv_nt = 1.f / nt;
  n.nw = nw;
  n.inv_nw = 1.f / nw;
  n.ncta = (float)values_cta;
  n.inv_ncta = values_cta > 0 ? count_rcp(n.ncta) : 0.f;
  return n;
}
/* The combination half of cta_ln_stats, for values a thread has already reduced: its values
 * (n.nt of them) have mean base + rel and sum of squared deviations m2t (base a value near
 * them, rel a small offset, so that differences of nearby bases stay exact). The warp is
 * combined relative to lane 0's base, then the warps relative to warp 0's, in warp order: lane
 * r takes warp r's terms and butterflies add them, or (HOW = WARPS_MIXED, up to 8 warps) every
 * thread adds the warps' terms in a loop, as cta_sum_slot. Its two halves, warp_ln_post and
 * cta_ln_merge, serve kernels that combine several rows behind one barrier. */
/* The warp's half: its lanes combined relative to lane 0's base; lane 0 writes the warp's
 * (reference, mean offset, sum of squares, count) to post. */
__device__ __forceinline__ void warp_ln_post(float base, float rel, float m2t, const LnCounts &n,
                                             float (&post)[4]) {
  const float mw = __shfl_sync(0xffffffffu, base, 0);
  const float d = (base - mw) + rel;
  float a[1] = {n.nt * d};
  group_sum<32, 1>(a);
  const float cw = a[0] * n.inv_nw;
  const float e = d - cw;
  float w[1] = {fmaf(n.nt * e, e, m2t)};
  group_sum<32, 1>(w);
  if ((threadIdx.x & 31) == 0)
    *reinterpret_cast<float4 *>(post) = make_float4(mw, cw, w[0], n.nw);
}
/* The CTA's half, after a __syncthreads that follows every warp's post: warps[w] holds warp w's
 * terms for each of the first `nwarps` warps (cta_ln_merge: every warp of the CTA;
 * fwd_spread_kernel's control warp posts none). Every thread gets the same bits. */
template <int HOW = WARPS_LANES>
__device__ __forceinline__ ChunkStats cta_ln_merge_warps(const float (*warps)[4], const LnCounts &n,
                                                         int nwarps) {
  /* The CTA, relative to warp 0's reference: lane r takes warp r's terms. */
  const float ref = warps[0][0];
  ChunkStats st;
  st.ref = ref;
  st.n = n.ncta;
  const int lane = threadIdx.x & 31;
  if (HOW == WARPS_MIXED && nwarps <= 8) {
    float sc = 0.f;
    for (int r = 0; r < nwarps; ++r) {
      const float4 q = *reinterpret_cast<const float4 *>(warps[r]);
      sc += q.w * ((q.x - ref) + q.y);
    }
    st.c = sc * n.inv_ncta;
    float m2 = 0.f;
    for (int r = 0; r < nwarps; ++r) {
      const float4 q = *reinterpret_cast<const float4 *>(warps[r]);
      const float er = ((q.x - ref) + q.y) - st.c;
      m2 += fmaf(q.w * er, er, q.z);
    }
    st.m2 = m2;
    return st;
  }
  float fn = 0.f, dr = 0.f, m2r = 0.f;
  if (lane < nwarps) {
    const float4 q = *reinterpret_cast<const float4 *>(warps[lane]);
    fn = q.w;
    dr = (q.x - ref) + q.y;
    m2r = q.z;
  }
  float sc[1] = {fn * dr};
  group_sum<32, 1>(sc);
  st.c = sc[0] * n.inv_ncta;
  const float er = dr - st.c;
  float m2[1] = {fmaf(fn * er, er, m2r)};
  group_sum<32, 1>(m2);
  st.m2 = m2[0];
  return st;
}
template <int HOW = WARPS_LANES>
__device__ __forceinline__ ChunkStats cta_ln_merge(const float (*warps)[4], const LnCounts &n) {
  return cta_ln_merge_warps<HOW>(warps, n, (int)(blockDim.x >> 5));
}
template <int HOW = WARPS_LANES>
__device__ __forceinline__ ChunkStats cta_ln_combine(float base, float rel, float m2t,
                                                     const LnCounts &n, float (&warp)[2][32][4],
                                                     int &round) {
  const int slot = round & 1;
  ++round;
  warp_ln_post(base, rel, m2t, n, warp[slot][threadIdx.x >> 5]);
  __syncthreads();
  return cta_ln_merge<HOW>(warp[slot], n);
}

/* The moments of the values one thread holds, in two passes over its registers: their mean
 * mt + rel (mt their plain mean, rel the mean of their deviations from it, so that mt + rel keeps
 * bits a large offset would round away) and m2t, their sum of squared deviations from it.
 * x_at(k, e) is value e of vector k (VPT vectors of VEC), zero where mine[k] is false, as the
 * first pass reads it; x_again(k, e) the same value for the second pass; inv_nt the reciprocal of
 * the count of the thread's values. */
template <int VPT, int VEC, typename X, typename X2>
__device__ __forceinline__ void thread_moments(const X &x_at, const X2 &x_again,
                                               const bool (&mine)[VPT], float inv_nt, float &mt,
                                               float &rel, float &m2t) {
  float p[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      p[e & 3] += x_at(k, e);
  mt = ((p[0] + p[1]) + (p[2] + p[3])) * inv_nt;
  float q1[4] = {0.f, 0.f, 0.f, 0.f}, q2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float d = mine[k] ? x_again(k, e) - mt : 0.f;
      q1[e & 3] += d;
      q2[e & 3] = fmaf(d, d, q2[e & 3]);
    }
  const float s1 = (q1[0] + q1[1]) + (q1[2] + q1[3]);
  rel = s1 * inv_nt;
  m2t = ((q2[0] + q2[1]) + (q2[2] + q2[3])) - s1 * rel;
}

/* LayerNorm statistics of the values one CTA holds, with one barrier. Each thread centres its
 * own values on their mean (thread_moments), each warp combines its lanes
 * relative to lane 0's mean, and the warps' (reference, mean offset, sum of squares, count)
 * are combined in warp order: Chan's pairwise-stable update, so no sum of squares is ever taken
 * about a mean far from the data, and differences of nearby means stay exact. x_at, x_again and
 * mine as thread_moments reads them; n holds the counts
 * (ln_counts). Returns the CTA's ChunkStats; every thread gets the same bits. Every thread of
 * the CTA calls it; `round` alternates the slot of `warp`. */
template <int VPT, int VEC, int HOW = WARPS_LANES, typename X, typename X2>
__device__ __forceinline__ ChunkStats cta_ln_stats(const X &x_at, const X2 &x_again,
                                                   const bool (&mine)[VPT], const LnCounts &n,
                                                   float (&warp)[2][32][4], int &round) {
  float mt, rel, m2t;
  thread_moments<VPT, VEC>(x_at, x_again, mine, n.inv_nt, mt, rel, m2t);
  return cta_ln_combine<HOW>(mt, rel, m2t, n, warp, round);
}

/* LayerNorm statistics of a row split over the csize CTAs of a cluster (csize may be 1), in one
 * exchange. Each CTA brings its chunk's ChunkStats (cta_ln_stats); the chunks are combined in
 * rank order relative to rank 0's reference, the same update as inside the CTA, lane-parallel.
 * The CTA's elements are then normalized as ((x - st.ref) - off) * rstd. Every thread of the
 * cluster calls it, in the same round, after a __syncthreads since its previous call. */
struct RowStats {
  float off, rstd, mean;
};
/* The combination half of ln_cluster_stats: slots[r] holds rank r's ChunkStats as (ref, c, m2,
 * n), for r < csize. */
__device__ __forceinline__ RowStats ln_rank_combine(const ChunkStats &cs, const float4 *slots,
                                                    int csize, float inv_n, float eps) {
  float c = cs.c, m2 = cs.m2, mref = cs.ref;
  if (csize > 1) {
    /* Lane r of every warp takes rank r's terms; xor butterflies add them, which gives every
     * lane (and every warp: same inputs, same tree) the same bits. */
    mref = slots[0].x;
    const int r = threadIdx.x & 31;
    float fn = 0.f, dr = 0.f, m2r = 0.f;
    if (r < csize) {
      const float4 q = slots[r];
      fn = q.w;
      dr = (q.x - mref) + q.y; /* rank r's mean, relative to mref */
      m2r = q.z;
    }
    float sc = fn * dr;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      sc += __shfl_xor_sync(0xffffffffu, sc, off);
    c = sc * inv_n;
    const float e = dr - c;
    m2 = fmaf(fn * e, e, m2r);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      m2 += __shfl_xor_sync(0xffffffffu, m2, off);
  }
  float var = m2 * inv_n;
  var = var < 0.f ? 0.f : var; /* not fmaxf: a NaN must stay NaN so the row's rstd shows it */
  RowStats st;
  st.rstd = 1.f / sqrtf(var + eps);
  st.off = c - (cs.ref - mref); /* x - (mref + c) = (x - cs.ref) - off */
  st.mean = mref + c;
  return st;
}
__device__ __forceinline__ RowStats ln_cluster_stats(const ChunkStats &cs, RingRed &red,
                                                     int &xround, int csize, float inv_n,
                                                     float eps) {
  if (csize == 1)
    return ln_rank_combine(cs, nullptr, 1, inv_n, eps);
  const int slot = cluster_exchange(make_float4(cs.ref, cs.c, cs.m2, cs.n), red, xround, csize);
  return ln_rank_combine(cs, red.cta[slot], csize, inv_n, eps);
}

/* The first K components of slots[r] summed over the ranks r < csize, in rank order, so that
 * every CTA reading the same slots gets the same bits: cluster_sum's and cluster_sum2's adding
 * halves, and the backward batch kernel's. */
template <int K>
__device__ __forceinline__ void rank_sums(const float4 *slots, int csize, float (&out)[K]) {
  static_assert(K >= 1 && K <= 4, "a float4's components");
#pragma unroll
  for (int i = 0; i < K; ++i)
    out[i] = 0.f;
  for (int r = 0; r < csize; ++r) {
    out[0] += slots[r].x;
    if constexpr (K > 1)
      out[1] += slots[r].y;
    if constexpr (K > 2)
      out[2] += slots[r].z;
    if constexpr (K > 3)
      out[3] += slots[r].w;
  }
}
/* The sum of slots[r].x over the ranks r < csize, in rank order (the forward's packed rows
 * form calls it after its own exchange). */
__device__ __forceinline__ float rank_sum(const float4 *slots, int csize) {
  float s[1];
  rank_sums<1>(slots, csize, s);
  return s[0];
}
/* RMSNorm: the sum of squares over the cluster, in rank order (csize may be 1). */
__device__ __forceinline__ float cluster_sum(float v, RingRed &red, int &xround, int csize) {
  if (csize == 1)
    return v;
  const int slot = cluster_exchange(make_float4(v, 0.f, 0.f, 0.f), red, xround, csize);
  return rank_sum(red.cta[slot], csize);
}

/* The backward's two row sums over the cluster, in place (csize may be 1): one exchange, then
 * the CTAs' values added, the same bits in every CTA. LANES: by a butterfly (csize a power of
 * two, as the ring's plans make it), lane i taking CTA (i % csize)'s values, the first in lanes
 * 0-15 and the second in 16-31; else every thread in a loop over the CTAs in rank order. Release
 * A/B run AW (H200): the butterfly +1.2 to +3.4 points on 16-bit rows over clusters of 2-16
 * CTAs (LayerNorm 16384 +1.4 to +2; RMSNorm 16384 level); in the fp32 kernels it moved their
 * machine code and lost 2.4 to 5.8 points at N = 4096-8192 and 32768 (also on rows without a
 * cluster; 65536 gained 5.5-6.2): those keep the loop. (Its `if` keeps the kernels' sm_90
 * machine code as it was measured.) */
template <bool LANES>
__device__ __forceinline__ void cluster_sum2(float (&v)[2], RingRed &red, int &xround, int csize) {
  if (csize > 1) {
    const int slot = cluster_exchange(make_float4(v[0], v[1], 0.f, 0.f), red, xround, csize);
    if constexpr (LANES) {
      const float4 c = red.cta[slot][threadIdx.x & (csize - 1)];
      float s = (threadIdx.x & 16) ? c.y : c.x;
#pragma unroll
      for (int off = 8; off > 0; off >>= 1)
        if (off < csize)
          s += __shfl_xor_sync(0xffffffffu, s, off);
      halves_to_both(s, v);
    } else {
      rank_sums<2>(red.cta[slot], csize, v);
    }
  }
}

/* ---- host helpers ---- */
struct DeviceInfo {
  int device;
  int sm_count;
  int cc_major;
  int max_smem_optin; /* bytes of dynamic shared memory a CTA may ask for */
  int smem_per_sm;    /* bytes of shared memory an SM has */
};

} // namespace fnorm_cuda

#endif
