/*
 * NEON few-row kernels (rd_fukr_t): one or two rows of a packed A panel
 * times a run of prepacked B micro-panels of 8 columns, for decoding (1-2
 * rows an expert).  The 12x8 micro-kernel holds two accumulators for one
 * row, and each fmla waits for the previous one (4 cycles of latency on
 * the Neoverse and Apple cores): a panel at a time runs a row at 2 fmla
 * per 4 cycles, an eighth of a 4-pipe core.  Here one row walks 8 panels
 * at once (16 independent chains, the pipes times the latency) and two rows
 * 4 panels, each B vector decoded once for its rows.
 *
 * Bits: each element is what rd_neon.c's micro-kernel of the same type
 * gives it (the same widening, (w - z) * s per column and run, one fused
 * multiply-add a step from zero, stored or added to C once).
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_ARM_KERNELS

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "rd_neon_few.h"

#define RD_INLINE inline __attribute__((always_inline))

enum { FK_F32, FK_BF16, FK_F16, FK_I8, FK_F8, FK_F4, FK_I4 };

/* bytes of one step of one micro-panel (8 columns) */
#define FK_STEP(kind) ((kind) == FK_F32 ? 32 : (kind) == FK_BF16 || (kind) == FK_F16 ? 16 \
                       : (kind) == FK_F4 || (kind) == FK_I4 ? 4 : 8)

/* the decoding tables of rd_neon.c's 4-bit kernel */
static const uint8_t rd_few_e2m1_lo[16] = {0x00, 0x00, 0x80, 0xc0, 0x00, 0x40, 0x80, 0xc0,
                                           0x00, 0x00, 0x80, 0xc0, 0x00, 0x40, 0x80, 0xc0};
static const uint8_t rd_few_e2m1_hi[16] = {0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40,
                                           0x80, 0xbf, 0xbf, 0xbf, 0xc0, 0xc0, 0xc0, 0xc0};
static const int8_t rd_few_shift[8] = {0, 0, 0, 0, -4, -4, -4, -4};

/* The 8 values of one step of a panel, widened exactly (not yet scaled),
 * as rd_neon.c's LOAD_B / WIDEN of the same type. */
static RD_INLINE void
rd_few_widen(const int kind, const char *bp, float32x4_t *w0, float32x4_t *w1, const uint8x16_t tlo,
             const uint8x16_t thi, const int8x8_t shift)
{
    if (kind == FK_F32) {
        *w0 = vld1q_f32((const float *)(const void *)bp);
        *w1 = vld1q_f32((const float *)(const void *)bp + 4);
    } else if (kind == FK_BF16) {
        const uint32x4_t bw = vreinterpretq_u32_u16(vld1q_u16((const uint16_t *)(const void *)bp));
        *w0 = vreinterpretq_f32_u32(vshlq_n_u32(bw, 16));
        *w1 = vreinterpretq_f32_u32(vandq_u32(bw, vdupq_n_u32(0xffff0000u)));
    } else if (kind == FK_F16) {
        const float16x8_t bh = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)(const void *)bp));
        *w0 = vcvt_f32_f16(vget_low_f16(bh));
        *w1 = vcvt_high_f32_f16(bh);
    } else if (kind == FK_I8) {
        const int16x8_t bq = vmovl_s8(vld1_s8((const int8_t *)(const void *)bp));
        *w0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(bq)));
        *w1 = vcvtq_f32_s32(vmovl_high_s16(bq));
    } else if (kind == FK_F8) {
        const uint16x8_t bh = vmovl_u8(vld1_u8((const uint8_t *)(const void *)bp));
        const uint16x8_t bits = vorrq_u16(vshlq_n_u16(vandq_u16(bh, vdupq_n_u16(0x80)), 8),
                                          vshlq_n_u16(vandq_u16(bh, vdupq_n_u16(0x7f)), 7));
        const float16x8_t bf = vreinterpretq_f16_u16(bits);
        *w0 = vmulq_f32(vcvt_f32_f16(vget_low_f16(bf)), vdupq_n_f32(256.0f));
        *w1 = vmulq_f32(vcvt_high_f32_f16(bf), vdupq_n_f32(256.0f));
    } else if (kind == FK_I4) {
        uint32_t word;
        memcpy(&word, bp, 4);
        const uint8x8_t codes = vand_u8(vshl_u8(vreinterpret_u8_u32(vdup_n_u32(word)), shift), vdup_n_u8(0x0f));
        const int16x8_t bq = vmovl_s8(vsub_s8(vreinterpret_s8_u8(veor_u8(codes, vdup_n_u8(8))), vdup_n_s8(8)));
        *w0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(bq)));
        *w1 = vcvtq_f32_s32(vmovl_high_s16(bq));
    } else {
        uint32_t word;
        memcpy(&word, bp, 4);
        const uint8x8_t codes = vand_u8(vshl_u8(vreinterpret_u8_u32(vdup_n_u32(word)), shift), vdup_n_u8(0x0f));
        const uint8x8x2_t z = vzip_u8(vqtbl1_u8(tlo, codes), vqtbl1_u8(thi, codes));
        const uint16x8_t top = vreinterpretq_u16_u8(vcombine_u8(z.val[0], z.val[1]));
        *w0 = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(top), 16));
        *w1 = vreinterpretq_f32_u32(vshll_high_n_u16(top, 16));
    }
}

/* e8m0 exponents (8 bytes) to float32 scales, as rd_neon.c's rd_neon_e8m0 */
static RD_INLINE void
rd_few_e8m0(const uint8_t *e, float32x4_t *s0, float32x4_t *s1)
{
    const uint16x8_t e16 = vmovl_u8(vld1_u8(e));
    const uint32x4_t lo = vmovl_u16(vget_low_u16(e16)), hi = vmovl_high_u16(e16);
    const uint32x4_t sub = vdupq_n_u32(0x00400000u);
    *s0 = vreinterpretq_f32_u32(vbslq_u32(vceqzq_u32(lo), sub, vshlq_n_u32(lo, 23)));
    *s1 = vreinterpretq_f32_u32(vbslq_u32(vceqzq_u32(hi), sub, vshlq_n_u32(hi, 23)));
}

/* 4 columns of a row of C from an accumulator (cols of them valid) */
static RD_INLINE void
rd_few_put(float32x4_t v, float *c, rd_int cs_c, rd_int cols, int mode)
{
    if (cols <= 0)
        return;
    if (cols >= 4 && cs_c == 1) {
        vst1q_f32(c, mode == RD_ADD ? vaddq_f32(vld1q_f32(c), v) : v);
        return;
    }
    float t[4];
    vst1q_f32(t, v);
    for (rd_int j = 0; j < cols && j < 4; j++) {
        if (mode == RD_ADD)
            c[j * cs_c] += t[j];
        else
            c[j * cs_c] = t[j];
    }
}

/* R rows x P panels (constants: the loops unroll, the accumulators stay
 * in registers). */
static RD_INLINE void
rd_few_body(const int kind, const int R, const int P, const int zp, rd_int kc, const float *a, const char *b,
            size_t bstep, float *c, rd_int rs_c, rd_int cs_c, rd_int n, int mode)
{
    const rd_int SB = FK_STEP(kind);
    float32x4_t acc[2][8][2];
    for (int i = 0; i < R; i++)
        for (int q = 0; q < P; q++)
            acc[i][q][0] = acc[i][q][1] = vdupq_n_f32(0.0f);
    const uint8x16_t tlo = vld1q_u8(rd_few_e2m1_lo), thi = vld1q_u8(rd_few_e2m1_hi);
    const int8x8_t shift = vld1_s8(rd_few_shift);
    const int quantized = kind == FK_I8 || kind == FK_F8 || kind == FK_F4 || kind == FK_I4;
    rd_qtrailer_t h = {(int)kc, (int)kc, 0, 0};
    if (quantized)
        memcpy(&h, b + SB * kc, sizeof h);
    rd_int p = 0, len = h.first;
    for (rd_int r = 0; p < kc; r++, len = h.tile) {
        float32x4_t s[8][2], z[8][2];
        for (int q = 0; q < P; q++) {
            const char *tr = b + q * bstep + SB * kc;
            s[q][0] = s[q][1] = z[q][0] = z[q][1] = vdupq_n_f32(0.0f);
            if (kind == FK_F4) {
                rd_few_e8m0((const uint8_t *)(tr + RD_F4RUN(r, 8)), &s[q][0], &s[q][1]);
            } else if (quantized) {
                const float *sv = (const float *)(const void *)(tr + RD_QRUN(r, 8, zp));
                s[q][0] = vld1q_f32(sv);
                s[q][1] = vld1q_f32(sv + 4);
                if (zp) {
                    z[q][0] = vld1q_f32(sv + 8);
                    z[q][1] = vld1q_f32(sv + 12);
                }
            }
        }
        const rd_int end = kc - p < len ? kc : p + len;
        for (; p < end; p++) {
            const char *bp = b + p * SB;
            for (int q = 0; q < P; q++) {
                float32x4_t w0, w1;
                rd_few_widen(kind, bp + q * bstep, &w0, &w1, tlo, thi, shift);
                if (quantized && zp) {
                    w0 = vsubq_f32(w0, z[q][0]);
                    w1 = vsubq_f32(w1, z[q][1]);
                }
                if (quantized) {
                    w0 = vmulq_f32(w0, s[q][0]);
                    w1 = vmulq_f32(w1, s[q][1]);
                }
                for (int i = 0; i < R; i++) {
                    acc[i][q][0] = vfmaq_n_f32(acc[i][q][0], w0, a[p * 12 + i]);
                    acc[i][q][1] = vfmaq_n_f32(acc[i][q][1], w1, a[p * 12 + i]);
                }
            }
        }
    }
    for (int i = 0; i < R; i++)
        for (int q = 0; q < P; q++) {
            float *cq = c + i * rs_c + q * 8 * cs_c;
            rd_few_put(acc[i][q][0], cq, cs_c, n - q * 8, mode);
            rd_few_put(acc[i][q][1], cq + 4 * cs_c, cs_c, n - q * 8 - 4, mode);
        }
}

#define RD_FEW_RUN(KIND, R, P, ZP)                                          \
    for (; q + (P) <= np; q += (P))                                         \
        rd_few_body(KIND, R, P, ZP, kc, a, b + q * bstep, bstep, c + q * 8 * cs_c, rs_c, cs_c, n - q * 8, mode);

/* The panels of a call in runs of P: 8, 4, 2, 1 for one row; 4, 2, 1 for two. */
#define RD_FEW_KERNEL(NAME, KIND, ZP)                                       \
static void                                                                 \
NAME(rd_int kc, const float *a, const char *b, size_t bstep, float *c,      \
     rd_int rs_c, rd_int cs_c, int m, rd_int n, int mode)                   \
{                                                                           \
    const rd_int np = (n + 7) / 8;                                          \
    rd_int q = 0;                                                           \
    if (m == 1) {                                                           \
        RD_FEW_RUN(KIND, 1, 8, ZP)                                          \
        RD_FEW_RUN(KIND, 1, 4, ZP)                                          \
        RD_FEW_RUN(KIND, 1, 2, ZP)                                          \
        RD_FEW_RUN(KIND, 1, 1, ZP)                                          \
    } else {                                                                \
        RD_FEW_RUN(KIND, 2, 4, ZP)                                          \
        RD_FEW_RUN(KIND, 2, 2, ZP)                                          \
        RD_FEW_RUN(KIND, 2, 1, ZP)                                          \
    }                                                                       \
}

RD_FEW_KERNEL(few_f32, FK_F32, 0)
RD_FEW_KERNEL(few_bf16, FK_BF16, 0)
RD_FEW_KERNEL(few_f16, FK_F16, 0)
RD_FEW_KERNEL(few_i8, FK_I8, 0)
RD_FEW_KERNEL(few_i8z, FK_I8, 1)
RD_FEW_KERNEL(few_f8, FK_F8, 0)
RD_FEW_KERNEL(few_f8z, FK_F8, 1)
RD_FEW_KERNEL(few_f4, FK_F4, 0)
RD_FEW_KERNEL(few_i4, FK_I4, 0)
RD_FEW_KERNEL(few_i4z, FK_I4, 1)

#define RD_FEW_ENTRY(NAME, BODY)                                            \
void                                                                        \
NAME(rd_int kc, const void *a, const void *b, size_t bstep, void *c,        \
     rd_int rs_c, rd_int cs_c, int m, rd_int n, int mode)                   \
{                                                                           \
    BODY(kc, (const float *)a, (const char *)b, bstep, (float *)c, rs_c, cs_c, m, n, mode); \
}
#define RD_FEW_QENTRY(NAME, BODY, BODYZ, SB)                                \
void                                                                        \
NAME(rd_int kc, const void *a, const void *b, size_t bstep, void *c,        \
     rd_int rs_c, rd_int cs_c, int m, rd_int n, int mode)                   \
{                                                                           \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, (const char *)b + (SB) * kc, sizeof h);                      \
    if (h.zp)                                                               \
        BODYZ(kc, (const float *)a, (const char *)b, bstep, (float *)c, rs_c, cs_c, m, n, mode); \
    else                                                                    \
        BODY(kc, (const float *)a, (const char *)b, bstep, (float *)c, rs_c, cs_c, m, n, mode); \
}
RD_FEW_ENTRY(rd_few_neon_f32, few_f32)
RD_FEW_ENTRY(rd_few_neon_bf16w, few_bf16)
RD_FEW_ENTRY(rd_few_neon_f16w, few_f16)
RD_FEW_QENTRY(rd_few_neon_i8w, few_i8, few_i8z, 8)
RD_FEW_QENTRY(rd_few_neon_f8w, few_f8, few_f8z, 8)
RD_FEW_ENTRY(rd_few_neon_f4w, few_f4)
RD_FEW_QENTRY(rd_few_neon_i4w, few_i4, few_i4z, 4)

#endif /* RD_HAVE_ARM_KERNELS */
