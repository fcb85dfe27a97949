/*
 * CUDA planning: how a problem maps to a tier, a kernel shape and a launch (vector width, lanes
 * or CTAs a row, grid, shared memory, workspace), from the problem, the pointers' alignment and
 * the device's properties alone. Host code without CUDA calls, so that tests/test_plan.cu checks
 * the plans' invariants on machines without a GPU. The choices are measured on an H200
 * (bench/tune/); every ladder ends in a plan the launchers know, or in FNORM_ERR_UNSUPPORTED
 * there.
 */
#include <stdlib.h>

#include "kernels.cuh"

using namespace fnorm_cuda;

namespace {

const int64_t kMaxGrid = 0x7fffffff;

size_t dtype_bytes(fnorm_dtype t) {
  return t == FNORM_DTYPE_F32 ? 4 : 2;
}

bool aligned(const void *p, size_t a) {
  return p == nullptr || ((uintptr_t)p % a) == 0;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}
int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

/* Threads for a CTA that walks `chunk` vectors, `per_thread` vectors a thread. */
int row_threads(int64_t chunk, int64_t per_thread) {
  return (int)min64(512, max64(64, round_up(ceil_div(chunk, per_thread), 32)));
}

/* Bytes of shared memory a staged CTA aims for (beyond that, rows are split over a cluster):
 * about three resident CTAs an SM. */
const int64_t kStageTarget = 64 * 1024;
const int kMaxThreads = 512;

/* Smallest power-of-two cluster (<= max_cluster) whose chunks hold at most cap vectors; then
 * larger while there are too few rows to fill the GPU and the chunks stay sizeable. */
int split_rows(const fnorm_problem *p, int64_t nvec, int64_t cap, int max_cluster,
               const DeviceInfo &dev) {
  int c = 1;
  while (c < max_cluster && ceil_div(nvec, c) > cap)
    c *= 2;
  while (c < max_cluster && p->rows * c < 2 * (int64_t)dev.sm_count && ceil_div(nvec, 2 * c) >= 256)
    c *= 2;
  return c;
}

/* Knobs of the backward ring tier and the forward CTA tier. The defaults are the library's choices,
 * measured on an H200 (bench/tune/); a build with FNORM_TUNING (a developer option, never a release
 * build) reads overrides from FNORM_TUNE_* environment variables, so one benchmark run on a GPU can
 * sweep them (scripts/tune_sweep.sh). */
struct Tuning {
  int ring;             /* 0: never; 1: rows longer than the warp tier's; 2: from 32 vectors on */
  int stages;           /* stages of the ring, at most */
  int stages_640;       /* ... for 16-bit rows of 513-640 vectors (N = 4097-5120) */
  int threads;          /* threads a CTA, at most */
  int cap;              /* vectors a CTA, preferably at most (a cluster beyond) */
  int cap_4k;           /* the same for rows of 2049-4096 vectors */
  int min_rows;         /* rows a persistent CTA (or cluster) gets at least, when M is small */
  int bwd_warps;        /* backward warp tier: warps a row at most on 16-byte rows (1, 2, 4, 8) */
  int bwd_fill4;        /* ... 16-bit rows take 4 warps only past this many sixteenths of them */
  int bwd_fill8;        /* ... and 8 warps only past this many sixteenths of them */
  int bwd_resident;     /* ... 1: its grid at most the CTAs resident at once, 0: 4 an SM */
  int bwd_param_smem;   /* ... 1: rows of a warp or more read gamma/beta from shared memory, 0:
                           all from global memory (tuning builds only) */
  int bwd_warp_cluster; /* ... 1: fp32 rows past 8 warps, up to 8 x 8 warps, over a cluster of
                           8-warp CTAs (sm_90), from bwd_cluster_rows rows on; 0: never (the
                           ring); 2 (tuning builds): 16-bit rows too, clusters of up to 16 */
  int bwd_cluster_rows; /* ... rows at least */
  int bwd_ring_beta;    /* backward ring from y: 1 beta from shared memory where it fits, 0 never */
  int bwd_fin_cols;     /* dgamma/dbeta finalize: columns a block, 16 or 32; 0: 16 for rows
                           shorter than 8 columns an SM, else 32 */
  int fwd_cta;          /* forward: 1 to use the CTA-per-row kernel where it fits, 0 never */
  int fwd_ept;         /* forward CTA-per-row kernel: elements a thread, preferably (8, 16 or 32) */
  int fwd_ept_ln32;    /* the same for fp32 LayerNorm rows of up to 4096 elements */
  int fwd_staged;      /* forward warp tier: 1 to stage rows a row ahead where it pays, 0 never */
  int fwd_staged_rows; /* ... when each warp of a full grid gets at least this many rows */
  int fwd_stream;      /* forward streaming kernel (MODE_STREAM): 1 for fp32 rows past the register
                          kernel's, 2 for all dtypes' rows past it, 3 also for its cluster rows, 0
                          never */
  int fwd_param_smem;  /* forward warp tier: 1 reads gamma and beta from shared memory on staged
                          fp32 rows and staged 16-bit LayerNorm rows; 0 never; 2 (tuning builds):
                          on all 16-byte rows (sweep 29's 1) */
  int fwd_reread;      /* forward CTA-per-row kernel: 1 reads x again for y on fp32 RMSNorm rows
                          of up to 8192 the loop kernel does not take; 0 never; 2 (tuning
                          builds) on all its rows */
  int fwd_reread_regs; /* ... its registers a thread at most (tuning builds: 32, 40, 48 or 64; 0 the
                          rule's) */
  int fwd_stream_minb; /* forward streaming kernel: CTAs an SM it is built for, 4 (at most 32
                          registers; tuning builds also 1, its own count, and 2) */
  int fwd_stream_hints;   /* ... 1: x's first read evict-last in L2, the second evict-first; 0:
                             both at normal priority */
  int fwd_stream_threads; /* ... threads a CTA (tuning builds: 128 to 512; 0 the rule's) */
  int fwd_warp_threads;   /* forward warp tier (tuning builds): threads a CTA (32 to 256; 0 the
                             rule's) */
  int fwd_warp_persist;   /* ... 2: 16-byte rows of a warp and fp32 rows take one-warp CTAs, not
                             persistent, the rest persistent CTAs (at most fwd_warp_grid an SM,
                             each looping over rows); 1: all persistent; 0: none */
  int fwd_warp_grid;      /* ... persistent CTAs an SM at most (0: the rule's, 48 or 32;
                             tuning builds 1 to 256) */
  int bwd_fast_div;   /* backward from y: x = (y - beta) / gamma by __fdividef on 16-bit rows (1),
                         on all rows (2), or by IEEE division (0) */
  int fwd_reg_onebar; /* forward register kernel: 1 fp32 LayerNorm's chunk statistics behind one
                         barrier (cta_ln_stats) in CTAs of more than 256 threads, 0 never (two sums
                         behind two); 2 (tuning builds) on all LayerNorm rows */
  int bwd_ring_resident;    /* backward: rows past the register ring's take its RESIDENT form (the
                               row kept in the stage) when from x and 1.5 rows an SM or more
                               (1); never (0, the stream tier); 2 (tuning builds) all of them */
  int bwd_resident_first;   /* ... 1: that form before the register ring, where the warp tier
                               does not fit, on the same rows (16-bit, from x, 1.5 rows an SM)
                               when their gamma is fp32; 0: never; 2 (tuning builds): whatever
                               gamma's dtype (and all rows with bwd_ring_resident 2) */
  int bwd_resident_threads; /* ... threads a CTA at most in that case (a multiple of 32, 64 to
                               512); rows past the register ring's always take up to 512 */
  int fwd_rms16_long;       /* forward: 1 sends 16-bit RMSNorm rows past 20480 that the lean form
                               does not take (fwd_lean 0) to the register
                               kernel, not the CTA-per-row kernel; 0 (tuning builds) never */
  int fwd_lean;             /* forward: the CTA-per-row kernel's lean form (fwd_lean_kernel, two
                                   CTAs an SM): 1 on the rows plan_forward names, 0 never; tuning
                                   builds: 2 on all RMSNorm rows, 3 on all rows, at fwd_ept
                                   elements a thread */
  int bwd_rms;              /* backward: RMSNorm without dbeta on the warp tier's and the ring's
                               kernels of their own: 1 where plan_backward says, 0 never, 2
                               (tuning builds) always */
  int fwd_bulk;             /* forward: rows past the register kernel's take the bulk-copy kernel
                               (MODE_BULK, sm_90) where a CTA's shared memory holds their chunk:
                               1 16-bit rows of more than 65536 vectors, 2 (tuning builds) all
                               16-byte rows, 3 (tuning builds) also the register kernel's past
                               32768 elements, 0 never */
  int fwd_bulk_pieces;      /* ... the pieces a chunk is copied in (1 to 8) */
  int fwd_lean_cl;          /* forward (sm_90): 16-byte rows longer than one CTA of the lean form
                               holds take it over a cluster: 1 the 16-bit rows plan_forward
                               names, persistent; tuning builds: all 16-byte rows,
                               2 a cluster a row, 3 persistent; 0 never */
  int fwd_lean_cl_threads;  /* ... threads a CTA at most (tuning builds: 64 to 1024; else 512) */
  int fwd_rows;             /* forward: 1 takes the 16-byte rows rows_form_shape names with 256
                               rows an SM and 2^25 elements to fwd_rows_kernel (fwd_rows_per_cta
                               rows a one-warp CTA), 0 never; tuning builds: 11, 12, 14, 18 take
                               all such rows (any rows, any gamma) at 1, 2, 4, 8 rows a CTA */
  int bwd_ring_more;        /* backward from x (sm_90), since the ring's split row sums: 1 the
                               ring also takes fp32 rows past 1024 vectors, fp32 rows of 1024
                               from 8192 rows and 16-bit RMSNorm rows of 256 or more from 32768
                               rows, where the warp tier fits; keeps 2 stages for 16-bit
                               RMSNorm rows of 513-640 vectors, and takes 16-bit rows with fp32
                               gamma past 640 vectors in its register form, not RESIDENT; 0 none
                               of these (the rules before sweep 64) */
  int bwd_cap_640;          /* backward ring (sm_90), 16-bit LayerNorm rows of 513-640 vectors
                               from x with 16-bit gamma: vectors a CTA at most (320: a cluster
                               of 2 CTAs of 160 threads, 3 an SM, not one CTA of 320 threads) */
  int bwd_stages_1k;        /* ... and its rows of 641-1024 vectors: stages (3) */
  int bwd_ring_vpt4;        /* backward ring (sm_90), fp32 rows of more than 8192 vectors from
                               x: 1 four vectors a thread (kRingVptWide), 0 two (kRingVpt);
                               2 (tuning builds) from 2049 vectors */
  int fwd_rows_lanes;       /* tuning builds with fwd_rows 11-18: lanes a row of fwd_rows_kernel
                               (32, 16: each half-warp its own rows, or 8: each quarter, rows
                               of 32 or 64 vectors), 0 rows_form_shape's */
  int fwd_rows_packed;      /* forward: 1 takes the rows packed_rows_shape names, with gamma in
                               their dtype, from packed_rows_min_elements, to
                               fwd_rows_packed_kernel; 0 never */
  int bwd_fin_pdl;          /* backward (sm_90): 1 the finalize a programmatic dependent launch,
                               0 an ordinary one */
  int bwd_batch;            /* backward (sm_90), from x, 16-bit rows batch_shape names with gamma
                               in their dtype, from 2^25 elements: 2 LayerNorm and RMSNorm rows
                               take the batch tier, 1 LayerNorm rows only, 0 none */
  int bwd_batch_cl;         /* ... 1 also LayerNorm rows of 16384, 32768 and 65536 over a
                               cluster (batch_shape), 2 RMSNorm rows too, 0 none */
  int fwd_packed_cl;        /* forward (sm_90): packed_rows_shape's cl_form for 16-bit RMSNorm
                               rows of 2-8 chunks over a cluster (1 chunks of 16384, 2 of
                               32768), 0 none */
  int fwd_packed_cl_ln;     /* ... for 16-bit LayerNorm rows */
  int bwd_resident_fill;    /* backward ring's RESIDENT form with one stage: 1 each thread refills
                               its own vectors of the stage with the next row's by cp.async as
                               soon as it has read them for dx; 0 one bulk copy after the row */
  int fwd_loop;             /* forward: -1 the rule (fp32 RMSNorm 2048-4096 on fwd_loop_kernel),
                               0 never; tuning builds 1, 2, 4 or 8: every 16-byte RMSNorm row
                               past the warp tier on it, that many vectors a thread a step */
  int fwd_loop_threads;     /* ... threads a CTA (64 to 1024; the default 1024) */
  int fwd_loop_pipe;        /* ... tuning builds: 1 the form with two steps in flight */
  int fwd_loop_form;        /* ... tuning builds: fwd_loop_kernel's FORM (LoopForm bits) at 1,
                               2, 4 or 8 vectors a step (1 no L2 policy, 2 gamma/beta read first, 4 plain
                               stores, 8 full, 16 free parameter loads, 32, 64, 128, 256,
                               1024 and 2048 the full form at 512, 256, 128, 160, 320 and 640
                               threads; forms 1, 2, 4, 8, 16, 24, 25, 28, 56, 88, 152, 280,
                               1048 and 2072 built); with 512
                               (kLoopLn) LayerNorm rows of whole steps on fwd_loop_ln_kernel
                               (forms 536, 568, 600, 664 and 792 with FNORM_TUNE_FWD_LOOP=8
                               and the threads the form names; steps of 32 values); 0 the
                               planned form */
  int fwd_loop_smem;        /* ... tuning builds: dynamic shared memory (bytes, unused) a CTA asks
                               for, to hold CTAs an SM down so that their rows stay in L1 */
  int fwd_reg_wide;         /* forward register kernel (MODE_REG), tuning builds: 1 takes fp32
                               rows at 4 vectors a thread in CTAs of up to 1024 threads (64
                               registers, twice the warps at the same bytes: lead 18 after
                               ncu25) instead of 8 in up to 512; 0 the planned form */
  int fwd_hold;             /* forward (sm_90): fp32 RMSNorm rows past the register kernel's,
                               not in place, held whole on chip over one cooperative launch
                               (MODE_HOLD) where hold_shape finds a cut: 1; 0 never (the
                               streaming kernel); 2 (tuning builds) the 16-byte rows of every
                               dtype and norm past it; 3 (tuning builds) also the register
                               kernel's past 32768 elements */
  int fwd_hold_sm;          /* ... CTAs an SM: 2 (512 threads); tuning builds also 4 (256) */
  int fwd_hold_parts;       /* ... the parts a chunk is copied in (tuning builds: 1 to 8) */
  int bwd_hold;             /* backward (sm_90): fp32 16-byte rows from x that would take the
                               ring's RESIDENT form in one stage or the stream tier, held whole
                               on chip over one cooperative launch (bwd_hold_kernel, MODE_HOLD)
                               where hold_shape finds a cut: 1; 0 never; 2 (tuning builds) the
                               16-byte rows from x of every dtype from 65536 elements, and those
                               that would take the stream tier */
  int bwd_hold_sm;          /* ... CTAs an SM: 1; tuning builds also 2 (one stage) */
  int bwd_hold_stages;      /* ... stages: 1; tuning builds also 2 (the next row's copy in flight
                               through this row's work, at four vectors a thread) */
  int bwd_fin_vec_cols;     /* dgamma/dbeta finalize: four columns a thread (16-byte loads of the
                               partial rows) for rows of this many columns or more that are a
                               multiple of 4; 0 never */
  int fwd_batch;            /* forward (sm_90): the batch tier on the rows fwd_batch_shape names
                               (fwd_batch_kernel): 1; 0 never (their other kernels) */
  int fwd_batch_form;       /* ... tuning builds: its stage form (fwd_batch_form_stages: 1 three
                               stages, 2 three deferred, 3 two); 0 fwd_batch_shape's */
  int fwd_spread;           /* forward (sm_90): fp32 LayerNorm rows past the register kernel's,
                               not in place, spread over every SM (fwd_spread_kernel,
                               MODE_SPREAD) where plan_spread finds a cut: 1; 0 never (their
                               other kernels); 2 (tuning builds) every 16-byte row it takes */
  int fwd_spread_stages;    /* ... tuning builds: its stages (3-8); 0 plan_spread's */
  int fwd_spread_defer;     /* ... tuning builds: the rows y waits behind the statistics; 0
                               plan_spread's */
};

Tuning tuning() {
  /* the fields in order (the table kept by hand) */
  // clang-format off
  Tuning t = {1,  2,   3, 512, 1024, 512, 16,   8, 9,   11, 1, 1,   1, 4096,       1, 0, 1,
              32, 16,  1, 4,   1,    1,   1,    0, 4,   1,  0, 0,   2, 0,          1, 1, 1,
              1,  128, 1, 1,   1,    1,   4,    1, 512, 1,  1, 320, 3, 1,          0, 1, 1,
              2,  1,   0, 0,   1,    -1,  1024, 0, 0,   0,  0, 1,   2, kHoldParts, 1, 1, 1,
              (int)kFinVecCols, 1, 0, 1, 0, 0};
  // clang-format on
  t.fwd_packed_cl = kFwdPackedCl;
  t.fwd_packed_cl_ln = kFwdPackedClLn;
#ifdef FNORM_TUNING
  t.ring = tune_knob("FNORM_TUNE_BWD_RING", t.ring);
  t.stages = tune_knob("FNORM_TUNE_BWD_STAGES", t.stages);
  t.stages_640 = tune_knob("FNORM_TUNE_BWD_STAGES640", t.stages_640);
  t.threads = tune_knob("FNORM_TUNE_BWD_THREADS", t.threads);
  t.cap = tune_knob("FNORM_TUNE_BWD_CAP", t.cap);
  t.cap_4k = tune_knob("FNORM_TUNE_BWD_CAP4K", t.cap_4k);
  t.min_rows = tune_knob("FNORM_TUNE_BWD_MIN_ROWS", t.min_rows);
  t.bwd_warps = tune_knob("FNORM_TUNE_BWD_WARPS", t.bwd_warps);
  t.fwd_cta = tune_knob("FNORM_TUNE_FWD_CTA", t.fwd_cta);
  t.fwd_ept = tune_knob("FNORM_TUNE_FWD_EPT", t.fwd_ept);
  t.fwd_ept_ln32 = tune_knob("FNORM_TUNE_FWD_EPT_LN32", t.fwd_ept_ln32);
  t.fwd_stream = tune_knob("FNORM_TUNE_FWD_STREAM", t.fwd_stream);
  t.bwd_fill4 = tune_knob("FNORM_TUNE_BWD_FILL4", t.bwd_fill4);
  t.bwd_fill8 = tune_knob("FNORM_TUNE_BWD_FILL8", t.bwd_fill8);
  t.bwd_resident = tune_knob("FNORM_TUNE_BWD_RESIDENT", t.bwd_resident);
  t.bwd_param_smem = tune_knob("FNORM_TUNE_BWD_PARAM_SMEM", t.bwd_param_smem);
  t.bwd_warp_cluster = tune_knob("FNORM_TUNE_BWD_WARP_CLUSTER", t.bwd_warp_cluster);
  t.bwd_cluster_rows = tune_knob("FNORM_TUNE_BWD_CLUSTER_ROWS", t.bwd_cluster_rows);
  t.bwd_ring_beta = tune_knob("FNORM_TUNE_BWD_RING_BETA", t.bwd_ring_beta);
  t.bwd_fin_cols = tune_knob("FNORM_TUNE_BWD_FIN_COLS", t.bwd_fin_cols);
  t.bwd_fast_div = tune_knob("FNORM_TUNE_BWD_FAST_DIV", t.bwd_fast_div);
  t.fwd_staged = tune_knob("FNORM_TUNE_FWD_STAGED", t.fwd_staged);
  t.fwd_staged_rows = tune_knob("FNORM_TUNE_FWD_STAGED_ROWS", t.fwd_staged_rows);
  t.fwd_param_smem = tune_knob("FNORM_TUNE_FWD_PARAM_SMEM", t.fwd_param_smem);
  t.fwd_reread = tune_knob("FNORM_TUNE_FWD_REREAD", t.fwd_reread);
  t.fwd_reread_regs = tune_knob("FNORM_TUNE_FWD_REREAD_REGS", t.fwd_reread_regs);
  t.fwd_stream_minb = tune_knob("FNORM_TUNE_FWD_STREAM_MINB", t.fwd_stream_minb);
  t.fwd_stream_hints = tune_knob("FNORM_TUNE_FWD_STREAM_HINTS", t.fwd_stream_hints);
  t.fwd_stream_threads = tune_knob("FNORM_TUNE_FWD_STREAM_THREADS", t.fwd_stream_threads);
  t.fwd_warp_threads = tune_knob("FNORM_TUNE_FWD_WARP_THREADS", t.fwd_warp_threads);
  t.fwd_warp_persist = tune_knob("FNORM_TUNE_FWD_WARP_PERSIST", t.fwd_warp_persist);
  t.fwd_warp_grid = tune_knob("FNORM_TUNE_FWD_WARP_GRID", t.fwd_warp_grid);
  t.fwd_reg_onebar = tune_knob("FNORM_TUNE_FWD_REG_ONEBAR", t.fwd_reg_onebar);
  t.bwd_ring_resident = tune_knob("FNORM_TUNE_BWD_RING_RESIDENT", t.bwd_ring_resident);
  t.bwd_resident_first = tune_knob("FNORM_TUNE_BWD_RESIDENT_FIRST", t.bwd_resident_first);
  t.bwd_resident_threads = tune_knob("FNORM_TUNE_BWD_RESIDENT_THREADS", t.bwd_resident_threads);
  t.fwd_rms16_long = tune_knob("FNORM_TUNE_FWD_RMS16_LONG", t.fwd_rms16_long);
  t.fwd_lean = tune_knob("FNORM_TUNE_FWD_LEAN", t.fwd_lean);
  t.bwd_rms = tune_knob("FNORM_TUNE_BWD_RMS", t.bwd_rms);
  t.fwd_bulk = tune_knob("FNORM_TUNE_FWD_BULK", t.fwd_bulk);
  t.fwd_bulk_pieces = tune_knob("FNORM_TUNE_FWD_BULK_PIECES", t.fwd_bulk_pieces);
  t.fwd_hold = tune_knob("FNORM_TUNE_FWD_HOLD", t.fwd_hold);
  t.fwd_hold_sm = tune_knob("FNORM_TUNE_FWD_HOLD_SM", t.fwd_hold_sm);
  if (t.fwd_hold_sm != 2 && t.fwd_hold_sm != 4)
    t.fwd_hold_sm = 2;
  t.fwd_hold_parts = tune_knob("FNORM_TUNE_FWD_HOLD_PARTS", t.fwd_hold_parts);
  if (t.fwd_hold_parts < 1 || t.fwd_hold_parts > kBulkMaxPieces)
    t.fwd_hold_parts = kHoldParts;
  t.bwd_hold = tune_knob("FNORM_TUNE_BWD_HOLD", t.bwd_hold);
  t.bwd_hold_sm = tune_knob("FNORM_TUNE_BWD_HOLD_SM", t.bwd_hold_sm);
  if (t.bwd_hold_sm != 1 && t.bwd_hold_sm != 2)
    t.bwd_hold_sm = 1;
  t.bwd_hold_stages = tune_knob("FNORM_TUNE_BWD_HOLD_STAGES", t.bwd_hold_stages);
  if (t.bwd_hold_stages != 1 && t.bwd_hold_stages != 2)
    t.bwd_hold_stages = 1;
  t.fwd_lean_cl = tune_knob("FNORM_TUNE_FWD_LEAN_CL", t.fwd_lean_cl);
  t.fwd_lean_cl_threads = tune_knob("FNORM_TUNE_FWD_LEAN_CL_THREADS", t.fwd_lean_cl_threads);
  t.fwd_batch = tune_knob("FNORM_TUNE_FWD_BATCH", t.fwd_batch);
  t.fwd_batch_form = tune_knob("FNORM_TUNE_FWD_BATCH_FORM", t.fwd_batch_form);
  t.fwd_spread = tune_knob("FNORM_TUNE_FWD_SPREAD", t.fwd_spread);
  t.fwd_spread_stages = tune_knob("FNORM_TUNE_FWD_SPREAD_STAGES", t.fwd_spread_stages);
  t.fwd_spread_defer = tune_knob("FNORM_TUNE_FWD_SPREAD_DEFER", t.fwd_spread_defer);
  t.fwd_rows = tune_knob("FNORM_TUNE_FWD_ROWS", t.fwd_rows);
  t.bwd_ring_more = tune_knob("FNORM_TUNE_BWD_RING_MORE", t.bwd_ring_more);
  t.bwd_cap_640 = tune_knob("FNORM_TUNE_BWD_CAP640", t.bwd_cap_640);
  t.bwd_stages_1k = tune_knob("FNORM_TUNE_BWD_STAGES1K", t.bwd_stages_1k);
  t.bwd_ring_vpt4 = tune_knob("FNORM_TUNE_BWD_RING_VPT4", t.bwd_ring_vpt4);
  t.fwd_rows_lanes = tune_knob("FNORM_TUNE_FWD_ROWS_LANES", t.fwd_rows_lanes);
  t.fwd_rows_packed = tune_knob("FNORM_TUNE_FWD_ROWS_PACKED", t.fwd_rows_packed);
  t.bwd_fin_pdl = tune_knob("FNORM_TUNE_BWD_FIN_PDL", t.bwd_fin_pdl);
  t.bwd_fin_vec_cols = tune_knob("FNORM_TUNE_BWD_FIN_VEC_COLS", t.bwd_fin_vec_cols);
  t.bwd_batch = tune_knob("FNORM_TUNE_BWD_BATCH", t.bwd_batch);
  t.bwd_batch_cl = tune_knob("FNORM_TUNE_BWD_BATCH_CL", t.bwd_batch_cl);
  t.fwd_packed_cl = tune_knob("FNORM_TUNE_FWD_PACKED_CL", t.fwd_packed_cl);
  t.fwd_packed_cl_ln = tune_knob("FNORM_TUNE_FWD_PACKED_CL_LN", t.fwd_packed_cl_ln);
  t.bwd_resident_fill = tune_knob("FNORM_TUNE_BWD_RESIDENT_FILL", t.bwd_resident_fill);
  t.fwd_loop = tune_knob("FNORM_TUNE_FWD_LOOP", t.fwd_loop);
  t.fwd_loop_threads = tune_knob("FNORM_TUNE_FWD_LOOP_THREADS", t.fwd_loop_threads);
  t.fwd_loop_pipe = tune_knob("FNORM_TUNE_FWD_LOOP_PIPE", t.fwd_loop_pipe);
  t.fwd_loop_form = tune_knob("FNORM_TUNE_FWD_LOOP_FORM", t.fwd_loop_form);
  if (t.fwd_loop_form < 0 || t.fwd_loop_form > 4095)
    t.fwd_loop_form = 0;
  t.fwd_loop_smem = tune_knob("FNORM_TUNE_FWD_LOOP_SMEM", t.fwd_loop_smem);
  if (t.fwd_loop_smem < 0 || t.fwd_loop_smem > 200 * 1024)
    t.fwd_loop_smem = 0;
  t.fwd_reg_wide = tune_knob("FNORM_TUNE_FWD_REG_WIDE", t.fwd_reg_wide);
  if (t.fwd_bulk_pieces < 1 || t.fwd_bulk_pieces > kBulkMaxPieces)
    t.fwd_bulk_pieces = 4; /* the default */
  if (t.bwd_resident_threads < 64 || t.bwd_resident_threads > kMaxThreads ||
      t.bwd_resident_threads % 32)
    t.bwd_resident_threads = 128; /* the default */
  if (t.fwd_warp_grid < 0 || t.fwd_warp_grid > 256)
    t.fwd_warp_grid = 0;
#endif
  return t;
}

/* The ring tier's shape for rows of nvec 16-byte vectors, `arrays` of them a stage (dy and x),
 * `vpt` vectors a thread (kRingVpt or kRingVptWide): the smallest power-of-two cluster whose
 * chunks hold at most `cap` vectors, or if that takes more than 16 CTAs, up to vpt vectors for
 * each of max_threads threads. False when no shape fits (more than 16 CTAs a row, or fewer than
 * two stages). */
bool plan_ring(Plan &pl, const fnorm_problem *p, int64_t nvec, int arrays, int stages,
               int max_threads, int64_t cap, int vpt, const DeviceInfo &dev) {
  if (dev.cc_major < 9 || stages < 2 || max_threads < 32 || cap < 1 || nvec < 1)
    return false;
  const int64_t stage_per_vec = 16 * (int64_t)arrays;
  const int64_t most = (int64_t)vpt * min64(max_threads, kMaxThreads);
  auto fits = [&](int64_t chunk, int64_t limit) {
    return chunk <= limit && chunk <= most && 2 * chunk * stage_per_vec <= dev.max_smem_optin;
  };
  int c = 1;
  while (c <= 16 && !fits(ceil_div(nvec, c), cap))
    c *= 2;
  if (c > 16) {
    c = 1;
    while (c <= 16 && !fits(ceil_div(nvec, c), most))
      c *= 2;
  }
  if (c > 16)
    return false;
  /* Too few rows to fill the GPU: split them further while the chunks stay sizeable. */
  while (c < 16 && p->rows * c < 2 * (int64_t)dev.sm_count && ceil_div(nvec, 2 * c) >= 256)
    c *= 2;
  pl.tier = TIER_RING;
  pl.cluster = c;
  pl.chunk = ceil_div(nvec, c);
  pl.vpt = vpt;
  pl.threads = (int)max64(32, round_up(ceil_div(pl.chunk, pl.vpt), 32));
  const int64_t stage = pl.chunk * stage_per_vec;
  pl.nbuf = (int)min64(min64(stages, kRingMaxStages), dev.max_smem_optin / stage);
  if (pl.nbuf < 2)
    return false;
  pl.smem = (size_t)(pl.nbuf * stage);
  return true;
}

/* The ring's RESIDENT form for rows past the register ring's (which otherwise take the stream
 * tier, reading dy and x twice; plan_backward says which rows): the smallest power-of-two cluster,
 * up to 16 CTAs, whose chunks take at most max_threads threads of ring_resident_vpt vectors, with
 * gamma's fp32 chunk and at least one stage of dy and x (up to `stages`) in shared memory. False
 * when none fits. */
bool plan_ring_resident(Plan &pl, int vec, int64_t nvec, int stages, int max_threads,
                        const DeviceInfo &dev) {
  if (dev.cc_major < 9 || nvec < 1)
    return false;
  const int vpt = ring_resident_vpt(vec);
  int c = 1;
  while (c <= 16 && ceil_div(nvec, c) > (int64_t)vpt * max_threads)
    c *= 2;
  if (c > 16)
    return false;
  const int64_t chunk = ceil_div(nvec, c);
  const int64_t stage = chunk * 2 * 16, gamma_bytes = chunk * vec * 4;
  const int64_t nbuf =
      min64(min64(stages, kRingMaxStages), ((int64_t)dev.max_smem_optin - gamma_bytes) / stage);
  if (nbuf < 1)
    return false;
  pl = Plan{};
  pl.vec = vec;
  pl.tier = TIER_RING;
  pl.variant = 1;
  pl.cluster = c;
  pl.chunk = chunk;
  pl.vpt = vpt;
  pl.threads = (int)max64(32, round_up(ceil_div(chunk, vpt), 32));
  pl.nbuf = (int)nbuf;
  pl.smem = (size_t)(nbuf * stage + gamma_bytes);
  return true;
}

/* Forward warp tier: 3 vectors a lane instead, on the vector path, when that leaves fewer lanes
 * idle (rows of 24, 48 or 96 vectors: 384 16-bit elements, the transformer width that inductor's
 * benchmarks use, would leave a quarter of the lanes idle at 4 or 2 vectors a lane). */
void three_per_lane(Plan &pl, int64_t nvec) {
  if (pl.vec == 1)
    return;
  int g = 4;
  while (g < 32 && 3 * (int64_t)g < nvec)
    g *= 2;
  if (3 * (int64_t)g >= nvec && 3 * g < pl.group * pl.vpt) {
    pl.vpt = 3;
    pl.group = g;
  }
}

/* Clusters resident at once and the row lanes each folds: one dgamma/dbeta partial row per
 * cluster. */
void plan_parts(Plan &pl, const fnorm_problem *p, int64_t resident, int max_cluster,
                const DeviceInfo &dev) {
  /* Fold the accumulators of up to 8 row lanes inside the cluster (sm_90), so that the
   * partials written and re-read stay a small fraction of the traffic. */
  int lanes = 1;
  while (lanes < 8 && pl.cluster * lanes * 2 <= max_cluster &&
         p->rows >= (int64_t)dev.sm_count * resident * 2)
    lanes *= 2;
  pl.cluster_rows = lanes;
  pl.nparts = max64(
      1, min64(ceil_div(p->rows, lanes), (int64_t)dev.sm_count * resident / (pl.cluster * lanes)));
  pl.grid = pl.nparts * pl.cluster * lanes;
}

/* Backward rows of at least this many vectors take the stream tier: measured on an H200
 * (bench/RESULTS.md), its plain column pass moves more bytes a second than the row tier's
 * per-row barriers allow, enough to pay for reading x and dy twice. */
const int64_t kBwdStreamMinVecs = 512;

void plan_stream(Plan &pl, const fnorm_problem *p, int64_t nvec, const DeviceInfo &dev) {
  pl.tier = TIER_STREAM;
  pl.chunk = 2048;
  pl.nchunks = ceil_div(nvec, pl.chunk);
  pl.threads = 256;
  const int64_t ncb = ceil_div(nvec, pl.threads);
  int64_t parts = min64(p->rows, max64(1, ceil_div(4 * (int64_t)dev.sm_count, ncb)));
  pl.rows_per_part = ceil_div(p->rows, parts);
  pl.nparts = ceil_div(p->rows, pl.rows_per_part);
  pl.grid = ncb * pl.nparts;
}

} // namespace

namespace fnorm_cuda {

bool hold_shape(int64_t nvec, int64_t rows, int64_t ctas, int64_t cap, HoldShape *hs) {
  if (nvec < 1 || rows < 1 || ctas < 1 || cap < 1)
    return false;
  int64_t best_cost = -1;
  for (int64_t pieces = ceil_div(nvec, cap); pieces <= ctas; ++pieces) {
    const int64_t chunk = ceil_div(nvec, pieces);
    const int64_t last = nvec - (pieces - 1) * chunk; /* the last chunk's vectors */
    if (last < pieces + 1)
      continue;
    const int64_t slots = min64(ctas / pieces, rows);
    const int64_t cost = ceil_div(rows, slots) * (chunk + kHoldRoundVecs);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      hs->pieces = (int)pieces;
      hs->slots = (int)slots;
      hs->chunk = chunk;
    }
  }
  return best_cost >= 0;
}

/* The vectors a thread takes a step in the full form loop_full_form_threads plans at `threads`:
 * 32 values for LayerNorm (fwd_loop_ln_kernel), four 16-byte vectors for 16-bit RMSNorm 8192 (256
 * threads, the row in one step: sweep 99, A/B run CY) and for fp32 RMSNorm 5120 at 320 threads
 * (sweep 101), else eight. */
static int loop_full_form_vpt(const fnorm_problem *p, int vec, int threads) {
  return p->norm == FNORM_LAYERNORM                                           ? 32 / vec
         : (p->dtype != FNORM_DTYPE_F32 && p->cols == 8192) || threads == 320 ? 4
                                                                              : 8;
}

/* The threads a CTA of fwd_loop_kernel's full form (kLoopFull + kLoopFreeParams: steps of eight
 * vectors a thread at constant offsets, or the vectors loop_full_form_vpt names, gamma read ahead
 * of y's stores, torch.compile's shape for these rows, its Triton kernel read in session 37) runs
 * on RMSNorm rows with gamma in their own dtype and two rows an SM at least (a CTA a row), and
 * fwd_loop_ln_kernel on LayerNorm ones (the last bullet); 0 where the form is not planned.
 * - fp32 32768 and 65536 at 1024 threads: sweep 91 (H200, tuning build, 2^27 elements) 32768
 *   92.5% -> 98.3%, 65536 85.3% -> 90.0% of the copy; A/B run CP (release): 32768 +4.1 to +5.8
 *   points at 2^25-2^27, 65536 +1.0 to +5.3; 131072 and 262144 lost up to 20 points at
 *   2^26-2^27 (the row, 512 KiB or more, comes back from L2 over many steps).
 * - fp32 16384 at 512 threads and 8192 at 256 (the row in one step): sweep 92, then A/B run CR
 *   (H200, release): 8192 +0.5 points at 2^27, +1.1 at 2^26, +2.7 at 2^25, +5 at 2^23-2^24;
 *   16384 +2.9 at 2^27 (99.8%), +1.8 at 2^26, +1.0 at 2^25, level at 2^24 and -5 at 2^23 (512
 *   rows): from 2^25 elements.
 * - fp32 5120 at 160 threads: sweep 94 (tuning build), then A/B run CS (H200, release): 97.6%
 *   -> 99.3% at 2^27, +2.3 at 2^26, +3.1 at 2^25, +5 at 2^24, +9 at 2^23. From 2^26 elements
 *   at 320 threads in one step of four vectors (loop_full_form_vpt): sweep 101 (tuning build)
 *   98.8% -> 99.7% at 2^27, level at 2^25 (-0.3); 640 threads of two vectors ran 51%.
 * - 16-bit 32768 at 512 threads, ahead of the packed rows form, from 2^27 elements: A/B run CS
 *   bf16 95.4% -> 97.8%, fp16 95.5% -> 96.9% at 2^27; at 2^26 bf16 level, fp16 -1.3; at
 *   2^24-2^25 -0.5 to -5.5 (fewer waves of two CTAs an SM). 16-bit 8192 at 128 threads level
 *   (sweep 94): not planned.
 * - 16-bit 65536 at 1024 threads (one step, as fp32 32768), from 2^26 elements: A/B run CU (H200,
 *   release) bf16 90.1% -> 92.7%, fp16 89.0-89.3% -> 92.9-93.1% at 2^27, +0.9/+1.2 at 2^26,
 *   -2.6/-3.2 at 2^25, level below; 16-bit 16384 at 256 threads, from 2^27: bf16 96.2% ->
 *   97.2-97.4%, fp16 96.0-96.2% -> 96.5% at 2^27, level at 2^23-2^26 (sweep 94: -2.5 at
 *   2^25).
 * - 16-bit RMSNorm 8192 at 256 threads in one step of four vectors a thread (loop_full_form_vpt),
 *   from 2^26 elements: sweep 99 (tuning build; eight vectors at 128 threads were level, sweep
 *   94, and two or one at 512 or 1024 threads lost 28-55 points), then A/B run CY (release): bf16
 *   96.7% -> 99.0-99.1% at 2^27, +2.8 at 2^26, +1.3 at 2^25, -1.6 at 2^24; fp16 96.7% -> 98.4% at
 *   2^27, +0.8 at 2^26, -1.2 at 2^25, -6.9 at 2^24. torch.compile 1.00x (was 0.97x).
 * - LayerNorm (fwd_loop_ln_kernel, the same shape with Chan-combined statistics), fp32 rows in
 *   one step of 32 values a thread: sweep 95 (H200, tuning build, 2^27 elements) 8192 at 256
 *   threads 96.2% -> 97.2%, 16384 at 512 95.8% -> 97.5%, 32768 at 1024 86.5% -> 89.6%; 16-bit
 *   rows (steps of four vectors; eight spill) lost 3-27 points, and so did longer fp32 rows
 *   (65536 in two steps 85.2% -> 81.4%) and 4096 at 128 threads and 5120 at 160 (-1.3 to -5.7).
 *   A/B run CW (release): 8192 +1.0 to +2.0 points at 2^23-2^27 save +0.2 at 2^25; 16384 +1.1 to
 *   +1.8 and 32768 +2.3 to +3.6 at 2^25-2^27, but both -1.9 to -2.7 at 2^23-2^24: from 2^25
 *   elements. */
static int loop_full_form_threads(const fnorm_problem *p, int vec, const DeviceInfo &dev) {
  if (p->param_dtype != p->dtype || vec * (int64_t)dtype_bytes(p->dtype) != 16 ||
      p->rows < 2 * (int64_t)dev.sm_count)
    return 0;
  if (p->norm == FNORM_LAYERNORM) /* fwd_loop_ln_kernel: fp32 rows of one step */
    return p->dtype != FNORM_DTYPE_F32              ? 0
           : p->cols == 8192                        ? 256
           : p->cols != 16384 && p->cols != 32768   ? 0
           : p->rows * p->cols < ((int64_t)1 << 25) ? 0
           : p->cols == 16384                       ? 512
                                                    : 1024;
  if (p->dtype != FNORM_DTYPE_F32)
    return p->cols == 65536 && p->rows * p->cols >= ((int64_t)1 << 26)   ? 1024
           : p->cols == 32768 && p->rows * p->cols >= ((int64_t)1 << 27) ? 512
           : p->cols == 16384 && p->rows * p->cols >= ((int64_t)1 << 27) ? 256
           : p->cols == 8192 && p->rows * p->cols >= ((int64_t)1 << 26)  ? 256
                                                                         : 0;
  if (p->cols == 16384)
    return p->rows * p->cols >= ((int64_t)1 << 25) ? 512 : 0;
  if (p->cols == 5120)
    return p->rows * p->cols >= ((int64_t)1 << 26) ? 320 : 160;
  return p->cols == 8192 ? 256 : p->cols == 32768 ? 1024 : p->cols == 65536 ? 1024 : 0;
}

/* MODE_BULK for rows of nvec 16-byte vectors where a CTA's shared memory holds their chunk over a
 * cluster of up to 16 (sm_90): false if it does not. */
static bool plan_bulk(Plan &pl, const fnorm_problem *p, int64_t nvec, const DeviceInfo &dev,
                      const Tuning &tn) {
  const int max_cluster = 16;
  int cb = 1;
  while (cb < max_cluster && ceil_div(nvec, cb) * 16 > dev.max_smem_optin)
    cb *= 2;
  while (cb < max_cluster && p->rows * cb < (int64_t)dev.sm_count)
    cb *= 2; /* few rows: more SMs */
  if (ceil_div(nvec, cb) * 16 > dev.max_smem_optin)
    return false;
  pl.tier = TIER_ROW;
  pl.mode = MODE_BULK;
  pl.cluster = cb;
  pl.chunk = ceil_div(nvec, cb);
  pl.threads = kMaxThreads;
  pl.smem = (size_t)pl.chunk * 16;
  pl.nbuf = tn.fwd_bulk_pieces;
  pl.grid = -min64(p->rows, kMaxGrid / cb); /* persistent: as many clusters as fit */
  return true;
}

/* MODE_HOLD for rows of nvec 16-byte vectors where hold_shape finds a cut (sm_90): false if it
 * does not. */
static bool plan_hold(Plan &pl, const fnorm_problem *p, int64_t nvec, const DeviceInfo &dev,
                      const Tuning &tn) {
  HoldShape hs;
  const int64_t cap = hold_cap_vecs(dev.smem_per_sm, tn.fwd_hold_sm);
  if (!hold_shape(nvec, p->rows, tn.fwd_hold_sm * (int64_t)dev.sm_count, cap, &hs))
    return false;
  pl.tier = TIER_ROW;
  pl.mode = MODE_HOLD;
  pl.cluster = 1;
  pl.nchunks = hs.pieces;
  pl.chunk = hs.chunk;
  pl.threads = 2 * kHoldThreads / tn.fwd_hold_sm;
  pl.nbuf = tn.fwd_hold_parts;
  pl.smem = (size_t)cap * 16;
  pl.grid = (int64_t)hs.pieces * hs.slots;
  return true;
}

/* MODE_SPREAD for rows of nvec 16-byte vectors of vec elements (sm_90): one CTA an SM, each
 * owning an even chunk of every row (the last at least half the CTAs' count of vectors: the
 * posting words of a row), fwd_spread_vpt vectors a thread in at most kSpreadMaxThreads
 * threads and a control warp, as many stages of the chunk as shared memory holds up to
 * kSpreadMaxStages, y written about half of them behind the statistics (Plan::variant); false where
 * no such cut exists. */
static bool plan_spread(Plan &pl, int vec, int64_t nvec, const DeviceInfo &dev, const Tuning &tn) {
  const int vpt = fwd_spread_vpt(vec);
  int64_t ctas = min64(dev.sm_count, kSpreadMaxCtas);
  const int64_t chunk = ceil_div(nvec, ctas);
  ctas = ceil_div(nvec, chunk);
  const int64_t threads = round_up(ceil_div(chunk, vpt), 32);
  if (chunk < kSpreadMinChunk || 2 * (nvec - (ctas - 1) * chunk) < ctas ||
      threads > kSpreadMaxThreads)
    return false;
  const int64_t stage_bytes = chunk * 16 + 16; /* (and the row's first vector) */
  int stages = (int)min64(kSpreadMaxStages, (dev.max_smem_optin - 1024) / stage_bytes);
  if (kTuningBuild && tn.fwd_spread_stages >= 3 && tn.fwd_spread_stages <= stages)
    stages = tn.fwd_spread_stages;
  /* (sweep 113, tuning build, 8 stages, fp32 LayerNorm 64 x 802816, y 1-5 rows behind: 18.8%,
   * 33.1%, 71.0-71.9%, 73.1%, 73.1% of the copy; RMSNorm 17.4-54.1%. Four rows behind is not
   * planned yet: the GPU tests have not run on it.) */
  int defer = stages / 2 - 1;
  if (kTuningBuild && tn.fwd_spread_defer >= 1 && tn.fwd_spread_defer <= stages - 2)
    defer = tn.fwd_spread_defer;
  if (stages < 3 || defer < 1 || stages - defer - 1 > 7)
    return false;
  pl.tier = TIER_ROW;
  pl.mode = MODE_SPREAD;
  pl.cluster = 1;
  pl.chunk = chunk;
  pl.vpt = vpt;
  pl.threads = (int)threads + 32; /* (and the control warp) */
  pl.nbuf = stages;
  pl.variant = defer;
  pl.smem = (size_t)(stages * stage_bytes);
  pl.grid = ctas;
  return true;
}

Plan plan_forward(const fnorm_problem *p, int vec, const DeviceInfo &dev, bool hold,
                  bool gamma_beta) {
  const Tuning tn = tuning();
  Plan pl = {};
  pl.vec = vec;
  const int64_t nvec = p->cols / vec;
  /* Tuning builds: FNORM_TUNE_FWD_HOLD=3 and FNORM_TUNE_FWD_BULK=3 take every 16-byte row of
   * more than 32768 elements to the hold or the bulk-copy kernel (sm_90), rows the register
   * kernel holds included. */
  if (kTuningBuild && p->cols > 32768 && (int64_t)vec * (int64_t)dtype_bytes(p->dtype) == 16 &&
      dev.cc_major >= 9) {
    if (tn.fwd_hold == 3 && hold && plan_hold(pl, p, nvec, dev, tn))
      return pl;
    if (tn.fwd_bulk == 3 && plan_bulk(pl, p, nvec, dev, tn))
      return pl;
  }
  /* Rows packed_rows_shape names (16-bit LayerNorm 4096-32768 and RMSNorm 16384 and 32768, fp32
   * LayerNorm 5120 and 8192) with gamma in their dtype, from 2^25 elements on (the rows form's
   * bound: more than L2 holds; 16-bit LayerNorm 8192 from 2^27, packed_rows_min_elements): a row a
   * CTA of 1-8 warps in registers, 16-bit rows as their words (fwd_rows_packed_kernel). A/B run of
   * session 29 (H200, release builds, 2^27 elements; see the kernel). The full forms of the loop
   * kernels come first (loop_full_form_threads): 16-bit RMSNorm 16384 and 32768 from 2^27
   * elements, fp32 LayerNorm 8192 from two rows an SM (so always, where the packed form would take
   * it). */
  const int full_threads = tn.fwd_loop == -1 ? loop_full_form_threads(p, vec, dev) : 0;
  /* The batch tier (fwd_batch_kernel): the rows fwd_batch_shape names (65536 and 262144), 16-byte
   * vectors with gamma in their dtype, from fwd_batch_min_elements (more than L2 holds), on sm_90
   * (clusters): a cluster a row, persistent (as many clusters as are resident), rounds of
   * round_rows rows staged nbuf rounds deep. 16-bit RMSNorm rows the loop kernel's full form
   * takes (65536 from 2^26 elements) keep it: the batch tier lost 5.2-5.6 points there (A/B run
   * GB; fwd_batch_shape has the run's numbers). */
  {
    int bt_threads = 0, bt_vpt = 0, bt_rows = 0, bt_stages = 0, bt_cluster = 0;
    const int elem_bytes = (int)dtype_bytes(p->dtype);
    fwd_batch_shape(p->cols, elem_bytes, p->norm == FNORM_LAYERNORM, bt_threads, bt_vpt, bt_rows,
                    bt_stages, bt_cluster);
    const int form = kTuningBuild && tn.fwd_batch_form >= 1 && tn.fwd_batch_form <= 3
                         ? tn.fwd_batch_form
                         : 0; /* (tuning builds) */
    if (form)
      bt_stages = fwd_batch_form_stages(form);
    const size_t smem = (size_t)bt_stages * bt_rows * bt_threads * bt_vpt * 16 + kDynSmemLinePad;
    if (bt_threads && tn.fwd_batch == 1 && (int64_t)vec * elem_bytes == 16 && dev.cc_major >= 9 &&
        p->param_dtype == p->dtype &&
        p->rows * p->cols >=
            fwd_batch_min_elements(p->cols, elem_bytes, p->norm == FNORM_LAYERNORM) &&
        smem <= (size_t)dev.max_smem_optin &&
        !(full_threads && elem_bytes == 2 && p->norm == FNORM_RMSNORM)) {
      pl.tier = TIER_BATCH;
      pl.threads = bt_threads;
      pl.vpt = bt_vpt;
      pl.round_rows = bt_rows;
      pl.nbuf = bt_stages;
      pl.variant = form;
      pl.cluster = bt_cluster;
      pl.smem = smem;
      pl.grid = -min64(ceil_div(p->rows, bt_rows), kMaxGrid / bt_cluster); /* persistent */
      return pl;
    }
  }
  if (full_threads) {
    pl.tier = TIER_ROW;
    pl.mode = MODE_LOOP;
    pl.vpt = loop_full_form_vpt(p, vec, full_threads);
    pl.threads = full_threads;
    pl.cluster = 1;
    pl.variant = 8 + kLoopFull + kLoopFreeParams + loop_full_thread_bits(full_threads) +
                 (p->norm == FNORM_LAYERNORM ? kLoopLn : 0);
    pl.grid = min64(p->rows, kMaxGrid);
    pl.smem = 0;
    /* fp32 LayerNorm 32768 with gamma and beta (kFwdLoopLnStaged): persistent, the first
     * kFwdLoopLnStaged vectors of each thread's gamma and beta in shared memory for the launch
     * (16 KiB a vector and array), and a carve-out of about that: the request rounded down
     * (fwd_loop_ln_staged_carveout), so that the driver takes the smallest carve-out it has that
     * holds the CTA (100 KiB for 96 KiB staged on an H200, not verified: ncu's "Shared Memory
     * Configuration Size" says) and L1 keeps the row that x's second read comes from; rounded
     * up, 44% of 228 KiB would ask past 100 KiB for 132. */
    if (kFwdLoopLnStaged > 0 && gamma_beta && p->norm == FNORM_LAYERNORM &&
        p->dtype == FNORM_DTYPE_F32 && p->param_dtype == FNORM_DTYPE_F32 && p->cols == 32768 &&
        full_threads == 1024 && kFwdLoopLnStagedBytes <= (size_t)dev.max_smem_optin &&
        dev.smem_per_sm > 0) {
      pl.smem = kFwdLoopLnStagedBytes;
      pl.grid = -pl.grid;
      pl.carveout = fwd_loop_ln_staged_carveout(dev.smem_per_sm);
    }
    return pl;
  }
  int packed_vpl = 0, packed_wpr = 0, packed_cluster = 0;
  const int elem = (int)dtype_bytes(p->dtype);
  packed_rows_shape(p->norm == FNORM_LAYERNORM, p->cols, elem, packed_vpl, packed_wpr,
                    packed_cluster,
                    dev.cc_major < 9             ? 0
                    : p->norm == FNORM_LAYERNORM ? tn.fwd_packed_cl_ln
                                                 : tn.fwd_packed_cl);
  if (tn.fwd_rows_packed == 1 && packed_vpl && vec * elem == 16 && p->param_dtype == p->dtype &&
      p->rows * p->cols >= packed_rows_min_elements(p->norm == FNORM_LAYERNORM, p->cols, elem) &&
      p->rows * packed_cluster <= kMaxGrid) {
    pl.tier = TIER_WARP;
    pl.packed = 1;
    pl.group = 32 * packed_wpr;
    pl.vpt = packed_vpl;
    pl.threads = 32 * packed_wpr;
    pl.cluster = packed_cluster;
    pl.grid = p->rows * packed_cluster; /* a CTA, or a cluster, a row */
    return pl;
  }
  if (nvec <= 256) {
    pl.tier = TIER_WARP;
    pl.vpt = nvec <= 128 ? 4 : 8;
    pl.group = 4;
    while (pl.group < 32 && (int64_t)pl.group * pl.vpt < nvec)
      pl.group *= 2;
    three_per_lane(pl, nvec);
    /* 16-byte rows of a whole warp, and fp32 rows, with 64 rows an SM or more: a one-warp CTA
     * for each warp's rows, not persistent (as torch.compile's kernel for such rows), so that
     * the SM's block scheduler keeps every warp slot busy with rows at their own phases.
     * Sweeps 34 and 36 (H200, 2^27 elements): 16-bit N = 768-2048 +2.4 to +4.8 points (but
     * bf16 LayerNorm 768 -1.5), fp32 N = 256-1024 +0.5 to +4.9; 16-bit rows of 8 or 16 lanes (N
     * = 256-512), staged otherwise, 1.3 points better to 8 worse. Sweep 37 (N = 768-2048): from
     * 16384 rows on -0.8 to +9%, at 8192 rows up to 17% slower (the rows fit in L2, and 8192
     * CTAs' launches then show); M = 4096 under graph replay lost 12-18 points. */
    const bool persist =
        tn.fwd_warp_persist == 1 ||
        (tn.fwd_warp_persist == 2 && !(vec * (int64_t)dtype_bytes(p->dtype) == 16 &&
                                       (pl.group == 32 || p->dtype == FNORM_DTYPE_F32) &&
                                       p->rows >= 64 * (int64_t)dev.sm_count));
    pl.threads = persist ? 256 : 32;
    if (kTuningBuild && tn.fwd_warp_threads >= 32 && tn.fwd_warp_threads <= 256)
      pl.threads = (int)round_up(tn.fwd_warp_threads, 32);
    const int64_t rows_per_cta = pl.threads / pl.group;
    const int64_t full_grid = (int64_t)dev.sm_count * 16; /* CTAs (the staging rule's) */
    pl.grid = min64(ceil_div(p->rows, rows_per_cta), kMaxGrid);
    /* Persistent CTAs: up to 48 an SM, far more than are resident (three or four), so that the
     * block scheduler balances the SMs' rows. A grid of only the resident CTAs, one wave, ran
     * 16-bit N = 256-512 5-10% slower than 16 an SM (A/B run AA1, H200). Sweeps 41-42 (H200,
     * 2^27 elements, 16-bit N = 64-512): 48 an SM +1.4 to +5.3 points over 16 on every row;
     * LayerNorm rows of 64 vectors (N = 512) did best at 32 (+2.3, where 48 gained 0.7 and 64
     * lost 2). */
    if (persist) {
      int cap = p->norm == FNORM_LAYERNORM && pl.group * pl.vpt >= 64 ? 32 : 48;
      if (kTuningBuild && tn.fwd_warp_grid > 0)
        cap = tn.fwd_warp_grid;
      pl.grid = min64(pl.grid, (int64_t)dev.sm_count * cap);
    }
    /* Staging a row ahead overlaps a warp's next rows' loads with this row's work. It pays at up
     * to 4 vectors a lane (at 8, 64 KB of stages a CTA hold the SM to three CTAs: sweep 16, 16-bit
     * N = 2048 lost 3-9 points, fp32 N = 768-1024 -6 to +1.5) and when each warp of a full grid
     * (16 CTAs an SM) gets 4 rows or more (sweep 17: 67584 rows on 132 SMs; with fewer, most
     * cells lost 0.4-9 points). (Reading all of a lane's slots at once, then masking, instead
     * of one conditional read after another, was level: sweep 41.) */
    pl.staged = tn.fwd_staged > 0 && persist && vec * (int64_t)dtype_bytes(p->dtype) == 16 &&
                pl.vpt <= 4 && p->rows >= tn.fwd_staged_rows * full_grid * (pl.threads / 32);
    /* gamma and beta as fp32 from shared memory, filled once a CTA, on staged rows. Sweep 29
     * (H200, 2^27 elements): fp32 N = 256-512 +0.8 to +4.6 points, 16-bit LayerNorm N = 256-1024
     * 0 to +1.7, but 16-bit RMSNorm 384-1024 -0.6 to -2.9; at 8 vectors a lane (16-bit 2048,
     * fp32 768-1024) -0.2 to -12.6, and with few rows (M = 4096) -20: the fill then costs
     * about as much as the CTA's rows. */
    pl.param_smem =
        (tn.fwd_param_smem == 1 && pl.staged &&
         (dtype_bytes(p->dtype) == 4 || p->norm == FNORM_LAYERNORM)) ||
        (kTuningBuild && tn.fwd_param_smem == 2 && vec * (int64_t)dtype_bytes(p->dtype) == 16);
    /* Rows of 32, 48 (16-bit), 64, 96, 128, 192 (fp32) or 256 16-byte vectors, many of them,
     * with gamma in the rows' dtype: several rows a one-warp CTA, each over the whole warp or,
     * rows of 64 vectors and 16-bit rows of 32 and 48, over half of it (fwd_rows_kernel,
     * torch.compile's shape; rows_form_shape, which has sweep 100's half-warp rows of 64).
     * Sweep 63 and A/B run AS (H200, release builds alternated): at 2^27 elements +1.8 to +5.5
     * points over the kernels above (16-bit LayerNorm 512 92% -> 95.5%, fp32 RMSNorm 128 94.5%
     * -> 100%); but 40960 rows of 256 (2^23.3 elements, within L2) 16-bit -6 to -7, fp32 -0.4
     * to -0.8, while 40960 rows of 1024 gained 1.4. Hence 256 rows an SM and 2^25 elements (more
     * than L2 holds) at least; between 2^25 and 2^27 not measured. Sweep 69 (H200, 2^27
     * elements) added half-warp rows and rows of 96 and 256 vectors: 16-bit 384 LayerNorm 94% ->
     * 98%, RMSNorm 97.5% -> 99.5% (576000 rows: 93% -> 96.5%, 95.5% -> 98%), 16-bit 256
     * LayerNorm +5 over a warp a row, 16-bit 768 +3 (LayerNorm 96% -> 99%), fp32 384 +3.5,
     * fp32 1024 +2.5, 16-bit 2048 +1 (A/B run BG, release: the same); sweep 70 fp32 768 +2
     * (LayerNorm 96.6% -> 98.6%). fp32 gamma on 16-bit rows was not measured and keeps the
     * kernels above. */
    int rows_lanes = 0, rows_vpl = 0;
    rows_form_shape(nvec, vec, dtype_bytes(p->dtype), rows_lanes, rows_vpl);
    int rows_cta = 0;
    if (tn.fwd_rows == 1 && rows_lanes && p->param_dtype == p->dtype &&
        p->rows >= 256 * (int64_t)dev.sm_count && p->rows * p->cols >= ((int64_t)1 << 25))
      rows_cta = fwd_rows_per_cta(p->norm == FNORM_RMSNORM, rows_lanes, rows_vpl);
    if (kTuningBuild && tn.fwd_rows >= 11 && tn.fwd_rows <= 18) {
      /* tuning builds: R = fwd_rows - 10 rows a CTA (a half-warp's rows at 16 lanes), over the
       * lanes fwd_rows_lanes names (32: rows of 32, 64, 96, 128, 192, 256 vectors; 16: of 32, 48,
       * 64 vectors, 16-bit or fp32; 8: of 32 or 64) or the rule's */
      const bool vec16 = vec * (int64_t)dtype_bytes(p->dtype) == 16;
      const int64_t v32 = nvec / 32, v16 = nvec / 16;
      if (tn.fwd_rows_lanes == 32)
        rows_lanes = vec16 && nvec % 32 == 0 &&
                             (v32 == 1 || v32 == 2 || v32 == 3 || v32 == 4 || v32 == 6 || v32 == 8)
                         ? 32
                         : 0;
      else if (tn.fwd_rows_lanes == 16)
        rows_lanes = vec16 && nvec % 16 == 0 && v16 >= 2 && v16 <= 4 ? 16 : 0;
      else if (tn.fwd_rows_lanes == 8)
        rows_lanes = vec16 && (nvec == 32 || nvec == 64) ? 8 : 0;
      rows_vpl = rows_lanes ? (int)(nvec / rows_lanes) : 0;
      rows_cta = rows_lanes ? tn.fwd_rows - 10 : 0;
    }
    if (rows_cta > 0) {
      pl.variant = rows_cta;
      pl.group = rows_lanes;
      pl.vpt = rows_vpl;
      pl.threads = 32;
      pl.grid = min64(ceil_div(p->rows, (int64_t)rows_cta * (32 / rows_lanes)), kMaxGrid);
      pl.staged = pl.param_smem = 0;
    }
    return pl;
  }
  pl.tier = TIER_ROW;
  const int64_t vbytes = (int64_t)vec * (int64_t)dtype_bytes(p->dtype);
  /* fp32 RMSNorm rows of 2048-4096 with fp32 gamma, from 2^25 elements: fwd_loop_kernel, one
   * step of four vectors a thread (a CTA of 128-256 threads a row), x read evict-last, then again
   * evict-first from L1, as torch.compile's kernels read it. Sweep 86 (H200, tuning build, 2^27
   * elements): 2048 97.6% -> 99.8-100.0% of the copy, 4096 98.2% -> 100.6% (the reread kernel of
   * the same shape before); A/B run CL (release builds) +1.7 to +2.5 points at 2^26-2^27; rows of
   * 2049-4095 were not measured. Looping over longer rows, 16-bit rows and other step counts
   * lost, and so did one step of eight vectors for fp32 8193-16384 save 16384 at 2^27 (A/B run
   * CM: +1.0 there, -1.6 to -8.6 around it; see the kernel). */
  const bool loop_rule = tn.fwd_loop == -1 && p->norm == FNORM_RMSNORM &&
                         p->dtype == FNORM_DTYPE_F32 && p->param_dtype == p->dtype &&
                         vbytes == 16 && p->cols >= 2048 && p->cols <= 4096 &&
                         p->rows * p->cols >= ((int64_t)1 << 25);
  /* (tuning builds: LayerNorm rows only in fwd_loop_ln_kernel's forms, and only rows of whole
   * steps of its threads) */
  const bool loop_ln_form = (tn.fwd_loop_form & kLoopLn) != 0;
  const bool loop_tuned =
      kTuningBuild &&
      (tn.fwd_loop == 1 || tn.fwd_loop == 2 || tn.fwd_loop == 4 || tn.fwd_loop == 8) &&
      (p->norm == FNORM_LAYERNORM) == loop_ln_form &&
      (!loop_ln_form ||
       (tn.fwd_loop == 8 && tn.fwd_loop_threads == loop_full_threads(tn.fwd_loop_form) &&
        p->cols % (32 * tn.fwd_loop_threads) == 0)) &&
      vbytes == 16 && tn.fwd_loop_threads >= 64 && tn.fwd_loop_threads <= 1024;
  if (loop_rule || loop_tuned) {
    pl.mode = MODE_LOOP;
    pl.vpt = loop_rule ? 4 : loop_ln_form ? 32 / vec : tn.fwd_loop; /* (LayerNorm: 32 values) */
    pl.threads = (int)min64(loop_rule ? 1024 : round_up(tn.fwd_loop_threads, 32),
                            round_up(ceil_div(nvec, pl.vpt), 32));
    pl.cluster = 1;
    /* (tuning builds: 1 fwd_loop_kernel's PIPE form, 8 + FORM the others) */
    pl.variant = !kTuningBuild           ? 0
                 : tn.fwd_loop_pipe == 1 ? 1
                 : tn.fwd_loop_form      ? 8 + tn.fwd_loop_form
                                         : 0;
    pl.grid = min64(p->rows, kMaxGrid);
    pl.smem = kTuningBuild ? (size_t)tn.fwd_loop_smem : 0;
    return pl;
  }
  const int max_cluster = dev.cc_major >= 9 ? 16 : 1;
  /* 16-byte vectors and rows enough to fill the GPU: a CTA per row while one CTA (up to 1024
   * threads of the preferred elements a thread, else up to 4 x 8) holds the row. Longer rows,
   * and fewer rows, take the register kernel below, split over a cluster (sweep 9: faster than
   * clusters of this kernel). */
  /* The CTA-per-row kernel's lean form (fwd_lean_kernel: two CTAs of up to 1024 threads an SM
   * in 32 registers, x read again for y from L1), and its elements a thread. Sweep 52 (H200,
   * 2^27 elements, against the kernels these rows took before; bench/tune/):
   *   16-bit RMSNorm 16385-32768, 32 a thread: 24576 81% -> 96%, 32768 84-85% -> 95% of the
   *     copy (with fp32 gamma 81-84% -> 89%); 16384 +1.1 points;
   *   16-bit RMSNorm 2049-8192 with 16-bit gamma, 16 a thread, from 2^25 elements on: 4096
   *     92% -> 96%, 8192 92% -> 97% (4096 rows of 8192 +3.2; 4096 rows of 4096 -2.3);
   *   fp32 RMSNorm 8193-16384, 16 a thread: 16384 93% -> 98% (24576-32768 -1 to -8: kept);
   *   16-bit LayerNorm 2049-4096 with 16-bit gamma and 64 rows an SM, 16 a thread: 4096 +0.9
   *     (bf16) and +3.1 (fp16) (8192 -1.4 to +0.6, 4096 rows of 4096 -3.6; longer 16-bit
   *     LayerNorm rows hold 32 elements a thread, which spilled in 32 registers: -20 to -30).
   *   16-bit LayerNorm 16385-32768 with 16-bit gamma, rows of a multiple of 1024 (the FULL form,
   *     whose statistics take the thread's four vectors two at a time, so that they no longer
   *     spill): A/B run AL1 (H200, release builds alternated) 32768 77-80% -> 89-91% of the
   *     copy, 17408-28672 60-77% -> 91-95%, 264 rows of 32768 61% -> 70%. Sweep 61 (tuning
   *     build) took the same form down to 8193: 12288 82-84% -> 93%, 10240 +2 to +4 points,
   *     16384 +1.3 to +1.6 (4096 rows: +2.5 to +3); at 8192 -0.5 and 5120-6144 -0.3 to +0.9,
   *     so 8192 and shorter keep their kernels.
   *   fp32 LayerNorm 5120-16384, rows of a multiple of 512 (FULL at 16 a thread; its pairs
   *     centred as above): sweep 61 16384 94.4% -> 97%, 12288 93% -> 97.6%, 8192 92.3% -> 95%;
   *     sweep 62 7168 +2, 5120-6144 +0.4 to +0.7 (4096 -9: not taken).
   *   16-bit rows with fp32 gamma (sweep 62): LayerNorm 16385-32768 as with 16-bit gamma, 20480
   *     59% -> 79%, 24576 62% -> 78%, 32768 66% -> 76% (10240 and 16384 -3 to -4: not taken);
   *     RMSNorm 10241-16384 (past 16384 the lean form already), 12288 86% -> 92% (16384 level,
   *     8192-10240 -1 to -1.5: not taken).
   * The rows these rules do not name keep their kernels. (Before sweep 52, 16-bit RMSNorm rows
   * past 20480 took the register kernel, +2 to +6 points over the CTA-per-row kernel's other
   * forms in sweeps 41-42.) */
  const bool is16 = dtype_bytes(p->dtype) == 2;
  const bool p16 = dtype_bytes(p->param_dtype) == 2;
  const bool rms = p->norm == FNORM_RMSNORM;
  int lean_ept = 0;
  if (tn.fwd_lean == 1) {
    if (rms && is16 && p->cols > 16384)
      lean_ept = 32;
    else if (rms && is16 && p16 && p->cols > 8192)
      lean_ept = 32;
    else if (rms && is16 && p->cols > 10240)
      lean_ept = 32;
    else if (rms && is16 && p16 && p->rows * p->cols >= ((int64_t)1 << 25))
      lean_ept = 16;
    else if (rms && !is16 && p->cols > 8192 && p->cols <= 16384)
      lean_ept = 16;
    else if (!rms && is16 && p16 && p->cols <= 4096 && p->rows >= 64 * (int64_t)dev.sm_count)
      lean_ept = 16;
    else if (!rms && is16 && (p16 ? p->cols > 8192 : p->cols > 16384) && p->cols <= 32768 &&
             p->cols % 1024 == 0)
      lean_ept = 32;
    else if (!rms && !is16 && p->cols >= 5120 && p->cols <= 16384 && p->cols % 512 == 0)
      lean_ept = 16;
  } else if (kTuningBuild && (tn.fwd_lean == 3 || (tn.fwd_lean == 2 && rms))) {
    lean_ept = tn.fwd_ept;
  }
  const bool rms16_long = tn.fwd_rms16_long == 1 && lean_ept == 0 && rms && is16 && p->cols > 20480;
  if (tn.fwd_cta > 0 && vbytes == 16 && p->rows >= 2 * (int64_t)dev.sm_count && !rms16_long) {
    const int v1 = 8 / vec; /* vectors of 8 elements */
    /* fp32 LayerNorm rows of up to 4096 at 16 elements a thread (sweep 19: N = 2048 and 4096
     * +3 and +5 points; from 5120 on, and for RMSNorm, 16 was level or slower). */
    /* fp32 RMSNorm rows of up to 8192 (those the loop kernel above does not take: 8192 itself
     * since A/B run CR): x read again for y (fwd_cta_reread_kernel), at 16
     * elements a thread and 48 registers (rows of up to 4096) or 40. Sweep 35 (H200, 2^27
     * elements): N = 2048 94% -> 99% of the copy, 4096 93% -> 99%, 8192 92% -> 99%; 16384
     * (1024 threads a CTA) 93% -> 77%. LayerNorm, and 16-bit rows (which spill within 40 or 48
     * registers), gained at most 1.7 points anywhere and mostly lost (sweeps 33 and 35). */
    /* fp32 LayerNorm rows of up to 4096 and of a multiple of 128 vectors (threads of 16
     * elements fill them exactly: the kernel's FULL form), with 64 rows an SM or more, too (the
     * loss above predates run Y2's reciprocals and the FULL form): A/B run AH5 (H200, 2^27
     * elements) N = 2048 +7.5% (93% -> 100% of the copy), 3072 +3.2%, 4096 +7.8% (93% ->
     * 99.7%); 5120-8192 (40 registers) -1 to -3%, and 4096 rows of 2048 -8.7% (rows between
     * 4096 and 32768 were not measured; the bound is the one-warp CTAs' rule). */
    const bool ln_reread = p->norm == FNORM_LAYERNORM && p->cols <= 4096 &&
                           (p->cols / vec) % (32 * 4) == 0 && p->rows >= 64 * (int64_t)dev.sm_count;
    const bool reread =
        lean_ept == 0 &&
        (tn.fwd_reread == 2 || (tn.fwd_reread == 1 && p->dtype == FNORM_DTYPE_F32 &&
                                ((p->norm == FNORM_RMSNORM && p->cols <= 8192) || ln_reread)));
    int ept = p->dtype == FNORM_DTYPE_F32 && p->norm == FNORM_LAYERNORM && p->cols <= 4096
                  ? tn.fwd_ept_ln32
                  : tn.fwd_ept;
    if (reread && tn.fwd_reread == 1)
      ept = 16;
    if (lean_ept > 0)
      ept = lean_ept;
    int vpt = v1;
    while (vpt < 4 * v1 && vpt * vec < ept)
      vpt *= 2;
    while (vpt < 4 * v1 && ceil_div(nvec, vpt) > 1024)
      vpt *= 2;
    if (ceil_div(nvec, vpt) <= 1024) {
      pl.mode = MODE_CTA;
      pl.vpt = vpt;
      /* reread: the kernel's register budget */
      pl.reread = !reread ? 0 : p->cols <= 4096 ? 48 : 40;
      if (kTuningBuild && reread && tn.fwd_reread_regs != 0)
        pl.reread = tn.fwd_reread_regs;
      /* (LayerNorm's lean form holds up to 4 vectors a thread) */
      pl.variant = lean_ept > 0 && (rms || vpt <= 4);
      pl.cluster = 1;
      pl.threads = (int)round_up(ceil_div(nvec, vpt), 32);
      pl.grid = min64(p->rows, kMaxGrid);
      return pl;
    }
  }
  /* Rows longer than one CTA of the lean form holds (16-bit LayerNorm rows of 32769-524288
   * elements, 16-bit RMSNorm rows with 16-bit gamma of 32769-65535 and 262144-524288, save
   * those the packed rows form takes over a cluster above, from 2^25 elements): the lean
   * form over a cluster of up to 16
   * (sm_90), each CTA an even chunk of at most 512 threads, 32 elements a thread (fp32
   * LayerNorm: 16, the most its statistics hold), persistent (as many clusters as are resident,
   * each looping over rows); LayerNorm only where every CTA's chunk is its threads' vectors
   * exactly (the FULL form: the form with tests spills at 32 16-bit elements a thread). Sweep 59
   * (H200, 2^27 elements, bf16, against the kernels these rows took before): N = 36864-57344
   * LayerNorm 54-70% -> 76-79% of the copy, RMSNorm 65-80% -> 82-83% (the register kernel);
   * 262144 LayerNorm +0.4, RMSNorm +2.1 points; 327680-524288 LayerNorm 38-46% -> 63-68%,
   * RMSNorm 47-58% -> 56-75% (the staged kernel); but 65536-131072 -0.6 to -1.2 (kept on the
   * register kernel). Launched one cluster a row instead of persistent, it lost 10-25 points;
   * with CTAs of up to 1024 threads, 65536-262144 lost 1-14; fp32 rows lost 20-48 (not
   * persistent, sweep 59a). With fp32 gamma (sweep 60, tuning build, bf16): LayerNorm 40960
   * 51% -> 66%, 49152 55% -> 64%, 262144 55% -> 60%, 393216-524288 31-37% -> 48-53%; RMSNorm
   * lost 17-20 points up to 262144 (it keeps its kernels). No release A/B run measured the
   * fp32-gamma rule yet. Since the clustered form stores y by one 16-byte store a vector
   * (store_vec, run BD), 16-bit LayerNorm rows of 65536-262143 take it too: sweep 68 (H200,
   * tuning build, 2^27 elements, against the register kernel) 65536 bf16 76.1% -> 77.7-78.7%,
   * fp16 77.6% -> 80.4-80.6%, 131072 +0.2 to +1.5, with fp32 gamma 65536 63.3% -> 73.5% and
   * 131072 62.7% -> 68.3%; RMSNorm there lost 0.6-1 (16-bit gamma) and 24-30 (fp32 gamma) and
   * keeps the register kernel. */
  const bool lean_cl_ln = !rms && p->cols > 32768;
  const bool lean_cl_rms = rms && p16 && p->cols > 32768 && (p->cols < 65536 || p->cols >= 262144);
  const bool lean_cl_rows = vbytes == 16 && dev.cc_major >= 9 &&
                            ((tn.fwd_lean_cl == 1 && is16 && (lean_cl_ln || lean_cl_rms)) ||
                             (kTuningBuild && tn.fwd_lean_cl >= 2));
  if (lean_cl_rows) {
    const int64_t vpt = !rms && !is16 ? 4 : 32 / vec;
    const int64_t cl_threads =
        kTuningBuild && tn.fwd_lean_cl_threads >= 64 && tn.fwd_lean_cl_threads <= 1024
            ? tn.fwd_lean_cl_threads
            : 512;
    int64_t cl = 2;
    while (cl < max_cluster && ceil_div(nvec, cl * vpt) > cl_threads)
      cl *= 2;
    const int64_t chunk = ceil_div(nvec, cl);
    const int64_t threads = round_up(ceil_div(chunk, vpt), 32);
    const bool full = chunk * cl == nvec && threads * vpt == chunk;
    if (ceil_div(nvec, vpt) > 1024 && threads <= 1024 && (rms || full)) { /* (the kernel's bound) */
      pl.mode = MODE_CTA;
      pl.variant = 1;
      pl.vpt = (int)vpt;
      pl.cluster = (int)cl;
      pl.chunk = chunk;
      pl.threads = (int)threads;
      pl.grid = -min64(p->rows, kMaxGrid / cl); /* persistent: as many clusters as fit */
      if (kTuningBuild && tn.fwd_lean_cl == 2)
        pl.grid = min64(p->rows, kMaxGrid / cl) * cl; /* a cluster a row */
      return pl;
    }
  }
  const int vpt = fwd_reg_vpt(vec);
  int c = split_rows(p, nvec, (int64_t)kMaxThreads * vpt, max_cluster, dev);
  pl.chunk = ceil_div(nvec, c);
  const bool reg_fits = pl.chunk <= (int64_t)kMaxThreads * vpt;
  /* 16-bit rows past 2^16 vectors whose chunk a CTA's shared memory holds, over a cluster of up
   * to 16 (sm_90): the bulk-copy kernel instead of the staged one. Sweep 57 (H200, 2^27
   * elements): bf16 N = 600008-1048576 LayerNorm +2.9 to +5.5 points (802816: 37% -> 43%),
   * RMSNorm +5 to +10 (45% -> 55%); at 393216 (the staged kernel's two buffers) -2.6 and -4.
   * fp32 rows, against the streaming kernel: LayerNorm -8 to -14, RMSNorm -5 to +1.5 (a
   * cluster of 16 a row at one CTA an SM, of which 7 are resident, 112 SMs). */
  /* fp32 LayerNorm rows past the register kernel's, not in place, whose chunk over every SM is
   * at least kSpreadMinChunk vectors: spread over every SM (fwd_spread_kernel), each CTA a chunk
   * of every row, x read once and held on chip, gamma and beta in registers for the launch. A/B
   * run GO (H200, release builds, against the streaming kernel): 64 x 802816 55.5% -> 70.7% of
   * the copy, 167 x 802816 57.5% -> 73.0%, but 524288 (chunks of 993 vectors) -2.4 and -5.5;
   * fp32 RMSNorm lost 16-32 points to the hold kernel (50-51% at 802816, unexplained), bf16
   * -24 to -26 (RMSNorm 802816) to +2.2 (tuning builds: FNORM_TUNE_FWD_SPREAD=2 any row the
   * kernel takes). */
  if (!reg_fits && vbytes == 16 && dev.cc_major >= 9 && hold &&
      ((tn.fwd_spread == 1 && p->norm == FNORM_LAYERNORM && dtype_bytes(p->dtype) == 4) ||
       (kTuningBuild && tn.fwd_spread == 2)) &&
      plan_spread(pl, vec, nvec, dev, tn))
    return pl;
  if (!reg_fits && vbytes == 16 && dev.cc_major >= 9 &&
      (tn.fwd_bulk >= 2 || (tn.fwd_bulk == 1 && dtype_bytes(p->dtype) == 2 && nvec > 65536)) &&
      plan_bulk(pl, p, nvec, dev, tn))
    return pl;
  /* fp32 RMSNorm rows past the register kernel's (N > 262144), not in place: each row held
   * whole in shared memory, cut over every resident CTA of one cooperative launch
   * (fwd_hold_kernel), so that x is read from DRAM once; the launcher cuts the rows again by the
   * CTAs the device actually holds at once. A/B run EB (H200, release builds, against the
   * streaming kernel): RMSNorm +2.2 to +6.6 points at N = 524288-1048576 (64 x 802816: 59.0% ->
   * 61.4%; 167 x 802816: 59.5% -> 66.1%), LayerNorm 1.7-9.7 points slower (it keeps the
   * streaming kernel; tuning builds: FNORM_TUNE_FWD_HOLD=2; four CTAs an SM left it 2-8
   * points under it, sweep 105). Since A/B run EF (eight parts a chunk, kHoldParts) RMSNorm
   * 64 x 802816 reads 66.7%. Rows the register kernel holds lost 9-31 points on this kernel
   * (sweep 105, FNORM_TUNE_FWD_HOLD=3: 16-bit and fp32 rows of 65536-262144) and 13-40 on the
   * bulk-copy kernel (FNORM_TUNE_FWD_BULK=3). */
  if (!reg_fits && vbytes == 16 && dev.cc_major >= 9 && hold &&
      (tn.fwd_hold >= 2 ||
       (tn.fwd_hold == 1 && dtype_bytes(p->dtype) == 4 && p->norm == FNORM_RMSNORM)) &&
      plan_hold(pl, p, nvec, dev, tn))
    return pl;
  /* Rows past the register kernel's: read once for the statistics, re-read (mostly from L2)
   * for y. Sweep 11 (H200): fp32 N = 802816 went from 1628 to 2034 GB/s (LayerNorm) and from
   * 1950 to 2181 (RMSNorm); bf16 RMSNorm fell from 1815 to 1112, so 16-bit rows keep the
   * staged kernel below; the register kernel's cluster rows were slower this way. */
  const bool stream =
      tn.fwd_stream >= 3 ||
      (!reg_fits && (tn.fwd_stream == 2 || (tn.fwd_stream == 1 && dtype_bytes(p->dtype) == 4)));
  if (vbytes == 16 && stream) {
    /* Clusters whose chunks are at most 16 vectors a thread where they can be. */
    c = split_rows(p, nvec, (int64_t)kMaxThreads * 16, max_cluster, dev);
    pl.mode = MODE_STREAM;
    pl.cluster = c;
    pl.chunk = ceil_div(nvec, c);
    pl.threads = kMaxThreads;
    if (kTuningBuild && tn.fwd_stream_threads >= 128 && tn.fwd_stream_threads <= kMaxThreads)
      pl.threads = (int)round_up(tn.fwd_stream_threads, 32);
    pl.min_blocks = tn.fwd_stream_minb;
    pl.hints = tn.fwd_stream_hints;
    pl.grid = min64(p->rows, kMaxGrid / c) * c;
    return pl;
  }
  if (reg_fits) {
    pl.mode = MODE_REG;
    pl.vpt = vpt;
    if (kTuningBuild && tn.fwd_reg_wide == 1 && vec == 4 && dtype_bytes(p->dtype) == 4)
      pl.vpt = vpt / 2; /* the same chunk over up to 2 * kMaxThreads threads */
    pl.threads = (int)max64(64, round_up(ceil_div(pl.chunk, pl.vpt), 32));
    /* fp32 LayerNorm's chunk statistics behind one barrier (cta_ln_stats, each thread centred
     * on its own mean) instead of two sums behind two. Sweeps 41-42 (H200, 2^27 elements):
     * fp32 N = 40960-262144 +0.9 to +4.4 points (CTAs of 320-512 threads; 64 rows of 262144
     * +0.8), but 64 rows of 65536 (a cluster of 8 CTAs of 256 threads) -4.5, and 16-bit rows
     * lost about 20. */
    pl.variant = p->norm == FNORM_LAYERNORM &&
                 ((tn.fwd_reg_onebar == 1 && p->dtype == FNORM_DTYPE_F32 && pl.threads > 256) ||
                  (kTuningBuild && tn.fwd_reg_onebar == 2));
  } else {
    /* Rows longer than registers hold: stage the chunk in shared memory, or re-read it. */
    c = split_rows(p, nvec, kStageTarget / (2 * vbytes), max_cluster, dev);
    pl.chunk = ceil_div(nvec, c);
    const int64_t stage = pl.chunk * vbytes;
    pl.mode = stage <= dev.max_smem_optin ? MODE_STAGED : MODE_GLOBAL;
    pl.nbuf = 2 * stage <= dev.max_smem_optin ? 2 : 1;
    pl.smem = pl.mode == MODE_STAGED ? (size_t)(pl.nbuf * stage) : 0;
    pl.threads = pl.mode == MODE_STAGED ? row_threads(pl.chunk, 4) : kMaxThreads;
  }
  pl.cluster = c;
  pl.grid = -min64(p->rows, kMaxGrid / c); /* persistent: as many clusters as fit */
  return pl;
}

/* MODE_HOLD for the backward (bwd_hold_kernel, sm_90): 16-byte rows from x where hold_shape finds
 * a cut at the CTAs tn.bwd_hold_sm an SM with tn.bwd_hold_stages stages (Plan::nbuf) whose chunks
 * hold kBwdHoldMinChunk vectors or more (tuning builds with FNORM_TUNE_BWD_HOLD=2: any); false
 * where it does not (or at two CTAs an SM with two stages, which do not fit). The plan's nchunks
 * and nparts bound the pieces and slots of any cut the launch may find (at most those CTAs): the
 * workspace's posts ([rows][nchunks] pairs of floats, at ws_rowpart), counts ([rows], at ws_rowsum)
 * and partial rows. */
static bool plan_bwd_hold(Plan &pl, const fnorm_problem *p, int vec, int64_t nvec, bool from_y,
                          const DeviceInfo &dev, const Tuning &tn) {
  if (tn.bwd_hold < 1 || from_y || dev.cc_major < 9 || vec * dtype_bytes(p->dtype) != 16 ||
      (dtype_bytes(p->dtype) != 4 && !(kTuningBuild && tn.bwd_hold == 2)))
    return false;
  const int per_sm = tn.bwd_hold_sm, stages = tn.bwd_hold_stages;
  const int vpt = bwd_hold_vpt(vec, per_sm, stages);
  const int64_t cap = (int64_t)vpt * kHoldThreads;
  /* (the kernel's stages from a line: kDynSmemLinePad more, within the 4 KiB kept for the
   * reserved and static shared memory) */
  const size_t smem = (size_t)cap * bwd_hold_vec_bytes(vec, stages) + kDynSmemLinePad;
  if (smem > (size_t)dev.max_smem_optin || per_sm * (smem + 4096) > (size_t)dev.smem_per_sm)
    return false;
  const int64_t ctas = (int64_t)per_sm * dev.sm_count;
  HoldShape hs;
  if (!hold_shape(nvec, p->rows, ctas, cap, &hs) ||
      (hs.chunk < kBwdHoldMinChunk && !(kTuningBuild && tn.bwd_hold == 2)))
    return false;
  pl = Plan{};
  pl.vec = vec;
  pl.tier = TIER_ROW;
  pl.mode = MODE_HOLD;
  pl.cluster = pl.cluster_rows = 1;
  pl.vpt = vpt;
  pl.nbuf = stages;
  pl.threads = kHoldThreads;
  pl.smem = smem;
  pl.chunk = hs.chunk;
  pl.nchunks = ctas;
  pl.nparts = min64(p->rows, ctas / ceil_div(nvec, cap));
  pl.grid = (int64_t)hs.pieces * hs.slots;
  return true;
}

Plan plan_backward(const fnorm_problem *p, int vec, const DeviceInfo &dev, bool from_y, bool hold,
                   Plan *fallback) {
  Plan pl = {};
  pl.vec = vec;
  const int64_t nvec = p->cols / vec;
  const int vpt = 16 / vec; /* warp tier: 16 elements a lane */
  const int reg_vpt = bwd_reg_vpt(vec);
  const int64_t vbytes = (int64_t)vec * (int64_t)dtype_bytes(p->dtype);
  const int max_cluster = dev.cc_major >= 9 ? 16 : 1;
  const int64_t acc_bytes = 2 * (int64_t)vec * 4; /* dgamma and dbeta accumulators */
  const Tuning tn = tuning();
  /* The warp tier: a row over `lanes` lanes (a power of two, 4 to 256), 16 elements each.
   * 16-byte rows may span 2, 4 or 8 warps (bwd_warps). Sweeps 20-21 (H200, 2^27 elements,
   * against the ring): 2 warps +3 to +9 points at N = 640-1024, 4 warps +1 to +8 for fp32 N =
   * 1152-2048. Sweep 27, gamma/beta from shared memory (sweep 26): 8 warps +5 to +10 points for
   * fp32 N = 2304-4096 and +5 to +16 for 16-bit 3072-4096. 16-bit rows that fill their warps
   * only partly do worse: sweep 27 had 4 warps 2 to 19 points ahead at N = 1280-1920 (10/16 of
   * the lanes or more) but 5 behind at 1152 (9/16), and 8 warps 3 to 7 behind at 2304-2560
   * (up to 10/16); such rows stay with the ring (bwd_fill4, bwd_fill8 sixteenths). */
  int64_t lanes = 4;
  while (lanes * vpt < nvec)
    lanes *= 2;
  int64_t max_lanes = 32;
  if (vbytes == 16 && (tn.bwd_warps == 2 || tn.bwd_warps == 4 || tn.bwd_warps == 8))
    max_lanes = 32 * (int64_t)tn.bwd_warps;
  /* fp32 rows past 8 warps, up to 8 x 8 warps (N = 4097-32768), over a cluster of 8-warp CTAs
   * (sm_90), each CTA an even chunk of the row, instead of the ring. Sweep 28 (H200, 2^27
   * elements): +3 to +5 points at fp32 N = 5120-32768, but -3.5 at 65536 (a cluster of 16), and
   * 16-bit rows lost 7 to 26 points (half the bytes a row for the same cluster exchange).
   * Sweep 30: from y, LayerNorm +21 to +30 (the ring's from-y rows are slow); with fewer rows
   * level or behind (M = 2048: -3 to +0.7; M = 256: +10 to +19 at N = 5120-8192 but -3 to -9
   * at 16384-32768), so clusters from 4096 rows on (bwd_cluster_rows). */
  const bool wide_cluster = kTuningBuild && tn.bwd_warp_cluster == 2;
  int64_t wcluster = 1;
  if (tn.bwd_warp_cluster >= 1 && (dtype_bytes(p->dtype) == 4 || wide_cluster) &&
      p->rows >= tn.bwd_cluster_rows && max_lanes == 256 && lanes > 256 &&
      lanes <= (wide_cluster ? 16 : 8) * 256 && dev.cc_major >= 9 && tn.bwd_param_smem == 1) {
    wcluster = lanes / 256;
    lanes = 256;
  }
  const int64_t fill = lanes == 128 ? tn.bwd_fill4 : lanes == 256 ? tn.bwd_fill8 : 0;
  const bool warp_fits = lanes <= max_lanes && !(dtype_bytes(p->dtype) == 2 && lanes >= 128 &&
                                                 16 * nvec <= fill * lanes * vpt);
  /* The ring: 2 stages and chunks of up to 1024 vectors (512 threads of 2), the fewest CTAs a
   * row, did best (sweep 19: 16-bit N = 8192-16384 and 65536 +2 to +5 points, fp32 8192 and
   * 32768 +3, -0.2 to +1.5 elsewhere), save rows of 2049-4096 vectors, which did 0-2.6 points
   * better as 8 chunks of 512 than as 4 of 1024. 16-bit rows of 513-640 vectors (N = 4097-5120,
   * CTAs of 288-320 threads) take 3 stages: sweeps 53-54 (H200, 2^27 elements) measured +2.3
   * to +5 points at N = 4608-5120 (bf16 and fp16, LayerNorm and RMSNorm), where 3 stages cost
   * 0.6-1.9 points at N = 1152-2816 and 6144-8192 and more stages no more. Rows past it: the ring's
   * RESIDENT form for rows from x with 1.5 rows an SM or more (sweeps 41-42, H200: 16-bit N =
   * 196608-262144 +6 to +9 points over the stream tier at 512 rows; from y -3 to -13; sweeps
   * 42-43, bf16 262144: 256 rows +4, 160 rows -0.9, 132 -2.4, 64 -6). fp32 rows past the ring's
   * four vectors a thread (N = 131073-262144) too: sweeps 41-42 had them 6 points behind the
   * stream tier, but since the ring's RMS form and split row sums sweep 78 (H200, tuning builds,
   * 2^27 elements, the stream tier -> RESIDENT, % of the copy) measured 262144 (one stage) 54.4
   * -> 58.1, 229376 52.7 -> 58.7, 196608 49.3 -> 55.3 (at 200 rows +1.2 to +1.7), and where two
   * stages fit (chunks of up to 2905 vectors: N <= 185920) 163840 52.0 -> 88.7, 139264 49.0 ->
   * 88.2, LayerNorm and RMSNorm alike. Those two-stage rows gain from one row an SM on (sweep
   * 78c: 132 rows +18 to +19 points, 160 rows +24; 64 rows +2.6 to +5.3, 32 rows -3.5 to -11),
   * where the one-stage rows are level (132-160 rows) or lose (64 rows -11). */
  /* (a trial plan, made only where there are not 1.5 rows an SM) */
  auto resident_two = [&] {
    Plan trial;
    return dtype_bytes(p->dtype) == 4 && p->rows >= (int64_t)dev.sm_count &&
           plan_ring_resident(trial, vec, nvec, tn.stages, kMaxThreads, dev) && trial.nbuf >= 2;
  };
  const bool resident_rows = (tn.bwd_ring_resident == 1 && !from_y &&
                              (2 * p->rows >= 3 * (int64_t)dev.sm_count || resident_two())) ||
                             (kTuningBuild && tn.bwd_ring_resident == 2);
  /* 16-bit rows with fp32 gamma: the register ring runs them 6-17 points below the same rows
   * with 16-bit gamma (probe 47, H200: the same instructions and bytes, ncu run 46), the RESIDENT
   * form in CTAs of 128 threads (four an SM) does not. Sweep 48 (H200, 2^27 elements, against
   * the register ring): N = 5120 +8 to +9 points, 16384 +6 to +8, 32768 +10 to +11, 65536 +5 to
   * +6 (256 threads: +7 to +9), 8192 -2 to -3; with 256 rows -3. Same-dtype gamma lost 3-8
   * points (sweep 44). */
  /* Since the ring's row sums are split around the dgamma/dbeta accumulators (row_sums_post),
   * sweep 64 (H200, 2^27 elements, from x): fp32 rows of 4096-32768 +5 to +11 points on the
   * ring over the warp tier and its clusters (N = 8192: 87% -> 97%; 1024-2048 level); 16-bit
   * RMSNorm rows of 2048-4096 +1.6 to +4.8 (LayerNorm -3 to -5: it stays); 16-bit RMSNorm rows
   * of 4097-5120 +15 to +22 with 2 stages (3 stages keep it from the RMS form from 16384 rows on,
   * see rms_slower below); 16-bit rows with fp32 gamma of 8192-65536 +1.6 to +7.8 in the
   * register ring over RESIDENT (5120 -2.5 to -11, 32768 LayerNorm -0.5). Rows the warp tier
   * takes without a cluster go to the ring only from some rows on: A/B run AV (H200, graph
   * preset, 4096 rows) had fp16 RMSNorm 4096 on the ring 5 points slower; sweep 65 (N = 4096,
   * ring against warp tier): fp32 8192 rows +0.6 (RMSNorm) to +4.6 (LayerNorm), 16384 rows
   * +1.3 to +2.5; bf16 RMSNorm 8192 rows -3.2, 16384 +0.7, 32768 level. So fp32 rows of 1024
   * vectors from 8192 rows, 16-bit RMSNorm rows from 32768. */
  const bool more = tn.bwd_ring_more == 1 && !from_y;
  const bool rms16 = dtype_bytes(p->dtype) == 2 && p->norm == FNORM_RMSNORM;
  const bool ring_first =
      more && ((dtype_bytes(p->dtype) == 4 && (nvec > 1024 || (nvec == 1024 && p->rows >= 8192))) ||
               (rms16 && nvec >= 256 && p->rows >= 32768));
  const bool resident_first = resident_rows && !warp_fits &&
                              ((tn.bwd_resident_first == 1 && p->param_dtype == FNORM_DTYPE_F32 &&
                                dtype_bytes(p->dtype) == 2 && !(more && nvec > 640)) ||
                               (kTuningBuild && tn.bwd_resident_first == 2));
  /* 16-bit LayerNorm rows of 641-1024 vectors (N = 5121-8192) with 16-bit gamma, from x: 3
   * stages too. Sweep 66 (H200, tuning build, 2^27 elements): bf16/fp16 6144 81% -> 87-88% of
   * the copy, 7168 83% -> 88.5%, 8192 86% -> 87.6%; RMSNorm 6144 +2.6, 7168 -0.7, 8192 -4.8:
   * it keeps 2. */
  const bool ln16 = !from_y && dtype_bytes(p->dtype) == 2 && p->norm == FNORM_LAYERNORM &&
                    p->param_dtype != FNORM_DTYPE_F32;
  const int ring_stages =
      dtype_bytes(p->dtype) == 2 && nvec > 512 && nvec <= 640 && !(more && rms16) ? tn.stages_640
      : ln16 && nvec > 640 && nvec <= 1024                                        ? tn.bwd_stages_1k
                                                                                  : tn.stages;
  /* 16-bit LayerNorm rows of 513-640 vectors (N = 4097-5120) with 16-bit gamma, from x: a
   * cluster of 2 CTAs of up to 160 threads, three an SM (their 118 registers a thread allow one
   * CTA of 320), instead of one CTA a row. Sweep 65 (H200, tuning build, 2^27 elements): bf16
   * 5120 78.2% -> 84.9% of the copy; RMSNorm (its RMS form, two CTAs an SM already) 92.0 ->
   * 91.6, so it keeps one CTA; 8192 in chunks of 256 lost 3.5 points. */
  const int64_t ring_cap = nvec > 2048 && nvec <= 4096         ? tn.cap_4k
                           : ln16 && nvec > 512 && nvec <= 640 ? tn.bwd_cap_640
                                                               : tn.cap;
  /* fp32 rows of more than 8192 vectors (N > 32768) from x: four vectors a thread, chunks twice
   * as long (kRingVptWide: a cluster of 8 CTAs of 512 threads at N = 65536, not 16). */
  const bool wide_vpt = !from_y && dtype_bytes(p->dtype) == 4 &&
                        ((tn.bwd_ring_vpt4 == 1 && nvec > 8192) ||
                         (kTuningBuild && tn.bwd_ring_vpt4 == 2 && nvec > 2048));
  const int ring_vpt = wide_vpt ? kRingVptWide : kRingVpt;
  /* The batch tier (bwd_batch_kernel): 16-bit rows of the lengths batch_shape names, from x,
   * gamma in their dtype, from 2^25 elements (more than L2 holds, as the forward's rows forms),
   * on sm_90, where it was measured; a CTA an SM (shared memory and registers; two of 128 threads
   * over a cluster), one partial row a CTA or cluster. LayerNorm rows of 16384 and 32768 over a
   * cluster of 2 and 4 CTAs of 8192 (the first form):
   * A/B run BN4 (H200, tuning build, the ring against it, % of the copy at 2^26 / 2^27
   * elements): bf16 16384 73.7 -> 78.3 / 83.6 -> 84.0, 32768 69.2 -> 74.1 / 77.3 -> 80.0, fp16
   * 16384 73.8 -> 79.0 / 83.4 -> 84.0, 32768 69.3 -> 73.7 / 78.1 -> 79.3; RMSNorm lost 4.5 to 7.4
   * (the ring's RMS form runs 84-92%), so its rows keep the ring. Since session 43 rows of 32768
   * over 8 CTAs of 128 threads (+1.4 to +2.8 points), and of 65536 over 16 (+0.8 to +8.1 against
   * the ring since A/B run GA): batch_shape. */
  int bt_threads = 0, bt_vpt = 0, bt_rows = 0, bt_stages = 0, bt_cluster = 0;
  batch_shape(p->cols, (int)dtype_bytes(p->dtype), bt_threads, bt_vpt, bt_rows, bt_stages,
              bt_cluster,
              tn.bwd_batch_cl == 2 || (tn.bwd_batch_cl == 1 && p->norm == FNORM_LAYERNORM));
  const bool batch = bt_threads && vbytes == 16 && !from_y && dev.cc_major >= 9 &&
                     p->param_dtype != FNORM_DTYPE_F32 && p->rows * p->cols >= ((int64_t)1 << 25) &&
                     (tn.bwd_batch == 2 || (tn.bwd_batch == 1 && p->norm == FNORM_LAYERNORM));
  const size_t batch_smem =
      (size_t)bt_stages * bt_rows * 2 * bt_threads * bt_vpt * 16 + kDynSmemLinePad;
  /* (tuning builds, FNORM_TUNE_BWD_HOLD=2: the hold tier ahead of the others from 65536
   * elements, every dtype) */
  if (kTuningBuild && hold && tn.bwd_hold == 2 && p->cols >= 65536 &&
      plan_bwd_hold(pl, p, vec, nvec, from_y, dev, tn)) {
    /* planned */
  } else if (batch && batch_smem <= (size_t)dev.max_smem_optin) {
    pl.tier = TIER_BATCH;
    pl.cluster = bt_cluster;
    pl.threads = bt_threads;
    pl.vpt = bt_vpt;
    pl.round_rows = bt_rows;
    pl.nbuf = bt_stages;
    pl.smem = batch_smem;
    const int64_t per_sm = max64(1, (int64_t)dev.smem_per_sm / (int64_t)(pl.smem + 1024));
    pl.nparts = max64(1, min64(ceil_div(p->rows, bt_rows), per_sm * dev.sm_count / pl.cluster));
    pl.grid = pl.nparts * pl.cluster;
  } else if (vec * dtype_bytes(p->dtype) == 16 && tn.ring > 0 &&
             (!warp_fits || ring_first || (tn.ring >= 2 && nvec >= 32)) &&
             ((resident_first &&
               plan_ring_resident(pl, vec, nvec, tn.stages, tn.bwd_resident_threads, dev)) ||
              plan_ring(pl, p, nvec, 2, ring_stages, tn.threads, ring_cap * ring_vpt / kRingVpt,
                        ring_vpt, dev) ||
              (!warp_fits && resident_rows &&
               plan_ring_resident(pl, vec, nvec, tn.stages, kMaxThreads, dev)))) {
    /* One partial row per resident cluster, found at launch; bound it here for the workspace
     * by shared memory and threads alone (registers only lower it). */
    const int64_t per_sm = max64(1, min64(min64(32, 2048 / pl.threads),
                                          (int64_t)dev.smem_per_sm / (int64_t)(pl.smem + 2048)));
    pl.nparts = max64(
        1, min64(ceil_div(p->rows, max64(1, tn.min_rows)), per_sm * dev.sm_count / pl.cluster));
    /* RESIDENT with one stage (fp32 rows past N = 185920): each thread refills its vectors of
     * the stage as it finishes them (see bwd_ring_kernel), so the next row's copy overlaps this
     * row's dx instead of following it. Sweep 79 (H200, tuning build, 2^27 elements, one bulk
     * copy -> each thread's, % of the copy, twice each): fp32 262144 LayerNorm 56.9-57.0 ->
     * 65.6, RMSNorm 57.2-57.4 -> 66.0; 196608 55.4-55.7 -> 62.7-63.1. */
    pl.thread_fill = pl.variant && pl.nbuf == 1 && tn.bwd_resident_fill == 1;
    /* fp32 rows the RESIDENT form would hold in one stage (N > 185920) take the hold tier
     * instead (bwd_hold_kernel: each row over the CTAs of one cooperative launch, a CTA's up to
     * 4096 vectors in one stage, where RESIDENT's cluster of 16 holds 4096 a CTA in one stage too
     * but gets no further than its cluster). Sweep 108 (H200, tuning build, 2^27 elements): fp32
     * 262144 LayerNorm 66.0% -> 74.8% of the copy, RMSNorm 66.4% -> 76.6%; 16-bit rows lost
     * 18-25 points on it (bf16 262144 46.7-50.1%), so they keep RESIDENT. A/B run EL (release):
     * 262144 +7.7 and +8.7 points, 196608 +11.9 and +15.4 (75.0% and 78.8%). */
    if (hold && pl.variant == 1 && pl.nbuf == 1 && dtype_bytes(p->dtype) == 4) {
      Plan held;
      if (plan_bwd_hold(held, p, vec, nvec, from_y, dev, tn))
        pl = held;
    }
  } else if (warp_fits) {
    pl = Plan{};
    pl.vec = vec;
    pl.tier = TIER_WARP;
    pl.vpt = vpt;
    pl.group = (int)lanes;
    pl.cluster = (int)wcluster;
    /* (Not three_per_lane: 24 elements a lane spill the backward's registers; measured 60% ->
     * 46% of the copy at 384 bf16 elements.) */
    pl.threads = 256;
    const int64_t rows_per_cta = pl.threads / pl.group;
    /* CTAs (or clusters): a partial row each; the launch may take fewer (resident). */
    pl.nparts =
        min64(ceil_div(p->rows, rows_per_cta), max64(1, (int64_t)dev.sm_count * 4 / wcluster));
    pl.grid = pl.nparts * wcluster;
    pl.resident = tn.bwd_resident;
    /* gamma/beta from shared memory: sweep 26 (H200, 2^27 elements) +5 to +15 points at N =
     * 768-2048, +1 to +2 at fp32 512-768, but -1 to -2 at 16-bit 256 (a row of 16 lanes). */
    pl.param_smem = vbytes == 16 && pl.group >= 32 && tn.bwd_param_smem == 1;
    /* Two stages of dy and x for 16-byte vectors, which the fold of the accumulators reuses;
     * else the fold's buffer alone. The launch adds gamma (and beta, from y) as fp32 when
     * param_smem: at most 2 * cols * 4 bytes more. */
    pl.smem = vbytes == 16 ? (size_t)pl.threads * 4 * vpt * 16
                           : (size_t)pl.threads * vpt * vec * sizeof(float);
  } else {
    pl = Plan{};
    pl.vec = vec;
    const int c = split_rows(p, nvec, (int64_t)kMaxThreads * reg_vpt, max_cluster, dev);
    const int64_t chunk = ceil_div(nvec, c);
    if (nvec < kBwdStreamMinVecs && chunk <= (int64_t)kMaxThreads * reg_vpt) {
      pl.tier = TIER_ROW;
      pl.mode = MODE_REG;
      pl.vpt = reg_vpt;
      pl.cluster = c;
      pl.chunk = chunk;
      pl.threads = (int)max64(64, round_up(ceil_div(chunk, reg_vpt), 32));
      /* Shared memory: the two-stage ring of dy and x, later reused for the fold of the
       * accumulators over the lanes. */
      pl.smem = (size_t)max64(chunk * 4 * vbytes, chunk * acc_bytes);
      /* Resident CTAs an SM: by registers (up to 128 a thread), threads and shared memory. */
      const int64_t resident =
          max64(1, min64(min64(2048 / pl.threads, 65536 / (128 * pl.threads)),
                         (int64_t)dev.smem_per_sm / (int64_t)(pl.smem + 1024)));
      plan_parts(pl, p, resident, max_cluster, dev);
    } else if (!(hold && plan_bwd_hold(pl, p, vec, nvec, from_y, dev, tn))) {
      /* (fp32 rows from x on sm_90 take the hold tier here where hold_shape cuts them in chunks
       * of kBwdHoldMinChunk vectors or more: A/B run EL (H200, release) fp32 1048576 +1.3 to +7.7
       * points; 802816, cut in chunks of 3041, LayerNorm -1.9 and -0.8, RMSNorm +1.1 and +0.6 at
       * 64 and 167 rows, so it keeps the stream tier; 16-bit rows lost 1-15 points in A/B runs
       * EJ and EK, so they keep it too) */
      plan_stream(pl, p, nvec, dev); /* any length */
    }
  }
  /* RMSNorm rows without dbeta (the dispatch knows that) on kernels without the sum of g and the
   * dbeta accumulators and partials (bwd_warp_kernel's and bwd_ring_kernel's RMS forms: 80-103
   * registers instead of 118-127). A/B runs AK1-AK2 (H200, 2^27 elements, builds alternated):
   * the ring 16-bit N = 6144-65536 +2.6 to +4.4%, its RESIDENT form (262144; 16-bit rows with
   * fp32 gamma) +6 to +11%, the warp tier 16-bit 384-3072 level to +5.3%, fp32 -0.5 to +5.5%,
   * and 4096 rows (less of the dbeta partials to write and add) +4 to +17%; but the 16-bit rows
   * of 8 warps (N = 2049-4096) and the ring's three-stage rows (4097-5120) 0.7-3% slower from
   * 16384 rows on (at 8192 rows and fewer 3.7-9% faster), and fp32 ring rows (N > 32768) 1.7-3.1%
   * slower: those keep the general kernels (as do the warp tier's clusters, the register ring
   * and the stream tier, which have no RMS form). */
  const bool is16 = dtype_bytes(p->dtype) == 2;
  const bool rms_kernels = (pl.tier == TIER_WARP && pl.cluster <= 1) || pl.tier == TIER_RING ||
                           pl.tier == TIER_BATCH || (pl.tier == TIER_ROW && pl.mode == MODE_HOLD);
  const bool rms_slower =
      (pl.tier == TIER_RING && !is16) || (is16 && p->rows >= 16384 &&
                                          ((pl.tier == TIER_WARP && pl.group == 256) ||
                                           (pl.tier == TIER_RING && !pl.variant && pl.nbuf == 3)));
  /* (the fp32 ring at four vectors a thread, wide_vpt, is built in its general form only) */
  const bool rms_built = !(pl.tier == TIER_RING && !pl.variant && wide_vpt);
  pl.rms_form = p->norm == FNORM_RMSNORM && !from_y && rms_kernels && rms_built &&
                (tn.bwd_rms == 2 || (tn.bwd_rms == 1 && !rms_slower));
  /* The finalize's columns a block. ncu4: 32 CTAs of 32 columns took as long as the backward
   * at N = 1024, M = 4096. Sweep 32 (H200, M = 4096 under graph replay): 16 columns +1.4 to
   * +2.7 points at N = 1024, but -1 to -2.7 at 4096-15872 (main grid: -1.6 to +0.6). */
  pl.fin_cols = tn.bwd_fin_cols == 16 || tn.bwd_fin_cols == 32
                    ? tn.bwd_fin_cols
                    : (p->cols < 8 * (int64_t)dev.sm_count ? 16 : 32);
  pl.fin_pdl = dev.cc_major >= 9 && tn.bwd_fin_pdl;
  pl.fin_vec =
      tn.bwd_fin_vec_cols > 0 && p->cols >= tn.bwd_fin_vec_cols && p->cols % 4 == 0 ? 4 : 1;
  /* Workspace: partials, then (stream tier) per-chunk and per-row sums, or (hold tier) the
   * chunks' posted sums and each row's count of them; 256-byte aligned. */
  const bool hold_tier = pl.tier == TIER_ROW && pl.mode == MODE_HOLD;
  size_t off = 0;
  pl.ws_partial = off;
  off += (size_t)round_up(2 * pl.nparts * p->cols * 4, 256);
  pl.ws_rowpart = off;
  if (pl.tier == TIER_STREAM || hold_tier)
    off += (size_t)round_up(p->rows * pl.nchunks * 2 * 4, 256);
  pl.ws_rowsum = off;
  if (pl.tier == TIER_STREAM)
    off += (size_t)round_up(p->rows * 2 * 4, 256);
  if (hold_tier)
    off += (size_t)round_up(p->rows * 4, 256);
  pl.ws_bytes = off;
  /* The hold tier's cooperative launch may be refused (fewer SMs given to this process than the
   * device has, say): the dispatch then takes the plan without it, in the same workspace. */
  if (hold_tier) {
    const Plan other = plan_backward(p, vec, dev, from_y, false);
    pl.ws_bytes = other.ws_bytes > pl.ws_bytes ? other.ws_bytes : pl.ws_bytes;
    if (fallback)
      *fallback = other;
  }
  return pl;
}

/* The widest access every pointer and stride allows: 16 bytes, else one element. */
int choose_vec(const fnorm_problem *p, const void *const *rows_ptrs, const int64_t *strides,
               int nrows_ptrs, const void *const *params, int nparams) {
  const int vec = (int)(16 / dtype_bytes(p->dtype));
  if (p->cols % vec != 0)
    return 1;
  for (int i = 0; i < nrows_ptrs; ++i)
    if (!aligned(rows_ptrs[i], 16) || strides[i] % vec != 0)
      return 1;
  const size_t pbytes = (size_t)vec * dtype_bytes(p->param_dtype);
  for (int i = 0; i < nparams; ++i)
    if (!aligned(params[i], pbytes))
      return 1;
  return vec;
}

void plan_backward_from_y(Plan &pl, const fnorm_problem *p, bool has_beta, const DeviceInfo &dev) {
  const Tuning tn = tuning();
  /* x recovered by __fdividef on 16-bit rows (sweep 41, H200: +3 to +14 points at N =
   * 1024-32768; its 2 ulp are far below y's rounding), by IEEE division on fp32 rows (0 to +3). */
  pl.fast_div = tn.bwd_fast_div == 2 || (tn.bwd_fast_div == 1 && dtype_bytes(p->dtype) == 2);
  /* Sweep 31 (H200, 2^27 elements): LayerNorm from y +6 to +12 points at 16-bit N = 5120-8192
   * (+0.2 to +1.6 at 16384-65536), +19 to +22 at fp32; but 6 to 12 points slower for RMSNorm
   * (no beta: only the reads of zeros would be added), so only where there is a beta. */
  if (pl.tier != TIER_RING || tn.bwd_ring_beta != 1 || p->norm != FNORM_LAYERNORM || !has_beta)
    return;
  /* (Fewer CTAs may fit an SM with it; the workspace's partial rows, an upper bound, stay.) */
  const size_t beta_bytes = (size_t)pl.chunk * pl.vec * sizeof(float);
  if (pl.smem + beta_bytes <= (size_t)dev.max_smem_optin) {
    pl.param_smem = 1;
    pl.smem += beta_bytes;
  }
}

/* The backward's workspace for any pointers, from x or from y: the vector width depends on the
 * pointers, which the query does not see, so the largest of both widths' (the wide one only
 * where the row length allows it, as choose_vec), each from x and from y (which may take different
 * tiers: the ring's RESIDENT form is planned from x only). */
size_t backward_workspace_bytes(const fnorm_problem *p, const DeviceInfo &dev) {
  int vec = (int)(16 / dtype_bytes(p->dtype));
  if (p->cols % vec != 0)
    vec = 1;
  size_t most = 0;
  for (int w = 0; w < 2; ++w)
    for (int y = 0; y < 2; ++y) {
      const size_t b = plan_backward(p, w ? 1 : vec, dev, y != 0).ws_bytes;
      most = b > most ? b : most;
    }
  return most;
}

} // namespace fnorm_cuda
