/*
 * The tile list of a grouped GEMM (frame/rd_tiling.c), read by the drivers
 * (frame/rd_driver.c).  A tile (group, row block, column block) owns its
 * block of the output.  Team tiles are run by all threads together, one
 * after another: their B panels packed once, shared, their rows split
 * between the threads; the other tiles are taken by one thread each.
 */
#ifndef RD_TILING_H
#define RD_TILING_H

#include "rd_frame.h"

enum { RD_MODE_ROWS = 0, RD_MODE_CONTRACT = 1 };

typedef struct {
    rd_int g, r0, r1, c0, c1;
    double cost;
} rd_tile_t;

typedef struct {
    rd_tile_t *tiles;
    rd_int *order;     /* the team tiles first, in list order; then the others
                          by decreasing cost */
    rd_int count;
    rd_int nteam;      /* how many team tiles lead the order */
    rd_int tm, tn;     /* the largest tile (rows, columns), of either kind */
    int nthreads;
} rd_tiling_t;

/* Per group g: rows of output and a contraction depth. */
typedef struct {
    int mode;
    const rd_int *bounds;
    rd_int rows;       /* CONTRACT: rows of every group's output block */
    rd_int depth;      /* ROWS: contraction depth of every group */
} rd_shape_t;

void rd_group_geometry(const rd_shape_t *sh, rd_int g, rd_int *r0, rd_int *r1, rd_int *depth);

/* The threads a call runs on: the plan's, or one for a problem too small
 * to pay for a team (its FLOPs and the bytes it reads and writes,
 * rd_frame.h) when the plan's threads are automatic. */
int rd_tiling_threads(const rd_plan_t *plan, const rd_shape_t *sh, rd_int ng, rd_int n, double bytes);

/* The tiles of a call (narrow: a 16-bit output, whose tiles are computed in
 * a float32 tile of their own; bytes: what the call reads and writes).
 * Returns 0, or -1 when out of memory. */
int rd_make_tiling(rd_tiling_t *tl, const rd_plan_t *plan, const rd_shape_t *sh, rd_int ng, rd_int n,
                   int narrow, double bytes);
void rd_free_tiling(rd_tiling_t *tl);

#endif /* RD_TILING_H */
