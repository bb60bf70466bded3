/*
 * Drivers of the grouped GEMMs: build one list of tiles over all groups,
 * order it by cost, and let the threads take tiles from it.  Each tile
 * (group, row block, column block) owns its block of the output, so no two
 * threads ever write the same element and no reduction across threads is
 * needed.  Within a tile the BLIS loop nest of rd_gemm_impl.h runs on
 * packed panels with the configured micro-kernel.
 */
#include "rd_kernel.h"

#include <stdlib.h>
#include <string.h>

enum { RD_MODE_ROWS = 0, RD_MODE_CONTRACT = 1 };

typedef struct {
    rd_int g, r0, r1, c0, c1;
    double cost;
} rd_tile_t;

typedef struct {
    rd_tile_t *tiles;
    rd_int *order;     /* tile indices by decreasing cost */
    rd_int count;
    rd_int tm, tn;     /* the tile sizes used */
    int nthreads;
} rd_tiling_t;

static rd_int
rd_round_up(rd_int x, rd_int unit)
{
    return (x + unit - 1) / unit * unit;
}

/*
 * Packing buffers, one pair per thread, kept from call to call: allocating
 * megabytes afresh on every call costs page faults (the kernel zeroing new
 * pages) comparable to the packing itself.  They grow to the largest size
 * asked for and stay: O(threads x cache blocks) of memory.
 */
static __thread void *rd_scratch_buf[2] = {NULL, NULL};
static __thread size_t rd_scratch_cap[2] = {0, 0};

static void *
rd_scratch(int which, size_t bytes)
{
    if (bytes > rd_scratch_cap[which]) {
        void *p = NULL;
        if (posix_memalign(&p, RD_ALIGN, bytes) != 0)
            return NULL;
        free(rd_scratch_buf[which]);
        rd_scratch_buf[which] = p;
        rd_scratch_cap[which] = bytes;
    }
    return rd_scratch_buf[which];
}

/* Split [0, extent) into the fewest pieces of at most `most` (a multiple of
 * `unit`), all of one size rounded up to `unit` except the last. */
static rd_int
rd_piece(rd_int extent, rd_int most, rd_int unit)
{
    if (extent <= 0)
        return unit;
    rd_int pieces = (extent + most - 1) / most;
    rd_int size = rd_round_up((extent + pieces - 1) / pieces, unit);
    return size > 0 ? size : unit;
}

/* Per group g: rows_of(g) rows of output, a contraction of depth_of(g). */
typedef struct {
    int mode;
    const rd_int *bounds;
    rd_int rows;       /* CONTRACT: rows of every group's output block */
    rd_int depth;      /* ROWS: contraction depth of every group */
} rd_shape_t;

static void
rd_group_geometry(const rd_shape_t *sh, rd_int g, rd_int *r0, rd_int *r1,
                  rd_int *depth)
{
    if (sh->mode == RD_MODE_ROWS) {
        *r0 = sh->bounds[g];
        *r1 = sh->bounds[g + 1];
        *depth = sh->depth;
    }
    else {
        *r0 = 0;
        *r1 = sh->rows;
        *depth = sh->bounds[g + 1] - sh->bounds[g];
    }
}

static rd_int
rd_count_tiles(const rd_shape_t *sh, rd_int ng, rd_int n, rd_int tm, rd_int tn,
               rd_int unit_m, rd_int unit_n)
{
    rd_int count = 0;
    rd_int nsz = rd_piece(n, tn, unit_n);
    rd_int ncols = n > 0 ? (n + nsz - 1) / nsz : 0;
    for (rd_int g = 0; g < ng; g++) {
        rd_int r0, r1, d;
        rd_group_geometry(sh, g, &r0, &r1, &d);
        rd_int rows = r1 - r0;
        if (rows <= 0)
            continue;
        rd_int msz = rd_piece(rows, tm, unit_m);
        count += (rows + msz - 1) / msz * ncols;
    }
    return count;
}

typedef struct {
    double cost;
    rd_int index;
} rd_rank_t;

/* Decreasing cost; ties in list order, so the order is fully determined. */
static int
rd_cmp_rank(const void *pa, const void *pb)
{
    const rd_rank_t *a = (const rd_rank_t *)pa, *b = (const rd_rank_t *)pb;
    if (a->cost != b->cost)
        return a->cost > b->cost ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

/*
 * Choose tile sizes and list the tiles.  Tiles start as large as the cache
 * blocking allows (tm = 4 MC rows, tn = NC columns: a packed B panel is then
 * reused by four A blocks) and are halved until every thread has several
 * tiles to take, so that many small groups and a single large one both keep
 * all threads busy.  Problems too small to pay for a thread team run on one.
 */
static int
rd_make_tiling(rd_tiling_t *tl, const rd_shape_t *sh, rd_int ng, rd_int n,
               rd_int mc, rd_int nc, rd_int mr, rd_int nr)
{
    double work = 0.0;
    for (rd_int g = 0; g < ng; g++) {
        rd_int r0, r1, d;
        rd_group_geometry(sh, g, &r0, &r1, &d);
        work += (double)(r1 - r0) * (double)n * (double)(d > 0 ? d : 1);
    }
    int nthreads = rd_get_num_threads();
    if (work < 262144.0)   /* ~0.5 MFLOP: a thread team costs more than it saves */
        nthreads = 1;

    rd_int tm = rd_round_up(4 * mc, mr), tn = rd_round_up(nc, nr);
    const rd_int tm_min = rd_round_up(48, mr), tn_min = rd_round_up(128, nr);
    const rd_int want = 4 * (rd_int)nthreads;
    rd_int count = rd_count_tiles(sh, ng, n, tm, tn, mr, nr);
    while (nthreads > 1 && count < want && (tm > tm_min || tn > tn_min)) {
        if (tn > tn_min && (tn >= 2 * tm || tm <= tm_min))
            tn = rd_round_up(tn / 2 > tn_min ? tn / 2 : tn_min, nr);
        else
            tm = rd_round_up(tm / 2 > tm_min ? tm / 2 : tm_min, mr);
        count = rd_count_tiles(sh, ng, n, tm, tn, mr, nr);
    }

    tl->tiles = (rd_tile_t *)malloc(sizeof(rd_tile_t) * (size_t)(count > 0 ? count : 1));
    tl->order = (rd_int *)malloc(sizeof(rd_int) * (size_t)(count > 0 ? count : 1));
    if (tl->tiles == NULL || tl->order == NULL) {
        free(tl->tiles);
        free(tl->order);
        tl->tiles = NULL;
        tl->order = NULL;
        return -1;
    }
    rd_int nsz = rd_piece(n, tn, nr);
    rd_int t = 0;
    for (rd_int g = 0; g < ng; g++) {
        rd_int r0, r1, d;
        rd_group_geometry(sh, g, &r0, &r1, &d);
        if (r1 - r0 <= 0 || n <= 0)
            continue;
        rd_int msz = rd_piece(r1 - r0, tm, mr);
        for (rd_int c = 0; c < n; c += nsz) {
            for (rd_int r = r0; r < r1; r += msz) {
                rd_tile_t *tile = &tl->tiles[t];
                tile->g = g;
                tile->r0 = r;
                tile->r1 = r + msz < r1 ? r + msz : r1;
                tile->c0 = c;
                tile->c1 = c + nsz < n ? c + nsz : n;
                /* a small constant keeps empty-contraction tiles (zeroing) ordered */
                tile->cost = (double)(tile->r1 - tile->r0) * (double)(tile->c1 - tile->c0)
                             * (double)(d > 0 ? d : 1) + 1024.0;
                t++;
            }
        }
    }
    tl->count = t;
    tl->tm = tm;
    tl->tn = nsz;
    tl->nthreads = nthreads;
    rd_rank_t *rank = (rd_rank_t *)malloc(sizeof(rd_rank_t) * (size_t)(t > 0 ? t : 1));
    if (rank == NULL) {
        free(tl->tiles);
        free(tl->order);
        tl->tiles = NULL;
        tl->order = NULL;
        return -1;
    }
    for (rd_int i = 0; i < t; i++) {
        rank[i].cost = tl->tiles[i].cost;
        rank[i].index = i;
    }
    qsort(rank, (size_t)t, sizeof(rd_rank_t), rd_cmp_rank);
    for (rd_int i = 0; i < t; i++)
        tl->order[i] = rank[i].index;
    free(rank);
    return 0;
}

static void
rd_free_tiling(rd_tiling_t *tl)
{
    free(tl->tiles);
    free(tl->order);
}

/* Keep gcc from turning the short fixed-width copies of the packing loops
 * into calls to memmove. */
#pragma GCC optimize("no-tree-loop-distribute-patterns")

#define RD_T float
#define RD_FN(x) rd_s_##x
#define RD_CFG s
#include "rd_gemm_impl.h"
#undef RD_T
#undef RD_FN
#undef RD_CFG

#define RD_T double
#define RD_FN(x) rd_d_##x
#define RD_CFG d
#include "rd_gemm_impl.h"
#undef RD_T
#undef RD_FN
#undef RD_CFG

/* ------------------------------------------------------------ public API */

/* Stream an output of `elems` elements of `size` bytes, written with
 * unit column stride and not accumulated into? */
static int
rd_want_stream(rd_int elems, size_t size, rd_int out_cs, int accumulate)
{
    rd_int min = rd_get_stream_min_bytes();
    return !accumulate && out_cs == 1 && min >= 0 && elems > 0
           && (double)elems * (double)size >= (double)min;
}

#define RD_DEFINE_ROWS(NAME, T, PFX, CFG)                            \
int NAME(rd_int k, rd_int n, rd_int ng, const rd_int *bounds,               \
         const T *lhs, rd_int lhs_rs, rd_int lhs_cs,                        \
         const T *rhs, rd_int rhs_gs, rd_int rhs_rs, rd_int rhs_cs,         \
         T *out, rd_int out_rs, rd_int out_cs, int accumulate)              \
{                                                                           \
    const rd_context_t *ctx = rd_context();                                 \
    rd_shape_t sh = {RD_MODE_ROWS, bounds, 0, k};                           \
    rd_tiling_t tl;                                                         \
    if (rd_make_tiling(&tl, &sh, ng, n, ctx->CFG.mc, ctx->CFG.nc,          \
                       ctx->CFG.mr, ctx->CFG.nr) != 0)                      \
        return -1;                                                          \
    int rc = PFX##run_tiles(ctx, &tl, RD_MODE_ROWS, bounds,                  \
                            lhs, lhs_rs, lhs_cs, rhs, rhs_gs, rhs_rs, rhs_cs, \
                            out, 0, out_rs, out_cs, k, accumulate,          \
                            rd_want_stream((bounds[ng] - bounds[0]) * n,    \
                                           sizeof(T), out_cs, accumulate)); \
    rd_free_tiling(&tl);                                                    \
    return rc;                                                              \
}

#define RD_DEFINE_CONTRACT(NAME, T, PFX, CFG)                        \
int NAME(rd_int k, rd_int n, rd_int ng, const rd_int *bounds,               \
         const T *lhs, rd_int lhs_rs, rd_int lhs_cs,                        \
         const T *rhs, rd_int rhs_rs, rd_int rhs_cs,                        \
         T *out, rd_int out_gs, rd_int out_rs, rd_int out_cs,               \
         int accumulate)                                                    \
{                                                                           \
    const rd_context_t *ctx = rd_context();                                 \
    rd_shape_t sh = {RD_MODE_CONTRACT, bounds, k, 0};                       \
    rd_tiling_t tl;                                                         \
    if (rd_make_tiling(&tl, &sh, ng, n, ctx->CFG.mc, ctx->CFG.nc,          \
                       ctx->CFG.mr, ctx->CFG.nr) != 0)                      \
        return -1;                                                          \
    int rc = PFX##run_tiles(ctx, &tl, RD_MODE_CONTRACT, bounds,              \
                            lhs, lhs_rs, lhs_cs, rhs, 0, rhs_rs, rhs_cs,    \
                            out, out_gs, out_rs, out_cs, 0, accumulate,     \
                            rd_want_stream(ng * k * n, sizeof(T), out_cs,   \
                                           accumulate));                    \
    rd_free_tiling(&tl);                                                    \
    return rc;                                                              \
}

RD_DEFINE_ROWS(rd_sgemm_ragged_rows, float, rd_s_, s)
RD_DEFINE_ROWS(rd_dgemm_ragged_rows, double, rd_d_, d)
RD_DEFINE_CONTRACT(rd_sgemm_ragged_contract, float, rd_s_, s)
RD_DEFINE_CONTRACT(rd_dgemm_ragged_contract, double, rd_d_, d)
