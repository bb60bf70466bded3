/*
 * Prepacking: weights laid out once in the micro-kernel's panel order
 * (rd_prepack, rd_prepack_bytes; the layout is frame/rd_playout.h's), read
 * in place by every later call of the driver.
 */
#include "rd_frame.h"
#include "rd_playout.h"

#include <stdint.h>
#include <string.h>

/* The layout rd_prepack gives weights [., k, n] for `plan`. */
static rd_playout_t
rd_playout(const rd_plan_t *plan, rd_int n, rd_int qtile, int qzp)
{
    const rd_ctype_desc_t *ct = &rd_ctypes[plan->ct];
    const rd_int NR = plan->k.nr;
    rd_playout_t L = {plan->k.kc, NR, (n + NR - 1) / NR, ct->k_unit, ct->b_size, qtile, qzp, rd_b_scale_size(plan->ct),
                      ct->b_nibbles, rd_ctype_e8m0(plan->ct)};
    if (ct->scale_size && L.KC > RD_I32_KC_MAX)   /* rd_gemm_block's int32 limit */
        L.KC = RD_I32_KC_MAX;
    return L;
}

/* Whether compute type ct lays out quantized weights (with trailers, or
 * for the int8 dot and MMLA types and the tile type that reads their
 * layout with a row of sums and scales a column). */
static int
rd_quantized_panels(rd_ctype_t ct)
{
    return ct == RD_CT_F32_I8W || ct == RD_CT_F32_F8W || ct == RD_CT_F32_F4W || ct == RD_CT_F32_I4W
           || rd_ctype_int8_dot(ct);
}

/* The routine that packs the weights of storage dtype `dtype` into the
 * layout (quantized values with their scales for RD_CT_U8S8: NULL here,
 * see rd_prepack). */
static int
rd_prepack_reads(rd_ctype_t ct, rd_dtype_t dtype)
{
    return rd_ctype_int8_dot(ct) ? rd_qpacker(ct, dtype, 1) != NULL : rd_packer(ct, dtype, 1) != NULL;
}

size_t
rd_prepack_bytes(const rd_plan_t *plan, rd_dtype_t dtype, rd_int k, rd_int n, rd_int qtile, int qzp)
{
    if (!rd_prepack_reads(plan->ct, dtype) || k < 0 || n < 0
        || (rd_quantized_panels(plan->ct) ? qtile < 1 : qtile != 0))
        return 0;
    const rd_playout_t L = rd_playout(plan, n, qtile, qzp);
    return rd_pblock_offset(&L, k);
}

/* The trailer of one micro-panel of group g's block at pc (kc deep), whose
 * columns start at column j0 of n: the header, then per run the scales
 * (and zero points) of the columns, 0 past n.  q: the weights' scales, of
 * tiles (tg, tr, tc) with element strides (gs, rs, cs). */
static void
rd_put_trailer(const rd_playout_t *L, const rd_scales_t *q, rd_int g, rd_int pc, rd_int kc,
               rd_int j0, rd_int n, char *dst)
{
    const rd_qtrailer_t h = rd_ptrailer(L, pc, kc);
    memcpy(dst, &h, sizeof h);
    const float *s = (const float *)q->s, *z = (const float *)q->z;
    const rd_int runs = rd_qruns(h.first, h.tile, kc);
    for (rd_int r = 0; r < runs; r++) {
        /* the tile along k of the run's first step */
        const rd_int t = (pc + rd_qrun_start(&h, r)) / L->qtile;
        if (L->e8m0) {
            /* 4-bit float panels: the exponent of each power-of-two scale */
            uint8_t *er = (uint8_t *)(dst + RD_F4RUN(r, L->NR));
            for (rd_int j = 0; j < L->NR; j++) {
                const rd_int col = j0 + j;
                const rd_int at = g / q->tg * q->gs + t * q->rs + col / q->tc * q->cs;
                er[j] = (uint8_t)(col < n ? rd_float_to_e8m0(s[at]) : 127);
            }
            continue;
        }
        float *sr = (float *)(void *)(dst + RD_QRUN(r, L->NR, L->qzp));
        float *zr = sr + L->NR;
        for (rd_int j = 0; j < L->NR; j++) {
            const rd_int col = j0 + j;
            const rd_int at = g / q->tg * q->gs + t * q->rs + col / q->tc * q->cs;
            sr[j] = col < n ? s[at] : 0.0f;
            if (L->qzp)
                zr[j] = col < n ? z[at] : 0.0f;
        }
    }
}

int
rd_prepack(const rd_plan_t *plan, rd_int ng, rd_int k, rd_int n, const rd_in_t *rhs, void *dst)
{
    rd_pack_t pack = rd_packer(plan->ct, rhs->dtype, 1);
    rd_qpack_t qpack = rd_ctype_int8_dot(plan->ct) ? rd_qpacker(plan->ct, rhs->dtype, 1) : NULL;
    const int quantized = rd_quantized_panels(plan->ct);
    if ((pack == NULL && qpack == NULL) || (rhs->q.s != NULL) != quantized)
        return -2;
    const rd_int qtile = quantized ? rhs->q.tr : 0;
    const int qzp = quantized && rhs->q.z != NULL;
    const size_t per_group = rd_prepack_bytes(plan, rhs->dtype, k, n, qtile, qzp);
    const rd_playout_t L = rd_playout(plan, n, qtile, qzp);
    const size_t src = rd_dtype_size[rhs->dtype];
    const rd_int NR = L.NR;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(plan->nthreads) if (plan->nthreads > 1 && ng > 1)
#endif
    for (rd_int g = 0; g < ng; g++) {
        char *out = (char *)dst + (size_t)g * per_group;
        for (rd_int pc = 0, kc; pc < k; pc += kc) {
            kc = rd_pblock_depth(&L, pc, k);
            const char *blk = (const char *)rd_at(rhs->p, src, g * rhs->gs + pc * rhs->rs, 1, 0, rhs->cs);
            if (qpack != NULL) {
                /* B's block as its transpose, its values and their column
                 * sums and scales, as packing B per call makes them */
                const rd_scales_t *q = &rhs->q;
                const rd_int off = g / q->tg * q->gs * (rd_int)sizeof(float);
                const rd_qblock_t qb = {(const char *)q->s + off,
                                        q->z != NULL ? (const char *)q->z + off : NULL,
                                        q->cs, q->rs, q->tc, q->tr, 0, pc};
                qpack(n, kc, blk, rhs->cs, rhs->rs, (int)NR, out, &qb);
                out += (size_t)L.panels * rd_ppanel_bytes(&L, pc, kc);
                continue;
            }
            if (!quantized) {
                /* B's block as its transpose: n rows of depth kc, into panels */
                pack(n, kc, blk, rhs->cs, rhs->rs, (int)NR, out);
                out += (size_t)L.panels * rd_ppanel_bytes(&L, pc, kc);
                continue;
            }
            /* panel by panel: its values, then its trailer */
            const size_t step = rd_ppanel_bytes(&L, pc, kc);
            for (rd_int j0 = 0; j0 < n; j0 += NR) {
                pack(n - j0 < NR ? n - j0 : NR, kc, blk + j0 * rhs->cs * (rd_int)src, rhs->cs, rhs->rs,
                     (int)NR, out);
                rd_put_trailer(&L, &rhs->q, g, pc, kc, j0, n,
                               out + (size_t)NR * (size_t)kc / (L.nibbles ? 2u : 1u));
                out += step;
            }
        }
    }
    return 0;
}
