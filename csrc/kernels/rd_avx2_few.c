/*
 * AVX2 few-row kernels (rd_fukr_t): one or two rows of a packed A panel
 * times a run of prepacked B micro-panels of 16 columns of quantized
 * weights (int8, float8, int4, 4-bit float), for decoding (1-2 rows an
 * expert) on the CPUs whose widest family is AVX2 (laptops and desktops
 * without AVX-512; rd_avx2.c says why not the float and 16-bit types).  The 6x16 micro-kernel holds two accumulators
 * for one row, each FMA waiting for the previous one (4 cycles): a panel at
 * a time runs a row at a quarter of the two FMA pipes.  Here one row walks
 * 4 panels at once (8 independent chains) and two rows 2 panels, each B
 * vector decoded once for its rows.
 *
 * Bits: each element is what rd_avx2.c's micro-kernel of the same type
 * gives it (the same widening, (w - z) * s per column and run, one fused
 * multiply-add a step from zero, stored or added to C once).
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "rd_avx2_few.h"

#define RD_FEW __attribute__((target("avx2,fma,f16c")))
#define RD_INLINE inline __attribute__((always_inline))

enum { FK_F32, FK_BF16, FK_F16, FK_I8, FK_F8, FK_F4, FK_I4 };

/* bytes of one step of one micro-panel (16 columns) */
#define FK_STEP(kind) ((kind) == FK_F32 ? 64 : (kind) == FK_BF16 || (kind) == FK_F16 ? 32 \
                       : (kind) == FK_F4 || (kind) == FK_I4 ? 8 : 16)

/* e2m1 codes as rd_avx2.c's rd_avx2_e2m1: the magnitude looked up on the low
 * 3 bits, the sign bit moved into place */
RD_FEW static RD_INLINE __m256
rd_few_e2m1(__m256i code, __m256 mag)
{
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, code), _mm256_castsi256_ps(sign));
}

/* The 16 values of one step of a panel, widened exactly (not yet scaled),
 * as rd_avx2.c's loads of the same type. */
RD_FEW static RD_INLINE void
rd_few_widen(const int kind, const char *bp, __m256 *w0, __m256 *w1, const __m256 mag)
{
    if (kind == FK_F32) {
        *w0 = _mm256_load_ps((const float *)(const void *)bp);
        *w1 = _mm256_load_ps((const float *)(const void *)bp + 8);
    } else if (kind == FK_BF16) {
        const __m256i bw = _mm256_loadu_si256((const __m256i *)(const void *)bp);
        *w0 = _mm256_castsi256_ps(_mm256_slli_epi32(bw, 16));
        *w1 = _mm256_castsi256_ps(_mm256_and_si256(bw, _mm256_set1_epi32((int)0xffff0000u)));
    } else if (kind == FK_F16) {
        const __m256i bw = _mm256_loadu_si256((const __m256i *)(const void *)bp);
        *w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(bw));
        *w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(bw, 1));
    } else if (kind == FK_I8) {
        const __m128i bq = _mm_loadu_si128((const __m128i *)(const void *)bp);
        *w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bq));
        *w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bq, 8)));
    } else if (kind == FK_F8) {
        const __m256i bh = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)bp));
        const __m256i bits = _mm256_or_si256(
            _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi16(0x80)), 8),
            _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi16(0x7f)), 7));
        *w0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(bits)), _mm256_set1_ps(256.0f));
        *w1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(bits, 1)), _mm256_set1_ps(256.0f));
    } else if (kind == FK_F4) {
        const __m256i bq = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)bp));
        *w0 = rd_few_e2m1(bq, mag);
        *w1 = rd_few_e2m1(_mm256_srli_epi32(bq, 4), mag);
    } else {
        const __m256i bq = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)bp));
        const __m256i eight = _mm256_set1_epi32(8);
        *w0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_xor_si256(_mm256_and_si256(bq, _mm256_set1_epi32(15)),
                                                                   eight), eight));
        *w1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_xor_si256(_mm256_srli_epi32(bq, 4), eight), eight));
    }
}

/* The scales of an e8m0 run (as rd_avx2.c's rd_avx2_e8m0) */
RD_FEW static RD_INLINE __m256
rd_few_e8m0(const uint8_t *e)
{
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)e));
    const __m256i sub = _mm256_and_si256(_mm256_cmpeq_epi32(v, _mm256_setzero_si256()),
                                         _mm256_set1_epi32(0x00400000));
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(v, 23), sub));
}

/* 8 columns of a row of C from an accumulator (cols of them valid) */
RD_FEW static RD_INLINE void
rd_few_put(__m256 v, float *c, rd_int cs_c, rd_int cols, int mode)
{
    if (cols <= 0)
        return;
    if (cols >= 8 && cs_c == 1) {
        _mm256_storeu_ps(c, mode == RD_ADD ? _mm256_add_ps(_mm256_loadu_ps(c), v) : v);
        return;
    }
    float t[8] __attribute__((aligned(32)));
    _mm256_store_ps(t, v);
    for (rd_int j = 0; j < cols && j < 8; j++) {
        if (mode == RD_ADD)
            c[j * cs_c] += t[j];
        else
            c[j * cs_c] = t[j];
    }
}

/* R rows x P panels (constants: the loops unroll, the accumulators stay
 * in registers). */
RD_FEW static RD_INLINE void
rd_few_body(const int kind, const int R, const int P, const int zp, rd_int kc, const float *a,
            const char *b, size_t bstep, float *c, rd_int rs_c, rd_int cs_c, rd_int n, int mode)
{
    const rd_int SB = FK_STEP(kind);
    __m256 acc[2][4][2];
    for (int i = 0; i < R; i++)
        for (int q = 0; q < P; q++)
            acc[i][q][0] = acc[i][q][1] = _mm256_setzero_ps();
    const __m256 mag = _mm256_loadu_ps(rd_e2m1_values);
    const int quantized = kind == FK_I8 || kind == FK_F8 || kind == FK_F4 || kind == FK_I4;
    rd_qtrailer_t h = {(int)kc, (int)kc, 0, 0};
    if (quantized)
        memcpy(&h, b + SB * kc, sizeof h);
    rd_int p = 0, len = h.first;
    for (rd_int r = 0; p < kc; r++, len = h.tile) {
        __m256 s[4][2], z[4][2];
        for (int q = 0; q < P; q++) {
            const char *tr = b + q * bstep + SB * kc;
            s[q][0] = s[q][1] = z[q][0] = z[q][1] = _mm256_setzero_ps();
            if (kind == FK_F4) {
                const uint8_t *e = (const uint8_t *)(tr + RD_F4RUN(r, 16));
                s[q][0] = rd_few_e8m0(e);
                s[q][1] = rd_few_e8m0(e + 8);
            } else if (quantized) {
                const float *sv = (const float *)(const void *)(tr + RD_QRUN(r, 16, zp));
                s[q][0] = _mm256_loadu_ps(sv);
                s[q][1] = _mm256_loadu_ps(sv + 8);
                if (zp) {
                    z[q][0] = _mm256_loadu_ps(sv + 16);
                    z[q][1] = _mm256_loadu_ps(sv + 24);
                }
            }
        }
        const rd_int end = kc - p < len ? kc : p + len;
        for (; p < end; p++) {
            const char *bp = b + p * SB;
            for (int q = 0; q < P; q++) {
                __m256 w0, w1;
                rd_few_widen(kind, bp + q * bstep, &w0, &w1, mag);
                /* (w - z) * s as rd_avx2.c's Q_LOAD_*: without zero points
                 * w * s, the same value (w - 0 = w) */
                if (quantized && zp) {
                    w0 = _mm256_sub_ps(w0, z[q][0]);
                    w1 = _mm256_sub_ps(w1, z[q][1]);
                }
                if (quantized) {
                    w0 = _mm256_mul_ps(w0, s[q][0]);
                    w1 = _mm256_mul_ps(w1, s[q][1]);
                }
                for (int i = 0; i < R; i++) {
                    const __m256 av = _mm256_broadcast_ss(a + p * 6 + i);
                    acc[i][q][0] = _mm256_fmadd_ps(av, w0, acc[i][q][0]);
                    acc[i][q][1] = _mm256_fmadd_ps(av, w1, acc[i][q][1]);
                }
            }
        }
    }
    for (int i = 0; i < R; i++)
        for (int q = 0; q < P; q++) {
            float *cq = c + i * rs_c + q * 16 * cs_c;
            rd_few_put(acc[i][q][0], cq, cs_c, n - q * 16, mode);
            rd_few_put(acc[i][q][1], cq + 8 * cs_c, cs_c, n - q * 16 - 8, mode);
        }
}

#define RD_FEW_RUN(KIND, R, P, ZP)                                          \
    for (; q + (P) <= np; q += (P))                                         \
        rd_few_body(KIND, R, P, ZP, kc, a, b + q * bstep, bstep, c + q * 16 * cs_c, rs_c, cs_c, n - q * 16, mode);

/* The panels of a call in runs of P: 4, 2, 1 for one row; 2, 1 for two. */
#define RD_FEW_KERNEL(NAME, KIND, ZP)                                       \
RD_FEW static void                                                          \
NAME(rd_int kc, const float *a, const char *b, size_t bstep, float *c,      \
     rd_int rs_c, rd_int cs_c, int m, rd_int n, int mode)                   \
{                                                                           \
    const rd_int np = (n + 15) / 16;                                        \
    rd_int q = 0;                                                           \
    if (m == 1) {                                                           \
        RD_FEW_RUN(KIND, 1, 4, ZP)                                          \
        RD_FEW_RUN(KIND, 1, 2, ZP)                                          \
        RD_FEW_RUN(KIND, 1, 1, ZP)                                          \
    } else {                                                                \
        RD_FEW_RUN(KIND, 2, 2, ZP)                                          \
        RD_FEW_RUN(KIND, 2, 1, ZP)                                          \
    }                                                                       \
}

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
RD_FEW_QENTRY(rd_few_avx2_i8w, few_i8, few_i8z, 16)
RD_FEW_QENTRY(rd_few_avx2_f8w, few_f8, few_f8z, 16)
RD_FEW_ENTRY(rd_few_avx2_f4w, few_f4)
RD_FEW_QENTRY(rd_few_avx2_i4w, few_i4, few_i4z, 8)

#endif /* RD_HAVE_X86_KERNELS */
