/*
 * fusednorm: fused LayerNorm and RMSNorm, forward and backward, for NVIDIA GPUs and the CPU.
 *
 * Public C99 API. This header needs no CUDA header: a CUDA stream travels as an opaque pointer.
 *
 * Conventions (they hold for every call below):
 *  - Every call returns an fnorm_status. FNORM_SUCCESS is 0; anything else is an error, and
 *    fnorm_status_name()/fnorm_status_string() say which. A call that returns an error from
 *    argument checking has written no output byte.
 *  - The library never allocates memory, prints, exits or keeps global state. The caller owns
 *    every buffer; the backward takes a workspace whose size fnorm_backward_workspace_size()
 *    gives (query, allocate, call: the two-phase pattern of CUB).
 *  - A problem is a matrix of `rows` rows (M) of `cols` elements (N). Each row is normalized
 *    over its N elements independently. Rows may be strided: row i of x starts at element
 *    i * x_stride. Sizes and strides are int64_t, in elements (not bytes).
 *  - The stream is the last argument. For FNORM_DEVICE_CUDA it is a cudaStream_t cast to
 *    void * (NULL is the legacy default stream); pointers are device pointers and the call
 *    is asynchronous (no host synchronization; capturable in a CUDA graph). For
 *    FNORM_DEVICE_CPU pointers are host pointers, the call is synchronous and the stream
 *    argument is ignored.
 *  - All statistics and reductions are accumulated in fp32 or wider. mean and rstd are fp32.
 *    Conversions to fp16/bf16 round to nearest even.
 *  - Results are deterministic: the same call (the same inputs, and the same outputs asked
 *    for) on the same device gives bitwise the same outputs, dgamma and dbeta included (they
 *    are reduced in a fixed order, never with floating-point atomics).
 *
 * Typical use (CPU; for CUDA pass FNORM_DEVICE_CUDA, device pointers and a stream):
 *
 *     fnorm_desc d;
 *     fnorm_desc_init(&d, FNORM_DEVICE_CPU, FNORM_LAYERNORM, FNORM_DTYPE_BF16, rows, cols);
 *     fnorm_forward_args fa = {0};
 *     fa.x = x; fa.gamma = gamma; fa.beta = beta; fa.y = y; fa.mean = mean; fa.rstd = rstd;
 *     fnorm_status s = fnorm_forward(&d, &fa, NULL);
 *
 *     size_t ws_bytes;
 *     fnorm_backward_workspace_size(&d, &ws_bytes);   // then allocate ws_bytes
 *     fnorm_backward_args ba = {0};
 *     ba.dy = dy; ba.x = x; ba.mean = mean; ba.rstd = rstd; ba.gamma = gamma;
 *     ba.dx = dx; ba.dgamma = dgamma; ba.dbeta = dbeta;
 *     s = fnorm_backward(&d, &ba, ws, ws_bytes, NULL);
 */
#ifndef FUSEDNORM_H
#define FUSEDNORM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(FNORM_BUILDING_SHARED)
#define FNORM_API __declspec(dllexport)
#elif defined(__GNUC__) && __GNUC__ >= 4
#define FNORM_API __attribute__((visibility("default")))
#else
#define FNORM_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */
#define FNORM_VERSION_MAJOR 0
#define FNORM_VERSION_MINOR 1
#define FNORM_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, e.g. 100 for 0.1.0. */
#define FNORM_VERSION_NUMBER                                                                       \
  (FNORM_VERSION_MAJOR * 10000 + FNORM_VERSION_MINOR * 100 + FNORM_VERSION_PATCH)
#define FNORM_STRINGIFY_(x) #x
#define FNORM_STRINGIFY(x) FNORM_STRINGIFY_(x)
#define FNORM_VERSION_STRING                                                                       \
  FNORM_STRINGIFY(FNORM_VERSION_MAJOR)                                                             \
  "." FNORM_STRINGIFY(FNORM_VERSION_MINOR) "." FNORM_STRINGIFY(FNORM_VERSION_PATCH)

/* The version of the library actually linked, to compare with the macros above. */
FNORM_API unsigned fnorm_version_number(void);
FNORM_API const char *fnorm_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes, generated from one table: X(name, value, description).
 * ------------------------------------------------------------------------------------------- */
#define FNORM_STATUS_TABLE(X)                                                                      \
  X(FNORM_SUCCESS, 0, "success")                                                                   \
  X(FNORM_ERR_NULL_POINTER, 1, "a required pointer argument is NULL")                              \
  X(FNORM_ERR_BAD_SIZE, 2, "rows or cols is <= 0, or the matrix size overflows")                   \
  X(FNORM_ERR_BAD_STRIDE, 3, "a row stride is negative or smaller than cols")                      \
  X(FNORM_ERR_BAD_EPS, 4, "eps is <= 0, NaN or infinite")                                          \
  X(FNORM_ERR_BAD_DTYPE, 5, "unknown dtype, or an unsupported combination of dtypes")              \
  X(FNORM_ERR_BAD_NORM, 6, "unknown normalization kind")                                           \
  X(FNORM_ERR_BAD_DEVICE, 7, "unknown device")                                                     \
  X(FNORM_ERR_BAD_FLAGS, 8, "unknown bits set in flags")                                           \
  X(FNORM_ERR_BAD_ARGUMENT, 9, "an argument is given that this operation does not take")           \
  X(FNORM_ERR_ALIASING, 10, "an output overlaps an input or another output")                       \
  X(FNORM_ERR_MISALIGNED, 11, "a pointer is not aligned to its element size")                      \
  X(FNORM_ERR_WORKSPACE_TOO_SMALL, 12, "workspace_bytes is smaller than the size queried")         \
  X(FNORM_ERR_NOT_BUILT, 13, "the library was built without this device's backend")                \
  X(FNORM_ERR_NO_DEVICE, 14, "no usable device of this kind is present")                           \
  X(FNORM_ERR_UNSUPPORTED, 15, "this backend does not support the requested combination")          \
  X(FNORM_ERR_CUDA, 16, "a CUDA runtime call or kernel launch failed")

typedef enum fnorm_status {
#define FNORM_STATUS_ENUM_(name, value, text) name = value,
  FNORM_STATUS_TABLE(FNORM_STATUS_ENUM_)
#undef FNORM_STATUS_ENUM_
} fnorm_status;

/* "FNORM_ERR_ALIASING" for FNORM_ERR_ALIASING; "FNORM_STATUS_UNKNOWN" for a value not listed. */
FNORM_API const char *fnorm_status_name(fnorm_status status);
/* A sentence describing the status; "unknown status" for a value not listed. Never NULL. */
FNORM_API const char *fnorm_status_string(fnorm_status status);

/* ---------------------------------------------------------------------------------------------
 * Enumerations. No valid value is 0, so a descriptor left zeroed is rejected, not misread.
 * ------------------------------------------------------------------------------------------- */
typedef enum fnorm_device {
  FNORM_DEVICE_CPU = 1, /* host memory, computed on the calling thread and an OpenMP team */
  FNORM_DEVICE_CUDA = 2 /* device memory of the current CUDA device, on the given stream */
} fnorm_device;

typedef enum fnorm_norm {
  /* y = (x - mean) * rstd * gamma + beta,  mean = sum(x)/N,
   * rstd = 1 / sqrt(sum((x - mean)^2)/N + eps) */
  FNORM_LAYERNORM = 1,
  /* y = x * rstd * gamma + beta,  rstd = 1 / sqrt(sum(x^2)/N + eps)  (beta usually absent) */
  FNORM_RMSNORM = 2
} fnorm_norm;

typedef enum fnorm_dtype {
  FNORM_DTYPE_SAME = 0, /* only for param_dtype: the same as dtype */
  FNORM_DTYPE_F32 = 1,  /* IEEE binary32 */
  FNORM_DTYPE_F16 = 2,  /* IEEE binary16 */
  FNORM_DTYPE_BF16 = 3  /* bfloat16: the top 16 bits of a binary32 */
} fnorm_dtype;

/* Size in bytes of one element of dtype; 0 for FNORM_DTYPE_SAME or an unknown value. */
FNORM_API size_t fnorm_dtype_size(fnorm_dtype dtype);

/* ---------------------------------------------------------------------------------------------
 * Problem descriptor.
 *
 * Describes shapes, dtypes and options, and holds no data pointer, so one descriptor serves a
 * forward and its backward. Fill it with fnorm_desc_init() and then change fields as needed.
 * The struct grows only at its end, and every field added later has 0 meaning "off", so code
 * that zeroes the struct (fnorm_desc_init does) keeps its meaning across versions.
 * ------------------------------------------------------------------------------------------- */
typedef struct fnorm_desc {
  fnorm_device device; /* where the pointers live and the work runs */
  fnorm_norm norm;     /* FNORM_LAYERNORM or FNORM_RMSNORM */
  int64_t rows;        /* M >= 1: the number of rows */
  int64_t cols;        /* N >= 1: elements per row, the normalized dimension */
  /* dtype of x, y, dy and dx: FNORM_DTYPE_F32, _F16 or _BF16. */
  fnorm_dtype dtype;
  /* dtype of gamma, beta, dgamma and dbeta: FNORM_DTYPE_SAME (default) or FNORM_DTYPE_F32
   * (fp32 master parameters with fp16/bf16 activations). Any other combination is
   * FNORM_ERR_BAD_DTYPE. */
  fnorm_dtype param_dtype;
  /* Added to the variance (LayerNorm) or to the mean square (RMSNorm) before the square
   * root. Must be finite and > 0. fnorm_desc_init sets 1e-5. */
  float eps;
  /* Row strides in elements: row i of x starts at x + i * x_stride. 0 means cols (rows
   * packed). Otherwise a stride must be >= cols; a negative stride is FNORM_ERR_BAD_STRIDE.
   * y_stride applies to the forward's y and to the y given to a backward in its place of x;
   * dy_stride and dx_stride apply to the backward only. */
  int64_t x_stride;
  int64_t y_stride;
  int64_t dy_stride;
  int64_t dx_stride;
  /* FNORM_DEVICE_CPU only: the most threads to use; 0 uses the OpenMP default. The result
   * does not depend on it (bitwise). Ignored for CUDA. */
  int cpu_threads;
  /* Reserved for options that later versions define; must be 0 now (else FNORM_ERR_BAD_FLAGS). */
  uint32_t flags;
} fnorm_desc;

/* Zeroes *desc and sets device, norm, dtype, rows, cols, param_dtype = FNORM_DTYPE_SAME,
 * eps = 1e-5, packed strides, cpu_threads = 0 and flags = 0. Checks nothing but desc != NULL
 * (FNORM_ERR_NULL_POINTER); the operations check the rest. */
FNORM_API fnorm_status fnorm_desc_init(fnorm_desc *desc, fnorm_device device, fnorm_norm norm,
                                       fnorm_dtype dtype, int64_t rows, int64_t cols);

/* FNORM_SUCCESS if `device` can run work now; FNORM_ERR_NOT_BUILT if the library was built
 * without its backend; FNORM_ERR_NO_DEVICE if no CUDA device or driver is usable;
 * FNORM_ERR_BAD_DEVICE for an unknown value. */
FNORM_API fnorm_status fnorm_device_available(fnorm_device device);

/* ---------------------------------------------------------------------------------------------
 * Forward.
 *
 * Writes (overwrites) y; writes mean and rstd when given (training), skips them when NULL
 * (inference). x and y may be the same buffer with the same stride (in place); any other
 * overlap between an output and an input or another output is FNORM_ERR_ALIASING.
 * Pointers must be aligned to their element size (FNORM_ERR_MISALIGNED otherwise); larger
 * alignment (16 bytes) and packed rows let the CUDA kernels use vector access, but are not
 * required. NaN or Inf in a row gives NaN/Inf in that row's y, mean and rstd only.
 * CUDA, sm_90: fp32 RMSNorm rows of more than 262144 elements (not in place) run as one
 * cooperative launch of every CTA the device holds at once, which uses y as its scratch until
 * it writes it; where the device refuses that launch (e.g. an MPS client given fewer SMs), the
 * call runs them on the kernel that reads x twice instead.
 * ------------------------------------------------------------------------------------------- */
typedef struct fnorm_forward_args {
  const void *x;     /* required. [rows][x_stride] of dtype: the input */
  const void *gamma; /* optional. [cols] of param_dtype: the scale; NULL means 1 */
  const void *beta;  /* optional. [cols] of param_dtype: the shift; NULL means 0 */
  void *y;           /* required. [rows][y_stride] of dtype: the output, overwritten */
  /* optional. [rows] fp32, overwritten: each row's mean. LayerNorm only: must be NULL for
   * RMSNorm (FNORM_ERR_BAD_ARGUMENT), which has no mean. */
  float *mean;
  float *rstd; /* optional. [rows] fp32, overwritten: each row's 1/sqrt(var + eps) */
} fnorm_forward_args;

FNORM_API fnorm_status fnorm_forward(const fnorm_desc *desc, const fnorm_forward_args *args,
                                     void *stream);

/* ---------------------------------------------------------------------------------------------
 * Backward.
 *
 * Given dy = dL/dy, computes dx = dL/dx, dgamma = dL/dgamma and dbeta = dL/dbeta. Each of dx,
 * dgamma and dbeta is optional (NULL skips it) and is overwritten, never accumulated into.
 * (The CUDA backend runs RMSNorm without dbeta on kernels of its own, so asking for dbeta or not
 * may change dgamma in its last bits; each way is deterministic.)
 *
 * The forward's input can be given in two ways, exactly one of which must be used:
 *  - x with the forward's rstd (and mean, for LayerNorm): exact.
 *  - y, the forward's output, with rstd, gamma and beta (when the forward had them):
 *    the memory-efficient form, which lets training free x. xhat is recovered as
 *    (y - beta) / gamma, so it is as accurate as y's dtype, and gamma must have no zero.
 *    (For 16-bit dtypes the CUDA backend divides by the GPU's fast division, within 2 ulp of
 *    fp32, far below y's rounding, for |gamma| below 2^126.)
 * dx may be the same buffer as dy with the same stride (in place); any other overlap of an
 * output with an input or another output is FNORM_ERR_ALIASING.
 * ------------------------------------------------------------------------------------------- */
typedef struct fnorm_backward_args {
  const void *dy;    /* required. [rows][dy_stride] of dtype: the gradient of y */
  const void *x;     /* [rows][x_stride] of dtype: the forward's input, or NULL if y is given */
  const void *y;     /* [rows][y_stride] of dtype: the forward's output, or NULL if x is given */
  const float *mean; /* [rows] fp32 from the forward: LayerNorm with x; otherwise ignored */
  const float *rstd; /* required. [rows] fp32 from the forward */
  const void *gamma; /* optional. [cols] of param_dtype: the scale the forward used; NULL = 1 */
  const void *beta;  /* with y only: [cols] of param_dtype, the forward's shift; NULL = 0 */
  void *dx;          /* optional. [rows][dx_stride] of dtype, overwritten */
  void *dgamma;      /* optional. [cols] of param_dtype, overwritten */
  void *dbeta;       /* optional. [cols] of param_dtype, overwritten */
} fnorm_backward_args;

/* Bytes of workspace fnorm_backward needs for this descriptor, in *bytes (0 is possible).
 * For CUDA the size is for the current device. The descriptor is checked as by
 * fnorm_backward, with the same statuses. */
FNORM_API fnorm_status fnorm_backward_workspace_size(const fnorm_desc *desc, size_t *bytes);

/* workspace: [workspace_bytes] scratch on the descriptor's device, 16-byte aligned, used only
 * during the call (for CUDA: until the work queued on `stream` completes), never read before it
 * is written. May be NULL when the query gave 0. A workspace_bytes below the query's answer is
 * FNORM_ERR_WORKSPACE_TOO_SMALL. */
FNORM_API fnorm_status fnorm_backward(const fnorm_desc *desc, const fnorm_backward_args *args,
                                      void *workspace, size_t workspace_bytes, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* FUSEDNORM_H */
