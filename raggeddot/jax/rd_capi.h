/*
 * The C interface raggeddot._core exports to code compiled outside it (the
 * XLA FFI handlers of raggeddot.jax): a table of function pointers in the
 * PyCapsule raggeddot._core._C_API, named RD_CAPI_NAME.
 *
 * Each grouped GEMM makes its plan inside _core (rd_plan_init: the kernel
 * family, blocking and thread count in force when the call starts) and runs
 * the drivers the NumPy API runs; nothing here needs the GIL.
 *
 * Shapes and strides are in elements.  Operands are validated by the caller:
 * the functions below never check them.
 */
#ifndef RD_CAPI_H
#define RD_CAPI_H

#include <stddef.h>
#include <stdint.h>

#define RD_CAPI_NAME "raggeddot._core._C_API"
#define RD_CAPI_VERSION 1

/* Storage dtypes (the numbering of rd_dtype_t). */
enum { RD_CAPI_F32 = 0, RD_CAPI_F64 = 1, RD_CAPI_F16 = 2, RD_CAPI_BF16 = 3 };

/* A strided operand or output: element [g][i][j] at p + g*gs + i*rs + j*cs. */
typedef struct {
    void *p;
    int dtype;
    int64_t gs, rs, cs;
} rd_capi_array_t;

typedef struct {
    size_t size;        /* sizeof(rd_capi_t) of the exporter */
    int version;        /* RD_CAPI_VERSION */
    /* 1 when a product computing in float64 (wide) or float32 (!wide) reads
     * storage dtype `dtype` as its lhs (which = 0) or rhs (which = 1). */
    int (*reads)(int wide, int dtype, int which);
    /* Ragged rows:  out[r] = lhs[r] @ rhs[j] for r in [bounds[j], bounds[j+1]),
     * j < ng; lhs [m, k], rhs [ng, k, n], out [m, n] (float64 when wide;
     * float32, float16 or bfloat16 otherwise); rows outside the bounds are
     * not touched.  Returns 0, -1 out of memory, -2 an unreadable dtype. */
    int (*ragged_rows)(int wide, int64_t k, int64_t n, int64_t ng, const int64_t *bounds,
                       const rd_capi_array_t *lhs, const rd_capi_array_t *rhs,
                       const rd_capi_array_t *out);
    /* Ragged contraction: out[j] = lhs[:, rows_j] @ rhs[rows_j, :],
     * rows_j = [bounds[j], bounds[j+1]); lhs [k, m], rhs [m, n], out [ng, k, n];
     * an empty group gives zeros.  Returns as ragged_rows. */
    int (*ragged_contract)(int wide, int64_t k, int64_t n, int64_t ng, const int64_t *bounds,
                           const rd_capi_array_t *lhs, const rd_capi_array_t *rhs,
                           const rd_capi_array_t *out);
    /* Threads a call started now would use (rd_get_num_threads). */
    int (*num_threads)(void);
} rd_capi_t;

#endif /* RD_CAPI_H */
