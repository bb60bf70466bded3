/*
 * 16-bit floats widened to float32, exactly, in portable C: shared by the
 * packing routines and the portable micro-kernels that read 16-bit panels.
 */
#ifndef RD_HALF_H
#define RD_HALF_H

#include <stdint.h>
#include <string.h>

static inline float
rd_bits_to_float(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint32_t
rd_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* bfloat16 is the upper half of a float32: exact, NaN payloads kept. */
static inline float
rd_bf16_to_float(uint16_t h)
{
    return rd_bits_to_float((uint32_t)h << 16);
}

/* float32 to bfloat16, rounded to nearest even (NaNs stay NaNs, made
 * quiet; overflow to infinity): the packing of bfloat16 products that round
 * float32 operands, and the narrowing of results. */
static inline uint16_t
rd_float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet = (u >> 16) | 0x40u;
    return (uint16_t)(nan ? quiet : rounded);
}

/* IEEE binary16 to float32, exact for every value (subnormals, infinities,
 * NaN payloads), without F16C so that every CPU takes the same path.  Only
 * integer operations and selects, so that the packing loops vectorize: the
 * exponent and mantissa bits move into place and the exponent is rebiased
 * (15 -> 127); infinities and NaNs get the largest exponent; a subnormal h
 * is m * 2^-24 (m its mantissa), the float32 of the integer m with 24
 * taken from its exponent. */
static inline float
rd_f16_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = h & 0x7c00u, man = h & 0x3ffu;
    const uint32_t bits = (uint32_t)(h & 0x7fffu) << 13;
    /* masks, not branches: all ones where the condition holds */
    const uint32_t special = 0u - (uint32_t)(exp == 0x7c00u);  /* inf, NaN */
    const uint32_t small = 0u - (uint32_t)(exp == 0);          /* zero, subnormal */
    const uint32_t nonzero = 0u - (uint32_t)(man != 0);
    uint32_t r = bits + (112u << 23) + ((112u << 23) & special);
    const float fm = (float)(int32_t)man;
    uint32_t sub;
    memcpy(&sub, &fm, sizeof sub);
    sub = (sub - (24u << 23)) & nonzero;
    r = (sub & small) | (r & ~small);
    return rd_bits_to_float(r | sign);
}

#endif /* RD_HALF_H */
