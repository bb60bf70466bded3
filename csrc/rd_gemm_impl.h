/*
 * Packing and the blocked GEMM loops for one dtype.  Included by rd_gemm.c
 * once per dtype with these macros defined:
 *   RD_T       element type (float, double)
 *   RD_FN(x)   name mangler, e.g. rd_s_##x
 *   RD_CFG     field of rd_context_t holding the kernel configuration (s, d)
 */

/* Copy one row of a packed panel; `w` is a compile-time constant at every
 * call below, so each case compiles to a few vector moves (not a call to
 * memmove, which gcc would otherwise substitute for the loop). */
static inline __attribute__((always_inline)) void
RD_FN(copy_w)(RD_T *restrict dst, const RD_T *restrict src, int w)
{
    for (int j = 0; j < w; j++)
        dst[j] = src[j];
}

/* Pack the mc x kc block A[i][p] = a[i*rs + p*cs] into mr-row micro-panels:
 * panel q holds rows q*mr .. q*mr+mr-1 as dst[q*mr*kc + p*mr + i], the rows
 * past mc zero. */
static void
RD_FN(pack_a)(rd_int mc, rd_int kc, const RD_T *a, rd_int rs, rd_int cs,
              int mr, RD_T *restrict dst)
{
    for (rd_int i0 = 0; i0 < mc; i0 += mr) {
        const RD_T *src = a + i0 * rs;
        rd_int rows = mc - i0 < mr ? mc - i0 : mr;
        if (rows == mr && rs == 1) {
            /* column-major A (a transposed operand): columns are contiguous */
            switch (mr) {
            case 6:
                for (rd_int p = 0; p < kc; p++)
                    RD_FN(copy_w)(dst + p * 6, src + p * cs, 6);
                break;
            case 12:
                for (rd_int p = 0; p < kc; p++)
                    RD_FN(copy_w)(dst + p * 12, src + p * cs, 12);
                break;
            default:
                for (rd_int p = 0; p < kc; p++)
                    RD_FN(copy_w)(dst + p * mr, src + p * cs, mr);
            }
        }
        else if (rows == mr && cs == 1) {
            /* row-major A: read each row sequentially, scatter into the panel */
            for (rd_int i = 0; i < mr; i++) {
                const RD_T *row = src + i * rs;
                RD_T *col = dst + i;
                for (rd_int p = 0; p < kc; p++)
                    col[p * mr] = row[p];
            }
        }
        else {
            for (rd_int p = 0; p < kc; p++) {
                for (rd_int i = 0; i < rows; i++)
                    dst[p * mr + i] = src[i * rs + p * cs];
                for (rd_int i = rows; i < mr; i++)
                    dst[p * mr + i] = 0;
            }
        }
        dst += (rd_int)mr * kc;
    }
}

/* Pack the kc x nc panel B[p][j] = b[p*rs + j*cs] into nr-column
 * micro-panels: panel q holds columns q*nr .. q*nr+nr-1 as
 * dst[q*nr*kc + p*nr + j], the columns past nc zero. */
static void
RD_FN(pack_b)(rd_int kc, rd_int nc, const RD_T *b, rd_int rs, rd_int cs,
              int nr, RD_T *restrict dst)
{
    for (rd_int j0 = 0; j0 < nc; j0 += nr) {
        const RD_T *src = b + j0 * cs;
        rd_int cols = nc - j0 < nr ? nc - j0 : nr;
        if (cols == nr && cs == 1) {
            /* row-major B: one short contiguous piece of each row (written
             * to the panel sequentially; a row-streaming order would scatter
             * the stores over panels a power of two apart, all in one cache
             * set).  libc's memcpy picks the widest vector moves the CPU has. */
            for (rd_int p = 0; p < kc; p++)
                memcpy(dst + p * nr, src + p * rs, sizeof(RD_T) * (size_t)nr);
        }
        else if (cols == nr && rs == 1) {
            /* transposed B: each column is contiguous along p */
            for (rd_int j = 0; j < nr; j++) {
                const RD_T *col = src + j * cs;
                RD_T *d = dst + j;
                for (rd_int p = 0; p < kc; p++)
                    d[p * nr] = col[p];
            }
        }
        else {
            for (rd_int p = 0; p < kc; p++) {
                for (rd_int j = 0; j < cols; j++)
                    dst[p * nr + j] = src[p * rs + j * cs];
                for (rd_int j = cols; j < nr; j++)
                    dst[p * nr + j] = 0;
            }
        }
        dst += (rd_int)nr * kc;
    }
}

/* C[M x N] (+)= A[M x K] B[K x N], all operands strided, with the BLIS loop
 * nest: NC panels of B, KC blocks of the contraction, MC blocks of A, then
 * NR x MR micro-tiles.  apack holds roundup(MC,MR)*KC elements, bpack
 * KC*roundup(min(N,NC),NR).  K == 0 writes zeros (or leaves C unchanged
 * when accumulating).  With `stream`, a C that one KC block completes (it
 * is written once, never read back here) gets non-temporal stores. */
static void
RD_FN(gemm_block)(const rd_context_t *ctx, rd_int M, rd_int N, rd_int K,
                  const RD_T *a, rd_int a_rs, rd_int a_cs,
                  const RD_T *b, rd_int b_rs, rd_int b_cs,
                  RD_T *c, rd_int c_rs, rd_int c_cs, int accumulate,
                  int stream, RD_T *apack, RD_T *bpack)
{
    const rd_int MC = ctx->RD_CFG.mc, KC = ctx->RD_CFG.kc, NC = ctx->RD_CFG.nc;
    const int MR = ctx->RD_CFG.mr, NR = ctx->RD_CFG.nr;
    if (K == 0) {
        if (!accumulate)
            for (rd_int i = 0; i < M; i++)
                for (rd_int j = 0; j < N; j++)
                    c[i * c_rs + j * c_cs] = 0;
        return;
    }
    for (rd_int jc = 0; jc < N; jc += NC) {
        rd_int nc = N - jc < NC ? N - jc : NC;
        for (rd_int pc = 0; pc < K; pc += KC) {
            rd_int kc = K - pc < KC ? K - pc : KC;
            int acc = accumulate || pc > 0 ? RD_ADD
                      : stream && K <= KC ? RD_STREAM : RD_STORE;
            RD_FN(pack_b)(kc, nc, b + pc * b_rs + jc * b_cs, b_rs, b_cs, NR, bpack);
            for (rd_int ic = 0; ic < M; ic += MC) {
                rd_int mc = M - ic < MC ? M - ic : MC;
                RD_FN(pack_a)(mc, kc, a + ic * a_rs + pc * a_cs, a_rs, a_cs, MR, apack);
                for (rd_int jr = 0; jr < nc; jr += NR) {
                    int nr = (int)(nc - jr < NR ? nc - jr : NR);
                    const RD_T *bp = bpack + jr * kc;
                    RD_T *cj = c + ic * c_rs + (jc + jr) * c_cs;
                    for (rd_int ir = 0; ir < mc; ir += MR) {
                        int mr = (int)(mc - ir < MR ? mc - ir : MR);
                        ctx->RD_CFG.ukr(kc, apack + ir * kc, bp, cj + ir * c_rs,
                                        c_rs, c_cs, mr, nr, acc);
                    }
                }
            }
        }
    }
}

/* Run every tile of the list, each owned by one thread.  The geometry of a
 * tile is resolved by `mode`: RD_MODE_ROWS (ragged rows of lhs) or
 * RD_MODE_CONTRACT (ragged contraction).  `stream`: see gemm_block. */
static int
RD_FN(run_tiles)(const rd_context_t *ctx, const rd_tiling_t *tl, int mode,
                 const rd_int *bounds,
                 const RD_T *lhs, rd_int lhs_rs, rd_int lhs_cs,
                 const RD_T *rhs, rd_int rhs_gs, rd_int rhs_rs, rd_int rhs_cs,
                 RD_T *out, rd_int out_gs, rd_int out_rs, rd_int out_cs,
                 rd_int k, int accumulate, int stream)
{
    const rd_int MC = ctx->RD_CFG.mc, KC = ctx->RD_CFG.kc, NC = ctx->RD_CFG.nc;
    const int MR = ctx->RD_CFG.mr, NR = ctx->RD_CFG.nr;
    const rd_int nc_max = rd_round_up(tl->tn < NC ? tl->tn : NC, NR);
    const size_t a_bytes = (size_t)rd_round_up(MC, MR) * (size_t)KC * sizeof(RD_T);
    const size_t b_bytes = (size_t)nc_max * (size_t)KC * sizeof(RD_T);
    int failed = 0;

#ifdef _OPENMP
#pragma omp parallel num_threads(tl->nthreads) if (tl->nthreads > 1)
#endif
    {
        RD_T *apack = (RD_T *)rd_scratch(0, a_bytes);
        RD_T *bpack = (RD_T *)rd_scratch(1, b_bytes);
        int ok = apack != NULL && bpack != NULL;
        if (!ok) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (rd_int t = 0; t < tl->count; t++) {
            if (!ok)
                continue;
            const rd_tile_t *tile = &tl->tiles[tl->order[t]];
            const rd_int g = tile->g;
            const rd_int rows = tile->r1 - tile->r0, cols = tile->c1 - tile->c0;
            if (mode == RD_MODE_ROWS) {
                /* rows are absolute rows of lhs/out; rhs[g] is k x n */
                RD_FN(gemm_block)(ctx, rows, cols, k,
                                  lhs + tile->r0 * lhs_rs, lhs_rs, lhs_cs,
                                  rhs + g * rhs_gs + tile->c0 * rhs_cs, rhs_rs, rhs_cs,
                                  out + tile->r0 * out_rs + tile->c0 * out_cs,
                                  out_rs, out_cs, accumulate, stream, apack, bpack);
            }
            else {
                /* rows index lhs's first axis; the contraction runs over the
                 * group's rows [bounds[g], bounds[g+1]) of rhs */
                const rd_int s = bounds[g], kg = bounds[g + 1] - bounds[g];
                RD_FN(gemm_block)(ctx, rows, cols, kg,
                                  lhs + tile->r0 * lhs_rs + s * lhs_cs, lhs_rs, lhs_cs,
                                  rhs + s * rhs_rs + tile->c0 * rhs_cs, rhs_rs, rhs_cs,
                                  out + g * out_gs + tile->r0 * out_rs + tile->c0 * out_cs,
                                  out_rs, out_cs, accumulate, stream, apack, bpack);
            }
        }
        if (stream)
            rd_store_fence();  /* before the barrier that ends the region */
    }
    return failed ? -1 : 0;
}
