/*
 * NEON kernels of the w4a8 types (RD_CT_U8S8_I4, RD_CT_U8S8_F4; rd_kernel.h):
 * 4-bit weights times int8 rows on SDOT (FEAT_DotProd: Graviton 2 and
 * later, Neoverse N1/V1/V2, Grace, Apple M1 and later), for the family
 * "neon-dot" (kernels/rd_neon_dot.c); their twin is in
 * kernels/rd_dot_twins.c ("neon-dot-twin", the same 12 x 8 block).
 *
 * Decoding: a quad step of an 8-column panel is 16 bytes, byte t holding
 * the codes of columns t/4 (low nibble) and 4 + t/4 (high nibble) at step
 * t%4: a mask and a shift give the codes, and one TBL each (the 16 values
 * of the codes, signed bytes) the k-quads of columns 0-3 and 4-7.  A is
 * int8-dot's (A + 128): one EOR makes 4 rows' quads signed again, and
 * SDOT then sums the exact products with nothing to take back out.
 *
 *   rd_w4a8_neon_i4 / _f4 (12 x 8): the micro-kernels, one body per row
 *       count 4, 8, 12; each run of the contraction within a scale tile
 *       finished and added into C as it ends.
 *   rd_w4a8_few_neon_i4 / _f4 (rd_fukr_t, 1-4 rows): several panels at
 *       once (one row: 4, 8 chains of sums), the C tile in registers across
 *       the runs.
 *
 * SDOT by element is emitted by encoding (kernels/rd_neon_insn.h).
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_ARM_KERNELS

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "rd_dot_blocking.h"
#include "rd_neon_body.h"
#include "rd_neon_insn.h"
#include "rd_neon_w4a8.h"

#define RD_SDOT(acc, vn, vm, idx) RD_DOT_BY_ELEMENT(0x4f80e000, acc, vn, vm, idx)

/* the values of the codes: int4 (c ^ 8) - 8; float4_e2m1fn 2 e2m1(c) */
static const int8_t rd_w4n_tables[2][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1},
    {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12},
};

/* One quad step of a panel: columns 0-3 (b0) and 4-7 (b1), signed. */
static inline void
rd_w4n_decode(const uint8_t *bq, int8x16_t tab, int8x16_t *b0, int8x16_t *b1)
{
    const uint8x16_t v = vld1q_u8(bq);
    *b0 = vqtbl1q_s8(tab, vandq_u8(v, vdupq_n_u8(0x0f)));
    *b1 = vqtbl1q_s8(tab, vshrq_n_u8(v, 4));
}

/* 16 bytes of A + 128 as the signed values. */
static inline int8x16_t
rd_w4n_signed(const uint8_t *a)
{
    return vreinterpretq_s8_u8(veorq_u8(vld1q_u8(a), vdupq_n_u8(0x80)));
}

/* The scales of run r of a panel's 8 columns (tr: its trailer): floats,
 * or 2^(e - 128) of the exponent bytes (2^(e - 127), halved: exact). */
static inline void
rd_w4n_scales(int f4, const uint8_t *tr, rd_int r, float32x4_t *s0, float32x4_t *s1)
{
    if (!f4) {
        const float *sv = (const float *)(const void *)(tr + RD_QRUN(r, 8, 0));
        *s0 = vld1q_f32(sv);
        *s1 = vld1q_f32(sv + 4);
        return;
    }
    rd_neon_e8m0(tr + RD_F4RUN(r, 8), s0, s1);
    *s0 = vmulq_n_f32(*s0, 0.5f);
    *s1 = vmulq_n_f32(*s1, 0.5f);
}

/* ------------------------------------------------------- micro-kernels */

#define WN_DECL(i, A, L) int32x4_t c##i##0, c##i##1;
#define WN_ZERO(i, A, L) c##i##0 = c##i##1 = vdupq_n_s32(0);
#define WN_DOT(i, A, L)                                                     \
    RD_SDOT(c##i##0, b0, A, L);                                             \
    RD_SDOT(c##i##1, b1, A, L);
#define WN_LOAD(reg, k) const int8x16_t reg = rd_w4n_signed(a + 16 * (k));
#define WN_FINISH(i, A, L)                                                  \
    {                                                                       \
        const float32x4_t s = vdupq_n_f32(sa[i]);                           \
        f##i##0 = vmulq_f32(vcvtq_f32_s32(c##i##0), vmulq_f32(s, sb0));     \
        f##i##1 = vmulq_f32(vcvtq_f32_s32(c##i##1), vmulq_f32(s, sb1));     \
    }
#define WN_FDECL(i, A, L) float32x4_t f##i##0, f##i##1;
#define WN_PUT(i, A, L) rd_neon_put_row(c + (i) * rs_c, f##i##0, f##i##1, put);
#define WN_SPILL(i, A, L)                                                   \
    vst1q_f32(buf + (i) * 8, f##i##0);                                      \
    vst1q_f32(buf + (i) * 8 + 4, f##i##1);

#define RD_WN_BODY(NAME, F4, R, ROWS, LOADS)                                \
static void                                                                 \
NAME(rd_int kc, const uint8_t *a, const uint8_t *b, float *c, rd_int rs_c,  \
     rd_int cs_c, int m, int n, int mode)                                   \
{                                                                           \
    const rd_int kq = (kc + 3) / 4 * 4;                                     \
    const float *sa = (const float *)(const void *)(a + 12 * kq + 48);      \
    const uint8_t *tb = b + 4 * kq;                                         \
    const int8x16_t tab = vld1q_s8(rd_w4n_tables[F4]);                      \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, tb, sizeof h);                                               \
    ROWS(WN_DECL)                                                           \
    rd_int p = 0;                                                           \
    for (rd_int r = 0; p < kc; r++) {                                       \
        const rd_int end = rd_qrun_end(&h, r, kc);                    \
        ROWS(WN_ZERO)                                                       \
        for (; p < end; p += 4) {                                           \
            int8x16_t b0, b1;                                               \
            rd_w4n_decode(b, tab, &b0, &b1);                                \
            LOADS(WN_LOAD)                                                  \
            ROWS(WN_DOT)                                                    \
            a += 48;                                                        \
            b += 16;                                                        \
        }                                                                   \
        float32x4_t sb0, sb1;                                               \
        rd_w4n_scales(F4, tb, r, &sb0, &sb1);                               \
        const int put = r == 0 ? mode : RD_ADD;                             \
        ROWS(WN_FDECL)                                                      \
        ROWS(WN_FINISH)                                                     \
        if (m == (R) && n == 8 && cs_c == 1) {                              \
            ROWS(WN_PUT)                                                    \
            continue;                                                       \
        }                                                                   \
        float buf[(R) * 8];                                                 \
        ROWS(WN_SPILL)                                                      \
        rd_s_store_edge(buf, 8, c, rs_c, cs_c, m, n, put == RD_ADD ? RD_ADD : RD_STORE); \
    }                                                                       \
}

RD_WN_BODY(wn_i4_rows4, 0, 4, NROWS4, NLOAD_A4)
RD_WN_BODY(wn_i4_rows8, 0, 8, NROWS8, NLOAD_A8)
RD_WN_BODY(wn_i4_rows12, 0, 12, NROWS12, NLOAD_A12)
RD_WN_BODY(wn_f4_rows4, 1, 4, NROWS4, NLOAD_A4)
RD_WN_BODY(wn_f4_rows8, 1, 8, NROWS8, NLOAD_A8)
RD_WN_BODY(wn_f4_rows12, 1, 12, NROWS12, NLOAD_A12)
RD_NEON_KERNEL(rd_w4a8_neon_i4_12x8, uint8_t, uint8_t, wn_i4_rows4, wn_i4_rows8, wn_i4_rows12)
RD_NEON_KERNEL(rd_w4a8_neon_f4_12x8, uint8_t, uint8_t, wn_f4_rows4, wn_f4_rows8, wn_f4_rows12)

void
rd_w4a8_neon_i4(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c, int m, int n,
                int mode)
{
    rd_w4a8_neon_i4_12x8(kc, a, b, c, rs_c, cs_c, m, n, mode);
}

void
rd_w4a8_neon_f4(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c, int m, int n,
                int mode)
{
    rd_w4a8_neon_f4_12x8(kc, a, b, c, rs_c, cs_c, m, n, mode);
}

/* ------------------------------------------------------ few-row kernels */

/* 4 columns of a row of C (cols of them valid; 0 past them): the loads
 * that rd_neon_put4 stores back. */
static inline float32x4_t
rd_w4n_get4(const float *c, rd_int cs_c, rd_int cols)
{
    if (cols >= 4 && cs_c == 1)
        return vld1q_f32(c);
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (rd_int j = 0; j < cols && j < 4; j++)
        t[j] = c[j * cs_c];
    return vld1q_f32(t);
}

/* R rows x P panels (constants: the loops unroll, the sums and the C tile
 * stay in registers), each element the micro-kernel's: per run, the exact
 * sums, then (float)S * (sa * sb) added in order to C (C first, for
 * RD_ADD, else -0: the identity of the additions, -0 + x being x, -0 and
 * NaNs included, so that every run adds the same way and the epilogue has
 * no branches: gcc kept the C tile on the stack with them). */
static inline __attribute__((always_inline)) void
rd_w4n_few_body(const int F4, const int R, const int P, rd_int kc, const uint8_t *a, const uint8_t *b,
                size_t bstep, float *c, rd_int rs_c, rd_int cs_c, rd_int n, int mode)
{
    const rd_int kq = (kc + 3) / 4 * 4;
    const float *sa = (const float *)(const void *)(a + 12 * kq + 48);
    const int8x16_t tab = vld1q_s8(rd_w4n_tables[F4]);
    rd_qtrailer_t h;
    memcpy(&h, b + 4 * kq, sizeof h);
    float32x4_t out[4][4][2];
    for (int i = 0; i < R; i++)
        for (int q = 0; q < P; q++) {
            const float *cq = c + i * rs_c + q * 8 * cs_c;
            out[i][q][0] = mode == RD_ADD ? rd_w4n_get4(cq, cs_c, n - q * 8) : vdupq_n_f32(-0.0f);
            out[i][q][1] = mode == RD_ADD ? rd_w4n_get4(cq + 4 * cs_c, cs_c, n - q * 8 - 4) : vdupq_n_f32(-0.0f);
        }
    rd_int p = 0;
    for (rd_int r = 0; p < kc; r++) {
        const rd_int end = rd_qrun_end(&h, r, kc);
        int32x4_t acc[4][4][2];
        for (int i = 0; i < R; i++)
            for (int q = 0; q < P; q++)
                acc[i][q][0] = acc[i][q][1] = vdupq_n_s32(0);
        for (; p < end; p += 4) {
            const int8x16_t av = rd_w4n_signed(a + p / 4 * 48);   /* rows 0-3 */
            for (int q = 0; q < P; q++) {
                int8x16_t b0, b1;
                rd_w4n_decode(b + q * bstep + p * 4, tab, &b0, &b1);
                /* (the lane index of SDOT is an immediate: unrolled rows) */
                RD_SDOT(acc[0][q][0], b0, av, 0);
                RD_SDOT(acc[0][q][1], b1, av, 0);
                if (R > 1) {
                    RD_SDOT(acc[1][q][0], b0, av, 1);
                    RD_SDOT(acc[1][q][1], b1, av, 1);
                }
                if (R > 2) {
                    RD_SDOT(acc[2][q][0], b0, av, 2);
                    RD_SDOT(acc[2][q][1], b1, av, 2);
                }
                if (R > 3) {
                    RD_SDOT(acc[3][q][0], b0, av, 3);
                    RD_SDOT(acc[3][q][1], b1, av, 3);
                }
            }
        }
        for (int q = 0; q < P; q++) {
            float32x4_t sb0, sb1;
            rd_w4n_scales(F4, b + q * bstep + 4 * kq, r, &sb0, &sb1);
            for (int i = 0; i < R; i++) {
                const float32x4_t s = vdupq_n_f32(sa[i]);
                out[i][q][0] = vaddq_f32(out[i][q][0], vmulq_f32(vcvtq_f32_s32(acc[i][q][0]), vmulq_f32(s, sb0)));
                out[i][q][1] = vaddq_f32(out[i][q][1], vmulq_f32(vcvtq_f32_s32(acc[i][q][1]), vmulq_f32(s, sb1)));
            }
        }
    }
    for (int i = 0; i < R; i++)
        for (int q = 0; q < P; q++) {
            float *cq = c + i * rs_c + q * 8 * cs_c;
            rd_neon_put4(out[i][q][0], cq, cs_c, n - q * 8, RD_STORE);
            rd_neon_put4(out[i][q][1], cq + 4 * cs_c, cs_c, n - q * 8 - 4, RD_STORE);
        }
}

/* One (F4, R, P) body as a function of its own (register allocated alone). */
#define RD_WN_VARIANT(F4, R, P)                                             \
__attribute__((noinline)) static void                                       \
rd_w4n_few_##F4##_##R##_##P(rd_int kc, const uint8_t *a, const uint8_t *b, size_t bstep, float *c, \
                            rd_int rs_c, rd_int cs_c, rd_int n, int mode)   \
{                                                                           \
    rd_w4n_few_body(F4, R, P, kc, a, b, bstep, c, rs_c, cs_c, n, mode);     \
}
#define RD_WN_VARIANTS(F4)                                                  \
    RD_WN_VARIANT(F4, 1, 4) RD_WN_VARIANT(F4, 1, 2) RD_WN_VARIANT(F4, 1, 1) \
    RD_WN_VARIANT(F4, 2, 2) RD_WN_VARIANT(F4, 2, 1) RD_WN_VARIANT(F4, 3, 1) \
    RD_WN_VARIANT(F4, 4, 1)
RD_WN_VARIANTS(0)
RD_WN_VARIANTS(1)

/* Panels q on of the call in runs of P. */
#define RD_WN_RUN(F4, R, P)                                                 \
    for (; q + (P) <= np; q += (P))                                         \
        rd_w4n_few_##F4##_##R##_##P(kc, a, b + q * bstep, bstep, c + q * 8 * cs_c, rs_c, cs_c, n - q * 8, mode);

/* One row in runs of 4, 2, 1 panels (8 chains of sums), two rows in runs
 * of 2, 1, three and four one panel at a time: the sums and the C tile in
 * the 32 registers beside the decoding. */
#define RD_WN_FEW(NAME, F4)                                                 \
void                                                                        \
NAME(rd_int kc, const void *a_, const void *b_, size_t bstep, void *c_, rd_int rs_c, rd_int cs_c, int m, \
     rd_int n, int mode)                                                    \
{                                                                           \
    const uint8_t *a = (const uint8_t *)a_, *b = (const uint8_t *)b_;       \
    float *c = (float *)c_;                                                 \
    const rd_int np = (n + 7) / 8;                                          \
    rd_int q = 0;                                                           \
    if (m == 1) {                                                           \
        RD_WN_RUN(F4, 1, 4) RD_WN_RUN(F4, 1, 2) RD_WN_RUN(F4, 1, 1)         \
    } else if (m == 2) {                                                    \
        RD_WN_RUN(F4, 2, 2) RD_WN_RUN(F4, 2, 1)                             \
    } else if (m == 3) {                                                    \
        RD_WN_RUN(F4, 3, 1)                                                 \
    } else {                                                                \
        RD_WN_RUN(F4, 4, 1)                                                 \
    }                                                                       \
}

RD_WN_FEW(rd_w4a8_few_neon_i4, 0)
RD_WN_FEW(rd_w4a8_few_neon_f4, 1)

#endif /* RD_HAVE_ARM_KERNELS */
