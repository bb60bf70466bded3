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

/* An optional [m, n] array of the hidden dtype with the shape of a (the
 * array named `ref`) and the row stride rs (any when rs < 0); its row
 * stride into *out_rs when given. */
static int
rd_gated_out_rs(PyObject *obj, const char *name, const char *ref, const rd_arg_t *a, rd_int rs, void **data,
                rd_int *out_rs)
{
    *data = NULL;
    if (obj == Py_None)
        return 0;
    rd_arg_t o;
    if (rd_arg_array(obj, name, 2, a->type_num, RD_AS_OUTPUT | RD_ROWS, &o) != 0)
        return -1;
    if (o.dim[0] != a->dim[0] || o.dim[1] != a->dim[1] || (rs >= 0 && o.stride[0] != rs)) {
        PyErr_Format(PyExc_ValueError, "'%s' must have the shape, dtype and row stride of '%s'", name, ref);
        return -1;
    }
    *data = o.data;
    if (out_rs != NULL)
        *out_rs = o.stride[0];
    return 0;
}

/* An optional [m, n] array of the hidden dtype with the row stride of a. */
static int
rd_gated_out(PyObject *obj, const char *name, const char *ref, const rd_arg_t *a, void **data)
{
    return rd_gated_out_rs(obj, name, ref, a, a->stride[0], data, NULL);
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

/* The optional row index of a fused pass's lhs (None: *ridx NULL, m its
 * rows): int64 [m] in [0, lhs rows). */
static int
rd_gated_row_index(PyObject *oidx, const rd_arg_t *lhs, rd_arg_t *idx, const long long **ridx, rd_int *m)
{
    *ridx = NULL;
    *m = lhs->dim[0];
    if (oidx == Py_None)
        return 0;
    if (rd_arg_array(oidx, "rows", 1, NPY_INT64, RD_CONTIG, idx) != 0 ||
        rd_arg_indices(idx, "rows", 0, lhs->dim[0]) != 0)
        return -1;
    *ridx = (const long long *)idx->data;
    *m = idx->dim[0];
    return 0;
}

/* The weights of a fused pass: w0 and w1 [g, k, n] (ow1 NULL: one weight,
 * named "w"), each a float array the packing reads or the tuple
 * (qvalue, scale, zero_point...) of a QArray (dequantized while packed),
 * both alike; or ow0 the tuple (buf0, buf1, dtype, ctype, g, k, n, kc, nr,
 * qtile, qzp) of two prepacked layouts of one float product (buf1 ignored
 * for one weight).  Sets the plan (the layout's, or the float product of
 * lhs and the weights into the compute type base) and checks that it
 * reads lhs and writes base's elements. */
typedef struct {
    rd_plan_t plan;
    rd_in_t b[2];
    rd_int g, k, n;
} rd_gated_w_t;

static int
rd_gated_weights(PyObject *ow0, PyObject *ow1, rd_ctype_t base, const rd_arg_t *lhs, int quantize_lhs,
                 rd_gated_w_t *w)
{
    const int pair = ow1 != NULL;
    const char *n0 = pair ? "w0" : "w", *n1 = "w1";
    memset(w, 0, sizeof *w);
    if (PyTuple_Check(ow0) && PyTuple_GET_SIZE(ow0) == 11) {
        PyObject *ob0, *ob1;
        const char *dtname, *ctname;
        Py_ssize_t pg, pk, pn, pkc, pnr, pqtile;
        int pqzp;
        rd_arg_t buf0, buf1;
        if (!PyArg_ParseTuple(ow0, "OOssnnnnnnp", &ob0, &ob1, &dtname, &ctname, &pg, &pk, &pn, &pkc, &pnr, &pqtile,
                              &pqzp))
            return -1;
        const int pdt = rd_dtype_named(dtname);
        if (pdt < 0 || rd_prepack_plan(ctname, pkc, pnr, &w->plan) != 0 ||
            rd_arg_array(ob0, n0, 1, NPY_UINT8, RD_CONTIG, &buf0) != 0 ||
            rd_arg_array(pair ? ob1 : ob0, pair ? n1 : n0, 1, NPY_UINT8, RD_CONTIG, &buf1) != 0)
            return -1;
        const size_t per = rd_prepack_bytes(&w->plan, (rd_dtype_t)pdt, pk, pn, pqtile, pqzp);
        if (rd_ctype_int8_dot(w->plan.ct) != quantize_lhs || (per == 0 && pk > 0 && pn > 0) ||
            (size_t)buf0.dim[0] != per * (size_t)pg || (size_t)buf1.dim[0] != per * (size_t)pg ||
            (pg > 0 && per > 0 && (((uintptr_t)buf0.data | (uintptr_t)buf1.data) & 63) != 0)) {
            PyErr_Format(PyExc_ValueError, "prepacked '%s' must be %s of %s products of one shape, "
                         "64-byte aligned", pair ? "w0' and 'w1" : n0, pair ? "two layouts" : "a layout",
                         quantize_lhs ? "int8 dot" : "float");
            return -1;
        }
        const rd_int panels = (pn + w->plan.k.nr - 1) / w->plan.k.nr;
        w->b[0] = (rd_in_t){.p = buf0.data, .dtype = (rd_dtype_t)pdt, .gs = (rd_int)per, .panels = panels,
                            .qtile = pqtile, .qzp = pqzp};
        w->b[1] = w->b[0];
        w->b[1].p = buf1.data;
        w->g = pg, w->k = pk, w->n = pn;
    }
    else {
        rd_arg_t w0, w1;
        rd_scales_t q0, q1;
        memset(&q0, 0, sizeof q0);
        memset(&q1, 0, sizeof q1);
        if (rd_arg_operand(ow0, n0, 3, base, 1, &w0, &q0) != 0 ||
            (pair && rd_arg_operand(ow1, n1, 3, base, 1, &w1, &q1) != 0))
            return -1;
        if (pair && (w0.dtype != w1.dtype || w0.dim[0] != w1.dim[0] || w0.dim[1] != w1.dim[1]
                     || w0.dim[2] != w1.dim[2] || (q0.s == NULL) != (q1.s == NULL))) {
            PyErr_SetString(PyExc_ValueError, "'w0' and 'w1' must have one dtype, shape and quantization");
            return -1;
        }
        w->b[0] = (rd_in_t){.p = w0.data, .dtype = (rd_dtype_t)w0.dtype, .gs = w0.stride[0], .rs = w0.stride[1],
                            .cs = w0.stride[2], .q = q0};
        if (pair)
            w->b[1] = (rd_in_t){.p = w1.data, .dtype = (rd_dtype_t)w1.dtype, .gs = w1.stride[0],
                                .rs = w1.stride[1], .cs = w1.stride[2], .q = q1};
        w->g = w0.dim[0], w->k = w0.dim[1], w->n = w0.dim[2];
        if (quantize_lhs) {   /* int8 weights times the rows quantized per row while packed */
            if (base != RD_CT_F32 || !rd_int8_exact(ow0, &w0) || (pair && !rd_int8_exact(ow1, &w1))
                || rd_int8_product() == RD_CT_I8I32) {
                PyErr_SetString(PyExc_TypeError, "quantizing 'lhs' while packing takes int8 quantized weights "
                                "and a float32 result, on a CPU with int8 dot products");
                return -1;
            }
            rd_plan_init(&w->plan, rd_int8_product());
        }
        else
            rd_plan_init(&w->plan, rd_float_product(base, (rd_dtype_t)lhs->dtype, (rd_dtype_t)w0.dtype,
                                                    q0.s != NULL, 0));
    }
    if ((quantize_lhs ? lhs->dtype != RD_F32 && lhs->dtype != RD_BF16
                      : rd_packer(w->plan.ct, (rd_dtype_t)lhs->dtype, 0) == NULL) ||
        rd_ctypes[w->plan.ct].c_size != rd_ctypes[base].c_size) {
        PyErr_Format(PyExc_TypeError, "a %s product cannot read 'lhs' (%s) or the weights, or write %s",
                     rd_ctypes[w->plan.ct].name, PyArray_DESCR(lhs->arr)->typeobj->tp_name, rd_ctypes[base].name);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(gated_rows_doc,
"gated_rows(lhs, w0, w1, bounds, a, h0, h1, b0, b1, kind, limit, alpha, rows=None, quantize_lhs=False)\n\n"
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
"row i of the product is row rows[i] of lhs (gathered while packed).\n"
"quantize_lhs: a float32 or bfloat16 lhs quantized to int8 per row while\n"
"packed, times int8 QArray weights (or two int8 dot layouts), the values of\n"
"ragged_rows with quantize_lhs; no rows index then.");

static PyObject *
rd_py_gated_rows(PyObject *self, PyObject *args)
{
    PyObject *olhs, *ow0, *ow1, *obounds, *oa, *oh0, *oh1, *ob0, *ob1, *oidx = Py_None;
    int kind, quantize_lhs = 0;
    double limit, alpha;
    rd_arg_t lhs, a;
    const rd_int *bv;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOidd|Op", &olhs, &ow0, &ow1, &obounds, &oa, &oh0, &oh1, &ob0, &ob1,
                          &kind, &limit, &alpha, &oidx, &quantize_lhs))
        return NULL;
    if (quantize_lhs && oidx != Py_None) {
        PyErr_SetString(PyExc_TypeError, "gated_rows quantizes 'lhs' read in place, not through 'rows'");
        return NULL;
    }
    if (rd_gated_hidden(oa, "a", RD_AS_OUTPUT, kind, &a) != 0)
        return NULL;
    const rd_ctype_t base = a.dtype == RD_F64 ? RD_CT_F64 : RD_CT_F32;
    if (rd_arg_array(olhs, "lhs", 2, RD_ANY_STORAGE, 0, &lhs) != 0)
        return NULL;
    rd_gated_w_t w;
    if (rd_gated_weights(ow0, ow1, base, &lhs, quantize_lhs, &w) != 0)
        return NULL;
    /* with a row index, row i of the product is row rows[i] of lhs */
    rd_arg_t idx;
    const long long *ridx;
    rd_int m;
    if (rd_gated_row_index(oidx, &lhs, &idx, &ridx, &m) != 0)
        return NULL;
    const rd_int k = lhs.dim[1], ng = w.g, n = w.n;
    if (w.k != k || a.dim[0] != m || a.dim[1] != n) {
        PyErr_SetString(PyExc_ValueError, "shapes of lhs [m, k], w0 and w1 [g, k, n], a [m, n] disagree");
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
    float *scales = NULL;
    if (quantize_lhs && rd_dynamic_scales(&x, m, k, &scales) != 0)
        return NULL;
    int rc = 0;
    if (bv[ng] > bv[0] && n > 0) {
        Py_BEGIN_ALLOW_THREADS
        if (scales != NULL)
            rc = rd_fill_row_scales(&x, m, k, scales);
        if (rc == 0)
            rc = rd_gated_rows(&w.plan, k, n, ng, bv, &x, &w.b[0], &w.b[1], rd_gated_epilogue, &o, 0);
        Py_END_ALLOW_THREADS
    }
    free(scales);
    return rd_gemm_result(rc);
}

PyDoc_STRVAR(gated_grad_rows_doc,
"gated_grad_rows(lhs, w, bounds, h0, h1, dh0, dh1, kind, limit, alpha, rows=None, row_scale=None)\n\n"
"The first products of an MoE layer's experts' backward with the\n"
"activation's gradient in their epilogue: for each group g, rows r in\n"
"[bounds[g], bounds[g+1]): d_a = lhs[r] @ w[g] rounded to h0's dtype (w an\n"
"array or a QArray tuple as ragged_rows reads it), then\n"
"dh0[r], dh1[r] = gated_act_grad(h0[r], h1[r], d_a).  lhs [m, k], w [g, k,\n"
"n] arrays the packing reads; h0, h1, dh0, dh1 [m, n] of one dtype (float32,\n"
"float64, bfloat16, float16) with contiguous rows, h0 and h1 of one row\n"
"stride, dh0 and dh1 of one (views of one [m, 2n] array, say).  The\n"
"values of ragged_rows into d_a then gated_act_grad, bit for bit.  With\n"
"rows (int64 [m] in [0, t)), lhs is [t, k] and row r of the product reads\n"
"lhs[rows[r]], times row_scale[r] where given (float32 or float64 [m] of\n"
"lhs's dtype, each product rounded to it): through the index while\n"
"packed, the bits of the product of that gathered (scaled) array.");

static PyObject *
rd_py_gated_grad_rows(PyObject *self, PyObject *args)
{
    PyObject *olhs, *ow, *obounds, *oh0, *oh1, *od0, *od1, *oidx = Py_None, *oscale = Py_None;
    int kind;
    double limit, alpha;
    rd_arg_t lhs, h0, idx;
    const rd_int *bv;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOidd|OO", &olhs, &ow, &obounds, &oh0, &oh1, &od0, &od1, &kind, &limit,
                          &alpha, &oidx, &oscale))
        return NULL;
    if (rd_gated_hidden(oh0, "h0", 0, kind, &h0) != 0)
        return NULL;
    rd_gated_grad_t o;
    memset(&o, 0, sizeof o);
    void *h1 = NULL, *d0 = NULL, *d1 = NULL;
    rd_int d_rs = 0;       /* dh0 and dh1: one row stride, maybe not h0's (views of one [m, 2n]) */
    if (rd_gated_out(oh1, "h1", "h0", &h0, &h1) != 0 ||
        rd_gated_out_rs(od0, "dh0", "h0", &h0, -1, &d0, &d_rs) != 0 ||
        rd_gated_out_rs(od1, "dh1", "dh0", &h0, d_rs, &d1, NULL) != 0)
        return NULL;
    if (h1 == NULL || d0 == NULL || d1 == NULL) {
        PyErr_SetString(PyExc_TypeError, "'h1', 'dh0' and 'dh1' must be arrays");
        return NULL;
    }
    const rd_ctype_t base = h0.dtype == RD_F64 ? RD_CT_F64 : RD_CT_F32;
    rd_gated_w_t w;
    if (rd_arg_array(olhs, "lhs", 2, RD_ANY_STORAGE, 0, &lhs) != 0 ||
        rd_gated_weights(ow, NULL, base, &lhs, 0, &w) != 0)
        return NULL;
    /* with a row index, row r of the product is (scale[r] times) row rows[r] of lhs */
    const long long *ridx;
    const void *rscale = NULL;
    rd_int m;
    if (rd_gated_row_index(oidx, &lhs, &idx, &ridx, &m) != 0)
        return NULL;
    if (oidx == Py_None && oscale != Py_None) {
        PyErr_SetString(PyExc_TypeError, "gated_grad_rows: 'row_scale' scales the rows an index 'rows' gathers");
        return NULL;
    }
    if (rd_arg_row_scale(oscale, "row_scale", &lhs, m, &rscale) != 0)
        return NULL;
    const rd_int k = lhs.dim[1], ng = w.g, n = w.n;
    if (w.k != k || h0.dim[0] != m || h0.dim[1] != n) {
        PyErr_SetString(PyExc_ValueError, "shapes of lhs [m, k], w [g, k, n], h0 [m, n] disagree");
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
    o.d_rs = d_rs;
    rd_in_t x = {.p = lhs.data, .dtype = (rd_dtype_t)lhs.dtype, .rs = lhs.stride[0], .cs = lhs.stride[1],
                 .ridx = ridx, .rscale = rscale};
    int rc = 0;
    if (bv[ng] > bv[0] && n > 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = rd_gated_rows(&w.plan, k, n, ng, bv, &x, &w.b[0], NULL, rd_gated_grad_epilogue, &o, 0);
        Py_END_ALLOW_THREADS
    }
    return rd_gemm_result(rc);
}

PyDoc_STRVAR(combine_rows_doc,
"combine_rows(lhs, w, bounds, out, tokens, weights, bias, hidden, lhs1=None, w1=None)\n\n"
"The down product of an MoE layer's experts with the combine in its\n"
"epilogue: for each group g, rows r in [bounds[g], bounds[g+1]) (the slots\n"
"of expert g), y = lhs[r] @ w[g] (+ bias[g]) rounded to the dtype of\n"
"`hidden` (an array of the hidden dtype: float32, float64, bfloat16 or\n"
"float16), then out[tokens[r]] += weights[r] * y.  lhs [m, k], w [g, k, n]\n"
"(an array the packing reads, a QArray tuple, or the tuple of a prepacked\n"
"layout as gated_rows takes it, buf1 ignored); out [T, n] of the compute\n"
"type (float64 for float64 hidden values, else float32) with contiguous\n"
"rows, holding what the rows are added to; tokens int64 [m]; weights [m]\n"
"of the compute type or None (weight 1); bias [g, n] of the compute type or\n"
"None.  Each column of an output row sums its slots in slot order, on one\n"
"thread, whatever the number of threads: the values of ragged_rows into y\n"
"(rounded) then gather_reduce ordered, bit for bit, without the [m, n]\n"
"array of y.  With lhs1 (as lhs) and w1 (as w, of w's kind):\n"
"y = lhs[r] @ w[g] + lhs1[r] @ w1[g], the second product added as\n"
"ragged_rows with accumulate adds it into the first's output.");

static PyObject *
rd_py_combine_rows(PyObject *self, PyObject *args)
{
    PyObject *olhs, *ow, *obounds, *oout, *otok, *ow8, *obias, *ohid, *olhs1 = Py_None, *ow1 = Py_None;
    rd_arg_t lhs, lhs1, out, tok, hid, w8;
    const rd_int *bv;
    const void *w8_data;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOO|OO", &olhs, &ow, &obounds, &oout, &otok, &ow8, &obias, &ohid, &olhs1,
                          &ow1))
        return NULL;
    const int summed = olhs1 != Py_None;
    if (summed != (ow1 != Py_None)) {
        PyErr_SetString(PyExc_TypeError, "combine_rows: 'lhs1' and 'w1' come together");
        return NULL;
    }
    if (summed && PyTuple_Check(ow) && PyTuple_GET_SIZE(ow) == 11) {   /* (rd_gated_weights would read its buf1) */
        PyErr_SetString(PyExc_TypeError, "combine_rows: 'lhs1' and 'w1' take plain or QArray weights, not prepacked");
        return NULL;
    }
    if (rd_arg_array(ohid, "hidden", 1, RD_ANY_STORAGE, 0, &hid) != 0)
        return NULL;
    if (hid.dtype != RD_F32 && hid.dtype != RD_F64 && hid.dtype != RD_F16 && hid.dtype != RD_BF16) {
        PyErr_SetString(PyExc_TypeError, "'hidden' must be float32, float64, float16 or bfloat16");
        return NULL;
    }
    const rd_ctype_t base = hid.dtype == RD_F64 ? RD_CT_F64 : RD_CT_F32;
    const int ct_num = base == RD_CT_F64 ? NPY_FLOAT64 : NPY_FLOAT32;
    rd_gated_w_t w;
    if (rd_arg_array(olhs, "lhs", 2, RD_ANY_STORAGE, 0, &lhs) != 0 ||
        (summed && rd_arg_array(olhs1, "lhs1", 2, RD_ANY_STORAGE, 0, &lhs1) != 0) ||
        rd_gated_weights(ow, summed ? ow1 : NULL, base, &lhs, 0, &w) != 0 ||
        rd_arg_array(oout, "out", 2, ct_num, RD_AS_OUTPUT | RD_ROWS, &out) != 0 ||
        rd_arg_array(otok, "tokens", 1, NPY_INT64, RD_CONTIG, &tok) != 0 ||
        rd_arg_indices(&tok, "tokens", 0, out.dim[0]) != 0 ||
        rd_arg_optional(ow8, "weights", 1, ct_num, tok.dim, &w8, &w8_data) != 0)
        return NULL;
    const rd_int m = lhs.dim[0], k = lhs.dim[1], ng = w.g, n = w.n;
    if (w.k != k || out.dim[1] != n || tok.dim[0] != m) {
        PyErr_SetString(PyExc_ValueError, "shapes of lhs [m, k], w [g, k, n], out [T, n], tokens [m] disagree");
        return NULL;
    }
    if (summed && (lhs1.dtype != lhs.dtype || lhs1.dim[0] != m || lhs1.dim[1] != k)) {
        PyErr_SetString(PyExc_ValueError, "'lhs1' must have lhs's dtype and shape");
        return NULL;
    }
    rd_combine_t o;
    memset(&o, 0, sizeof o);
    o.ct = base;
    o.dt = (rd_dtype_t)hid.dtype;
    o.tokens = (const long long *)tok.data;
    o.w = w8_data;
    o.out = out.data;
    o.out_rs = out.stride[0];
    if (rd_gated_bias(obias, "bias", ct_num, ng, n, &o.bias, &o.b_rs) != 0 ||
        rd_arg_bounds(obounds, ng, m, "w.shape[0]", &bv) != 0)
        return NULL;
    rd_in_t x = {.p = lhs.data, .dtype = (rd_dtype_t)lhs.dtype, .rs = lhs.stride[0], .cs = lhs.stride[1]};
    int rc = 0;
    if (bv[ng] > bv[0] && n > 0) {
        if (summed) {
            const rd_in_t x1 = {.p = lhs1.data, .dtype = (rd_dtype_t)lhs1.dtype, .rs = lhs1.stride[0],
                                .cs = lhs1.stride[1]};
            Py_BEGIN_ALLOW_THREADS
            rc = rd_summed_rows(&w.plan, k, n, ng, bv, &x, &w.b[0], &x1, &w.b[1], rd_combine_epilogue, &o);
            Py_END_ALLOW_THREADS
        }
        else {
            Py_BEGIN_ALLOW_THREADS
            rc = rd_gated_rows(&w.plan, k, n, ng, bv, &x, &w.b[0], NULL, rd_combine_epilogue, &o, 1);
            Py_END_ALLOW_THREADS
        }
    }
    return rd_gemm_result(rc);
}

PyMethodDef rd_gated_methods[] = {
    {"gated_rows", rd_py_gated_rows, METH_VARARGS, gated_rows_doc},
    {"gated_grad_rows", rd_py_gated_grad_rows, METH_VARARGS, gated_grad_rows_doc},
    {"combine_rows", rd_py_combine_rows, METH_VARARGS, combine_rows_doc},
    {NULL, NULL, 0, NULL},
};
