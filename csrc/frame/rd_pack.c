/*
 * Packing: where the operands' storage dtypes become the packed element
 * types of a compute type, and where their strides (transposed, negative,
 * broadcast) are resolved, so that the micro-kernels see nothing but
 * contiguous panels.  The table below says which routine packs what; a
 * compute type with another packed layout (k-pairs interleaved for a
 * bfloat16 dot product, say) adds its routines and its rows here.
 */
#include "rd_frame.h"

/* Keep gcc from turning the short fixed-width copies into calls to memmove. */
#pragma GCC optimize("no-tree-loop-distribute-patterns")

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Each packing routine is compiled for the baseline instruction set and
 * again for AVX2 and AVX-512, and the loader binds the widest the CPU runs:
 * the conversions (16-bit floats widened, runs copied) then move 8 or 16
 * values per instruction instead of 4.  Same arithmetic in every clone:
 * conversions are exact, so the results do not depend on the clone. */
#if defined(RD_HAVE_X86_KERNELS) && !defined(RD_NO_PACK_CLONES)
#define RD_PACK_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define RD_PACK_F16C 1
#else
#define RD_PACK_CLONES
#endif

#include "rd_half.h"
/* float8_e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no
 * infinities, S.1111.111 is NaN) to float32, exact. */
static inline float
rd_f8e4m3_to_float(uint8_t b)
{
    const uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    const uint32_t exp = (b >> 3) & 0xfu, man = b & 0x7u;
    if (exp == 0xf && man == 0x7)
        return rd_bits_to_float(sign | 0x7fc00000u);
    if (exp != 0)                         /* normal: rebias 7 -> 127 */
        return rd_bits_to_float(sign | ((exp + 120u) << 23) | (man << 20));
    float v = (float)man * 0x1p-9f;       /* zero or subnormal: man * 2^-9 */
    return sign ? -v : v;
}

#define RD_SRC float
#define RD_DST float
#define RD_CVT(v) (v)
#define RD_SAME 1
#define RD_FN(x) rd_pack_s_s_##x
#include "rd_pack_impl.h"

#define RD_SRC double
#define RD_DST double
#define RD_CVT(v) (v)
#define RD_SAME 1
#define RD_FN(x) rd_pack_d_d_##x
#include "rd_pack_impl.h"

/* float32 operands of a float64 product: widened exactly while packing */
#define RD_SRC float
#define RD_DST double
#define RD_CVT(v) ((double)(v))
#define RD_SAME 0
#define RD_FN(x) rd_pack_s_d_##x
#include "rd_pack_impl.h"

/* 16-bit float operands, widened exactly while packing (never as a whole-array copy) */
#define RD_SRC uint16_t
#define RD_DST float
#define RD_CVT(v) rd_f16_to_float(v)
#define RD_SAME 0
#define RD_FN(x) rd_pack_h_s_##x
#include "rd_pack_impl.h"

#ifdef RD_PACK_F16C
/* the same with F16C's vcvtph2ps (exact, like rd_f16_to_float; NaNs stay
 * NaNs), eight values an instruction: chosen by rd_packer where the CPU
 * has F16C */
#include <immintrin.h>
#define RD_SRC uint16_t
#define RD_DST float
#define RD_CVT(v) _cvtsh_ss(v)
#define RD_SAME 0
#define RD_FN(x) rd_pack_h_s_f16c_##x
#define RD_ATTR __attribute__((target("avx,f16c")))
#define RD_RUN_ATTR RD_ATTR
#define RD_RUN8(d, s) \
    _mm256_storeu_ps((d), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s))))
#include "rd_pack_impl.h"
#endif

#define RD_SRC uint16_t
#define RD_DST float
#define RD_CVT(v) rd_bf16_to_float(v)
#define RD_SAME 0
#define RD_FN(x) rd_pack_b_s_##x
#include "rd_pack_impl.h"

#define RD_SRC uint16_t
#define RD_DST double
#define RD_CVT(v) ((double)rd_f16_to_float(v))
#define RD_SAME 0
#define RD_FN(x) rd_pack_h_d_##x
#include "rd_pack_impl.h"

#define RD_SRC uint16_t
#define RD_DST double
#define RD_CVT(v) ((double)rd_bf16_to_float(v))
#define RD_SAME 0
#define RD_FN(x) rd_pack_b_d_##x
#include "rd_pack_impl.h"

/* 16-bit B panels kept as they are stored, for the micro-kernels that widen
 * them (RD_CT_F32_BF16W with the halves of each row interleaved) */
#define RD_SRC uint16_t
#define RD_DST uint16_t
#define RD_CVT(v) (v)
#define RD_SAME 1
#define RD_FN(x) rd_pack_h_h_##x
#include "rd_pack_impl.h"

#define RD_SRC uint16_t
#define RD_DST uint16_t
#define RD_CVT(v) (v)
#define RD_SAME 0
#define RD_HALVES 1
#define RD_FN(x) rd_pack_b_bi_##x
#include "rd_pack_impl.h"

/* One-byte quantized values kept as they are stored (int8, or float8_e4m3fn
 * codes), for the panels of prepacked quantized weights (RD_CT_F32_I8W,
 * RD_CT_F32_F8W) that the micro-kernels widen and dequantize; rd_prepack
 * writes the scales after each panel */
#define RD_SRC uint8_t
#define RD_DST uint8_t
#define RD_CVT(v) (v)
#define RD_SAME 1
#define RD_FN(x) rd_pack_c_c_##x
#include "rd_pack_impl.h"

/* Quantized values: int8 (int4 values too, held in int8) and float8_e4m3fn,
 * read with the scales of their tiles (rd_pack_qimpl.h) */
#define RD_SRC int8_t
#define RD_DST float
#define RD_CVT(v) ((float)(v))
#define RD_FN(x) rd_pack_i8_s_##x
#include "rd_pack_qimpl.h"

#define RD_SRC int8_t
#define RD_DST double
#define RD_CVT(v) ((double)(v))
#define RD_FN(x) rd_pack_i8_d_##x
#include "rd_pack_qimpl.h"

#define RD_SRC uint8_t
#define RD_DST float
#define RD_CVT(v) rd_f8e4m3_to_float(v)
#define RD_FN(x) rd_pack_f8_s_##x
#include "rd_pack_qimpl.h"

#define RD_SRC uint8_t
#define RD_DST double
#define RD_CVT(v) ((double)rd_f8e4m3_to_float(v))
#define RD_FN(x) rd_pack_f8_d_##x
#include "rd_pack_qimpl.h"

/*
 * int8 values for the exact integer products (RD_CT_I8I32): each value less
 * its (integral) zero point, as int16, in k-pairs: X[i][p] at
 * panel[(p/2)*2r + 2i + p%2], depth padded to even with zeros; after the
 * r*kp values of each panel, r floats: the scale of each row's tile for
 * this block, which lies within one tile along the depth (the driver cuts
 * its blocks there).  Padding rows get zeros and scale 0.
 */
RD_PACK_CLONES static void
rd_pack_i8_i16_qpack(rd_int rows, rd_int depth, const void *src_, rd_int rs, rd_int cs,
                     int r, void *dst_, const rd_qblock_t *qb)
{
    const int8_t *src = (const int8_t *)src_;
    const float *scale = (const float *)qb->s;
    const float *zero = (const float *)qb->z;
    const rd_int kp = (depth + 1) / 2 * 2;
    const rd_int t = qb->p0 / qb->tp;          /* the block's tile along the depth */
    int16_t *restrict dst = (int16_t *)dst_;
    for (rd_int i0 = 0; i0 < rows; i0 += r) {
        const rd_int have = rows - i0 < r ? rows - i0 : r;
        float *sc = (float *)(void *)(dst + (rd_int)r * kp);
        for (rd_int i = 0; i < have; i++) {
            const int8_t *x = src + (i0 + i) * rs;
            const rd_int at = (qb->i0 + i0 + i) / qb->tr * qb->rs + t * qb->ps;
            const int16_t zp = zero != NULL ? (int16_t)zero[at] : 0;
            int16_t *col = dst + 2 * i;
            rd_int p = 0;
            if (cs == 1)
                for (; p + 1 < depth; p += 2) {
                    col[p * r] = (int16_t)(x[p] - zp);
                    col[p * r + 1] = (int16_t)(x[p + 1] - zp);
                }
            for (; p + 1 < depth; p += 2) {
                col[p * r] = (int16_t)(x[p * cs] - zp);
                col[p * r + 1] = (int16_t)(x[(p + 1) * cs] - zp);
            }
            if (p < depth) {
                col[p * r] = (int16_t)(x[p * cs] - zp);
                col[p * r + 1] = 0;
            }
            sc[i] = scale[at];
        }
        for (rd_int i = have; i < r; i++) {
            for (rd_int p = 0; p < kp; p += 2) {
                dst[p * r + 2 * i] = 0;
                dst[p * r + 2 * i + 1] = 0;
            }
            sc[i] = 0.0f;
        }
        dst += (rd_int)r * kp + 2 * (rd_int)r;   /* values, then r floats */
    }
}

/* float32 operands read as bfloat16 (rounded to nearest even), for the
 * float32 kernels where no bfloat16 dot-product kernel runs: the values a
 * BF16_BF16_F32 product multiplies, widened back exactly */
#define RD_SRC float
#define RD_DST float
#define RD_CVT(v) rd_bf16_to_float(rd_float_to_bf16(v))
#define RD_SAME 0
#define RD_FN(x) rd_pack_r_s_##x
#include "rd_pack_impl.h"

/* bfloat16 k-pairs (RD_CT_BF16DP): bfloat16 operands as they are, float32
 * ones rounded to nearest even */
#define RD_SRC uint16_t
#define RD_CVT(v) (v)
#define RD_FN(x) rd_pack_b_p_##x
#include "rd_pack_pairs.h"

#define RD_SRC float
#define RD_CVT(v) rd_float_to_bf16(v)
#define RD_FN(x) rd_pack_r_p_##x
#include "rd_pack_pairs.h"

/*
 * int8 values for the int8 dot products (RD_CT_U8S8): k-quads,
 * X[i][p] at panel[(p/4)*4r + 4i + p%4] as a byte, plus `shift` (128 for
 * A, whose bytes the instruction reads unsigned; 0 for B), depth padded to
 * a multiple of 4 (B's padding 0, so that every padding product is 0);
 * after the r*kq bytes of each panel, r int32 sums of the row's values over
 * the block, r float scales and r int32 zero points of the row's tile (the
 * block lies within one tile along the depth: the driver cuts its blocks
 * there).  Padding rows get 0 values, sums, scales and zero points.
 */
RD_PACK_CLONES static void
rd_pack_i8_quads(rd_int rows, rd_int depth, const int8_t *src, rd_int rs, rd_int cs,
                 int r, uint8_t *dst, const rd_qblock_t *qb, uint8_t shift)
{
    const float *scale = (const float *)qb->s;
    const float *zero = (const float *)qb->z;
    const rd_int kq = (depth + 3) / 4 * 4;
    const rd_int t = qb->p0 / qb->tp;          /* the block's tile along the depth */
    for (rd_int i0 = 0; i0 < rows; i0 += r) {
        const rd_int have = rows - i0 < r ? rows - i0 : r;
        char *tr = (char *)dst + (rd_int)r * kq;
        int32_t *sum = (int32_t *)(void *)tr;
        float *sc = (float *)(void *)(tr + 4 * (rd_int)r);
        int32_t *zp = (int32_t *)(void *)(tr + 8 * (rd_int)r);
        for (rd_int i = 0; i < have; i++) {
            const int8_t *x = src + (i0 + i) * rs;
            uint8_t *d = dst + 4 * i;
            int32_t acc = 0;
            rd_int p = 0;
            if (cs == 1)
                for (; p < depth; p++) {
                    d[p / 4 * 4 * r + p % 4] = (uint8_t)((uint8_t)x[p] + shift);
                    acc += x[p];
                }
            for (; p < depth; p++) {
                d[p / 4 * 4 * r + p % 4] = (uint8_t)((uint8_t)x[p * cs] + shift);
                acc += x[p * cs];
            }
            for (; p < kq; p++)
                d[p / 4 * 4 * r + p % 4] = 0;
            const rd_int at = (qb->i0 + i0 + i) / qb->tr * qb->rs + t * qb->ps;
            sum[i] = acc;
            sc[i] = scale[at];
            zp[i] = zero != NULL ? (int32_t)zero[at] : 0;
        }
        for (rd_int i = have; i < r; i++) {
            for (rd_int p = 0; p < kq; p++)
                dst[p / 4 * 4 * r + 4 * i + p % 4] = 0;
            sum[i] = 0;
            sc[i] = 0.0f;
            zp[i] = 0;
        }
        dst += (rd_int)r * kq + 12 * (rd_int)r;   /* values, then the trailer */
    }
}

static void
rd_pack_i8_u8_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs,
                    int r, void *dst, const rd_qblock_t *qb)
{
    rd_pack_i8_quads(rows, depth, (const int8_t *)src, rs, cs, r, (uint8_t *)dst, qb, 128);
}

static void
rd_pack_i8_s8_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs,
                    int r, void *dst, const rd_qblock_t *qb)
{
    rd_pack_i8_quads(rows, depth, (const int8_t *)src, rs, cs, r, (uint8_t *)dst, qb, 0);
}

/*
 * float32 / bfloat16 rows quantized to int8 while packed, for the int8 dot
 * products (RD_CT_U8S8 A, "dynamic" activation quantization): each value
 * x of row i becomes q = clip(rint(x / s_i), -128, 127) with s_i the row's
 * scale (rd_row_scales: absmax / 127.5), the value raggeddot.quantize gives
 * per row (the same float32 division and rounding); stored as q + 128 in
 * the k-quads of rd_pack_i8_quads, with the row's sum of q, its scale and a
 * zero point of 0 in the trailer.  A NaN becomes -128 (never undefined).
 */
static inline int32_t
rd_quantize_q8(float x, float s)
{
    float y = rintf(x / s);
    if (!(y >= -128.0f))   /* NaN too */
        y = -128.0f;
    if (y > 127.0f)
        y = 127.0f;
    return (int32_t)y;
}

#define RD_Q8_PACK(NAME, SRC, WIDEN)                                        \
RD_PACK_CLONES static void                                                  \
NAME(rd_int rows, rd_int depth, const void *src_, rd_int rs, rd_int cs,     \
     int r, void *dst_, const rd_qblock_t *qb)                              \
{                                                                           \
    const SRC *src = (const SRC *)src_;                                     \
    uint8_t *dst = (uint8_t *)dst_;                                         \
    const float *scale = (const float *)qb->s;                              \
    const rd_int kq = (depth + 3) / 4 * 4;                                  \
    const rd_int t = qb->p0 / qb->tp;                                       \
    for (rd_int i0 = 0; i0 < rows; i0 += r) {                               \
        const rd_int have = rows - i0 < r ? rows - i0 : r;                  \
        char *tr = (char *)dst + (rd_int)r * kq;                            \
        int32_t *sum = (int32_t *)(void *)tr;                               \
        float *sc = (float *)(void *)(tr + 4 * (rd_int)r);                  \
        int32_t *zp = (int32_t *)(void *)(tr + 8 * (rd_int)r);              \
        for (rd_int i = 0; i < have; i++) {                                 \
            const SRC *x = src + (i0 + i) * rs;                             \
            const float s = scale[(qb->i0 + i0 + i) / qb->tr * qb->rs + t * qb->ps]; \
            uint8_t *d = dst + 4 * i;                                       \
            int32_t acc = 0;                                                \
            rd_int p = 0;                                                   \
            for (; p < depth; p++) {                                        \
                const int32_t q = rd_quantize_q8(WIDEN(x[p * cs]), s);      \
                d[p / 4 * 4 * r + p % 4] = (uint8_t)(q + 128);              \
                acc += q;                                                   \
            }                                                               \
            for (; p < kq; p++)                                             \
                d[p / 4 * 4 * r + p % 4] = 0;                               \
            sum[i] = acc;                                                   \
            sc[i] = s;                                                      \
            zp[i] = 0;                                                      \
        }                                                                   \
        for (rd_int i = have; i < r; i++) {                                 \
            for (rd_int p = 0; p < kq; p++)                                 \
                dst[p / 4 * 4 * r + 4 * i + p % 4] = 0;                     \
            sum[i] = 0;                                                     \
            sc[i] = 0.0f;                                                   \
            zp[i] = 0;                                                      \
        }                                                                   \
        dst += (rd_int)r * kq + 12 * (rd_int)r;                             \
    }                                                                       \
}
#define RD_SAME_FLOAT(v) (v)
RD_Q8_PACK(rd_pack_s_q8_qpack, float, RD_SAME_FLOAT)
RD_Q8_PACK(rd_pack_b_q8_qpack, uint16_t, rd_bf16_to_float)

/* Per-row scales of dynamic int8 quantization: s_i = max_p |x[i][p]| / 127.5
 * in float32 (1 for a row of zeros; NaN when the row holds one), as
 * raggeddot.quantize(x, "int8", channelwise_axes=(0,)) computes them. */
RD_PACK_CLONES static void
rd_row_scales_s(const float *x, rd_int m, rd_int k, rd_int rs, rd_int cs, float *out)
{
    for (rd_int i = 0; i < m; i++) {
        const float *row = x + i * rs;
        float amax = 0.0f;
        for (rd_int p = 0; p < k; p++) {
            const float a = fabsf(row[p * cs]);
            amax = a > amax || a != a ? a : amax;
        }
        const float s = amax / 127.5f;
        out[i] = s == 0.0f ? 1.0f : s;
    }
}

RD_PACK_CLONES static void
rd_row_scales_b(const uint16_t *x, rd_int m, rd_int k, rd_int rs, rd_int cs, float *out)
{
    for (rd_int i = 0; i < m; i++) {
        const uint16_t *row = x + i * rs;
        float amax = 0.0f;
        for (rd_int p = 0; p < k; p++) {
            const float a = fabsf(rd_bf16_to_float(row[p * cs]));
            amax = a > amax || a != a ? a : amax;
        }
        const float s = amax / 127.5f;
        out[i] = s == 0.0f ? 1.0f : s;
    }
}

int
rd_row_scales(const void *x, rd_dtype_t dtype, rd_int m, rd_int k, rd_int rs, rd_int cs, float *out)
{
    if (dtype == RD_F32)
        rd_row_scales_s((const float *)x, m, k, rs, cs, out);
    else if (dtype == RD_BF16)
        rd_row_scales_b((const uint16_t *)x, m, k, rs, cs, out);
    else
        return -1;
    return 0;
}

/* [compute type][storage dtype][A, B] */
static const rd_pack_t rd_pack_table[RD_CT_COUNT][RD_DTYPE_COUNT][2] = {
    [RD_CT_F32] = {
        [RD_F32] = {rd_pack_s_s_pack, rd_pack_s_s_pack},
        [RD_F16] = {rd_pack_h_s_pack, rd_pack_h_s_pack},
        [RD_BF16] = {rd_pack_b_s_pack, rd_pack_b_s_pack},
        [RD_F32_AS_BF16] = {rd_pack_r_s_pack, rd_pack_r_s_pack},
    },
    [RD_CT_F64] = {
        [RD_F32] = {rd_pack_s_d_pack, rd_pack_s_d_pack},
        [RD_F64] = {rd_pack_d_d_pack, rd_pack_d_d_pack},
        [RD_F16] = {rd_pack_h_d_pack, rd_pack_h_d_pack},
        [RD_BF16] = {rd_pack_b_d_pack, rd_pack_b_d_pack},
    },
    [RD_CT_F32_BF16W] = {
        [RD_F32] = {rd_pack_s_s_pack, NULL},
        [RD_F16] = {rd_pack_h_s_pack, NULL},
        [RD_BF16] = {rd_pack_b_s_pack, rd_pack_b_bi_pack},
    },
    [RD_CT_F32_F16W] = {
        [RD_F32] = {rd_pack_s_s_pack, NULL},
        [RD_F16] = {rd_pack_h_s_pack, rd_pack_h_h_pack},
        [RD_BF16] = {rd_pack_b_s_pack, NULL},
    },
    [RD_CT_F32_I8W] = {
        [RD_F32] = {rd_pack_s_s_pack, NULL},
        [RD_F16] = {rd_pack_h_s_pack, NULL},
        [RD_BF16] = {rd_pack_b_s_pack, NULL},
        [RD_I8] = {NULL, rd_pack_c_c_pack},
    },
    [RD_CT_F32_F8W] = {
        [RD_F32] = {rd_pack_s_s_pack, NULL},
        [RD_F16] = {rd_pack_h_s_pack, NULL},
        [RD_BF16] = {rd_pack_b_s_pack, NULL},
        [RD_F8E4M3] = {NULL, rd_pack_c_c_pack},
    },
    [RD_CT_BF16DP] = {
        [RD_BF16] = {rd_pack_b_p_pack, rd_pack_b_p_pack},
        [RD_F32_AS_BF16] = {rd_pack_r_p_pack, rd_pack_r_p_pack},
    },
};

rd_pack_t
rd_packer(rd_ctype_t ct, rd_dtype_t src, int which)
{
    if ((unsigned)ct >= RD_CT_COUNT || (unsigned)src >= RD_DTYPE_COUNT || (which != 0 && which != 1))
        return NULL;
#ifdef RD_PACK_F16C
    /* float16 widened to float32 panels: with F16C where the CPU has it */
    static const rd_pack_t f16c[RD_CT_COUNT][2] = {
        [RD_CT_F32] = {rd_pack_h_s_f16c_pack, rd_pack_h_s_f16c_pack},
        [RD_CT_F32_BF16W] = {rd_pack_h_s_f16c_pack, NULL},
        [RD_CT_F32_F16W] = {rd_pack_h_s_f16c_pack, NULL},
        [RD_CT_F32_I8W] = {rd_pack_h_s_f16c_pack, NULL},
        [RD_CT_F32_F8W] = {rd_pack_h_s_f16c_pack, NULL},
    };
    if (src == RD_F16 && f16c[ct][which] != NULL) {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx"))
            return f16c[ct][which];
    }
#endif
    return rd_pack_table[ct][src][which];
}

/* [compute type][storage dtype][A, B] of quantized operands */
static const rd_qpack_t rd_qpack_table[RD_CT_COUNT][RD_DTYPE_COUNT][2] = {
    [RD_CT_F32] = {
        [RD_I8] = {rd_pack_i8_s_qpack, rd_pack_i8_s_qpack},
        [RD_F8E4M3] = {rd_pack_f8_s_qpack, rd_pack_f8_s_qpack},
    },
    [RD_CT_F64] = {
        [RD_I8] = {rd_pack_i8_d_qpack, rd_pack_i8_d_qpack},
        [RD_F8E4M3] = {rd_pack_f8_d_qpack, rd_pack_f8_d_qpack},
    },
    [RD_CT_I8I32] = {
        [RD_I8] = {rd_pack_i8_i16_qpack, rd_pack_i8_i16_qpack},
    },
    [RD_CT_U8S8] = {
        [RD_I8] = {rd_pack_i8_u8_qpack, rd_pack_i8_s8_qpack},
        /* float rows with their per-row scales: quantized while packed */
        [RD_F32] = {rd_pack_s_q8_qpack, NULL},
        [RD_BF16] = {rd_pack_b_q8_qpack, NULL},
    },
};

rd_qpack_t
rd_qpacker(rd_ctype_t ct, rd_dtype_t src, int which)
{
    if ((unsigned)ct >= RD_CT_COUNT || (unsigned)src >= RD_DTYPE_COUNT || (which != 0 && which != 1))
        return NULL;
    return rd_qpack_table[ct][src][which];
}
