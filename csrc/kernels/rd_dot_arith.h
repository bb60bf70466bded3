/*
 * The arithmetic of the bfloat16 dot-product instructions, one float32 lane
 * at a time, in plain C that gives the same bits on every CPU and compiler
 * (no FMA contraction: the build has -ffp-contract=off; no rounding-mode
 * or flush-mode changes: every rounding is done by hand from exact values).
 * The twins of the dot-product families (kernels/rd_dot_twins.c) are built
 * on it, and the tests hold each native instruction to it.
 *
 * x86 vdpbf16ps (AVX512_BF16; SPEC section 6, measured on Zen4): per pair,
 *   acc = fma(hi(a), hi(b), acc);  acc = fma(lo(a), lo(b), acc)
 * each step rounded to nearest even, bfloat16 denormal inputs read as 0,
 * a tiny result (|r| < 2^-126 after rounding to 24 bits with an unbounded
 * exponent) flushed to 0 with its sign.
 *
 * Arm BFDOT / BFMMLA with FPCR.EBF = 0 (the Arm ARM's BFDotAdd): per pair,
 *   acc = add(acc, add(mul(lo(a), lo(b)), mul(hi(a), hi(b))))
 * every operation rounded to odd (truncated, then the last bit set when the
 * result is inexact), overflow to infinity, denormal inputs read as 0 and a
 * tiny result (|r| < 2^-126 before rounding) flushed to 0 with its sign,
 * any NaN giving the default NaN (0x7fc00000).  BFMMLA adds a row's pairs
 * in order with this same step, so both instructions give these bits.
 *
 * Exactness: a product of two bfloat16 values has at most 16 significant
 * bits and is exact in double; the sum of two such values (or of one and a
 * float32) is held exactly as a double and an error term (Knuth's TwoSum),
 * from which each rounding is decided.
 */
#ifndef RD_DOT_ARITH_H
#define RD_DOT_ARITH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rd_half.h"

#define RD_FLT_MIN_D 0x1p-126
#define RD_TWO128_D 0x1p128

/* bfloat16 bits to float32 with a denormal input read as 0 (sign kept). */
static inline float
rd_bf16_daz(uint16_t h)
{
    return rd_bf16_to_float((h & 0x7f80u) == 0 ? (uint16_t)(h & 0x8000u) : h);
}

/* float32 with a denormal read as 0 (sign kept): the flush of inputs, and
 * (applied to a rounded result) of results. */
static inline float
rd_f32_daz(float x)
{
    return (rd_float_bits(x) & 0x7f800000u) == 0 ? copysignf(0.0f, x) : x;
}

/* ------------------------------------------------------- x86 vdpbf16ps */

/* fma(a, b, acc) for bfloat16-valued a, b (denormals already read as 0)
 * and a float32 acc, rounded to nearest even, a tiny result flushed: the
 * double sum of the exact product and acc rounds to the float32 the fused
 * operation gives (double's 53 bits exceed 2 x 24 + 2, so rounding twice
 * never differs from once), and the rounding to 24 bits with an unbounded
 * exponent, which decides tininess, is that of the sum scaled into the
 * normal range (by 2^100, exactly). */
static inline float
rd_vdpbf16_step(float acc, float a, float b)
{
    const double s = (double)a * (double)b + (double)acc;
    if (fabs(s) < RD_FLT_MIN_D && fabsf((float)(s * 0x1p100)) < 0x1p-26f)
        return copysignf(0.0f, (float)s);
    return (float)s;
}

/* --------------------------------------------------------- Arm BFDotAdd */

#define RD_DEFAULT_NAN_BITS 0x7fc00000u

static inline float
rd_default_nan(void)
{
    return rd_bits_to_float(RD_DEFAULT_NAN_BITS);
}

/* The float32 rounding to odd of the exact value s + e (s a double, e the
 * error of the sum that made it: |e| <= ulp(s) / 2), with a tiny value
 * (below 2^-126 before rounding) flushed to 0 and a value of 2^128 or more
 * (where the exponent overflows) made infinite. */
static inline float
rd_round_odd(double s, double e)
{
    const double as = fabs(s);
    /* e's sign against s's: the exact value lies beyond s (> 0), short of
     * it (< 0), or is s (0) */
    const int beyond = s == 0.0 ? 0 : (e == 0.0 ? 0 : ((e > 0.0) == (s > 0.0) ? 1 : -1));
    if (s == 0.0)
        return (float)s;
    if (as < RD_FLT_MIN_D || (as == RD_FLT_MIN_D && beyond < 0))
        return copysignf(0.0f, (float)s);
    if (as > RD_TWO128_D || (as == RD_TWO128_D && beyond >= 0))
        return copysignf(INFINITY, (float)s);
    if (as >= 0x1.fffffep127)   /* FLT_MAX .. 2^128: truncated to FLT_MAX, odd */
        return copysignf(0x1.fffffep127f, (float)s);
    float f = (float)s;         /* nearest; below FLT_MAX in magnitude */
    /* r: the exact value less f, whose sign is exact (d is exact, and a
     * rounded sum of two doubles keeps the sign of their exact sum) */
    const double d = s - (double)f;
    const double r = d + e;
    if (r == 0.0)
        return f;               /* exact */
    if ((r > 0.0) != (f > 0.0)) /* f is beyond the value: step toward 0 */
        f = rd_bits_to_float(rd_float_bits(f) - 1u);
    return rd_bits_to_float(rd_float_bits(f) | 1u);
}

/* x + y of two float32 values with BFDotAdd's rounding. */
static inline float
rd_bfadd(float x, float y)
{
    x = rd_f32_daz(x);
    y = rd_f32_daz(y);
    if (isnan(x) || isnan(y))
        return rd_default_nan();
    if (isinf(x) || isinf(y)) {
        const float r = x + y;
        return isnan(r) ? rd_default_nan() : r;
    }
    const double s = (double)x + (double)y;
    const double bb = s - (double)x;
    const double e = ((double)x - (s - bb)) + ((double)y - bb);
    return rd_round_odd(s, e);
}

/* x * y of two bfloat16-valued float32s (exact in double) with BFDotAdd's
 * rounding: exact, or 0 when tiny, or infinite. */
static inline float
rd_bfmul(float x, float y)
{
    x = rd_f32_daz(x);
    y = rd_f32_daz(y);
    const double p = (double)x * (double)y;
    if (isnan(p))
        return rd_default_nan();
    return rd_round_odd(p, 0.0);
}

/* acc + lo(a) lo(b) + hi(a) hi(b): one BFDotAdd of a pair (bfloat16 bits
 * a_lo, a_hi of A and b_lo, b_hi of B). */
static inline float
rd_bfdotadd(float acc, uint16_t a_lo, uint16_t a_hi, uint16_t b_lo, uint16_t b_hi)
{
    const float t1 = rd_bfmul(rd_bf16_to_float(a_lo), rd_bf16_to_float(b_lo));
    const float t2 = rd_bfmul(rd_bf16_to_float(a_hi), rd_bf16_to_float(b_hi));
    return rd_bfadd(acc, rd_bfadd(t1, t2));
}

#endif /* RD_DOT_ARITH_H */
