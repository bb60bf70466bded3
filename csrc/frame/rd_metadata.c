/*
 * megablox's make_group_metadata: which (group, m-tile) pairs a tiled
 * grouped matmul visits, in visiting order.  The steps follow megablox's
 * own numbering; invariants are stated where they are used.
 */
#include "rd_frame.h"

#include <stdlib.h>

/*
 * jnp.repeat(arange(len(repeats)), repeats, total_repeat_length=length):
 * entry `pos` is the last index i whose exclusive prefix sum of repeats is
 * <= pos.  So empty entries are skipped, positions past sum(repeats) repeat
 * the final index (len-1, even when its repeat count is zero), and
 * positions past `length` are cut off.
 */
static void
rd_repeat_arange(const rd_int *repeats, rd_int count, rd_int length, int *out)
{
    rd_int i = 0, next_start = count > 1 ? repeats[0] : 0;
    for (rd_int pos = 0; pos < length; pos++) {
        while (i + 1 < count && next_start <= pos) {
            i++;
            next_start += repeats[i];
        }
        out[pos] = (int)i;
    }
}

long long
rd_make_group_metadata(const rd_int *group_sizes, rd_int ng, rd_int m,
                       rd_int tm, rd_int start_group,
                       rd_int num_nonzero_groups, int visit_empty_groups,
                       int *group_offsets, int *group_ids, int *m_tile_ids)
{
    const rd_int tiles_m = m / tm;
    const rd_int length = tiles_m + ng - 1;
    const rd_int end_group = start_group + num_nonzero_groups - 1;
    rd_int *group_tiles = (rd_int *)malloc(sizeof(rd_int) * (size_t)(ng > 0 ? ng : 1));
    rd_int *tile_visits = (rd_int *)malloc(sizeof(rd_int) * (size_t)(tiles_m > 0 ? tiles_m : 1));
    if (group_tiles == NULL || tile_visits == NULL) {
        free(group_tiles);
        free(tile_visits);
        return -1;
    }

    /* 1. group_offsets = [0, cumsum(group_sizes)...] */
    rd_int end = 0;
    group_offsets[0] = 0;
    for (rd_int g = 0; g < ng; g++) {
        end += group_sizes[g];
        group_offsets[g + 1] = (int)end;
    }

    /* 2. tiles per group: end rounded up, start rounded down to tm;
     *    empty groups take 0 tiles, or 1 when they must be visited. */
    for (rd_int g = 0; g < ng; g++) {
        rd_int start = group_offsets[g], stop = group_offsets[g + 1];
        rd_int rounded = (stop + tm - 1) / tm * tm - start / tm * tm;
        if (group_sizes[g] == 0)
            group_tiles[g] = visit_empty_groups ? 1 : 0;
        else
            group_tiles[g] = rounded / tm;
    }

    /* 3./4. group_ids: each group repeated group_tiles times, to `length`. */
    rd_repeat_arange(group_tiles, ng, length, group_ids);

    /* 5. every tile is visited once by its owner, and once more for each
     *    group that starts strictly inside it (non-empty, start % tm != 0);
     *    with visit_empty_groups, an empty group adds a visit to the tile
     *    its offset falls in, wherever in the tile that is. */
    for (rd_int t = 0; t < tiles_m; t++)
        tile_visits[t] = 1;
    for (rd_int g = 0; g < ng; g++) {
        rd_int off = group_offsets[g];
        int skip = (off % tm == 0) || group_sizes[g] == 0;
        if (visit_empty_groups && group_sizes[g] == 0)
            skip = 0;
        rd_int tile = off / tm;
        if (!skip && tile < tiles_m)
            tile_visits[tile] += 1;
    }
    rd_repeat_arange(tile_visits, tiles_m, length, m_tile_ids);

    /* 6. shard: roll both lists left past the entries of groups before
     *    start_group; count the tiles of groups [start_group, end_group]. */
    rd_int shift = 0;
    for (rd_int i = 0; i < length; i++)
        shift += group_ids[i] < start_group;
    if (shift > 0 && length > 0) {
        int *tmp = (int *)malloc(sizeof(int) * (size_t)length);
        if (tmp == NULL) {
            free(group_tiles);
            free(tile_visits);
            return -1;
        }
        int *lists[2] = {group_ids, m_tile_ids};
        for (int l = 0; l < 2; l++) {
            for (rd_int i = 0; i < length; i++)
                tmp[i] = lists[l][(i + shift) % length];
            for (rd_int i = 0; i < length; i++)
                lists[l][i] = tmp[i];
        }
        free(tmp);
    }
    long long num_tiles = 0;
    for (rd_int g = 0; g < ng; g++)
        if (g >= start_group && g <= end_group)
            num_tiles += group_tiles[g];

    free(group_tiles);
    free(tile_visits);
    return num_tiles;
}
