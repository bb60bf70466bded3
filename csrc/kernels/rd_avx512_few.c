/*
 * AVX-512 few-row kernels (rd_fukr_t, kernels/rd_few_body.h): one row
 * walks 4 micro-panels of 32 columns at once (8 independent FMA chains),
 * two rows 2 panels.  With one row the 12x32 micro-kernel holds two
 * accumulators, each FMA waiting 4 cycles for the previous one, and falls
 * back to its 4-row body, which does the FMAs of four rows for one.
 * Measured on Zen4 (2 threads, 64 experts x [2048, 768], one row an expert,
 * prepacked): int8 weights 8.1 -> 4.0 ms, MXFP4 6.7 -> 3.4 ms.  Three or
 * four rows walk 2 panels (16 chains), for the quantized types, whose
 * decoding (widening, (w - z) * s a step) the micro-kernel's 4-row body
 * repeats panel after panel at half its FMAs' rate: 16 experts x [2048,
 * 768], bfloat16 rows, Zen4 2 threads, 3 / 4 rows an expert: int8 2.03 /
 * 2.03 -> 1.30 / 1.46 ms, int4 1.68 / 1.70 -> 1.09 / 1.31, MXFP4 1.59 /
 * 1.63 -> 1.11 / 1.35 (the float types gain nothing: their weights stream).
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "rd_avx512_body.h"
#include "rd_avx512_few.h"
#include "rd_few_body.h"

#define FEW_ATTR __attribute__((target("avx512f,avx512bw")))
#define FEW_V __m512
#define FEW_W 16
#define FEW_MR 12
#define FEW_P1 4
#define FEW_P2 2
#define FEW_P4 2
#define FEW_ZERO _mm512_setzero_ps
#define FEW_LOADU _mm512_loadu_ps
#define FEW_SUB _mm512_sub_ps
#define FEW_MUL _mm512_mul_ps
#define FEW_FMA(acc, w, a) _mm512_fmadd_ps(_mm512_set1_ps(*(a)), (w), (acc))
#define FK_STEP(kind) ((kind) == FK_F32 ? 128 : (kind) == FK_BF16 || (kind) == FK_F16 ? 64 \
                       : (kind) == FK_F4 || (kind) == FK_I4 ? 16 : 32)

typedef struct {
    __m512 e2m1, i4;    /* the 16 values of the 4-bit codes */
} rd_few_consts_t;

FEW_ATTR static RD_INLINE rd_few_consts_t
rd_few_consts(void)
{
    const rd_few_consts_t k = {_mm512_loadu_ps(rd_e2m1_values), _mm512_loadu_ps(rd_i4_values)};
    return k;
}

/* The 32 values of one step of a panel, widened exactly (not yet scaled),
 * as rd_avx512.c's LOAD_B / WIDEN of the same type. */
FEW_ATTR static RD_INLINE void
rd_few_widen(const int kind, const char *bp, __m512 *w0, __m512 *w1, const rd_few_consts_t *k)
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
    } else {    /* 4-bit codes: vpermps reads the low 4 bits of each lane */
        const __m512i bq = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)bp));
        const __m512 t = kind == FK_I4 ? k->i4 : k->e2m1;
        *w0 = _mm512_permutexvar_ps(bq, t);
        *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(bq, 4), t);
    }
}

/* The scales of a run's e8m0 exponents */
FEW_ATTR static RD_INLINE void
rd_few_e8m0(const uint8_t *e, __m512 *s0, __m512 *s1)
{
    *s0 = rd_avx512_e8m0(e);
    *s1 = rd_avx512_e8m0(e + 16);
}

#define rd_few_put rd_avx512_put16

#include "rd_few_body.h"

RD_FEW_DEFINE(rd_few_avx512_f32, FK_F32)
RD_FEW_DEFINE(rd_few_avx512_bf16w, FK_BF16)
RD_FEW_DEFINE(rd_few_avx512_f16w, FK_F16)
RD_FEW_DEFINE_ZP(rd_few_avx512_i8w, FK_I8)
RD_FEW_DEFINE_ZP(rd_few_avx512_f8w, FK_F8)
RD_FEW_DEFINE(rd_few_avx512_f4w, FK_F4)
RD_FEW_DEFINE_ZP(rd_few_avx512_i4w, FK_I4)

#endif /* RD_HAVE_X86_KERNELS */
