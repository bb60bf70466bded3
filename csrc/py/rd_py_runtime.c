/*
 * Binding of the runtime: threads, kernel selection and blocking, the
 * streaming threshold, the result-buffer cache and its allocator, what the
 * build holds, and the peak probes of the benchmarks.
 */
#include "py/rd_py.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

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

/* Bytes of the machine's physical memory, 0 when the system does not say.
 * Read once (glibc's sysconf(_SC_PHYS_PAGES) is a system call, and a decode
 * step asks for a dozen buffers); called with the GIL held. */
static unsigned long long
rd_physical_memory(void)
{
    static int known = 0;
    static unsigned long long bytes = 0;
    if (known)
        return bytes;
    known = 1;
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && size > 0)
        bytes = (unsigned long long)pages * (unsigned long long)size;
#endif
    return bytes;
}

/* MemoryError "cannot allocate <bytes> for an array of shape (...) and
 * dtype <name>", as NumPy words it (bytes < 0: more than an address space
 * holds; limit > 0: more than the machine's memory, refused before the
 * allocation, which an overcommitting system would grant and end the
 * process when its pages are touched). Returns NULL. */
static PyObject *
rd_empty_no_memory(const PyArray_Dims *dims, const char *dtype, long long bytes, unsigned long long limit)
{
    PyObject *shape = PyTuple_New(dims->len);
    if (shape == NULL)
        return NULL;
    for (int d = 0; d < dims->len; d++) {
        PyObject *n = PyLong_FromSsize_t((Py_ssize_t)dims->ptr[d]);
        if (n == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, d, n);
    }
    if (bytes < 0)
        PyErr_Format(PyExc_MemoryError, "cannot allocate an array of shape %R and dtype %s: it needs "
                     "more bytes than memory can hold", shape, dtype);
    else if (limit > 0)
        PyErr_Format(PyExc_MemoryError, "cannot allocate %lld bytes (%lld MiB) for an array of shape %R "
                     "and dtype %s: more than this machine's memory (%llu bytes)", bytes, bytes >> 20, shape,
                     dtype, limit);
    else
        PyErr_Format(PyExc_MemoryError, "cannot allocate %lld bytes (%lld MiB) for an array of shape %R "
                     "and dtype %s", bytes, bytes >> 20, shape, dtype);
    Py_DECREF(shape);
    return NULL;
}

/* A new C-contiguous array of descr (a float storage dtype: float32,
 * float64, float16 or bfloat16, native order; the reference is stolen)
 * whose memory comes from, and goes back to, the cache of result buffers;
 * NULL with an exception (MemoryError naming the shape and dtype). */
PyObject *
rd_pool_array(PyArray_Descr *descr, int nd, const npy_intp *shape)
{
    const int storage = rd_storage_dtype(descr);
    if ((storage != RD_F32 && storage != RD_F64 && storage != RD_F16 && storage != RD_BF16)
        || !PyArray_ISNBO(descr->byteorder)) {
        /* an uninitialised array of any other dtype could hold garbage
         * object pointers or need NumPy's own allocation (every bit
         * pattern of these is a float) */
        PyErr_SetString(PyExc_TypeError, "empty: dtype must be native float32, float64, float16 or bfloat16");
        Py_DECREF(descr);
        return NULL;
    }
    const PyArray_Dims dims = {(npy_intp *)shape, nd};
    size_t bytes = rd_dtype_size[storage];
    int too_large = 0;
    for (int d = 0; d < nd; d++) {
        if (shape[d] < 0) {
            PyErr_Format(PyExc_ValueError, "empty: negative dimension %zd in the shape", (Py_ssize_t)shape[d]);
            Py_DECREF(descr);
            return NULL;
        }
        if (shape[d] > 0 && bytes > ((size_t)PY_SSIZE_T_MAX) / (size_t)shape[d])
            too_large = 1;   /* keep checking the other dimensions' signs */
        else
            bytes *= (size_t)shape[d];
    }
    const char *dtype_name = rd_dtype_names[storage];
    if (too_large) {
        /* more bytes than an address space holds: a result that cannot be
         * allocated, as for any too-large allocation */
        rd_empty_no_memory(&dims, dtype_name, -1, 0);
        Py_DECREF(descr);
        return NULL;
    }
    const unsigned long long limit = rd_physical_memory();
    if (limit > 0 && (unsigned long long)bytes > limit) {
        rd_empty_no_memory(&dims, dtype_name, (long long)bytes, limit);
        Py_DECREF(descr);
        return NULL;
    }
    size_t got = 0;
    void *p = rd_buffer_take(bytes, &got);
    if (p == NULL) {
        rd_empty_no_memory(&dims, dtype_name, (long long)bytes, 0);
        Py_DECREF(descr);
        return NULL;
    }
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, nd, (npy_intp *)shape, NULL, p,
                                         NPY_ARRAY_CARRAY, NULL);  /* steals descr */
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
rd_py_empty(PyObject *self, PyObject *args)
{
    PyObject *oshape;
    PyArray_Descr *descr = NULL;
    PyArray_Dims dims = {NULL, 0};
    (void)self;
    if (!PyArg_ParseTuple(args, "OO&", &oshape, PyArray_DescrConverter, &descr))
        return NULL;
    if (!PyArray_IntpConverter(oshape, &dims)) {
        Py_DECREF(descr);
        return NULL;
    }
    PyObject *arr = rd_pool_array(descr, dims.len, dims.ptr);
    PyDimMem_FREE(dims.ptr);
    return arr;
}

/* The integer `arg` of `fn`'s argument `name` as a Py_ssize_t in [lo, hi];
 * -1 with a ValueError naming both (or the TypeError of a non-integer). */
static int
rd_int_in(PyObject *arg, const char *fn, const char *name, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t *out)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (v == -1 && !overflow && PyErr_Occurred())
        return -1;
    if (overflow || v < (long long)lo || v > (long long)hi) {
        PyErr_Format(PyExc_ValueError, "%s: '%s' must be in [%zd, %zd], got %R", fn, name, lo, hi, arg);
        return -1;
    }
    *out = (Py_ssize_t)v;
    return 0;
}

static PyObject *
rd_py_set_buffer_cache(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t bytes;
    if (rd_int_in(arg, "set_buffer_cache", "nbytes", 0, PY_SSIZE_T_MAX, &bytes) != 0)
        return NULL;
    return PyLong_FromSize_t(rd_buffer_cache_limit((size_t)bytes));
}

/* ------------------------------------------------------ configuration */

static PyObject *
rd_py_set_num_threads(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t n;
    if (rd_int_in(arg, "set_num_threads", "n", 1, 4096, &n) != 0)
        return NULL;
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
    PyObject *previous = PyUnicode_FromString(rd_get_kernel());
    if (previous == NULL)
        return NULL;
    int rc = rd_set_kernel(name);
    if (rc == -1)
        PyErr_Format(PyExc_ValueError, "unknown kernel %R (compiled: see build_info()['simd'], or 'auto')", arg);
    else if (rc == -2)
        PyErr_Format(PyExc_RuntimeError, "this CPU cannot run the %R kernel", arg);
    if (rc != 0) {
        Py_DECREF(previous);
        return NULL;
    }
    return previous;
}

static PyObject *
rd_py_get_kernel(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(rd_get_kernel());
}

/* The compute type named `name` ("float32", "float64"), or -1. */
static int
rd_ctype_named(const char *name)
{
    for (int ct = 0; ct < RD_CT_COUNT; ct++)
        if (strcmp(rd_ctypes[ct].name, name) == 0)
            return ct;
    return -1;
}

/* kernel_for(ctype) -> the family serving compute type `ctype` now, or
 * "none" (a dot-product type no family here serves). */
static PyObject *
rd_py_kernel_for(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    int ct = rd_ctype_named(name);
    if (ct < 0) {
        PyErr_Format(PyExc_ValueError, "unknown compute type %R", arg);
        return NULL;
    }
    return PyUnicode_FromString(rd_kernel_for((rd_ctype_t)ct));
}

/* selection_generation() -> a number that changes whenever set_kernel or
 * set_blocking changes what serves the products. */
static PyObject *
rd_py_selection_generation(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromUnsignedLong(rd_selection_generation());
}

static PyObject *
rd_py_set_blocking(PyObject *self, PyObject *args)
{
    const char *dtype;
    Py_ssize_t mc, kc, nc;
    (void)self;
    if (!PyArg_ParseTuple(args, "snnn", &dtype, &mc, &kc, &nc))
        return NULL;
    int ct = rd_ctype_named(dtype);
    if (ct < 0 || rd_set_blocking((rd_ctype_t)ct, mc, kc, nc) != 0) {
        PyErr_Format(PyExc_ValueError,
                     "set_blocking(dtype in {'float32', 'float64'}, mc, kc, nc >= 1), got '%s', %zd, %zd, %zd",
                     dtype, mc, kc, nc);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
rd_py_set_stream_threshold(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t bytes;
    if (rd_int_in(arg, "set_stream_threshold", "nbytes", PY_SSIZE_T_MIN, PY_SSIZE_T_MAX, &bytes) != 0)
        return NULL;
    rd_int previous = rd_get_stream_min_bytes();
    rd_set_stream_min_bytes(bytes < 0 ? -1 : bytes);
    return PyLong_FromSsize_t(previous);
}

/* ----------------------------------------------------------- build info */

/* [{name, runnable, types}] for every compiled family, in table order. */
static PyObject *
rd_py_kernel_table(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    for (const rd_family_t *const *f = rd_families; *f != NULL; f++) {
        PyObject *types = PyList_New(0), *row = NULL;
        if (types == NULL)
            goto error;
        for (int ct = 0; ct < RD_CT_COUNT; ct++) {
            if ((*f)->types[ct].ukr == NULL)
                continue;
            PyObject *s = PyUnicode_FromString(rd_ctypes[ct].name);
            if (s == NULL || PyList_Append(types, s) != 0) {
                Py_XDECREF(s);
                Py_DECREF(types);
                goto error;
            }
            Py_DECREF(s);
        }
        row = Py_BuildValue("{s:s,s:O,s:N}", "name", (*f)->name, "runnable",
                            (*f)->runnable() ? Py_True : Py_False, "types", types);
        if (row == NULL || PyList_Append(list, row) != 0) {
            Py_XDECREF(row);
            goto error;
        }
        Py_DECREF(row);
    }
    return list;
error:
    Py_DECREF(list);
    return NULL;
}

/* Why the build has no OpenMP ("" when it has): setup.py defines it. */
#ifndef RD_OPENMP_NOTE
#define RD_OPENMP_NOTE ""
#endif

/* The CPU features the kernels check, as {name: bool}. */
static PyObject *
rd_cpu_features(void)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    const char *names[16];
    int values[16];
    const int n = rd_cpu_list(names, values, 16);
    for (int i = 0; i < n; i++)
        if (PyDict_SetItemString(d, names[i], values[i] ? Py_True : Py_False) != 0) {
            Py_DECREF(d);
            return NULL;
        }
    return d;
}

static PyObject *
rd_py_build_info(PyObject *self, PyObject *unused)
{
    PyObject *kernels = NULL, *simd = NULL, *cpu = NULL, *blocking = NULL, *info = NULL;
    PyObject *products = NULL, *amx = NULL;
    (void)self;
    if ((kernels = rd_py_kernel_table(NULL, unused)) == NULL || (simd = PyList_New(0)) == NULL ||
        (cpu = rd_cpu_features()) == NULL || (blocking = PyDict_New()) == NULL)
        goto done;
    for (const rd_family_t *const *f = rd_families; *f != NULL; f++) {
        PyObject *s = PyUnicode_FromString((*f)->name);
        if (s == NULL || PyList_Append(simd, s) != 0) {
            Py_XDECREF(s);
            goto done;
        }
        Py_DECREF(s);
    }
    for (int ct = 0; ct < RD_CT_COUNT; ct++) {
        const char *family;
        const rd_ukr_desc_t *k = rd_active_kernel((rd_ctype_t)ct, &family);
        if (k->ukr == NULL)   /* a dot-product type no family here serves */
            continue;
        PyObject *b = Py_BuildValue("{s:s,s:i,s:i,s:n,s:n,s:n}", "kernel", family, "MR", k->mr,
                                    "NR", k->nr, "MC", (Py_ssize_t)k->mc, "KC", (Py_ssize_t)k->kc,
                                    "NC", (Py_ssize_t)k->nc);
        if (b == NULL || PyDict_SetItemString(blocking, rd_ctypes[ct].name, b) != 0) {
            Py_XDECREF(b);
            goto done;
        }
        Py_DECREF(b);
    }
    /* what serves each kind of product now, and what each precision gives */
    const char *amx_why = rd_amx_unavailable();
    const rd_ctype_t bf = rd_bf16_product(0), bfx = rd_bf16_product(1), i8 = rd_int8_product();
    products = Py_BuildValue("{s:{s:s,s:s},s:{s:s,s:s},s:{s:s,s:s}}",
                             "bfloat16", "compute", rd_ctypes[bf].name, "kernel", rd_kernel_for(bf),
                             "bfloat16_highest", "compute", rd_ctypes[bfx].name, "kernel", rd_kernel_for(bfx),
                             "int8", "compute", rd_ctypes[i8].name, "kernel", rd_kernel_for(i8));
    amx = Py_BuildValue("{s:O,s:s}", "runnable", amx_why == NULL ? Py_True : Py_False,
                        "why", amx_why == NULL ? "" : amx_why);
    if (products == NULL || amx == NULL || PyDict_SetItemString(cpu, "amx", amx_why == NULL ? Py_True : Py_False) != 0)
        goto done;
    info = Py_BuildValue("{s:O,s:s,s:O,s:O,s:O,s:s,s:s,s:O,s:O,s:O,s:i,s:O,s:n,s:{s:n,s:n},s:O,s:O,s:d}",
                         "openmp", rd_have_openmp() ? Py_True : Py_False,
                         "openmp_note", RD_OPENMP_NOTE,
                         "forked_single_threaded", rd_forked_single_threaded() ? Py_True : Py_False,
                         "kernels", kernels,
                         "simd", simd,
                         "kernel", rd_get_kernel(),
                         "kernel_selection", rd_kernel_selection(),
                         "cpu", cpu,
                         "cpu_avx2", PyDict_GetItemString(cpu, "avx2") == Py_True ? Py_True : Py_False,
                         "cpu_avx512", PyDict_GetItemString(cpu, "avx512f") == Py_True ? Py_True : Py_False,
                         "num_threads", rd_get_num_threads(),
                         "blocking", blocking,
                         "stream_threshold", (Py_ssize_t)rd_get_stream_min_bytes(),
                         "buffer_cache", "limit", (Py_ssize_t)rd_buffer_cache_limit(SIZE_MAX),
                         "idle", (Py_ssize_t)rd_buffer_cache_idle(),
                         "products", products,
                         "amx", amx,
                         "bf16dot_vs_fma", rd_bf16dot_measured());
done:
    Py_XDECREF(products);
    Py_XDECREF(amx);
    Py_XDECREF(kernels);
    Py_XDECREF(simd);
    Py_XDECREF(cpu);
    Py_XDECREF(blocking);
    return info;
}

/* ---------------------------------------------------------- peak probes */

PyDoc_STRVAR(fma_peak_doc,
"fma_peak(threads, seconds, isa='avx2') -> GFLOP/s\n\n"
"Sustained throughput of `threads` threads, each running independent chains\n"
"of one instruction for about `seconds`: isa='avx2' (256-bit float32 FMA),\n"
"'avx512' (512-bit float32 FMA), 'avx512_bf16', 'avx512_vnni', 'avx_vnni',\n"
"'amx_bf16', 'amx_int8', 'neon' (fmla), 'neon_bf16' (BFMMLA), 'neon_dot' (UDOT)\n"
"or 'neon_i8mm' (USMMLA).  0.0 when the CPU lacks that instruction set.");

static PyObject *
rd_py_fma_peak(PyObject *self, PyObject *args)
{
    int threads;
    double seconds;
    const char *isa = "avx2";
    (void)self;
    if (!PyArg_ParseTuple(args, "id|s", &threads, &seconds, &isa))
        return NULL;
    if (rd_peak_gflops(isa, 0.0) < 0.0) {
        PyErr_Format(PyExc_ValueError, "fma_peak: isa must be 'avx2', 'avx512', 'avx512_bf16', 'avx512_vnni', "
                     "'avx_vnni', 'amx_bf16', 'amx_int8', 'neon', 'neon_bf16', 'neon_dot' or 'neon_i8mm', "
                     "got '%s'", isa);
        return NULL;
    }
    if (threads < 1 || threads > 4096 || !(seconds > 0.0 && seconds <= 60.0)) {
        PyErr_SetString(PyExc_ValueError, "fma_peak needs 1 <= threads <= 4096 and 0 < seconds <= 60");
        return NULL;
    }
    double total = 0.0;
    threads = rd_team_size(threads);
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
#endif
    total += rd_peak_gflops(isa, seconds);
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(total);
}

PyDoc_STRVAR(read_bandwidth_doc,
"read_bandwidth(threads, megabytes, seconds) -> GB/s\n\n"
"Bytes per second that `threads` threads read together, each sweeping\n"
"`megabytes` of its own memory for about `seconds`.");

static PyObject *
rd_py_read_bandwidth(PyObject *self, PyObject *args)
{
    int threads;
    double megabytes, seconds;
    (void)self;
    if (!PyArg_ParseTuple(args, "idd", &threads, &megabytes, &seconds))
        return NULL;
    if (threads < 1 || threads > 4096 || !(megabytes >= 1.0 && megabytes <= 65536.0)
        || !(seconds > 0.0 && seconds <= 60.0)) {
        /* (PyErr_Format has no conversion for doubles) */
        char got[96];
        snprintf(got, sizeof got, "%d, %g, %g", threads, megabytes, seconds);
        PyErr_Format(PyExc_ValueError, "read_bandwidth needs 1 <= threads <= 4096, "
                     "1 <= megabytes <= 65536 and 0 < seconds <= 60, got %s", got);
        return NULL;
    }
    double total = 0.0;
    int failed = 0;
    size_t bytes = (size_t)(megabytes * 1048576.0);
    threads = rd_team_size(threads);
    Py_BEGIN_ALLOW_THREADS
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total) reduction(| : failed)
#endif
    {
        double gbps = rd_read_gbps(bytes, seconds);
        if (gbps < 0.0)
            failed = 1;
        else
            total += gbps;
    }
    Py_END_ALLOW_THREADS
    if (failed)
        return PyErr_NoMemory();
    return PyFloat_FromDouble(total);
}

PyDoc_STRVAR(narrow_doc,
"narrow(src, dst, portable=False)\n\n"
"dst[...] = src rounded to nearest even: src float32, dst float16 or\n"
"bfloat16 of the same shape, both C-contiguous (dst writeable).");

static PyObject *
rd_py_narrow(PyObject *self, PyObject *args)
{
    PyObject *osrc, *odst;
    int portable = 0;
    rd_arg_t src, dst;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO|p", &osrc, &odst, &portable))
        return NULL;
    if (rd_arg_array(osrc, "src", -1, NPY_FLOAT32, RD_CONTIG, &src) != 0 ||
        rd_arg_array(odst, "dst", -1, RD_ANY_STORAGE, RD_CONTIG | RD_AS_OUTPUT, &dst) != 0)
        return NULL;
    if ((dst.dtype != RD_F16 && dst.dtype != RD_BF16) || PyArray_SIZE(src.arr) != PyArray_SIZE(dst.arr)) {
        PyErr_SetString(PyExc_ValueError, "narrow: 'dst' must be float16 or bfloat16 with src's size");
        return NULL;
    }
    size_t n = (size_t)PyArray_SIZE(src.arr);
    Py_BEGIN_ALLOW_THREADS
    rd_narrow((const float *)src.data, dst.data, (rd_dtype_t)dst.dtype, n, portable);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* amx_twin_state() -> (threads holding a tile configuration now, tile
 * operations run without one): the emulated tiles' bookkeeping, (0, 0)
 * between calls when every thread released its tiles. */
static PyObject *
rd_py_amx_twin_state(PyObject *self, PyObject *unused)
{
    int held;
    long strays;
    (void)self;
    (void)unused;
    rd_amx_twin_state(&held, &strays);
    return Py_BuildValue("(il)", held, strays);
}

PyMethodDef rd_runtime_methods[] = {
    {"amx_twin_state", rd_py_amx_twin_state, METH_NOARGS,
     "amx_twin_state() -> (threads holding emulated tiles now, tile operations run without a configuration)"},
    {"set_num_threads", rd_py_set_num_threads, METH_O, "set_num_threads(n)"},
    {"get_num_threads", rd_py_get_num_threads, METH_NOARGS, "get_num_threads() -> int"},
    {"set_kernel", rd_py_set_kernel, METH_O,
     "set_kernel(name) -> previous name; name in build_info()['simd'] or 'auto'"},
    {"get_kernel", rd_py_get_kernel, METH_NOARGS, "get_kernel() -> name of the kernel in use"},
    {"selection_generation", rd_py_selection_generation, METH_NOARGS,
     "selection_generation() -> a number that changes whenever set_kernel or set_blocking does"},
    {"kernel_for", rd_py_kernel_for, METH_O,
     "kernel_for(ctype) -> the family serving that compute type now, or 'none'"},
    {"kernel_table", rd_py_kernel_table, METH_NOARGS,
     "kernel_table() -> [{'name', 'runnable', 'types'}] of the compiled families, most preferred first"},
    {"set_blocking", rd_py_set_blocking, METH_VARARGS,
     "set_blocking(dtype, mc, kc, nc): cache blocking of the kernel in force (for tuning);"
     " set_kernel(name) restores the defaults of that kernel"},
    {"empty", rd_py_empty, METH_VARARGS, empty_doc},
    {"set_buffer_cache", rd_py_set_buffer_cache, METH_O,
     "set_buffer_cache(nbytes) -> previous limit on the idle result buffers kept for reuse (0: keep none)"},
    {"set_stream_threshold", rd_py_set_stream_threshold, METH_O,
     "set_stream_threshold(nbytes) -> previous: outputs of at least nbytes that a call writes once"
     " get non-temporal stores (negative: never)"},
    {"build_info", rd_py_build_info, METH_NOARGS, "build_info() -> dict"},
    {"fma_peak", rd_py_fma_peak, METH_VARARGS, fma_peak_doc},
    {"read_bandwidth", rd_py_read_bandwidth, METH_VARARGS, read_bandwidth_doc},
    {"narrow", rd_py_narrow, METH_VARARGS, narrow_doc},
    {NULL, NULL, 0, NULL},
};
