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

/* e^x of a float, the same bits on every CPU and compiler: computed in
 * double (x = n ln2 + r, |r| <= ln2/2, e^r by its Taylor polynomial to r^11,
 * relative error under 1e-14, times 2^n built from n's bits) and rounded once
 * to float, so correctly rounded but where e^x lies within 1e-14 of a midpoint
 * between floats.  Only IEEE +, -, * and conversions: the activations' loops
 * vectorize it (libm's expf is a call a value, and its bits are the
 * platform's).  x beyond [-104, 89] is clamped (e^x then 0 or infinity in
 * float); NaN stays NaN. */
static inline float
rd_expf(float xf)
{
    uint32_t u;                                   /* the clamp on the bits: a compare and */
    memcpy(&u, &xf, sizeof u);                    /* select of doubles stops gcc vectorizing */
    const uint32_t a = u & 0x7fffffffu, lim = (u >> 31) ? 0x42d00000u : 0x42b20000u;  /* 104, 89 */
    u = a > lim && a <= 0x7f800000u ? (u & 0x80000000u) | lim : u;
    float xc;
    memcpy(&xc, &u, sizeof xc);
    const double x = (double)xc;
    const double shift = 0x1.8p52;                /* adding it rounds to an integer */
    const double t = x * 0x1.71547652b82fep0 + shift;
    const double n = t - shift;                   /* round(x / ln2) */
    const double r = x - n * 0x1.62e42fefa39efp-1;
    double p = 1.0 / 39916800;
    p = p * r + 1.0 / 3628800;
    p = p * r + 1.0 / 362880;
    p = p * r + 1.0 / 40320;
    p = p * r + 1.0 / 5040;
    p = p * r + 1.0 / 720;
    p = p * r + 1.0 / 120;
    p = p * r + 1.0 / 24;
    p = p * r + 1.0 / 6;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);               /* n in the low bits of t's mantissa */
    bits = (bits + 1023u) << 52;                  /* 2^n: n + 1023 in [873, 1152] */
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return (float)(p * scale);
}

/* The elementwise activations work in chunks of this many values. */
#define RD_ACT_CHUNK 4096

#define RD_T float
#define RD_FN(x) rd_s_##x
#define RD_EXP rd_expf
#define RD_ERF erff
#define RD_TANH tanhf
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
