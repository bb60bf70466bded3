/*
 * AVX-512 dot-product micro-kernels, each written once over its "dot step",
 * for CPUs that have the instruction (chosen at run time).  Their twins
 * (kernels/rd_dot_twins.c: "avx512-bf16-twin", "avx512-vnni-twin") compute
 * the instruction's arithmetic in plain C with the same register block and
 * blocking (kernels/rd_dot_blocking.h) on every CPU, so that the same
 * packing, edges and epilogues are tested everywhere, and the tests hold
 * each native kernel to its twin bit for bit wherever the CPU has it.
 *
 *   rd_bf16dot_avx512_12x32 (family "avx512-bf16"):
 *       bfloat16 k-pairs into float32 (vdpbf16ps), RD_CT_BF16DP
 *   rd_u8s8dot_avx512_12x32 (family "avx512-vnni"):
 *       int8 k-quads into int32 (vpdpbusd), RD_CT_U8S8
 *
 * The register block is the float32 kernel's: 12 rows x 32 columns in 24
 * zmm accumulators.  Per step (a pair or a quad of the contraction): two
 * loads of B, twelve 32-bit broadcasts of A, 24 dot products, each 2 (bf16)
 * or 4 (int8) multiply-adds a lane.
 *
 * The instructions' arithmetic (SPEC: measured against Zen4 hardware;
 * kernels/rd_dot_arith.h writes it lane by lane): vdpbf16ps adds to each
 * float32 lane the product of the odd (upper) bfloat16 elements of the
 * pair, rounded, then that of the even ones, rounded, with denormal inputs
 * and results as zero, whatever MXCSR says.  vpdpbusd adds to each int32
 * lane, modulo 2^32, the four products of A's unsigned bytes and B's signed
 * bytes.
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "rd_avx512_body.h"
#include "rd_dot_blocking.h"
#include "rd_avx512_w4a8.h"

#define RD_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define RD_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

/* ------------------------------------------------------------ dot steps */

RD_BF16_TARGET static inline __m512
rd_dpbf16_native(__m512 acc, __m512i a, __m512i b)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

/* ------------------------------------------------------- bfloat16 pairs */

/* One pair step of row i: A's pair broadcast, against both B vectors. */
#define BF_STEP(i)                                                          \
    {                                                                       \
        const __m512i av = _mm512_set1_epi32(a32[i]);                       \
        c##i##0 = DOT(c##i##0, av, b0);                                     \
        c##i##1 = DOT(c##i##1, av, b1);                                     \
    }

/* The float32 body of rd_avx512_body.h with pair steps: accumulators, C's
 * prefetch, the loop over kp / 2 pairs, the store. */
#define RD_BF_BODY(NAME, TARGET, R, ROWS)                                   \
TARGET static void                                                          \
NAME(rd_int kc, const T *a, const TB *b, T *c, rd_int rs_c, rd_int cs_c,    \
     int m, int n, int accumulate)                                          \
{                                                                           \
    const int32_t *a32 = (const int32_t *)(const void *)a;                  \
    const rd_int pairs = (kc + 1) / 2;                                      \
    RD_BODY_ENTER(R, ROWS)                                                  \
    for (rd_int q = 0; q < pairs; q++) {                                    \
        const __m512i b0 = _mm512_loadu_si512((const void *)b);             \
        const __m512i b1 = _mm512_loadu_si512((const void *)(b + 2 * W));   \
        ROWS(BF_STEP)                                                       \
        a32 += 12;                                                          \
        b += 4 * W;                                                         \
    }                                                                       \
    RD_BODY_LEAVE(R, ROWS)                                                  \
}

#define T float
#define TB uint16_t
#define V __m512
#define W 16
#define ZERO _mm512_setzero_ps
#define STORE_A _mm512_store_ps
#define STORE_ROW s_store_row
#define STREAM _mm512_stream_ps
#define STORE_EDGE rd_s_store_edge

#define DOT rd_dpbf16_native
RD_BF_BODY(bf_rows4, RD_BF16_TARGET, 4, ROWS4)
RD_BF_BODY(bf_rows8, RD_BF16_TARGET, 8, ROWS8)
RD_BF_BODY(bf_rows12, RD_BF16_TARGET, 12, ROWS12)
RD_KERNEL(rd_bf16dot_avx512_12x32, bf_rows4, bf_rows8, bf_rows12)
#undef DOT


#undef TB
#undef V
#undef ZERO

/* ---------------------------------------------------------- int8 quads */

/* One quad step of row i. */
#define U_STEP(i)                                                           \
    {                                                                       \
        const __m512i av = _mm512_set1_epi32(a32[i]);                       \
        c##i##0 = DOT(c##i##0, av, b0);                                     \
        c##i##1 = DOT(c##i##1, av, b1);                                     \
    }
/* Row i's int32 sums to float32 (rd_kernel.h, RD_CT_U8S8): the +128 shift
 * and the zero points taken back, t = S - u cb - v zb with u = 128 + za and
 * v = ra - kc za (wrapping, as the instruction's sums do), then scaled. */
#define U_FINISH(i)                                                         \
    {                                                                       \
        const __m512i u = _mm512_set1_epi32((int32_t)(128u + (uint32_t)za[i])); \
        const __m512i v = _mm512_set1_epi32((int32_t)((uint32_t)ra[i] - (uint32_t)kc * (uint32_t)za[i])); \
        const __m512 s = _mm512_set1_ps(sa[i]);                             \
        c##i##0 = _mm512_sub_epi32(c##i##0, _mm512_mullo_epi32(u, cb0));   \
        c##i##1 = _mm512_sub_epi32(c##i##1, _mm512_mullo_epi32(u, cb1));   \
        if (zero_b) {                                                       \
            c##i##0 = _mm512_sub_epi32(c##i##0, _mm512_mullo_epi32(v, zb0)); \
            c##i##1 = _mm512_sub_epi32(c##i##1, _mm512_mullo_epi32(v, zb1)); \
        }                                                                   \
        f##i##0 = _mm512_mul_ps(_mm512_cvtepi32_ps(c##i##0), _mm512_mul_ps(s, sb0)); \
        f##i##1 = _mm512_mul_ps(_mm512_cvtepi32_ps(c##i##1), _mm512_mul_ps(s, sb1)); \
    }
#define U_FDECL(i) __m512 f##i##0, f##i##1;
#define U_PUT(i) s_store_row(c + (i) * rs_c, f##i##0, f##i##1, accumulate);
#define U_SPILL(i)                                                          \
    _mm512_store_ps(buf + (i) * 32, f##i##0);                               \
    _mm512_store_ps(buf + (i) * 32 + 16, f##i##1);
#define U_DECL(i) __m512i c##i##0 = _mm512_setzero_si512(), c##i##1 = _mm512_setzero_si512();

#define RD_U_BODY(NAME, TARGET, R, ROWS)                                    \
TARGET static void                                                          \
NAME(rd_int kc, const T *a_, const TB *b, T *c, rd_int rs_c, rd_int cs_c,   \
     int m, int n, int accumulate)                                          \
{                                                                           \
    const uint8_t *a = (const uint8_t *)(const void *)a_;                   \
    const rd_int kq = (kc + 3) / 4 * 4;                                     \
    const int32_t *a32 = (const int32_t *)(const void *)a;                  \
    const char *ta = (const char *)a + 12 * kq, *tb = (const char *)b + 32 * kq; \
    const int32_t *ra = (const int32_t *)(const void *)ta;                  \
    const float *sa = (const float *)(const void *)(ta + 48);               \
    const int32_t *za = (const int32_t *)(const void *)(ta + 96);           \
    ROWS(U_DECL)                                                            \
    for (rd_int q = 0; q < kq; q += 4) {                                    \
        const __m512i b0 = _mm512_loadu_si512((const void *)b);             \
        const __m512i b1 = _mm512_loadu_si512((const void *)(b + 64));      \
        ROWS(U_STEP)                                                        \
        a32 += 12;                                                          \
        b += 128;                                                           \
    }                                                                       \
    const __m512i cb0 = _mm512_loadu_si512((const void *)tb);               \
    const __m512i cb1 = _mm512_loadu_si512((const void *)(tb + 64));        \
    const __m512 sb0 = _mm512_loadu_ps(tb + 128), sb1 = _mm512_loadu_ps(tb + 192); \
    const __m512i zb0 = _mm512_loadu_si512((const void *)(tb + 256));       \
    const __m512i zb1 = _mm512_loadu_si512((const void *)(tb + 320));       \
    const int zero_b = _mm512_test_epi32_mask(zb0, zb0) != 0 || _mm512_test_epi32_mask(zb1, zb1) != 0; \
    ROWS(U_FDECL)                                                           \
    ROWS(U_FINISH)                                                          \
    if (m == (R) && n == 32 && cs_c == 1) {                                 \
        ROWS(U_PUT)                                                         \
        return;                                                             \
    }                                                                       \
    float buf[(R) * 32] __attribute__((aligned(64)));                       \
    ROWS(U_SPILL)                                                           \
    rd_s_store_edge(buf, 32, c, rs_c, cs_c, m, n, accumulate);              \
}

/* The bodies dispatched on the number of valid rows by RD_KERNEL (A's
 * bytes reach them as T, B's as TB).  No streaming stores: s_store_row and
 * rd_s_store_edge add only for RD_ADD, so RD_STREAM stores plainly. */
#define TB int8_t

#define DOT rd_avx512_dpbusd
RD_U_BODY(u_rows4, RD_VNNI_TARGET, 4, ROWS4)
RD_U_BODY(u_rows8, RD_VNNI_TARGET, 8, ROWS8)
RD_U_BODY(u_rows12, RD_VNNI_TARGET, 12, ROWS12)
RD_KERNEL(rd_u8s8dot_avx512_12x32, u_rows4, u_rows8, u_rows12)
#undef DOT


#undef TB
#undef T
#undef W
#undef STORE_A
#undef STORE_ROW
#undef STREAM
#undef STORE_EDGE

/* ------------------------------------------------------------- families */

static int
rd_avx512bw_runnable(void)
{
    return rd_cpu()->avx512bw;
}

static int
rd_avx512_bf16_runnable(void)
{
    return rd_avx512bw_runnable() && rd_cpu()->avx512_bf16;
}

static int
rd_avx512_vnni_runnable(void)
{
    return rd_avx512bw_runnable() && rd_cpu()->avx512_vnni;
}

const rd_family_t rd_family_avx512_bf16 = {
    "avx512-bf16", rd_avx512_bf16_runnable,
    {[RD_CT_BF16DP] = RD_BF16_DESC(rd_bf16dot_avx512_12x32)}, 0, {{NULL, 0, 0}}, {{NULL, 0, NULL, 0}},
};
/* (with the w4a8 kernels of rd_avx512_w4a8.c: 4-bit weights, int8 rows) */
const rd_family_t rd_family_avx512_vnni = {
    "avx512-vnni", rd_avx512_vnni_runnable,
    {[RD_CT_U8S8] = RD_VNNI_DESC(rd_u8s8dot_avx512_12x32),
     [RD_CT_U8S8_I4] = RD_VNNI_DESC(rd_w4a8_avx512_i4),
     [RD_CT_U8S8_F4] = RD_VNNI_DESC(rd_w4a8_avx512_f4)},
    0, {{NULL, 0, 0}},
    {[RD_CT_U8S8_I4] = {rd_w4a8_few_avx512_i4, RD_W4_FEW_ROWS, rd_w4a8_avx512_i4, RD_W4_KMAX},
     [RD_CT_U8S8_F4] = {rd_w4a8_few_avx512_f4, RD_W4_FEW_ROWS, rd_w4a8_avx512_f4, RD_W4_KMAX}},
};

#endif /* RD_HAVE_X86_KERNELS */
