/*
 * The shape shared by the AVX-512 micro-kernels of every family (float,
 * bfloat16 dot products, int8 dot products): row bodies for 4, 8 and 12
 * valid rows of a 12-row packed A panel, their accumulators, the C tile's
 * prefetch, and the stores of a finished tile (whole rows, non-temporal
 * rows, or the valid corner through a spill).  Included by the kernel
 * files under kernels/; the element macros (T, V, W, ZERO, ...) are
 * defined by the includer around each instantiation.
 */
#ifndef RD_AVX512_BODY_H
#define RD_AVX512_BODY_H

#include "rd_kernel.h"

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define RD_AVX512 __attribute__((target("avx512f")))

/* The requests of rd_ahead (rd_kernel.h), one line a step: bodies that
 * take part define AHEAD_ENTER/STEP/LEAVE as RD_AHEAD_*, the others as
 * nothing. */
#define RD_AHEAD_ENTER const char *ahead = rd_ahead.next, *const ahead_end = rd_ahead.end;
#define RD_AHEAD_STEP                                                       \
    if (ahead < ahead_end) {                                                \
        _mm_prefetch(ahead, _MM_HINT_T1);                                   \
        ahead += 64;                                                        \
    }
#define RD_AHEAD_LEAVE rd_ahead.next = ahead;
#define AHEAD_ENTER
#define AHEAD_STEP
#define AHEAD_LEAVE

#define ROWS4(X) X(0) X(1) X(2) X(3)
#define ROWS8(X) ROWS4(X) X(4) X(5) X(6) X(7)
#define ROWS12(X) ROWS8(X) X(8) X(9) X(10) X(11)

/*
 * One body per row count R in {4, 8, 12}, all reading the 12-row packed A
 * panel: a tile with at most 4 or 8 valid rows (the last rows of a small
 * group) runs only the FMAs of those rows instead of all twelve.
 *
 * Per dtype: T the element type, V the vector type, W its lanes (NR = 2 W),
 * and the intrinsics ZERO, SET1, FMA, LOAD_A, STORE_A.
 */
#define RD_DECL(i) V c##i##0 = ZERO(), c##i##1 = ZERO();
#define RD_STEP(i)                                                          \
    av = SET1(a[i]);                                                        \
    c##i##0 = FMA(av, b0, c##i##0);                                         \
    c##i##1 = FMA(av, b1, c##i##1);
#define RD_PUT(i) STORE_ROW(c + (i) * rs_c, c##i##0, c##i##1, accumulate);
#define RD_STREAM_PUT(i)                                                    \
    STREAM(c + (i) * rs_c, c##i##0);                                        \
    STREAM(c + (i) * rs_c + W, c##i##1);
#define RD_SPILL(i)                                                         \
    STORE_A(buf + (i) * 2 * W, c##i##0);                                    \
    STORE_A(buf + (i) * 2 * W + W, c##i##1);

/* The parts of a body around its contraction loop: the accumulators and
 * the C tile's prefetch (or the decision to stream it), then the store of
 * the tile (whole rows, streamed rows, or the valid corner of a spill). */
#define RD_BODY_ENTER(R, ROWS)                                              \
    ROWS(RD_DECL)                                                           \
    const int stream = accumulate == RD_STREAM && m == (R) && n == 2 * W    \
                       && cs_c == 1                                         \
                       && rd_stream_aligned(c, rs_c * (rd_int)sizeof(T));   \
    /* bring the C tile in while the contraction runs (not when streaming: \
     * non-temporal stores write the lines without reading them) */         \
    if (cs_c == 1 && !stream)                                               \
        for (int i = 0; i < m; i++) {                                       \
            _mm_prefetch((const char *)(c + i * rs_c), _MM_HINT_T0);        \
            _mm_prefetch((const char *)(c + i * rs_c + 2 * W - 1), _MM_HINT_T0); \
        }
#define RD_BODY_LEAVE(R, ROWS)                                              \
    if (m == (R) && n == 2 * W && cs_c == 1) {                              \
        if (stream) {                                                       \
            ROWS(RD_STREAM_PUT)                                             \
        } else {                                                            \
            ROWS(RD_PUT)                                                    \
        }                                                                   \
        return;                                                             \
    }                                                                       \
    T buf[(R) * 2 * W] __attribute__((aligned(64)));                        \
    ROWS(RD_SPILL)                                                          \
    STORE_EDGE(buf, 2 * W, c, rs_c, cs_c, m, n, accumulate);

#define RD_BODY(NAME, R, ROWS)                                              \
RD_AVX512 static void                                                       \
NAME(rd_int kc, const T *a, const TB *b, T *c, rd_int rs_c, rd_int cs_c,    \
     int m, int n, int accumulate)                                          \
{                                                                           \
    RD_BODY_ENTER(R, ROWS)                                                  \
    AHEAD_ENTER                                                             \
    for (rd_int p = 0; p < kc; p++) {                                       \
        LOAD_B(b, b0, b1)                                                   \
        V av;                                                               \
        ROWS(RD_STEP)                                                       \
        AHEAD_STEP                                                          \
        a += 12;                                                            \
        b += 2 * W;                                                         \
    }                                                                       \
    AHEAD_LEAVE                                                             \
    RD_BODY_LEAVE(R, ROWS)                                                  \
}

/* Dispatch on the number of valid rows. */
#define RD_KERNEL(NAME, BODY4, BODY8, BODY12)                               \
static void                                                                 \
NAME(rd_int kc, const void *a_, const void *b_, void *c_, rd_int rs_c,      \
     rd_int cs_c, int m, int n, int accumulate)                             \
{                                                                           \
    const T *a = (const T *)a_;                                             \
    const TB *b = (const TB *)b_;                                           \
    T *c = (T *)c_;                                                         \
    if (m > 8)                                                              \
        BODY12(kc, a, b, c, rs_c, cs_c, m, n, accumulate);                  \
    else if (m > 4)                                                         \
        BODY8(kc, a, b, c, rs_c, cs_c, m, n, accumulate);                   \
    else                                                                    \
        BODY4(kc, a, b, c, rs_c, cs_c, m, n, accumulate);                   \
}

/* acc += u8 x s8 quads (vpdpbusd), written as an instruction with its
 * accumulator tied: gcc 12 gives the intrinsic's accumulator a register
 * of its own, copies it every step and spills the accumulators of a
 * 24-accumulator loop to the stack (the int8-dot and w4a8 kernels). */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static inline __m512i
rd_avx512_dpbusd(__m512i acc, __m512i u, __m512i s)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}

/* The float32 scales 2^(e - 127) of 16 e8m0 exponents (e 0: 2^-127, a
 * subnormal), for the 4-bit panels (RD_CT_F32_F4W). */
RD_AVX512 static inline __m512
rd_avx512_e8m0(const uint8_t *e)
{
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)e));
    const __mmask16 zero = _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512());
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_slli_epi32(v, 23), zero,
                                                     _mm512_set1_epi32(0x00400000)));
}

/* 16 columns of a row of C (cols of them valid), stored or added: whole
 * where contiguous (masked at the right edge), through a spill where
 * strided (the few-row kernels' edge) */
RD_AVX512 static inline __attribute__((always_inline)) void
rd_avx512_put16(__m512 v, float *c, rd_int cs_c, rd_int cols, int mode)
{
    if (cols <= 0)
        return;
    if (cs_c == 1) {
        const __mmask16 m = cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1u);
        if (mode == RD_ADD)
            v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, c), v);
        _mm512_mask_storeu_ps(c, m, v);
        return;
    }
    float t[16] __attribute__((aligned(64)));
    _mm512_store_ps(t, v);
    for (rd_int j = 0; j < cols && j < 16; j++)
        c[j * cs_c] = mode == RD_ADD ? c[j * cs_c] + t[j] : t[j];
}

/* One row of a float32 tile, 32 columns: stored, or added to C. */
RD_AVX512 static inline void
s_store_row(float *c, __m512 lo, __m512 hi, int accumulate)
{
    if (accumulate == RD_ADD) {
        lo = _mm512_add_ps(_mm512_loadu_ps(c), lo);
        hi = _mm512_add_ps(_mm512_loadu_ps(c + 16), hi);
    }
    _mm512_storeu_ps(c, lo);
    _mm512_storeu_ps(c + 16, hi);
}

#endif /* RD_AVX512_BODY_H */
