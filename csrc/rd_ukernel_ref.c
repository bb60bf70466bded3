/*
 * Portable reference micro-kernels: plain C loops with the same packed
 * layout and the same contract as the SIMD kernels (see rd_kernel.h).
 * They are the fallback on CPUs without AVX2 and the yardstick the tests
 * hold the SIMD kernels to.
 */
#include "rd_kernel.h"

#define RD_REF_UKR(NAME, T, MR, NR, STORE)                                          \
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
    STORE(&acc[0][0], NR, c, rs_c, cs_c, m, n, accumulate);                \
}

RD_REF_UKR(rd_sgemm_ref_6x16, float, 6, 16, rd_s_store_edge)
RD_REF_UKR(rd_dgemm_ref_6x8, double, 6, 8, rd_d_store_edge)
