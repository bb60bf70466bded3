/*
 * raggeddot kernel library: the contract shared by the micro-kernels, the
 * packing routines and the drivers.  Nothing here includes Python.h; the
 * binding (rd_module.c) is the only file that talks to CPython.
 *
 * Conventions
 *   - Sizes, offsets and strides are rd_int (ptrdiff_t, 64-bit on the
 *     platforms we build for).  Strides are in elements, not bytes.
 *   - A matrix X with strides (rs, cs) holds X[i][j] at x[i*rs + j*cs].
 *   - Kernels take already-validated arguments and never check them.
 */
#ifndef RD_KERNEL_H
#define RD_KERNEL_H

#include <stddef.h>

typedef ptrdiff_t rd_int;

/* Alignment of the packing buffers, in bytes. */
#define RD_ALIGN 64

/*
 * Micro-kernel contract (BLIS style).  A kernel has a fixed register block
 * of MR x NR (its configuration below says which).
 *
 *   a : packed A micro-panel, MR x kc, column after column:  A[i][p] = a[p*MR + i]
 *   b : packed B micro-panel, kc x NR, row after row:         B[p][j] = b[p*NR + j]
 *   c : the C tile, C[i][j] = c[i*rs_c + j*cs_c], of which only the leading
 *       m x n corner (m <= MR, n <= NR) is valid and may be touched.
 *
 *   accumulate == RD_STORE  :  C  = A B
 *   accumulate == RD_ADD    :  C += A B
 *   accumulate == RD_STREAM :  C  = A B with non-temporal stores, which
 *       write whole cache lines to memory without first reading them in
 *       (for large outputs that are written once and not read back soon).
 *       Only full tiles whose rows are 64-byte aligned are streamed; a
 *       kernel treats any other tile, or the whole flag if it has no such
 *       stores, as RD_STORE.  The caller fences (rd_store_fence) before
 *       another thread reads the results.
 *
 * The product is accumulated in registers in the order p = 0, 1, ..., kc-1
 * (one fused or unfused multiply-add per step) starting from zero, and is
 * added to C once at the end.  Padding rows/columns of the panels are zero.
 */
enum { RD_STORE = 0, RD_ADD = 1, RD_STREAM = 2 };

/* Order the non-temporal stores of this thread before its later stores
 * (a no-op where the kernels have none). */
static inline void
rd_store_fence(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__SSE__))
    __builtin_ia32_sfence();
#endif
}

/* Whether a C tile with rows of `row_bytes` apart starting at c can take
 * 64-byte non-temporal stores. */
static inline int
rd_stream_aligned(const void *c, rd_int row_bytes)
{
    return (((size_t)c | (size_t)row_bytes) & 63) == 0;
}
typedef void (*rd_sgemm_ukr_t)(rd_int kc, const float *a, const float *b,
                               float *c, rd_int rs_c, rd_int cs_c,
                               int m, int n, int accumulate);
typedef void (*rd_dgemm_ukr_t)(rd_int kc, const double *a, const double *b,
                               double *c, rd_int rs_c, rd_int cs_c,
                               int m, int n, int accumulate);

/* The edge path shared by every micro-kernel: write (or add) the valid
 * m x n corner of a register tile spilled to buf (row stride ldb) into C. */
#define RD_DEFINE_STORE_EDGE(NAME, T)                                        \
static inline void NAME(const T *buf, int ldb, T *c, rd_int rs_c,           \
                        rd_int cs_c, int m, int n, int accumulate)          \
{                                                                           \
    for (int i = 0; i < m; i++) {                                           \
        T *ci = c + i * rs_c;                                               \
        const T *bi = buf + i * ldb;                                        \
        if (accumulate == RD_ADD)                                           \
            for (int j = 0; j < n; j++)                                     \
                ci[j * cs_c] += bi[j];                                      \
        else                                                                \
            for (int j = 0; j < n; j++)                                     \
                ci[j * cs_c] = bi[j];                                       \
    }                                                                       \
}
RD_DEFINE_STORE_EDGE(rd_s_store_edge, float)
RD_DEFINE_STORE_EDGE(rd_d_store_edge, double)

/* Portable reference micro-kernels (rd_ukernel_ref.c). */
void rd_sgemm_ref_6x16(rd_int kc, const float *a, const float *b, float *c,
                       rd_int rs_c, rd_int cs_c, int m, int n, int accumulate);
void rd_dgemm_ref_6x8(rd_int kc, const double *a, const double *b, double *c,
                      rd_int rs_c, rd_int cs_c, int m, int n, int accumulate);

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define RD_HAVE_X86_KERNELS 1
/* AVX2/FMA micro-kernels (rd_ukernel_avx2.c). */
void rd_sgemm_avx2_6x16(rd_int kc, const float *a, const float *b, float *c,
                        rd_int rs_c, rd_int cs_c, int m, int n, int accumulate);
void rd_dgemm_avx2_6x8(rd_int kc, const double *a, const double *b, double *c,
                       rd_int rs_c, rd_int cs_c, int m, int n, int accumulate);
/* AVX-512F micro-kernels (rd_ukernel_avx512.c). */
void rd_sgemm_avx512_12x32(rd_int kc, const float *a, const float *b, float *c,
                           rd_int rs_c, rd_int cs_c, int m, int n, int accumulate);
void rd_dgemm_avx512_12x16(rd_int kc, const double *a, const double *b, double *c,
                           rd_int rs_c, rd_int cs_c, int m, int n, int accumulate);
/* Sustained FMA throughput of one thread, GFLOP/s, measured for ~seconds
 * with 256-bit (avx2) or 512-bit (avx512) float32 FMAs. */
double rd_fma_peak_avx2(double seconds);
double rd_fma_peak_avx512(double seconds);
#endif

/* A micro-kernel with its register block and cache blocking:
 * MC x KC block of A (L2), KC x NC panel of B (L3), KC x NR micro-panel (L1). */
typedef struct {
    rd_sgemm_ukr_t ukr;
    int mr, nr;
    rd_int mc, kc, nc;
} rd_sconfig_t;

typedef struct {
    rd_dgemm_ukr_t ukr;
    int mr, nr;
    rd_int mc, kc, nc;
} rd_dconfig_t;

/* The kernel configuration in force (rd_context.c). */
typedef struct {
    const char *name;          /* "ref", "avx2" or "avx512" */
    rd_sconfig_t s;
    rd_dconfig_t d;
} rd_context_t;

const rd_context_t *rd_context(void);
/* Select a kernel by name ("ref", "avx2", "avx512", "auto").  Returns 0 on
 * success, -1 for an unknown name, -2 when the CPU cannot run it. */
int rd_set_kernel(const char *name);
/* Change the cache blocking of the kernel in force (dtype_bytes 4 or 8);
 * MC and NC are rounded up to multiples of MR and NR.  For tuning. */
int rd_set_blocking(int dtype_bytes, rd_int mc, rd_int kc, rd_int nc);
/* Outputs of at least this many bytes that a call writes once (no
 * accumulation, the whole contraction in one KC block) are written with
 * non-temporal stores; smaller ones stay in cache for their reader.
 * Negative: never.  Default RD_STREAM_MIN_BYTES; settable for tuning and
 * for testing that path on small problems. */
#define RD_STREAM_MIN_BYTES ((rd_int)32 << 20)
rd_int rd_get_stream_min_bytes(void);
void rd_set_stream_min_bytes(rd_int bytes);
/* Names of the kernels compiled into this build, NULL-terminated. */
const char *const *rd_compiled_kernels(void);
int rd_cpu_has_avx2(void);
int rd_cpu_has_avx512(void);

/* Threads. */
int rd_get_num_threads(void);
void rd_set_num_threads(int n);
int rd_have_openmp(void);

/* ------------------------------------------------------------------ drivers
 *
 * Ragged rows (the forward of ragged_dot, megablox gmm):
 *   for each local group g in [0, ng):  rows r in [bounds[g], bounds[g+1])
 *     out[r, :] (+)= lhs[r, :] @ rhs[g]          lhs [m, k], rhs [ng, k, n]
 *   Rows outside [bounds[0], bounds[ng]) are not touched.
 *
 * Ragged contraction (d_rhs, megablox tgmm):
 *   for each group g in [0, ng):  rows r in [bounds[g], bounds[g+1])
 *     out[g] (+)= lhs[:, rows] @ rhs[rows, :]    lhs [k, m], rhs [m, n], out [ng, k, n]
 *   An empty group gives out[g] = 0 (or leaves it unchanged when accumulating).
 *
 * Each output element is reduced in a fixed order: blocks of KC along the
 * contraction (ascending), each block summed in registers in ascending order
 * and then added to the output.  The order depends on KC alone, never on the
 * thread count or the schedule, so results are bitwise reproducible.
 *
 * Returns 0, or -1 when a packing buffer could not be allocated.
 */
int rd_sgemm_ragged_rows(rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
                         const float *lhs, rd_int lhs_rs, rd_int lhs_cs,
                         const float *rhs, rd_int rhs_gs, rd_int rhs_rs, rd_int rhs_cs,
                         float *out, rd_int out_rs, rd_int out_cs, int accumulate);
int rd_dgemm_ragged_rows(rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
                         const double *lhs, rd_int lhs_rs, rd_int lhs_cs,
                         const double *rhs, rd_int rhs_gs, rd_int rhs_rs, rd_int rhs_cs,
                         double *out, rd_int out_rs, rd_int out_cs, int accumulate);
int rd_sgemm_ragged_contract(rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
                             const float *lhs, rd_int lhs_rs, rd_int lhs_cs,
                             const float *rhs, rd_int rhs_rs, rd_int rhs_cs,
                             float *out, rd_int out_gs, rd_int out_rs, rd_int out_cs,
                             int accumulate);
int rd_dgemm_ragged_contract(rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
                             const double *lhs, rd_int lhs_rs, rd_int lhs_cs,
                             const double *rhs, rd_int rhs_rs, rd_int rhs_cs,
                             double *out, rd_int out_gs, rd_int out_rs, rd_int out_cs,
                             int accumulate);

/* ----------------------------------------------------------- result buffers
 * (rd_pool.c; callers hold the GIL.)  rd_buffer_take returns a block of at
 * least `bytes` (its real size in *got), 64-byte aligned, 2 MiB aligned
 * from 4 MiB on; NULL when out of memory.  rd_buffer_give takes it back:
 * blocks of 4 MiB or more are kept idle for reuse while the idle total
 * stays under the limit, the oldest dropped first.  rd_buffer_cache_limit
 * sets the limit (SIZE_MAX: leave it) and returns the previous one. */
#define RD_BUFFER_CACHE_DEFAULT ((size_t)2 << 30)
void *rd_buffer_take(size_t bytes, size_t *got);
void rd_buffer_give(void *p, size_t bytes);
size_t rd_buffer_cache_limit(size_t limit);
size_t rd_buffer_cache_idle(void);

/* ------------------------------------------------------------ tile metadata
 * megablox make_group_metadata.  group_sizes [ng] (non-negative, validated),
 * m % tm == 0.  Outputs: group_offsets [ng+1], group_ids and m_tile_ids
 * [m/tm + ng - 1], all int32; returns num_tiles, or -1 when out of memory. */
long long rd_make_group_metadata(const rd_int *group_sizes, rd_int ng, rd_int m,
                                 rd_int tm, rd_int start_group,
                                 rd_int num_nonzero_groups, int visit_empty_groups,
                                 int *group_offsets, int *group_ids,
                                 int *m_tile_ids);


/* ------------------------------------------------------------------- MoE
 * The pieces of a Mixture-of-Experts layer around the grouped matmuls
 * (rd_moe.c).  Arrays are C-contiguous unless a row stride is given.
 */
enum { RD_SCORE_SOFTMAX = 0, RD_SCORE_SIGMOID = 1 };
enum { RD_ACT_SILU = 0, RD_ACT_GELU = 1, RD_ACT_GELU_TANH = 2, RD_ACT_RELU = 3,
       RD_ACT_SWIGLU_OAI = 4 };

/* Router: scores = softmax/sigmoid(logits [T, E]); selection = scores
 * (+ selection_bias [E]); with n_groups > 1 only the topk_groups groups of
 * E/n_groups experts whose two best selection values sum highest stay
 * eligible; the top_k eligible experts by selection (ties to the lower
 * index) are chosen; weights are their scores, divided by their sum when
 * norm_topk_prob (+1e-20 for sigmoid), times scaling.
 * Outputs: scores [T, E], topk_idx [T, top_k] (int64), topk_w [T, top_k].
 * Returns 0, or -1 when out of memory. */
int rd_s_moe_route(rd_int T, rd_int E, const float *logits, int score_func,
                   const float *selection_bias, rd_int n_groups, rd_int topk_groups,
                   rd_int top_k, int norm_topk_prob, double scaling,
                   float *scores, long long *topk_idx, float *topk_w);
int rd_d_moe_route(rd_int T, rd_int E, const double *logits, int score_func,
                   const double *selection_bias, rd_int n_groups, rd_int topk_groups,
                   rd_int top_k, int norm_topk_prob, double scaling,
                   double *scores, long long *topk_idx, double *topk_w);

/* Counting sort of the T*k assignments (token-major, then choice order) by
 * expert, stable.  capacity < 0: keep all; otherwise an expert keeps its
 * first `capacity` assignments in that order.  Outputs: slot_of [T*k] (the
 * assignment's position in expert order, or -1 when dropped),
 * token_of_slot [kept], group_sizes [E].  Returns the number kept, or -1
 * when out of memory. */
rd_int rd_moe_sort(rd_int T, rd_int k, rd_int E, const long long *topk_idx,
                   rd_int capacity, long long *slot_of, long long *token_of_slot,
                   long long *group_sizes);

/* ragged_gather: out[i, :] = x[src[i], :] (times scale[i] when given).
 * x rows have stride x_rs; out is [n, d] contiguous. */
void rd_s_gather_rows(rd_int n, rd_int d, const float *x, rd_int x_rs,
                      const long long *src, const float *scale, float *out);
void rd_d_gather_rows(rd_int n, rd_int d, const double *x, rd_int x_rs,
                      const long long *src, const double *scale, double *out);

/* ragged_gather_reduce: out[t, :] = sum_j w[t, j] * y[slots[t, j], :] for
 * j = 0..k-1 in that order (w == NULL: weight 1; slot -1: skipped).
 * Deterministic whatever the thread count: one thread owns a token. */
void rd_s_gather_reduce(rd_int T, rd_int k, rd_int d, const float *y, rd_int y_rs,
                        const long long *slots, const float *w, float *out);
void rd_d_gather_reduce(rd_int T, rd_int k, rd_int d, const double *y, rd_int y_rs,
                        const long long *slots, const double *w, double *out);

/* Gated activations, elementwise over n contiguous values:
 *   out = act(gate) * up              (silu, gelu, gelu_tanh, relu)
 *   out = g * sigmoid(1.702 g) * (u + 1),  g = min(gate, limit),
 *         u = clip(up, -limit, limit)  (swiglu_oai)
 * and the backward: d_gate, d_up from d_out. */
void rd_s_gated_act(rd_int n, int kind, double limit, const float *gate,
                    const float *up, float *out);
void rd_d_gated_act(rd_int n, int kind, double limit, const double *gate,
                    const double *up, double *out);
void rd_s_gated_act_grad(rd_int n, int kind, double limit, const float *gate,
                         const float *up, const float *d_out, float *d_gate, float *d_up);
void rd_d_gated_act_grad(rd_int n, int kind, double limit, const double *gate,
                         const double *up, const double *d_out, double *d_gate, double *d_up);

#endif /* RD_KERNEL_H */
