/*
 * The layout of prepacked weights, shared by the driver that reads it
 * (frame/rd_driver.c) and the prepacking that writes it
 * (frame/rd_prepack.c), and the small helpers both use.  Internal to
 * frame/.
 */
#ifndef RD_PLAYOUT_H
#define RD_PLAYOUT_H

#include "rd_frame.h"

static inline rd_int
rd_round_up(rd_int x, rd_int unit)
{
    return (x + unit - 1) / unit * unit;
}

/* A strided operand moved by (i, j) elements along (rows, columns). */
static inline const void *
rd_at(const void *p, size_t size, rd_int i, rd_int rs, rd_int j, rd_int cs)
{
    return (const char *)p + (i * rs + j * cs) * (rd_int)size;
}

/* The prepacked layout of one group's weights (rd_prepack): KC blocks of
 * `panels` micro-panels NR wide, each followed, for quantized weights
 * (qtile > 0), by its trailer (rd_kernel.h); for a compute type whose
 * panels carry a row of scales a column (scale_size > 0, RD_CT_U8S8), each
 * block also ends at the next scale tile boundary along k, and each panel
 * is followed by that row, as packing B per call makes it. */
typedef struct {
    rd_int KC, NR, panels, k_unit;
    size_t b_size;
    rd_int qtile;
    int qzp;
    size_t scale_size;  /* bytes a column of B's row of scales (rd_b_scale_size) */
    int nibbles;        /* 4-bit panels (RD_CT_F32_F4W, RD_CT_F32_I4W): NR/2
                           bytes a step */
    int e8m0;           /* ... with one exponent byte a column per run after
                           them (rd_ctype_e8m0), else RD_QRUN's trailer */
} rd_playout_t;

/* The trailer of the block at pc, kc deep: the block's runs within the
 * scale tiles along k. */
static inline rd_qtrailer_t
rd_ptrailer(const rd_playout_t *L, rd_int pc, rd_int kc)
{
    const rd_int first = L->qtile - pc % L->qtile;
    rd_qtrailer_t h = {(int)(first < kc ? first : kc), (int)(L->qtile < kc ? L->qtile : kc), L->qzp, 0};
    return h;
}

/* Bytes of one micro-panel of the block at pc, kc deep (values, trailer). */
static inline size_t
rd_ppanel_bytes(const rd_playout_t *L, rd_int pc, rd_int kc)
{
    if (L->nibbles) {   /* (w4a8 too: its k-quads, the same trailers) */
        const rd_qtrailer_t h = rd_ptrailer(L, pc, kc);
        const rd_int runs = rd_qruns(h.first, h.tile, kc);
        return (size_t)L->NR / 2 * (size_t)rd_round_up(kc, L->k_unit)
               + (L->e8m0 ? RD_F4RUN(runs, L->NR) : RD_QRUN(runs, L->NR, L->qzp));
    }
    size_t bytes = (size_t)L->NR * (size_t)rd_round_up(kc, L->k_unit) * L->b_size;
    if (L->scale_size)
        bytes += (size_t)L->NR * L->scale_size;
    else if (L->qtile > 0) {
        const rd_qtrailer_t h = rd_ptrailer(L, pc, kc);
        bytes += RD_QRUN(rd_qruns(h.first, h.tile, kc), L->NR, L->qzp);
    }
    return bytes;
}

/* The depth of a w4a8 block (RD_CT_U8S8_I4 / F4) at p, kc deep at most,
 * of a contraction of k in scale tiles qtile deep: one that would end inside
 * a tile it does not start in ends at that tile's start instead, so that
 * its runs are the blocks of the one-byte int8 layout (cut at the tiles,
 * and within a tile every KC steps from its start) and the bits theirs.
 * The prepacking and the driver both cut by it. */
static inline rd_int
rd_w4a8_depth(rd_int qtile, rd_int p, rd_int kc, rd_int k)
{
    const rd_int r = qtile > 0 ? (p + kc) % qtile : 0;
    return p + kc < k && r != 0 && r < kc ? kc - r : kc;
}

/* The depth of the layout's block at p of a contraction of k: KC, less at
 * the end, and for panels with a row of scales a column (scale_size; not
 * the w4a8 ones, whose trailers hold runs) also ending at the next scale
 * tile boundary along k. */
static inline rd_int
rd_pblock_depth(const rd_playout_t *L, rd_int p, rd_int k)
{
    rd_int kc = k - p < L->KC ? k - p : L->KC;
    if (L->scale_size && !L->nibbles && L->qtile > 0 && L->qtile - p % L->qtile < kc)
        kc = L->qtile - p % L->qtile;
    if (L->scale_size && L->nibbles)
        kc = rd_w4a8_depth(L->qtile, p, kc, k);
    return kc;
}

/* Where the block at pc of a group's layout starts, in bytes.  The one rule
 * by which rd_prepack writes the blocks and rd_gemm_block finds them. */
static inline size_t
rd_pblock_offset(const rd_playout_t *L, rd_int pc)
{
    size_t off = 0;
    for (rd_int p = 0, d; p < pc; p += d) {
        d = rd_pblock_depth(L, p, pc);
        off += (size_t)L->panels * rd_ppanel_bytes(L, p, d);
    }
    return off;
}

#endif /* RD_PLAYOUT_H */
