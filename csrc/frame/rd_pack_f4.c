/*
 * Packing of 4-bit float operands (RD_F4E2M1: float4_e2m1fn codes two a
 * byte, addressed in nibbles, rd_kernel.h): dequantized while packed into
 * float32 / float64 panels (any scales) and into the bfloat16 k-pairs of the
 * bfloat16 dot products (power-of-two scales, whose products with e2m1
 * values bfloat16 holds exactly), and kept as they are, 4 bits a value, in
 * the panels of prepacked weights (RD_CT_F32_F4W).  The tables of
 * frame/rd_pack.c bind them.
 */
#include "rd_frame.h"
#include "rd_half.h"
#include "rd_pack_int.h"

#include <stdint.h>
#include <string.h>

/* The code at nibble address `at` (twice the byte address, plus 1 for the
 * high nibble). */
static inline unsigned
rd_f4_code(uintptr_t at)
{
    const uint8_t byte = *(const uint8_t *)(at >> 1);
    return (unsigned)(byte >> ((at & 1u) << 2)) & 0xfu;
}

/* The value at element offset i of the nibble-addressed x. */
static inline float
rd_f4_at(const void *x, rd_int i)
{
    return rd_e2m1_values[rd_f4_code((uintptr_t)x + (uintptr_t)i)];
}

/* dequantized while packed: (value - z) * s into float32 / float64 panels */
#define RD_SRC uint8_t
#define RD_DST float
#define RD_CVT(v) ((float)(v))
#define RD_LOAD(x, i) rd_f4_at((x), (i))
#define RD_FN(x) rd_f4_s_##x
#include "rd_pack_qimpl.h"

#define RD_SRC uint8_t
#define RD_DST double
#define RD_CVT(v) ((double)(v))
#define RD_LOAD(x, i) ((double)rd_f4_at((x), (i)))
#define RD_FN(x) rd_f4_d_##x
#include "rd_pack_qimpl.h"

void
rd_pack_f4_s_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                   const rd_qblock_t *qb)
{
    rd_f4_s_qpack(rows, depth, src, rs, cs, r, dst, qb);
}

void
rd_pack_f4_d_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                   const rd_qblock_t *qb)
{
    rd_f4_d_qpack(rows, depth, src, rs, cs, r, dst, qb);
}

/*
 * bfloat16 in blocks of `unit` steps: k-pairs (unit 2, RD_CT_BF16DP's
 * layout, which the tile type reads too) or quads (4, RD_CT_BF16MMA's):
 * X[i][p] = value * s of its tile, computed in float32 (exact: a value of
 * at most 2 significant bits times a power of two) and rounded to bfloat16
 * (exact as well, unless the scale over- or underflows: then the value the
 * dequantized bfloat16 array holds), at dst[(p/unit)*unit*r + unit*i +
 * p%unit], depth padded to a multiple of unit and rows past `rows` with
 * zeros.  Zero points are not taken (the callers never pass them).
 */
static void
rd_pack_f4_units(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst_,
                 const rd_qblock_t *qb, int unit)
{
    const float *scale = (const float *)qb->s;
    const rd_int kp = (depth + unit - 1) / unit * unit;
    uint16_t *restrict dst = (uint16_t *)dst_;
    for (rd_int i0 = 0; i0 < rows; i0 += r) {
        const rd_int have = rows - i0 < r ? rows - i0 : r;
        memset(dst, 0, (size_t)r * (size_t)kp * sizeof(uint16_t));
        for (rd_int i = 0; i < have; i++) {
            const uintptr_t x = (uintptr_t)src + (uintptr_t)((i0 + i) * rs);
            const float *s = scale + (qb->i0 + i0 + i) / qb->tr * qb->rs;
            uint16_t *col = dst + (rd_int)unit * i;
            for (rd_int p = 0; p < depth; p++) {
                const float sc = s[(qb->p0 + p) / qb->tp * qb->ps];
                const float v = rd_e2m1_values[rd_f4_code(x + (uintptr_t)(p * cs))] * sc;
                col[p / unit * unit * r + p % unit] = rd_float_to_bf16(v);
            }
        }
        dst += (rd_int)r * kp;
    }
}

void
rd_pack_f4_p_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                   const rd_qblock_t *qb)
{
    rd_pack_f4_units(rows, depth, src, rs, cs, r, dst, qb, 2);
}

/* (the blocks of 4 steps of RD_CT_BF16MMA) */
void
rd_pack_f4_q4_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                    const rd_qblock_t *qb)
{
    rd_pack_f4_units(rows, depth, src, rs, cs, r, dst, qb, 4);
}

/*
 * The 4-bit panels of prepacked weights (RD_CT_F32_F4W, RD_CT_F32_I4W),
 * codes as they are: row i of step p of an r-row micro-panel (r even) in the
 * low nibble of byte p*r/2 + i for i < r/2, in the high nibble of byte
 * p*r/2 + i - r/2 otherwise; rows past `rows` hold code 0 (+0, or 0).
 * Panels of r*depth/2 bytes one after the other (rd_prepack writes a
 * trailer after each).  The codes of float4_e2m1fn operands (addressed in
 * nibbles), or the low 4 bits of int4 values held in int8.
 */
/* The 4-bit code at element offset `at` of src: of a float4_e2m1fn operand
 * (addressed in nibbles), or the low 4 bits of an int4 value held in int8. */
static inline unsigned
rd_nibble_code(const void *src, int int4, rd_int at)
{
    return int4 ? (uint8_t)((const int8_t *)src)[at] & 0x0fu : rd_f4_code((uintptr_t)src + (uintptr_t)at);
}

static void
rd_pack_nibbles(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst_, int int4)
{
    uint8_t *restrict dst = (uint8_t *)dst_;
    const int h = r / 2;
    for (rd_int i0 = 0; i0 < rows; i0 += r) {
        const rd_int have = rows - i0 < r ? rows - i0 : r;
        memset(dst, 0, (size_t)h * (size_t)depth);
        for (rd_int i = 0; i < have; i++) {
            const int shift = i < h ? 0 : 4;
            uint8_t *col = dst + (i < h ? i : i - h);
            for (rd_int p = 0; p < depth; p++)
                col[p * h] |= (uint8_t)(rd_nibble_code(src, int4, (i0 + i) * rs + p * cs) << shift);
        }
        dst += (rd_int)h * depth;
    }
}

void
rd_pack_f4_f4_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst)
{
    rd_pack_nibbles(rows, depth, src, rs, cs, r, dst, 0);
}

void
rd_pack_i4_i4_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst)
{
    rd_pack_nibbles(rows, depth, src, rs, cs, r, dst, 1);
}

/*
 * The 4-bit k-quads of the w4a8 types (RD_CT_U8S8_I4, RD_CT_U8S8_F4; the
 * layout is rd_kernel.h's): per r-row micro-panel (r even), each quad q of
 * the depth 2r bytes, byte t holding row t/4's code of step 4q + t%4 in its
 * low nibble and row r/2 + t/4's in its high nibble (padding steps and rows
 * code 0); then the rd_qtrailer_t of the block's runs within the scale
 * tiles along the depth, and per run one scale a row: a float (int4,
 * RD_QRUN), or the e8m0 exponent byte of the power-of-two scale
 * (float4_e2m1fn, RD_F4RUN).  Padding rows get scale 0 (exponent 0).  The
 * codes of float4_e2m1fn operands (addressed in nibbles), or the low 4
 * bits of int4 values.
 */
static void
rd_pack_w4a8(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst_,
             const rd_qblock_t *qb, int int4)
{
    uint8_t *dst = (uint8_t *)dst_;
    const int h = r / 2;
    const rd_int kq = (depth + 3) / 4 * 4;
    const float *scale = (const float *)qb->s;
    const rd_int first = qb->tp - qb->p0 % qb->tp;
    const rd_qtrailer_t head = {(int)(first < depth ? first : depth), (int)(qb->tp < depth ? qb->tp : depth), 0, 0};
    const rd_int runs = rd_qruns(head.first, head.tile, depth);
    const size_t trailer = int4 ? RD_QRUN(runs, r, 0) : RD_F4RUN(runs, r);
    for (rd_int i0 = 0; i0 < rows; i0 += r) {
        const rd_int have = rows - i0 < r ? rows - i0 : r;
        memset(dst, 0, (size_t)h * (size_t)kq);
        for (rd_int i = 0; i < have; i++) {
            const int shift = i < h ? 0 : 4;
            uint8_t *col = dst + 4 * (i < h ? i : i - h);
            for (rd_int p = 0; p < depth; p++)
                col[p / 4 * 2 * r + p % 4] |= (uint8_t)(rd_nibble_code(src, int4, (i0 + i) * rs + p * cs) << shift);
        }
        uint8_t *tr = dst + (rd_int)h * kq;
        memcpy(tr, &head, sizeof head);
        for (rd_int run = 0; run < runs; run++) {
            /* the tile along the depth of the run's first step */
            const rd_int t = (qb->p0 + rd_qrun_start(&head, run)) / qb->tp;
            for (rd_int i = 0; i < r; i++) {
                const float s = i < have ? scale[(qb->i0 + i0 + i) / qb->tr * qb->rs + t * qb->ps] : 0.0f;
                if (int4)
                    memcpy(tr + RD_QRUN(run, r, 0) + 4 * (size_t)i, &s, sizeof s);
                else
                    tr[RD_F4RUN(run, r) + (size_t)i] = (uint8_t)rd_float_to_e8m0(s);
            }
        }
        dst += (rd_int)h * kq + (rd_int)trailer;
    }
}

void
rd_pack_i8_w4_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                    const rd_qblock_t *qb)
{
    rd_pack_w4a8(rows, depth, src, rs, cs, r, dst, qb, 1);
}

void
rd_pack_f4_w4_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                    const rd_qblock_t *qb)
{
    rd_pack_w4a8(rows, depth, src, rs, cs, r, dst, qb, 0);
}
