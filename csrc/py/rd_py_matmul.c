/*
 * Binding of the grouped GEMM drivers and of megablox's tile metadata.
 */
#include "py/rd_py.h"

#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* Group row boundaries: int64 [ng + 1], contiguous, non-decreasing in [0, limit]. */
int
rd_arg_bounds(PyObject *obj, rd_int ng, rd_int limit, const char *what, const rd_int **out)
{
    rd_arg_t b;
    if (rd_arg_array(obj, "bounds", 1, NPY_INT64, RD_CONTIG, &b) != 0)
        return -1;
    if (b.dim[0] != ng + 1) {
        PyErr_Format(PyExc_ValueError, "'bounds' must have %s + 1 = %zd entries, got %zd", what,
                     (Py_ssize_t)(ng + 1), (Py_ssize_t)b.dim[0]);
        return -1;
    }
    const npy_int64 *v = (const npy_int64 *)b.data;
    for (rd_int i = 0; i <= ng; i++) {
        if (v[i] < 0 || v[i] > limit || (i > 0 && v[i] < v[i - 1])) {
            PyErr_Format(PyExc_ValueError, "'bounds' must be non-decreasing within [0, %zd]",
                         (Py_ssize_t)limit);
            return -1;
        }
    }
    *out = (const rd_int *)v;
    return 0;
}

/* The 4-bit values of a quantized operand, the tuple (codes, scale,
 * zero_point, axis, length): codes a uint8 array holding two
 * float4_e2m1fn codes a byte (the low nibble first) along `axis`, where
 * it has (length + 1) / 2 bytes of unit stride, for `length` values; x
 * gets the values' shape and their nibble address and strides
 * (rd_kernel.h, RD_F4E2M1). */
static int
rd_arg_nibbles(PyObject *obj, const char *name, int ndim, rd_arg_t *x)
{
    Py_ssize_t axis = PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 3));
    Py_ssize_t length = PyLong_AsSsize_t(PyTuple_GET_ITEM(obj, 4));
    if (PyErr_Occurred())
        return -1;
    if (rd_arg_array(PyTuple_GET_ITEM(obj, 0), name, ndim, NPY_UINT8, 0, x) != 0)
        return -1;
    if (axis < 0 || axis >= ndim || length < 0 || x->dim[axis] != (length + 1) / 2
        || (length > 2 && x->stride[axis] != 1)) {
        PyErr_Format(PyExc_ValueError, "4-bit '%s' must hold (length + 1) / 2 bytes of unit stride along "
                     "its axis", name);
        return -1;
    }
    for (int d = 0; d < ndim; d++)
        x->stride[d] = d == axis ? 1 : 2 * x->stride[d];
    x->dim[axis] = length;
    x->dtype = RD_F4E2M1;
    x->data = (void *)((uintptr_t)x->data * 2u);
    return 0;
}

/* Whether every scale of a quantized operand (a tuple, as rd_arg_operand
 * read it, float32 scales) is a power of two in [2^-127, 2^127] with no
 * zero points: an e8m0 exponent, whose products with float4_e2m1fn values
 * bfloat16 and float32 hold exactly (up to overflow). */
int
rd_pow2_scales(PyObject *obj)
{
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) < 3 || PyTuple_GET_ITEM(obj, 2) != Py_None)
        return 0;
    PyObject *os = PyTuple_GET_ITEM(obj, 1);
    if (!PyArray_Check(os) || PyArray_TYPE((PyArrayObject *)os) != NPY_FLOAT32)
        return 0;
    PyArrayIterObject *it = (PyArrayIterObject *)PyArray_IterNew(os);
    if (it == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = 1;
    while (ok && it->index < it->size) {
        uint32_t u;
        memcpy(&u, it->dataptr, sizeof u);
        ok = u == 0x00400000u || ((u & 0x807fffffu) == 0 && (u >> 23) >= 1 && (u >> 23) <= 254);
        PyArray_ITER_NEXT(it);
    }
    Py_DECREF(it);
    return ok;
}

/* One operand of a grouped GEMM: an array of a storage dtype that compute
 * type `ct` packs (which = 0: lhs, 1: rhs), or a quantized operand, the
 * tuple (qvalue, scale, zero_point): qvalue int8 or float8_e4m3fn; scale an
 * array of the compute dtype with as many dimensions as qvalue, each
 * dividing qvalue's (tile = qvalue.shape // scale.shape); zero_point None
 * or an array like scale.  Fills x and q (q zeroed for a plain operand). */
int
rd_arg_operand(PyObject *obj, const char *name, int ndim, rd_ctype_t ct, int which, rd_arg_t *x,
               rd_scales_t *q)
{
    memset(q, 0, sizeof *q);
    if (!PyTuple_Check(obj)) {
        if (rd_arg_array(obj, name, ndim, RD_ANY_STORAGE, 0, x) != 0)
            return -1;
        if (rd_packer(ct, (rd_dtype_t)x->dtype, which) == NULL) {
            PyErr_Format(PyExc_TypeError, "a %s product cannot read '%s' (%s): give 'out' a wider "
                         "dtype, or pass quantized values with their scales",
                         rd_ctypes[ct].name, name, PyArray_DESCR(x->arr)->typeobj->tp_name);
            return -1;
        }
        return 0;
    }
    PyObject *oq, *os, *oz;
    char sname[64], zname[64];
    snprintf(sname, sizeof sname, "%s scale", name);
    snprintf(zname, sizeof zname, "%s zero_point", name);
    if (PyTuple_GET_SIZE(obj) != 3 && PyTuple_GET_SIZE(obj) != 5) {
        PyErr_Format(PyExc_TypeError, "quantized '%s' must be a tuple (qvalue, scale, zero_point) or, for "
                     "4-bit values, (codes, scale, zero_point, axis, length), got %zd items", name,
                     PyTuple_GET_SIZE(obj));
        return -1;
    }
    oq = PyTuple_GET_ITEM(obj, 0);
    os = PyTuple_GET_ITEM(obj, 1);
    oz = PyTuple_GET_ITEM(obj, 2);
    const int scale_type = ct == RD_CT_F64 ? NPY_FLOAT64 : NPY_FLOAT32;
    rd_arg_t s, z;
    if ((PyTuple_GET_SIZE(obj) == 5 ? rd_arg_nibbles(obj, name, ndim, x)
                                    : rd_arg_array(oq, name, ndim, RD_ANY_STORAGE, 0, x)) != 0 ||
        rd_arg_array(os, sname, ndim, scale_type, 0, &s) != 0 ||
        (oz != Py_None && rd_arg_array(oz, zname, ndim, scale_type, 0, &z) != 0))
        return -1;
    if (rd_qpacker(ct, (rd_dtype_t)x->dtype, which) == NULL) {
        PyErr_Format(PyExc_TypeError, "quantized '%s' must hold int8, float8_e4m3fn or 4-bit float values, got %s",
                     name, PyArray_DESCR(x->arr)->typeobj->tp_name);
        return -1;
    }
    rd_int tile[3] = {1, 1, 1};
    for (int d = 0; d < ndim; d++) {
        rd_int qd = x->dim[d], sd = s.dim[d];
        if (sd < 0 || (sd == 0 ? qd != 0 : qd % sd != 0)) {
            PyErr_Format(PyExc_ValueError, "'%s' has %zd entries on axis %d, which does not divide "
                         "the %zd of '%s'", sname, (Py_ssize_t)sd, d, (Py_ssize_t)qd, name);
            return -1;
        }
        if (oz != Py_None && z.dim[d] != sd) {
            PyErr_Format(PyExc_ValueError, "'%s' must have the shape of '%s'", zname, sname);
            return -1;
        }
        tile[3 - ndim + d] = sd > 0 && qd / sd > 0 ? qd / sd : 1;
    }
    q->s = s.data;
    q->z = oz != Py_None ? z.data : NULL;
    if (oz != Py_None)
        for (int d = 0; d < ndim; d++)
            if (z.stride[d] != s.stride[d] && z.dim[d] > 1) {
                PyErr_Format(PyExc_ValueError, "'%s' must have the strides of '%s'", zname, sname);
                return -1;
            }
    q->gs = ndim == 3 ? s.stride[0] : 0;
    q->rs = s.stride[ndim - 2];
    q->cs = s.stride[ndim - 1];
    q->tg = tile[0];
    q->tr = tile[1];
    q->tc = tile[2];
    return 0;
}

/* Whether quantized operand `obj` (a tuple, as rd_arg_operand read it)
 * holds int8 values whose zero points, if any, are integers in
 * [-128, 127]: its values less their zero points are then exact int16s.
 * (Called after rd_arg_operand accepted obj.) */
int
rd_int8_exact(PyObject *obj, const rd_arg_t *x)
{
    if (!PyTuple_Check(obj) || x->dtype != RD_I8)
        return 0;
    PyObject *oz = PyTuple_GET_ITEM(obj, 2);
    if (oz == Py_None)
        return 1;
    PyArrayIterObject *it = (PyArrayIterObject *)PyArray_IterNew(oz);
    if (it == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = 1;
    while (ok && it->index < it->size) {
        const float z = *(const float *)it->dataptr;
        ok = z >= -128.0f && z <= 127.0f && z == (float)(int)z;
        PyArray_ITER_NEXT(it);
    }
    Py_DECREF(it);
    return ok;
}

/* The output of a grouped GEMM: float32 or float64 (the compute type), or
 * float16 / bfloat16 (a float32 product rounded once into it). */
int
rd_arg_out(PyObject *oout, int ndim, rd_arg_t *out)
{
    if (rd_arg_array(oout, "out", ndim, RD_ANY_STORAGE, RD_AS_OUTPUT, out) != 0)
        return -1;
    if (out->dtype != RD_F32 && out->dtype != RD_F64 && out->dtype != RD_F16 && out->dtype != RD_BF16) {
        PyErr_Format(PyExc_TypeError, "'out' has dtype %s, expected float32, float64, float16 or bfloat16",
                     PyArray_DESCR(out->arr)->typeobj->tp_name);
        return -1;
    }
    return 0;
}

/* The operands of one grouped GEMM call: out (float32 or float64; float32
 * for a 16-bit out) picks the compute type; lhs and rhs as rd_arg_operand
 * reads them.  With `as_bf16` (a float32 product only), float32 operands
 * are read as bfloat16, each rounded to nearest even while packed.  Then
 * the dot-product types where they are served: a float32 product of two
 * bfloat16 operands (or operands read as bfloat16) runs on the type
 * rd_float_product chooses (AMX tiles, vdpbf16ps, or the widening float32
 * kernels; always those with `exact`, precision HIGHEST); a float32 product
 * of two int8 quantized operands (integral zero points) on the exact
 * integer type rd_int8_product chooses. */
static int
rd_parse_gemm(PyObject *args, int rhs_ndim, int out_ndim, rd_arg_t *lhs, rd_scales_t *lq,
              rd_arg_t *rhs, rd_scales_t *rq, rd_arg_t *out, PyObject **bounds, int *accumulate,
              rd_plan_t *plan, int *quantize_lhs)
{
    PyObject *olhs, *orhs, *oout;
    int as_bf16 = 0, exact = 0;
    *quantize_lhs = 0;
    if (!PyArg_ParseTuple(args, "OOOOp|ppp", &olhs, &orhs, bounds, &oout, accumulate, &as_bf16, quantize_lhs,
                          &exact))
        return -1;
    if (rd_arg_out(oout, out_ndim, out) != 0)
        return -1;
    rd_plan_init(plan, rd_arg_ctype(out));
    if (rd_arg_operand(olhs, "lhs", 2, plan->ct, 0, lhs, lq) != 0 ||
        rd_arg_operand(orhs, "rhs", rhs_ndim, plan->ct, 1, rhs, rq) != 0)
        return -1;
    if (as_bf16) {
        rd_arg_t *xs[2] = {lhs, rhs};
        const rd_scales_t *qs[2] = {lq, rq};
        for (int i = 0; i < 2; i++) {
            if (plan->ct != RD_CT_F32 || qs[i]->s != NULL ||
                (xs[i]->dtype != RD_F32 && xs[i]->dtype != RD_BF16)) {
                PyErr_Format(PyExc_TypeError, "a product of bfloat16-rounded operands takes float32 or "
                             "bfloat16 '%s' and a float32 result", i ? "rhs" : "lhs");
                return -1;
            }
            if (xs[i]->dtype == RD_F32)
                xs[i]->dtype = RD_F32_AS_BF16;
        }
    }
    if (*quantize_lhs) {
        const rd_ctype_t i8 = rd_int8_product();
        if (plan->ct != RD_CT_F32 || lq->s != NULL || (lhs->dtype != RD_F32 && lhs->dtype != RD_BF16)
            || !rd_int8_exact(orhs, rhs) || i8 == RD_CT_I8I32) {
            PyErr_SetString(PyExc_TypeError, "quantizing 'lhs' while packing takes a float32 or bfloat16 'lhs', "
                            "an int8 quantized 'rhs' and a float32 result, on a CPU with int8 dot products");
            return -1;
        }
        rd_plan_init(plan, i8);
        return 0;
    }
    /* quantized operands (4-bit weights included, whose values bfloat16
     * would hold exactly) are dequantized into float32 panels: float32
     * products, as their prepacked layouts compute them */
    const rd_ctype_t ct = rd_float_product(plan->ct, (rd_dtype_t)lhs->dtype, (rd_dtype_t)rhs->dtype,
                                           lq->s != NULL || rq->s != NULL, exact);
    if (ct != plan->ct)
        rd_plan_init(plan, ct);
    else if (plan->ct == RD_CT_F32 && rd_int8_exact(olhs, lhs) && rd_int8_exact(orhs, rhs))
        rd_plan_init(plan, rd_int8_product());
    return 0;
}

/* A float lhs [m, k] quantized to int8 while packed: its per-row scales
 * (filled by rd_row_scales before the call) in a new buffer *scales,
 * described in a->q as tiles of 1 x k. */
int
rd_dynamic_scales(rd_in_t *a, rd_int m, rd_int k, float **scales)
{
    *scales = (float *)malloc(sizeof(float) * (size_t)(m > 0 ? m : 1));
    if (*scales == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(&a->q, 0, sizeof a->q);
    a->q.s = *scales;
    a->q.rs = 1;
    a->q.tg = a->q.tr = 1;
    a->q.tc = k > 0 ? k : 1;
    return 0;
}

int
rd_fill_row_scales(const rd_in_t *a, rd_int m, rd_int k, float *scales)
{
    /* a row holding an infinity or a NaN has a non-finite scale: the check
     * of the values costs nothing more than their scales */
    rd_row_scales(a->p, a->dtype, m, k, a->rs, a->cs, scales);
    int finite = 1;
    for (rd_int i = 0; i < m; i++)
        finite &= scales[i] - scales[i] == 0.0f;
    return finite ? 0 : RD_RC_NON_FINITE;
}

PyObject *
rd_run_gemm(const rd_plan_t *plan, int contract, int quantize_lhs, rd_int m, rd_int k, rd_int n, rd_int ng,
            const rd_int *bounds, rd_in_t *a, const rd_in_t *b, const rd_out_t *c, int accumulate)
{
    float *scales = NULL;
    if (quantize_lhs && rd_dynamic_scales(a, m, k, &scales) != 0)
        return NULL;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    if (scales != NULL)
        rc = rd_fill_row_scales(a, m, k, scales);
    if (rc == 0)
        rc = contract ? rd_ragged_contract(plan, k, n, ng, bounds, a, b, c, accumulate)
                      : rd_ragged_rows(plan, k, n, ng, bounds, a, b, c, accumulate);
    Py_END_ALLOW_THREADS
    free(scales);
    return rd_gemm_result(rc);
}

/* None for a driver's 0, else the exception its return code means. */
PyObject *
rd_gemm_result(int rc)
{
    if (rc == -1)
        return PyErr_NoMemory();
    if (rc == RD_RC_NON_FINITE) {
        PyErr_SetString(PyExc_ValueError, "'lhs' holds an infinity or a NaN, which its int8 quantization per "
                        "row cannot represent (the row's scale would be infinite or NaN)");
        return NULL;
    }
    if (rc != 0) {
        PyErr_SetString(PyExc_TypeError, "no packing routine for these operand dtypes");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ragged_rows (contract = 0) or ragged_contract (contract = 1). */
static PyObject *
rd_gemm_call(PyObject *args, int contract)
{
    rd_arg_t lhs, rhs, out;
    rd_scales_t lq, rq;
    PyObject *obounds;
    int accumulate;
    rd_plan_t plan;
    const rd_int *bv;
    int quantize_lhs;
    if (rd_parse_gemm(args, contract ? 2 : 3, contract ? 3 : 2, &lhs, &lq, &rhs, &rq, &out, &obounds,
                      &accumulate, &plan, &quantize_lhs) != 0)
        return NULL;
    if (quantize_lhs && contract) {
        PyErr_SetString(PyExc_TypeError, "ragged_contract does not quantize its operands");
        return NULL;
    }
    rd_in_t a = {lhs.data, (rd_dtype_t)lhs.dtype, 0, lhs.stride[0], lhs.stride[1], lq, 0, 0, 0, NULL, NULL, NULL};
    rd_in_t b;
    rd_out_t c;
    rd_int k, n, ng, m;
    if (contract) {   /* lhs [k, m], rhs [m, n], out [ng, k, n] */
        k = lhs.dim[0], m = lhs.dim[1], n = rhs.dim[1], ng = out.dim[0];
        if (rhs.dim[0] != m || out.dim[1] != k || out.dim[2] != n) {
            PyErr_SetString(PyExc_ValueError, "shapes of lhs [k, m], rhs [m, n], out [g, k, n] disagree");
            return NULL;
        }
        b = (rd_in_t){rhs.data, (rd_dtype_t)rhs.dtype, 0, rhs.stride[0], rhs.stride[1], rq, 0, 0, 0, NULL, NULL,
                      NULL};
        c = (rd_out_t){out.data, out.stride[0], out.stride[1], out.stride[2], (rd_dtype_t)out.dtype};
    }
    else {            /* lhs [m, k], rhs [ng, k, n], out [m, n] */
        m = lhs.dim[0], k = lhs.dim[1], ng = rhs.dim[0], n = rhs.dim[2];
        if (rhs.dim[1] != k || out.dim[0] != m || out.dim[1] != n) {
            PyErr_SetString(PyExc_ValueError, "shapes of lhs [m, k], rhs [g, k, n], out [m, n] disagree");
            return NULL;
        }
        b = (rd_in_t){rhs.data, (rd_dtype_t)rhs.dtype, rhs.stride[0], rhs.stride[1], rhs.stride[2], rq, 0, 0, 0,
                      NULL, NULL, NULL};
        c = (rd_out_t){out.data, 0, out.stride[0], out.stride[1], (rd_dtype_t)out.dtype};
    }
    if (rd_arg_bounds(obounds, ng, m, contract ? "out.shape[0]" : "rhs.shape[0]", &bv) != 0)
        return NULL;
    return rd_run_gemm(&plan, contract, quantize_lhs, m, k, n, ng, bv, &a, &b, &c, accumulate);
}

PyDoc_STRVAR(ragged_rows_doc,
"ragged_rows(lhs, rhs, bounds, out, accumulate, as_bf16=False, quantize_lhs=False, exact=False)\n\n"
"For each group g: out[r] (+)= lhs[r] @ rhs[g] for r in [bounds[g], bounds[g+1]).\n"
"lhs [m, k], rhs [ng, k, n], bounds int64 [ng + 1], out [m, n].  out's dtype\n"
"(float32 or float64) is the compute type (a float16 or bfloat16 out: float32,\n"
"each tile rounded once into out when complete); lhs and rhs may be float16,\n"
"bfloat16, float32 or (for a float64 out) float64, widened while packing.\n"
"A quantized operand is the tuple (qvalue, scale, zero_point): int8 or\n"
"float8_e4m3fn values, scales of out's dtype and of qvalue's rank (tile =\n"
"qvalue.shape // scale.shape), zero_point None or like scale; each value\n"
"is read as (q - zero_point) * scale of its tile while packed; a float32\n"
"product of two int8 operands (zero points None or integers in [-128, 127])\n"
"sums the integers exactly in int32 per block and scales each block once\n"
"(AMX tiles, else vpdpbusd, where the CPU has them).  A float32 product of\n"
"two bfloat16 operands runs on AMX tiles where the CPU has them, else on\n"
"vdpbf16ps where it outruns the float32 FMAs; with as_bf16, float32\n"
"operands are rounded to bfloat16 (nearest even) while packed, and the\n"
"product is that of bfloat16 operands.  With quantize_lhs (ragged_rows, an\n"
"int8 quantized rhs, a CPU with int8 dot products), a float32 or bfloat16\n"
"lhs is quantized per row while packed (absmax / 127.5 scales, round half\n"
"to even): the product of raggeddot.quantize(lhs, 'int8', (0,)) and rhs.\n"
"With exact (precision HIGHEST), bfloat16 operands are widened and their\n"
"exact products summed in float32 (no dot-product instruction).\n"
"Rows outside [bounds[0], bounds[ng]) are left as they are.");

static PyObject *
rd_py_ragged_rows(PyObject *self, PyObject *args)
{
    (void)self;
    return rd_gemm_call(args, 0);
}

PyDoc_STRVAR(ragged_contract_doc,
"ragged_contract(lhs, rhs, bounds, out, accumulate, as_bf16=False, quantize_lhs=False, exact=False)\n\n"
"For each group g: out[g] (+)= lhs[:, rows] @ rhs[rows, :], rows = [bounds[g], bounds[g+1]).\n"
"lhs [k, m], rhs [m, n], bounds int64 [ng + 1], out [ng, k, n]; dtypes as ragged_rows.\n"
"An empty group gives zeros (or leaves out[g] as it is when accumulating).");

static PyObject *
rd_py_ragged_contract(PyObject *self, PyObject *args)
{
    (void)self;
    return rd_gemm_call(args, 1);
}

PyDoc_STRVAR(ragged_contract_gathered_doc,
"ragged_contract_gathered(lhs, rhs, bounds, out, accumulate, lhs_cols, rhs_rows, rhs_row_scale=None)\n\n"
"ragged_contract of lhs[:, lhs_cols] (lhs [k, t], lhs_cols int64 [m] in [0, t))\n"
"and rhs [m, n], or of lhs [k, m] and rhs[rhs_rows] (rhs [t, n]): one index,\n"
"the other None.  The indexed operand's columns (rows) are read through the\n"
"index while packed, never gathered whole (the dispatched rows of an MoE\n"
"layer, token rows[i] of slot i); the bits of ragged_contract on the\n"
"gathered array.  Float and 16-bit operands, not quantized.  rhs_row_scale\n"
"(with rhs_rows; float32 or float64 [m] of rhs's dtype): row i of the\n"
"product's rhs is rhs_row_scale[i] * rhs[rhs_rows[i]], each product rounded\n"
"to that dtype (the bits of the product of that scaled array).");

static PyObject *
rd_py_ragged_contract_gathered(PyObject *self, PyObject *args)
{
    PyObject *olhs, *orhs, *obounds, *oout, *ocols, *orows, *oscale = Py_None;
    int accumulate;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOpOO|O", &olhs, &orhs, &obounds, &oout, &accumulate, &ocols, &orows, &oscale))
        return NULL;
    if ((ocols == Py_None) == (orows == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "ragged_contract_gathered takes one index: 'lhs_cols' or 'rhs_rows'");
        return NULL;
    }
    PyObject *plain = Py_BuildValue("(OOOOi)", olhs, orhs, obounds, oout, accumulate);
    if (plain == NULL)
        return NULL;
    rd_arg_t lhs, rhs, out, idx;
    rd_scales_t lq, rq;
    PyObject *ob;
    rd_plan_t plan;
    int quantize_lhs;
    const int rc = rd_parse_gemm(plain, 2, 3, &lhs, &lq, &rhs, &rq, &out, &ob, &accumulate, &plan, &quantize_lhs);
    Py_DECREF(plain);
    if (rc != 0)
        return NULL;
    if (lq.s != NULL || rq.s != NULL || (plan.ct != RD_CT_F32 && plan.ct != RD_CT_F64
                                         && plan.ct != RD_CT_BF16DP && plan.ct != RD_CT_BF16MMA
                                         && plan.ct != RD_CT_BF16TILE)) {
        PyErr_SetString(PyExc_TypeError, "ragged_contract_gathered takes float or 16-bit operands, not quantized");
        return NULL;
    }
    const int by_cols = ocols != Py_None;
    const rd_arg_t *held = by_cols ? &lhs : &rhs;      /* the operand read through the index */
    const char *name = by_cols ? "lhs_cols" : "rhs_rows";
    if (rd_arg_array(by_cols ? ocols : orows, name, 1, NPY_INT64, RD_CONTIG, &idx) != 0 ||
        rd_arg_indices(&idx, name, 0, by_cols ? held->dim[1] : held->dim[0]) != 0)
        return NULL;
    const rd_int k = lhs.dim[0], m = idx.dim[0], n = rhs.dim[1], ng = out.dim[0];
    if ((by_cols ? rhs.dim[0] : lhs.dim[1]) != m || out.dim[1] != k || out.dim[2] != n) {
        PyErr_SetString(PyExc_ValueError, by_cols
                        ? "shapes of lhs [k, t], lhs_cols [m], rhs [m, n], out [g, k, n] disagree"
                        : "shapes of lhs [k, m], rhs [t, n], rhs_rows [m], out [g, k, n] disagree");
        return NULL;
    }
    const rd_int *bv;
    const void *rscale = NULL;
    if (by_cols && oscale != Py_None) {
        PyErr_SetString(PyExc_TypeError, "ragged_contract_gathered: 'rhs_row_scale' goes with 'rhs_rows'");
        return NULL;
    }
    if (rd_arg_bounds(obounds, ng, m, "out.shape[0]", &bv) != 0 ||
        rd_arg_row_scale(oscale, "rhs_row_scale", &rhs, m, &rscale) != 0)
        return NULL;
    rd_in_t a = {.p = lhs.data, .dtype = (rd_dtype_t)lhs.dtype, .rs = lhs.stride[0], .cs = lhs.stride[1],
                 .cidx = by_cols ? (const long long *)idx.data : NULL};
    rd_in_t b = {.p = rhs.data, .dtype = (rd_dtype_t)rhs.dtype, .rs = rhs.stride[0], .cs = rhs.stride[1],
                 .ridx = by_cols ? NULL : (const long long *)idx.data, .rscale = rscale};
    const rd_out_t c = {out.data, out.stride[0], out.stride[1], out.stride[2], (rd_dtype_t)out.dtype};
    return rd_run_gemm(&plan, 1, 0, m, k, n, ng, bv, &a, &b, &c, accumulate);
}

/* -------------------------------------------------------------- metadata */

PyDoc_STRVAR(make_group_metadata_doc,
"make_group_metadata(group_sizes, m, tm, start_group, num_nonzero_groups, visit_empty_groups)\n\n"
"megablox's tile metadata.  group_sizes: int64 [g], non-negative, sum <= m;\n"
"m % tm == 0.  Returns ((group_offsets, group_ids, m_tile_ids), num_tiles).");

static PyObject *
rd_py_make_group_metadata(PyObject *self, PyObject *args)
{
    PyObject *ogs;
    Py_ssize_t m, tm, start_group, num_nonzero;
    int visit_empty;
    rd_arg_t gs;
    (void)self;
    if (!PyArg_ParseTuple(args, "Onnnnp", &ogs, &m, &tm, &start_group, &num_nonzero, &visit_empty))
        return NULL;
    if (rd_arg_array(ogs, "group_sizes", 1, NPY_INT64, RD_CONTIG, &gs) != 0)
        return NULL;
    npy_intp ng = gs.dim[0];
    const npy_int64 *sizes = (const npy_int64 *)gs.data;
    npy_int64 total = 0;
    for (npy_intp i = 0; i < ng; i++) {
        if (sizes[i] < 0 || sizes[i] > INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "'group_sizes' has an entry outside [0, 2**31)");
            return NULL;
        }
        total += sizes[i];
    }
    if (ng < 1 || m < 1 || tm < 1 || m % tm != 0 || total > m || m > INT32_MAX ||
        start_group < 0 || num_nonzero < 0 || start_group + num_nonzero > ng) {
        PyErr_SetString(PyExc_ValueError, "invalid make_group_metadata arguments");
        return NULL;
    }
    npy_intp len_off = ng + 1, len_ids = m / tm + ng - 1;
    PyArrayObject *offsets = (PyArrayObject *)PyArray_EMPTY(1, &len_off, NPY_INT32, 0);
    PyArrayObject *ids = (PyArrayObject *)PyArray_EMPTY(1, &len_ids, NPY_INT32, 0);
    PyArrayObject *tiles = (PyArrayObject *)PyArray_EMPTY(1, &len_ids, NPY_INT32, 0);
    if (offsets == NULL || ids == NULL || tiles == NULL)
        goto error;
    long long num_tiles;
    Py_BEGIN_ALLOW_THREADS
    num_tiles = rd_make_group_metadata((const rd_int *)sizes, ng, m, tm, start_group,
                                       num_nonzero, visit_empty,
                                       (int *)PyArray_DATA(offsets), (int *)PyArray_DATA(ids),
                                       (int *)PyArray_DATA(tiles));
    Py_END_ALLOW_THREADS
    if (num_tiles < 0) {
        PyErr_NoMemory();
        goto error;
    }
    return Py_BuildValue("(NNN)L", (PyObject *)offsets, (PyObject *)ids,
                         (PyObject *)tiles, num_tiles);
error:
    Py_XDECREF(offsets);
    Py_XDECREF(ids);
    Py_XDECREF(tiles);
    return NULL;
}

PyMethodDef rd_matmul_methods[] = {
    {"ragged_rows", rd_py_ragged_rows, METH_VARARGS, ragged_rows_doc},
    {"ragged_contract", rd_py_ragged_contract, METH_VARARGS, ragged_contract_doc},
    {"ragged_contract_gathered", rd_py_ragged_contract_gathered, METH_VARARGS, ragged_contract_gathered_doc},
    {"make_group_metadata", rd_py_make_group_metadata, METH_VARARGS, make_group_metadata_doc},
    {NULL, NULL, 0, NULL},
};
