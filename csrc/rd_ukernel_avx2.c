/*
 * AVX2 + FMA micro-kernels.  Compiled with per-function target attributes,
 * so the object file builds with the default -march and these functions are
 * only ever called after a run-time CPU check (rd_context.c).
 *
 *   rd_sgemm_avx2_6x16:  6 rows x 16 columns of float32, 12 ymm accumulators
 *   rd_dgemm_avx2_6x8 :  6 rows x  8 columns of float64, 12 ymm accumulators
 *
 * Per step p of the contraction: two loads of the B row, six broadcasts of
 * the A column, twelve independent FMAs (two FMA pipes x four cycles of
 * latency needs at least eight in flight).  Edge tiles (m < MR or n < NR,
 * or a C with non-unit column stride) go through a register-sized buffer.
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <time.h>

#define RD_AVX2 __attribute__((target("avx2,fma")))

/* ---------------------------------------------------------------- float32 */

#define S_STEP(AOFF, BOFF)                                                  \
    do {                                                                    \
        __m256 b0 = _mm256_load_ps(b + (BOFF));                             \
        __m256 b1 = _mm256_load_ps(b + (BOFF) + 8);                         \
        __m256 av;                                                          \
        av = _mm256_broadcast_ss(a + (AOFF) + 0);                           \
        c00 = _mm256_fmadd_ps(av, b0, c00); c01 = _mm256_fmadd_ps(av, b1, c01); \
        av = _mm256_broadcast_ss(a + (AOFF) + 1);                           \
        c10 = _mm256_fmadd_ps(av, b0, c10); c11 = _mm256_fmadd_ps(av, b1, c11); \
        av = _mm256_broadcast_ss(a + (AOFF) + 2);                           \
        c20 = _mm256_fmadd_ps(av, b0, c20); c21 = _mm256_fmadd_ps(av, b1, c21); \
        av = _mm256_broadcast_ss(a + (AOFF) + 3);                           \
        c30 = _mm256_fmadd_ps(av, b0, c30); c31 = _mm256_fmadd_ps(av, b1, c31); \
        av = _mm256_broadcast_ss(a + (AOFF) + 4);                           \
        c40 = _mm256_fmadd_ps(av, b0, c40); c41 = _mm256_fmadd_ps(av, b1, c41); \
        av = _mm256_broadcast_ss(a + (AOFF) + 5);                           \
        c50 = _mm256_fmadd_ps(av, b0, c50); c51 = _mm256_fmadd_ps(av, b1, c51); \
    } while (0)

RD_AVX2 static inline void
s_store_row(float *c, __m256 lo, __m256 hi, int accumulate)
{
    if (accumulate == RD_STREAM) {
        _mm256_stream_ps(c, lo);
        _mm256_stream_ps(c + 8, hi);
        return;
    }
    if (accumulate == RD_ADD) {
        lo = _mm256_add_ps(_mm256_loadu_ps(c), lo);
        hi = _mm256_add_ps(_mm256_loadu_ps(c + 8), hi);
    }
    _mm256_storeu_ps(c, lo);
    _mm256_storeu_ps(c + 8, hi);
}

RD_AVX2 void
rd_sgemm_avx2_6x16(rd_int kc, const float *a, const float *b, float *c,
                   rd_int rs_c, rd_int cs_c, int m, int n, int accumulate)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();

    /* One step per iteration: unrolling by hand makes gcc interleave the
     * steps and spill accumulators; this form keeps all twelve in registers. */
    for (rd_int p = 0; p < kc; p++) {
        S_STEP(0, 0);
        a += 6;
        b += 16;
    }

    if (m == 6 && n == 16 && cs_c == 1) {
        if (accumulate == RD_STREAM && !rd_stream_aligned(c, rs_c * (rd_int)sizeof(float)))
            accumulate = RD_STORE;
        s_store_row(c + 0 * rs_c, c00, c01, accumulate);
        s_store_row(c + 1 * rs_c, c10, c11, accumulate);
        s_store_row(c + 2 * rs_c, c20, c21, accumulate);
        s_store_row(c + 3 * rs_c, c30, c31, accumulate);
        s_store_row(c + 4 * rs_c, c40, c41, accumulate);
        s_store_row(c + 5 * rs_c, c50, c51, accumulate);
        return;
    }
    float buf[6 * 16] __attribute__((aligned(32)));
    _mm256_store_ps(buf + 0, c00);  _mm256_store_ps(buf + 8, c01);
    _mm256_store_ps(buf + 16, c10); _mm256_store_ps(buf + 24, c11);
    _mm256_store_ps(buf + 32, c20); _mm256_store_ps(buf + 40, c21);
    _mm256_store_ps(buf + 48, c30); _mm256_store_ps(buf + 56, c31);
    _mm256_store_ps(buf + 64, c40); _mm256_store_ps(buf + 72, c41);
    _mm256_store_ps(buf + 80, c50); _mm256_store_ps(buf + 88, c51);
    rd_s_store_edge(buf, 16, c, rs_c, cs_c, m, n, accumulate);
}

/* ---------------------------------------------------------------- float64 */

#define D_STEP(AOFF, BOFF)                                                  \
    do {                                                                    \
        __m256d b0 = _mm256_load_pd(b + (BOFF));                            \
        __m256d b1 = _mm256_load_pd(b + (BOFF) + 4);                        \
        __m256d av;                                                         \
        av = _mm256_broadcast_sd(a + (AOFF) + 0);                           \
        c00 = _mm256_fmadd_pd(av, b0, c00); c01 = _mm256_fmadd_pd(av, b1, c01); \
        av = _mm256_broadcast_sd(a + (AOFF) + 1);                           \
        c10 = _mm256_fmadd_pd(av, b0, c10); c11 = _mm256_fmadd_pd(av, b1, c11); \
        av = _mm256_broadcast_sd(a + (AOFF) + 2);                           \
        c20 = _mm256_fmadd_pd(av, b0, c20); c21 = _mm256_fmadd_pd(av, b1, c21); \
        av = _mm256_broadcast_sd(a + (AOFF) + 3);                           \
        c30 = _mm256_fmadd_pd(av, b0, c30); c31 = _mm256_fmadd_pd(av, b1, c31); \
        av = _mm256_broadcast_sd(a + (AOFF) + 4);                           \
        c40 = _mm256_fmadd_pd(av, b0, c40); c41 = _mm256_fmadd_pd(av, b1, c41); \
        av = _mm256_broadcast_sd(a + (AOFF) + 5);                           \
        c50 = _mm256_fmadd_pd(av, b0, c50); c51 = _mm256_fmadd_pd(av, b1, c51); \
    } while (0)

RD_AVX2 static inline void
d_store_row(double *c, __m256d lo, __m256d hi, int accumulate)
{
    if (accumulate == RD_STREAM) {
        _mm256_stream_pd(c, lo);
        _mm256_stream_pd(c + 4, hi);
        return;
    }
    if (accumulate == RD_ADD) {
        lo = _mm256_add_pd(_mm256_loadu_pd(c), lo);
        hi = _mm256_add_pd(_mm256_loadu_pd(c + 4), hi);
    }
    _mm256_storeu_pd(c, lo);
    _mm256_storeu_pd(c + 4, hi);
}

RD_AVX2 void
rd_dgemm_avx2_6x8(rd_int kc, const double *a, const double *b, double *c,
                  rd_int rs_c, rd_int cs_c, int m, int n, int accumulate)
{
    __m256d c00 = _mm256_setzero_pd(), c01 = _mm256_setzero_pd();
    __m256d c10 = _mm256_setzero_pd(), c11 = _mm256_setzero_pd();
    __m256d c20 = _mm256_setzero_pd(), c21 = _mm256_setzero_pd();
    __m256d c30 = _mm256_setzero_pd(), c31 = _mm256_setzero_pd();
    __m256d c40 = _mm256_setzero_pd(), c41 = _mm256_setzero_pd();
    __m256d c50 = _mm256_setzero_pd(), c51 = _mm256_setzero_pd();

    for (rd_int p = 0; p < kc; p++) {
        D_STEP(0, 0);
        a += 6;
        b += 8;
    }

    if (m == 6 && n == 8 && cs_c == 1) {
        if (accumulate == RD_STREAM && !rd_stream_aligned(c, rs_c * (rd_int)sizeof(double)))
            accumulate = RD_STORE;
        d_store_row(c + 0 * rs_c, c00, c01, accumulate);
        d_store_row(c + 1 * rs_c, c10, c11, accumulate);
        d_store_row(c + 2 * rs_c, c20, c21, accumulate);
        d_store_row(c + 3 * rs_c, c30, c31, accumulate);
        d_store_row(c + 4 * rs_c, c40, c41, accumulate);
        d_store_row(c + 5 * rs_c, c50, c51, accumulate);
        return;
    }
    double buf[6 * 8] __attribute__((aligned(32)));
    _mm256_store_pd(buf + 0, c00);  _mm256_store_pd(buf + 4, c01);
    _mm256_store_pd(buf + 8, c10);  _mm256_store_pd(buf + 12, c11);
    _mm256_store_pd(buf + 16, c20); _mm256_store_pd(buf + 20, c21);
    _mm256_store_pd(buf + 24, c30); _mm256_store_pd(buf + 28, c31);
    _mm256_store_pd(buf + 32, c40); _mm256_store_pd(buf + 36, c41);
    _mm256_store_pd(buf + 40, c50); _mm256_store_pd(buf + 44, c51);
    rd_d_store_edge(buf, 8, c, rs_c, cs_c, m, n, accumulate);
}

/* ------------------------------------------------------------- peak probe */

static double
rd_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* 12 independent FMA chains on 8 floats: the register-bound ceiling of any
 * AVX2 float32 kernel on this core.  Returns GFLOP/s of one thread. */
RD_AVX2 double
rd_fma_peak_avx2(double seconds)
{
    const long chunk = 1L << 20;
    /* Distinct starting values: identical chains would be merged into one
     * by the compiler, and the probe would time a single chain. */
    __m256 x0 = _mm256_set1_ps(1.00f), x1 = _mm256_set1_ps(1.01f), x2 = _mm256_set1_ps(1.02f),
           x3 = _mm256_set1_ps(1.03f), x4 = _mm256_set1_ps(1.04f), x5 = _mm256_set1_ps(1.05f),
           x6 = _mm256_set1_ps(1.06f), x7 = _mm256_set1_ps(1.07f), x8 = _mm256_set1_ps(1.08f),
           x9 = _mm256_set1_ps(1.09f), x10 = _mm256_set1_ps(1.10f), x11 = _mm256_set1_ps(1.11f);
    const __m256 mul = _mm256_set1_ps(0.9999999f);
    const __m256 add = _mm256_set1_ps(1e-7f);
    long iters = 0;
    double t0 = rd_now(), t1;
    do {
        for (long i = 0; i < chunk; i++) {
            x0 = _mm256_fmadd_ps(x0, mul, add);  x1 = _mm256_fmadd_ps(x1, mul, add);
            x2 = _mm256_fmadd_ps(x2, mul, add);  x3 = _mm256_fmadd_ps(x3, mul, add);
            x4 = _mm256_fmadd_ps(x4, mul, add);  x5 = _mm256_fmadd_ps(x5, mul, add);
            x6 = _mm256_fmadd_ps(x6, mul, add);  x7 = _mm256_fmadd_ps(x7, mul, add);
            x8 = _mm256_fmadd_ps(x8, mul, add);  x9 = _mm256_fmadd_ps(x9, mul, add);
            x10 = _mm256_fmadd_ps(x10, mul, add); x11 = _mm256_fmadd_ps(x11, mul, add);
        }
        iters += chunk;
        t1 = rd_now();
    } while (t1 - t0 < seconds);
    /* Keep the chains live so the loop cannot be removed. */
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)),
                             _mm256_add_ps(_mm256_add_ps(x4, x5), _mm256_add_ps(x6, x7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(x8, x9), _mm256_add_ps(x10, x11)));
    float sink[8];
    _mm256_storeu_ps(sink, s);
    volatile float keep = sink[0];
    (void)keep;
    return (double)iters * 12.0 * 16.0 / (t1 - t0) / 1e9;
}

#endif /* RD_HAVE_X86_KERNELS */
