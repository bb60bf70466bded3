/*
 * The binding of the fused gate and up products of an MoE layer's experts
 * (frame/rd_driver.c rd_gated_rows, with moe/rd_moe.c's epilogue).
 */
#include "rd_py.h"
#include "moe/rd_moe.h"

#include <stdint.h>
#include <string.h>

/* An optional [ng, n] bias of the compute type with contiguous rows. */
static int
rd_gated_bias(PyObject *obj, const char *name, int type_num, rd_int ng, rd_int n, const void **data,
              rd_int *rs)
{
    *data = NULL;
    if (obj == Py_None)
        return 0;
    rd_arg_t b;
    if (rd_arg_array(obj, name, 2, type_num, RD_ROWS, &b) != 0)
        return -1;
    if (b.dim[0] != ng || b.dim[1] != n) {
        PyErr_Format(PyExc_ValueError, "'%s' must be [%zd, %zd], got [%zd, %zd]", name, (Py_ssize_t)ng,
                     (Py_ssize_t)n, (Py_ssize_t)b.dim[0], (Py_ssize_t)b.dim[1]);
        return -1;
    }
    if (*rs != 0 && *rs != b.stride[0]) {
        PyErr_SetString(PyExc_ValueError, "'b0' and 'b1' must have the same row stride");
        return -1;
    }
    *data = b.data;
    *rs = b.stride[0];
    return 0;
}

/* An optional [m, n] array of the hidden dtype with the row stride of a
 * (the array named `ref`). */
static int
rd_gated_out(PyObject *obj, const char *name, const char *ref, const rd_arg_t *a, void **data)
{
    *data = NULL;
    if (obj == Py_None)
        return 0;
    rd_arg_t o;
    if (rd_arg_array(obj, name, 2, a->type_num, RD_AS_OUTPUT | RD_ROWS, &o) != 0)
        return -1;
    if (o.dim[0] != a->dim[0] || o.dim[1] != a->dim[1] || o.stride[0] != a->stride[0]) {
        PyErr_Format(PyExc_ValueError, "'%s' must have the shape, dtype and row stride of '%s'", name, ref);
        return -1;
    }
    *data = o.data;
    return 0;
}

/* The hidden activations' array `name` (float32, float64, float16 or
 * bfloat16, contiguous rows; writeable when `flags` says so) and a known
 * activation code; -1 with an exception otherwise. */
static int
rd_gated_hidden(PyObject *obj, const char *name, int flags, int kind, rd_arg_t *x)
{
    if (rd_arg_array(obj, name, 2, RD_ANY_STORAGE, flags | RD_ROWS, x) != 0)
        return -1;
    if (x->dtype != RD_F32 && x->dtype != RD_F64 && x->dtype != RD_F16 && x->dtype != RD_BF16) {
        PyErr_Format(PyExc_TypeError, "'%s' must be float32, float64, float16 or bfloat16", name);
        return -1;
    }
    if (kind < RD_ACT_SILU || kind > RD_ACT_SWIGLU_OAI) {
        PyErr_Format(PyExc_ValueError, "unknown activation code %d", kind);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(gated_rows_doc,
"gated_rows(lhs, w0, w1, bounds, a, h0, h1, b0, b1, kind, limit, alpha, rows=None)\n\n"
"The gate and up products of an MoE layer's experts in one pass: for each\n"
"group g, rows r in [bounds[g], bounds[g+1]): h0 = lhs[r] @ w0[g] (+ b0[g]),\n"
"h1 = lhs[r] @ w1[g] (+ b1[g]), rounded to a's dtype (written to h0, h1 when\n"
"given), a[r] = gated_act(h0, h1) (activation `kind`).  lhs [m, k] and\n"
"w0, w1 [g, k, n] arrays the packing reads (w0 and w1 of one dtype); a [m,\n"
"n] float32, float64, bfloat16 or float16 with contiguous rows (h0, h1\n"
"like it or None; w0 and w1 may be QArray tuples as ragged_rows reads them);\n"
"b0, b1 [g, n] of the compute type or None.  The values\n"
"of ragged_rows into h0 and h1 then gated_act, bit for bit.  Rows outside\n"
"[bounds[0], bounds[g]) are left as they are.  w0 may instead be the tuple\n"
"(buf0, buf1, dtype, ctype, g, k, n, kc, nr, qtile, qzp) of two prepacked\n"
"layouts of one kind (w1 then ignored).  rows: None, or int64 [m]:\n"
"row i of the product is row rows[i] of lhs (gathered while packed).");

static PyObject *
rd_py_gated_rows(PyObject *self, PyObject *args)
{
    PyObject *olhs, *ow0, *ow1, *obounds, *oa, *oh0, *oh1, *ob0, *ob1, *oidx = Py_None;
    int kind;
    double limit, alpha;
    rd_arg_t lhs, w0, w1, a;
    const rd_int *bv;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOidd|O", &olhs, &ow0, &ow1, &obounds, &oa, &oh0, &oh1, &ob0, &ob1,
                          &kind, &limit, &alpha, &oidx))
        return NULL;
    if (rd_gated_hidden(oa, "a", RD_AS_OUTPUT, kind, &a) != 0)
        return NULL;
    rd_plan_t plan;     /* the prepacked layout's, or made below */
    const rd_ctype_t base = a.dtype == RD_F64 ? RD_CT_F64 : RD_CT_F32;
    if (rd_arg_array(olhs, "lhs", 2, RD_ANY_STORAGE, 0, &lhs) != 0)
        return NULL;
    /* prepacked weights: the tuple (buf0, buf1, dtype, ctype, g, k, n, kc,
     * nr, qtile, qzp) of two PackedRhs of one layout */
    const int packed = PyTuple_Check(ow0) && PyTuple_GET_SIZE(ow0) == 11;
    Py_ssize_t pg = 0, pk = 0, pn = 0, pkc = 0, pnr = 0, pqtile = 0;
    int pqzp = 0, pdt = -1;
    size_t per = 0;
    rd_arg_t buf0, buf1;
    if (packed) {
        PyObject *ob0, *ob1;
        const char *dtname, *ctname;
        if (!PyArg_ParseTuple(ow0, "OOssnnnnnnp", &ob0, &ob1, &dtname, &ctname, &pg, &pk, &pn, &pkc, &pnr, &pqtile,
                              &pqzp))
            return NULL;
        pdt = rd_dtype_named(dtname);
        if (pdt < 0 || rd_prepack_plan(ctname, pkc, pnr, &plan) != 0 ||
            rd_arg_array(ob0, "w0", 1, NPY_UINT8, RD_CONTIG, &buf0) != 0 ||
            rd_arg_array(ob1, "w1", 1, NPY_UINT8, RD_CONTIG, &buf1) != 0)
            return NULL;
        per = rd_prepack_bytes(&plan, (rd_dtype_t)pdt, pk, pn, pqtile, pqzp);
        if (rd_ctype_layout(plan.ct) == RD_CT_U8S8 || (per == 0 && pk > 0 && pn > 0) ||
            (size_t)buf0.dim[0] != per * (size_t)pg || (size_t)buf1.dim[0] != per * (size_t)pg ||
            (pg > 0 && per > 0 && (((uintptr_t)buf0.data | (uintptr_t)buf1.data) & 63) != 0)) {
            PyErr_SetString(PyExc_ValueError, "prepacked 'w0' and 'w1' must be two layouts of float products "
                            "of one shape, 64-byte aligned");
            return NULL;
        }
        w0.dim[0] = pg, w0.dim[1] = pk, w0.dim[2] = pn;
        w0.dtype = pdt;
        w0.arr = NULL;
    }
    /* plain or quantized (the tuple (qvalue, scale, zero_point...) of a
     * QArray: dequantized while packed) weights, both alike */
    rd_scales_t q0, q1;
    memset(&q0, 0, sizeof q0);
    memset(&q1, 0, sizeof q1);
    if (!packed && (rd_arg_operand(ow0, "w0", 3, base, 1, &w0, &q0) != 0 ||
                    rd_arg_operand(ow1, "w1", 3, base, 1, &w1, &q1) != 0))
        return NULL;
    if (!packed && (w0.dtype != w1.dtype || w0.dim[0] != w1.dim[0] || w0.dim[1] != w1.dim[1]
                    || w0.dim[2] != w1.dim[2] || (q0.s == NULL) != (q1.s == NULL))) {
        PyErr_SetString(PyExc_ValueError, "'w0' and 'w1' must have one dtype, shape and quantization");
        return NULL;
    }
    /* with a row index, row i of the product is row rows[i] of lhs */
    rd_arg_t idx;
    const long long *ridx = NULL;
    rd_int m = lhs.dim[0];
    if (oidx != Py_None) {
        if (rd_arg_array(oidx, "rows", 1, NPY_INT64, RD_CONTIG, &idx) != 0 ||
            rd_arg_indices(&idx, "rows", 0, lhs.dim[0]) != 0)
            return NULL;
        ridx = (const long long *)idx.data;
        m = idx.dim[0];
    }
    const rd_int k = lhs.dim[1], ng = w0.dim[0], n = w0.dim[2];
    if (w0.dim[1] != k || a.dim[0] != m || a.dim[1] != n) {
        PyErr_SetString(PyExc_ValueError, "shapes of lhs [m, k], w0 and w1 [g, k, n], a [m, n] disagree");
        return NULL;
    }
    if (!packed)
        rd_plan_init(&plan, rd_float_product(base, (rd_dtype_t)lhs.dtype, (rd_dtype_t)w0.dtype, q0.s != NULL, 0));
    if (rd_packer(plan.ct, (rd_dtype_t)lhs.dtype, 0) == NULL ||
        rd_ctypes[plan.ct].c_size != rd_ctypes[base].c_size) {
        PyErr_Format(PyExc_TypeError, "a %s product cannot read 'lhs' (%s) or the weights, or write 'a' (%s)",
                     rd_ctypes[plan.ct].name, PyArray_DESCR(lhs.arr)->typeobj->tp_name,
                     PyArray_DESCR(a.arr)->typeobj->tp_name);
        return NULL;
    }
    rd_gated_out_t o;
    memset(&o, 0, sizeof o);
    o.ct = base;
    o.dt = (rd_dtype_t)a.dtype;
    o.kind = kind;
    o.limit = limit;
    o.alpha = alpha;
    o.a = a.data;
    o.rs = a.stride[0];
    const int bias_type = base == RD_CT_F64 ? NPY_FLOAT64 : NPY_FLOAT32;
    if (rd_gated_out(oh0, "h0", "a", &a, &o.h0) != 0 || rd_gated_out(oh1, "h1", "a", &a, &o.h1) != 0 ||
        rd_gated_bias(ob0, "b0", bias_type, ng, n, &o.b0, &o.b_rs) != 0 ||
        rd_gated_bias(ob1, "b1", bias_type, ng, n, &o.b1, &o.b_rs) != 0 ||
        rd_arg_bounds(obounds, ng, m, "w0.shape[0]", &bv) != 0)
        return NULL;
    rd_in_t x = {.p = lhs.data, .dtype = (rd_dtype_t)lhs.dtype, .rs = lhs.stride[0], .cs = lhs.stride[1],
                 .ridx = ridx};
    rd_in_t b0, b1;
    if (packed) {
        const rd_int panels = (pn + plan.k.nr - 1) / plan.k.nr;
        b0 = (rd_in_t){.p = buf0.data, .dtype = (rd_dtype_t)pdt, .gs = (rd_int)per, .panels = panels,
                       .qtile = pqtile, .qzp = pqzp};
        b1 = b0;
        b1.p = buf1.data;
    }
    else {
        b0 = (rd_in_t){.p = w0.data, .dtype = (rd_dtype_t)w0.dtype, .gs = w0.stride[0], .rs = w0.stride[1],
                       .cs = w0.stride[2], .q = q0};
        b1 = (rd_in_t){.p = w1.data, .dtype = (rd_dtype_t)w1.dtype, .gs = w1.stride[0], .rs = w1.stride[1],
                       .cs = w1.stride[2], .q = q1};
    }
    int rc = 0;
    if (bv[ng] > bv[0] && n > 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = rd_gated_rows(&plan, k, n, ng, bv, &x, &b0, &b1, rd_gated_epilogue, &o);
        Py_END_ALLOW_THREADS
    }
    return rd_gemm_result(rc);
}

PyDoc_STRVAR(gated_grad_rows_doc,
"gated_grad_rows(lhs, w, bounds, h0, h1, dh0, dh1, kind, limit, alpha)\n\n"
"The first products of an MoE layer's experts' backward with the\n"
"activation's gradient in their epilogue: for each group g, rows r in\n"
"[bounds[g], bounds[g+1]): d_a = lhs[r] @ w[g] rounded to h0's dtype (w an\n"
"array or a QArray tuple as ragged_rows reads it), then\n"
"dh0[r], dh1[r] = gated_act_grad(h0[r], h1[r], d_a).  lhs [m, k], w [g, k,\n"
"n] arrays the packing reads; h0, h1, dh0, dh1 [m, n] of one dtype (float32,\n"
"float64, bfloat16, float16) with contiguous rows and one row stride.  The\n"
"values of ragged_rows into d_a then gated_act_grad, bit for bit.");

static PyObject *
rd_py_gated_grad_rows(PyObject *self, PyObject *args)
{
    PyObject *olhs, *ow, *obounds, *oh0, *oh1, *od0, *od1;
    int kind;
    double limit, alpha;
    rd_arg_t lhs, w, h0;
    const rd_int *bv;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOidd", &olhs, &ow, &obounds, &oh0, &oh1, &od0, &od1, &kind, &limit,
                          &alpha))
        return NULL;
    if (rd_gated_hidden(oh0, "h0", 0, kind, &h0) != 0)
        return NULL;
    rd_gated_grad_t o;
    memset(&o, 0, sizeof o);
    void *h1 = NULL, *d0 = NULL, *d1 = NULL;
    if (rd_gated_out(oh1, "h1", "h0", &h0, &h1) != 0 || rd_gated_out(od0, "dh0", "h0", &h0, &d0) != 0 ||
        rd_gated_out(od1, "dh1", "h0", &h0, &d1) != 0)
        return NULL;
    if (h1 == NULL || d0 == NULL || d1 == NULL) {
        PyErr_SetString(PyExc_TypeError, "'h1', 'dh0' and 'dh1' must be arrays");
        return NULL;
    }
    const rd_ctype_t base = h0.dtype == RD_F64 ? RD_CT_F64 : RD_CT_F32;
    rd_plan_t plan;
    rd_scales_t q;
    if (rd_arg_array(olhs, "lhs", 2, RD_ANY_STORAGE, 0, &lhs) != 0 ||
        rd_arg_operand(ow, "w", 3, base, 1, &w, &q) != 0)
        return NULL;
    const rd_int m = lhs.dim[0], k = lhs.dim[1], ng = w.dim[0], n = w.dim[2];
    if (w.dim[1] != k || h0.dim[0] != m || h0.dim[1] != n) {
        PyErr_SetString(PyExc_ValueError, "shapes of lhs [m, k], w [g, k, n], h0 [m, n] disagree");
        return NULL;
    }
    rd_plan_init(&plan, rd_float_product(base, (rd_dtype_t)lhs.dtype, (rd_dtype_t)w.dtype, q.s != NULL, 0));
    if (rd_packer(plan.ct, (rd_dtype_t)lhs.dtype, 0) == NULL) {
        PyErr_Format(PyExc_TypeError, "a %s product cannot read 'lhs' (%s)", rd_ctypes[plan.ct].name,
                     PyArray_DESCR(lhs.arr)->typeobj->tp_name);
        return NULL;
    }
    if (rd_arg_bounds(obounds, ng, m, "w.shape[0]", &bv) != 0)
        return NULL;
    o.ct = base;
    o.dt = (rd_dtype_t)h0.dtype;
    o.kind = kind;
    o.limit = limit;
    o.alpha = alpha;
    o.h0 = h0.data;
    o.h1 = h1;
    o.dh0 = d0;
    o.dh1 = d1;
    o.rs = h0.stride[0];
    rd_in_t x = {.p = lhs.data, .dtype = (rd_dtype_t)lhs.dtype, .rs = lhs.stride[0], .cs = lhs.stride[1]};
    rd_in_t b = {.p = w.data, .dtype = (rd_dtype_t)w.dtype, .gs = w.stride[0], .rs = w.stride[1], .cs = w.stride[2],
                 .q = q};
    int rc = 0;
    if (bv[ng] > bv[0] && n > 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = rd_gated_rows(&plan, k, n, ng, bv, &x, &b, NULL, rd_gated_grad_epilogue, &o);
        Py_END_ALLOW_THREADS
    }
    return rd_gemm_result(rc);
}

PyMethodDef rd_gated_methods[] = {
    {"gated_rows", rd_py_gated_rows, METH_VARARGS, gated_rows_doc},
    {"gated_grad_rows", rd_py_gated_grad_rows, METH_VARARGS, gated_grad_rows_doc},
    {NULL, NULL, 0, NULL},
};
