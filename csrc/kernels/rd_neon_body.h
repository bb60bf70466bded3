/*
 * The shape shared by the NEON micro-kernels (kernels/rd_neon.c,
 * kernels/rd_neon_dot.c): a 12-row x 8-column block of float32 (or int32)
 * accumulators, 24 of the 32 vector registers, two of 4 columns a row; A's
 * 12 rows arrive as three vectors (rows 0-3, 4-7, 8-11) and each row's
 * value is taken by lane (fmla by element, or a dot product by element),
 * B's 8 columns as two vectors.  Row bodies for 4, 8 and 12 valid rows of a
 * 12-row panel (the last rows of a small group run only their own
 * products), and the stores of a finished tile: whole rows, or the valid
 * corner through a spill.  Included by the kernel files; the element
 * macros are defined around each instantiation.
 */
#ifndef RD_NEON_BODY_H
#define RD_NEON_BODY_H

#include "rd_kernel.h"

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

/* Rows as (index, A register, lane). */
#define NROWS4(X) X(0, a0, 0) X(1, a0, 1) X(2, a0, 2) X(3, a0, 3)
#define NROWS8(X) NROWS4(X) X(4, a1, 0) X(5, a1, 1) X(6, a1, 2) X(7, a1, 3)
#define NROWS12(X) NROWS8(X) X(8, a2, 0) X(9, a2, 1) X(10, a2, 2) X(11, a2, 3)
/* The A registers a body of R rows loads (12 floats or pairs or quads a
 * step, 4 rows a register): A_LOAD(reg, offset in A's elements of 4 rows). */
#define NLOAD_A4(A_LOAD) A_LOAD(a0, 0)
#define NLOAD_A8(A_LOAD) A_LOAD(a0, 0) A_LOAD(a1, 1)
#define NLOAD_A12(A_LOAD) A_LOAD(a0, 0) A_LOAD(a1, 1) A_LOAD(a2, 2)

/* A float32 row of the tile into C: stored, or added to C's values. */
static inline void
rd_neon_put_row(float *c, float32x4_t lo, float32x4_t hi, int mode)
{
    if (mode == RD_ADD) {
        lo = vaddq_f32(vld1q_f32(c), lo);
        hi = vaddq_f32(vld1q_f32(c + 4), hi);
    }
    vst1q_f32(c, lo);
    vst1q_f32(c + 4, hi);
}

#define NPUT(i, A, L) rd_neon_put_row(c + (i) * rs_c, c##i##0, c##i##1, mode);
#define NSPILL(i, A, L)                                                     \
    vst1q_f32(buf + (i) * 8, c##i##0);                                      \
    vst1q_f32(buf + (i) * 8 + 4, c##i##1);

/* The float32 tile's store: whole rows when the tile is full and C's
 * columns contiguous, else the valid corner of a spill.  (NEON has no
 * cache-bypassing store that pays here: RD_STREAM stores plainly.) */
#define RD_NEON_LEAVE(R, ROWS)                                              \
    if (m == (R) && n == 8 && cs_c == 1) {                                  \
        ROWS(NPUT)                                                          \
        return;                                                             \
    }                                                                       \
    float buf[(R) * 8];                                                     \
    ROWS(NSPILL)                                                            \
    rd_s_store_edge(buf, 8, c, rs_c, cs_c, m, n, mode == RD_ADD ? RD_ADD : RD_STORE);

/* The decoding of 4-bit panels (kernels/rd_neon.c, rd_neon_few.c): a
 * step's 4 bytes hold columns 0-3 in their low nibbles and 4-7 in their
 * high ones (vshl by rd_nibble_shift and a mask set them apart); every e2m1
 * value's float32 bits are 0 below the top 16, whose low and high bytes two
 * 16-entry tables give (tbl). */
static const uint8_t rd_e2m1_lo[16] = {0x00, 0x00, 0x80, 0xc0, 0x00, 0x40, 0x80, 0xc0,
                                       0x00, 0x00, 0x80, 0xc0, 0x00, 0x40, 0x80, 0xc0};
static const uint8_t rd_e2m1_hi[16] = {0x00, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40,
                                       0x80, 0xbf, 0xbf, 0xbf, 0xc0, 0xc0, 0xc0, 0xc0};
static const int8_t rd_nibble_shift[8] = {0, 0, 0, 0, -4, -4, -4, -4};

/* e8m0 exponents (8 bytes) to float32 scales 2^(e - 127) (e 0: 2^-127). */
static inline void
rd_neon_e8m0(const uint8_t *e, float32x4_t *s0, float32x4_t *s1)
{
    const uint16x8_t e16 = vmovl_u8(vld1_u8(e));
    const uint32x4_t lo = vmovl_u16(vget_low_u16(e16)), hi = vmovl_high_u16(e16);
    const uint32x4_t sub = vdupq_n_u32(0x00400000u);
    *s0 = vreinterpretq_f32_u32(vbslq_u32(vceqzq_u32(lo), sub, vshlq_n_u32(lo, 23)));
    *s1 = vreinterpretq_f32_u32(vbslq_u32(vceqzq_u32(hi), sub, vshlq_n_u32(hi, 23)));
}

/* 4 columns of a row of C (cols of them valid), stored or added: whole
 * where contiguous, else column by column (the few-row kernels' edge) */
static inline __attribute__((always_inline)) void
rd_neon_put4(float32x4_t v, float *c, rd_int cs_c, rd_int cols, int mode)
{
    if (cols <= 0)
        return;
    if (cols >= 4 && cs_c == 1) {
        vst1q_f32(c, mode == RD_ADD ? vaddq_f32(vld1q_f32(c), v) : v);
        return;
    }
    float t[4];
    vst1q_f32(t, v);
    for (rd_int j = 0; j < cols && j < 4; j++) {
        if (mode == RD_ADD)
            c[j * cs_c] += t[j];
        else
            c[j * cs_c] = t[j];
    }
}

/* Dispatch on the number of valid rows. */
#define RD_NEON_KERNEL(NAME, TA, TB, BODY4, BODY8, BODY12)                  \
static void                                                                 \
NAME(rd_int kc, const void *a_, const void *b_, void *c_, rd_int rs_c,      \
     rd_int cs_c, int m, int n, int mode)                                   \
{                                                                           \
    const TA *a = (const TA *)a_;                                           \
    const TB *b = (const TB *)b_;                                           \
    float *c = (float *)c_;                                                 \
    if (m > 8)                                                              \
        BODY12(kc, a, b, c, rs_c, cs_c, m, n, mode);                        \
    else if (m > 4)                                                         \
        BODY8(kc, a, b, c, rs_c, cs_c, m, n, mode);                         \
    else                                                                    \
        BODY4(kc, a, b, c, rs_c, cs_c, m, n, mode);                         \
}

#endif /* RD_NEON_BODY_H */
