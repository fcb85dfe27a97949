/*
 * fnorm_plan_tests: the CUDA backend's plans (src/cuda/plan.cu) checked on the host, without a
 * GPU, for several device descriptions (an H200, an A100, a small sm_90 part, a consumer part
 * with less shared memory), every dtype pair, row lengths 1-4200 and longer ones up to 2^22,
 * and row counts from 1 to 2^27 / N.
 *
 * For each plan it checks what the launchers and kernels rely on: the row is covered (lanes or
 * chunks times vectors at least its length), the smallest warp-tier group that covers it, group
 * and cluster sizes the kernels are built for, at most 1024 threads, shared memory within the
 * device's opt-in limit, the 16-byte-only tiers and forms given only 16-byte rows, the ring only
 * on sm_90 and newer, clusters only on sm_90, and a workspace that holds the partial rows and is
 * no larger than the workspace query answers. A plan that breaks any of these is a failure; the
 * first few are printed. Ends with "N passed, M failed" (one count per plan).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda/kernels.cuh"

using namespace fnorm_cuda;

namespace {

struct Device {
  const char *name;
  DeviceInfo info;
};

/* max_smem_optin as device_info() gives it: the device's opt-in limit less 2 KiB. */
const Device kDevices[] = {
    {"H200", {0, 132, 9, 227 * 1024 - 2048, 228 * 1024}},
    {"A100", {0, 108, 8, 163 * 1024 - 2048, 164 * 1024}},
    {"sm_90 with 16 SMs", {0, 16, 9, 227 * 1024 - 2048, 228 * 1024}},
    {"sm_120 with 100 KiB", {0, 84, 12, 99 * 1024 - 2048, 100 * 1024}},
};

struct Pair {
  fnorm_dtype dtype, param;
  int bytes;
};
const Pair kPairs[] = {{FNORM_DTYPE_F32, FNORM_DTYPE_F32, 4},
                       {FNORM_DTYPE_F16, FNORM_DTYPE_F16, 2},
                       {FNORM_DTYPE_F16, FNORM_DTYPE_F32, 2},
                       {FNORM_DTYPE_BF16, FNORM_DTYPE_BF16, 2},
                       {FNORM_DTYPE_BF16, FNORM_DTYPE_F32, 2}};

int g_passed = 0, g_failed = 0;
/* Backward plans by tier (warp, of which clustered, ring, row, stream, batch): printed at the
 * end, so a run shows which tiers it covered. */
long g_bwd_tiers[6];
char g_why[256]; /* the first broken invariant of the plan being checked */

bool is_pow2(int64_t v) {
  return v > 0 && (v & (v - 1)) == 0;
}

/* Records the first broken invariant; returns ok so that checks chain. */
bool require(bool ok, const char *what) {
  if (!ok && !g_why[0])
    snprintf(g_why, sizeof g_why, "%s", what);
  return ok;
}

int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/* 16-bit RMSNorm rows the loop kernel's full form takes (gamma in their dtype, two rows an SM):
 * 65536 at 1024 threads from 2^26 elements, 32768 at 512 and 16384 at 256 from 2^27 (A/B runs
 * CS and CU), 8192 at 256 threads in steps of four vectors from 2^26 (sweep 99, A/B run CY). */
bool full16(const fnorm_problem &p, const DeviceInfo &dev) {
  return p.norm == FNORM_RMSNORM && p.dtype != FNORM_DTYPE_F32 && p.param_dtype == p.dtype &&
         p.rows >= 2 * (int64_t)dev.sm_count &&
         ((p.cols == 65536 && p.rows * p.cols >= ((int64_t)1 << 26)) ||
          ((p.cols == 32768 || p.cols == 16384) && p.rows * p.cols >= ((int64_t)1 << 27)) ||
          (p.cols == 8192 && p.rows * p.cols >= ((int64_t)1 << 26)));
}

/* fp32 LayerNorm rows fwd_loop_ln_kernel takes (fp32 gamma, one step of 32 values a thread):
 * 8192 at 256 threads from two rows an SM, 16384 at 512 and 32768 at 1024 from 2^25 elements
 * (sweep 95, A/B run CW). */
int64_t full_ln_min_rows(int64_t cols, const DeviceInfo &dev) {
  const int64_t two_an_sm = 2 * (int64_t)dev.sm_count;
  return cols == 8192 ? two_an_sm : ((int64_t)1 << 25) / cols;
}
bool full_ln(const fnorm_problem &p, const DeviceInfo &dev) {
  return p.norm == FNORM_LAYERNORM && p.dtype == FNORM_DTYPE_F32 && p.param_dtype == p.dtype &&
         (p.cols == 8192 || p.cols == 16384 || p.cols == 32768) &&
         p.rows >= full_ln_min_rows(p.cols, dev);
}

void check_forward(const Plan &pl, const fnorm_problem &p, int vec, const DeviceInfo &dev) {
  const int64_t nvec = p.cols / vec;
  const bool wide = vec * (p.dtype == FNORM_DTYPE_F32 ? 4 : 2) == 16;
  const int max_cluster = dev.cc_major >= 9 ? 16 : 1;
  require(pl.vec == vec, "forward: the plan's width is the one asked for");
  require(pl.carveout == 0 || (pl.mode == MODE_LOOP && pl.smem > 0),
          "forward: a carve-out only for the loop kernel's staged parameters");
  require(kTuningBuild || !pl.variant || pl.mode == MODE_CTA || pl.tier == TIER_WARP ||
              pl.mode == MODE_LOOP || pl.mode == MODE_SPREAD ||
              (pl.tier == TIER_ROW && pl.mode == MODE_REG && p.norm == FNORM_LAYERNORM &&
               p.dtype == FNORM_DTYPE_F32 && pl.threads > 256),
          "forward: one barrier's statistics only on fp32 LayerNorm rows in over 256 threads "
          "(the loop kernel's variant is its form, the spread kernel's its deferral)");
  /* fwd_batch_kernel: the rows fwd_batch_shape names, 16-byte with gamma in their dtype, from
   * fwd_batch_min_elements, on sm_90 (tuning builds: FNORM_TUNE_FWD_BATCH=0 leaves them to the
   * other tiers) */
  bool batch = false;
  {
    int threads = 0, vpt = 0, rows = 0, stages = 0, cluster = 0;
    const int elem_bytes = (int)fnorm_dtype_size(p.dtype);
    fwd_batch_shape(p.cols, elem_bytes, p.norm == FNORM_LAYERNORM, threads, vpt, rows, stages,
                    cluster);
    if (kTuningBuild && pl.tier == TIER_BATCH && pl.variant) /* (FNORM_TUNE_FWD_BATCH_FORM) */
      stages = fwd_batch_form_stages(pl.variant);
    const size_t smem = (size_t)stages * rows * threads * vpt * 16 + kDynSmemLinePad;
    batch =
        threads > 0 && wide && dev.cc_major >= 9 && p.param_dtype == p.dtype &&
        p.rows * p.cols >= fwd_batch_min_elements(p.cols, elem_bytes, p.norm == FNORM_LAYERNORM) &&
        smem <= (size_t)dev.max_smem_optin && !full16(p, dev);
    require(kTuningBuild ? pl.tier != TIER_BATCH || batch : (pl.tier == TIER_BATCH) == batch,
            "forward batch tier: on the rows fwd_batch_shape names with gamma in their dtype from "
            "fwd_batch_min_elements on sm_90 (not 16-bit RMSNorm rows the loop kernel's full form "
            "takes), and there alone");
    if (pl.tier == TIER_BATCH) {
      require(pl.threads == threads && pl.vpt == vpt && pl.round_rows == rows &&
                  pl.nbuf == stages && pl.cluster == cluster &&
                  (int64_t)threads * vpt * cluster == nvec && (stages == 2 || stages == 3),
              "forward batch tier: fwd_batch_shape's shape, the row exactly its cluster's vectors");
      require(pl.smem == smem, "forward batch tier: its stages, from a line, in shared memory");
      const int64_t most = (int64_t)0x7fffffff / cluster;
      require(pl.grid == -(cdiv(p.rows, rows) < most ? cdiv(p.rows, rows) : most) && !pl.packed &&
                  (kTuningBuild ? pl.variant >= 0 && pl.variant <= 3 : !pl.variant) && !pl.staged &&
                  !pl.param_smem,
              "forward batch tier: persistent, at most a cluster a round");
      return;
    }
  }
  /* fwd_rows_packed_kernel: the 16-byte rows packed_rows_shape names with gamma in their dtype,
   * from packed_rows_min_elements (tuning builds: FNORM_TUNE_FWD_ROWS_PACKED=0 leaves them to the
   * other tiers) */
  /* (tuning builds: the cluster form of either cl_form, FNORM_TUNE_FWD_PACKED_CL) */
  int packed_vpl = 0, packed_wpr = 0, packed_cluster = 0;
  const int elem = (int)fnorm_dtype_size(p.dtype);
  const int cl_form = dev.cc_major < 9                 ? 0
                      : kTuningBuild && pl.cluster > 1 ? pl.vpt / 8
                      : p.norm == FNORM_LAYERNORM      ? kFwdPackedClLn
                                                       : kFwdPackedCl;
  packed_rows_shape(p.norm == FNORM_LAYERNORM, p.cols, elem, packed_vpl, packed_wpr, packed_cluster,
                    cl_form);
  const bool packed_rows =
      packed_vpl && vec * elem == 16 && p.param_dtype == p.dtype &&
      p.rows * p.cols >= packed_rows_min_elements(p.norm == FNORM_LAYERNORM, p.cols, elem) &&
      p.rows * packed_cluster <= 0x7fffffff && !batch &&
      !(!kTuningBuild && (full16(p, dev) || full_ln(p, dev)));
  require(kTuningBuild ? !pl.packed || packed_rows : !!pl.packed == packed_rows,
          "forward: the packed rows form on the rows packed_rows_shape names with gamma in their "
          "dtype from packed_rows_min_elements, and there alone");
  if (pl.packed) {
    require(pl.tier == TIER_WARP && pl.vpt == packed_vpl && pl.threads == 32 * packed_wpr &&
                pl.group == pl.threads && pl.cluster == packed_cluster &&
                (int64_t)pl.vpt * pl.threads * pl.cluster == nvec && !pl.variant && !pl.staged &&
                !pl.param_smem && pl.grid == p.rows * pl.cluster,
            "forward packed rows form: a row a CTA of packed_rows_shape's warps, or a cluster of "
            "such CTAs (sm_90), not persistent");
    require(pl.cluster == 1 || (dev.cc_major >= 9 && elem == 2 && pl.cluster <= 8),
            "forward packed rows form: clusters only of 16-bit rows, on sm_90");
    return;
  }
  if (pl.tier == TIER_WARP && pl.variant) {
    /* fwd_rows_kernel (sweeps 63 and 69) */
    int lanes = 0, vpl = 0;
    rows_form_shape(nvec, vec, (int)fnorm_dtype_size(p.dtype), lanes, vpl);
    require(
        wide && (pl.group == 32 || pl.group == 16) && pl.vpt * pl.group == nvec &&
            ((pl.group == lanes && pl.vpt == vpl) ||
             (kTuningBuild && ((pl.group == 32 && (pl.vpt <= 4 || pl.vpt == 6 || pl.vpt == 8)) ||
                               (pl.group == 16 && pl.vpt >= 2 && pl.vpt <= 4)))),
        "forward rows form: the rows rows_form_shape names (tuning builds: rows of 32, 64, "
        "96, 128, 192, 256 vectors over a warp, of 32, 48, 64 over half a warp)");
    require(pl.threads == 32 && !pl.staged && !pl.param_smem &&
                pl.grid == cdiv(p.rows, (int64_t)pl.variant * (32 / pl.group)),
            "forward rows form: one-warp CTAs, not persistent, one a CTA's rows");
    require(
        kTuningBuild ||
            (pl.variant == fwd_rows_per_cta(p.norm == FNORM_RMSNORM, pl.group, pl.vpt) &&
             p.param_dtype == p.dtype && p.rows >= 256 * (int64_t)dev.sm_count &&
             p.rows * p.cols >= ((int64_t)1 << 25)),
        "forward rows form: sweeps 63/69's rows a CTA, gamma in the rows' dtype, 256 rows an SM, "
        "2^25 elements");
    return;
  }
  if (pl.tier == TIER_WARP) {
    int rows_lanes = 0, rows_vpl = 0;
    rows_form_shape(nvec, vec, (int)fnorm_dtype_size(p.dtype), rows_lanes, rows_vpl);
    require(kTuningBuild ||
                !(rows_lanes && p.param_dtype == p.dtype && p.rows >= 256 * (int64_t)dev.sm_count &&
                  p.rows * p.cols >= ((int64_t)1 << 25)),
            "forward warp tier: the rows rows_form_shape names, with 256 rows an SM, take the "
            "rows form");
    require(pl.group == 4 || pl.group == 8 || pl.group == 16 || pl.group == 32,
            "forward warp tier: 4 to 32 lanes a row");
    require(pl.vpt == 3 || pl.vpt == 4 || pl.vpt == 8, "forward warp tier: 3, 4 or 8 vectors");
    require((int64_t)pl.group * pl.vpt >= nvec, "forward warp tier: the row is covered");
    require(pl.vpt != 3 || wide, "forward warp tier: 3 vectors a lane only on 16-byte rows");
    require(pl.threads == 256 || pl.threads == 32 || kTuningBuild,
            "forward warp tier: 256 threads, or one warp");
    require(kTuningBuild ||
                (pl.threads == 32) == (wide && (pl.group == 32 || p.dtype == FNORM_DTYPE_F32) &&
                                       p.rows >= 64 * (int64_t)dev.sm_count),
            "forward warp tier: one-warp CTAs for 16-byte rows of a warp and for fp32 rows, "
            "from 64 rows an SM");
    require(pl.grid >= 1 && pl.grid <= cdiv(p.rows, pl.threads / pl.group),
            "forward warp tier: 1 CTA to one a row group");
    require(pl.threads == 32 || kTuningBuild ||
                pl.grid <= (p.norm == FNORM_LAYERNORM && pl.group * pl.vpt >= 64 ? 32 : 48) *
                               (int64_t)dev.sm_count,
            "forward warp tier: persistent 256-thread CTAs, at most 48 an SM (LayerNorm rows "
            "of 64 vectors or more: 32)");
    require(!pl.staged || (wide && pl.vpt <= 4), "forward staged rows: 16-byte, <= 4 vectors");
    require(!pl.staged || pl.threads == 256, "forward staged rows: persistent CTAs");
    require(!pl.param_smem || wide, "forward warp tier: gamma/beta in shared memory: 16-byte");
    require(!pl.param_smem || kTuningBuild ||
                (pl.staged && (p.dtype == FNORM_DTYPE_F32 || p.norm == FNORM_LAYERNORM)),
            "forward warp tier: gamma/beta in shared memory on staged fp32 or LayerNorm rows");
    require((pl.staged ? 2 * (size_t)pl.vpt * pl.threads * 16 : 0) +
                    (pl.param_smem ? 2 * (size_t)p.cols * 4 : 0) <=
                (size_t)dev.max_smem_optin,
            "forward warp tier: stages and gamma/beta fit in shared memory");
    return;
  }
  if (!require(pl.tier == TIER_ROW, "forward: the warp or the row tier"))
    return;
  require(is_pow2(pl.cluster) && pl.cluster <= max_cluster, "forward: a cluster the GPU allows");
  require(kTuningBuild || !wide || dev.cc_major < 9 || p.dtype == FNORM_DTYPE_F32 ||
              p.param_dtype == FNORM_DTYPE_F32 || p.norm != FNORM_RMSNORM || p.cols <= 32768 ||
              (p.cols >= 65536 && p.cols < 262144) || p.cols > 524288 ||
              (pl.mode == MODE_CTA && pl.cluster > 1),
          "forward: 16-bit RMSNorm rows with 16-bit gamma of 32769-65535 and 262144-524288 take "
          "the lean form over a cluster (sm_90)");
  require(pl.threads >= 32 && pl.threads <= 1024 && pl.threads % 32 == 0,
          "forward: 32 to 1024 threads, whole warps");
  switch (pl.mode) {
  case MODE_CTA:
    require(wide, "forward CTA-per-row kernel: 16-byte rows");
    if (pl.cluster > 1) {
      require(pl.variant == 1 && dev.cc_major >= 9, "forward lean form over a cluster: sm_90");
      require(pl.chunk * pl.cluster >= nvec && pl.chunk * (pl.cluster - 1) < nvec,
              "forward lean form over a cluster: the row covered, every CTA a chunk");
      require((int64_t)pl.threads * pl.vpt >= pl.chunk && pl.vpt <= 8,
              "forward lean form over a cluster: the chunk held, at most 32 elements a thread");
      require(p.norm == FNORM_RMSNORM || (pl.vpt <= 4 && (int64_t)pl.threads * pl.vpt == pl.chunk &&
                                          pl.chunk * pl.cluster == nvec),
              "forward lean form over a cluster: LayerNorm rows only in its FULL form");
      require(pl.grid < 0 && -pl.grid <= p.rows, "forward lean form over a cluster: persistent");
      require(kTuningBuild || (p.dtype != FNORM_DTYPE_F32 &&
                               (p.param_dtype != FNORM_DTYPE_F32 || p.norm == FNORM_LAYERNORM) &&
                               pl.vpt * vec == 32 && p.cols > 32768 &&
                               (p.norm == FNORM_LAYERNORM || p.cols < 65536 || p.cols >= 262144)),
              "forward lean form over a cluster: 16-bit LayerNorm rows past 32768 (sweeps 59-60 "
              "and 68), 16-bit RMSNorm rows with 16-bit gamma of 32769-65535 and from 262144 on, "
              "32 elements a thread");
      break;
    }
    require(pl.cluster == 1, "forward CTA-per-row kernel: no cluster");
    require((int64_t)pl.threads * pl.vpt >= nvec, "forward CTA-per-row kernel: row covered");
    require(pl.grid >= 1 && pl.grid <= p.rows, "forward CTA-per-row kernel: a CTA a row");
    require(pl.reread == 0 || kTuningBuild ||
                (p.dtype == FNORM_DTYPE_F32 && p.cols <= 8192 && pl.vpt == 4 &&
                 pl.reread == (p.cols <= 4096 ? 48 : 40) &&
                 (p.norm == FNORM_RMSNORM ||
                  (p.cols <= 4096 && nvec % 128 == 0 && p.rows >= 64 * dev.sm_count))),
            "forward CTA-per-row kernel: x read again for y only on fp32 rows of up to 8192 "
            "(LayerNorm: up to 4096, full, 64 rows an SM), 16 elements a thread, in 48 or 40 "
            "registers");
    if (!kTuningBuild) {
      const bool is16 = p.dtype != FNORM_DTYPE_F32, p16 = p.param_dtype != FNORM_DTYPE_F32;
      const bool rms = p.norm == FNORM_RMSNORM;
      const bool lean =
          rms ? (is16 ? p.cols > 10240 || (p16 && (p.cols > 8192 || p.rows * p.cols >= (1 << 25)))
                      : p.cols > 8192 && p.cols <= 16384)
          : is16 ? (p16 && p.cols <= 4096 && p.rows >= 64 * (int64_t)dev.sm_count) ||
                       ((p16 ? p.cols > 8192 : p.cols > 16384) && p.cols <= 32768 &&
                        p.cols % 1024 == 0)
                 : p.cols >= 5120 && p.cols <= 16384 && p.cols % 512 == 0;
      require(!!pl.variant == lean,
              "forward CTA-per-row kernel: the lean form on the rows of sweep 52's rules, A/B "
              "run AL1's and sweeps 61-62's");
      require(!pl.variant || rms || p.cols <= 4096 || (int64_t)pl.threads * pl.vpt == nvec,
              "forward CTA-per-row kernel: LayerNorm's lean form past 4096 only on rows it fills "
              "exactly (its FULL form: four vectors a thread spill otherwise)");
      require(!pl.variant ||
                  (pl.reread == 0 && pl.vpt * vec == (is16 && p.cols > 8192 ? 32 : 16)) ||
                  (int64_t)pl.vpt * 512 < nvec,
              "forward CTA-per-row kernel: the lean form at 16 elements a thread (16-bit rows "
              "past 8192: 32), more only where 1024 threads need them");
    }
    break;
  case MODE_REG:
    require(pl.vpt == fwd_reg_vpt(vec), "forward register kernel: its vectors a thread");
    require(pl.chunk * pl.cluster >= nvec, "forward register kernel: the row covered");
    require((int64_t)pl.threads * pl.vpt >= pl.chunk, "forward register kernel: chunk held");
    require(pl.grid < 0, "forward register kernel: persistent");
    break;
  case MODE_STAGED:
  case MODE_GLOBAL:
    require(pl.chunk * pl.cluster >= nvec, "forward staged kernel: the row covered");
    require(pl.nbuf == 1 || pl.nbuf == 2, "forward staged kernel: 1 or 2 buffers");
    require(kTuningBuild || !wide || dev.cc_major < 9 || nvec <= 65536 ||
                cdiv(nvec, 16) * 16 > dev.max_smem_optin,
            "forward staged kernel: not where the bulk-copy kernel takes the row");
    require(pl.smem <= (size_t)dev.max_smem_optin, "forward staged kernel: shared memory fits");
    require(pl.mode == MODE_STAGED || pl.smem == 0, "forward re-reading kernel: no stages");
    require(pl.grid < 0, "forward staged kernel: persistent");
    break;
  case MODE_BULK:
    require(wide && dev.cc_major >= 9, "forward bulk-copy kernel: 16-byte rows, sm_90");
    require(kTuningBuild || (p.dtype != FNORM_DTYPE_F32 && nvec > 65536),
            "forward bulk-copy kernel: 16-bit rows of more than 65536 vectors (sweep 57)");
    require(pl.cluster >= 1 && pl.cluster <= 16, "forward bulk-copy kernel: a cluster of 1-16");
    require(pl.chunk * pl.cluster >= nvec && pl.chunk * (pl.cluster - 1) < nvec,
            "forward bulk-copy kernel: the row covered, every CTA a part");
    require(pl.smem == (size_t)pl.chunk * 16 && pl.smem <= (size_t)dev.max_smem_optin,
            "forward bulk-copy kernel: the chunk fits in shared memory");
    require(pl.cluster == 1 ||
                (size_t)cdiv(nvec, pl.cluster / 2) * 16 > (size_t)dev.max_smem_optin ||
                p.rows * (pl.cluster / 2) < dev.sm_count,
            "forward bulk-copy kernel: the smallest cluster that holds the row, or more SMs for "
            "few rows");
    require(pl.nbuf >= 1 && pl.nbuf <= kBulkMaxPieces, "forward bulk-copy kernel: 1-8 pieces");
    require(pl.threads == 512 && pl.grid < 0,
            "forward bulk-copy kernel: persistent 512-thread CTAs");
    break;
  case MODE_LOOP:
    require(wide && (p.norm == FNORM_RMSNORM) == !(pl.variant > 8 && ((pl.variant - 8) & kLoopLn)),
            "forward loop kernel: 16-byte rows, LayerNorm ones in fwd_loop_ln_kernel's forms");
    require(pl.threads >= 32 && pl.threads <= 1024 && pl.threads % 32 == 0 && pl.cluster == 1 &&
                (pl.vpt == 1 || pl.vpt == 2 || pl.vpt == 4 || pl.vpt == 8),
            "forward loop kernel: whole warps, one CTA a row, 1, 2, 4 or 8 vectors a step");
    if (p.norm == FNORM_LAYERNORM) {
      require(pl.vpt * vec == 32 && pl.threads == loop_full_threads(pl.variant - 8) &&
                  p.cols % (32 * (int64_t)pl.threads) == 0,
              "forward LayerNorm loop kernel: 32 values a thread a step, rows of whole steps of "
              "the form's threads");
      /* fp32 rows of 32768 with gamma and beta (check_forward's callers give both): persistent,
       * kFwdLoopLnStaged vectors of gamma and beta a thread in shared memory, the carve-out the
       * request rounded down */
      const size_t staged_bytes = kFwdLoopLnStagedBytes;
      const bool staged = kFwdLoopLnStaged > 0 && p.cols == 32768 && pl.threads == 1024 &&
                          staged_bytes <= (size_t)dev.max_smem_optin;
      require(staged ? pl.smem == staged_bytes && pl.grid == -p.rows &&
                           pl.carveout == fwd_loop_ln_staged_carveout(dev.smem_per_sm) &&
                           pl.carveout > 0 && pl.carveout <= 100
                     : pl.smem == 0 && pl.carveout == 0 && pl.grid >= 1 && pl.grid <= p.rows,
              "forward LayerNorm loop kernel: fp32 32768 persistent with its parameters staged "
              "and its carve-out, the rest a CTA a row");
      require(kTuningBuild ||
                  (full_ln(p, dev) && pl.variant == 8 + kLoopFull + kLoopFreeParams + kLoopLn +
                                                        loop_full_thread_bits((int)(p.cols / 32))),
              "forward LayerNorm loop kernel: fp32 rows of 8192-32768 in one step (sweep 95)");
      break;
    }
    require(kTuningBuild ||
                (p.dtype == FNORM_DTYPE_F32 && p.param_dtype == p.dtype && p.cols >= 2048 &&
                 p.cols <= 4096 && p.rows * p.cols >= ((int64_t)1 << 25) && pl.vpt == 4 &&
                 pl.threads * (int64_t)pl.vpt >= nvec && pl.variant == 0) ||
                (pl.variant > 8 && ((pl.variant - 8) & kLoopFull) != 0 &&
                 p.param_dtype == p.dtype && p.rows >= 2 * (int64_t)dev.sm_count &&
                 pl.vpt == ((p.dtype != FNORM_DTYPE_F32 && p.cols == 8192) ||
                                    (p.dtype == FNORM_DTYPE_F32 && p.cols == 5120 &&
                                     p.rows * p.cols >= ((int64_t)1 << 26))
                                ? 4
                                : 8) &&
                 pl.threads == loop_full_threads(pl.variant - 8) &&
                 nvec % (pl.vpt * (int64_t)pl.threads) == 0 &&
                 (pl.variant - 8 - kLoopFull - kLoopFreeParams == 0 ||
                  pl.variant - 8 - kLoopFull - kLoopFreeParams == kLoopFull512 ||
                  pl.variant - 8 - kLoopFull - kLoopFreeParams == kLoopFull256 ||
                  pl.variant - 8 - kLoopFull - kLoopFreeParams == kLoopFull160 ||
                  pl.variant - 8 - kLoopFull - kLoopFreeParams == kLoopFull320) &&
                 (p.dtype == FNORM_DTYPE_F32
                      ? p.cols == 5120 || p.cols == 8192 || p.cols == 32768 || p.cols == 65536 ||
                            (p.cols == 16384 && p.rows * p.cols >= ((int64_t)1 << 25))
                      : full16(p, dev))),
            "forward loop kernel: fp32 RMSNorm 2048-4096 from 2^25 elements in one step of four "
            "vectors (sweep 86); the full form: fp32 RMSNorm 5120-65536, 16-bit 8192-65536 "
            "(sweeps 91-99, A/B runs CP-CY)");
    require(pl.grid >= 1 && pl.grid <= p.rows, "forward loop kernel: a CTA a row");
    break;
  case MODE_SPREAD: {
    require(wide && dev.cc_major >= 9, "forward spread kernel: 16-byte rows, sm_90");
    require(nvec > 16 * 512 * (int64_t)fwd_reg_vpt(vec),
            "forward spread kernel: only rows the register kernel's clusters cannot hold");
    require(kTuningBuild || (p.dtype == FNORM_DTYPE_F32 && p.norm == FNORM_LAYERNORM),
            "forward spread kernel: fp32 LayerNorm rows (A/B run GO; tuning builds: "
            "FNORM_TUNE_FWD_SPREAD=2, any 16-byte row)");
    const int64_t last = nvec - pl.chunk * (pl.grid - 1);
    require(pl.cluster == 1 && pl.grid >= 1 && pl.grid <= dev.sm_count &&
                pl.grid <= kSpreadMaxCtas && pl.chunk >= kSpreadMinChunk && last >= 1 &&
                last <= pl.chunk && 2 * last >= pl.grid,
            "forward spread kernel: a CTA an SM at most, no cluster, the row covered by chunks of "
            "at least kSpreadMinChunk vectors, the last with room for a row's posting words");
    const int data = pl.threads - 32;
    require(pl.vpt == fwd_spread_vpt(vec) && data % 32 == 0 && data >= 32 &&
                data <= kSpreadMaxThreads && (int64_t)data * pl.vpt >= pl.chunk &&
                (int64_t)(data - 32) * pl.vpt < pl.chunk,
            "forward spread kernel: the fewest whole warps that hold the chunk at its vectors a "
            "thread, and a control warp");
    require(pl.nbuf >= 3 && pl.nbuf <= kSpreadMaxStages && pl.variant >= 1 &&
                pl.nbuf - pl.variant - 1 >= 1 && pl.nbuf - pl.variant - 1 <= 7 &&
                (kTuningBuild || pl.variant == pl.nbuf / 2 - 1) &&
                pl.smem == (size_t)pl.nbuf * (pl.chunk * 16 + 16) &&
                pl.smem + 1024 <= (size_t)dev.max_smem_optin,
            "forward spread kernel: 3-8 stages of the chunk (and the row's first vector), y "
            "about half of them behind");
    break;
  }
  case MODE_HOLD: {
    require(wide && dev.cc_major >= 9, "forward hold kernel: 16-byte rows, sm_90");
    require(kTuningBuild || (p.dtype == FNORM_DTYPE_F32 && p.norm == FNORM_RMSNORM),
            "forward hold kernel: fp32 RMSNorm rows (16-bit ones past the register kernel's take "
            "the bulk-copy kernel, LayerNorm ones the streaming kernel: A/B run EB)");
    require(nvec > 16 * 512 * (int64_t)fwd_reg_vpt(vec) || (kTuningBuild && p.cols > 32768),
            "forward hold kernel: only rows the register kernel's clusters cannot hold (tuning "
            "builds: FNORM_TUNE_FWD_HOLD=3, rows of more than 32768 elements)");
    const int per_sm = 2 * kHoldThreads / pl.threads;
    const int64_t cap = hold_cap_vecs(dev.smem_per_sm, per_sm);
    require((pl.threads == kHoldThreads || (kTuningBuild && pl.threads == kHoldThreads / 2)) &&
                pl.cluster == 1 &&
                (pl.nbuf == kHoldParts ||
                 (kTuningBuild && pl.nbuf >= 1 && pl.nbuf <= kBulkMaxPieces)) &&
                pl.smem == (size_t)cap * 16,
            "forward hold kernel: 512-thread CTAs (tuning builds also 256), no cluster, "
            "shared memory for its share of an SM");
    require(pl.nchunks >= 1 && pl.chunk <= cap && pl.chunk * pl.nchunks >= nvec &&
                pl.chunk * (pl.nchunks - 1) < nvec &&
                nvec - pl.chunk * (pl.nchunks - 1) >= pl.nchunks + 1,
            "forward hold kernel: the row covered by chunks that fit, each with room for the "
            "posts and their count");
    require(pl.grid % pl.nchunks == 0 && pl.grid >= pl.nchunks &&
                pl.grid <= per_sm * (int64_t)dev.sm_count && pl.grid / pl.nchunks <= p.rows,
            "forward hold kernel: whole rows of chunks, at most its CTAs an SM, no idle slot");
    break;
  }
  case MODE_STREAM:
    require(wide, "forward streaming kernel: 16-byte rows");
    require(pl.chunk * pl.cluster >= nvec, "forward streaming kernel: the row covered");
    require(pl.grid >= pl.cluster && pl.grid % pl.cluster == 0,
            "forward streaming kernel: whole clusters");
    require(pl.threads <= 512, "forward streaming kernel: at most its 512 threads");
    require(kTuningBuild || (pl.min_blocks == 4 && pl.hints == 1),
            "forward streaming kernel: the form built for 4 CTAs an SM, with L2 hints (sweep 39)");
    break;
  default:
    require(false, "forward row tier: a known mode");
  }
}

void check_backward(const Plan &pl, const fnorm_problem &p, int vec, const DeviceInfo &dev,
                    bool from_y) {
  const int64_t nvec = p.cols / vec;
  const bool wide = vec * (p.dtype == FNORM_DTYPE_F32 ? 4 : 2) == 16;
  const int max_cluster = dev.cc_major >= 9 ? 16 : 1;
  require(pl.vec == vec, "backward: the plan's width is the one asked for");
  require(pl.nparts >= 1, "backward: at least one partial row");
  require(pl.fin_cols == 16 || pl.fin_cols == 32, "backward finalize: 16 or 32 columns a block");
  require(pl.fin_vec == 1 || (pl.fin_vec == 4 && p.cols % 4 == 0),
          "backward finalize: 1 column a thread, or 4 of a row of a multiple of 4");
  require(!pl.rms_form ||
              (p.norm == FNORM_RMSNORM &&
               ((pl.tier == TIER_WARP && pl.cluster <= 1) || pl.tier == TIER_RING ||
                pl.tier == TIER_BATCH || (pl.tier == TIER_ROW && pl.mode == MODE_HOLD))),
          "backward: the RMS form only for RMSNorm, on the kernels that have it");
  require(!pl.thread_fill || (pl.tier == TIER_RING && pl.variant == 1 && pl.nbuf == 1),
          "backward: each thread's own refill only in the ring's RESIDENT form with one stage");
  require(kTuningBuild || pl.tier != TIER_RING || pl.variant != 1 ||
              pl.thread_fill == (pl.nbuf == 1),
          "backward ring RESIDENT: one stage refilled by each thread (bwd_resident_fill)");
  ++g_bwd_tiers[pl.tier == TIER_WARP    ? 0
                : pl.tier == TIER_RING  ? 2
                : pl.tier == TIER_ROW   ? 3
                : pl.tier == TIER_BATCH ? 5
                                        : 4];
  if (pl.tier == TIER_WARP && pl.cluster > 1)
    ++g_bwd_tiers[1];
  switch (pl.tier) {
  case TIER_WARP:
    require(is_pow2(pl.group) && pl.group >= 4 && pl.group <= 256,
            "backward warp tier: 4 to 256 lanes a row");
    require(pl.group <= 32 || wide, "backward warp tier: rows over several warps are 16-byte");
    require(pl.vpt * vec == 16, "backward warp tier: 16 elements a lane");
    /* cluster > 1: clusters of 8-warp CTAs, fp32 rows of up to 8 (16-bit and 16 CTAs: tuning
     * builds only). */
    require(pl.cluster == 1 || (pl.group == 256 && wide && dev.cc_major >= 9 &&
                                is_pow2(pl.cluster) && pl.cluster <= 16 && pl.param_smem),
            "backward warp tier: clusters only of 8-warp 16-byte rows on sm_90");
    require(pl.cluster == 1 || kTuningBuild || (p.dtype == FNORM_DTYPE_F32 && pl.cluster <= 8),
            "backward warp tier: clusters only of fp32 rows, of up to 8 CTAs");
    require((int64_t)pl.group * pl.vpt * pl.cluster >= nvec, "backward warp tier: row covered");
    require(pl.cluster > 1 ? (int64_t)pl.group * pl.vpt * (pl.cluster / 2) < nvec
                           : pl.group == 4 || (int64_t)(pl.group / 2) * pl.vpt < nvec,
            "backward warp tier: the fewest lanes that cover the row");
    require(pl.threads == 256, "backward warp tier: 256 threads");
    require(pl.nparts >= 1 && pl.nparts <= cdiv(p.rows, 256 / pl.group) &&
                pl.grid == pl.nparts * pl.cluster,
            "backward warp tier: 1 CTA (cluster) to one a row group, a partial row each");
    require(!pl.param_smem || (wide && pl.group >= 32),
            "backward warp tier: gamma/beta in shared memory only for 16-byte rows of a warp+");
    require(pl.smem + (pl.param_smem ? 2 * (size_t)cdiv(nvec, pl.cluster) * vec * 4 : 0) <=
                (size_t)dev.max_smem_optin,
            "backward warp tier: stages and gamma/beta fit in shared memory");
    break;
  case TIER_RING:
    require(dev.cc_major >= 9 && wide, "backward ring: sm_90 and 16-byte rows");
    require(is_pow2(pl.cluster) && pl.cluster <= 16, "backward ring: 1 to 16 CTAs a row");
    require(pl.chunk * pl.cluster >= nvec && pl.chunk * (pl.cluster - 1) < nvec,
            "backward ring: every CTA gets part of the row");
    require((pl.variant
                 ? pl.vpt == ring_resident_vpt(vec)
                 : pl.vpt == kRingVpt || (pl.vpt == kRingVptWide && p.dtype == FNORM_DTYPE_F32 &&
                                          !from_y && (kTuningBuild || nvec > 8192))) &&
                (int64_t)pl.threads * pl.vpt >= pl.chunk,
            "backward ring: the chunk held by the threads (four vectors only fp32 from x past "
            "8192)");
    require(pl.vpt != kRingVptWide || pl.variant || p.dtype != FNORM_DTYPE_F32 ||
                (!pl.rms_form && !pl.param_smem),
            "backward ring: four vectors a thread only in the general form from x (the one "
            "built)");
    require(pl.threads >= 32 && pl.threads <= 512 && pl.threads % 32 == 0,
            "backward ring: 32 to 512 threads, whole warps");
    require(kTuningBuild || !pl.variant ||
                (!from_y &&
                 (2 * p.rows >= 3 * (int64_t)dev.sm_count ||
                  (p.dtype == FNORM_DTYPE_F32 && pl.nbuf >= 2 && p.rows >= dev.sm_count)) &&
                 (p.dtype == FNORM_DTYPE_F32
                      ? nvec > (int64_t)16 * 512 * kRingVptWide
                      : nvec > (int64_t)16 * 512 * kRingVpt ||
                            (p.param_dtype == FNORM_DTYPE_F32 && pl.threads <= 128))),
            "backward ring: the RESIDENT form for rows past the register ring's (fp32: past four "
            "vectors a thread), or 16-bit rows with fp32 gamma in CTAs of up to 128 threads, from "
            "x, 1.5 rows an SM or more (fp32 in two stages: one row an SM)");
    require(pl.variant || (pl.nbuf >= 2 && pl.smem == (size_t)pl.nbuf * pl.chunk * 32 &&
                           pl.smem <= (size_t)dev.max_smem_optin),
            "backward ring: two stages or more that fit in shared memory");
    {
      const bool is16 = p.dtype != FNORM_DTYPE_F32;
      const bool ln16 =
          is16 && !from_y && p.norm == FNORM_LAYERNORM && p.param_dtype != FNORM_DTYPE_F32;
      const bool three =
          (is16 && nvec > 512 && nvec <= 640 && !(p.norm == FNORM_RMSNORM && !from_y)) ||
          (ln16 && nvec > 640 && nvec <= 1024);
      require(kTuningBuild || pl.variant || pl.nbuf == (three ? 3 : 2),
              "backward ring: 3 stages for 16-bit rows of 513-640 vectors (not RMSNorm from x) "
              "and 16-bit LayerNorm rows of 641-1024 from x with 16-bit gamma, else 2");
    }
    require(!pl.variant ||
                (pl.nbuf >= 1 && pl.smem == (size_t)pl.nbuf * pl.chunk * 32 + pl.chunk * vec * 4 &&
                 pl.smem <= (size_t)dev.max_smem_optin),
            "backward ring RESIDENT: a stage or more and gamma's fp32 chunk in shared memory");
    break;
  case TIER_ROW:
    if (pl.mode == MODE_HOLD) {
      require(dev.cc_major >= 9 && wide && !from_y,
              "backward hold tier: sm_90, 16-byte rows from x");
      require(kTuningBuild || (p.dtype == FNORM_DTYPE_F32 &&
                               [&] {
                                 const Plan o = plan_backward(&p, vec, dev, from_y, false);
                                 return o.tier == TIER_STREAM ||
                                        (o.tier == TIER_RING && o.variant == 1 && o.nbuf == 1);
                               }()),
              "backward hold tier: fp32 rows the ring's RESIDENT form would take in one stage or "
              "the stream tier would take (tuning builds: FNORM_TUNE_BWD_HOLD=2, every dtype from "
              "65536 elements)");
      const int stages = pl.nbuf;
      const int per_sm = stages == 1 && pl.vpt == bwd_hold_vpt(vec, 2, 1) ? 2 : 1;
      const int64_t cap = (int64_t)pl.vpt * pl.threads;
      require(((stages == 1 && pl.vpt == bwd_hold_vpt(vec, 1, 1)) ||
               (kTuningBuild && ((stages == 2 && pl.vpt == bwd_hold_vpt(vec, 1, 2)) ||
                                 (stages == 1 && pl.vpt == bwd_hold_vpt(vec, 2, 1))))) &&
                  pl.threads == kHoldThreads && pl.cluster == 1 &&
                  pl.smem == (size_t)cap * bwd_hold_vec_bytes(vec, stages) + kDynSmemLinePad &&
                  per_sm * (pl.smem + 4096) <= (size_t)dev.smem_per_sm,
              "backward hold tier: 512-thread CTAs of 32 elements a thread, a CTA an SM, one "
              "stage (tuning builds also two of four vectors a thread, or 16 elements at two CTAs "
              "an SM), no cluster, dy, x and gamma's fp32 chunk in shared memory");
      const int64_t pieces = cdiv(nvec, pl.chunk);
      require(kTuningBuild || pl.chunk >= kBwdHoldMinChunk,
              "backward hold tier: chunks of kBwdHoldMinChunk vectors or more (A/B run EL)");
      require(pl.chunk <= cap && pl.chunk * (pieces - 1) < nvec && pl.nchunks >= pieces &&
                  pl.nchunks == per_sm * (int64_t)dev.sm_count,
              "backward hold tier: the row covered by chunks that fit, at most its CTAs");
      require(pl.grid % pieces == 0 && pl.grid <= pl.nchunks && pl.grid / pieces <= p.rows &&
                  pl.grid / pieces <= pl.nparts && pl.nparts <= p.rows,
              "backward hold tier: whole rows of chunks, a partial row a slot, no idle slot");
      require(pl.ws_bytes >=
                      (size_t)(2 * pl.nparts * p.cols * 4 + p.rows * pl.nchunks * 8 + p.rows * 4) &&
                  pl.ws_bytes >= plan_backward(&p, vec, dev, from_y, false).ws_bytes,
              "backward hold tier: the workspace holds the partials, posts and counts, and the "
              "plan without it");
      break;
    }
    require(pl.mode == MODE_REG && pl.vpt == bwd_reg_vpt(vec), "backward row tier: registers");
    require(pl.cluster >= 1 && pl.cluster_rows >= 1 && pl.cluster * pl.cluster_rows <= max_cluster,
            "backward row tier: a cluster the GPU allows");
    require(pl.chunk * pl.cluster >= nvec, "backward row tier: the row covered");
    require((int64_t)pl.threads * pl.vpt >= pl.chunk && pl.threads <= 1024,
            "backward row tier: the chunk held by at most 1024 threads");
    require(pl.smem <= (size_t)dev.max_smem_optin, "backward row tier: shared memory fits");
    require(pl.grid == pl.nparts * pl.cluster * pl.cluster_rows,
            "backward row tier: a partial row a cluster");
    break;
  case TIER_STREAM:
    require(pl.chunk * pl.nchunks >= nvec, "backward stream tier: the row covered");
    require(pl.rows_per_part * pl.nparts >= p.rows && pl.rows_per_part * (pl.nparts - 1) < p.rows,
            "backward stream tier: every partial row has rows");
    break;
  case TIER_BATCH: {
    int threads = 0, vpt = 0, rows = 0, stages = 0, cluster = 0;
    batch_shape(p.cols, p.dtype == FNORM_DTYPE_F32 ? 4 : 2, threads, vpt, rows, stages, cluster);
    require(dev.cc_major >= 9 && wide && !from_y && p.dtype != FNORM_DTYPE_F32 &&
                p.param_dtype != FNORM_DTYPE_F32 && threads > 0,
            "backward batch tier: sm_90, 16-bit 16-byte rows from x with 16-bit gamma, the "
            "lengths batch_shape names");
    require(p.rows * p.cols >= ((int64_t)1 << 25), "backward batch tier: from 2^25 elements");
    require(pl.threads == threads && pl.vpt == vpt && pl.round_rows == rows && pl.nbuf == stages &&
                pl.cluster == cluster && (int64_t)threads * vpt * vec * cluster == p.cols,
            "backward batch tier: batch_shape's shape, the row exactly its cluster's vectors");
    require(pl.smem == (size_t)stages * rows * 2 * threads * vpt * 16 + kDynSmemLinePad &&
                pl.smem <= (size_t)dev.max_smem_optin,
            "backward batch tier: its stages, from a line, fit in shared memory");
    require(kTuningBuild || pl.cluster == 1 || p.norm == FNORM_LAYERNORM,
            "backward batch tier: clusters only of LayerNorm rows");
    require(pl.nparts >= 1 && pl.nparts <= cdiv(p.rows, rows) &&
                pl.grid == pl.nparts * pl.cluster && pl.cluster <= 16,
            "backward batch tier: a partial row a cluster of up to 16, a round a cluster at least");
    break;
  }
  default:
    require(false, "backward: a known tier");
  }
  require(pl.ws_bytes >= (size_t)(2 * pl.nparts * p.cols * 4),
          "backward: the workspace holds the partial rows");
  require(pl.ws_bytes % 256 == 0, "backward: the workspace a multiple of 256 bytes");
  require(pl.ws_bytes <= backward_workspace_bytes(&p, dev),
          "backward: the workspace query answers at least this plan's workspace");
}

void check(const Device &d, const Pair &pair, fnorm_norm norm, int64_t rows, int64_t cols) {
  fnorm_problem p;
  memset(&p, 0, sizeof p);
  p.norm = norm;
  p.rows = rows;
  p.cols = cols;
  p.dtype = pair.dtype;
  p.param_dtype = pair.param;
  p.eps = 1e-5f;
  p.x_stride = p.y_stride = p.dy_stride = p.dx_stride = cols;
  const int wide = 16 / pair.bytes;
  const int vecs[2] = {cols % wide == 0 ? wide : 1, 1};
  for (int v = 0; v < (vecs[0] == 1 ? 1 : 2); ++v)
    for (int dir = 0; dir < 2; ++dir) {
      g_why[0] = 0;
      if (dir == 0) {
        check_forward(plan_forward(&p, vecs[v], d.info), p, vecs[v], d.info);
        require(plan_forward(&p, vecs[v], d.info, false).mode != MODE_HOLD &&
                    plan_forward(&p, vecs[v], d.info, false).mode != MODE_SPREAD,
                "forward without the hold or spread kernel (in place, or after its launch was "
                "refused): never planned");
      } else
        check_backward(plan_backward(&p, vecs[v], d.info, false), p, vecs[v], d.info, false);
      if (dir == 1 && !g_why[0]) { /* and from y */
        Plan pl = plan_backward(&p, vecs[v], d.info, true);
        check_backward(pl, p, vecs[v], d.info, true);
        plan_backward_from_y(pl, &p, true, d.info);
        require(!pl.param_smem || pl.tier != TIER_RING || p.norm == FNORM_LAYERNORM,
                "backward ring from y: beta in shared memory only for LayerNorm");
        require(pl.tier != TIER_RING || pl.smem <= (size_t)d.info.max_smem_optin,
                "backward ring from y: stages and beta fit in shared memory");
        require(pl.tier != TIER_RING || !pl.param_smem ||
                    pl.smem == plan_backward(&p, vecs[v], d.info, true).smem +
                                   (size_t)pl.chunk * pl.vec * 4,
                "backward ring from y: beta's fp32 chunk after the stages");
        require(kTuningBuild || pl.fast_div == (pair.bytes == 2),
                "backward from y: __fdividef on 16-bit rows, IEEE division on fp32 rows");
        require(kTuningBuild || pl.tier != TIER_RING || !pl.variant,
                "backward from y: not the ring's RESIDENT form");
        require(!pl.rms_form, "backward from y: not the RMS form (it is from x)");
      }
      if (!g_why[0]) {
        ++g_passed;
        continue;
      }
      if (++g_failed <= 20)
        printf("FAIL %s, dtype %d param %d, %s, M = %lld, N = %lld, %d-element access: %s\n",
               d.name, (int)pair.dtype, (int)pair.param, norm == FNORM_LAYERNORM ? "LN" : "RMS",
               (long long)rows, (long long)cols, vecs[v], g_why);
    }
}

/* The choices the benchmarks measured (bench/tune/), on the H200 and the A100 descriptions: a
 * failed expectation means the planner no longer picks what the numbers picked. */
void expect(const Device &d, fnorm_dtype dt, fnorm_norm norm, int64_t rows, int64_t cols,
            bool backward, bool ok, const char *what) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  printf("FAIL %s, dtype %d, %s %s, M = %lld, N = %lld: expected %s\n", d.name, (int)dt,
         norm == FNORM_LAYERNORM ? "LN" : "RMS", backward ? "backward" : "forward", (long long)rows,
         (long long)cols, what);
}

/* Rows of the main benchmark grid's problem of row length cols: M*N = 2^27 (at least one). */
int64_t grid_rows(int64_t cols) {
  const int64_t rows = ((int64_t)1 << 27) / cols;
  return rows > 0 ? rows : 1;
}

fnorm_problem problem(fnorm_dtype dt, fnorm_norm norm, int64_t rows, int64_t cols) {
  fnorm_problem p;
  memset(&p, 0, sizeof p);
  p.norm = norm;
  p.rows = rows;
  p.cols = cols;
  p.dtype = p.param_dtype = dt;
  p.eps = 1e-5f;
  p.x_stride = p.y_stride = p.dy_stride = p.dx_stride = cols;
  return p;
}

void check_choices() {
  if (kTuningBuild) /* the environment may move the knobs */
    return;
  const Device &h200 = kDevices[0], &a100 = kDevices[1];
  const fnorm_norm LN = FNORM_LAYERNORM, RMS = FNORM_RMSNORM;
  const fnorm_dtype F32 = FNORM_DTYPE_F32, BF16 = FNORM_DTYPE_BF16, F16 = FNORM_DTYPE_F16;
  /* Backward: fp32 rows of 4097-32768 from y over a cluster of 8-warp CTAs (sweep 28) from 4096
   * rows on (sweep 30), the ring otherwise (from x since sweep 64, fewer rows, 16-bit rows,
   * 65536, sm_80). */
  const int64_t cl_cols[] = {5120, 8192, 16384, 32768};
  const int cl_size[] = {2, 2, 4, 8};
  for (int i = 0; i < 4; ++i)
    for (int nm = 0; nm < 2; ++nm) {
      const fnorm_norm norm = nm ? RMS : LN;
      const int64_t rows = grid_rows(cl_cols[i]);
      fnorm_problem p = problem(F32, norm, rows, cl_cols[i]);
      Plan pl = plan_backward(&p, 4, h200.info, true);
      expect(h200, F32, norm, rows, cl_cols[i], true,
             pl.tier == TIER_WARP && pl.group == 256 && pl.cluster == cl_size[i],
             "from y: the 8-warp rows over a cluster");
      pl = plan_backward(&p, 4, h200.info, false);
      expect(h200, F32, norm, rows, cl_cols[i], true, pl.tier == TIER_RING, "from x: the ring");
      pl = plan_backward(&p, 4, a100.info, false);
      expect(a100, F32, norm, rows, cl_cols[i], true, pl.tier != TIER_WARP, "no warp-tier row");
      p.rows = 2048; /* few rows: the ring (sweep 30) */
      pl = plan_backward(&p, 4, h200.info, false);
      expect(h200, F32, norm, 2048, cl_cols[i], true, pl.tier == TIER_RING, "the ring");
      p.rows = rows;
      p = problem(BF16, norm, rows, cl_cols[i]);
      pl = plan_backward(&p, 8, h200.info, false);
      const bool batch = norm == LN || cl_cols[i] <= 8192; /* (LayerNorm 16384-32768: a cluster) */
      expect(h200, BF16, norm, rows, cl_cols[i], true, pl.tier == (batch ? TIER_BATCH : TIER_RING),
             batch ? "the batch tier" : "the ring");
      p.rows = (((int64_t)1 << 25) - 1) / cl_cols[i]; /* below 2^25 elements: the ring */
      pl = plan_backward(&p, 8, h200.info, false);
      expect(h200, BF16, norm, p.rows, cl_cols[i], true, pl.tier == TIER_RING, "the ring");
      pl = plan_backward(&p, 8, a100.info, false);
      expect(a100, BF16, norm, p.rows, cl_cols[i], true, pl.tier != TIER_BATCH,
             "no batch tier before sm_90");
    }
  /* The finalize: 16 columns a block at N = 1024, 32 from 4096 on (sweep 32). */
  const int64_t fin_cols[] = {1024, 4096};
  for (int i = 0; i < 2; ++i) {
    fnorm_problem q = problem(FNORM_DTYPE_F16, LN, 4096, fin_cols[i]);
    expect(h200, FNORM_DTYPE_F16, LN, 4096, fin_cols[i], true,
           plan_backward(&q, 8, h200.info, false).fin_cols == (i == 0 ? 16 : 32),
           i == 0 ? "a finalize of 16 columns a block" : "a finalize of 32 columns a block");
  }
  /* fp32 rows past 8192 vectors from x: four vectors a thread, 512 threads, so 65536 takes a
   * cluster of 8 and rows of up to 131072 stay in the ring; 32768 and rows from y keep two. */
  const int64_t wcols[] = {32768, 65536, 131072};
  for (int i = 0; i < 3; ++i)
    for (int nm = 0; nm < 2; ++nm) {
      const fnorm_norm norm = nm ? RMS : LN;
      const int64_t rows = grid_rows(wcols[i]);
      fnorm_problem p = problem(F32, norm, rows, wcols[i]);
      const Plan pl = plan_backward(&p, 4, h200.info, false);
      const bool wide = wcols[i] > 32768;
      expect(h200, F32, norm, rows, wcols[i], true,
             pl.tier == TIER_RING && pl.vpt == (wide ? kRingVptWide : kRingVpt) &&
                 pl.threads == 512 && pl.cluster == (wcols[i] == 131072 ? 16 : 8),
             wide ? "the ring, four vectors a thread" : "the ring, two vectors a thread");
      const Plan py = plan_backward(&p, 4, h200.info, true);
      expect(h200, F32, norm, rows, wcols[i], true,
             !(py.tier == TIER_RING && py.vpt == kRingVptWide),
             "from y: not the ring at four vectors a thread");
    }
  fnorm_problem p = problem(F32, LN, 2048, 65536);
  /* Forward warp tier with 2^27 elements: the rows form (sweeps 63, 69, 70 and 100) on 16-byte
   * rows of 32, 96, 128 and 256 vectors over a warp, fp32 rows of 192 too, rows of 64 and 16-bit
   * rows of 32 and 48 over half a warp, at the rows a CTA below (fp32 2048: the CTA-per-row kernel;
   * 16-bit 1536, 192 vectors, one-warp CTAs). With 4096 rows: persistent 256-thread CTAs,
   * gamma/beta from global memory. */
  struct {
    int64_t cols;
    bool bf16;
    int lanes, vpl, rows_ln, rows_rms; /* lanes 0: not the rows form */
  } const fshape[] = {
      {256, false, 16, 4, 2, 2}, {384, false, 32, 3, 2, 2},  {512, false, 32, 4, 2, 2},
      {768, false, 32, 6, 1, 1}, {1024, false, 32, 8, 1, 1}, {256, true, 16, 2, 4, 4},
      {384, true, 16, 3, 4, 4},  {512, true, 16, 4, 2, 2},   {768, true, 32, 3, 2, 2},
      {1024, true, 32, 4, 2, 2}, {2048, true, 32, 8, 1, 1},  {1536, true, 0, 0, 0, 0}};
  for (const auto &f : fshape)
    for (int nm = 0; nm < 2; ++nm) {
      const fnorm_dtype dtype = f.bf16 ? BF16 : F32;
      const fnorm_norm norm = nm ? RMS : LN;
      const int vec = f.bf16 ? 8 : 4;
      const int64_t rows = grid_rows(f.cols);
      p = problem(dtype, norm, rows, f.cols);
      const Plan pl = plan_forward(&p, vec, h200.info);
      if (f.lanes)
        expect(h200, dtype, norm, rows, f.cols, false,
               pl.tier == TIER_WARP && pl.threads == 32 && pl.group == f.lanes && pl.vpt == f.vpl &&
                   pl.variant == (nm ? f.rows_rms : f.rows_ln),
               f.lanes == 16 ? "the rows form over half a warp (sweeps 69 and 100)"
                             : "the rows form over a warp (sweeps 63 and 69)");
      else
        expect(h200, dtype, norm, rows, f.cols, false,
               pl.tier == TIER_WARP && pl.threads == 32 && pl.variant == 0,
               "one-warp CTAs (not measured in the rows form)");
      expect(h200, dtype, norm, rows, f.cols, false, !pl.param_smem,
             "gamma/beta from global memory");
      p = problem(dtype, norm, 4096, f.cols);
      expect(h200, dtype, norm, 4096, f.cols, false, !plan_forward(&p, vec, h200.info).param_smem,
             "gamma/beta from global memory");
      expect(h200, dtype, norm, 4096, f.cols, false,
             plan_forward(&p, vec, h200.info).threads == 256, "persistent 256-thread CTAs");
    }
  /* Forward warp tier's persistent grid: 48 CTAs an SM, 32 for LayerNorm rows of 64 vectors
   * (sweeps 41-42); rows of 256-512 with fp32 gamma (with bf16 gamma they take the rows
   * form). */
  const int64_t gcols[] = {64, 256, 384, 512};
  for (int i = 0; i < 4; ++i)
    for (int nm = 0; nm < 2; ++nm) {
      const fnorm_norm norm = nm ? RMS : LN;
      const int64_t rows = grid_rows(gcols[i]);
      p = problem(BF16, norm, rows, gcols[i]);
      if (gcols[i] >= 256)
        p.param_dtype = FNORM_DTYPE_F32;
      const int cap = norm == LN && gcols[i] == 512 ? 32 : 48;
      const Plan pl = plan_forward(&p, 8, h200.info);
      expect(h200, BF16, norm, rows, gcols[i], false,
             pl.tier == TIER_WARP && pl.threads == 256 && pl.grid == cap * h200.info.sm_count,
             cap == 32 ? "32 persistent CTAs an SM" : "48 persistent CTAs an SM");
    }
  /* Forward: 16-bit rows of 4096-32768 on the CTA-per-row kernel, RMSNorm's in its lean form
   * (sweep 52), LayerNorm's at 4096 and past 8192 (A/B run AL1, sweep 61), not at 8192; past
   * 32768 on the register kernel. With 4096 rows of 4096, RMSNorm's and LayerNorm's not lean;
   * fp32 RMSNorm lean at 16384, not at 8192 (read again for y) or 32768; fp32 LayerNorm lean at
   * 8192-16384 (sweep 61), not at 32768. At 65536 RMSNorm on the packed rows form over a cluster
   * of 2 (sweep 76), LayerNorm on the lean form over a cluster (sweep 68). */
  /* 16-bit LayerNorm rows of 4096 and 5120 (the main grid's 2^27 elements): the packed rows
   * form with 16-bit gamma, the CTA-per-row kernel with fp32 gamma. */
  for (int i = 0; i < 2; ++i)
    for (int d = 0; d < 2; ++d) {
      const int64_t cols = i ? 5120 : 4096;
      p = problem(d ? F16 : BF16, LN, grid_rows(cols), cols);
      expect(h200, d ? F16 : BF16, LN, p.rows, cols, false,
             plan_forward(&p, 8, h200.info).packed == 1, "16-bit gamma: the packed rows form");
      p.param_dtype = FNORM_DTYPE_F32;
      expect(h200, d ? F16 : BF16, LN, p.rows, cols, false,
             plan_forward(&p, 8, h200.info).packed == 0 &&
                 plan_forward(&p, 8, h200.info).tier == TIER_ROW,
             "fp32 gamma: not the packed rows form");
    }
  const int64_t ccols[] = {4096, 8192, 16384, 20480, 24576, 32768, 65536};
  for (int i = 0; i < 7; ++i)
    for (int nm = 0; nm < 2; ++nm) {
      const fnorm_norm norm = nm ? RMS : LN;
      const int64_t rows = grid_rows(ccols[i]);
      p = problem(BF16, norm, rows, ccols[i]);
      const Plan pl = plan_forward(&p, 8, h200.info);
      /* (RMSNorm 65536: the packed rows form over a cluster of 2 where kFwdPackedCl is 2) */
      const bool rms_cl = norm == RMS && ccols[i] == 65536 && kFwdPackedCl == 2;
      const bool lcl = norm == LN && ccols[i] > 32768,
                 reg = norm == RMS && ccols[i] > 32768 && !rms_cl,
                 packed =
                     (norm == LN && ccols[i] <= 32768 && ccols[i] != 20480 && ccols[i] != 24576) ||
                     (norm == RMS && ccols[i] == 16384) || rms_cl,
                 lean = !reg && (norm == RMS || ccols[i] <= 4096 || ccols[i] > 8192),
                 full = full16(p, h200.info); /* (A/B runs CS and CU) */
      /* (LayerNorm 65536 from 2^25 elements: the batch tier, A/B run GB) */
      const bool batch = norm == LN && ccols[i] == 65536;
      if (batch) {
        expect(h200, BF16, norm, rows, ccols[i], false, pl.tier == TIER_BATCH, "the batch tier");
      } else if (full) {
        expect(h200, BF16, norm, rows, ccols[i], false,
               pl.mode == MODE_LOOP && pl.vpt == (ccols[i] == 8192 ? 4 : 8) &&
                   pl.threads == (ccols[i] == 65536   ? 1024
                                  : ccols[i] == 32768 ? 512
                                                      : 256),
               "the loop kernel's full form at 256, 512 or 1024 threads (8192: four vectors a "
               "step)");
      } else if (packed) {
        expect(h200, BF16, norm, rows, ccols[i], false, pl.tier == TIER_WARP && pl.packed,
               "the packed rows form");
      } else {
        expect(h200, BF16, norm, rows, ccols[i], false,
               pl.mode == (reg ? MODE_REG : MODE_CTA) && !!pl.variant == lean &&
                   (pl.mode == MODE_CTA && pl.cluster > 1) == lcl,
               reg    ? "the register kernel"
               : lcl  ? "the lean form over a cluster"
               : lean ? "the CTA-per-row kernel's lean form"
                      : "the CTA-per-row kernel");
      }
      p.rows = 4096;
      if (batch) {
        expect(h200, BF16, norm, 4096, ccols[i], false,
               plan_forward(&p, 8, h200.info).tier == TIER_BATCH,
               "4096 rows of 65536: the batch tier");
        p.rows = 256; /* (2^24 elements) */
        expect(h200, BF16, norm, 256, ccols[i], false,
               plan_forward(&p, 8, h200.info).mode == MODE_CTA &&
                   plan_forward(&p, 8, h200.info).cluster > 1,
               "256 rows of 65536: the lean form over a cluster");
      } else if (full16(p, h200.info)) {
        expect(h200, BF16, norm, 4096, ccols[i], false,
               plan_forward(&p, 8, h200.info).mode == MODE_LOOP,
               "4096 rows of 32768 or 65536: the loop kernel's full form");
      } else if (packed && 4096 * ccols[i] >= packed_rows_min_elements(norm == LN, ccols[i], 2)) {
        expect(h200, BF16, norm, 4096, ccols[i], false, plan_forward(&p, 8, h200.info).packed == 1,
               "4096 rows of 16384 or more: the packed rows form (2^25 elements)");
      } else {
        expect(h200, BF16, norm, 4096, ccols[i], false,
               !!plan_forward(&p, 8, h200.info).variant ==
                   (!reg && ((norm == RMS && ccols[i] > 4096) || ccols[i] > 8192)),
               "4096 rows: the lean form for RMSNorm rows of 8192 (16384 and 32768 from 2^25 "
               "elements on the packed form), LayerNorm's of 8193-32768 and (over a cluster) past "
               "32768");
      }
    }
  /* The forward's batch tier (A/B run GB): fp32 rows of 65536 and 262144 from 2^25 elements (below,
   * other kernels: the register kernel's fp32 LayerNorm forms are checked below), 16-bit LayerNorm
   * 262144 from 2^27 (at 2^25 it lost 2.9-4.0 points to the lean form over a cluster), RMSNorm
   * 262144 from 2^25, RMSNorm 65536 from 2^25 up to where the loop kernel's full form takes it
   * (2^26); never with fp32 gamma on 16-bit rows, never on sm_80. */
  {
    static const struct {
      fnorm_dtype dt;
      fnorm_norm norm;
      int64_t rows, cols;
      bool batch;
      const char *why;
    } batch_rows[] = {
        {F32, LN, 2048, 65536, true, "fp32 65536 at 2^27 elements"},
        {F32, LN, 512, 262144, true, "fp32 262144 at 2^27 elements"},
        {F32, LN, 256, 65536, false, "fp32 65536 at 2^24 elements"},
        {BF16, LN, 512, 262144, true, "16-bit LayerNorm 262144 at 2^27 elements"},
        {BF16, LN, 256, 262144, false, "16-bit LayerNorm 262144 at 2^26 elements"},
        {F16, RMS, 128, 262144, true, "16-bit RMSNorm 262144 at 2^25 elements"},
        {BF16, RMS, 512, 65536, true, "16-bit RMSNorm 65536 at 2^25 elements"},
        {BF16, RMS, 1024, 65536, false, "16-bit RMSNorm 65536 at 2^26 elements (the full form)"}};
    for (const auto &c : batch_rows) {
      p = problem(c.dt, c.norm, c.rows, c.cols);
      const int vec = c.dt == F32 ? 4 : 8;
      expect(h200, c.dt, c.norm, c.rows, c.cols, false,
             (plan_forward(&p, vec, h200.info).tier == TIER_BATCH) == c.batch, c.why);
      expect(h200, c.dt, c.norm, c.rows, c.cols, false,
             plan_forward(&p, vec, a100.info).tier != TIER_BATCH, "sm_80: not the batch tier");
      if (c.dt != F32) {
        p.param_dtype = F32;
        expect(h200, c.dt, c.norm, c.rows, c.cols, false,
               plan_forward(&p, vec, h200.info).tier != TIER_BATCH,
               "fp32 gamma: not the batch tier");
      }
    }
    p = problem(BF16, RMS, 1024, 65536);
    expect(h200, BF16, RMS, 1024, 65536, false, plan_forward(&p, 8, h200.info).mode == MODE_LOOP,
           "RMSNorm 65536 at 2^26 elements: the loop kernel's full form");
  }
  /* fp32 RMSNorm 5120: the full form at 320 threads of four vectors from 2^26 elements (sweep
   * 101), at 160 of eight below */
  for (int64_t rows = grid_rows(5120) / 4; rows <= grid_rows(5120); rows *= 2) {
    p = problem(F32, RMS, rows, 5120);
    const Plan pl = plan_forward(&p, 4, h200.info);
    const bool wide = rows * 5120 >= ((int64_t)1 << 26);
    expect(h200, F32, RMS, rows, 5120, false,
           pl.mode == MODE_LOOP && pl.threads == (wide ? 320 : 160) && pl.vpt == (wide ? 4 : 8) &&
               pl.variant == 8 + kLoopFull + kLoopFreeParams + (wide ? kLoopFull320 : kLoopFull160),
           wide ? "fp32 RMSNorm 5120 from 2^26 elements: the full form, 320 threads x 4 vectors"
                : "fp32 RMSNorm 5120 below 2^26 elements: the full form, 160 threads x 8 vectors");
  }
  {
    const int64_t fcols[] = {8192, 16384, 32768};
    for (int i = 0; i < 3; ++i) {
      p = problem(F32, RMS, grid_rows(fcols[i]), fcols[i]);
      const Plan pl = plan_forward(&p, 4, h200.info);
      expect(h200, F32, RMS, p.rows, fcols[i], false, pl.mode == MODE_LOOP,
             "fp32: the loop kernel's full form");
      p.norm = LN;
      const Plan pln = plan_forward(&p, 4, h200.info);
      expect(h200, F32, LN, p.rows, fcols[i], false,
             full_ln(p, h200.info) && pln.tier == TIER_ROW && pln.mode == MODE_LOOP &&
                 pln.vpt == 8 && (int64_t)pln.threads * 32 == fcols[i] &&
                 ((pln.variant - 8) & kLoopLn) != 0,
             "fp32 LayerNorm: fwd_loop_ln_kernel, the row in one step of 32 values a thread");
      /* 32768 with gamma and beta: its parameters' first vectors staged for the launch
       * (kFwdLoopLnStaged); without them, not (the same kernel a CTA a row) */
      const Plan plain = plan_forward(&p, 4, h200.info, true, false);
      expect(h200, F32, LN, p.rows, fcols[i], false,
             fcols[i] == 32768 && kFwdLoopLnStaged > 0
                 ? pln.smem == kFwdLoopLnStagedBytes && pln.grid == -p.rows && pln.carveout == 43 &&
                       plain.mode == MODE_LOOP && plain.variant == pln.variant && plain.smem == 0 &&
                       plain.grid == p.rows && plain.carveout == 0
                 : pln.smem == 0 && pln.carveout == 0 && plain.smem == 0,
             "fp32 LayerNorm 32768: gamma and beta staged in 96 KiB with a carve-out of 43% "
             "(228 KiB an SM), only where both are given");
      /* below its bound, the kernels before it */
      p.rows = full_ln_min_rows(fcols[i], h200.info) - 1;
      expect(h200, F32, LN, p.rows, fcols[i], false,
             !full_ln(p, h200.info) && plan_forward(&p, 4, h200.info).mode != MODE_LOOP,
             "fp32 LayerNorm below the loop kernel's bound: not the loop kernel");
      p.rows = grid_rows(fcols[i]);
      p.param_dtype = FNORM_DTYPE_BF16;
      expect(h200, F32, LN, p.rows, fcols[i], false,
             plan_forward(&p, 4, h200.info).mode != MODE_LOOP,
             "fp32 LayerNorm with 16-bit gamma: not the loop kernel");
    }
    p = problem(F32, LN, grid_rows(12288 + 128), 12288 + 128);
    expect(h200, F32, LN, p.rows, p.cols, false, !plan_forward(&p, 4, h200.info).variant,
           "fp32 LayerNorm: not the lean form on rows it does not fill exactly");
    /* 16-bit rows with fp32 gamma (sweep 62): LayerNorm lean past 16384, RMSNorm past 10240 */
    const int64_t gcols32[] = {10240, 12288, 16384, 20480, 32768};
    for (int i = 0; i < 5; ++i)
      for (int nm = 0; nm < 2; ++nm) {
        const fnorm_norm norm = nm ? RMS : LN;
        p = problem(BF16, norm, grid_rows(gcols32[i]), gcols32[i]);
        p.param_dtype = FNORM_DTYPE_F32;
        const bool lean = norm == RMS ? gcols32[i] > 10240 : gcols32[i] > 16384;
        expect(h200, BF16, norm, p.rows, p.cols, false,
               !!plan_forward(&p, 8, h200.info).variant == lean,
               lean ? "fp32 gamma: the lean form" : "fp32 gamma: not the lean form");
      }
    p = problem(BF16, LN, grid_rows(12288 + 512), 12288 + 512);
    expect(h200, BF16, LN, p.rows, p.cols, false, !plan_forward(&p, 8, h200.info).variant,
           "16-bit LayerNorm: not the lean form past 8192 on rows it does not fill exactly");
  }
  /* Forward register kernel: fp32 LayerNorm's statistics behind one barrier in CTAs of more
   * than 256 threads (sweeps 41-42; rows of 65536 and 262144 below 2^25 elements, the batch tier
   * from there), not in smaller ones (64 rows of 65536), not 16-bit (checked
   * on bf16 LayerNorm rows of 65544: since sweep 68 16-bit LayerNorm rows past 32768 take the
   * register kernel only where the lean form over a cluster does not fill its threads). */
  {
    p = problem(F32, LN, 256, 65536);
    Plan pl = plan_forward(&p, 4, h200.info);
    expect(h200, F32, LN, 256, 65536, false, pl.mode == MODE_REG && pl.variant == 1,
           "one barrier's statistics");
    p = problem(F32, LN, 96, 262144);
    pl = plan_forward(&p, 4, h200.info);
    expect(h200, F32, LN, 96, 262144, false, pl.mode == MODE_REG && pl.variant == 1,
           "one barrier's statistics");
    p = problem(F32, LN, 64, 65536);
    pl = plan_forward(&p, 4, h200.info);
    expect(h200, F32, LN, 64, 65536, false, pl.mode == MODE_REG && pl.variant == 0,
           "two barriers' statistics");
    p = problem(BF16, LN, 2048, 65536 + 8);
    pl = plan_forward(&p, 8, h200.info);
    expect(h200, BF16, LN, 2048, 65536 + 8, false, pl.mode == MODE_REG && pl.variant == 0,
           "two barriers' statistics");
  }
  /* Forward: fp32 LayerNorm rows past the register kernel's take the spread kernel, not in place:
   * 64 x 802816 over the 132 SMs in chunks of 1521 vectors (the last 1453) at four vectors a
   * thread, eight stages, y three rows behind (A/B run GO); in place and on sm_80 the
   * streaming kernel; 524288 (chunks of 993 vectors) and 2^20 (past 480 threads) the streaming
   * kernel. fp32 RMSNorm rows take the hold kernel, not in place: 64 x 802816 in 33 chunks of 6082
   * vectors, 8 rows at a time (8 rounds, every CTA busy); in place and on sm_80 the streaming
   * kernel. */
  {
    p = problem(F32, LN, 64, 802816);
    Plan pl = plan_forward(&p, 4, h200.info);
    expect(h200, F32, LN, 64, 802816, false,
           pl.mode == MODE_SPREAD && pl.chunk == 1521 && pl.grid == 132 && pl.threads == 416 &&
               pl.nbuf == 8 && pl.variant == 3,
           "the spread kernel, 132 chunks of 1521 vectors, 8 stages, y 3 rows behind");
    expect(h200, F32, LN, 64, 802816, false,
           plan_forward(&p, 4, h200.info, false).mode == MODE_STREAM, "in place: streaming");
    expect(a100, F32, LN, 64, 802816, false, plan_forward(&p, 4, a100.info).mode == MODE_STREAM,
           "sm_80: streaming");
    p = problem(F32, LN, 256, 524288);
    expect(h200, F32, LN, 256, 524288, false, plan_forward(&p, 4, h200.info).mode == MODE_STREAM,
           "chunks of 993 vectors: streaming");
    p = problem(F32, LN, 128, 1048576);
    expect(h200, F32, LN, 128, 1048576, false, plan_forward(&p, 4, h200.info).mode == MODE_STREAM,
           "chunks past 480 threads: streaming");
    p = problem(F32, RMS, 64, 802816);
    pl = plan_forward(&p, 4, h200.info);
    expect(h200, F32, RMS, 64, 802816, false,
           pl.mode == MODE_HOLD && pl.nchunks == 33 && pl.chunk == 6082 && pl.grid == 264,
           "the hold kernel, 33 chunks a row, 8 rows at a time");
    expect(h200, F32, RMS, 64, 802816, false,
           plan_forward(&p, 4, h200.info, false).mode == MODE_STREAM, "in place: streaming");
    expect(a100, F32, RMS, 64, 802816, false, plan_forward(&p, 4, a100.info).mode == MODE_STREAM,
           "sm_80: streaming");
  }
  /* Backward: rows past the register ring, from x, 1.5 rows an SM or more: the ring's RESIDENT
   * form (16-bit; fp32 since sweep 78, and where it takes one stage the hold tier since sweep
   * 108); from y, or 16-bit with 160 rows, the stream tier (sweeps 41-43); fp32 rows from x the
   * stream tier would take (160 rows, 524288: past 16 CTAs of the form) the hold tier; fp32
   * 131072 (the register ring's four vectors a thread) neither. */
  auto is_bwd_hold = [](const Plan &pl) { return pl.tier == TIER_ROW && pl.mode == MODE_HOLD; };
  const int64_t scols[] = {196608, 262144};
  for (int i = 0; i < 2; ++i) {
    const int64_t rows = grid_rows(scols[i]);
    p = problem(BF16, LN, rows, scols[i]);
    Plan pl = plan_backward(&p, 8, h200.info, false);
    expect(h200, BF16, LN, rows, scols[i], true, pl.tier == TIER_RING && pl.variant == 1,
           "the ring's RESIDENT form");
    expect(h200, BF16, LN, rows, scols[i], true,
           plan_backward(&p, 8, h200.info, true).tier == TIER_STREAM, "from y: the stream tier");
    expect(h200, BF16, LN, rows, scols[i], true,
           plan_backward(&p, 8, a100.info, false).tier == TIER_STREAM, "sm_80: the stream tier");
    p.rows = 160; /* under 1.5 rows an SM (sweep 43) */
    expect(h200, BF16, LN, 160, scols[i], true,
           plan_backward(&p, 8, h200.info, false).tier == TIER_STREAM, "the stream tier");
    p.rows = 256;
    expect(h200, BF16, LN, 256, scols[i], true, plan_backward(&p, 8, h200.info, false).variant == 1,
           "the ring's RESIDENT form");
    p = problem(F32, LN, rows, scols[i]); /* (one stage: the hold tier, sweep 108) */
    pl = plan_backward(&p, 4, h200.info, false);
    expect(h200, F32, LN, rows, scols[i], true, is_bwd_hold(pl) && pl.chunk == 4096,
           "the hold tier, chunks of 4096 vectors");
    pl = plan_backward(&p, 4, h200.info, false, false);
    expect(h200, F32, LN, rows, scols[i], true, pl.tier == TIER_RING && pl.variant == 1,
           "without the hold tier: the ring's RESIDENT form");
    expect(h200, F32, LN, rows, scols[i], true,
           plan_backward(&p, 4, h200.info, true).tier == TIER_STREAM, "from y: the stream tier");
    p.rows = 160;
    expect(h200, F32, LN, 160, scols[i], true, is_bwd_hold(plan_backward(&p, 4, h200.info, false)),
           "the hold tier");
  }
  {
    Plan pl;
    /* fp32 rows whose RESIDENT chunks take two stages: from one row an SM (sweep 78c) */
    p = problem(F32, RMS, 132, 139264);
    pl = plan_backward(&p, 4, h200.info, false);
    expect(h200, F32, RMS, 132, 139264, true,
           pl.tier == TIER_RING && pl.variant == 1 && pl.nbuf == 2,
           "the ring's RESIDENT form, two stages");
    p.rows = 100; /* (the hold tier's best cut, 10 chunks of 3482 vectors, is too short) */
    expect(h200, F32, RMS, 100, 139264, true,
           plan_backward(&p, 4, h200.info, false).tier == TIER_STREAM, "the stream tier");
    p = problem(F32, LN, 512, 262144); /* the hold tier, 16 chunks a row, 8 rows at a time */
    pl = plan_backward(&p, 4, h200.info, false);
    expect(h200, F32, LN, 512, 262144, true,
           is_bwd_hold(pl) && pl.chunk == 4096 && pl.grid == 128 && pl.nbuf == 1,
           "the hold tier, 16 chunks a row, 8 rows at a time");
    pl = plan_backward(&p, 4, h200.info, false, false); /* one stage, refilled by each thread */
    expect(h200, F32, LN, 512, 262144, true,
           pl.tier == TIER_RING && pl.variant == 1 && pl.nbuf == 1 && pl.thread_fill == 1,
           "without the hold tier: the ring's RESIDENT form, one stage, each thread's refill");
    {
      Plan fallback = {};
      const Plan held = plan_backward(&p, 4, h200.info, false, true, &fallback);
      expect(h200, F32, LN, 512, 262144, true,
             is_bwd_hold(held) && fallback.tier == pl.tier && fallback.variant == pl.variant &&
                 fallback.nbuf == pl.nbuf && fallback.grid == pl.grid &&
                 fallback.ws_bytes == pl.ws_bytes && held.ws_bytes >= fallback.ws_bytes,
             "the fallback the hold plan hands the dispatch: the plan without it");
    }
    p = problem(F32, LN, 132, 262144); /* (one stage: 1.5 rows an SM) */
    expect(h200, F32, LN, 132, 262144, true, is_bwd_hold(plan_backward(&p, 4, h200.info, false)),
           "the hold tier");
    p = problem(F32, RMS, 256, 524288);
    expect(h200, F32, RMS, 256, 524288, true, is_bwd_hold(plan_backward(&p, 4, h200.info, false)),
           "the hold tier");
    expect(h200, F32, RMS, 256, 524288, true,
           plan_backward(&p, 4, a100.info, false).tier == TIER_STREAM, "sm_80: the stream tier");
    p = problem(F32, LN, 128, 1048576); /* 66 chunks of 3972 vectors, 2 rows at a time */
    pl = plan_backward(&p, 4, h200.info, false);
    expect(h200, F32, LN, 128, 1048576, true,
           is_bwd_hold(pl) && pl.chunk == 3972 && pl.grid == 132 && pl.vpt == 8,
           "the hold tier, 66 chunks a row, two rows at a time");
    expect(h200, F32, LN, 128, 1048576, true,
           plan_backward(&p, 4, h200.info, true).tier == TIER_STREAM, "from y: the stream tier");
    p = problem(F32, LN, 64, 802816); /* (chunks of 3041 vectors: A/B run EL) */
    expect(h200, F32, LN, 64, 802816, true,
           plan_backward(&p, 4, h200.info, false).tier == TIER_STREAM, "the stream tier");
    p = problem(F32, LN, 1024, 131072);
    pl = plan_backward(&p, 4, h200.info, false);
    expect(h200, F32, LN, 1024, 131072, true,
           pl.tier == TIER_RING && pl.variant == 0 && pl.vpt == kRingVptWide,
           "the register ring, four vectors a thread");
  }
  /* Backward, 16-bit rows with fp32 gamma past the warp tier up to 640 vectors, from x, 1.5
   * rows an SM or more: the RESIDENT form in CTAs of 128 threads (sweep 48); longer rows (sweep
   * 64), 16-bit gamma, from y or 160 rows: the register ring. */
  const int64_t pcols[] = {5120, 16384, 32768, 65536};
  for (int i = 0; i < 4; ++i) {
    const int64_t rows = grid_rows(pcols[i]);
    p = problem(BF16, LN, rows, pcols[i]);
    p.param_dtype = FNORM_DTYPE_F32;
    Plan pl = plan_backward(&p, 8, h200.info, false);
    if (i == 0)
      expect(h200, BF16, LN, rows, pcols[i], true,
             pl.tier == TIER_RING && pl.variant == 1 && pl.threads <= 128,
             "fp32 gamma: the ring's RESIDENT form, 128 threads a CTA");
    else
      expect(h200, BF16, LN, rows, pcols[i], true, pl.tier == TIER_RING && pl.variant == 0,
             "fp32 gamma past 640 vectors: the register ring");
    expect(h200, BF16, LN, rows, pcols[i], true, plan_backward(&p, 8, h200.info, true).variant == 0,
           "from y: the register ring");
    p.rows = 160;
    expect(h200, BF16, LN, 160, pcols[i], true, plan_backward(&p, 8, h200.info, false).variant == 0,
           "160 rows: the register ring");
    p = problem(BF16, LN, rows, pcols[i]);
    expect(h200, BF16, LN, rows, pcols[i], true,
           plan_backward(&p, 8, h200.info, false).variant == 0, "bf16 gamma: the register ring");
  }
  /* Backward ring, 16-bit LayerNorm rows of 513-640 vectors from x with 16-bit gamma: a cluster
   * of 2 CTAs of up to 160 threads (sweep 65); RMSNorm's one CTA a row. fp32 rows of 1024
   * vectors from x: the ring from 8192 rows, the warp tier below (sweep 65). */
  const int64_t c640[] = {4608, 5120};
  for (int i = 0; i < 2; ++i) {
    /* (5120 from 2^25 elements takes the batch tier: below it) */
    const int64_t rows = i ? 4096 : grid_rows(c640[i]);
    p = problem(BF16, LN, rows, c640[i]);
    Plan pl = plan_backward(&p, 8, h200.info, false);
    expect(h200, BF16, LN, rows, c640[i], true,
           pl.tier == TIER_RING && pl.cluster == 2 && pl.threads == 160 && pl.nbuf == 3,
           "a cluster of 2 CTAs of 160 threads, 3 stages");
    p.norm = RMS;
    pl = plan_backward(&p, 8, h200.info, false);
    expect(h200, BF16, RMS, rows, c640[i], true, pl.tier == TIER_RING && pl.cluster == 1,
           "one CTA a row");
  }
  const int64_t r1024[] = {4096, 8192, 16384};
  for (int i = 0; i < 3; ++i) {
    p = problem(F32, LN, r1024[i], 4096);
    expect(h200, F32, LN, r1024[i], 4096, true,
           plan_backward(&p, 4, h200.info, false).tier == (i == 0 ? TIER_WARP : TIER_RING),
           i == 0 ? "4096 rows: the warp tier" : "the ring");
  }
  /* Backward, RMSNorm from x: the RMS form (A/B runs AK1-AK2) save on fp32 ring rows (from
   * 4096 since sweep 64; 16-bit rows of 2049-5120 now take the ring's RMS form, in 2 stages);
   * never LayerNorm. */
  struct {
    fnorm_dtype dt;
    int64_t rows, cols;
    bool rms_form;
  } const rf[] = {{BF16, 131072, 1024, true}, {BF16, 32768, 4096, true}, {BF16, 8192, 4096, true},
                  {BF16, 26214, 5120, true},  {BF16, 4096, 5120, true},  {BF16, 16384, 8192, true},
                  {BF16, 2048, 65536, true},  {BF16, 512, 262144, true}, {F32, 131072, 1024, true},
                  {F32, 32768, 4096, false},  {F32, 2048, 65536, false}, {F32, 512, 262144, true},
                  {F32, 4096, 4096, true}};
  for (const auto &c : rf) {
    p = problem(c.dt, RMS, c.rows, c.cols);
    const int v = c.dt == F32 ? 4 : 8;
    expect(h200, c.dt, RMS, c.rows, c.cols, true,
           plan_backward(&p, v, h200.info, false).rms_form == (int)c.rms_form,
           c.rms_form ? "the RMS form" : "the general kernels");
    p.norm = LN;
    expect(h200, c.dt, LN, c.rows, c.cols, true, !plan_backward(&p, v, h200.info, false).rms_form,
           "LayerNorm: the general kernels");
  }
  /* Forward loop kernel's full form: fp32 RMSNorm rows (fp32 gamma) of 32768 and 65536 at 1024
   * threads (sweep 91, A/B run CP), 8192 at 256 and 16384 at 512 (sweep 92, A/B run CR), with two
   * rows an SM, 16384 from 2^25 elements; not 16-bit rows, 16-bit gamma, rows between them,
   * longer multiples of 32768 or fewer rows. */
  {
    const int64_t fcols[] = {5120, 8192, 16384, 32768, 65536, 49152, 131072, 262144, 6144};
    for (int i = 0; i < 9; ++i) {
      const int64_t rows = grid_rows(fcols[i]);
      p = problem(F32, RMS, rows, fcols[i]);
      Plan pl = plan_forward(&p, 4, h200.info);
      /* (65536 and 262144 from 2^25 elements: the batch tier, A/B run GB; 65536 below, with two
       * rows an SM, the full form) */
      const bool batch = fcols[i] == 65536 || fcols[i] == 262144;
      const bool full = fcols[i] < 65536 && fcols[i] != 49152 && fcols[i] != 6144;
      if (batch) {
        expect(h200, F32, RMS, rows, fcols[i], false, pl.tier == TIER_BATCH,
               "65536 and 262144 from 2^25 elements: the batch tier");
        p = problem(F32, RMS, 2 * h200.info.sm_count, fcols[i]);
        expect(h200, F32, RMS, p.rows, fcols[i], false,
               (plan_forward(&p, 4, h200.info).mode == MODE_LOOP) == (fcols[i] == 65536),
               "65536 below 2^25 elements with two rows an SM: the full form");
        p = problem(F32, RMS, rows, fcols[i]);
      }
      /* (5120 at these 2^27 elements: 320 threads of four vectors, from 2^26) */
      const int threads = fcols[i] == 5120    ? 320
                          : fcols[i] == 8192  ? 256
                          : fcols[i] == 16384 ? 512
                                              : 1024;
      expect(h200, F32, RMS, rows, fcols[i], false,
             full == (pl.tier == TIER_ROW && pl.mode == MODE_LOOP &&
                      pl.vpt == (fcols[i] == 5120 ? 4 : 8) && pl.threads == threads &&
                      pl.variant == 8 + kLoopFull + kLoopFreeParams +
                                        (fcols[i] == 5120    ? kLoopFull320
                                         : fcols[i] == 8192  ? kLoopFull256
                                         : fcols[i] == 16384 ? kLoopFull512
                                                             : 0)),
             full ? "the loop kernel's full form"
                  : "not the full form: 6144, rows between 32768 and 65536 or from 65536 "
                    "(the batch tier)");
      if (fcols[i] == 16384) {
        p = problem(F32, RMS, 1024, fcols[i]);
        expect(h200, F32, RMS, p.rows, fcols[i], false,
               plan_forward(&p, 4, h200.info).mode != MODE_LOOP,
               "not the full form: 16384 below 2^25 elements (A/B run CR: level at 2^24, -5 at "
               "2^23)");
        p = problem(F32, RMS, 2048, fcols[i]);
        expect(h200, F32, RMS, p.rows, fcols[i], false,
               plan_forward(&p, 4, h200.info).mode == MODE_LOOP,
               "the full form: 16384 from 2^25 elements");
      }
      p = problem(F32, RMS, 2 * h200.info.sm_count - 1, fcols[i]);
      expect(h200, F32, RMS, p.rows, fcols[i], false,
             plan_forward(&p, 4, h200.info).mode != MODE_LOOP,
             "not the full form: fewer than two rows an SM");
      p = problem(BF16, RMS, rows, fcols[i]);
      expect(h200, BF16, RMS, rows, fcols[i], false,
             (plan_forward(&p, 8, h200.info).mode == MODE_LOOP) == full16(p, h200.info),
             full16(p, h200.info) ? "16-bit rows of 16384-65536: the full form"
                                  : "not the full form: other 16-bit rows");
      if (fcols[i] == 32768 || fcols[i] == 16384) {
        p = problem(BF16, RMS, 4095, fcols[i]);
        expect(h200, BF16, RMS, p.rows, fcols[i], false, plan_forward(&p, 8, h200.info).packed == 1,
               "16-bit rows of 32768 below 2^27 elements: the packed rows form (A/B run CS)");
      }
      p = problem(F32, RMS, rows, fcols[i]);
      p.param_dtype = FNORM_DTYPE_BF16;
      expect(h200, F32, RMS, rows, fcols[i], false,
             plan_forward(&p, 4, h200.info).mode != MODE_LOOP, "not the full form: 16-bit gamma");
    }
  }
  /* Forward CTA-per-row kernel: x read again for y on fp32 RMSNorm rows of 2048-8192 (sweep
   * 35), in 48 registers up to 4096, 40 beyond; on fp32 LayerNorm rows of 2048-4096 (A/B run
   * AH5) with 64 rows an SM, in 48; not at 16384, not LayerNorm past 4096 or with few rows, not
   * 16-bit. fp32 RMSNorm rows of 2048-4096 from 2^25 elements take the loop form instead (sweep
   * 86: four vectors a thread in one step, 128 and 256 threads), below 2^25 the reread kernel;
   * rows of 8192 and 16384 the loop kernel's full form (A/B run CR). */
  const int64_t rcols[] = {2048, 4096, 5120, 8192, 16384};
  const int rregs[] = {48, 48, 40, 40, 0};
  for (int i = 0; i < 5; ++i) {
    const int64_t rows = grid_rows(rcols[i]);
    p = problem(F32, RMS, rows, rcols[i]);
    Plan pl = plan_forward(&p, 4, h200.info);
    if (rcols[i] <= 4096) {
      expect(h200, F32, RMS, rows, rcols[i], false,
             pl.tier == TIER_ROW && pl.mode == MODE_LOOP && pl.vpt == 4 &&
                 pl.threads == rcols[i] / 16 && pl.grid == rows,
             "the loop form, a row in one step of four vectors a thread");
      p = problem(F32, RMS, rows / 8, rcols[i]);
      pl = plan_forward(&p, 4, h200.info);
      expect(h200, F32, RMS, rows / 8, rcols[i], false,
             pl.tier == TIER_ROW && pl.mode == MODE_CTA && pl.reread == rregs[i],
             "2^24 elements: x read again for y");
    } else if (rcols[i] >= 5120) { /* the loop kernel's full form (A/B runs CR, CS; sweep 101) */
      expect(h200, F32, RMS, rows, rcols[i], false,
             pl.tier == TIER_ROW && pl.mode == MODE_LOOP && pl.vpt == (rcols[i] == 5120 ? 4 : 8),
             "the loop kernel's full form");
    } else {
      expect(h200, F32, RMS, rows, rcols[i], false,
             pl.tier == TIER_ROW && pl.mode == MODE_CTA && pl.reread == rregs[i],
             rregs[i] ? "x read again for y" : "the row held in registers");
    }
    p = problem(F32, LN, rows, rcols[i]);
    const int ln_regs = rcols[i] <= 4096 ? 48 : 0;
    expect(h200, F32, LN, rows, rcols[i], false, plan_forward(&p, 4, h200.info).reread == ln_regs,
           ln_regs ? "x read again for y" : "the row held in registers");
    p = problem(F32, LN, 4096, rcols[i]);
    expect(h200, F32, LN, 4096, rcols[i], false, plan_forward(&p, 4, h200.info).reread == 0,
           "4096 rows: the row held in registers");
    p = problem(BF16, RMS, rows, rcols[i]);
    expect(h200, BF16, RMS, rows, rcols[i], false, plan_forward(&p, 8, h200.info).reread == 0,
           "the row held in registers");
  }
}

} // namespace

int main(void) {
  printf("fnorm_plan_tests: the CUDA plans' invariants, on the host\n");
  fflush(stdout); /* before any crash of the planner */
  /* Every length to 4200 (all the warp tiers, the forward's CTA rows, the backward's 8-warp
   * rows and the ring's first), then powers of two and their neighbours, and lengths of the
   * benchmarks. */
  int64_t lengths[4400];
  int n = 0;
  for (int64_t c = 1; c <= 4200; ++c)
    lengths[n++] = c;
  for (int64_t c = 8192; c <= (int64_t)1 << 22; c *= 2) {
    lengths[n++] = c - 8;
    lengths[n++] = c;
    lengths[n++] = c + 1;
    lengths[n++] = c + 8;
  }
  const int64_t extra[] = {5120, 12289, 24577, 32776, 802816, 1048576 + 7, 3 * 1048576};
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; ++i)
    lengths[n++] = extra[i];
  const int64_t some_rows[] = {1, 2, 3, 7, 64, 1000, 4097};
  for (const Device &d : kDevices)
    for (const Pair &pair : kPairs)
      for (int i = 0; i < n; ++i) {
        const int64_t cols = lengths[i];
        /* The main grid's count, 2^27 elements, on every dtype pair only for some lengths. */
        const bool full = cols % 64 == 0 || cols > 4200 || cols < 300;
        for (int norm = 0; norm < 2; ++norm) {
          const fnorm_norm nm = norm == 0 ? FNORM_LAYERNORM : FNORM_RMSNORM;
          for (size_t r = 0; r < sizeof some_rows / sizeof some_rows[0]; ++r)
            if (full || r % 3 == 0)
              check(d, pair, nm, some_rows[r], cols);
          check(d, pair, nm, grid_rows(cols), cols);
        }
      }
  check_choices();
  printf(
      "backward plans: warp tier %ld (clustered %ld), ring %ld, row %ld, stream %ld, batch %ld\n",
      g_bwd_tiers[0], g_bwd_tiers[1], g_bwd_tiers[2], g_bwd_tiers[3], g_bwd_tiers[4],
      g_bwd_tiers[5]);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
