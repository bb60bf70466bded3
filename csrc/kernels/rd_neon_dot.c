/*
 * NEON dot-product and matrix-multiply micro-kernels, for aarch64 cores
 * that have the instruction (chosen at run time by their feature bits,
 * cpu/rd_cpu.h):
 *
 *   rd_bf16mmla_neon_12x8 (family "neon-bf16", FEAT_BF16: Graviton 3/4,
 *       Neoverse V1/V2/N2, Grace, Apple M2 and later): bfloat16 by BFMMLA,
 *       RD_CT_BF16MMA: two rows by two columns of 4 steps an instruction,
 *       with the Arm arithmetic (kernels/rd_dot_arith.h: each pair's two
 *       products summed and added to the accumulator, every operation
 *       rounded to odd, denormals flushed; BFMMLA adds a row's two pairs in
 *       order, so its bits are BFDOT's)
 *   rd_u8s8mmla_neon_12x8 (family "neon-i8mm", FEAT_I8MM): int8 by USMMLA,
 *       RD_CT_U8S8MMA: A + 128 unsigned times B signed, two rows by two
 *       columns of 8 steps an instruction, RD_CT_U8S8's trailers: vpdpbusd's
 *       sums, bit for bit
 *   rd_u8s8dot_neon_dot_12x8 (family "neon-dot", FEAT_DotProd: Graviton 2,
 *       Neoverse N1, Apple M1): RD_CT_U8S8 by UDOT (by element), unsigned
 *       times unsigned: B's bytes shifted by 128 too (xor 0x80: two
 *       instructions a step on B's two vectors, where turning A's three
 *       back to signed for SDOT would take three), and the epilogue takes
 *       128 times A's sums (A + 128 over the block: ra + 128 kc) back out
 *
 * Each has a twin in plain C with the same block and blocking
 * (kernels/rd_dot_twins.c), runnable everywhere; the tests hold native and
 * twin bit for bit (under QEMU where no ARM core is at hand).
 *
 * The register block is the float32 kernel's (kernels/rd_neon_body.h):
 * 12 rows x 8 columns, 24 accumulators.
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
#include "rd_neon_w4a8.h"

/* --------------------------------------------------- int8 quads (UDOT) */

#define IDECL(i, A, L) int32x4_t c##i##0 = vdupq_n_s32(0), c##i##1 = vdupq_n_s32(0);
#define IDOT(i, A, L)                                                       \
    RD_UDOT(c##i##0, b0, A, L);                                             \
    RD_UDOT(c##i##1, b1, A, L);
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

/* The rows' int32 sums (c##i##0, c##i##1) to float32 into C, with B's
 * column trailer at tb and A's row trailer (ra, sa, za). */
#define RD_NI_FINISH(R, ROWS)                                               \
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
    rd_s_store_edge(buf, 8, c, rs_c, cs_c, m, n, mode == RD_ADD ? RD_ADD : RD_STORE);

/* UDOT, unsigned times unsigned: A + 128 as packed, B + 128 (xor 0x80).
 * A: 12 rows of quads (48 bytes, the trailer after 12 kq), B: 8 columns of
 * quads (32 bytes, the trailer after 8 kq). */
#define RD_UXOR(x) veorq_u8(vld1q_u8((const uint8_t *)(const void *)(x)), vdupq_n_u8(0x80))
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
        const uint8x16_t b0 = RD_UXOR(b), b1 = RD_UXOR(b + 16);             \
        LOADS(ILOAD)                                                        \
        ROWS(IDOT)                                                          \
        a += 48;                                                            \
        b += 32;                                                            \
    }                                                                       \
    RD_NI_FINISH(R, ROWS)                                                   \
}

#define BSHIFT 128u
RD_NI_BODY(ss_rows4, 4, NROWS4, NLOAD_A4)
RD_NI_BODY(ss_rows8, 8, NROWS8, NLOAD_A8)
RD_NI_BODY(ss_rows12, 12, NROWS12, NLOAD_A12)
RD_NEON_KERNEL(rd_u8s8dot_neon_dot_12x8, uint8_t, int8_t, ss_rows4, ss_rows8, ss_rows12)
#undef BSHIFT

/* --------------------------------------------------- MMLA (2 x 2 blocks)
 *
 * USMMLA and BFMMLA multiply two rows of A by two columns of B into a 2 x 2
 * block of C per register: 24 accumulators hold the 12 x 8 block as 6 row
 * pairs x 4 column pairs.  Both operands are packed in blocks of 8 int8 /
 * 4 bfloat16 steps, each row's (column's) values of a block contiguous, so
 * one 16-byte load is a row pair's (column pair's) operand: per step 6
 * loads of A, 4 of B, 24 MMLA.  The 2 x 2 blocks are unzipped into rows at
 * the end. */
#define MPAIRS4(X) X(0, 0, 1) X(1, 2, 3)
#define MPAIRS8(X) MPAIRS4(X) X(2, 4, 5) X(3, 6, 7)
#define MPAIRS12(X) MPAIRS8(X) X(4, 8, 9) X(5, 10, 11)
#define MDECL(t, r0, r1) ACC m##t##0 = ZERO, m##t##1 = ZERO, m##t##2 = ZERO, m##t##3 = ZERO;
/* (the barrier keeps each row pair's load beside its products: a compiler
 * that hoists all six loads above them runs out of registers and spills
 * accumulators) */
#define MSTEP(t, r0, r1)                                                    \
    {                                                                       \
        __asm__ volatile("" ::: "memory");                                  \
        const AV at = LOAD_A(a + (t) * A_PAIR);                             \
        MMLA(m##t##0, at, bj0);                                             \
        MMLA(m##t##1, at, bj1);                                             \
        MMLA(m##t##2, at, bj2);                                             \
        MMLA(m##t##3, at, bj3);                                             \
    }
/* rows r0 = 2t and r1 = 2t + 1 of the block, columns 0-3 and 4-7 */
#define MUNZIP(t, r0, r1)                                                   \
    ACC c##r0##0 = UNZIP(vzip1q_u64, m##t##0, m##t##1), c##r0##1 = UNZIP(vzip1q_u64, m##t##2, m##t##3); \
    ACC c##r1##0 = UNZIP(vzip2q_u64, m##t##0, m##t##1), c##r1##1 = UNZIP(vzip2q_u64, m##t##2, m##t##3);

/* The product loop: `steps` blocks of the contraction, A_PAIR elements a
 * row pair (and a column pair of B). */
#define RD_MMLA_LOOP(PAIRS)                                                 \
    PAIRS(MDECL)                                                            \
    for (rd_int st = 0; st < steps; st++) {                                 \
        const BV bj0 = LOAD_B(b), bj1 = LOAD_B(b + A_PAIR);                 \
        const BV bj2 = LOAD_B(b + 2 * A_PAIR), bj3 = LOAD_B(b + 3 * A_PAIR); \
        PAIRS(MSTEP)                                                        \
        a += 6 * A_PAIR;                                                    \
        b += 4 * A_PAIR;                                                    \
    }                                                                       \
    PAIRS(MUNZIP)

/* bfloat16: blocks of 4 steps (a row pair, a column pair: 8 halves) */
#define ACC float32x4_t
#define ZERO vdupq_n_f32(0.0f)
#define AV uint16x8_t
#define BV uint16x8_t
#define LOAD_A(p) vld1q_u16(p)
#define LOAD_B(p) vld1q_u16(p)
#define A_PAIR 8
#define MMLA RD_BFMMLA
#define UNZIP(z, x, y) vreinterpretq_f32_u64(z(vreinterpretq_u64_f32(x), vreinterpretq_u64_f32(y)))
#define RD_NBM_BODY(NAME, R, ROWS, PAIRS)                                   \
static void                                                                 \
NAME(rd_int kc, const uint16_t *a, const uint16_t *b, float *c, rd_int rs_c, \
     rd_int cs_c, int m, int n, int mode)                                   \
{                                                                           \
    const rd_int steps = (kc + 3) / 4;   /* blocks of 4 steps */            \
    RD_MMLA_LOOP(PAIRS)                                                     \
    RD_NEON_LEAVE(R, ROWS)                                                  \
}
RD_NBM_BODY(bfm_rows4, 4, NROWS4, MPAIRS4)
RD_NBM_BODY(bfm_rows8, 8, NROWS8, MPAIRS8)
RD_NBM_BODY(bfm_rows12, 12, NROWS12, MPAIRS12)
RD_NEON_KERNEL(rd_bf16mmla_neon_12x8, uint16_t, uint16_t, bfm_rows4, bfm_rows8, bfm_rows12)
#undef ACC
#undef ZERO
#undef AV
#undef BV
#undef LOAD_A
#undef LOAD_B
#undef A_PAIR
#undef MMLA
#undef UNZIP

/* int8: blocks of 8 steps (A + 128: a row pair 16 bytes; B: a column pair
 * 16 bytes), then RD_CT_U8S8's trailers and epilogue (IFINISH) */
#define ACC int32x4_t
#define ZERO vdupq_n_s32(0)
#define AV uint8x16_t
#define BV int8x16_t
#define LOAD_A(p) vld1q_u8(p)
#define LOAD_B(p) vld1q_s8(p)
#define A_PAIR 16
#define MMLA RD_USMMLA
#define UNZIP(z, x, y) vreinterpretq_s32_u64(z(vreinterpretq_u64_s32(x), vreinterpretq_u64_s32(y)))
#define BSHIFT 0u
#define RD_NIM_BODY(NAME, R, ROWS, PAIRS)                                   \
static void                                                                 \
NAME(rd_int kc, const uint8_t *a, const int8_t *b, float *c, rd_int rs_c,   \
     rd_int cs_c, int m, int n, int mode)                                   \
{                                                                           \
    const rd_int k8 = (kc + 7) / 8 * 8, steps = k8 / 8;                    \
    const char *ta = (const char *)a + 12 * k8, *tb = (const char *)b + 8 * k8; \
    const int32_t *ra = (const int32_t *)(const void *)ta;                  \
    const float *sa = (const float *)(const void *)(ta + 48);               \
    const int32_t *za = (const int32_t *)(const void *)(ta + 96);           \
    RD_MMLA_LOOP(PAIRS)                                                     \
    RD_NI_FINISH(R, ROWS)                                                   \
}
RD_NIM_BODY(usm_rows4, 4, NROWS4, MPAIRS4)
RD_NIM_BODY(usm_rows8, 8, NROWS8, MPAIRS8)
RD_NIM_BODY(usm_rows12, 12, NROWS12, MPAIRS12)
RD_NEON_KERNEL(rd_u8s8mmla_neon_12x8, uint8_t, int8_t, usm_rows4, usm_rows8, usm_rows12)
#undef ACC
#undef ZERO
#undef AV
#undef BV
#undef LOAD_A
#undef LOAD_B
#undef A_PAIR
#undef MMLA
#undef UNZIP
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
    {[RD_CT_BF16MMA] = RD_NEON_BF16_DESC(rd_bf16mmla_neon_12x8)}, 0, {{NULL, 0, 0}}, {{NULL, 0, NULL, 0}},
};
const rd_family_t rd_family_neon_i8mm = {
    "neon-i8mm", rd_neon_i8mm_runnable,
    {[RD_CT_U8S8MMA] = RD_NEON_I8_DESC(rd_u8s8mmla_neon_12x8)}, 0, {{NULL, 0, 0}}, {{NULL, 0, NULL, 0}},
};
/* (with the w4a8 kernels of rd_neon_w4a8.c: 4-bit weights, int8 rows) */
const rd_family_t rd_family_neon_dot = {
    "neon-dot", rd_neon_dot_runnable,
    {[RD_CT_U8S8] = RD_NEON_I8_DESC(rd_u8s8dot_neon_dot_12x8),
     [RD_CT_U8S8_I4] = RD_NEON_I8_DESC(rd_w4a8_neon_i4),
     [RD_CT_U8S8_F4] = RD_NEON_I8_DESC(rd_w4a8_neon_f4)},
    0, {{NULL, 0, 0}},
    {[RD_CT_U8S8_I4] = {rd_w4a8_few_neon_i4, 4, rd_w4a8_neon_i4, 0},
     [RD_CT_U8S8_F4] = {rd_w4a8_few_neon_f4, 4, rd_w4a8_neon_f4, 0}},
};

#endif /* RD_HAVE_ARM_KERNELS */
