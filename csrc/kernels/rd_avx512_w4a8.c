/*
 * AVX-512 VNNI kernels of the w4a8 types (RD_CT_U8S8_I4, RD_CT_U8S8_F4;
 * rd_kernel.h): 4-bit weights times int8 rows on vpdpbusd, for the family
 * "avx512-vnni" (kernels/rd_avx512_dot.c); their twin is in
 * kernels/rd_dot_twins.c.
 *
 * Decoding: a quad step of a 32-column panel is 64 bytes, byte t holding
 * the codes of columns t/4 (low nibble) and 16 + t/4 (high nibble) at step
 * t%4: one mask and one shift give the two vectors of codes, and one
 * vpshufb each (a 16-entry table in every 128-bit lane) turns them into
 * the k-quads of int8-dot's B, columns 0-15 and 16-31.  The table holds
 * value + 128, an unsigned byte, so that B is the instruction's unsigned
 * operand and A (packed signed) its signed one; S then exceeds the sum of
 * the products by 128 ra (ra: the row's sum over the block, in A's
 * trailer), taken back out before the epilogue of RD_CT_U8S8.
 *
 *   rd_w4a8_avx512_i4 / _f4 (12 x 32): the micro-kernels, one body per row
 *       count 4, 8, 12, as the int8-dot kernel.
 *   rd_w4a8_few_avx512_i4 / _f4 (rd_fukr_t, 1-4 rows): several panels at
 *       once, so that the chains of dependent vpdpbusd overlap and each B
 *       vector is decoded once for all the rows (decoding, where the time
 *       is that of reading the weights).
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "rd_avx512_body.h"
#include "rd_avx512_w4a8.h"

#define RD_W4_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define RD_W4_INLINE inline __attribute__((always_inline))

/* the values of the codes (int4: (c ^ 8) - 8; float4_e2m1fn: 2 e2m1(c)),
 * as signed bytes [0], and + 128 as unsigned ones [1] */
static const uint8_t rd_w4_tables[2][2][16] = {
    {{0, 1, 2, 3, 4, 5, 6, 7, 248, 249, 250, 251, 252, 253, 254, 255},
     {128, 129, 130, 131, 132, 133, 134, 135, 120, 121, 122, 123, 124, 125, 126, 127}},
    {{0, 1, 2, 3, 4, 6, 8, 12, 0, 255, 254, 253, 252, 250, 248, 244},
     {128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116}},
};

RD_W4_TARGET static RD_W4_INLINE __m512i
rd_w4_table(int f4, int offset)
{
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)rd_w4_tables[f4][offset]));
}

/* One quad step of a panel, decoded by the table tab: columns 0-15 (b0)
 * and 16-31 (b1). */
RD_W4_TARGET static RD_W4_INLINE void
rd_w4_decode(const char *bq, __m512i tab, __m512i *b0, __m512i *b1)
{
    const __m512i low = _mm512_set1_epi8(0x0f);
    const __m512i v = _mm512_loadu_si512((const void *)bq);
    *b0 = _mm512_shuffle_epi8(tab, _mm512_and_si512(v, low));
    *b1 = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
}

/* The scales of run r of a panel's 32 columns (tr: its trailer): floats,
 * or 2^(e - 128) of the exponent bytes e (2^(e - 127), as rd_e8m0_to_float
 * makes it, halved: exact). */
RD_W4_TARGET static RD_W4_INLINE void
rd_w4_scales(int f4, const char *tr, rd_int r, __m512 *s0, __m512 *s1)
{
    if (!f4) {
        const char *sv = tr + RD_QRUN(r, 32, 0);
        *s0 = _mm512_loadu_ps(sv);
        *s1 = _mm512_loadu_ps(sv + 64);
        return;
    }
    const uint8_t *ev = (const uint8_t *)tr + RD_F4RUN(r, 32);
    *s0 = _mm512_mul_ps(rd_avx512_e8m0(ev), _mm512_set1_ps(0.5f));
    *s1 = _mm512_mul_ps(rd_avx512_e8m0(ev + 16), _mm512_set1_ps(0.5f));
}

/* RD_CT_U8S8's epilogue of a run's sums: (float)(S - 128 x) * (sa * sb),
 * x the sums the offset of one side added (B's column sums, or A's row
 * sum; x128 = 128 x), t = S - 128 x the exact sum of the products (modulo
 * 2^32); sa broadcast. */
RD_W4_TARGET static RD_W4_INLINE __m512
rd_w4_finish(__m512i s, __m512i x128, __m512 sa, __m512 sb)
{
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s, x128)), _mm512_mul_ps(sa, sb));
}

/* ------------------------------------------------------- micro-kernels
 *
 * A + 128 (unsigned, as int8-dot packs it) times B decoded signed; B's
 * column sums of the run (vpdpbusd of bytes 1 by B) take the 128 back. Each
 * run's result goes to C as the blocks cut at the scale tiles of the
 * one-byte layout go: stored (or added) for the first run, added after. */

#define W_DECL(i) __m512i c##i##0, c##i##1;
#define W_ZERO(i) c##i##0 = c##i##1 = _mm512_setzero_si512();
#define W_STEP(i)                                                           \
    {                                                                       \
        const __m512i av = _mm512_set1_epi32(a32[i]);                       \
        c##i##0 = rd_avx512_dpbusd(c##i##0, av, b0);                                \
        c##i##1 = rd_avx512_dpbusd(c##i##1, av, b1);                                \
    }
#define W_FINISH(i)                                                         \
    const __m512 f##i##0 = rd_w4_finish(c##i##0, cb0, _mm512_set1_ps(sa[i]), sb0); \
    const __m512 f##i##1 = rd_w4_finish(c##i##1, cb1, _mm512_set1_ps(sa[i]), sb1);
#define W_PUT(i) s_store_row(c + (i) * rs_c, f##i##0, f##i##1, put);
#define W_SPILL(i)                                                          \
    _mm512_store_ps(buf + (i) * 32, f##i##0);                               \
    _mm512_store_ps(buf + (i) * 32 + 16, f##i##1);

#define RD_W4_BODY(NAME, F4, R, ROWS)                                       \
RD_W4_TARGET static void                                                    \
NAME(rd_int kc, const void *a_, const void *b_, float *c, rd_int rs_c, rd_int cs_c, int m, int n, int mode) \
{                                                                           \
    const rd_int kq = (kc + 3) / 4 * 4;                                     \
    const int32_t *a32 = (const int32_t *)a_;                               \
    const char *b = (const char *)b_, *tb = (const char *)b_ + 16 * kq;     \
    const float *sa = (const float *)(const void *)((const char *)a_ + 12 * kq + 48); \
    const __m512i tab = rd_w4_table(F4, 0), ones = _mm512_set1_epi8(1);     \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, tb, sizeof h);                                               \
    ROWS(W_DECL)                                                            \
    rd_int p = 0;                                                           \
    for (rd_int r = 0; p < kc; r++) {                                       \
        const rd_int end = rd_qrun_end(&h, r, kc);                     \
        __m512i cb0 = _mm512_setzero_si512(), cb1 = _mm512_setzero_si512(); \
        ROWS(W_ZERO)                                                        \
        for (; p < end; p += 4) {                                           \
            __m512i b0, b1;                                                 \
            rd_w4_decode(b, tab, &b0, &b1);                                 \
            cb0 = rd_avx512_dpbusd(cb0, ones, b0);                                  \
            cb1 = rd_avx512_dpbusd(cb1, ones, b1);                                  \
            ROWS(W_STEP)                                                    \
            a32 += 12;                                                      \
            b += 64;                                                        \
        }                                                                   \
        __m512 sb0, sb1;                                                    \
        rd_w4_scales(F4, tb, r, &sb0, &sb1);                                \
        cb0 = _mm512_slli_epi32(cb0, 7);                                    \
        cb1 = _mm512_slli_epi32(cb1, 7);                                    \
        const int put = r == 0 ? mode : RD_ADD;                             \
        ROWS(W_FINISH)                                                      \
        if (m == (R) && n == 32 && cs_c == 1) {                             \
            ROWS(W_PUT)                                                     \
            continue;                                                       \
        }                                                                   \
        float buf[(R) * 32] __attribute__((aligned(64)));                   \
        ROWS(W_SPILL)                                                       \
        rd_s_store_edge(buf, 32, c, rs_c, cs_c, m, n, put == RD_ADD ? RD_ADD : RD_STORE); \
    }                                                                       \
}

RD_W4_BODY(w4_i4_rows4, 0, 4, ROWS4)
RD_W4_BODY(w4_i4_rows8, 0, 8, ROWS8)
RD_W4_BODY(w4_i4_rows12, 0, 12, ROWS12)
RD_W4_BODY(w4_f4_rows4, 1, 4, ROWS4)
RD_W4_BODY(w4_f4_rows8, 1, 8, ROWS8)
RD_W4_BODY(w4_f4_rows12, 1, 12, ROWS12)

#define RD_W4_KERNEL(NAME, PRE)                                             \
void                                                                        \
NAME(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c, int m, int n, int mode) \
{                                                                           \
    if (m > 8)                                                              \
        PRE##_rows12(kc, a, b, (float *)c, rs_c, cs_c, m, n, mode);         \
    else if (m > 4)                                                         \
        PRE##_rows8(kc, a, b, (float *)c, rs_c, cs_c, m, n, mode);          \
    else                                                                    \
        PRE##_rows4(kc, a, b, (float *)c, rs_c, cs_c, m, n, mode);          \
}

RD_W4_KERNEL(rd_w4a8_avx512_i4, w4_i4)
RD_W4_KERNEL(rd_w4a8_avx512_f4, w4_f4)

/* ------------------------------------------------------ few-row kernels
 *
 * B decoded + 128 (unsigned) times A's bytes made signed again (xor 128),
 * each row's sum over the run (vpdpbusd of bytes 1 by A) taking the 128
 * back: per step one instruction a row, where the micro-kernels' column
 * sums would cost two a panel. */

/* 16 columns of a row of C (cols of them valid; 0 past them). */
RD_W4_TARGET static RD_W4_INLINE __m512
rd_w4_get16(const float *c, rd_int cs_c, rd_int cols)
{
    if (cols <= 0)
        return _mm512_setzero_ps();
    if (cs_c == 1)
        return _mm512_maskz_loadu_ps(cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1u), c);
    float t[16] __attribute__((aligned(64))) = {0};
    for (rd_int j = 0; j < cols && j < 16; j++)
        t[j] = c[j * cs_c];
    return _mm512_load_ps(t);
}

/* R rows x P panels (constants: the loops unroll, the sums stay in
 * registers), each element as the micro-kernel sums and finishes it.  One
 * row takes B + 128 against A made signed and the row's sum (two
 * instructions a step for the row); more rows take the micro-kernel's way,
 * A + 128 against B and B's column sums (two a step for each panel, but
 * none for each row). */
RD_W4_TARGET static RD_W4_INLINE void
rd_w4_few_body(const int F4, const int R, const int P, rd_int kc, const char *a, const char *b, size_t bstep,
               float *c, rd_int rs_c, rd_int cs_c, rd_int n, int mode)
{
    const int rowsum = R == 1;
    const rd_int kq = (kc + 3) / 4 * 4;
    const int32_t *a32 = (const int32_t *)(const void *)a;
    const float *sa = (const float *)(const void *)(a + 12 * kq + 48);
    const __m512i tab = rd_w4_table(F4, rowsum), ones = _mm512_set1_epi8(1);
    rd_qtrailer_t h;
    memcpy(&h, b + 16 * kq, sizeof h);
    __m512 out[4][4][2], sav[4];
    for (int i = 0; i < R; i++)
        sav[i] = _mm512_set1_ps(sa[i]);
    for (int q = 0; q < P; q++)
        for (int i = 0; i < R; i++)
            out[i][q][0] = out[i][q][1] = _mm512_setzero_ps();
    rd_int p = 0;
    for (rd_int r = 0; p < kc; r++) {
        const rd_int end = rd_qrun_end(&h, r, kc);
        /* the sums, and the sums to take 128 times back out: of the row
         * (x[0]), or of each panel's columns (x[q][half]) */
        __m512i acc[4][4][2], x[4][2];
        for (int q = 0; q < P; q++) {
            x[q][0] = x[q][1] = _mm512_setzero_si512();
            for (int i = 0; i < R; i++)
                acc[i][q][0] = acc[i][q][1] = _mm512_setzero_si512();
        }
        for (; p < end; p += 4) {
            __m512i av[4];
            for (int i = 0; i < R; i++)
                av[i] = _mm512_set1_epi32(a32[p / 4 * 12 + i]);
            if (rowsum) {
                av[0] = _mm512_xor_si512(av[0], _mm512_set1_epi8((char)0x80));
                x[0][0] = rd_avx512_dpbusd(x[0][0], ones, av[0]);
            }
            for (int q = 0; q < P; q++) {
                __m512i b0, b1;
                rd_w4_decode(b + q * bstep + p * 16, tab, &b0, &b1);
                if (rowsum) {
                    acc[0][q][0] = rd_avx512_dpbusd(acc[0][q][0], b0, av[0]);
                    acc[0][q][1] = rd_avx512_dpbusd(acc[0][q][1], b1, av[0]);
                    continue;
                }
                x[q][0] = rd_avx512_dpbusd(x[q][0], ones, b0);
                x[q][1] = rd_avx512_dpbusd(x[q][1], ones, b1);
                for (int i = 0; i < R; i++) {
                    acc[i][q][0] = rd_avx512_dpbusd(acc[i][q][0], av[i], b0);
                    acc[i][q][1] = rd_avx512_dpbusd(acc[i][q][1], av[i], b1);
                }
            }
        }
        /* the run's results, added in order to the C tile held in
         * registers (C itself first, for RD_ADD): each element the sums
         * of the micro-kernel, which adds each run into C */
        for (int q = 0; q < P; q++) {
            __m512 sb0, sb1;
            rd_w4_scales(F4, b + q * bstep + 16 * kq, r, &sb0, &sb1);
            const __m512i x0 = _mm512_slli_epi32(rowsum ? x[0][0] : x[q][0], 7);
            const __m512i x1 = rowsum ? x0 : _mm512_slli_epi32(x[q][1], 7);
            for (int i = 0; i < R; i++) {
                const __m512 f0 = rd_w4_finish(acc[i][q][0], x0, sav[i], sb0);
                const __m512 f1 = rd_w4_finish(acc[i][q][1], x1, sav[i], sb1);
                if (r > 0) {
                    out[i][q][0] = _mm512_add_ps(out[i][q][0], f0);
                    out[i][q][1] = _mm512_add_ps(out[i][q][1], f1);
                } else if (mode == RD_ADD) {
                    const float *cq = c + i * rs_c + q * 32 * cs_c;
                    out[i][q][0] = _mm512_add_ps(rd_w4_get16(cq, cs_c, n - q * 32), f0);
                    out[i][q][1] = _mm512_add_ps(rd_w4_get16(cq + 16 * cs_c, cs_c, n - q * 32 - 16), f1);
                } else {
                    out[i][q][0] = f0;
                    out[i][q][1] = f1;
                }
            }
        }
    }
    for (int q = 0; q < P; q++)
        for (int i = 0; i < R; i++) {
            float *cq = c + i * rs_c + q * 32 * cs_c;
            rd_avx512_put16(out[i][q][0], cq, cs_c, n - q * 32, RD_STORE);
            rd_avx512_put16(out[i][q][1], cq + 16 * cs_c, cs_c, n - q * 32 - 16, RD_STORE);
        }
}

/* One (F4, R, P) body as a function of its own, so that each is register
 * allocated alone (inlined into one dispatcher, gcc spilled the sums). */
#define RD_W4_VARIANT(F4, R, P)                                             \
RD_W4_TARGET __attribute__((noinline)) static void                          \
rd_w4_few_##F4##_##R##_##P(rd_int kc, const char *a, const char *b, size_t bstep, float *c, rd_int rs_c, \
                           rd_int cs_c, rd_int n, int mode)                 \
{                                                                           \
    rd_w4_few_body(F4, R, P, kc, a, b, bstep, c, rs_c, cs_c, n, mode);      \
}
#define RD_W4_VARIANTS(F4)                                                  \
    RD_W4_VARIANT(F4, 1, 4) RD_W4_VARIANT(F4, 1, 2) RD_W4_VARIANT(F4, 1, 1) \
    RD_W4_VARIANT(F4, 2, 4) RD_W4_VARIANT(F4, 2, 2) RD_W4_VARIANT(F4, 2, 1) \
    RD_W4_VARIANT(F4, 3, 1) RD_W4_VARIANT(F4, 4, 1)
RD_W4_VARIANTS(0)
RD_W4_VARIANTS(1)

/* Panels q on of the call in runs of P. */
#define RD_W4_RUN(F4, R, P)                                                 \
    for (; q + (P) <= np; q += (P))                                         \
        rd_w4_few_##F4##_##R##_##P(kc, a, b + q * bstep, bstep, c + q * 32 * cs_c, rs_c, cs_c, n - q * 32, mode);

/* One and two rows in runs of 4, 2, 1 panels (8 or 16 chains of sums:
 * enough to cover vpdpbusd's latency; two rows at 4 panels measured 5%
 * faster than at 2, its inner loop still without spills), three and four
 * one panel at a time (the sums, the column sums and the C tile are what
 * the registers hold beside the decoding). */
#define RD_W4_FEW(NAME, F4)                                                 \
void                                                                        \
NAME(rd_int kc, const void *a_, const void *b_, size_t bstep, void *c_, rd_int rs_c, rd_int cs_c, int m, \
     rd_int n, int mode)                                                    \
{                                                                           \
    const char *a = (const char *)a_, *b = (const char *)b_;                \
    float *c = (float *)c_;                                                 \
    const rd_int np = (n + 31) / 32;                                        \
    rd_int q = 0;                                                           \
    if (m == 1) {                                                           \
        RD_W4_RUN(F4, 1, 4) RD_W4_RUN(F4, 1, 2) RD_W4_RUN(F4, 1, 1)         \
    } else if (m == 2) {                                                    \
        RD_W4_RUN(F4, 2, 4) RD_W4_RUN(F4, 2, 2) RD_W4_RUN(F4, 2, 1)         \
    } else if (m == 3) {                                                    \
        RD_W4_RUN(F4, 3, 1)                                                 \
    } else {                                                                \
        RD_W4_RUN(F4, 4, 1)                                                 \
    }                                                                       \
}

RD_W4_FEW(rd_w4a8_few_avx512_i4, 0)
RD_W4_FEW(rd_w4a8_few_avx512_f4, 1)

#endif /* RD_HAVE_X86_KERNELS */
