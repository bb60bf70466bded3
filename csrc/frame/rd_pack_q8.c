/*
 * float32 / bfloat16 rows quantized to int8 while packed (RD_CT_U8S8's A,
 * the k-quads or RD_CT_U8S8MMA's blocks; the tile types' rows in
 * frame/rd_pack_dot.c): the per-row scales, the quantization and the
 * packing in one pass.  frame/rd_pack.c binds them in its tables.
 */
#include "rd_pack_int.h"
#include "rd_half.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/*
 * float32 / bfloat16 rows quantized to int8 while packed, for the int8 dot
 * products (RD_CT_U8S8 A, "dynamic" activation quantization): each value
 * x of row i becomes q = clip(rint(x / s_i), -128, 127) with s_i the row's
 * scale (rd_row_scales: absmax / 127.5), the value raggeddot.quantize gives
 * per row (the same float32 division and rounding); stored as q + 128 in
 * the k-quads of rd_pack_i8_quads, with the row's sum of q, its scale and a
 * zero point of 0 in the trailer.  A NaN becomes -128 (never undefined).
 */
static inline int32_t
rd_quantize_q8(float x, float s)
{
    float y = x / s;
    y = y >= -128.0f ? y : -128.0f;   /* NaN too: clipped first (the bounds */
    y = y <= 127.0f ? y : 127.0f;     /* are integers: clip and rint commute) */
    return (int32_t)rintf(y);
}

static inline float
rd_widen_any(const void *x, int bf16, rd_int i)
{
    return bf16 ? rd_bf16_to_float(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* q[p] = rd_quantize_q8(x[p * cs], s) for p < n: x float32, or bfloat16
 * bits when bf16.  Contiguous rows take eight values an instruction where
 * the CPU has AVX2 (every CPU whose kernels take int8 dot products does):
 * the same division, clip and nearest-even rounding. */
static void
rd_q8_row_scalar(const void *x, int bf16, rd_int n, rd_int cs, float s, int8_t *q)
{
    for (rd_int p = 0; p < n; p++)
        q[p] = (int8_t)rd_quantize_q8(rd_widen_any(x, bf16, p * cs), s);
}

/* max |x[p * cs]| over p < n, NaN when one is NaN. */
static float
rd_absmax_scalar(const void *x, int bf16, rd_int n, rd_int cs)
{
    float amax = 0.0f;
    int nan = 0;
    for (rd_int p = 0; p < n; p++) {
        const float a = fabsf(rd_widen_any(x, bf16, p * cs));
        amax = a > amax ? a : amax;
        nan |= a != a;
    }
    return nan ? (float)NAN : amax;
}

#ifdef RD_HAVE_X86_KERNELS
#include <immintrin.h>

__attribute__((target("avx2"))) static inline __m256
rd_load8(const void *x, int bf16, rd_int p)
{
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)x + p))), 16));
    return _mm256_loadu_ps((const float *)x + p);
}

/* x[p .. p + 8) quantized as rd_quantize_q8 does (the same division,
 * clip and rounding), as int32 lanes (vs: the scale in every lane). */
__attribute__((target("avx2"))) static inline __m256i
rd_q8_8(const void *x, int bf16, rd_int p, __m256 vs)
{
    const __m256 lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
    /* max(y, lo) gives lo for a NaN y (its second operand); then the
     * conversion rounds to nearest even (MXCSR's default) */
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_div_ps(rd_load8(x, bf16, p), vs), lo), hi));
}

/* rd_q8_8's lanes as bytes, in the low 8 of the result. */
__attribute__((target("avx2"))) static inline __m128i
rd_q8_bytes(__m256i v)
{
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm_packs_epi16(w, w);
}

__attribute__((target("avx2"))) static void
rd_q8_row_avx2(const void *x, int bf16, rd_int n, float s, int8_t *q)
{
    const __m256 vs = _mm256_set1_ps(s);
    rd_int p = 0;
    for (; p + 8 <= n; p += 8)
        _mm_storel_epi64((__m128i *)(void *)(q + p), rd_q8_bytes(rd_q8_8(x, bf16, p, vs)));
    for (; p < n; p++)
        q[p] = (int8_t)rd_quantize_q8(rd_widen_any(x, bf16, p), s);
}

/* A contiguous row x of `depth` values quantized as rd_q8_row_avx2 does and
 * stored, + 128, as the k-quads of row 0 of a panel of r rows (d: its
 * first word; steps r words apart), up to kq (padding bytes 0); returns the
 * row's sum of q.  One pass: no copy of q dealt out byte by byte. */
__attribute__((target("avx2"))) static int32_t
rd_q8_quads_avx2(const void *x, int bf16, rd_int depth, rd_int kq, float s, uint32_t *d, rd_int r)
{
    const __m256 vs = _mm256_set1_ps(s);
    const __m128i flip = _mm_set1_epi8((char)0x80);
    __m256i sum = _mm256_setzero_si256();
    rd_int p = 0;
    for (; p + 8 <= depth; p += 8) {
        const __m256i v = rd_q8_8(x, bf16, p, vs);
        sum = _mm256_add_epi32(sum, v);
        const __m128i q = _mm_xor_si128(rd_q8_bytes(v), flip);
        d[p / 4 * r] = (uint32_t)_mm_cvtsi128_si32(q);
        d[(p / 4 + 1) * r] = (uint32_t)_mm_extract_epi32(q, 1);
    }
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    int32_t acc = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xb1)));
    for (; p < kq; p += 4) {
        uint32_t word = 0;
        for (rd_int e = 0; e < 4 && p + e < depth; e++) {
            const int32_t q = rd_quantize_q8(rd_widen_any(x, bf16, p + e), s);
            acc += q;
            word |= (uint32_t)(uint8_t)(q ^ 0x80) << (8 * e);
        }
        d[p / 4 * r] = word;
    }
    return acc;
}

__attribute__((target("avx2"))) static float
rd_absmax_avx2(const void *x, int bf16, rd_int n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    rd_int p = 0;
    for (; p + 8 <= n; p += 8) {
        const __m256 a = _mm256_andnot_ps(sign, rd_load8(x, bf16, p));
        m = _mm256_max_ps(m, a);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, m);
    float amax = rd_absmax_scalar((const char *)x + p * (bf16 ? 2 : 4), bf16, n - p, 1);
    if (amax != amax || _mm256_movemask_ps(nan))
        return (float)NAN;
    for (int i = 0; i < 8; i++)
        amax = lanes[i] > amax ? lanes[i] : amax;
    return amax;
}
#endif

static void
rd_q8_row(const void *x, int bf16, rd_int n, rd_int cs, float s, int8_t *q)
{
#ifdef RD_HAVE_X86_KERNELS
    if (cs == 1 && rd_cpu()->avx2) {
        rd_q8_row_avx2(x, bf16, n, s, q);
        return;
    }
#endif
    rd_q8_row_scalar(x, bf16, n, cs, s, q);
}

static float
rd_absmax(const void *x, int bf16, rd_int n, rd_int cs)
{
#ifdef RD_HAVE_X86_KERNELS
    if (cs == 1 && rd_cpu()->avx2)
        return rd_absmax_avx2(x, bf16, n);
#endif
    return rd_absmax_scalar(x, bf16, n, cs);
}

/* A row x of `depth` values (cs apart) quantized and stored, + 128, as
 * row 0 of a panel of r rows in blocks of `unit` steps (d: its first byte),
 * up to kq (padding bytes 0): a stretch of the row quantized, then dealt
 * into the panel a block at a time; returns the row's sum of q. */
static int32_t
rd_q8_dealt(const char *x, int bf16, rd_int depth, rd_int kq, rd_int cs, float s, uint8_t *d, int r, int unit)
{
    int8_t q[256] __attribute__((aligned(64)));
    int32_t acc = 0;
    for (rd_int p0 = 0; p0 < kq; p0 += 256) {
        const rd_int w = kq - p0 < 256 ? kq - p0 : 256;
        const rd_int real = depth - p0 < w ? depth - p0 : w;
        rd_q8_row(x + p0 * cs * (bf16 ? 2 : 4), bf16, real, cs, s, q);
        for (rd_int p = real; p < w; p++)
            q[p] = -128;   /* padding: stored as 0 */
        for (rd_int p = 0; p < real; p++)
            acc += q[p];
        for (rd_int p = 0; p < w; p += unit)
            for (int e = 0; e < unit; e++)
                d[(p0 + p) * (rd_int)r + e] = (uint8_t)(q[p + e] ^ 0x80);
    }
    return acc;
}

/* (unit: 4, the k-quads of RD_CT_U8S8; 8, the blocks of RD_CT_U8S8MMA's A) */
void
rd_pack_q8(rd_int rows, rd_int depth, const void *src, int bf16, rd_int rs, rd_int cs,
           int r, void *dst_, const rd_qblock_t *qb, int unit)
{
    uint8_t *dst = (uint8_t *)dst_;
    const float *scale = (const float *)qb->s;
    const rd_int kq = (depth + unit - 1) / unit * unit;
    const rd_int t = qb->p0 / qb->tp;
    const size_t esize = bf16 ? 2 : 4;
    for (rd_int i0 = 0; i0 < rows; i0 += r) {
        const rd_int have = rows - i0 < r ? rows - i0 : r;
        char *tr = (char *)dst + (rd_int)r * kq;
        int32_t *sum = (int32_t *)(void *)tr;
        float *sc = (float *)(void *)(tr + 4 * (rd_int)r);
        int32_t *zp = (int32_t *)(void *)(tr + 8 * (rd_int)r);
        if (have < r)   /* the padding rows' values 0: the panel cleared at once, its rows written after */
            memset(dst, 0, (size_t)r * (size_t)kq);
        for (rd_int i = 0; i < have; i++) {
            const char *x = (const char *)src + (i0 + i) * rs * (rd_int)esize;
            const float s = scale[(qb->i0 + i0 + i) / qb->tr * qb->rs + t * qb->ps];
#ifdef RD_HAVE_X86_KERNELS
            if (unit == 4 && cs == 1 && rd_cpu()->avx2)
                sum[i] = rd_q8_quads_avx2(x, bf16, depth, kq, s, (uint32_t *)(void *)(dst + 4 * i), r);
            else
#endif
                sum[i] = rd_q8_dealt(x, bf16, depth, kq, cs, s, dst + (rd_int)unit * i, r, unit);
            sc[i] = s;
            zp[i] = 0;
        }
        for (rd_int i = have; i < r; i++) {
            sum[i] = 0;
            sc[i] = 0.0f;
            zp[i] = 0;
        }
        dst += (rd_int)r * kq + 12 * (rd_int)r;
    }
}

void
rd_pack_s_q8_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                   const rd_qblock_t *qb)
{
    rd_pack_q8(rows, depth, src, 0, rs, cs, r, dst, qb, 4);
}

void
rd_pack_b_q8_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                   const rd_qblock_t *qb)
{
    rd_pack_q8(rows, depth, src, 1, rs, cs, r, dst, qb, 4);
}

void
rd_pack_s_qo_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                   const rd_qblock_t *qb)
{
    rd_pack_q8(rows, depth, src, 0, rs, cs, r, dst, qb, 8);
}

void
rd_pack_b_qo_qpack(rd_int rows, rd_int depth, const void *src, rd_int rs, rd_int cs, int r, void *dst,
                   const rd_qblock_t *qb)
{
    rd_pack_q8(rows, depth, src, 1, rs, cs, r, dst, qb, 8);
}

/* Per-row scales of dynamic int8 quantization: s_i = max_p |x[i][p]| / 127.5
 * in float32 (1 for a row of zeros; NaN when the row holds one), as
 * raggeddot.quantize(x, "int8", channelwise_axes=(0,)) computes them. */
int
rd_row_scales(const void *x, rd_dtype_t dtype, rd_int m, rd_int k, rd_int rs, rd_int cs, float *out)
{
    if (dtype != RD_F32 && dtype != RD_BF16)
        return -1;
    const int bf16 = dtype == RD_BF16;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(rd_get_num_threads()) if (m * k > 262144)
#endif
    for (rd_int i = 0; i < m; i++) {
        const float amax = rd_absmax((const char *)x + i * rs * (bf16 ? 2 : 4), bf16, k, cs);
        const float s = amax / 127.5f;
        out[i] = s == 0.0f ? 1.0f : s;
    }
    return 0;
}
