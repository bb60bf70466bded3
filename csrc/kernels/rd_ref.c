/*
 * Portable reference micro-kernels: plain C loops with the same packed
 * layout and the same contract as the SIMD kernels (see rd_kernel.h).
 * They are the fallback on CPUs without SIMD kernels and the yardstick the
 * tests hold the SIMD kernels to.
 *
 *   rd_sgemm_ref_6x16:  6 rows x 16 columns of float32
 *   rd_sgemm_ref_stream_8x2048: up to 8 rows reading B in place (rd_sukr_t)
 *   rd_dgemm_ref_6x8 :  6 rows x  8 columns of float64
 *   rd_sgemm_ref_bf16w_6x16, rd_sgemm_ref_f16w_6x16: float32 A, 16-bit B
 *       panels (RD_CT_F32_BF16W with interleaved halves, RD_CT_F32_F16W),
 *       each B value widened exactly to float32 before its products
 *   rd_i8gemm_ref_6x16:  int16 k-pairs of int8 values (RD_CT_I8I32), exact
 *       int32 sums, scaled into float32 once per block
 *   rd_sgemm_ref_i8w_6x16, rd_sgemm_ref_f8w_6x16: float32 A, one-byte B
 *       panels of prepacked quantized weights with their scales
 *       (RD_CT_F32_I8W, RD_CT_F32_F8W), each B value widened and
 *       dequantized to float32 before its products
 */
#include "rd_kernel.h"
#include "rd_half.h"

#define RD_REF_UKR(NAME, T, MR, NR, STORE)                                  \
static void NAME(rd_int kc, const void *a_, const void *b_, void *c,        \
                 rd_int rs_c, rd_int cs_c, int m, int n, int mode)          \
{                                                                           \
    const T *a = (const T *)a_, *b = (const T *)b_;                         \
    T acc[MR][NR];                                                          \
    for (int i = 0; i < MR; i++)                                            \
        for (int j = 0; j < NR; j++)                                        \
            acc[i][j] = 0;                                                  \
    for (rd_int p = 0; p < kc; p++) {                                       \
        const T *ap = a + p * MR;                                           \
        const T *bp = b + p * NR;                                           \
        for (int i = 0; i < MR; i++)                                        \
            for (int j = 0; j < NR; j++)                                    \
                acc[i][j] += ap[i] * bp[j];                                 \
    }                                                                       \
    STORE(&acc[0][0], NR, (T *)c, rs_c, cs_c, m, n, mode);                  \
}

RD_REF_UKR(rd_sgemm_ref_6x16, float, 6, 16, rd_s_store_edge)
RD_REF_UKR(rd_dgemm_ref_6x8, double, 6, 8, rd_d_store_edge)

/* The streaming kernel (rd_sukr_t): up to 8 rows of an 8-row A panel, B's
 * row p read in place (ldb elements apart, its first n columns), row after
 * row, with rd_sgemm_ref_6x16's arithmetic. */
static void
rd_sgemm_ref_stream_8x2048(rd_int kc, const void *a_, const void *b_, rd_int ldb, void *c,
                          rd_int rs_c, rd_int cs_c, int m, int n, int mode)
{
    const float *a = (const float *)a_, *b = (const float *)b_;
    float acc[8][2048];
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            acc[i][j] = 0;
    for (rd_int p = 0; p < kc; p++) {
        const float *bp = b + p * ldb;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                acc[i][j] += a[8 * p + i] * bp[j];
    }
    rd_s_store_edge(&acc[0][0], 2048, (float *)c, rs_c, cs_c, m, n, mode == RD_ADD ? RD_ADD : RD_STORE);
}

/* B's row p as float32, column j read from position AT(j) of the row. */
#define RD_REF_UKR_W(NAME, MR, NR, WIDEN, AT)                                \
static void NAME(rd_int kc, const void *a_, const void *b_, void *c,        \
                 rd_int rs_c, rd_int cs_c, int m, int n, int mode)          \
{                                                                           \
    const float *a = (const float *)a_;                                     \
    const uint16_t *b = (const uint16_t *)b_;                               \
    float acc[MR][NR], row[NR];                                             \
    for (int i = 0; i < MR; i++)                                            \
        for (int j = 0; j < NR; j++)                                        \
            acc[i][j] = 0;                                                  \
    for (rd_int p = 0; p < kc; p++) {                                       \
        const float *ap = a + p * MR;                                       \
        for (int j = 0; j < NR; j++)                                        \
            row[j] = WIDEN(b[p * NR + AT(j)]);                              \
        for (int i = 0; i < MR; i++)                                        \
            for (int j = 0; j < NR; j++)                                    \
                acc[i][j] += ap[i] * row[j];                                \
    }                                                                       \
    rd_s_store_edge(&acc[0][0], NR, (float *)c, rs_c, cs_c, m, n, mode);    \
}

#define RD_IN_ORDER(j) (j)
#define RD_HALVES_16(j) ((j) < 8 ? 2 * (j) : 2 * ((j) - 8) + 1)
RD_REF_UKR_W(rd_sgemm_ref_bf16w_6x16, 6, 16, rd_bf16_to_float, RD_HALVES_16)
RD_REF_UKR_W(rd_sgemm_ref_f16w_6x16, 6, 16, rd_f16_to_float, RD_IN_ORDER)

/* One-byte B widened exactly: an int8 value, or a float8_e4m3fn code (not
 * NaN) placed in a binary16's bits (sign; exponent and mantissa shifted
 * into the top of binary16's, whose bias is 8 more) and scaled by 2^8. */
static inline float
rd_widen_i8(uint8_t b)
{
    return (float)(int8_t)b;
}

static inline float
rd_widen_f8(uint8_t b)
{
    const uint16_t h = (uint16_t)(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));
    return rd_f16_to_float(h) * 256.0f;
}

/* The quantized-panel contract (rd_kernel.h, RD_CT_F32_I8W / F8W): per run
 * of the block, B's row p is (widen(b) - z) * s column by column, then the
 * float32 products and sums of rd_sgemm_ref_6x16. */
#define RD_REF_UKR_Q(NAME, MR, NR, WIDEN)                                    \
static void NAME(rd_int kc, const void *a_, const void *b_, void *c,        \
                 rd_int rs_c, rd_int cs_c, int m, int n, int mode)          \
{                                                                           \
    const float *a = (const float *)a_;                                     \
    const uint8_t *b = (const uint8_t *)b_;                                 \
    const char *tr = (const char *)b_ + (rd_int)(NR) * kc;                  \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, tr, sizeof h);                                               \
    float acc[MR][NR], row[NR];                                             \
    for (int i = 0; i < MR; i++)                                            \
        for (int j = 0; j < NR; j++)                                        \
            acc[i][j] = 0;                                                  \
    rd_int p = 0, len = h.first;                                            \
    for (rd_int r = 0; p < kc; r++, len = h.tile) {                         \
        const float *s = (const float *)(const void *)(tr + RD_QRUN(r, NR, h.zp)); \
        float z[NR];                                                        \
        for (int j = 0; j < NR; j++)                                        \
            z[j] = h.zp ? s[NR + j] : 0.0f;                                 \
        const rd_int end = kc - p < len ? kc : p + len;                     \
        for (; p < end; p++) {                                              \
            const float *ap = a + p * MR;                                   \
            for (int j = 0; j < NR; j++)                                    \
                row[j] = (WIDEN(b[p * NR + j]) - z[j]) * s[j];              \
            for (int i = 0; i < MR; i++)                                    \
                for (int j = 0; j < NR; j++)                                \
                    acc[i][j] += ap[i] * row[j];                            \
        }                                                                   \
    }                                                                       \
    rd_s_store_edge(&acc[0][0], NR, (float *)c, rs_c, cs_c, m, n, mode);    \
}

RD_REF_UKR_Q(rd_sgemm_ref_i8w_6x16, 6, 16, rd_widen_i8)
RD_REF_UKR_Q(rd_sgemm_ref_f8w_6x16, 6, 16, rd_widen_f8)

/* The 4-bit contracts (rd_kernel.h): per run, B's row p is, column by
 * column, e2m1(code) * 2^(e - 127) (RD_CT_F32_F4W, exact), or the int4
 * value's (w - z) * s (RD_CT_F32_I4W, as RD_CT_F32_I8W's); then the float32
 * products and sums of rd_sgemm_ref_6x16. */
static inline void
rd_sgemm_ref_nibbles(rd_int kc, const float *a, const uint8_t *b, void *c, rd_int rs_c, rd_int cs_c,
                     int m, int n, int mode, int int4)
{
    enum { MR = 6, NR = 16 };
    const char *tr = (const char *)b + (rd_int)(NR / 2) * kc;
    rd_qtrailer_t h;
    memcpy(&h, tr, sizeof h);
    float acc[MR][NR], row[NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            acc[i][j] = 0;
    rd_int p = 0, len = h.first;
    for (rd_int r = 0; p < kc; r++, len = h.tile) {
        float s[NR], z[NR];
        if (int4) {
            const float *sv = (const float *)(const void *)(tr + RD_QRUN(r, NR, h.zp));
            for (int j = 0; j < NR; j++) {
                s[j] = sv[j];
                z[j] = h.zp ? sv[NR + j] : 0.0f;
            }
        } else {
            const uint8_t *e = (const uint8_t *)(tr + RD_F4RUN(r, NR));
            for (int j = 0; j < NR; j++)
                s[j] = rd_e8m0_to_float(e[j]);
        }
        const rd_int end = kc - p < len ? kc : p + len;
        for (; p < end; p++) {
            const float *ap = a + p * MR;
            const uint8_t *bp = b + p * (NR / 2);
            for (int j = 0; j < NR; j++) {
                const unsigned code = j < NR / 2 ? bp[j] & 0xfu : (unsigned)bp[j - NR / 2] >> 4;
                row[j] = int4 ? (rd_i4_values[code] - z[j]) * s[j] : rd_e2m1_values[code] * s[j];
            }
            for (int i = 0; i < MR; i++)
                for (int j = 0; j < NR; j++)
                    acc[i][j] += ap[i] * row[j];
        }
    }
    rd_s_store_edge(&acc[0][0], NR, (float *)c, rs_c, cs_c, m, n, mode);
}

static void
rd_sgemm_ref_f4w_6x16(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c,
                      int m, int n, int mode)
{
    rd_sgemm_ref_nibbles(kc, (const float *)a, (const uint8_t *)b, c, rs_c, cs_c, m, n, mode, 0);
}

static void
rd_sgemm_ref_i4w_6x16(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c,
                      int m, int n, int mode)
{
    rd_sgemm_ref_nibbles(kc, (const float *)a, (const uint8_t *)b, c, rs_c, cs_c, m, n, mode, 1);
}

/* The integer contract (rd_kernel.h, RD_CT_I8I32): pairs of int16
 * products summed in int32 (as vpmaddwd does), the sum converted to float32
 * once and multiplied by sa[i] * sb[j]. */
static void
rd_i8gemm_ref_6x16(rd_int kc, const void *a_, const void *b_, void *c, rd_int rs_c,
                   rd_int cs_c, int m, int n, int mode)
{
    enum { MR = 6, NR = 16 };
    const int16_t *a = (const int16_t *)a_, *b = (const int16_t *)b_;
    const rd_int kp = (kc + 1) / 2 * 2;
    int32_t acc[MR][NR];
    float out[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            acc[i][j] = 0;
    for (rd_int p = 0; p < kp; p += 2) {
        const int16_t *ap = a + p * MR, *bp = b + p * NR;
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++)
                acc[i][j] += (int32_t)ap[2 * i] * bp[2 * j] + (int32_t)ap[2 * i + 1] * bp[2 * j + 1];
    }
    const float *sa = (const float *)(const void *)(a + MR * kp);
    const float *sb = (const float *)(const void *)(b + NR * kp);
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            out[i][j] = (float)acc[i][j] * (sa[i] * sb[j]);
    rd_s_store_edge(&out[0][0], NR, (float *)c, rs_c, cs_c, m, n, mode);
}

static int
rd_ref_runnable(void)
{
    return 1;
}

/* Blocking: the published BLIS Haswell float32 (6x16, MC=144, KC=256,
 * NC=4080) and float64 (6x8, MC=72, KC=256, NC=4080) values. */
const rd_family_t rd_family_ref = {
    "ref",
    rd_ref_runnable,
    {
        [RD_CT_F32] = {rd_sgemm_ref_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F64] = {rd_dgemm_ref_6x8, 6, 8, 72, 256, 4080, NULL},
        [RD_CT_F32_BF16W] = {rd_sgemm_ref_bf16w_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F32_F16W] = {rd_sgemm_ref_f16w_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_I8I32] = {rd_i8gemm_ref_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F32_I8W] = {rd_sgemm_ref_i8w_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F32_F8W] = {rd_sgemm_ref_f8w_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F32_F4W] = {rd_sgemm_ref_f4w_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F32_I4W] = {rd_sgemm_ref_i4w_6x16, 6, 16, 144, 256, 4080, NULL},
    },
    0,
    {[RD_CT_F32] = {rd_sgemm_ref_stream_8x2048, 8, 2048}},
    {{NULL, 0, NULL, 0}},
};
