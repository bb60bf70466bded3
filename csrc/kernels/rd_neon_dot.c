/*
 * NEON dot-product micro-kernels, for aarch64 cores that have the
 * instruction (chosen at run time by their feature bits, cpu/rd_cpu.h):
 *
 *   rd_bf16dot_neon_12x8 (family "neon-bf16", FEAT_BF16: Graviton 3/4,
 *       Neoverse V1/V2/N2, Grace, Apple M2 and later): bfloat16 k-pairs
 *       into float32 by BFDOT (by element), RD_CT_BF16DP's layout with the
 *       Arm arithmetic (kernels/rd_dot_arith.h: each pair's two products
 *       summed and added to the accumulator, every operation rounded to
 *       odd, denormals flushed)
 *   rd_u8s8dot_neon_i8mm_12x8 (family "neon-i8mm", FEAT_I8MM): int8 k-quads
 *       into int32 by SUDOT (by element), RD_CT_U8S8: B's signed bytes
 *       times A's unsigned ones (+128), exactly vpdpbusd's sums
 *   rd_u8s8dot_neon_dot_12x8 (family "neon-dot", FEAT_DotProd: Graviton 2,
 *       Neoverse N1, Apple M1): the same by UDOT, unsigned times unsigned:
 *       B's bytes shifted by 128 too (xor 0x80: two instructions a step
 *       on B's two vectors, where turning A's three back to signed for
 *       SDOT would take three), and the epilogue takes 128 times A's sums
 *       (A + 128 over the block: ra + 128 kc) back out
 *
 * Each has a twin in plain C with the same block and blocking
 * (kernels/rd_dot_twins.c), runnable everywhere; the tests hold native and
 * twin bit for bit (under QEMU where no ARM core is at hand).
 *
 * The register block is the float32 kernel's (kernels/rd_neon_body.h):
 * 12 rows x 8 columns, 24 accumulators; per step (a pair or a quad of the
 * contraction) 5 loads and 24 dot products by element.
 *
 * The instructions are emitted by encoding (.inst), with the registers the
 * compiler chose decoded by an assembler macro (rd_vnum), so that every
 * assembler takes them whatever extensions it knows: clang 14's rejects
 * these mnemonics under any .arch directive.
 */
#include "rd_kernel.h"
#include "rd_dot_blocking.h"

#ifdef RD_HAVE_ARM_KERNELS

#include "rd_neon_body.h"
#include "rd_neon_insn.h"

/* ------------------------------------------------------- bfloat16 pairs */

#define BDECL(i, A, L) float32x4_t c##i##0 = vdupq_n_f32(0.0f), c##i##1 = vdupq_n_f32(0.0f);
#define BDOT(i, A, L)                                                       \
    RD_BFDOT(c##i##0, b0, A, L);                                            \
    RD_BFDOT(c##i##1, b1, A, L);
#define BLOAD(reg, k) const uint16x8_t reg = vld1q_u16(a + 8 * (k));

/* A: 12 rows of pairs (24 halves) a step, B: 8 columns of pairs. */
#define RD_NB_BODY(NAME, R, ROWS, LOADS)                                    \
static void                                                                 \
NAME(rd_int kc, const uint16_t *a, const uint16_t *b, float *c, rd_int rs_c, \
     rd_int cs_c, int m, int n, int mode)                                   \
{                                                                           \
    const rd_int pairs = (kc + 1) / 2;                                      \
    ROWS(BDECL)                                                             \
    for (rd_int q = 0; q < pairs; q++) {                                    \
        const uint16x8_t b0 = vld1q_u16(b), b1 = vld1q_u16(b + 8);          \
        LOADS(BLOAD)                                                        \
        ROWS(BDOT)                                                          \
        a += 24;                                                            \
        b += 16;                                                            \
    }                                                                       \
    RD_NEON_LEAVE(R, ROWS)                                                  \
}
RD_NB_BODY(bf_rows4, 4, NROWS4, NLOAD_A4)
RD_NB_BODY(bf_rows8, 8, NROWS8, NLOAD_A8)
RD_NB_BODY(bf_rows12, 12, NROWS12, NLOAD_A12)
RD_NEON_KERNEL(rd_bf16dot_neon_12x8, uint16_t, uint16_t, bf_rows4, bf_rows8, bf_rows12)

/* ----------------------------------------------------------- int8 quads */

#define IDECL(i, A, L) int32x4_t c##i##0 = vdupq_n_s32(0), c##i##1 = vdupq_n_s32(0);
#define IDOT(i, A, L)                                                       \
    DOT(c##i##0, b0, A, L);                                                 \
    DOT(c##i##1, b1, A, L);
#define ILOAD(reg, k) const uint8x16_t reg = vld1q_u8(a + 16 * (k));
/* Row i's int32 sums to float32 (rd_kernel.h, RD_CT_U8S8): t = S - u cb -
 * v zb with u = 128 + za and v = ra - kc za, wrapping, then
 * (float)t * (sa * sb).  A kernel whose sums are of (A + 128) (B + 128)
 * (BSHIFT 128) first takes 128 (ra + 128 kc) back out: those sums are
 * S + 128 times A + 128 summed over the block's steps (A's padding bytes
 * are 0, so the padding steps add nothing). */
#define IFINISH(i, A, L)                                                    \
    float32x4_t f##i##0, f##i##1;                                           \
    {                                                                       \
        const int32x4_t u = vdupq_n_s32((int32_t)(128u + (uint32_t)za[i])); \
        const int32x4_t v = vdupq_n_s32((int32_t)((uint32_t)ra[i] - (uint32_t)kc * (uint32_t)za[i])); \
        if (BSHIFT) {                                                       \
            const int32x4_t w = vdupq_n_s32((int32_t)(BSHIFT * ((uint32_t)ra[i] + 128u * (uint32_t)kc))); \
            c##i##0 = vsubq_s32(c##i##0, w);                                \
            c##i##1 = vsubq_s32(c##i##1, w);                                \
        }                                                                   \
        c##i##0 = vsubq_s32(c##i##0, vmulq_s32(u, cb0));                    \
        c##i##1 = vsubq_s32(c##i##1, vmulq_s32(u, cb1));                    \
        if (zero_b) {                                                       \
            c##i##0 = vsubq_s32(c##i##0, vmulq_s32(v, zb0));                \
            c##i##1 = vsubq_s32(c##i##1, vmulq_s32(v, zb1));                \
        }                                                                   \
        const float32x4_t s = vdupq_n_f32(sa[i]);                           \
        f##i##0 = vmulq_f32(vcvtq_f32_s32(c##i##0), vmulq_f32(s, sb0));     \
        f##i##1 = vmulq_f32(vcvtq_f32_s32(c##i##1), vmulq_f32(s, sb1));     \
    }
#define IPUT(i, A, L) rd_neon_put_row(c + (i) * rs_c, f##i##0, f##i##1, mode);
#define ISPILL(i, A, L)                                                     \
    vst1q_f32(buf + (i) * 8, f##i##0);                                      \
    vst1q_f32(buf + (i) * 8 + 4, f##i##1);

/* A: 12 rows of quads (48 bytes, the trailer after 12 kq), B: 8 columns
 * of quads (32 bytes, the trailer after 8 kq). */
#define RD_NI_BODY(NAME, R, ROWS, LOADS)                                    \
static void                                                                 \
NAME(rd_int kc, const uint8_t *a, const int8_t *b, float *c, rd_int rs_c,   \
     rd_int cs_c, int m, int n, int mode)                                   \
{                                                                           \
    const rd_int kq = (kc + 3) / 4 * 4;                                     \
    const char *ta = (const char *)a + 12 * kq, *tb = (const char *)b + 8 * kq; \
    const int32_t *ra = (const int32_t *)(const void *)ta;                  \
    const float *sa = (const float *)(const void *)(ta + 48);               \
    const int32_t *za = (const int32_t *)(const void *)(ta + 96);           \
    ROWS(IDECL)                                                             \
    for (rd_int q = 0; q < kq; q += 4) {                                    \
        const int8x16_t b0 = ADJUST_B(vld1q_s8(b)), b1 = ADJUST_B(vld1q_s8(b + 16)); \
        LOADS(ILOAD)                                                        \
        ROWS(IDOT)                                                          \
        a += 48;                                                            \
        b += 32;                                                            \
    }                                                                       \
    const int32x4_t cb0 = vld1q_s32((const int32_t *)(const void *)tb);     \
    const int32x4_t cb1 = vld1q_s32((const int32_t *)(const void *)(tb + 16)); \
    const float32x4_t sb0 = vld1q_f32((const float *)(const void *)(tb + 32)); \
    const float32x4_t sb1 = vld1q_f32((const float *)(const void *)(tb + 48)); \
    const int32x4_t zb0 = vld1q_s32((const int32_t *)(const void *)(tb + 64)); \
    const int32x4_t zb1 = vld1q_s32((const int32_t *)(const void *)(tb + 80)); \
    const int zero_b = vmaxvq_u32(vreinterpretq_u32_s32(vorrq_s32(zb0, zb1))) != 0; \
    ROWS(IFINISH)                                                           \
    if (m == (R) && n == 8 && cs_c == 1) {                                  \
        ROWS(IPUT)                                                          \
        return;                                                             \
    }                                                                       \
    float buf[(R) * 8];                                                     \
    ROWS(ISPILL)                                                            \
    rd_s_store_edge(buf, 8, c, rs_c, cs_c, m, n, mode == RD_ADD ? RD_ADD : RD_STORE); \
}

/* SUDOT: B signed (the vector) times A unsigned (the element), the sums of
 * A + 128 */
#define DOT RD_SUDOT
#define ADJUST_B(x) (x)
#define BSHIFT 0u
RD_NI_BODY(su_rows4, 4, NROWS4, NLOAD_A4)
RD_NI_BODY(su_rows8, 8, NROWS8, NLOAD_A8)
RD_NI_BODY(su_rows12, 12, NROWS12, NLOAD_A12)
RD_NEON_KERNEL(rd_u8s8dot_neon_i8mm_12x8, uint8_t, int8_t, su_rows4, su_rows8, su_rows12)
#undef DOT
#undef ADJUST_B
#undef BSHIFT

/* UDOT: unsigned times unsigned, B + 128 (xor 0x80) */
#define DOT RD_UDOT
#define ADJUST_B(x) vreinterpretq_s8_u8(veorq_u8(vreinterpretq_u8_s8(x), vdupq_n_u8(0x80)))
#define BSHIFT 128u
RD_NI_BODY(ss_rows4, 4, NROWS4, NLOAD_A4)
RD_NI_BODY(ss_rows8, 8, NROWS8, NLOAD_A8)
RD_NI_BODY(ss_rows12, 12, NROWS12, NLOAD_A12)
RD_NEON_KERNEL(rd_u8s8dot_neon_dot_12x8, uint8_t, int8_t, ss_rows4, ss_rows8, ss_rows12)
#undef DOT
#undef ADJUST_B
#undef BSHIFT

/* ------------------------------------------------------------- families */

static int
rd_neon_bf16_runnable(void)
{
    return rd_cpu()->bf16;
}

static int
rd_neon_i8mm_runnable(void)
{
    return rd_cpu()->i8mm;
}

static int
rd_neon_dot_runnable(void)
{
    return rd_cpu()->dotprod;
}

const rd_family_t rd_family_neon_bf16 = {
    "neon-bf16", rd_neon_bf16_runnable,
    {[RD_CT_BF16DP] = RD_NEON_BF16_DESC(rd_bf16dot_neon_12x8)}, 0, {{NULL, 0, 0}},
};
const rd_family_t rd_family_neon_i8mm = {
    "neon-i8mm", rd_neon_i8mm_runnable,
    {[RD_CT_U8S8] = RD_NEON_I8_DESC(rd_u8s8dot_neon_i8mm_12x8)}, 0, {{NULL, 0, 0}},
};
const rd_family_t rd_family_neon_dot = {
    "neon-dot", rd_neon_dot_runnable,
    {[RD_CT_U8S8] = RD_NEON_I8_DESC(rd_u8s8dot_neon_dot_12x8)}, 0, {{NULL, 0, 0}},
};

#endif /* RD_HAVE_ARM_KERNELS */
