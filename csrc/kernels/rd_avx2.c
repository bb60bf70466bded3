/*
 * AVX2 + FMA micro-kernels.  Compiled with per-function target attributes,
 * so the object file builds with the default -march and these functions are
 * only ever called after a run-time CPU check (the family's runnable()).
 *
 *   rd_sgemm_avx2_6x16:  6 rows x 16 columns of float32, 12 ymm accumulators
 *   rd_sgemm_avx2_stream_8x2048: up to 8 rows reading B in place (rd_sukr_t)
 *   rd_dgemm_avx2_6x8 :  6 rows x  8 columns of float64, 12 ymm accumulators
 *   rd_sgemm_avx2_{bf16w,f16w}_6x16: float32 with 16-bit B panels (F16C too)
 *   rd_i8gemm_avx2_6x16: int16 k-pairs into int32 (vpmaddwd + vpaddd), the
 *       sums scaled into float32 once per block (RD_CT_I8I32)
 *   rd_sgemm_avx2_{i8w,f8w}_6x16: float32 with one-byte B panels of
 *       prepacked quantized weights (RD_CT_F32_I8W, RD_CT_F32_F8W)
 *   rd_sgemm_avx2_f4w_6x16: float32 with 4-bit B panels (RD_CT_F32_F4W)
 *   rd_sgemm_avx2_i4w_6x16: float32 with int4 B panels (RD_CT_F32_I4W)
 *
 * Per step p of the contraction: two loads of the B row, six broadcasts of
 * the A column, twelve independent FMAs (two FMA pipes x four cycles of
 * latency needs at least eight in flight).  Edge tiles (m < MR or n < NR,
 * or a C with non-unit column stride) go through a register-sized buffer.
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define RD_AVX2 __attribute__((target("avx2,fma,f16c")))

#include "rd_avx2_f4.h"
#include "rd_avx2_few.h"

/* ---------------------------------------------------------------- float32 */

/* LOAD_B(b, b0, b1): the two B vectors of one step (columns 0-7, 8-15) */
#define S_STEP(AOFF, LOAD_B)                                                \
    do {                                                                    \
        LOAD_B(b, b0, b1)                                                   \
        __m256 av;                                                          \
        av = _mm256_broadcast_ss(a + (AOFF) + 0);                           \
        c00 = _mm256_fmadd_ps(av, b0, c00); c01 = _mm256_fmadd_ps(av, b1, c01); \
        av = _mm256_broadcast_ss(a + (AOFF) + 1);                           \
        c10 = _mm256_fmadd_ps(av, b0, c10); c11 = _mm256_fmadd_ps(av, b1, c11); \
        av = _mm256_broadcast_ss(a + (AOFF) + 2);                           \
        c20 = _mm256_fmadd_ps(av, b0, c20); c21 = _mm256_fmadd_ps(av, b1, c21); \
        av = _mm256_broadcast_ss(a + (AOFF) + 3);                           \
        c30 = _mm256_fmadd_ps(av, b0, c30); c31 = _mm256_fmadd_ps(av, b1, c31); \
        av = _mm256_broadcast_ss(a + (AOFF) + 4);                           \
        c40 = _mm256_fmadd_ps(av, b0, c40); c41 = _mm256_fmadd_ps(av, b1, c41); \
        av = _mm256_broadcast_ss(a + (AOFF) + 5);                           \
        c50 = _mm256_fmadd_ps(av, b0, c50); c51 = _mm256_fmadd_ps(av, b1, c51); \
    } while (0)

#define S_LOAD_F32(b, b0, b1) __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps((b) + 8);
/* 16-bit B rows widened in registers (exactly): bfloat16 rows hold their
 * halves interleaved (RD_CT_F32_BF16W), so a shift gives columns 0-7 and a
 * mask columns 8-15; float16 rows in order go through vcvtph2ps. */
#define S_LOAD_BF16(b, b0, b1)                                              \
    const __m256i bw = _mm256_loadu_si256((const __m256i *)(const void *)(b)); \
    __m256 b0 = _mm256_castsi256_ps(_mm256_slli_epi32(bw, 16));             \
    __m256 b1 = _mm256_castsi256_ps(_mm256_and_si256(bw, _mm256_set1_epi32((int)0xffff0000u)));
#define S_LOAD_F16(b, b0, b1)                                               \
    const __m256i bw = _mm256_loadu_si256((const __m256i *)(const void *)(b)); \
    __m256 b0 = _mm256_cvtph_ps(_mm256_castsi256_si128(bw));                \
    __m256 b1 = _mm256_cvtph_ps(_mm256_extracti128_si256(bw, 1));

RD_AVX2 static inline void
s_store_row(float *c, __m256 lo, __m256 hi, int accumulate)
{
    if (accumulate == RD_STREAM) {
        _mm256_stream_ps(c, lo);
        _mm256_stream_ps(c + 8, hi);
        return;
    }
    if (accumulate == RD_ADD) {
        lo = _mm256_add_ps(_mm256_loadu_ps(c), lo);
        hi = _mm256_add_ps(_mm256_loadu_ps(c + 8), hi);
    }
    _mm256_storeu_ps(c, lo);
    _mm256_storeu_ps(c + 8, hi);
}

/* The twelve accumulators of a 6x16 float32 tile, and their store: whole
 * rows (streamed where asked and aligned), or the valid corner through a
 * spill.  Shared by every float32-output body below. */
#define S_ACC_ZERO                                                          \
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();            \
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();            \
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();            \
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();            \
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();            \
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();

#define S_ACC_STORE                                                         \
    if (m == 6 && n == 16 && cs_c == 1) {                                   \
        if (accumulate == RD_STREAM && !rd_stream_aligned(c, rs_c * (rd_int)sizeof(float))) \
            accumulate = RD_STORE;                                          \
        s_store_row(c + 0 * rs_c, c00, c01, accumulate);                    \
        s_store_row(c + 1 * rs_c, c10, c11, accumulate);                    \
        s_store_row(c + 2 * rs_c, c20, c21, accumulate);                    \
        s_store_row(c + 3 * rs_c, c30, c31, accumulate);                    \
        s_store_row(c + 4 * rs_c, c40, c41, accumulate);                    \
        s_store_row(c + 5 * rs_c, c50, c51, accumulate);                    \
        return;                                                             \
    }                                                                       \
    float buf[6 * 16] __attribute__((aligned(32)));                         \
    _mm256_store_ps(buf + 0, c00);  _mm256_store_ps(buf + 8, c01);          \
    _mm256_store_ps(buf + 16, c10); _mm256_store_ps(buf + 24, c11);         \
    _mm256_store_ps(buf + 32, c20); _mm256_store_ps(buf + 40, c21);         \
    _mm256_store_ps(buf + 48, c30); _mm256_store_ps(buf + 56, c31);         \
    _mm256_store_ps(buf + 64, c40); _mm256_store_ps(buf + 72, c41);         \
    _mm256_store_ps(buf + 80, c50); _mm256_store_ps(buf + 88, c51);         \
    rd_s_store_edge(buf, 16, c, rs_c, cs_c, m, n, accumulate);

#define RD_AVX2_SGEMM(NAME, TB, LOAD_B)                                     \
RD_AVX2 static void                                                         \
NAME(rd_int kc, const void *a_, const void *b_, void *c_,                   \
     rd_int rs_c, rd_int cs_c, int m, int n, int accumulate)                \
{                                                                           \
    const float *a = (const float *)a_;                                     \
    const TB *b = (const TB *)b_;                                           \
    float *c = (float *)c_;                                                 \
    S_ACC_ZERO                                                              \
    /* One step per iteration: unrolling by hand makes gcc interleave the  \
     * steps and spill accumulators; this form keeps all twelve in registers. */ \
    for (rd_int p = 0; p < kc; p++) {                                       \
        S_STEP(0, LOAD_B);                                                  \
        a += 6;                                                             \
        b += 16;                                                            \
    }                                                                       \
    S_ACC_STORE                                                             \
}

RD_AVX2_SGEMM(rd_sgemm_avx2_6x16, float, S_LOAD_F32)
RD_AVX2_SGEMM(rd_sgemm_avx2_bf16w_6x16, uint16_t, S_LOAD_BF16)
RD_AVX2_SGEMM(rd_sgemm_avx2_f16w_6x16, uint16_t, S_LOAD_F16)

/* The streaming kernel (rd_sukr_t, kernels/rd_stream_body.h). */
#define TARGET RD_AVX2
#define V __m256
#define W 8
#define MASK __m256i
#define MASK_ALL _mm256_set1_epi32(-1)
#define MASK_FIRST(r) _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define LOADM(k, p) _mm256_maskload_ps(p, k)
#define LOAD _mm256_load_ps
#define STORE _mm256_store_ps
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ZERO _mm256_setzero_ps
#define RD_SREGS 16
#include "rd_stream_body.h"
RD_STREAM_KERNEL(rd_sgemm_avx2_stream_8x2048, s_stream)

/* -------------------------------------------- float32 on quantized panels
 *
 * One-byte B rows (16 bytes a step) widened exactly: int8 sign-extended
 * (vpmovsxbd) and converted (vcvtdq2ps); float8_e4m3fn codes zero-extended
 * to 16 bits, their sign, exponent and mantissa moved into binary16's
 * places, converted with vcvtph2ps and scaled by 2^8 (exact).  Then
 * (w - z) * s with the run's scales and zero points (rd_kernel.h), and the
 * FMAs of the float32 kernel. */
#define Q_WIDEN_I8(b, b0, b1)                                               \
    const __m128i bq = _mm_loadu_si128((const __m128i *)(const void *)(b)); \
    __m256 b0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bq));               \
    __m256 b1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bq, 8)));
#define Q_WIDEN_F8(b, b0, b1)                                               \
    const __m256i bh = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b))); \
    const __m256i bits = _mm256_or_si256(                                   \
        _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi16(0x80)), 8),  \
        _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi16(0x7f)), 7)); \
    __m256 b0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(bits)), _mm256_set1_ps(256.0f)); \
    __m256 b1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(bits, 1)), _mm256_set1_ps(256.0f));
#define Q_LOAD_I8(b, b0, b1)                                                \
    Q_WIDEN_I8(b, w0, w1)                                                   \
    const __m256 b0 = _mm256_mul_ps(_mm256_sub_ps(w0, z0), s0);             \
    const __m256 b1 = _mm256_mul_ps(_mm256_sub_ps(w1, z1), s1);
#define Q_LOAD_F8(b, b0, b1)                                                \
    Q_WIDEN_F8(b, w0, w1)                                                   \
    const __m256 b0 = _mm256_mul_ps(_mm256_sub_ps(w0, z0), s0);             \
    const __m256 b1 = _mm256_mul_ps(_mm256_sub_ps(w1, z1), s1);

/* int4 codes (RD_CT_F32_I4W): a step's 8 bytes, columns 0-7 in their low
 * nibbles and 8-15 in their high ones, each the value (code ^ 8) - 8 */
#define Q_WIDEN_I4(b, b0, b1)                                               \
    const __m256i bq = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(b))); \
    const __m256i eight = _mm256_set1_epi32(8);                             \
    __m256 b0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_xor_si256(_mm256_and_si256(bq, _mm256_set1_epi32(15)), \
                                                                     eight), eight)); \
    __m256 b1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_xor_si256(_mm256_srli_epi32(bq, 4), eight), eight));
#define Q_LOAD_I4(b, b0, b1)                                                \
    Q_WIDEN_I4(b, w0, w1)                                                   \
    const __m256 b0 = _mm256_mul_ps(_mm256_sub_ps(w0, z0), s0);             \
    const __m256 b1 = _mm256_mul_ps(_mm256_sub_ps(w1, z1), s1);

#define RD_AVX2_QGEMM(NAME, LOAD_B) RD_AVX2_QGEMM_S(NAME, LOAD_B, 16)
/* (SB: bytes of B a step, 16 one a byte, 8 for nibbles) */
#define RD_AVX2_QGEMM_S(NAME, LOAD_B, SB)                                   \
RD_AVX2 static void                                                         \
NAME(rd_int kc, const void *a_, const void *b_, void *c_,                   \
     rd_int rs_c, rd_int cs_c, int m, int n, int accumulate)                \
{                                                                           \
    const float *a = (const float *)a_;                                     \
    const uint8_t *b = (const uint8_t *)b_;                                 \
    float *c = (float *)c_;                                                 \
    const char *tr = (const char *)b_ + (SB) * kc;                          \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, tr, sizeof h);                                               \
    S_ACC_ZERO                                                              \
    rd_int p = 0, len = h.first;                                            \
    for (rd_int r = 0; p < kc; r++, len = h.tile) {                         \
        const float *sv = (const float *)(const void *)(tr + RD_QRUN(r, 16, h.zp)); \
        const __m256 s0 = _mm256_loadu_ps(sv), s1 = _mm256_loadu_ps(sv + 8); \
        __m256 z0 = _mm256_setzero_ps(), z1 = _mm256_setzero_ps();          \
        if (h.zp) {                                                         \
            z0 = _mm256_loadu_ps(sv + 16);                                  \
            z1 = _mm256_loadu_ps(sv + 24);                                  \
        }                                                                   \
        const rd_int end = kc - p < len ? kc : p + len;                     \
        for (; p < end; p++) {                                              \
            S_STEP(0, LOAD_B);                                              \
            a += 6;                                                         \
            b += (SB);                                                      \
        }                                                                   \
    }                                                                       \
    S_ACC_STORE                                                             \
}

RD_AVX2_QGEMM(rd_sgemm_avx2_i8w_6x16, Q_LOAD_I8)
RD_AVX2_QGEMM(rd_sgemm_avx2_f8w_6x16, Q_LOAD_F8)
RD_AVX2_QGEMM_S(rd_sgemm_avx2_i4w_6x16, Q_LOAD_I4, 8)

/* float32 on 4-bit panels (RD_CT_F32_F4W): a step's 8 bytes hold columns
 * 0-7 in their low nibbles and 8-15 in their high ones; each code's
 * magnitude is looked up (vpermps on its low 3 bits, an 8-entry table) and
 * its sign bit moved into place, then multiplied by the column's
 * power-of-two scale (both exact; kernels/rd_avx2_f4.h), then the FMAs of
 * the float32 kernel. */
#define Q_LOAD_F4(b, b0, b1)                                                \
    const __m256i bq = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(b))); \
    const __m256 b0 = _mm256_mul_ps(rd_avx2_e2m1(bq, mag), s0);             \
    const __m256 b1 = _mm256_mul_ps(rd_avx2_e2m1(_mm256_srli_epi32(bq, 4), mag), s1);

RD_AVX2 static void
rd_sgemm_avx2_f4w_6x16(rd_int kc, const void *a_, const void *b_, void *c_, rd_int rs_c, rd_int cs_c,
                       int m, int n, int accumulate)
{
    const float *a = (const float *)a_;
    const uint8_t *b = (const uint8_t *)b_;
    float *c = (float *)c_;
    const char *tr = (const char *)b_ + 8 * kc;
    rd_qtrailer_t h;
    memcpy(&h, tr, sizeof h);
    const __m256 mag = _mm256_loadu_ps(rd_e2m1_values);
    S_ACC_ZERO
    rd_int p = 0, len = h.first;
    for (rd_int r = 0; p < kc; r++, len = h.tile) {
        const uint8_t *e = (const uint8_t *)(tr + RD_F4RUN(r, 16));
        const __m256 s0 = rd_avx2_e8m0(e), s1 = rd_avx2_e8m0(e + 8);
        const rd_int end = kc - p < len ? kc : p + len;
        for (; p < end; p++) {
            S_STEP(0, Q_LOAD_F4);
            a += 6;
            b += 8;
        }
    }
    S_ACC_STORE
}

/* ---------------------------------------------------------------- float64 */

#define D_STEP(AOFF, BOFF)                                                  \
    do {                                                                    \
        __m256d b0 = _mm256_load_pd(b + (BOFF));                            \
        __m256d b1 = _mm256_load_pd(b + (BOFF) + 4);                        \
        __m256d av;                                                         \
        av = _mm256_broadcast_sd(a + (AOFF) + 0);                           \
        c00 = _mm256_fmadd_pd(av, b0, c00); c01 = _mm256_fmadd_pd(av, b1, c01); \
        av = _mm256_broadcast_sd(a + (AOFF) + 1);                           \
        c10 = _mm256_fmadd_pd(av, b0, c10); c11 = _mm256_fmadd_pd(av, b1, c11); \
        av = _mm256_broadcast_sd(a + (AOFF) + 2);                           \
        c20 = _mm256_fmadd_pd(av, b0, c20); c21 = _mm256_fmadd_pd(av, b1, c21); \
        av = _mm256_broadcast_sd(a + (AOFF) + 3);                           \
        c30 = _mm256_fmadd_pd(av, b0, c30); c31 = _mm256_fmadd_pd(av, b1, c31); \
        av = _mm256_broadcast_sd(a + (AOFF) + 4);                           \
        c40 = _mm256_fmadd_pd(av, b0, c40); c41 = _mm256_fmadd_pd(av, b1, c41); \
        av = _mm256_broadcast_sd(a + (AOFF) + 5);                           \
        c50 = _mm256_fmadd_pd(av, b0, c50); c51 = _mm256_fmadd_pd(av, b1, c51); \
    } while (0)

RD_AVX2 static inline void
d_store_row(double *c, __m256d lo, __m256d hi, int accumulate)
{
    if (accumulate == RD_STREAM) {
        _mm256_stream_pd(c, lo);
        _mm256_stream_pd(c + 4, hi);
        return;
    }
    if (accumulate == RD_ADD) {
        lo = _mm256_add_pd(_mm256_loadu_pd(c), lo);
        hi = _mm256_add_pd(_mm256_loadu_pd(c + 4), hi);
    }
    _mm256_storeu_pd(c, lo);
    _mm256_storeu_pd(c + 4, hi);
}

RD_AVX2 static void
rd_dgemm_avx2_6x8(rd_int kc, const void *a_, const void *b_, void *c_,
                  rd_int rs_c, rd_int cs_c, int m, int n, int accumulate)
{
    const double *a = (const double *)a_, *b = (const double *)b_;
    double *c = (double *)c_;
    __m256d c00 = _mm256_setzero_pd(), c01 = _mm256_setzero_pd();
    __m256d c10 = _mm256_setzero_pd(), c11 = _mm256_setzero_pd();
    __m256d c20 = _mm256_setzero_pd(), c21 = _mm256_setzero_pd();
    __m256d c30 = _mm256_setzero_pd(), c31 = _mm256_setzero_pd();
    __m256d c40 = _mm256_setzero_pd(), c41 = _mm256_setzero_pd();
    __m256d c50 = _mm256_setzero_pd(), c51 = _mm256_setzero_pd();

    for (rd_int p = 0; p < kc; p++) {
        D_STEP(0, 0);
        a += 6;
        b += 8;
    }

    if (m == 6 && n == 8 && cs_c == 1) {
        if (accumulate == RD_STREAM && !rd_stream_aligned(c, rs_c * (rd_int)sizeof(double)))
            accumulate = RD_STORE;
        d_store_row(c + 0 * rs_c, c00, c01, accumulate);
        d_store_row(c + 1 * rs_c, c10, c11, accumulate);
        d_store_row(c + 2 * rs_c, c20, c21, accumulate);
        d_store_row(c + 3 * rs_c, c30, c31, accumulate);
        d_store_row(c + 4 * rs_c, c40, c41, accumulate);
        d_store_row(c + 5 * rs_c, c50, c51, accumulate);
        return;
    }
    double buf[6 * 8] __attribute__((aligned(32)));
    _mm256_store_pd(buf + 0, c00);  _mm256_store_pd(buf + 4, c01);
    _mm256_store_pd(buf + 8, c10);  _mm256_store_pd(buf + 12, c11);
    _mm256_store_pd(buf + 16, c20); _mm256_store_pd(buf + 20, c21);
    _mm256_store_pd(buf + 24, c30); _mm256_store_pd(buf + 28, c31);
    _mm256_store_pd(buf + 32, c40); _mm256_store_pd(buf + 36, c41);
    _mm256_store_pd(buf + 40, c50); _mm256_store_pd(buf + 44, c51);
    rd_d_store_edge(buf, 8, c, rs_c, cs_c, m, n, accumulate);
}

/* ------------------------------------------------------ int8 x int8 -> int32
 *
 * Per pair of contraction steps: two loads of 8 int16 pairs of B, six
 * broadcasts of an A pair (one 32-bit lane), twelve vpmaddwd (two int16
 * products summed into each int32 lane, exact for int8-range values) and
 * twelve vpaddd.  The epilogue converts each int32 sum to float32 once and
 * multiplies it by sa[i] * sb[j] (rd_kernel.h). */
#define I_DECL(i) __m256i c##i##0 = _mm256_setzero_si256(), c##i##1 = _mm256_setzero_si256();
#define I_STEP(i)                                                           \
    {                                                                       \
        int32_t pair;                                                       \
        memcpy(&pair, a + 2 * (i), sizeof pair);                            \
        const __m256i av = _mm256_set1_epi32(pair);                         \
        c##i##0 = _mm256_add_epi32(c##i##0, _mm256_madd_epi16(av, b0));     \
        c##i##1 = _mm256_add_epi32(c##i##1, _mm256_madd_epi16(av, b1));     \
    }
#define I_SCALE(i)                                                          \
    {                                                                       \
        const __m256 s = _mm256_set1_ps(sa[i]);                             \
        f##i##0 = _mm256_mul_ps(_mm256_cvtepi32_ps(c##i##0), _mm256_mul_ps(s, sb0)); \
        f##i##1 = _mm256_mul_ps(_mm256_cvtepi32_ps(c##i##1), _mm256_mul_ps(s, sb1)); \
    }
#define I_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define I_FDECL(i) __m256 f##i##0, f##i##1;
#define I_PUT(i) s_store_row(c + (i) * rs_c, f##i##0, f##i##1, accumulate);
#define I_SPILL(i)                                                          \
    _mm256_store_ps(buf + 16 * (i), f##i##0);                               \
    _mm256_store_ps(buf + 16 * (i) + 8, f##i##1);

RD_AVX2 static void
rd_i8gemm_avx2_6x16(rd_int kc, const void *a_, const void *b_, void *c_,
                    rd_int rs_c, rd_int cs_c, int m, int n, int accumulate)
{
    const int16_t *a = (const int16_t *)a_, *b = (const int16_t *)b_;
    float *c = (float *)c_;
    const rd_int kp = (kc + 1) / 2 * 2;
    const float *sa = (const float *)(const void *)(a + 6 * kp);
    const float *sb = (const float *)(const void *)(b + 16 * kp);
    I_ROWS(I_DECL)
    for (rd_int p = 0; p < kp; p += 2) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)(const void *)b);
        const __m256i b1 = _mm256_loadu_si256((const __m256i *)(const void *)(b + 16));
        I_ROWS(I_STEP)
        a += 12;
        b += 32;
    }
    const __m256 sb0 = _mm256_loadu_ps(sb), sb1 = _mm256_loadu_ps(sb + 8);
    I_ROWS(I_FDECL)
    I_ROWS(I_SCALE)
    if (m == 6 && n == 16 && cs_c == 1) {
        if (accumulate == RD_STREAM && !rd_stream_aligned(c, rs_c * (rd_int)sizeof(float)))
            accumulate = RD_STORE;
        I_ROWS(I_PUT)
        return;
    }
    float buf[6 * 16] __attribute__((aligned(32)));
    I_ROWS(I_SPILL)
    rd_s_store_edge(buf, 16, c, rs_c, cs_c, m, n, accumulate);
}

/* ---------------------------------------------------------------- family */

static int
rd_avx2_runnable(void)
{
    const rd_cpu_t *c = rd_cpu();
    return c->avx2 && c->fma && c->f16c;
}

/* Blocking: the published BLIS Haswell/Zen float32 (6x16, MC=144, KC=256,
 * NC=4080) and float64 (6x8, MC=72, KC=256, NC=4080) values. */
const rd_family_t rd_family_avx2 = {
    "avx2",
    rd_avx2_runnable,
    {
        [RD_CT_F32] = {rd_sgemm_avx2_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F64] = {rd_dgemm_avx2_6x8, 6, 8, 72, 256, 4080, NULL},
        [RD_CT_F32_BF16W] = {rd_sgemm_avx2_bf16w_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F32_F16W] = {rd_sgemm_avx2_f16w_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_I8I32] = {rd_i8gemm_avx2_6x16, 6, 16, 144, 512, 4080, NULL},
        [RD_CT_F32_I8W] = {rd_sgemm_avx2_i8w_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F32_F8W] = {rd_sgemm_avx2_f8w_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F32_F4W] = {rd_sgemm_avx2_f4w_6x16, 6, 16, 144, 256, 4080, NULL},
        [RD_CT_F32_I4W] = {rd_sgemm_avx2_i4w_6x16, 6, 16, 144, 256, 4080, NULL},
    },
    0,
    {[RD_CT_F32] = {rd_sgemm_avx2_stream_8x2048, RD_SMR, RD_SNR}},
    /* the few-row kernels of the quantized types only: measured on Zen4
     * (the avx2 family named), 64 experts x [2048, 768], one and two rows an
     * expert, they took int8 weights from 8.9-10.0 to 5.1-7.2 ms, int4 from
     * 12.3 to 6.2-7.5, MXFP4 from 9.0-10.1 to 6.4-7.5, but bfloat16 weights
     * at two rows from 6.1-6.9 to 8.2-8.5 (their widening is two
     * instructions; the memory bounds them as they were) */
    {
        [RD_CT_F32_I8W] = {rd_few_avx2_i8w, 3, rd_sgemm_avx2_i8w_6x16, 0},
        [RD_CT_F32_F8W] = {rd_few_avx2_f8w, 3, rd_sgemm_avx2_f8w_6x16, 0},
        [RD_CT_F32_F4W] = {rd_few_avx2_f4w, 3, rd_sgemm_avx2_f4w_6x16, 0},
        [RD_CT_F32_I4W] = {rd_few_avx2_i4w, 3, rd_sgemm_avx2_i4w_6x16, 0},
    },
};

#endif /* RD_HAVE_X86_KERNELS */
