/*
 * AVX-512F micro-kernels, for CPUs that have it (chosen at run time).
 *
 *   rd_sgemm_avx512_12x32:  12 rows x 32 columns of float32
 *   rd_dgemm_avx512_12x16:  12 rows x 16 columns of float64
 *
 * 24 zmm accumulators: on cores whose FMA latency times throughput exceeds
 * the 12 chains an AVX2 6x16 block can keep in 16 registers, the 32
 * registers of AVX-512 are what lets the FMA pipes run full.  Per step p:
 * two loads of the B row, twelve broadcasts of the A column (folded into
 * the FMAs as embedded broadcasts), 24 FMAs.
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <time.h>

#define RD_AVX512 __attribute__((target("avx512f")))

#define ROWS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/* ---------------------------------------------------------------- float32 */

RD_AVX512 void
rd_sgemm_avx512_12x32(rd_int kc, const float *a, const float *b, float *c,
                      rd_int rs_c, rd_int cs_c, int m, int n, int accumulate)
{
#define DECL(i) __m512 c##i##0 = _mm512_setzero_ps(), c##i##1 = _mm512_setzero_ps();
    ROWS12(DECL)
#undef DECL
    /* Bring the C tile in while the contraction runs (two lines per row). */
    if (cs_c == 1) {
        for (int i = 0; i < m; i++) {
            _mm_prefetch((const char *)(c + i * rs_c), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + i * rs_c + 31), _MM_HINT_T0);
        }
    }
    for (rd_int p = 0; p < kc; p++) {
        const __m512 b0 = _mm512_load_ps(b);
        const __m512 b1 = _mm512_load_ps(b + 16);
#define STEP(i)                                                             \
        {                                                                   \
            const __m512 av = _mm512_set1_ps(a[i]);                         \
            c##i##0 = _mm512_fmadd_ps(av, b0, c##i##0);                     \
            c##i##1 = _mm512_fmadd_ps(av, b1, c##i##1);                     \
        }
        ROWS12(STEP)
#undef STEP
        a += 12;
        b += 32;
    }

    if (m == 12 && n == 32 && cs_c == 1) {
#define STORE(i)                                                            \
        {                                                                   \
            float *ci = c + (i) * rs_c;                                     \
            __m512 lo = c##i##0, hi = c##i##1;                              \
            if (accumulate) {                                               \
                lo = _mm512_add_ps(_mm512_loadu_ps(ci), lo);                \
                hi = _mm512_add_ps(_mm512_loadu_ps(ci + 16), hi);           \
            }                                                               \
            _mm512_storeu_ps(ci, lo);                                       \
            _mm512_storeu_ps(ci + 16, hi);                                  \
        }
        ROWS12(STORE)
#undef STORE
        return;
    }
    float buf[12 * 32] __attribute__((aligned(64)));
#define SPILL(i)                                                            \
    _mm512_store_ps(buf + (i) * 32, c##i##0);                               \
    _mm512_store_ps(buf + (i) * 32 + 16, c##i##1);
    ROWS12(SPILL)
#undef SPILL
    rd_s_store_edge(buf, 32, c, rs_c, cs_c, m, n, accumulate);
}

/* ---------------------------------------------------------------- float64 */

RD_AVX512 void
rd_dgemm_avx512_12x16(rd_int kc, const double *a, const double *b, double *c,
                      rd_int rs_c, rd_int cs_c, int m, int n, int accumulate)
{
#define DECL(i) __m512d c##i##0 = _mm512_setzero_pd(), c##i##1 = _mm512_setzero_pd();
    ROWS12(DECL)
#undef DECL
    if (cs_c == 1) {
        for (int i = 0; i < m; i++) {
            _mm_prefetch((const char *)(c + i * rs_c), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + i * rs_c + 15), _MM_HINT_T0);
        }
    }
    for (rd_int p = 0; p < kc; p++) {
        const __m512d b0 = _mm512_load_pd(b);
        const __m512d b1 = _mm512_load_pd(b + 8);
#define STEP(i)                                                             \
        {                                                                   \
            const __m512d av = _mm512_set1_pd(a[i]);                        \
            c##i##0 = _mm512_fmadd_pd(av, b0, c##i##0);                     \
            c##i##1 = _mm512_fmadd_pd(av, b1, c##i##1);                     \
        }
        ROWS12(STEP)
#undef STEP
        a += 12;
        b += 16;
    }

    if (m == 12 && n == 16 && cs_c == 1) {
#define STORE(i)                                                            \
        {                                                                   \
            double *ci = c + (i) * rs_c;                                    \
            __m512d lo = c##i##0, hi = c##i##1;                             \
            if (accumulate) {                                               \
                lo = _mm512_add_pd(_mm512_loadu_pd(ci), lo);                \
                hi = _mm512_add_pd(_mm512_loadu_pd(ci + 8), hi);            \
            }                                                               \
            _mm512_storeu_pd(ci, lo);                                       \
            _mm512_storeu_pd(ci + 8, hi);                                   \
        }
        ROWS12(STORE)
#undef STORE
        return;
    }
    double buf[12 * 16] __attribute__((aligned(64)));
#define SPILL(i)                                                            \
    _mm512_store_pd(buf + (i) * 16, c##i##0);                               \
    _mm512_store_pd(buf + (i) * 16 + 8, c##i##1);
    ROWS12(SPILL)
#undef SPILL
    rd_d_store_edge(buf, 16, c, rs_c, cs_c, m, n, accumulate);
}

/* ------------------------------------------------------------- peak probe */

static double
rd_now512(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* 24 independent 512-bit FMA chains: the ceiling of the 12x32 kernel. */
RD_AVX512 double
rd_fma_peak_avx512(double seconds)
{
    const long chunk = 1L << 19;
    /* Distinct starting values: identical chains would be merged into one
     * by the compiler, and the probe would time a single chain. */
#define DECL(i) __m512 x##i##0 = _mm512_set1_ps(1.0f + 0.01f * (i)), \
                       x##i##1 = _mm512_set1_ps(1.5f + 0.01f * (i));
    ROWS12(DECL)
#undef DECL
    const __m512 mul = _mm512_set1_ps(0.9999999f);
    const __m512 add = _mm512_set1_ps(1e-7f);
    long iters = 0;
    double t0 = rd_now512(), t1;
    do {
        for (long i = 0; i < chunk; i++) {
#define FMA(i) x##i##0 = _mm512_fmadd_ps(x##i##0, mul, add); x##i##1 = _mm512_fmadd_ps(x##i##1, mul, add);
            ROWS12(FMA)
#undef FMA
        }
        iters += chunk;
        t1 = rd_now512();
    } while (t1 - t0 < seconds);
    __m512 s = _mm512_setzero_ps();
#define SUM(i) s = _mm512_add_ps(s, _mm512_add_ps(x##i##0, x##i##1));
    ROWS12(SUM)
#undef SUM
    volatile float keep = _mm512_reduce_add_ps(s);
    (void)keep;
    return (double)iters * 24.0 * 32.0 / (t1 - t0) / 1e9;
}

#endif /* RD_HAVE_X86_KERNELS */
