/*
 * What the packing files share (frame/rd_pack.c binds the routines in its
 * tables; frame/rd_pack_dot.c holds those of the dot-product compute
 * types and the register transpose both use).  Internal to frame/.
 */
#ifndef RD_PACK_INT_H
#define RD_PACK_INT_H

#include "rd_frame.h"

#include <stdint.h>

/* Each packing routine is compiled for the baseline instruction set and
 * again for AVX2 and AVX-512, and the loader binds the widest the CPU runs
 * (RD_WIDEST_CLONES): the conversions (16-bit floats widened, runs copied)
 * then move 8 or 16 values per instruction instead of 4.  Same arithmetic
 * in every clone: conversions are exact, so the results do not depend on
 * the clone. */
#define RD_PACK_CLONES RD_WIDEST_CLONES
#if defined(RD_HAVE_X86_KERNELS)
#define RD_PACK_F16C 1
#endif

/* Eight rows of `depth` contiguous 4-byte values (rows rs_bytes apart)
 * written transposed: dst[p*ld + i] (4-byte elements) = row i's value p. */
void rd_pack_words8(const char *src, rd_int rs_bytes, rd_int depth, char *dst, int ld);

/* The packing routines of the dot-product compute types (rd_kernel.h):
 * bfloat16 k-pairs from bfloat16 (b_p) and from float32 rounded (r_p);
 * int8 k-quads of quantized int8 operands, A shifted by 128 (i8_u8) and B
 * (i8_s8); float32 / bfloat16 rows quantized to int8 k-quads while packed
 * (s_q8, b_q8, with the scales of rd_row_scales). */
void rd_pack_b_p_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst);
void rd_pack_r_p_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst);
void rd_pack_i8_u8_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                         const rd_qblock_t *qb);
void rd_pack_i8_s8_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                         const rd_qblock_t *qb);
void rd_pack_s_q8_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                        const rd_qblock_t *qb);
void rd_pack_b_q8_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                        const rd_qblock_t *qb);
/* rows x depth float32 (bf16 0) or bfloat16 (1) values quantized to int8
 * per row while packed into panels of r rows, in blocks of `unit` steps (4:
 * RD_CT_U8S8's k-quads; 8: RD_CT_U8S8MMA's), frame/rd_pack_q8.c. */
void rd_pack_q8(rd_int rows, rd_int depth, const void *src, int bf16, rd_int rs, rd_int cs, int r, void *dst_,
                const rd_qblock_t *qb, int unit);

/* The 4-bit k-quads of the w4a8 types' B (RD_CT_U8S8_I4, RD_CT_U8S8_F4),
 * with a trailer of runs of scales, from int4 values held in int8 (i8_w4)
 * or float4_e2m1fn codes (f4_w4), frame/rd_pack_f4.c; their A is
 * RD_CT_U8S8's. */
void rd_pack_i8_w4_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                         const rd_qblock_t *qb);
void rd_pack_f4_w4_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                         const rd_qblock_t *qb);

/* The A operands of the tile types, row after row (frame/rd_pack_dot.c):
 * bfloat16 from bfloat16 (b_t) and from float32 rounded (r_t); int8 + 128
 * with each row's trailer (i8_ut); float32 / bfloat16 rows quantized to
 * int8 while packed (s_qt, b_qt). */
void rd_pack_b_t_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst);
void rd_pack_r_t_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst);
void rd_pack_i8_ut_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                         const rd_qblock_t *qb);
void rd_pack_s_qt_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                        const rd_qblock_t *qb);
void rd_pack_b_qt_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                        const rd_qblock_t *qb);

/* The trailer of an int8 k-quad (or k-octet) micro-panel of `kq` steps:
 * the sums, scales and zero points of its `have` rows (frame/rd_pack_dot.c). */
void rd_quads_trailer(uint8_t *panel, rd_int kq, int r, rd_int have, rd_int row0, const int32_t *sums,
                      const rd_qblock_t *qb);

/* The operands of the MMLA types (frame/rd_pack_mmla.c): int8 in blocks
 * of 8 steps with each micro-panel's trailer, + 128 (A: i8_uo) or as they
 * are (B: i8_so); float32 / bfloat16 rows quantized to int8 while packed,
 * in those blocks (s_qo, b_qo: frame/rd_pack_dot.c); bfloat16 in blocks of
 * 4 steps, from bfloat16 (b_q4) and from float32 rounded (r_q4), and 4-bit
 * weights dequantized (f4_q4: frame/rd_pack_f4.c). */
void rd_pack_i8_uo_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                         const rd_qblock_t *qb);
void rd_pack_i8_so_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                         const rd_qblock_t *qb);
void rd_pack_f4_q4_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                         const rd_qblock_t *qb);
void rd_pack_s_qo_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                        const rd_qblock_t *qb);
void rd_pack_b_qo_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                        const rd_qblock_t *qb);
void rd_pack_b_q4_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst);
void rd_pack_r_q4_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst);

/* 4-bit float operands (frame/rd_pack_f4.c): dequantized into float32 (s),
 * float64 (d) or bfloat16 k-pairs (p, power-of-two scales), and the 4-bit
 * panels of prepacked weights (f4, RD_CT_F32_F4W). */
void rd_pack_f4_s_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                        const rd_qblock_t *qb);
void rd_pack_f4_d_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                        const rd_qblock_t *qb);
void rd_pack_f4_p_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                        const rd_qblock_t *qb);
void rd_pack_f4_f4_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst);
/* int4 values held in int8 into the same nibble panels (RD_CT_F32_I4W): the
 * low 4 bits of each (values in [-8, 7], checked by the caller). */
void rd_pack_i4_i4_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst);

#endif /* RD_PACK_INT_H */
