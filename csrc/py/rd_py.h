/*
 * The binding raggeddot._core: shared by the files under py/, the only
 * ones that include Python.h.
 *
 * Every entry point parses its arguments with rd_arg_array (one parser for
 * all), checks them (the public Python layer has already validated them for
 * users; these checks keep a direct call from crashing the interpreter),
 * allocates its outputs, releases the GIL around the kernel, and sets an
 * exception only after the GIL is back.
 */
#ifndef RD_PY_H
#define RD_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifndef RD_PY_MODULE_FILE
#define NO_IMPORT_ARRAY
#endif
#define PY_ARRAY_UNIQUE_SYMBOL rd_ARRAY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "rd_frame.h"

/* What an array argument must be. */
enum {
    RD_ANY_FLOAT = -1,      /* dtype: float32 or float64 */
    RD_ANY_STORAGE = -2,    /*        any storage dtype the packing reads:
                               float16, bfloat16 (ml_dtypes), float32, float64;
                               int8, float8_e4m3fn (ml_dtypes) with scales */
    RD_AS_OUTPUT = 1 << 0,  /* flags: writeable */
    RD_CONTIG = 1 << 1,     /*        C-contiguous */
    RD_ROWS = 1 << 2,       /*        2-D with contiguous rows */
};

/* A parsed array argument. */
typedef struct {
    PyArrayObject *arr;     /* borrowed */
    int type_num;           /* NumPy's */
    int dtype;              /* rd_dtype_t for float arrays, -1 otherwise */
    int ndim;
    rd_int dim[NPY_MAXDIMS];
    rd_int stride[NPY_MAXDIMS];   /* in elements */
    void *data;
} rd_arg_t;

/* Parse `obj` as argument `name`: a numpy.ndarray of `ndim` dimensions
 * (-1: any), of NumPy type `type_num` (or RD_ANY_FLOAT, RD_ANY_STORAGE),
 * aligned, in native byte order, with element-sized strides, and `flags`.
 * Returns 0, or -1 with an exception naming the argument. */
int rd_arg_array(PyObject *obj, const char *name, int ndim, int type_num, int flags,
                 rd_arg_t *out);

/* The compute type of a float32 (RD_CT_F32) or float64 (RD_CT_F64) array. */
rd_ctype_t rd_arg_ctype(const rd_arg_t *a);

/* Group row boundaries `obj`: int64 [ng + 1], contiguous, non-decreasing
 * in [0, limit] (`what` names ng in the message); -1 with an exception. */
int rd_arg_bounds(PyObject *obj, rd_int ng, rd_int limit, const char *what, const rd_int **out);

/* None for a grouped GEMM driver's return code 0, else the exception it
 * means (-1: MemoryError, -2: TypeError). */
PyObject *rd_gemm_result(int rc);

/* An operand of a grouped GEMM of compute type ct (which: 0 lhs, 1 rhs):
 * an array the packing reads, or a quantized tuple (qvalue, scale,
 * zero_point[, axis, length]) whose scales fill q (py/rd_py_matmul.c);
 * -1 with an exception naming `name`. */
int rd_arg_operand(PyObject *obj, const char *name, int ndim, rd_ctype_t ct, int which, rd_arg_t *x,
                   rd_scales_t *q);

/* The parts of a grouped GEMM call the prepacked product shares
 * (py/rd_py_matmul.c): a float out array of `ndim` dimensions; the run of
 * the product without the GIL (ragged rows, or with `contract` ragged
 * contraction; with `quantize_lhs` a float lhs quantized to int8 per row
 * while packed), None or the exception of its failure; whether a quantized
 * operand holds int8 values with integral zero points; whether every
 * scale of a quantized operand is a power of two. */
int rd_arg_out(PyObject *oout, int ndim, rd_arg_t *out);
/* A float lhs quantized to int8 per row while packed (py/rd_py_matmul.c):
 * rd_dynamic_scales gives it a new buffer of m scales (a->q; free it after
 * the call; -1 with MemoryError), rd_fill_row_scales fills them (no GIL
 * needed): 0, or RD_RC_NON_FINITE when a row holds an infinity or a NaN,
 * the code rd_gemm_result turns into a ValueError (run nothing then; the
 * Python callers replace it by one naming their function and argument). */
#define RD_RC_NON_FINITE (-3)
int rd_dynamic_scales(rd_in_t *a, rd_int m, rd_int k, float **scales);
int rd_fill_row_scales(const rd_in_t *a, rd_int m, rd_int k, float *scales);
PyObject *rd_run_gemm(const rd_plan_t *plan, int contract, int quantize_lhs, rd_int m, rd_int k, rd_int n,
                      rd_int ng, const rd_int *bounds, rd_in_t *a, const rd_in_t *b, const rd_out_t *c,
                      int accumulate);
int rd_int8_exact(PyObject *obj, const rd_arg_t *x);
int rd_pow2_scales(PyObject *obj);

/* The plan of prepacked weights of compute type `name` laid out with
 * blocking kc and panels nr (py/rd_py_prepack.c); the storage dtype of a
 * NumPy name.  -1 with an exception naming what disagrees. */
int rd_prepack_plan(const char *name, Py_ssize_t kc, Py_ssize_t nr, rd_plan_t *plan);
int rd_dtype_named(const char *name);

/* A new C-contiguous float array (float32, float64, float16, bfloat16;
 * descr's reference stolen) from the cache of result buffers
 * (py/rd_py_runtime.c); NULL with an exception. */
PyObject *rd_pool_array(PyArray_Descr *descr, int nd, const npy_intp *shape);

/* The storage dtype (rd_dtype_t) of arrays of descr, or -1 (py/rd_py_module.c). */
int rd_storage_dtype(PyArray_Descr *descr);

/* An optional float argument (None: absent, *data NULL) of the given
 * type and shape, contiguous; -1 with an exception naming `name`. */
int rd_arg_optional(PyObject *obj, const char *name, int ndim, int type_num, const rd_int *shape,
                    rd_arg_t *out, const void **data);

/* Every index of an int64 array in [lo, hi); -1 with an exception otherwise. */
int rd_arg_indices(const rd_arg_t *idx, const char *name, long long lo, long long hi);

/* The optional scale of each of the m rows an index gathers from `x`
 * (None: *data NULL): float32 or float64 [m] as x, which must be one of
 * those; -1 with an exception naming `name` otherwise. */
int rd_arg_row_scale(PyObject *obj, const char *name, const rd_arg_t *x, rd_int m, const void **data);

/* The methods of each role, NULL-terminated (py/rd_py_*.c). */
extern PyMethodDef rd_matmul_methods[];
extern PyMethodDef rd_moe_methods[];
extern PyMethodDef rd_runtime_methods[];
extern PyMethodDef rd_plan_methods[];
extern PyMethodDef rd_gated_methods[];
extern PyMethodDef rd_prepack_methods[];

/* Add the C interface capsule _C_API (py/rd_py_capi.c); 0 or -1. */
int rd_add_capi(PyObject *m);

#endif /* RD_PY_H */
