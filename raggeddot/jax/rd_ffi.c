/*
 * XLA FFI handlers of raggeddot.jax: the custom calls "raggeddot_ragged_rows"
 * and "raggeddot_ragged_contract" on the CPU, written against XLA's C API
 * (xla/ffi/api/c_api.h of the installed jaxlib).  raggeddot.jax compiles
 * this file on first use and binds it to raggeddot._core's drivers through
 * the table of rd_capi.h (rd_ffi_bind); the handlers only check, slice the
 * batch and compute the group bounds.
 *
 * Operands (row-major, as jax passes them; B the batch of the output, every
 * operand's leading dimension 1 (shared) or B):
 *
 *   ragged_rows:     lhs [B, m, k] ([B, k, m] with transpose_lhs),
 *                    rhs [B, g, k, n] ([B, g, n, k] with transpose_rhs),
 *                    group_sizes [B, G] (int32 / int64), group_offset [B] (int32 / int64)
 *                 -> out [B, m, n]:  out[b, r] = lhs[b, r] @ rhs[b, i - o_b] for
 *                    the rows r of groups i in [o_b, o_b + g), 0 elsewhere.
 *   ragged_contract: lhs [B, k, m] ([B, m, k] with transpose_lhs),
 *                    rhs [B, m, n] ([B, n, m] with transpose_rhs),
 *                    group_sizes, group_offset as above
 *                 -> out [B, g, k, n]:  out[b, j] = lhs[b][:, rows] @ rhs[b][rows, :]
 *                    over the rows of group o_b + j (zeros for an empty group).
 *
 * The output dtype picks the arithmetic: float64 for a float64 output,
 * float32 otherwise (a float16 / bfloat16 output is rounded once per tile).
 * Group sizes and offsets are checked when the call runs: a negative size,
 * sizes summing past m or an offset out of range is an FFI error naming
 * them.  Nothing here aborts; every error goes back to XLA.
 */
#include "xla/ffi/api/c_api.h"
#include "rd_capi.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const rd_capi_t *rd_api = NULL;

/* Bind the handlers to _core's table; 0, or -1 when it is of another version. */
int
rd_ffi_bind(const void *table)
{
    const rd_capi_t *t = (const rd_capi_t *)table;
    if (t == NULL || t->version != RD_CAPI_VERSION || t->size < sizeof(rd_capi_t))
        return -1;
    rd_api = t;
    return 0;
}

/* Threads a call started now would run (raggeddot's setting, read through
 * _core), or -1 when unbound. */
int
rd_ffi_num_threads(void)
{
    return rd_api != NULL ? rd_api->num_threads() : -1;
}

static XLA_FFI_Error *
rd_error(const XLA_FFI_CallFrame *cf, XLA_FFI_Error_Code code, const char *msg)
{
    XLA_FFI_Error_Create_Args e;
    memset(&e, 0, sizeof e);
    e.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    e.message = msg;
    e.errc = code;
    return cf->api->XLA_FFI_Error_Create(&e);
}

/* The leading fields of every extension chained from a call frame's
 * extension_start, in every version of c_api.h: the struct's size, its
 * type (an enum, int-sized) and the next one.  The header has renamed the
 * struct that declares them (XLA_FFI_Extension_Base up to jaxlib 0.10;
 * jaxlib 0.11's calls it XLA_FFI_InternalExtension, and XLA_FFI_Extension
 * is another struct there), so the chain is read through this mirror of
 * those fields and the handlers name neither: they compile against both. */
typedef struct rd_ffi_ext {
    size_t struct_size;
    int type;
    struct rd_ffi_ext *next;
} rd_ffi_ext;

/* The metadata extension is that header followed by the metadata to fill:
 * the header's own XLA_FFI_Metadata_Extension must hold the mirror first. */
_Static_assert(offsetof(XLA_FFI_Metadata_Extension, metadata) >= sizeof(rd_ffi_ext),
               "XLA_FFI_Metadata_Extension starts with the extension header");
_Static_assert(sizeof(XLA_FFI_Extension_Metadata) == sizeof(int), "extension types are int-sized");

/* The metadata call (XLA asks every handler for its API version), or NULL. */
static XLA_FFI_Error *
rd_metadata(XLA_FFI_CallFrame *cf, int *handled)
{
    *handled = 0;
    rd_ffi_ext *ext = (rd_ffi_ext *)(void *)cf->extension_start;
    while (ext != NULL && ext->type != (int)XLA_FFI_Extension_Metadata)
        ext = ext->next;
    if (ext == NULL)
        return NULL;
    XLA_FFI_Metadata_Extension *me = (XLA_FFI_Metadata_Extension *)(void *)ext;
    me->metadata->api_version.major_version = XLA_FFI_API_MAJOR;
    me->metadata->api_version.minor_version = XLA_FFI_API_MINOR;
    me->metadata->traits = 0;
    *handled = 1;
    return NULL;
}

/* An integer attribute `name` (any integer scalar), or `dflt` when absent. */
static int
rd_attr_int(const XLA_FFI_CallFrame *cf, const char *name, long long dflt, long long *out)
{
    size_t len = strlen(name);
    *out = dflt;
    for (int64_t i = 0; i < cf->attrs.size; i++) {
        const XLA_FFI_ByteSpan *s = cf->attrs.names[i];
        if (s->len != len || memcmp(s->ptr, name, len) != 0)
            continue;
        if (cf->attrs.types[i] != XLA_FFI_AttrType_SCALAR)
            return -1;
        const XLA_FFI_Scalar *sc = (const XLA_FFI_Scalar *)cf->attrs.attrs[i];
        switch (sc->dtype) {
        case XLA_FFI_DataType_PRED: case XLA_FFI_DataType_S8: *out = *(const int8_t *)sc->value; return 0;
        case XLA_FFI_DataType_S32: *out = *(const int32_t *)sc->value; return 0;
        case XLA_FFI_DataType_S64: *out = *(const int64_t *)sc->value; return 0;
        default: return -1;
        }
    }
    return 0;
}

/* The storage dtype of a float buffer, or -1. */
static int
rd_float_dtype(XLA_FFI_DataType t)
{
    switch (t) {
    case XLA_FFI_DataType_F32: return RD_CAPI_F32;
    case XLA_FFI_DataType_F64: return RD_CAPI_F64;
    case XLA_FFI_DataType_F16: return RD_CAPI_F16;
    case XLA_FFI_DataType_BF16: return RD_CAPI_BF16;
    default: return -1;
    }
}

static const size_t rd_size_of[4] = {4, 8, 2, 2};
static const char *const rd_name_of[4] = {"float32", "float64", "float16", "bfloat16"};

/* One call, parsed. */
typedef struct {
    const XLA_FFI_Buffer *lhs, *rhs, *gs, *off, *out;
    int lt, rt, ot;             /* storage dtypes */
    int wide;                   /* float64 arithmetic */
    int64_t B;                  /* batch of the output */
    int64_t G, g;               /* groups in group_sizes, local groups */
    long long tl, tr;           /* transpose_lhs, transpose_rhs */
    char msg[320];
} rd_call_t;

static const XLA_FFI_Buffer *
rd_buffer(const XLA_FFI_CallFrame *cf, int i, int ret)
{
    if (ret)
        return cf->rets.size > i && cf->rets.types[i] == XLA_FFI_RetType_BUFFER
               ? (const XLA_FFI_Buffer *)cf->rets.rets[i] : NULL;
    return cf->args.size > i && cf->args.types[i] == XLA_FFI_ArgType_BUFFER
           ? (const XLA_FFI_Buffer *)cf->args.args[i] : NULL;
}

/* A batch dimension of 1 (shared) or B. */
static int
rd_batch_ok(const XLA_FFI_Buffer *x, int64_t B)
{
    return x->dims[0] == 1 || x->dims[0] == B;
}

/* Parse and check what both handlers share; 0, or -1 with c->msg set. */
static int
rd_parse(const XLA_FFI_CallFrame *cf, const char *fn, int lrank, int rrank, int orank, rd_call_t *c)
{
    c->lhs = rd_buffer(cf, 0, 0);
    c->rhs = rd_buffer(cf, 1, 0);
    c->gs = rd_buffer(cf, 2, 0);
    c->off = rd_buffer(cf, 3, 0);
    c->out = rd_buffer(cf, 0, 1);
    if (cf->args.size != 4 || cf->rets.size != 1 || !c->lhs || !c->rhs || !c->gs || !c->off || !c->out) {
        snprintf(c->msg, sizeof c->msg, "%s: expected 4 buffer operands (lhs, rhs, group_sizes, "
                 "group_offset) and 1 result, got %lld and %lld", fn, (long long)cf->args.size,
                 (long long)cf->rets.size);
        return -1;
    }
    if (rd_attr_int(cf, "transpose_lhs", 0, &c->tl) != 0 || rd_attr_int(cf, "transpose_rhs", 0, &c->tr) != 0) {
        snprintf(c->msg, sizeof c->msg, "%s: attributes transpose_lhs / transpose_rhs must be integers", fn);
        return -1;
    }
    if (c->lhs->rank != lrank || c->rhs->rank != rrank || c->gs->rank != 2 || c->off->rank != 1 ||
        c->out->rank != orank) {
        snprintf(c->msg, sizeof c->msg, "%s: operand ranks must be lhs %d, rhs %d, group_sizes 2, "
                 "group_offset 1, out %d; got %lld, %lld, %lld, %lld, %lld", fn, lrank, rrank, orank,
                 (long long)c->lhs->rank, (long long)c->rhs->rank, (long long)c->gs->rank,
                 (long long)c->off->rank, (long long)c->out->rank);
        return -1;
    }
    c->lt = rd_float_dtype(c->lhs->dtype);
    c->rt = rd_float_dtype(c->rhs->dtype);
    c->ot = rd_float_dtype(c->out->dtype);
    if (c->lt < 0 || c->rt < 0 || c->ot < 0) {
        snprintf(c->msg, sizeof c->msg, "%s: lhs, rhs and out must be float16, bfloat16, float32 or "
                 "float64 (XLA dtypes %d, %d, %d)", fn, (int)c->lhs->dtype, (int)c->rhs->dtype,
                 (int)c->out->dtype);
        return -1;
    }
    c->wide = c->ot == RD_CAPI_F64;
    if (!rd_api->reads(c->wide, c->lt, 0) || !rd_api->reads(c->wide, c->rt, 1)) {
        snprintf(c->msg, sizeof c->msg, "%s: a %s product cannot read lhs %s with rhs %s (a float64 "
                 "input needs a float64 output)", fn, c->wide ? "float64" : "float32",
                 rd_name_of[c->lt], rd_name_of[c->rt]);
        return -1;
    }
    int it = c->gs->dtype, ot = c->off->dtype;
    if ((it != XLA_FFI_DataType_S32 && it != XLA_FFI_DataType_S64) ||
        (ot != XLA_FFI_DataType_S32 && ot != XLA_FFI_DataType_S64)) {
        snprintf(c->msg, sizeof c->msg, "%s: group_sizes and group_offset must be int32 or int64", fn);
        return -1;
    }
    c->B = c->out->dims[0];
    c->G = c->gs->dims[1];
    if (!rd_batch_ok(c->lhs, c->B) || !rd_batch_ok(c->rhs, c->B) || !rd_batch_ok(c->gs, c->B) ||
        !rd_batch_ok(c->off, c->B)) {
        snprintf(c->msg, sizeof c->msg, "%s: the leading (batch) dimension of lhs, rhs, group_sizes "
                 "and group_offset must be 1 or the output's %lld; got %lld, %lld, %lld, %lld", fn,
                 (long long)c->B, (long long)c->lhs->dims[0], (long long)c->rhs->dims[0],
                 (long long)c->gs->dims[0], (long long)c->off->dims[0]);
        return -1;
    }
    return 0;
}

static int64_t
rd_int_at(const XLA_FFI_Buffer *x, int64_t i)
{
    return x->dtype == XLA_FFI_DataType_S32 ? (int64_t)((const int32_t *)x->data)[i]
                                            : ((const int64_t *)x->data)[i];
}

/* Bounds [g + 1] of the local groups [o, o + g) of batch entry b, from its
 * group sizes, checked against the ragged size m; -1 with c->msg set. */
static int
rd_bounds(rd_call_t *c, const char *fn, int64_t b, int64_t m, int64_t *bounds)
{
    const int64_t gb = c->gs->dims[0] == 1 ? 0 : b;
    const int64_t o = rd_int_at(c->off, c->off->dims[0] == 1 ? 0 : b);
    if (o < 0 || o > c->G - c->g) {
        snprintf(c->msg, sizeof c->msg, "%s: group_offset=%lld (batch %lld) with %lld local groups "
                 "must lie in [0, %lld] for %lld groups", fn, (long long)o, (long long)b,
                 (long long)c->g, (long long)(c->G - c->g), (long long)c->G);
        return -1;
    }
    int64_t start = 0;
    for (int64_t i = 0; i < c->G; i++) {
        const int64_t s = rd_int_at(c->gs, gb * c->G + i);
        if (s < 0) {
            snprintf(c->msg, sizeof c->msg, "%s: group_sizes[%lld, %lld]=%lld is negative", fn,
                     (long long)gb, (long long)i, (long long)s);
            return -1;
        }
        if (s > m - start) {
            snprintf(c->msg, sizeof c->msg, "%s: group_sizes[%lld, :%lld] sums past m=%lld, the size "
                     "of the lhs ragged dimension (sum(group_sizes) must be <= m)", fn, (long long)gb,
                     (long long)(i + 1), (long long)m);
            return -1;
        }
        if (i >= o && i <= o + c->g)
            bounds[i - o] = start;
        start += s;
    }
    if (o + c->g == c->G)
        bounds[c->g] = start;
    return 0;
}

static XLA_FFI_Error *
rd_driver_error(const XLA_FFI_CallFrame *cf, int rc, const char *fn)
{
    char msg[160];
    snprintf(msg, sizeof msg, "%s: %s", fn, rc == -1 ? "out of memory" : "no packing routine for these dtypes");
    return rd_error(cf, rc == -1 ? XLA_FFI_Error_Code_INTERNAL : XLA_FFI_Error_Code_INVALID_ARGUMENT, msg);
}

/* Bytes of a buffer's batch entry (dims after the first). */
static size_t
rd_entry(const XLA_FFI_Buffer *x, int dtype)
{
    size_t e = rd_size_of[dtype];
    for (int64_t d = 1; d < x->rank; d++)
        e *= (size_t)x->dims[d];
    return e;
}

static char *
rd_at(const XLA_FFI_Buffer *x, int dtype, int64_t b)
{
    return (char *)x->data + (x->dims[0] == 1 ? 0 : (size_t)b * rd_entry(x, dtype));
}

static XLA_FFI_Error *
rd_run(XLA_FFI_CallFrame *cf, int contract)
{
    const char *fn = contract ? "raggeddot_ragged_contract" : "raggeddot_ragged_rows";
    int handled;
    XLA_FFI_Error *err = rd_metadata(cf, &handled);
    if (handled || err != NULL)
        return err;
    if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE)
        return NULL;
    if (rd_api == NULL)
        return rd_error(cf, XLA_FFI_Error_Code_INTERNAL, "raggeddot FFI handlers are not bound to _core");
    rd_call_t c;
    memset(&c, 0, sizeof c);
    if (rd_parse(cf, fn, 3, contract ? 3 : 4, contract ? 4 : 3, &c) != 0)
        return rd_error(cf, XLA_FFI_Error_Code_INVALID_ARGUMENT, c.msg);
    const int64_t *L = c.lhs->dims, *R = c.rhs->dims, *O = c.out->dims;
    int64_t m, k, n;
    rd_capi_array_t a, w, o;
    if (contract) {   /* lhs [k, m] | [m, k], rhs [m, n] | [n, m], out [g, k, n] */
        c.g = O[1], k = O[2], n = O[3];
        m = c.tl ? L[1] : L[2];
        const int64_t lk = c.tl ? L[2] : L[1], rm = c.tr ? R[2] : R[1], rn = c.tr ? R[1] : R[2];
        if (lk != k || rm != m || rn != n) {
            snprintf(c.msg, sizeof c.msg, "%s: shapes disagree: lhs [%lld, %lld, %lld] (transpose_lhs=%lld), "
                     "rhs [%lld, %lld, %lld] (transpose_rhs=%lld), out [%lld, %lld, %lld, %lld]", fn,
                     (long long)L[0], (long long)L[1], (long long)L[2], c.tl, (long long)R[0],
                     (long long)R[1], (long long)R[2], c.tr, (long long)O[0], (long long)O[1],
                     (long long)k, (long long)n);
            return rd_error(cf, XLA_FFI_Error_Code_INVALID_ARGUMENT, c.msg);
        }
        a = (rd_capi_array_t){NULL, c.lt, 0, c.tl ? 1 : m, c.tl ? k : 1};
        w = (rd_capi_array_t){NULL, c.rt, 0, c.tr ? 1 : n, c.tr ? m : 1};
        o = (rd_capi_array_t){NULL, c.ot, k * n, n, 1};
    }
    else {            /* lhs [m, k] | [k, m], rhs [g, k, n] | [g, n, k], out [m, n] */
        m = O[1], n = O[2], c.g = R[1];
        k = c.tl ? L[1] : L[2];
        const int64_t lm = c.tl ? L[2] : L[1], rk = c.tr ? R[3] : R[2], rn = c.tr ? R[2] : R[3];
        if (lm != m || rk != k || rn != n) {
            snprintf(c.msg, sizeof c.msg, "%s: shapes disagree: lhs [%lld, %lld, %lld] (transpose_lhs=%lld), "
                     "rhs [%lld, %lld, %lld, %lld] (transpose_rhs=%lld), out [%lld, %lld, %lld]", fn,
                     (long long)L[0], (long long)L[1], (long long)L[2], c.tl, (long long)R[0],
                     (long long)R[1], (long long)R[2], (long long)R[3], c.tr, (long long)O[0],
                     (long long)m, (long long)n);
            return rd_error(cf, XLA_FFI_Error_Code_INVALID_ARGUMENT, c.msg);
        }
        a = (rd_capi_array_t){NULL, c.lt, 0, c.tl ? 1 : k, c.tl ? m : 1};
        w = (rd_capi_array_t){NULL, c.rt, k * n, c.tr ? 1 : n, c.tr ? k : 1};
        o = (rd_capi_array_t){NULL, c.ot, 0, n, 1};
    }
    if (c.g > c.G) {
        snprintf(c.msg, sizeof c.msg, "%s: %lld local groups but group_sizes holds only %lld", fn,
                 (long long)c.g, (long long)c.G);
        return rd_error(cf, XLA_FFI_Error_Code_INVALID_ARGUMENT, c.msg);
    }
    int64_t small[65];
    int64_t *bounds = c.g < 65 ? small : (int64_t *)malloc(sizeof(int64_t) * (size_t)(c.g + 1));
    if (bounds == NULL)
        return rd_error(cf, XLA_FFI_Error_Code_INTERNAL, "raggeddot FFI: out of memory");
    const size_t osz = rd_size_of[c.ot];
    int rc = 0;
    for (int64_t b = 0; b < c.B && rc == 0; b++) {
        if (rd_bounds(&c, fn, b, m, bounds) != 0) {
            rc = -3;
            break;
        }
        a.p = rd_at(c.lhs, c.lt, b);
        w.p = rd_at(c.rhs, c.rt, b);
        o.p = (char *)c.out->data + (size_t)b * rd_entry(c.out, c.ot);
        if (contract) {
            if (k == 0 || n == 0 || c.g == 0)
                continue;
            rc = rd_api->ragged_contract(c.wide, k, n, c.g, bounds, &a, &w, &o);
            continue;
        }
        /* rows of no local group are zeros (all rows when k = 0) */
        const int64_t lo = k == 0 ? m : bounds[0], hi = k == 0 ? m : bounds[c.g];
        if (lo * n > 0)
            memset(o.p, 0, (size_t)(lo * n) * osz);
        if ((m - hi) * n > 0)
            memset((char *)o.p + (size_t)(hi * n) * osz, 0, (size_t)((m - hi) * n) * osz);
        if (k > 0 && n > 0 && hi > lo)
            rc = rd_api->ragged_rows(c.wide, k, n, c.g, bounds, &a, &w, &o);
    }
    if (bounds != small)
        free(bounds);
    if (rc == -3)
        return rd_error(cf, XLA_FFI_Error_Code_INVALID_ARGUMENT, c.msg);
    return rc != 0 ? rd_driver_error(cf, rc, fn) : NULL;
}

XLA_FFI_Error *
rd_ffi_ragged_rows(XLA_FFI_CallFrame *cf)
{
    return rd_run(cf, 0);
}

XLA_FFI_Error *
rd_ffi_ragged_contract(XLA_FFI_CallFrame *cf)
{
    return rd_run(cf, 1);
}
