/*
 * One packing routine for quantized values, for one (storage type -> packed
 * type) pair.  Included by frame/rd_pack.c with these macros defined:
 *   RD_SRC      storage element type (int8_t, uint8_t for float8 bit patterns)
 *   RD_DST      packed element type (float, double), also the type of the
 *               scales and zero points
 *   RD_CVT(v)   the stored value as an RD_DST (exact)
 *   RD_FN(x)    name mangler
 *   RD_LOAD(x, i)  optional: the value at element offset i of x as an
 *               RD_DST (default RD_CVT(x[i]); 4-bit values, addressed in
 *               nibbles, define it)
 *
 * qpack(rows, depth, src, rs, cs, r, dst, qb): as the plain routines
 * (rd_pack_impl.h), X[i][p] = src[i*rs + p*cs] into r-row micro-panels,
 * panel q holding rows q*r .. q*r+r-1 as dst[q*r*depth + p*r + i], rows past
 * `rows` zero; each value written as (RD_CVT(x) - z) * s with the scale s
 * and zero point z of its tile (see rd_qblock_t).  The scale is looked up
 * once per row and run of depth within one tile, never per element.
 */
#ifndef RD_LOAD
#define RD_LOAD(x, i) RD_CVT((x)[i])
#endif
static void
RD_FN(qpack)(rd_int rows, rd_int depth, const void *src_, rd_int rs, rd_int cs,
             int r, void *dst_, const rd_qblock_t *qb)
{
    const RD_SRC *src = (const RD_SRC *)src_;
    const RD_DST *scale = (const RD_DST *)qb->s;
    const RD_DST *zero = (const RD_DST *)qb->z;
    RD_DST *restrict dst = (RD_DST *)dst_;
    for (rd_int i0 = 0; i0 < rows; i0 += r) {
        rd_int have = rows - i0 < r ? rows - i0 : r;
        for (rd_int i = 0; i < have; i++) {
            const RD_SRC *x = src + (i0 + i) * rs;
            const rd_int row_tile = (qb->i0 + i0 + i) / qb->tr;
            const RD_DST *s = scale + row_tile * qb->rs;
            const RD_DST *z = zero != NULL ? zero + row_tile * qb->rs : NULL;
            RD_DST *col = dst + i;
            rd_int p = 0;
            while (p < depth) {
                /* the run of p within one tile along the depth */
                const rd_int t = (qb->p0 + p) / qb->tp;
                rd_int end = (t + 1) * qb->tp - qb->p0;
                if (end > depth)
                    end = depth;
                const RD_DST sc = s[t * qb->ps];
                const RD_DST zp = z != NULL ? z[t * qb->ps] : (RD_DST)0;
                if (cs == 1)
                    for (; p < end; p++)
                        col[p * r] = (RD_LOAD(x, p) - zp) * sc;
                else
                    for (; p < end; p++)
                        col[p * r] = (RD_LOAD(x, p * cs) - zp) * sc;
            }
        }
        for (rd_int i = have; i < r; i++)
            for (rd_int p = 0; p < depth; p++)
                dst[p * r + i] = 0;
        dst += (rd_int)r * depth;
    }
}

#undef RD_SRC
#undef RD_DST
#undef RD_CVT
#undef RD_FN
#undef RD_LOAD
