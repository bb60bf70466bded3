/*
 * The gated pair of an MoE layer's experts (the gate and up products of
 * the same rows, w0 and w1): each block of rows packed once for both,
 * each finished tile pair handed to an epilogue (the activation, the
 * combine) instead of being stored whole.
 */
#include "rd_frame.h"
#include "rd_driver_impl.h"
#include "rd_playout.h"
#include "rd_tiling.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------- gated products */

#define RD_GATED_TN ((rd_int)1024)

/* rd_gated_rows (lhs1 NULL) and rd_summed_rows (lhs1: w1's rows, the
 * second product added into the first's tile). */
static int
rd_tile_pass(const rd_plan_t *base, rd_int k, rd_int n, rd_int ng, const rd_int *bounds, const rd_in_t *lhs,
             const rd_in_t *w0, const rd_in_t *lhs1, const rd_in_t *w1, rd_gated_epi_t epi, void *ctx,
             int ordered)
{
    rd_call_t cl, cl1;
    rd_plan_t planned = *base, *plan = &planned;
    rd_plan_choose(plan, RD_MODE_ROWS, k, n, ng, bounds, w0->panels > 0,
                   plan->ct == RD_CT_F32 && w0->panels == 0 && w0->q.s == NULL && w0->dtype == RD_F32
                   && w0->cs == 1 && (w1 == NULL || (w1->cs == 1 && w1->rs == w0->rs)));
    int rc = rd_call_init(&cl, plan, lhs, w0);
    if (rc == 0 && lhs1 != NULL)
        rc = lhs1->dtype != lhs->dtype || (lhs1->ridx == NULL) != (lhs->ridx == NULL) || w1 == NULL
             ? -2 : rd_call_init(&cl1, plan, lhs1, w1);
    if (rc != 0)
        return rc;
    if (w1 != NULL && (w1->dtype != w0->dtype || (w1->panels > 0) != (w0->panels > 0)
                       || (w1->q.s == NULL) != (w0->q.s == NULL)))
        return -2;
    const int summed = lhs1 != NULL;
    rd_shape_t sh = {RD_MODE_ROWS, bounds, 0, k};
    rd_tiling_t tl;
    const double rows = (double)(bounds[ng] - bounds[0]);
    const double pairs = w1 != NULL ? 2.0 : 1.0;
    const double bytes = (summed ? 2.0 : 1.0) * rows * (double)k * (double)cl.a_src
                         + pairs * (double)ng * (double)k * (double)n * (double)cl.b_src
                         + (summed ? 1.0 : pairs) * rows * (double)n * (double)cl.c_size;
    /* no team tiles, and tiles at most RD_GATED_TN wide: the products are
     * computed into tiles of their own, and an MoE layer's f (768 to 2048
     * in the models of this field) is then one or two tiles, each packed
     * block of rows read by every column of it */
    plan->team = 0;
    if (plan->tn <= 0 || plan->tn > RD_GATED_TN)
        plan->tn = RD_GATED_TN;
    const rd_ukr_desc_t *kd = &plan->k;
    /* ordered: a column block a thread (as many as the call's threads, at
     * most one a panel), over tiles not split for the threads */
    const rd_int panels = (n + kd->nr - 1) / kd->nr;
    rd_int blocks = 1;
    rd_plan_t tiled = *plan;
    if (ordered) {
        const int threads = rd_tiling_threads(plan, &sh, ng, n, bytes);
        blocks = threads < panels ? threads : panels;
        tiled.nthreads = 1;
    }
    if (rd_make_tiling(&tl, &tiled, &sh, ng, n, 0, bytes) != 0)
        return -1;
    if (ordered)
        tl.nthreads = (int)blocks;
    const rd_int ld = rd_round_up(tl.tn, kd->nr);
    size_t a_bytes, b_bytes, stage_bytes;
    rd_pack_sizes(&cl, &tl, &a_bytes, &b_bytes, &stage_bytes, 0);
    const size_t t_bytes = (size_t)(tl.tm > 0 ? tl.tm : 1) * (size_t)ld * cl.c_size;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(tl.nthreads) if (tl.nthreads > 1)
#endif
    {
        char *apack = (char *)rd_scratch(0, a_bytes);
        char *bpack = (char *)rd_scratch(1, b_bytes);
        char *bpack2 = w1 != NULL && !summed ? (char *)rd_scratch(4, b_bytes) : bpack;
        char *t0 = (char *)rd_scratch(2, t_bytes);
        char *t1 = w1 != NULL && !summed ? (char *)rd_scratch(5, t_bytes) : t0;
        /* gathered rows are staged a block at a time (rd_pack_block) */
        const int staged = lhs->ridx == NULL || rd_scratch(6, stage_bytes) != NULL;
        const int ok = apack != NULL && ((bpack != NULL && bpack2 != NULL) || b_bytes == 0)
                       && t0 != NULL && t1 != NULL && staged;
        if (!ok) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
        /* ordered: column block t of `blocks` (whole panels), every tile
         * in list order (group after group, rows in order within a column
         * piece) cut to it; else tile t, largest first, as the threads take
         * them */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (rd_int t = 0; t < (ordered ? blocks : tl.count); t++) {
            const rd_int lo = ordered ? panels * t / blocks * kd->nr : 0;
            const rd_int hi_p = ordered ? panels * (t + 1) / blocks * kd->nr : n;
            const rd_int hi = hi_p < n ? hi_p : n;
            for (rd_int u = ordered ? 0 : t; ok && u < (ordered ? tl.count : t + 1); u++) {
                const rd_tile_t *tile = &tl.tiles[ordered ? u : tl.order[u]];
                const rd_int c0 = tile->c0 > lo ? tile->c0 : lo, c1 = tile->c1 < hi ? tile->c1 : hi;
                if (c1 <= c0)
                    continue;
                const rd_int rows_t = tile->r1 - tile->r0, cols = c1 - c0;
                const rd_block_t a = rd_block(lhs, cl.a_src, cl.q_size, 0, tile->r0, 0);
                const rd_block_t b = rd_block(w0, cl.b_src, cl.q_size, tile->g, 0, c0);
                rd_block_t b2;
                if (w1 != NULL)
                    b2 = rd_block(w1, cl.b_src, cl.q_size, tile->g, 0, c0);
                if (summed) {
                    const rd_block_t a1 = rd_block(lhs1, cl1.a_src, cl1.q_size, 0, tile->r0, 0);
                    rd_gemm_block(&cl, rows_t, cols, k, &a, &b, NULL, t0, NULL, ld, 1, 0, 0, apack, bpack, NULL,
                                  0, 1);
                    rd_gemm_block(&cl1, rows_t, cols, k, &a1, &b2, NULL, t0, NULL, ld, 1, 1, 0, apack, bpack,
                                  NULL, 0, 1);
                    epi(ctx, tile->g, tile->r0, c0, rows_t, cols, t0, NULL, ld);
                    continue;
                }
                rd_gemm_block(&cl, rows_t, cols, k, &a, &b, w1 != NULL ? &b2 : NULL, t0, w1 != NULL ? t1 : NULL,
                              ld, 1, 0, 0, apack, bpack, bpack2, 0, 1);
                epi(ctx, tile->g, tile->r0, c0, rows_t, cols, t0, w1 != NULL ? t1 : NULL, ld);
            }
        }
        if (kd->release != NULL)
            kd->release();
    }
    rd_free_tiling(&tl);
    return failed ? -1 : 0;
}

int
rd_gated_rows(const rd_plan_t *plan, rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
              const rd_in_t *lhs, const rd_in_t *w0, const rd_in_t *w1, rd_gated_epi_t epi, void *ctx,
              int ordered)
{
    return rd_tile_pass(plan, k, n, ng, bounds, lhs, w0, NULL, w1, epi, ctx, ordered);
}

int
rd_summed_rows(const rd_plan_t *plan, rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
               const rd_in_t *lhs0, const rd_in_t *w0, const rd_in_t *lhs1, const rd_in_t *w1,
               rd_gated_epi_t epi, void *ctx)
{
    return rd_tile_pass(plan, k, n, ng, bounds, lhs0, w0, lhs1, w1, epi, ctx, 1);
}
