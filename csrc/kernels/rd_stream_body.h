/*
 * The streaming micro-kernel's body (rd_sukr_t), shared by the SIMD
 * families: C[m x n] (+)= A[m x kc] B[kc x n] for m <= 4 rows of a packed
 * 4-row A panel (A[i][p] = a[4p + i]) and B read where it lies, row p at
 * b + p*ldb, its first n columns only.
 *
 * The contraction runs row of B after row of B, each row read from left
 * to right across the whole strip (up to RD_SNR columns): when B's rows are
 * contiguous (ldb == n) a block of B is one sequential read, which the
 * hardware prefetchers follow at memory speed.  The strip's sums live in a
 * float32 buffer in L1 (4 x RD_SNR), each loaded and stored once per four
 * rows of B, the four products added in order.  Every element is summed
 * over p = 0, 1, ... from zero with one fused multiply-add per step, as the
 * packed kernels do, so the results are theirs bit for bit.
 *
 * The includer defines V (vector), W (lanes), MASK (a lane mask type),
 * MASK_ALL, MASK_FIRST(r) (the first r lanes), LOADM(k, p) (a masked load
 * that never reads the masked-off lanes), LOAD, STORE (aligned), SET1, FMA,
 * ZERO and the target attribute TARGET.
 */
#ifndef RD_STREAM_BODY_H
#define RD_STREAM_BODY_H

/* Widest strip of the streaming kernels (columns). */
#define RD_SNR 512

#define RD_SV4(i) a0 = SET1(a[4 * p + (i)]); a1 = SET1(a[4 * p + 4 + (i)]);     \
    a2 = SET1(a[4 * p + 8 + (i)]); a3 = SET1(a[4 * p + 12 + (i)]);              \
    x = LOAD(s + (i) * RD_SNR + v * W);                                         \
    x = FMA(a0, b0, x); x = FMA(a1, b1, x); x = FMA(a2, b2, x); x = FMA(a3, b3, x); \
    STORE(s + (i) * RD_SNR + v * W, x);
#define RD_SV1(i) x = LOAD(s + (i) * RD_SNR + v * W);                          \
    x = FMA(SET1(a[4 * p + (i)]), b0, x);                                       \
    STORE(s + (i) * RD_SNR + v * W, x);

#define RD_SROWS1(X) X(0)
#define RD_SROWS2(X) X(0) X(1)
#define RD_SROWS3(X) X(0) X(1) X(2)
#define RD_SROWS4(X) X(0) X(1) X(2) X(3)

/* The sums of M rows into s (rows RD_SNR apart, zeroed by the caller). */
#define RD_STREAM_ROWS(NAME, ROWS)                                          \
TARGET static void                                                          \
NAME(rd_int kc, const float *a, const float *b, rd_int ldb, float *s, int n) \
{                                                                           \
    const int nv = (n + W - 1) / W;                                         \
    const MASK last = n % W ? MASK_FIRST(n % W) : MASK_ALL;                 \
    rd_int p = 0;                                                           \
    for (; p + 4 <= kc; p += 4) {                                           \
        const float *r0 = b + p * ldb, *r1 = r0 + ldb, *r2 = r1 + ldb, *r3 = r2 + ldb; \
        for (int v = 0; v < nv; v++) {                                      \
            const MASK k = v == nv - 1 ? last : MASK_ALL;                   \
            const V b0 = LOADM(k, r0 + v * W), b1 = LOADM(k, r1 + v * W);   \
            const V b2 = LOADM(k, r2 + v * W), b3 = LOADM(k, r3 + v * W);   \
            V a0, a1, a2, a3, x;                                            \
            ROWS(RD_SV4)                                                    \
        }                                                                   \
    }                                                                       \
    for (; p < kc; p++) {                                                   \
        const float *r0 = b + p * ldb;                                      \
        for (int v = 0; v < nv; v++) {                                      \
            const V b0 = LOADM(v == nv - 1 ? last : MASK_ALL, r0 + v * W);  \
            V x;                                                            \
            ROWS(RD_SV1)                                                    \
        }                                                                   \
    }                                                                       \
}

/* The kernel: the sums of the valid rows, then C (+)= them. */
#define RD_STREAM_KERNEL(NAME, P)                                           \
RD_STREAM_ROWS(P##_1, RD_SROWS1)                                            \
RD_STREAM_ROWS(P##_2, RD_SROWS2)                                            \
RD_STREAM_ROWS(P##_3, RD_SROWS3)                                            \
RD_STREAM_ROWS(P##_4, RD_SROWS4)                                            \
TARGET static void                                                          \
NAME(rd_int kc, const void *a_, const void *b_, rd_int ldb, void *c,        \
     rd_int rs_c, rd_int cs_c, int m, int n, int mode)                      \
{                                                                           \
    const float *a = (const float *)a_, *b = (const float *)b_;             \
    float s[4 * RD_SNR] __attribute__((aligned(64)));                       \
    const int nw = (n + W - 1) / W * W;                                     \
    for (int i = 0; i < m; i++)                                             \
        for (int j = 0; j < nw; j += W)                                     \
            STORE(s + i * RD_SNR + j, ZERO());                              \
    if (m == 1)                                                             \
        P##_1(kc, a, b, ldb, s, n);                                         \
    else if (m == 2)                                                        \
        P##_2(kc, a, b, ldb, s, n);                                         \
    else if (m == 3)                                                        \
        P##_3(kc, a, b, ldb, s, n);                                         \
    else                                                                    \
        P##_4(kc, a, b, ldb, s, n);                                         \
    rd_s_store_edge(s, RD_SNR, (float *)c, rs_c, cs_c, m, n, mode == RD_ADD ? RD_ADD : RD_STORE); \
}

#endif /* RD_STREAM_BODY_H */
