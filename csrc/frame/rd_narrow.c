/*
 * Results narrowed to 16-bit floats, rounded to nearest even once: float32
 * to bfloat16 (its upper half, rounded; NaNs stay NaNs, made quiet) and to
 * float16 (F16C's vcvtps2ph where the CPU has it, which rounds as IEEE
 * does; otherwise bit by bit, the same results).  Vector code through
 * target clones: NumPy's own casts convert one value at a time.
 */
#include "rd_frame.h"
#include "rd_half.h"

#include <stdint.h>
#include <string.h>

#if defined(RD_HAVE_X86_KERNELS)
#include <immintrin.h>
#endif

/* IEEE float32 to binary16, round to nearest even, overflow to infinity,
 * subnormals and NaNs (made quiet) kept. */
static inline uint16_t
rd_float_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)                       /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)                      /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {                     /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u)                   /* below 2^-25: rounds to 0 */
            return (uint16_t)sign;
        const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e;       /* 14..24: value = m * 2^(e-150) */
        uint32_t q = m >> shift;
        const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rest > half || (rest == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias 127 -> 15, round the 13 dropped bits to nearest even */
    const uint32_t r = a - (112u << 23);
    return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}

RD_WIDEST_CLONES static void
rd_narrow_bf16(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = rd_float_to_bf16(src[i]);
}

#if defined(RD_HAVE_X86_KERNELS)
__attribute__((target("avx,f16c"))) static void
rd_narrow_f16c(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = rd_float_to_f16(src[i]);
}
#endif

static void
rd_narrow_f16(const float *src, uint16_t *dst, size_t n)
{
#if defined(RD_HAVE_X86_KERNELS)
    if (rd_cpu()->f16c) {
        rd_narrow_f16c(src, dst, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] = rd_float_to_f16(src[i]);
}

int
rd_narrow(const float *src, void *dst, rd_dtype_t dtype, size_t n, int portable)
{
    if (dtype == RD_BF16)
        rd_narrow_bf16(src, (uint16_t *)dst, n);
    else if (dtype == RD_F16 && !portable)
        rd_narrow_f16(src, (uint16_t *)dst, n);
    else if (dtype == RD_F16)
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = rd_float_to_f16(src[i]);
    else
        return -1;
    return 0;
}

void
rd_widen(const void *src, float *dst, rd_dtype_t dtype, size_t n)
{
    const uint16_t *h = (const uint16_t *)src;
    if (dtype == RD_BF16)
        for (size_t i = 0; i < n; i++)
            dst[i] = rd_bf16_to_float(h[i]);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = rd_f16_to_float(h[i]);
}
