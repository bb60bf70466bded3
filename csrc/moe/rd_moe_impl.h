/*
 * MoE routing, gathers and gated activations for one dtype.  Included by
 * moe/rd_moe.c with RD_T (float, double), RD_FN(x) (name mangler) and the math
 * functions RD_EXP, RD_ERF, RD_TANH defined.
 */

/* Index of the largest v[i] over i in [0, n) with eligible[i]; ties go to
 * the lower index, NaN never wins over a number.  -1 if none is eligible. */
static rd_int
RD_FN(argmax_eligible)(const RD_T *v, const unsigned char *eligible, rd_int n)
{
    rd_int best = -1;
    for (rd_int i = 0; i < n; i++) {
        if (!eligible[i])
            continue;
        if (best < 0 || v[i] > v[best] || (v[best] != v[best] && v[i] == v[i]))
            best = i;
    }
    return best;
}

static int
RD_FN(moe_route)(rd_int T, rd_int E, const void *logits_, int score_func,
                 const void *selection_bias_, rd_int n_groups, rd_int topk_groups,
                 rd_int top_k, int norm_topk_prob, double scaling,
                 void *scores_, long long *topk_idx, void *topk_w_)
{
    const RD_T *logits = (const RD_T *)logits_;
    const RD_T *selection_bias = (const RD_T *)selection_bias_;
    RD_T *scores = (RD_T *)scores_, *topk_w = (RD_T *)topk_w_;
    int failed = 0;
    const rd_int per_group = n_groups > 1 ? E / n_groups : E;
#ifdef _OPENMP
#pragma omp parallel num_threads(rd_get_num_threads()) if (T * E > 32768)
#endif
    {
        RD_T *sel = (RD_T *)malloc(sizeof(RD_T) * (size_t)E);
        RD_T *gscore = (RD_T *)malloc(sizeof(RD_T) * (size_t)(n_groups > 1 ? n_groups : 1));
        unsigned char *ok = (unsigned char *)malloc((size_t)E);
        unsigned char *gok = (unsigned char *)malloc((size_t)(n_groups > 1 ? n_groups : 1));
        int have = sel != NULL && gscore != NULL && ok != NULL && gok != NULL;
        if (!have) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (rd_int t = 0; t < T; t++) {
            if (!have)
                continue;
            const RD_T *lg = logits + t * E;
            RD_T *sc = scores + t * E;
            if (score_func == RD_SCORE_SOFTMAX) {
                RD_T mx = lg[0];
                for (rd_int e = 1; e < E; e++)
                    mx = lg[e] > mx ? lg[e] : mx;
                RD_T sum = 0;
                for (rd_int e = 0; e < E; e++) {
                    sc[e] = RD_EXP(lg[e] - mx);
                    sum += sc[e];
                }
                for (rd_int e = 0; e < E; e++)
                    sc[e] /= sum;
            }
            else {
                for (rd_int e = 0; e < E; e++)
                    sc[e] = (RD_T)1 / ((RD_T)1 + RD_EXP(-lg[e]));
            }
            for (rd_int e = 0; e < E; e++) {
                sel[e] = selection_bias ? sc[e] + selection_bias[e] : sc[e];
                ok[e] = 1;
            }
            if (n_groups > 1 && topk_groups < n_groups) {
                /* group score: the sum of its two best selection values */
                for (rd_int q = 0; q < n_groups; q++) {
                    const RD_T *v = sel + q * per_group;
                    rd_int i1 = RD_FN(argmax_eligible)(v, ok + q * per_group, per_group);
                    RD_T s = v[i1];
                    if (per_group > 1) {
                        ok[q * per_group + i1] = 0;
                        rd_int i2 = RD_FN(argmax_eligible)(v, ok + q * per_group, per_group);
                        ok[q * per_group + i1] = 1;
                        s += v[i2];
                    }
                    gscore[q] = s;
                    gok[q] = 1;
                }
                unsigned char *keep = (unsigned char *)ok;   /* reuse as expert mask */
                for (rd_int e = 0; e < E; e++)
                    keep[e] = 0;
                for (rd_int r = 0; r < topk_groups; r++) {
                    rd_int q = RD_FN(argmax_eligible)(gscore, gok, n_groups);
                    gok[q] = 0;
                    for (rd_int e = q * per_group; e < (q + 1) * per_group; e++)
                        keep[e] = 1;
                }
            }
            long long *idx = topk_idx + t * top_k;
            RD_T *w = topk_w + t * top_k;
            RD_T wsum = 0;
            for (rd_int j = 0; j < top_k; j++) {
                rd_int e = RD_FN(argmax_eligible)(sel, ok, E);
                ok[e] = 0;
                idx[j] = e;
                w[j] = sc[e];
                wsum += sc[e];
            }
            if (norm_topk_prob) {
                RD_T denom = score_func == RD_SCORE_SIGMOID ? wsum + (RD_T)1e-20 : wsum;
                for (rd_int j = 0; j < top_k; j++)
                    w[j] /= denom;
            }
            for (rd_int j = 0; j < top_k; j++)
                w[j] = (RD_T)(w[j] * scaling);
        }
        free(sel);
        free(gscore);
        free(ok);
        free(gok);
    }
    return failed ? -1 : 0;
}

static void
RD_FN(gather_rows)(rd_int n, rd_int d, const void *x_, rd_int x_rs,
                   const long long *src, const void *scale_, void *out_)
{
    const RD_T *x = (const RD_T *)x_, *scale = (const RD_T *)scale_;
    RD_T *out = (RD_T *)out_;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(rd_get_num_threads()) if (n * d > 65536)
#endif
    for (rd_int i = 0; i < n; i++) {
        const RD_T *row = x + (rd_int)src[i] * x_rs;
        RD_T *o = out + i * d;
        if (scale) {
            const RD_T s = scale[i];
            for (rd_int c = 0; c < d; c++)
                o[c] = s * row[c];
        }
        else {
            memcpy(o, row, sizeof(RD_T) * (size_t)d);
        }
    }
}

/* o[c] += w * row[c], c < d: each term of a combine (gather_reduce, and
 * the epilogue of the down product that combines, rd_combine_epilogue),
 * one function so that both round alike. */
static void
RD_FN(add_row)(rd_int d, const void *w_, const void *row_, void *o_)
{
    const RD_T w = *(const RD_T *)w_, *row = (const RD_T *)row_;
    RD_T *o = (RD_T *)o_;
    for (rd_int c = 0; c < d; c++)
        o[c] += w * row[c];
}

static void
RD_FN(gather_reduce)(rd_int T, rd_int k, rd_int d, const void *y_, rd_int y_rs,
                     const long long *slots, const void *w_, void *out_, int ordered)
{
    const RD_T *y = (const RD_T *)y_, *w = (const RD_T *)w_;
    RD_T *out = (RD_T *)out_;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(rd_get_num_threads()) if (T * k * d > 65536)
#endif
    for (rd_int t = 0; t < T; t++) {
        RD_T *o = out + t * d;
        for (rd_int c = 0; c < d; c++)
            o[c] = 0;
        const long long *st = slots + t * k;
        for (rd_int j = rd_combine_next(st, k, ordered, -1); j >= 0; j = rd_combine_next(st, k, ordered, j)) {
            const RD_T wt = w ? w[t * k + j] : (RD_T)1;
            RD_FN(add_row)(d, &wt, y + (rd_int)st[j] * y_rs, o);
        }
    }
}

static inline RD_T
RD_FN(sigmoid)(RD_T x)
{
    return (RD_T)1 / ((RD_T)1 + RD_EXP(-x));
}

#define RD_SQRT1_2 0.70710678118654752440
#define RD_SQRT2_PI 0.79788456080286535588   /* sqrt(2/pi) */
#define RD_INV_SQRT_2PI 0.39894228040143267794

/* gated_act over n <= RD_ACT_CHUNK values: one loop a kind, so that the
 * compiler vectorizes those whose functions are inline (silu, relu,
 * swiglu_oai with rd_expf); cloned for the widest vectors, each clone the
 * same IEEE operations on each element (no contraction), so the same bits. */
static RD_WIDEST_CLONES void
RD_FN(act_chunk)(rd_int n, int kind, RD_T lim, RD_T alp, const RD_T *gate, const RD_T *up, RD_T *out)
{
    switch (kind) {
    case RD_ACT_SILU:
        for (rd_int i = 0; i < n; i++)
            out[i] = gate[i] * RD_FN(sigmoid)(gate[i]) * up[i];
        break;
    case RD_ACT_GELU:
        for (rd_int i = 0; i < n; i++) {
            const RD_T g = gate[i];
            out[i] = (RD_T)0.5 * g * ((RD_T)1 + RD_ERF(g * (RD_T)RD_SQRT1_2)) * up[i];
        }
        break;
    case RD_ACT_GELU_TANH:
        for (rd_int i = 0; i < n; i++) {
            const RD_T g = gate[i];
            const RD_T z = (RD_T)RD_SQRT2_PI * (g + (RD_T)0.044715 * g * g * g);
            out[i] = (RD_T)0.5 * g * ((RD_T)1 + RD_TANH(z)) * up[i];
        }
        break;
    case RD_ACT_RELU:
        for (rd_int i = 0; i < n; i++) {
            const RD_T g = gate[i];
            out[i] = (g > 0 ? g : (g != g ? g : (RD_T)0)) * up[i];
        }
        break;
    default: /* RD_ACT_SWIGLU_OAI */
        for (rd_int i = 0; i < n; i++) {
            const RD_T g = gate[i], u = up[i];
            const RD_T gc = g > lim ? lim : g;
            const RD_T uc = u > lim ? lim : (u < -lim ? -lim : u);
            out[i] = gc * RD_FN(sigmoid)(alp * gc) * (uc + (RD_T)1);
        }
    }
}

static void
RD_FN(gated_act)(rd_int n, int kind, double limit, double alpha, const void *gate_,
                 const void *up_, void *out_)
{
    const RD_T *gate = (const RD_T *)gate_, *up = (const RD_T *)up_;
    RD_T *out = (RD_T *)out_;
    if (n <= RD_ACT_CHUNK) {   /* a row of a fused product's epilogue: no parallel region (each cost a system call) */
        RD_FN(act_chunk)(n, kind, (RD_T)limit, (RD_T)alpha, gate, up, out);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(rd_get_num_threads()) if (n > 65536)
#endif
    for (rd_int c = 0; c < n; c += RD_ACT_CHUNK)
        RD_FN(act_chunk)(n - c < RD_ACT_CHUNK ? n - c : RD_ACT_CHUNK, kind, (RD_T)limit, (RD_T)alpha, gate + c,
                         up + c, out + c);
}

/* gated_act_grad over n <= RD_ACT_CHUNK values (as act_chunk). */
static RD_WIDEST_CLONES void
RD_FN(act_grad_chunk)(rd_int n, int kind, RD_T lim, RD_T alp, const RD_T *gate, const RD_T *up,
                      const RD_T *d_out, RD_T *d_gate, RD_T *d_up)
{
    switch (kind) {
    case RD_ACT_SILU:
        for (rd_int i = 0; i < n; i++) {
            const RD_T g = gate[i], s = RD_FN(sigmoid)(g);
            const RD_T dact = s * ((RD_T)1 + g * ((RD_T)1 - s));
            d_gate[i] = d_out[i] * dact * up[i];
            d_up[i] = d_out[i] * (g * s);
        }
        break;
    case RD_ACT_GELU:
        for (rd_int i = 0; i < n; i++) {
            const RD_T g = gate[i];
            const RD_T cdf = (RD_T)0.5 * ((RD_T)1 + RD_ERF(g * (RD_T)RD_SQRT1_2));
            const RD_T dact = cdf + g * (RD_T)RD_INV_SQRT_2PI * RD_EXP((RD_T)-0.5 * g * g);
            d_gate[i] = d_out[i] * dact * up[i];
            d_up[i] = d_out[i] * (g * cdf);
        }
        break;
    case RD_ACT_GELU_TANH:
        for (rd_int i = 0; i < n; i++) {
            const RD_T g = gate[i];
            const RD_T z = (RD_T)RD_SQRT2_PI * (g + (RD_T)0.044715 * g * g * g);
            const RD_T th = RD_TANH(z);
            const RD_T act = (RD_T)0.5 * g * ((RD_T)1 + th);
            const RD_T dact = (RD_T)0.5 * ((RD_T)1 + th)
                              + (RD_T)0.5 * g * ((RD_T)1 - th * th) * (RD_T)RD_SQRT2_PI
                                * ((RD_T)1 + (RD_T)3 * (RD_T)0.044715 * g * g);
            d_gate[i] = d_out[i] * dact * up[i];
            d_up[i] = d_out[i] * act;
        }
        break;
    case RD_ACT_RELU:
        for (rd_int i = 0; i < n; i++) {
            const RD_T g = gate[i];
            const RD_T act = g > 0 ? g : (g != g ? g : (RD_T)0);
            const RD_T dact = g > 0 ? (RD_T)1 : (g != g ? g : (RD_T)0);
            d_gate[i] = d_out[i] * dact * up[i];
            d_up[i] = d_out[i] * act;
        }
        break;
    default: /* RD_ACT_SWIGLU_OAI: clip passes the gradient inside the limits */
        for (rd_int i = 0; i < n; i++) {
            const RD_T g = gate[i], u = up[i], dy = d_out[i];
            const RD_T gc = g > lim ? lim : g;
            const RD_T uc = u > lim ? lim : (u < -lim ? -lim : u);
            const RD_T s = RD_FN(sigmoid)(alp * gc);
            const RD_T glu = gc * s;
            const RD_T dglu = g > lim ? (RD_T)0 : s * ((RD_T)1 + alp * gc * ((RD_T)1 - s));
            d_gate[i] = dy * dglu * (uc + (RD_T)1);
            d_up[i] = (u > lim || u < -lim) ? (RD_T)0 : dy * glu;
        }
    }
}

static void
RD_FN(gated_act_grad)(rd_int n, int kind, double limit, double alpha, const void *gate_,
                      const void *up_, const void *d_out_, void *d_gate_, void *d_up_)
{
    const RD_T *gate = (const RD_T *)gate_, *up = (const RD_T *)up_;
    const RD_T *d_out = (const RD_T *)d_out_;
    RD_T *d_gate = (RD_T *)d_gate_, *d_up = (RD_T *)d_up_;
    if (n <= RD_ACT_CHUNK) {   /* as gated_act */
        RD_FN(act_grad_chunk)(n, kind, (RD_T)limit, (RD_T)alpha, gate, up, d_out, d_gate, d_up);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(rd_get_num_threads()) if (n > 65536)
#endif
    for (rd_int c = 0; c < n; c += RD_ACT_CHUNK)
        RD_FN(act_grad_chunk)(n - c < RD_ACT_CHUNK ? n - c : RD_ACT_CHUNK, kind, (RD_T)limit, (RD_T)alpha,
                              gate + c, up + c, d_out + c, d_gate + c, d_up + c);
}
