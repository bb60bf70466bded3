/*
 * NEON few-row kernels (rd_fukr_t, kernels/rd_few_body.h): one row walks 8
 * micro-panels of 8 columns at once (16 fmla chains: the 4 pipes of the
 * Neoverse V and Apple cores times 4 cycles of latency), two rows 4 panels.
 * The 12x8 micro-kernel holds two accumulators for one row.
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_ARM_KERNELS

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "rd_neon_body.h"
#include "rd_neon_few.h"
#include "rd_few_body.h"

#define FEW_ATTR
#define FEW_V float32x4_t
#define FEW_W 4
#define FEW_MR 12
#define FEW_P1 8
#define FEW_P2 4
#define FEW_P4 2
#define FEW_ZERO() vdupq_n_f32(0.0f)
#define FEW_LOADU vld1q_f32
#define FEW_SUB vsubq_f32
#define FEW_MUL vmulq_f32
#define FEW_FMA(acc, w, a) vfmaq_n_f32((acc), (w), *(a))
#define FK_STEP(kind) ((kind) == FK_F32 ? 32 : (kind) == FK_BF16 || (kind) == FK_F16 ? 16 \
                       : (kind) == FK_F4 || (kind) == FK_I4 ? 4 : 8)

typedef struct {
    uint8x16_t tlo, thi;    /* the low and high bytes of the e2m1 values' top 16 bits */
    int8x8_t shift;         /* the nibbles of a step's 4 bytes apart */
} rd_few_consts_t;

static RD_INLINE rd_few_consts_t
rd_few_consts(void)
{
    const rd_few_consts_t k = {vld1q_u8(rd_e2m1_lo), vld1q_u8(rd_e2m1_hi), vld1_s8(rd_nibble_shift)};
    return k;
}

/* The 8 values of one step of a panel, widened exactly (not yet scaled),
 * as rd_neon.c's LOAD_B / WIDEN of the same type. */
FEW_ATTR static RD_INLINE void
rd_few_widen(const int kind, const char *bp, float32x4_t *w0, float32x4_t *w1, const rd_few_consts_t *k)
{
    const uint8x16_t tlo = k->tlo, thi = k->thi;
    const int8x8_t shift = k->shift;
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

/* The scales of a run's e8m0 exponents */
FEW_ATTR static RD_INLINE void
rd_few_e8m0(const uint8_t *e, float32x4_t *s0, float32x4_t *s1)
{
    rd_neon_e8m0(e, s0, s1);
}

#define rd_few_put rd_neon_put4

#include "rd_few_body.h"

RD_FEW_DEFINE(rd_few_neon_f32, FK_F32)
RD_FEW_DEFINE(rd_few_neon_bf16w, FK_BF16)
RD_FEW_DEFINE(rd_few_neon_f16w, FK_F16)
RD_FEW_DEFINE_ZP(rd_few_neon_i8w, FK_I8)
RD_FEW_DEFINE_ZP(rd_few_neon_f8w, FK_F8)
RD_FEW_DEFINE(rd_few_neon_f4w, FK_F4)
RD_FEW_DEFINE_ZP(rd_few_neon_i4w, FK_I4)

#endif /* RD_HAVE_ARM_KERNELS */
