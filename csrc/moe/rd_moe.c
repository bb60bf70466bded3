/*
 * The pieces of a Mixture-of-Experts layer around its grouped matmuls:
 * routing (scores, group-limited top-k), the counting sort of assignments
 * by expert, dispatch and combine as row gathers, and gated activations.
 */
#include "moe/rd_moe.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

rd_int
rd_moe_sort(rd_int T, rd_int k, rd_int E, const long long *topk_idx,
            rd_int capacity, long long *slot_of, long long *token_of_slot,
            long long *group_sizes)
{
    rd_int *start = (rd_int *)malloc(sizeof(rd_int) * (size_t)(E > 0 ? E : 1));
    if (start == NULL)
        return -1;
    /* 1. count the kept assignments of each expert, in token order */
    for (rd_int e = 0; e < E; e++)
        group_sizes[e] = 0;
    for (rd_int a = 0; a < T * k; a++) {
        long long e = topk_idx[a];
        if (capacity < 0 || group_sizes[e] < capacity) {
            group_sizes[e]++;
            slot_of[a] = 0;          /* kept; position filled below */
        }
        else {
            slot_of[a] = -1;         /* dropped */
        }
    }
    /* 2. exclusive prefix sum: where each expert's rows start */
    rd_int kept = 0;
    for (rd_int e = 0; e < E; e++) {
        start[e] = kept;
        kept += group_sizes[e];
    }
    /* 3. place the kept assignments, stable in token order */
    for (rd_int a = 0; a < T * k; a++) {
        if (slot_of[a] < 0)
            continue;
        rd_int pos = start[topk_idx[a]]++;
        slot_of[a] = pos;
        token_of_slot[pos] = a / k;
    }
    free(start);
    return kept;
}

/* 1/k!, k = 12 down to 0: the Taylor coefficients of e^r */
static const double rd_inv_factorial[13] = {
    1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720,
    1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0,
};

/* sum of rd_inv_factorial[i] r^(last - i), i = first..last, by Horner's
 * rule: e^r to r^11 (1, 12), or (e^r - 1) / r to r^11 (0, 11) */
static inline __attribute__((always_inline)) double
rd_exp_taylor(double r, int first, int last)
{
    double p = rd_inv_factorial[first];
#pragma GCC unroll 13
    for (int i = first + 1; i <= last; i++)
        p = p * r + rd_inv_factorial[i];
    return p;
}

/* e^x in double for x in [-708, 709] (or NaN): x = n ln2 + r, |r| <= ln2/2,
 * e^r by its Taylor polynomial to r^11 (relative error under 1e-14), times
 * 2^n built from n's bits.  *em1, when given, gets e^x - 1 with the same
 * relative accuracy where x is small: 2^n (e^r - 1) + (2^n - 1), e^r - 1 by
 * its own polynomial (to r^12), never the difference of two near numbers. */
static inline __attribute__((always_inline)) double
rd_exp_core(double x, double *em1)
{
    const double shift = 0x1.8p52;                /* adding it rounds to an integer */
    const double t = x * 0x1.71547652b82fep0 + shift;
    const double n = t - shift;                   /* round(x / ln2) */
    const double r = x - n * 0x1.62e42fefa39efp-1;
    const double p = rd_exp_taylor(r, 1, 12);     /* e^r, to r^11 */
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);               /* n in the low bits of t's mantissa */
    bits = (bits + 1023u) << 52;                  /* 2^n: n + 1023 in [1, 2046] */
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    if (em1 != NULL)    /* e^r - 1 = r (1 + r/2 + ... + r^11/12!) */
        *em1 = scale * (rd_exp_taylor(r, 0, 11) * r) + (scale - 1.0);
    return p * scale;
}

/* |x| with its magnitude clamped at the float whose bits are `lim`
 * (infinities too; NaN stays NaN), and x's sign bit: the clamps are done
 * on the bits, because a compare and select of doubles stops gcc
 * vectorizing the loops these functions are inlined in. */
static inline __attribute__((always_inline)) float
rd_clamped_abs(float x, uint32_t lim, uint32_t *sign)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    *sign = u & 0x80000000u;
    uint32_t a = u & 0x7fffffffu;
    const uint32_t nan = 0u - (uint32_t)(a > 0x7f800000u);     /* all ones for a NaN */
    a = ((a < lim ? a : lim) & ~nan) | (a & nan);
    float f;
    memcpy(&f, &a, sizeof f);
    return f;
}

/* A float of magnitude v (a double rounded once) with the sign bit `sign`. */
static inline __attribute__((always_inline)) float
rd_signed_float(double v, uint32_t sign)
{
    const float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u |= sign;
    float out;
    memcpy(&out, &u, sizeof out);
    return out;
}

/* e^x of a float, the same bits on every CPU and compiler: computed in
 * double (rd_exp_core) and rounded once to float, so correctly rounded but
 * where e^x lies within 1e-14 of a midpoint between floats.  Only IEEE +,
 * -, * and conversions: the activations' loops vectorize it (libm's expf
 * is a call a value, and its bits are the platform's).  x beyond
 * [-104, 89] is clamped (e^x then 0 or infinity in float); NaN stays NaN. */
static inline __attribute__((always_inline)) float
rd_expf(float xf)
{
    uint32_t u;
    memcpy(&u, &xf, sizeof u);
    const uint32_t a = u & 0x7fffffffu, lim = (u >> 31) ? 0x42d00000u : 0x42b20000u;  /* 104, 89 */
    u = a > lim && a <= 0x7f800000u ? (u & 0x80000000u) | lim : u;
    float xc;
    memcpy(&xc, &u, sizeof xc);
    return (float)rd_exp_core((double)xc, NULL);
}

/* tanh of a float, as rd_expf: tanh|z| = m / (m + 2) with m = e^{2|z|} - 1
 * in double (no cancellation near 0), rounded once, with z's sign.  |z| is
 * clamped at 10 (tanh is 1 in float from 9.01 on); NaN stays NaN. */
static inline __attribute__((always_inline)) float
rd_tanhf(float z)
{
    uint32_t sign;
    const double x = 2.0 * (double)rd_clamped_abs(z, 0x41200000u, &sign);   /* 10 */
    double m;
    (void)rd_exp_core(x, &m);
    return rd_signed_float(m / (m + 2.0), sign);
}

/* 2^n / (2n + 1)!!, n = 0..62: erf(a) = 2/sqrt(pi) a e^{-a^2} sum_n c_n a^{2n},
 * a series of positive terms (no cancellation); 63 of them reach a relative
 * 1e-17 at a = 4. */
static const double rd_erf_series[63] = {
    0x1.0000000000000p+0, 0x1.5555555555555p-1, 0x1.1111111111111p-2,
    0x1.3813813813814p-4, 0x1.1566abc011567p-6, 0x1.937e11175f095p-9,
    0x1.f09b28ba4d955p-12, 0x1.08db48ebe51c7p-14, 0x1.f28db670be53bp-18,
    0x1.a3d5a71b92cd3p-21, 0x1.3fdfbc45c52eap-24, 0x1.bd0ac3296b624p-28,
    0x1.1cd3b01a822a6p-31, 0x1.519297d390c9fp-35, 0x1.747e72912d023p-39,
    0x1.808286c768445p-43, 0x1.74dba97b8be52p-47, 0x1.54e6174c62a5ap-51,
    0x1.26d4d5e132b8cp-55, 0x1.e3d36c1c38faap-60, 0x1.799ec4c4db4d0p-64,
    0x1.19050980a3336p-68, 0x1.8fac24452c5fdp-73, 0x1.101e0dcd0ddf3p-77,
    0x1.636b2c25f2c57p-82, 0x1.be03fb2a9a10ep-87, 0x1.0d4adb45318cap-91,
    0x1.395bc2a44c468p-96, 0x1.5fd74f512d38cp-101, 0x1.7da878c0310ddp-106,
    0x1.906d9c10fce8bp-111, 0x1.96c8bf0d31af7p-116, 0x1.9086a47b449d0p-121,
    0x1.7e978a031f273p-126, 0x1.62de2e635bf7dp-131, 0x1.3fe183f49b037p-136,
    0x1.18718c3c25b5ep-141, 0x1.de9fa7a781366p-147, 0x1.8dd12aeef708ap-152,
    0x1.42483cb4a13e1p-157, 0x1.fd4910eadf32bp-163, 0x1.88b3b6aeeff5cp-168,
    0x1.27ae777aaea6fp-173, 0x1.b306925c38de1p-179, 0x1.38d3d3acbe777p-184,
    0x1.b80562010be8bp-190, 0x1.2ecf673a86d1bp-195, 0x1.97ff32292170cp-201,
    0x1.0d319d230e257p-206, 0x1.5c0c6e1377238p-212, 0x1.b9175b58090c0p-218,
    0x1.12137bdd39d0dp-223, 0x1.4e1ca0bfaa712p-229, 0x1.8faf67c62dfc9p-235,
    0x1.d55ae5e660472p-241, 0x1.0e9e7ff139d16p-246, 0x1.328ac2c4386e4p-252,
    0x1.5531d21af5596p-258, 0x1.7545d22a9f03bp-264, 0x1.9180e20fba197p-270,
    0x1.a8bb1daf50808p-276, 0x1.b9ff147c2a260p-282, 0x1.c49ab4b87d147p-288,
};

/* erf of a float, as rd_expf: the series above and e^{-a^2} in double
 * (relative error under 1e-14), rounded once, with x's sign.  |x| is
 * clamped at 4 (erf is 1 in float from 3.92 on); NaN stays NaN. */
static inline __attribute__((always_inline)) float
rd_erff(float x)
{
    uint32_t sign;
    const double a = (double)rd_clamped_abs(x, 0x40800000u, &sign);         /* 4 */
    const double y = a * a;                       /* exact: 48 bits */
    double s = rd_erf_series[62];
#pragma GCC unroll 64
    for (int n = 61; n >= 0; n--)
        s = s * y + rd_erf_series[n];
    return rd_signed_float(0x1.20dd750429b6dp+0 * a * rd_exp_core(-y, NULL) * s, sign);   /* 2/sqrt(pi) */
}

/* The elementwise activations work in chunks of this many values. */
#define RD_ACT_CHUNK 4096

#define RD_T float
#define RD_FN(x) rd_s_##x
#define RD_EXP rd_expf
#define RD_ERF rd_erff
#define RD_TANH rd_tanhf
#include "rd_moe_impl.h"
#undef RD_T
#undef RD_FN
#undef RD_EXP
#undef RD_ERF
#undef RD_TANH

#define RD_T double
#define RD_FN(x) rd_d_##x
#define RD_EXP exp
#define RD_ERF erf
#define RD_TANH tanh
#include "rd_moe_impl.h"
#undef RD_T
#undef RD_FN
#undef RD_EXP
#undef RD_ERF
#undef RD_TANH

const rd_moe_ops_t rd_moe_ops[RD_CT_COUNT] = {
    [RD_CT_F32] = {rd_s_moe_route, rd_s_gather_rows, rd_s_gather_reduce, rd_s_add_row, rd_s_gated_act,
                   rd_s_gated_act_grad},
    [RD_CT_F64] = {rd_d_moe_route, rd_d_gather_rows, rd_d_gather_reduce, rd_d_add_row, rd_d_gated_act,
                   rd_d_gated_act_grad},
};

void
rd_gather_reduce_half(rd_int T, rd_int k, rd_int d, const uint16_t *y, rd_int y_rs, rd_dtype_t dt,
                      const long long *slots, const float *w, float *out, int ordered)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(rd_get_num_threads()) if (T * k * d > 65536)
#endif
    for (rd_int t = 0; t < T; t++) {
        float *o = out + t * d;
        float row[1024];
        for (rd_int c = 0; c < d; c++)
            o[c] = 0;
        const long long *st = slots + t * k;
        for (rd_int j = rd_combine_next(st, k, ordered, -1); j >= 0; j = rd_combine_next(st, k, ordered, j)) {
            const float wt = w ? w[t * k + j] : 1.0f;
            for (rd_int c0 = 0; c0 < d; c0 += 1024) {
                const rd_int n = d - c0 < 1024 ? d - c0 : 1024;
                rd_widen(y + (rd_int)st[j] * y_rs + c0, row, dt, (size_t)n);
                rd_s_add_row(n, &wt, row, o + c0);
            }
        }
    }
}

/* Elements [c0, c0 + n) of row i of x (dtype dt, rows rs elements apart)
 * as doubles, exactly. */
static void
rd_row_doubles(const void *x, rd_int rs, rd_dtype_t dt, rd_int i, rd_int c0, rd_int n, double *dst)
{
    if (dt == RD_F64) {
        const double *r = (const double *)x + i * rs + c0;
        for (rd_int c = 0; c < n; c++)
            dst[c] = r[c];
        return;
    }
    float buf[256];
    const float *r = (const float *)x + i * rs + c0;
    if (dt == RD_BF16 || dt == RD_F16) {
        rd_widen((const uint16_t *)x + i * rs + c0, buf, dt, (size_t)n);
        r = buf;
    }
    for (rd_int c = 0; c < n; c++)
        dst[c] = (double)r[c];
}

void
rd_slot_dots(rd_int T, rd_int k, rd_int d, const void *a, rd_int a_rs, rd_dtype_t da, const void *rows,
             rd_int r_rs, rd_dtype_t dr, const long long *slots, void *out)
{
    const int wide = da == RD_F64 || dr == RD_F64;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(rd_get_num_threads()) if (T * k * d > 65536)
#endif
    for (rd_int t = 0; t < T; t++) {
        double x[256], y[256];
        for (rd_int j = 0; j < k; j++) {
            const long long s = slots[t * k + j];
            double sum = 0.0;
            for (rd_int c0 = 0; s >= 0 && c0 < d; c0 += 256) {
                const rd_int n = d - c0 < 256 ? d - c0 : 256;
                rd_row_doubles(a, a_rs, da, t, c0, n, x);
                rd_row_doubles(rows, r_rs, dr, (rd_int)s, c0, n, y);
                for (rd_int c = 0; c < n; c++)
                    sum += x[c] * y[c];
            }
            if (wide)
                ((double *)out)[t * k + j] = sum;
            else
                ((float *)out)[t * k + j] = (float)sum;
        }
    }
}

/* A tile's rows plus the bias of group g (columns c0.., of the compute
 * type): the bias added in the compute type, as the separate passes add it
 * to their products. */
static void
rd_tile_bias(int wide, const void *bias, rd_int b_rs, rd_int g, rd_int c0, void *x, rd_int cols)
{
    if (wide) {
        const double *b = (const double *)bias + g * b_rs + c0;
        double *v = (double *)x;
        for (rd_int j = 0; j < cols; j++)
            v[j] += b[j];
    }
    else {
        const float *b = (const float *)bias + g * b_rs + c0;
        float *v = (float *)x;
        for (rd_int j = 0; j < cols; j++)
            v[j] += b[j];
    }
}

/* The epilogue of the down product that combines (rd_combine_t): per row
 * of a finished tile, the bias, the rounding to the hidden dtype, then the
 * row times its slot's weight added into its token's output row. */
void
rd_combine_epilogue(void *ctx_, rd_int g, rd_int r0, rd_int c0, rd_int rows, rd_int cols, void *t0_,
                    void *t1_, rd_int ld)
{
    const rd_combine_t *o = (const rd_combine_t *)ctx_;
    const int wide = o->ct == RD_CT_F64, half = o->dt == RD_BF16 || o->dt == RD_F16;
    const size_t es = wide ? sizeof(double) : sizeof(float);
    const rd_moe_ops_t *ops = &rd_moe_ops[wide ? RD_CT_F64 : RD_CT_F32];
    const double one64 = 1.0;
    const float one32 = 1.0f;
    uint16_t row16[RD_GATED_MAX_COLS];
    (void)t1_;
    for (rd_int i = 0; i < rows; i++) {
        const rd_int r = r0 + i;
        char *x = (char *)t0_ + (size_t)(i * ld) * es;
        if (o->bias != NULL)
            rd_tile_bias(wide, o->bias, o->b_rs, g, c0, x, cols);
        if (half) {
            rd_narrow((const float *)(void *)x, row16, o->dt, (size_t)cols, 0);
            rd_widen(row16, (float *)(void *)x, o->dt, (size_t)cols);
        }
        const void *wt = o->w != NULL ? (const char *)o->w + (size_t)r * es
                         : wide ? (const void *)&one64 : (const void *)&one32;
        ops->add_row(cols, wt, x, (char *)o->out + (size_t)(o->tokens[r] * o->out_rs + c0) * es);
    }
}

/* The epilogue of the fused gate and up products (rd_gated_rows): per row
 * of a finished tile, the biases added (in the compute type), the
 * projections rounded to the hidden dtype and kept where asked for, then
 * the activation on those values, rounded once into `a`: the values of the
 * separate passes (products rounded to the hidden dtype, biases added
 * before that rounding, gated_act on the rounded values), bit for bit. */
void
rd_gated_epilogue(void *ctx_, rd_int g, rd_int r0, rd_int c0, rd_int rows, rd_int cols, void *t0_,
                  void *t1_, rd_int ld)
{
    const rd_gated_out_t *o = (const rd_gated_out_t *)ctx_;
    const int wide = o->ct == RD_CT_F64, half = o->dt == RD_BF16 || o->dt == RD_F16;
    const size_t es = wide ? sizeof(double) : sizeof(float);
    const size_t os = half ? 2 : es;            /* bytes of an output element */
    const rd_moe_ops_t *ops = &rd_moe_ops[wide ? RD_CT_F64 : RD_CT_F32];
    uint16_t row16[RD_GATED_MAX_COLS];
    for (rd_int i = 0; i < rows; i++) {
        char *p[2] = {(char *)t0_ + (size_t)(i * ld) * es, (char *)t1_ + (size_t)(i * ld) * es};
        const rd_int r = r0 + i;
        for (int q = 0; q < 2; q++) {
            const void *bias = q ? o->b1 : o->b0;
            void *keep = q ? o->h1 : o->h0;
            if (bias != NULL)
                rd_tile_bias(wide, bias, o->b_rs, g, c0, p[q], cols);
            char *dst = keep != NULL ? (char *)keep + (size_t)(r * o->rs + c0) * os : NULL;
            if (half) {
                /* rounded once into the hidden dtype, then read back as the
                 * activation's operand */
                uint16_t *h = dst != NULL ? (uint16_t *)(void *)dst : row16;
                float *x = (float *)(void *)p[q];
                rd_narrow(x, h, o->dt, (size_t)cols, 0);
                rd_widen(h, x, o->dt, (size_t)cols);
            }
            else if (dst != NULL)
                memcpy(dst, p[q], (size_t)cols * es);
        }
        char *a = (char *)o->a + (size_t)(r * o->rs + c0) * os;
        if (half) {
            ops->gated_act(cols, o->kind, o->limit, o->alpha, p[0], p[1], p[0]);
            rd_narrow((const float *)(void *)p[0], a, o->dt, (size_t)cols, 0);
        }
        else
            ops->gated_act(cols, o->kind, o->limit, o->alpha, p[0], p[1], a);
    }
}

/* The epilogue of the backward's first product, d_a = d_y @ wo^T
 * (rd_gated_rows with one weight): per row of a finished tile, d_a rounded
 * to the hidden dtype (as the array the separate pass writes), then the
 * activation's gradient from the kept h0, h1 into d_h0, d_h1, rounded
 * once: the values of the separate product and gated_act_grad, bit for
 * bit, without the [rows, n] array of d_a. */
void
rd_gated_grad_epilogue(void *ctx_, rd_int g, rd_int r0, rd_int c0, rd_int rows, rd_int cols, void *t0_,
                       void *t1_, rd_int ld)
{
    const rd_gated_grad_t *o = (const rd_gated_grad_t *)ctx_;
    const int wide = o->ct == RD_CT_F64, half = o->dt == RD_BF16 || o->dt == RD_F16;
    const size_t es = wide ? sizeof(double) : sizeof(float), os = half ? 2 : es;
    const rd_moe_ops_t *ops = &rd_moe_ops[wide ? RD_CT_F64 : RD_CT_F32];
    float h[2][RD_GATED_MAX_COLS], dg[RD_GATED_MAX_COLS], du[RD_GATED_MAX_COLS];
    uint16_t row16[RD_GATED_MAX_COLS];
    (void)g;
    (void)t1_;
    for (rd_int i = 0; i < rows; i++) {
        char *da = (char *)t0_ + (size_t)(i * ld) * es;
        const size_t at = (size_t)((r0 + i) * o->rs + c0) * os, d_at = (size_t)((r0 + i) * o->d_rs + c0) * os;
        char *d0 = (char *)o->dh0 + d_at, *d1 = (char *)o->dh1 + d_at;
        if (!half) {
            ops->gated_act_grad(cols, o->kind, o->limit, o->alpha, (const char *)o->h0 + at,
                                (const char *)o->h1 + at, da, d0, d1);
            continue;
        }
        float *x = (float *)(void *)da;
        rd_narrow(x, row16, o->dt, (size_t)cols, 0);
        rd_widen((const char *)o->h0 + at, h[0], o->dt, (size_t)cols);
        rd_widen((const char *)o->h1 + at, h[1], o->dt, (size_t)cols);
        rd_widen(row16, x, o->dt, (size_t)cols);
        ops->gated_act_grad(cols, o->kind, o->limit, o->alpha, h[0], h[1], x, dg, du);
        rd_narrow(dg, d0, o->dt, (size_t)cols, 0);
        rd_narrow(du, d1, o->dt, (size_t)cols, 0);
    }
}
