/*
 * Public front end: small queries, argument checking, and dispatch to a backend.
 *
 * fnorm_forward, fnorm_backward and fnorm_backward_workspace_size check their arguments in this
 * fixed order; the first failing check gives the status, and no backend runs (so no output byte
 * is written) unless every check passes.
 *
 *   1. desc == NULL or args == NULL (the query: bytes == NULL)           FNORM_ERR_NULL_POINTER
 *   2. device is neither FNORM_DEVICE_CPU nor FNORM_DEVICE_CUDA         FNORM_ERR_BAD_DEVICE
 *   3. norm is neither FNORM_LAYERNORM nor FNORM_RMSNORM               FNORM_ERR_BAD_NORM
 *   4. dtype not F32/F16/BF16, or param_dtype not SAME/F32              FNORM_ERR_BAD_DTYPE
 *   5. flags != 0                                                       FNORM_ERR_BAD_FLAGS
 *   6. rows <= 0 or cols <= 0                                           FNORM_ERR_BAD_SIZE
 *   7. any of the four strides < 0, or 0 < stride < cols                FNORM_ERR_BAD_STRIDE
 *      (all four are checked in every call: one descriptor serves forward and backward)
 *   8. a byte extent ((rows - 1) * stride + cols) * element size overflows int64_t, ptrdiff_t
 *      or size_t, for each matrix the operation can use (forward: x, y; backward and its
 *      query: x, y, dy, dx), or cols * param size, or rows * 4            FNORM_ERR_BAD_SIZE
 *   9. eps NaN, infinite or <= 0                                        FNORM_ERR_BAD_EPS
 *      The query stops here and asks the backend (CUDA not built: FNORM_ERR_NOT_BUILT).
 *  10. a required pointer is NULL                                       FNORM_ERR_NULL_POINTER
 *      forward: x or y. backward, in this order: dy or rstd NULL, or x and y both NULL
 *      (FNORM_ERR_NULL_POINTER); x and y both set (FNORM_ERR_BAD_ARGUMENT); LayerNorm with x
 *      and mean NULL (FNORM_ERR_NULL_POINTER).
 *  11. an argument the operation does not take                          FNORM_ERR_BAD_ARGUMENT
 *      forward: mean with RMSNorm. backward: beta with x. (The backward ignores mean when y is
 *      given or the norm is RMSNorm.)
 *  12. a pointer in use not aligned to its element size (2 or 4; mean/rstd 4), or a non-NULL
 *      workspace not 16-byte aligned                                    FNORM_ERR_MISALIGNED
 *  13. an output overlaps an input or another output, or the workspace [workspace,
 *      workspace + workspace_bytes) overlaps any buffer                 FNORM_ERR_ALIASING
 *      Allowed: y == x with y_stride == x_stride (forward), dx == dy with dx_stride ==
 *      dy_stride (backward), and two matrices with the same row pitch whose rows interleave
 *      without touching (e.g. the two halves of a [rows][2 * cols] buffer). Inputs may overlap.
 *  14. backward only: the backend's workspace size is asked for (CUDA not built:
 *      FNORM_ERR_NOT_BUILT); workspace_bytes below it               FNORM_ERR_WORKSPACE_TOO_SMALL
 *      then workspace NULL with a nonzero size                          FNORM_ERR_NULL_POINTER
 * Then the call goes to the backend; FNORM_DEVICE_CUDA in a build without CUDA answers
 * FNORM_ERR_NOT_BUILT.
 */
#include <float.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

/* ---------------------------------------------------------------------------------------------
 * Small queries
 * ------------------------------------------------------------------------------------------- */
unsigned fnorm_version_number(void) {
  return FNORM_VERSION_NUMBER;
}

const char *fnorm_version_string(void) {
  return FNORM_VERSION_STRING;
}

const char *fnorm_status_name(fnorm_status status) {
  switch (status) {
#define FNORM_STATUS_NAME_CASE_(name, value, text)                                                 \
  case name:                                                                                       \
    return #name;
    FNORM_STATUS_TABLE(FNORM_STATUS_NAME_CASE_)
#undef FNORM_STATUS_NAME_CASE_
  }
  return "FNORM_STATUS_UNKNOWN";
}

const char *fnorm_status_string(fnorm_status status) {
  switch (status) {
#define FNORM_STATUS_STRING_CASE_(name, value, text)                                               \
  case name:                                                                                       \
    return text;
    FNORM_STATUS_TABLE(FNORM_STATUS_STRING_CASE_)
#undef FNORM_STATUS_STRING_CASE_
  }
  return "unknown status";
}

size_t fnorm_dtype_size(fnorm_dtype dtype) {
  switch (dtype) {
  case FNORM_DTYPE_F32:
    return 4;
  case FNORM_DTYPE_F16:
  case FNORM_DTYPE_BF16:
    return 2;
  case FNORM_DTYPE_SAME:
    return 0;
  }
  return 0;
}

fnorm_status fnorm_desc_init(fnorm_desc *desc, fnorm_device device, fnorm_norm norm,
                             fnorm_dtype dtype, int64_t rows, int64_t cols) {
  if (desc == NULL) {
    return FNORM_ERR_NULL_POINTER;
  }
  memset(desc, 0, sizeof *desc);
  desc->device = device;
  desc->norm = norm;
  desc->rows = rows;
  desc->cols = cols;
  desc->dtype = dtype;
  desc->param_dtype = FNORM_DTYPE_SAME;
  desc->eps = 1e-5f;
  /* Strides 0 (packed), cpu_threads 0 (OpenMP default) and flags 0 come from the memset. */
  return FNORM_SUCCESS;
}

fnorm_status fnorm_device_available(fnorm_device device) {
  switch (device) {
  case FNORM_DEVICE_CPU:
    return FNORM_SUCCESS;
  case FNORM_DEVICE_CUDA:
#ifdef FNORM_HAVE_CUDA
    return fnorm_cuda_available();
#else
    return FNORM_ERR_NOT_BUILT;
#endif
  }
  return FNORM_ERR_BAD_DEVICE;
}

/* ---------------------------------------------------------------------------------------------
 * Descriptor checks (steps 2 to 9)
 * ------------------------------------------------------------------------------------------- */
typedef enum operation { OPERATION_FORWARD, OPERATION_BACKWARD } operation;

/* The largest byte count that fits int64_t, ptrdiff_t and size_t alike. */
static uint64_t max_byte_count(void) {
  uint64_t limit = (uint64_t)INT64_MAX;
  if ((uint64_t)PTRDIFF_MAX < limit) {
    limit = (uint64_t)PTRDIFF_MAX;
  }
  if ((uint64_t)SIZE_MAX < limit) {
    limit = (uint64_t)SIZE_MAX;
  }
  return limit;
}

/* *out = a * b + c, all non-negative; 0 if it would exceed max_byte_count(). */
static int checked_multiply_add(uint64_t a, uint64_t b, uint64_t c, uint64_t *out) {
  const uint64_t limit = max_byte_count();
  if (b != 0 && a > limit / b) {
    return 0;
  }
  if (a * b > limit - c) {
    return 0;
  }
  *out = a * b + c;
  return 1;
}

/* Whether the bytes spanned by a [rows][stride] matrix with rows of `cols` elements fit. */
static int matrix_extent_fits(int64_t rows, int64_t stride, int64_t cols, size_t element) {
  uint64_t elements;
  uint64_t bytes;
  return checked_multiply_add((uint64_t)(rows - 1), (uint64_t)stride, (uint64_t)cols, &elements) &&
         checked_multiply_add(elements, element, 0, &bytes);
}

static int stride_is_valid(int64_t stride, int64_t cols) {
  return stride == 0 || stride >= cols;
}

/* Steps 2 to 9: checks *desc (not NULL) for `op` and resolves it into *problem. */
static fnorm_status resolve_problem(const fnorm_desc *desc, operation op, fnorm_problem *problem) {
  if (desc->device != FNORM_DEVICE_CPU && desc->device != FNORM_DEVICE_CUDA) {
    return FNORM_ERR_BAD_DEVICE;
  }
  if (desc->norm != FNORM_LAYERNORM && desc->norm != FNORM_RMSNORM) {
    return FNORM_ERR_BAD_NORM;
  }
  const size_t element = fnorm_dtype_size(desc->dtype); /* 0 for SAME and unknown values */
  if (element == 0) {
    return FNORM_ERR_BAD_DTYPE;
  }
  fnorm_dtype param_dtype;
  if (desc->param_dtype == FNORM_DTYPE_SAME) {
    param_dtype = desc->dtype;
  } else if (desc->param_dtype == FNORM_DTYPE_F32) {
    param_dtype = FNORM_DTYPE_F32;
  } else {
    return FNORM_ERR_BAD_DTYPE;
  }
  if (desc->flags != 0) {
    return FNORM_ERR_BAD_FLAGS;
  }
  const int64_t rows = desc->rows;
  const int64_t cols = desc->cols;
  if (rows <= 0 || cols <= 0) {
    return FNORM_ERR_BAD_SIZE;
  }
  if (!stride_is_valid(desc->x_stride, cols) || !stride_is_valid(desc->y_stride, cols) ||
      !stride_is_valid(desc->dy_stride, cols) || !stride_is_valid(desc->dx_stride, cols)) {
    return FNORM_ERR_BAD_STRIDE;
  }
  const int64_t x_stride = desc->x_stride != 0 ? desc->x_stride : cols;
  const int64_t y_stride = desc->y_stride != 0 ? desc->y_stride : cols;
  const int64_t dy_stride = desc->dy_stride != 0 ? desc->dy_stride : cols;
  const int64_t dx_stride = desc->dx_stride != 0 ? desc->dx_stride : cols;
  uint64_t unused;
  if (!matrix_extent_fits(rows, x_stride, cols, element) ||
      !matrix_extent_fits(rows, y_stride, cols, element) ||
      (op == OPERATION_BACKWARD && (!matrix_extent_fits(rows, dy_stride, cols, element) ||
                                    !matrix_extent_fits(rows, dx_stride, cols, element))) ||
      !checked_multiply_add((uint64_t)cols, fnorm_dtype_size(param_dtype), 0, &unused) ||
      !checked_multiply_add((uint64_t)rows, sizeof(float), 0, &unused)) {
    return FNORM_ERR_BAD_SIZE;
  }
  /* Written so that NaN fails too; FLT_MAX excludes +Inf. */
  if (!(desc->eps > 0.0f && desc->eps <= FLT_MAX)) {
    return FNORM_ERR_BAD_EPS;
  }

  memset(problem, 0, sizeof *problem);
  problem->norm = desc->norm;
  problem->rows = rows;
  problem->cols = cols;
  problem->dtype = desc->dtype;
  problem->param_dtype = param_dtype;
  problem->eps = desc->eps;
  problem->x_stride = x_stride;
  problem->y_stride = y_stride;
  problem->dy_stride = dy_stride;
  problem->dx_stride = dx_stride;
  problem->cpu_threads = desc->cpu_threads;
  return FNORM_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Buffer checks (steps 12 and 13), driven by a table of the buffers a call uses
 * ------------------------------------------------------------------------------------------- */
/* A buffer as the checks see it: `rows` rows of `width` bytes, `pitch` bytes apart. */
typedef struct buffer_extent {
  const void *ptr;
  uint64_t alignment;
  uint64_t rows;
  uint64_t pitch;
  uint64_t width;
  int is_output;
  /* Two buffers with the same nonzero group may be the same memory with the same pitch: the
   * in-place pairs (forward x/y, backward dy/dx). */
  int in_place_group;
} buffer_extent;

/* The most buffers one call checks: the backward's dy, x or y, mean, rstd, gamma, beta, dx,
 * dgamma, dbeta and workspace. */
#define MAX_BUFFERS 10

typedef struct buffer_table {
  buffer_extent entries[MAX_BUFFERS];
  int count;
} buffer_table;

enum { NO_GROUP = 0, GROUP_IN_PLACE = 1 };

/* Adds a buffer when ptr is not NULL (an absent optional buffer takes part in no check). */
static void add_buffer(buffer_table *table, const void *ptr, uint64_t alignment, uint64_t rows,
                       uint64_t pitch, uint64_t width, int is_output, int in_place_group) {
  if (ptr == NULL || table->count >= MAX_BUFFERS) {
    return;
  }
  buffer_extent *e = &table->entries[table->count++];
  e->ptr = ptr;
  e->alignment = alignment;
  e->rows = rows;
  e->pitch = pitch;
  e->width = width;
  e->is_output = is_output;
  e->in_place_group = in_place_group;
}

static void add_matrix(buffer_table *table, const void *ptr, const fnorm_problem *p, int64_t stride,
                       int is_output, int in_place_group) {
  const uint64_t element = fnorm_dtype_size(p->dtype);
  /* The pitch only matters when rows > 1, where step 8 has shown it cannot overflow. */
  add_buffer(table, ptr, element, (uint64_t)p->rows, (uint64_t)stride * element,
             (uint64_t)p->cols * element, is_output, in_place_group);
}

static void add_param_vector(buffer_table *table, const void *ptr, const fnorm_problem *p,
                             int is_output) {
  const uint64_t bytes = (uint64_t)p->cols * fnorm_dtype_size(p->param_dtype);
  add_buffer(table, ptr, fnorm_dtype_size(p->param_dtype), 1, bytes, bytes, is_output, NO_GROUP);
}

static void add_row_statistic(buffer_table *table, const float *ptr, const fnorm_problem *p,
                              int is_output) {
  const uint64_t bytes = (uint64_t)p->rows * sizeof(float);
  add_buffer(table, ptr, sizeof(float), 1, bytes, bytes, is_output, NO_GROUP);
}

static fnorm_status check_alignment(const buffer_table *table) {
  for (int i = 0; i < table->count; i++) {
    if ((uintptr_t)table->entries[i].ptr % table->entries[i].alignment != 0) {
      return FNORM_ERR_MISALIGNED;
    }
  }
  return FNORM_SUCCESS;
}

/* [begin, end) of a buffer's bytes; end saturates rather than wrapping past the address space. */
static void byte_range(const buffer_extent *e, uintptr_t *begin, uintptr_t *end) {
  uint64_t span = (e->rows - 1) * e->pitch + e->width; /* fits: checked in step 8 */
  *begin = (uintptr_t)e->ptr;
  *end = *begin + (uintptr_t)span;
  if (*end < *begin || span > (uint64_t)UINTPTR_MAX) {
    *end = UINTPTR_MAX;
  }
}

static int buffers_overlap(const buffer_extent *a, const buffer_extent *b) {
  uintptr_t a_begin, a_end, b_begin, b_end;
  byte_range(a, &a_begin, &a_end);
  byte_range(b, &b_begin, &b_end);
  if (a_begin == a_end || b_begin == b_end || a_end <= b_begin || b_end <= a_begin) {
    return 0; /* an empty buffer (a zero-byte workspace) overlaps nothing */
  }
  if (a->in_place_group != NO_GROUP && a->in_place_group == b->in_place_group &&
      a_begin == b_begin && a->pitch == b->pitch) {
    return 0;
  }
  if (a->rows > 1 && b->rows > 1 && a->pitch == b->pitch) {
    /* Same pitch S: modulo S, a's rows cover [0, width_a) and b's cover [r, r + width_b) with
     * r = (b - a) mod S, so they never meet iff r >= width_a and r + width_b <= S. */
    const uint64_t pitch = a->pitch;
    uint64_t r;
    if (b_begin >= a_begin) {
      r = (uint64_t)(b_begin - a_begin) % pitch;
    } else {
      r = (pitch - (uint64_t)(a_begin - b_begin) % pitch) % pitch;
    }
    if (r >= a->width && r + b->width <= pitch) {
      return 0;
    }
  }
  return 1;
}

static fnorm_status check_aliasing(const buffer_table *table) {
  for (int i = 0; i < table->count; i++) {
    for (int j = i + 1; j < table->count; j++) {
      const buffer_extent *a = &table->entries[i];
      const buffer_extent *b = &table->entries[j];
      if ((a->is_output || b->is_output) && buffers_overlap(a, b)) {
        return FNORM_ERR_ALIASING;
      }
    }
  }
  return FNORM_SUCCESS;
}

static fnorm_status check_buffers(const buffer_table *table) {
  fnorm_status status = check_alignment(table);
  if (status != FNORM_SUCCESS) {
    return status;
  }
  return check_aliasing(table);
}

/* ---------------------------------------------------------------------------------------------
 * Forward
 * ------------------------------------------------------------------------------------------- */
fnorm_status fnorm_forward(const fnorm_desc *desc, const fnorm_forward_args *args, void *stream) {
  if (desc == NULL || args == NULL) {
    return FNORM_ERR_NULL_POINTER;
  }
  fnorm_problem p;
  fnorm_status status = resolve_problem(desc, OPERATION_FORWARD, &p);
  if (status != FNORM_SUCCESS) {
    return status;
  }
  if (args->x == NULL || args->y == NULL) {
    return FNORM_ERR_NULL_POINTER;
  }
  if (p.norm == FNORM_RMSNORM && args->mean != NULL) {
    return FNORM_ERR_BAD_ARGUMENT;
  }

  buffer_table table;
  table.count = 0;
  add_matrix(&table, args->x, &p, p.x_stride, 0, GROUP_IN_PLACE);
  add_matrix(&table, args->y, &p, p.y_stride, 1, GROUP_IN_PLACE);
  add_param_vector(&table, args->gamma, &p, 0);
  add_param_vector(&table, args->beta, &p, 0);
  add_row_statistic(&table, args->mean, &p, 1);
  add_row_statistic(&table, args->rstd, &p, 1);
  status = check_buffers(&table);
  if (status != FNORM_SUCCESS) {
    return status;
  }

  switch (desc->device) {
  case FNORM_DEVICE_CPU:
    (void)stream; /* the CPU backend is synchronous */
    return fnorm_cpu_forward(&p, args);
  case FNORM_DEVICE_CUDA:
#ifdef FNORM_HAVE_CUDA
    return fnorm_cuda_forward(&p, args, stream);
#else
    return FNORM_ERR_NOT_BUILT;
#endif
  }
  return FNORM_ERR_BAD_DEVICE;
}

/* ---------------------------------------------------------------------------------------------
 * Backward
 * ------------------------------------------------------------------------------------------- */
static fnorm_status backend_workspace_size(fnorm_device device, const fnorm_problem *p,
                                           size_t *bytes) {
  switch (device) {
  case FNORM_DEVICE_CPU:
    return fnorm_cpu_backward_workspace_size(p, bytes);
  case FNORM_DEVICE_CUDA:
#ifdef FNORM_HAVE_CUDA
    return fnorm_cuda_backward_workspace_size(p, bytes);
#else
    return FNORM_ERR_NOT_BUILT;
#endif
  }
  return FNORM_ERR_BAD_DEVICE;
}

fnorm_status fnorm_backward_workspace_size(const fnorm_desc *desc, size_t *bytes) {
  if (desc == NULL || bytes == NULL) {
    return FNORM_ERR_NULL_POINTER;
  }
  fnorm_problem p;
  fnorm_status status = resolve_problem(desc, OPERATION_BACKWARD, &p);
  if (status != FNORM_SUCCESS) {
    return status;
  }
  size_t required = 0;
  status = backend_workspace_size(desc->device, &p, &required);
  if (status != FNORM_SUCCESS) {
    return status;
  }
  *bytes = required;
  return FNORM_SUCCESS;
}

fnorm_status fnorm_backward(const fnorm_desc *desc, const fnorm_backward_args *args,
                            void *workspace, size_t workspace_bytes, void *stream) {
  if (desc == NULL || args == NULL) {
    return FNORM_ERR_NULL_POINTER;
  }
  fnorm_problem p;
  fnorm_status status = resolve_problem(desc, OPERATION_BACKWARD, &p);
  if (status != FNORM_SUCCESS) {
    return status;
  }
  const int from_x = args->x != NULL;
  if (args->dy == NULL || args->rstd == NULL || (args->x == NULL && args->y == NULL)) {
    return FNORM_ERR_NULL_POINTER;
  }
  if (args->x != NULL && args->y != NULL) {
    return FNORM_ERR_BAD_ARGUMENT;
  }
  const int uses_mean = from_x && p.norm == FNORM_LAYERNORM;
  if (uses_mean && args->mean == NULL) {
    return FNORM_ERR_NULL_POINTER;
  }
  if (from_x && args->beta != NULL) {
    return FNORM_ERR_BAD_ARGUMENT;
  }

  buffer_table table;
  table.count = 0;
  add_matrix(&table, args->dy, &p, p.dy_stride, 0, GROUP_IN_PLACE);
  add_matrix(&table, args->dx, &p, p.dx_stride, 1, GROUP_IN_PLACE);
  if (from_x) {
    add_matrix(&table, args->x, &p, p.x_stride, 0, NO_GROUP);
  } else {
    add_matrix(&table, args->y, &p, p.y_stride, 0, NO_GROUP);
  }
  if (uses_mean) {
    add_row_statistic(&table, args->mean, &p, 0);
  }
  add_row_statistic(&table, args->rstd, &p, 0);
  add_param_vector(&table, args->gamma, &p, 0);
  add_param_vector(&table, args->beta, &p, 0); /* NULL unless y is given: checked above */
  add_param_vector(&table, args->dgamma, &p, 1);
  add_param_vector(&table, args->dbeta, &p, 1);
  /* The workspace counts as an output; a NULL one is not added and is judged in step 14. */
  add_buffer(&table, workspace, 16, 1, workspace_bytes, workspace_bytes, 1, NO_GROUP);
  status = check_buffers(&table);
  if (status != FNORM_SUCCESS) {
    return status;
  }

  size_t required = 0;
  status = backend_workspace_size(desc->device, &p, &required);
  if (status != FNORM_SUCCESS) {
    return status;
  }
  if (workspace_bytes < required) {
    return FNORM_ERR_WORKSPACE_TOO_SMALL;
  }
  if (workspace == NULL && required > 0) {
    return FNORM_ERR_NULL_POINTER;
  }

  switch (desc->device) {
  case FNORM_DEVICE_CPU:
    (void)stream; /* the CPU backend is synchronous */
    return fnorm_cpu_backward(&p, args, workspace, workspace_bytes);
  case FNORM_DEVICE_CUDA:
#ifdef FNORM_HAVE_CUDA
    return fnorm_cuda_backward(&p, args, workspace, workspace_bytes, stream);
#else
    return FNORM_ERR_NOT_BUILT;
#endif
  }
  return FNORM_ERR_BAD_DEVICE;
}
