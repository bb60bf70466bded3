/*
 * Portable reference micro-kernels: plain C loops with the same packed
 * layout and the same contract as the SIMD kernels (see rd_kernel.h).
 * They are the fallback on CPUs without SIMD kernels and the yardstick the
 * tests hold the SIMD kernels to.
 *
 *   rd_sgemm_ref_6x16:  6 rows x 16 columns of float32
 *   rd_dgemm_ref_6x8 :  6 rows x  8 columns of float64
 */
#include "rd_kernel.h"

#define RD_REF_UKR(NAME, T, MR, NR, STORE)                                  \
static void NAME(rd_int kc, const void *a_, const void *b_, void *c,        \
                 rd_int rs_c, rd_int cs_c, int m, int n, int mode)          \
{                                                                           \
    const T *a = (const T *)a_, *b = (const T *)b_;                         \
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
    STORE(&acc[0][0], NR, (T *)c, rs_c, cs_c, m, n, mode);                  \
}

RD_REF_UKR(rd_sgemm_ref_6x16, float, 6, 16, rd_s_store_edge)
RD_REF_UKR(rd_dgemm_ref_6x8, double, 6, 8, rd_d_store_edge)

static int
rd_ref_runnable(void)
{
    return 1;
}

/* Blocking: the published BLIS Haswell float32 (6x16, MC=144, KC=256,
 * NC=4080) and float64 (6x8, MC=72, KC=256, NC=4080) values. */
const rd_family_t rd_family_ref = {
    "ref",
    rd_ref_runnable,
    {
        [RD_CT_F32] = {rd_sgemm_ref_6x16, 6, 16, 144, 256, 4080},
        [RD_CT_F64] = {rd_dgemm_ref_6x8, 6, 8, 72, 256, 4080},
    },
};
