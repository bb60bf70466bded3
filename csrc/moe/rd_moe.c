/*
 * The pieces of a Mixture-of-Experts layer around its grouped matmuls:
 * routing (scores, group-limited top-k), the counting sort of assignments
 * by expert, dispatch and combine as row gathers, and gated activations.
 */
#include "moe/rd_moe.h"

#include <math.h>
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

#define RD_T float
#define RD_FN(x) rd_s_##x
#define RD_EXP expf
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
    [RD_CT_F32] = {rd_s_moe_route, rd_s_gather_rows, rd_s_gather_reduce, rd_s_gated_act,
                   rd_s_gated_act_grad},
    [RD_CT_F64] = {rd_d_moe_route, rd_d_gather_rows, rd_d_gather_reduce, rd_d_gated_act,
                   rd_d_gated_act_grad},
};
