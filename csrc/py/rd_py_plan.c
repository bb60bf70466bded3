/*
 * The binding of the plan table (frame/rd_plan.c): shape classes as tuples
 * (op, ctype, family, k, n, g, bucket, threads) and plans as dicts
 * {kernel, mc, kc, nc, tm, tn, threads, split, team} (with mr, nr read back:
 * a tile type's, also for its kernel 'vector'), for
 * raggeddot.tune and its cache file.
 */
#include "rd_py.h"

#include <string.h>

static const char *const rd_op_names[] = {"rows", "contract"};
static const char *const rd_kind_names[] = {"main", "stream", "vector"};
static const char *const rd_split_names[] = {"m", "n"};

/* Index of `s` in names[0..count), or -1. */
static int
rd_name_index(const char *s, const char *const *names, int count)
{
    for (int i = 0; i < count; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

/* The kernel of class c's family for its compute type (with the set
 * blocking when that family serves the type now) and the family's
 * streaming kernel (NULL: none). */
static void
rd_class_kernels(const rd_pclass_t *c, const rd_ukr_desc_t **k, const rd_sukr_desc_t **s)
{
    const rd_family_t *f = rd_family_named(c->family);
    const char *serving;
    const rd_ukr_desc_t *active = rd_active_kernel(c->ct, &serving);
    *k = strcmp(serving, f->name) == 0 ? active : &f->types[c->ct];
    *s = f->stream[c->ct].ukr != NULL ? &f->stream[c->ct] : NULL;
}

/* The class, its family's kernel for the class's compute type and that
 * family's streaming kernel; -1 with an exception naming what is wrong. */
static int
rd_parse_class(PyObject *obj, rd_pclass_t *c, const rd_ukr_desc_t **k, const rd_sukr_desc_t **s)
{
    const char *op, *ct, *family;
    Py_ssize_t kk, n, g;
    int bucket, threads;
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 8) {
        PyErr_Format(PyExc_TypeError, "'cls' must be a tuple (op, ctype, family, k, n, g, bucket, threads), "
                     "got %R", obj);
        return -1;
    }
    if (!PyArg_ParseTuple(obj, "sssnnnii", &op, &ct, &family, &kk, &n, &g, &bucket, &threads))
        return -1;
    memset(c, 0, sizeof *c);
    c->mode = rd_name_index(op, rd_op_names, 2);
    if (c->mode < 0) {
        PyErr_Format(PyExc_ValueError, "the class's op must be 'rows' or 'contract', got '%s'", op);
        return -1;
    }
    int t = 0;
    while (t < RD_CT_COUNT && strcmp(rd_ctypes[t].name, ct) != 0)
        t++;
    if (t == RD_CT_COUNT) {
        PyErr_Format(PyExc_ValueError, "the class's ctype '%s' is not a compute type", ct);
        return -1;
    }
    c->ct = (rd_ctype_t)t;
    const rd_family_t *f = rd_family_named(family);
    if (f == NULL || f->types[t].ukr == NULL) {
        PyErr_Format(PyExc_ValueError, "the class's family '%s' is not a kernel family with a "
                     "'%s' kernel", family, ct);
        return -1;
    }
    if (kk < 0 || n < 0 || g < 0 || bucket < 0 || threads < 1) {
        PyErr_Format(PyExc_ValueError, "the class's k, n, g, bucket must be >= 0 and threads >= 1, "
                     "got %R", obj);
        return -1;
    }
    c->family = f->name;
    c->k = kk;
    c->n = n;
    c->g = g;
    c->bucket = bucket;
    c->threads = threads;
    rd_class_kernels(c, k, s);
    return 0;
}

static PyObject *
rd_class_tuple(const rd_pclass_t *c)
{
    return Py_BuildValue("(sssnnnii)", rd_op_names[c->mode], rd_ctypes[c->ct].name, c->family,
                         (Py_ssize_t)c->k, (Py_ssize_t)c->n, (Py_ssize_t)c->g, c->bucket, c->threads);
}

/* The dict of a choice, its zeros (the kernel's blocking) filled in. */
static PyObject *
rd_choice_dict(const rd_pchoice_t *ch, const rd_ukr_desc_t *k, const rd_sukr_desc_t *s)
{
    const int streams = ch->kind == RD_KIND_STREAM && s != NULL;
    return Py_BuildValue("{s:s,s:n,s:n,s:n,s:n,s:n,s:i,s:s,s:i,s:i,s:i}",
                         "kernel", rd_kind_names[ch->kind],
                         "mc", (Py_ssize_t)(ch->mc > 0 ? ch->mc : k->mc),
                         "kc", (Py_ssize_t)(ch->kc > 0 ? ch->kc : k->kc),
                         "nc", (Py_ssize_t)(ch->nc > 0 ? ch->nc : k->nc),
                         "tm", (Py_ssize_t)ch->tm, "tn", (Py_ssize_t)ch->tn,
                         "threads", ch->threads, "split", rd_split_names[ch->split], "team", ch->team,
                         "mr", streams ? s->mr : k->mr, "nr", streams ? s->nr : k->nr);
}

/* A plan dict over the default choice d; -1 with an exception naming the
 * bad key or value. */
static int
rd_parse_choice(PyObject *obj, const rd_ukr_desc_t *k, const rd_sukr_desc_t *s, int tile, rd_pchoice_t *d)
{
    if (!PyDict_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "'plan' must be a dict or None, got %R", obj);
        return -1;
    }
    PyObject *key, *val;
    Py_ssize_t pos = 0;
    long long given[2] = {-1, -1};
    while (PyDict_Next(obj, &pos, &key, &val)) {
        const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (name == NULL) {
            PyErr_Format(PyExc_TypeError, "a plan's keys are strings, got %R", key);
            return -1;
        }
        if (!strcmp(name, "kernel") || !strcmp(name, "split")) {
            const int kind = !strcmp(name, "kernel");
            const char *word = PyUnicode_Check(val) ? PyUnicode_AsUTF8(val) : NULL;
            const int i = word == NULL ? -1 : rd_name_index(word, kind ? rd_kind_names : rd_split_names,
                                                            kind ? 3 : 2);
            if (i < 0 || (kind && i == RD_KIND_STREAM && s == NULL) || (kind && i == RD_KIND_VECTOR && !tile)) {
                PyErr_Format(PyExc_ValueError, "plan['%s'] must be %s, got %R", name,
                             kind ? (tile ? "'main' or 'vector'" : s ? "'main' or 'stream'"
                                                                    : "'main' (no streaming kernel here)")
                                  : "'m' or 'n'", val);
                return -1;
            }
            *(kind ? &d->kind : &d->split) = i;
            continue;
        }
        long long v = PyLong_Check(val) && !PyBool_Check(val) ? PyLong_AsLongLong(val) : -1;
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (!strcmp(name, "mr") || !strcmp(name, "nr")) {
            given[name[0] == 'n'] = v;   /* read back: checked against the kernel below */
            continue;
        }
        rd_int *slot = !strcmp(name, "mc") ? &d->mc : !strcmp(name, "kc") ? &d->kc
                       : !strcmp(name, "nc") ? &d->nc : !strcmp(name, "tm") ? &d->tm
                       : !strcmp(name, "tn") ? &d->tn : NULL;
        const int blocking = slot == &d->mc || slot == &d->kc || slot == &d->nc;
        if (!strcmp(name, "team")) {
            if (v != 0 && v != 1) {
                PyErr_Format(PyExc_ValueError, "plan['team'] must be 0 or 1, got %R", val);
                return -1;
            }
            d->team = (int)v;
            continue;
        }
        if (slot == NULL && strcmp(name, "threads") != 0) {
            PyErr_Format(PyExc_ValueError, "unknown plan key '%s' (kernel, mc, kc, nc, tm, tn, threads, "
                         "split, team)", name);
            return -1;
        }
        if (v < (blocking ? 1 : 0) || v > (1LL << 24)) {
            PyErr_Format(PyExc_ValueError, "plan['%s'] must be an int in [%d, 2**24], got %R", name,
                         blocking ? 1 : 0, val);
            return -1;
        }
        if (slot != NULL)
            *slot = (rd_int)v;
        else
            d->threads = (int)v;
    }
    const int streams = d->kind == RD_KIND_STREAM;
    const int block[2] = {streams ? s->mr : k->mr, streams ? s->nr : k->nr};
    for (int i = 0; i < 2; i++)
        if (given[i] != -1 && given[i] != block[i]) {
            PyErr_Format(PyExc_ValueError, "plan['%s'] is the kernel's register block, %d, got %lld",
                         i ? "nr" : "mr", block[i], given[i]);
            return -1;
        }
    return 0;
}

static PyObject *
rd_py_plan_record(PyObject *self, PyObject *args)
{
    (void)self;
    int on;
    if (!PyArg_ParseTuple(args, "p", &on))
        return NULL;
    rd_pclass_t log[RD_PLAN_LOG];
    int n = on ? 0 : rd_plan_recorded(log, RD_PLAN_LOG);
    rd_plan_record(on);
    PyObject *list = PyList_New(n);
    for (int i = 0; list != NULL && i < n; i++) {
        PyObject *t = rd_class_tuple(&log[i]);
        if (t == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

/* plan_default(cls) / plan_candidates(cls) / plan_get(cls) */
static PyObject *
rd_py_plan_query(PyObject *args, int what)
{
    PyObject *ocls;
    rd_pclass_t c;
    const rd_ukr_desc_t *k;
    const rd_sukr_desc_t *s;
    if (!PyArg_ParseTuple(args, "O", &ocls) || rd_parse_class(ocls, &c, &k, &s) != 0)
        return NULL;
    rd_pchoice_t ch[16];
    int n = 1;
    if (what == 0)
        rd_plan_default(&c, k, s, ch);
    else if (what == 1)
        n = rd_plan_candidates(&c, k, s, ch, 16);
    else if (!rd_plan_get(&c, ch))
        Py_RETURN_NONE;
    if (what != 1)
        return rd_choice_dict(ch, k, s);
    PyObject *list = PyList_New(n);
    for (int i = 0; list != NULL && i < n; i++) {
        PyObject *d = rd_choice_dict(&ch[i], k, s);
        if (d == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, d);
    }
    return list;
}

static PyObject *
rd_py_plan_default(PyObject *self, PyObject *args)
{
    (void)self;
    return rd_py_plan_query(args, 0);
}

static PyObject *
rd_py_plan_candidates(PyObject *self, PyObject *args)
{
    (void)self;
    return rd_py_plan_query(args, 1);
}

static PyObject *
rd_py_plan_get(PyObject *self, PyObject *args)
{
    (void)self;
    return rd_py_plan_query(args, 2);
}

static PyObject *
rd_py_plan_set(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *ocls, *oplan;
    rd_pclass_t c;
    const rd_ukr_desc_t *k;
    const rd_sukr_desc_t *s;
    if (!PyArg_ParseTuple(args, "OO", &ocls, &oplan) || rd_parse_class(ocls, &c, &k, &s) != 0)
        return NULL;
    if (oplan == Py_None) {
        rd_plan_set(&c, NULL);
        Py_RETURN_NONE;
    }
    rd_pchoice_t ch;
    rd_plan_default(&c, k, s, &ch);
    if (rd_parse_choice(oplan, k, s, rd_ctype_layout(c.ct) != (int)c.ct, &ch) != 0)
        return NULL;
    if (rd_plan_set(&c, &ch) != 0) {
        PyErr_SetString(PyExc_ValueError, "the plan table is full (plan_clear() empties it)");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
rd_py_plan_table(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    PyObject *list = PyList_New(0);
    rd_pclass_t c;
    rd_pchoice_t ch;
    for (int i = 0; list != NULL && rd_plan_entry(i, &c, &ch); i++) {
        const rd_ukr_desc_t *k;
        const rd_sukr_desc_t *s;
        rd_class_kernels(&c, &k, &s);
        PyObject *item = Py_BuildValue("(NN)", rd_class_tuple(&c), rd_choice_dict(&ch, k, s));
        if (item == NULL || PyList_Append(list, item) != 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

static PyObject *
rd_py_plan_clear(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    rd_plan_clear();
    Py_RETURN_NONE;
}

PyMethodDef rd_plan_methods[] = {
    {"plan_record", rd_py_plan_record, METH_VARARGS,
     "plan_record(on) -> list: start (True; returns []) or stop (False) recording the shape "
     "classes of the grouped products run; stopping returns them, first seen first."},
    {"plan_set", rd_py_plan_set, METH_VARARGS,
     "plan_set(cls, plan): the plan (a dict; missing keys keep the default's) every call of "
     "class cls uses from now on; None removes the entry."},
    {"plan_get", rd_py_plan_get, METH_VARARGS, "plan_get(cls) -> dict or None: the table's entry."},
    {"plan_default", rd_py_plan_default, METH_VARARGS,
     "plan_default(cls) -> dict: the plan the built-in cost model gives the class."},
    {"plan_candidates", rd_py_plan_candidates, METH_VARARGS,
     "plan_candidates(cls) -> list of dicts: plans worth timing for the class, the default first."},
    {"plan_table", rd_py_plan_table, METH_NOARGS, "plan_table() -> list of (cls, plan)."},
    {"plan_clear", rd_py_plan_clear, METH_NOARGS, "plan_clear(): empty the table."},
    {NULL, NULL, 0, NULL},
};
