/*
 * The decoding of 4-bit float panels (RD_CT_F32_F4W) shared by the AVX2
 * micro-kernels (kernels/rd_avx2.c) and their few-row kernels
 * (kernels/rd_avx2_few.c).
 */
#ifndef RD_AVX2_F4_H
#define RD_AVX2_F4_H

#include <immintrin.h>
#include <stdint.h>

#define RD_AVX2_F4 __attribute__((target("avx2,fma,f16c")))

/* e2m1 codes in 32-bit lanes to float32: the magnitude looked up (vpermps on
 * the low 3 bits, `mag` the 8 magnitudes), the sign bit moved into place
 * (exact) */
RD_AVX2_F4 static inline __m256
rd_avx2_e2m1(__m256i code, __m256 mag)
{
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, code), _mm256_castsi256_ps(sign));
}

/* The float32 scales 2^(e - 127) of 8 e8m0 exponents (e 0: 2^-127) */
RD_AVX2_F4 static inline __m256
rd_avx2_e8m0(const uint8_t *e)
{
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)e));
    const __m256i sub = _mm256_and_si256(_mm256_cmpeq_epi32(v, _mm256_setzero_si256()),
                                         _mm256_set1_epi32(0x00400000));
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(v, 23), sub));
}

#endif /* RD_AVX2_F4_H */
