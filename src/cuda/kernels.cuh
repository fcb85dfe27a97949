/*
 * What dispatch.cu hands to the kernel files: kernel parameters, launch plans (made in plan.cu),
 * and the launchers (templates over the activation dtype T and the parameter dtype P, explicitly
 * instantiated in forward.cu and backward.cu for the five supported pairs).
 */
#ifndef FNORM_CUDA_KERNELS_CUH
#define FNORM_CUDA_KERNELS_CUH

#include "common.cuh"

namespace fnorm_cuda {

struct FwdParams {
  const void *x;
  void *y;
  const void *gamma; /* NULL: 1 */
  const void *beta;  /* NULL: 0 */
  float *mean;       /* NULL: not written */
  float *rstd;       /* NULL: not written */
  int64_t rows, cols, x_stride, y_stride;
  float eps;
  int layernorm;
};

struct BwdParams {
  const void *dy;
  const void *xy; /* x, or y when from_y */
  const float *mean;
  const float *rstd;
  const void *gamma;
  const void *beta;
  void *dx; /* NULL: not written */
  int64_t rows, cols, dy_stride, xy_stride, dx_stride;
  int layernorm;
  int from_y;       /* 1: x recomputed from y by IEEE division; 2: by __fdividef */
  int want_dparams; /* dgamma or dbeta requested */
  int ring_fill;    /* bwd_ring_kernel RESIDENT with one stage: Plan::thread_fill */
  /* dgamma/dbeta partials in the workspace: [nparts][cols] for gamma, then the same for beta */
  float *partial;
  int64_t nparts;
};

/* Tiers, by row length: */
enum Tier {
  TIER_WARP = 1,   /* 4..32 lanes a row (backward: up to 8 warps), the row in registers */
  TIER_ROW = 2,    /* a CTA, or a cluster of 2..16 CTAs (sm_90), per row, each CTA owning a chunk
                      of it (Mode says where the chunk lives) */
  TIER_STREAM = 3, /* backward only: rows of any length, in column blocks over several kernels */
  TIER_RING = 4,   /* sm_90, 16-byte vectors: a CTA or cluster per row, rows streamed through a
                      ring of shared-memory stages by bulk copies (nbuf stages) */
  TIER_BATCH = 5   /* sm_90, the rows batch_shape (backward) and fwd_batch_shape (forward) name: a
                      CTA or a cluster per row, persistent, several rows a round behind one
                      barrier (bwd_batch_kernel, fwd_batch_kernel) */
};

/* Where a TIER_ROW CTA keeps its chunk of the row. */
enum Mode {
  MODE_REG = 1,    /* in registers (VPT vectors a thread), the next row prefetched meanwhile */
  MODE_STAGED = 2, /* forward: staged in shared memory (nbuf stages) */
  MODE_GLOBAL = 3, /* forward: re-read from global memory (L2) for each pass */
  MODE_CTA = 4,    /* forward, 16-byte vectors: a CTA per row in registers (vpt vectors a
                      thread), not persistent; resident CTAs overlap the rows */
  MODE_STREAM = 5, /* forward, 16-byte fp32 rows past the register kernel's: each CTA streams
                      its chunk twice, statistics then y */
  MODE_BULK = 6,   /* forward (sm_90), 16-byte rows past the register kernel's: each CTA's chunk
                      copied into shared memory in nbuf pieces, refilled piece by piece with the
                      next row's */
  MODE_LOOP = 7,   /* forward, 16-byte rows: RMSNorm (fp32 2048-4096, and in the full form fp32
                      5120-65536 and 16-bit 8192-65536; fwd_loop_ln_kernel: fp32 LayerNorm
                      8192-32768; tuning builds any): a CTA a row
                      looping over it vpt vectors a thread a step, x read twice
                      (fwd_loop_kernel) */
  MODE_HOLD = 8,   /* forward (sm_90), 16-byte fp32 RMSNorm rows past the register kernel's, not in
                      place: each row held whole in shared memory, cut into `nchunks` chunks
                      over the CTAs of one cooperative launch (fwd_hold_kernel, hold_shape);
                      backward (sm_90), fp32 16-byte rows from x past the ring's RESIDENT
                      form in two stages, likewise (bwd_hold_kernel; `nchunks` the most
                      chunks a row, `nparts` the most rows at a time: its workspace's
                      bounds) */
  MODE_SPREAD = 9  /* forward (sm_90), 16-byte fp32 LayerNorm rows past the register kernel's
                      whose chunk over every SM is 1200-1920 vectors (tuning builds: any row),
                      not in place: one CTA an SM, each owning the same chunk of every row, held
                      in shared memory `nbuf` rows deep, statistics posted through y, y written
                      `variant` rows behind them (fwd_spread_kernel, plan_spread) */
};

/* fwd_loop_kernel's FORM bits (MODE_LOOP: Plan.variant is 8 + FORM where FORM is not 0). */
enum LoopForm {
  kLoopNoL2 = 1,        /* x read with L1 priorities only, no L2 policy (as Triton's loads) */
  kLoopParamsFirst = 2, /* the y pass reads a step's gamma/beta vectors before computing any y */
  kLoopPlainStore = 4,  /* y stored as plain copies the compiler may schedule (no asm store) */
  kLoopFull = 8,        /* 1024 threads (or the count the bits below name) and rows of whole
                           steps (the launcher checks): no tests, a step's vectors at constant
                           offsets from one address */
  kLoopFreeParams = 16, /* gamma/beta read by asm the compiler may issue ahead of y's stores */
  kLoopFull512 = 32,    /* with kLoopFull: 512 threads instead of 1024 */
  kLoopFull256 = 64,    /* with kLoopFull: 256 threads */
  kLoopFull128 = 128,   /* with kLoopFull: 128 threads (tuning builds, eight vectors a step) */
  kLoopFull160 = 256,   /* with kLoopFull: 160 threads (eight vectors a step: fp32 5120) */
  kLoopLn = 512,        /* with kLoopFull: LayerNorm, each thread's step centred on its own mean
                           in registers and combined by Chan's update (thread_moments) */
  kLoopFull320 = 1024,  /* with kLoopFull: 320 threads (fp32 5120 at 4 vectors a step) */
  kLoopFull640 = 2048   /* with kLoopFull: 640 threads (tuning builds: fp32 5120 at 2 vectors) */
};

/* The threads a CTA of fwd_loop_kernel's full form (FORM with kLoopFull) runs. */
constexpr int loop_full_threads(int form) {
  return form & kLoopFull640   ? 640
         : form & kLoopFull320 ? 320
         : form & kLoopFull160 ? 160
         : form & kLoopFull128 ? 128
         : form & kLoopFull256 ? 256
         : form & kLoopFull512 ? 512
                               : 1024;
}
/* Its inverse: the thread bits of the full form at `threads` (128-1024). */
constexpr int loop_full_thread_bits(int threads) {
  return threads == 640   ? kLoopFull640
         : threads == 320 ? kLoopFull320
         : threads == 160 ? kLoopFull160
         : threads == 128 ? kLoopFull128
         : threads == 256 ? kLoopFull256
         : threads == 512 ? kLoopFull512
                          : 0;
}

/* True in developer builds configured with FNORM_TUNING (knobs read from FNORM_TUNE_* variables,
 * experimental kernels built); never in a release build. */
#ifdef FNORM_TUNING
constexpr bool kTuningBuild = true;
/* The value of environment variable `name` as an integer, `fallback` when unset or empty. */
inline int tune_knob(const char *name, int fallback) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}
#else
constexpr bool kTuningBuild = false;
#endif

struct Plan {
  int tier;
  int vec;          /* elements per access: 16 / sizeof(T) on the vector path, else 1 */
  int group;        /* TIER_WARP: lanes per row */
  int vpt;          /* TIER_WARP and MODE_REG: vectors per thread */
  int cluster;      /* TIER_ROW: CTAs per row */
  int cluster_rows; /* TIER_ROW backward: rows a cluster works on at once (cluster of
                       cluster * cluster_rows CTAs) */
  int mode;         /* TIER_ROW: where each CTA's chunk lives (Mode)... */
  int nbuf;         /* ...in 1 buffer, or 2 so that the next row's copy overlaps this row's work;
                       MODE_BULK: the pieces a CTA's chunk is copied in */
  int staged;       /* TIER_WARP forward: rows staged a row ahead in shared memory (cp.async) */
  int reread;       /* MODE_CTA: x read a second time (from L2) for y instead of held: the
                       kernel's registers a thread at most (40 or 48); 0 held */
  int variant;      /* 1 for the second form of the tier's kernel (forward MODE_REG: LayerNorm's
                       statistics behind one barrier; forward MODE_CTA: the lean form,
                       fwd_lean_kernel; backward TIER_RING: RESIDENT, the row kept in the
                       stage); 0 the first. Forward TIER_WARP: the rows a one-warp CTA of
                       fwd_rows_kernel takes at a time (0: fwd_warp_kernel). Forward
                       MODE_LOOP: 8 + fwd_loop_kernel's FORM (LoopForm bits), 0 the plain loop;
                       tuning builds also 1, the PIPE form */
  int min_blocks;   /* MODE_STREAM: CTAs an SM the kernel is built for (4: at most 32
                       registers; tuning builds also 1, its own count, and 2) */
  int hints;        /* MODE_STREAM: 1 to mark x's first read evict-last in L2, its second
                       evict-first */
  int resident;     /* TIER_WARP backward: 1 to launch no more CTAs than fit on the GPU at once */
  int fast_div;     /* backward from y: x recomputed by __fdividef (else IEEE division) */
  int rms_form;     /* backward TIER_WARP and TIER_RING, RMSNorm from x: the kernels' RMS form
                       (no sum of g, no dbeta) where dbeta is not wanted */
  int param_smem;   /* TIER_WARP: gamma/beta read from shared memory (16-byte rows; forward:
                       staged rows); TIER_RING (from y): beta */
  int packed;       /* forward TIER_WARP: 1 for fwd_rows_packed_kernel (16-byte rows of vpt
                       vectors a lane over threads / 32 warps, a row a CTA; packed_rows_shape) */
  int threads;      /* CTA size */
  int carveout;     /* forward MODE_LOOP with smem (fwd_loop_ln_kernel's staged parameters): the
                       shared-memory carve-out asked for, in percent of the SM's shared memory,
                       before the persistent grid is sized; 0: not asked (the largest where
                       there is dynamic shared memory, kernel_attributes) */
  int64_t grid;     /* CTAs launched; negative: persistent, the CTAs (or clusters) resident at
                       once, at most -grid */
  int64_t chunk;    /* TIER_ROW: vectors per CTA; TIER_STREAM: vectors per row chunk */
  size_t smem;      /* dynamic shared memory per CTA */
  int64_t nparts;   /* backward: dgamma/dbeta partial rows */
  int fin_cols;     /* backward: columns a block of the dgamma/dbeta finalize (16 or 32) */
  int fin_pdl;      /* backward (sm_90): the finalize launched as a programmatic dependent of the
                       row kernel (pdl_allow_dependents) */
  int fin_vec;      /* backward: columns a thread of the finalize, 1 or 4 (16-byte loads; rows
                       of a multiple of 4 columns, kFinVecCols and longer) */
  int round_rows;   /* TIER_BATCH: rows a round (nbuf rounds staged; threads, vpt: batch_shape) */
  int thread_fill;  /* TIER_RING RESIDENT with one stage: each thread refills its own vectors of
                       the stage by cp.async as soon as it has read them for dx (else one bulk
                       copy of the chunk once the CTA is done with it) */
  /* TIER_STREAM (backward) */
  int64_t nchunks; /* row chunks per row in the first kernel; forward MODE_HOLD: chunks a row */
  int64_t rows_per_part;                    /* rows per column-pass CTA */
  size_t ws_partial, ws_rowpart, ws_rowsum; /* byte offsets into the workspace */
  size_t ws_bytes;
};

/* Whether a MODE_LOOP plan runs fwd_loop_kernel's full form FORM on rows of `cols` elements in
 * vectors of `vec`: the plan's threads are the form's and the row is whole steps of them. */
inline bool loop_full_fits(const Plan &plan, int form, int64_t cols, int vec) {
  return plan.threads == loop_full_threads(form) &&
         cols % ((int64_t)plan.vpt * plan.threads * vec) == 0;
}

/* Vectors a thread holds in registers in the MODE_REG kernels: 32 elements for the forward,
 * 16 for the backward (which also keeps dgamma/dbeta accumulators); fewer on the one-element
 * path, whose per-element addressing costs registers too. */
constexpr int fwd_reg_vpt(int vec) {
  return vec == 1 ? 16 : 32 / vec;
}
constexpr int bwd_reg_vpt(int vec) {
  return vec == 1 ? 8 : 16 / vec;
}
/* Vectors a thread in the backward ring kernel (16 elements of 16-bit data, 8 of fp32):
 * measured best on an H200 (bench/tune/), against one (too little work a row for its barrier)
 * and four (16-bit accumulators spill). */
constexpr int kRingVpt = 2;
/* ... and for fp32 rows past 16 CTAs of 512 threads of kRingVpt (N > 32768), from x: 4 vectors,
 * 16 elements a thread as on 16-bit rows, so that a row takes a cluster of 8 CTAs, not 16 (an
 * H200 has room for only 7 clusters of 16 CTAs at one CTA an SM: 112 of its 132 SMs), and rows
 * of up to 131072 elements stay in the ring. */
constexpr int kRingVptWide = 4;
/* ... and in its RESIDENT form, which holds only the dgamma/dbeta accumulators:
 * 32 elements. */
constexpr int ring_resident_vpt(int vec) {
  return 32 / vec;
}

/* The forward's rows form (fwd_rows_kernel) for 16-byte rows of nvec vectors (vec elements of
 * elem_bytes): lanes a row and vectors a lane, lanes 0 where it takes none. Rows of 32, 96, 128
 * and 256 vectors over a warp (1, 3, 4, 8 a lane), fp32 rows of 192 (N = 768) too (6 a lane);
 * rows of 64 vectors (fp32 256, 16-bit 512) and 16-bit rows of 32 and 48 (N = 256, 384) over
 * half a warp (4, 2, 3 a lane). Sweeps 69-70 (H200): half-warp rows +0.5 to +5 points over a
 * warp a row (16-bit 256) and +2 to +5 over the warp tier's staged kernel (384); fp32 768 at 6
 * a lane +2. Sweep 100 (H200, 2^27 elements): rows of 64 vectors over half a warp at 2 rows a
 * half, against the whole warp at 2 vectors a lane: LayerNorm fp32 256 96.5% -> 97.3%, bf16
 * 512 95.1% -> 95.9%, bf16 RMSNorm 512 97.0% -> 97.4%, fp32 RMSNorm 256 level (98.2/98.1%);
 * over a quarter of the warp (8 lanes, tuning builds) 0.4 to 4 points slower, save 16-bit
 * LayerNorm 256 (+0.4 at 2 rows a quarter, RMSNorm -1.1). 16-bit rows of 192 vectors (N =
 * 1536) were not measured. */
constexpr void rows_form_shape(int64_t nvec, int vec, int elem_bytes, int &lanes, int &vpl) {
  lanes = vpl = 0;
  if (vec * elem_bytes != 16)
    return;
  if ((elem_bytes == 2 && (nvec == 32 || nvec == 48)) || nvec == 64) {
    lanes = 16;
  } else if (nvec == 32 || nvec == 96 || nvec == 128 || nvec == 256 ||
             (elem_bytes == 4 && nvec == 192)) {
    lanes = 32;
  } else {
    return;
  }
  vpl = (int)(nvec / lanes);
}

/* The forward's packed rows form (fwd_rows_packed_kernel) for 16-byte rows of `cols` elements of
 * elem_bytes with gamma in their dtype: 16-byte vectors a lane (vpl), warps a CTA (wpr) and
 * CTAs a row (cluster: 1, or 2-8 with cl_form below), 0 where it takes none. 16-bit LayerNorm 4096
 * and 5120 over a warp, 8192 over 4 warps, 16384 and 32768 over 8; 16-bit RMSNorm 16384 and 32768
 * over 8; fp32 LayerNorm 5120 over 5 warps and 8192 over 8. launchprobe, the A/B runs of session
 * 29, A/B run CG (RMSNorm 32768) and sweep 83 (16-bit LayerNorm 8192-32768 in other CTA shapes;
 * session 34) (H200) measured these shapes; other lengths were not (fp32 LayerNorm 4096, 16384
 * and 32768 and fp32 RMSNorm 4096-32768 were level or slower in launchprobe). Sweep 83 (tuning
 * build, 2^27 elements, % of the copy): LayerNorm 8192 over 4 warps of 8 vectors a lane 93.6-93.8
 * -> 95.3-95.5 (over 2 of 16 before; over 8 of 4: 94.9-95.1); 16384 over 4 of 16 -1 to -1.2,
 * over 16 of 4 level; 32768 over 16 of 8 bf16 +1.5 (92.6-92.7) but fp16 93.4-93.6 -> 77.1, over
 * 32 of 4 -22 to -24. */
constexpr void packed_rows_shape(bool layernorm, int64_t cols, int elem_bytes, int &vpl, int &wpr,
                                 int &cluster, int cl_form = 0) {
  vpl = wpr = cluster = 0;
  if (elem_bytes == 4) {
    if (layernorm && (cols == 5120 || cols == 8192))
      vpl = 8;
  } else if (elem_bytes == 2 && layernorm) {
    if (cols == 4096 || cols == 32768)
      vpl = 16;
    else if (cols == 5120)
      vpl = 20;
    else if (cols == 8192 || cols == 16384)
      vpl = 8;
  } else if (elem_bytes == 2 && (cols == 16384 || cols == 32768)) {
    vpl = cols == 16384 ? 8 : 16;
  }
  if (vpl) {
    wpr = (int)(cols / ((16 / elem_bytes) * 32 * vpl));
    cluster = 1;
    return;
  }
  /* cl_form 1 (2): 16-bit rows of 2-8 chunks of 16384 (32768) elements not named above, a
   * chunk a CTA of 8 warps of 8 (16) vectors a lane, the row over a cluster (sm_90; plan_forward
   * passes a cl_form there alone: kFwdPackedCl, RMSNorm rows in chunks of 32768, sweeps 76-77).
   * At most 8, the portable cluster size: the grid is launched whole, not sized by an occupancy
   * query (clusters of 16 ran RMSNorm 524288 at 77% of the copy against 72-73%, sweep 76). */
  const int64_t chunk = cl_form == 1 ? 16384 : cl_form == 2 ? 32768 : 0;
  if (elem_bytes == 2 && chunk && cols % chunk == 0 && cols / chunk >= 2 && cols / chunk <= 8) {
    vpl = (int)(chunk / (8 * 32 * 8));
    wpr = 8;
    cluster = (int)(cols / chunk);
  }
}

/* packed_rows_shape's cl_form that plan_forward passes on sm_90 for RMSNorm and LayerNorm rows
 * (tuning builds: FNORM_TUNE_FWD_PACKED_CL and FNORM_TUNE_FWD_PACKED_CL_LN) */
constexpr int kFwdPackedCl = 2, kFwdPackedClLn = 0;

/* fp32 LayerNorm rows of 32768 (with gamma and beta) on fwd_loop_ln_kernel's 1024-thread form,
 * persistent, with the parameters of the first kFwdLoopLnStaged of each thread's eight vectors
 * (12288 of the 32768 columns at 3: 96 KiB of gamma and beta) in shared memory for the launch, so
 * that each row reads 3/8 fewer of them from L2; the carve-out leaves L1 the 128 KiB row x is read
 * again from. Run FC (session 52): without gamma and beta the cell ran 99.2% of the copy against
 * 91.1%, the parameters read again from L2 by every row. A/B run FF (session 53, H200, lead 39,
 * which held this form): 91.2% -> 93.1% at 2^27 elements, 84.1% -> 85.6% at 2^25; lead 39's other
 * forms, the same idea in the packed and RMSNorm loop kernels, lost 5-12 points and were dropped.
 * 0: not taken. */
constexpr int kFwdLoopLnStaged = 3;
/* ... and its dynamic shared memory: kFwdLoopLnStaged 16-byte vectors of gamma and as many of
 * beta for each of the form's 1024 threads (96 KiB at 3). */
constexpr size_t kFwdLoopLnStagedBytes = (size_t)2 * kFwdLoopLnStaged * 1024 * 16;
/* ... and the carve-out plan_forward asks for it, in percent of an SM's smem_per_sm bytes (> 0):
 * the CTA's request (those bytes, the kernel's 2 KiB of static shared memory and the 1 KiB the
 * system keeps a CTA) rounded down, at most 100 (plan_forward says why down). */
constexpr int fwd_loop_ln_staged_carveout(int smem_per_sm) {
  const int64_t pct = ((int64_t)kFwdLoopLnStagedBytes + 3072) * 100 / smem_per_sm;
  return (int)(pct < 100 ? pct : 100);
}

/* ... and the elements (rows * cols) from which it takes them: 2^25 (more than L2 holds); for
 * 16-bit LayerNorm 8192 2^27, since the A/B run of session 29 had it (then over 2 warps) 2 points
 * faster at 16384 rows, level at 8192 and 3.6 slower at 4096. fp32 LayerNorm (A/B run of
 * session 30, H200, release builds, % of the copy): 5120 at 6553 rows 92.5 -> 92.3, 13107 rows
 * 94.0 -> 97.0, 26214 rows 94.7 -> 97.5; 8192 at 4096 rows 91.6 -> 93.5, 8192 rows 93.6 -> 96.0. */
constexpr int64_t packed_rows_min_elements(bool layernorm, int64_t cols, int elem_bytes) {
  return layernorm && cols == 8192 && elem_bytes == 2 ? (int64_t)1 << 27 : (int64_t)1 << 25;
}

/* The backward's batch tier (bwd_batch_kernel, sm_90): 16-bit rows of exactly threads * vpt
 * 16-byte vectors, `rows` of them a round sharing one CTA barrier and the dgamma/dbeta
 * accumulators, `stages` rounds in shared memory. The shapes are the best bwdprobe found
 * (bench/tune/bwdprobe.cu, H200, 2^27 elements, bf16 LayerNorm; % of the copy in the probe's
 * run, where the library's ring had 85.7 and 87.8 in fnbench): 5120 over 320 threads of 2
 * vectors, 4 rows a round (88.7-88.9; 1 row 81.3, 2 rows 82.5, 5 rows 85.1; 160 threads of 4
 * vectors 78.9); 8192 over 256 threads of 4 vectors, 2 rows (89.4-89.9; 512 threads of 2, 1 row
 * 78.5, 2 rows 84.9; 3 rows 79.2; 3 stages 88.4). 16384 in one CTA (512 threads of 4 vectors,
 * a row a round, 3 stages: 86.7-87.5 in the probe against the ring's 83.8) lost 2-3.6 points to
 * the ring in the library at 8192 rows (A/B runs BN2, BN3); with `clustered` (plan_backward says
 * which rows), rows of 16384 take the 8192 shape over a cluster of 2 CTAs, and rows of 32768 and
 * 65536 CTAs of 128 threads of 4 vectors over a cluster of 8 and 16: at about 208 registers two
 * such CTAs share an SM, and one's wait for the cluster's sums overlaps the other's work. A/B runs
 * DT and DU (session 43, H200, release builds, LayerNorm, % of the copy; runs BN4 and DS below
 * it): 32768 over 8 CTAs of 128 threads against 4 of 256, bf16 80.6-80.7 -> 82.3-82.4 and fp16
 * 79.2 -> 81.8-81.9 at 2^27 elements, +1.4 to +2.8 at 2^25-2^26; 16384 over 4 of 128 +0.7 to
 * +0.8 at 2^25 but -1.4 to -1.6 at 2^27 (kept over 2 of 256); 65536 over 16 of 128 against the
 * ring +5.7 to +6.2 at 2^25, +0.8 to +1.1 at 2^26, -4.2 at 2^27 (then the ring's from 2^26).
 * RMSNorm's rows in those shapes ran 4-16 points under the ring's RMS form (run DT), as in run BN4,
 * and keep it. Three stages instead of two (A/B run DS: 8192, and 16384 and 32768 over 2 and 4 CTAs
 * of 256) were 0.5-2.7 points slower. Rows of 65536 take three, each round's second pass a
 * round late so that its exchange overlaps the next round's first pass (bwd_batch_kernel): A/B
 * run FL (session 54, against two stages) bf16 70.8 -> 75.6 at 2^25 and 74.0 -> 79.4 at 2^26,
 * fp16 +4.3 to +6.3; the same form lost 0.5-1.9 points at 16384 and 32768 (run FL) and 0.8-2.5
 * to the ring at 65536 from 2^27 (A/B run FM). Those losses at 2^27 were the clustered forms'
 * stages sitting 16 bytes into a shared-memory line; from a line (smem_on_line, A/B run GA,
 * session 58, H200) 65536 at 2^27 went 83.9 -> 92.0 (bf16) and 83.4 -> 90.8 (fp16) against the
 * ring's, 16384 +6.1 to +6.5 and 32768 +6.1 to +9.4 at 2^25 and 2^27, so every length takes the
 * tier at any size from 2^25. Zero where it has no shape. */
constexpr void batch_shape(int64_t cols, int elem_bytes, int &threads, int &vpt, int &rows,
                           int &stages, int &cluster, bool clustered = true) {
  threads = vpt = rows = stages = cluster = 0;
  if (elem_bytes != 2)
    return;
  if (cols == 5120)
    threads = 320, vpt = 2, rows = 4, stages = 2, cluster = 1;
  else if (cols == 8192)
    threads = 256, vpt = 4, rows = 2, stages = 2, cluster = 1;
  else if (clustered && cols == 16384)
    threads = 256, vpt = 4, rows = 2, stages = 2, cluster = 2;
  else if (clustered && (cols == 32768 || cols == 65536))
    threads = 128, vpt = 4, rows = 2, stages = cols == 65536 ? 3 : 2, cluster = (int)(cols / 4096);
}

/* The forward's batch tier (fwd_batch_kernel, sm_90, rows with gamma in their dtype; plan_forward
 * says from how many elements): its CTAs' threads, vectors a thread, rows a round, stages (3:
 * the deferred y pass) and cluster for rows of `cols` elements of elem_bytes, or zeros where it
 * has no shape. bench/tune/fwdprobe.cu (lead 52, session 58, H200, LayerNorm at 2^27 elements,
 * % of the copy, against run FV's kernels) chose them: bf16 65536 over 8 CTAs of 256 threads,
 * two rows a round, 88.9% (81.3%); fp32 65536 over 8 of 512, two rows a round deferred, 93.8%
 * (85.3%); fp32 262144 over 16 of 512 at 8 vectors a thread, a row a round deferred, 93.8%
 * (85.7%); bf16 262144 over 16 of 512, two rows a round, 77.9% (75.0%). In the library, A/B run
 * GB (H200, release builds, against the kernels these rows took before; % of the copy at 2^25 /
 * 2^27 elements, bf16 then fp16):
 *   LayerNorm 16-bit 65536  +4.0 / +7.6 (80.7-81.4% -> 88.4-88.9%), +2.9 / +7.1;
 *             16-bit 262144 -2.9 / +8.3 (73.5% -> 81.7%), -4.0 / +7.4: from 2^27
 *             (fwd_batch_min_elements; 2^26 not measured);
 *             fp32 65536 +6.2 / +7.2 (85.5% -> 92.7%), 262144 +10.2 / +7.5 (85.5% -> 93.0%);
 *   RMSNorm   16-bit 65536 +2.2 / -5.2, +5.0 / -5.6: the loop kernel's full form keeps it where
 *             it takes it (from 2^26 elements);
 *             16-bit 262144 +7.0 / +10.2 (81.9% -> 92.1%), +6.3 / +10.1;
 *             fp32 65536 +8.9 / +3.4 (89.5% -> 92.9%), 262144 +9.8 / +9.1 (84.9% -> 94.0%).
 * 16-bit LayerNorm 262144 takes three stages, deferred, since session 59: with the kernel's
 * LayerNorm merge in warp 0 alone (lead 53) A/B run GH measured bf16 +8.6 and fp16 +2.2 points
 * at 2^27 over two stages, and A/B run GI, once fp16 gamma and beta were held as whole words
 * (none spilled in the loop), bf16 81.1% -> 90.1%, fp16 82.0% -> 88.3% against the tree before.
 * Before the merge moved, the same form measured +1.6 on bf16 (sweep 111) and +1.4 / -1.8 (A/B run
 * GE). */
constexpr void fwd_batch_shape(int64_t cols, int elem_bytes, bool layernorm, int &threads, int &vpt,
                               int &rows, int &stages, int &cluster) {
  threads = vpt = rows = stages = cluster = 0;
  if (elem_bytes == 2 && cols == 65536)
    threads = 256, vpt = 4, rows = 2, stages = 2, cluster = 8;
  else if (elem_bytes == 2 && cols == 262144) /* (LayerNorm deferred: A/B runs GH and GI) */
    threads = 512, vpt = 4, rows = 2, stages = layernorm ? 3 : 2, cluster = 16;
  else if (elem_bytes == 4 && cols == 65536)
    threads = 512, vpt = 4, rows = 2, stages = 3, cluster = 8;
  else if (elem_bytes == 4 && cols == 262144)
    threads = 512, vpt = 8, rows = 1, stages = 3, cluster = 16;
}
/* fwd_batch_shape as one value (the kernel's template arguments). */
struct BatchShape {
  int threads, vpt, rows, stages, cluster;
};
constexpr BatchShape fwd_batch_shape_of(int64_t cols, int elem_bytes, bool layernorm) {
  BatchShape sh = {0, 0, 0, 0, 0};
  fwd_batch_shape(cols, elem_bytes, layernorm, sh.threads, sh.vpt, sh.rows, sh.stages, sh.cluster);
  return sh;
}
/* Tuning builds (FNORM_TUNE_FWD_BATCH_FORM, Plan::variant): the batch kernel's stages in its other
 * forms: 1 three stages, the y pass not deferred (two rounds in flight); 2 three, deferred; 3 two
 * (not deferred). */
constexpr int fwd_batch_form_stages(int form) {
  return form == 3 ? 2 : 3;
}
/* The elements (rows * cols) from which the forward's batch tier takes its rows: 2^25 (more
 * than L2 holds), 16-bit LayerNorm rows of 262144 2^27 (A/B run GB above). */
constexpr int64_t fwd_batch_min_elements(int64_t cols, int elem_bytes, bool layernorm) {
  return layernorm && elem_bytes == 2 && cols == 262144 ? (int64_t)1 << 27 : (int64_t)1 << 25;
}

/* Rows a one-warp CTA of the forward's fwd_rows_kernel takes at a time (at 16 lanes a row: each
 * half-warp), for rows of vpl 16-byte vectors a lane. Sweep 63 (H200, 2^27 elements), a warp a
 * row: best at four vectors a lane in all (LayerNorm; RMSNorm at eight), LayerNorm at four
 * vectors a lane of one row also two rows (16-bit 1024: 96.6% against 96.3%). Sweep 69: 3
 * vectors a lane 2 rows (+0.2 to +0.5 over 1 and 4), 8 a lane 1 row (2 lost 2.5, 4 lost 25);
 * half-warp rows 4 (+0.2 to +1 over 2; sweep 70 at 576000 rows of 384 +0.1 to +0.4). Sweep 70:
 * 6 a lane 1 row (+0.4 to +0.5 over 2). Sweep 100: half-warp rows of 4 a lane 2 rows (+1.7 to
 * +3.9 points over 4, +0.3 to +0.9 over 1). */
constexpr int fwd_rows_per_cta(bool rms, int lanes, int vpl) {
  if (lanes == 16)
    return vpl == 4 ? 2 : 4;
  return vpl == 1 ? (rms ? 8 : 4) : vpl == 2 ? (rms ? 4 : 2) : vpl >= 6 ? 1 : 2;
}

/* The forward MODE_SPREAD kernel (fwd_spread_kernel): vectors a thread (16 fp32 values of gamma
 * and of beta held in registers), data threads a CTA, CTAs (a lane combines up to 8 CTAs' words),
 * the fewest vectors a chunk (A/B run GO, H200: fp32 LayerNorm chunks of 1521 vectors gained 15
 * points, of 993 lost 2-5: a row costs about a microsecond beyond its bytes) and the most
 * stages. */
constexpr int fwd_spread_vpt(int vec) {
  return vec == 4 ? 4 : 2;
}
/* (data threads; with the control warp 512, 128 registers a thread) */
constexpr int kSpreadMaxThreads = 480;
constexpr int kSpreadMaxWords = 8;
constexpr int64_t kSpreadMaxCtas = 32 * kSpreadMaxWords;
constexpr int64_t kSpreadMinChunk = 1200;
constexpr int kSpreadMaxStages = 8;

/* Most pieces the forward MODE_BULK kernel copies a CTA's chunk in (its mbarriers). */
constexpr int kBulkMaxPieces = 8;

/* The forward MODE_HOLD kernel: threads a CTA at two CTAs an SM (tuning builds also 256 at four:
 * FNORM_TUNE_FWD_HOLD_SM), the parts a chunk is copied in, and what a round of a CTA (its post,
 * its wait for the row's other chunks) costs, in vectors of the chunk (about 2 us of a CTA's share
 * of the DRAM bandwidth), for hold_shape's choice. */
constexpr int kHoldThreads = 512;
/* Eight parts, not four (at about 6000 vectors a chunk, parts of two rounds of the threads instead
 * of three): each part's y frees its stage for the next row's part sooner, less of the last part's
 * copy is exposed before the statistics, and y's batches wait on L2 for gamma six times a row
 * instead of eight (bench/RESULTS.md, lead 23). Sweep 105 and A/B run EF
 * (H200, session 46): fp32 RMSNorm +1.7 to +5.1 points (64 x 802816: 62.6% -> 66.7% of the copy);
 * two parts (against four) -0.6 to +1.4, four CTAs an SM of half the chunk with eight parts within
 * a point of this. Sixteen parts (one round of the threads each, 12-14 a chunk, a barrier each, and
 * a part's gamma loads one vector ahead of its stores) lost 9-18 points (A/B run EG). */
constexpr int kHoldParts = 8;
constexpr int64_t kHoldRoundVecs = 2048;
/* How fwd_hold_kernel cuts rows of nvec vectors over `ctas` CTAs resident at once, each holding
 * at most `cap` vectors: `pieces` chunks a row of `chunk` vectors (the last one possibly
 * shorter), `slots` rows at a time (a launch of pieces * slots CTAs). The cut with the least
 * time by rounds * (chunk + kHoldRoundVecs), the fewest pieces among equals; every chunk holds
 * at least pieces + 1 vectors (the statistics' posts and their count). False if none fits. */
struct HoldShape {
  int pieces;
  int slots;
  int64_t chunk;
};
bool hold_shape(int64_t nvec, int64_t rows, int64_t ctas, int64_t cap, HoldShape *hs);
/* The backward's hold tier (bwd_hold_kernel, sm_90): vectors a thread at per_sm CTAs an SM of
 * kHoldThreads with `stages` stages (one stage: 32 elements a thread at one CTA an SM, as the
 * ring's RESIDENT form, 16 at two; two stages, tuning builds: four vectors, which two stages of
 * at one CTA an SM fit in shared memory), and the shared memory a vector of its chunk takes: dy
 * and x a stage, and gamma's fp32 values. */
constexpr int bwd_hold_vpt(int vec, int per_sm, int stages) {
  return stages == 2 ? 4 : 32 / vec / per_sm;
}
constexpr int bwd_hold_vec_bytes(int vec, int stages) {
  return stages * 2 * 16 + vec * 4;
}
/* ... and the least chunk (vectors a CTA) at which release builds plan it: its wait for the other
 * chunks' posts and its two passes cost about as much a row whatever the chunk, so short chunks
 * pay more of them a byte. A/B runs EJ-EL (H200, fp32, release): cuts of 3972-4096 vectors a
 * chunk (N = 196608, 262144, 1048576) gained 1.3-15.4 points, the cut of 3041 (802816) LayerNorm
 * -0.8 to -1.9 and RMSNorm +0.6 to +1.5 against the stream tier; the line lies between. */
constexpr int64_t kBwdHoldMinChunk = 7 * kHoldThreads;
/* The vectors a MODE_HOLD CTA may hold at per_sm CTAs an SM: its share of the SM's shared memory,
 * less its reserved and static shared memory (4 KiB together), in 16-byte vectors. */
constexpr int64_t hold_cap_vecs(int smem_per_sm, int per_sm = 2) {
  return ((int64_t)smem_per_sm / per_sm - 4096) / 16;
}

/* The dgamma/dbeta finalize reads four columns a thread (16-byte loads) from rows of this many
 * columns on (a multiple of 4): there the partial rows are few and long, and one 4-byte load a
 * thread left the finalize at about a third of the copy's speed (ncu, session 53, H200: 15.8 us
 * for the 8 partial rows of bf16 LayerNorm 512 x 262144). Shorter rows have many partial rows
 * and few columns, where four columns a thread would leave too few CTAs. */
constexpr int64_t kFinVecCols = 16384;

/* Vectors a thread in the forward MODE_CTA kernel: kCtaMinVpt (8 elements), twice or four
 * times that. */
template <typename T> constexpr int kCtaMinVpt = 8 * (int)sizeof(T) / 16;

template <typename T, typename P>
fnorm_status launch_forward(const Plan &plan, const FwdParams &a, cudaStream_t stream);
/* fallback: the plan to run instead where `plan`'s row kernels cannot be launched (the backward's
 * hold tier, whose cooperative launch the device may refuse), or NULL. */
template <typename T, typename P>
fnorm_status launch_backward(const Plan &plan, BwdParams a, void *dgamma, void *dbeta,
                             void *workspace, cudaStream_t stream, const Plan *fallback = nullptr);

/* plan.cu: the plans (host code, no CUDA calls). `vec` is choose_vec's width: 16 / element bytes
 * where every pointer and stride allows 16-byte access and the row length is a multiple of it,
 * else 1. backward_workspace_bytes is the workspace query's answer, for either width. */
/* hold: MODE_HOLD may be planned (it posts its statistics through y, so not where y is x, and
 * not again after the device refused its cooperative launch). gamma_beta: both gamma and beta are
 * given (forms that keep them in shared memory for the launch are planned only then). */
Plan plan_forward(const fnorm_problem *p, int vec, const DeviceInfo &dev, bool hold = true,
                  bool gamma_beta = true);
/* from_y: the backward is given y, not x (plan_backward_from_y then completes the plan). hold:
 * MODE_HOLD may be planned (not again after the device refused its cooperative launch).
 * fallback (where not NULL): where the plan takes the hold tier, set to the plan without it,
 * which the dispatch runs if the device refuses the cooperative launch (the plan's workspace
 * covers both); left as it is otherwise. */
Plan plan_backward(const fnorm_problem *p, int vec, const DeviceInfo &dev, bool from_y,
                   bool hold = true, Plan *fallback = nullptr);
/* The backward from y: the ring then keeps LayerNorm's beta (when given) in shared memory
 * where it fits (param_smem). */
void plan_backward_from_y(Plan &pl, const fnorm_problem *p, bool has_beta, const DeviceInfo &dev);
int choose_vec(const fnorm_problem *p, const void *const *rows_ptrs, const int64_t *strides,
               int nrows_ptrs, const void *const *params, int nparams);
size_t backward_workspace_bytes(const fnorm_problem *p, const DeviceInfo &dev);

/* The attributes a launch with `smem` bytes of dynamic shared memory and clusters of
 * `cluster` CTAs needs. Dynamic plus static shared memory above 48 KiB needs the opt-in; it is
 * set whenever there is dynamic memory, which is cheap and never wrong. The largest carve-out
 * is asked for too: otherwise the driver may pick a smaller one than the occupancy
 * calculation assumed, and a persistent grid would run in two waves. */
template <typename... KArgs>
fnorm_status kernel_attributes(void (*kernel)(KArgs...), size_t smem, int cluster) {
  if (smem > 0 && (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem) != cudaSuccess ||
                   cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared) != cudaSuccess)) {
    cudaGetLastError();
    return FNORM_ERR_CUDA;
  }
#ifdef FNORM_TUNING
  /* Tuning builds: FNORM_TUNE_CARVEOUT (0-100) asks every kernel for that carve-out, in percent
   * of the most shared memory (0: the largest L1), in place of the driver's choice (no dynamic
   * shared memory) or the largest (sweeps 88-89). */
  const int carveout = tune_knob("FNORM_TUNE_CARVEOUT", -1);
  if (carveout >= 0 && carveout <= 100 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout) !=
          cudaSuccess) {
    cudaGetLastError();
    return FNORM_ERR_CUDA;
  }
#endif
  if (cluster > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                          1) != cudaSuccess) {
    cudaGetLastError();
    return FNORM_ERR_CUDA;
  }
  return FNORM_SUCCESS;
}

/* A launch configuration of `grid` CTAs, with a cluster dimension when cluster > 1 (in attr,
 * which must outlive cfg). */
inline void launch_config(cudaLaunchConfig_t &cfg, cudaLaunchAttribute (&attr)[1], int64_t grid,
                          int threads, size_t smem, int cluster, cudaStream_t stream) {
  cfg = cudaLaunchConfig_t{};
  cfg.gridDim = dim3((unsigned)grid, 1, 1);
  cfg.blockDim = dim3((unsigned)threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  if (cluster > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
}

/* Clusters (or CTAs, when cluster == 1) of `kernel` that can be resident on the device at once,
 * at most max_units: the size of a persistent launch. The kernel's attributes for smem and
 * cluster (kernel_attributes) must be set already: the occupancy calculation reads them. */
template <typename... KArgs>
fnorm_status persistent_units(void (*kernel)(KArgs...), int threads, size_t smem, int cluster,
                              int64_t max_units, int64_t *units) {
  int resident = 0;
  if (cluster > 1) {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
    launch_config(cfg, attr, cluster, threads, smem, cluster, nullptr);
    if (cudaOccupancyMaxActiveClusters(&resident, kernel, &cfg) != cudaSuccess) {
      cudaGetLastError();
      return FNORM_ERR_CUDA;
    }
  } else {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) !=
            cudaSuccess) {
      cudaGetLastError();
      return FNORM_ERR_CUDA;
    }
    resident = per_sm * sms;
  }
  if (resident < 1)
    return FNORM_ERR_UNSUPPORTED; /* the configuration cannot run on this device */
  *units = resident < max_units ? resident : max_units;
  return FNORM_SUCCESS;
}

/* The CTAs of `kernel` (no cluster) resident at once at `threads` threads and `smem` bytes of
 * dynamic shared memory, its attributes set first: what a cooperative launch may take. */
template <typename... KArgs>
fnorm_status resident_ctas(void (*kernel)(KArgs...), int threads, size_t smem, int64_t max_ctas,
                           int64_t *ctas) {
  if (kernel_attributes(kernel, smem, 1) != FNORM_SUCCESS)
    return FNORM_ERR_CUDA;
  return persistent_units(kernel, threads, smem, 1, max_ctas, ctas);
}

/* Launch a kernel by a configuration launch_config made; returns FNORM_ERR_CUDA on any failure. */
template <typename... KArgs, typename... Args>
fnorm_status launch_configured(const cudaLaunchConfig_t &cfg, void (*kernel)(KArgs...),
                               Args... args) {
  if (cudaLaunchKernelEx(&cfg, kernel, args...) != cudaSuccess) {
    cudaGetLastError(); /* a launch error is not sticky: clear it so later calls start clean */
    return FNORM_ERR_CUDA;
  }
  return cudaGetLastError() == cudaSuccess ? FNORM_SUCCESS : FNORM_ERR_CUDA;
}

/* A cooperative launch (every CTA resident at once, which a grid-wide barrier and waits on other
 * CTAs' posts need; no cluster) of `grid` CTAs of a kernel whose attributes for smem are set
 * already (kernel_attributes); returns FNORM_ERR_CUDA on any failure, the device's refusal
 * included. */
template <typename... KArgs, typename... Args>
fnorm_status launch_cooperative(void (*kernel)(KArgs...), int64_t grid, int threads, size_t smem,
                                cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr[1];
  launch_config(cfg, attr, grid, threads, smem, 1, stream);
  attr[0].id = cudaLaunchAttributeCooperative; /* (no cluster: the one attribute) */
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return launch_configured(cfg, kernel, args...);
}

/* Launch `grid` CTAs (> 0) of a kernel whose attributes for smem and cluster
 * (kernel_attributes) are set already; returns FNORM_ERR_CUDA on any failure. */
template <typename... KArgs, typename... Args>
fnorm_status launch_prepared(void (*kernel)(KArgs...), int64_t grid, int threads, size_t smem,
                             int cluster, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr[1];
  launch_config(cfg, attr, grid, threads, smem, cluster, stream);
  return launch_configured(cfg, kernel, args...);
}

/* Launch a kernel with a cluster dimension (when cluster > 1), dynamic shared memory and
 * the attributes both need; returns FNORM_ERR_CUDA on any failure. A negative grid asks for
 * a persistent launch: as many clusters as can be resident at once, at most -grid. */
template <typename... KArgs, typename... Args>
fnorm_status launch_kernel(void (*kernel)(KArgs...), int64_t grid, int threads, size_t smem,
                           int cluster, cudaStream_t stream, Args... args) {
  if (kernel_attributes(kernel, smem, cluster) != FNORM_SUCCESS)
    return FNORM_ERR_CUDA;
  if (grid < 0) {
    int64_t units = 0;
    const fnorm_status st = persistent_units(kernel, threads, smem, cluster, -grid, &units);
    if (st != FNORM_SUCCESS)
      return st;
    grid = units * cluster;
  }
  return launch_prepared(kernel, grid, threads, smem, cluster, stream, args...);
}

} // namespace fnorm_cuda

#endif
