/*
 * fnbench: throughput of the fusednorm operations, in GB/s, beside a memory copy measured in the
 * same run on the same device, so that each cell can be read as a fraction of what the memory
 * system delivers.
 *
 * Bytes counted per cell: forward 2*M*N*elem (read x, write y), backward 3*M*N*elem (read x or
 * y and dy, write dx). Nothing else is counted: weights, mean/rstd and partial sums are overhead
 * the kernels must keep small. The copy moves M*N*elem bytes and counts read plus written bytes.
 *
 * Every cell is checked before it is timed: the output of one run (y, mean, rstd for a forward;
 * dx, dgamma, dbeta for a backward) is compared with an oracle on a sample of rows (all rows for
 * small problems) and, for dgamma/dbeta, on the whole vector. The default oracle is the CPU
 * backend for CUDA runs and a double-precision reference written here for CPU runs (the CPU
 * backend checked against itself would prove nothing).
 *
 * Run `fnbench --help` for the options.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#define BENCH_OMP_FOR _Pragma("omp parallel for schedule(static)")
#define BENCH_OMP_FOR_DYNAMIC _Pragma("omp parallel for schedule(dynamic, 1)")
#else
#define BENCH_OMP_FOR
#define BENCH_OMP_FOR_DYNAMIC
#endif

#if defined(FNORM_BENCH_CUDA) && FNORM_BENCH_CUDA
#include <cuda_runtime_api.h>
#define BENCH_HAVE_CUDA 1
#else
#define BENCH_HAVE_CUDA 0
#endif

#include "fusednorm.h"

#define ERROR_LEN 256
#define MAX_COLS 64
#define MAX_SHAPES 256

/* ---------------------------------------------------------------------------------------------
 * Operations, dtypes, small helpers
 * ------------------------------------------------------------------------------------------- */

typedef enum op_kind {
  OP_LN_FWD,
  OP_RMS_FWD,
  OP_LN_BWD,
  OP_RMS_BWD,
  OP_LN_BWD_Y,
  OP_RMS_BWD_Y,
  OP_COUNT
} op_kind;

static const char *const op_names[OP_COUNT] = {"ln-fwd",  "rms-fwd",  "ln-bwd",
                                               "rms-bwd", "ln-bwd-y", "rms-bwd-y"};

static fnorm_norm op_norm(op_kind op) {
  return (op == OP_LN_FWD || op == OP_LN_BWD || op == OP_LN_BWD_Y) ? FNORM_LAYERNORM
                                                                   : FNORM_RMSNORM;
}
static int op_is_backward(op_kind op) {
  return op != OP_LN_FWD && op != OP_RMS_FWD;
}
static int op_from_y(op_kind op) {
  return op == OP_LN_BWD_Y || op == OP_RMS_BWD_Y;
}

static const char *dtype_name(fnorm_dtype dt) {
  switch (dt) {
  case FNORM_DTYPE_F32:
    return "fp32";
  case FNORM_DTYPE_F16:
    return "fp16";
  case FNORM_DTYPE_BF16:
    return "bf16";
  default:
    return "same";
  }
}

static int parse_dtype(const char *s, fnorm_dtype *out) {
  if (!strcmp(s, "fp32") || !strcmp(s, "f32") || !strcmp(s, "float32"))
    *out = FNORM_DTYPE_F32;
  else if (!strcmp(s, "fp16") || !strcmp(s, "f16") || !strcmp(s, "float16"))
    *out = FNORM_DTYPE_F16;
  else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))
    *out = FNORM_DTYPE_BF16;
  else
    return -1;
  return 0;
}

/* Sort key of a dtype in the final table: the order the presets list them in. */
static int dtype_rank(fnorm_dtype dt) {
  return dt == FNORM_DTYPE_BF16 ? 0 : dt == FNORM_DTYPE_F16 ? 1 : 2;
}

/* Records the first error only: later ones are usually consequences of it. */
static void set_error(char *buf, const char *fmt, ...) {
  va_list ap;
  if (buf[0] != '\0')
    return;
  va_start(ap, fmt);
  vsnprintf(buf, ERROR_LEN, fmt, ap);
  va_end(ap);
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts its argument. */
static double median_of(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  return (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void *host_alloc(size_t bytes) {
  void *p = NULL;
  /* 64-byte alignment: a cache line, and more than the 16 bytes the workspace contract asks. */
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
    return NULL;
  return p;
}

/* ---------------------------------------------------------------------------------------------
 * Element conversion (host side): round to nearest even, like the library.
 * ------------------------------------------------------------------------------------------- */

static float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bf16_to_float(uint16_t h) {
  return bits_to_float((uint32_t)h << 16);
}

static uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN (quiet) */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24, exact in float */
    float v = (float)mantissa * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exponent == 31)
    return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

static uint16_t float_to_half(float f) {
  uint32_t u = float_to_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t mag = u & 0x7fffffffu;
  uint32_t h, rem, half;
  int shift;
  if (mag >= 0x7f800000u) /* Inf, or NaN kept quiet */
    return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0u));
  if (mag >= 0x477ff000u) /* >= 65520 rounds to infinity */
    return (uint16_t)(sign | 0x7c00u);
  if (mag >= 0x38800000u) { /* normal: rebias the exponent, keep 10 mantissa bits */
    h = (mag >> 13) - 0x1c000u;
    rem = mag & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
      ++h; /* a carry into the exponent is the right answer */
    return (uint16_t)(sign | h);
  }
  /* subnormal: value = m * 2^(e-150), unit 2^-24, so h = m >> (126 - e) */
  shift = 126 - (int)(mag >> 23);
  if (shift > 24)
    return (uint16_t)sign;
  {
    uint32_t m = (mag & 0x7fffffu) | 0x800000u;
    h = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u)))
      ++h;
  }
  return (uint16_t)(sign | h);
}

static float load_float(const void *base, int64_t i, fnorm_dtype dt) {
  switch (dt) {
  case FNORM_DTYPE_F32:
    return ((const float *)base)[i];
  case FNORM_DTYPE_F16:
    return half_to_float(((const uint16_t *)base)[i]);
  case FNORM_DTYPE_BF16:
    return bf16_to_float(((const uint16_t *)base)[i]);
  default:
    return NAN;
  }
}

static void store_float(void *base, int64_t i, fnorm_dtype dt, float v) {
  switch (dt) {
  case FNORM_DTYPE_F32:
    ((float *)base)[i] = v;
    break;
  case FNORM_DTYPE_F16:
    ((uint16_t *)base)[i] = float_to_half(v);
    break;
  case FNORM_DTYPE_BF16:
    ((uint16_t *)base)[i] = float_to_bf16(v);
    break;
  default:
    break;
  }
}

static void convert_to_float(const void *src, fnorm_dtype dt, int64_t n, float *dst) {
  BENCH_OMP_FOR
  for (int64_t i = 0; i < n; ++i)
    dst[i] = load_float(src, i, dt);
}

/* Counter-based PRNG (splitmix64 finalizer of seed + i * golden ratio): element i depends only
 * on (seed, i), so a parallel fill gives the same data for any thread count. Uniform [0, 1). */
static float uniform01(uint64_t seed, int64_t i) {
  uint64_t z = seed + (uint64_t)i * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* Fills n elements with offset + scale * uniform(-1, 1). */
static void fill_random(void *base, fnorm_dtype dt, int64_t n, uint64_t seed, float offset,
                        float scale) {
  BENCH_OMP_FOR
  for (int64_t i = 0; i < n; ++i)
    store_float(base, i, dt, offset + scale * (2.0f * uniform01(seed, i) - 1.0f));
}

/* Comparison tolerance for an output of dtype dt, on the error measure of vector_error: a few
 * units in the last place of the largest element for fp16/bf16 (the device and the oracle may
 * round a value that sits on a rounding boundary to different neighbours), and room for a
 * different summation order over up to a million elements for fp32. */
static double tolerance(fnorm_dtype dt) {
  switch (dt) {
  case FNORM_DTYPE_BF16:
    return 2e-2;
  case FNORM_DTYPE_F16:
    return 4e-3;
  default:
    return 5e-4;
  }
}

/* Normwise relative error max|got - ref| / max|ref| (a NaN or Inf in got counts as infinite),
 * with the index of the worst element. Normwise, because elementwise relative error is
 * meaningless where a value cancels to near zero (dx, dgamma). */
static double vector_error(const float *got, const float *ref, int64_t n, int64_t *worst) {
  double max_ref = 0.0, max_diff = 0.0;
  *worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    double r = fabs((double)ref[i]);
    double d = fabs((double)got[i] - (double)ref[i]);
    if (r > max_ref)
      max_ref = r;
    if (!(d <= max_diff)) { /* also true when d is NaN */
      max_diff = isnan(d) || isinf(d) ? INFINITY : d;
      *worst = i;
      if (isinf(max_diff))
        break;
    }
  }
  return max_diff / (max_ref > 0.0 ? max_ref : 1.0);
}

/* ---------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------- */

typedef enum oracle_kind { ORACLE_DEFAULT, ORACLE_CPU, ORACLE_REF } oracle_kind;

typedef struct shape {
  fnorm_dtype dtype;
  int64_t rows;
  int64_t cols;
} shape;

typedef struct config {
  fnorm_device device;
  const char *preset;
  int ops[OP_COUNT];
  fnorm_dtype dtypes[3];
  int n_dtypes;
  int64_t cols[MAX_COLS];
  int n_cols;
  int64_t elements; /* M = elements / N unless rows is set */
  int64_t rows;
  shape extra[4]; /* presets' odd shapes, kept only while N, M and E are the preset's */
  int n_extra;
  fnorm_dtype param_dtype; /* FNORM_DTYPE_SAME or FNORM_DTYPE_F32 */
  int iters;               /* 0: adaptive */
  int graph;
  int inference;
  int no_affine; /* gamma and beta not given: elementwise_affine=False, dx alone backward */
  int markdown;
  int quiet;
  int check_rows;
  int param_check;
  int cpu_threads;
  oracle_kind oracle;
  uint64_t seed;
  const char *csv_path;
  /* Raw command-line values, applied over the preset by resolve_config. */
  char *ops_arg;
  char *dtypes_arg;
  char *cols_arg;
  int64_t elements_arg;
  int64_t rows_arg;
  int graph_arg;
} config;

static void print_usage(FILE *f) {
  fprintf(
      f,
      "usage: fnbench [options]\n"
      "\n"
      "Measures fusednorm throughput (GB/s) per operation, dtype and N, beside a copy of the\n"
      "same bytes measured in the same run. Every cell is checked against an oracle first.\n"
      "\n"
      "  --device cpu|cuda     device to run on (default: cuda if usable, else cpu)\n"
      "  --preset NAME         grid: main (default on cuda), graph, cpu (default on cpu), quick\n"
      "      main:  ln/rms fwd/bwd; bf16, fp16, fp32; N in {256 384 512 768 1024 2048 4096\n"
      "             5120 8192 16384 32768 65536 262144}, M = 2^27/N; plus 64x802816 fp32\n"
      "             and 576000x384 bf16\n"
      "      graph: ln/rms fwd/bwd; fp16; M = 4096, N in {1024 4096 8192 15872}; --graph on\n"
      "      cpu:   ln/rms fwd/bwd; bf16, fp32; N in {256 1024 4096 16384 65536}, M = 2^26/N\n"
      "      quick: all six ops; bf16, fp16, fp32; N in {1000 4096}, M = 2^20/N\n"
      "  --ops LIST            comma list of ln-fwd, rms-fwd, ln-bwd, rms-bwd, ln-bwd-y,\n"
      "                        rms-bwd-y (-y: backward from the forward's output y), or all\n"
      "  --dtypes LIST         comma list of bf16, fp16, fp32\n"
      "  --n LIST              comma list of N (row lengths)\n"
      "  --elements E          M = E / N for every N\n"
      "  --rows M              M for every N (overrides --elements)\n"
      "  --param-dtype f32|same  dtype of gamma/beta/dgamma/dbeta (default same)\n"
      "  --iters K             timed launches per cell (default adaptive); with --graph, the\n"
      "                        launches captured per graph (default 20)\n"
      "  --graph               cuda: time replays of a graph of K launches (per launch =\n"
      "                        replay / K), and the copy the same way\n"
      "  --inference           forward without mean/rstd (default writes them: training)\n"
      "  --no-affine           no gamma and no beta (a norm without elementwise affine): the\n"
      "                        forward reads x alone, the backward writes dx alone\n"
      "  --threads T           cpu: threads for the library and the copy (default OpenMP's)\n"
      "  --oracle cpu|ref      check against the CPU backend (default on cuda) or against the\n"
      "                        double-precision reference in fnbench (default on cpu)\n"
      "  --check-rows R        rows sampled per check (default 12; all rows when M*N <= 2^20)\n"
      "  --no-param-check      skip the dgamma/dbeta check (it runs the oracle on all rows)\n"
      "  --seed S              input seed (default 1)\n"
      "  --csv FILE            write one CSV line per cell to FILE\n"
      "  --markdown            print the table as Markdown\n"
      "  --quiet               no progress on stderr\n"
      "  --help                this text\n"
      "\n"
      "Bytes counted: forward 2*M*N*elem, backward 3*M*N*elem; copy 2*M*N*elem.\n"
      "Exit status: 0 if every cell ran and passed its check, 1 otherwise, 2 on bad usage.\n");
}

static int parse_int64(const char *s, int64_t *out) {
  char *end = NULL;
  long long v;
  if (s == NULL || *s == '\0')
    return -1;
  v = strtoll(s, &end, 0);
  if (*end != '\0' || v <= 0)
    return -1;
  *out = (int64_t)v;
  return 0;
}

/* Splits a comma list in place and calls item() on each piece; stops at the first failure. */
static int for_each_item(char *list, int (*item)(const char *, void *), void *ctx) {
  char *save = NULL;
  char *tok = strtok_r(list, ",", &save);
  if (tok == NULL)
    return -1;
  for (; tok != NULL; tok = strtok_r(NULL, ",", &save))
    if (item(tok, ctx) != 0)
      return -1;
  return 0;
}

static int add_op(const char *s, void *ctx) {
  config *c = ctx;
  if (!strcmp(s, "all")) {
    for (int i = 0; i < OP_COUNT; ++i)
      c->ops[i] = 1;
    return 0;
  }
  for (int i = 0; i < OP_COUNT; ++i)
    if (!strcmp(s, op_names[i])) {
      c->ops[i] = 1;
      return 0;
    }
  fprintf(stderr, "fnbench: unknown op '%s'\n", s);
  return -1;
}

static int add_dtype(const char *s, void *ctx) {
  config *c = ctx;
  fnorm_dtype dt;
  if (parse_dtype(s, &dt) != 0) {
    fprintf(stderr, "fnbench: unknown dtype '%s'\n", s);
    return -1;
  }
  for (int i = 0; i < c->n_dtypes; ++i)
    if (c->dtypes[i] == dt)
      return 0;
  c->dtypes[c->n_dtypes++] = dt;
  return 0;
}

static int add_col(const char *s, void *ctx) {
  config *c = ctx;
  int64_t n;
  if (parse_int64(s, &n) != 0 || c->n_cols >= MAX_COLS) {
    fprintf(stderr, "fnbench: bad N '%s' (or more than %d values)\n", s, MAX_COLS);
    return -1;
  }
  c->cols[c->n_cols++] = n;
  return 0;
}

static void set_ops(config *c, int ln_fwd, int rms_fwd, int ln_bwd, int rms_bwd, int bwd_y) {
  c->ops[OP_LN_FWD] = ln_fwd;
  c->ops[OP_RMS_FWD] = rms_fwd;
  c->ops[OP_LN_BWD] = ln_bwd;
  c->ops[OP_RMS_BWD] = rms_bwd;
  c->ops[OP_LN_BWD_Y] = bwd_y;
  c->ops[OP_RMS_BWD_Y] = bwd_y;
}

/* Fills ops, dtypes, N, E/M, extras and graph from a preset. */
static int apply_preset(config *c, const char *name) {
  static const int64_t main_cols[] = {256,  384,  512,   768,   1024,  2048,  4096,
                                      5120, 8192, 16384, 32768, 65536, 262144};
  static const int64_t graph_cols[] = {1024, 4096, 8192, 15872};
  static const int64_t cpu_cols[] = {256, 1024, 4096, 16384, 65536};
  static const int64_t quick_cols[] = {1000, 4096};
  const int64_t *cols;
  int n_cols;
  c->n_dtypes = 0;
  c->n_extra = 0;
  c->rows = 0;
  if (!strcmp(name, "main")) {
    set_ops(c, 1, 1, 1, 1, 0);
    c->dtypes[0] = FNORM_DTYPE_BF16;
    c->dtypes[1] = FNORM_DTYPE_F16;
    c->dtypes[2] = FNORM_DTYPE_F32;
    c->n_dtypes = 3;
    cols = main_cols;
    n_cols = (int)(sizeof main_cols / sizeof main_cols[0]);
    c->elements = (int64_t)1 << 27;
    c->extra[0].dtype = FNORM_DTYPE_F32;
    c->extra[0].rows = 64;
    c->extra[0].cols = 802816;
    c->extra[1].dtype = FNORM_DTYPE_BF16;
    c->extra[1].rows = 576000;
    c->extra[1].cols = 384;
    c->n_extra = 2;
  } else if (!strcmp(name, "graph")) {
    set_ops(c, 1, 1, 1, 1, 0);
    c->dtypes[0] = FNORM_DTYPE_F16;
    c->n_dtypes = 1;
    cols = graph_cols;
    n_cols = (int)(sizeof graph_cols / sizeof graph_cols[0]);
    c->elements = 0;
    c->rows = 4096;
    c->graph = 1;
  } else if (!strcmp(name, "cpu")) {
    set_ops(c, 1, 1, 1, 1, 0);
    c->dtypes[0] = FNORM_DTYPE_BF16;
    c->dtypes[1] = FNORM_DTYPE_F32;
    c->n_dtypes = 2;
    cols = cpu_cols;
    n_cols = (int)(sizeof cpu_cols / sizeof cpu_cols[0]);
    /* 128 MiB of bf16 a tensor: several times a server CPU's last-level cache, so that the
     * memcpy of the same bytes measures memory, not cache, as the forward does. */
    c->elements = (int64_t)1 << 26;
  } else if (!strcmp(name, "quick")) {
    set_ops(c, 1, 1, 1, 1, 1);
    c->dtypes[0] = FNORM_DTYPE_BF16;
    c->dtypes[1] = FNORM_DTYPE_F16;
    c->dtypes[2] = FNORM_DTYPE_F32;
    c->n_dtypes = 3;
    cols = quick_cols;
    n_cols = (int)(sizeof quick_cols / sizeof quick_cols[0]);
    c->elements = (int64_t)1 << 20;
  } else {
    fprintf(stderr, "fnbench: unknown preset '%s' (main, graph, cpu, quick)\n", name);
    return -1;
  }
  c->n_cols = n_cols;
  for (int i = 0; i < n_cols; ++i)
    c->cols[i] = cols[i];
  return 0;
}

#define NEED_VALUE()                                                                               \
  do {                                                                                             \
    if (i + 1 >= argc) {                                                                           \
      fprintf(stderr, "fnbench: %s needs a value\n", arg);                                         \
      return -1;                                                                                   \
    }                                                                                              \
    value = argv[++i];                                                                             \
  } while (0)

/* Collects the options; resolve_config applies them over the preset (which depends on the
 * device, known only later), whatever their order on the command line. */
static int parse_args(int argc, char **argv, config *c, int *want_help) {
  const char *value = NULL;
  memset(c, 0, sizeof *c);
  c->check_rows = 12;
  c->param_check = 1;
  c->seed = 1;
  c->param_dtype = FNORM_DTYPE_SAME;
  *want_help = 0;
  for (int i = 1; i < argc; ++i) {
    const char *arg = argv[i];
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      *want_help = 1;
      return 0;
    } else if (!strcmp(arg, "--device")) {
      NEED_VALUE();
      if (!strcmp(value, "cpu"))
        c->device = FNORM_DEVICE_CPU;
      else if (!strcmp(value, "cuda"))
        c->device = FNORM_DEVICE_CUDA;
      else {
        fprintf(stderr, "fnbench: unknown device '%s' (cpu, cuda)\n", value);
        return -1;
      }
    } else if (!strcmp(arg, "--preset")) {
      NEED_VALUE();
      c->preset = value;
    } else if (!strcmp(arg, "--ops")) {
      NEED_VALUE();
      c->ops_arg = argv[i];
    } else if (!strcmp(arg, "--dtypes")) {
      NEED_VALUE();
      c->dtypes_arg = argv[i];
    } else if (!strcmp(arg, "--n")) {
      NEED_VALUE();
      c->cols_arg = argv[i];
    } else if (!strcmp(arg, "--elements")) {
      NEED_VALUE();
      if (parse_int64(value, &c->elements_arg) != 0) {
        fprintf(stderr, "fnbench: bad --elements '%s'\n", value);
        return -1;
      }
    } else if (!strcmp(arg, "--rows")) {
      NEED_VALUE();
      if (parse_int64(value, &c->rows_arg) != 0) {
        fprintf(stderr, "fnbench: bad --rows '%s'\n", value);
        return -1;
      }
    } else if (!strcmp(arg, "--param-dtype")) {
      NEED_VALUE();
      if (!strcmp(value, "same"))
        c->param_dtype = FNORM_DTYPE_SAME;
      else if (!strcmp(value, "f32") || !strcmp(value, "fp32"))
        c->param_dtype = FNORM_DTYPE_F32;
      else {
        fprintf(stderr, "fnbench: --param-dtype takes f32 or same\n");
        return -1;
      }
    } else if (!strcmp(arg, "--iters")) {
      int64_t k;
      NEED_VALUE();
      if (parse_int64(value, &k) != 0 || k > 100000) {
        fprintf(stderr, "fnbench: bad --iters '%s'\n", value);
        return -1;
      }
      c->iters = (int)k;
    } else if (!strcmp(arg, "--threads")) {
      int64_t t;
      NEED_VALUE();
      if (parse_int64(value, &t) != 0 || t > 4096) {
        fprintf(stderr, "fnbench: bad --threads '%s'\n", value);
        return -1;
      }
      c->cpu_threads = (int)t;
    } else if (!strcmp(arg, "--check-rows")) {
      int64_t r;
      NEED_VALUE();
      if (parse_int64(value, &r) != 0 || r > 1000000) {
        fprintf(stderr, "fnbench: bad --check-rows '%s'\n", value);
        return -1;
      }
      c->check_rows = (int)r;
    } else if (!strcmp(arg, "--seed")) {
      int64_t s;
      NEED_VALUE();
      if (parse_int64(value, &s) != 0) {
        fprintf(stderr, "fnbench: bad --seed '%s'\n", value);
        return -1;
      }
      c->seed = (uint64_t)s;
    } else if (!strcmp(arg, "--oracle")) {
      NEED_VALUE();
      if (!strcmp(value, "cpu"))
        c->oracle = ORACLE_CPU;
      else if (!strcmp(value, "ref"))
        c->oracle = ORACLE_REF;
      else {
        fprintf(stderr, "fnbench: --oracle takes cpu or ref\n");
        return -1;
      }
    } else if (!strcmp(arg, "--csv")) {
      NEED_VALUE();
      c->csv_path = value;
    } else if (!strcmp(arg, "--graph")) {
      c->graph_arg = 1;
    } else if (!strcmp(arg, "--inference")) {
      c->inference = 1;
    } else if (!strcmp(arg, "--no-affine")) {
      c->no_affine = 1;
    } else if (!strcmp(arg, "--no-param-check")) {
      c->param_check = 0;
    } else if (!strcmp(arg, "--markdown")) {
      c->markdown = 1;
    } else if (!strcmp(arg, "--quiet")) {
      c->quiet = 1;
    } else {
      fprintf(stderr, "fnbench: unknown option '%s' (see --help)\n", arg);
      return -1;
    }
  }
  return 0;
}

/* The preset first, then the options that override it. */
static int resolve_config(config *c) {
  if (c->preset == NULL)
    c->preset = c->device == FNORM_DEVICE_CUDA ? "main" : "cpu";
  if (apply_preset(c, c->preset) != 0)
    return -1;
  if (c->ops_arg) {
    memset(c->ops, 0, sizeof c->ops);
    if (for_each_item(c->ops_arg, add_op, c) != 0)
      return -1;
  }
  if (c->dtypes_arg) {
    c->n_dtypes = 0;
    if (for_each_item(c->dtypes_arg, add_dtype, c) != 0)
      return -1;
  }
  if (c->cols_arg) {
    c->n_cols = 0;
    if (for_each_item(c->cols_arg, add_col, c) != 0)
      return -1;
  }
  /* The extras are shapes of their own, so any change of N, M or E drops them; a dtype list
   * keeps those of its dtypes. */
  if (c->cols_arg || c->elements_arg || c->rows_arg)
    c->n_extra = 0;
  if (c->elements_arg) {
    c->elements = c->elements_arg;
    c->rows = 0;
  }
  if (c->rows_arg)
    c->rows = c->rows_arg;
  if (c->graph_arg)
    c->graph = 1;
  if (c->oracle == ORACLE_DEFAULT)
    c->oracle = c->device == FNORM_DEVICE_CUDA ? ORACLE_CPU : ORACLE_REF;
  return 0;
}

/* The shapes of the grid: dtypes x N, then the extras whose dtype was asked for. */
static int build_shapes(const config *c, shape *out, int cap) {
  int n = 0;
  for (int d = 0; d < c->n_dtypes; ++d)
    for (int j = 0; j < c->n_cols; ++j) {
      int64_t rows = c->rows ? c->rows : c->elements / c->cols[j];
      if (n >= cap)
        return n;
      out[n].dtype = c->dtypes[d];
      out[n].rows = rows > 0 ? rows : 1;
      out[n].cols = c->cols[j];
      ++n;
    }
  for (int e = 0; e < c->n_extra; ++e)
    for (int d = 0; d < c->n_dtypes; ++d)
      if (c->extra[e].dtype == c->dtypes[d] && n < cap)
        out[n++] = c->extra[e];
  return n;
}

/* ---------------------------------------------------------------------------------------------
 * Run context, memory and transfers on the benchmarked device
 * ------------------------------------------------------------------------------------------- */

typedef enum cell_status { CELL_OK, CELL_FAIL, CELL_ERROR } cell_status;

static const char *const cell_status_names[] = {"OK", "FAIL", "ERROR"};

typedef struct cell_result {
  op_kind op;
  fnorm_dtype dtype;
  fnorm_dtype param_dtype; /* resolved: never FNORM_DTYPE_SAME */
  int64_t rows;
  int64_t cols;
  double bytes;
  double median_us;
  double gbps;
  double copy_gbps;
  double max_err; /* NaN when no check ran */
  int iters;
  cell_status status;
  char error[ERROR_LEN];
} cell_result;

typedef struct bench {
  config cfg;
  fnorm_device device;
  int threads; /* CPU: the library's thread count, which the copy uses too */
#if BENCH_HAVE_CUDA
  cudaStream_t stream;
#endif
  void *stream_arg; /* the stream as the library takes it */
  FILE *csv;
  cell_result *results;
  int n_results;
  int total_cells;
} bench;

#if BENCH_HAVE_CUDA
/* Inside a function with a `char *err` and a `done:` label. */
#define CUDA_OR_DONE(call)                                                                         \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      set_error(err, "%s: %s", #call, cudaGetErrorString(e_));                                     \
      goto done;                                                                                   \
    }                                                                                              \
  } while (0)
#endif

static void *dev_alloc(bench *b, size_t bytes, char *err) {
  void *p = NULL;
  if (b->device == FNORM_DEVICE_CPU) {
    p = host_alloc(bytes);
    if (p == NULL)
      set_error(err, "out of host memory (%zu bytes)", bytes);
    return p;
  }
#if BENCH_HAVE_CUDA
  {
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
      set_error(err, "cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
      return NULL;
    }
  }
#endif
  return p;
}

static void dev_free(bench *b, void *p) {
  if (p == NULL)
    return;
  if (b->device == FNORM_DEVICE_CPU) {
    free(p);
    return;
  }
#if BENCH_HAVE_CUDA
  cudaFree(p); /* a failure here is a sticky error that the next checked call reports */
#endif
}

/* Waits for the work queued on the bench stream; reports asynchronous errors. */
static int dev_sync(bench *b, char *err) {
#if BENCH_HAVE_CUDA
  if (b->device == FNORM_DEVICE_CUDA) {
    cudaError_t e = cudaStreamSynchronize(b->stream);
    if (e != cudaSuccess) {
      set_error(err, "cudaStreamSynchronize: %s", cudaGetErrorString(e));
      return -1;
    }
  }
#else
  (void)b;
  (void)err;
#endif
  return 0;
}

/* Host <-> device copy on the bench stream, complete on return. The stream is non-blocking,
 * so a plain cudaMemcpy (legacy stream) would not wait for the kernels queued on it. */
static int dev_transfer(bench *b, void *dst, const void *src, size_t bytes, int to_device,
                        char *err) {
  if (bytes == 0)
    return 0;
  if (b->device == FNORM_DEVICE_CPU) {
    memcpy(dst, src, bytes);
    return 0;
  }
#if BENCH_HAVE_CUDA
  {
    cudaError_t e = cudaMemcpyAsync(
        dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, b->stream);
    if (e == cudaSuccess)
      e = cudaStreamSynchronize(b->stream);
    if (e != cudaSuccess) {
      set_error(err, "cudaMemcpyAsync(%s, %zu bytes): %s", to_device ? "H2D" : "D2H", bytes,
                cudaGetErrorString(e));
      return -1;
    }
  }
#else
  (void)to_device;
  (void)err;
#endif
  return 0;
}

/* Copies rows[0..n) (sorted) of a packed device matrix to a packed host array, one transfer per
 * run of consecutive rows. */
static int download_rows(bench *b, void *host, const void *dev, const int64_t *rows, int64_t n,
                         size_t row_bytes, char *err) {
  int64_t k = 0;
  while (k < n) {
    int64_t run = 1;
    while (k + run < n && rows[k + run] == rows[k] + run)
      ++run;
    if (dev_transfer(b, (char *)host + (size_t)k * row_bytes,
                     (const char *)dev + (size_t)rows[k] * row_bytes, (size_t)run * row_bytes, 0,
                     err) != 0)
      return -1;
    k += run;
  }
  return 0;
}

static void gather_rows(void *dst, const void *src, const int64_t *rows, int64_t n,
                        size_t row_bytes) {
  for (int64_t k = 0; k < n; ++k)
    memcpy((char *)dst + (size_t)k * row_bytes, (const char *)src + (size_t)rows[k] * row_bytes,
           row_bytes);
}

/* The CPU copy ceiling: memcpy split in equal parts across the library's thread count. */
static void cpu_parallel_copy(void *dst, const void *src, size_t bytes, int threads) {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    size_t parts = (size_t)omp_get_num_threads();
    size_t chunk = ((bytes + parts - 1) / parts + 63) & ~(size_t)63;
    size_t lo = (size_t)omp_get_thread_num() * chunk;
    if (lo < bytes)
      memcpy((char *)dst + lo, (const char *)src + lo, bytes - lo < chunk ? bytes - lo : chunk);
  }
#else
  (void)threads;
  memcpy(dst, src, bytes);
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Launching and timing
 * ------------------------------------------------------------------------------------------- */

typedef enum launch_kind { LAUNCH_FORWARD, LAUNCH_BACKWARD, LAUNCH_COPY } launch_kind;

typedef struct launch {
  launch_kind kind;
  const fnorm_desc *desc;
  const fnorm_forward_args *fa;
  const fnorm_backward_args *ba;
  void *workspace;
  size_t workspace_bytes;
  void *dst; /* copy */
  const void *src;
  size_t bytes;
} launch;

typedef struct timing {
  double median_us; /* per launch */
  int iters;        /* launches timed (per graph with --graph) */
} timing;

static int launch_once(bench *b, const launch *l, char *err) {
  fnorm_status s = FNORM_SUCCESS;
  switch (l->kind) {
  case LAUNCH_FORWARD:
    s = fnorm_forward(l->desc, l->fa, b->stream_arg);
    break;
  case LAUNCH_BACKWARD:
    s = fnorm_backward(l->desc, l->ba, l->workspace, l->workspace_bytes, b->stream_arg);
    break;
  case LAUNCH_COPY:
    if (b->device == FNORM_DEVICE_CPU) {
      cpu_parallel_copy(l->dst, l->src, l->bytes, b->threads);
      return 0;
    }
#if BENCH_HAVE_CUDA
    {
      cudaError_t e =
          cudaMemcpyAsync(l->dst, l->src, l->bytes, cudaMemcpyDeviceToDevice, b->stream);
      if (e != cudaSuccess) {
        set_error(err, "cudaMemcpyAsync(D2D): %s", cudaGetErrorString(e));
        return -1;
      }
    }
#endif
    return 0;
  }
  if (s != FNORM_SUCCESS) {
    set_error(err, "%s: %s (%s)", l->kind == LAUNCH_FORWARD ? "fnorm_forward" : "fnorm_backward",
              fnorm_status_name(s), fnorm_status_string(s));
    return -1;
  }
  return 0;
}

static int clamp_int(double v, int lo, int hi) {
  if (!(v >= lo)) /* also NaN */
    return lo;
  return v > hi ? hi : (int)v;
}

static int time_cpu(bench *b, const launch *l, timing *t, char *err) {
  double *times = NULL;
  double start, estimate;
  int n;
  /* one warm-up (it also faults in the pages of the outputs), one to estimate the count */
  if (launch_once(b, l, err) != 0)
    return -1;
  start = now_seconds();
  if (launch_once(b, l, err) != 0)
    return -1;
  estimate = now_seconds() - start;
  n = b->cfg.iters ? b->cfg.iters : clamp_int(0.25 / estimate, 3, 50);
  times = malloc((size_t)n * sizeof *times);
  if (times == NULL) {
    set_error(err, "out of host memory");
    return -1;
  }
  for (int i = 0; i < n; ++i) {
    start = now_seconds();
    if (launch_once(b, l, err) != 0) {
      free(times);
      return -1;
    }
    times[i] = (now_seconds() - start) * 1e6;
  }
  t->median_us = median_of(times, n);
  t->iters = n;
  free(times);
  return 0;
}

#if BENCH_HAVE_CUDA
/* Events around each launch of a back-to-back sequence; the median of the per-launch times. */
static int time_cuda_launches(bench *b, const launch *l, timing *t, char *err) {
  cudaEvent_t probe[2];
  cudaEvent_t *events = NULL;
  double *times = NULL;
  int n_probe = 0, n_events = 0, n = 0, rc = -1;
  float ms = 0.0f;
  for (int i = 0; i < 2; ++i) /* warm-up */
    if (launch_once(b, l, err) != 0)
      goto done;
  CUDA_OR_DONE(cudaEventCreate(&probe[0]));
  n_probe = 1;
  CUDA_OR_DONE(cudaEventCreate(&probe[1]));
  n_probe = 2;
  CUDA_OR_DONE(cudaEventRecord(probe[0], b->stream));
  for (int i = 0; i < 5; ++i)
    if (launch_once(b, l, err) != 0)
      goto done;
  CUDA_OR_DONE(cudaEventRecord(probe[1], b->stream));
  CUDA_OR_DONE(cudaEventSynchronize(probe[1]));
  CUDA_OR_DONE(cudaEventElapsedTime(&ms, probe[0], probe[1]));
  /* about 0.3 s of launches, 20 to 200 of them */
  n = b->cfg.iters ? b->cfg.iters : clamp_int(300.0 / ((double)ms / 5.0), 20, 200);
  events = calloc((size_t)n + 1, sizeof *events);
  times = malloc((size_t)n * sizeof *times);
  if (events == NULL || times == NULL) {
    set_error(err, "out of host memory");
    goto done;
  }
  for (; n_events < n + 1; ++n_events)
    CUDA_OR_DONE(cudaEventCreate(&events[n_events]));
  CUDA_OR_DONE(cudaEventRecord(events[0], b->stream));
  for (int i = 0; i < n; ++i) {
    if (launch_once(b, l, err) != 0)
      goto done;
    CUDA_OR_DONE(cudaEventRecord(events[i + 1], b->stream));
  }
  CUDA_OR_DONE(cudaEventSynchronize(events[n]));
  for (int i = 0; i < n; ++i) {
    CUDA_OR_DONE(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
    times[i] = (double)ms * 1e3;
  }
  t->median_us = median_of(times, n);
  t->iters = n;
  rc = 0;
done:
  if (rc != 0)
    cudaStreamSynchronize(b->stream); /* leave no work in flight on an error path */
  for (int i = 0; i < n_probe; ++i)
    cudaEventDestroy(probe[i]);
  for (int i = 0; i < n_events; ++i)
    cudaEventDestroy(events[i]);
  free(events);
  free(times);
  return rc;
}

/* K launches captured in a graph; the median replay time over 20 replays, divided by K. This
 * takes the host's launch overhead out of the measure of small problems. */
static int time_cuda_graph(bench *b, const launch *l, timing *t, char *err) {
  enum { REPLAYS = 20, WARM_REPLAYS = 3 };
  cudaEvent_t events[REPLAYS + 1];
  double times[REPLAYS];
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  int k = b->cfg.iters ? b->cfg.iters : 20;
  int n_events = 0, rc = -1;
  float ms = 0.0f;
  /* a launch outside the capture first: modules load lazily, which a capture must not see */
  if (launch_once(b, l, err) != 0)
    goto done;
  CUDA_OR_DONE(cudaStreamSynchronize(b->stream));
  CUDA_OR_DONE(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < k; ++i)
    if (launch_once(b, l, err) != 0) {
      /* end the capture, or the stream stays unusable for every later cell */
      if (cudaStreamEndCapture(b->stream, &graph) == cudaSuccess && graph != NULL)
        cudaGraphDestroy(graph);
      graph = NULL;
      cudaGetLastError();
      goto done;
    }
  CUDA_OR_DONE(cudaStreamEndCapture(b->stream, &graph));
  CUDA_OR_DONE(cudaGraphInstantiateWithFlags(&exec, graph, 0));
  for (int i = 0; i < WARM_REPLAYS; ++i)
    CUDA_OR_DONE(cudaGraphLaunch(exec, b->stream));
  for (; n_events < REPLAYS + 1; ++n_events)
    CUDA_OR_DONE(cudaEventCreate(&events[n_events]));
  CUDA_OR_DONE(cudaEventRecord(events[0], b->stream));
  for (int i = 0; i < REPLAYS; ++i) {
    CUDA_OR_DONE(cudaGraphLaunch(exec, b->stream));
    CUDA_OR_DONE(cudaEventRecord(events[i + 1], b->stream));
  }
  CUDA_OR_DONE(cudaEventSynchronize(events[REPLAYS]));
  for (int i = 0; i < REPLAYS; ++i) {
    CUDA_OR_DONE(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
    times[i] = (double)ms * 1e3 / k;
  }
  t->median_us = median_of(times, REPLAYS);
  t->iters = k;
  rc = 0;
done:
  if (rc != 0)
    cudaStreamSynchronize(b->stream);
  for (int i = 0; i < n_events; ++i)
    cudaEventDestroy(events[i]);
  if (exec != NULL)
    cudaGraphExecDestroy(exec);
  if (graph != NULL)
    cudaGraphDestroy(graph);
  return rc;
}
#endif

static int time_launch(bench *b, const launch *l, timing *t, char *err) {
#if BENCH_HAVE_CUDA
  if (b->device == FNORM_DEVICE_CUDA)
    return b->cfg.graph ? time_cuda_graph(b, l, t, err) : time_cuda_launches(b, l, t, err);
#endif
  return time_cpu(b, l, t, err);
}

/* GB/s of a copy of `bytes` bytes from src to dst (both on the device), read + written: the
 * fastest of copies of `bytes`, of `bytes` rounded down to a whole MiB and of one MiB less. The
 * copy routine's rate depends on the exact size (run BI/BJ, H200, cudaMemcpyAsync: 2^29 - 512
 * bytes, the 16-bit rows of 384, 2.5% below 2^29; 2^30 bytes 1.2% below 2^30 - 2^20), and the
 * ceiling is the device's, not the copy routine's way with a size. */
static int measure_copy(bench *b, void *dst, const void *src, size_t bytes, double *gbps,
                        char *err) {
  const size_t mib = (size_t)1 << 20;
  const size_t sizes[3] = {bytes, bytes / mib * mib, bytes / mib * mib - mib};
  launch l;
  int i;
  memset(&l, 0, sizeof l);
  l.kind = LAUNCH_COPY;
  l.dst = dst;
  l.src = src;
  *gbps = 0.0;
  for (i = 0; i < 3; i++) {
    timing t[2];
    int n = 1, j;
    if (i > 0 && (sizes[i] == bytes || bytes < 4 * mib))
      continue;
    l.bytes = sizes[i];
    if (time_launch(b, &l, &t[0], err) != 0)
      return -1;
#if BENCH_HAVE_CUDA
    /* Under --graph also launched plainly: replayed from a graph, copies of 1 GiB or more ran
     * at 2760 GB/s against 4170-4250 launched (run BI, H200). */
    if (b->device == FNORM_DEVICE_CUDA && b->cfg.graph) {
      if (time_cuda_launches(b, &l, &t[1], err) != 0)
        return -1;
      n = 2;
    }
#endif
    for (j = 0; j < n; j++) {
      const double r = 2.0 * (double)sizes[i] / (t[j].median_us * 1e3);
      if (r > *gbps)
        *gbps = r;
    }
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * A group: the buffers of one shape (dtype, M, N), shared by the operations run on it
 * ------------------------------------------------------------------------------------------- */

typedef struct group {
  shape s;
  fnorm_dtype param_dtype; /* resolved */
  size_t elem;
  size_t param_elem;
  size_t matrix_bytes; /* M * N * elem */
  int need_backward;
  /* host: inputs as generated, and what came back from the device */
  void *h_x, *h_dy, *h_gamma, *h_beta, *h_y;
  float *h_mean, *h_rstd;
  float *gamma_f, *beta_f; /* gamma and beta as floats, for the reference oracle */
  /* device; for the CPU they alias the host inputs */
  void *d_x, *d_y, *d_dy, *d_dx, *d_gamma, *d_beta, *d_dgamma, *d_dbeta;
  float *d_mean, *d_rstd;
  int64_t *sample; /* sorted rows that the checks compare */
  int64_t n_sample;
  double copy_gbps;
  fnorm_norm trained; /* whose training forward d_y, d_mean, d_rstd now hold; 0: none */
  char error[ERROR_LEN];
} group;

static fnorm_desc make_desc(const bench *b, const group *g, fnorm_norm norm, fnorm_device device,
                            int64_t rows) {
  fnorm_desc d;
  fnorm_desc_init(&d, device, norm, g->s.dtype, rows, g->s.cols);
  d.param_dtype = b->cfg.param_dtype;
  d.cpu_threads = b->cfg.cpu_threads;
  return d;
}

static int is_sampled(const int64_t *rows, int64_t n, int64_t row) {
  for (int64_t k = 0; k < n; ++k)
    if (rows[k] == row)
      return 1;
  return 0;
}

static int compare_int64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* All rows of a small problem; otherwise the first, middle and last rows (where partitioning
 * bugs show) and pseudo-random ones, check_rows in all. */
static int choose_sample(group *g, int check_rows, uint64_t seed) {
  const int64_t m = g->s.rows;
  const int all = m <= check_rows || m * g->s.cols <= ((int64_t)1 << 20);
  const int64_t want = all ? m : check_rows;
  const int64_t fixed[5] = {0, m - 1, m / 2, 1, m - 2};
  int64_t n = 0;
  g->sample = malloc((size_t)want * sizeof *g->sample);
  if (g->sample == NULL)
    return -1;
  if (all) {
    for (int64_t r = 0; r < m; ++r)
      g->sample[r] = r;
    g->n_sample = m;
    return 0;
  }
  for (int i = 0; i < 5 && n < want; ++i)
    if (!is_sampled(g->sample, n, fixed[i]))
      g->sample[n++] = fixed[i];
  for (int64_t draw = 0; n < want; ++draw) {
    int64_t r = (int64_t)((double)uniform01(seed ^ 0x5eedull, draw) * (double)m);
    if (r >= m)
      r = m - 1;
    if (!is_sampled(g->sample, n, r))
      g->sample[n++] = r;
  }
  qsort(g->sample, (size_t)n, sizeof *g->sample, compare_int64);
  g->n_sample = n;
  return 0;
}

static void group_free(bench *b, group *g) {
  const int cpu = b->device == FNORM_DEVICE_CPU;
  if (!cpu) { /* on the CPU these alias the host buffers freed below */
    dev_free(b, g->d_x);
    dev_free(b, g->d_dy);
    dev_free(b, g->d_gamma);
    dev_free(b, g->d_beta);
    free(g->h_y);
  }
  dev_free(b, g->d_y);
  dev_free(b, g->d_dx);
  dev_free(b, g->d_dgamma);
  dev_free(b, g->d_dbeta);
  dev_free(b, g->d_mean);
  dev_free(b, g->d_rstd);
  free(g->h_x);
  free(g->h_dy);
  free(g->h_gamma);
  free(g->h_beta);
  free(g->h_mean);
  free(g->h_rstd);
  free(g->gamma_f);
  free(g->beta_f);
  free(g->sample);
}

/* gamma or beta as the library is given them: NULL under --no-affine */
static const void *affine(const bench *b, const void *param) {
  return b->cfg.no_affine ? NULL : param;
}

/* The param dtype column: "none" under --no-affine */
static const char *param_label(const bench *b, fnorm_dtype param_dtype) {
  return b->cfg.no_affine ? "none" : dtype_name(param_dtype);
}

/* Allocates, fills and uploads the inputs, measures the copy ceiling of this size. */
static int group_setup(bench *b, group *g) {
  const int64_t m = g->s.rows, n = g->s.cols;
  const uint64_t seed = b->cfg.seed * 0x100000001b3ull;
  const int cpu = b->device == FNORM_DEVICE_CPU;
  char *err = g->error;
  g->param_dtype = b->cfg.param_dtype == FNORM_DTYPE_SAME ? g->s.dtype : b->cfg.param_dtype;
  g->elem = fnorm_dtype_size(g->s.dtype);
  g->param_elem = fnorm_dtype_size(g->param_dtype);
  g->matrix_bytes = (size_t)m * (size_t)n * g->elem;

  g->h_x = host_alloc(g->matrix_bytes);
  g->h_dy = g->need_backward ? host_alloc(g->matrix_bytes) : NULL;
  g->h_gamma = host_alloc((size_t)n * g->param_elem);
  g->h_beta = host_alloc((size_t)n * g->param_elem);
  g->gamma_f = malloc((size_t)n * sizeof(float));
  g->beta_f = malloc((size_t)n * sizeof(float));
  g->h_mean = malloc((size_t)m * sizeof(float));
  g->h_rstd = malloc((size_t)m * sizeof(float));
  if (g->h_x == NULL || (g->need_backward && g->h_dy == NULL) || g->h_gamma == NULL ||
      g->h_beta == NULL || g->gamma_f == NULL || g->beta_f == NULL || g->h_mean == NULL ||
      g->h_rstd == NULL || choose_sample(g, b->cfg.check_rows, b->cfg.seed) != 0) {
    set_error(err, "out of host memory");
    return -1;
  }
  /* x centred off zero so that LayerNorm's mean matters; gamma never near zero (the backward
   * from y divides by it); no input is all zeros. */
  fill_random(g->h_x, g->s.dtype, m * n, seed + 1, 0.25f, 1.0f);
  if (g->need_backward)
    fill_random(g->h_dy, g->s.dtype, m * n, seed + 2, 0.0f, 1.0f);
  fill_random(g->h_gamma, g->param_dtype, n, seed + 3, 1.0f, 0.1f);
  fill_random(g->h_beta, g->param_dtype, n, seed + 4, 0.0f, 0.1f);
  convert_to_float(g->h_gamma, g->param_dtype, n, g->gamma_f);
  convert_to_float(g->h_beta, g->param_dtype, n, g->beta_f);
  if (b->cfg.no_affine) /* the reference oracle's scale and shift without them */
    for (int64_t i = 0; i < n; ++i) {
      g->gamma_f[i] = 1.0f;
      g->beta_f[i] = 0.0f;
    }

  if (cpu) {
    g->d_x = g->h_x;
    g->d_dy = g->h_dy;
    g->d_gamma = g->h_gamma;
    g->d_beta = g->h_beta;
  } else {
    if ((g->d_x = dev_alloc(b, g->matrix_bytes, err)) == NULL ||
        (g->d_gamma = dev_alloc(b, (size_t)n * g->param_elem, err)) == NULL ||
        (g->d_beta = dev_alloc(b, (size_t)n * g->param_elem, err)) == NULL ||
        (g->need_backward && (g->d_dy = dev_alloc(b, g->matrix_bytes, err)) == NULL))
      return -1;
    if (dev_transfer(b, g->d_x, g->h_x, g->matrix_bytes, 1, err) != 0 ||
        dev_transfer(b, g->d_gamma, g->h_gamma, (size_t)n * g->param_elem, 1, err) != 0 ||
        dev_transfer(b, g->d_beta, g->h_beta, (size_t)n * g->param_elem, 1, err) != 0 ||
        (g->need_backward && dev_transfer(b, g->d_dy, g->h_dy, g->matrix_bytes, 1, err) != 0))
      return -1;
  }
  if ((g->d_y = dev_alloc(b, g->matrix_bytes, err)) == NULL ||
      (g->d_mean = dev_alloc(b, (size_t)m * sizeof(float), err)) == NULL ||
      (g->d_rstd = dev_alloc(b, (size_t)m * sizeof(float), err)) == NULL)
    return -1;
  if (g->need_backward && ((g->d_dx = dev_alloc(b, g->matrix_bytes, err)) == NULL ||
                           (g->d_dgamma = dev_alloc(b, (size_t)n * g->param_elem, err)) == NULL ||
                           (g->d_dbeta = dev_alloc(b, (size_t)n * g->param_elem, err)) == NULL))
    return -1;
  if (cpu)
    g->h_y = g->d_y;
  /* the copy writes y, which every forward overwrites before it is read */
  return measure_copy(b, g->d_y, g->d_x, g->matrix_bytes, &g->copy_gbps, err);
}

/* Runs the training forward of `norm` unless its outputs are already in d_y/d_mean/d_rstd:
 * the backward's inputs. */
static int ensure_trained(bench *b, group *g, fnorm_norm norm, char *err) {
  fnorm_desc d;
  fnorm_forward_args fa;
  fnorm_status s;
  if (g->trained == norm)
    return 0;
  d = make_desc(b, g, norm, b->device, g->s.rows);
  memset(&fa, 0, sizeof fa);
  fa.x = g->d_x;
  fa.gamma = affine(b, g->d_gamma);
  fa.beta = norm == FNORM_LAYERNORM ? affine(b, g->d_beta) : NULL;
  fa.y = g->d_y;
  fa.mean = norm == FNORM_LAYERNORM ? g->d_mean : NULL;
  fa.rstd = g->d_rstd;
  s = fnorm_forward(&d, &fa, b->stream_arg);
  if (s != FNORM_SUCCESS) {
    set_error(err, "fnorm_forward (backward's inputs): %s (%s)", fnorm_status_name(s),
              fnorm_status_string(s));
    return -1;
  }
  if (dev_sync(b, err) != 0)
    return -1;
  g->trained = norm;
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Oracles: the CPU backend on the sampled rows (and on all rows for dgamma/dbeta), or a
 * double-precision reference written from the formulas in fusednorm.h.
 * ------------------------------------------------------------------------------------------- */

static void ref_forward_row(fnorm_norm norm, const void *x, fnorm_dtype dt, int64_t n,
                            const float *gamma, const float *beta, float eps, float *y,
                            float *mean_out, float *rstd_out) {
  double mean = 0.0, sq = 0.0, rstd;
  if (norm == FNORM_LAYERNORM) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i)
      sum += load_float(x, i, dt);
    mean = sum / (double)n;
  }
  for (int64_t i = 0; i < n; ++i) {
    double c = load_float(x, i, dt) - mean;
    sq += c * c;
  }
  rstd = 1.0 / sqrt(sq / (double)n + eps);
  for (int64_t i = 0; i < n; ++i)
    y[i] = (float)((load_float(x, i, dt) - mean) * rstd * gamma[i] + (beta ? beta[i] : 0.0));
  *mean_out = (float)mean;
  *rstd_out = (float)rstd;
}

/* xhat of element i, from x with the forward's statistics, or from y with gamma and beta. */
static double ref_xhat(int from_y, const void *in, int64_t i, int64_t col, fnorm_dtype dt,
                       double mean, double rstd, const float *gamma, const float *beta) {
  double v = load_float(in, i, dt);
  if (from_y)
    return (v - (beta ? beta[col] : 0.0)) / gamma[col];
  return (v - mean) * rstd;
}

static void ref_backward_row(fnorm_norm norm, int from_y, const void *in, const void *dy,
                             fnorm_dtype dt, int64_t n, float mean, float rstd, const float *gamma,
                             const float *beta, float *dx) {
  const double mu = norm == FNORM_LAYERNORM && !from_y ? mean : 0.0;
  double sum_g = 0.0, sum_gx = 0.0, c1, c2;
  for (int64_t i = 0; i < n; ++i) {
    double gdy = gamma[i] * (double)load_float(dy, i, dt);
    sum_g += gdy;
    sum_gx += gdy * ref_xhat(from_y, in, i, i, dt, mu, rstd, gamma, beta);
  }
  c1 = norm == FNORM_LAYERNORM ? sum_g / (double)n : 0.0;
  c2 = sum_gx / (double)n;
  for (int64_t i = 0; i < n; ++i) {
    double gdy = gamma[i] * (double)load_float(dy, i, dt);
    double xh = ref_xhat(from_y, in, i, i, dt, mu, rstd, gamma, beta);
    dx[i] = (float)(rstd * (gdy - c1 - xh * c2));
  }
}

/* dgamma = sum over rows of dy * xhat, dbeta = sum of dy, in double. Threads take blocks of
 * columns, so each sums its columns over all rows in order. */
static void ref_param_grads(fnorm_norm norm, int from_y, const void *in, const void *dy,
                            fnorm_dtype dt, int64_t m, int64_t n, const float *mean,
                            const float *rstd, const float *gamma, const float *beta, float *dgamma,
                            float *dbeta) {
  enum { WIDTH = 64 };
  const int64_t blocks = (n + WIDTH - 1) / WIDTH;
  BENCH_OMP_FOR_DYNAMIC
  for (int64_t blk = 0; blk < blocks; ++blk) {
    double acc_g[WIDTH], acc_b[WIDTH];
    const int64_t j0 = blk * WIDTH, j1 = j0 + WIDTH < n ? j0 + WIDTH : n;
    memset(acc_g, 0, sizeof acc_g);
    memset(acc_b, 0, sizeof acc_b);
    for (int64_t r = 0; r < m; ++r) {
      const double mu = norm == FNORM_LAYERNORM && !from_y ? mean[r] : 0.0;
      for (int64_t j = j0; j < j1; ++j) {
        double d = load_float(dy, r * n + j, dt);
        acc_g[j - j0] += d * ref_xhat(from_y, in, r * n + j, j, dt, mu, rstd[r], gamma, beta);
        acc_b[j - j0] += d;
      }
    }
    for (int64_t j = j0; j < j1; ++j) {
      dgamma[j] = (float)acc_g[j - j0];
      dbeta[j] = (float)acc_b[j - j0];
    }
  }
}

/* y, mean, rstd of the rows sx (packed, R rows) as floats. */
static int oracle_forward_rows(bench *b, group *g, fnorm_norm norm, const void *sx, int64_t rows,
                               float *ref_y, float *ref_mean, float *ref_rstd, char *err) {
  const int64_t n = g->s.cols;
  const int ln = norm == FNORM_LAYERNORM;
  if (b->cfg.oracle == ORACLE_CPU) {
    fnorm_desc d = make_desc(b, g, norm, FNORM_DEVICE_CPU, rows);
    fnorm_forward_args fa;
    fnorm_status s;
    void *y = host_alloc((size_t)rows * (size_t)n * g->elem);
    if (y == NULL) {
      set_error(err, "out of host memory");
      return -1;
    }
    memset(&fa, 0, sizeof fa);
    fa.x = sx;
    fa.gamma = affine(b, g->h_gamma);
    fa.beta = ln ? affine(b, g->h_beta) : NULL;
    fa.y = y;
    fa.mean = ln ? ref_mean : NULL;
    fa.rstd = ref_rstd;
    s = fnorm_forward(&d, &fa, NULL);
    if (s == FNORM_SUCCESS)
      convert_to_float(y, g->s.dtype, rows * n, ref_y);
    free(y);
    if (s != FNORM_SUCCESS) {
      set_error(err, "oracle fnorm_forward (cpu): %s", fnorm_status_name(s));
      return -1;
    }
    return 0;
  }
  {
    const float eps = make_desc(b, g, norm, b->device, rows).eps;
    BENCH_OMP_FOR
    for (int64_t r = 0; r < rows; ++r)
      ref_forward_row(norm, (const char *)sx + (size_t)(r * n) * g->elem, g->s.dtype, n, g->gamma_f,
                      ln ? g->beta_f : NULL, eps, ref_y + r * n, &ref_mean[r], &ref_rstd[r]);
  }
  return 0;
}

/* dx of the sampled rows: `in` is x or y (packed, R rows), smean/srstd the rows' statistics. */
static int oracle_backward_rows(bench *b, group *g, fnorm_norm norm, int from_y, const void *in,
                                const void *sdy, const float *smean, const float *srstd,
                                int64_t rows, float *ref_dx, char *err) {
  const int64_t n = g->s.cols;
  const int ln = norm == FNORM_LAYERNORM;
  if (b->cfg.oracle == ORACLE_CPU) {
    fnorm_desc d = make_desc(b, g, norm, FNORM_DEVICE_CPU, rows);
    fnorm_backward_args ba;
    fnorm_status s;
    size_t ws_bytes = 0;
    void *ws = NULL;
    void *dx = host_alloc((size_t)rows * (size_t)n * g->elem);
    s = fnorm_backward_workspace_size(&d, &ws_bytes);
    if (s == FNORM_SUCCESS && ws_bytes > 0)
      ws = host_alloc(ws_bytes);
    if (dx == NULL || (s == FNORM_SUCCESS && ws_bytes > 0 && ws == NULL)) {
      free(dx);
      free(ws);
      set_error(err, "out of host memory");
      return -1;
    }
    if (s == FNORM_SUCCESS) {
      memset(&ba, 0, sizeof ba);
      ba.dy = sdy;
      if (from_y) {
        ba.y = in;
        ba.beta = ln ? affine(b, g->h_beta) : NULL;
      } else {
        ba.x = in;
        ba.mean = ln ? smean : NULL;
      }
      ba.rstd = srstd;
      ba.gamma = affine(b, g->h_gamma);
      ba.dx = dx;
      s = fnorm_backward(&d, &ba, ws, ws_bytes, NULL);
    }
    if (s == FNORM_SUCCESS)
      convert_to_float(dx, g->s.dtype, rows * n, ref_dx);
    free(dx);
    free(ws);
    if (s != FNORM_SUCCESS) {
      set_error(err, "oracle fnorm_backward (cpu, rows): %s", fnorm_status_name(s));
      return -1;
    }
    return 0;
  }
  BENCH_OMP_FOR
  for (int64_t r = 0; r < rows; ++r)
    ref_backward_row(norm, from_y, (const char *)in + (size_t)(r * n) * g->elem,
                     (const char *)sdy + (size_t)(r * n) * g->elem, g->s.dtype, n,
                     smean ? smean[r] : 0.0f, srstd[r], g->gamma_f, ln ? g->beta_f : NULL,
                     ref_dx + r * n);
  return 0;
}

/* dgamma and dbeta over all rows; `in` is the full x or y on the host. (Not under --no-affine,
 * which has no dgamma/dbeta to check.) */
static int oracle_param_grads(bench *b, group *g, fnorm_norm norm, int from_y, const void *in,
                              float *ref_dgamma, float *ref_dbeta, char *err) {
  const int64_t m = g->s.rows, n = g->s.cols;
  const int ln = norm == FNORM_LAYERNORM;
  if (b->cfg.oracle == ORACLE_CPU) {
    fnorm_desc d = make_desc(b, g, norm, FNORM_DEVICE_CPU, m);
    fnorm_backward_args ba;
    fnorm_status s;
    size_t ws_bytes = 0;
    void *ws = NULL;
    void *dgamma = host_alloc((size_t)n * g->param_elem);
    void *dbeta = host_alloc((size_t)n * g->param_elem);
    s = fnorm_backward_workspace_size(&d, &ws_bytes);
    if (s == FNORM_SUCCESS && ws_bytes > 0)
      ws = host_alloc(ws_bytes);
    if (dgamma == NULL || dbeta == NULL || (s == FNORM_SUCCESS && ws_bytes > 0 && ws == NULL)) {
      free(dgamma);
      free(dbeta);
      free(ws);
      set_error(err, "out of host memory");
      return -1;
    }
    if (s == FNORM_SUCCESS) {
      memset(&ba, 0, sizeof ba);
      ba.dy = g->h_dy;
      if (from_y) {
        ba.y = in;
        ba.beta = ln ? g->h_beta : NULL;
      } else {
        ba.x = in;
        ba.mean = ln ? g->h_mean : NULL;
      }
      ba.rstd = g->h_rstd;
      ba.gamma = g->h_gamma;
      ba.dgamma = dgamma;
      ba.dbeta = ln ? dbeta : NULL;
      s = fnorm_backward(&d, &ba, ws, ws_bytes, NULL);
    }
    if (s == FNORM_SUCCESS) {
      convert_to_float(dgamma, g->param_dtype, n, ref_dgamma);
      if (ln)
        convert_to_float(dbeta, g->param_dtype, n, ref_dbeta);
    }
    free(dgamma);
    free(dbeta);
    free(ws);
    if (s != FNORM_SUCCESS) {
      set_error(err, "oracle fnorm_backward (cpu, all rows): %s", fnorm_status_name(s));
      return -1;
    }
    return 0;
  }
  ref_param_grads(norm, from_y, in, g->h_dy, g->s.dtype, m, n, ln ? g->h_mean : NULL, g->h_rstd,
                  g->gamma_f, ln ? g->beta_f : NULL, ref_dgamma, ref_dbeta);
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Checks: compare one run on the device with the oracle
 * ------------------------------------------------------------------------------------------- */

/* Compares `got` with `ref` (both float, `count` vectors of `len`), each vector normwise;
 * records the largest error in r->max_err and a FAIL with its place when over tol. */
static void compare_vectors(cell_result *r, const char *what, const float *got, const float *ref,
                            int64_t count, int64_t len, const int64_t *row_ids, double tol) {
  for (int64_t k = 0; k < count; ++k) {
    int64_t worst = 0;
    double e = vector_error(got + k * len, ref + k * len, len, &worst);
    if (isnan(r->max_err) || !(e <= r->max_err))
      r->max_err = e;
    if (!(e <= tol)) {
      char where[64];
      if (row_ids != NULL)
        snprintf(where, sizeof where, "row %" PRId64 " col %" PRId64, row_ids[k], worst);
      else
        snprintf(where, sizeof where, "index %" PRId64, worst);
      r->status = r->status == CELL_ERROR ? CELL_ERROR : CELL_FAIL;
      set_error(r->error, "%s %s: got %.6g, oracle %.6g (error %.3g > tolerance %.3g)", what, where,
                (double)got[k * len + worst], (double)ref[k * len + worst], e, tol);
    }
  }
}

/* Picks the sampled entries of a per-row fp32 array. */
static void gather_floats(float *dst, const float *src, const int64_t *rows, int64_t n) {
  for (int64_t k = 0; k < n; ++k)
    dst[k] = src[rows[k]];
}

static int check_forward(bench *b, group *g, fnorm_norm norm, int training, cell_result *r) {
  const int64_t rows = g->n_sample, n = g->s.cols;
  const size_t row_bytes = (size_t)n * g->elem;
  const int ln = norm == FNORM_LAYERNORM;
  char *err = r->error;
  int rc = -1;
  void *sx = host_alloc((size_t)rows * row_bytes);
  void *got_raw = host_alloc((size_t)rows * row_bytes);
  float *got = malloc((size_t)(rows * n) * sizeof(float));
  float *ref = malloc((size_t)(rows * n) * sizeof(float));
  float *stats = malloc((size_t)rows * 4 * sizeof(float)); /* got/ref mean, got/ref rstd */
  if (sx == NULL || got_raw == NULL || got == NULL || ref == NULL || stats == NULL) {
    set_error(err, "out of host memory");
    goto done;
  }
  gather_rows(sx, g->h_x, g->sample, rows, row_bytes);
  if (download_rows(b, got_raw, g->d_y, g->sample, rows, row_bytes, err) != 0)
    goto done;
  if (training &&
      ((ln &&
        dev_transfer(b, g->h_mean, g->d_mean, (size_t)g->s.rows * sizeof(float), 0, err) != 0) ||
       dev_transfer(b, g->h_rstd, g->d_rstd, (size_t)g->s.rows * sizeof(float), 0, err) != 0))
    goto done;
  if (oracle_forward_rows(b, g, norm, sx, rows, ref, stats + rows, stats + 3 * rows, err) != 0)
    goto done;
  convert_to_float(got_raw, g->s.dtype, rows * n, got);
  compare_vectors(r, "y", got, ref, rows, n, g->sample, tolerance(g->s.dtype));
  if (training) {
    if (ln) {
      gather_floats(stats, g->h_mean, g->sample, rows);
      compare_vectors(r, "mean", stats, stats + rows, 1, rows, NULL, tolerance(FNORM_DTYPE_F32));
    }
    gather_floats(stats + 2 * rows, g->h_rstd, g->sample, rows);
    compare_vectors(r, "rstd", stats + 2 * rows, stats + 3 * rows, 1, rows, NULL,
                    tolerance(FNORM_DTYPE_F32));
  }
  rc = 0;
done:
  free(sx);
  free(got_raw);
  free(got);
  free(ref);
  free(stats);
  return rc;
}

static int check_backward(bench *b, group *g, fnorm_norm norm, int from_y, cell_result *r) {
  const int64_t m = g->s.rows, rows = g->n_sample, n = g->s.cols;
  const size_t row_bytes = (size_t)n * g->elem;
  const int ln = norm == FNORM_LAYERNORM;
  char *err = r->error;
  int rc = -1;
  void *sin = host_alloc((size_t)rows * row_bytes); /* sampled x or y */
  void *sdy = host_alloc((size_t)rows * row_bytes);
  void *got_raw = host_alloc((size_t)rows * row_bytes);
  float *got = malloc((size_t)(rows * n) * sizeof(float));
  float *ref = malloc((size_t)(rows * n) * sizeof(float));
  float *smean = malloc((size_t)rows * sizeof(float));
  float *srstd = malloc((size_t)rows * sizeof(float));
  void *param_raw = host_alloc((size_t)n * g->param_elem);
  float *params = malloc((size_t)n * 4 * sizeof(float)); /* got/ref dgamma, got/ref dbeta */
  if (sin == NULL || sdy == NULL || got_raw == NULL || got == NULL || ref == NULL ||
      smean == NULL || srstd == NULL || param_raw == NULL || params == NULL) {
    set_error(err, "out of host memory");
    goto done;
  }
  /* the statistics (and y) the device backward used: those of the device forward */
  if ((ln && dev_transfer(b, g->h_mean, g->d_mean, (size_t)m * sizeof(float), 0, err) != 0) ||
      dev_transfer(b, g->h_rstd, g->d_rstd, (size_t)m * sizeof(float), 0, err) != 0)
    goto done;
  gather_floats(smean, g->h_mean, g->sample, rows);
  gather_floats(srstd, g->h_rstd, g->sample, rows);
  if (from_y) {
    if (download_rows(b, sin, g->d_y, g->sample, rows, row_bytes, err) != 0)
      goto done;
  } else {
    gather_rows(sin, g->h_x, g->sample, rows, row_bytes);
  }
  gather_rows(sdy, g->h_dy, g->sample, rows, row_bytes);
  if (download_rows(b, got_raw, g->d_dx, g->sample, rows, row_bytes, err) != 0)
    goto done;
  if (oracle_backward_rows(b, g, norm, from_y, sin, sdy, ln ? smean : NULL, srstd, rows, ref,
                           err) != 0)
    goto done;
  convert_to_float(got_raw, g->s.dtype, rows * n, got);
  compare_vectors(r, "dx", got, ref, rows, n, g->sample, tolerance(g->s.dtype));

  if (b->cfg.param_check && !b->cfg.no_affine) { /* (no dgamma/dbeta without them) */
    const void *full_in = g->h_x;
    if (from_y) {
      if (g->h_y == NULL && (g->h_y = host_alloc(g->matrix_bytes)) == NULL) {
        set_error(err, "out of host memory");
        goto done;
      }
      if (g->h_y != g->d_y && dev_transfer(b, g->h_y, g->d_y, g->matrix_bytes, 0, err) != 0)
        goto done;
      full_in = g->h_y;
    }
    if (oracle_param_grads(b, g, norm, from_y, full_in, params + n, params + 3 * n, err) != 0)
      goto done;
    if (dev_transfer(b, param_raw, g->d_dgamma, (size_t)n * g->param_elem, 0, err) != 0)
      goto done;
    convert_to_float(param_raw, g->param_dtype, n, params);
    compare_vectors(r, "dgamma", params, params + n, 1, n, NULL, tolerance(g->param_dtype));
    if (ln) {
      if (dev_transfer(b, param_raw, g->d_dbeta, (size_t)n * g->param_elem, 0, err) != 0)
        goto done;
      convert_to_float(param_raw, g->param_dtype, n, params + 2 * n);
      compare_vectors(r, "dbeta", params + 2 * n, params + 3 * n, 1, n, NULL,
                      tolerance(g->param_dtype));
    }
  }
  rc = 0;
done:
  free(sin);
  free(sdy);
  free(got_raw);
  free(got);
  free(ref);
  free(smean);
  free(srstd);
  free(param_raw);
  free(params);
  return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Cells
 * ------------------------------------------------------------------------------------------- */

static void run_cell(bench *b, group *g, op_kind op, cell_result *r) {
  const fnorm_norm norm = op_norm(op);
  const int backward = op_is_backward(op), from_y = op_from_y(op);
  const int training = !b->cfg.inference;
  const int ln = norm == FNORM_LAYERNORM;
  fnorm_desc d;
  fnorm_forward_args fa;
  fnorm_backward_args ba;
  launch l;
  timing t;
  void *ws = NULL;
  size_t ws_bytes = 0;

  memset(r, 0, sizeof *r);
  r->op = op;
  r->dtype = g->s.dtype;
  r->param_dtype = b->cfg.param_dtype == FNORM_DTYPE_SAME ? g->s.dtype : b->cfg.param_dtype;
  r->rows = g->s.rows;
  r->cols = g->s.cols;
  r->bytes = (backward ? 3.0 : 2.0) * (double)g->s.rows * (double)g->s.cols *
             (double)fnorm_dtype_size(g->s.dtype);
  r->median_us = r->gbps = r->max_err = NAN;
  r->copy_gbps = g->copy_gbps;
  if (g->error[0] != '\0') {
    r->status = CELL_ERROR;
    snprintf(r->error, sizeof r->error, "%s", g->error);
    return;
  }

  d = make_desc(b, g, norm, b->device, g->s.rows);
  memset(&l, 0, sizeof l);
  l.desc = &d;
  if (!backward) {
    memset(&fa, 0, sizeof fa);
    fa.x = g->d_x;
    fa.gamma = affine(b, g->d_gamma);
    fa.beta = ln ? affine(b, g->d_beta) : NULL;
    fa.y = g->d_y;
    if (training) {
      fa.mean = ln ? g->d_mean : NULL;
      fa.rstd = g->d_rstd;
    }
    l.kind = LAUNCH_FORWARD;
    l.fa = &fa;
    g->trained = 0; /* y is rewritten, and with --inference mean/rstd go stale */
    if (launch_once(b, &l, r->error) != 0 || dev_sync(b, r->error) != 0 ||
        check_forward(b, g, norm, training, r) != 0)
      goto error;
  } else {
    fnorm_status s;
    if (ensure_trained(b, g, norm, r->error) != 0)
      goto error;
    s = fnorm_backward_workspace_size(&d, &ws_bytes);
    if (s != FNORM_SUCCESS) {
      set_error(r->error, "fnorm_backward_workspace_size: %s (%s)", fnorm_status_name(s),
                fnorm_status_string(s));
      goto error;
    }
    if (ws_bytes > 0 && (ws = dev_alloc(b, ws_bytes, r->error)) == NULL)
      goto error;
    memset(&ba, 0, sizeof ba);
    ba.dy = g->d_dy;
    if (from_y) {
      ba.y = g->d_y;
      ba.beta = ln ? affine(b, g->d_beta) : NULL;
    } else {
      ba.x = g->d_x;
      ba.mean = ln ? g->d_mean : NULL;
    }
    ba.rstd = g->d_rstd;
    ba.gamma = affine(b, g->d_gamma);
    ba.dx = g->d_dx;
    if (!b->cfg.no_affine) { /* (no dgamma/dbeta without gamma and beta) */
      ba.dgamma = g->d_dgamma;
      ba.dbeta = ln ? g->d_dbeta : NULL; /* RMSNorm runs without beta */
    }
    l.kind = LAUNCH_BACKWARD;
    l.ba = &ba;
    l.workspace = ws;
    l.workspace_bytes = ws_bytes;
    if (launch_once(b, &l, r->error) != 0 || dev_sync(b, r->error) != 0 ||
        check_backward(b, g, norm, from_y, r) != 0)
      goto error;
  }
  /* timed even when the check failed: the numbers still say something, and the FAIL stays */
  if (time_launch(b, &l, &t, r->error) != 0)
    goto error;
  if (!backward && training)
    g->trained = norm;
  r->median_us = t.median_us;
  r->iters = t.iters;
  r->gbps = r->bytes / (t.median_us * 1e3);
  dev_free(b, ws);
  return;
error:
  r->status = CELL_ERROR;
  dev_free(b, ws);
}

static void write_csv_row(bench *b, const cell_result *r) {
  if (b->csv == NULL)
    return;
  fprintf(b->csv, "%s,%s,%s,%s,%" PRId64 ",%" PRId64 ",%.0f,%.3f,%.2f,%.2f,%.4f,%.3e,%s\n",
          b->device == FNORM_DEVICE_CUDA ? "cuda" : "cpu", op_names[r->op], dtype_name(r->dtype),
          param_label(b, r->param_dtype), r->rows, r->cols, r->bytes, r->median_us, r->gbps,
          r->copy_gbps, r->gbps / r->copy_gbps, r->max_err, cell_status_names[r->status]);
  fflush(b->csv); /* a run cut short keeps the cells it finished */
}

static void run_group(bench *b, const shape *s) {
  group g;
  double start = now_seconds();
  memset(&g, 0, sizeof g);
  g.s = *s;
  for (int op = 0; op < OP_COUNT; ++op)
    if (b->cfg.ops[op] && op_is_backward((op_kind)op))
      g.need_backward = 1;
  if (!b->cfg.quiet)
    fprintf(stderr, "preparing %s M=%" PRId64 " N=%" PRId64 " ...", dtype_name(s->dtype), s->rows,
            s->cols);
  group_setup(b, &g);
  if (!b->cfg.quiet)
    fprintf(stderr, " %.1f s, copy %.1f GB/s\n", now_seconds() - start, g.copy_gbps);
  for (int op = 0; op < OP_COUNT; ++op) {
    cell_result *r;
    if (!b->cfg.ops[op])
      continue;
    r = &b->results[b->n_results++];
    if (!b->cfg.quiet)
      fprintf(stderr, "[%d/%d] %-9s %s M=%" PRId64 " N=%" PRId64 " ...", b->n_results,
              b->total_cells, op_names[op], dtype_name(s->dtype), s->rows, s->cols);
    start = now_seconds();
    run_cell(b, &g, (op_kind)op, r);
    if (!b->cfg.quiet) {
      if (r->status == CELL_ERROR)
        fprintf(stderr, " ERROR (%.1f s)\n    %s\n", now_seconds() - start, r->error);
      else
        fprintf(stderr, " %.1f GB/s, %.0f%% of copy, err %.2e %s (%.1f s)\n", r->gbps,
                100.0 * r->gbps / r->copy_gbps, r->max_err, cell_status_names[r->status],
                now_seconds() - start);
      if (r->status == CELL_FAIL)
        fprintf(stderr, "    %s\n", r->error);
    }
    write_csv_row(b, r);
  }
  group_free(b, &g);
}

/* ---------------------------------------------------------------------------------------------
 * Output
 * ------------------------------------------------------------------------------------------- */

static int compare_cells(const void *pa, const void *pb) {
  const cell_result *a = pa, *b = pb;
  if (a->op != b->op)
    return (int)a->op - (int)b->op;
  if (a->dtype != b->dtype)
    return dtype_rank(a->dtype) - dtype_rank(b->dtype);
  if (a->cols != b->cols)
    return (a->cols > b->cols) - (a->cols < b->cols);
  return (a->rows > b->rows) - (a->rows < b->rows);
}

static void format_number(char *buf, size_t size, const char *fmt, double v) {
  if (isnan(v))
    snprintf(buf, size, "-");
  else
    snprintf(buf, size, fmt, v);
}

static void print_table(bench *b) {
  const int md = b->cfg.markdown;
  int failures = 0;
  qsort(b->results, (size_t)b->n_results, sizeof *b->results, compare_cells);
  if (md)
    printf("\n| op | dtype | param | M | N | time (us) | GB/s | copy GB/s | %% of copy | max err "
           "| status |\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|\n");
  else
    printf("\n%-9s %-5s %-5s %9s %8s %11s %9s %9s %7s %9s  %s\n", "op", "dtype", "param", "M", "N",
           "time_us", "GB/s", "copy", "%copy", "max_err", "status");
  for (int i = 0; i < b->n_results; ++i) {
    const cell_result *r = &b->results[i];
    char time_s[32], gbps_s[32], copy_s[32], frac_s[32], err_s[32];
    format_number(time_s, sizeof time_s, "%.2f", r->median_us);
    format_number(gbps_s, sizeof gbps_s, "%.1f", r->gbps);
    format_number(copy_s, sizeof copy_s, "%.1f", r->copy_gbps);
    format_number(frac_s, sizeof frac_s, "%.1f%%", 100.0 * r->gbps / r->copy_gbps);
    format_number(err_s, sizeof err_s, "%.2e", r->max_err);
    if (md)
      printf("| %s | %s | %s | %" PRId64 " | %" PRId64 " | %s | %s | %s | %s | %s | %s |\n",
             op_names[r->op], dtype_name(r->dtype), param_label(b, r->param_dtype), r->rows,
             r->cols, time_s, gbps_s, copy_s, frac_s, err_s, cell_status_names[r->status]);
    else
      printf("%-9s %-5s %-5s %9" PRId64 " %8" PRId64 " %11s %9s %9s %7s %9s  %s\n", op_names[r->op],
             dtype_name(r->dtype), param_label(b, r->param_dtype), r->rows, r->cols, time_s, gbps_s,
             copy_s, frac_s, err_s, cell_status_names[r->status]);
    failures += r->status != CELL_OK;
  }
  if (failures > 0) {
    printf("\n%d of %d cells did not pass:\n", failures, b->n_results);
    for (int i = 0; i < b->n_results; ++i) {
      const cell_result *r = &b->results[i];
      if (r->status != CELL_OK)
        printf("%s %s %s M=%" PRId64 " N=%" PRId64 ": %s: %s\n", md ? "-" : " ", op_names[r->op],
               dtype_name(r->dtype), r->rows, r->cols, cell_status_names[r->status], r->error);
    }
  } else {
    printf("\nall %d cells passed their check\n", b->n_results);
  }
}

static void cpu_model(char *buf, size_t size) {
  char line[512];
  FILE *f = fopen("/proc/cpuinfo", "r");
  snprintf(buf, size, "unknown CPU");
  if (f == NULL)
    return;
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "model name", 10) == 0) {
      char *colon = strchr(line, ':');
      if (colon != NULL) {
        char *v = colon + 1;
        size_t len;
        while (*v == ' ' || *v == '\t')
          ++v;
        len = strcspn(v, "\n");
        snprintf(buf, size, "%.*s", (int)len, v);
      }
      break;
    }
  }
  fclose(f);
}

/* Device, date, method, and a copy ceiling of 256 MiB measured now. Returns -1 if the copy
 * failed. */
static int print_header(bench *b) {
  const char *p = b->cfg.markdown ? "- " : "# ";
  const size_t copy_bytes = (size_t)256 << 20;
  char date[64], err[ERROR_LEN] = "";
  time_t now = time(NULL);
  struct tm utc;
  void *src = NULL, *dst = NULL;
  double gbps = NAN;
  int rc = 0;
  gmtime_r(&now, &utc);
  strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", &utc);
  printf("%sfnbench: fusednorm %s (header %s), %s\n", p, fnorm_version_string(),
         FNORM_VERSION_STRING, date);
  if (b->device == FNORM_DEVICE_CPU) {
    char model[256];
    cpu_model(model, sizeof model);
    printf("%sdevice: cpu: %s, %d thread%s (%s)\n", p, model, b->threads,
           b->threads == 1 ? "" : "s",
#ifdef _OPENMP
           "OpenMP"
#else
           "no OpenMP"
#endif
    );
    printf("%stiming: clock_gettime(CLOCK_MONOTONIC) per call, median of 3-50 calls\n", p);
  }
#if BENCH_HAVE_CUDA
  else {
    struct cudaDeviceProp prop;
    int dev = 0, runtime = 0, driver = 0;
    cudaGetDevice(&dev);
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
      printf("%sdevice: cuda %d: %s, sm_%d%d, %d SMs, L2 %.1f MiB, %.1f GiB, runtime %d.%d, "
             "driver %d.%d\n",
             p, dev, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
             prop.l2CacheSize / 1048576.0, (double)prop.totalGlobalMem / 1073741824.0,
             runtime / 1000, (runtime % 1000) / 10, driver / 1000, (driver % 1000) / 10);
    if (b->cfg.graph)
      printf("%stiming: CUDA graph of K=%d launches, median of 20 replays / K\n", p,
             b->cfg.iters ? b->cfg.iters : 20);
    else
      printf("%stiming: CUDA events around each launch, median of 20-200 launches\n", p);
  }
#endif
  printf("%soracle: %s; %d sampled rows per check (all when M*N <= 2^20)%s\n", p,
         b->cfg.oracle == ORACLE_CPU ? "CPU backend" : "double-precision reference",
         b->cfg.check_rows,
         b->cfg.param_check && !b->cfg.no_affine ? ", dgamma/dbeta over all rows" : "");
  printf("%sforward: %s; param dtype: %s; bytes: fwd 2*M*N*elem, bwd 3*M*N*elem\n", p,
         b->cfg.inference ? "inference (no mean/rstd)" : "training (writes mean/rstd)",
         b->cfg.no_affine                        ? "none (no gamma, no beta)"
         : b->cfg.param_dtype == FNORM_DTYPE_F32 ? "fp32"
                                                 : "same as data");
  src = dev_alloc(b, copy_bytes, err);
  dst = src != NULL ? dev_alloc(b, copy_bytes, err) : NULL;
  if (dst != NULL && b->device == FNORM_DEVICE_CPU)
    memset(src, 1, copy_bytes); /* fault the source's pages in before timing */
  if (dst == NULL || measure_copy(b, dst, src, copy_bytes, &gbps, err) != 0) {
    printf("%scopy ceiling: could not be measured: %s\n", p, err);
    rc = -1;
  } else if (b->device == FNORM_DEVICE_CPU) {
    printf("%scopy ceiling: memcpy of 256 MiB over %d thread%s: %.1f GB/s (read + written)\n", p,
           b->threads, b->threads == 1 ? "" : "s", gbps);
  } else {
    printf("%scopy ceiling: cudaMemcpyAsync device to device of 256 MiB: %.1f GB/s (read + "
           "written)%s\n",
           p, gbps, b->cfg.graph ? ", in graphs" : "");
  }
  printf("%scopy column: the same copy measured on each cell's own M*N*elem bytes\n", p);
  dev_free(b, src);
  dev_free(b, dst);
  fflush(stdout);
  return rc;
}

/* ---------------------------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  bench b;
  shape shapes[MAX_SHAPES];
  int n_shapes, n_ops = 0, want_help = 0, exit_code = 0;
  fnorm_status cuda_status;

  memset(&b, 0, sizeof b);
  if (parse_args(argc, argv, &b.cfg, &want_help) != 0)
    return 2;
  if (want_help) {
    print_usage(stdout);
    return 0;
  }

  cuda_status = fnorm_device_available(FNORM_DEVICE_CUDA);
  if (b.cfg.device == 0)
    b.cfg.device =
        BENCH_HAVE_CUDA && cuda_status == FNORM_SUCCESS ? FNORM_DEVICE_CUDA : FNORM_DEVICE_CPU;
  if (b.cfg.device == FNORM_DEVICE_CUDA) {
    if (!BENCH_HAVE_CUDA) {
      fprintf(stderr, "fnbench: built without CUDA (the library has no CUDA backend)\n");
      return 2;
    }
    if (cuda_status != FNORM_SUCCESS) {
      fprintf(stderr, "fnbench: CUDA is not usable: %s (%s)\n", fnorm_status_name(cuda_status),
              fnorm_status_string(cuda_status));
      return 2;
    }
  }
  b.device = b.cfg.device;
  if (resolve_config(&b.cfg) != 0)
    return 2;
  if (b.cfg.graph && b.device == FNORM_DEVICE_CPU) {
    fprintf(stderr, "fnbench: --graph applies to cuda only; timing plain calls on the cpu\n");
    b.cfg.graph = 0;
  }
#ifdef _OPENMP
  b.threads = b.cfg.cpu_threads > 0 ? b.cfg.cpu_threads : omp_get_max_threads();
#else
  b.threads = 1;
#endif

  n_shapes = build_shapes(&b.cfg, shapes, MAX_SHAPES);
  for (int op = 0; op < OP_COUNT; ++op)
    n_ops += b.cfg.ops[op];
  b.total_cells = n_shapes * n_ops;
  if (b.total_cells == 0) {
    fprintf(stderr, "fnbench: no cells to run\n");
    return 2;
  }
  b.results = calloc((size_t)b.total_cells, sizeof *b.results);
  if (b.results == NULL) {
    fprintf(stderr, "fnbench: out of memory\n");
    return 1;
  }
  if (b.cfg.csv_path != NULL) {
    b.csv = fopen(b.cfg.csv_path, "w");
    if (b.csv == NULL) {
      fprintf(stderr, "fnbench: cannot write %s\n", b.cfg.csv_path);
      free(b.results);
      return 2;
    }
    fprintf(b.csv, "device,op,dtype,param_dtype,M,N,bytes,median_us,GBps,copy_GBps,"
                   "fraction_of_copy,max_err,status\n");
  }
#if BENCH_HAVE_CUDA
  if (b.device == FNORM_DEVICE_CUDA) {
    cudaError_t e = cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      fprintf(stderr, "fnbench: cudaStreamCreateWithFlags: %s\n", cudaGetErrorString(e));
      return 1;
    }
    b.stream_arg = (void *)b.stream;
  }
#endif

  if (print_header(&b) != 0)
    exit_code = 1;
  for (int i = 0; i < n_shapes; ++i)
    run_group(&b, &shapes[i]);
  print_table(&b);
  for (int i = 0; i < b.n_results; ++i)
    if (b.results[i].status != CELL_OK)
      exit_code = 1;

#if BENCH_HAVE_CUDA
  if (b.device == FNORM_DEVICE_CUDA)
    cudaStreamDestroy(b.stream);
#endif
  if (b.csv != NULL && fclose(b.csv) != 0) {
    fprintf(stderr, "fnbench: error writing %s\n", b.cfg.csv_path);
    exit_code = 1;
  }
  free(b.results);
  return exit_code;
}
