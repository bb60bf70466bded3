/*
 * Packing for the dot-product compute types (rd_kernel.h): bfloat16
 * k-pairs (RD_CT_BF16DP), int8 k-quads with their row and column sums
 * (RD_CT_U8S8), the A operands of the tile types, and the register
 * transpose of 4-byte values that these and the float32 packing use for
 * rows contiguous along the contraction (float rows quantized to int8
 * while packed: frame/rd_pack_q8.c).  frame/rd_pack.c binds them in its
 * tables.
 */
#include "rd_pack_int.h"
#include "rd_half.h"

/* Keep gcc from turning the short fixed-width copies into calls to memmove. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

/*
 * Eight rows of 4-byte values transposed into a panel: dst[p*ld + i] =
 * row i's value p (rows rs_bytes apart), eight steps at a time by the
 * unpack / shuffle / lane-swap transpose of an 8 x 8 block in AVX2
 * registers (bit moves only), where the CPU has AVX2; one value at a time
 * otherwise.  Packing a transposed operand (transformers' [E, out, in]
 * weights read as B, bfloat16 k-pairs of a row-major A) is a transpose.
 */
static void
rd_words8_scalar(const char *src, rd_int rs_bytes, rd_int p0, rd_int depth, uint32_t *dst, int ld)
{
    for (rd_int p = p0; p < depth; p++)
        for (int i = 0; i < 8; i++)
            memcpy(dst + p * ld + i, src + i * rs_bytes + 4 * p, 4);
}

#ifdef RD_HAVE_X86_KERNELS
#include <immintrin.h>
__attribute__((target("avx2"))) static void
rd_words8_avx2(const char *src, rd_int rs_bytes, rd_int depth, uint32_t *dst, int ld)
{
    rd_int p = 0;
    for (; p + 8 <= depth; p += 8) {
        const char *s = src + 4 * p;
        const __m256 r0 = _mm256_loadu_ps((const float *)(const void *)s);
        const __m256 r1 = _mm256_loadu_ps((const float *)(const void *)(s + rs_bytes));
        const __m256 r2 = _mm256_loadu_ps((const float *)(const void *)(s + 2 * rs_bytes));
        const __m256 r3 = _mm256_loadu_ps((const float *)(const void *)(s + 3 * rs_bytes));
        const __m256 r4 = _mm256_loadu_ps((const float *)(const void *)(s + 4 * rs_bytes));
        const __m256 r5 = _mm256_loadu_ps((const float *)(const void *)(s + 5 * rs_bytes));
        const __m256 r6 = _mm256_loadu_ps((const float *)(const void *)(s + 6 * rs_bytes));
        const __m256 r7 = _mm256_loadu_ps((const float *)(const void *)(s + 7 * rs_bytes));
        const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
        const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
        const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
        const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
        /* columns j and j + 4 of rows 0-3 (s0-s3) and of rows 4-7 (s4-s7) */
        const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
        const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
        const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
        const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
        float *d = (float *)(void *)(dst + p * ld);
        _mm256_storeu_ps(d, _mm256_permute2f128_ps(s0, s4, 0x20));
        _mm256_storeu_ps(d + ld, _mm256_permute2f128_ps(s1, s5, 0x20));
        _mm256_storeu_ps(d + 2 * ld, _mm256_permute2f128_ps(s2, s6, 0x20));
        _mm256_storeu_ps(d + 3 * ld, _mm256_permute2f128_ps(s3, s7, 0x20));
        _mm256_storeu_ps(d + 4 * ld, _mm256_permute2f128_ps(s0, s4, 0x31));
        _mm256_storeu_ps(d + 5 * ld, _mm256_permute2f128_ps(s1, s5, 0x31));
        _mm256_storeu_ps(d + 6 * ld, _mm256_permute2f128_ps(s2, s6, 0x31));
        _mm256_storeu_ps(d + 7 * ld, _mm256_permute2f128_ps(s3, s7, 0x31));
    }
    rd_words8_scalar(src, rs_bytes, p, depth, dst, ld);
}
#endif

void
rd_pack_words8(const char *src, rd_int rs_bytes, rd_int depth, char *dst, int ld)
{
#ifdef RD_HAVE_X86_KERNELS
    if (rd_cpu()->avx2) {
        rd_words8_avx2(src, rs_bytes, depth, (uint32_t *)(void *)dst, ld);
        return;
    }
#endif
    rd_words8_scalar(src, rs_bytes, 0, depth, (uint32_t *)(void *)dst, ld);
}

/* bfloat16 k-pairs (RD_CT_BF16DP): bfloat16 operands as they are, float32
 * ones rounded to nearest even */
#ifdef RD_HAVE_X86_KERNELS
#include <immintrin.h>
/* One pair step of 32 bfloat16 rows: d[2i] = x0[i], d[2i+1] = x1[i] (0 when
 * x1 is NULL), two vpermt2w; the dot-product kernels that read these
 * panels need AVX-512BW, so every CPU that packs them has it. */
__attribute__((target("avx512f,avx512bw"))) static void
rd_pairs32_avx512(uint16_t *d, const uint16_t *x0, const uint16_t *x1)
{
    static const uint16_t lo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i a = _mm512_loadu_si512((const void *)x0);
    const __m512i b = x1 != NULL ? _mm512_loadu_si512((const void *)x1) : _mm512_setzero_si512();
    const __m512i ilo = _mm512_loadu_si512((const void *)lo);
    const __m512i ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
    _mm512_storeu_si512((void *)d, _mm512_permutex2var_epi16(a, ilo, b));
    _mm512_storeu_si512((void *)(d + 32), _mm512_permutex2var_epi16(a, ihi, b));
}

static int
rd_pairs32_ok(void)
{
    return rd_cpu()->avx512bw;
}
#define RD_PAIRS32 rd_pairs32_avx512
#define RD_PAIRS32_OK rd_pairs32_ok
#endif
#define RD_SRC uint16_t
#define RD_CVT(v) (v)
#define RD_FN(x) rd_pack_b_p_##x
#define RD_PAIR_WORDS8 rd_pack_words8
#include "rd_pack_pairs.h"

#define RD_SRC float
#define RD_CVT(v) rd_float_to_bf16(v)
#define RD_FN(x) rd_pack_r_p_##x
#include "rd_pack_pairs.h"

/*
 * int8 values for the int8 dot products (RD_CT_U8S8): k-quads,
 * X[i][p] at panel[(p/4)*4r + 4i + p%4] as a byte, plus `shift` (128 for
 * A, whose bytes the instruction reads unsigned; 0 for B), depth padded to
 * a multiple of 4 with bytes 0 (as stored, A's too), so that every padding
 * product is 0 whatever a kernel adds to either side;
 * after the r*kq bytes of each panel, r int32 sums of the row's values over
 * the block, r float scales and r int32 zero points of the row's tile (the
 * block lies within one tile along the depth: the driver cuts its blocks
 * there).  Padding rows get 0 values, sums, scales and zero points.
 */
/* One panel's trailer: the sums, scales and zero points of its `have`
 * rows (scales and zero points of the block's tile t), zeros past them
 * (rd_pack_int.h). */
void
rd_quads_trailer(uint8_t *panel, rd_int kq, int r, rd_int have, rd_int row0, const int32_t *sums,
                 const rd_qblock_t *qb)
{
    const float *scale = (const float *)qb->s, *zero = (const float *)qb->z;
    const rd_int t = qb->p0 / qb->tp;          /* the block's tile along the depth */
    char *tr = (char *)panel + (rd_int)r * kq;
    int32_t *sum = (int32_t *)(void *)tr;
    float *sc = (float *)(void *)(tr + 4 * (rd_int)r);
    int32_t *zp = (int32_t *)(void *)(tr + 8 * (rd_int)r);
    for (rd_int i = 0; i < r; i++) {
        const rd_int at = (qb->i0 + row0 + i) / qb->tr * qb->rs + t * qb->ps;
        sum[i] = i < have ? sums[i] : 0;
        sc[i] = i < have ? scale[at] : 0.0f;
        zp[i] = i < have && zero != NULL ? (int32_t)zero[at] : 0;
    }
}

#ifdef RD_HAVE_X86_KERNELS
#include <immintrin.h>

/* The whole k-quads (p < full) of a 32-row panel whose steps lie
 * contiguous across the rows (rows 1 apart, steps cs apart: a row-major
 * B), as rd_pack_i8_quads writes them: four steps' 32 bytes interleaved
 * into 32 words by byte and word unpacks (the instruction's lanes put
 * right by the 128-bit permutes), their sums over the signed bytes added
 * to sums[32], then xor flip.  Returns the words written. */
__attribute__((target("avx2"))) static rd_int
rd_quads32_avx2(rd_int full, const int8_t *src, rd_int cs, uint32_t *d, int32_t *sums, uint32_t flip)
{
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const __m256i fl = _mm256_set1_epi32((int32_t)flip);
    __m256i s[4];
    for (int j = 0; j < 4; j++)
        s[j] = _mm256_loadu_si256((const __m256i *)(const void *)(sums + 8 * j));
    for (rd_int p = 0; p < full; p += 4) {
        const int8_t *x = src + p * cs;
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)x);
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(x + cs));
        const __m256i x2 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 2 * cs));
        const __m256i x3 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 3 * cs));
        const __m256i t0 = _mm256_unpacklo_epi8(x0, x1), t1 = _mm256_unpackhi_epi8(x0, x1);
        const __m256i t2 = _mm256_unpacklo_epi8(x2, x3), t3 = _mm256_unpackhi_epi8(x2, x3);
        const __m256i q0 = _mm256_unpacklo_epi16(t0, t2), q1 = _mm256_unpackhi_epi16(t0, t2);
        const __m256i q2 = _mm256_unpacklo_epi16(t1, t3), q3 = _mm256_unpackhi_epi16(t1, t3);
        /* rows 0-7, 8-15, 16-23, 24-31 */
        const __m256i w[4] = {_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q2, q3, 0x20),
                              _mm256_permute2x128_si256(q0, q1, 0x31), _mm256_permute2x128_si256(q2, q3, 0x31)};
        for (int j = 0; j < 4; j++) {
            /* a word's four signed bytes summed: pairs (unsigned ones x signed), then the two pairs */
            s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, w[j]), ones16));
            _mm256_storeu_si256((__m256i *)(void *)(d + 8 * j), _mm256_xor_si256(w[j], fl));
        }
        d += 32;
    }
    for (int j = 0; j < 4; j++)
        _mm256_storeu_si256((__m256i *)(void *)(sums + 8 * j), s[j]);
    return full / 4 * 32;
}

/* The first `len` bytes (a multiple of 16: whole k-quads) of four rows of
 * a panel whose steps are contiguous along each row (a row-major A): the
 * rows' words transposed four quads at a time into the panel's word
 * columns i .. i + 3 (r words a quad), their signed bytes summed into
 * sums[0 .. 3], then xor flip. */
__attribute__((target("avx2"))) static void
rd_quads4rows_avx2(rd_int len, const int8_t *x, rd_int rs, int r, uint32_t *d, int32_t *sums, uint32_t flip)
{
    const __m128i ones8 = _mm_set1_epi8(1), ones16 = _mm_set1_epi16(1), fl = _mm_set1_epi32((int32_t)flip);
    __m128i s[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
    for (rd_int p = 0; p < len; p += 16) {
        __m128i v[4];
        for (int j = 0; j < 4; j++) {
            v[j] = _mm_loadu_si128((const __m128i *)(const void *)(x + j * rs + p));
            s[j] = _mm_add_epi32(s[j], _mm_madd_epi16(_mm_maddubs_epi16(ones8, v[j]), ones16));
        }
        const __m128i t0 = _mm_unpacklo_epi32(v[0], v[1]), t1 = _mm_unpackhi_epi32(v[0], v[1]);
        const __m128i t2 = _mm_unpacklo_epi32(v[2], v[3]), t3 = _mm_unpackhi_epi32(v[2], v[3]);
        const __m128i o[4] = {_mm_unpacklo_epi64(t0, t2), _mm_unpackhi_epi64(t0, t2), _mm_unpacklo_epi64(t1, t3),
                              _mm_unpackhi_epi64(t1, t3)};
        uint32_t *dq = d + p / 4 * r;
        for (int q = 0; q < 4; q++)
            _mm_storeu_si128((__m128i *)(void *)(dq + q * r), _mm_xor_si128(o[q], fl));
    }
    for (int j = 0; j < 4; j++) {
        int32_t lanes[4];
        _mm_storeu_si128((__m128i *)(void *)lanes, s[j]);
        sums[j] = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    }
}
#endif

RD_PACK_CLONES static void
rd_pack_i8_quads(rd_int rows, rd_int depth, const int8_t *src, rd_int rs, rd_int cs,
                 int r, uint8_t *dst, const rd_qblock_t *qb, uint8_t shift)
{
    const rd_int kq = (depth + 3) / 4 * 4, full = depth / 4 * 4;
    const rd_int panel = (rd_int)r * kq + 12 * (rd_int)r;   /* values, then the trailer */
    const uint32_t flip = shift ? 0x80808080u : 0u;
    int32_t sums[128];   /* r <= 128: every register block here is far smaller */
    rd_int i0 = 0;
    if (rs == 1) {
        /* the values of one step lie contiguous across the rows (a
         * row-major B, a transposed A): four steps at a time, read in
         * memory order, each row's four bytes joined into one word */
        for (; i0 + r <= rows; i0 += r) {
            uint32_t *d = (uint32_t *)(void *)dst;
            for (int i = 0; i < r; i++)
                sums[i] = 0;
            rd_int p0 = 0;
#ifdef RD_HAVE_X86_KERNELS
            if (r == 32 && full > 0 && rd_cpu()->avx2) {
                d += rd_quads32_avx2(full, src + i0, cs, d, sums, flip);
                p0 = full;
            }
#endif
            for (rd_int p = p0; p < kq; p += 4) {
                const int8_t *x0 = src + i0 + p * cs;
                const int8_t *x1 = p + 1 < depth ? x0 + cs : NULL, *x2 = p + 2 < depth ? x0 + 2 * cs : NULL;
                const int8_t *x3 = p + 3 < depth ? x0 + 3 * cs : NULL;
                if (p + 3 < depth)
                    for (int i = 0; i < r; i++) {
                        const int32_t a = x0[i], b = x1[i], c = x2[i], e = x3[i];
                        sums[i] += a + b + c + e;
                        d[i] = ((uint32_t)(uint8_t)a | (uint32_t)(uint8_t)b << 8 | (uint32_t)(uint8_t)c << 16
                                | (uint32_t)(uint8_t)e << 24) ^ flip;
                    }
                else   /* the last, partial quad: padding bytes 0 (as stored, in A too) */
                    for (int i = 0; i < r; i++) {
                        const int32_t a = x0[i], b = x1 ? x1[i] : 0, c = x2 ? x2[i] : 0;
                        sums[i] += a + b + c;
                        d[i] = ((uint32_t)(uint8_t)a | (uint32_t)(uint8_t)b << 8 | (uint32_t)(uint8_t)c << 16)
                               ^ (flip & ((1u << (8 * (depth - p))) - 1u));
                    }
                d += r;
            }
            rd_quads_trailer(dst, kq, r, r, i0, sums, qb);
            dst += panel;
        }
    }
    for (; i0 < rows; i0 += r) {
        const rd_int have = rows - i0 < r ? rows - i0 : r;
        uint32_t *d = (uint32_t *)(void *)dst;
        /* rows four at a time, the whole 16-byte stretches of their steps
         * (a row-major A), the rest of each row below */
        rd_int vec = 0, vrows = 0;
#ifdef RD_HAVE_X86_KERNELS
        if (cs == 1 && full >= 16 && rd_cpu()->avx2) {
            vec = full / 16 * 16;
            vrows = have / 4 * 4;
            for (rd_int i = 0; i < vrows; i += 4)
                rd_quads4rows_avx2(vec, src + (i0 + i) * rs, rs, r, d + i, sums + i, flip);
        }
#endif
        for (rd_int i = 0; i < have; i++) {
            const int8_t *x = src + (i0 + i) * rs;
            int32_t acc = i < vrows ? sums[i] : 0;
            rd_int p = i < vrows ? vec : 0;
            if (cs == 1)   /* a row's steps contiguous (a row-major A): a word a quad */
                for (; p < full; p += 4) {
                    uint32_t w;
                    memcpy(&w, x + p, 4);
                    acc += x[p] + x[p + 1] + x[p + 2] + x[p + 3];
                    d[p / 4 * r + i] = w ^ flip;
                }
            for (; p < kq; p += 4) {
                uint32_t w = 0;
                for (rd_int t = 0; t < 4 && p + t < depth; t++) {
                    const int8_t v = x[(p + t) * cs];
                    acc += v;
                    w |= (uint32_t)(uint8_t)v << (8 * t);
                }
                d[p / 4 * r + i] = p + 4 <= depth ? w ^ flip : w ^ (flip & ((1u << (8 * (depth - p))) - 1u));
            }
            sums[i] = acc;
        }
        for (rd_int i = have; i < r; i++)
            for (rd_int q = 0; q < kq / 4; q++)
                d[q * r + i] = 0;
        rd_quads_trailer(dst, kq, r, have, i0, sums, qb);
        dst += panel;
    }
}

void
rd_pack_i8_u8_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs,
                    int r, void *dst, const rd_qblock_t *qb)
{
    rd_pack_i8_quads(rows, depth, (const int8_t *)src, rs, cs, r, (uint8_t *)dst, qb, 128);
}

void
rd_pack_i8_s8_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs,
                    int r, void *dst, const rd_qblock_t *qb)
{
    rd_pack_i8_quads(rows, depth, (const int8_t *)src, rs, cs, r, (uint8_t *)dst, qb, 0);
}

/*
 * A operands of the tile types (RD_CT_BF16TILE, RD_CT_U8S8TILE): row after
 * row, as a tile loads them (16 rows, the row pitch as stride).  That is
 * the k-pair and k-quad layouts above with panels of one row: a row of kp
 * bfloat16 values (odd depth padded with 0), or of kq bytes A + 128
 * followed by the row's trailer (sum, scale, zero point); the rows past
 * `rows` up to a multiple of r are zero (values and trailers), as the
 * padding rows of a packed micro-panel are.
 */
static void
rd_tile_pad_rows(rd_int rows, int r, size_t row_bytes, void *dst)
{
    const rd_int padded = (rows + r - 1) / r * r;
    if (padded > rows)
        memset((char *)dst + (size_t)rows * row_bytes, 0, (size_t)(padded - rows) * row_bytes);
}

void
rd_pack_b_t_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst)
{
    const rd_int kp = (depth + 1) / 2 * 2;
    if (cs == 1) {   /* rows contiguous along the contraction: copied as they are */
        const uint16_t *x = (const uint16_t *)src;
        uint16_t *d = (uint16_t *)dst;
        for (rd_int i = 0; i < rows; i++) {
            memcpy(d + i * kp, x + i * rs, (size_t)depth * 2);
            if (kp > depth)
                d[i * kp + depth] = 0;
        }
    }
    else
        rd_pack_b_p_pack(rows, depth, src, rs, cs, 1, dst);
    rd_tile_pad_rows(rows, r, (size_t)kp * 2, dst);
}

void
rd_pack_r_t_pack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst)
{
    rd_pack_r_p_pack(rows, depth, src, rs, cs, 1, dst);
    rd_tile_pad_rows(rows, r, (size_t)((depth + 1) / 2 * 2) * 2, dst);
}

void
rd_pack_i8_ut_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                    const rd_qblock_t *qb)
{
    rd_pack_i8_quads(rows, depth, (const int8_t *)src, rs, cs, 1, (uint8_t *)dst, qb, 128);
    rd_tile_pad_rows(rows, r, (size_t)((depth + 3) / 4 * 4 + 12), dst);
}

void
rd_pack_s_qt_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                   const rd_qblock_t *qb)
{
    rd_pack_q8(rows, depth, src, 0, rs, cs, 1, dst, qb, 4);
    rd_tile_pad_rows(rows, r, (size_t)((depth + 3) / 4 * 4 + 12), dst);
}

void
rd_pack_b_qt_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                   const rd_qblock_t *qb)
{
    rd_pack_q8(rows, depth, src, 1, rs, cs, 1, dst, qb, 4);
    rd_tile_pad_rows(rows, r, (size_t)((depth + 3) / 4 * 4 + 12), dst);
}
