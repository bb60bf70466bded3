/*
 * One packing routine into bfloat16 k-pairs (RD_CT_BF16DP), for one storage
 * type.  Included by frame/rd_pack_dot.c with these macros defined:
 *   RD_SRC      storage element type (uint16_t bfloat16 bits, float)
 *   RD_CVT(v)   the bfloat16 bits of a stored value
 *   RD_FN(x)    name mangler
 *   RD_PAIR_WORDS8  optional (values kept as they are): rd_pack_words8, the pairs
 *               of eight rows as 32-bit words
 *   RD_PAIRS32(d, x0, x1), RD_PAIRS32_OK()  optional: one pair step of 32
 *               rows contiguous in x0, x1 (NULL: zeros) written to d, and
 *               whether the CPU runs it
 *
 * pack(rows, depth, src, rs, cs, r, dst): the rows x depth block
 * X[i][p] = src[i*rs + p*cs] into r-row micro-panels of depth kp = depth
 * rounded up to even, panel q holding rows q*r .. q*r+r-1 with
 * X[i][p] at dst[(p/2)*2r + 2i + p%2] (the two elements of a pair side by
 * side, a 32-bit word a row), padding (odd depth, rows past `rows`) zero.
 * It serves A (r = MR) and B read as its transpose (r = NR); extern, for
 * the tables of frame/rd_pack.c (rd_pack_int.h declares it).
 */
static inline __attribute__((always_inline)) void
RD_FN(pairs)(uint16_t *restrict d, const RD_SRC *restrict x0, const RD_SRC *restrict x1, int r)
{
    /* one pair step of r rows whose values lie contiguous in x0 (step p)
     * and x1 (step p + 1, or NULL past the depth) */
    if (x1 != NULL)
        for (int i = 0; i < r; i++) {
            d[2 * i] = RD_CVT(x0[i]);
            d[2 * i + 1] = RD_CVT(x1[i]);
        }
    else
        for (int i = 0; i < r; i++) {
            d[2 * i] = RD_CVT(x0[i]);
            d[2 * i + 1] = 0;
        }
}

RD_PACK_CLONES void
RD_FN(pack)(rd_int rows, rd_int depth, const void *src_, rd_int rs, rd_int cs, int r, void *dst_)
{
    const RD_SRC *src = (const RD_SRC *)src_;
    uint16_t *restrict dst = (uint16_t *)dst_;
    const rd_int kp = (depth + 1) / 2 * 2;
    const rd_int panel = (rd_int)r * kp;
    rd_int i0 = 0;
    if (rs == 1) {
        /* the values of each step lie contiguous across the rows (a
         * row-major B, a transposed A): two steps at a time, each line of
         * the source read once, dealt to the panels */
        const rd_int full = rows / r;
#ifdef RD_PAIRS32
        /* 32 bfloat16 columns a panel, two steps interleaved by vpermt2w */
        if (r == 32 && RD_PAIRS32_OK()) {
            for (rd_int p = 0; p < depth; p += 2) {
                const RD_SRC *x0 = src + p * cs, *x1 = p + 1 < depth ? x0 + cs : NULL;
                for (rd_int q = 0; q < full; q++)
                    RD_PAIRS32(dst + q * panel + p * r, x0 + q * r, x1 != NULL ? x1 + q * r : NULL);
            }
            i0 = full * r;
            dst += full * panel;
            goto rest;
        }
#endif
        for (rd_int p = 0; p < depth; p += 2) {
            const RD_SRC *x0 = src + p * cs, *x1 = p + 1 < depth ? x0 + cs : NULL;
            for (rd_int q = 0; q < full; q++)
                RD_FN(pairs)(dst + q * panel + p * r, x0 + q * r, x1 != NULL ? x1 + q * r : NULL, r);
        }
        i0 = full * r;
        dst += full * panel;
    }
#ifdef RD_PAIRS32
rest:
#endif
    for (; i0 < rows; i0 += r) {
        const rd_int have = rows - i0 < r ? rows - i0 : r;
        rd_int i = 0;
#ifdef RD_PAIR_WORDS8
        /* a pair is a 32-bit word of a row (values as they are): eight rows
         * at a time transposed in registers, the odd last step below */
        if (cs == 1 && depth >= 2)
            for (; i + 8 <= have; i += 8) {
                const RD_SRC *x = src + (i0 + i) * rs;
                RD_PAIR_WORDS8((const char *)x, (rd_int)sizeof(RD_SRC) * rs, depth / 2, (char *)(dst + 2 * i), r);
                if (depth % 2)
                    for (int t = 0; t < 8; t++) {
                        dst[(depth - 1) * r + 2 * (i + t)] = RD_CVT(x[t * rs + depth - 1]);
                        dst[(depth - 1) * r + 2 * (i + t) + 1] = 0;
                    }
            }
#endif
        for (; i < have; i++) {
            const RD_SRC *x = src + (i0 + i) * rs;
            uint16_t *d = dst + 2 * i;
            rd_int p = 0;
            if (cs == 1)
                for (; p + 1 < depth; p += 2) {
                    d[p * r] = RD_CVT(x[p]);
                    d[p * r + 1] = RD_CVT(x[p + 1]);
                }
            for (; p + 1 < depth; p += 2) {
                d[p * r] = RD_CVT(x[p * cs]);
                d[p * r + 1] = RD_CVT(x[(p + 1) * cs]);
            }
            if (p < depth) {
                d[p * r] = RD_CVT(x[p * cs]);
                d[p * r + 1] = 0;
            }
        }
        for (rd_int i = have; i < r; i++)
            for (rd_int p = 0; p < kp; p += 2) {
                dst[p * r + 2 * i] = 0;
                dst[p * r + 2 * i + 1] = 0;
            }
        dst += panel;
    }
}

#undef RD_SRC
#undef RD_CVT
#undef RD_FN
#undef RD_PAIRS32
#undef RD_PAIRS32_OK
#undef RD_PAIR_WORDS8
