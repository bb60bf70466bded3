"""Pure-NumPy reference implementations (the oracle) of raggeddot's operations.

This module states the semantics of ``jax.lax.ragged_dot``,
``jax.lax.ragged_dot_general`` and megablox's ``make_group_metadata``, ``gmm``
and ``tgmm`` (``jax.experimental.pallas.ops.tpu.megablox.gmm``) as plainly as
possible.  It imports nothing but NumPy, so it stays independent of the
C kernel it is used to check.  Speed is not a goal: products are accumulated in
float64 (int64 for integer inputs, complex128 for complex ones) and cast to the
output dtype once, at the end.

Conventions used throughout:

* ``group_sizes`` ``gs`` of length ``g`` splits a ragged dimension of size ``m``
  into consecutive row ranges: group ``i`` owns ``[start_i, start_i + gs[i])``
  with ``start_i = sum(gs[:i])``.  Sizes must be ``>= 0`` and ``sum(gs) <= m``
  (``ValueError`` otherwise).  Positions at or past ``sum(gs)`` belong to no
  group.
* Output rows that no computed group owns are exactly zero, unless a function
  documents otherwise (``existing_out``).
* ``precision`` and ``tiling`` are accepted for signature compatibility and
  ignored: the oracle always computes in (at least) float64.
"""

import numpy as np

__all__ = [
    "ragged_dot",
    "ragged_dot_general",
    "make_group_metadata",
    "gmm",
    "tgmm",
    "moe_block",
    "ragged_gather",
    "ragged_gather_reduce",
]


# ---------------------------------------------------------------------------
# Small shared helpers
# ---------------------------------------------------------------------------


# (maxexp, nmant, bits) of float dtypes that NumPy knows only through extensions.
_EXTENSION_FLOATS = {"bfloat16": (128, 7, 16)}


def _dtype_rank(dtype):
    """JAX's ordering key for dot result types (lax._dot_general_dtype_rule).

    The input whose key is larger decides the result dtype: complex beats real,
    then the wider exponent range, then the wider mantissa, then the bit width,
    then signed beats unsigned.
    """
    dtype = np.dtype(dtype)
    if dtype.name in _EXTENSION_FLOATS:  # e.g. ml_dtypes' bfloat16, unknown to np.finfo
        return (False,) + _EXTENSION_FLOATS[dtype.name] + (True,)
    is_complex = np.issubdtype(dtype, np.complexfloating)
    real = np.empty(0, dtype).real.dtype if is_complex else dtype
    if np.issubdtype(real, np.floating):
        info = np.finfo(real)
        maxexp, nmant, bits = info.maxexp, info.nmant, info.bits
    elif np.issubdtype(real, np.integer):
        maxexp, nmant, bits = -1, -1, np.iinfo(real).bits
    elif real == np.bool_:
        maxexp, nmant, bits = -1, -1, 1
    else:
        raise TypeError(f"Unsupported input dtype {dtype}.")
    signed = not np.issubdtype(real, np.unsignedinteger)
    return (is_complex, maxexp, nmant, bits, signed)


def _result_dtype(lhs, rhs, preferred_element_type):
    """Output dtype of a dot: ``preferred_element_type`` if given, else JAX's rule.

    For float32/float64 inputs JAX's rule is ``np.result_type(lhs, rhs)``.  For
    other mixes it differs from NumPy (int32 x float32 -> float32, int32 x
    uint32 -> int32) and two different dtypes of equal rank (float16 x
    bfloat16) are a TypeError.
    """
    if preferred_element_type is not None:
        return np.dtype(preferred_element_type)
    lhs_key, rhs_key = _dtype_rank(lhs.dtype), _dtype_rank(rhs.dtype)
    if lhs_key > rhs_key:
        return lhs.dtype
    if rhs_key > lhs_key:
        return rhs.dtype
    if lhs.dtype != rhs.dtype:
        raise TypeError(f"Incompatible input dtypes {lhs.dtype} and {rhs.dtype}.")
    return lhs.dtype


def _accumulator_dtype(out_dtype):
    """The dtype the oracle accumulates in: the widest type of out_dtype's kind."""
    out_dtype = np.dtype(out_dtype)
    if np.issubdtype(out_dtype, np.complexfloating):
        return np.dtype(np.complex128)
    if np.issubdtype(out_dtype, np.integer) or out_dtype == np.bool_:
        return np.dtype(np.int64)
    return np.dtype(np.float64)


def _group_sizes_array(group_sizes):
    """group_sizes as an int64 array; any integer dtype is accepted."""
    gs = np.asarray(group_sizes)
    if not np.issubdtype(gs.dtype, np.integer):
        raise TypeError(f"'group_sizes' must have an integer dtype, got {gs.dtype}.")
    return gs.astype(np.int64)


def _check_group_sizes(gs, size, what):
    """ValueError unless every size is >= 0 and every row of gs sums to <= size.

    gs may have leading (prefix) dimensions; the groups run along its last axis.
    """
    if np.any(gs < 0):
        raise ValueError(f"'group_sizes' must be non-negative, got {gs.tolist()}.")
    totals = gs.sum(axis=-1)
    if np.any(totals > size):
        raise ValueError(
            f"sum('group_sizes') = {int(np.max(totals))} exceeds {what} = {size}."
        )


def _group_bounds(gs):
    """(starts, ends) of each group along the last axis of gs: ends = cumsum(gs)."""
    ends = np.cumsum(gs, axis=-1)
    return ends - gs, ends


def _first_group(group_offset, num_groups, num_local_groups):
    """Index of the first group held by rhs (megablox's group_offset); validated."""
    if group_offset is None:
        first = 0
    else:
        offset = np.asarray(group_offset)
        if offset.size != 1 or not np.issubdtype(offset.dtype, np.integer):
            raise ValueError(
                f"'group_offset' must be an integer scalar, got {group_offset!r}."
            )
        first = int(offset.reshape(()))
    if first < 0 or first + num_local_groups > num_groups:
        raise ValueError(
            f"groups [{first}, {first + num_local_groups}) held by 'rhs' are not "
            f"within the {num_groups} groups of 'group_sizes'."
        )
    return first


def _check_ndim(x, ndim, name):
    if x.ndim != ndim:
        raise ValueError(f"Expected {ndim}-tensor for '{name}' but got {x.ndim}-tensor.")


# ---------------------------------------------------------------------------
# ragged_dot
# ---------------------------------------------------------------------------


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None,
               group_offset=None):
    """Grouped matmul with the semantics of ``jax.lax.ragged_dot``.

    For each group ``i`` held by rhs, with rows ``R_i = [start_i, start_i + gs[i])``::

        out[R_i, :] = lhs[R_i, :] @ rhs[i - group_offset]

    Every other row of ``out`` (rows past ``sum(gs)``, and rows of groups not
    held by rhs) is exactly 0.

    Args:
      lhs: [m, k].
      rhs: [g_local, k, n]; holds groups ``[group_offset, group_offset + g_local)``.
      group_sizes: [g], any integer dtype; ``>= 0`` with ``sum <= m``.
      precision: ignored (accepted for compatibility).
      preferred_element_type: output dtype; default JAX's result type of
        lhs and rhs (``np.result_type`` for float32/float64).
      group_offset: None (then ``g_local`` must equal ``g``) or an integer
        scalar / 0-d array with megablox's meaning (jax itself raises for it).

    Returns:
      [m, n] array of the output dtype, accumulated in float64.
    """
    del precision
    lhs, rhs = np.asarray(lhs), np.asarray(rhs)
    gs = _group_sizes_array(group_sizes)
    _check_ndim(lhs, 2, "lhs")
    _check_ndim(rhs, 3, "rhs")
    _check_ndim(gs, 1, "group_sizes")
    m, k = lhs.shape
    g_local, rhs_k, n = rhs.shape
    if rhs_k != k:
        raise ValueError(f"lhs is [m, k] = {lhs.shape} but rhs is [g, k, n] = {rhs.shape}.")
    if group_offset is None and g_local != gs.shape[0]:
        raise ValueError(
            f"rhs holds {g_local} groups but 'group_sizes' has {gs.shape[0]}."
        )
    first = _first_group(group_offset, gs.shape[0], g_local)
    _check_group_sizes(gs, m, "lhs.shape[0]")
    out_dtype = _result_dtype(lhs, rhs, preferred_element_type)
    acc_dtype = _accumulator_dtype(out_dtype)

    starts, ends = _group_bounds(gs)
    out = np.zeros((m, n), acc_dtype)
    for j in range(g_local):
        i = first + j
        rows = slice(starts[i], ends[i])
        out[rows] = lhs[rows].astype(acc_dtype) @ rhs[j].astype(acc_dtype)
    return out.astype(out_dtype)


# ---------------------------------------------------------------------------
# ragged_dot_general
# ---------------------------------------------------------------------------


def _remaining(rank, *used):
    """Dimensions in range(rank) not in any of the `used` lists, ascending."""
    taken = set()
    for dims in used:
        taken.update(dims)
    return [d for d in range(rank) if d not in taken]


def _unpack_dimension_numbers(dims):
    """Plain int lists from any object shaped like jax's RaggedDotDimensionNumbers."""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dims.dot_dimension_numbers
    as_list = lambda xs: [int(x) for x in xs]
    return (as_list(lhs_contract), as_list(rhs_contract), as_list(lhs_batch),
            as_list(rhs_batch), as_list(dims.lhs_ragged_dimensions),
            as_list(dims.rhs_group_dimensions))


def _matmul_blocks(lhs, rhs, nb, nf, nc):
    """Batched matmul of lhs [B..., F..., C...] and rhs [B..., C..., N...] -> [B..., F..., N...].

    nb, nf and nc count the batch (B), lhs free (F) and contracting (C) axes.
    """
    b_shape = lhs.shape[:nb]
    f_shape = lhs.shape[nb:nb + nf]
    c_shape = lhs.shape[nb + nf:]
    n_shape = rhs.shape[nb + nc:]
    if rhs.shape[:nb] != b_shape or rhs.shape[nb:nb + nc] != c_shape:
        raise ValueError(
            f"batch/contracting sizes differ: lhs {lhs.shape}, rhs {rhs.shape}."
        )
    size = lambda shape: int(np.prod(shape, dtype=np.int64))
    lhs3 = lhs.reshape((size(b_shape), size(f_shape), size(c_shape)))
    rhs3 = rhs.reshape((size(b_shape), size(c_shape), size(n_shape)))
    return np.matmul(lhs3, rhs3).reshape(b_shape + f_shape + n_shape)


def _broadcast_group_sizes(gs, prefix_shape):
    """group_sizes as shape prefix_shape + (g,): a [g] vector is broadcast."""
    if gs.ndim == 0:
        raise ValueError("expected rank of group_sizes to be >= 1.")
    if gs.ndim == 1:
        return np.broadcast_to(gs, tuple(prefix_shape) + gs.shape)
    expected = tuple(prefix_shape) + (gs.shape[-1],)
    if gs.shape != expected:
        raise ValueError(f"expected group_sizes to have shape {expected}, got {gs.shape}.")
    return gs


def _group_mask(starts, ends, i, ragged_size, ndim):
    """Boolean mask of the positions owned by group i, for an array of rank ndim.

    starts/ends have shape P + (g,), P being the prefix axes, which lead the
    array and are followed by its ragged axis.  The mask is True where
    starts[..., i] <= position < ends[..., i] along the ragged axis; it has
    shape P + (ragged_size,) padded with trailing 1s to rank ndim.
    """
    position = np.arange(ragged_size)
    mask = (starts[..., i, None] <= position) & (position < ends[..., i, None])
    return mask.reshape(mask.shape + (1,) * (ndim - mask.ndim))


def ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers,
                       precision=None, preferred_element_type=None, group_offset=None):
    """Ragged dot with general dimension numbers, as ``jax.lax.ragged_dot_general``.

    ``ragged_dot_dimension_numbers`` is any object with attributes
    ``dot_dimension_numbers = ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))``,
    ``lhs_ragged_dimensions = [r]`` (exactly one) and ``rhs_group_dimensions``.
    Write B for the batch dims (in the listed order), F for lhs's other dims and
    N for rhs's other dims (both ascending, rhs's group dim excluded), K for the
    contracting dims (listed order).  The kind of lhs dim ``r`` picks the mode:

    1. r is in F (ragged non-contracting, the MoE forward; rhs has one group dim)::

           out[B, F, N] = sum_K lhs[B, F, K] * rhs[group(B, F), B, K, N]

       where group(...) is the group owning F's r-coordinate; positions owned by
       no group give exactly 0.  out: [B..., F..., N...].
    2. r is in K (ragged contracting, tgmm; rhs has no group dim)::

           out[i, B, F, N] = sum over K with the r-coordinate in group i of
                             lhs[B, F, K] * rhs[B, K, N]

       Empty groups give exact zeros.  out: [g, B..., F..., N...].
    3. r is in B (ragged batch; rhs has no group dim): a plain batched dot,
       group_sizes does not change the result.  out: [B..., F..., N...].

    group_sizes is [g] (broadcast) or ``lhs.shape[prefix] + (g,)``, the prefix
    being B plus the dims of F (mode 1, ascending) or K (mode 2, listed order)
    that precede r; in mode 3 the prefix is the batch dims listed before r.
    Each group-size row is validated (>= 0, sum <= size of dim r).

    group_offset is not supported here (NotImplementedError); use ragged_dot or gmm.
    """
    del precision
    if group_offset is not None:
        raise NotImplementedError(
            "group_offset is only implemented by ragged_dot and gmm."
        )
    lhs, rhs = np.asarray(lhs), np.asarray(rhs)
    gs = _group_sizes_array(group_sizes)
    (lhs_contract, rhs_contract, lhs_batch, rhs_batch, lhs_ragged,
     rhs_group) = _unpack_dimension_numbers(ragged_dot_dimension_numbers)
    if len(lhs_ragged) != 1:
        raise ValueError("ragged_dot_general expects exactly one lhs ragged dimension.")
    if len(lhs_contract) != len(rhs_contract) or len(lhs_batch) != len(rhs_batch):
        raise ValueError("lhs and rhs must list as many contracting and batch dims.")
    r = lhs_ragged[0]
    lhs_free = _remaining(lhs.ndim, lhs_contract, lhs_batch)
    rhs_free = _remaining(rhs.ndim, rhs_contract, rhs_batch, rhs_group)
    out_dtype = _result_dtype(lhs, rhs, preferred_element_type)
    acc_dtype = _accumulator_dtype(out_dtype)
    nb, nc, nf = len(lhs_batch), len(lhs_contract), len(lhs_free)

    if r in lhs_free:
        # Mode 1.  lhs as [B, F, K]: the prefix dims and r are its leading axes.
        if len(rhs_group) != 1:
            raise ValueError("mode 1 (ragged non-contracting) needs exactly one rhs group dim.")
        lhs_t = lhs.transpose(lhs_batch + lhs_free + lhs_contract).astype(acc_dtype)
        rhs_t = rhs.transpose(rhs_group + rhs_batch + rhs_contract + rhs_free)
        rhs_t = rhs_t.astype(acc_dtype)
        ragged_axis = nb + lhs_free.index(r)
        gs_full = _broadcast_group_sizes(gs, lhs_t.shape[:ragged_axis])
        num_groups = gs_full.shape[-1]
        if rhs_t.shape[0] != num_groups:
            raise ValueError(
                f"rhs group dim has size {rhs_t.shape[0]}, expected {num_groups}."
            )
        _check_group_sizes(gs_full, lhs_t.shape[ragged_axis], "the lhs ragged dim size")
        starts, ends = _group_bounds(gs_full)
        out = np.zeros(lhs_t.shape[:nb + nf] + rhs_t.shape[1 + nb + nc:], acc_dtype)
        for i in range(num_groups):
            mask = _group_mask(starts, ends, i, lhs_t.shape[ragged_axis], out.ndim)
            product = _matmul_blocks(lhs_t, rhs_t[i], nb, nf, nc)
            out = np.where(mask, product, out)
        return out.astype(out_dtype)

    if r in lhs_contract:
        # Mode 2.  lhs as [B, K, F] and rhs as [B, K, N]: prefix and r lead both.
        if rhs_group:
            raise ValueError("mode 2 (ragged contracting) takes no rhs group dim.")
        lhs_t = lhs.transpose(lhs_batch + lhs_contract + lhs_free).astype(acc_dtype)
        rhs_t = rhs.transpose(rhs_batch + rhs_contract + rhs_free).astype(acc_dtype)
        ragged_axis = nb + lhs_contract.index(r)
        gs_full = _broadcast_group_sizes(gs, lhs_t.shape[:ragged_axis])
        num_groups = gs_full.shape[-1]
        _check_group_sizes(gs_full, lhs_t.shape[ragged_axis], "the lhs ragged dim size")
        starts, ends = _group_bounds(gs_full)
        # Move F after K's end for the matmul helper: [B, K, F] -> [B, F, K].
        k_axes = list(range(nb, nb + nc))
        f_axes = list(range(nb + nc, nb + nc + nf))
        to_bfk = list(range(nb)) + f_axes + k_axes
        outs = []
        for i in range(num_groups):
            # Both operands are masked (as jax does), so non-finite values
            # outside group i never reach out[i].
            ragged_size = lhs_t.shape[ragged_axis]
            lhs_i = np.where(_group_mask(starts, ends, i, ragged_size, lhs_t.ndim), lhs_t, 0)
            rhs_i = np.where(_group_mask(starts, ends, i, ragged_size, rhs_t.ndim), rhs_t, 0)
            lhs_i = lhs_i.transpose(to_bfk)
            outs.append(_matmul_blocks(lhs_i, rhs_i, nb, nf, nc))
        out_shape = ((num_groups,) + lhs_t.shape[:nb] + lhs_t.shape[nb + nc:]
                     + rhs_t.shape[nb + nc:])
        out = np.stack(outs) if outs else np.zeros(out_shape, acc_dtype)
        return out.reshape(out_shape).astype(out_dtype)

    if r in lhs_batch:
        # Mode 3: group_sizes is validated but does not change the result.
        if rhs_group:
            raise ValueError("mode 3 (ragged batch) takes no rhs group dim.")
        ragged_index = lhs_batch.index(r)
        prefix_shape = tuple(lhs.shape[d] for d in lhs_batch[:ragged_index])
        gs_full = _broadcast_group_sizes(gs, prefix_shape)
        _check_group_sizes(gs_full, lhs.shape[r], "the lhs ragged dim size")
        lhs_t = lhs.transpose(lhs_batch + lhs_free + lhs_contract).astype(acc_dtype)
        rhs_t = rhs.transpose(rhs_batch + rhs_contract + rhs_free).astype(acc_dtype)
        return _matmul_blocks(lhs_t, rhs_t, nb, nf, nc).astype(out_dtype)

    raise ValueError(f"lhs ragged dimension {r} is not a dimension of lhs (rank {lhs.ndim}).")


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
    lhs, rhs = np.asarray(lhs), np.asarray(rhs)
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
    out_dtype = _megablox_out_dtype(lhs, rhs, preferred_element_type, existing_out)
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
    lhs, rhs = np.asarray(lhs), np.asarray(rhs)
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
    out_dtype = _megablox_out_dtype(lhs, rhs, preferred_element_type, existing_out)
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


# The MoE layer's statement in plain NumPy lives in its own module (it too
# imports only numpy); it is part of the oracle.
from ._moe_reference import moe_block, ragged_gather, ragged_gather_reduce  # noqa: E402
