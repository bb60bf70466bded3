/*
 * AVX2 few-row kernels (rd_fukr_t, kernels/rd_few_body.h) of the quantized
 * types (int8, float8, int4, 4-bit float), for the CPUs whose widest family
 * is AVX2: one row walks 4 micro-panels of 16 columns at once (8 FMA
 * chains: 2 pipes x 4 cycles), two rows 2 panels, three rows one (four
 * rows, 8 accumulators and the decoding's registers in 16, measured slower
 * than the micro-kernel: int8 2.34 -> 2.56 ms where three rows went 2.34 ->
 * 2.14, MXFP4 2.35 -> 1.88, 16 x [2048, 768] on Zen4 under the avx2
 * family).  The 6x16 micro-kernel holds two accumulators for one row.  (rd_avx2.c says why not the float
 * and 16-bit types.)
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "rd_avx2_f4.h"
#include "rd_avx2_few.h"
#include "rd_few_body.h"

#define FEW_ATTR __attribute__((target("avx2,fma,f16c")))
#define FEW_V __m256
#define FEW_W 8
#define FEW_MR 6
#define FEW_P1 4
#define FEW_P2 2
#define FEW_P4 1
#define FEW_ZERO _mm256_setzero_ps
#define FEW_LOADU _mm256_loadu_ps
#define FEW_SUB _mm256_sub_ps
#define FEW_MUL _mm256_mul_ps
#define FEW_FMA(acc, w, a) _mm256_fmadd_ps(_mm256_broadcast_ss(a), (w), (acc))
#define FK_STEP(kind) ((kind) == FK_F32 ? 64 : (kind) == FK_BF16 || (kind) == FK_F16 ? 32 \
                       : (kind) == FK_F4 || (kind) == FK_I4 ? 8 : 16)

typedef struct {
    __m256 mag;     /* the magnitudes of the e2m1 codes 0-7 */
} rd_few_consts_t;

FEW_ATTR static RD_INLINE rd_few_consts_t
rd_few_consts(void)
{
    const rd_few_consts_t k = {_mm256_loadu_ps(rd_e2m1_values)};
    return k;
}

/* The 16 values of one step of a panel, widened exactly (not yet scaled),
 * as rd_avx2.c's loads of the same type. */
FEW_ATTR static RD_INLINE void
rd_few_widen(const int kind, const char *bp, __m256 *w0, __m256 *w1, const rd_few_consts_t *k)
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
        *w0 = rd_avx2_e2m1(bq, k->mag);
        *w1 = rd_avx2_e2m1(_mm256_srli_epi32(bq, 4), k->mag);
    } else {
        const __m256i bq = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)bp));
        const __m256i eight = _mm256_set1_epi32(8);
        *w0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_xor_si256(_mm256_and_si256(bq, _mm256_set1_epi32(15)),
                                                                   eight), eight));
        *w1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_xor_si256(_mm256_srli_epi32(bq, 4), eight), eight));
    }
}

/* The scales of a run's e8m0 exponents */
FEW_ATTR static RD_INLINE void
rd_few_e8m0(const uint8_t *e, __m256 *s0, __m256 *s1)
{
    *s0 = rd_avx2_e8m0(e);
    *s1 = rd_avx2_e8m0(e + 8);
}

/* 8 columns of a row of C from an accumulator (cols of them valid) */
FEW_ATTR static RD_INLINE void
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

#include "rd_few_body.h"

RD_FEW_DEFINE_ZP(rd_few_avx2_i8w, FK_I8)
RD_FEW_DEFINE_ZP(rd_few_avx2_f8w, FK_F8)
RD_FEW_DEFINE(rd_few_avx2_f4w, FK_F4)
RD_FEW_DEFINE_ZP(rd_few_avx2_i4w, FK_I4)

#endif /* RD_HAVE_X86_KERNELS */
