/*
 * AVX-512F micro-kernels, for CPUs that have it (chosen at run time).
 *
 *   rd_sgemm_avx512_12x32:  12 rows x 32 columns of float32
 *   rd_sgemm_avx512_stream_8x2048: up to 8 rows reading B in place (rd_sukr_t)
 *   rd_dgemm_avx512_12x16:  12 rows x 16 columns of float64
 *   rd_sgemm_avx512_{bf16w,f16w}_12x32: float32 with 16-bit B panels
 *   rd_i8gemm_avx512_12x32: int16 k-pairs into int32 (AVX-512BW vpmaddwd +
 *       vpaddd), scaled into float32 once per block (RD_CT_I8I32)
 *   rd_sgemm_avx512_{i8w,f8w}_12x32: float32 with one-byte B panels of
 *       prepacked quantized weights (RD_CT_F32_I8W, RD_CT_F32_F8W)
 *   rd_sgemm_avx512_f4w_12x32: float32 with 4-bit B panels (RD_CT_F32_F4W)
 *   rd_sgemm_avx512_i4w_12x32: float32 with int4 B panels (RD_CT_F32_I4W)
 *
 * 24 zmm accumulators (of 32 registers), twice the FMAs per step of the
 * AVX2 6x16 block.  Per step p: two loads of the B row, twelve broadcasts of
 * the A column, 24 FMAs.
 *
 * The family needs AVX-512BW besides AVX-512F (its integer kernel does):
 * every AVX-512 CPU but the Xeon Phi has both; those run the AVX2 family.
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "rd_avx512_body.h"
#include "rd_avx512_few.h"

/* ---------------------------------------------------------------- float32 */

#define T float
#define TB float
#define LOAD_B(b, b0, b1) const V b0 = _mm512_load_ps(b), b1 = _mm512_load_ps((b) + W);
#define V __m512
#define W 16
#define ZERO _mm512_setzero_ps
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define LOAD_A _mm512_load_ps
#define STORE_A _mm512_store_ps
#define STORE_ROW s_store_row
#define STREAM _mm512_stream_ps
#define STORE_EDGE rd_s_store_edge
#undef AHEAD_ENTER
#undef AHEAD_STEP
#undef AHEAD_LEAVE
#define AHEAD_ENTER RD_AHEAD_ENTER
#define AHEAD_STEP RD_AHEAD_STEP
#define AHEAD_LEAVE RD_AHEAD_LEAVE
RD_BODY(s_rows4, 4, ROWS4)
RD_BODY(s_rows8, 8, ROWS8)
/* The 12-row body, which runs the large products, also requests its B
 * micro-panel's two lines RD_S_B_AHEAD bytes (16 steps) ahead into L1
 * each step.  At KC 512 the micro-panel (64 KiB) outgrows L1, so each of
 * the A panels of a block reads it from L2 again, and a core that runs
 * two 512-bit FMAs a cycle waits for it.  Measured in interleaved rounds
 * (float32, MC 144 KC 512, % of the measured FMA peak): on an Intel Xeon
 * with AMX, dense 2048^3 58.5 -> 71.4% at 1 thread and 51.1 -> 61.4% at 2,
 * grouped m4096 k2048 n768 g32 48.8 -> 54.4% and 47.0 -> 50.4%, at 16
 * threads within the noise (56.3 -> 54.7% dense 4096^3, 61.1 -> 59.1%
 * grouped m16384); on Zen4 (one FMA a cycle) 0-0.4% faster. */
#define RD_S_B_AHEAD 2048
#undef AHEAD_STEP
#define AHEAD_STEP                                                          \
    RD_AHEAD_STEP                                                           \
    _mm_prefetch((const char *)b + RD_S_B_AHEAD, _MM_HINT_T0);              \
    _mm_prefetch((const char *)b + RD_S_B_AHEAD + 64, _MM_HINT_T0);
RD_BODY(s_rows12, 12, ROWS12)
RD_KERNEL(rd_sgemm_avx512_12x32, s_rows4, s_rows8, s_rows12)
#undef AHEAD_ENTER
#undef AHEAD_STEP
#undef AHEAD_LEAVE
#define AHEAD_ENTER
#define AHEAD_STEP
#define AHEAD_LEAVE

/* float32 arithmetic on 16-bit B panels, widened in registers: bfloat16
 * rows hold their halves interleaved (RD_CT_F32_BF16W), so a shift moves
 * the even positions (columns 0-15) into float32 and a mask keeps the odd
 * ones (columns 16-31); float16 rows in order go through vcvtph2ps.  Both
 * widenings are exact, so results equal the float32 kernel's on the
 * widened values. */
#undef TB
#undef LOAD_B
#define TB uint16_t
#define LOAD_B(b, b0, b1)                                                   \
    const __m512i bw = _mm512_loadu_si512((const void *)(b));               \
    const V b0 = _mm512_castsi512_ps(_mm512_slli_epi32(bw, 16));            \
    const V b1 = _mm512_castsi512_ps(_mm512_and_si512(bw, _mm512_set1_epi32((int)0xffff0000u)));
RD_BODY(sb_rows4, 4, ROWS4)
RD_BODY(sb_rows8, 8, ROWS8)
RD_BODY(sb_rows12, 12, ROWS12)
RD_KERNEL(rd_sgemm_avx512_bf16w_12x32, sb_rows4, sb_rows8, sb_rows12)
#undef LOAD_B
#define LOAD_B(b, b0, b1)                                                   \
    const __m512i bw = _mm512_loadu_si512((const void *)(b));               \
    const V b0 = _mm512_cvtph_ps(_mm512_castsi512_si256(bw));               \
    const V b1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(bw, 1));
RD_BODY(sh_rows4, 4, ROWS4)
RD_BODY(sh_rows8, 8, ROWS8)
RD_BODY(sh_rows12, 12, ROWS12)
RD_KERNEL(rd_sgemm_avx512_f16w_12x32, sh_rows4, sh_rows8, sh_rows12)

/* float32 on quantized panels.  One-byte B rows (32 bytes a step)
 * widened exactly, as the AVX2 kernels do: int8 by vpmovsxbd + vcvtdq2ps,
 * float8_e4m3fn codes moved into binary16's places (AVX-512BW word
 * shifts), vcvtph2ps and a scaling by 2^8.  Then (w - z) * s with the
 * scales and zero points of the run the step is in (rd_kernel.h), and the
 * FMAs of the float32 kernel. */
#define RD_AVX512Q __attribute__((target("avx512f,avx512bw")))
#define RD_QBODY(NAME, R, ROWS) RD_QBODY_S(NAME, R, ROWS, 2 * W)
/* (SB: bytes of B a step, 32 one a byte, 16 for nibbles) */
#define RD_QBODY_S(NAME, R, ROWS, SB)                                       \
RD_AVX512Q static void                                                      \
NAME(rd_int kc, const T *a, const TB *b, T *c, rd_int rs_c, rd_int cs_c,    \
     int m, int n, int accumulate)                                          \
{                                                                           \
    const char *tr = (const char *)b + (SB) * kc;                           \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, tr, sizeof h);                                               \
    RD_BODY_ENTER(R, ROWS)                                                  \
    rd_int p = 0, len = h.first;                                            \
    for (rd_int r = 0; p < kc; r++, len = h.tile) {                         \
        const float *sv = (const float *)(const void *)(tr + RD_QRUN(r, 2 * W, h.zp)); \
        const V s0 = _mm512_loadu_ps(sv), s1 = _mm512_loadu_ps(sv + W);     \
        V z0 = ZERO(), z1 = ZERO();                                         \
        if (h.zp) {                                                         \
            z0 = _mm512_loadu_ps(sv + 2 * W);                               \
            z1 = _mm512_loadu_ps(sv + 3 * W);                               \
        }                                                                   \
        const rd_int end = kc - p < len ? kc : p + len;                     \
        for (; p < end; p++) {                                              \
            WIDEN(b, w0, w1)                                                \
            const V b0 = _mm512_mul_ps(_mm512_sub_ps(w0, z0), s0);          \
            const V b1 = _mm512_mul_ps(_mm512_sub_ps(w1, z1), s1);          \
            V av;                                                           \
            ROWS(RD_STEP)                                                   \
            a += 12;                                                        \
            b += (SB);                                                      \
        }                                                                   \
    }                                                                       \
    RD_BODY_LEAVE(R, ROWS)                                                  \
}

#undef TB
#define TB uint8_t
#define WIDEN(b, w0, w1)                                                    \
    const __m256i bq = _mm256_loadu_si256((const __m256i *)(const void *)(b)); \
    const V w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(bq))); \
    const V w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(bq, 1)));
RD_QBODY(si8_rows4, 4, ROWS4)
RD_QBODY(si8_rows8, 8, ROWS8)
RD_QBODY(si8_rows12, 12, ROWS12)
RD_KERNEL(rd_sgemm_avx512_i8w_12x32, si8_rows4, si8_rows8, si8_rows12)
#undef WIDEN
#define WIDEN(b, w0, w1)                                                    \
    const __m512i bh = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(b))); \
    const __m512i bits = _mm512_or_si512(                                   \
        _mm512_slli_epi16(_mm512_and_si512(bh, _mm512_set1_epi16(0x80)), 8), \
        _mm512_slli_epi16(_mm512_and_si512(bh, _mm512_set1_epi16(0x7f)), 7)); \
    const V w0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(bits)), _mm512_set1_ps(256.0f)); \
    const V w1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(bits, 1)), _mm512_set1_ps(256.0f));
RD_QBODY(sf8_rows4, 4, ROWS4)
RD_QBODY(sf8_rows8, 8, ROWS8)
RD_QBODY(sf8_rows12, 12, ROWS12)
RD_KERNEL(rd_sgemm_avx512_f8w_12x32, sf8_rows4, sf8_rows8, sf8_rows12)
#undef WIDEN
/* int4 codes (RD_CT_F32_I4W): a step's 16 bytes hold columns 0-15 in their
 * low nibbles and 16-31 in their high ones; vpermps looks each value up in
 * the 16 of int4 (it reads the low 4 bits of its index) */
#define WIDEN(b, w0, w1)                                                    \
    const __m512i bq = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b))); \
    const V i4 = _mm512_loadu_ps(rd_i4_values);                             \
    const V w0 = _mm512_permutexvar_ps(bq, i4);                             \
    const V w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(bq, 4), i4);
RD_QBODY_S(si4_rows4, 4, ROWS4, W)
RD_QBODY_S(si4_rows8, 8, ROWS8, W)
RD_QBODY_S(si4_rows12, 12, ROWS12, W)
RD_KERNEL(rd_sgemm_avx512_i4w_12x32, si4_rows4, si4_rows8, si4_rows12)
#undef WIDEN

/* float32 on 4-bit panels (RD_CT_F32_F4W): a step's 16 bytes hold columns
 * 0-15 in their low nibbles and 16-31 in their high ones, zero-extended to
 * 32-bit lanes; vpermps looks each code up in the 16 values of e2m1 (it
 * reads the low 4 bits of its index, so the high nibble needs one shift
 * and the low none), and the product with the column's power-of-two scale
 * is exact: then the FMAs of the float32 kernel. */
#define RD_F4BODY(NAME, R, ROWS)                                            \
RD_AVX512Q static void                                                      \
NAME(rd_int kc, const T *a, const TB *b, T *c, rd_int rs_c, rd_int cs_c,    \
     int m, int n, int accumulate)                                          \
{                                                                           \
    const char *tr = (const char *)b + W * kc;                              \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, tr, sizeof h);                                               \
    const V table = _mm512_loadu_ps(rd_e2m1_values);                        \
    RD_BODY_ENTER(R, ROWS)                                                  \
    rd_int p = 0, len = h.first;                                            \
    for (rd_int r = 0; p < kc; r++, len = h.tile) {                         \
        const uint8_t *e = (const uint8_t *)(tr + RD_F4RUN(r, 2 * W));      \
        const V s0 = rd_avx512_e8m0(e), s1 = rd_avx512_e8m0(e + W);         \
        const rd_int end = kc - p < len ? kc : p + len;                     \
        for (; p < end; p++) {                                              \
            const __m512i bq = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)b)); \
            const V b0 = _mm512_mul_ps(_mm512_permutexvar_ps(bq, table), s0); \
            const V b1 = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(bq, 4), table), s1); \
            V av;                                                           \
            ROWS(RD_STEP)                                                   \
            a += 12;                                                        \
            b += W;                                                         \
        }                                                                   \
    }                                                                       \
    RD_BODY_LEAVE(R, ROWS)                                                  \
}
RD_F4BODY(sf4_rows4, 4, ROWS4)
RD_F4BODY(sf4_rows8, 8, ROWS8)
RD_F4BODY(sf4_rows12, 12, ROWS12)
RD_KERNEL(rd_sgemm_avx512_f4w_12x32, sf4_rows4, sf4_rows8, sf4_rows12)
#undef TB
#undef LOAD_B
#undef T
#undef V
#undef W
#undef ZERO
#undef SET1
#undef FMA
#undef LOAD_A
#undef STORE_A
#undef STORE_ROW
#undef STREAM
#undef STORE_EDGE

/* ---------------------------------------------------------------- float64 */

RD_AVX512 static inline void
d_store_row(double *c, __m512d lo, __m512d hi, int accumulate)
{
    if (accumulate == RD_ADD) {
        lo = _mm512_add_pd(_mm512_loadu_pd(c), lo);
        hi = _mm512_add_pd(_mm512_loadu_pd(c + 8), hi);
    }
    _mm512_storeu_pd(c, lo);
    _mm512_storeu_pd(c + 8, hi);
}

#define T double
#define TB double
#define LOAD_B(b, b0, b1) const V b0 = _mm512_load_pd(b), b1 = _mm512_load_pd((b) + W);
#define V __m512d
#define W 8
#define ZERO _mm512_setzero_pd
#define SET1 _mm512_set1_pd
#define FMA _mm512_fmadd_pd
#define LOAD_A _mm512_load_pd
#define STORE_A _mm512_store_pd
#define STORE_ROW d_store_row
#define STREAM _mm512_stream_pd
#define STORE_EDGE rd_d_store_edge
RD_BODY(d_rows4, 4, ROWS4)
RD_BODY(d_rows8, 8, ROWS8)
RD_BODY(d_rows12, 12, ROWS12)
RD_KERNEL(rd_dgemm_avx512_12x16, d_rows4, d_rows8, d_rows12)
#undef TB
#undef LOAD_B
#undef T
#undef V
#undef W
#undef ZERO
#undef SET1
#undef FMA
#undef LOAD_A
#undef STORE_A
#undef STORE_ROW
#undef STREAM
#undef STORE_EDGE

/* ------------------------------------------------------ int8 x int8 -> int32
 *
 * Per pair of contraction steps: two loads of 16 int16 pairs of B, R
 * broadcasts of an A pair, 2R vpmaddwd (two int16 products summed into an
 * int32 lane: exact for int8-range values, no saturation) and 2R vpaddd.
 * The epilogue converts each int32 sum to float32 once and multiplies it by
 * sa[i] * sb[j] (rd_kernel.h). */
#define RD_AVX512BW __attribute__((target("avx512f,avx512bw")))

#define I_DECL(i) __m512i c##i##0 = _mm512_setzero_si512(), c##i##1 = _mm512_setzero_si512();
#define I_STEP(i)                                                           \
    {                                                                       \
        int32_t pair;                                                       \
        memcpy(&pair, a + 2 * (i), sizeof pair);                            \
        const __m512i av = _mm512_set1_epi32(pair);                         \
        c##i##0 = _mm512_add_epi32(c##i##0, _mm512_madd_epi16(av, b0));     \
        c##i##1 = _mm512_add_epi32(c##i##1, _mm512_madd_epi16(av, b1));     \
    }
#define I_SCALE(i)                                                          \
    const __m512 s##i = _mm512_set1_ps(sa[i]);                              \
    const __m512 f##i##0 = _mm512_mul_ps(_mm512_cvtepi32_ps(c##i##0), _mm512_mul_ps(s##i, sb0)); \
    const __m512 f##i##1 = _mm512_mul_ps(_mm512_cvtepi32_ps(c##i##1), _mm512_mul_ps(s##i, sb1));
#define I_PUT(i) s_store_row(c + (i) * rs_c, f##i##0, f##i##1, accumulate);
#define I_SPILL(i)                                                          \
    _mm512_store_ps(buf + (i) * 32, f##i##0);                               \
    _mm512_store_ps(buf + (i) * 32 + 16, f##i##1);

#define RD_IBODY(NAME, R, ROWS)                                             \
RD_AVX512BW static void                                                     \
NAME(rd_int kc, const int16_t *a, const int16_t *b, float *c, rd_int rs_c,  \
     rd_int cs_c, int m, int n, int accumulate)                             \
{                                                                           \
    const rd_int kp = (kc + 1) / 2 * 2;                                     \
    const float *sa = (const float *)(const void *)(a + 12 * kp);           \
    const float *sb = (const float *)(const void *)(b + 32 * kp);           \
    ROWS(I_DECL)                                                            \
    for (rd_int p = 0; p < kp; p += 2) {                                    \
        const __m512i b0 = _mm512_loadu_si512((const void *)b);             \
        const __m512i b1 = _mm512_loadu_si512((const void *)(b + 32));      \
        ROWS(I_STEP)                                                        \
        a += 24;                                                            \
        b += 64;                                                            \
    }                                                                       \
    const __m512 sb0 = _mm512_loadu_ps(sb), sb1 = _mm512_loadu_ps(sb + 16); \
    ROWS(I_SCALE)                                                           \
    if (m == (R) && n == 32 && cs_c == 1) {                                 \
        ROWS(I_PUT)                                                         \
        return;                                                             \
    }                                                                       \
    float buf[(R) * 32] __attribute__((aligned(64)));                       \
    ROWS(I_SPILL)                                                           \
    rd_s_store_edge(buf, 32, c, rs_c, cs_c, m, n, accumulate);              \
}
RD_IBODY(i_rows4, 4, ROWS4)
RD_IBODY(i_rows8, 8, ROWS8)
RD_IBODY(i_rows12, 12, ROWS12)

/* Dispatch on the number of valid rows (streaming stores are not used:
 * RD_STREAM is taken as RD_STORE). */
static void
rd_i8gemm_avx512_12x32(rd_int kc, const void *a_, const void *b_, void *c_, rd_int rs_c,
                       rd_int cs_c, int m, int n, int accumulate)
{
    const int16_t *a = (const int16_t *)a_, *b = (const int16_t *)b_;
    float *c = (float *)c_;
    if (accumulate == RD_STREAM)
        accumulate = RD_STORE;
    if (m > 8)
        i_rows12(kc, a, b, c, rs_c, cs_c, m, n, accumulate);
    else if (m > 4)
        i_rows8(kc, a, b, c, rs_c, cs_c, m, n, accumulate);
    else
        i_rows4(kc, a, b, c, rs_c, cs_c, m, n, accumulate);
}

/* ------------------------------------------------------------- streaming */

#undef V
#undef W
#undef ZERO
#undef SET1
#undef FMA
#define TARGET RD_AVX512
#define V __m512
#define W 16
#define MASK __mmask16
#define MASK_ALL ((__mmask16)0xFFFF)
#define MASK_FIRST(r) ((__mmask16)((1u << (r)) - 1u))
#define LOADM(k, p) _mm512_maskz_loadu_ps(k, p)
#define LOAD _mm512_load_ps
#define STORE _mm512_store_ps
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ZERO _mm512_setzero_ps
#define RD_SREGS 32
#include "rd_stream_body.h"
RD_STREAM_KERNEL(rd_sgemm_avx512_stream_8x2048, s_stream)

/* ---------------------------------------------------------------- family */

static int
rd_avx512_runnable(void)
{
    return rd_cpu()->avx512bw;
}

/* Blocking: twice the register block of the AVX2 kernels, the same MC
 * and NC; KC 512 (the tuner's timings on Zen4 put it 2-8% ahead of 256 on
 * every compute-bound float32 spec: dense, 16 and 64 rows a group), the
 * same for every float32-accumulating type, whose results equal float32's
 * bit for bit only with the same blocks of the contraction. */
const rd_family_t rd_family_avx512 = {
    "avx512",
    rd_avx512_runnable,
    {
        [RD_CT_F32] = {rd_sgemm_avx512_12x32, 12, 32, 144, 512, 4080, NULL},
        [RD_CT_F64] = {rd_dgemm_avx512_12x16, 12, 16, 72, 256, 4080, NULL},
        [RD_CT_F32_BF16W] = {rd_sgemm_avx512_bf16w_12x32, 12, 32, 144, 512, 4080, NULL},
        [RD_CT_F32_F16W] = {rd_sgemm_avx512_f16w_12x32, 12, 32, 144, 512, 4080, NULL},
        [RD_CT_I8I32] = {rd_i8gemm_avx512_12x32, 12, 32, 144, 512, 4080, NULL},
        [RD_CT_F32_I8W] = {rd_sgemm_avx512_i8w_12x32, 12, 32, 144, 512, 4080, NULL},
        [RD_CT_F32_F8W] = {rd_sgemm_avx512_f8w_12x32, 12, 32, 144, 512, 4080, NULL},
        [RD_CT_F32_F4W] = {rd_sgemm_avx512_f4w_12x32, 12, 32, 144, 512, 4080, NULL},
        [RD_CT_F32_I4W] = {rd_sgemm_avx512_i4w_12x32, 12, 32, 144, 512, 4080, NULL},
    },
    0,
    {[RD_CT_F32] = {rd_sgemm_avx512_stream_8x2048, RD_SMR, RD_SNR}},
    {
        [RD_CT_F32] = {rd_few_avx512_f32, 2, rd_sgemm_avx512_12x32, 0},
        [RD_CT_F32_BF16W] = {rd_few_avx512_bf16w, 2, rd_sgemm_avx512_bf16w_12x32, 0},
        [RD_CT_F32_F16W] = {rd_few_avx512_f16w, 2, rd_sgemm_avx512_f16w_12x32, 0},
        [RD_CT_F32_I8W] = {rd_few_avx512_i8w, 4, rd_sgemm_avx512_i8w_12x32, 0},
        [RD_CT_F32_F8W] = {rd_few_avx512_f8w, 4, rd_sgemm_avx512_f8w_12x32, 0},
        [RD_CT_F32_F4W] = {rd_few_avx512_f4w, 4, rd_sgemm_avx512_f4w_12x32, 0},
        [RD_CT_F32_I4W] = {rd_few_avx512_i4w, 4, rd_sgemm_avx512_i4w_12x32, 0},
    },
};

#endif /* RD_HAVE_X86_KERNELS */
