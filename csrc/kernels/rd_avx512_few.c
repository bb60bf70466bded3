/*
 * AVX-512 few-row kernels (rd_fukr_t): one or two rows of a packed A panel
 * times a run of prepacked B micro-panels of 32 columns, for the products
 * of decoding (1-2 rows an expert), where each weight is read once.
 *
 * Why not the 12x32 micro-kernel panel after panel: with one row it holds
 * two accumulators, and each step's multiply-add waits for the previous
 * one (4 cycles of latency), so a panel runs at 2 FMAs per 4 cycles
 * whatever the memory could give; the 4-row body it falls back to does
 * the FMAs of four rows for one.  Here one row walks 4 panels at once (8
 * independent chains) and two rows 2 panels, decoding each B vector once
 * for its rows.
 *
 * Bits: every element is what the family's micro-kernel gives it (the
 * same widening, (w - z) * s per column and run, one fused multiply-add a
 * step from zero, the sum stored or added to C once); only the order in
 * which independent elements are computed changes.
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "rd_avx512_few.h"

#define RD_FEW __attribute__((target("avx512f,avx512bw")))
#define RD_INLINE inline __attribute__((always_inline))

/* The panel encodings, as the micro-kernels of rd_avx512.c read them
 * (rd_kernel.h: the compute types) */
enum { FK_F32, FK_BF16, FK_F16, FK_I8, FK_F8, FK_F4, FK_I4 };

/* bytes of one step of one micro-panel (32 columns) */
#define FK_STEP(kind) ((kind) == FK_F32 ? 128 : (kind) == FK_BF16 || (kind) == FK_F16 ? 64 \
                       : (kind) == FK_F4 || (kind) == FK_I4 ? 16 : 32)

/* The 32 values of one step of a panel, widened exactly (not yet scaled). */
RD_FEW static RD_INLINE void
rd_few_widen(const int kind, const char *bp, __m512 *w0, __m512 *w1, const __m512 table, const __m512 i4)
{
    if (kind == FK_F32) {
        *w0 = _mm512_load_ps((const float *)(const void *)bp);
        *w1 = _mm512_load_ps((const float *)(const void *)bp + 16);
    } else if (kind == FK_BF16) {
        const __m512i bw = _mm512_loadu_si512((const void *)bp);
        *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(bw, 16));
        *w1 = _mm512_castsi512_ps(_mm512_and_si512(bw, _mm512_set1_epi32((int)0xffff0000u)));
    } else if (kind == FK_F16) {
        const __m512i bw = _mm512_loadu_si512((const void *)bp);
        *w0 = _mm512_cvtph_ps(_mm512_castsi512_si256(bw));
        *w1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(bw, 1));
    } else if (kind == FK_I8) {
        *w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)bp)));
        *w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(bp + 16))));
    } else if (kind == FK_F8) {
        const __m512i bh = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)bp));
        const __m512i bits = _mm512_or_si512(
            _mm512_slli_epi16(_mm512_and_si512(bh, _mm512_set1_epi16(0x80)), 8),
            _mm512_slli_epi16(_mm512_and_si512(bh, _mm512_set1_epi16(0x7f)), 7));
        *w0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(bits)), _mm512_set1_ps(256.0f));
        *w1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(bits, 1)), _mm512_set1_ps(256.0f));
    } else {
        const __m512i bq = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)bp));
        const __m512 t = kind == FK_I4 ? i4 : table;
        *w0 = _mm512_permutexvar_ps(bq, t);
        *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(bq, 4), t);
    }
}

/* The scale of the columns of an e8m0 run (as rd_avx512.c's rd_avx512_e8m0) */
RD_FEW static RD_INLINE __m512
rd_few_e8m0(const uint8_t *e)
{
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)e));
    const __mmask16 zero = _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512());
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_slli_epi32(v, 23), zero,
                                                     _mm512_set1_epi32(0x00400000)));
}

/* One row block of C (R rows, P panels, n valid columns) from the
 * accumulators: whole vectors where the columns are contiguous, masked at
 * the right edge, through a spill where C's columns are strided. */
RD_FEW static RD_INLINE void
rd_few_put(__m512 v, float *c, rd_int cs_c, rd_int cols, int mode)
{
    if (cols <= 0)
        return;
    if (cs_c == 1) {
        const __mmask16 k = cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1u);
        if (mode == RD_ADD)
            v = _mm512_add_ps(_mm512_maskz_loadu_ps(k, c), v);
        _mm512_mask_storeu_ps(c, k, v);
        return;
    }
    float t[16] __attribute__((aligned(64)));
    _mm512_store_ps(t, v);
    for (rd_int j = 0; j < cols && j < 16; j++) {
        if (mode == RD_ADD)
            c[j * cs_c] += t[j];
        else
            c[j * cs_c] = t[j];
    }
}

/* R rows x P panels: the body every kernel below instantiates (kind, R, P
 * and zp constants, so the loops unroll and the accumulators stay in
 * registers). */
RD_FEW static RD_INLINE void
rd_few_body(const int kind, const int R, const int P, const int zp, rd_int kc, const float *a,
            const char *b, size_t bstep, float *c, rd_int rs_c, rd_int cs_c, rd_int n, int mode)
{
    const rd_int SB = FK_STEP(kind);
    __m512 acc[2][4][2];
    for (int i = 0; i < R; i++)
        for (int q = 0; q < P; q++)
            acc[i][q][0] = acc[i][q][1] = _mm512_setzero_ps();
    const __m512 table = _mm512_loadu_ps(rd_e2m1_values), i4 = _mm512_loadu_ps(rd_i4_values);
    const int quantized = kind == FK_I8 || kind == FK_F8 || kind == FK_F4 || kind == FK_I4;
    rd_qtrailer_t h = {(int)kc, (int)kc, 0, 0};
    if (quantized)
        memcpy(&h, b + SB * kc, sizeof h);
    rd_int p = 0, len = h.first;
    for (rd_int r = 0; p < kc; r++, len = h.tile) {
        __m512 s[4][2], z[4][2];
        for (int q = 0; q < P; q++) {
            const char *tr = b + q * bstep + SB * kc;
            s[q][0] = s[q][1] = z[q][0] = z[q][1] = _mm512_setzero_ps();
            if (kind == FK_F4) {
                const uint8_t *e = (const uint8_t *)(tr + RD_F4RUN(r, 32));
                s[q][0] = rd_few_e8m0(e);
                s[q][1] = rd_few_e8m0(e + 16);
            } else if (quantized) {
                const float *sv = (const float *)(const void *)(tr + RD_QRUN(r, 32, zp));
                s[q][0] = _mm512_loadu_ps(sv);
                s[q][1] = _mm512_loadu_ps(sv + 16);
                if (zp) {
                    z[q][0] = _mm512_loadu_ps(sv + 32);
                    z[q][1] = _mm512_loadu_ps(sv + 48);
                }
            }
        }
        const rd_int end = kc - p < len ? kc : p + len;
        for (; p < end; p++) {
            const char *bp = b + p * SB;
            for (int q = 0; q < P; q++) {
                __m512 w0, w1;
                rd_few_widen(kind, bp + q * bstep, &w0, &w1, table, i4);
                if (quantized && zp) {
                    w0 = _mm512_sub_ps(w0, z[q][0]);
                    w1 = _mm512_sub_ps(w1, z[q][1]);
                }
                if (quantized) {
                    w0 = _mm512_mul_ps(w0, s[q][0]);
                    w1 = _mm512_mul_ps(w1, s[q][1]);
                }
                for (int i = 0; i < R; i++) {
                    const __m512 av = _mm512_set1_ps(a[p * 12 + i]);
                    acc[i][q][0] = _mm512_fmadd_ps(av, w0, acc[i][q][0]);
                    acc[i][q][1] = _mm512_fmadd_ps(av, w1, acc[i][q][1]);
                }
            }
        }
    }
    for (int i = 0; i < R; i++)
        for (int q = 0; q < P; q++) {
            float *cq = c + i * rs_c + q * 32 * cs_c;
            rd_few_put(acc[i][q][0], cq, cs_c, n - q * 32, mode);
            rd_few_put(acc[i][q][1], cq + 16 * cs_c, cs_c, n - q * 32 - 16, mode);
        }
}

/* The panels of a call in runs of P: 4, 2, 1 for one row, 2, 1 for two. */
#define RD_FEW_KERNEL(NAME, KIND, ZP)                                       \
RD_FEW static void                                                          \
NAME(rd_int kc, const float *a, const char *b, size_t bstep, float *c,      \
     rd_int rs_c, rd_int cs_c, int m, rd_int n, int mode)                   \
{                                                                           \
    const rd_int np = (n + 31) / 32;                                        \
    rd_int q = 0;                                                           \
    if (m == 1) {                                                           \
        for (; q + 4 <= np; q += 4)                                         \
            rd_few_body(KIND, 1, 4, ZP, kc, a, b + q * bstep, bstep, c + q * 32 * cs_c, rs_c, cs_c, \
                        n - q * 32, mode);                                  \
        for (; q + 2 <= np; q += 2)                                         \
            rd_few_body(KIND, 1, 2, ZP, kc, a, b + q * bstep, bstep, c + q * 32 * cs_c, rs_c, cs_c, \
                        n - q * 32, mode);                                  \
        for (; q < np; q++)                                                 \
            rd_few_body(KIND, 1, 1, ZP, kc, a, b + q * bstep, bstep, c + q * 32 * cs_c, rs_c, cs_c, \
                        n - q * 32, mode);                                  \
    } else {                                                                \
        for (; q + 2 <= np; q += 2)                                         \
            rd_few_body(KIND, 2, 2, ZP, kc, a, b + q * bstep, bstep, c + q * 32 * cs_c, rs_c, cs_c, \
                        n - q * 32, mode);                                  \
        for (; q < np; q++)                                                 \
            rd_few_body(KIND, 2, 1, ZP, kc, a, b + q * bstep, bstep, c + q * 32 * cs_c, rs_c, cs_c, \
                        n - q * 32, mode);                                  \
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

/* The entry points (rd_fukr_t): untyped pointers; the quantized ones pick
 * the body with or without zero points from the panel's trailer. */
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
RD_FEW_ENTRY(rd_few_avx512_f32, few_f32)
RD_FEW_ENTRY(rd_few_avx512_bf16w, few_bf16)
RD_FEW_ENTRY(rd_few_avx512_f16w, few_f16)
RD_FEW_QENTRY(rd_few_avx512_i8w, few_i8, few_i8z, 32)
RD_FEW_QENTRY(rd_few_avx512_f8w, few_f8, few_f8z, 32)
RD_FEW_ENTRY(rd_few_avx512_f4w, few_f4)
RD_FEW_QENTRY(rd_few_avx512_i4w, few_i4, few_i4z, 16)

#endif /* RD_HAVE_X86_KERNELS */
