/*
 * AVX-512F micro-kernels, for CPUs that have it (chosen at run time).
 *
 *   rd_sgemm_avx512_12x32:  12 rows x 32 columns of float32
 *   rd_dgemm_avx512_12x16:  12 rows x 16 columns of float64
 *
 24 zmm accumulators (of 32 registers), twice the FMAs per step of the
 * AVX2 6x16 block.  Per step p: two loads of the B row, twelve broadcasts of
 * the A column, 24 FMAs.
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <time.h>

#define RD_AVX512 __attribute__((target("avx512f")))

#define ROWS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/*
 * One body per row count R in {4, 8, 12}, all reading the 12-row packed A
 * panel: a tile with at most 4 or 8 valid rows (the last rows of a small
 * group) runs only the FMAs of those rows instead of all twelve.
 */

/* ---------------------------------------------------------------- float32 */

RD_AVX512 static inline void
s_store_row(float *c, __m512 lo, __m512 hi, int accumulate)
{
    if (accumulate) {
        lo = _mm512_add_ps(_mm512_loadu_ps(c), lo);
        hi = _mm512_add_ps(_mm512_loadu_ps(c + 16), hi);
    }
    _mm512_storeu_ps(c, lo);
    _mm512_storeu_ps(c + 16, hi);
}

RD_AVX512 static void
s_rows4(rd_int kc, const float *a, const float *b, float *c, rd_int rs_c, rd_int cs_c,
          int m, int n, int accumulate)
{
    __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps();
    __m512 c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
    __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps();
    __m512 c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
    /* bring the C tile in while the contraction runs */
    if (cs_c == 1)
        for (int i = 0; i < m; i++) {
            _mm_prefetch((const char *)(c + i * rs_c), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + i * rs_c + 31), _MM_HINT_T0);
        }
    for (rd_int p = 0; p < kc; p++) {
        const __m512 b0 = _mm512_load_ps(b);
        const __m512 b1 = _mm512_load_ps(b + 16);
        __m512 av;
        av = _mm512_set1_ps(a[0]);
        c00 = _mm512_fmadd_ps(av, b0, c00);
        c01 = _mm512_fmadd_ps(av, b1, c01);
        av = _mm512_set1_ps(a[1]);
        c10 = _mm512_fmadd_ps(av, b0, c10);
        c11 = _mm512_fmadd_ps(av, b1, c11);
        av = _mm512_set1_ps(a[2]);
        c20 = _mm512_fmadd_ps(av, b0, c20);
        c21 = _mm512_fmadd_ps(av, b1, c21);
        av = _mm512_set1_ps(a[3]);
        c30 = _mm512_fmadd_ps(av, b0, c30);
        c31 = _mm512_fmadd_ps(av, b1, c31);
        a += 12;
        b += 32;
    }
    if (m == 4 && n == 32 && cs_c == 1) {
        s_store_row(c + 0 * rs_c, c00, c01, accumulate);
        s_store_row(c + 1 * rs_c, c10, c11, accumulate);
        s_store_row(c + 2 * rs_c, c20, c21, accumulate);
        s_store_row(c + 3 * rs_c, c30, c31, accumulate);
        return;
    }
    float buf[128] __attribute__((aligned(64)));
    _mm512_store_ps(buf + 0, c00);
    _mm512_store_ps(buf + 16, c01);
    _mm512_store_ps(buf + 32, c10);
    _mm512_store_ps(buf + 48, c11);
    _mm512_store_ps(buf + 64, c20);
    _mm512_store_ps(buf + 80, c21);
    _mm512_store_ps(buf + 96, c30);
    _mm512_store_ps(buf + 112, c31);
    rd_s_store_edge(buf, 32, c, rs_c, cs_c, m, n, accumulate);
}

RD_AVX512 static void
s_rows8(rd_int kc, const float *a, const float *b, float *c, rd_int rs_c, rd_int cs_c,
          int m, int n, int accumulate)
{
    __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps();
    __m512 c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
    __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps();
    __m512 c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
    __m512 c40 = _mm512_setzero_ps(), c41 = _mm512_setzero_ps();
    __m512 c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps();
    __m512 c60 = _mm512_setzero_ps(), c61 = _mm512_setzero_ps();
    __m512 c70 = _mm512_setzero_ps(), c71 = _mm512_setzero_ps();
    /* bring the C tile in while the contraction runs */
    if (cs_c == 1)
        for (int i = 0; i < m; i++) {
            _mm_prefetch((const char *)(c + i * rs_c), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + i * rs_c + 31), _MM_HINT_T0);
        }
    for (rd_int p = 0; p < kc; p++) {
        const __m512 b0 = _mm512_load_ps(b);
        const __m512 b1 = _mm512_load_ps(b + 16);
        __m512 av;
        av = _mm512_set1_ps(a[0]);
        c00 = _mm512_fmadd_ps(av, b0, c00);
        c01 = _mm512_fmadd_ps(av, b1, c01);
        av = _mm512_set1_ps(a[1]);
        c10 = _mm512_fmadd_ps(av, b0, c10);
        c11 = _mm512_fmadd_ps(av, b1, c11);
        av = _mm512_set1_ps(a[2]);
        c20 = _mm512_fmadd_ps(av, b0, c20);
        c21 = _mm512_fmadd_ps(av, b1, c21);
        av = _mm512_set1_ps(a[3]);
        c30 = _mm512_fmadd_ps(av, b0, c30);
        c31 = _mm512_fmadd_ps(av, b1, c31);
        av = _mm512_set1_ps(a[4]);
        c40 = _mm512_fmadd_ps(av, b0, c40);
        c41 = _mm512_fmadd_ps(av, b1, c41);
        av = _mm512_set1_ps(a[5]);
        c50 = _mm512_fmadd_ps(av, b0, c50);
        c51 = _mm512_fmadd_ps(av, b1, c51);
        av = _mm512_set1_ps(a[6]);
        c60 = _mm512_fmadd_ps(av, b0, c60);
        c61 = _mm512_fmadd_ps(av, b1, c61);
        av = _mm512_set1_ps(a[7]);
        c70 = _mm512_fmadd_ps(av, b0, c70);
        c71 = _mm512_fmadd_ps(av, b1, c71);
        a += 12;
        b += 32;
    }
    if (m == 8 && n == 32 && cs_c == 1) {
        s_store_row(c + 0 * rs_c, c00, c01, accumulate);
        s_store_row(c + 1 * rs_c, c10, c11, accumulate);
        s_store_row(c + 2 * rs_c, c20, c21, accumulate);
        s_store_row(c + 3 * rs_c, c30, c31, accumulate);
        s_store_row(c + 4 * rs_c, c40, c41, accumulate);
        s_store_row(c + 5 * rs_c, c50, c51, accumulate);
        s_store_row(c + 6 * rs_c, c60, c61, accumulate);
        s_store_row(c + 7 * rs_c, c70, c71, accumulate);
        return;
    }
    float buf[256] __attribute__((aligned(64)));
    _mm512_store_ps(buf + 0, c00);
    _mm512_store_ps(buf + 16, c01);
    _mm512_store_ps(buf + 32, c10);
    _mm512_store_ps(buf + 48, c11);
    _mm512_store_ps(buf + 64, c20);
    _mm512_store_ps(buf + 80, c21);
    _mm512_store_ps(buf + 96, c30);
    _mm512_store_ps(buf + 112, c31);
    _mm512_store_ps(buf + 128, c40);
    _mm512_store_ps(buf + 144, c41);
    _mm512_store_ps(buf + 160, c50);
    _mm512_store_ps(buf + 176, c51);
    _mm512_store_ps(buf + 192, c60);
    _mm512_store_ps(buf + 208, c61);
    _mm512_store_ps(buf + 224, c70);
    _mm512_store_ps(buf + 240, c71);
    rd_s_store_edge(buf, 32, c, rs_c, cs_c, m, n, accumulate);
}

RD_AVX512 static void
s_rows12(rd_int kc, const float *a, const float *b, float *c, rd_int rs_c, rd_int cs_c,
          int m, int n, int accumulate)
{
    __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps();
    __m512 c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
    __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps();
    __m512 c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
    __m512 c40 = _mm512_setzero_ps(), c41 = _mm512_setzero_ps();
    __m512 c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps();
    __m512 c60 = _mm512_setzero_ps(), c61 = _mm512_setzero_ps();
    __m512 c70 = _mm512_setzero_ps(), c71 = _mm512_setzero_ps();
    __m512 c80 = _mm512_setzero_ps(), c81 = _mm512_setzero_ps();
    __m512 c90 = _mm512_setzero_ps(), c91 = _mm512_setzero_ps();
    __m512 c100 = _mm512_setzero_ps(), c101 = _mm512_setzero_ps();
    __m512 c110 = _mm512_setzero_ps(), c111 = _mm512_setzero_ps();
    /* bring the C tile in while the contraction runs */
    if (cs_c == 1)
        for (int i = 0; i < m; i++) {
            _mm_prefetch((const char *)(c + i * rs_c), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + i * rs_c + 31), _MM_HINT_T0);
        }
    for (rd_int p = 0; p < kc; p++) {
        const __m512 b0 = _mm512_load_ps(b);
        const __m512 b1 = _mm512_load_ps(b + 16);
        __m512 av;
        av = _mm512_set1_ps(a[0]);
        c00 = _mm512_fmadd_ps(av, b0, c00);
        c01 = _mm512_fmadd_ps(av, b1, c01);
        av = _mm512_set1_ps(a[1]);
        c10 = _mm512_fmadd_ps(av, b0, c10);
        c11 = _mm512_fmadd_ps(av, b1, c11);
        av = _mm512_set1_ps(a[2]);
        c20 = _mm512_fmadd_ps(av, b0, c20);
        c21 = _mm512_fmadd_ps(av, b1, c21);
        av = _mm512_set1_ps(a[3]);
        c30 = _mm512_fmadd_ps(av, b0, c30);
        c31 = _mm512_fmadd_ps(av, b1, c31);
        av = _mm512_set1_ps(a[4]);
        c40 = _mm512_fmadd_ps(av, b0, c40);
        c41 = _mm512_fmadd_ps(av, b1, c41);
        av = _mm512_set1_ps(a[5]);
        c50 = _mm512_fmadd_ps(av, b0, c50);
        c51 = _mm512_fmadd_ps(av, b1, c51);
        av = _mm512_set1_ps(a[6]);
        c60 = _mm512_fmadd_ps(av, b0, c60);
        c61 = _mm512_fmadd_ps(av, b1, c61);
        av = _mm512_set1_ps(a[7]);
        c70 = _mm512_fmadd_ps(av, b0, c70);
        c71 = _mm512_fmadd_ps(av, b1, c71);
        av = _mm512_set1_ps(a[8]);
        c80 = _mm512_fmadd_ps(av, b0, c80);
        c81 = _mm512_fmadd_ps(av, b1, c81);
        av = _mm512_set1_ps(a[9]);
        c90 = _mm512_fmadd_ps(av, b0, c90);
        c91 = _mm512_fmadd_ps(av, b1, c91);
        av = _mm512_set1_ps(a[10]);
        c100 = _mm512_fmadd_ps(av, b0, c100);
        c101 = _mm512_fmadd_ps(av, b1, c101);
        av = _mm512_set1_ps(a[11]);
        c110 = _mm512_fmadd_ps(av, b0, c110);
        c111 = _mm512_fmadd_ps(av, b1, c111);
        a += 12;
        b += 32;
    }
    if (m == 12 && n == 32 && cs_c == 1) {
        s_store_row(c + 0 * rs_c, c00, c01, accumulate);
        s_store_row(c + 1 * rs_c, c10, c11, accumulate);
        s_store_row(c + 2 * rs_c, c20, c21, accumulate);
        s_store_row(c + 3 * rs_c, c30, c31, accumulate);
        s_store_row(c + 4 * rs_c, c40, c41, accumulate);
        s_store_row(c + 5 * rs_c, c50, c51, accumulate);
        s_store_row(c + 6 * rs_c, c60, c61, accumulate);
        s_store_row(c + 7 * rs_c, c70, c71, accumulate);
        s_store_row(c + 8 * rs_c, c80, c81, accumulate);
        s_store_row(c + 9 * rs_c, c90, c91, accumulate);
        s_store_row(c + 10 * rs_c, c100, c101, accumulate);
        s_store_row(c + 11 * rs_c, c110, c111, accumulate);
        return;
    }
    float buf[384] __attribute__((aligned(64)));
    _mm512_store_ps(buf + 0, c00);
    _mm512_store_ps(buf + 16, c01);
    _mm512_store_ps(buf + 32, c10);
    _mm512_store_ps(buf + 48, c11);
    _mm512_store_ps(buf + 64, c20);
    _mm512_store_ps(buf + 80, c21);
    _mm512_store_ps(buf + 96, c30);
    _mm512_store_ps(buf + 112, c31);
    _mm512_store_ps(buf + 128, c40);
    _mm512_store_ps(buf + 144, c41);
    _mm512_store_ps(buf + 160, c50);
    _mm512_store_ps(buf + 176, c51);
    _mm512_store_ps(buf + 192, c60);
    _mm512_store_ps(buf + 208, c61);
    _mm512_store_ps(buf + 224, c70);
    _mm512_store_ps(buf + 240, c71);
    _mm512_store_ps(buf + 256, c80);
    _mm512_store_ps(buf + 272, c81);
    _mm512_store_ps(buf + 288, c90);
    _mm512_store_ps(buf + 304, c91);
    _mm512_store_ps(buf + 320, c100);
    _mm512_store_ps(buf + 336, c101);
    _mm512_store_ps(buf + 352, c110);
    _mm512_store_ps(buf + 368, c111);
    rd_s_store_edge(buf, 32, c, rs_c, cs_c, m, n, accumulate);
}

void
rd_sgemm_avx512_12x32(rd_int kc, const float *a, const float *b, float *c,
                      rd_int rs_c, rd_int cs_c, int m, int n, int accumulate)
{
    if (m > 8)
        s_rows12(kc, a, b, c, rs_c, cs_c, m, n, accumulate);
    else if (m > 4)
        s_rows8(kc, a, b, c, rs_c, cs_c, m, n, accumulate);
    else
        s_rows4(kc, a, b, c, rs_c, cs_c, m, n, accumulate);
}

/* ---------------------------------------------------------------- float64 */

RD_AVX512 static inline void
d_store_row(double *c, __m512d lo, __m512d hi, int accumulate)
{
    if (accumulate) {
        lo = _mm512_add_pd(_mm512_loadu_pd(c), lo);
        hi = _mm512_add_pd(_mm512_loadu_pd(c + 8), hi);
    }
    _mm512_storeu_pd(c, lo);
    _mm512_storeu_pd(c + 8, hi);
}

RD_AVX512 static void
d_rows4(rd_int kc, const double *a, const double *b, double *c, rd_int rs_c, rd_int cs_c,
          int m, int n, int accumulate)
{
    __m512d c00 = _mm512_setzero_pd(), c01 = _mm512_setzero_pd();
    __m512d c10 = _mm512_setzero_pd(), c11 = _mm512_setzero_pd();
    __m512d c20 = _mm512_setzero_pd(), c21 = _mm512_setzero_pd();
    __m512d c30 = _mm512_setzero_pd(), c31 = _mm512_setzero_pd();
    /* bring the C tile in while the contraction runs */
    if (cs_c == 1)
        for (int i = 0; i < m; i++) {
            _mm_prefetch((const char *)(c + i * rs_c), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + i * rs_c + 15), _MM_HINT_T0);
        }
    for (rd_int p = 0; p < kc; p++) {
        const __m512d b0 = _mm512_load_pd(b);
        const __m512d b1 = _mm512_load_pd(b + 8);
        __m512d av;
        av = _mm512_set1_pd(a[0]);
        c00 = _mm512_fmadd_pd(av, b0, c00);
        c01 = _mm512_fmadd_pd(av, b1, c01);
        av = _mm512_set1_pd(a[1]);
        c10 = _mm512_fmadd_pd(av, b0, c10);
        c11 = _mm512_fmadd_pd(av, b1, c11);
        av = _mm512_set1_pd(a[2]);
        c20 = _mm512_fmadd_pd(av, b0, c20);
        c21 = _mm512_fmadd_pd(av, b1, c21);
        av = _mm512_set1_pd(a[3]);
        c30 = _mm512_fmadd_pd(av, b0, c30);
        c31 = _mm512_fmadd_pd(av, b1, c31);
        a += 12;
        b += 16;
    }
    if (m == 4 && n == 16 && cs_c == 1) {
        d_store_row(c + 0 * rs_c, c00, c01, accumulate);
        d_store_row(c + 1 * rs_c, c10, c11, accumulate);
        d_store_row(c + 2 * rs_c, c20, c21, accumulate);
        d_store_row(c + 3 * rs_c, c30, c31, accumulate);
        return;
    }
    double buf[64] __attribute__((aligned(64)));
    _mm512_store_pd(buf + 0, c00);
    _mm512_store_pd(buf + 8, c01);
    _mm512_store_pd(buf + 16, c10);
    _mm512_store_pd(buf + 24, c11);
    _mm512_store_pd(buf + 32, c20);
    _mm512_store_pd(buf + 40, c21);
    _mm512_store_pd(buf + 48, c30);
    _mm512_store_pd(buf + 56, c31);
    rd_d_store_edge(buf, 16, c, rs_c, cs_c, m, n, accumulate);
}

RD_AVX512 static void
d_rows8(rd_int kc, const double *a, const double *b, double *c, rd_int rs_c, rd_int cs_c,
          int m, int n, int accumulate)
{
    __m512d c00 = _mm512_setzero_pd(), c01 = _mm512_setzero_pd();
    __m512d c10 = _mm512_setzero_pd(), c11 = _mm512_setzero_pd();
    __m512d c20 = _mm512_setzero_pd(), c21 = _mm512_setzero_pd();
    __m512d c30 = _mm512_setzero_pd(), c31 = _mm512_setzero_pd();
    __m512d c40 = _mm512_setzero_pd(), c41 = _mm512_setzero_pd();
    __m512d c50 = _mm512_setzero_pd(), c51 = _mm512_setzero_pd();
    __m512d c60 = _mm512_setzero_pd(), c61 = _mm512_setzero_pd();
    __m512d c70 = _mm512_setzero_pd(), c71 = _mm512_setzero_pd();
    /* bring the C tile in while the contraction runs */
    if (cs_c == 1)
        for (int i = 0; i < m; i++) {
            _mm_prefetch((const char *)(c + i * rs_c), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + i * rs_c + 15), _MM_HINT_T0);
        }
    for (rd_int p = 0; p < kc; p++) {
        const __m512d b0 = _mm512_load_pd(b);
        const __m512d b1 = _mm512_load_pd(b + 8);
        __m512d av;
        av = _mm512_set1_pd(a[0]);
        c00 = _mm512_fmadd_pd(av, b0, c00);
        c01 = _mm512_fmadd_pd(av, b1, c01);
        av = _mm512_set1_pd(a[1]);
        c10 = _mm512_fmadd_pd(av, b0, c10);
        c11 = _mm512_fmadd_pd(av, b1, c11);
        av = _mm512_set1_pd(a[2]);
        c20 = _mm512_fmadd_pd(av, b0, c20);
        c21 = _mm512_fmadd_pd(av, b1, c21);
        av = _mm512_set1_pd(a[3]);
        c30 = _mm512_fmadd_pd(av, b0, c30);
        c31 = _mm512_fmadd_pd(av, b1, c31);
        av = _mm512_set1_pd(a[4]);
        c40 = _mm512_fmadd_pd(av, b0, c40);
        c41 = _mm512_fmadd_pd(av, b1, c41);
        av = _mm512_set1_pd(a[5]);
        c50 = _mm512_fmadd_pd(av, b0, c50);
        c51 = _mm512_fmadd_pd(av, b1, c51);
        av = _mm512_set1_pd(a[6]);
        c60 = _mm512_fmadd_pd(av, b0, c60);
        c61 = _mm512_fmadd_pd(av, b1, c61);
        av = _mm512_set1_pd(a[7]);
        c70 = _mm512_fmadd_pd(av, b0, c70);
        c71 = _mm512_fmadd_pd(av, b1, c71);
        a += 12;
        b += 16;
    }
    if (m == 8 && n == 16 && cs_c == 1) {
        d_store_row(c + 0 * rs_c, c00, c01, accumulate);
        d_store_row(c + 1 * rs_c, c10, c11, accumulate);
        d_store_row(c + 2 * rs_c, c20, c21, accumulate);
        d_store_row(c + 3 * rs_c, c30, c31, accumulate);
        d_store_row(c + 4 * rs_c, c40, c41, accumulate);
        d_store_row(c + 5 * rs_c, c50, c51, accumulate);
        d_store_row(c + 6 * rs_c, c60, c61, accumulate);
        d_store_row(c + 7 * rs_c, c70, c71, accumulate);
        return;
    }
    double buf[128] __attribute__((aligned(64)));
    _mm512_store_pd(buf + 0, c00);
    _mm512_store_pd(buf + 8, c01);
    _mm512_store_pd(buf + 16, c10);
    _mm512_store_pd(buf + 24, c11);
    _mm512_store_pd(buf + 32, c20);
    _mm512_store_pd(buf + 40, c21);
    _mm512_store_pd(buf + 48, c30);
    _mm512_store_pd(buf + 56, c31);
    _mm512_store_pd(buf + 64, c40);
    _mm512_store_pd(buf + 72, c41);
    _mm512_store_pd(buf + 80, c50);
    _mm512_store_pd(buf + 88, c51);
    _mm512_store_pd(buf + 96, c60);
    _mm512_store_pd(buf + 104, c61);
    _mm512_store_pd(buf + 112, c70);
    _mm512_store_pd(buf + 120, c71);
    rd_d_store_edge(buf, 16, c, rs_c, cs_c, m, n, accumulate);
}

RD_AVX512 static void
d_rows12(rd_int kc, const double *a, const double *b, double *c, rd_int rs_c, rd_int cs_c,
          int m, int n, int accumulate)
{
    __m512d c00 = _mm512_setzero_pd(), c01 = _mm512_setzero_pd();
    __m512d c10 = _mm512_setzero_pd(), c11 = _mm512_setzero_pd();
    __m512d c20 = _mm512_setzero_pd(), c21 = _mm512_setzero_pd();
    __m512d c30 = _mm512_setzero_pd(), c31 = _mm512_setzero_pd();
    __m512d c40 = _mm512_setzero_pd(), c41 = _mm512_setzero_pd();
    __m512d c50 = _mm512_setzero_pd(), c51 = _mm512_setzero_pd();
    __m512d c60 = _mm512_setzero_pd(), c61 = _mm512_setzero_pd();
    __m512d c70 = _mm512_setzero_pd(), c71 = _mm512_setzero_pd();
    __m512d c80 = _mm512_setzero_pd(), c81 = _mm512_setzero_pd();
    __m512d c90 = _mm512_setzero_pd(), c91 = _mm512_setzero_pd();
    __m512d c100 = _mm512_setzero_pd(), c101 = _mm512_setzero_pd();
    __m512d c110 = _mm512_setzero_pd(), c111 = _mm512_setzero_pd();
    /* bring the C tile in while the contraction runs */
    if (cs_c == 1)
        for (int i = 0; i < m; i++) {
            _mm_prefetch((const char *)(c + i * rs_c), _MM_HINT_T0);
            _mm_prefetch((const char *)(c + i * rs_c + 15), _MM_HINT_T0);
        }
    for (rd_int p = 0; p < kc; p++) {
        const __m512d b0 = _mm512_load_pd(b);
        const __m512d b1 = _mm512_load_pd(b + 8);
        __m512d av;
        av = _mm512_set1_pd(a[0]);
        c00 = _mm512_fmadd_pd(av, b0, c00);
        c01 = _mm512_fmadd_pd(av, b1, c01);
        av = _mm512_set1_pd(a[1]);
        c10 = _mm512_fmadd_pd(av, b0, c10);
        c11 = _mm512_fmadd_pd(av, b1, c11);
        av = _mm512_set1_pd(a[2]);
        c20 = _mm512_fmadd_pd(av, b0, c20);
        c21 = _mm512_fmadd_pd(av, b1, c21);
        av = _mm512_set1_pd(a[3]);
        c30 = _mm512_fmadd_pd(av, b0, c30);
        c31 = _mm512_fmadd_pd(av, b1, c31);
        av = _mm512_set1_pd(a[4]);
        c40 = _mm512_fmadd_pd(av, b0, c40);
        c41 = _mm512_fmadd_pd(av, b1, c41);
        av = _mm512_set1_pd(a[5]);
        c50 = _mm512_fmadd_pd(av, b0, c50);
        c51 = _mm512_fmadd_pd(av, b1, c51);
        av = _mm512_set1_pd(a[6]);
        c60 = _mm512_fmadd_pd(av, b0, c60);
        c61 = _mm512_fmadd_pd(av, b1, c61);
        av = _mm512_set1_pd(a[7]);
        c70 = _mm512_fmadd_pd(av, b0, c70);
        c71 = _mm512_fmadd_pd(av, b1, c71);
        av = _mm512_set1_pd(a[8]);
        c80 = _mm512_fmadd_pd(av, b0, c80);
        c81 = _mm512_fmadd_pd(av, b1, c81);
        av = _mm512_set1_pd(a[9]);
        c90 = _mm512_fmadd_pd(av, b0, c90);
        c91 = _mm512_fmadd_pd(av, b1, c91);
        av = _mm512_set1_pd(a[10]);
        c100 = _mm512_fmadd_pd(av, b0, c100);
        c101 = _mm512_fmadd_pd(av, b1, c101);
        av = _mm512_set1_pd(a[11]);
        c110 = _mm512_fmadd_pd(av, b0, c110);
        c111 = _mm512_fmadd_pd(av, b1, c111);
        a += 12;
        b += 16;
    }
    if (m == 12 && n == 16 && cs_c == 1) {
        d_store_row(c + 0 * rs_c, c00, c01, accumulate);
        d_store_row(c + 1 * rs_c, c10, c11, accumulate);
        d_store_row(c + 2 * rs_c, c20, c21, accumulate);
        d_store_row(c + 3 * rs_c, c30, c31, accumulate);
        d_store_row(c + 4 * rs_c, c40, c41, accumulate);
        d_store_row(c + 5 * rs_c, c50, c51, accumulate);
        d_store_row(c + 6 * rs_c, c60, c61, accumulate);
        d_store_row(c + 7 * rs_c, c70, c71, accumulate);
        d_store_row(c + 8 * rs_c, c80, c81, accumulate);
        d_store_row(c + 9 * rs_c, c90, c91, accumulate);
        d_store_row(c + 10 * rs_c, c100, c101, accumulate);
        d_store_row(c + 11 * rs_c, c110, c111, accumulate);
        return;
    }
    double buf[192] __attribute__((aligned(64)));
    _mm512_store_pd(buf + 0, c00);
    _mm512_store_pd(buf + 8, c01);
    _mm512_store_pd(buf + 16, c10);
    _mm512_store_pd(buf + 24, c11);
    _mm512_store_pd(buf + 32, c20);
    _mm512_store_pd(buf + 40, c21);
    _mm512_store_pd(buf + 48, c30);
    _mm512_store_pd(buf + 56, c31);
    _mm512_store_pd(buf + 64, c40);
    _mm512_store_pd(buf + 72, c41);
    _mm512_store_pd(buf + 80, c50);
    _mm512_store_pd(buf + 88, c51);
    _mm512_store_pd(buf + 96, c60);
    _mm512_store_pd(buf + 104, c61);
    _mm512_store_pd(buf + 112, c70);
    _mm512_store_pd(buf + 120, c71);
    _mm512_store_pd(buf + 128, c80);
    _mm512_store_pd(buf + 136, c81);
    _mm512_store_pd(buf + 144, c90);
    _mm512_store_pd(buf + 152, c91);
    _mm512_store_pd(buf + 160, c100);
    _mm512_store_pd(buf + 168, c101);
    _mm512_store_pd(buf + 176, c110);
    _mm512_store_pd(buf + 184, c111);
    rd_d_store_edge(buf, 16, c, rs_c, cs_c, m, n, accumulate);
}

void
rd_dgemm_avx512_12x16(rd_int kc, const double *a, const double *b, double *c,
                      rd_int rs_c, rd_int cs_c, int m, int n, int accumulate)
{
    if (m > 8)
        d_rows12(kc, a, b, c, rs_c, cs_c, m, n, accumulate);
    else if (m > 4)
        d_rows8(kc, a, b, c, rs_c, cs_c, m, n, accumulate);
    else
        d_rows4(kc, a, b, c, rs_c, cs_c, m, n, accumulate);
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
