"""megablox's grouped matmuls, gmm and tgmm, on the same C kernels as ragged_dot."""
from . import _gateway as gw
from . import _validate as v
from ._ops import _group_bounds

__all__ = ["gmm", "tgmm"]


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
        if existing is not None and existing.dtype != dt:
            raise ValueError(f"{fn}: 'existing_out' has dtype {existing.dtype} but "
                             f"preferred_element_type is {dt}; they must match")
        return dt
    if existing is not None:
        return existing.dtype
    return gw.compute_dtype(v.promote(lt, rt, fn))


def gmm(lhs, rhs, group_sizes, preferred_element_type=None, tiling=None, group_offset=None,
        existing_out=None, transpose_rhs=False, *, out=None):
    """Grouped matmul (megablox ``gmm``): ``lhs[s_i:s_i+size_i] @ rhs[i]`` for each group i.

    Args:
      lhs: ``[m, k]``.
      rhs: ``[g_local, k, n]``, or ``[g_local, n, k]`` when ``transpose_rhs``
        (read through strides, never copied).
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

    Returns:
      ``[m, n]`` (``out`` when given): ``out[r] = lhs[r] @ rhs[i - group_offset]``
      for rows r of a local group i; other rows from ``existing_out`` or 0.
    """
    fn = "gmm"
    lhs = v.as_array(lhs, "lhs", fn, ndim=2, shape_doc=" [m, k]")
    rhs = v.as_array(rhs, "rhs", fn, ndim=3, shape_doc=" [g, n, k]" if transpose_rhs else " [g, k, n]")
    lt = v.float_dtype(lhs, "lhs", fn)
    rt = v.float_dtype(rhs, "rhs", fn)
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
    bounds = _group_bounds(gs, 0 if group_offset is None else group_offset, w.shape[0], fn)
    ct = gw.compute_dtype(lt, rt, out_dtype)
    res = gw.result_buffer(out, existing, (m, n), out_dtype, ct, fn, {"lhs": lhs, "rhs": rhs})
    if existing is None:
        res[:bounds[0]] = 0
        res[bounds[-1]:] = 0
    gw.rows(lhs, w, bounds, res)
    return gw.deliver(res, out, out_dtype)


def tgmm(lhs, rhs, group_sizes, preferred_element_type=None, tiling=None, group_offset=None,
         num_actual_groups=None, existing_out=None, *, out=None):
    """Transposed grouped matmul (megablox ``tgmm``), the weight gradient of gmm.

    ``out[j] = lhs[:, rows] @ rhs[rows, :]`` where ``rows`` are the rows of group
    ``group_offset + j``; an empty group gives zeros.

    Args:
      lhs: ``[k, m]`` (e.g. ``x.T``, read through strides).
      rhs: ``[m, n]``.
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

    Returns:
      ``[num_actual_groups, k, n]`` (``out`` when given). Each thread owns
      whole output tiles, so no reduction across threads is needed.
    """
    fn = "tgmm"
    lhs = v.as_array(lhs, "lhs", fn, ndim=2, shape_doc=" [k, m]")
    rhs = v.as_array(rhs, "rhs", fn, ndim=2, shape_doc=" [m, n]")
    lt = v.float_dtype(lhs, "lhs", fn)
    rt = v.float_dtype(rhs, "rhs", fn)
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
    bounds = _group_bounds(gs, start, count, fn)
    shape = (count, k, n)
    existing = _existing_array(existing_out, shape, fn)
    out_dtype = _out_dtype(preferred_element_type, lt, rt, existing, fn)
    ct = gw.compute_dtype(lt, rt, out_dtype)
    res = gw.result_buffer(out, existing, shape, out_dtype, ct, fn, {"lhs": lhs, "rhs": rhs})
    gw.contract(lhs, rhs, bounds, res, accumulate=existing is not None)
    return gw.deliver(res, out, out_dtype)
