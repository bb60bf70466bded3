/*
 * Portable reference micro-kernels: plain C loops with the same packed
 * layout and the same contract as the SIMD kernels (see rd_kernel.h).
 * They are the fallback on CPUs without AVX2 and the yardstick the tests
 * hold the SIMD kernels to.
 */
#include "rd_kernel.h"

#define RD_REF_UKR(NAME, T, MR, NR)                                          \
void NAME(rd_int kc, const T *a, const T *b, T *c, rd_int rs_c,             \
          rd_int cs_c, int m, int n, int accumulate)                        \
{                                                                           \
    T acc[MR][NR];                                                          \
    for (int i = 0; i < MR; i++)                                            \
        for (int j = 0; j < NR; j++)                                        \
            acc[i][j] = 0;                                                  \
    for (rd_int p = 0; p < kc; p++) {                                       \
        const T *ap = a + p * MR;                                           \
        const T *bp = b + p * NR;                                           \
        for (int i = 0; i < MR; i++)                                        \
            for (int j = 0; j < NR; j++)                                    \
                acc[i][j] += ap[i] * bp[j];                                 \
    }                                                                       \
    for (int i = 0; i < m; i++) {                                           \
        T *ci = c + i * rs_c;                                               \
        if (accumulate)                                                     \
            for (int j = 0; j < n; j++)                                     \
                ci[j * cs_c] += acc[i][j];                                  \
        else                                                                \
            for (int j = 0; j < n; j++)                                     \
                ci[j * cs_c] = acc[i][j];                                   \
    }                                                                       \
}

RD_REF_UKR(rd_sgemm_ref_6x16, float, 6, 16)
RD_REF_UKR(rd_dgemm_ref_6x8, double, 6, 8)
