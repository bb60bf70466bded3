/*
 * One packing routine, for one (storage type -> packed type) pair.  Included
 * by frame/rd_pack.c with these macros defined:
 *   RD_SRC      storage element type (float, double, uint16_t for 16-bit floats)
 *   RD_DST      packed element type (float, double)
 *   RD_CVT(v)   the packed value of a stored one
 *   RD_SAME     1 when the storage and packed types are one type (no conversion)
 *   RD_FN(x)    name mangler
 *   RD_ATTR     attributes of the routine (target ISA; optional)
 *   RD_RUN8(d, s)  converts 8 contiguous values at once (optional; an
 *               instruction the compiler does not find by itself)
 *   RD_WORDS8(src, rs_bytes, depth, dst, r)  optional: for 4-byte values kept
 *               as they are, eight rows of `depth` contiguous values, rs_bytes
 *               apart, written to dst[p*r + i] (i < 8)
 *   RD_HALVES   defined: each r-wide row of a panel holds its two halves
 *               interleaved, column i at position RD_AT(i, r) (2i in the
 *               first half, 2(i - r/2) + 1 in the second; r even)
 *
 * pack(rows, depth, src, rs, cs, r, dst): the rows x depth block
 * X[i][p] = src[i*rs + p*cs] into r-row micro-panels, panel q holding rows
 * q*r .. q*r+r-1 as dst[q*r*depth + p*r + i], rows past `rows` zero.  It
 * serves A (r = MR) and B, read as its transpose (r = NR), for any r.
 * The macros are undefined at the end, ready for the next instantiation.
 */

/* dst[0..w) = src[0..w): a run of w contiguous values, converted; copied in
 * chunks of fixed width so that every chunk compiles to vector moves,
 * whatever the register block. */
#ifndef RD_ATTR
#define RD_ATTR RD_PACK_CLONES
#define RD_RUN_ATTR
#endif
#ifdef RD_HALVES
#define RD_AT(i, r) ((i) < (r) / 2 ? 2 * (i) : 2 * ((i) - (r) / 2) + 1)
#else
#define RD_AT(i, r) (i)
#endif
static inline __attribute__((always_inline)) RD_RUN_ATTR void
RD_FN(run)(RD_DST *restrict dst, const RD_SRC *restrict src, int w)
{
#ifdef RD_HALVES
    /* a whole row (w == r): the halves interleaved */
    const int h = w / 2;
    for (int j = 0; j < h; j++) {
        dst[2 * j] = RD_CVT(src[j]);
        dst[2 * j + 1] = RD_CVT(src[h + j]);
    }
    return;
#endif
#if RD_SAME
    /* a long run of one type: libc's memcpy picks the widest moves the CPU
     * has */
    if (w >= 16) {
        memcpy(dst, src, sizeof(RD_DST) * (size_t)w);
        return;
    }
#endif
    int j = 0;
#ifdef RD_RUN8
    for (; j + 8 <= w; j += 8)
        RD_RUN8(dst + j, src + j);
#endif
    for (; j + 16 <= w; j += 16)
        for (int t = 0; t < 16; t++)
            dst[j + t] = RD_CVT(src[j + t]);
    for (; j + 8 <= w; j += 8)
        for (int t = 0; t < 8; t++)
            dst[j + t] = RD_CVT(src[j + t]);
    for (; j + 4 <= w; j += 4)
        for (int t = 0; t < 4; t++)
            dst[j + t] = RD_CVT(src[j + t]);
    for (; j < w; j++)
        dst[j] = RD_CVT(src[j]);
}

RD_ATTR static void
RD_FN(pack)(rd_int rows, rd_int depth, const void *src_, rd_int rs, rd_int cs,
            int r, void *dst_)
{
    const RD_SRC *src = (const RD_SRC *)src_;
    RD_DST *restrict dst = (RD_DST *)dst_;
    rd_int i0 = 0;
    if (rs == 1) {
        /* the values of each p are contiguous across all rows (a row-major
         * B, a transposed A): read them in memory order, p after p, each
         * line of the source once, and deal each run of r to its panel.
         * (Panel after panel instead would walk the source in strips of r
         * values a whole line apart, which the memory streams badly.) */
        const rd_int full = rows / r;
        const rd_int panel = (rd_int)r * depth;
        for (rd_int p = 0; p < depth; p++) {
            const RD_SRC *x = src + p * cs;
            for (rd_int q = 0; q < full; q++)
                RD_FN(run)(dst + q * panel + p * r, x + q * r, r);
        }
        i0 = full * r;
        dst += full * panel;
    }
    for (; i0 < rows; i0 += r) {
        const RD_SRC *x = src + i0 * rs;
        rd_int full = rows - i0 >= r;
        if (cs == 1) {
            /* each row is contiguous along p: read rows sequentially and
             * scatter into the panel (a last panel of fewer rows zeroed
             * whole first: one pass of wide stores, where zeroing its
             * missing rows value by value cost more than its rows' values,
             * a few rows of a decode step) */
            const int have = full ? r : (int)(rows - i0);
            int i = 0;
            if (!full)
                memset(dst, 0, sizeof(RD_DST) * (size_t)r * (size_t)depth);
#ifdef RD_WORDS8
            /* 4-byte values as they are: eight rows at a time transposed
             * in registers (rd_words8), the rest one by one */
            if (r % 8 == 0 || r > 8)
                for (; i + 8 <= have; i += 8)
                    RD_WORDS8((const char *)(x + i * rs), (rd_int)sizeof(RD_SRC) * rs, depth,
                              (char *)(dst + i), r);
#endif
            for (; i < have; i++) {
                const RD_SRC *row = x + i * rs;
                RD_DST *col = dst + RD_AT(i, r);
#if RD_SAME || defined(RD_HALVES)
                for (rd_int p = 0; p < depth; p++)
                    col[p * r] = RD_CVT(row[p]);
#else
                /* convert a stretch of the row with vector instructions,
                 * then scatter it */
                RD_DST tmp[64];
                for (rd_int p0 = 0; p0 < depth; p0 += 64) {
                    int w = depth - p0 < 64 ? (int)(depth - p0) : 64;
                    RD_FN(run)(tmp, row + p0, w);
                    for (int p = 0; p < w; p++)
                        col[(p0 + p) * r] = tmp[p];
                }
#endif
            }
        }
        else {
            rd_int have = full ? r : rows - i0;
            for (rd_int p = 0; p < depth; p++) {
                for (rd_int i = 0; i < have; i++)
                    dst[p * r + RD_AT(i, r)] = RD_CVT(x[i * rs + p * cs]);
                for (rd_int i = have; i < r; i++)
                    dst[p * r + RD_AT(i, r)] = 0;
            }
        }
        dst += (rd_int)r * depth;
    }
}

#undef RD_SRC
#undef RD_DST
#undef RD_CVT
#undef RD_SAME
#undef RD_FN
#undef RD_ATTR
#undef RD_RUN_ATTR
#undef RD_HALVES
#undef RD_AT
#undef RD_RUN8
#undef RD_WORDS8
