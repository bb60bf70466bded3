/*
 * Packing: where the operands' storage dtypes become the packed element
 * types of a compute type, and where their strides (transposed, negative,
 * broadcast) are resolved, so that the micro-kernels see nothing but
 * contiguous panels.  The tables below say which routine packs what; the
 * routines of the dot-product compute types (bfloat16 k-pairs, int8
 * k-quads) live in frame/rd_pack_dot.c.
 */
#include "rd_frame.h"

/* Keep gcc from turning the short fixed-width copies into calls to memmove. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif

#include <stdint.h>
#include <string.h>

#include "rd_pack_int.h"

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
#define RD_WORDS8 rd_pack_words8
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
    [RD_CT_BF16TILE] = {
        [RD_BF16] = {rd_pack_b_t_pack, rd_pack_b_p_pack},
        [RD_F32_AS_BF16] = {rd_pack_r_t_pack, rd_pack_r_p_pack},
    },
    [RD_CT_BF16MMA] = {
        [RD_BF16] = {rd_pack_b_q4_pack, rd_pack_b_q4_pack},
        [RD_F32_AS_BF16] = {rd_pack_r_q4_pack, rd_pack_r_q4_pack},
    },
    [RD_CT_F32_F4W] = {
        [RD_F32] = {rd_pack_s_s_pack, NULL},
        [RD_F16] = {rd_pack_h_s_pack, NULL},
        [RD_BF16] = {rd_pack_b_s_pack, NULL},
        [RD_F4E2M1] = {NULL, rd_pack_f4_f4_pack},
    },
    [RD_CT_F32_I4W] = {
        [RD_F32] = {rd_pack_s_s_pack, NULL},
        [RD_F16] = {rd_pack_h_s_pack, NULL},
        [RD_BF16] = {rd_pack_b_s_pack, NULL},
        [RD_I8] = {NULL, rd_pack_i4_i4_pack},
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
        [RD_CT_F32_F4W] = {rd_pack_h_s_f16c_pack, NULL},
        [RD_CT_F32_I4W] = {rd_pack_h_s_f16c_pack, NULL},
    };
    if (src == RD_F16 && f16c[ct][which] != NULL) {
        if (rd_cpu()->f16c)
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
        [RD_F4E2M1] = {rd_pack_f4_s_qpack, rd_pack_f4_s_qpack},
    },
    [RD_CT_F64] = {
        [RD_I8] = {rd_pack_i8_d_qpack, rd_pack_i8_d_qpack},
        [RD_F8E4M3] = {rd_pack_f8_d_qpack, rd_pack_f8_d_qpack},
        [RD_F4E2M1] = {rd_pack_f4_d_qpack, rd_pack_f4_d_qpack},
    },
    /* 4-bit weights with power-of-two scales for a bfloat16 lhs: the
     * bfloat16 k-pairs of their dequantized values (exact) */
    [RD_CT_BF16DP] = {
        [RD_F4E2M1] = {NULL, rd_pack_f4_p_qpack},
    },
    [RD_CT_BF16TILE] = {
        [RD_F4E2M1] = {NULL, rd_pack_f4_p_qpack},
    },
    [RD_CT_BF16MMA] = {
        [RD_F4E2M1] = {NULL, rd_pack_f4_q4_qpack},
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
    [RD_CT_U8S8TILE] = {
        [RD_I8] = {rd_pack_i8_ut_qpack, rd_pack_i8_s8_qpack},
        [RD_F32] = {rd_pack_s_qt_qpack, NULL},
        [RD_BF16] = {rd_pack_b_qt_qpack, NULL},
    },
    /* w4a8: A as int8-dot's, B prepacked only (its 4-bit k-quads) */
    [RD_CT_U8S8_I4] = {
        [RD_I8] = {rd_pack_i8_u8_qpack, rd_pack_i8_w4_qpack},
        [RD_F32] = {rd_pack_s_q8_qpack, NULL},
        [RD_BF16] = {rd_pack_b_q8_qpack, NULL},
    },
    [RD_CT_U8S8_F4] = {
        [RD_I8] = {rd_pack_i8_u8_qpack, NULL},
        [RD_F32] = {rd_pack_s_q8_qpack, NULL},
        [RD_BF16] = {rd_pack_b_q8_qpack, NULL},
        [RD_F4E2M1] = {NULL, rd_pack_f4_w4_qpack},
    },
    [RD_CT_U8S8MMA] = {
        [RD_I8] = {rd_pack_i8_uo_qpack, rd_pack_i8_so_qpack},
        [RD_F32] = {rd_pack_s_qo_qpack, NULL},
        [RD_BF16] = {rd_pack_b_qo_qpack, NULL},
    },
};

rd_qpack_t
rd_qpacker(rd_ctype_t ct, rd_dtype_t src, int which)
{
    if ((unsigned)ct >= RD_CT_COUNT || (unsigned)src >= RD_DTYPE_COUNT || (which != 0 && which != 1))
        return NULL;
    return rd_qpack_table[ct][src][which];
}
