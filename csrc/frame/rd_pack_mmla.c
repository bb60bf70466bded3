/*
 * The operands of Arm's matrix-multiply-accumulate types (rd_kernel.h:
 * RD_CT_U8S8MMA, RD_CT_BF16MMA), A and B alike (B packed as its
 * transpose): blocks of `unit` steps of the contraction (8 int8, 4
 * bfloat16), each row's values of a block contiguous, so that one 16-byte
 * load holds the 2 x 8 (or 2 x 4) block of two rows that an MMLA
 * instruction multiplies.  X[i][p] of an r-row micro-panel at
 * panel[(p/unit)*unit*r + unit*i + p%unit]; the depth padded with zeros to a
 * multiple of unit; rows past `rows` zero.
 */
#include "rd_pack_int.h"
#include "rd_half.h"

#include <stdint.h>
#include <string.h>

/* int8 values in blocks of 8, plus `flip` (0x80: + 128, A's bytes, read
 * unsigned; 0: B's), each micro-panel followed by the trailer of
 * RD_CT_U8S8 (sums, scales, zero points of the block's scale tile);
 * padding bytes 0. */
static void
rd_pack_i8_octets(rd_int rows, rd_int depth, const void *src_, rd_int rs, rd_int cs, int r, void *dst_,
                  const rd_qblock_t *qb, uint8_t flip)
{
    const int8_t *src = (const int8_t *)src_;
    uint8_t *dst = (uint8_t *)dst_;
    const rd_int k8 = (depth + 7) / 8 * 8;
    int32_t sums[128];   /* r <= 128: every register block here is far smaller */
    for (rd_int i0 = 0; i0 < rows; i0 += r) {
        const rd_int have = rows - i0 < r ? rows - i0 : r;
        memset(dst, 0, (size_t)r * (size_t)k8);
        for (rd_int i = 0; i < have; i++) {
            const int8_t *x = src + (i0 + i) * rs;
            uint8_t *d = dst + 8 * i;
            int32_t acc = 0;
            for (rd_int p = 0; p < depth; p++) {
                const int8_t v = x[p * cs];
                acc += v;
                d[(p / 8) * 8 * r + p % 8] = (uint8_t)((uint8_t)v ^ flip);
            }
            sums[i] = acc;
        }
        rd_quads_trailer(dst, k8, r, have, i0, sums, qb);
        dst += (rd_int)r * k8 + 12 * (rd_int)r;
    }
}

void
rd_pack_i8_uo_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                    const rd_qblock_t *qb)
{
    rd_pack_i8_octets(rows, depth, src, rs, cs, r, dst, qb, 0x80);
}

void
rd_pack_i8_so_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                    const rd_qblock_t *qb)
{
    rd_pack_i8_octets(rows, depth, src, rs, cs, r, dst, qb, 0);
}

/* bfloat16 values in blocks of 4: RD_CVT(src value) gives the bfloat16
 * bits of a stored value (as they are, or float32 rounded to nearest even,
 * NaNs quiet: the BF16_BF16_F32 preset). */
#define RD_QUADS_PACK(NAME, SRC, CVT)                                        \
void                                                                        \
NAME(rd_int rows, rd_int depth, const void *src_, rd_int rs, rd_int cs, int r, void *dst_) \
{                                                                           \
    const SRC *src = (const SRC *)src_;                                     \
    uint16_t *dst = (uint16_t *)dst_;                                       \
    const rd_int k4 = (depth + 3) / 4 * 4;                                  \
    for (rd_int i0 = 0; i0 < rows; i0 += r) {                               \
        const rd_int have = rows - i0 < r ? rows - i0 : r;                  \
        memset(dst, 0, (size_t)r * (size_t)k4 * sizeof(uint16_t));          \
        for (rd_int i = 0; i < have; i++) {                                 \
            const SRC *x = src + (i0 + i) * rs;                             \
            uint16_t *d = dst + 4 * i;                                      \
            rd_int p = 0;                                                   \
            if (cs == 1)   /* a row's steps contiguous: four at a time */   \
                for (; p + 4 <= depth; p += 4) {                            \
                    uint16_t *q = d + p * r;                                \
                    q[0] = CVT(x[p]);                                       \
                    q[1] = CVT(x[p + 1]);                                   \
                    q[2] = CVT(x[p + 2]);                                   \
                    q[3] = CVT(x[p + 3]);                                   \
                }                                                           \
            for (; p < depth; p++)                                          \
                d[(p / 4) * 4 * r + p % 4] = CVT(x[p * cs]);                \
        }                                                                   \
        dst += (rd_int)r * k4;                                              \
    }                                                                       \
}

#define RD_AS_IS(v) (v)
RD_QUADS_PACK(rd_pack_b_q4_pack, uint16_t, RD_AS_IS)
RD_QUADS_PACK(rd_pack_r_q4_pack, float, rd_float_to_bf16)
