/*
 * AVX-VNNI int8 dot-product micro-kernel (the VEX, 256-bit form of
 * vpdpbusd: Intel Alder Lake and later, AMD Zen5), family "avx-vnni".  Its
 * twin, "avx-vnni-twin" (kernels/rd_dot_twins.c), computes the same exact
 * int32 sums in plain C with the same register block and blocking, on
 * every CPU.  The arithmetic and the packed layout are RD_CT_U8S8's
 * (rd_kernel.h).
 *
 *   rd_u8s8dot_avxvnni_6x16: 6 rows x 16 columns in 12 ymm accumulators;
 *       per quad step two loads of B, six 32-bit broadcasts of A, twelve
 *       dot products of 4 multiply-adds a lane.
 */
#include "rd_kernel.h"
#include "rd_dot_blocking.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* (vpdpbusd is written as inline assembly: no compiler target for AVX-VNNI,
 * which gcc 10 does not know, is needed) */
#define RD_AVXVNNI_TARGET __attribute__((target("avx2,fma")))
#define RD_AVX2_TARGET __attribute__((target("avx2,fma")))

/* With its accumulator tied (as in kernels/rd_avx512_dot.c), in the VEX
 * encoding AVX-VNNI CPUs without AVX-512 run. */
RD_AVXVNNI_TARGET static inline __m256i
rd_dpbusd256_native(__m256i acc, __m256i a, __m256i b)
{
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
    return acc;
}

RD_AVX2_TARGET static inline void
rd_store_row16(float *c, __m256 lo, __m256 hi, int accumulate)
{
    if (accumulate == RD_ADD) {
        lo = _mm256_add_ps(_mm256_loadu_ps(c), lo);
        hi = _mm256_add_ps(_mm256_loadu_ps(c + 8), hi);
    }
    _mm256_storeu_ps(c, lo);
    _mm256_storeu_ps(c + 8, hi);
}

#define ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define Y_DECL(i) __m256i c##i##0 = _mm256_setzero_si256(), c##i##1 = _mm256_setzero_si256();
#define Y_STEP(i)                                                           \
    {                                                                       \
        const __m256i av = _mm256_set1_epi32(a32[i]);                       \
        c##i##0 = DOT(c##i##0, av, b0);                                     \
        c##i##1 = DOT(c##i##1, av, b1);                                     \
    }
/* As U_FINISH of rd_avx512_dot.c: t = S - u cb - v zb, then scaled. */
#define Y_FINISH(i)                                                         \
    {                                                                       \
        const __m256i u = _mm256_set1_epi32((int32_t)(128u + (uint32_t)za[i])); \
        const __m256i v = _mm256_set1_epi32((int32_t)((uint32_t)ra[i] - (uint32_t)kc * (uint32_t)za[i])); \
        const __m256 s = _mm256_set1_ps(sa[i]);                             \
        c##i##0 = _mm256_sub_epi32(c##i##0, _mm256_mullo_epi32(u, cb0));   \
        c##i##1 = _mm256_sub_epi32(c##i##1, _mm256_mullo_epi32(u, cb1));   \
        if (zero_b) {                                                       \
            c##i##0 = _mm256_sub_epi32(c##i##0, _mm256_mullo_epi32(v, zb0)); \
            c##i##1 = _mm256_sub_epi32(c##i##1, _mm256_mullo_epi32(v, zb1)); \
        }                                                                   \
        f##i##0 = _mm256_mul_ps(_mm256_cvtepi32_ps(c##i##0), _mm256_mul_ps(s, sb0)); \
        f##i##1 = _mm256_mul_ps(_mm256_cvtepi32_ps(c##i##1), _mm256_mul_ps(s, sb1)); \
    }
#define Y_FDECL(i) __m256 f##i##0, f##i##1;
#define Y_PUT(i) rd_store_row16(c + (i) * rs_c, f##i##0, f##i##1, accumulate);
#define Y_SPILL(i)                                                          \
    _mm256_store_ps(buf + (i) * 16, f##i##0);                               \
    _mm256_store_ps(buf + (i) * 16 + 8, f##i##1);

#define RD_Y_KERNEL(NAME, TARGET)                                           \
TARGET static void                                                          \
NAME(rd_int kc, const void *a_, const void *b_, void *c_, rd_int rs_c,      \
     rd_int cs_c, int m, int n, int accumulate)                             \
{                                                                           \
    const int8_t *b = (const int8_t *)b_;                                   \
    float *c = (float *)c_;                                                 \
    if (accumulate == RD_STREAM)                                            \
        accumulate = RD_STORE;                                              \
    const rd_int kq = (kc + 3) / 4 * 4;                                     \
    const int32_t *a32 = (const int32_t *)a_;                               \
    const char *ta = (const char *)a_ + 6 * kq, *tb = (const char *)b_ + 16 * kq; \
    const int32_t *ra = (const int32_t *)(const void *)ta;                  \
    const float *sa = (const float *)(const void *)(ta + 24);               \
    const int32_t *za = (const int32_t *)(const void *)(ta + 48);           \
    ROWS6(Y_DECL)                                                           \
    for (rd_int q = 0; q < kq; q += 4) {                                    \
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)(const void *)b); \
        const __m256i b1 = _mm256_loadu_si256((const __m256i *)(const void *)(b + 32)); \
        ROWS6(Y_STEP)                                                       \
        a32 += 6;                                                           \
        b += 64;                                                            \
    }                                                                       \
    const __m256i cb0 = _mm256_loadu_si256((const __m256i *)(const void *)tb); \
    const __m256i cb1 = _mm256_loadu_si256((const __m256i *)(const void *)(tb + 32)); \
    const __m256 sb0 = _mm256_loadu_ps((const float *)(const void *)(tb + 64)); \
    const __m256 sb1 = _mm256_loadu_ps((const float *)(const void *)(tb + 96)); \
    const __m256i zb0 = _mm256_loadu_si256((const __m256i *)(const void *)(tb + 128)); \
    const __m256i zb1 = _mm256_loadu_si256((const __m256i *)(const void *)(tb + 160)); \
    const int zero_b = !_mm256_testz_si256(zb0, zb0) || !_mm256_testz_si256(zb1, zb1); \
    ROWS6(Y_FDECL)                                                          \
    ROWS6(Y_FINISH)                                                         \
    if (m == 6 && n == 16 && cs_c == 1) {                                   \
        ROWS6(Y_PUT)                                                        \
        return;                                                             \
    }                                                                       \
    float buf[6 * 16] __attribute__((aligned(32)));                         \
    ROWS6(Y_SPILL)                                                          \
    rd_s_store_edge(buf, 16, c, rs_c, cs_c, m, n, accumulate);              \
}

#define DOT rd_dpbusd256_native
RD_Y_KERNEL(rd_u8s8dot_avxvnni_6x16, RD_AVXVNNI_TARGET)
#undef DOT

static int
rd_avx2_runnable(void)
{
    return rd_cpu()->avx2 && rd_cpu()->fma;
}

static int
rd_avx_vnni_runnable(void)
{
    return rd_avx2_runnable() && rd_cpu()->avx_vnni;
}

const rd_family_t rd_family_avx_vnni = {
    "avx-vnni", rd_avx_vnni_runnable,
    {[RD_CT_U8S8] = RD_AVXVNNI_DESC(rd_u8s8dot_avxvnni_6x16)}, 0, {{NULL, 0, 0}}, {{NULL, 0, NULL, 0}},
};

#endif /* RD_HAVE_X86_KERNELS */
