/*
 * Packing and the blocked GEMM loops for one dtype.  Included by rd_gemm.c
 * once per dtype with these macros defined:
 *   RD_T       element type (float, double)
 *   RD_MR      register block rows
 *   RD_NR      register block columns
 *   RD_FN(x)   name mangler, e.g. rd_s_##x
 *   RD_UKR     field of rd_context_t holding the micro-kernel (sgemm, dgemm)
 *   RD_BLK     field of rd_context_t holding the blocking (sblk, dblk)
 */

/* Pack the mc x kc block A[i][p] = a[i*rs + p*cs] into MR-row micro-panels:
 * panel q holds rows q*MR .. q*MR+MR-1 as dst[q*MR*kc + p*MR + i], the rows
 * past mc zero. */
static void
RD_FN(pack_a)(rd_int mc, rd_int kc, const RD_T *a, rd_int rs, rd_int cs,
              RD_T *restrict dst)
{
    for (rd_int i0 = 0; i0 < mc; i0 += RD_MR) {
        const RD_T *src = a + i0 * rs;
        rd_int mr = mc - i0 < RD_MR ? mc - i0 : RD_MR;
        if (mr == RD_MR && cs == 1) {
            for (rd_int p = 0; p < kc; p++)
                for (int i = 0; i < RD_MR; i++)
                    dst[p * RD_MR + i] = src[i * rs + p];
        }
        else if (mr == RD_MR && rs == 1) {
            for (rd_int p = 0; p < kc; p++)
                for (int i = 0; i < RD_MR; i++)
                    dst[p * RD_MR + i] = src[i + p * cs];
        }
        else {
            for (rd_int p = 0; p < kc; p++) {
                for (rd_int i = 0; i < mr; i++)
                    dst[p * RD_MR + i] = src[i * rs + p * cs];
                for (rd_int i = mr; i < RD_MR; i++)
                    dst[p * RD_MR + i] = 0;
            }
        }
        dst += RD_MR * kc;
    }
}

/* Pack the kc x nc panel B[p][j] = b[p*rs + j*cs] into NR-column
 * micro-panels: panel q holds columns q*NR .. q*NR+NR-1 as
 * dst[q*NR*kc + p*NR + j], the columns past nc zero. */
static void
RD_FN(pack_b)(rd_int kc, rd_int nc, const RD_T *b, rd_int rs, rd_int cs,
              RD_T *restrict dst)
{
    for (rd_int j0 = 0; j0 < nc; j0 += RD_NR) {
        const RD_T *src = b + j0 * cs;
        rd_int nr = nc - j0 < RD_NR ? nc - j0 : RD_NR;
        if (nr == RD_NR && cs == 1) {
            for (rd_int p = 0; p < kc; p++)
                for (int j = 0; j < RD_NR; j++)
                    dst[p * RD_NR + j] = src[p * rs + j];
        }
        else if (nr == RD_NR && rs == 1) {
            for (int j = 0; j < RD_NR; j++)
                for (rd_int p = 0; p < kc; p++)
                    dst[p * RD_NR + j] = src[j * cs + p];
        }
        else {
            for (rd_int p = 0; p < kc; p++) {
                for (rd_int j = 0; j < nr; j++)
                    dst[p * RD_NR + j] = src[p * rs + j * cs];
                for (rd_int j = nr; j < RD_NR; j++)
                    dst[p * RD_NR + j] = 0;
            }
        }
        dst += RD_NR * kc;
    }
}

/* C[M x N] (+)= A[M x K] B[K x N], all operands strided, with the BLIS loop
 * nest: NC panels of B, KC blocks of the contraction, MC blocks of A, then
 * NR x MR micro-tiles.  apack holds MC*KC elements, bpack KC*roundup(NC,NR).
 * K == 0 writes zeros (or leaves C unchanged when accumulating). */
static void
RD_FN(gemm_block)(const rd_context_t *ctx, rd_int M, rd_int N, rd_int K,
                  const RD_T *a, rd_int a_rs, rd_int a_cs,
                  const RD_T *b, rd_int b_rs, rd_int b_cs,
                  RD_T *c, rd_int c_rs, rd_int c_cs, int accumulate,
                  RD_T *apack, RD_T *bpack)
{
    const rd_int MC = ctx->RD_BLK.mc, KC = ctx->RD_BLK.kc, NC = ctx->RD_BLK.nc;
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
            int acc = accumulate || pc > 0;
            RD_FN(pack_b)(kc, nc, b + pc * b_rs + jc * b_cs, b_rs, b_cs, bpack);
            for (rd_int ic = 0; ic < M; ic += MC) {
                rd_int mc = M - ic < MC ? M - ic : MC;
                RD_FN(pack_a)(mc, kc, a + ic * a_rs + pc * a_cs, a_rs, a_cs, apack);
                for (rd_int jr = 0; jr < nc; jr += RD_NR) {
                    int nr = (int)(nc - jr < RD_NR ? nc - jr : RD_NR);
                    const RD_T *bp = bpack + jr * kc;
                    RD_T *cj = c + ic * c_rs + (jc + jr) * c_cs;
                    for (rd_int ir = 0; ir < mc; ir += RD_MR) {
                        int mr = (int)(mc - ir < RD_MR ? mc - ir : RD_MR);
                        ctx->RD_UKR(kc, apack + ir * kc, bp, cj + ir * c_rs,
                                    c_rs, c_cs, mr, nr, acc);
                    }
                }
            }
        }
    }
}

/* Run every tile of the list, each owned by one thread.  The geometry of a
 * tile is resolved by `mode`: RD_MODE_ROWS (ragged rows of lhs) or
 * RD_MODE_CONTRACT (ragged contraction). */
static int
RD_FN(run_tiles)(const rd_context_t *ctx, const rd_tiling_t *tl, int mode,
                 rd_int n, const rd_int *bounds,
                 const RD_T *lhs, rd_int lhs_rs, rd_int lhs_cs,
                 const RD_T *rhs, rd_int rhs_gs, rd_int rhs_rs, rd_int rhs_cs,
                 RD_T *out, rd_int out_gs, rd_int out_rs, rd_int out_cs,
                 rd_int k, int accumulate)
{
    const rd_int MC = ctx->RD_BLK.mc, KC = ctx->RD_BLK.kc, NC = ctx->RD_BLK.nc;
    const rd_int nc_max = rd_round_up(tl->tn < NC ? tl->tn : NC, RD_NR);
    const size_t a_bytes = (size_t)rd_round_up(MC, RD_MR) * (size_t)KC * sizeof(RD_T);
    const size_t b_bytes = (size_t)nc_max * (size_t)KC * sizeof(RD_T);
    int failed = 0;
    (void)n;

#ifdef _OPENMP
#pragma omp parallel num_threads(tl->nthreads) if (tl->nthreads > 1)
#endif
    {
        RD_T *apack = (RD_T *)rd_aligned_alloc(a_bytes);
        RD_T *bpack = (RD_T *)rd_aligned_alloc(b_bytes);
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
                                  out_rs, out_cs, accumulate, apack, bpack);
            }
            else {
                /* rows index lhs's first axis; the contraction runs over the
                 * group's rows [bounds[g], bounds[g+1]) of rhs */
                const rd_int s = bounds[g], kg = bounds[g + 1] - bounds[g];
                RD_FN(gemm_block)(ctx, rows, cols, kg,
                                  lhs + tile->r0 * lhs_rs + s * lhs_cs, lhs_rs, lhs_cs,
                                  rhs + s * rhs_rs + tile->c0 * rhs_cs, rhs_rs, rhs_cs,
                                  out + g * out_gs + tile->r0 * out_rs + tile->c0 * out_cs,
                                  out_rs, out_cs, accumulate, apack, bpack);
            }
        }
        rd_aligned_free(apack);
        rd_aligned_free(bpack);
    }
    return failed ? -1 : 0;
}
