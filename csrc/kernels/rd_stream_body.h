/*
 * The streaming micro-kernel's body (rd_sukr_t), shared by the SIMD
 * families: C[m x n] (+)= A[m x kc] B[kc x n] for m <= 8 rows of a packed
 * 8-row A panel (A[i][p] = a[8p + i]) and B read where it lies, row p at
 * b + p*ldb, its first n columns only.
 *
 * The contraction runs row of B after row of B, each row read from left to
 * right across the whole strip (up to RD_SNR columns), so that B is read in
 * the order it lies in memory: one sequential stream when its rows are
 * contiguous (ldb == n), which the hardware prefetchers follow at memory
 * speed (reading four rows side by side instead, as a register-blocked
 * kernel does, measured at 60% of the read bandwidth on Zen4, one row at a
 * time at 100%).  The strip's sums live in a float32 buffer (in L1 for up
 * to 8 rows of 512 columns) that each row of B updates.  Every element is summed over p = 0, 1, ...
 * from zero with one fused multiply-add per step, as the packed kernels
 * sum it, so the results are theirs bit for bit.
 *
 * The includer defines V (vector), W (lanes), RD_SREGS (how many vector
 * registers there are: m rows' sums and a row of B stay in them when
 * (m + 1) times the strip's vectors, plus two, fit), MASK (a lane mask type),
 * MASK_ALL, MASK_FIRST(r) (the first r lanes), LOADM(k, p) (a masked load
 * that never reads the masked-off lanes), LOAD, STORE (aligned), SET1, FMA,
 * ZERO and the target attribute TARGET.
 */
#ifndef RD_STREAM_BODY_H
#define RD_STREAM_BODY_H

/* Rows of the A panel of the streaming kernels, and their widest strip
 * (columns).  The sums take m x n floats (16 KiB for 8 rows of 512). */
#define RD_SMR 8
#define RD_SNR 2048

#define RD_SA(i) const V a##i = SET1(a[RD_SMR * p + (i)]);
#define RD_SA2(i) const V a##i = SET1(a[RD_SMR * p + (i)]), e##i = SET1(a[RD_SMR * (p + 1) + (i)]);
#define RD_SV(i) x = LOAD(s + (i) * ld + v * W);                               \
    x = FMA(a##i, b0, x);                                                       \
    STORE(s + (i) * ld + v * W, x);
#define RD_SV2(i) x = LOAD(s + (i) * ld + v * W);                              \
    x = FMA(a##i, b0, x);                                                       \
    x = FMA(e##i, b1, x);                                                       \
    STORE(s + (i) * ld + v * W, x);

#define RD_SROWS1(X) X(0)
#define RD_SROWS2(X) X(0) X(1)
#define RD_SROWS3(X) RD_SROWS2(X) X(2)
#define RD_SROWS4(X) RD_SROWS3(X) X(3)
#define RD_SROWS5(X) RD_SROWS4(X) X(4)
#define RD_SROWS6(X) RD_SROWS5(X) X(5)
#define RD_SROWS7(X) RD_SROWS6(X) X(6)
#define RD_SROWS8(X) RD_SROWS7(X) X(7)

/* The sums of the rows ROWS into s (rows ld apart, zeroed by the caller):
 * with PAIRS, two rows of B a pass, each sum loaded and stored once for two
 * products (5-8 rows of A: the loads and stores of the sums, not the
 * products, would set the pace; measured in L2 on Zen4, 8 rows ran at 58%
 * of the FMA peak with pairs and 37% without), else one row (1-4 rows of
 * A, whose products cannot outrun memory: B read in order, as the hardware
 * prefetchers want it; 4 rows read at 90% of the read bandwidth this way
 * and 62% with pairs). */
#define RD_STREAM_ROWS(NAME, ROWS, PAIRS)                                   \
TARGET static void                                                          \
NAME(rd_int kc, const float *a, const float *b, rd_int ldb, float *s, rd_int ld, int n) \
{                                                                           \
    const int nv = (n + W - 1) / W;                                         \
    const MASK last = n % W ? MASK_FIRST(n % W) : MASK_ALL;                 \
    rd_int p = 0;                                                           \
    for (; PAIRS && p + 2 <= kc; p += 2) {                                  \
        const float *r = b + p * ldb, *r1 = r + ldb;                        \
        ROWS(RD_SA2)                                                        \
        for (int v = 0; v < nv; v++) {                                      \
            const MASK k = v == nv - 1 ? last : MASK_ALL;                   \
            const V b0 = LOADM(k, r + v * W), b1 = LOADM(k, r1 + v * W);    \
            V x;                                                            \
            ROWS(RD_SV2)                                                    \
        }                                                                   \
    }                                                                       \
    for (; p < kc; p++) {                                                   \
        const float *r = b + p * ldb;                                       \
        ROWS(RD_SA)                                                         \
        for (int v = 0; v < nv; v++) {                                      \
            const V b0 = LOADM(v == nv - 1 ? last : MASK_ALL, r + v * W);   \
            V x;                                                            \
            ROWS(RD_SV)                                                     \
        }                                                                   \
    }                                                                       \
}

/* The sums of ROWS rows of A over a strip of at most NV vectors held in
 * registers (a router's 32-256 columns, a few tokens): where the strip is
 * that narrow, each row of B updating a buffer in L1 is bound by the loads
 * and stores of its sums (and, for one or two vectors, by the store-to-load
 * latency), while B itself is read from cache.  The same products, summed
 * over p in the same order from zero: the bits of the buffered sums.
 * Each step asks for the strip's 64-byte lines RD_SAHEAD bytes of strip
 * ahead (rd_sahead rows; none past the last): its few loads a step leave
 * the hardware prefetchers, which stop at each 4 KiB page, behind (a cold
 * [2048, 128] float32 router, 1 MiB: 75-84 -> 56-65 us a call on Zen4; 8
 * and 16 KiB ahead no better).  The buffered rows' loop, bound by its
 * sums' loads and stores, ran slower with them (4 rows x 768 columns: 7.1
 * -> 8.8-9.2 ms) and has none. */
#define RD_SAHEAD 4096
/* (the strip's loops unrolled whole, so that its sums stay in registers) */
#define RD_SUNROLL _Pragma("GCC unroll 8")
#define RD_SRZ(i) V acc##i[rd_snv];                                          \
    RD_SUNROLL for (int v = 0; v < rd_snv; v++)                             \
        acc##i[v] = ZERO();
#define RD_SRF(i) {                                                         \
        const V ai = SET1(a[RD_SMR * p + (i)]);                             \
        RD_SUNROLL for (int v = 0; v < rd_snv; v++)                         \
            acc##i[v] = FMA(ai, bv[v], acc##i[v]);                          \
    }
#define RD_SRS(i) RD_SUNROLL for (int v = 0; v < rd_snv; v++)               \
        STORE(s + (i) * ld + v * W, acc##i[v]);
#define RD_SREG_ROWS(NAME, ROWS, NV)                                        \
TARGET static void                                                          \
NAME(rd_int kc, const float *a, const float *b, rd_int ldb, float *s, rd_int ld, int n) \
{                                                                           \
    /* (a strip is at most 8 x 16 floats: rd_sahead >= 8) */                \
    enum { rd_snv = NV, rd_sahead = RD_SAHEAD / (NV * W * 4) };             \
    const MASK last = n % W ? MASK_FIRST(n % W) : MASK_ALL;                 \
    ROWS(RD_SRZ)                                                            \
    for (rd_int p = 0; p < kc; p++) {                                       \
        const float *r = b + p * ldb;                                       \
        if (p + rd_sahead < kc)                                             \
            for (int v = 0; v < rd_snv; v += 16 / W)                        \
                __builtin_prefetch(r + rd_sahead * ldb + v * W, 0, 3);      \
        V bv[rd_snv];                                                       \
        RD_SUNROLL for (int v = 0; v < rd_snv; v++)                         \
            bv[v] = LOADM(v == rd_snv - 1 ? last : MASK_ALL, r + v * W);    \
        ROWS(RD_SRF)                                                        \
    }                                                                       \
    ROWS(RD_SRS)                                                            \
}

/* The table of the eight functions P_1 ... P_8 (one to eight vectors, or
 * rows) */
#define RD_STABLE(P) {P##_1, P##_2, P##_3, P##_4, P##_5, P##_6, P##_7, P##_8}

#define RD_SREG_NV(P, ROWS)                                                 \
RD_SREG_ROWS(P##_1, ROWS, 1)                                                \
RD_SREG_ROWS(P##_2, ROWS, 2)                                                \
RD_SREG_ROWS(P##_3, ROWS, 3)                                                \
RD_SREG_ROWS(P##_4, ROWS, 4)                                                \
RD_SREG_ROWS(P##_5, ROWS, 5)                                                \
RD_SREG_ROWS(P##_6, ROWS, 6)                                                \
RD_SREG_ROWS(P##_7, ROWS, 7)                                                \
RD_SREG_ROWS(P##_8, ROWS, 8)

/* The kernel: the sums of the valid rows (in registers where m rows of the
 * strip's vectors fit in RD_SREGS of them, else in the buffer), then C
 * (+)= them. */
#define RD_STREAM_KERNEL(NAME, P)                                           \
RD_SREG_NV(P##_r1, RD_SROWS1)                                               \
RD_SREG_NV(P##_r2, RD_SROWS2)                                               \
RD_SREG_NV(P##_r3, RD_SROWS3)                                               \
RD_SREG_NV(P##_r4, RD_SROWS4)                                               \
RD_STREAM_ROWS(P##_1, RD_SROWS1, 0)                                         \
RD_STREAM_ROWS(P##_2, RD_SROWS2, 0)                                         \
RD_STREAM_ROWS(P##_3, RD_SROWS3, 0)                                         \
RD_STREAM_ROWS(P##_4, RD_SROWS4, 0)                                         \
RD_STREAM_ROWS(P##_5, RD_SROWS5, 1)                                         \
RD_STREAM_ROWS(P##_6, RD_SROWS6, 1)                                         \
RD_STREAM_ROWS(P##_7, RD_SROWS7, 1)                                         \
RD_STREAM_ROWS(P##_8, RD_SROWS8, 1)                                         \
TARGET static void                                                          \
NAME(rd_int kc, const void *a_, const void *b_, rd_int ldb, void *c,        \
     rd_int rs_c, rd_int cs_c, int m, int n, int mode)                      \
{                                                                           \
    typedef void (*rows_t)(rd_int, const float *, const float *, rd_int, float *, rd_int, int); \
    static const rows_t rows[RD_SMR] = RD_STABLE(P);                        \
    static const rows_t regs[4][8] = {RD_STABLE(P##_r1), RD_STABLE(P##_r2),  \
                                      RD_STABLE(P##_r3), RD_STABLE(P##_r4)}; \
    float s[RD_SMR * (RD_SNR + 16)] __attribute__((aligned(64)));           \
    /* rows of sums 64 bytes more than a multiple of 64 apart: a sum's load \
     * then never matches the store of another row's 4 KiB apart, which the \
     * CPU would take for a dependence and wait on */                       \
    const int nv = (n + W - 1) / W;                                         \
    const int ld = nv * W + 16;                                             \
    if (m <= 4 && nv <= 8 && (m + 1) * nv + 2 <= RD_SREGS) {                \
        regs[m - 1][nv - 1](kc, (const float *)a_, (const float *)b_, ldb, s, ld, n); \
    } else {                                                                \
        for (int i = 0; i < m * ld; i += W)                                 \
            STORE(s + i, ZERO());                                           \
        rows[m - 1](kc, (const float *)a_, (const float *)b_, ldb, s, ld, n); \
    }                                                                       \
    rd_s_store_edge(s, (int)ld, (float *)c, rs_c, cs_c, m, n, mode == RD_ADD ? RD_ADD : RD_STORE); \
}

#endif /* RD_STREAM_BODY_H */
