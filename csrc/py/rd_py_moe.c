/*
 * Binding of the MoE pieces: routing, the counting sort by expert, the
 * gathers of dispatch and combine, and the gated activations.  Each float
 * entry point takes the compute type of its first float argument and calls
 * that type's row of rd_moe_ops.
 */
#include "py/rd_py.h"
#include "moe/rd_moe.h"
#include "rd_half.h"

static PyObject *
rd_py_moe_route(PyObject *self, PyObject *args)
{
    PyObject *ologits, *obias;
    int score_func, norm;
    Py_ssize_t n_groups, topk_groups, top_k;
    double scaling;
    rd_arg_t logits, bias;
    const void *bias_data;
    (void)self;
    if (!PyArg_ParseTuple(args, "OiOnnnpd", &ologits, &score_func, &obias, &n_groups,
                          &topk_groups, &top_k, &norm, &scaling))
        return NULL;
    if (rd_arg_array(ologits, "logits", 2, RD_ANY_FLOAT, RD_CONTIG, &logits) != 0)
        return NULL;
    npy_intp T = logits.dim[0], E = logits.dim[1];
    rd_int bias_shape[1] = {E};
    if (rd_arg_optional(obias, "selection_bias", 1, logits.type_num, bias_shape, &bias, &bias_data) != 0)
        return NULL;
    if (E < 1 || top_k < 1 || top_k > E ||
        (score_func != RD_SCORE_SOFTMAX && score_func != RD_SCORE_SIGMOID) ||
        (n_groups > 1 && (E % n_groups != 0 || topk_groups < 1 || topk_groups > n_groups ||
                          topk_groups * (E / n_groups) < top_k))) {
        PyErr_SetString(PyExc_ValueError, "invalid routing configuration");
        return NULL;
    }
    const rd_moe_ops_t *ops = &rd_moe_ops[rd_arg_ctype(&logits)];
    npy_intp dims_s[2] = {T, E}, dims_k[2] = {T, top_k};
    PyArrayObject *scores = (PyArrayObject *)PyArray_EMPTY(2, dims_s, logits.type_num, 0);
    PyArrayObject *idx = (PyArrayObject *)PyArray_EMPTY(2, dims_k, NPY_INT64, 0);
    PyArrayObject *w = (PyArrayObject *)PyArray_EMPTY(2, dims_k, logits.type_num, 0);
    if (scores == NULL || idx == NULL || w == NULL)
        goto error;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ops->route(T, E, logits.data, score_func, bias_data, n_groups, topk_groups, top_k, norm,
                    scaling, PyArray_DATA(scores), (long long *)PyArray_DATA(idx), PyArray_DATA(w));
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_NoMemory();
        goto error;
    }
    return Py_BuildValue("NNN", (PyObject *)scores, (PyObject *)idx, (PyObject *)w);
error:
    Py_XDECREF(scores);
    Py_XDECREF(idx);
    Py_XDECREF(w);
    return NULL;
}

static PyObject *
rd_py_moe_sort(PyObject *self, PyObject *args)
{
    PyObject *oidx;
    Py_ssize_t E, capacity;
    rd_arg_t idx;
    (void)self;
    if (!PyArg_ParseTuple(args, "Onn", &oidx, &E, &capacity))
        return NULL;
    if (E < 1) {
        PyErr_Format(PyExc_ValueError, "number of experts must be positive, got %zd", E);
        return NULL;
    }
    if (rd_arg_array(oidx, "topk_idx", 2, NPY_INT64, RD_CONTIG, &idx) != 0 ||
        rd_arg_indices(&idx, "topk_idx", 0, E) != 0)
        return NULL;
    npy_intp T = idx.dim[0], k = idx.dim[1], n = T * k, e = E;
    PyArrayObject *slot_of = (PyArrayObject *)PyArray_EMPTY(2, PyArray_DIMS(idx.arr), NPY_INT64, 0);
    PyArrayObject *tok = (PyArrayObject *)PyArray_EMPTY(1, &n, NPY_INT64, 0);
    PyArrayObject *gs = (PyArrayObject *)PyArray_EMPTY(1, &e, NPY_INT64, 0);
    PyObject *tok_kept = NULL;
    if (slot_of == NULL || tok == NULL || gs == NULL)
        goto error;
    rd_int kept;
    Py_BEGIN_ALLOW_THREADS
    kept = rd_moe_sort(T, k, E, (const long long *)idx.data, capacity,
                       (long long *)PyArray_DATA(slot_of), (long long *)PyArray_DATA(tok),
                       (long long *)PyArray_DATA(gs));
    Py_END_ALLOW_THREADS
    if (kept < 0) {
        PyErr_NoMemory();
        goto error;
    }
    tok_kept = PySequence_GetSlice((PyObject *)tok, 0, kept);
    Py_DECREF(tok);
    tok = NULL;
    if (tok_kept == NULL)
        goto error;
    return Py_BuildValue("NNN", (PyObject *)slot_of, tok_kept, (PyObject *)gs);
error:
    Py_XDECREF(slot_of);
    Py_XDECREF(tok);
    Py_XDECREF(gs);
    return NULL;
}

/* gather_rows of 16-bit rows: copied as they are, or (with scales)
 * widened and scaled into float32. */
static void
rd_gather_rows_half(rd_int n, rd_int d, const uint16_t *x, rd_int x_rs, rd_dtype_t dt,
                    const long long *src, const float *scale, void *out_)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(rd_get_num_threads()) if (n * d > 65536)
#endif
    for (rd_int i = 0; i < n; i++) {
        const uint16_t *row = x + (rd_int)src[i] * x_rs;
        if (scale == NULL) {
            memcpy((uint16_t *)out_ + i * d, row, sizeof(uint16_t) * (size_t)d);
            continue;
        }
        float *o = (float *)out_ + i * d;
        const float s = scale[i];
        if (dt == RD_BF16)
            for (rd_int c = 0; c < d; c++)
                o[c] = s * rd_bf16_to_float(row[c]);
        else
            for (rd_int c = 0; c < d; c++)
                o[c] = s * rd_f16_to_float(row[c]);
    }
}

/* gather_rows of float32 rows into 16-bit ones: each row scaled in
 * float32 (by 1 without scales), then rounded to nearest even once (the
 * values of the float32 gather, then narrow). */
static void
rd_gather_rows_narrow(rd_int n, rd_int d, const float *x, rd_int x_rs, const long long *src,
                      const float *scale, uint16_t *out, rd_dtype_t dt)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(rd_get_num_threads()) if (n * d > 65536)
#endif
    for (rd_int i = 0; i < n; i++) {
        float buf[512];
        const float *row = x + (rd_int)src[i] * x_rs;
        const float s = scale == NULL ? 1.0f : scale[i];
        for (rd_int c0 = 0; c0 < d; c0 += 512) {
            const rd_int w = d - c0 < 512 ? d - c0 : 512;
            for (rd_int c = 0; c < w; c++)
                buf[c] = s * row[c0 + c];
            rd_narrow(buf, out + i * d + c0, dt, (size_t)w, 0);
        }
    }
}

static PyObject *
rd_py_gather_rows(PyObject *self, PyObject *args)
{
    PyObject *ox, *osrc, *oscale, *onarrow = Py_None;
    rd_arg_t x, src, scale, narrow;
    const void *scale_data;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOO|O", &ox, &osrc, &oscale, &onarrow))
        return NULL;
    if (rd_arg_array(ox, "x", 2, RD_ANY_STORAGE, RD_ROWS, &x) != 0)
        return NULL;
    const int half = x.dtype == RD_F16 || x.dtype == RD_BF16;
    if (!half && x.dtype != RD_F32 && x.dtype != RD_F64) {
        PyErr_Format(PyExc_TypeError, "'x' has dtype %s, expected float32, float64, float16 or bfloat16",
                     PyArray_DESCR(x.arr)->typeobj->tp_name);
        return NULL;
    }
    if (onarrow != Py_None) {
        if (rd_arg_array(onarrow, "narrow", 1, RD_ANY_STORAGE, 0, &narrow) != 0)
            return NULL;
        if (x.dtype != RD_F32 || (narrow.dtype != RD_F16 && narrow.dtype != RD_BF16)) {
            PyErr_SetString(PyExc_TypeError, "gather_rows: 'narrow' (a float16 or bfloat16 array) "
                            "takes float32 'x'");
            return NULL;
        }
    }
    /* 16-bit rows: scales float32, scaled rows float32 */
    const int ct_num = half ? NPY_FLOAT32 : x.type_num;
    if (rd_arg_array(osrc, "indices", 1, NPY_INT64, RD_CONTIG, &src) != 0 ||
        rd_arg_indices(&src, "indices", 0, x.dim[0]) != 0 ||
        rd_arg_optional(oscale, "scale", 1, ct_num, src.dim, &scale, &scale_data) != 0)
        return NULL;
    npy_intp dims[2] = {src.dim[0], x.dim[1]};
    /* out: x's dtype (a 16-bit one is NumPy's ml_dtypes descriptor), or
     * float32 for scaled 16-bit rows, from the cache of result buffers
     * (the dispatched rows [N, d] are a layer's largest array: fresh pages
     * each call cost as much as the gather); rd_pool_array takes a
     * reference */
    PyArray_Descr *descr;
    if (onarrow != Py_None) {
        descr = PyArray_DESCR(narrow.arr);
        Py_INCREF(descr);
    }
    else if (half && scale_data != NULL)
        descr = PyArray_DescrFromType(NPY_FLOAT32);
    else {
        descr = PyArray_DESCR(x.arr);
        Py_INCREF(descr);
    }
    PyArrayObject *out = (PyArrayObject *)rd_pool_array(descr, 2, dims);
    if (out == NULL)
        return NULL;
    const rd_moe_ops_t *ops = &rd_moe_ops[rd_arg_ctype(&x)];
    rd_int rs = dims[1] > 0 ? x.stride[0] : 0;
    Py_BEGIN_ALLOW_THREADS
    if (onarrow != Py_None)
        rd_gather_rows_narrow(dims[0], dims[1], (const float *)x.data, rs,
                              (const long long *)src.data, (const float *)scale_data,
                              (uint16_t *)PyArray_DATA(out), (rd_dtype_t)narrow.dtype);
    else if (half)
        rd_gather_rows_half(dims[0], dims[1], (const uint16_t *)x.data, rs, (rd_dtype_t)x.dtype,
                            (const long long *)src.data, (const float *)scale_data, PyArray_DATA(out));
    else
        ops->gather_rows(dims[0], dims[1], x.data, rs, (const long long *)src.data, scale_data,
                         PyArray_DATA(out));
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

static PyObject *
rd_py_slot_dots(PyObject *self, PyObject *args)
{
    PyObject *oa, *orows, *oslots;
    rd_arg_t a, rows, slots;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOO", &oa, &orows, &oslots))
        return NULL;
    if (rd_arg_array(oa, "a", 2, RD_ANY_STORAGE, RD_ROWS, &a) != 0 ||
        rd_arg_array(orows, "rows", 2, RD_ANY_STORAGE, RD_ROWS, &rows) != 0)
        return NULL;
    const rd_arg_t *both[2] = {&a, &rows};
    for (int i = 0; i < 2; i++)
        if (both[i]->dtype != RD_F32 && both[i]->dtype != RD_F64 && both[i]->dtype != RD_F16
            && both[i]->dtype != RD_BF16) {
            PyErr_Format(PyExc_TypeError, "'%s' must be float32, float64, float16 or bfloat16", i ? "rows" : "a");
            return NULL;
        }
    if (rd_arg_array(oslots, "slot_of", 2, NPY_INT64, RD_CONTIG, &slots) != 0 ||
        rd_arg_indices(&slots, "slot_of", -1, rows.dim[0]) != 0)
        return NULL;
    if (slots.dim[0] != a.dim[0] || rows.dim[1] != a.dim[1]) {
        PyErr_SetString(PyExc_ValueError, "shapes of a [T, d], rows [n, d], slot_of [T, k] disagree");
        return NULL;
    }
    const int wide = a.dtype == RD_F64 || rows.dtype == RD_F64;
    PyArrayObject *out = (PyArrayObject *)PyArray_EMPTY(2, PyArray_DIMS(slots.arr), wide ? NPY_FLOAT64 : NPY_FLOAT32, 0);
    if (out == NULL)
        return NULL;
    const rd_int d = a.dim[1];
    Py_BEGIN_ALLOW_THREADS
    rd_slot_dots(a.dim[0], slots.dim[1], d, a.data, d > 0 ? a.stride[0] : 0, (rd_dtype_t)a.dtype, rows.data,
                 d > 0 ? rows.stride[0] : 0, (rd_dtype_t)rows.dtype, (const long long *)slots.data,
                 PyArray_DATA(out));
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

static PyObject *
rd_py_gather_reduce(PyObject *self, PyObject *args)
{
    PyObject *oy, *oslots, *ow;
    int ordered = 0;
    rd_arg_t y, slots, w;
    const void *w_data;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOO|p", &oy, &oslots, &ow, &ordered))
        return NULL;
    if (rd_arg_array(oy, "y", 2, RD_ANY_STORAGE, RD_ROWS, &y) != 0)
        return NULL;
    const int half = y.dtype == RD_F16 || y.dtype == RD_BF16;
    if (!half && y.dtype != RD_F32 && y.dtype != RD_F64) {
        PyErr_Format(PyExc_TypeError, "'y' has dtype %s, expected float32, float64, float16 or bfloat16",
                     PyArray_DESCR(y.arr)->typeobj->tp_name);
        return NULL;
    }
    /* 16-bit rows are summed into float32 (weights float32 too) */
    const int ct_num = half ? NPY_FLOAT32 : y.type_num;
    if (rd_arg_array(oslots, "indices", 2, NPY_INT64, RD_CONTIG, &slots) != 0 ||
        rd_arg_indices(&slots, "indices", -1, y.dim[0]) != 0 ||
        rd_arg_optional(ow, "weights", 2, ct_num, slots.dim, &w, &w_data) != 0)
        return NULL;
    npy_intp T = slots.dim[0], k = slots.dim[1], d = y.dim[1];
    npy_intp dims[2] = {T, d};
    PyArrayObject *out = (PyArrayObject *)rd_pool_array(PyArray_DescrFromType(ct_num), 2, dims);
    if (out == NULL)
        return NULL;
    const rd_moe_ops_t *ops = &rd_moe_ops[rd_arg_ctype(&y)];
    rd_int rs = d > 0 ? y.stride[0] : 0;
    Py_BEGIN_ALLOW_THREADS
    if (half)
        rd_gather_reduce_half(T, k, d, (const uint16_t *)y.data, rs, (rd_dtype_t)y.dtype,
                              (const long long *)slots.data, (const float *)w_data, PyArray_DATA(out), ordered);
    else
        ops->gather_reduce(T, k, d, y.data, rs, (const long long *)slots.data, w_data,
                           PyArray_DATA(out), ordered);
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

/* gate and up (and d_out): C-contiguous, one float dtype (float32,
 * float64, float16 or bfloat16), one shape; kind a known activation. */
static int
rd_arg_gated(PyObject *og, PyObject *ou, PyObject *odo, int kind, rd_arg_t *g, rd_arg_t *u,
             rd_arg_t *dout)
{
    if (rd_arg_array(og, "gate", -1, RD_ANY_STORAGE, RD_CONTIG, g) != 0)
        return -1;
    if (g->dtype != RD_F32 && g->dtype != RD_F64 && g->dtype != RD_F16 && g->dtype != RD_BF16) {
        PyErr_Format(PyExc_TypeError, "'gate' has dtype %s, expected float32, float64, float16 or bfloat16",
                     PyArray_DESCR(g->arr)->typeobj->tp_name);
        return -1;
    }
    if (
        rd_arg_array(ou, "up", g->ndim, g->type_num, RD_CONTIG, u) != 0 ||
        (odo != NULL && rd_arg_array(odo, "d_out", g->ndim, g->type_num, RD_CONTIG, dout) != 0))
        return -1;
    if (!PyArray_SAMESHAPE(g->arr, u->arr) || (odo != NULL && !PyArray_SAMESHAPE(g->arr, dout->arr))) {
        PyErr_SetString(PyExc_ValueError, "'gate', 'up' (and 'd_out') must have one shape");
        return -1;
    }
    if (kind < RD_ACT_SILU || kind > RD_ACT_SWIGLU_OAI) {
        PyErr_Format(PyExc_ValueError, "unknown activation %d", kind);
        return -1;
    }
    return 0;
}

/* The element-wise kernels on 16-bit arrays: chunks widened to float32 on
 * the stack, computed by the float32 kernel and rounded once into the
 * 16-bit results (the float32 arithmetic on the same values, then one
 * rounding to nearest even).  in[0..nin) are read, out[0..nout) written. */
#define RD_HALF_CHUNK 1024

static void
rd_half_elementwise(npy_intp n, rd_dtype_t dt, int kind, double limit, double alpha,
                    const void *const *in, int nin, void *const *out, int nout)
{
    const rd_moe_ops_t *ops = &rd_moe_ops[RD_CT_F32];
    const npy_intp chunks = (n + RD_HALF_CHUNK - 1) / RD_HALF_CHUNK;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(rd_get_num_threads()) if (n > 65536)
#endif
    for (npy_intp c = 0; c < chunks; c++) {
        float w[5][RD_HALF_CHUNK];
        const npy_intp i0 = c * RD_HALF_CHUNK;
        const npy_intp len = n - i0 < RD_HALF_CHUNK ? n - i0 : RD_HALF_CHUNK;
        for (int j = 0; j < nin; j++)
            rd_widen((const uint16_t *)in[j] + i0, w[j], dt, (size_t)len);
        if (nout == 1)
            ops->gated_act(len, kind, limit, alpha, w[0], w[1], w[3]);
        else
            ops->gated_act_grad(len, kind, limit, alpha, w[0], w[1], w[2], w[3], w[4]);
        for (int j = 0; j < nout; j++)
            rd_narrow(w[3 + j], (uint16_t *)out[j] + i0, dt, (size_t)len, 0);
    }
}

static PyObject *
rd_py_gated_act(PyObject *self, PyObject *args)
{
    PyObject *og, *ou;
    int kind;
    double limit, alpha = RD_SWIGLU_ALPHA;
    rd_arg_t g, u;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOid|d", &og, &ou, &kind, &limit, &alpha) ||
        rd_arg_gated(og, ou, NULL, kind, &g, &u, NULL) != 0)
        return NULL;
    PyArrayObject *out = (PyArrayObject *)rd_pool_array(PyArray_DescrFromType(g.type_num), g.ndim, PyArray_DIMS(g.arr));
    if (out == NULL)
        return NULL;
    const rd_moe_ops_t *ops = &rd_moe_ops[rd_arg_ctype(&g)];
    npy_intp n = PyArray_SIZE(g.arr);
    const void *in[2] = {g.data, u.data};
    void *res[1] = {PyArray_DATA(out)};
    Py_BEGIN_ALLOW_THREADS
    if (g.dtype == RD_F16 || g.dtype == RD_BF16)
        rd_half_elementwise(n, (rd_dtype_t)g.dtype, kind, limit, alpha, in, 2, res, 1);
    else
        ops->gated_act(n, kind, limit, alpha, g.data, u.data, PyArray_DATA(out));
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

static PyObject *
rd_py_gated_act_grad(PyObject *self, PyObject *args)
{
    PyObject *og, *ou, *odo;
    int kind;
    double limit, alpha = RD_SWIGLU_ALPHA;
    rd_arg_t g, u, dout;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOid|d", &og, &ou, &odo, &kind, &limit, &alpha) ||
        rd_arg_gated(og, ou, odo, kind, &g, &u, &dout) != 0)
        return NULL;
    PyArrayObject *dg = (PyArrayObject *)rd_pool_array(PyArray_DescrFromType(g.type_num), g.ndim, PyArray_DIMS(g.arr));
    PyArrayObject *du = (PyArrayObject *)rd_pool_array(PyArray_DescrFromType(g.type_num), g.ndim, PyArray_DIMS(g.arr));
    if (dg == NULL || du == NULL) {
        Py_XDECREF(dg);
        Py_XDECREF(du);
        return NULL;
    }
    const rd_moe_ops_t *ops = &rd_moe_ops[rd_arg_ctype(&g)];
    npy_intp n = PyArray_SIZE(g.arr);
    const void *in[3] = {g.data, u.data, dout.data};
    void *res[2] = {PyArray_DATA(dg), PyArray_DATA(du)};
    Py_BEGIN_ALLOW_THREADS
    if (g.dtype == RD_F16 || g.dtype == RD_BF16)
        rd_half_elementwise(n, (rd_dtype_t)g.dtype, kind, limit, alpha, in, 3, res, 2);
    else
        ops->gated_act_grad(n, kind, limit, alpha, g.data, u.data, dout.data, PyArray_DATA(dg),
                            PyArray_DATA(du));
    Py_END_ALLOW_THREADS
    return Py_BuildValue("NN", (PyObject *)dg, (PyObject *)du);
}

PyMethodDef rd_moe_methods[] = {
    {"moe_route", rd_py_moe_route, METH_VARARGS,
     "moe_route(logits, score_func, selection_bias, n_groups, topk_groups, top_k, norm_topk_prob, scaling)"
     " -> (scores [T, E], topk_idx [T, k] int64, topk_weights [T, k])"},
    {"moe_sort", rd_py_moe_sort, METH_VARARGS,
     "moe_sort(topk_idx [T, k] int64, E, capacity) -> (slot_of [T, k], token_of_slot [kept], group_sizes [E]);"
     " capacity < 0 keeps every assignment, dropped ones get slot -1"},
    {"gather_rows", rd_py_gather_rows, METH_VARARGS,
     "gather_rows(x [T, d], indices [n] int64, scale [n] or None) -> out [n, d], out[i] = scale[i] * x[indices[i]];"
     " float16 / bfloat16 x: rows copied as they are, or with a float32 scale widened into a float32 out;"
     " float32 x with narrow (a float16 or bfloat16 array): out of its dtype, each scaled row rounded once"},
    {"gather_reduce", rd_py_gather_reduce, METH_VARARGS,
     "gather_reduce(y [n, d], indices [T, k] int64, weights [T, k] or None, ordered=False) -> out [T, d],"
     " out[t] = sum_j weights[t, j] * y[indices[t, j]] (index -1 skipped), j in order or (ordered)"
     " in the order of the indices; float16 / bfloat16 y: widened, summed with float32 weights into a"
     " float32 out"},
    {"slot_dots", rd_py_slot_dots, METH_VARARGS,
     "slot_dots(a [T, d], rows [n, d], slot_of [T, k] int64) -> out [T, k], out[t, j] ="
     " <a[t], rows[slot_of[t, j]]> (0 for -1), summed in double, rounded once to float32 (float64"
     " when either is float64); float16 / bfloat16 rows widened exactly"},
    {"gated_act", rd_py_gated_act, METH_VARARGS, "gated_act(gate, up, kind, limit, alpha=1.702) -> out"},
    {"gated_act_grad", rd_py_gated_act_grad, METH_VARARGS,
     "gated_act_grad(gate, up, d_out, kind, limit, alpha=1.702) -> (d_gate, d_up)"},
    {NULL, NULL, 0, NULL},
};
