/*
 * The C interface for code compiled outside the extension (rd_capi.h, which
 * ships in the raggeddot.jax package): the grouped GEMM drivers behind a
 * table of function pointers, exported as a PyCapsule.
 */
#include "py/rd_py.h"
#include "../../raggeddot/jax/rd_capi.h"

#include <string.h>

_Static_assert((int)RD_CAPI_F32 == (int)RD_F32 && (int)RD_CAPI_F64 == (int)RD_F64 &&
               (int)RD_CAPI_F16 == (int)RD_F16 && (int)RD_CAPI_BF16 == (int)RD_BF16,
               "rd_capi.h numbers dtypes as rd_dtype_t does");
_Static_assert(sizeof(int64_t) == sizeof(rd_int), "bounds are passed as rd_int");

static int
rd_capi_reads(int wide, int dtype, int which)
{
    if (dtype < 0 || dtype >= RD_DTYPE_COUNT)
        return 0;
    return rd_packer(wide ? RD_CT_F64 : RD_CT_F32, (rd_dtype_t)dtype, which) != NULL;
}

static rd_in_t
rd_capi_in(const rd_capi_array_t *a)
{
    rd_in_t x;
    memset(&x, 0, sizeof x);
    x.p = a->p;
    x.dtype = (rd_dtype_t)a->dtype;
    x.gs = a->gs;
    x.rs = a->rs;
    x.cs = a->cs;
    return x;
}

static int
rd_capi_gemm(int contract, int wide, int64_t k, int64_t n, int64_t ng, const int64_t *bounds,
             const rd_capi_array_t *lhs, const rd_capi_array_t *rhs, const rd_capi_array_t *out)
{
    rd_plan_t plan;
    /* two bfloat16 operands: the fastest kernels for them (AMX tiles,
     * vdpbf16ps where it pays; the caller widens them for HIGHEST) */
    rd_plan_init(&plan, rd_float_product(wide ? RD_CT_F64 : RD_CT_F32, (rd_dtype_t)lhs->dtype,
                                         (rd_dtype_t)rhs->dtype, 0, 0));
    rd_in_t a = rd_capi_in(lhs), b = rd_capi_in(rhs);
    rd_out_t c = {out->p, out->gs, out->rs, out->cs, (rd_dtype_t)out->dtype};
    const rd_int *bv = (const rd_int *)bounds;
    return contract ? rd_ragged_contract(&plan, k, n, ng, bv, &a, &b, &c, 0)
                    : rd_ragged_rows(&plan, k, n, ng, bv, &a, &b, &c, 0);
}

static int
rd_capi_rows(int wide, int64_t k, int64_t n, int64_t ng, const int64_t *bounds,
             const rd_capi_array_t *lhs, const rd_capi_array_t *rhs, const rd_capi_array_t *out)
{
    return rd_capi_gemm(0, wide, k, n, ng, bounds, lhs, rhs, out);
}

static int
rd_capi_contract(int wide, int64_t k, int64_t n, int64_t ng, const int64_t *bounds,
                 const rd_capi_array_t *lhs, const rd_capi_array_t *rhs, const rd_capi_array_t *out)
{
    return rd_capi_gemm(1, wide, k, n, ng, bounds, lhs, rhs, out);
}

static const rd_capi_t rd_capi_table = {
    sizeof(rd_capi_t), RD_CAPI_VERSION, rd_capi_reads, rd_capi_rows, rd_capi_contract,
    rd_get_num_threads,
};

int
rd_add_capi(PyObject *m)
{
    PyObject *cap = PyCapsule_New((void *)&rd_capi_table, RD_CAPI_NAME, NULL);
    if (cap == NULL)
        return -1;
    if (PyModule_AddObject(m, "_C_API", cap) != 0) {
        Py_DECREF(cap);
        return -1;
    }
    return 0;
}
