/*
 * The twin of the AMX tile micro-kernels (family "amx-twin"): the kernels
 * of kernels/rd_amx_body.h over eight tile registers emulated in plain C,
 * compiled on every architecture and runnable on every CPU (chosen only by
 * name), so that the packing, the chunking of the contraction, the edges
 * and the epilogues of the tile kernels are tested wherever the suite runs.
 *
 * Arithmetic: int8 exactly as TDPBUSD (products of unsigned and signed
 * bytes summed in int32, modulo 2^32).  bfloat16: the order of Intel's
 * pseudocode for TDPBF16PS (per pair the even element's product, then the
 * odd one's, each added with one rounding to nearest even), denormal
 * inputs (and a denormal accumulator) read as 0 and denormal results
 * flushed to 0; the instruction's own order is undocumented (SPEC), so
 * native and twin agree bit for bit where every partial sum is exact, and
 * both stay within the error bound of a float32 sum elsewhere.
 */
#include "rd_frame.h"
#include "rd_amx.h"
#include "rd_dot_arith.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The emulated tile registers of a thread, and whether its configuration is
 * loaded.  rd_amx_twin_held counts the threads holding one now,
 * rd_amx_twin_strays the tile operations run without one (a driver that
 * forgot TENTER or ran a kernel after the release): both 0 between calls. */
typedef struct {
    unsigned char r[16][64];
} rd_tile_t;

static __thread rd_tile_t rd_tmm[8];
static __thread int rd_twin_loaded = 0;
static int rd_amx_twin_held = 0;
static long rd_amx_twin_strays = 0;

static void
rd_twin_enter(void)
{
    if (!rd_twin_loaded) {
        memset(rd_tmm, 0, sizeof rd_tmm);
        rd_twin_loaded = 1;
        __atomic_add_fetch(&rd_amx_twin_held, 1, __ATOMIC_RELAXED);
    }
}

static void
rd_twin_release(void)
{
    if (rd_twin_loaded) {
        rd_twin_loaded = 0;
        __atomic_sub_fetch(&rd_amx_twin_held, 1, __ATOMIC_RELAXED);
    }
}

void
rd_amx_twin_state(int *held, long *strays)
{
    *held = __atomic_load_n(&rd_amx_twin_held, __ATOMIC_RELAXED);
    *strays = __atomic_load_n(&rd_amx_twin_strays, __ATOMIC_RELAXED);
}

static inline void
rd_twin_check(void)
{
    if (!rd_twin_loaded)
        __atomic_add_fetch(&rd_amx_twin_strays, 1, __ATOMIC_RELAXED);
}

static void
rd_twin_load(rd_tile_t *t, const void *p, long stride)
{
    rd_twin_check();
    for (int i = 0; i < 16; i++)
        memcpy(t->r[i], (const char *)p + i * stride, 64);
}

static void
rd_twin_store(const rd_tile_t *t, void *p, long stride)
{
    rd_twin_check();
    for (int i = 0; i < 16; i++)
        memcpy((char *)p + i * stride, t->r[i], 64);
}

static void
rd_twin_zero(rd_tile_t *t)
{
    rd_twin_check();
    memset(t, 0, sizeof *t);
}

/* C[16 x 16] float32 += A[16 x 16 pairs] . B[16 pair rows x 16 columns],
 * pair by pair, even element first, each step a correctly rounded fused
 * multiply-add: the product of two bfloat16 values is exact in double, and
 * its sum with a float32 rounded to double and then to float32 is the
 * correctly rounded float32 sum (double has more than 2 x 24 + 2 bits: the
 * two roundings never differ from one), on every CPU and compiler. */
static void
rd_twin_dpbf16(rd_tile_t *ct, const rd_tile_t *at, const rd_tile_t *bt)
{
    rd_twin_check();
    float b[16][32];
    for (int q = 0; q < 16; q++)
        for (int e = 0; e < 32; e++) {
            uint16_t h;
            memcpy(&h, bt->r[q] + 2 * e, 2);
            b[q][e] = rd_bf16_daz(h);
        }
    for (int i = 0; i < 16; i++) {
        float acc[16], a[32];
        memcpy(acc, ct->r[i], 64);
        for (int j = 0; j < 16; j++)
            acc[j] = rd_f32_daz(acc[j]);
        for (int p = 0; p < 32; p++) {
            uint16_t h;
            memcpy(&h, at->r[i] + 2 * p, 2);
            a[p] = rd_bf16_daz(h);
        }
        for (int q = 0; q < 16; q++)
            for (int e = 0; e < 2; e++)
                for (int j = 0; j < 16; j++)
                    acc[j] = rd_f32_daz((float)((double)a[2 * q + e] * (double)b[q][2 * j + e] + (double)acc[j]));
        memcpy(ct->r[i], acc, 64);
    }
}

/* C[16 x 16] int32 += A[16 x 16 quads] (unsigned) . B[16 quad rows x 16
 * columns] (signed), modulo 2^32. */
static void
rd_twin_dpbusd(rd_tile_t *ct, const rd_tile_t *at, const rd_tile_t *bt)
{
    rd_twin_check();
    for (int i = 0; i < 16; i++) {
        uint32_t acc[16];
        memcpy(acc, ct->r[i], 64);
        for (int q = 0; q < 16; q++)
            for (int j = 0; j < 16; j++) {
                uint32_t s = 0;
                for (int e = 0; e < 4; e++)
                    s += (uint32_t)((int32_t)at->r[i][4 * q + e] * (int32_t)(int8_t)bt->r[q][4 * j + e]);
                acc[j] += s;
            }
        memcpy(ct->r[i], acc, 64);
    }
}

#define TLOAD(t, p, s) rd_twin_load(&rd_tmm[t], (p), (long)(s))
#define TSTORE(t, p, s) rd_twin_store(&rd_tmm[t], (p), (long)(s))
#define TZERO(t) rd_twin_zero(&rd_tmm[t])
#define TDPBF16(c, a, b) rd_twin_dpbf16(&rd_tmm[c], &rd_tmm[a], &rd_tmm[b])
#define TDPBUSD(c, a, b) rd_twin_dpbusd(&rd_tmm[c], &rd_tmm[a], &rd_tmm[b])
#define TENTER() rd_twin_enter()
#define RD_TNAME(x) rd_amxtwin_##x
#define RD_TTARGET
#include "rd_amx_body.h"   /* (which undefines the macros above) */

/* ------------------------------------------------------------- family */

static int
rd_always(void)
{
    return 1;
}

const rd_family_t rd_family_amx_twin = {
    "amx-twin", rd_always,
    {[RD_CT_BF16TILE] = RD_AMX_BF16_DESC(rd_amxtwin_bf16, rd_twin_release),
     [RD_CT_U8S8TILE] = RD_AMX_U8S8_DESC(rd_amxtwin_u8s8, rd_twin_release)},
    1, {{NULL, 0, 0}}, {{NULL, 0, NULL, 0}},
};
