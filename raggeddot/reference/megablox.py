"""The oracle of megablox's ``make_group_metadata``, ``gmm`` and ``tgmm``."""

import numpy as np

from ._common import (_accumulator_dtype, _check_group_sizes, _check_ndim, _first_group,
                      _group_bounds, _group_sizes_array, _result_dtype)

from . import quant as _quant

__all__ = ["make_group_metadata", "gmm", "tgmm"]


# ---------------------------------------------------------------------------
# megablox: make_group_metadata, gmm, tgmm
# ---------------------------------------------------------------------------


def _repeat_to_length(values, repeats, total_length):
    """np.repeat(values, repeats), cut or padded to total_length like jnp.repeat.

    ``jnp.repeat(..., total_repeat_length=L)`` drops entries past L and pads a
    short result with ``values[-1]``: the last *input* value, even when its own
    repeat count is 0 (so not always the last value written).  An empty
    ``values`` gives an empty result.
    """
    if len(values) == 0:
        return values[:0]
    out = np.repeat(values, repeats)[:total_length]
    padding = np.full(total_length - len(out), values[-1], dtype=values.dtype)
    return np.concatenate([out, padding])


def make_group_metadata(*, group_sizes, m, tm, start_group=0, num_nonzero_groups=None,
                        visit_empty_groups=True):
    """The (group, row tile) visiting schedule of megablox's tiled kernels.

    Rows are cut into ``tiles_m = m // tm`` tiles of ``tm`` rows.  A tile that
    holds rows of several groups is visited once per group; the schedule lists
    the visits in row order.  The groups ``[start_group, start_group +
    num_nonzero_groups)`` are the ones the caller computes (its shard).

    Returns ``((group_offsets, group_ids, m_tile_ids), num_tiles)``:
      group_offsets: int32 [g + 1], ``[0, cumsum(group_sizes)...]``.
      group_ids: int32 [tiles_m + g - 1], the group of each visit.
      m_tile_ids: int32 [tiles_m + g - 1], the row tile of each visit.
      num_tiles: int, how many leading entries the shard must execute.

    Steps (megablox's, element for element):
      1. ``group_ends = cumsum(gs)``, ``group_starts = group_ends - gs``.
      2. A group covers ``(ceil(end / tm) - floor(start / tm))`` tiles; 0 if it
         is empty, or 1 if it is empty and visit_empty_groups (tgmm must zero it).
      3. ``group_ids = repeat(arange(g), group_tiles)`` to length
         ``tiles_m + g - 1`` (jnp.repeat padding: see _repeat_to_length).
      4. Every tile is visited once, plus once per group that starts inside it
         (start % tm != 0 and size > 0), plus, if visit_empty_groups, once per
         empty group whose start ``s`` gives ``s // tm < tiles_m``.
         ``m_tile_ids = repeat(arange(tiles_m), visits)``, same length/padding.
      5. Both lists are rolled left by the number of entries with group id
         < start_group, putting the shard's visits first; ``num_tiles`` sums
         group_tiles over ``[start_group, start_group + num_nonzero_groups)``.

    Note: megablox counts step 4's visits with ``jnp.histogram`` on float32
    bin edges, which misplaces some counts once tiles_m passes about 4100 (first
    seen at 4109): e.g. with tiles_m = 5000 a group starting inside tile 4997 has
    its extra visit put on tile 4998, so megablox never computes that group's
    rows of tile 4997.  This oracle counts exactly (the intended meaning).

    Raises ValueError if tm does not divide m, or the sizes are invalid.
    """
    gs = _group_sizes_array(group_sizes)
    _check_ndim(gs, 1, "group_sizes")
    m, tm = int(m), int(tm)
    if tm <= 0 or m % tm != 0:
        raise ValueError(f"{m} must be divisible by x-dimension tile size ({tm}).")
    _check_group_sizes(gs, m, "m")
    num_groups = gs.shape[0]
    start_group = int(np.asarray(start_group).reshape(()))
    if num_nonzero_groups is None:
        num_nonzero_groups = num_groups - start_group
    end_group = start_group + int(num_nonzero_groups) - 1
    tiles_m = m // tm
    length = tiles_m + num_groups - 1

    # Step 1.
    group_starts, group_ends = _group_bounds(gs)
    group_offsets = np.concatenate([[0], group_ends])

    # Step 2.
    rounded_ends = -(-group_ends // tm) * tm
    rounded_starts = group_starts // tm * tm
    group_tiles = np.where(gs == 0, 0, (rounded_ends - rounded_starts) // tm)
    if visit_empty_groups:
        group_tiles = np.where(gs == 0, 1, group_tiles)

    # Step 3.
    group_ids = _repeat_to_length(np.arange(num_groups), group_tiles, length)

    # Step 4.
    tile_visits = np.ones(tiles_m, np.int64)
    for i in range(num_groups):
        starts_inside = gs[i] > 0 and group_starts[i] % tm != 0
        empty_visit = visit_empty_groups and gs[i] == 0
        tile = group_starts[i] // tm
        if (starts_inside or empty_visit) and tile < tiles_m:
            tile_visits[tile] += 1
    m_tile_ids = _repeat_to_length(np.arange(tiles_m), tile_visits, length)

    # Step 5.
    first_tile_in_shard = int(np.sum(group_ids < start_group))
    group_ids = np.roll(group_ids, -first_tile_in_shard)
    m_tile_ids = np.roll(m_tile_ids, -first_tile_in_shard)
    in_shard = (np.arange(num_groups) >= start_group) & (np.arange(num_groups) <= end_group)
    num_tiles = int(np.sum(group_tiles[in_shard]))

    as_int32 = lambda x: np.asarray(x, dtype=np.int32)
    return (as_int32(group_offsets), as_int32(group_ids), as_int32(m_tile_ids)), num_tiles


def _megablox_out_dtype(lhs, rhs, preferred_element_type, existing_out):
    """Output dtype of gmm/tgmm.

    preferred_element_type if given; else existing_out's dtype if given; else
    float64 when the inputs promote to float64 and float32 otherwise (megablox's
    default is float32; it accepts only bfloat16/float32 inputs).
    """
    if preferred_element_type is not None:
        out_dtype = np.dtype(preferred_element_type)
        if existing_out is not None and existing_out.dtype != out_dtype:
            raise ValueError("Existing output dtype must match preferred_element_type.")
        return out_dtype
    if existing_out is not None:
        return existing_out.dtype
    if _result_dtype(lhs, rhs, None) == np.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def gmm(lhs, rhs, group_sizes, preferred_element_type=None, tiling=None, group_offset=None,
        existing_out=None, transpose_rhs=False):
    """Megablox's grouped matmul: ``out[R_i] = lhs[R_i] @ rhs[i - group_offset]``.

    rhs holds groups ``[group_offset, group_offset + g_local)`` of the g groups
    in group_sizes (g_local may be smaller than g even with group_offset None,
    which means 0).  Only those groups' rows ``R_i`` are computed, and they
    overwrite the output.  Every other row (other groups' rows, rows past
    sum(group_sizes)) is taken from existing_out when given, else it is 0.

    Args:
      lhs: [m, k].
      rhs: [g_local, k, n], or [g_local, n, k] if transpose_rhs.
      group_sizes: [g], integer.
      preferred_element_type: output dtype (see _megablox_out_dtype for None).
      tiling: ignored (megablox's (tm, tk, tn)).
      group_offset: None or an integer scalar / 0-d array.
      existing_out: None or [m, n]; its dtype must equal preferred_element_type.
      transpose_rhs: rhs holds each group's matrix transposed.

    Returns:
      [m, n].

    Megablox itself leaves rows past sum(group_sizes) uninitialised when rhs
    holds all g groups and existing_out is None; the oracle returns 0 there.
    """
    del tiling
    lhs, rhs, lhs_like, rhs_like = _quant.operands(lhs, rhs)
    gs = _group_sizes_array(group_sizes)
    _check_ndim(lhs, 2, "lhs")
    _check_ndim(rhs, 3, "rhs")
    _check_ndim(gs, 1, "group_sizes")
    if transpose_rhs:
        rhs = rhs.transpose(0, 2, 1)
    m, k = lhs.shape
    g_local, rhs_k, n = rhs.shape
    if rhs_k != k:
        raise ValueError(f"lhs has k = {k} but rhs has k = {rhs_k}.")
    first = _first_group(group_offset, gs.shape[0], g_local)
    _check_group_sizes(gs, m, "lhs.shape[0]")
    if existing_out is not None:
        existing_out = np.asarray(existing_out)
        if existing_out.shape != (m, n):
            raise ValueError(f"existing_out must have shape {(m, n)}, got {existing_out.shape}.")
    out_dtype = _megablox_out_dtype(lhs_like, rhs_like, preferred_element_type, existing_out)
    acc_dtype = _accumulator_dtype(out_dtype)

    if existing_out is None:
        out = np.zeros((m, n), acc_dtype)
    else:
        out = existing_out.astype(acc_dtype)
    starts, ends = _group_bounds(gs)
    for j in range(g_local):
        i = first + j
        rows = slice(starts[i], ends[i])
        out[rows] = lhs[rows].astype(acc_dtype) @ rhs[j].astype(acc_dtype)
    return out.astype(out_dtype)


def tgmm(lhs, rhs, group_sizes, preferred_element_type=None, tiling=None, group_offset=None,
         num_actual_groups=None, existing_out=None):
    """Megablox's transposed grouped matmul (the weight gradient of gmm).

    For each local group ``j`` (global group ``i = group_offset + j``) with
    rows ``R_i``::

        out[j] = lhs[:, R_i] @ rhs[R_i, :]   (+ existing_out[j] if given)

    Empty groups give zeros (plus existing_out[j]); rows past sum(group_sizes)
    are ignored.

    Args:
      lhs: [k, m] (the transpose of gmm's lhs).
      rhs: [m, n].
      group_sizes: [g], integer.
      preferred_element_type: output dtype (see _megablox_out_dtype for None).
      tiling: ignored.
      group_offset: None (0) or an integer scalar / 0-d array.
      num_actual_groups: number of local groups; None means g.
      existing_out: None or [num_actual_groups, k, n], added to the result.

    Returns:
      [num_actual_groups, k, n].
    """
    del tiling
    lhs, rhs, lhs_like, rhs_like = _quant.operands(lhs, rhs)
    gs = _group_sizes_array(group_sizes)
    _check_ndim(lhs, 2, "lhs")
    _check_ndim(rhs, 2, "rhs")
    _check_ndim(gs, 1, "group_sizes")
    k, m = lhs.shape
    rhs_m, n = rhs.shape
    if rhs_m != m:
        raise ValueError(f"lhs is [k, m] = {lhs.shape} but rhs is [m, n] = {rhs.shape}.")
    num_groups = gs.shape[0]
    num_local = num_groups if num_actual_groups is None else int(num_actual_groups)
    first = _first_group(group_offset, num_groups, num_local)
    _check_group_sizes(gs, m, "rhs.shape[0]")
    if existing_out is not None:
        existing_out = np.asarray(existing_out)
        if existing_out.shape != (num_local, k, n):
            raise ValueError(
                f"existing_out must have shape {(num_local, k, n)}, got {existing_out.shape}."
            )
    out_dtype = _megablox_out_dtype(lhs_like, rhs_like, preferred_element_type, existing_out)
    acc_dtype = _accumulator_dtype(out_dtype)

    starts, ends = _group_bounds(gs)
    out = np.zeros((num_local, k, n), acc_dtype)
    for j in range(num_local):
        i = first + j
        rows = slice(starts[i], ends[i])
        out[j] = lhs[:, rows].astype(acc_dtype) @ rhs[rows].astype(acc_dtype)
    if existing_out is not None:
        out += existing_out.astype(acc_dtype)
    return out.astype(out_dtype)
