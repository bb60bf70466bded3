/*
 * Drivers of the grouped GEMMs: build one list of tiles over all groups,
 * order it by cost, and let the threads take tiles from it.  Each tile
 * (group, row block, column block) owns its block of the output, so no two
 * threads ever write the same element and no reduction across threads is
 * needed.  Within a tile the BLIS loop nest runs on packed panels with the
 * plan's micro-kernel.
 *
 * Nothing here knows an element type: sizes come from the plan's compute
 * type, conversions from the packing routines (frame/rd_pack.c), and the
 * arithmetic from the micro-kernel.
 */
#include "rd_frame.h"
#include "rd_half.h"
#include "rd_playout.h"
#include "rd_tiling.h"
#include "rd_driver_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/*
 * Packing buffers, one pair per thread (and the float32 tile of a 16-bit
 * output; and in the calling thread the B panel its team shares; and for
 * the gated products a second B panel and tile, and their gathered rows
 * of A), kept from
 * call to call: allocating
 * megabytes afresh on every call costs page faults (the kernel zeroing new
 * pages) comparable to the packing itself.  They grow to the largest size
 * asked for and stay: O(threads x cache blocks) of memory.
 */
static __thread void *rd_scratch_buf[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
static __thread size_t rd_scratch_cap[7] = {0, 0, 0, 0, 0, 0, 0};

void *
rd_scratch(int which, size_t bytes)
{
    if (bytes > rd_scratch_cap[which]) {
        void *p = NULL;
        if (posix_memalign(&p, RD_ALIGN, bytes) != 0)
            return NULL;
        free(rd_scratch_buf[which]);
        rd_scratch_buf[which] = p;
        rd_scratch_cap[which] = bytes;
    }
    return rd_scratch_buf[which];
}


/* Line l of a gathered block (rd_pack_block) times its row's scale, each
 * product rounded to the element type T. */
#define RD_SCALED_LINE(T)                                                   \
    do {                                                                    \
        const T s_ = ((const T *)(const void *)x->rscale)[i + l];           \
        const T *src_ = (const T *)(const void *)line;                      \
        T *dst_ = (T *)(void *)d;                                           \
        if (step == 1)                                                      \
            for (rd_int t = 0; t < len; t++)                                \
                dst_[t] = s_ * src_[t];                                     \
        else                                                                \
            for (rd_int t = 0; t < len; t++)                                \
                dst_[t] = s_ * src_[t * step];                              \
    } while (0)

/* The block of `x` at (i, j), operand `which` (0: A, 1: B), into r-row
 * micro-panels: A as `rows` rows of x by `depth` columns; B as its
 * transpose, `rows` columns of x by `depth` rows. */
static void
rd_pack_block(const rd_call_t *cl, int which, const rd_block_t *x, rd_int i, rd_int j,
              rd_int rows, rd_int depth, int r, void *dst)
{
    if (x->ridx != NULL || x->cidx != NULL) {
        /* rows (or columns) gathered through the index into a block of
         * their own in this thread's staging buffer (sized by the caller),
         * each line copied along the axis it runs on, then packed as any
         * block: X[i + ii][j + jj] for ii < nr, jj < nc (A: rows x depth;
         * B: depth x rows, packed as its transpose) */
        const size_t es = which ? cl->b_src : cl->a_src;
        const rd_int nr = which ? depth : rows, nc = which ? rows : depth;
        char *stage = (char *)rd_scratch(6, (size_t)nr * (size_t)nc * es);
        const int by_rows = x->ridx != NULL;      /* lines along rows: stage[ii][jj], else stage[jj][ii] */
        const rd_int lines = by_rows ? nr : nc, len = by_rows ? nc : nr;
        const rd_int step = by_rows ? x->cs : x->rs;  /* along a line, in the source */
        for (rd_int l = 0; l < lines; l++) {
            const rd_int at = by_rows ? x->ridx[i + l] * x->rs + j * x->cs : (i * x->rs + x->cidx[j + l] * x->cs);
            const char *line = (const char *)x->p + at * (rd_int)es;
            char *d = stage + (size_t)(l * len) * es;
            if (x->rscale != NULL && es == sizeof(float))     /* row l times its scale, rounded */
                RD_SCALED_LINE(float);
            else if (x->rscale != NULL)
                RD_SCALED_LINE(double);
            else if (step == 1)
                memcpy(d, line, (size_t)len * es);
            else
                for (rd_int t = 0; t < len; t++)
                    memcpy(d + (size_t)t * es, line + t * step * (rd_int)es, es);
        }
        /* the staged block's strides along X's rows and columns */
        const rd_int srs = by_rows ? nc : 1, scs = by_rows ? 1 : nr;
        if (which)
            cl->pack_b(rows, depth, stage, scs, srs, r, dst);
        else
            cl->pack_a(rows, depth, stage, srs, scs, r, dst);
        return;
    }
    const void *src = rd_at(x->p, which ? cl->b_src : cl->a_src, i, x->rs, j, x->cs);
    const rd_int rs = which ? x->cs : x->rs, cs = which ? x->rs : x->cs;
    if (x->q == NULL) {
        (which ? cl->pack_b : cl->pack_a)(rows, depth, src, rs, cs, r, dst);
        return;
    }
    const rd_scales_t *q = x->q;
    rd_qblock_t qb = {x->qs, x->qz,
                      which ? q->cs : q->rs, which ? q->rs : q->cs,
                      which ? q->tc : q->tr, which ? q->tr : q->tc,
                      which ? x->j0 + j : x->i0 + i, which ? x->i0 + i : x->j0 + j};
    (which ? cl->qpack_b : cl->qpack_a)(rows, depth, src, rs, cs, r, dst, &qb);
}

/* Bytes of one r-row micro-panel of depth kp (packed values, then the
 * scales of its rows where the compute type carries them). */
static inline size_t
rd_panel_bytes(const rd_call_t *cl, size_t elem, rd_int r, rd_int kp)
{
    return (size_t)r * ((size_t)kp * elem + cl->scale_size);
}

/* How far the contraction may run from its position pc before it leaves
 * the scale tile of quantized operand x (which = 0: A, whose depth is its
 * column axis; 1: B, whose depth is its row axis), in the operand's own
 * (absolute) indices: group bounds and cache blocks cut scale tiles. */
static rd_int
rd_scale_room(const rd_block_t *x, int which, rd_int pc)
{
    if (x->panels > 0)   /* prepacked B: its blocks end at its scale tiles along k */
        return x->qtile - (x->i0 + pc) % x->qtile;
    const rd_int tp = which ? x->q->tr : x->q->tc;
    const rd_int pos = (which ? x->i0 : x->j0) + pc;
    return tp - pos % tp;
}


__thread rd_ahead_t rd_ahead = {NULL, NULL};

/* The B panel of block (pc, jc) of operand b for the micro-kernels: read in
 * place (streamed: B's strip at (pc, jc); prepacked: its KC block at pc,
 * micro-panels *bstep bytes apart), or packed into bpack (by this thread
 * alone, or, `shared`, each thread of the team its run of whole panels,
 * then a barrier). */
static const char *
rd_b_panel(const rd_call_t *cl, const rd_block_t *b, rd_int pc, rd_int jc, rd_int nc, rd_int kc,
           rd_int kp, char *bpack, size_t *bstep, int shared, int tid, int nt)
{
    const rd_ukr_desc_t *kd = &cl->plan->k;
    const int NR = kd->nr;
    *bstep = 0;
    if (cl->plan->kind == RD_KIND_STREAM)
        return (const char *)rd_at(b->p, cl->b_src, pc, b->rs, jc, 1);
    if (b->panels > 0) {
        const rd_int KC = cl->scale_size && kd->kc > RD_I32_KC_MAX ? RD_I32_KC_MAX : kd->kc;
        const rd_playout_t L = {KC, NR, b->panels, cl->k_unit, cl->b_size, b->qtile, b->qzp,
                                rd_b_scale_size(cl->plan->ct),
                                rd_ctypes[cl->plan->ct].b_nibbles, rd_ctype_e8m0(cl->plan->ct)};
        *bstep = rd_ppanel_bytes(&L, pc, kc);
        return (const char *)b->p + rd_pblock_offset(&L, pc) + (size_t)((b->j0 + jc) / NR) * *bstep;
    }
    if (!shared) {
        rd_pack_block(cl, 1, b, pc, jc, nc, kc, NR, bpack);
        return bpack;
    }
    /* each thread packs a run of whole panels, read row by row as one block
     * (panel by panel would read B in strips) */
    const rd_int np = (nc + NR - 1) / NR;
    const rd_int j0 = np * tid / nt * NR, j1 = np * (tid + 1) / nt * NR;
    const rd_int j_end = j1 < nc ? j1 : nc;
    if (j0 < j_end)
        rd_pack_block(cl, 1, b, pc, jc + j0, j_end - j0, kc, NR, bpack + rd_panel_bytes(cl, cl->b_size, j0, kp));
#ifdef _OPENMP
#pragma omp barrier
#endif
    return bpack;
}

/* C[M x N] (+)= A[M x K] B[K x N], all operands strided, with the BLIS loop
 * nest: NC panels of B, KC blocks of the contraction, MC blocks of A, then
 * NR x MR micro-tiles.  apack holds roundup(MC,MR)*KC packed elements, bpack
 * KC*roundup(min(N,NC),NR) (with their scales, rd_panel_bytes).  K == 0
 * writes zeros (or leaves C unchanged when accumulating).  A compute type
 * that carries scales in its panels (RD_CT_I8I32) has each KC block end at
 * the next scale-tile boundary of either operand along the contraction, so
 * that one scale per row and column covers the block.  With `stream`, a C
 * that one KC block completes (it is written once, never read back here)
 * gets non-temporal stores.
 *
 * With a second pair (b2, c2: its own packing buffer bpack2, C2 strided as
 * C), C2 (+)= A B2 in the same pass: each packed block of A multiplied by
 * both (the gate and up products of an MoE layer, A packed once).
 *
 * A team tile (nt > 1 threads, this one tid; one pair only) is run by every
 * thread of the team together: each B panel packed once into the shared
 * bpack, its micro-panels split between the threads, then each thread's
 * share of the rows (a range of whole MR blocks) multiplied by it; a
 * barrier before the next panel overwrites it.  Every output element is
 * still summed in the same KC blocks in the same order. */
void
rd_gemm_block(const rd_call_t *cl, rd_int M, rd_int N, rd_int K,
              const rd_block_t *a, const rd_block_t *b, const rd_block_t *b2,
              void *c, void *c2, rd_int c_rs, rd_int c_cs, int accumulate, int stream,
              char *apack, char *bpack, char *bpack2, int tid, int nt)
{
    const rd_ukr_desc_t *kd = &cl->plan->k;
    const rd_int MC = kd->mc, NC = kd->nc;
    const rd_int KC = cl->scale_size && kd->kc > RD_I32_KC_MAX ? RD_I32_KC_MAX : kd->kc;
    const int MR = kd->mr, NR = kd->nr;
    const size_t cz = cl->c_size;
    const int streamed = cl->plan->kind == RD_KIND_STREAM;   /* B read in place by plan->s */
    /* a team packs B into the shared bpack, and waits before repacking it */
    const int shared = nt > 1 && !streamed && b->panels == 0;
    const int pairs = b2 != NULL ? 2 : 1;
    const rd_block_t *bs[2] = {b, b2};
    char *cs[2] = {(char *)c, (char *)c2}, *bpacks[2] = {bpack, bpack2};
    if (K == 0) {
        if (!accumulate && tid == 0)
            for (int q = 0; q < pairs; q++)
                for (rd_int i = 0; i < M; i++)
                    for (rd_int j = 0; j < N; j++)
                        memset(cs[q] + (i * c_rs + j * c_cs) * (rd_int)cz, 0, cz);
        return;
    }
    /* NC blocks of whole panels when B is prepacked (its panels start every
     * NR columns; a tile starts on a panel) */
    const rd_int NCB = b->panels > 0 ? (NC > NR ? NC / NR * NR : NR) : NC;
    for (rd_int jc = 0; jc < N; jc += NCB) {
        rd_int nc = N - jc < NCB ? N - jc : NCB;
        rd_int kc;
        for (rd_int pc = 0; pc < K; pc += kc) {
            kc = K - pc < KC ? K - pc : KC;
            if (cl->scale_size) {
                /* (w4a8 weights hold runs of scales in their blocks, cut as prepack cut them) */
                rd_int ra = rd_scale_room(a, 0, pc);
                rd_int rb = rd_ctype_w4a8(cl->plan->ct) ? rd_w4a8_depth(b->qtile, pc, kc, K) : rd_scale_room(b, 1, pc);
                kc = kc < ra ? kc : ra;
                kc = kc < rb ? kc : rb;
                if (b2 != NULL && !rd_ctype_w4a8(cl->plan->ct)) {
                    const rd_int rb2 = rd_scale_room(b2, 1, pc);
                    kc = kc < rb2 ? kc : rb2;
                }
            }
            rd_int kp = rd_round_up(kc, cl->k_unit);   /* packed depth */
            int mode = accumulate || pc > 0 ? RD_ADD
                       : stream && kc == K ? RD_STREAM : RD_STORE;
            /* B's panel is packed as its transpose: nc rows of depth kc;
             * prepacked weights are read where they lie: the KC block at pc
             * (rd_pblock_offset), its panel of column j0 + jc, micro-panels
             * bstep bytes apart (values, and the trailer of quantized ones) */
            const char *bpanel[2];
            size_t bstep[2];
            for (int q = 0; q < pairs; q++)
                bpanel[q] = rd_b_panel(cl, bs[q], pc, jc, nc, kc, kp, bpacks[q], &bstep[q], shared, tid, nt);
            /* the next KC block of B requested while this one's products run,
             * where it is one run of memory (whole rows of a row-major B):
             * measured on Zen4 at 16 rows a group, 40% of the FMA peak
             * without, 46% with (KC 512), 52% at KC 128, whose blocks leave
             * room in L2 for the next one */
            rd_ahead.next = rd_ahead.end = NULL;
            if (nt == 1 && pairs == 1 && !streamed && b->panels == 0 && b->ridx == NULL && b->cs == 1 && b->rs == nc
                && pc + kc < K && cl->b_src_nibbles == 0) {
                const rd_int rows = K - pc - kc < KC ? K - pc - kc : KC;
                rd_ahead.next = (const char *)rd_at(b->p, cl->b_src, pc + kc, b->rs, jc, 1);
                rd_ahead.end = rd_ahead.next + rows * nc * (rd_int)cl->b_src;
            }
            /* this thread's rows: all, or its share of a team tile's */
            const rd_int units = (M + MR - 1) / MR;
            const rd_int lo = units * tid / nt * MR, hi = units * (tid + 1) / nt * MR;
            const rd_int i_end = hi < M ? hi : M;
            /* a row or two on prepacked B: the few-row kernel, where it
             * gives the micro-kernel's results */
            const int few = b->panels > 0 && !streamed && cl->plan->few.ukr != NULL
                            && cl->plan->few.main == kd->ukr && i_end - lo <= cl->plan->few.mr
                            && (cl->plan->few.kmax == 0 || kc <= cl->plan->few.kmax)
                            && (b2 == NULL || b2->panels > 0);
            for (rd_int ic = lo; ic < i_end; ic += MC) {
                rd_int mc = i_end - ic < MC ? i_end - ic : MC;
                rd_pack_block(cl, 0, a, ic, pc, mc, kc, MR, apack);
                if (few) {   /* all the panels of the block in one call */
                    for (int q = 0; q < pairs; q++)
                        cl->plan->few.ukr(kc, apack, bpanel[q], bstep[q],
                                          cs[q] + (ic * c_rs + jc * c_cs) * (rd_int)cz, c_rs, c_cs, (int)mc, nc,
                                          mode);
                    continue;
                }
                for (rd_int jr = 0; jr < nc; jr += NR) {
                    int nr = (int)(nc - jr < NR ? nc - jr : NR);
                    for (int q = 0; q < pairs; q++) {
                        const char *bp = streamed ? bpanel[q] + (size_t)jr * cl->b_src
                                         : bs[q]->panels > 0 ? bpanel[q] + (size_t)(jr / NR) * bstep[q]
                                         : bpanel[q] + rd_panel_bytes(cl, cl->b_size, jr, kp);
                        char *cj = cs[q] + (ic * c_rs + (jc + jr) * c_cs) * (rd_int)cz;
                        for (rd_int ir = 0; ir < mc; ir += MR) {
                            int mr = (int)(mc - ir < MR ? mc - ir : MR);
                            const char *ap = apack + rd_panel_bytes(cl, cl->a_size, ir, kp);
                            char *cij = cj + ir * c_rs * (rd_int)cz;
                            if (streamed)
                                cl->plan->s.ukr(kc, ap, bp, bs[q]->rs, cij, c_rs, c_cs, mr, nr, mode);
                            else
                                kd->ukr(kc, ap, bp, cij, c_rs, c_cs, mr, nr, mode);
                        }
                    }
                }
            }
            if (shared) {
#ifdef _OPENMP
#pragma omp barrier
#endif
            }
        }
    }
}

/* The block of operand `x` at group g, row i0, column j0: `size` bytes a
 * stored element, `psize` one of its scales. */
rd_block_t
rd_block(const rd_in_t *x, size_t size, size_t psize, rd_int g, rd_int i0, rd_int j0)
{
    if (x->panels > 0)   /* prepacked: group g's panels, located per block by rd_gemm_block */
        return (rd_block_t){(const char *)x->p + g * x->gs, 0, 0, NULL, NULL, NULL, i0, j0, x->panels,
                            x->qtile, x->qzp, NULL, NULL, NULL};
    if (x->ridx != NULL)   /* gathered rows: the index (and scales) from row i0 on, the columns from j0 */
        return (rd_block_t){(const char *)x->p + j0 * x->cs * (rd_int)size, x->rs, x->cs, NULL, NULL, NULL, i0,
                            j0, 0, 0, 0, x->ridx + i0, NULL,
                            x->rscale != NULL ? (const char *)x->rscale + i0 * (rd_int)size : NULL};
    if (x->cidx != NULL)   /* gathered columns: the rows from i0, the index from column j0 on */
        return (rd_block_t){(const char *)x->p + i0 * x->rs * (rd_int)size, x->rs, x->cs, NULL, NULL, NULL, i0,
                            j0, 0, 0, 0, NULL, x->cidx + j0, NULL};
    rd_block_t b = {(const char *)x->p + (g * x->gs + i0 * x->rs + j0 * x->cs) * (rd_int)size,
                    x->rs, x->cs, NULL, NULL, NULL, i0, j0, 0, 0, 0, NULL, NULL, NULL};
    if (x->q.s != NULL) {
        const rd_int off = g / x->q.tg * x->q.gs * (rd_int)psize;
        b.q = &x->q;
        b.qs = (const char *)x->q.s + off;
        b.qz = x->q.z != NULL ? (const char *)x->q.z + off : NULL;
    }
    return b;
}

/* The rows x cols block of a 16-bit output at o (strides rs, cs) widened
 * into the float32 tile t (rows ld apart), exactly. */
static void
rd_widen_tile(const void *o, rd_int rs, rd_int cs, rd_dtype_t dtype, rd_int rows, rd_int cols,
              float *t, rd_int ld)
{
    for (rd_int i = 0; i < rows; i++) {
        const uint16_t *src = (const uint16_t *)o + i * rs;
        float *dst = t + i * ld;
        if (dtype == RD_BF16)
            for (rd_int j = 0; j < cols; j++)
                dst[j] = rd_bf16_to_float(src[j * cs]);
        else
            for (rd_int j = 0; j < cols; j++)
                dst[j] = rd_f16_to_float(src[j * cs]);
    }
}

/* The float32 tile t (rows ld apart) rounded into the rows x cols block of
 * a 16-bit output at o (strides rs, cs): rd_narrow row by row, through a
 * row of 16-bit values when the output's rows are strided. */
static void
rd_narrow_tile(const float *t, rd_int ld, rd_int rows, rd_int cols, void *o, rd_int rs,
               rd_int cs, rd_dtype_t dtype)
{
    uint16_t row[256];
    for (rd_int i = 0; i < rows; i++) {
        uint16_t *dst = (uint16_t *)o + i * rs;
        if (cs == 1) {
            rd_narrow(t + i * ld, dst, dtype, (size_t)cols, 0);
            continue;
        }
        for (rd_int j0 = 0; j0 < cols; j0 += 256) {
            const rd_int w = cols - j0 < 256 ? cols - j0 : 256;
            rd_narrow(t + i * ld + j0, row, dtype, (size_t)w, 0);
            for (rd_int j = 0; j < w; j++)
                dst[(j0 + j) * cs] = row[j];
        }
    }
}

/* What the tiles of one call share besides the plan: the geometry, the
 * operands, and for a 16-bit output the row stride of its float32 tiles. */
typedef struct {
    const rd_call_t *cl;
    int mode;                   /* RD_MODE_ROWS (ragged rows of lhs) or RD_MODE_CONTRACT */
    const rd_int *bounds;
    const rd_in_t *lhs, *rhs;
    const rd_out_t *out;
    rd_int k;
    int accumulate, stream, narrow;
    rd_int tn_max;
} rd_run_t;

/* One tile, by this thread alone (nt = 1) or as thread tid of a team of nt
 * (rd_gemm_block), its packing buffers apack and bpack (the team's shared
 * B panel), tile32 the float32 tile of a 16-bit output. */
static void
rd_run_tile(const rd_run_t *r, const rd_tile_t *tile, char *apack, char *bpack, float *tile32,
            int tid, int nt)
{
    const rd_call_t *cl = r->cl;
    const rd_out_t *out = r->out;
    const size_t cz = r->narrow ? 2 : cl->c_size;   /* bytes of an output element */
    const rd_int g = tile->g;
    const rd_int rows = tile->r1 - tile->r0, cols = tile->c1 - tile->c0;
    char *o = (char *)out->p + (g * out->gs + tile->r0 * out->rs + tile->c0 * out->cs) * (rd_int)cz;
    /* where the tile is computed: the output, or a 16-bit output's float32
     * tile (rows tn_max apart), holding its old values when accumulating */
    void *c = o;
    rd_int c_rs = out->rs, c_cs = out->cs;
    if (r->narrow) {
        c = tile32, c_rs = r->tn_max, c_cs = 1;
        if (r->accumulate)
            rd_widen_tile(o, out->rs, out->cs, out->dtype, rows, cols, tile32, r->tn_max);
    }
    rd_block_t a, b;
    rd_int depth = r->k;
    if (r->mode == RD_MODE_ROWS) {
        /* rows are absolute rows of lhs/out; rhs[g] is k x n */
        a = rd_block(r->lhs, cl->a_src, cl->q_size, 0, tile->r0, 0);
        b = rd_block(r->rhs, cl->b_src, cl->q_size, g, 0, tile->c0);
    }
    else {
        /* rows index lhs's first axis; the contraction runs over the group's
         * rows [bounds[g], bounds[g+1]) of rhs */
        const rd_int s = r->bounds[g];
        depth = r->bounds[g + 1] - s;
        a = rd_block(r->lhs, cl->a_src, cl->q_size, 0, tile->r0, s);
        b = rd_block(r->rhs, cl->b_src, cl->q_size, 0, s, tile->c0);
    }
    rd_gemm_block(cl, rows, cols, depth, &a, &b, NULL, c, NULL, c_rs, c_cs, r->accumulate, r->stream, apack,
                  bpack, NULL, tid, nt);
    if (r->narrow)
        rd_narrow_tile(tile32, r->tn_max, rows, cols, o, out->rs, out->cs, out->dtype);
}

/* The packing buffers of a thread for the tiles of tl: A blocks of at most
 * MC rows and at most a tile's, B panels of at most NC columns and a
 * tile's (none when B is streamed: read in place), and (stage, when not
 * NULL) an A block of gathered rows before it is packed, or with stage_b
 * the larger of that and a block of B's. */
void
rd_pack_sizes(const rd_call_t *cl, const rd_tiling_t *tl, size_t *a_bytes, size_t *b_bytes, size_t *stage,
              int stage_b)
{
    const rd_ukr_desc_t *kd = &cl->plan->k;
    const rd_int nc_max = rd_round_up(tl->tn < kd->nc ? tl->tn : kd->nc, kd->nr);
    const rd_int kp_max = rd_round_up(kd->kc, cl->k_unit);
    const rd_int mc_max = rd_round_up(tl->tm > 0 && tl->tm < kd->mc ? tl->tm : kd->mc, kd->mr);
    *a_bytes = rd_panel_bytes(cl, cl->a_size, mc_max, kp_max);
    *b_bytes = cl->plan->kind == RD_KIND_STREAM ? 0 : rd_panel_bytes(cl, cl->b_size, nc_max, kp_max);
    if (stage != NULL) {    /* an A block, or (stage_b) a block of B panels, staged */
        const size_t sa = (size_t)mc_max * (size_t)kp_max * cl->a_src;
        const size_t sb = stage_b ? (size_t)nc_max * (size_t)kp_max * cl->b_src : 0;
        *stage = sa > sb ? sa : sb;
    }
}

/* Run every tile of the list: the team tiles by all threads together, one
 * after another, then each of the others by one thread. */
static int
rd_run_tiles(const rd_run_t *r, const rd_tiling_t *tl)
{
    const rd_call_t *cl = r->cl;
    const rd_ukr_desc_t *kd = &cl->plan->k;
    size_t a_bytes, b_bytes, stage_bytes;
    rd_pack_sizes(cl, tl, &a_bytes, &b_bytes, &stage_bytes, r->rhs->ridx != NULL);
    const int gathers = r->lhs->ridx != NULL || r->lhs->cidx != NULL || r->rhs->ridx != NULL;
    /* a 16-bit output's tile is computed in float32 here, tm x tn_max */
    const size_t t_bytes = r->narrow ? (size_t)tl->tm * (size_t)r->tn_max * sizeof(float) : 0;
    char *shared = tl->nteam > 0 ? (char *)rd_scratch(3, b_bytes) : NULL;
    int failed = tl->nteam > 0 && shared == NULL;

#ifdef _OPENMP
#pragma omp parallel num_threads(tl->nthreads) if (tl->nthreads > 1)
#endif
    {
        char *apack = (char *)rd_scratch(0, a_bytes);
        char *bpack = (char *)rd_scratch(1, b_bytes);
        float *tile32 = r->narrow ? (float *)rd_scratch(2, t_bytes) : NULL;
        /* an operand read through an index is staged a block at a time (rd_pack_block) */
        const int staged = !gathers || rd_scratch(6, stage_bytes) != NULL;
        int ok = apack != NULL && (bpack != NULL || b_bytes == 0) && (!r->narrow || tile32 != NULL)
                 && (tl->nteam == 0 || shared != NULL) && staged;
        if (!ok) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
        int tid = 0, nt = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        /* every thread meets the team's worksharing and barriers, the ones
         * without buffers computing nothing (the call then fails) */
        for (rd_int t = 0; shared != NULL && t < tl->nteam; t++)
            rd_run_tile(r, &tl->tiles[tl->order[t]], ok ? apack : NULL, shared, tile32,
                        ok ? tid : nt, nt);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (rd_int t = tl->nteam; t < tl->count; t++)
            if (ok)
                rd_run_tile(r, &tl->tiles[tl->order[t]], apack, bpack, tile32, 0, 1);
        if (r->stream)
            rd_store_fence();  /* before the barrier that ends the region */
        if (kd->release != NULL)
            kd->release();     /* this thread's tiles, if it ran a tile kernel */
    }
    return failed ? -1 : 0;
}

/* ------------------------------------------------------------ public API */

int
rd_call_init(rd_call_t *cl, const rd_plan_t *plan, const rd_in_t *lhs, const rd_in_t *rhs)
{
    const rd_ctype_desc_t *ct = &rd_ctypes[plan->ct];
    cl->plan = plan;
    cl->pack_a = cl->pack_b = NULL;
    cl->qpack_a = cl->qpack_b = NULL;
    if (lhs->q.s != NULL)
        cl->qpack_a = rd_qpacker(plan->ct, lhs->dtype, 0);
    else
        cl->pack_a = rd_packer(plan->ct, lhs->dtype, 0);
    if (rhs->q.s != NULL)
        cl->qpack_b = rd_qpacker(plan->ct, rhs->dtype, 1);
    else
        cl->pack_b = rd_packer(plan->ct, rhs->dtype, 1);
    /* prepacked B (panels > 0) is read where it lies, packed by nothing */
    if ((cl->pack_a == NULL && cl->qpack_a == NULL)
        || (rhs->panels == 0 && cl->pack_b == NULL && cl->qpack_b == NULL))
        return -2;
    cl->a_src = rd_dtype_size[lhs->dtype];
    cl->b_src = rd_dtype_size[rhs->dtype];
    cl->b_src_nibbles = rhs->dtype == RD_F4E2M1;
    cl->a_size = ct->a_size;
    cl->b_size = ct->b_size;
    cl->c_size = ct->c_size;
    cl->scale_size = ct->scale_size;
    /* the operands' scales are double for a float64 product, float otherwise */
    cl->q_size = plan->ct == RD_CT_F64 ? sizeof(double) : sizeof(float);
    cl->k_unit = ct->k_unit;
    /* panels that carry scales need them on both sides (prepacked B carries
     * them in its layout) */
    if (cl->scale_size && (lhs->q.s == NULL || (rhs->q.s == NULL && rhs->panels == 0)))
        return -2;
    return 0;
}

/* Stream an output of `elems` elements written with unit column stride and
 * not accumulated into? */
static int
rd_want_stream(const rd_call_t *cl, rd_int elems, rd_int out_cs, int accumulate)
{
    rd_int min = cl->plan->stream_min;
    return !accumulate && out_cs == 1 && min >= 0 && elems > 0
           && (double)elems * (double)cl->c_size >= (double)min;
}

static int
rd_run(const rd_plan_t *base, int mode, rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
       const rd_in_t *lhs, const rd_in_t *rhs, const rd_out_t *out, int accumulate)
{
    rd_call_t cl;
    rd_plan_t planned = *base, *plan = &planned;
    /* a streaming kernel reads float32 rows of unit stride where they lie */
    rd_plan_choose(plan, mode, k, n, ng, bounds, rhs->panels > 0,
                   plan->ct == RD_CT_F32 && rhs->panels == 0 && rhs->q.s == NULL
                   && rhs->dtype == RD_F32 && rhs->cs == 1 && rhs->ridx == NULL);
    int rc = rd_call_init(&cl, plan, lhs, rhs);
    if (rc != 0)
        return rc;
    rd_shape_t sh = {mode, bounds, mode == RD_MODE_CONTRACT ? k : 0, mode == RD_MODE_ROWS ? k : 0};
    rd_tiling_t tl;
    const int narrow = out->dtype == RD_BF16 || out->dtype == RD_F16;
    if (narrow && cl.c_size != sizeof(float))
        return -2;
    rd_int elems = mode == RD_MODE_ROWS ? (bounds[ng] - bounds[0]) * n : ng * k * n;
    /* the bytes a call reads and writes: lhs and output rows, the groups' weights */
    const double rows = (double)(bounds[ng] - bounds[0]);
    const double bytes = mode == RD_MODE_ROWS
        ? rows * (double)k * (double)cl.a_src + (double)ng * (double)k * (double)n * (double)cl.b_src
          + (double)elems * (double)cl.c_size
        : rows * ((double)k * (double)cl.a_src + (double)n * (double)cl.b_src)
          + (double)elems * (double)cl.c_size;
    if (rd_make_tiling(&tl, plan, &sh, ng, n, narrow, bytes) != 0)
        return -1;
    const rd_run_t run = {&cl, mode, bounds, lhs, rhs, out, mode == RD_MODE_ROWS ? k : 0, accumulate,
                          !narrow && rd_want_stream(&cl, elems, out->cs, accumulate), narrow,
                          rd_round_up(tl.tn, plan->k.nr)};
    rc = rd_run_tiles(&run, &tl);
    rd_free_tiling(&tl);
    return rc;
}

int
rd_ragged_rows(const rd_plan_t *plan, rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
               const rd_in_t *lhs, const rd_in_t *rhs, const rd_out_t *out, int accumulate)
{
    return rd_run(plan, RD_MODE_ROWS, k, n, ng, bounds, lhs, rhs, out, accumulate);
}

int
rd_ragged_contract(const rd_plan_t *plan, rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
                   const rd_in_t *lhs, const rd_in_t *rhs, const rd_out_t *out, int accumulate)
{
    return rd_run(plan, RD_MODE_CONTRACT, k, n, ng, bounds, lhs, rhs, out, accumulate);
}
