/*
 * The tile list of a grouped GEMM: which tiles, of what size, in what
 * order, on how many threads (frame/rd_tiling.h).
 */
#include "rd_tiling.h"
#include "rd_playout.h"

#include <math.h>
#include <stdlib.h>

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

void
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

/* The tiles of the groups of fewer than team_rows rows. */
static rd_int
rd_count_tiles(const rd_shape_t *sh, rd_int ng, rd_int n, rd_int tm, rd_int tn,
               rd_int unit_m, rd_int unit_n, rd_int team_rows)
{
    rd_int count = 0;
    rd_int nsz = rd_piece(n, tn, unit_n);
    rd_int ncols = n > 0 ? (n + nsz - 1) / nsz : 0;
    for (rd_int g = 0; g < ng; g++) {
        rd_int r0, r1, d;
        rd_group_geometry(sh, g, &r0, &r1, &d);
        rd_int rows = r1 - r0;
        if (rows <= 0 || rows >= team_rows)
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
 * Choose tile sizes and list the tiles.  A group of more than max(threads,
 * 4) x MC rows (the plan allowing) makes team tiles of all its rows and NC columns:
 * the threads share its packed B panels instead of each packing them for
 * its own row tiles.  The other tiles start as large as the cache blocking
 * allows (tm = 4 MC rows, tn = NC columns: a packed B panel is then reused
 * by four A blocks; or the plan's tm/tn) and are halved until every thread
 * has several tiles to take, so that many small groups keep all threads
 * busy: the plan's split says which side is halved first.  Problems too small to pay for a thread team (FLOPs and
 * operand bytes, rd_frame.h) run on one when the plan's threads are
 * automatic.
 */
/* The widest tile of a 16-bit output: its float32 tile (tm x this) stays
 * within a thread's scratch of about a megabyte. */
#define RD_NARROW_TN ((rd_int)512)

int
rd_tiling_threads(const rd_plan_t *plan, const rd_shape_t *sh, rd_int ng, rd_int n, double bytes)
{
    double work = 0.0;
    for (rd_int g = 0; g < ng; g++) {
        rd_int r0, r1, d;
        rd_group_geometry(sh, g, &r0, &r1, &d);
        work += (double)(r1 - r0) * (double)n * (double)(d > 0 ? d : 1);
    }
    if (plan->auto_threads && 2.0 * work < RD_TEAM_MIN_FLOPS && bytes < RD_TEAM_MIN_BYTES)
        return 1;
    return plan->nthreads;
}

int
rd_make_tiling(rd_tiling_t *tl, const rd_plan_t *plan, const rd_shape_t *sh,
               rd_int ng, rd_int n, int narrow, double bytes)
{
    /* a streaming kernel takes strips of any width: tiles of whole vectors */
    const int streams = plan->kind == RD_KIND_STREAM;
    const rd_int mc = plan->k.mc, nc = plan->k.nc, mr = plan->k.mr, nr = streams ? 64 : plan->k.nr;
    const int nthreads = rd_tiling_threads(plan, sh, ng, n, bytes);

    rd_int tm = rd_round_up(plan->tm > 0 ? plan->tm : 4 * mc, mr);
    rd_int tn = rd_round_up(plan->tn > 0 ? plan->tn : nc, nr);
    if (narrow && tn > RD_NARROW_TN)
        tn = rd_round_up(RD_NARROW_TN, nr);
    const rd_int tm_min = rd_round_up(48, mr), tn_min = rd_round_up(streams ? 256 : 128, nr);
    const rd_int want = 4 * (rd_int)nthreads;
    /* a group of more rows than one tile takes (4 MC), and enough for every
     * thread to have MC of them, is run by the team: one tile per NC columns,
     * B packed once for all its rows (smaller groups' tiles pack their B
     * once anyway, and run without the team's barriers) */
    const rd_int team_rows = nthreads > 1 && !narrow && !streams && plan->team
                             ? (rd_int)(nthreads > 4 ? nthreads : 4) * mc + 1 : (rd_int)1 << 62;
    const rd_int team_tn = rd_piece(n, nc, nr);
    rd_int nteam = 0;
    for (rd_int g = 0; g < ng; g++) {
        rd_int r0, r1, d;
        rd_group_geometry(sh, g, &r0, &r1, &d);
        if (r1 - r0 >= team_rows && n > 0)
            nteam += (n + team_tn - 1) / team_tn;
    }
    rd_int count = rd_count_tiles(sh, ng, n, tm, tn, mr, nr, team_rows);
    while (nthreads > 1 && count > 0 && count < want && (tm > tm_min || tn > tn_min)) {
        if (tn > tn_min && (plan->split == RD_SPLIT_N || tm <= tm_min))
            tn = rd_round_up(tn / 2 > tn_min ? tn / 2 : tn_min, nr);
        else
            tm = rd_round_up(tm / 2 > tm_min ? tm / 2 : tm_min, mr);
        count = rd_count_tiles(sh, ng, n, tm, tn, mr, nr, team_rows);
    }
    count += nteam;

    tl->tiles = (rd_tile_t *)malloc(sizeof(rd_tile_t) * (size_t)(count > 0 ? count : 1));
    tl->order = (rd_int *)malloc(sizeof(rd_int) * (size_t)(count > 0 ? count : 1));
    if (tl->tiles == NULL || tl->order == NULL) {
        free(tl->tiles);
        free(tl->order);
        tl->tiles = NULL;
        tl->order = NULL;
        return -1;
    }
    const rd_int nsz = rd_piece(n, tn, nr);
    rd_int t = 0, tmax = 0;
    for (rd_int g = 0; g < ng; g++) {
        rd_int r0, r1, d;
        rd_group_geometry(sh, g, &r0, &r1, &d);
        if (r1 - r0 <= 0 || n <= 0)
            continue;
        const int team = r1 - r0 >= team_rows;
        const rd_int msz = team ? r1 - r0 : rd_piece(r1 - r0, tm, mr);
        const rd_int csz = team ? team_tn : nsz;
        tmax = msz > tmax ? msz : tmax;
        for (rd_int c = 0; c < n; c += csz) {
            for (rd_int r = r0; r < r1; r += msz) {
                rd_tile_t *tile = &tl->tiles[t];
                tile->g = g;
                tile->r0 = r;
                tile->r1 = r + msz < r1 ? r + msz : r1;
                tile->c0 = c;
                tile->c1 = c + csz < n ? c + csz : n;
                /* a small constant keeps empty-contraction tiles (zeroing)
                 * ordered; team tiles rank first, in list order */
                tile->cost = team ? HUGE_VAL
                             : (double)(tile->r1 - tile->r0) * (double)(tile->c1 - tile->c0)
                               * (double)(d > 0 ? d : 1) + 1024.0;
                t++;
            }
        }
    }
    tl->count = t;
    tl->nteam = nteam;
    tl->tm = tmax;
    tl->tn = nteam > 0 && team_tn > nsz ? team_tn : nsz;
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

void
rd_free_tiling(rd_tiling_t *tl)
{
    free(tl->tiles);
    free(tl->order);
}


