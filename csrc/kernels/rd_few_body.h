/*
 * The shape shared by the few-row kernels (rd_fukr_t) of every instruction
 * set (rd_avx512_few.c, rd_avx2_few.c, rd_neon_few.c): one to four rows of
 * a packed A panel times a run of prepacked B micro-panels, several panels
 * at once, so that each column's chain of dependent multiply-adds (one a
 * step, whose latency bounds a panel taken alone) overlaps the others', and
 * each B vector is decoded once for all the rows.
 *
 * Bits: every element is what the family's micro-kernel of the same type
 * gives it (the same widening, (w - z) * s per column and run, one fused
 * multiply-add a step from zero, stored or added to C once); only the order
 * of independent elements changes.
 *
 * The includer defines, before including this file:
 *   FEW_ATTR          the functions' attributes (the instruction set)
 *   FEW_V, FEW_W      the vector type and its float32 lanes; a micro-panel
 *                     is NR = 2 FEW_W columns
 *   FEW_MR            the rows of a packed A panel (A[i][p] at a[p MR + i])
 *   FEW_P1, FEW_P2, FEW_P4  the most panels at once for one row, for two
 *                     and for three or four (a power of two, at most 8)
 *   FEW_ZERO(), FEW_LOADU(p), FEW_SUB(x, y), FEW_MUL(x, y)
 *   FEW_FMA(acc, w, a)  acc + w * (*a), fused (a: a float of A)
 *   rd_few_consts_t, rd_few_consts(): what the decoders keep in registers
 *   rd_few_widen(kind, bp, &w0, &w1, &k): one step of a panel, widened
 *   rd_few_e8m0(e, &s0, &s1): the scales of a run's e8m0 exponents
 *   rd_few_put(v, c, cs_c, cols, mode): FEW_W columns of a row of C, cols
 *                     of them valid, stored or added
 * and FK_STEP(kind), the bytes of a step of a panel of each kind below.
 * Included twice: first for the kinds (before FEW_ATTR is defined), then
 * for the bodies.
 */
#ifndef RD_FEW_BODY_H
#define RD_FEW_BODY_H

#include "rd_kernel.h"

#include <string.h>

#define RD_INLINE inline __attribute__((always_inline))

/* The panel encodings (rd_kernel.h, the compute types) */
enum { FK_F32, FK_BF16, FK_F16, FK_I8, FK_F8, FK_F4, FK_I4 };

#define FK_QUANTIZED(kind) ((kind) == FK_I8 || (kind) == FK_F8 || (kind) == FK_F4 || (kind) == FK_I4)

#endif /* RD_FEW_BODY_H */

#if defined(FEW_ATTR) && !defined(RD_FEW_BODIES)
#define RD_FEW_BODIES

/* R rows x P panels (kind, R, P and zp constants: the loops unroll and the
 * accumulators stay in registers). */
FEW_ATTR static RD_INLINE void
rd_few_body(const int kind, const int R, const int P, const int zp, rd_int kc, const float *a,
            const char *b, size_t bstep, float *c, rd_int rs_c, rd_int cs_c, rd_int n, int mode)
{
    const rd_int SB = FK_STEP(kind), NR = 2 * FEW_W;
    const rd_few_consts_t k = rd_few_consts();
    const int quantized = FK_QUANTIZED(kind);
    FEW_V acc[4][8][2];
    for (int i = 0; i < R; i++)
        for (int q = 0; q < P; q++)
            acc[i][q][0] = acc[i][q][1] = FEW_ZERO();
    rd_qtrailer_t h = {(int)kc, (int)kc, 0, 0};
    if (quantized)
        memcpy(&h, b + SB * kc, sizeof h);
    rd_int p = 0, len = h.first;
    for (rd_int r = 0; p < kc; r++, len = h.tile) {
        FEW_V s[8][2], z[8][2];
        for (int q = 0; q < P; q++) {
            const char *tr = b + q * bstep + SB * kc;
            s[q][0] = s[q][1] = z[q][0] = z[q][1] = FEW_ZERO();
            if (kind == FK_F4) {
                rd_few_e8m0((const uint8_t *)(tr + RD_F4RUN(r, NR)), &s[q][0], &s[q][1]);
            } else if (quantized) {
                const float *sv = (const float *)(const void *)(tr + RD_QRUN(r, NR, zp));
                s[q][0] = FEW_LOADU(sv);
                s[q][1] = FEW_LOADU(sv + FEW_W);
                if (zp) {
                    z[q][0] = FEW_LOADU(sv + NR);
                    z[q][1] = FEW_LOADU(sv + NR + FEW_W);
                }
            }
        }
        const rd_int end = kc - p < len ? kc : p + len;
        for (; p < end; p++) {
            const char *bp = b + p * SB;
            for (int q = 0; q < P; q++) {
                FEW_V w0, w1;
                rd_few_widen(kind, bp + q * bstep, &w0, &w1, &k);
                /* (w - z) * s; without zero points w * s, the same value */
                if (quantized && zp) {
                    w0 = FEW_SUB(w0, z[q][0]);
                    w1 = FEW_SUB(w1, z[q][1]);
                }
                if (quantized) {
                    w0 = FEW_MUL(w0, s[q][0]);
                    w1 = FEW_MUL(w1, s[q][1]);
                }
                for (int i = 0; i < R; i++) {
                    acc[i][q][0] = FEW_FMA(acc[i][q][0], w0, a + p * FEW_MR + i);
                    acc[i][q][1] = FEW_FMA(acc[i][q][1], w1, a + p * FEW_MR + i);
                }
            }
        }
    }
    for (int i = 0; i < R; i++)
        for (int q = 0; q < P; q++) {
            float *cq = c + i * rs_c + q * NR * cs_c;
            rd_few_put(acc[i][q][0], cq, cs_c, n - q * NR, mode);
            rd_few_put(acc[i][q][1], cq + FEW_W * cs_c, cs_c, n - q * NR - FEW_W, mode);
        }
}

/* Panels q on of the call in runs of P (a constant), while P fit. */
#define RD_FEW_RUN(KIND, R, P, ZP, PMAX)                                    \
    if ((P) <= (PMAX))                                                      \
        for (; q + (P) <= np; q += (P))                                     \
            rd_few_body(KIND, R, (P) <= (PMAX) ? (P) : 1, ZP, kc, a, b + q * bstep, bstep, \
                        c + q * 2 * FEW_W * cs_c, rs_c, cs_c, n - q * 2 * FEW_W, mode);

/* A kernel of one kind (and with or without zero points): one row in runs
 * of FEW_P1, ..., 2, 1 panels, two rows in runs of FEW_P2, ..., 1, three
 * or four rows in runs of FEW_P4, ..., 1. */
#define RD_FEW_KERNEL(NAME, KIND, ZP)                                       \
FEW_ATTR static void                                                        \
NAME(rd_int kc, const float *a, const char *b, size_t bstep, float *c,      \
     rd_int rs_c, rd_int cs_c, int m, rd_int n, int mode)                   \
{                                                                           \
    const rd_int np = (n + 2 * FEW_W - 1) / (2 * FEW_W);                    \
    rd_int q = 0;                                                           \
    if (m == 1) {                                                           \
        RD_FEW_RUN(KIND, 1, 8, ZP, FEW_P1)                                  \
        RD_FEW_RUN(KIND, 1, 4, ZP, FEW_P1)                                  \
        RD_FEW_RUN(KIND, 1, 2, ZP, FEW_P1)                                  \
        RD_FEW_RUN(KIND, 1, 1, ZP, FEW_P1)                                  \
    } else if (m == 2) {                                                    \
        RD_FEW_RUN(KIND, 2, 8, ZP, FEW_P2)                                  \
        RD_FEW_RUN(KIND, 2, 4, ZP, FEW_P2)                                  \
        RD_FEW_RUN(KIND, 2, 2, ZP, FEW_P2)                                  \
        RD_FEW_RUN(KIND, 2, 1, ZP, FEW_P2)                                  \
    } else if (m == 3) {                                                    \
        RD_FEW_RUN(KIND, 3, 4, ZP, FEW_P4)                                  \
        RD_FEW_RUN(KIND, 3, 2, ZP, FEW_P4)                                  \
        RD_FEW_RUN(KIND, 3, 1, ZP, FEW_P4)                                  \
    } else {                                                                \
        RD_FEW_RUN(KIND, 4, 4, ZP, FEW_P4)                                  \
        RD_FEW_RUN(KIND, 4, 2, ZP, FEW_P4)                                  \
        RD_FEW_RUN(KIND, 4, 1, ZP, FEW_P4)                                  \
    }                                                                       \
}

/* The entry point (rd_fukr_t) of a kind without zero points (the float and
 * 16-bit types, 4-bit floats); and of a quantized kind that may have them,
 * the kernel with or without as the panel's trailer says. */
#define RD_FEW_DEFINE(NAME, KIND)                                           \
RD_FEW_KERNEL(NAME##_plain, KIND, 0)                                        \
void                                                                        \
NAME(rd_int kc, const void *a, const void *b, size_t bstep, void *c,        \
     rd_int rs_c, rd_int cs_c, int m, rd_int n, int mode)                   \
{                                                                           \
    NAME##_plain(kc, (const float *)a, (const char *)b, bstep, (float *)c, rs_c, cs_c, m, n, mode); \
}
#define RD_FEW_DEFINE_ZP(NAME, KIND)                                        \
RD_FEW_KERNEL(NAME##_plain, KIND, 0)                                        \
RD_FEW_KERNEL(NAME##_zp, KIND, 1)                                           \
void                                                                        \
NAME(rd_int kc, const void *a, const void *b, size_t bstep, void *c,        \
     rd_int rs_c, rd_int cs_c, int m, rd_int n, int mode)                   \
{                                                                           \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, (const char *)b + FK_STEP(KIND) * kc, sizeof h);             \
    (h.zp ? NAME##_zp : NAME##_plain)(kc, (const float *)a, (const char *)b, bstep, (float *)c, rs_c, \
                                     cs_c, m, n, mode);                     \
}

#endif /* FEW_ATTR */
