/*
 * raggeddot._core: the only file that includes Python.h.
 *
 * Every entry point checks its arguments (the public Python layer has
 * already validated them for users; these checks keep a direct call from
 * crashing the interpreter), releases the GIL around the kernel, and sets
 * an exception only after the GIL is back.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "rd_kernel.h"

#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------ arguments */

/* A float operand: aligned, native byte order, element-sized strides. */
static int
rd_check_operand(PyObject *obj, const char *name, int ndim, int type_num,
                 int writeable, PyArrayObject **out)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "'%s' must be a numpy.ndarray, got %s",
                     name, Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_NDIM(arr) != ndim) {
        PyErr_Format(PyExc_ValueError, "'%s' must be %d-D, got %d-D", name,
                     ndim, PyArray_NDIM(arr));
        return -1;
    }
    if (type_num >= 0 && PyArray_TYPE(arr) != type_num) {
        PyErr_Format(PyExc_TypeError, "'%s' has the wrong dtype", name);
        return -1;
    }
    if (!PyArray_ISALIGNED(arr) || !PyArray_ISNOTSWAPPED(arr)) {
        PyErr_Format(PyExc_ValueError,
                     "'%s' must be aligned and in native byte order", name);
        return -1;
    }
    npy_intp item = PyArray_ITEMSIZE(arr);
    for (int d = 0; d < ndim; d++) {
        if (PyArray_STRIDE(arr, d) % item != 0) {
            PyErr_Format(PyExc_ValueError,
                         "'%s' has a stride that is not a multiple of its itemsize",
                         name);
            return -1;
        }
    }
    if (writeable && !PyArray_ISWRITEABLE(arr)) {
        PyErr_Format(PyExc_ValueError, "'%s' must be writeable", name);
        return -1;
    }
    *out = arr;
    return 0;
}

static rd_int
rd_stride(PyArrayObject *arr, int d)
{
    return (rd_int)(PyArray_STRIDE(arr, d) / PyArray_ITEMSIZE(arr));
}

/* Group row boundaries: int64, 1-D, contiguous, non-decreasing in [0, limit]. */
static int
rd_check_bounds(PyObject *obj, rd_int limit, PyArrayObject **out)
{
    PyArrayObject *b;
    if (rd_check_operand(obj, "bounds", 1, NPY_INT64, 0, &b) != 0)
        return -1;
    if (!PyArray_IS_C_CONTIGUOUS(b) || PyArray_DIM(b, 0) < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "'bounds' must be contiguous with at least one entry");
        return -1;
    }
    const npy_int64 *v = (const npy_int64 *)PyArray_DATA(b);
    npy_intp len = PyArray_DIM(b, 0);
    for (npy_intp i = 0; i < len; i++) {
        if (v[i] < 0 || v[i] > limit || (i > 0 && v[i] < v[i - 1])) {
            PyErr_Format(PyExc_ValueError,
                         "'bounds' must be non-decreasing within [0, %zd]",
                         (Py_ssize_t)limit);
            return -1;
        }
    }
    *out = b;
    return 0;
}

static int
rd_float_type(PyArrayObject *arr)
{
    int t = PyArray_TYPE(arr);
    if (t != NPY_FLOAT32 && t != NPY_FLOAT64) {
        PyErr_SetString(PyExc_TypeError, "operands must be float32 or float64");
        return -1;
    }
    return t;
}

/* --------------------------------------------------------------- kernels */

PyDoc_STRVAR(ragged_rows_doc,
"ragged_rows(lhs, rhs, bounds, out, accumulate)\n\n"
"For each group g: out[r] (+)= lhs[r] @ rhs[g] for r in [bounds[g], bounds[g+1]).\n"
"lhs [m, k], rhs [ng, k, n], bounds int64 [ng + 1], out [m, n]; one float dtype.\n"
"Rows outside [bounds[0], bounds[ng]) are left as they are.");

static PyObject *
rd_py_ragged_rows(PyObject *self, PyObject *args)
{
    PyObject *olhs, *orhs, *obounds, *oout;
    int accumulate;
    PyArrayObject *lhs, *rhs, *bounds, *out;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOp", &olhs, &orhs, &obounds, &oout, &accumulate))
        return NULL;
    if (rd_check_operand(olhs, "lhs", 2, -1, 0, &lhs) != 0)
        return NULL;
    int t = rd_float_type(lhs);
    if (t < 0 || rd_check_operand(orhs, "rhs", 3, t, 0, &rhs) != 0 ||
        rd_check_operand(oout, "out", 2, t, 1, &out) != 0)
        return NULL;
    rd_int m = PyArray_DIM(lhs, 0), k = PyArray_DIM(lhs, 1);
    rd_int ng = PyArray_DIM(rhs, 0), n = PyArray_DIM(rhs, 2);
    if (PyArray_DIM(rhs, 1) != k || PyArray_DIM(out, 0) != m || PyArray_DIM(out, 1) != n) {
        PyErr_SetString(PyExc_ValueError, "shapes of lhs [m, k], rhs [g, k, n], out [m, n] disagree");
        return NULL;
    }
    if (rd_check_bounds(obounds, m, &bounds) != 0)
        return NULL;
    if (PyArray_DIM(bounds, 0) != ng + 1) {
        PyErr_SetString(PyExc_ValueError, "'bounds' must have rhs.shape[0] + 1 entries");
        return NULL;
    }
    const rd_int *bv = (const rd_int *)PyArray_DATA(bounds);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (t == NPY_FLOAT32)
        rc = rd_sgemm_ragged_rows(k, n, ng, bv,
                                  (const float *)PyArray_DATA(lhs), rd_stride(lhs, 0), rd_stride(lhs, 1),
                                  (const float *)PyArray_DATA(rhs), rd_stride(rhs, 0), rd_stride(rhs, 1), rd_stride(rhs, 2),
                                  (float *)PyArray_DATA(out), rd_stride(out, 0), rd_stride(out, 1), accumulate);
    else
        rc = rd_dgemm_ragged_rows(k, n, ng, bv,
                                  (const double *)PyArray_DATA(lhs), rd_stride(lhs, 0), rd_stride(lhs, 1),
                                  (const double *)PyArray_DATA(rhs), rd_stride(rhs, 0), rd_stride(rhs, 1), rd_stride(rhs, 2),
                                  (double *)PyArray_DATA(out), rd_stride(out, 0), rd_stride(out, 1), accumulate);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ragged_contract_doc,
"ragged_contract(lhs, rhs, bounds, out, accumulate)\n\n"
"For each group g: out[g] (+)= lhs[:, rows] @ rhs[rows, :], rows = [bounds[g], bounds[g+1]).\n"
"lhs [k, m], rhs [m, n], bounds int64 [ng + 1], out [ng, k, n]; one float dtype.\n"
"An empty group gives zeros (or leaves out[g] as it is when accumulating).");

static PyObject *
rd_py_ragged_contract(PyObject *self, PyObject *args)
{
    PyObject *olhs, *orhs, *obounds, *oout;
    int accumulate;
    PyArrayObject *lhs, *rhs, *bounds, *out;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOp", &olhs, &orhs, &obounds, &oout, &accumulate))
        return NULL;
    if (rd_check_operand(olhs, "lhs", 2, -1, 0, &lhs) != 0)
        return NULL;
    int t = rd_float_type(lhs);
    if (t < 0 || rd_check_operand(orhs, "rhs", 2, t, 0, &rhs) != 0 ||
        rd_check_operand(oout, "out", 3, t, 1, &out) != 0)
        return NULL;
    rd_int k = PyArray_DIM(lhs, 0), m = PyArray_DIM(lhs, 1), n = PyArray_DIM(rhs, 1);
    rd_int ng = PyArray_DIM(out, 0);
    if (PyArray_DIM(rhs, 0) != m || PyArray_DIM(out, 1) != k || PyArray_DIM(out, 2) != n) {
        PyErr_SetString(PyExc_ValueError, "shapes of lhs [k, m], rhs [m, n], out [g, k, n] disagree");
        return NULL;
    }
    if (rd_check_bounds(obounds, m, &bounds) != 0)
        return NULL;
    if (PyArray_DIM(bounds, 0) != ng + 1) {
        PyErr_SetString(PyExc_ValueError, "'bounds' must have out.shape[0] + 1 entries");
        return NULL;
    }
    const rd_int *bv = (const rd_int *)PyArray_DATA(bounds);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (t == NPY_FLOAT32)
        rc = rd_sgemm_ragged_contract(k, n, ng, bv,
                                      (const float *)PyArray_DATA(lhs), rd_stride(lhs, 0), rd_stride(lhs, 1),
                                      (const float *)PyArray_DATA(rhs), rd_stride(rhs, 0), rd_stride(rhs, 1),
                                      (float *)PyArray_DATA(out), rd_stride(out, 0), rd_stride(out, 1), rd_stride(out, 2),
                                      accumulate);
    else
        rc = rd_dgemm_ragged_contract(k, n, ng, bv,
                                      (const double *)PyArray_DATA(lhs), rd_stride(lhs, 0), rd_stride(lhs, 1),
                                      (const double *)PyArray_DATA(rhs), rd_stride(rhs, 0), rd_stride(rhs, 1),
                                      (double *)PyArray_DATA(out), rd_stride(out, 0), rd_stride(out, 1), rd_stride(out, 2),
                                      accumulate);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
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
    PyArrayObject *gs;
    (void)self;
    if (!PyArg_ParseTuple(args, "Onnnnp", &ogs, &m, &tm, &start_group, &num_nonzero, &visit_empty))
        return NULL;
    if (rd_check_operand(ogs, "group_sizes", 1, NPY_INT64, 0, &gs) != 0)
        return NULL;
    if (!PyArray_IS_C_CONTIGUOUS(gs)) {
        PyErr_SetString(PyExc_ValueError, "'group_sizes' must be contiguous");
        return NULL;
    }
    npy_intp ng = PyArray_DIM(gs, 0);
    const npy_int64 *sizes = (const npy_int64 *)PyArray_DATA(gs);
    npy_int64 total = 0;
    for (npy_intp i = 0; i < ng; i++) {
        if (sizes[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "'group_sizes' has a negative entry");
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


/* ------------------------------------------------------------------- MoE */

/* A C-contiguous array of `type_num` with `ndim` dims, or NULL + exception. */
static PyArrayObject *
rd_contig(PyObject *obj, const char *name, int ndim, int type_num)
{
    PyArrayObject *arr;
    if (rd_check_operand(obj, name, ndim, type_num, 0, &arr) != 0)
        return NULL;
    if (!PyArray_IS_C_CONTIGUOUS(arr)) {
        PyErr_Format(PyExc_ValueError, "'%s' must be C-contiguous", name);
        return NULL;
    }
    return arr;
}

/* Every index in [lo, hi); -1 allowed when allow_neg. */
static int
rd_check_indices(PyArrayObject *idx, const char *name, npy_int64 hi, int allow_neg)
{
    const npy_int64 *v = (const npy_int64 *)PyArray_DATA(idx);
    npy_intp n = PyArray_SIZE(idx);
    for (npy_intp i = 0; i < n; i++) {
        if (v[i] >= hi || v[i] < (allow_neg ? -1 : 0)) {
            PyErr_Format(PyExc_ValueError, "'%s' holds index %lld outside [0, %lld)",
                         name, (long long)v[i], (long long)hi);
            return -1;
        }
    }
    return 0;
}

static PyObject *
rd_py_moe_route(PyObject *self, PyObject *args)
{
    PyObject *ologits, *obias;
    int score_func, norm;
    Py_ssize_t n_groups, topk_groups, top_k;
    double scaling;
    (void)self;
    if (!PyArg_ParseTuple(args, "OiOnnnpd", &ologits, &score_func, &obias, &n_groups,
                          &topk_groups, &top_k, &norm, &scaling))
        return NULL;
    PyArrayObject *logits = rd_contig(ologits, "logits", 2, -1), *bias = NULL;
    if (logits == NULL)
        return NULL;
    int t = rd_float_type(logits);
    if (t < 0)
        return NULL;
    npy_intp T = PyArray_DIM(logits, 0), E = PyArray_DIM(logits, 1);
    if (obias != Py_None) {
        bias = rd_contig(obias, "selection_bias", 1, t);
        if (bias == NULL)
            return NULL;
        if (PyArray_DIM(bias, 0) != E) {
            PyErr_SetString(PyExc_ValueError, "'selection_bias' must have E entries");
            return NULL;
        }
    }
    if (E < 1 || top_k < 1 || top_k > E || (score_func != RD_SCORE_SOFTMAX && score_func != RD_SCORE_SIGMOID) ||
        (n_groups > 1 && (E % n_groups != 0 || topk_groups < 1 || topk_groups > n_groups ||
                          topk_groups * (E / n_groups) < top_k))) {
        PyErr_SetString(PyExc_ValueError, "invalid routing configuration");
        return NULL;
    }
    npy_intp dims_s[2] = {T, E}, dims_k[2] = {T, top_k};
    PyArrayObject *scores = (PyArrayObject *)PyArray_EMPTY(2, dims_s, t, 0);
    PyArrayObject *idx = (PyArrayObject *)PyArray_EMPTY(2, dims_k, NPY_INT64, 0);
    PyArrayObject *w = (PyArrayObject *)PyArray_EMPTY(2, dims_k, t, 0);
    if (scores == NULL || idx == NULL || w == NULL)
        goto error;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (t == NPY_FLOAT32)
        rc = rd_s_moe_route(T, E, (const float *)PyArray_DATA(logits), score_func,
                            bias ? (const float *)PyArray_DATA(bias) : NULL, n_groups, topk_groups,
                            top_k, norm, scaling, (float *)PyArray_DATA(scores),
                            (long long *)PyArray_DATA(idx), (float *)PyArray_DATA(w));
    else
        rc = rd_d_moe_route(T, E, (const double *)PyArray_DATA(logits), score_func,
                            bias ? (const double *)PyArray_DATA(bias) : NULL, n_groups, topk_groups,
                            top_k, norm, scaling, (double *)PyArray_DATA(scores),
                            (long long *)PyArray_DATA(idx), (double *)PyArray_DATA(w));
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
    (void)self;
    if (!PyArg_ParseTuple(args, "Onn", &oidx, &E, &capacity))
        return NULL;
    PyArrayObject *idx = rd_contig(oidx, "topk_idx", 2, NPY_INT64);
    if (idx == NULL || E < 1 || rd_check_indices(idx, "topk_idx", E, 0) != 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "number of experts must be positive");
        return NULL;
    }
    npy_intp T = PyArray_DIM(idx, 0), k = PyArray_DIM(idx, 1), n = T * k, e = E;
    PyArrayObject *slot_of = (PyArrayObject *)PyArray_EMPTY(2, PyArray_DIMS(idx), NPY_INT64, 0);
    PyArrayObject *tok = (PyArrayObject *)PyArray_EMPTY(1, &n, NPY_INT64, 0);
    PyArrayObject *gs = (PyArrayObject *)PyArray_EMPTY(1, &e, NPY_INT64, 0);
    if (slot_of == NULL || tok == NULL || gs == NULL)
        goto error;
    rd_int kept;
    Py_BEGIN_ALLOW_THREADS
    kept = rd_moe_sort(T, k, E, (const long long *)PyArray_DATA(idx), capacity,
                       (long long *)PyArray_DATA(slot_of), (long long *)PyArray_DATA(tok),
                       (long long *)PyArray_DATA(gs));
    Py_END_ALLOW_THREADS
    if (kept < 0) {
        PyErr_NoMemory();
        goto error;
    }
    PyObject *tok_kept = PySequence_GetSlice((PyObject *)tok, 0, kept);
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

/* Rows of a 2-D float array whose columns are contiguous. */
static PyArrayObject *
rd_rows(PyObject *obj, const char *name, int type_num)
{
    PyArrayObject *arr;
    if (rd_check_operand(obj, name, 2, type_num, 0, &arr) != 0)
        return NULL;
    /* an empty array has no rows to read, whatever strides NumPy gave it */
    if (PyArray_DIM(arr, 0) > 0 && PyArray_DIM(arr, 1) > 1 &&
        PyArray_STRIDE(arr, 1) != PyArray_ITEMSIZE(arr)) {
        PyErr_Format(PyExc_ValueError, "'%s' must have contiguous rows", name);
        return NULL;
    }
    return arr;
}

static PyObject *
rd_py_gather_rows(PyObject *self, PyObject *args)
{
    PyObject *ox, *osrc, *oscale;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOO", &ox, &osrc, &oscale))
        return NULL;
    PyArrayObject *x = rd_rows(ox, "x", -1), *src, *scale = NULL;
    if (x == NULL)
        return NULL;
    int t = rd_float_type(x);
    if (t < 0 || (src = rd_contig(osrc, "indices", 1, NPY_INT64)) == NULL ||
        rd_check_indices(src, "indices", PyArray_DIM(x, 0), 0) != 0)
        return NULL;
    npy_intp n = PyArray_DIM(src, 0), d = PyArray_DIM(x, 1);
    if (oscale != Py_None) {
        if ((scale = rd_contig(oscale, "scale", 1, t)) == NULL)
            return NULL;
        if (PyArray_DIM(scale, 0) != n) {
            PyErr_SetString(PyExc_ValueError, "'scale' must have one entry per index");
            return NULL;
        }
    }
    npy_intp dims[2] = {n, d};
    PyArrayObject *out = (PyArrayObject *)PyArray_EMPTY(2, dims, t, 0);
    if (out == NULL)
        return NULL;
    rd_int rs = d > 0 ? rd_stride(x, 0) : 0;
    Py_BEGIN_ALLOW_THREADS
    if (t == NPY_FLOAT32)
        rd_s_gather_rows(n, d, (const float *)PyArray_DATA(x), rs, (const long long *)PyArray_DATA(src),
                         scale ? (const float *)PyArray_DATA(scale) : NULL, (float *)PyArray_DATA(out));
    else
        rd_d_gather_rows(n, d, (const double *)PyArray_DATA(x), rs, (const long long *)PyArray_DATA(src),
                         scale ? (const double *)PyArray_DATA(scale) : NULL, (double *)PyArray_DATA(out));
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

static PyObject *
rd_py_gather_reduce(PyObject *self, PyObject *args)
{
    PyObject *oy, *oslots, *ow;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOO", &oy, &oslots, &ow))
        return NULL;
    PyArrayObject *y = rd_rows(oy, "y", -1), *slots, *w = NULL;
    if (y == NULL)
        return NULL;
    int t = rd_float_type(y);
    if (t < 0 || (slots = rd_contig(oslots, "indices", 2, NPY_INT64)) == NULL ||
        rd_check_indices(slots, "indices", PyArray_DIM(y, 0), 1) != 0)
        return NULL;
    npy_intp T = PyArray_DIM(slots, 0), k = PyArray_DIM(slots, 1), d = PyArray_DIM(y, 1);
    if (ow != Py_None) {
        if ((w = rd_contig(ow, "weights", 2, t)) == NULL)
            return NULL;
        if (PyArray_DIM(w, 0) != T || PyArray_DIM(w, 1) != k) {
            PyErr_SetString(PyExc_ValueError, "'weights' must have the shape of 'indices'");
            return NULL;
        }
    }
    npy_intp dims[2] = {T, d};
    PyArrayObject *out = (PyArrayObject *)PyArray_EMPTY(2, dims, t, 0);
    if (out == NULL)
        return NULL;
    rd_int rs = d > 0 ? rd_stride(y, 0) : 0;
    Py_BEGIN_ALLOW_THREADS
    if (t == NPY_FLOAT32)
        rd_s_gather_reduce(T, k, d, (const float *)PyArray_DATA(y), rs, (const long long *)PyArray_DATA(slots),
                           w ? (const float *)PyArray_DATA(w) : NULL, (float *)PyArray_DATA(out));
    else
        rd_d_gather_reduce(T, k, d, (const double *)PyArray_DATA(y), rs, (const long long *)PyArray_DATA(slots),
                           w ? (const double *)PyArray_DATA(w) : NULL, (double *)PyArray_DATA(out));
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

/* gate and up: same shape, contiguous, one float dtype. */
static int
rd_pair(PyObject *og, PyObject *ou, PyArrayObject **g, PyArrayObject **u, int *t)
{
    if (rd_check_operand(og, "gate", PyArray_Check(og) ? PyArray_NDIM((PyArrayObject *)og) : 1, -1, 0, g) != 0)
        return -1;
    if ((*t = rd_float_type(*g)) < 0)
        return -1;
    if (rd_check_operand(ou, "up", PyArray_NDIM(*g), *t, 0, u) != 0)
        return -1;
    if (!PyArray_IS_C_CONTIGUOUS(*g) || !PyArray_IS_C_CONTIGUOUS(*u) ||
        !PyArray_SAMESHAPE(*g, *u)) {
        PyErr_SetString(PyExc_ValueError, "'gate' and 'up' must be C-contiguous with one shape");
        return -1;
    }
    return 0;
}

static PyObject *
rd_py_gated_act(PyObject *self, PyObject *args)
{
    PyObject *og, *ou;
    int kind;
    double limit;
    PyArrayObject *g, *u;
    int t;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOid", &og, &ou, &kind, &limit))
        return NULL;
    if (rd_pair(og, ou, &g, &u, &t) != 0)
        return NULL;
    if (kind < RD_ACT_SILU || kind > RD_ACT_SWIGLU_OAI) {
        PyErr_SetString(PyExc_ValueError, "unknown activation");
        return NULL;
    }
    PyArrayObject *out = (PyArrayObject *)PyArray_EMPTY(PyArray_NDIM(g), PyArray_DIMS(g), t, 0);
    if (out == NULL)
        return NULL;
    npy_intp n = PyArray_SIZE(g);
    Py_BEGIN_ALLOW_THREADS
    if (t == NPY_FLOAT32)
        rd_s_gated_act(n, kind, limit, (const float *)PyArray_DATA(g), (const float *)PyArray_DATA(u),
                       (float *)PyArray_DATA(out));
    else
        rd_d_gated_act(n, kind, limit, (const double *)PyArray_DATA(g), (const double *)PyArray_DATA(u),
                       (double *)PyArray_DATA(out));
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

static PyObject *
rd_py_gated_act_grad(PyObject *self, PyObject *args)
{
    PyObject *og, *ou, *odo;
    int kind;
    double limit;
    PyArrayObject *g, *u, *dout;
    int t;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOid", &og, &ou, &odo, &kind, &limit))
        return NULL;
    if (rd_pair(og, ou, &g, &u, &t) != 0)
        return NULL;
    if (rd_check_operand(odo, "d_out", PyArray_NDIM(g), t, 0, &dout) != 0)
        return NULL;
    if (!PyArray_IS_C_CONTIGUOUS(dout) || !PyArray_SAMESHAPE(g, dout)) {
        PyErr_SetString(PyExc_ValueError, "'d_out' must be C-contiguous with the shape of 'gate'");
        return NULL;
    }
    if (kind < RD_ACT_SILU || kind > RD_ACT_SWIGLU_OAI) {
        PyErr_SetString(PyExc_ValueError, "unknown activation");
        return NULL;
    }
    PyArrayObject *dg = (PyArrayObject *)PyArray_EMPTY(PyArray_NDIM(g), PyArray_DIMS(g), t, 0);
    PyArrayObject *du = (PyArrayObject *)PyArray_EMPTY(PyArray_NDIM(g), PyArray_DIMS(g), t, 0);
    if (dg == NULL || du == NULL) {
        Py_XDECREF(dg);
        Py_XDECREF(du);
        return NULL;
    }
    npy_intp n = PyArray_SIZE(g);
    Py_BEGIN_ALLOW_THREADS
    if (t == NPY_FLOAT32)
        rd_s_gated_act_grad(n, kind, limit, (const float *)PyArray_DATA(g), (const float *)PyArray_DATA(u),
                            (const float *)PyArray_DATA(dout), (float *)PyArray_DATA(dg),
                            (float *)PyArray_DATA(du));
    else
        rd_d_gated_act_grad(n, kind, limit, (const double *)PyArray_DATA(g), (const double *)PyArray_DATA(u),
                            (const double *)PyArray_DATA(dout), (double *)PyArray_DATA(dg),
                            (double *)PyArray_DATA(du));
    Py_END_ALLOW_THREADS
    return Py_BuildValue("NN", (PyObject *)dg, (PyObject *)du);
}

/* ------------------------------------------------------ result buffers */

static const char rd_buffer_name[] = "raggeddot.buffer";
/* tracemalloc domain of NumPy's array data: result blocks are reported as
 * array memory while an array holds them (not while they sit idle). */
#define RD_TRACE_DOMAIN 389047

static void
rd_buffer_release(PyObject *capsule)
{
    void *p = PyCapsule_GetPointer(capsule, rd_buffer_name);
    PyTraceMalloc_Untrack(RD_TRACE_DOMAIN, (uintptr_t)p);
    rd_buffer_give(p, (size_t)(uintptr_t)PyCapsule_GetContext(capsule));
}

PyDoc_STRVAR(empty_doc,
"empty(shape, dtype) -> uninitialised C-contiguous array, 64-byte aligned.\n\n"
"Its memory comes from, and returns to, the cache of result buffers (see\n"
"set_buffer_cache): a large block freed by an earlier result is reused\n"
"with its pages already mapped.");

static PyObject *
rd_py_empty(PyObject *self, PyObject *args)
{
    PyObject *oshape;
    PyArray_Descr *descr = NULL;
    PyArray_Dims dims = {NULL, 0};
    (void)self;
    if (!PyArg_ParseTuple(args, "OO&", &oshape, PyArray_DescrConverter, &descr))
        return NULL;
    if ((descr->type_num != NPY_FLOAT32 && descr->type_num != NPY_FLOAT64)
        || !PyArray_ISNBO(descr->byteorder)) {
        /* an uninitialised array of any other dtype could hold garbage
         * object pointers or need NumPy's own allocation */
        PyErr_SetString(PyExc_TypeError, "empty: dtype must be native float32 or float64");
        Py_DECREF(descr);
        return NULL;
    }
    if (!PyArray_IntpConverter(oshape, &dims)) {
        Py_DECREF(descr);
        return NULL;
    }
#if NPY_ABI_VERSION >= 0x02000000
    size_t bytes = (size_t)PyDataType_ELSIZE(descr);
#else
    size_t bytes = (size_t)descr->elsize;
#endif
    for (int d = 0; d < dims.len; d++) {
        if (dims.ptr[d] < 0 || (dims.ptr[d] > 0 && bytes > ((size_t)PY_SSIZE_T_MAX) / (size_t)dims.ptr[d])) {
            PyErr_SetString(PyExc_ValueError, "empty: negative or too large shape");
            Py_DECREF(descr);
            PyDimMem_FREE(dims.ptr);
            return NULL;
        }
        bytes *= (size_t)dims.ptr[d];
    }
    size_t got = 0;
    void *p = rd_buffer_take(bytes, &got);
    if (p == NULL) {
        Py_DECREF(descr);
        PyDimMem_FREE(dims.ptr);
        return PyErr_NoMemory();
    }
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, dims.len, dims.ptr, NULL, p,
                                         NPY_ARRAY_CARRAY, NULL);  /* steals descr */
    PyDimMem_FREE(dims.ptr);
    if (arr == NULL) {
        rd_buffer_give(p, got);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(p, rd_buffer_name, rd_buffer_release);
    if (capsule == NULL || PyCapsule_SetContext(capsule, (void *)(uintptr_t)got) != 0) {
        if (capsule != NULL)
            Py_DECREF(capsule);  /* gives the block back */
        else
            rd_buffer_give(p, got);
        Py_DECREF(arr);
        return NULL;
    }
    PyTraceMalloc_Track(RD_TRACE_DOMAIN, (uintptr_t)p, got);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, capsule) != 0) {  /* steals capsule */
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *
rd_py_set_buffer_cache(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t bytes = PyLong_AsSsize_t(arg);
    if (bytes == -1 && PyErr_Occurred())
        return NULL;
    if (bytes < 0) {
        PyErr_Format(PyExc_ValueError, "set_buffer_cache: nbytes must be >= 0, got %zd", bytes);
        return NULL;
    }
    return PyLong_FromSize_t(rd_buffer_cache_limit((size_t)bytes));
}

/* ------------------------------------------------------ configuration */

static PyObject *
rd_py_set_num_threads(PyObject *self, PyObject *arg)
{
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1 || n > 4096) {
        PyErr_Format(PyExc_ValueError, "number of threads must be in [1, 4096], got %ld", n);
        return NULL;
    }
    rd_set_num_threads((int)n);
    Py_RETURN_NONE;
}

static PyObject *
rd_py_get_num_threads(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(rd_get_num_threads());
}

static PyObject *
rd_py_set_kernel(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    const char *previous = rd_context()->name;
    int rc = rd_set_kernel(name);
    if (rc == -1) {
        PyErr_Format(PyExc_ValueError, "unknown kernel %R (compiled: see build_info()['simd'], or 'auto')", arg);
        return NULL;
    }
    if (rc == -2) {
        PyErr_Format(PyExc_RuntimeError, "this CPU cannot run the %R kernel", arg);
        return NULL;
    }
    return PyUnicode_FromString(previous);
}

static PyObject *
rd_py_set_blocking(PyObject *self, PyObject *args)
{
    const char *dtype;
    Py_ssize_t mc, kc, nc;
    (void)self;
    if (!PyArg_ParseTuple(args, "snnn", &dtype, &mc, &kc, &nc))
        return NULL;
    int bytes = strcmp(dtype, "float32") == 0 ? 4 : strcmp(dtype, "float64") == 0 ? 8 : 0;
    if (bytes == 0 || rd_set_blocking(bytes, mc, kc, nc) != 0) {
        PyErr_SetString(PyExc_ValueError, "set_blocking(dtype in {'float32', 'float64'}, mc, kc, nc >= 1)");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
rd_py_set_stream_threshold(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t bytes = PyLong_AsSsize_t(arg);
    if (bytes == -1 && PyErr_Occurred())
        return NULL;
    rd_int previous = rd_get_stream_min_bytes();
    rd_set_stream_min_bytes(bytes < 0 ? -1 : bytes);
    return PyLong_FromSsize_t(previous);
}

static PyObject *
rd_py_get_kernel(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(rd_context()->name);
}

static PyObject *
rd_blocking_dict(int mr, int nr, rd_int mc, rd_int kc, rd_int nc)
{
    return Py_BuildValue("{s:i,s:i,s:n,s:n,s:n}", "MR", mr, "NR", nr,
                         "MC", (Py_ssize_t)mc, "KC", (Py_ssize_t)kc,
                         "NC", (Py_ssize_t)nc);
}

static PyObject *
rd_py_build_info(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *simd = PyList_New(0), *info = NULL, *b32 = NULL, *b64 = NULL;
    if (simd == NULL)
        return NULL;
    for (const char *const *k = rd_compiled_kernels(); *k != NULL; k++) {
        PyObject *s = PyUnicode_FromString(*k);
        if (s == NULL || PyList_Append(simd, s) != 0) {
            Py_XDECREF(s);
            goto error;
        }
        Py_DECREF(s);
    }
    const rd_context_t *ctx = rd_context();
    b32 = rd_blocking_dict(ctx->s.mr, ctx->s.nr, ctx->s.mc, ctx->s.kc, ctx->s.nc);
    b64 = rd_blocking_dict(ctx->d.mr, ctx->d.nr, ctx->d.mc, ctx->d.kc, ctx->d.nc);
    if (b32 == NULL || b64 == NULL)
        goto error;
    info = Py_BuildValue("{s:O,s:O,s:s,s:O,s:O,s:i,s:{s:N,s:N},s:n,s:{s:n,s:n}}",
                         "openmp", rd_have_openmp() ? Py_True : Py_False,
                         "simd", simd,
                         "kernel", ctx->name,
                         "cpu_avx2", rd_cpu_has_avx2() ? Py_True : Py_False,
                         "cpu_avx512", rd_cpu_has_avx512() ? Py_True : Py_False,
                         "num_threads", rd_get_num_threads(),
                         "blocking", "float32", b32, "float64", b64,
                         "stream_threshold", (Py_ssize_t)rd_get_stream_min_bytes(),
                         "buffer_cache", "limit", (Py_ssize_t)rd_buffer_cache_limit(SIZE_MAX),
                         "idle", (Py_ssize_t)rd_buffer_cache_idle());
    b32 = b64 = NULL;
error:
    Py_DECREF(simd);
    Py_XDECREF(b32);
    Py_XDECREF(b64);
    return info;
}

PyDoc_STRVAR(fma_peak_doc,
"fma_peak(threads, seconds, isa='avx2') -> GFLOP/s\n\n"
"Sustained float32 FMA throughput of `threads` threads, each running\n"
"independent FMA chains for about `seconds`: 256-bit FMAs for isa='avx2',\n"
"512-bit for isa='avx512'.  0.0 when the CPU lacks that instruction set.");

static PyObject *
rd_py_fma_peak(PyObject *self, PyObject *args)
{
    int threads;
    double seconds;
    const char *isa = "avx2";
    (void)self;
    if (!PyArg_ParseTuple(args, "id|s", &threads, &seconds, &isa))
        return NULL;
    int wide = strcmp(isa, "avx512") == 0;
    if (!wide && strcmp(isa, "avx2") != 0) {
        PyErr_Format(PyExc_ValueError, "fma_peak: isa must be 'avx2' or 'avx512', got '%s'", isa);
        return NULL;
    }
    if (threads < 1 || seconds <= 0.0 || seconds > 60.0) {
        PyErr_SetString(PyExc_ValueError, "fma_peak needs threads >= 1 and 0 < seconds <= 60");
        return NULL;
    }
    double total = 0.0;
#ifdef RD_HAVE_X86_KERNELS
    if (wide ? rd_cpu_has_avx512() : rd_cpu_has_avx2()) {
        Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
#endif
        total += wide ? rd_fma_peak_avx512(seconds) : rd_fma_peak_avx2(seconds);
        Py_END_ALLOW_THREADS
    }
#endif
    return PyFloat_FromDouble(total);
}

static PyObject *
rd_py_kernel_table(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    static const char *const order[] = {"avx512", "avx2", "ref"};
    for (int i = 0; i < 3; i++) {
        int compiled = 0;
        for (const char *const *k = rd_compiled_kernels(); *k != NULL; k++)
            compiled |= strcmp(*k, order[i]) == 0;
        if (!compiled)
            continue;
        int ok = i == 2 || (i == 1 ? rd_cpu_has_avx2() : rd_cpu_has_avx512());
        PyObject *row = Py_BuildValue("{s:s,s:O,s:[ss]}", "name", order[i], "runnable",
                                      ok ? Py_True : Py_False, "types", "float32", "float64");
        if (row == NULL || PyList_Append(list, row) != 0) {
            Py_XDECREF(row);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(row);
    }
    return list;
}

static PyMethodDef rd_methods[] = {
    {"kernel_table", rd_py_kernel_table, METH_NOARGS, "kernel_table() -> [{name, runnable, types}]"},
    {"ragged_rows", rd_py_ragged_rows, METH_VARARGS, ragged_rows_doc},
    {"ragged_contract", rd_py_ragged_contract, METH_VARARGS, ragged_contract_doc},
    {"make_group_metadata", rd_py_make_group_metadata, METH_VARARGS, make_group_metadata_doc},
    {"set_num_threads", rd_py_set_num_threads, METH_O, "set_num_threads(n)"},
    {"get_num_threads", rd_py_get_num_threads, METH_NOARGS, "get_num_threads() -> int"},
    {"set_kernel", rd_py_set_kernel, METH_O,
     "set_kernel(name) -> previous name; name in build_info()['simd'] or 'auto'"},
    {"set_blocking", rd_py_set_blocking, METH_VARARGS,
     "set_blocking(dtype, mc, kc, nc): cache blocking of the kernel in force (for tuning);"
     " set_kernel(name) restores the defaults of that kernel"},
    {"get_kernel", rd_py_get_kernel, METH_NOARGS, "get_kernel() -> name of the kernel in use"},
    {"empty", rd_py_empty, METH_VARARGS, empty_doc},
    {"set_buffer_cache", rd_py_set_buffer_cache, METH_O,
     "set_buffer_cache(nbytes) -> previous limit on the idle result buffers kept for reuse (0: keep none)"},
    {"set_stream_threshold", rd_py_set_stream_threshold, METH_O,
     "set_stream_threshold(nbytes) -> previous: outputs of at least nbytes that a call writes once"
     " get non-temporal stores (negative: never)"},
    {"build_info", rd_py_build_info, METH_NOARGS, "build_info() -> dict"},
    {"fma_peak", rd_py_fma_peak, METH_VARARGS, fma_peak_doc},
    {"moe_route", rd_py_moe_route, METH_VARARGS,
     "moe_route(logits, score_func, selection_bias, n_groups, topk_groups, top_k, norm_topk_prob, scaling)"
     " -> (scores [T, E], topk_idx [T, k] int64, topk_weights [T, k])"},
    {"moe_sort", rd_py_moe_sort, METH_VARARGS,
     "moe_sort(topk_idx [T, k] int64, E, capacity) -> (slot_of [T, k], token_of_slot [kept], group_sizes [E]);"
     " capacity < 0 keeps every assignment, dropped ones get slot -1"},
    {"gather_rows", rd_py_gather_rows, METH_VARARGS,
     "gather_rows(x [T, d], indices [n] int64, scale [n] or None) -> out [n, d], out[i] = scale[i] * x[indices[i]]"},
    {"gather_reduce", rd_py_gather_reduce, METH_VARARGS,
     "gather_reduce(y [n, d], indices [T, k] int64, weights [T, k] or None) -> out [T, d],"
     " out[t] = sum_j weights[t, j] * y[indices[t, j]] (index -1 skipped)"},
    {"gated_act", rd_py_gated_act, METH_VARARGS, "gated_act(gate, up, kind, limit) -> out"},
    {"gated_act_grad", rd_py_gated_act_grad, METH_VARARGS,
     "gated_act_grad(gate, up, d_out, kind, limit) -> (d_gate, d_up)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef rd_module = {
    PyModuleDef_HEAD_INIT, "_core",
    "raggeddot's compiled kernels (grouped GEMM, tile metadata).", -1, rd_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__core(void)
{
    import_array();
    PyObject *m = PyModule_Create(&rd_module);
    if (m == NULL)
        return NULL;
    /* the C enums the Python side passes back in, so that it never retypes them */
    PyObject *acts = Py_BuildValue("{s:i,s:i,s:i,s:i,s:i}", "silu", RD_ACT_SILU, "gelu", RD_ACT_GELU,
                                   "gelu_tanh", RD_ACT_GELU_TANH, "relu", RD_ACT_RELU,
                                   "swiglu_oai", RD_ACT_SWIGLU_OAI);
    PyObject *scores = Py_BuildValue("{s:i,s:i}", "softmax", RD_SCORE_SOFTMAX, "sigmoid", RD_SCORE_SIGMOID);
    if (acts == NULL || scores == NULL || PyModule_AddObject(m, "ACTIVATIONS", acts) != 0) {
        Py_XDECREF(acts);
        Py_XDECREF(scores);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObject(m, "SCORE_FUNCS", scores) != 0) {
        Py_DECREF(scores);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
