/*
 * The framework around the micro-kernels: per-call plans, the runtime
 * settings they are made from, packing, the grouped GEMM drivers, result
 * buffers and megablox's tile metadata.  No Python here.
 */
#ifndef RD_FRAME_H
#define RD_FRAME_H

#include "rd_kernel.h"

/* ------------------------------------------------------------------ plans
 *
 * Everything one call needs to know about how to run, fixed when the call
 * starts (the binding makes it while it holds the GIL): later changes of
 * the runtime settings never reach a call in flight.
 */
/* RD_KIND_VECTOR (a tile type's plan only): the product runs on the
 * vector kernels that serve the tile type's products without tiles (the
 * dot type reading the same B layout where served, else the widening
 * float32 kernels): for few rows a group, where a 16-row tile is mostly
 * padding, a tuned plan may find them faster. */
enum { RD_KIND_MAIN = 0, RD_KIND_STREAM = 1, RD_KIND_VECTOR = 2 };
enum { RD_SPLIT_M = 0, RD_SPLIT_N = 1 };

typedef struct {
    rd_ctype_t ct;          /* compute type */
    const char *family;     /* name of the family the micro-kernel comes from */
    rd_ukr_desc_t k;        /* micro-kernel, register block, cache blocking */
    rd_sukr_desc_t s;       /* the family's streaming kernel for ct (ukr NULL: none) */
    rd_fukr_desc_t few;     /* the family's few-row kernel for ct (ukr NULL: none),
                               used on prepacked B where it gives k.ukr's results */
    int kind;               /* RD_KIND_STREAM: B read in place by s (k then
                               has s's register block), RD_KIND_MAIN: packed */
    int split;              /* the tile side halved first to make work for
                               the threads: RD_SPLIT_M rows, RD_SPLIT_N columns */
    rd_int tm, tn;          /* largest tile (rows, columns); 0: from the blocking */
    int nthreads;           /* threads of the call (at most) */
    int auto_threads;       /* 1: one thread for a product too small to pay
                               for a team (RD_TEAM_MIN_*) */
    int team;               /* 1: groups of more than max(threads, 4) x MC
                               rows are run by all threads together, sharing
                               their packed B panels (frame/rd_tiling.c) */
    rd_int stream_min;      /* outputs of >= this many bytes written once are
                               streamed; negative: never */
    /* a tile type's vector alternative (RD_KIND_VECTOR), fixed with the
     * rest of the plan: its compute type, family and kernel (ukr NULL:
     * none) */
    rd_ctype_t alt_ct;
    const char *alt_family;
    rd_ukr_desc_t alt_k;
} rd_plan_t;

/* Fill `plan` for compute type `ct` from the runtime settings. */
void rd_plan_init(rd_plan_t *plan, rd_ctype_t ct);

/* ------------------------------------------------------- per-call plans
 * (frame/rd_plan.c)  The shape class of a grouped product: its mode, the
 * compute type and kernel family, k (ragged contraction: the output's
 * rows), n, the number of groups, the bucket of the group sizes (the bit
 * length of the mean rows of the non-empty groups; ragged contraction: of
 * their mean depth) and the threads asked for.  Every call looks its class
 * up in a table of plans (set by raggeddot.tune, or loaded from its cache);
 * a class without an entry gets the default plan below.  The table is
 * written under the GIL and read by calls in flight: a lock guards it. */
typedef struct {
    int mode;               /* 0: ragged rows, 1: ragged contraction */
    rd_ctype_t ct;
    const char *family;     /* a family's own name (rd_families) */
    rd_int k, n, g;
    int bucket, threads;
} rd_pclass_t;

/* A plan's choices: 0 in mc/kc/nc/tm/tn keeps the kernel's value, threads
 * 0 is automatic (the call's threads, one for a small product). */
typedef struct {
    int kind, split;
    rd_int mc, kc, nc, tm, tn;
    int threads;
    int team;               /* rd_plan_t.team */
} rd_pchoice_t;

/* A product of fewer FLOPs than this and of fewer operand bytes than that
 * runs on one thread when its threads are automatic: waking a team costs
 * microseconds on an idle machine, and a timeslice (milliseconds) when
 * another process holds a core the team needs. */
#define RD_TEAM_MIN_FLOPS 4.0e6
#define RD_TEAM_MIN_BYTES ((double)(1 << 20))

/* The class of a call. */
void rd_plan_class(rd_pclass_t *c, const rd_plan_t *plan, int mode, rd_int k, rd_int n,
                   rd_int ng, const rd_int *bounds);
/* The default choices for a class, from the kernel k of its family and
 * its streaming kernel s (NULL: none). */
void rd_plan_default(const rd_pclass_t *c, const rd_ukr_desc_t *k, const rd_sukr_desc_t *s,
                     rd_pchoice_t *out);
/* Up to `most` candidate choices worth timing for a class, the default
 * first; returns how many. */
int rd_plan_candidates(const rd_pclass_t *c, const rd_ukr_desc_t *k, const rd_sukr_desc_t *s,
                       rd_pchoice_t *out, int most);
/* The table: set (choice NULL: remove) returns 0, or -1 when full; get
 * returns 1 with *out filled, 0 without an entry; entry i of the table
 * (i < rd_plan_count()), 0 past its end. */
int rd_plan_set(const rd_pclass_t *c, const rd_pchoice_t *choice);
int rd_plan_get(const rd_pclass_t *c, rd_pchoice_t *out);
int rd_plan_count(void);
int rd_plan_entry(int i, rd_pclass_t *c, rd_pchoice_t *out);
void rd_plan_clear(void);
/* Recording: on (clears the log) or off; the classes logged since it was
 * turned on, in first-seen order (at most RD_PLAN_LOG). */
#define RD_PLAN_LOG 256
void rd_plan_record(int on);
int rd_plan_recorded(rd_pclass_t *out, int most);
/* Make the call's plan: the class's table entry or default, applied to
 * `plan` (which the binding made from the runtime settings).  Prepacked
 * weights keep the blocking they were laid out with; B is streamed only
 * where the call allows it (`streamable`: float32 rows of unit stride). */
void rd_plan_choose(rd_plan_t *plan, int mode, rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
                    int prepacked, int streamable);
/* The family of that name, or NULL. */
const rd_family_t *rd_family_named(const char *name);

/* ------------------------------------------------------------------ AMX
 * (kernels/rd_amx.c)  NULL where the "amx" family runs here (the CPU has
 * AMX and the OS granted this process its tile state), else why not.  The
 * twin's tile state: the threads holding a configuration now and the tile
 * operations run without one, since the process started (0 and 0 between
 * calls: every thread releases its tiles when its share of a call ends). */
const char *rd_amx_unavailable(void);
void rd_amx_twin_state(int *held, long *strays);
/* For tests only (never called by the library): probe again as if the OS
 * refused the permission request with `err` (0: ask the OS again), so that
 * the refused paths run on a machine that grants it.  Not thread-safe:
 * call it while no product runs. */
void rd_amx_simulate_refusal(int err);

/* --------------------------------------------------------------- runtime
 * (frame/rd_runtime.c)  Process-wide settings the plans are made from. */

/* Select a family by name, or "auto" for the best this CPU runs.  A family
 * without a kernel for some compute type leaves that type to the best
 * runnable family that has one.  Resets the blocking to the defaults.
 * Returns 0, -1 for an unknown name, -2 when the CPU cannot run it. */
int rd_set_kernel(const char *name);
/* Name of the selected family ("auto" picks resolve to a family's name). */
const char *rd_get_kernel(void);
/* What was asked for: a family's name, or "auto" (what rd_set_kernel takes back). */
const char *rd_kernel_selection(void);
/* The name of the family serving compute type ct now ("none": a
 * dot-product type no family here serves). */
const char *rd_kernel_for(rd_ctype_t ct);
/* The micro-kernel in force for a compute type (never NULL; its ukr is
 * NULL only for a dot-product type that no family serves now). */
const rd_ukr_desc_t *rd_active_kernel(rd_ctype_t ct, const char **family);
/* A number that changes whenever the selection (rd_set_kernel) or a
 * blocking (rd_set_blocking) changes: what was decided from the selection
 * in force may be kept while it stays the same. */
unsigned long rd_selection_generation(void);
/* Cache blocking of the kernel in force for `ct`; MC and NC are rounded up
 * to multiples of MR and NR.  Returns 0, or -1 for a size below 1 or a
 * type no kernel serves. */
int rd_set_blocking(rd_ctype_t ct, rd_int mc, rd_int kc, rd_int nc);

/* The compute type of a float32 product of two bfloat16 operands (or
 * operands read as bfloat16) with the selection in force: the tile type
 * where served (AMX), else the MMLA type (Arm's BFMMLA), else the bfloat16
 * dot type where served (the MMLA and dot types in automatic selection only
 * where the instruction outruns the float32 FMAs: rd_bf16dot_measured),
 * else RD_CT_F32 (the widening kernels); `exact` (precision HIGHEST):
 * RD_CT_F32 always, exact products summed in float32 without flushing.  Of
 * a float32 product of two int8 operands: the tile type, the MMLA type, the
 * int8 dot type, or RD_CT_I8I32 (the same results, bit for bit, with the
 * same KC).  Of weights prepacked in the B layout of `layout` (RD_CT_BF16DP
 * or RD_CT_U8S8; the MMLA types have layouts of their own): the tile type
 * reading that layout where served, else `layout`. */
rd_ctype_t rd_bf16_product(int exact);
/* The compute type of a product of compute type `base` (RD_CT_F32 or
 * RD_CT_F64, from the output) of operands of storage dtypes a and b, not
 * quantized: rd_bf16_product(exact) for a float32 product of two bfloat16
 * operands (or operands read as bfloat16), else base. */
rd_ctype_t rd_float_product(rd_ctype_t base, rd_dtype_t a, rd_dtype_t b, int quantized, int exact);
rd_ctype_t rd_int8_product(void);
rd_ctype_t rd_layout_product(rd_ctype_t layout);
/* rd_bf16dot_vs_fma, measured once per process (when first needed). */
double rd_bf16dot_measured(void);

/* Outputs of at least this many bytes that a call writes once (no
 * accumulation, the whole contraction in one KC block) are written with
 * non-temporal stores; smaller ones stay in cache for their reader. */
#define RD_STREAM_MIN_BYTES ((rd_int)32 << 20)
rd_int rd_get_stream_min_bytes(void);
void rd_set_stream_min_bytes(rd_int bytes);

/* Threads of the next call: the set count (RAGGEDDOT_NUM_THREADS or
 * OpenMP's default until set), or 1 in a process forked after this one may
 * have run threads (GNU OpenMP's pool does not survive fork). */
int rd_get_num_threads(void);
void rd_set_num_threads(int n);
/* A team of `wanted` threads, as that rule allows; every OpenMP team of
 * more than one thread is sized through it. */
int rd_team_size(int wanted);
int rd_forked_single_threaded(void);
int rd_have_openmp(void);

/* -------------------------------------------------------------- operands */

/* The scales of a quantized operand (qwix's QArray): the operand's element
 * X[g][i][j] stands for (q - z[t]) * s[t], t = (g / tg, i / tr, j / tc) the
 * tile holding it, z = 0 without zero points.  s and z are elements of the
 * compute type's packed type (float, double), at s[t0*gs + t1*rs + t2*cs].
 * s == NULL: the operand is not quantized (a zeroed rd_scales_t). */
typedef struct {
    const void *s, *z;
    rd_int gs, rs, cs;      /* strides between tiles, elements */
    rd_int tg, tr, tc;      /* tile sizes along groups, rows, columns (>= 1) */
} rd_scales_t;

/* A read-only operand: its storage dtype, data and strides (elements).
 * gs is the stride between groups where the operand has a group axis; q
 * its scales when it holds quantized values. */
typedef struct {
    const void *p;
    rd_dtype_t dtype;
    rd_int gs, rs, cs;
    rd_scales_t q;
    rd_int panels;          /* > 0: B laid out by rd_prepack, p its group 0
                             * (gs: bytes between groups), this many NR-wide
                             * panels per KC block */
    rd_int qtile;           /* prepacked quantized B (panels > 0): the depth
                             * along k of its scale tiles; 0: float panels */
    int qzp;                /* prepacked quantized B: with zero points */
    const long long *ridx;  /* NULL, or (rd_gated_rows' lhs, a contraction's
                             * rhs; float operands, not quantized): row i of
                             * the operand is row ridx[i] of the array at p
                             * (rows rs apart), gathered while packed */
    const long long *cidx;  /* NULL, or (a contraction's lhs, as ridx):
                             * column j is column cidx[j] of the array at p */
    const void *rscale;     /* NULL, or (with ridx; a float32 or float64
                             * operand) row i is rscale[i] * row ridx[i],
                             * each element's product rounded to the
                             * operand's dtype (an MoE layer's cotangent
                             * rows times their router weights) */
} rd_in_t;

/* An output: elements of the plan's compute type, or (dtype RD_BF16 or
 * RD_F16, for a float32 compute type) 16-bit ones.  A 16-bit output is
 * computed tile by tile into float32 and rounded once, to nearest even, when
 * its tile is complete (an accumulating call widens the tile's old values
 * first): the values are those of a float32 output narrowed afterwards,
 * without the float32 array. */
typedef struct {
    void *p;
    rd_int gs, rs, cs;
    rd_dtype_t dtype;       /* RD_F32 / RD_F64: the compute type's own */
} rd_out_t;

extern const size_t rd_dtype_size[RD_DTYPE_COUNT];
extern const char *const rd_dtype_names[RD_DTYPE_COUNT];   /* NumPy's names */

/* ---------------------------------------------------------------- packing
 * (frame/rd_pack.c)  pack(rows, depth, src, rs, cs, r, dst) packs the
 * rows x depth block X[i][p] = src[i*rs + p*cs] into r-row micro-panels:
 * panel q holds rows q*r .. q*r+r-1 as dst[q*r*dp + p*r + i], dp = depth
 * rounded up to the compute type's k_unit, padding zero.  Packing A is this
 * with r = MR; packing B is this on B's transpose with r = NR. */
typedef void (*rd_pack_t)(rd_int rows, rd_int depth, const void *src, rd_int rs,
                          rd_int cs, int r, void *dst);
/* The routine that packs A (which = 0) or B (which = 1) operands of storage
 * dtype `src` for compute type `ct`; NULL when there is none. */
rd_pack_t rd_packer(rd_ctype_t ct, rd_dtype_t src, int which);

/* Packing a quantized operand: as rd_pack_t, each value q read as
 * (q - z) * s with the scale and zero point of its tile.  The block's
 * element (i, p) is element (i0 + i, p0 + p) of the operand in the packer's
 * orientation (rows, depth: an operand packed as its transpose has its
 * scales' strides and tiles swapped too), of tile (i0 + i) / tr,
 * (p0 + p) / tp, whose scale is s[tile_row * rs + tile_depth * ps]. */
typedef struct {
    const void *s, *z;      /* tile (0, 0) of the operand (of its group) */
    rd_int rs, ps;          /* strides between tiles along rows, depth */
    rd_int tr, tp;          /* tile sizes along rows, depth */
    rd_int i0, p0;          /* the block's origin in the operand */
} rd_qblock_t;
typedef void (*rd_qpack_t)(rd_int rows, rd_int depth, const void *src, rd_int rs,
                           rd_int cs, int r, void *dst, const rd_qblock_t *qb);
/* The routine that packs quantized A (which = 0) or B (which = 1) operands
 * of storage dtype `src` for compute type `ct`; NULL when there is none. */
rd_qpack_t rd_qpacker(rd_ctype_t ct, rd_dtype_t src, int which);

/* Per-row scales of dynamic int8 quantization of the m x k block
 * X[i][p] = x[i*rs + p*cs] (float32 or bfloat16): out[i] = max_p |X[i][p]|
 * / 127.5 in float32, 1 for a row of zeros (raggeddot.quantize's
 * channelwise rows).  A product of RD_CT_U8S8 whose A is such a float
 * operand with these scales (rd_scales_t of tiles 1 x k) quantizes each
 * value while packing it, q = clip(rint(x / s), -128, 127).  Returns -1 for
 * another dtype. */
int rd_row_scales(const void *x, rd_dtype_t dtype, rd_int m, rd_int k, rd_int rs, rd_int cs, float *out);

/* ---------------------------------------------------------------- drivers
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
 * Quantized operands (q.s != NULL) are dequantized value by value while
 * packed, with the group, row and column of each value in the operand's own
 * indices (absolute rows of lhs in ragged rows mode; absolute contraction
 * rows in ragged contraction mode), so any tiling of the scales works.
 *
 * Returns 0, -1 when a buffer could not be allocated, -2 when the plan's
 * compute type cannot read an operand's storage dtype.
 */
int rd_ragged_rows(const rd_plan_t *plan, rd_int k, rd_int n, rd_int ng,
                   const rd_int *bounds, const rd_in_t *lhs, const rd_in_t *rhs,
                   const rd_out_t *out, int accumulate);
int rd_ragged_contract(const rd_plan_t *plan, rd_int k, rd_int n, rd_int ng,
                       const rd_int *bounds, const rd_in_t *lhs, const rd_in_t *rhs,
                       const rd_out_t *out, int accumulate);

/* Gated rows (the gate and up products of an MoE layer's experts in one
 * pass): for each local group g, rows r in [bounds[g], bounds[g+1]),
 *   t0 = lhs[r] @ w0[g],  t1 = lhs[r] @ w1[g]      (w0, w1 [ng, k, n])
 * computed tile by tile, each packed block of lhs multiplied by both, into
 * two tiles of the compute type's output elements (rows `ld` apart), which
 * epi(ctx, g, r0, c0, rows, cols, t0, t1, ld) receives as each tile
 * completes (tile rows r0.., columns c0.. of the n): it applies the
 * activation and writes the results, so that the products' outputs are
 * never written whole.  The sums are those of rd_ragged_rows with the same
 * plan, bit for bit.  w0 and w1 are of one storage dtype, both prepacked or
 * neither, both quantized or neither; w1 NULL: one product (t1 NULL), the
 * epilogue of a single product (an activation's gradient).  An lhs with a row index (ridx: the
 * dispatch of an MoE layer, slot i reading token ridx[i]) is gathered while
 * packed, with no [rows, k] copy.
 *
 * `ordered`: the tiles of each column reach the epilogue in row order, on
 * one thread: the columns are split between the threads (whole panels,
 * each thread all the rows of its columns, group after group), so that an
 * epilogue that adds rows into shared outputs (an MoE layer's combine,
 * each slot's row added into its token's) adds each column of an output
 * row in the order of the rows, whatever the number of threads, with no
 * two threads adding into one element.  Returns as rd_ragged_rows. */
typedef void (*rd_gated_epi_t)(void *ctx, rd_int g, rd_int r0, rd_int c0, rd_int rows, rd_int cols,
                               void *t0, void *t1, rd_int ld);
int rd_gated_rows(const rd_plan_t *plan, rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
                  const rd_in_t *lhs, const rd_in_t *w0, const rd_in_t *w1, rd_gated_epi_t epi, void *ctx,
                  int ordered);

/* Summed rows (the backward of an MoE layer's gate and up products, whose
 * row gradients add): for each local group g, rows r of it,
 *   t0 = lhs0[r] @ w0[g] + lhs1[r] @ w1[g]      (lhs0, lhs1 [m, k] alike)
 * the second product added into the first's tile as rd_ragged_rows with
 * `accumulate` adds it into the first's output (the same sums in the same
 * order, bit for bit), each finished tile handed to epi (t1 NULL) as
 * rd_gated_rows with `ordered` hands it.  w0 and w1 as rd_gated_rows takes
 * them.  Returns as rd_ragged_rows. */
int rd_summed_rows(const rd_plan_t *plan, rd_int k, rd_int n, rd_int ng, const rd_int *bounds,
                   const rd_in_t *lhs0, const rd_in_t *w0, const rd_in_t *lhs1, const rd_in_t *w1,
                   rd_gated_epi_t epi, void *ctx);

/* ----------------------------------------------------------- prepacking
 * (frame/rd_prepack.c)  Weights laid out once in the micro-kernel's panel
 * order, to be read in place by every later call: rhs [ng, k, n] (strided,
 * any storage dtype the compute type's B packing reads) becomes, per group,
 * the KC blocks of the contraction in order (every block KC deep but the
 * last), each the ceil(n / NR) panels of NR columns that packing B would
 * make (depth rounded up to k_unit, zero padding).
 *
 * Quantized weights (rhs->q.s != NULL: int8 values for RD_CT_F32_I8W,
 * float8_e4m3fn codes for RD_CT_F32_F8W, float32 scales and zero points)
 * keep their bytes; each micro-panel of a block at pc, kc deep, is followed
 * by the trailer of rd_kernel.h: the runs of the block within scale tiles
 * of depth qtile = rhs->q.tr along k (the first run to the next tile
 * boundary, qtile - pc % qtile steps) with the scales (and zero points) of
 * the panel's columns for each run (zeros past n).  The blocks are the KC
 * blocks of the float32 product on the dequantized values, so the sums are
 * the same; a scale tile may end inside a block.
 *
 * rd_prepack_bytes gives the bytes per group (0 when the plan cannot pack
 * that dtype; qtile 0 for float weights, qzp: with zero points);
 * rd_prepack writes group after group at `dst`.  A call reads it with
 * rd_in_t.panels = ceil(n / NR), gs = bytes per group, qtile / qzp as
 * given here, and a plan of the same compute type, NR and KC. */
size_t rd_prepack_bytes(const rd_plan_t *plan, rd_dtype_t dtype, rd_int k, rd_int n,
                        rd_int qtile, int qzp);
int rd_prepack(const rd_plan_t *plan, rd_int ng, rd_int k, rd_int n, const rd_in_t *rhs, void *dst);

/* ----------------------------------------------------------- narrowing
 * (frame/rd_narrow.c)  dst[i] = src[i] rounded to nearest even into dtype
 * RD_BF16 or RD_F16 (NaNs quiet, overflow to infinity); `portable`: the
 * float16 conversion in plain C even where F16C exists (for tests).
 * Returns -1 for another dtype. */
int rd_narrow(const float *src, void *dst, rd_dtype_t dtype, size_t n, int portable);
/* dst[i] = src[i] widened exactly from RD_BF16 (else RD_F16) to float32. */
void rd_widen(const void *src, float *dst, rd_dtype_t dtype, size_t n);

/* ----------------------------------------------------------- result buffers
 * (frame/rd_pool.c; callers hold the GIL.)  rd_buffer_take returns a block
 * of at least `bytes` (its real size in *got), 64-byte aligned, 2 MiB
 * aligned from 4 MiB on; NULL when out of memory.  rd_buffer_give takes it
 * back: blocks of 4 MiB or more are kept idle for reuse while the idle total
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

/* ------------------------------------------------------------ peak probes
 * (probe/rd_peak.c; for the benchmarks' "% of peak", not used by the
 * kernels.)  Sustained throughput of one thread, GFLOP/s, over ~seconds of
 * independent chains of the instruction `isa` names; -1 for an unknown
 * name, 0 when the CPU lacks it. */
double rd_peak_gflops(const char *isa, double seconds);
/* The rate of vdpbf16ps over that of 512-bit float32 FMAs, in flops (one
 * thread, a fraction of a millisecond of each, best of three rounds): 2 on
 * AMD Zen4, 0.5 on Intel's Xeons; 0 without AVX512_BF16.  The runtime's
 * automatic choice of the bfloat16 dot-product kernels follows it. */
double rd_bf16dot_vs_fma(void);
/* One thread's read bandwidth, GB/s, sweeping `bytes` of its own memory for
 * about `seconds` (probe/rd_peak.c); -1 when the memory cannot be had. */
double rd_read_gbps(size_t bytes, double seconds);

#endif /* RD_FRAME_H */
