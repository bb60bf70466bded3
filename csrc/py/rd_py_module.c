/*
 * raggeddot._core: the module, its argument parser, and the constants the
 * Python side passes back in (exported here so that it never retypes them).
 */
#define RD_PY_MODULE_FILE
#include "py/rd_py.h"
#include "moe/rd_moe.h"

/* ------------------------------------------------------------ arguments */

#include <string.h>

/* The storage dtype of an array, or -1.  bfloat16 is ml_dtypes' (a user
 * dtype, known by its scalar type's name and size). */
int
rd_storage_dtype(PyArray_Descr *descr)
{
    switch (descr->type_num) {
    case NPY_FLOAT32:
        return RD_F32;
    case NPY_FLOAT64:
        return RD_F64;
    case NPY_FLOAT16:
        return RD_F16;
    case NPY_INT8:
        return RD_I8;
    default: {
        const char *name = descr->typeobj->tp_name;
        const char *dot = strrchr(name, '.');
#if NPY_ABI_VERSION >= 0x02000000
        npy_intp size = PyDataType_ELSIZE(descr);
#else
        npy_intp size = descr->elsize;
#endif
        if (PyDataType_ISUSERDEF(descr) && size == 2 &&
            strcmp(dot != NULL ? dot + 1 : name, "bfloat16") == 0)
            return RD_BF16;
        if (PyDataType_ISUSERDEF(descr) && size == 1 &&
            strcmp(dot != NULL ? dot + 1 : name, "float8_e4m3fn") == 0)
            return RD_F8E4M3;
        return -1;
    }
    }
}

int
rd_arg_array(PyObject *obj, const char *name, int ndim, int type_num, int flags,
             rd_arg_t *out)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "'%s' must be a numpy.ndarray, got %s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyArrayObject *arr = (PyArrayObject *)obj;
    int nd = PyArray_NDIM(arr);
    if (ndim >= 0 && nd != ndim) {
        PyErr_Format(PyExc_ValueError, "'%s' must be %d-D, got %d-D", name, ndim, nd);
        return -1;
    }
    int t = PyArray_TYPE(arr), storage = rd_storage_dtype(PyArray_DESCR(arr));
    int ok = type_num == RD_ANY_STORAGE ? storage >= 0
             : type_num == RD_ANY_FLOAT ? storage == RD_F32 || storage == RD_F64
             : t == type_num;
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "'%s' has dtype %s, expected %s", name,
                     PyArray_DESCR(arr)->typeobj->tp_name,
                     type_num == RD_ANY_STORAGE ? "float16, bfloat16, float32, float64, int8 or float8_e4m3fn"
                     : type_num == RD_ANY_FLOAT ? "float32 or float64"
                     : type_num == NPY_INT64 ? "int64" : "another dtype");
        return -1;
    }
    if (!PyArray_ISALIGNED(arr) || !PyArray_ISNOTSWAPPED(arr)) {
        PyErr_Format(PyExc_ValueError, "'%s' must be aligned and in native byte order", name);
        return -1;
    }
    npy_intp item = PyArray_ITEMSIZE(arr);
    for (int d = 0; d < nd; d++) {
        if (PyArray_STRIDE(arr, d) % item != 0) {
            PyErr_Format(PyExc_ValueError,
                         "'%s' has a stride that is not a multiple of its itemsize", name);
            return -1;
        }
        out->dim[d] = (rd_int)PyArray_DIM(arr, d);
        out->stride[d] = (rd_int)(PyArray_STRIDE(arr, d) / item);
    }
    if ((flags & RD_AS_OUTPUT) && !PyArray_ISWRITEABLE(arr)) {
        PyErr_Format(PyExc_ValueError, "'%s' must be writeable", name);
        return -1;
    }
    if ((flags & RD_CONTIG) && !PyArray_IS_C_CONTIGUOUS(arr)) {
        PyErr_Format(PyExc_ValueError, "'%s' must be C-contiguous", name);
        return -1;
    }
    /* an empty array has no rows to read, whatever strides NumPy gave it */
    if ((flags & RD_ROWS) && nd == 2 && out->dim[0] > 0 && out->dim[1] > 1 && out->stride[1] != 1) {
        PyErr_Format(PyExc_ValueError, "'%s' must have contiguous rows", name);
        return -1;
    }
    out->arr = arr;
    out->type_num = t;
    out->dtype = storage;
    out->ndim = nd;
    out->data = PyArray_DATA(arr);
    return 0;
}

rd_ctype_t
rd_arg_ctype(const rd_arg_t *a)
{
    return a->dtype == RD_F64 ? RD_CT_F64 : RD_CT_F32;
}

/* An optional float argument (None: absent) of the given type and shape. */
int
rd_arg_optional(PyObject *obj, const char *name, int ndim, int type_num, const rd_int *shape,
                rd_arg_t *out, const void **data)
{
    *data = NULL;
    if (obj == Py_None)
        return 0;
    if (rd_arg_array(obj, name, ndim, type_num, RD_CONTIG, out) != 0)
        return -1;
    for (int d = 0; d < ndim; d++) {
        if (out->dim[d] != shape[d]) {
            PyErr_Format(PyExc_ValueError, "'%s' has %zd entries on axis %d, expected %zd", name,
                         (Py_ssize_t)out->dim[d], d, (Py_ssize_t)shape[d]);
            return -1;
        }
    }
    *data = out->data;
    return 0;
}

int
rd_arg_indices(const rd_arg_t *idx, const char *name, long long lo, long long hi)
{
    const npy_int64 *v = (const npy_int64 *)idx->data;
    npy_intp n = PyArray_SIZE(idx->arr);
    for (npy_intp i = 0; i < n; i++) {
        if (v[i] < lo || v[i] >= hi) {
            PyErr_Format(PyExc_ValueError, "'%s' holds index %lld outside [%lld, %lld)", name,
                         (long long)v[i], lo, hi);
            return -1;
        }
    }
    return 0;
}

int
rd_arg_row_scale(PyObject *obj, const char *name, const rd_arg_t *x, rd_int m, const void **data)
{
    *data = NULL;
    if (obj == Py_None)
        return 0;
    if (x->dtype != RD_F32 && x->dtype != RD_F64) {
        PyErr_Format(PyExc_TypeError, "'%s' scales float32 or float64 rows, not 16-bit ones", name);
        return -1;
    }
    rd_arg_t sc;
    const rd_int shape[1] = {m};
    return rd_arg_optional(obj, name, 1, x->dtype == RD_F64 ? NPY_FLOAT64 : NPY_FLOAT32, shape, &sc, data);
}

/* ---------------------------------------------------------------- module */

static PyMethodDef rd_no_methods[] = {{NULL, NULL, 0, NULL}};

static struct PyModuleDef rd_module = {
    PyModuleDef_HEAD_INIT, "_core",
    "raggeddot's compiled kernels: grouped GEMMs, tile metadata, MoE pieces, runtime.", -1,
    rd_no_methods, NULL, NULL, NULL, NULL,
};

/* Add a dict {name: value} of C enum values as attribute `attr`. */
static int
rd_add_enum(PyObject *m, const char *attr, const char *const *names, const int *values, int count)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return -1;
    for (int i = 0; i < count; i++) {
        PyObject *v = PyLong_FromLong(values[i]);
        if (v == NULL || PyDict_SetItemString(d, names[i], v) != 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return -1;
        }
        Py_DECREF(v);
    }
    if (PyModule_AddObject(m, attr, d) != 0) {
        Py_DECREF(d);
        return -1;
    }
    return 0;
}

/* {compute dtype: (storage dtypes its packing reads for both operands)}, from
 * the packing table, so that the Python side never restates it. */
static int
rd_add_packing_reads(PyObject *m)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return -1;
    for (int ct = 0; ct < RD_CT_COUNT; ct++) {
        PyObject *names = PyList_New(0);
        int rc = names == NULL ? -1 : 0;
        for (int dt = 0; rc == 0 && dt < RD_DTYPE_COUNT; dt++) {
            if (rd_packer((rd_ctype_t)ct, (rd_dtype_t)dt, 0) == NULL ||
                rd_packer((rd_ctype_t)ct, (rd_dtype_t)dt, 1) == NULL)
                continue;
            PyObject *s = PyUnicode_FromString(rd_dtype_names[dt]);
            rc = s == NULL || PyList_Append(names, s) != 0 ? -1 : 0;
            Py_XDECREF(s);
        }
        PyObject *t = rc == 0 ? PyList_AsTuple(names) : NULL;
        Py_XDECREF(names);
        if (t == NULL || PyDict_SetItemString(d, rd_ctypes[ct].name, t) != 0) {
            Py_XDECREF(t);
            Py_DECREF(d);
            return -1;
        }
        Py_DECREF(t);
    }
    if (PyModule_AddObject(m, "PACKING_READS", d) != 0) {
        Py_DECREF(d);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__core(void)
{
    import_array();
    PyObject *m = PyModule_Create(&rd_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddFunctions(m, rd_matmul_methods) != 0 ||
        PyModule_AddFunctions(m, rd_moe_methods) != 0 ||
        PyModule_AddFunctions(m, rd_runtime_methods) != 0 ||
        PyModule_AddFunctions(m, rd_plan_methods) != 0 ||
        PyModule_AddFunctions(m, rd_gated_methods) != 0 ||
        PyModule_AddFunctions(m, rd_prepack_methods) != 0)
        goto error;
    static const char *const act_names[] = {"silu", "gelu", "gelu_tanh", "relu", "swiglu_oai"};
    static const int act_values[] = {RD_ACT_SILU, RD_ACT_GELU, RD_ACT_GELU_TANH, RD_ACT_RELU,
                                     RD_ACT_SWIGLU_OAI};
    static const char *const score_names[] = {"softmax", "sigmoid"};
    static const int score_values[] = {RD_SCORE_SOFTMAX, RD_SCORE_SIGMOID};
    if (rd_add_enum(m, "ACTIVATIONS", act_names, act_values, 5) != 0 ||
        rd_add_enum(m, "SCORE_FUNCS", score_names, score_values, 2) != 0 ||
        rd_add_packing_reads(m) != 0 || rd_add_capi(m) != 0)
        goto error;
    return m;
error:
    Py_DECREF(m);
    return NULL;
}
