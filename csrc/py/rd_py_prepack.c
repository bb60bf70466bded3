/*
 * Binding of prepacking: the layout of weights laid out once (its plan,
 * bytes and panel width), the packing itself, and the grouped product on
 * prepacked weights.
 */
#include "py/rd_py.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ prepacking */

/* Whether the operand tuple obj (x: as rd_arg_operand read it) holds what
 * the w4a8 type ct lays out: no zero points, and int4 values in [-8, 7]
 * (RD_CT_U8S8_I4) or 4-bit floats with e8m0 scales (RD_CT_U8S8_F4). */
static int
rd_w4a8_weights(PyObject *obj, const rd_arg_t *x, rd_ctype_t ct)
{
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) < 3 || PyTuple_GET_ITEM(obj, 2) != Py_None)
        return 0;
    if (ct == RD_CT_U8S8_F4)
        return x->dtype == RD_F4E2M1 && rd_pow2_scales(obj);
    if (x->dtype != RD_I8)
        return 0;
    PyArrayIterObject *it = (PyArrayIterObject *)PyArray_IterNew((PyObject *)x->arr);
    if (it == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = 1;
    while (ok && it->index < it->size) {
        const int8_t v = *(const int8_t *)it->dataptr;
        ok = v >= -8 && v <= 7;
        PyArray_ITER_NEXT(it);
    }
    Py_DECREF(it);
    return ok;
}

/* A plan for the compute type named `name` (a dot type's name: the type
 * that multiplies weights in its layout now, rd_layout_product) whose kernel has register block
 * width `nr` (any, when nr <= 0) and cache depth KC = `kc` (the plan's, when
 * kc <= 0); -1 with an exception naming what disagrees. */
int
rd_prepack_plan(const char *name, Py_ssize_t kc, Py_ssize_t nr, rd_plan_t *plan)
{
    int ct = -1;
    for (int t = 0; t < RD_CT_COUNT; t++)
        if (strcmp(rd_ctypes[t].name, name) == 0)
            ct = t;
    if (ct < 0) {
        PyErr_Format(PyExc_ValueError, "unknown compute type '%s'", name);
        return -1;
    }
    /* weights in a dot type's B layout are multiplied by the tile type
     * that reads that layout where it is served (AMX) */
    rd_plan_init(plan, rd_layout_product((rd_ctype_t)ct));
    if (plan->k.ukr == NULL) {
        PyErr_Format(PyExc_ValueError, "no kernel serves %s products with the kernel selection in force "
                     "('%s'): select a kernel family that has them, or prepack the weights again",
                     name, rd_kernel_selection());
        return -1;
    }
    if (nr > 0 && plan->k.nr != nr) {
        PyErr_Format(PyExc_ValueError,
                     "the weights were prepacked in panels of %zd columns, but the %s kernel in use "
                     "(%s) takes %d: prepack them again, or select the kernel they were packed for",
                     (Py_ssize_t)nr, name, rd_kernel_for(plan->ct), plan->k.nr);
        return -1;
    }
    if (kc > 0)
        plan->k.kc = kc;
    return 0;
}

int
rd_dtype_named(const char *name)
{
    for (int d = 0; d < RD_DTYPE_COUNT; d++)
        if (strcmp(rd_dtype_names[d], name) == 0)
            return d;
    PyErr_Format(PyExc_ValueError, "unknown storage dtype '%s'", name);
    return -1;
}

PyDoc_STRVAR(prepack_layout_doc,
"prepack_layout(ctype, dtype, k, n, qtile=0, qzp=False) -> (bytes_per_group, nr, kc, kernel)\n\n"
"The layout rd_prepack gives weights [g, k, n] of storage `dtype` for a\n"
"product of compute type `ctype` with the kernel selected now; quantized\n"
"weights (ctype float32-int8w / float32-float8w) with scale tiles `qtile`\n"
"deep along k, and zero points when `qzp`.");

static PyObject *
rd_py_prepack_layout(PyObject *self, PyObject *args)
{
    const char *ctname, *dtname;
    Py_ssize_t k, n, qtile = 0;
    int qzp = 0;
    rd_plan_t plan;
    (void)self;
    if (!PyArg_ParseTuple(args, "ssnn|np", &ctname, &dtname, &k, &n, &qtile, &qzp))
        return NULL;
    int dt = rd_dtype_named(dtname);
    if (dt < 0 || rd_prepack_plan(ctname, 0, 0, &plan) != 0)
        return NULL;
    if (k < 0 || n < 0 || qtile < 0) {
        PyErr_SetString(PyExc_ValueError, "prepack_layout needs k >= 0, n >= 0 and qtile >= 0");
        return NULL;
    }
    size_t bytes = rd_prepack_bytes(&plan, (rd_dtype_t)dt, k, n, qtile, qzp);
    if (bytes == 0 && k > 0 && n > 0) {
        PyErr_Format(PyExc_TypeError, "a %s product cannot prepack %s weights%s", ctname, dtname,
                     qtile > 0 ? " with scales" : "");
        return NULL;
    }
    return Py_BuildValue("(nins)", (Py_ssize_t)bytes, plan.k.nr, (Py_ssize_t)plan.k.kc,
                         rd_kernel_for(plan.ct));
}

PyDoc_STRVAR(prepack_doc,
"prepack(rhs, dst, ctype, kc, nr)\n\n"
"Lay rhs [g, k, n] out in dst (uint8, C-contiguous, g x bytes_per_group of\n"
"prepack_layout) in the panel order of the `ctype` kernel: per group, KC\n"
"blocks of the contraction, each the NR-wide panels that packing B makes.\n"
"Quantized weights (ctype float32-int8w / float32-float8w) are the tuple\n"
"(qvalue, scale, zero_point) of ragged_rows, float32 scales: each panel\n"
"keeps one byte a value and is followed by its columns' scales.");

static PyObject *
rd_py_prepack(PyObject *self, PyObject *args)
{
    PyObject *orhs, *odst;
    const char *ctname;
    Py_ssize_t kc, nr;
    rd_arg_t rhs, dst;
    rd_scales_t q;
    rd_plan_t plan;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOsnn", &orhs, &odst, &ctname, &kc, &nr))
        return NULL;
    if (rd_prepack_plan(ctname, kc, nr, &plan) != 0)
        return NULL;
    memset(&q, 0, sizeof q);
    if (PyTuple_Check(orhs)) {
        /* the scales as a float32 product reads them (shapes, tiles) */
        if (rd_arg_operand(orhs, "rhs", 3, RD_CT_F32, 1, &rhs, &q) != 0)
            return NULL;
    }
    else if (rd_arg_array(orhs, "rhs", 3, RD_ANY_STORAGE, 0, &rhs) != 0)
        return NULL;
    if (rd_arg_array(odst, "dst", 1, NPY_UINT8, RD_CONTIG | RD_AS_OUTPUT, &dst) != 0)
        return NULL;
    if (plan.ct == RD_CT_F32_F4W && (rhs.dtype != RD_F4E2M1 || !rd_pow2_scales(orhs))) {
        PyErr_SetString(PyExc_ValueError, "float32-float4w weights hold 4-bit values with power-of-two scales "
                        "in [2^-127, 2^127] and no zero points");
        return NULL;
    }
    if (rd_ctype_w4a8(plan.ct) && q.s != NULL && q.tr % 4 != 0 && q.tr < rhs.dim[1]) {
        PyErr_SetString(PyExc_ValueError, "w4a8 weights (int8-int4-dot, int8-mxfp4-dot) take scale tiles along "
                        "k of a multiple of 4 steps (or one tile)");
        return NULL;
    }
    if (rd_ctype_w4a8(plan.ct) && !rd_w4a8_weights(orhs, &rhs, plan.ct)) {
        PyErr_SetString(PyExc_ValueError, plan.ct == RD_CT_U8S8_F4
                        ? "int8-mxfp4-dot weights hold float4_e2m1fn values with power-of-two scales in "
                          "[2^-127, 2^127] and no zero points"
                        : "int8-int4-dot weights hold int8 values in [-8, 7] and no zero points");
        return NULL;
    }
    if (rd_ctype_int8_dot(plan.ct) && !rd_ctype_w4a8(plan.ct) && !rd_int8_exact(orhs, &rhs)) {
        PyErr_SetString(PyExc_ValueError, "int8-dot and int8-mmla weights hold int8 values with zero points "
                        "absent or integers in [-128, 127]");
        return NULL;
    }
    if (((uintptr_t)dst.data & 63) != 0) {
        PyErr_SetString(PyExc_ValueError, "'dst' must start on a 64-byte boundary");
        return NULL;
    }
    size_t per = rd_prepack_bytes(&plan, (rd_dtype_t)rhs.dtype, rhs.dim[1], rhs.dim[2],
                                  q.s != NULL ? q.tr : 0, q.z != NULL);
    if ((per == 0 && rhs.dim[1] > 0 && rhs.dim[2] > 0) || (size_t)dst.dim[0] != per * (size_t)rhs.dim[0]) {
        PyErr_Format(PyExc_ValueError, "'dst' must hold %zd bytes for these weights, got %zd",
                     (Py_ssize_t)(per * (size_t)rhs.dim[0]), (Py_ssize_t)dst.dim[0]);
        return NULL;
    }
    rd_in_t b = {.p = rhs.data, .dtype = (rd_dtype_t)rhs.dtype, .gs = rhs.stride[0], .rs = rhs.stride[1],
                 .cs = rhs.stride[2], .q = q};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rd_prepack(&plan, rhs.dim[0], rhs.dim[1], rhs.dim[2], &b, dst.data);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_Format(PyExc_TypeError, "a %s product cannot prepack these weights%s", ctname,
                     q.s != NULL ? " (quantized)" : "");
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ragged_rows_packed_doc,
"ragged_rows_packed(lhs, packed, dtype, ctype, g, k, n, kc, nr, bounds, out, accumulate, qtile=0, qzp=False,\n"
"                   quantize_lhs=False)\n\n"
"ragged_rows with rhs [g, k, n] of storage `dtype` prepacked (prepack) for\n"
"the `ctype` kernel with blocking kc and panel width nr (quantized weights:\n"
"scale tiles qtile deep along k, zero points when qzp); out float32 or\n"
"float64 as ctype computes.  int8-dot weights take lhs as the quantized\n"
"tuple (qvalue int8, scale [m, 1] float32, zero_point) of ragged_rows.");

static PyObject *
rd_py_ragged_rows_packed(PyObject *self, PyObject *args)
{
    PyObject *olhs, *opacked, *obounds, *oout;
    const char *dtname, *ctname;
    Py_ssize_t ng, k, n, kc, nr, qtile = 0;
    int accumulate, qzp = 0, quantize_lhs = 0;
    rd_arg_t lhs, packed, out;
    rd_plan_t plan;
    const rd_int *bv;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOssnnnnnOOp|npp", &olhs, &opacked, &dtname, &ctname, &ng, &k, &n, &kc, &nr,
                          &obounds, &oout, &accumulate, &qtile, &qzp, &quantize_lhs))
        return NULL;
    int dt = rd_dtype_named(dtname);
    rd_scales_t lq;
    memset(&lq, 0, sizeof lq);
    if (dt < 0 || rd_prepack_plan(ctname, kc, nr, &plan) != 0)
        return NULL;
    /* int8-dot weights take an int8 quantized lhs (or a float one quantized
     * per row while packed), the others a float one */
    if (quantize_lhs && !rd_ctype_int8_dot(plan.ct)) {
        PyErr_SetString(PyExc_TypeError, "only weights prepacked for int8 dot products quantize 'lhs'");
        return NULL;
    }
    const int qlhs = rd_ctype_int8_dot(plan.ct) && !quantize_lhs;
    if ((qlhs ? rd_arg_operand(olhs, "lhs", 2, plan.ct, 0, &lhs, &lq)
              : rd_arg_array(olhs, "lhs", 2, RD_ANY_STORAGE, 0, &lhs)) != 0 ||
        rd_arg_array(opacked, "packed", 1, NPY_UINT8, RD_CONTIG, &packed) != 0 ||
        rd_arg_out(oout, 2, &out) != 0)
        return NULL;
    if (qlhs && rd_ctype_w4a8(plan.ct) && PyTuple_GET_ITEM(olhs, 2) != Py_None) {
        PyErr_SetString(PyExc_TypeError, "weights prepacked for w4a8 products (int8-int4-dot, int8-mxfp4-dot) "
                        "take an int8 quantized 'lhs' without zero points");
        return NULL;
    }
    if (qlhs && (lq.s == NULL || !rd_int8_exact(olhs, &lhs) || (k > 0 && lq.tc < k))) {
        PyErr_SetString(PyExc_TypeError, "weights prepacked for int8 dot products take an int8 quantized 'lhs' "
                        "with one scale (and integral zero point) per row along k");
        return NULL;
    }
    if (rd_ctypes[plan.ct].c_size != rd_ctypes[rd_arg_ctype(&out)].c_size ||
        (quantize_lhs ? lhs.dtype != RD_F32 && lhs.dtype != RD_BF16
                      : !qlhs && rd_packer(plan.ct, (rd_dtype_t)lhs.dtype, 0) == NULL)) {
        PyErr_Format(PyExc_TypeError, "a %s product cannot read 'lhs' (%s) or write 'out' (%s)", ctname,
                     PyArray_DESCR(lhs.arr)->typeobj->tp_name, PyArray_DESCR(out.arr)->typeobj->tp_name);
        return NULL;
    }
    size_t per = rd_prepack_bytes(&plan, (rd_dtype_t)dt, k, n, qtile, qzp);
    rd_int m = lhs.dim[0];
    if (ng < 0 || qtile < 0 || lhs.dim[1] != k || out.dim[0] != m || out.dim[1] != n
        || (per == 0 && k > 0 && n > 0) || (size_t)packed.dim[0] != per * (size_t)ng) {
        PyErr_SetString(PyExc_ValueError, "shapes of lhs [m, k], packed [g * bytes_per_group], out [m, n] disagree");
        return NULL;
    }
    if (packed.dim[0] > 0 && ((uintptr_t)packed.data & 63) != 0) {
        PyErr_SetString(PyExc_ValueError, "'packed' must start on a 64-byte boundary");
        return NULL;
    }
    if (rd_arg_bounds(obounds, ng, m, "g", &bv) != 0)
        return NULL;
    const rd_int panels = (n + plan.k.nr - 1) / plan.k.nr;
    rd_in_t a = {.p = lhs.data, .dtype = (rd_dtype_t)lhs.dtype, .rs = lhs.stride[0], .cs = lhs.stride[1],
                 .q = lq};
    rd_in_t b = {.p = packed.data, .dtype = (rd_dtype_t)dt, .gs = (rd_int)per, .panels = panels,
                 .qtile = qtile, .qzp = qzp};
    rd_out_t c = {out.data, 0, out.stride[0], out.stride[1], (rd_dtype_t)out.dtype};
    return rd_run_gemm(&plan, 0, quantize_lhs, m, k, n, ng, bv, &a, &b, &c, accumulate);
}

PyMethodDef rd_prepack_methods[] = {
    {"prepack_layout", rd_py_prepack_layout, METH_VARARGS, prepack_layout_doc},
    {"prepack", rd_py_prepack, METH_VARARGS, prepack_doc},
    {"ragged_rows_packed", rd_py_ragged_rows_packed, METH_VARARGS, ragged_rows_packed_doc},
    {NULL, NULL, 0, NULL},
};
