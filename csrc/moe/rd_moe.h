/*
 * The pieces of a Mixture-of-Experts layer around the grouped matmuls
 * (moe/rd_moe.c).  No Python here.
 */
#ifndef RD_MOE_H
#define RD_MOE_H

#include "rd_frame.h"

#include <stdint.h>

/* Arrays are C-contiguous unless a row stride is given. */
enum { RD_SCORE_SOFTMAX = 0, RD_SCORE_SIGMOID = 1 };
/* gpt-oss's default swiglu alpha (config.swiglu_alpha) */
#define RD_SWIGLU_ALPHA 1.702

enum { RD_ACT_SILU = 0, RD_ACT_GELU = 1, RD_ACT_GELU_TANH = 2, RD_ACT_RELU = 3,
       RD_ACT_SWIGLU_OAI = 4 };

/*
 * Per compute type (float32, float64), the pieces that take float arrays.
 * Their pointers are to elements of that type.
 *
 * route: scores = softmax/sigmoid(logits [T, E]); selection = scores
 *   (+ selection_bias [E]); with n_groups > 1 only the topk_groups groups of
 *   E/n_groups experts whose two best selection values sum highest stay
 *   eligible; the top_k eligible experts by selection (ties to the lower
 *   index) are chosen; weights are their scores, divided by their sum when
 *   norm_topk_prob (+1e-20 for sigmoid), times scaling.
 *   Outputs: scores [T, E], topk_idx [T, top_k] (int64), topk_w [T, top_k].
 *   Returns 0, or -1 when out of memory.
 *
 * gather_rows (ragged_gather): out[i, :] = x[src[i], :] (times scale[i]
 *   when given).  x rows have stride x_rs; out is [n, d] contiguous.
 *
 * gather_reduce (ragged_gather_reduce): out[t, :] = sum_j w[t, j] *
 *   y[slots[t, j], :] for j = 0..k-1 in that order, or (ordered) in the
 *   order of the slots (w == NULL: weight 1; slot -1: skipped).
 *   Deterministic whatever the thread count: one thread owns a token.
 *   add_row: o[c] += w * row[c] for c < d (w one element), each term of
 *   gather_reduce.
 *
 * gated_act, elementwise over n contiguous values:
 *   out = act(gate) * up              (silu, gelu, gelu_tanh, relu)
 *   out = g * sigmoid(alpha g) * (u + 1),  g = min(gate, limit),
 *         u = clip(up, -limit, limit)  (swiglu_oai; gpt-oss: alpha = 1.702;
 *         limit and alpha are ignored by the other activations)
 * gated_act_grad: d_gate, d_up from d_out.
 */
typedef struct {
    int (*route)(rd_int T, rd_int E, const void *logits, int score_func,
                 const void *selection_bias, rd_int n_groups, rd_int topk_groups,
                 rd_int top_k, int norm_topk_prob, double scaling,
                 void *scores, long long *topk_idx, void *topk_w);
    void (*gather_rows)(rd_int n, rd_int d, const void *x, rd_int x_rs,
                        const long long *src, const void *scale, void *out);
    void (*gather_reduce)(rd_int T, rd_int k, rd_int d, const void *y, rd_int y_rs,
                          const long long *slots, const void *w, void *out, int ordered);
    void (*add_row)(rd_int d, const void *w, const void *row, void *o);
    void (*gated_act)(rd_int n, int kind, double limit, double alpha, const void *gate,
                      const void *up, void *out);
    void (*gated_act_grad)(rd_int n, int kind, double limit, double alpha, const void *gate,
                           const void *up, const void *d_out, void *d_gate, void *d_up);
} rd_moe_ops_t;

extern const rd_moe_ops_t rd_moe_ops[RD_CT_COUNT];

/* The term of a token's sum that follows the one at position j of its k
 * slots (j = -1: the first): the next kept one in order, or (ordered) the
 * kept slot least above slots[j] (a token's slots are distinct); -1 when
 * none is left. */
static inline rd_int
rd_combine_next(const long long *slots, rd_int k, int ordered, rd_int j)
{
    if (!ordered) {
        for (j++; j < k; j++)
            if (slots[j] >= 0)
                return j;
        return -1;
    }
    const long long after = j >= 0 ? slots[j] : -1;
    rd_int best = -1;
    for (rd_int i = 0; i < k; i++)
        if (slots[i] > after && (best < 0 || slots[i] < slots[best]))
            best = i;
    return best;
}

/* out[t, j] = <a[t], rows[slots[t, j]]> (0 where the slot is -1), for
 * a [T, d] and rows [n, d] of dtypes da, dr (float32, float64, float16,
 * bfloat16; rows a_rs, r_rs elements apart), out [T, k] float64 when
 * either is float64, else float32: each product exact in double, summed
 * in double in order, rounded once (the router's gradient in an MoE
 * layer's backward; 16-bit rows widened exactly). */
void rd_slot_dots(rd_int T, rd_int k, rd_int d, const void *a, rd_int a_rs, rd_dtype_t da, const void *rows,
                  rd_int r_rs, rd_dtype_t dr, const long long *slots, void *out);

/* gather_reduce of 16-bit rows y (dtype dt) into float32 out: each row
 * widened, then the float32 terms (add_row), so the sums are those of the
 * float32 gather_reduce on the widened rows. */
void rd_gather_reduce_half(rd_int T, rd_int k, rd_int d, const uint16_t *y, rd_int y_rs, rd_dtype_t dt,
                           const long long *slots, const float *w, float *out, int ordered);

/* The down product that combines (rd_gated_rows, ordered, one weight;
 * rd_combine_epilogue its epilogue): per row r of the product (a slot of
 * the layer: expert outputs sorted by expert) and column c < n, with y the
 * product of the compute type ct (RD_CT_F64 or float32 tiles):
 *   y += bias[g]           (when given: [ng, n] of ct, rows b_rs apart)
 *   y rounded to dt (the hidden dtype) and back;
 *   out[tokens[r], c] += w[r] * y   (add_row; w NULL: weight 1)
 * out [T, n] of ct, rows out_rs elements apart, holding its old values.
 * The rows reach it in order for each column (ordered), so that each
 * output element sums its slots in slot order: the values of the separate
 * product (rounded to dt) and gather_reduce ordered, bit for bit. */
typedef struct {
    rd_ctype_t ct;
    rd_dtype_t dt;
    const void *bias;
    rd_int b_rs;
    const long long *tokens;
    const void *w;
    void *out;
    rd_int out_rs;
} rd_combine_t;
void rd_combine_epilogue(void *ctx, rd_int g, rd_int r0, rd_int c0, rd_int rows, rd_int cols, void *t0,
                         void *t1, rd_int ld);

/* Counting sort of the T*k assignments (token-major, then choice order) by
 * expert, stable.  capacity < 0: keep all; otherwise an expert keeps its
 * first `capacity` assignments in that order.  Outputs: slot_of [T*k] (the
 * assignment's position in expert order, or -1 when dropped),
 * token_of_slot [kept], group_sizes [E].  Returns the number kept, or -1
 * when out of memory. */
rd_int rd_moe_sort(rd_int T, rd_int k, rd_int E, const long long *topk_idx,
                   rd_int capacity, long long *slot_of, long long *token_of_slot,
                   long long *group_sizes);

/* The fused gate and up products' outputs (rd_gated_rows' epilogue,
 * rd_gated_epilogue its rd_gated_epi_t): per row r of the product (the
 * rows of its lhs) and column c < n, with h0, h1 the two products of the
 * compute type ct (RD_CT_F64 for a float64 layer, else float32 tiles):
 *   h0 += b0[g], h1 += b1[g]   (when given: [ng, n] of the compute type,
 *                               rows b_rs elements apart)
 *   h0, h1 rounded to dt (the hidden dtype: float32, float64, bfloat16 or
 *   float16) and written to h0_out, h1_out when given;
 *   a = gated_act(h0, h1) (of the rounded values) rounded to dt into a.
 * The outputs are [rows, n] of dt, rows rs elements apart.  Tiles are at
 * most RD_GATED_MAX_COLS wide (rd_gated_rows' tiles are). */
#define RD_GATED_MAX_COLS 4096
typedef struct {
    rd_ctype_t ct;
    rd_dtype_t dt;
    int kind;
    double limit, alpha;
    const void *b0, *b1;
    rd_int b_rs;
    void *a, *h0, *h1;
    rd_int rs;
} rd_gated_out_t;
void rd_gated_epilogue(void *ctx, rd_int g, rd_int r0, rd_int c0, rd_int rows, rd_int cols, void *t0,
                       void *t1, rd_int ld);

/* The backward's fused first product (rd_gated_grad_epilogue): d_a of the
 * compute type ct from the product, rounded to dt; h0, h1 (read) [rows, n]
 * of dt, rows rs elements apart; dh0, dh1 (written) likewise, rows d_rs
 * apart. */
typedef struct {
    rd_ctype_t ct;
    rd_dtype_t dt;
    int kind;
    double limit, alpha;
    const void *h0, *h1;
    void *dh0, *dh1;
    rd_int rs, d_rs;
} rd_gated_grad_t;
void rd_gated_grad_epilogue(void *ctx, rd_int g, rd_int r0, rd_int c0, rd_int rows, rd_int cols, void *t0,
                            void *t1, rd_int ld);

#endif /* RD_MOE_H */
