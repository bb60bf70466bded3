/*
 * AVX-512 VNNI kernels of the w4a8 types (RD_CT_U8S8_I4, RD_CT_U8S8_F4;
 * rd_kernel.h): 4-bit weights times int8 rows on vpdpbusd, for the family
 * "avx512-vnni" (kernels/rd_avx512_dot.c); their twin is in
 * kernels/rd_dot_twins.c.
 *
 * Decoding: a quad step of a 32-column panel is 64 bytes, byte t holding
 * the codes of columns t/4 (low nibble) and 16 + t/4 (high nibble) at step
 * t%4: one mask and one shift give the two vectors of codes, and one
 * vpshufb each (a 16-entry table in every 128-bit lane) turns them into
 * the k-quads of int8-dot's B, columns 0-15 and 16-31.  vpdpbusd takes
 * one operand unsigned: A is packed + 128 (as for int8-dot), so one side's
 * sums times 128 are taken back out of each run's int32 sums S before the
 * epilogue of RD_CT_U8S8 (the exact sum t of the products, whichever way).
 *
 *   rd_w4a8_avx512_i4 / _f4 (12 x 32): the micro-kernels, one body per row
 *       count 4, 8, 12, as the int8-dot kernel: A + 128 times B decoded
 *       signed, less 128 times B's column sums of the run (two vpdpbusd a
 *       step, shared by the 12 rows).
 *   rd_w4a8_few_avx512_i4 / _f4 (rd_fukr_t, 1-8 rows): several panels at
 *       once, so that the chains of dependent vpdpbusd overlap and each B
 *       vector is decoded once for all the rows (decoding, where the time
 *       is that of reading the weights): B decoded + 128 times A made
 *       signed again (a copy of the rows' quads, once a call, each
 *       step's quad of a row broadcast to a register), less 128
 *       times the rows' sums of the run, worked out once a call for every
 *       panel.
 */
#include "rd_kernel.h"

#ifdef RD_HAVE_X86_KERNELS

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "rd_avx512_body.h"
#include "rd_avx512_w4a8.h"

#define RD_W4_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))
/* (one attribute: clang takes the last of two target attributes, not both) */
#define RD_W4_TARGET_VL __attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl")))
#define RD_W4_INLINE inline __attribute__((always_inline))

/* the values of the codes (int4: (c ^ 8) - 8; float4_e2m1fn: 2 e2m1(c)),
 * as signed bytes [0], and + 128 as unsigned ones [1] */
static const uint8_t rd_w4_tables[2][2][16] = {
    {{0, 1, 2, 3, 4, 5, 6, 7, 248, 249, 250, 251, 252, 253, 254, 255},
     {128, 129, 130, 131, 132, 133, 134, 135, 120, 121, 122, 123, 124, 125, 126, 127}},
    {{0, 1, 2, 3, 4, 6, 8, 12, 0, 255, 254, 253, 252, 250, 248, 244},
     {128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116}},
};

RD_W4_TARGET static RD_W4_INLINE __m512i
rd_w4_table(int f4, int offset)
{
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)rd_w4_tables[f4][offset]));
}

/* One quad step of a panel, decoded by the table tab: columns 0-15 (b0)
 * and 16-31 (b1). */
RD_W4_TARGET static RD_W4_INLINE void
rd_w4_decode(const char *bq, __m512i tab, __m512i *b0, __m512i *b1)
{
    const __m512i low = _mm512_set1_epi8(0x0f);
    const __m512i v = _mm512_loadu_si512((const void *)bq);
    *b0 = _mm512_shuffle_epi8(tab, _mm512_and_si512(v, low));
    *b1 = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
}

/* The scales of run r of a panel's 32 columns (tr: its trailer): floats,
 * or 2^(e - 128) of the exponent bytes e (2^(e - 127), as rd_e8m0_to_float
 * makes it, halved: exact). */
RD_W4_TARGET static RD_W4_INLINE void
rd_w4_scales(int f4, const char *tr, rd_int r, __m512 *s0, __m512 *s1)
{
    if (!f4) {
        const char *sv = tr + RD_QRUN(r, 32, 0);
        *s0 = _mm512_loadu_ps(sv);
        *s1 = _mm512_loadu_ps(sv + 64);
        return;
    }
    const uint8_t *ev = (const uint8_t *)tr + RD_F4RUN(r, 32);
    *s0 = _mm512_mul_ps(rd_avx512_e8m0(ev), _mm512_set1_ps(0.5f));
    *s1 = _mm512_mul_ps(rd_avx512_e8m0(ev + 16), _mm512_set1_ps(0.5f));
}

/* RD_CT_U8S8's epilogue of a run's sums: (float)(S - 128 x) * (sa * sb),
 * x the sums the offset of one side added (B's column sums, or A's row
 * sum; x128 = 128 x), t = S - 128 x the exact sum of the products (modulo
 * 2^32); sa broadcast. */
RD_W4_TARGET static RD_W4_INLINE __m512
rd_w4_finish(__m512i s, __m512i x128, __m512 sa, __m512 sb)
{
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s, x128)), _mm512_mul_ps(sa, sb));
}

/* ------------------------------------------------------- micro-kernels
 *
 * A + 128 (unsigned, as int8-dot packs it) times B decoded signed; B's
 * column sums of the run (vpdpbusd of bytes 1 by B) take the 128 back. Each
 * run's result goes to C as the blocks cut at the scale tiles of the
 * one-byte layout go: stored (or added) for the first run, added after. */

#define W_DECL(i) __m512i c##i##0, c##i##1;
#define W_ZERO(i) c##i##0 = c##i##1 = _mm512_setzero_si512();
#define W_STEP(i)                                                           \
    {                                                                       \
        const __m512i av = _mm512_set1_epi32(a32[i]);                       \
        c##i##0 = rd_avx512_dpbusd(c##i##0, av, b0);                                \
        c##i##1 = rd_avx512_dpbusd(c##i##1, av, b1);                                \
    }
#define W_FINISH(i)                                                         \
    const __m512 f##i##0 = rd_w4_finish(c##i##0, cb0, _mm512_set1_ps(sa[i]), sb0); \
    const __m512 f##i##1 = rd_w4_finish(c##i##1, cb1, _mm512_set1_ps(sa[i]), sb1);
#define W_PUT(i) s_store_row(c + (i) * rs_c, f##i##0, f##i##1, put);
#define W_SPILL(i)                                                          \
    _mm512_store_ps(buf + (i) * 32, f##i##0);                               \
    _mm512_store_ps(buf + (i) * 32 + 16, f##i##1);

#define RD_W4_BODY(NAME, F4, R, ROWS)                                       \
RD_W4_TARGET static void                                                    \
NAME(rd_int kc, const void *a_, const void *b_, float *c, rd_int rs_c, rd_int cs_c, int m, int n, int mode) \
{                                                                           \
    const rd_int kq = (kc + 3) / 4 * 4;                                     \
    const int32_t *a32 = (const int32_t *)a_;                               \
    const char *b = (const char *)b_, *tb = (const char *)b_ + 16 * kq;     \
    const float *sa = (const float *)(const void *)((const char *)a_ + 12 * kq + 48); \
    const __m512i tab = rd_w4_table(F4, 0), ones = _mm512_set1_epi8(1);     \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, tb, sizeof h);                                               \
    ROWS(W_DECL)                                                            \
    rd_int p = 0;                                                           \
    for (rd_int r = 0; p < kc; r++) {                                       \
        const rd_int end = rd_qrun_end(&h, r, kc);                     \
        __m512i cb0 = _mm512_setzero_si512(), cb1 = _mm512_setzero_si512(); \
        ROWS(W_ZERO)                                                        \
        for (; p < end; p += 4) {                                           \
            __m512i b0, b1;                                                 \
            rd_w4_decode(b, tab, &b0, &b1);                                 \
            cb0 = rd_avx512_dpbusd(cb0, ones, b0);                                  \
            cb1 = rd_avx512_dpbusd(cb1, ones, b1);                                  \
            ROWS(W_STEP)                                                    \
            a32 += 12;                                                      \
            b += 64;                                                        \
        }                                                                   \
        __m512 sb0, sb1;                                                    \
        rd_w4_scales(F4, tb, r, &sb0, &sb1);                                \
        cb0 = _mm512_slli_epi32(cb0, 7);                                    \
        cb1 = _mm512_slli_epi32(cb1, 7);                                    \
        const int put = r == 0 ? mode : RD_ADD;                             \
        ROWS(W_FINISH)                                                      \
        if (m == (R) && n == 32 && cs_c == 1) {                             \
            ROWS(W_PUT)                                                     \
            continue;                                                       \
        }                                                                   \
        float buf[(R) * 32] __attribute__((aligned(64)));                   \
        ROWS(W_SPILL)                                                       \
        rd_s_store_edge(buf, 32, c, rs_c, cs_c, m, n, put == RD_ADD ? RD_ADD : RD_STORE); \
    }                                                                       \
}

RD_W4_BODY(w4_i4_rows4, 0, 4, ROWS4)
RD_W4_BODY(w4_i4_rows8, 0, 8, ROWS8)
RD_W4_BODY(w4_i4_rows12, 0, 12, ROWS12)
RD_W4_BODY(w4_f4_rows4, 1, 4, ROWS4)
RD_W4_BODY(w4_f4_rows8, 1, 8, ROWS8)
RD_W4_BODY(w4_f4_rows12, 1, 12, ROWS12)

#define RD_W4_KERNEL(NAME, PRE)                                             \
void                                                                        \
NAME(rd_int kc, const void *a, const void *b, void *c, rd_int rs_c, rd_int cs_c, int m, int n, int mode) \
{                                                                           \
    if (m > 8)                                                              \
        PRE##_rows12(kc, a, b, (float *)c, rs_c, cs_c, m, n, mode);         \
    else if (m > 4)                                                         \
        PRE##_rows8(kc, a, b, (float *)c, rs_c, cs_c, m, n, mode);          \
    else                                                                    \
        PRE##_rows4(kc, a, b, (float *)c, rs_c, cs_c, m, n, mode);          \
}

RD_W4_KERNEL(rd_w4a8_avx512_i4, w4_i4)
RD_W4_KERNEL(rd_w4a8_avx512_f4, w4_f4)

/* ------------------------------------------------------ few-row kernels
 *
 * B decoded + 128 (unsigned) times A's bytes made signed again (xor 128):
 * the products' sum exceeds the exact one by 128 times the row's sum over
 * the run, which the call works out once for every panel (no instruction a
 * step for it, where the micro-kernels' column sums cost two a step for
 * each panel), and each run's sums start from minus that (wrapping, exact
 * at the end): the same int32 t, so the micro-kernel's results. */

/* 16 columns of a row of C (cols of them valid; 0 past them). */
RD_W4_TARGET static RD_W4_INLINE __m512
rd_w4_get16(const float *c, rd_int cs_c, rd_int cols)
{
    if (cols <= 0)
        return _mm512_setzero_ps();
    if (cs_c == 1)
        return _mm512_maskz_loadu_ps(cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1u), c);
    float t[16] __attribute__((aligned(64))) = {0};
    for (rd_int j = 0; j < cols && j < 16; j++)
        t[j] = c[j * cs_c];
    return _mm512_load_ps(t);
}

/* How far ahead of its decoding a three- or four-row body asks for its
 * panels' bytes. Those bodies decode and multiply their panels more
 * slowly than memory streams them (Zen4 2 threads, 64 experts x [2048, 768]
 * at 4 rows: MXFP4 3.44-3.52 -> 2.91-3.08 ms, int4 3.29-3.35 -> 2.94-3.14 ms
 * at 2048 bytes ahead); one and two rows stream four panels at once, at the
 * memory's rate already (there it cost up to 20% at one row). */
#define RD_W4_AHEAD 2048

/* The runs a call's row sums are worked out for at once (a longer block
 * is taken in parts of whole runs, C stored and read back between them:
 * the same operations in the same order). */
#define RD_W4_RUNS 128

/* What the bodies read of A: its rows' quads made signed again (af,
 * RD_W4_FEW_ROWS a step), the rows' scales, and for runs r0.. of the part
 * of the block [p0, p1), 128 times each row's sum of its values over the
 * run, ra[(r - r0) * RD_W4_FEW_ROWS + i] (wrapping, as the instruction's
 * sums do). */
typedef struct {
    const int32_t *af;
    const float *sa;
    const uint32_t *ra;
    rd_int r0, p0, p1;
} rd_w4_rows_t;

/* R rows x P panels (constants: the loops unroll, the sums stay in
 * registers) over the part [p0, p1) of the block, each element as the
 * micro-kernel sums and finishes it: C added first for RD_ADD (mode, which
 * is RD_ADD for every part but the block's first), the results stored. */
RD_W4_TARGET static RD_W4_INLINE void
rd_w4_few_body(const int F4, const int R, const int P, rd_int kc, const rd_w4_rows_t *A, const char *b,
               size_t bstep, float *c, rd_int rs_c, rd_int cs_c, rd_int n, int mode)
{
    const rd_int kq = (kc + 3) / 4 * 4;
    const __m512i tab = rd_w4_table(F4, 1);
    rd_qtrailer_t h;
    memcpy(&h, b + 16 * kq, sizeof h);
    __m512 out[RD_W4_FEW_ROWS][4][2], sav[RD_W4_FEW_ROWS];
    for (int i = 0; i < R; i++)
        sav[i] = _mm512_set1_ps(A->sa[i]);
    /* C first for RD_ADD, else -0: the identity of the additions (-0 + x
     * is x, -0 and NaNs included), so that every run adds the same way */
    for (int q = 0; q < P; q++)
        for (int i = 0; i < R; i++) {
            const float *cq = c + i * rs_c + q * 32 * cs_c;
            out[i][q][0] = mode == RD_ADD ? rd_w4_get16(cq, cs_c, n - q * 32) : _mm512_set1_ps(-0.0f);
            out[i][q][1] = mode == RD_ADD ? rd_w4_get16(cq + 16 * cs_c, cs_c, n - q * 32 - 16)
                                          : _mm512_set1_ps(-0.0f);
        }
    const uint32_t *ra = A->ra;
    rd_int p = A->p0;
    for (rd_int r = A->r0; p < A->p1; r++, ra += RD_W4_FEW_ROWS) {
        const rd_int end = rd_qrun_end(&h, r, kc);
        __m512i acc[RD_W4_FEW_ROWS][4][2];
        for (int q = 0; q < P; q++)
            for (int i = 0; i < R; i++)
                acc[i][q][0] = acc[i][q][1] = _mm512_set1_epi32((int32_t)(0u - ra[i]));
        for (; p < end; p += 4) {
            const int32_t *as = A->af + (size_t)p / 4 * RD_W4_FEW_ROWS;
            __m512i av[RD_W4_FEW_ROWS];
            for (int i = 0; i < R; i++)
                av[i] = _mm512_set1_epi32(as[i]);
            for (int q = 0; q < P; q++) {
                __m512i b0, b1;
                if (R >= 3)   /* the panels' streams, read slowly: asked for ahead */
                    _mm_prefetch(b + q * bstep + p * 16 + RD_W4_AHEAD, _MM_HINT_T0);
                rd_w4_decode(b + q * bstep + p * 16, tab, &b0, &b1);
                for (int i = 0; i < R; i++) {
                    acc[i][q][0] = rd_avx512_dpbusd(acc[i][q][0], b0, av[i]);
                    acc[i][q][1] = rd_avx512_dpbusd(acc[i][q][1], b1, av[i]);
                }
            }
        }
        /* the run's results, added in order to the C tile held in
         * registers: each element the sums of the micro-kernel, which adds
         * each run into C */
        for (int q = 0; q < P; q++) {
            __m512 sb0, sb1;
            rd_w4_scales(F4, b + q * bstep + 16 * kq, r, &sb0, &sb1);
            for (int i = 0; i < R; i++) {
                const __m512 s0 = _mm512_mul_ps(sav[i], sb0), s1 = _mm512_mul_ps(sav[i], sb1);
                out[i][q][0] = _mm512_add_ps(out[i][q][0], _mm512_mul_ps(_mm512_cvtepi32_ps(acc[i][q][0]), s0));
                out[i][q][1] = _mm512_add_ps(out[i][q][1], _mm512_mul_ps(_mm512_cvtepi32_ps(acc[i][q][1]), s1));
            }
        }
    }
    for (int q = 0; q < P; q++)
        for (int i = 0; i < R; i++) {
            float *cq = c + i * rs_c + q * 32 * cs_c;
            rd_avx512_put16(out[i][q][0], cq, cs_c, n - q * 32, RD_STORE);
            rd_avx512_put16(out[i][q][1], cq + 16 * cs_c, cs_c, n - q * 32 - 16, RD_STORE);
        }
}

/* One (F4, R, P) body as a function of its own, so that each is register
 * allocated alone (inlined into one dispatcher, gcc spilled the sums). */
#define RD_W4_VARIANT(F4, R, P)                                             \
RD_W4_TARGET __attribute__((noinline)) static void                          \
rd_w4_few_##F4##_##R##_##P(rd_int kc, const rd_w4_rows_t *A, const char *b, size_t bstep, float *c, \
                           rd_int rs_c, rd_int cs_c, rd_int n, int mode)    \
{                                                                           \
    rd_w4_few_body(F4, R, P, kc, A, b, bstep, c, rs_c, cs_c, n, mode);      \
}
#define RD_W4_VARIANTS(F4)                                                  \
    RD_W4_VARIANT(F4, 1, 4) RD_W4_VARIANT(F4, 1, 2) RD_W4_VARIANT(F4, 1, 1) \
    RD_W4_VARIANT(F4, 2, 4) RD_W4_VARIANT(F4, 2, 2) RD_W4_VARIANT(F4, 2, 1) \
    RD_W4_VARIANT(F4, 3, 2) RD_W4_VARIANT(F4, 3, 1) RD_W4_VARIANT(F4, 4, 2) RD_W4_VARIANT(F4, 4, 1) \
    RD_W4_VARIANT(F4, 5, 1) RD_W4_VARIANT(F4, 6, 1) RD_W4_VARIANT(F4, 7, 1) RD_W4_VARIANT(F4, 8, 1)
RD_W4_VARIANTS(0)
RD_W4_VARIANTS(1)

/* A's row sums of runs [r0, r1) (rd_w4_rows_t's ra), times 128: the
 * signed bytes each step of the body multiplies (af, padding included;
 * the rows past m are 0), a step's rows' quads summed by one vpdpbusd
 * with bytes 1. */
RD_W4_TARGET_VL static void
rd_w4_row_sums(const int32_t *af, const rd_qtrailer_t *h, rd_int kc, rd_int r0, rd_int r1, uint32_t *ra)
{
    const __m256i ones = _mm256_set1_epi8(1);
    for (rd_int r = r0; r < r1; r++) {
        const rd_int p1 = rd_qrun_end(h, r, kc);
        __m256i sum = _mm256_setzero_si256();
        for (rd_int p = rd_qrun_start(h, r); p < p1; p += 4) {
            const int32_t *step = af + (size_t)p / 4 * RD_W4_FEW_ROWS;
            sum = _mm256_dpbusd_epi32(sum, ones, _mm256_load_si256((const __m256i *)(const void *)step));
        }
        _mm256_storeu_si256((__m256i *)(void *)(ra + (r - r0) * RD_W4_FEW_ROWS), _mm256_slli_epi32(sum, 7));
    }
}

/* The first m rows' quads of the packed A (a32: 12 a step, + 128) made
 * signed again (each byte xor 128), RD_W4_FEW_ROWS a step, once a call
 * for all its panels (kq / 4 steps; kq <= RD_W4_KMAX, the descriptor's
 * kmax; rows past m 0). */
RD_W4_TARGET_VL static void
rd_w4_flip(const int32_t *a32, rd_int kq, int m, int32_t *af)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    const __mmask8 rows = (__mmask8)((1u << m) - 1u);
    for (rd_int s = 0; s < kq / 4; s++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(a32 + s * 12));
        _mm256_store_si256((__m256i *)(void *)(af + s * RD_W4_FEW_ROWS), _mm256_maskz_xor_epi32(rows, q, flip));
    }
}

/* Panels q on of the call in runs of P. */
#define RD_W4_RUN(F4, R, P)                                                 \
    for (; q + (P) <= np; q += (P))                                         \
        rd_w4_few_##F4##_##R##_##P(kc, &A, b + q * bstep, bstep, c + q * 32 * cs_c, rs_c, cs_c, n - q * 32, put);

/* One and two rows in runs of 4, 2, 1 panels (8 or 16 chains of sums:
 * enough to cover vpdpbusd's latency; two rows at 4 panels measured 5%
 * faster than at 2, its inner loop still without spills), three and four
 * in runs of 2, 1 (the 16 sums of four rows and two panels fill half the
 * registers, the C tile kept on the stack between runs: two streams in
 * flight measured 10-12% faster than one on Zen4, 64 experts x [2048, 768]
 * at 4 rows, 19.0 -> 16.8 cycles a 64-byte step at one thread, 18.2 ->
 * 16.4 at two), five to eight one panel at a time. */
#define RD_W4_FEW(NAME, F4)                                                 \
void                                                                        \
NAME(rd_int kc, const void *a_, const void *b_, size_t bstep, void *c_, rd_int rs_c, rd_int cs_c, int m, \
     rd_int n, int mode)                                                    \
{                                                                           \
    const char *b = (const char *)b_;                                       \
    float *c = (float *)c_;                                                 \
    const rd_int kq = (kc + 3) / 4 * 4, np = (n + 31) / 32;                 \
    rd_qtrailer_t h;                                                        \
    memcpy(&h, b + 16 * kq, sizeof h);                                      \
    const rd_int runs = rd_qruns(h.first, h.tile, kc);                      \
    uint32_t ra[RD_W4_RUNS * RD_W4_FEW_ROWS];                               \
    int32_t af[RD_W4_KMAX / 4 * RD_W4_FEW_ROWS] __attribute__((aligned(64))); \
    rd_w4_flip((const int32_t *)a_, kq, m, af);                            \
    rd_w4_rows_t A = {af, (const float *)(const void *)((const char *)a_ + 12 * kq + 48), ra, 0, 0, 0}; \
    for (rd_int r1; A.r0 < runs; A.r0 = r1, A.p0 = A.p1) {                  \
        r1 = runs - A.r0 < RD_W4_RUNS ? runs : A.r0 + RD_W4_RUNS;           \
        A.p1 = rd_qrun_end(&h, r1 - 1, kc);                                 \
        rd_w4_row_sums(af, &h, kc, A.r0, r1, ra);                           \
        const int put = A.r0 == 0 ? mode : RD_ADD;                          \
        rd_int q = 0;                                                       \
        if (m == 1) {                                                       \
            RD_W4_RUN(F4, 1, 4) RD_W4_RUN(F4, 1, 2) RD_W4_RUN(F4, 1, 1)     \
        } else if (m == 2) {                                                \
            RD_W4_RUN(F4, 2, 4) RD_W4_RUN(F4, 2, 2) RD_W4_RUN(F4, 2, 1)     \
        } else if (m == 3) {                                                \
            RD_W4_RUN(F4, 3, 2) RD_W4_RUN(F4, 3, 1)                         \
        } else if (m == 4) {                                                \
            RD_W4_RUN(F4, 4, 2) RD_W4_RUN(F4, 4, 1)                         \
        } else if (m == 5) {                                                \
            RD_W4_RUN(F4, 5, 1)                                             \
        } else if (m == 6) {                                                \
            RD_W4_RUN(F4, 6, 1)                                             \
        } else if (m == 7) {                                                \
            RD_W4_RUN(F4, 7, 1)                                             \
        } else {                                                            \
            RD_W4_RUN(F4, 8, 1)                                             \
        }                                                                   \
    }                                                                       \
}

RD_W4_FEW(rd_w4a8_few_avx512_i4, 0)
RD_W4_FEW(rd_w4a8_few_avx512_f4, 1)

#endif /* RD_HAVE_X86_KERNELS */
