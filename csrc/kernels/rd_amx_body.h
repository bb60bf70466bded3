/*
 * The AMX micro-kernels, written once over the tile operations and
 * included twice by kernels/rd_amx.c: with the instructions (family "amx")
 * and with their emulation in C (family "amx-twin").  The includer defines
 *   RD_TNAME(x)          name mangler
 *   RD_TTARGET           the functions' target attribute (or nothing)
 *   TENTER()             this thread's tile configuration, loaded once
 *   TZERO(t), TLOAD(t, p, stride), TSTORE(t, p, stride)
 *   TDPBF16(c, a, b), TDPBUSD(c, a, b)
 * with t, c, a, b literal tile numbers; it undefines them at its end.
 *
 * Tiles: 0-3 the accumulators C00 C01 C10 C11 (rows 0-15 / 16-31 by
 * columns 0-15 / 16-31 of the 32 x 32 block), 4-5 the two 16-row tiles of
 * A, 6-7 the two 16-column tiles of B; every tile 16 rows of 64 bytes.
 * Per chunk of the contraction (32 bfloat16 steps or 64 int8 steps): two
 * loads of A, two of B, four tile products.  A block of 16 rows or fewer
 * (the last rows of a group) or 16 columns or fewer runs only the tiles it
 * needs.  A packed B micro-panel (NR = 32) holds a chunk as 16 pair (quad)
 * rows of 128 bytes, so the tile of columns 16-31 starts 64 bytes into
 * each row.  The chunk past the last whole one is copied into zero-padded
 * buffers first: a tile reads 64 bytes a row, past the end of the panel.
 */

/* One chunk: A rows at ap (stride as bytes), B rows at bp (stride 128). */
#define RD_TCHUNK(DP, ap, as, bp)                                           \
    {                                                                       \
        TLOAD(6, (bp), 128);                                                \
        TLOAD(4, (ap), (as));                                               \
        DP(0, 4, 6);                                                        \
        if (two_c) {                                                        \
            TLOAD(7, (bp) + 64, 128);                                       \
            DP(1, 4, 7);                                                    \
        }                                                                   \
        if (two_r) {                                                        \
            TLOAD(5, (ap) + 16 * (as), (as));                               \
            DP(2, 5, 6);                                                    \
            if (two_c)                                                      \
                DP(3, 5, 7);                                                \
        }                                                                   \
    }

/* The accumulators in use: to zero, from C's rows at p (stride bytes), or
 * into it. */
#define RD_TALL(OP, p, stride)                                              \
    {                                                                       \
        OP(0, (p), (stride));                                               \
        if (two_c)                                                          \
            OP(1, (p) + 64, (stride));                                      \
        if (two_r) {                                                        \
            OP(2, (p) + 16 * (stride), (stride));                           \
            if (two_c)                                                      \
                OP(3, (p) + 16 * (stride) + 64, (stride));                  \
        }                                                                   \
    }
#define RD_TZERO3(t, p, s) TZERO(t)

/* The chunks of a block: `full` whole ones, then the rest (rem_bytes of
 * each A row, rem_rows pair / quad rows of B) from zero-padded copies. */
#define RD_TCHUNKS(DP, UNIT_BYTES)                                          \
    for (rd_int q = 0; q < full; q++)                                       \
        RD_TCHUNK(DP, a + q * 64, as, b + q * 2048)                         \
    if (rem_bytes > 0) {                                                    \
        unsigned char abuf[32 * 64] __attribute__((aligned(64)));          \
        unsigned char bbuf[16 * 128] __attribute__((aligned(64)));         \
        memset(abuf, 0, sizeof abuf);                                       \
        memset(bbuf, 0, sizeof bbuf);                                       \
        for (int i = 0; i < (two_r ? 32 : 16); i++)                         \
            memcpy(abuf + 64 * i, a + i * as + full * 64, (size_t)rem_bytes); \
        memcpy(bbuf, b + full * 2048, (size_t)(rem_bytes / (UNIT_BYTES)) * 128); \
        RD_TCHUNK(DP, abuf, 64, bbuf)                                       \
    }

/* bfloat16 (RD_CT_BF16TILE): a 32 x kp row-major A panel, a B micro-panel of
 * k-pairs; acc = C (RD_ADD) or 0, += A B, C = acc. */
RD_TTARGET static void
RD_TNAME(bf16)(rd_int kc, const void *a_, const void *b_, void *c_, rd_int rs_c, rd_int cs_c,
               int m, int n, int mode)
{
    const unsigned char *a = (const unsigned char *)a_, *b = (const unsigned char *)b_;
    float *c = (float *)c_;
    const rd_int kp = (kc + 1) / 2 * 2, as = 2 * kp;
    const rd_int full = kp / 32, rem_bytes = 2 * (kp - 32 * full);
    const int two_r = m > 16, two_c = n > 16;
    /* the whole block straight from and to C: every row and column valid,
     * C's rows contiguous */
    const int direct = m == 32 && n == 32 && cs_c == 1;
    float buf[32 * 32] __attribute__((aligned(64)));
    TENTER();
    if (mode != RD_ADD)
        RD_TALL(RD_TZERO3, (char *)buf, 128)
    else if (direct)
        RD_TALL(TLOAD, (char *)c, 4 * rs_c)
    else {
        memset(buf, 0, sizeof buf);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                buf[32 * i + j] = c[i * rs_c + j * cs_c];
        RD_TALL(TLOAD, (char *)buf, 128)
    }
    RD_TCHUNKS(TDPBF16, 4)
    if (direct) {
        RD_TALL(TSTORE, (char *)c, 4 * rs_c)
        return;
    }
    RD_TALL(TSTORE, (char *)buf, 128)
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            c[i * rs_c + j * cs_c] = buf[32 * i + j];
}

/* int8 (RD_CT_U8S8TILE): rows of A + 128 (kq bytes, then the row's
 * trailer), a B micro-panel of k-quads and its trailer; the int32 sums
 * from zero, then RD_CT_U8S8's epilogue into C. */
RD_TTARGET static void
RD_TNAME(u8s8)(rd_int kc, const void *a_, const void *b_, void *c_, rd_int rs_c, rd_int cs_c,
               int m, int n, int mode)
{
    const unsigned char *a = (const unsigned char *)a_, *b = (const unsigned char *)b_;
    float *c = (float *)c_;
    const rd_int kq = (kc + 3) / 4 * 4, as = kq + 12;
    const rd_int full = kq / 64, rem_bytes = kq - 64 * full;
    const int two_r = m > 16, two_c = n > 16;
    int32_t s[32 * 32] __attribute__((aligned(64)));
    TENTER();
    RD_TALL(RD_TZERO3, (char *)s, 128)
    RD_TCHUNKS(TDPBUSD, 4)
    RD_TALL(TSTORE, (char *)s, 128)
    const unsigned char *tb = b + 32 * kq;
    int32_t cb[32], zb[32];
    float sb[32];
    memcpy(cb, tb, sizeof cb);
    memcpy(sb, tb + 128, sizeof sb);
    memcpy(zb, tb + 256, sizeof zb);
    for (int i = 0; i < m; i++) {
        const unsigned char *ta = a + i * as + kq;
        int32_t ra, za;
        float sa;
        memcpy(&ra, ta, 4);
        memcpy(&sa, ta + 4, 4);
        memcpy(&za, ta + 8, 4);
        /* t = S - (128 + za) cb - (ra - kc za) zb, modulo 2^32 */
        const uint32_t u = 128u + (uint32_t)za, v = (uint32_t)ra - (uint32_t)kc * (uint32_t)za;
        float *ci = c + i * rs_c;
        float f[32];
        for (int j = 0; j < 32; j++) {
            const uint32_t t = (uint32_t)s[32 * i + j] - u * (uint32_t)cb[j] - v * (uint32_t)zb[j];
            f[j] = (float)(int32_t)t * (sa * sb[j]);
        }
        if (mode == RD_ADD)
            for (int j = 0; j < n; j++)
                ci[j * cs_c] += f[j];
        else
            for (int j = 0; j < n; j++)
                ci[j * cs_c] = f[j];
    }
}

#undef RD_TCHUNK
#undef RD_TALL
#undef RD_TZERO3
#undef RD_TCHUNKS
#undef TLOAD
#undef TSTORE
#undef TZERO
#undef TDPBF16
#undef TDPBUSD
#undef TENTER
#undef RD_TNAME
#undef RD_TTARGET
