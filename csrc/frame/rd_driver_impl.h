/*
 * What the grouped GEMM drivers share (frame/rd_driver.c, the ragged
 * products; frame/rd_gated.c, the gated pair of an MoE layer): the call's
 * packing routines and sizes, the block of an operand one tile reads, the
 * per-thread packing buffers and the BLIS loop nest of one tile.
 */
#ifndef RD_DRIVER_IMPL_H
#define RD_DRIVER_IMPL_H

#include "rd_frame.h"
#include "rd_tiling.h"

#include <stddef.h>

/* What every tile of one call shares: the plan and its packing routines. */
typedef struct {
    const rd_plan_t *plan;
    rd_pack_t pack_a, pack_b;
    rd_qpack_t qpack_a, qpack_b;    /* for quantized operands (else NULL) */
    size_t a_src, b_src;            /* storage element sizes of lhs, rhs */
    int b_src_nibbles;              /* rhs addressed in nibbles (4-bit values) */
    size_t a_size, b_size, c_size;  /* packed A, packed B, output element sizes */
    size_t scale_size;              /* bytes a row of scales after each micro-panel */
    size_t q_size;                  /* bytes of an element of the operands' scales */
    int k_unit;
} rd_call_t;

/* The part of an operand one tile reads: X[i][j] at p + (i*rs + j*cs)
 * elements, and for a quantized operand the scales of its group with the
 * block's origin (i0, j0) in the operand's (row, column) indices. */
typedef struct {
    const void *p;
    rd_int rs, cs;
    const rd_scales_t *q;       /* NULL: not quantized */
    const char *qs, *qz;        /* scale / zero point of tile (0, 0) of the group */
    rd_int i0, j0;
    rd_int panels;              /* > 0: prepacked B (rd_prepack), p its group */
    rd_int qtile;               /* prepacked quantized B: scale tiles along k */
    int qzp;                    /* ... with zero points */
    const long long *ridx;      /* NULL, or row i is row ridx[i] of the array at p */
    const long long *cidx;      /* NULL, or column j is column cidx[j] of it */
    const char *rscale;         /* NULL, or row i is scaled by rscale[i] (rd_in_t) */
} rd_block_t;

/* Thread-local scratch buffer `which` (0-6) of at least `bytes`, 64-byte
 * aligned, kept from call to call (NULL: out of memory). */
void *rd_scratch(int which, size_t bytes);

/* The packing routines and element sizes of a call of `plan` on lhs and
 * rhs (-2: no packing serves them). */
int rd_call_init(rd_call_t *cl, const rd_plan_t *plan, const rd_in_t *lhs, const rd_in_t *rhs);

/* The block of operand `x` at group g, row i0, column j0. */
rd_block_t rd_block(const rd_in_t *x, size_t size, size_t psize, rd_int g, rd_int i0, rd_int j0);

/* Bytes of the packing buffers of a tiling's largest tile (A, B, and the
 * staging of gathered rows). */
void rd_pack_sizes(const rd_call_t *cl, const rd_tiling_t *tl, size_t *a_bytes, size_t *b_bytes, size_t *stage,
                   int stage_b);

/* C[M x N] (+)= A B (and C2 (+)= A B2) over one tile: the loop nest
 * (frame/rd_driver.c). */
void rd_gemm_block(const rd_call_t *cl, rd_int M, rd_int N, rd_int K,
                   const rd_block_t *a, const rd_block_t *b, const rd_block_t *b2,
                   void *c, void *c2, rd_int c_rs, rd_int c_cs, int accumulate, int stream,
                   char *apack, char *bpack, char *bpack2, int tid, int nt);

#endif /* RD_DRIVER_IMPL_H */
