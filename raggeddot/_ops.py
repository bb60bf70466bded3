"""ragged_dot and make_group_metadata: validation here, arithmetic through the gateway."""
import numpy as np

from . import _gateway as gw
from . import _validate as v

__all__ = ["ragged_dot", "make_group_metadata"]


def _group_bounds(gs, group_offset, num_local, fn):
    """Row boundaries [num_local + 1] of groups [group_offset, group_offset + num_local)."""
    start = v.local_group_start(group_offset, gs.shape[0], num_local, fn)
    return gw.group_bounds(gs, start, num_local)


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None, *,
               out=None):
    """Grouped matrix multiplication with the semantics of ``jax.lax.ragged_dot``.

    The rows of ``lhs`` are split into consecutive groups; group ``i`` owns rows
    ``[s_i, s_i + group_sizes[i])`` with ``s_i = sum(group_sizes[:i])``, and::

        out[r, :] = lhs[r, :] @ rhs[i]      for every row r of group i
        out[r, :] = 0                        for r >= sum(group_sizes)

    Args:
      lhs: ``[m, k]`` float array (float16, bfloat16, float32 or float64).
      rhs: ``[g, k, n]`` float array, one ``[k, n]`` matrix per group.
      group_sizes: ``[g]`` integers, non-negative, ``sum(group_sizes) <= m``.
      precision: accepted for compatibility with jax (None, "default", "high",
        "highest" or a ``jax.lax.Precision``); the CPU always accumulates in at
        least float32.
      preferred_element_type: dtype of the result; default is the promoted type
        of lhs and rhs (the wider float wins; float16 with bfloat16 is an error).
      group_offset: megablox's expert sharding. When given, ``rhs`` holds only
        groups ``[group_offset, group_offset + rhs.shape[0])`` of the
        ``len(group_sizes)`` groups; rows of those groups are computed and all
        other rows are 0.
      out: optional ``[m, n]`` array of the result's dtype to write the result
        into (NumPy's ``out=``; it must not share memory with lhs or rhs). A
        caller that reuses one buffer across calls skips the page faults of a
        fresh large array.

    Returns:
      ``[m, n]`` array (``out`` when given). Products accumulate in float32
      (float64 when an input or the output is float64) and are cast once at
      the end.

    Runs on the tiled C kernel: one list of (group, row block, column block)
    tiles over all groups, shared by the threads (see ``set_num_threads``).
    Results do not depend on the number of threads.
    """
    fn = "ragged_dot"
    lhs = v.as_array(lhs, "lhs", fn, ndim=2, shape_doc=" [m, k]")
    rhs = v.as_array(rhs, "rhs", fn, ndim=3, shape_doc=" [g, k, n]")
    lt = v.float_dtype(lhs, "lhs", fn)
    rt = v.float_dtype(rhs, "rhs", fn)
    out_dtype = v.output_dtype(preferred_element_type, v.promote(lt, rt, fn), fn)
    v.check_precision(precision, fn)
    m, k = lhs.shape
    if rhs.shape[1] != k:
        raise ValueError(
            f"{fn}: contracting dimensions differ: 'lhs' has k={k} (shape {lhs.shape}) "
            f"but 'rhs' has k={rhs.shape[1]} (shape {rhs.shape})"
        )
    gs, _ = v.group_sizes_array(group_sizes, fn, limit=m)
    bounds = _group_bounds(gs, group_offset, rhs.shape[0], fn)

    ct = gw.compute_dtype(lt, rt, out_dtype)
    n = rhs.shape[2]
    res = gw.result_buffer(out, None, (m, n), out_dtype, ct, fn, {"lhs": lhs, "rhs": rhs})
    res[:bounds[0]] = 0
    res[bounds[-1]:] = 0
    gw.rows(lhs, rhs, bounds, res)
    return gw.deliver(res, out, out_dtype)


def make_group_metadata(*, group_sizes, m, tm, start_group=0, num_nonzero_groups=None,
                        visit_empty_groups=True):
    """megablox's tile metadata for a grouped matmul with row tiles of ``tm``.

    A tiled kernel visits (group, m-tile) pairs; a tile that straddles a group
    boundary is visited once per group it holds. With ``tiles_m = m // tm`` and
    ``g = len(group_sizes)``:

    1. ``group_offsets = [0, cumsum(group_sizes)...]``  (int32 ``[g + 1]``).
    2. Group i needs ``(round_up(end_i, tm) - round_down(start_i, tm)) // tm``
       tiles; an empty group needs 0, or 1 when ``visit_empty_groups`` (tgmm
       must still zero its output).
    3. ``group_ids``: each group id repeated by its tile count, padded (with the
       last group id) or cut to ``tiles_m + g - 1`` entries.
    4. ``m_tile_ids``: tile t repeated once, plus once for every non-empty group
       starting strictly inside it (and every empty group falling in it when
       ``visit_empty_groups``), padded or cut the same way.
    5. Both lists are rolled left past the entries of groups before
       ``start_group``; ``num_tiles`` counts the tiles of groups
       ``[start_group, start_group + num_nonzero_groups)``.

    Returns:
      ``((group_offsets, group_ids, m_tile_ids), num_tiles)``: three int32
      arrays and an int, equal element for element to megablox's.
    """
    fn = "make_group_metadata"
    gs, total = v.group_sizes_array(group_sizes, fn)
    g = gs.shape[0]
    if g < 1:
        raise ValueError(f"{fn}: 'group_sizes' must hold at least one group, got shape {gs.shape}")
    m = v.index(m, "m", fn)
    tm = v.index(tm, "tm", fn)
    if tm < 1:
        raise ValueError(f"{fn}: 'tm' must be positive, got {tm}")
    if m < 1:
        raise ValueError(f"{fn}: 'm' must be positive, got {m}")
    if m % tm:
        raise ValueError(f"{fn}: m={m} must be divisible by the m-dimension tile size tm={tm}")
    if m > np.iinfo(np.int32).max:
        raise ValueError(f"{fn}: m={m} does not fit the int32 metadata")
    if total > m:
        raise ValueError(f"{fn}: sum(group_sizes)={total} exceeds m={m}")
    start_group = v.index(start_group, "start_group", fn)
    if not 0 <= start_group < g:
        raise ValueError(f"{fn}: 'start_group'={start_group} must be in [0, {g})")
    if num_nonzero_groups is None:
        num_nonzero_groups = g - start_group
    num_nonzero_groups = v.index(num_nonzero_groups, "num_nonzero_groups", fn)
    if num_nonzero_groups < 0 or start_group + num_nonzero_groups > g:
        raise ValueError(
            f"{fn}: 'num_nonzero_groups'={num_nonzero_groups} with start_group={start_group} "
            f"exceeds the {g} groups"
        )
    return gw.group_metadata(gs, m, tm, start_group, num_nonzero_groups, visit_empty_groups)
