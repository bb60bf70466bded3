"""megablox's make_group_metadata and grouped matmuls gmm and tgmm, with the
derivative rules of gmm and tgmm (megablox ops.py), on the same kernels as
ragged_dot."""
import numpy as np

from . import _autodiff
from . import _gateway as gw
from . import _operand
from . import _precision
from . import _validate as v
from ._prepack import PackedRhs, meet

__all__ = ["make_group_metadata", "gmm", "tgmm"]


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


def _check_tiling(tiling, m, k, n, fn):
    """megablox's `tiling`: (tm, tk, tn) or a callable (m, k, n) -> (tm, tk, tn).

    The CPU kernels choose their own cache blocking (see build_info()), so the
    value is only checked: three positive integers."""
    if tiling is None:
        return None
    if callable(tiling):
        tiling = tiling(m, k, n)
        if tiling is None:
            raise ValueError(f"{fn}: no tuned tiling found for (m, k, n) = ({m}, {k}, {n})")
    try:
        parts = tuple(v.index(t, "tiling", fn) for t in tiling)
    except TypeError:
        raise TypeError(f"{fn}: 'tiling' must be a 3-tuple of ints or a callable, got {tiling!r}") from None
    if len(parts) != 3 or min(parts) < 1:
        raise ValueError(f"{fn}: 'tiling' must be three positive ints (tm, tk, tn), got {tiling!r}")
    return parts


def _existing_array(existing_out, shape, fn):
    if existing_out is None:
        return None
    arr = v.as_array(existing_out, "existing_out", fn)
    v.float_dtype(arr, "existing_out", fn)
    if arr.shape != tuple(shape):
        raise ValueError(f"{fn}: 'existing_out' must have shape {tuple(shape)}, got {arr.shape}")
    return arr


def _out_dtype(preferred_element_type, lt, rt, existing, fn):
    """megablox's output dtype: preferred_element_type (existing_out must then
    have it), else existing_out's dtype, else float32 (float64 when an input is
    float64: the CPU has no reason to round a float64 problem)."""
    if preferred_element_type is not None:
        dt = v.output_dtype(preferred_element_type, None, fn)
        if existing is not None and v.native(existing.dtype) != dt:
            raise ValueError(f"{fn}: 'existing_out' has dtype {existing.dtype} but "
                             f"preferred_element_type is {dt}; they must match")
        return dt
    if existing is not None:
        return v.native(existing.dtype)
    return gw.compute_dtype(v.promote(lt, rt))


def gmm(lhs, rhs, group_sizes, preferred_element_type=None, tiling=None, group_offset=None,
        existing_out=None, transpose_rhs=False, *, out=None, precision=None):
    """Grouped matmul (megablox ``gmm``): ``lhs[s_i:s_i+size_i] @ rhs[i]`` for each group i.

    Args:
      lhs: ``[m, k]``.
      rhs: ``[g_local, k, n]``, or ``[g_local, n, k]`` when ``transpose_rhs``;
        or a :class:`~raggeddot.PackedRhs` of ``[g_local, k, n]`` weights
        (read through strides, never copied). Either operand may be a
        :class:`~raggeddot.QArray` with any tiling, read as its dequantized
        value (dequantized while packed).
      group_sizes: ``[g]`` integers, ``sum <= m``; ``g == g_local`` unless
        ``group_offset`` is given.
      preferred_element_type: output dtype; default existing_out's dtype, else
        float32 (float64 when an input is float64), as megablox.
      tiling: megablox's ``(tm, tk, tn)`` or a callable; checked and otherwise
        unused (the CPU kernel's blocking is in ``build_info()``).
      group_offset: rhs holds groups ``[group_offset, group_offset + g_local)``
        (None means 0; g_local may be less than g); only rows of those groups
        are computed.
      existing_out: ``[m, n]``; rows not computed keep its values (otherwise
        they are 0). Computed rows are overwritten, as megablox does.
      transpose_rhs: use ``rhs[i].T`` (rhs given as ``[g_local, n, k]``).
      out: optional ``[m, n]`` array of the result's dtype to write into
        (NumPy's ``out=``); it may be ``existing_out`` itself, which is then
        updated in place, but must not share memory with lhs or rhs.
      precision: as for ``ragged_dot`` (not megablox's: keyword only, as
        tgmm's); ``"highest"`` multiplies 16-bit operands exactly in float32
        instead of on the fastest bfloat16 kernels.

    Returns:
      ``[m, n]`` (``out`` when given): ``out[r] = lhs[r] @ rhs[i - group_offset]``
      for rows r of a local group i; other rows from ``existing_out`` or 0.
    """
    fn = "gmm"
    # a PackedRhs: weights laid out once as [g_local, k, n] (prepack's transpose_rhs says how they came)
    # an AsQArray lhs of one int8 scale a row: quantized by the kernels while they pack it, where they can
    lhs, rhs, lt, rt, quantize_lhs = _operand.operands(lhs, rhs, fn, " [m, k]",
                                                       " [g, n, k]" if transpose_rhs else " [g, k, n]",
                                                       packed=True, transposed=transpose_rhs, in_kernel=True)
    packed = isinstance(rhs, PackedRhs)
    w = rhs.transpose(0, 2, 1) if transpose_rhs else rhs      # [g_local, k, n] view
    m, k = lhs.shape
    if w.shape[1] != k:
        axis = 2 if transpose_rhs else 1
        raise ValueError(
            f"{fn}: contracting dimensions differ: 'lhs' has k={k} (shape {lhs.shape}) but 'rhs' "
            f"has {w.shape[1]} on axis {axis} (shape {rhs.shape}, transpose_rhs={bool(transpose_rhs)})"
        )
    n = w.shape[2]
    _check_tiling(tiling, m, k, n, fn)
    existing = _existing_array(existing_out, (m, n), fn)
    out_dtype = _out_dtype(preferred_element_type, lt, rt, existing, fn)
    gs, _ = v.group_sizes_array(group_sizes, fn, limit=m)
    # megablox: group_offset None means 0, and rhs may hold fewer groups than group_sizes
    start = v.local_group_start(0 if group_offset is None else group_offset, gs.shape[0], w.shape[0], fn)
    bounds = gw.group_bounds(gs, start, w.shape[0])
    ct = gw.compute_dtype(lt, rt, out_dtype)
    algo = _precision.resolve(precision, lt, rt, ct, fn, packed=rhs if packed else None)
    inputs = {"lhs": _operand.storage(lhs), "rhs": _operand.storage(rhs)}
    gw.check_out(out, existing, (m, n), out_dtype, fn, inputs)
    if packed:   # the layout for this lhs (prepack's rule), checked, then made if it is new
        lhs, w = meet(rhs, lhs, ct, fn, quantize_lhs=quantize_lhs, exact=(algo == "exact"))
    with v.memory_for(fn, "the result [m, n]"):
        res = gw.result_buffer(out, existing, (m, n), out_dtype, ct, fn, inputs)
    with v.memory_for(fn, "the kernels' packed panels of lhs and rhs"):
        _operand.product_rows(lhs, w, bounds, res, algo, quantize_lhs, fn)
    if existing is None:      # (rows of no local group, after the kernels: a refused call writes nothing)
        res[:bounds[0]] = 0
        res[bounds[-1]:] = 0
    with v.memory_for(fn, f"the result [m, n] in {out_dtype}"):
        return gw.deliver(res, out, out_dtype)


def tgmm(lhs, rhs, group_sizes, preferred_element_type=None, tiling=None, group_offset=None,
         num_actual_groups=None, existing_out=None, *, out=None, precision=None):
    """Transposed grouped matmul (megablox ``tgmm``), the weight gradient of gmm.

    ``out[j] = lhs[:, rows] @ rhs[rows, :]`` where ``rows`` are the rows of group
    ``group_offset + j``; an empty group gives zeros.

    Args:
      lhs: ``[k, m]`` (e.g. ``x.T``, read through strides).
      rhs: ``[m, n]``. Either operand may be a :class:`~raggeddot.QArray`;
        each value is dequantized with the scale of its own tile, so scale
        blocks along m (the reduction) need not match the group bounds.
      group_sizes: ``[g]`` integers, ``sum <= m``.
      preferred_element_type: output dtype; default existing_out's dtype, else
        float32 (float64 when an input is float64), as megablox.
      tiling: megablox's ``(tm, tk, tn)`` or a callable; checked, otherwise unused.
      group_offset: first group computed (default 0).
      num_actual_groups: number of groups computed (default ``len(group_sizes)``,
        so it must be given with a group_offset).
      existing_out: ``[num_actual_groups, k, n]``, added to the result.
      out: optional ``[num_actual_groups, k, n]`` array of the result's dtype
        to write into (NumPy's ``out=``). It may be ``existing_out`` itself,
        which then accumulates in place (``out += lhs_g @ rhs_g``), but must
        not share memory with lhs or rhs. The result is ``g/size`` times
        larger than the forward's when groups are small; a fresh array that
        size costs the OS's zeroing of every new page, which reusing one
        buffer across calls (a gradient buffer in a training loop) avoids.
      precision: as for ``ragged_dot`` (not megablox's: keyword only);
        ``"highest"`` multiplies 16-bit operands exactly in float32 instead
        of on the fastest bfloat16 kernels.

    Returns:
      ``[num_actual_groups, k, n]`` (``out`` when given). Each thread owns
      whole output tiles, so no reduction across threads is needed.
    """
    fn = "tgmm"
    lhs, rhs, lt, rt, _ = _operand.operands(lhs, rhs, fn, " [k, m]", " [m, n]")
    k, m = lhs.shape
    if rhs.shape[0] != m:
        raise ValueError(
            f"{fn}: ragged dimensions differ: 'lhs' [k, m] has m={m} (shape {lhs.shape}) "
            f"but 'rhs' [m, n] has m={rhs.shape[0]} (shape {rhs.shape})"
        )
    n = rhs.shape[1]
    _check_tiling(tiling, m, k, n, fn)
    gs, _ = v.group_sizes_array(group_sizes, fn, limit=m, limit_doc="lhs.shape[1]")
    g = gs.shape[0]
    start = 0 if group_offset is None else v.index(group_offset, "group_offset", fn)
    if not 0 <= start <= g:
        raise ValueError(f"{fn}: 'group_offset'={start} must be in [0, len(group_sizes)={g}]")
    # megablox: num_actual_groups defaults to len(group_sizes), so with a
    # group_offset it must be given
    count = g if num_actual_groups is None else v.index(num_actual_groups, "num_actual_groups", fn)
    if count < 0 or start + count > g:
        raise ValueError(
            f"{fn}: 'num_actual_groups'={count} with group_offset={start} exceeds len(group_sizes)={g}"
            + (" (num_actual_groups defaults to len(group_sizes); pass it with group_offset)"
               if num_actual_groups is None else "")
        )
    bounds = gw.group_bounds(gs, start, count)
    shape = (count, k, n)
    existing = _existing_array(existing_out, shape, fn)
    out_dtype = _out_dtype(preferred_element_type, lt, rt, existing, fn)
    ct = gw.compute_dtype(lt, rt, out_dtype)
    algo = _precision.resolve(precision, lt, rt, ct, fn)
    with v.memory_for(fn, "the result [num_actual_groups, k, n]"):
        res = gw.result_buffer(out, existing, shape, out_dtype, ct, fn,
                               {"lhs": _operand.storage(lhs), "rhs": _operand.storage(rhs)})
    with v.memory_for(fn, "the kernels' packed panels of lhs and rhs"):
        gw.contract(lhs, rhs, bounds, res, accumulate=existing is not None, algo=algo)
    with v.memory_for(fn, f"the result [num_actual_groups, k, n] in {out_dtype}"):
        return gw.deliver(res, out, out_dtype)


# ---------------------------------------------------------------------------
# Derivative rules (megablox ops.py)
# ---------------------------------------------------------------------------
# gmm: out[rows_i] = lhs[rows_i] @ w[i - off] (w = rhs, or rhs^T per group when
# transpose_rhs) for the local groups; other rows are existing_out's (or 0).
#   d_lhs = gmm(ct, rhs, transpose_rhs=not transpose_rhs)
#   d_rhs = tgmm(lhs^T, ct) [g_local, k, n], or tgmm(ct^T, lhs) [g_local, n, k] when transpose_rhs
#   d_existing_out = ct with the computed rows zeroed


def _computed_rows(gs, off, num_local):
    """[first, last): the rows of groups [off, off + num_local) (contiguous)."""
    sizes = np.asarray(gs).astype(np.int64)
    start = 0 if off is None else v.index(off, "group_offset", "gmm")
    ends = np.concatenate([[0], np.cumsum(sizes)])
    return int(ends[start]), int(ends[start + num_local])


def _gmm_vjp(a, wanted):
    lhs, rhs, gs, out, cdt = _autodiff.primal(gmm, a)
    off, tr, prec = a["group_offset"], bool(a["transpose_rhs"]), a["precision"]
    g_local = rhs.shape[0]

    def backward(ct):
        ct = ct.astype(cdt, copy=False)
        grads = {}
        if "lhs" in wanted:
            w = rhs.unpack() if isinstance(rhs, PackedRhs) else rhs    # (laid out for B, not B^T)
            grads["lhs"] = gmm(ct, w, gs, preferred_element_type=cdt, group_offset=off,
                               transpose_rhs=not tr, precision=prec)
        if "rhs" in wanted:
            if tr:  # rhs is [g_local, n, k]: tgmm(ct^T [n, m], lhs [m, k])
                grads["rhs"] = tgmm(ct.T, lhs, gs, preferred_element_type=cdt, group_offset=off,
                                    num_actual_groups=g_local, precision=prec)
            else:
                grads["rhs"] = tgmm(lhs.T, ct, gs, preferred_element_type=cdt, group_offset=off,
                                    num_actual_groups=g_local, precision=prec)
        if "existing_out" in wanted:
            first, last = _computed_rows(gs, off, g_local)
            d = np.array(ct, copy=True)
            d[first:last] = 0
            grads["existing_out"] = d
        return grads

    return out, backward


def _gmm_jvp(a, t):
    lhs, rhs, gs, out, cdt = _autodiff.primal(gmm, a)
    off, tr = a["group_offset"], bool(a["transpose_rhs"])
    kw = dict(preferred_element_type=cdt, group_offset=off, transpose_rhs=tr, precision=a["precision"])
    terms = []
    if t.get("lhs") is not None:
        terms.append(gmm(t["lhs"], rhs, gs, **kw))
    if t.get("rhs") is not None:
        terms.append(gmm(lhs, t["rhs"], gs, **kw))
    if t.get("existing_out") is not None:
        first, last = _computed_rows(gs, off, rhs.shape[0])
        d = np.array(t["existing_out"], dtype=cdt, copy=True)
        d[first:last] = 0
        terms.append(d)
    return out, _autodiff.sum_terms(terms, out)


# tgmm: out[j] = lhs[:, rows_i] @ rhs[rows_i] (+ existing_out[j]), i = off + j.
#   d_lhs[:, rows_i] = ct[j] @ rhs[rows_i]^T  ->  d_lhs = gmm(rhs, ct^T, gs, group_offset=off)^T
#   d_rhs[rows_i]    = lhs[:, rows_i]^T @ ct[j] ->  d_rhs = gmm(lhs^T, ct, gs, group_offset=off)
#   d_existing_out = ct
# (positions of no computed group, rows past sum(gs) included, get 0.)


def _tgmm_start(a):
    return 0 if a["group_offset"] is None else v.index(a["group_offset"], "group_offset", "tgmm")


def _tgmm_vjp(a, wanted):
    lhs, rhs, gs, out, cdt = _autodiff.primal(tgmm, a)
    start = _tgmm_start(a)

    def backward(ct):
        ct = ct.astype(cdt, copy=False)
        grads = {}
        if "lhs" in wanted:  # [m, n] x [count, n, k] -> [m, k] -> [k, m]
            d = gmm(rhs, ct.transpose(0, 2, 1), gs, preferred_element_type=cdt, group_offset=start,
                    precision=a["precision"])
            grads["lhs"] = np.ascontiguousarray(d.T)
        if "rhs" in wanted:  # [m, k] x [count, k, n] -> [m, n]
            grads["rhs"] = gmm(lhs.T, ct, gs, preferred_element_type=cdt, group_offset=start,
                               precision=a["precision"])
        if "existing_out" in wanted:
            grads["existing_out"] = np.array(ct, copy=True)
        return grads

    return out, backward


def _tgmm_jvp(a, t):
    lhs, rhs, gs, out, cdt = _autodiff.primal(tgmm, a)
    kw = dict(preferred_element_type=cdt, group_offset=a["group_offset"],
              num_actual_groups=out.shape[0], precision=a["precision"])
    terms = []
    if t.get("lhs") is not None:
        terms.append(tgmm(t["lhs"], rhs, gs, **kw))
    if t.get("rhs") is not None:
        terms.append(tgmm(lhs, t["rhs"], gs, **kw))
    if t.get("existing_out") is not None:
        terms.append(t["existing_out"].astype(cdt))
    return out, _autodiff.sum_terms(terms, out)


_autodiff.defvjp(gmm, _gmm_vjp, ("lhs", "rhs", "existing_out"))
_autodiff.defjvp(gmm, _gmm_jvp, ("lhs", "rhs", "existing_out"), packed_argnames=("rhs",))
_autodiff.defvjp(tgmm, _tgmm_vjp, ("lhs", "rhs", "existing_out"))
_autodiff.defjvp(tgmm, _tgmm_jvp, ("lhs", "rhs", "existing_out"))
