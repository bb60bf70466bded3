/*
 * NEON (Advanced SIMD) micro-kernels, family "neon": every aarch64 core
 * has them (Apple M-series, AWS Graviton, NVIDIA Grace, Ampere, Azure
 * Cobalt, Raspberry Pi).  Plain intrinsics of the base instruction set.
 *
 *   rd_sgemm_neon_12x8: 12 rows x 8 columns of float32 (fmla by element)
 *   rd_dgemm_neon_6x8:  6 rows x 8 columns of float64
 *   rd_sgemm_neon_{bf16w,f16w}_12x8: float32 with 16-bit B panels
 *   rd_sgemm_neon_{i8w,f8w}_12x8: float32 with one-byte B panels of
 *       prepacked quantized weights (RD_CT_F32_I8W, RD_CT_F32_F8W)
 *   rd_sgemm_neon_f4w_12x8: float32 with 4-bit B panels (RD_CT_F32_F4W)
 *   rd_sgemm_neon_i4w_12x8: float32 with int4 B panels (RD_CT_F32_I4W)
 *   rd_sgemm_neon_stream_8x2048: up to 8 rows reading B in place (rd_sukr_t)
 *
 * Register blocking by the cores' FMA pipes: 24 accumulators of 4 lanes
 * (96 products a step), three vectors of A (12 rows, each row's value
 * taken by lane) and two of B.  Per step: 5 loads, 24 fmla.  With 4-cycle
 * fmla latency, 24 independent chains keep 4 pipes (Neoverse V1/V2, Apple
 * M-series) or 2 (Neoverse N1/N2) busy; llvm-mca's models of those cores
 * put the loop at their FMA bound (README, "Supported CPUs").
 *
 * Every product is one fused multiply-add, as the x86 FMA kernels'; a
 * widened or dequantized B value is exactly the value the per-call
 * packing writes, so the results equal the float32 kernel's on those
 * values bit for bit (rd_kernel.h).
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_ARM_KERNELS

#include "rd_neon_body.h"
#include "rd_neon_few.h"

/* The requests of rd_ahead (rd_kernel.h), one line a step, as the x86
 * float32 kernels make them: the first `ahead_steps` steps of the loop
 * request one line each (the loop is split there, so that neither part
 * tests anything but its counter), the rest none. */
#define RD_NAHEAD_ENTER                                                     \
    const char *ahead = rd_ahead.next;                                      \
    const rd_int ahead_lines = ahead < rd_ahead.end ? (rd_ahead.end - ahead + 63) / 64 : 0; \
    const rd_int ahead_steps = ahead_lines < kc ? ahead_lines : kc;
#define RD_NAHEAD_STEP                                                      \
    __builtin_prefetch(ahead, 0, 2);                                        \
    ahead += 64;
#define RD_NAHEAD_LEAVE rd_ahead.next = ahead;

#define NDECL(i, A, L) float32x4_t c##i##0 = vdupq_n_f32(0.0f), c##i##1 = vdupq_n_f32(0.0f);
#define NFMA(i, A, L)                                                       \
    c##i##0 = vfmaq_laneq_f32(c##i##0, b0, A, L);                           \
    c##i##1 = vfmaq_laneq_f32(c##i##1, b1, A, L);
#define NLOAD_F32(reg, k) const float32x4_t reg = vld1q_f32(a + 4 * (k));

/* ---------------------------------------------------------------- float32 */

/* LOAD_B(b, b0, b1): the two B vectors of a step; B_STEP: B's elements a
 * step.  AHEAD_*: the requests of rd_ahead (ahead_steps of the steps make
 * one), or nothing (no step does). */
#define RD_NF_STEP(ROWS, LOADS)                                             \
    {                                                                       \
        LOAD_B(b, b0, b1)                                                   \
        LOADS(NLOAD_F32)                                                    \
        ROWS(NFMA)                                                          \
        a += 12;                                                            \
        b += B_STEP;                                                        \
    }
#define RD_NF_BODY(NAME, R, ROWS, LOADS)                                    \
static void                                                                 \
NAME(rd_int kc, const float *a, const TB *b, float *c, rd_int rs_c,         \
     rd_int cs_c, int m, int n, int mode)                                   \
{                                                                           \
    ROWS(NDECL)                                                             \
    AHEAD_ENTER                                                             \
    rd_int p = 0;                                                           \
    for (; p < ahead_steps; p++) {                                          \
        RD_NF_STEP(ROWS, LOADS)                                             \
        AHEAD_STEP                                                          \
    }                                                                       \
    for (; p < kc; p++)                                                     \
        RD_NF_STEP(ROWS, LOADS)                                             \
    AHEAD_LEAVE                                                             \
    RD_NEON_LEAVE(R, ROWS)                                                  \
}

#define RD_NF_KERNEL(NAME, P)                                               \
    RD_NF_BODY(P##_rows4, 4, NROWS4, NLOAD_A4)                              \
    RD_NF_BODY(P##_rows8, 8, NROWS8, NLOAD_A8)                              \
    RD_NF_BODY(P##_rows12, 12, NROWS12, NLOAD_A12)                          \
    RD_NEON_KERNEL(NAME, float, TB, P##_rows4, P##_rows8, P##_rows12)

#define TB float
#define B_STEP 8
#define LOAD_B(b, b0, b1) const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32((b) + 4);
#define AHEAD_ENTER RD_NAHEAD_ENTER
#define AHEAD_STEP RD_NAHEAD_STEP
#define AHEAD_LEAVE RD_NAHEAD_LEAVE
RD_NF_KERNEL(rd_sgemm_neon_12x8, s)
#undef AHEAD_ENTER
#undef AHEAD_STEP
#undef AHEAD_LEAVE
#define AHEAD_ENTER const rd_int ahead_steps = 0;
#define AHEAD_STEP
#define AHEAD_LEAVE
#undef TB
#undef LOAD_B

/* float32 arithmetic on 16-bit B panels, widened in registers: bfloat16
 * rows hold their halves interleaved (RD_CT_F32_BF16W: position 2j column
 * j, 2j+1 column 4+j), so a shift gives columns 0-3 and a mask columns
 * 4-7; float16 rows in order go through fcvtl.  Both widenings are exact. */
#define TB uint16_t
#define LOAD_B(b, b0, b1)                                                   \
    const uint32x4_t bw = vreinterpretq_u32_u16(vld1q_u16(b));              \
    const float32x4_t b0 = vreinterpretq_f32_u32(vshlq_n_u32(bw, 16));      \
    const float32x4_t b1 = vreinterpretq_f32_u32(vandq_u32(bw, vdupq_n_u32(0xffff0000u)));
RD_NF_KERNEL(rd_sgemm_neon_bf16w_12x8, sb)
#undef LOAD_B
#define LOAD_B(b, b0, b1)                                                   \
    const float16x8_t bh = vreinterpretq_f16_u16(vld1q_u16(b));             \
    const float32x4_t b0 = vcvt_f32_f16(vget_low_f16(bh));                  \
    const float32x4_t b1 = vcvt_high_f32_f16(bh);
RD_NF_KERNEL(rd_sgemm_neon_f16w_12x8, sh)
#undef LOAD_B
#undef TB
#undef B_STEP

/* float32 on quantized panels (rd_kernel.h, RD_CT_F32_I8W / F8W): one-byte
 * B rows (8 bytes a step) widened exactly, then (w - z) * s with the scales
 * and zero points of the run the step is in, then the FMAs. */
#define RD_NQ_STEP(ROWS, LOADS, DEQ)                                        \
    {                                                                       \
        WIDEN(b, w0, w1)                                                    \
        const float32x4_t b0 = DEQ(w0, z0, s0), b1 = DEQ(w1, z1, s1);       \
        LOADS(NLOAD_F32)                                                    \
        ROWS(NFMA)                                                          \
        a += 12;                                                            \
        b += SB;                                                            \
    }
/* (w - z) * s; without zero points w * s, the same value (w - 0 = w) */
#define RD_DEQ_ZP(w, z, s) vmulq_f32(vsubq_f32((w), (z)), (s))
#define RD_DEQ(w, z, s) vmulq_f32((w), (s))
#define RD_NQ_BODY(NAME, R, ROWS, LOADS)                                    \
static void                                                                 \
NAME(rd_int kc, const float *a, const uint8_t *b, float *c, rd_int rs_c,    \
     rd_int cs_c, int m, int n, int mode)                                   \
{                                                                           \
    const char *tr = (const char *)b + SB * kc;                             \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, tr, sizeof h);                                               \
    ROWS(NDECL)                                                             \
    rd_int p = 0, len = h.first;                                            \
    for (rd_int r = 0; p < kc; r++, len = h.tile) {                         \
        const float *sv = (const float *)(const void *)(tr + RD_QRUN(r, 8, h.zp)); \
        const float32x4_t s0 = vld1q_f32(sv), s1 = vld1q_f32(sv + 4);       \
        const rd_int end = kc - p < len ? kc : p + len;                     \
        if (h.zp) {                                                         \
            const float32x4_t z0 = vld1q_f32(sv + 8), z1 = vld1q_f32(sv + 12); \
            for (; p < end; p++)                                            \
                RD_NQ_STEP(ROWS, LOADS, RD_DEQ_ZP)                          \
        } else {                                                            \
            for (; p < end; p++)                                            \
                RD_NQ_STEP(ROWS, LOADS, RD_DEQ)                             \
        }                                                                   \
    }                                                                       \
    RD_NEON_LEAVE(R, ROWS)                                                  \
}

#define RD_NQ_KERNEL(NAME, P)                                               \
    RD_NQ_BODY(P##_rows4, 4, NROWS4, NLOAD_A4)                              \
    RD_NQ_BODY(P##_rows8, 8, NROWS8, NLOAD_A8)                              \
    RD_NQ_BODY(P##_rows12, 12, NROWS12, NLOAD_A12)                          \
    RD_NEON_KERNEL(NAME, float, uint8_t, P##_rows4, P##_rows8, P##_rows12)

/* SB: bytes of B a step (8 one a byte; 4 for int4 nibbles) */
#define SB 8
/* int8 values: sign-extended to 32 bits, converted (exact) */
#define WIDEN(b, w0, w1)                                                    \
    const int16x8_t bq = vmovl_s8(vld1_s8((const int8_t *)(const void *)(b))); \
    const float32x4_t w0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(bq)));      \
    const float32x4_t w1 = vcvtq_f32_s32(vmovl_high_s16(bq));
RD_NQ_KERNEL(rd_sgemm_neon_i8w_12x8, si8)
#undef WIDEN
/* float8_e4m3fn codes (not NaN): sign, exponent and mantissa moved into
 * binary16's places (whose bias is 8 more), widened, scaled by 2^8 */
#define WIDEN(b, w0, w1)                                                    \
    const uint16x8_t bh = vmovl_u8(vld1_u8(b));                             \
    const uint16x8_t bits = vorrq_u16(vshlq_n_u16(vandq_u16(bh, vdupq_n_u16(0x80)), 8), \
                                      vshlq_n_u16(vandq_u16(bh, vdupq_n_u16(0x7f)), 7)); \
    const float16x8_t bf = vreinterpretq_f16_u16(bits);                     \
    const float32x4_t w0 = vmulq_f32(vcvt_f32_f16(vget_low_f16(bf)), vdupq_n_f32(256.0f)); \
    const float32x4_t w1 = vmulq_f32(vcvt_high_f32_f16(bf), vdupq_n_f32(256.0f));
RD_NQ_KERNEL(rd_sgemm_neon_f8w_12x8, sf8)
#undef WIDEN
#undef SB
/* int4 codes (RD_CT_F32_I4W): a step's 4 bytes hold columns 0-3 in their
 * low nibbles and 4-7 in their high ones (split as the 4-bit float kernel
 * splits them), each the value (code ^ 8) - 8: sign-extended, converted */
#define SB 4
#define WIDEN(b, w0, w1)                                                    \
    uint32_t word;                                                          \
    memcpy(&word, b, 4);                                                    \
    const uint8x8_t codes = vand_u8(vshl_u8(vreinterpret_u8_u32(vdup_n_u32(word)), vld1_s8(rd_nibble_shift)), \
                                    vdup_n_u8(0x0f));                       \
    const int16x8_t bq = vmovl_s8(vsub_s8(vreinterpret_s8_u8(veor_u8(codes, vdup_n_u8(8))), vdup_n_s8(8))); \
    const float32x4_t w0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(bq)));      \
    const float32x4_t w1 = vcvtq_f32_s32(vmovl_high_s16(bq));
RD_NQ_KERNEL(rd_sgemm_neon_i4w_12x8, si4)
#undef WIDEN
#undef SB

/* float32 on 4-bit panels (RD_CT_F32_F4W): a step's 4 bytes hold columns
 * 0-3 in their low nibbles and 4-7 in their high ones.  Every e2m1 value's
 * float32 bits are 0 below the top 16, so two 16-entry byte tables (the
 * low and high byte of those 16 bits) decode 8 codes with two tbl, a zip
 * widens them to float32, and the product with the column's power-of-two
 * scale is exact (the tables and scales: kernels/rd_neon_body.h): then the
 * FMAs. */
#define RD_NF4_BODY(NAME, R, ROWS, LOADS)                                   \
static void                                                                 \
NAME(rd_int kc, const float *a, const uint8_t *b, float *c, rd_int rs_c,    \
     rd_int cs_c, int m, int n, int mode)                                   \
{                                                                           \
    const char *tr = (const char *)b + 4 * kc;                              \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, tr, sizeof h);                                               \
    const uint8x16_t tlo = vld1q_u8(rd_e2m1_lo), thi = vld1q_u8(rd_e2m1_hi); \
    const int8x8_t shift = vld1_s8(rd_nibble_shift);                        \
    ROWS(NDECL)                                                             \
    rd_int p = 0, len = h.first;                                            \
    for (rd_int r = 0; p < kc; r++, len = h.tile) {                         \
        float32x4_t s0, s1;                                                 \
        rd_neon_e8m0((const uint8_t *)(tr + RD_F4RUN(r, 8)), &s0, &s1);     \
        const rd_int end = kc - p < len ? kc : p + len;                     \
        for (; p < end; p++) {                                              \
            uint32_t word;                                                  \
            memcpy(&word, b, 4);                                            \
            const uint8x8_t codes = vand_u8(vshl_u8(vreinterpret_u8_u32(vdup_n_u32(word)), shift), \
                                            vdup_n_u8(0x0f));               \
            const uint8x8x2_t z = vzip_u8(vqtbl1_u8(tlo, codes), vqtbl1_u8(thi, codes)); \
            const uint16x8_t top = vreinterpretq_u16_u8(vcombine_u8(z.val[0], z.val[1])); \
            const float32x4_t b0 = vmulq_f32(vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(top), 16)), s0); \
            const float32x4_t b1 = vmulq_f32(vreinterpretq_f32_u32(vshll_high_n_u16(top, 16)), s1); \
            LOADS(NLOAD_F32)                                                \
            ROWS(NFMA)                                                      \
            a += 12;                                                        \
            b += 4;                                                         \
        }                                                                   \
    }                                                                       \
    RD_NEON_LEAVE(R, ROWS)                                                  \
}
RD_NF4_BODY(sf4_rows4, 4, NROWS4, NLOAD_A4)
RD_NF4_BODY(sf4_rows8, 8, NROWS8, NLOAD_A8)
RD_NF4_BODY(sf4_rows12, 12, NROWS12, NLOAD_A12)
RD_NEON_KERNEL(rd_sgemm_neon_f4w_12x8, float, uint8_t, sf4_rows4, sf4_rows8, sf4_rows12)

/* ---------------------------------------------------------------- float64 */

/* 6 rows x 8 columns: A's 6 rows in three vectors of 2 (each row's value
 * by lane), B's 8 columns in four, 24 accumulators; per step 7 loads and
 * 24 fmla.  One body for every row count (edges through a spill). */
#define DROWS(X) X(0, a0, 0) X(1, a0, 1) X(2, a1, 0) X(3, a1, 1) X(4, a2, 0) X(5, a2, 1)
#define DDECL(i, A, L)                                                      \
    float64x2_t c##i##0 = vdupq_n_f64(0.0), c##i##1 = vdupq_n_f64(0.0),     \
                c##i##2 = vdupq_n_f64(0.0), c##i##3 = vdupq_n_f64(0.0);
#define DFMA(i, A, L)                                                       \
    c##i##0 = vfmaq_laneq_f64(c##i##0, b0, A, L);                           \
    c##i##1 = vfmaq_laneq_f64(c##i##1, b1, A, L);                           \
    c##i##2 = vfmaq_laneq_f64(c##i##2, b2, A, L);                           \
    c##i##3 = vfmaq_laneq_f64(c##i##3, b3, A, L);
#define DPUT(i, A, L)                                                       \
    {                                                                       \
        double *ci = c + (i) * rs_c;                                        \
        if (mode == RD_ADD) {                                               \
            c##i##0 = vaddq_f64(vld1q_f64(ci), c##i##0);                    \
            c##i##1 = vaddq_f64(vld1q_f64(ci + 2), c##i##1);                \
            c##i##2 = vaddq_f64(vld1q_f64(ci + 4), c##i##2);                \
            c##i##3 = vaddq_f64(vld1q_f64(ci + 6), c##i##3);                \
        }                                                                   \
        vst1q_f64(ci, c##i##0);                                             \
        vst1q_f64(ci + 2, c##i##1);                                         \
        vst1q_f64(ci + 4, c##i##2);                                         \
        vst1q_f64(ci + 6, c##i##3);                                         \
    }
#define DSPILL(i, A, L)                                                     \
    vst1q_f64(buf + (i) * 8, c##i##0);                                      \
    vst1q_f64(buf + (i) * 8 + 2, c##i##1);                                  \
    vst1q_f64(buf + (i) * 8 + 4, c##i##2);                                  \
    vst1q_f64(buf + (i) * 8 + 6, c##i##3);

static void
rd_dgemm_neon_6x8(rd_int kc, const void *a_, const void *b_, void *c_, rd_int rs_c, rd_int cs_c,
                  int m, int n, int mode)
{
    const double *a = (const double *)a_, *b = (const double *)b_;
    double *c = (double *)c_;
    DROWS(DDECL)
    for (rd_int p = 0; p < kc; p++) {
        const float64x2_t b0 = vld1q_f64(b), b1 = vld1q_f64(b + 2), b2 = vld1q_f64(b + 4),
                          b3 = vld1q_f64(b + 6);
        const float64x2_t a0 = vld1q_f64(a), a1 = vld1q_f64(a + 2), a2 = vld1q_f64(a + 4);
        DROWS(DFMA)
        a += 6;
        b += 8;
    }
    if (m == 6 && n == 8 && cs_c == 1) {
        DROWS(DPUT)
        return;
    }
    double buf[6 * 8];
    DROWS(DSPILL)
    rd_d_store_edge(buf, 8, c, rs_c, cs_c, m, n, mode == RD_ADD ? RD_ADD : RD_STORE);
}

/* ------------------------------------------------------------- streaming */

/* The streaming kernel (rd_sukr_t, kernels/rd_stream_body.h) on NEON: a
 * "mask" is the count of valid lanes of the last vector of a row, and the
 * masked load reads only those. */
static inline float32x4_t
rd_neon_loadm(int k, const float *p)
{
    if (k == 4)
        return vld1q_f32(p);
    float32x4_t v = vdupq_n_f32(0.0f);
    v = vld1q_lane_f32(p, v, 0);
    if (k > 1)
        v = vld1q_lane_f32(p + 1, v, 1);
    if (k > 2)
        v = vld1q_lane_f32(p + 2, v, 2);
    return v;
}

#define TARGET
#define V float32x4_t
#define W 4
#define MASK int
#define MASK_ALL 4
#define MASK_FIRST(r) (r)
#define LOADM(k, p) rd_neon_loadm((k), (p))
#define LOAD vld1q_f32
#define STORE vst1q_f32
#define SET1 vdupq_n_f32
#define FMA(a, b, c) vfmaq_f32((c), (a), (b))
#define ZERO() vdupq_n_f32(0.0f)
#define RD_SREGS 32
#include "rd_stream_body.h"
RD_STREAM_KERNEL(rd_sgemm_neon_stream_8x2048, s_stream)

/* ---------------------------------------------------------------- family */

static int
rd_neon_runnable(void)
{
    return rd_cpu()->neon;
}

/* Blocking: KC 512 (a 16 KiB B micro-panel and a 24 KiB A micro-panel fit
 * the 64 KiB L1 of Neoverse N1/V1/V2 and the larger ones of Apple's
 * cores), MC = 144 rows of A (288 KiB) in L2, NC = 4080 columns. */
const rd_family_t rd_family_neon = {
    "neon",
    rd_neon_runnable,
    {
        [RD_CT_F32] = {rd_sgemm_neon_12x8, 12, 8, 144, 512, 4080, NULL},
        [RD_CT_F64] = {rd_dgemm_neon_6x8, 6, 8, 72, 256, 4080, NULL},
        [RD_CT_F32_BF16W] = {rd_sgemm_neon_bf16w_12x8, 12, 8, 144, 512, 4080, NULL},
        [RD_CT_F32_F16W] = {rd_sgemm_neon_f16w_12x8, 12, 8, 144, 512, 4080, NULL},
        [RD_CT_F32_I8W] = {rd_sgemm_neon_i8w_12x8, 12, 8, 144, 512, 4080, NULL},
        [RD_CT_F32_F8W] = {rd_sgemm_neon_f8w_12x8, 12, 8, 144, 512, 4080, NULL},
        [RD_CT_F32_F4W] = {rd_sgemm_neon_f4w_12x8, 12, 8, 144, 512, 4080, NULL},
        [RD_CT_F32_I4W] = {rd_sgemm_neon_i4w_12x8, 12, 8, 144, 512, 4080, NULL},
    },
    0,
    {[RD_CT_F32] = {rd_sgemm_neon_stream_8x2048, RD_SMR, RD_SNR}},
    {
        [RD_CT_F32] = {rd_few_neon_f32, 2, rd_sgemm_neon_12x8, 0},
        [RD_CT_F32_BF16W] = {rd_few_neon_bf16w, 2, rd_sgemm_neon_bf16w_12x8, 0},
        [RD_CT_F32_F16W] = {rd_few_neon_f16w, 2, rd_sgemm_neon_f16w_12x8, 0},
        [RD_CT_F32_I8W] = {rd_few_neon_i8w, 2, rd_sgemm_neon_i8w_12x8, 0},
        [RD_CT_F32_F8W] = {rd_few_neon_f8w, 2, rd_sgemm_neon_f8w_12x8, 0},
        [RD_CT_F32_F4W] = {rd_few_neon_f4w, 2, rd_sgemm_neon_f4w_12x8, 0},
        [RD_CT_F32_I4W] = {rd_few_neon_i4w, 2, rd_sgemm_neon_i4w_12x8, 0},
    },
};

#endif /* RD_HAVE_ARM_KERNELS */
