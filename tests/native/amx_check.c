/*
 * The native AMX check: products of both tile compute types
 * (RD_CT_BF16TILE, RD_CT_U8S8TILE) through the library's C API, run with
 * the family "amx" where this CPU runs it, then with its twin "amx-twin",
 * over the kernels' edges and the paths that use them (ragged rows and
 * contraction, prepacked weights, the gated products of an MoE layer with
 * their epilogues).  Built as a static program from the library's C (not
 * csrc/py) without OpenMP, it runs on any x86-64 host (where only the twin
 * runs) and under an emulator of an AMX CPU (both run):
 * tests/test_amx_native.py builds it, runs it both ways and compares.
 *
 * Output, one line per case and family:
 *   case NAME FAMILY KIND match=M hash=H ref=... guards=... tiles=... ok|FAIL
 *   KIND exact: every partial sum is exact (int8 with power-of-two scales;
 *     bfloat16 small integers, and products 2^-70 or 2^100 times those,
 *     beside denormals read and flushed as 0): every output equals the
 *     float64 truth (rounded once to a 16-bit output);
 *   KIND bound: random bfloat16, or a float lhs quantized while packed:
 *     every output within a float32 sum's error bound of the float64 truth
 *     (plus half a quantization step per element);
 *   M bits: native and twin must give the same bits, and so the same hash
 *     (FNV-1a of every output buffer, guards included): every exact case,
 *     and the int8 sums of a quantized float lhs; M bound: random bfloat16,
 *     where the instruction's order of additions is not the twin's.
 *   ref: that comparison; guards: the values around every output (and its
 *   rows outside the groups) unchanged; tiles: after the call no tile
 *   configuration is held (native: XINUSE says the tiles are in their init
 *   state; twin: its bookkeeping).
 * then, where both families ran,
 *   same NAME equal | differ N of M (...) ok|FAIL
 * where the native family ran, the few-rows-vector line (int8 at a few rows
 * a group on the vector kernels, with the tiles' bits), and the simulated
 * refusals of the permission request (perm lines).  The
 * exit status is 1 when any check failed.
 */
#include "rd_frame.h"
#include "rd_half.h"
#include "moe/rd_moe.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

/* ------------------------------------------------------------ data */

static uint64_t rng_state;

static void
seed_with(const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    rng_state = h;
}

static uint64_t
next64(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int
irand(int lo, int hi)
{
    return lo + (int)(next64() % (uint64_t)(hi - lo + 1));
}

/* uniform in [-2, 2) times 2^e, e in [-2, 2]: exact float32 arithmetic */
static float
frand(void)
{
    static const float scale[5] = {0x1p-24f, 0x1p-23f, 0x1p-22f, 0x1p-21f, 0x1p-20f};
    const int32_t u = (int32_t)(next64() >> 40) - (1 << 23);
    return (float)u * scale[irand(0, 4)];
}

static void *
xalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes > 0 ? bytes : 64) != 0) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memset(p, 0, bytes > 0 ? bytes : 64);
    return p;
}

/* -------------------------------------------------------- operands */

enum { D_INT, D_RAND, D_ASBF16, D_DENORM, D_DENORM_B, D_I8, D_QF32, D_QBF16 };
enum { L_ROW, L_STRIDED, L_TRANS };

/* An operand [g][rows][cols] as the driver reads it, and the values the
 * product multiplies (rounded, dequantized), in double. */
typedef struct {
    rd_in_t in;
    void *mem;
    double *val;
    rd_int g, rows, cols;
    float *s, *z;       /* int8 scales / zero points; a dynamically quantized row's scales */
} opnd_t;

#define VAL(o, gg, i, j) ((o)->val[((gg) * (o)->rows + (i)) * (o)->cols + (j)])

static void
opnd_free(opnd_t *o)
{
    free(o->mem);
    free(o->val);
    free(o->s);
    free(o->z);
    memset(o, 0, sizeof *o);
}

/* A float operand: bfloat16 small integers (D_INT) or random values
 * (D_RAND, D_QBF16), float32 values that round to small integers (D_ASBF16,
 * read as bfloat16), float32 random values (D_QF32), or bfloat16 values of
 * three kinds by row (lhs, D_DENORM) or column (rhs, D_DENORM_B): small
 * integers, denormals (read as 0), and small integers times 2^-70 (lhs) or
 * 2^100 / 2^-70 (rhs), whose products are normal, or denormal (flushed).
 * Stored row-major, every other row and column of a larger array
 * (L_STRIDED), or transposed per group (L_TRANS).  D_QF32 / D_QBF16: a lhs
 * quantized per row while packed, its scales from rd_row_scales. */
static void
opnd_float(opnd_t *o, rd_int g, rd_int rows, rd_int cols, int data, int layout)
{
    memset(o, 0, sizeof *o);
    const int f32 = data == D_ASBF16 || data == D_QF32;
    const size_t es = f32 ? 4 : 2;
    o->g = g, o->rows = rows, o->cols = cols;
    o->val = (double *)xalloc(sizeof(double) * (size_t)(g * rows * cols));
    rd_int gs = rows * cols, rs = cols, cs = 1;
    if (layout == L_STRIDED)
        gs = 4 * rows * cols, rs = 2 * cols, cs = 2;
    else if (layout == L_TRANS)
        rs = 1, cs = rows;
    o->mem = xalloc(es * (size_t)(g * gs));
    for (rd_int gg = 0; gg < g; gg++)
        for (rd_int i = 0; i < rows; i++)
            for (rd_int j = 0; j < cols; j++) {
                const rd_int at = gg * gs + i * rs + j * cs;
                float v;
                if (data == D_INT) {
                    v = (float)irand(-8, 8);
                    ((uint16_t *)o->mem)[at] = rd_float_to_bf16(v);
                }
                else if (data == D_DENORM || data == D_DENORM_B) {
                    const int kind = (int)((data == D_DENORM ? i : j) % 3), n = irand(-8, 8);
                    uint16_t h;
                    if (kind == 1) {   /* a bfloat16 denormal: read as 0 */
                        h = (uint16_t)(irand(1, 127) | (irand(0, 1) << 15));
                        v = 0.0f;
                    }
                    else {
                        v = kind == 0 ? (float)n
                            : data == D_DENORM || j % 6 == 2 ? (float)n * 0x1p-70f : (float)n * 0x1p100f;
                        h = rd_float_to_bf16(v);
                    }
                    ((uint16_t *)o->mem)[at] = h;
                }
                else if (data == D_ASBF16) {
                    /* within half a bfloat16 ulp of an integer of [-8, 8] */
                    const int n = irand(-8, 8), frac = irand(-7, 7);
                    ((float *)o->mem)[at] = n == 0 ? 0.0f : (float)n + (float)frac * 0x1p-12f;
                    v = (float)n;
                }
                else if (data == D_QF32) {
                    v = frand();
                    ((float *)o->mem)[at] = v;
                }
                else {
                    const uint16_t h = rd_float_to_bf16(frand());
                    ((uint16_t *)o->mem)[at] = h;
                    v = rd_bf16_to_float(h);
                }
                VAL(o, gg, i, j) = v;
            }
    o->in.p = o->mem;
    o->in.dtype = data == D_ASBF16 ? RD_F32_AS_BF16 : data == D_QF32 ? RD_F32 : RD_BF16;
    o->in.gs = gs, o->in.rs = rs, o->in.cs = cs;
    if (data == D_QF32 || data == D_QBF16) {
        o->s = (float *)xalloc(sizeof(float) * (size_t)rows);
        rd_row_scales(o->mem, o->in.dtype, rows, cols, rs, cs, o->s);
        o->in.q.s = o->s;
        o->in.q.rs = 1;
        o->in.q.tg = o->in.q.tr = 1;
        o->in.q.tc = cols;
    }
}

/* An int8 operand [g][rows][cols], row-major, with scales (1 or 1/2: every
 * product of two exact) on tiles of tr x tc and, with zp, integral zero
 * points in [-20, 20]. */
static void
opnd_i8(opnd_t *o, rd_int g, rd_int rows, rd_int cols, rd_int tr, rd_int tc, int zp)
{
    memset(o, 0, sizeof *o);
    o->g = g, o->rows = rows, o->cols = cols;
    const rd_int nr = (rows + tr - 1) / tr, nc = (cols + tc - 1) / tc, tiles = g * nr * nc;
    o->mem = xalloc((size_t)(g * rows * cols));
    o->val = (double *)xalloc(sizeof(double) * (size_t)(g * rows * cols));
    o->s = (float *)xalloc(sizeof(float) * (size_t)tiles);
    int8_t *q = (int8_t *)o->mem;
    for (rd_int e = 0; e < g * rows * cols; e++)
        q[e] = (int8_t)irand(-128, 127);
    for (rd_int t = 0; t < tiles; t++)
        o->s[t] = irand(0, 1) ? 1.0f : 0.5f;
    if (zp) {
        o->z = (float *)xalloc(sizeof(float) * (size_t)tiles);
        for (rd_int t = 0; t < tiles; t++)
            o->z[t] = (float)irand(-20, 20);
    }
    for (rd_int gg = 0; gg < g; gg++)
        for (rd_int i = 0; i < rows; i++)
            for (rd_int j = 0; j < cols; j++) {
                const rd_int t = (gg * nr + i / tr) * nc + j / tc;
                VAL(o, gg, i, j) = ((double)q[(gg * rows + i) * cols + j] - (zp ? o->z[t] : 0.0)) * o->s[t];
            }
    o->in.p = o->mem;
    o->in.dtype = RD_I8;
    o->in.gs = rows * cols, o->in.rs = cols, o->in.cs = 1;
    o->in.q = (rd_scales_t){o->s, o->z, nr * nc, nc, 1, 1, tr, tc};
}

/* --------------------------------------------------------- outputs */

#define GUARD 0xA5
#define STALE32 0x7FC0DEADu     /* a NaN: an output never written fails its check */
#define STALE16 0x7FDEu

/* An output [g][rows][cols] of float32 or bfloat16 elements (rows rs apart,
 * groups gs apart) inside a buffer of guard bytes: two rows above and
 * below each group, three columns left and two right of each row.  `live`
 * marks the rows the call may write. */
typedef struct {
    unsigned char *mem;
    size_t es, count;
    rd_int g, rows, cols, gs, rs, off;
    unsigned char *live;
} obuf_t;

static void
obuf_init(obuf_t *b, rd_int g, rd_int rows, rd_int cols, size_t es)
{
    b->es = es, b->g = g, b->rows = rows, b->cols = cols;
    b->rs = cols + 5;
    b->gs = (rows + 2) * b->rs;
    b->off = 2 * b->rs + 3;
    b->count = (size_t)(b->off + g * b->gs + 2 * b->rs);
    b->mem = (unsigned char *)xalloc(b->count * es);
    memset(b->mem, GUARD, b->count * es);
    b->live = (unsigned char *)xalloc((size_t)(g * rows));
}

static void
obuf_free(obuf_t *b)
{
    free(b->mem);
    free(b->live);
    memset(b, 0, sizeof *b);
}

static void *
obuf_at(const obuf_t *b, rd_int gg, rd_int i, rd_int j)
{
    return b->mem + (size_t)(b->off + gg * b->gs + i * b->rs + j) * b->es;
}

static float
obuf_get(const obuf_t *b, rd_int gg, rd_int i, rd_int j)
{
    const void *p = obuf_at(b, gg, i, j);
    if (b->es == 2) {
        uint16_t h;
        memcpy(&h, p, 2);
        return rd_bf16_to_float(h);
    }
    float f;
    memcpy(&f, p, 4);
    return f;
}

static void
obuf_put(obuf_t *b, rd_int gg, rd_int i, rd_int j, float v)
{
    void *p = obuf_at(b, gg, i, j);
    if (b->es == 2) {
        const uint16_t h = rd_float_to_bf16(v);
        memcpy(p, &h, 2);
    }
    else
        memcpy(p, &v, 4);
}

/* Rows [i0, i1) of group gg live, each element the stale NaN */
static void
obuf_live(obuf_t *b, rd_int gg, rd_int i0, rd_int i1)
{
    for (rd_int i = i0; i < i1; i++) {
        b->live[gg * b->rows + i] = 1;
        for (rd_int j = 0; j < b->cols; j++) {
            void *p = obuf_at(b, gg, i, j);
            if (b->es == 2) {
                const uint16_t h = STALE16;
                memcpy(p, &h, 2);
            }
            else {
                const uint32_t u = STALE32;
                memcpy(p, &u, 4);
            }
        }
    }
}

/* How many elements outside the live rows changed. */
static long
obuf_guards(const obuf_t *b)
{
    long bad = 0;
    for (size_t e = 0; e < b->count; e++) {
        const rd_int x = (rd_int)e - b->off;
        int live = 0;
        if (x >= 0) {
            const rd_int gg = x / b->gs, rem = x % b->gs, i = rem / b->rs, j = rem % b->rs;
            live = gg < b->g && i < b->rows && j < b->cols && b->live[gg * b->rows + i];
        }
        if (live)
            continue;
        for (size_t byte = 0; byte < b->es; byte++)
            if (b->mem[e * b->es + byte] != GUARD) {
                bad++;
                break;
            }
    }
    return bad;
}

static uint64_t
fnv(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* ------------------------------------------------------- results */

typedef struct {
    const char *kind;       /* "exact" or "bound" */
    int bits;               /* native and twin must agree bit for bit */
    obuf_t out[3];
    int nout;
    long checked, bad;      /* outputs compared with the truth, and failing */
    long premise;           /* exact cases whose truth is not exact in float32 */
    double worst;           /* bound: the largest |error| / bound */
    char first[200];        /* the first failure */
    long guards;
    int tiles_ok;
    int rc;
} result_t;

static void
note(result_t *r, const char *what, rd_int gg, rd_int i, rd_int j, double got, double want)
{
    r->bad++;
    if (r->first[0] == '\0')
        snprintf(r->first, sizeof r->first, "%s (%ld, %ld, %ld) got %.9g want %.9g", what, (long)gg, (long)i,
                 (long)j, got, want);
}

/* One output against its float64 truth: `want` the exact sum, `mag` the
 * sum of the magnitudes of its terms, `steps` their number, `extra` an
 * allowance for a quantized operand's rounding.  Exact: equal (after the
 * one rounding of a 16-bit output).  Bound: |got - want| <= (steps + 2)
 * 2^-23 mag + extra, twice the first-order bound of a float32 sum of that
 * many terms in any order (and half a bfloat16 ulp for a 16-bit output). */
static void
check_value(result_t *r, const obuf_t *b, rd_int gg, rd_int i, rd_int j, double want, double mag, double steps,
            double extra)
{
    const float got = obuf_get(b, gg, i, j);
    r->checked++;
    if (strcmp(r->kind, "exact") == 0) {
        const float w32 = (float)want;
        if ((double)w32 != want) {
            r->premise++;
            note(r, "truth not exact in float32 at", gg, i, j, got, want);
            return;
        }
        const float w = b->es == 2 ? rd_bf16_to_float(rd_float_to_bf16(w32)) : w32;
        if (!(got == w))
            note(r, "not the exact value at", gg, i, j, got, w);
        return;
    }
    double bound = (steps + 2.0) * 0x1p-23 * mag + extra;
    if (b->es == 2)   /* the float32 value, rounded once to bfloat16 */
        bound += 0x1p-8 * (fabs(want) + bound);
    const double err = fabs((double)got - want);
    if (!(err <= bound)) {
        note(r, "outside the bound at", gg, i, j, got, want);
        return;
    }
    if (bound > 0 && err / bound > r->worst)
        r->worst = err / bound;
}

/* Whether the calling thread holds no tile configuration: XGETBV with
 * ECX = 1 reads XINUSE, whose bit 17 (TILECFG) is clear while the tiles
 * are in their init state. */
static int
native_tiles_released(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
    (void)hi;
    return (lo & (1u << 17)) == 0;
}

static int
tiles_released(const char *family)
{
    if (strcmp(family, "amx") == 0)
        return native_tiles_released();
    int held;
    long strays;
    rd_amx_twin_state(&held, &strays);
    return held == 0 && strays == 0;
}

/* ---------------------------------------------------------- cases */

enum { OP_ROWS, OP_CONTRACT, OP_GATED, OP_GRAD, OP_COMBINE };

typedef struct {
    const char *name;
    int op, data;
    rd_int k, n;            /* OP_CONTRACT: k the rows of each group's output */
    int ng;
    rd_int sizes[8];
    rd_int skip;            /* rows before the first group (and one after it) */
    int acc, out16;         /* RD_ADD into existing values; a bfloat16 output */
    int la, lb;             /* layouts of lhs, rhs */
    int prepacked;
    rd_int mc, kc, nc;      /* blocking (0: the family's) */
    rd_int ta, tb;          /* int8: scale tiles of lhs / rhs along the contraction (0: one) */
    int za, zb;             /* int8: zero points */
    int ridx;               /* gated: lhs rows gathered through an index */
    int bias, kind;         /* gated, combine: biases; the activation */
    int stream;             /* every output streamed (threshold 0 bytes) */
} case_t;

static const case_t CASES[] = {
    /* ragged rows (ragged_dot, gmm), bfloat16 small integers: rows and
     * columns around the 16-row / 16-column tiles and the 32 x 32 block,
     * depths around the 32-step chunks and across KC (256), empty groups */
    {"rows-1x1x1", OP_ROWS, D_INT, 1, 1, 1, {1}, .skip = 0},
    {"rows-5x3x7", OP_ROWS, D_INT, 3, 7, 3, {2, 0, 3}, .skip = 2},
    {"rows-16x32x16", OP_ROWS, D_INT, 32, 16, 1, {16}, .skip = 0},
    {"rows-17x33x17", OP_ROWS, D_INT, 33, 17, 1, {17}, .skip = 1},
    {"rows-31x31x15", OP_ROWS, D_INT, 31, 15, 2, {0, 31}, .skip = 0},
    {"rows-32x64x32", OP_ROWS, D_INT, 64, 32, 1, {32}, .skip = 0},
    {"rows-32x64x32-add", OP_ROWS, D_INT, 64, 32, 1, {32}, .acc = 1},
    {"rows-33x65x33", OP_ROWS, D_INT, 65, 33, 2, {1, 32}, .skip = 3},
    {"rows-edges-63x31", OP_ROWS, D_INT, 63, 31, 6, {15, 16, 17, 0, 33, 48}, .skip = 0},
    {"rows-70x97x50", OP_ROWS, D_INT, 97, 50, 4, {20, 0, 0, 49}, .skip = 0},
    {"rows-45x300x64-add", OP_ROWS, D_INT, 300, 64, 2, {13, 32}, .acc = 1},
    {"rows-40x600x70", OP_ROWS, D_INT, 600, 70, 1, {40}, .skip = 0},
    {"rows-bf16out", OP_ROWS, D_INT, 97, 45, 3, {17, 0, 33}, .skip = 2, .out16 = 1},
    {"rows-bf16out-add", OP_ROWS, D_INT, 70, 33, 2, {31, 16}, .acc = 1, .out16 = 1},
    {"rows-strided-transposed", OP_ROWS, D_INT, 41, 48, 2, {17, 18}, .la = L_STRIDED, .lb = L_TRANS},
    {"rows-f32-as-bf16", OP_ROWS, D_ASBF16, 77, 40, 2, {19, 33}, .skip = 1},
    {"rows-blocking-32x40x64", OP_ROWS, D_INT, 100, 100, 2, {70, 30}, .mc = 32, .kc = 40, .nc = 64},
    {"rows-mc-150", OP_ROWS, D_INT, 40, 20, 1, {150}, .skip = 0},
    /* denormal inputs read as 0, denormal products flushed (the
     * instruction's arithmetic, which the twin models) */
    {"rows-denormals", OP_ROWS, D_DENORM, 70, 36, 2, {17, 31}, .skip = 1},
    /* outputs streamed (RD_STREAM: the tile kernels store as RD_STORE) */
    {"rows-streamed", OP_ROWS, D_INT, 65, 64, 2, {32, 17}, .stream = 1},
    {"i8-streamed", OP_ROWS, D_I8, 130, 64, 2, {32, 17}, .stream = 1, .zb = 1},
    /* random bfloat16: within the bound */
    {"rows-rand-17x33x17", OP_ROWS, D_RAND, 33, 17, 1, {17}, .skip = 0},
    {"rows-rand-70x97x50", OP_ROWS, D_RAND, 97, 50, 4, {20, 0, 0, 49}, .skip = 2},
    {"rows-rand-40x600x70-add", OP_ROWS, D_RAND, 600, 70, 1, {40}, .acc = 1},
    {"rows-rand-bf16out", OP_ROWS, D_RAND, 130, 36, 2, {33, 16}, .out16 = 1},
    /* bfloat16 weights prepacked (k-pair panels read in place) */
    {"rows-prepacked", OP_ROWS, D_INT, 130, 75, 3, {30, 0, 55}, .prepacked = 1},
    {"rows-prepacked-kc40-add", OP_ROWS, D_INT, 97, 33, 2, {16, 17}, .acc = 1, .prepacked = 1, .kc = 40},
    {"rows-rand-prepacked", OP_ROWS, D_RAND, 300, 40, 2, {33, 31}, .prepacked = 1},
    /* int8: per-row scales of lhs, per-column scales of rhs, zero points
     * on either side, scale tiles along k (subchannel: the KC blocks end
     * at them), depths not multiples of 64, across KC (512) */
    {"i8-5x3x7", OP_ROWS, D_I8, 3, 7, 3, {2, 0, 3}, .skip = 1},
    {"i8-17x65x17-zp", OP_ROWS, D_I8, 65, 17, 1, {17}, .za = 1, .zb = 1},
    {"i8-31x63x33-zpa", OP_ROWS, D_I8, 63, 33, 2, {0, 31}, .skip = 2, .za = 1},
    {"i8-32x64x32-zpb", OP_ROWS, D_I8, 64, 32, 2, {16, 16}, .zb = 1},
    {"i8-edges-129x50-add", OP_ROWS, D_I8, 129, 50, 4, {33, 1, 0, 30}, .acc = 1, .za = 1, .zb = 1},
    {"i8-subchannel-1300", OP_ROWS, D_I8, 1300, 40, 2, {40, 7}, .ta = 260, .tb = 100, .za = 1},
    {"i8-bf16out", OP_ROWS, D_I8, 97, 33, 2, {17, 16}, .out16 = 1, .zb = 1},
    {"i8-blocking-kc100", OP_ROWS, D_I8, 333, 70, 2, {50, 20}, .mc = 32, .kc = 100, .nc = 64, .za = 1},
    {"i8-prepacked", OP_ROWS, D_I8, 200, 45, 3, {20, 0, 17}, .prepacked = 1, .zb = 1},
    {"i8-prepacked-subchannel", OP_ROWS, D_I8, 700, 33, 2, {9, 33}, .prepacked = 1, .tb = 140, .za = 1,
     .zb = 1},
    /* float lhs quantized per row while packed (activation_qtype="int8") */
    {"q8-f32-lhs", OP_ROWS, D_QF32, 150, 40, 2, {25, 18}, .zb = 1},
    {"q8-bf16-lhs-prepacked", OP_ROWS, D_QBF16, 90, 33, 2, {17, 16}, .prepacked = 1},
    /* ragged contraction (tgmm, d_rhs): lhs x.T of x [m, k] (strided), the
     * groups' depths are their row counts, empty groups zero or kept */
    {"tgmm-19x37", OP_CONTRACT, D_INT, 19, 37, 4, {7, 0, 40, 1}, .la = L_TRANS},
    {"tgmm-19x37-add", OP_CONTRACT, D_INT, 19, 37, 4, {7, 0, 40, 1}, .acc = 1, .la = L_TRANS},
    {"tgmm-33x17-bf16out", OP_CONTRACT, D_INT, 33, 17, 3, {64, 65, 0}, .skip = 2, .out16 = 1, .la = L_TRANS},
    {"tgmm-rand", OP_CONTRACT, D_RAND, 40, 33, 4, {33, 64, 0, 17}, .la = L_TRANS},
    {"tgmm-i8", OP_CONTRACT, D_I8, 20, 33, 3, {70, 0, 31}, .skip = 1, .zb = 1},
    {"tgmm-i8-subchannel-add", OP_CONTRACT, D_I8, 17, 31, 3, {45, 0, 36}, .acc = 1, .ta = 10, .tb = 10,
     .za = 1},
    /* the gate and up products of an MoE layer's experts in one pass
     * (rd_gated_rows, rd_gated_epilogue): kept projections, biases, the
     * activation on the rounded values; dispatched rows gathered */
    {"gated-silu", OP_GATED, D_INT, 70, 33, 3, {5, 0, 40}, .skip = 2, .bias = 1, .kind = RD_ACT_SILU},
    {"gated-gather-swiglu-bf16", OP_GATED, D_INT, 64, 50, 2, {17, 28}, .out16 = 1, .ridx = 1,
     .kind = RD_ACT_SWIGLU_OAI},
    {"gated-rand-prepacked-gelu", OP_GATED, D_RAND, 100, 40, 3, {33, 0, 15}, .prepacked = 1, .bias = 1,
     .kind = RD_ACT_GELU},
    /* the backward's first product with the activation's gradient
     * (rd_gated_grad_epilogue) */
    {"grad-gelu-bf16", OP_GRAD, D_INT, 48, 33, 2, {17, 30}, .out16 = 1, .kind = RD_ACT_GELU_TANH},
    {"grad-rand-silu", OP_GRAD, D_RAND, 70, 20, 3, {12, 0, 33}, .kind = RD_ACT_SILU},
    /* the down product with the combine in its epilogue (ordered) */
    {"combine-bf16", OP_COMBINE, D_INT, 40, 33, 3, {0}, .out16 = 1, .bias = 1},
    {"combine-rand-prepacked", OP_COMBINE, D_RAND, 64, 17, 4, {0}, .prepacked = 1},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static int
is_int8(const case_t *c)
{
    return c->data == D_I8 || c->data == D_QF32 || c->data == D_QBF16;
}

/* The plan of a case for `family`: the compute type the runtime chooses
 * for its operands (which must be the family's tile type), with the case's
 * blocking.  0, or -1 with the reason in r->first. */
static int
case_plan(const case_t *c, const char *family, rd_plan_t *plan, result_t *r)
{
    const rd_ctype_t want = is_int8(c) ? RD_CT_U8S8TILE : RD_CT_BF16TILE;
    const rd_ctype_t ct = is_int8(c) ? rd_int8_product()
                          : c->prepacked ? rd_layout_product(RD_CT_BF16DP)
                          : rd_float_product(RD_CT_F32, RD_BF16, RD_BF16, 0, 0);
    if (ct != want || (is_int8(c) && c->prepacked && rd_layout_product(RD_CT_U8S8) != want)) {
        snprintf(r->first, sizeof r->first, "the runtime chose compute type %d, not the tile type %d", (int)ct,
                 (int)want);
        return -1;
    }
    if (c->mc || c->kc || c->nc) {
        const rd_ukr_desc_t *k = rd_active_kernel(ct, NULL);
        if (rd_set_blocking(ct, c->mc ? c->mc : k->mc, c->kc ? c->kc : k->kc, c->nc ? c->nc : k->nc) != 0) {
            snprintf(r->first, sizeof r->first, "rd_set_blocking refused");
            return -1;
        }
    }
    rd_plan_init(plan, ct);
    if (plan->k.ukr == NULL || strcmp(plan->family, family) != 0) {
        snprintf(r->first, sizeof r->first, "compute type %d served by %s, not %s", (int)ct, plan->family, family);
        return -1;
    }
    return 0;
}

/* Weights [ng, k, n] laid out by rd_prepack for the plan, into *mem; the
 * rd_in_t that reads them. */
static rd_in_t
prepacked(const rd_plan_t *plan, const opnd_t *w, rd_int ng, rd_int k, rd_int n, void **mem, result_t *r)
{
    const rd_int qtile = w->in.q.s != NULL ? w->in.q.tr : 0;
    const int qzp = w->in.q.z != NULL;
    const size_t per = rd_prepack_bytes(plan, w->in.dtype, k, n, qtile, qzp);
    *mem = xalloc(per * (size_t)ng);
    if (per == 0 || rd_prepack(plan, ng, k, n, &w->in, *mem) != 0) {
        r->rc = -9;
        snprintf(r->first, sizeof r->first, "rd_prepack failed");
    }
    rd_in_t b;
    memset(&b, 0, sizeof b);
    b.p = *mem;
    b.dtype = w->in.dtype;
    b.gs = (rd_int)per;
    b.panels = (n + plan->k.nr - 1) / plan->k.nr;
    b.qtile = qtile;
    b.qzp = qzp;
    return b;
}

static rd_int
case_rows(const case_t *c, rd_int *bounds)
{
    bounds[0] = c->skip;
    for (int g = 0; g < c->ng; g++)
        bounds[g + 1] = bounds[g] + c->sizes[g];
    return bounds[c->ng] + (c->skip > 0 ? 1 : 0);
}

/* The allowance for a lhs quantized per row while packed: half a scale
 * step per element, times the weights it multiplies. */
static double
quant_allowance(const case_t *c, const opnd_t *lhs, const opnd_t *rhs, rd_int gg, rd_int i, rd_int j)
{
    if (c->data != D_QF32 && c->data != D_QBF16)
        return 0.0;
    double s = 0.0;
    for (rd_int p = 0; p < rhs->rows; p++)
        s += fabs(VAL(rhs, gg, p, j));
    return 0.5 * (double)lhs->s[i] * s;
}

/* Ragged rows: out[r] (+)= lhs[r] @ rhs[g] over the groups' rows. */
static void
run_rows(const case_t *c, const char *family, result_t *r)
{
    rd_int bounds[9];
    const rd_int m = case_rows(c, bounds), k = c->k, n = c->n;
    const int ng = c->ng;
    rd_plan_t plan;
    opnd_t lhs, rhs;
    if (c->data == D_I8)
        opnd_i8(&lhs, 1, m, k, 1, c->ta ? c->ta : k, c->za);
    else
        opnd_float(&lhs, 1, m, k, c->data, c->la);
    if (is_int8(c))
        opnd_i8(&rhs, ng, k, n, c->tb ? c->tb : k, 1, c->zb);
    else
        opnd_float(&rhs, ng, k, n, c->data == D_DENORM ? D_DENORM_B : c->data, c->lb);
    obuf_t *o = &r->out[r->nout++];
    obuf_init(o, 1, m, n, c->out16 ? 2 : 4);
    obuf_live(o, 0, bounds[0], bounds[ng]);
    double *init = (double *)xalloc(sizeof(double) * (size_t)(m * n));
    if (c->acc)
        for (rd_int i = bounds[0]; i < bounds[ng]; i++)
            for (rd_int j = 0; j < n; j++) {
                const float v = c->data == D_RAND ? frand() : (float)irand(-50, 50);
                obuf_put(o, 0, i, j, v);
                init[i * n + j] = obuf_get(o, 0, i, j);
            }
    void *packed = NULL;
    if (case_plan(c, family, &plan, r) == 0) {
        const rd_in_t b = c->prepacked ? prepacked(&plan, &rhs, ng, k, n, &packed, r) : rhs.in;
        const rd_out_t out = {obuf_at(o, 0, 0, 0), 0, o->rs, 1, c->out16 ? RD_BF16 : RD_F32};
        plan.stream_min = c->stream ? 0 : plan.stream_min;
        if (r->rc == 0)
            r->rc = rd_ragged_rows(&plan, k, n, ng, bounds, &lhs.in, &b, &out, c->acc);
        r->tiles_ok = tiles_released(family);
    }
    else
        r->rc = -9;
    for (int g = 0; g < ng; g++)
        for (rd_int i = bounds[g]; i < bounds[g + 1]; i++)
            for (rd_int j = 0; j < n; j++) {
                double want = init[i * n + j], mag = fabs(want);
                for (rd_int p = 0; p < k; p++) {
                    double t = VAL(&lhs, 0, i, p) * VAL(&rhs, g, p, j);
                    if (fabs(t) < 0x1p-126)   /* a denormal product: flushed (D_DENORM makes */
                        t = 0.0;              /* an output's products all tiny, or none) */
                    want += t;
                    mag += fabs(t);
                }
                check_value(r, o, 0, i, j, want, mag, (double)k, quant_allowance(c, &lhs, &rhs, g, i, j));
            }
    free(init);
    free(packed);
    opnd_free(&lhs);
    opnd_free(&rhs);
}

/* Ragged contraction: out[g] (+)= lhs[:, rows of g] @ rhs[rows of g, :]. */
static void
run_contract(const case_t *c, const char *family, result_t *r)
{
    rd_int bounds[9];
    const rd_int m = case_rows(c, bounds), k = c->k, n = c->n;
    const int ng = c->ng;
    rd_plan_t plan;
    opnd_t lhs, rhs;
    if (c->data == D_I8) {
        opnd_i8(&lhs, 1, k, m, 1, c->ta ? c->ta : m, c->za);
        opnd_i8(&rhs, 1, m, n, c->tb ? c->tb : m, 1, c->zb);
    }
    else {
        opnd_float(&lhs, 1, k, m, c->data, c->la);
        opnd_float(&rhs, 1, m, n, c->data, c->lb);
    }
    obuf_t *o = &r->out[r->nout++];
    obuf_init(o, ng, k, n, c->out16 ? 2 : 4);
    double *init = (double *)xalloc(sizeof(double) * (size_t)(ng * k * n));
    for (int g = 0; g < ng; g++) {
        obuf_live(o, g, 0, k);
        if (c->acc)
            for (rd_int i = 0; i < k; i++)
                for (rd_int j = 0; j < n; j++) {
                    const float v = c->data == D_RAND ? frand() : (float)irand(-50, 50);
                    obuf_put(o, g, i, j, v);
                    init[(g * k + i) * n + j] = obuf_get(o, g, i, j);
                }
    }
    if (case_plan(c, family, &plan, r) == 0) {
        const rd_out_t out = {obuf_at(o, 0, 0, 0), o->gs, o->rs, 1, c->out16 ? RD_BF16 : RD_F32};
        r->rc = rd_ragged_contract(&plan, k, n, ng, bounds, &lhs.in, &rhs.in, &out, c->acc);
        r->tiles_ok = tiles_released(family);
    }
    else
        r->rc = -9;
    for (int g = 0; g < ng; g++)
        for (rd_int i = 0; i < k; i++)
            for (rd_int j = 0; j < n; j++) {
                double want = init[(g * k + i) * n + j], mag = fabs(want);
                for (rd_int p = bounds[g]; p < bounds[g + 1]; p++) {
                    const double t = VAL(&lhs, 0, i, p) * VAL(&rhs, 0, p, j);
                    want += t;
                    mag += fabs(t);
                }
                check_value(r, o, g, i, j, want, mag, (double)(bounds[g + 1] - bounds[g]), 0.0);
            }
    free(init);
    opnd_free(&lhs);
    opnd_free(&rhs);
}

/* The product of rows [bounds[0], bounds[ng]) of lhs (through idx when
 * given) and w[g] by rd_ragged_rows with the case's plan, into a float32
 * [m, n] array, each element checked against the truth (plus bias[g]
 * when given): the values a fused pass must match. */
static float *
separate_rows(const case_t *c, const rd_plan_t *plan, const rd_int *bounds, rd_int m, const opnd_t *x,
              const long long *idx, const opnd_t *w, const rd_in_t *wb, result_t *r)
{
    const rd_int k = c->k, n = c->n;
    float *y = (float *)xalloc(sizeof(float) * (size_t)(m * n));
    obuf_t o;
    obuf_init(&o, 1, m, n, 4);
    obuf_live(&o, 0, bounds[0], bounds[c->ng]);
    const rd_out_t out = {obuf_at(&o, 0, 0, 0), 0, o.rs, 1, RD_F32};
    /* gathered rows: copied here, the separate pass takes them as they are */
    rd_in_t a = x->in;
    void *gathered = NULL;
    if (idx != NULL) {
        const size_t es = rd_dtype_size[a.dtype];
        gathered = xalloc(es * (size_t)(m * k));
        for (rd_int i = 0; i < m; i++)
            for (rd_int p = 0; p < k; p++)
                memcpy((char *)gathered + (size_t)(i * k + p) * es,
                       (const char *)a.p + (size_t)(idx[i] * a.rs + p * a.cs) * es, es);
        a.p = gathered;
        a.rs = k;
        a.cs = 1;
    }
    const int rc = rd_ragged_rows(plan, k, n, c->ng, bounds, &a, wb, &out, 0);
    free(gathered);
    if (rc != 0)
        r->rc = rc;
    for (int g = 0; g < c->ng; g++)
        for (rd_int i = bounds[g]; i < bounds[g + 1]; i++) {
            const rd_int xi = idx != NULL ? (rd_int)idx[i] : i;
            for (rd_int j = 0; j < n; j++) {
                double want = 0.0, mag = 0.0;
                for (rd_int p = 0; p < k; p++) {
                    const double t = VAL(x, 0, xi, p) * VAL(w, g, p, j);
                    want += t;
                    mag += fabs(t);
                }
                check_value(r, &o, 0, i, j, want, mag, (double)k, 0.0);
                y[i * n + j] = obuf_get(&o, 0, i, j);
            }
        }
    if (obuf_guards(&o) != 0)
        note(r, "the separate product wrote outside its rows", 0, 0, 0, 0, 0);
    obuf_free(&o);
    return y;
}

/* A value rounded to the output dtype and back (16-bit: bfloat16). */
static float
round_dt(const case_t *c, float v)
{
    return c->out16 ? rd_bf16_to_float(rd_float_to_bf16(v)) : v;
}

static int
same_bits(const obuf_t *b, rd_int i, rd_int j, float want)
{
    if (b->es == 2) {
        uint16_t h, w = rd_float_to_bf16(want);
        memcpy(&h, obuf_at(b, 0, i, j), 2);
        return h == w;
    }
    uint32_t u, w;
    memcpy(&u, obuf_at(b, 0, i, j), 4);
    memcpy(&w, &want, 4);
    return u == w;
}

/* The gate and up products and the activation in one pass. */
static void
run_gated(const case_t *c, const char *family, result_t *r)
{
    rd_int bounds[9];
    const rd_int m = case_rows(c, bounds), k = c->k, n = c->n;
    const int ng = c->ng;
    /* with a row index: row i of the product is row idx[i] of x [m / 2 + 3, k] */
    const rd_int xrows = c->ridx ? m / 2 + 3 : m;
    opnd_t x, w0, w1;
    opnd_float(&x, 1, xrows, k, c->data, L_ROW);
    opnd_float(&w0, ng, k, n, c->data, L_ROW);
    opnd_float(&w1, ng, k, n, c->data, L_ROW);
    long long *idx = NULL;
    if (c->ridx) {
        idx = (long long *)xalloc(sizeof(long long) * (size_t)m);
        for (rd_int i = 0; i < m; i++)
            idx[i] = irand(0, (int)xrows - 1);
    }
    float *bias = NULL;
    if (c->bias) {
        bias = (float *)xalloc(sizeof(float) * (size_t)(2 * ng * n));
        for (rd_int e = 0; e < 2 * ng * n; e++)
            bias[e] = c->data == D_RAND ? frand() : (float)irand(-20, 20);
    }
    obuf_t *a = &r->out[0], *h0 = &r->out[1], *h1 = &r->out[2];
    r->nout = 3;
    for (int q = 0; q < 3; q++) {
        obuf_init(&r->out[q], 1, m, n, c->out16 ? 2 : 4);
        obuf_live(&r->out[q], 0, bounds[0], bounds[ng]);
    }
    rd_plan_t plan;
    void *p0 = NULL, *p1 = NULL;
    float *y0 = NULL, *y1 = NULL;
    if (case_plan(c, family, &plan, r) == 0) {
        const rd_in_t b0 = c->prepacked ? prepacked(&plan, &w0, ng, k, n, &p0, r) : w0.in;
        const rd_in_t b1 = c->prepacked ? prepacked(&plan, &w1, ng, k, n, &p1, r) : w1.in;
        rd_gated_out_t go;
        memset(&go, 0, sizeof go);
        go.ct = RD_CT_F32;
        go.dt = c->out16 ? RD_BF16 : RD_F32;
        go.kind = c->kind;
        go.limit = 7.0;
        go.alpha = RD_SWIGLU_ALPHA;
        go.b0 = bias;
        go.b1 = bias != NULL ? bias + ng * n : NULL;
        go.b_rs = n;
        go.a = obuf_at(a, 0, 0, 0);
        go.h0 = obuf_at(h0, 0, 0, 0);
        go.h1 = obuf_at(h1, 0, 0, 0);
        go.rs = a->rs;
        rd_in_t xi = x.in;
        xi.ridx = idx;
        if (r->rc == 0)
            r->rc = rd_gated_rows(&plan, k, n, ng, bounds, &xi, &b0, &b1, rd_gated_epilogue, &go, 0);
        r->tiles_ok = tiles_released(family);
        /* the projections: the separate products plus the biases, rounded */
        y0 = separate_rows(c, &plan, bounds, m, &x, idx, &w0, &b0, r);
        y1 = separate_rows(c, &plan, bounds, m, &x, idx, &w1, &b1, r);
        r->tiles_ok &= tiles_released(family);
    }
    else
        r->rc = -9;
    const rd_moe_ops_t *ops = &rd_moe_ops[RD_CT_F32];
    float g0[RD_GATED_MAX_COLS], g1[RD_GATED_MAX_COLS], act[RD_GATED_MAX_COLS];
    for (int g = 0; y0 != NULL && g < ng; g++)
        for (rd_int i = bounds[g]; i < bounds[g + 1]; i++) {
            for (rd_int j = 0; j < n; j++) {
                float v0 = y0[i * n + j], v1 = y1[i * n + j];
                if (bias != NULL) {
                    v0 += bias[g * n + j];
                    v1 += bias[(ng + g) * n + j];
                }
                g0[j] = round_dt(c, v0);
                g1[j] = round_dt(c, v1);
                if (!same_bits(h0, i, j, g0[j]) || !same_bits(h1, i, j, g1[j]))
                    note(r, "h0 or h1 is not the separate product's at", 0, i, j, obuf_get(h0, 0, i, j), g0[j]);
            }
            ops->gated_act(n, c->kind, 7.0, RD_SWIGLU_ALPHA, g0, g1, act);
            for (rd_int j = 0; j < n; j++)
                if (!same_bits(a, i, j, act[j]))
                    note(r, "the activation is not gated_act of h0, h1 at", 0, i, j, obuf_get(a, 0, i, j), act[j]);
        }
    free(y0);
    free(y1);
    free(p0);
    free(p1);
    free(idx);
    free(bias);
    opnd_free(&x);
    opnd_free(&w0);
    opnd_free(&w1);
}

/* The backward's first product with the activation's gradient. */
static void
run_grad(const case_t *c, const char *family, result_t *r)
{
    rd_int bounds[9];
    const rd_int m = case_rows(c, bounds), k = c->k, n = c->n;
    const int ng = c->ng;
    opnd_t dy, w;
    opnd_float(&dy, 1, m, k, c->data, L_ROW);
    opnd_float(&w, ng, k, n, c->data, L_ROW);
    /* h0, h1: the forward's kept projections (inputs, laid out as the outputs) */
    obuf_t hin[2];
    for (int q = 0; q < 2; q++) {
        obuf_init(&hin[q], 1, m, n, c->out16 ? 2 : 4);
        for (rd_int i = 0; i < m; i++)
            for (rd_int j = 0; j < n; j++)
                obuf_put(&hin[q], 0, i, j, frand());
    }
    obuf_t *d0 = &r->out[0], *d1 = &r->out[1];
    r->nout = 2;
    for (int q = 0; q < 2; q++) {
        obuf_init(&r->out[q], 1, m, n, c->out16 ? 2 : 4);
        obuf_live(&r->out[q], 0, bounds[0], bounds[ng]);
    }
    rd_plan_t plan;
    float *da = NULL;
    if (case_plan(c, family, &plan, r) == 0) {
        rd_gated_grad_t go;
        memset(&go, 0, sizeof go);
        go.ct = RD_CT_F32;
        go.dt = c->out16 ? RD_BF16 : RD_F32;
        go.kind = c->kind;
        go.limit = 7.0;
        go.alpha = RD_SWIGLU_ALPHA;
        go.h0 = obuf_at(&hin[0], 0, 0, 0);
        go.h1 = obuf_at(&hin[1], 0, 0, 0);
        go.dh0 = obuf_at(d0, 0, 0, 0);
        go.dh1 = obuf_at(d1, 0, 0, 0);
        go.rs = d0->rs;
        go.d_rs = d0->rs;
        r->rc = rd_gated_rows(&plan, k, n, ng, bounds, &dy.in, &w.in, NULL, rd_gated_grad_epilogue, &go, 0);
        r->tiles_ok = tiles_released(family);
        da = separate_rows(c, &plan, bounds, m, &dy, NULL, &w, &w.in, r);
        r->tiles_ok &= tiles_released(family);
    }
    else
        r->rc = -9;
    const rd_moe_ops_t *ops = &rd_moe_ops[RD_CT_F32];
    float h[2][RD_GATED_MAX_COLS], x[RD_GATED_MAX_COLS], dg[RD_GATED_MAX_COLS], du[RD_GATED_MAX_COLS];
    for (rd_int i = bounds[0]; da != NULL && i < bounds[ng]; i++) {
        for (rd_int j = 0; j < n; j++) {
            h[0][j] = obuf_get(&hin[0], 0, i, j);
            h[1][j] = obuf_get(&hin[1], 0, i, j);
            x[j] = round_dt(c, da[i * n + j]);
        }
        ops->gated_act_grad(n, c->kind, 7.0, RD_SWIGLU_ALPHA, h[0], h[1], x, dg, du);
        for (rd_int j = 0; j < n; j++)
            if (!same_bits(d0, i, j, dg[j]) || !same_bits(d1, i, j, du[j]))
                note(r, "dh0 or dh1 is not gated_act_grad of the separate product at", 0, i, j,
                     obuf_get(d0, 0, i, j), dg[j]);
    }
    free(da);
    obuf_free(&hin[0]);
    obuf_free(&hin[1]);
    opnd_free(&dy);
    opnd_free(&w);
}

/* The down product with the combine: T tokens of two slots each, sorted by
 * expert; out[token] += weight * (y + bias) rounded, in slot order. */
static void
run_combine(const case_t *c, const char *family, result_t *r)
{
    const rd_int T = 27, top = 2, m = T * top, k = c->k, n = c->n;
    const int ng = c->ng;
    /* each token's two distinct experts, then the slots in expert order */
    int expert[27 * 2];
    for (rd_int t = 0; t < T; t++) {
        expert[t * top] = irand(0, ng - 2);
        expert[t * top + 1] = irand(expert[t * top] + 1, ng - 1);
    }
    rd_int bounds[9] = {0};
    long long *tokens = (long long *)xalloc(sizeof(long long) * (size_t)m);
    rd_int at = 0;
    for (int g = 0; g < ng; g++) {
        for (rd_int s = 0; s < m; s++)
            if (expert[s] == g)
                tokens[at++] = s / top;
        bounds[g + 1] = at;
    }
    opnd_t h, w;
    opnd_float(&h, 1, m, k, c->data, L_ROW);
    opnd_float(&w, ng, k, n, c->data, L_ROW);
    float *wt = (float *)xalloc(sizeof(float) * (size_t)m);
    for (rd_int s = 0; s < m; s++)
        wt[s] = c->data == D_RAND ? frand() : (irand(0, 1) ? 0.5f : 0.25f);
    float *bias = NULL;
    if (c->bias) {
        bias = (float *)xalloc(sizeof(float) * (size_t)(ng * n));
        for (rd_int e = 0; e < ng * n; e++)
            bias[e] = c->data == D_RAND ? frand() : (float)irand(-20, 20);
    }
    obuf_t *o = &r->out[0];
    r->nout = 1;
    obuf_init(o, 1, T, n, 4);
    obuf_live(o, 0, 0, T);
    float *want = (float *)xalloc(sizeof(float) * (size_t)(T * n));
    for (rd_int t = 0; t < T; t++)
        for (rd_int j = 0; j < n; j++) {
            want[t * n + j] = c->data == D_RAND ? frand() : (float)irand(-50, 50);
            obuf_put(o, 0, t, j, want[t * n + j]);
        }
    rd_plan_t plan;
    void *packed = NULL;
    float *y = NULL;
    if (case_plan(c, family, &plan, r) == 0) {
        const rd_in_t b = c->prepacked ? prepacked(&plan, &w, ng, k, n, &packed, r) : w.in;
        rd_combine_t co;
        memset(&co, 0, sizeof co);
        co.ct = RD_CT_F32;
        co.dt = c->out16 ? RD_BF16 : RD_F32;
        co.bias = bias;
        co.b_rs = n;
        co.tokens = tokens;
        co.w = wt;
        co.out = obuf_at(o, 0, 0, 0);
        co.out_rs = o->rs;
        if (r->rc == 0)
            r->rc = rd_gated_rows(&plan, k, n, ng, bounds, &h.in, &b, NULL, rd_combine_epilogue, &co, 1);
        r->tiles_ok = tiles_released(family);
        y = separate_rows(c, &plan, bounds, m, &h, NULL, &w, &b, r);
        r->tiles_ok &= tiles_released(family);
    }
    else
        r->rc = -9;
    const rd_moe_ops_t *ops = &rd_moe_ops[RD_CT_F32];
    float row[RD_GATED_MAX_COLS];
    for (int g = 0; y != NULL && g < ng; g++)
        for (rd_int s = bounds[g]; s < bounds[g + 1]; s++) {
            for (rd_int j = 0; j < n; j++)
                row[j] = round_dt(c, bias != NULL ? y[s * n + j] + bias[g * n + j] : y[s * n + j]);
            ops->add_row(n, &wt[s], row, want + tokens[s] * n);
        }
    for (rd_int t = 0; y != NULL && t < T; t++)
        for (rd_int j = 0; j < n; j++)
            if (!same_bits(o, t, j, want[t * n + j]))
                note(r, "the combined output is not the separate product's at", 0, t, j, obuf_get(o, 0, t, j),
                     want[t * n + j]);
    free(y);
    free(want);
    free(packed);
    free(bias);
    free(wt);
    free(tokens);
    opnd_free(&h);
    opnd_free(&w);
}

/* One case with one family: its line, and whether it passed. */
static void
run_case(const case_t *c, const char *family, result_t *r)
{
    memset(r, 0, sizeof *r);
    r->kind = c->data == D_RAND || c->data == D_QF32 || c->data == D_QBF16 ? "bound" : "exact";
    r->bits = c->data != D_RAND;
    seed_with(c->name);
    if (rd_set_kernel(family) != 0) {
        r->rc = -9;
        snprintf(r->first, sizeof r->first, "rd_set_kernel(\"%s\") refused", family);
    }
    else if (c->op == OP_ROWS)
        run_rows(c, family, r);
    else if (c->op == OP_CONTRACT)
        run_contract(c, family, r);
    else if (c->op == OP_GATED)
        run_gated(c, family, r);
    else if (c->op == OP_GRAD)
        run_grad(c, family, r);
    else
        run_combine(c, family, r);
    uint64_t hash = 1469598103934665603ull;
    for (int q = 0; q < r->nout; q++) {
        r->guards += obuf_guards(&r->out[q]);
        hash = fnv(hash, r->out[q].mem, r->out[q].count * r->out[q].es);
    }
    const int ok = r->rc == 0 && r->bad == 0 && r->guards == 0 && r->tiles_ok && r->checked > 0;
    char ref[64];
    if (r->bad)
        snprintf(ref, sizeof ref, "BAD(%ld/%ld)", r->bad, r->checked);
    else if (strcmp(r->kind, "bound") == 0)
        snprintf(ref, sizeof ref, "within(%ld,worst=%.3f)", r->checked, r->worst);
    else
        snprintf(ref, sizeof ref, "equal(%ld)", r->checked);
    printf("case %s %s %s match=%s hash=%016llx ref=%s guards=%s tiles=%s %s", c->name, family, r->kind,
           r->bits ? "bits" : "bound", (unsigned long long)hash, ref, r->guards ? "CHANGED" : "ok",
           r->tiles_ok ? "released" : "HELD", ok ? "ok" : "FAIL");
    if (!ok)
        printf(" (rc %d%s%s)", r->rc, r->first[0] ? ": " : "", r->first);
    printf("\n");
    fflush(stdout);
    if (!ok)
        failures++;
}

static float
bits_value(uint32_t u, size_t es)
{
    return es == 2 ? rd_bf16_to_float((uint16_t)u) : rd_bits_to_float(u);
}

/* Native against twin, element by element. */
static void
compare(const case_t *c, const result_t *nat, const result_t *twin)
{
    long differ = 0, total = 0;
    char first[160] = "";
    for (int q = 0; q < nat->nout && q < twin->nout; q++) {
        const obuf_t *a = &nat->out[q], *b = &twin->out[q];
        for (size_t e = 0; e < a->count; e++) {
            total++;
            if (memcmp(a->mem + e * a->es, b->mem + e * b->es, a->es) == 0)
                continue;
            if (differ++ == 0) {
                const rd_int x = (rd_int)e - a->off;
                uint32_t u = 0, v = 0;
                memcpy(&u, a->mem + e * a->es, a->es);
                memcpy(&v, b->mem + e * b->es, b->es);
                snprintf(first, sizeof first, "output %d at (%ld, %ld, %ld): amx %.9g (0x%x), twin %.9g (0x%x)",
                         q, (long)(x / a->gs), (long)(x % a->gs / a->rs), (long)(x % a->gs % a->rs),
                         (double)bits_value(u, a->es), u, (double)bits_value(v, b->es), v);
            }
        }
    }
    const int ok = !nat->bits || differ == 0;
    if (differ == 0)
        printf("same %s equal %s\n", c->name, ok ? "ok" : "FAIL");
    else
        printf("same %s differ %ld of %ld (%s) %s\n", c->name, differ, total, first, ok ? "ok" : "FAIL");
    if (!ok)
        failures++;
}

static void
free_result(result_t *r)
{
    for (int q = 0; q < r->nout; q++)
        obuf_free(&r->out[q]);
}

/* ---------------------------------------------- the permission request */

/* The refused request, simulated: the family is not runnable and says
 * why, the products go to other kernels, the peak probe does not run
 * tiles; then, asked again, the OS's answer is back. */
static void
check_refusals(void)
{
    const int granted = rd_amx_unavailable() == NULL;
    static const int errs[3] = {EPERM, EINVAL, ENOSPC};
    for (int e = 0; e < 3; e++) {
        rd_amx_simulate_refusal(errs[e]);
        const char *why = rd_amx_unavailable();
        int ok;
        if (granted) {
            ok = why != NULL && strstr(why, "refused") != NULL && strstr(why, strerror(errs[e])) != NULL
                 && (errs[e] != ENOSPC || strstr(why, "sigaltstack") != NULL)
                 && rd_set_kernel("amx") == -2 && rd_set_kernel("auto") == 0
                 && rd_bf16_product(0) != RD_CT_BF16TILE && rd_int8_product() != RD_CT_U8S8TILE
                 && strcmp(rd_kernel_for(RD_CT_BF16TILE), "none") == 0
                 && rd_peak_gflops("amx_bf16", 0.001) == 0.0;
        }
        else   /* no AMX here: the CPU's answer comes first, unchanged */
            ok = why != NULL && strstr(why, "refused") == NULL && rd_set_kernel("amx") == -2;
        printf("perm refused-%s %s: %s\n", strerror(errs[e]), ok ? "ok" : "FAIL", why ? why : "(runnable)");
        if (!ok)
            failures++;
    }
    /* asked again: as before; where granted, the peak probe's own tile
     * loops run (and release their tiles) */
    rd_amx_simulate_refusal(0);
    const char *why = rd_amx_unavailable();
    const int ok = granted ? why == NULL && rd_set_kernel("amx") == 0 && rd_peak_gflops("amx_bf16", 0.001) > 0.0
                             && rd_peak_gflops("amx_int8", 0.001) > 0.0 && native_tiles_released()
                           : why != NULL;
    printf("perm asked-again %s: %s\n", ok ? "ok" : "FAIL", why ? why : "runnable");
    if (!ok)
        failures++;
    rd_set_kernel("auto");
}

/* ------------------------------------------------ few rows a group */

/* rows [0, m) of lhs by rd_ragged_rows with `plan` (b: the weights as
 * read), into out [m, n]; the call's status. */
static int
few_rows(const rd_plan_t *plan, const rd_int *bounds, int ng, rd_int k, rd_int n, const opnd_t *lhs,
         const rd_in_t *b, float *out)
{
    const rd_out_t o = {out, 0, n, 1, RD_F32};
    return rd_ragged_rows(plan, k, n, ng, bounds, &lhs->in, b, &o, 0);
}

/* int8 at a few rows a group, each family chosen by the runtime ("auto"):
 * the plan takes the vector kernels that read the tiles' B layout, with
 * the tile's KC, and gives the exact values (every partial sum is exact)
 * and the bits of the tiles (forced by a plan entry), plain and prepacked.
 * Where no family serves the tiles or their vector type, says so. */
static void
check_few_rows_vector(void)
{
    rd_set_kernel("auto");
    const char *vec = rd_kernel_for(RD_CT_U8S8);
    if (rd_int8_product() != RD_CT_U8S8TILE || strcmp(vec, "none") == 0) {
        printf("few-rows-vector skipped: int8 served by %s, its vector type by %s\n",
               rd_kernel_for(rd_int8_product()), vec);
        return;
    }
    enum { NG = 6 };
    static const rd_int sizes[NG] = {1, 3, 0, 4, 2, 1};
    rd_int bounds[NG + 1] = {0};
    for (int g = 0; g < NG; g++)
        bounds[g + 1] = bounds[g] + sizes[g];
    const rd_int m = bounds[NG], k = 700, n = 70;   /* k across the tiles' KC (512) */
    opnd_t lhs, rhs;
    opnd_i8(&lhs, 1, m, k, 1, k, 1);
    opnd_i8(&rhs, NG, k, n, k, 1, 1);
    rd_plan_t plan, chosen;
    rd_plan_init(&plan, RD_CT_U8S8TILE);
    chosen = plan;
    rd_plan_choose(&chosen, 0, k, n, NG, bounds, 0, 1);
    const long kc = (long)chosen.k.kc;
    int ok = chosen.ct == RD_CT_U8S8 && kc == (long)plan.k.kc && strcmp(chosen.family, vec) == 0;
    result_t pr;
    memset(&pr, 0, sizeof pr);
    void *mem = NULL;
    const rd_in_t packed = prepacked(&plan, &rhs, NG, k, n, &mem, &pr);
    float *out[3];
    int rc = pr.rc;
    for (int q = 0; q < 3; q++)
        out[q] = (float *)xalloc(sizeof(float) * (size_t)(m * n));
    rd_plan_record(1);
    rc |= few_rows(&plan, bounds, NG, k, n, &lhs, &rhs.in, out[0]);
    rd_plan_record(0);
    rc |= few_rows(&plan, bounds, NG, k, n, &lhs, &packed, out[1]);
    /* the tiles, by a plan entry for the class of the call */
    rd_pclass_t cls;
    rd_pchoice_t tiles;
    ok = ok && rd_plan_recorded(&cls, 1) == 1;
    rd_plan_default(&cls, &plan.k, &plan.s, &tiles);
    tiles.kind = RD_KIND_MAIN;
    rc |= rd_plan_set(&cls, &tiles);
    chosen = plan;
    rd_plan_choose(&chosen, 0, k, n, NG, bounds, 0, 1);
    ok = ok && chosen.ct == RD_CT_U8S8TILE;
    rc |= few_rows(&plan, bounds, NG, k, n, &lhs, &rhs.in, out[2]);
    rd_plan_set(&cls, NULL);
    long bad = 0;
    for (int g = 0; g < NG; g++)
        for (rd_int i = bounds[g]; i < bounds[g + 1]; i++)
            for (rd_int j = 0; j < n; j++) {
                double want = 0.0;
                for (rd_int p = 0; p < k; p++)
                    want += VAL(&lhs, 0, i, p) * VAL(&rhs, g, p, j);
                bad += (double)out[0][i * n + j] != want;
            }
    const int same = memcmp(out[0], out[1], sizeof(float) * (size_t)(m * n)) == 0
                     && memcmp(out[0], out[2], sizeof(float) * (size_t)(m * n)) == 0;
    ok = ok && rc == 0 && bad == 0 && same && native_tiles_released();
    printf("few-rows-vector %s: the vector kernels of %s, KC %ld (the tiles' %ld), %ld of %ld values off, bits of "
           "the tiles and prepacked %s\n", ok ? "ok" : "FAIL", vec, kc, (long)plan.k.kc, bad, (long)(m * n),
           same ? "equal" : "differ");
    if (!ok)
        failures++;
    for (int q = 0; q < 3; q++)
        free(out[q]);
    free(mem);
    opnd_free(&lhs);
    opnd_free(&rhs);
}

/* The release check can fail: a configuration loaded here is seen, and
 * released is not. */
static int
native_release_check_works(void)
{
    /* palette 1, one tile of 16 rows x 64 bytes (LDTILECFG's block) */
    static const struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg __attribute__((aligned(64))) = {1, 0, {0}, {64}, {16}};
    const int before = native_tiles_released();
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg) : "memory");
    const int loaded = !native_tiles_released();
    __asm__ volatile("tilerelease" ::: "memory");
    return before && loaded && native_tiles_released();
}

int
main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    const char *why = rd_amx_unavailable();
    printf("amx %s\n", why == NULL ? "runnable" : why);
    if (why == NULL) {
        const int works = native_release_check_works();
        printf("release-check %s\n", works ? "ok" : "FAIL");
        if (!works)
            failures++;
    }
    const char *families[2] = {"amx", "amx-twin"};
    int cases = 0;
    for (int i = 0; i < NCASES; i++) {
        const case_t *c = &CASES[i];
        if (only != NULL && strstr(c->name, only) == NULL)
            continue;
        result_t res[2];
        int ran[2] = {0, 0};
        for (int f = 0; f < 2; f++) {
            if (f == 0 && why != NULL)
                continue;
            run_case(c, families[f], &res[f]);
            ran[f] = 1;
        }
        if (ran[0] && ran[1])
            compare(c, &res[0], &res[1]);
        for (int f = 0; f < 2; f++)
            if (ran[f])
                free_result(&res[f]);
        cases++;
    }
    if (only == NULL) {
        if (why == NULL)
            check_few_rows_vector();
        check_refusals();
    }
    printf("summary %d cases, %d failures\n", cases, failures);
    return failures ? 1 : 0;
}
