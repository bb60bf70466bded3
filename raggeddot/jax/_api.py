"""ragged_dot, ragged_dot_general, gmm and tgmm on jax arrays: shape and
dtype checks at trace time, then one of the two primitives of ``_prims``
(which lower to the FFI custom calls). Group sizes stay runtime operands;
when they are concrete they are also checked here, with the NumPy API's
messages, and under ``jax.jit`` the custom call checks them when it runs."""
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import _megablox
from .. import _precision
from .. import _validate as v
from .._ragged_dot_general import _dimension_numbers
from ._prims import contract_p, rows_p

__all__ = ["ragged_dot", "ragged_dot_general", "gmm", "tgmm"]

_READ = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16), np.dtype(jnp.bfloat16))


def _operand(x, name, fn, ndim=None):
    x = jnp.asarray(x)
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{fn}: '{name}' must be {ndim}-D, got shape {x.shape}")
    if x.dtype not in _READ:
        raise TypeError(f"{fn}: '{name}' has dtype {x.dtype}; expected float16, bfloat16, float32 or float64")
    return x


def _compute(lt, rt, out_dtype):
    """The dtype the custom call writes: float64 when anything is float64,
    else the output dtype itself (float32, float16 or bfloat16)."""
    f64 = np.dtype(np.float64)
    if f64 in (np.dtype(lt), np.dtype(rt), np.dtype(out_dtype)):
        return f64
    return np.dtype(out_dtype) if np.dtype(out_dtype) in _READ else np.dtype(np.float32)


def _concrete(x):
    try:
        return np.asarray(x) if not isinstance(x, jax.core.Tracer) else None
    except Exception:
        return None


def _group_sizes(group_sizes, fn, prefix, limit, limit_doc):
    """group_sizes as int32/int64 ``[B, G]`` (B = prod(prefix) or 1); checked
    now when concrete (negative entries, sums past `limit`)."""
    gs = jnp.asarray(group_sizes)
    if not jnp.issubdtype(gs.dtype, jnp.integer):
        raise TypeError(f"{fn}: 'group_sizes' must have an integer dtype, got {gs.dtype}")
    if gs.ndim == 0:
        raise ValueError(f"{fn}: 'group_sizes' must be at least 1-D [g], got a scalar")
    if gs.ndim > 1 and gs.shape[:-1] != tuple(prefix):
        raise ValueError(f"{fn}: 'group_sizes' must have shape [g] or {tuple(prefix) + gs.shape[-1:]}, "
                         f"got {gs.shape}")
    host = _concrete(gs)
    if host is not None and host.size:
        if host.min() < 0:
            i = tuple(int(j) for j in np.argwhere(host < 0)[0])
            raise ValueError(f"{fn}: 'group_sizes' has a negative entry: group_sizes{list(i)}={host[i]}")
        total = host.astype(np.int64).sum(axis=-1).max()
        if total > limit:
            raise ValueError(f"{fn}: sum(group_sizes)={total} exceeds {limit_doc}={limit}")
    if gs.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        gs = gs.astype(jnp.int32)
    return gs.reshape((-1, gs.shape[-1]))


def _offset(group_offset, g, local, fn, local_doc="rhs.shape[0]"):
    """group_offset as an int32 ``[1]`` operand; a Python int is checked now
    (None: 0, and then rhs must hold every group unless `local` is None)."""
    if group_offset is None:
        if local is not None and local != g:
            raise ValueError(f"{fn}: len(group_sizes)={g} does not match {local_doc}={local} "
                             "(the number of groups in 'rhs'); pass group_offset to shard the groups")
        return jnp.zeros((1,), jnp.int32)
    host = _concrete(group_offset)
    if host is not None:
        if host.size != 1 or host.dtype.kind not in "iu":
            raise TypeError(f"{fn}: 'group_offset' must be one integer, got {group_offset!r}")
        o = int(host.reshape(()))
        n = 0 if local is None else local
        if o < 0 or o + n > g:
            raise ValueError(f"{fn}: 'group_offset'={o} with {local_doc}={n} local groups must satisfy "
                             f"0 <= group_offset and group_offset + {local_doc} <= len(group_sizes)={g}")
    off = jnp.asarray(group_offset)
    if not jnp.issubdtype(off.dtype, jnp.integer) or off.size != 1:
        raise TypeError(f"{fn}: 'group_offset' must be one integer, got dtype {off.dtype} shape {off.shape}")
    return off.reshape((1,)).astype(jnp.int32)


def _types(lhs, rhs, preferred_element_type, precision, fn):
    """``(out_dtype, compute dtype, algo)``: the result's dtype as jax.lax
    gives it, the dtype the custom call writes, and what ``precision`` asks
    (``raggeddot._precision.resolve``; None reads jax's
    ``jax_default_matmul_precision``, as jax.lax does)."""
    out_dtype = v.output_dtype(preferred_element_type, v.promote(lhs.dtype, rhs.dtype), fn)
    cdt = _compute(lhs.dtype, rhs.dtype, out_dtype)
    if precision is None:
        precision = jax.config.jax_default_matmul_precision
    ct = np.dtype(np.float64 if cdt == np.float64 else np.float32)
    algo = _precision.resolve(precision, lhs.dtype, rhs.dtype, ct, fn)
    return out_dtype, cdt, algo


def _for_algorithm(algo, lhs, rhs):
    """The operands the custom call multiplies for ``algo``: "exact" on two
    bfloat16 operands widens them to float32 first, so that the kernels
    multiply them exactly (otherwise bfloat16 products take the fastest
    kernels this CPU has: AMX tiles, vdpbf16ps where it outruns the float32
    FMAs); "bf16" rounds float32 operands to bfloat16 (nearest even, jax's
    rounding), whose products the fastest bfloat16 kernels then sum in
    float32."""
    if algo == "exact" and lhs.dtype == jnp.bfloat16 and rhs.dtype == jnp.bfloat16:
        return lhs.astype(jnp.float32), rhs.astype(jnp.float32)
    if algo == "bf16":
        return tuple(a.astype(jnp.bfloat16) if a.dtype == jnp.float32 else a for a in (lhs, rhs))
    return lhs, rhs


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None):
    """``jax.lax.ragged_dot`` on raggeddot's kernels (an XLA FFI custom call).

    Group ``i`` owns rows ``[s_i, s_i + group_sizes[i])``, ``s_i = sum(group_sizes[:i])``::

        out[r, :] = lhs[r, :] @ rhs[i - group_offset]   for rows r of the groups rhs holds
        out[r, :] = 0                                    for every other row

    Args:
      lhs: ``[m, k]`` float16, bfloat16, float32 or float64 (read in place).
      rhs: ``[g, k, n]``; with ``group_offset`` the groups
        ``[group_offset, group_offset + g)`` of ``len(group_sizes)``.
      group_sizes: ``[G]`` integers (a runtime operand: under ``jax.jit`` a
        negative entry or a sum past m raises when the call runs).
      precision: as jax's, with its meanings as ``raggeddot.ragged_dot``
        gives them (None: jax's ``jax_default_matmul_precision``); on two
        bfloat16 operands the default takes the fastest kernels (AMX tiles
        where the CPU has them), HIGHEST the exact products (the operands
        widened to float32 first); BF16_BF16_F32 rounds float32 operands to
        bfloat16 first. A value refused raises when the call is traced.
      preferred_element_type: the output dtype; default the promoted dtype.
      group_offset: megablox's expert sharding, an int or an integer array
        (e.g. from ``jax.lax.axis_index`` under ``shard_map``).

    Returns ``[m, n]``. Differentiable (jvp, vjp, grad) and batchable (vmap).
    """
    fn = "ragged_dot"
    lhs = _operand(lhs, "lhs", fn, 2)
    rhs = _operand(rhs, "rhs", fn, 3)
    m, k = lhs.shape
    if rhs.shape[1] != k:
        raise ValueError(f"{fn}: contracting dimensions differ: 'lhs' has k={k} (shape {lhs.shape}) "
                         f"but 'rhs' has k={rhs.shape[1]} (shape {rhs.shape})")
    out_dtype, cdt, algo = _types(lhs, rhs, preferred_element_type, precision, fn)
    lhs, rhs = _for_algorithm(algo, lhs, rhs)
    gs = _group_sizes(group_sizes, fn, (), m, "lhs.shape[0]")
    if gs.shape[0] != 1:
        raise ValueError(f"{fn}: 'group_sizes' must be 1-D [g], got shape {jnp.shape(group_sizes)}")
    off = _offset(group_offset, gs.shape[1], rhs.shape[0], fn)
    out = rows_p.bind(lhs[None], rhs[None], gs, off, tl=False, tr=False, dtype=cdt)[0]
    return out.astype(out_dtype)


def _row_mask(gs, off, g, m):
    """[m] bool: rows of the groups [off, off + g)."""
    ends = jnp.cumsum(gs[0].astype(jnp.int32))
    starts = ends - gs[0].astype(jnp.int32)
    o = off[0]
    lo = jnp.where(g > 0, jax.lax.dynamic_index_in_dim(starts, jnp.minimum(o, gs.shape[1] - 1), keepdims=False), 0)
    hi = jnp.where(o + g > 0, jax.lax.dynamic_index_in_dim(ends, jnp.clip(o + g - 1, 0, gs.shape[1] - 1),
                                                           keepdims=False), 0)
    r = jnp.arange(m, dtype=jnp.int32)
    return (r >= lo) & (r < hi)


def gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=(128, 128, 128),
        group_offset=None, existing_out=None, transpose_rhs=False, interpret=False):
    """megablox ``gmm``: ``out[r] = lhs[r] @ rhs[i - group_offset]`` for rows r of
    the local groups ``[group_offset, group_offset + g_local)``; other rows
    come from ``existing_out``, or are 0.

    Args:
      lhs ``[m, k]``; rhs ``[g_local, k, n]`` (``[g_local, n, k]`` with
      ``transpose_rhs``, read through strides); group_sizes ``[G]``;
      preferred_element_type the output dtype (megablox's default float32);
      tiling checked and otherwise unused (the CPU kernels block for the
      cache themselves); group_offset an int or integer array (default 0);
      existing_out ``[m, n]``; interpret ignored.

    Returns ``[m, n]``. Differentiable and batchable as ragged_dot.
    """
    fn = "gmm"
    lhs = _operand(lhs, "lhs", fn, 2)
    rhs = _operand(rhs, "rhs", fn, 3)
    m, k = lhs.shape
    rk, n = (rhs.shape[2], rhs.shape[1]) if transpose_rhs else (rhs.shape[1], rhs.shape[2])
    if rk != k:
        raise ValueError(f"{fn}: contracting dimensions differ: 'lhs' has k={k} (shape {lhs.shape}) but 'rhs' "
                         f"has {rk} (shape {rhs.shape}, transpose_rhs={bool(transpose_rhs)})")
    _megablox._check_tiling(tiling, m, k, n, fn)
    out_dtype = v.output_dtype(preferred_element_type, None, fn)
    cdt = _compute(lhs.dtype, rhs.dtype, out_dtype)
    gs = _group_sizes(group_sizes, fn, (), m, "lhs.shape[0]")
    off = _offset(0 if group_offset is None else group_offset, gs.shape[1], rhs.shape[0], fn)
    out = rows_p.bind(lhs[None], rhs[None], gs, off, tl=False, tr=bool(transpose_rhs), dtype=cdt)[0]
    out = out.astype(out_dtype)
    if existing_out is not None:
        existing_out = jnp.asarray(existing_out)
        if existing_out.shape != (m, n):
            raise ValueError(f"{fn}: 'existing_out' must have shape {(m, n)}, got {existing_out.shape}")
        out = jnp.where(_row_mask(gs, off, rhs.shape[0], m)[:, None], out, existing_out.astype(out_dtype))
    return out


def tgmm(lhs, rhs, group_sizes, preferred_element_type=jnp.float32, tiling=(128, 128, 128),
         group_offset=None, num_actual_groups=None, existing_out=None, interpret=False):
    """megablox ``tgmm``: ``out[j] = lhs[:, rows] @ rhs[rows, :]`` over the rows of
    group ``group_offset + j`` (zeros for an empty group), plus ``existing_out``.

    Args:
      lhs ``[k, m]``; rhs ``[m, n]``; group_sizes ``[G]``; group_offset an int
      or integer array (default 0); num_actual_groups the number of groups
      computed (default G); existing_out ``[num_actual_groups, k, n]``, added;
      tiling checked; interpret ignored.

    Returns ``[num_actual_groups, k, n]``.
    """
    fn = "tgmm"
    lhs = _operand(lhs, "lhs", fn, 2)
    rhs = _operand(rhs, "rhs", fn, 2)
    k, m = lhs.shape
    if rhs.shape[0] != m:
        raise ValueError(f"{fn}: ragged dimensions differ: 'lhs' [k, m] has m={m} (shape {lhs.shape}) "
                         f"but 'rhs' [m, n] has m={rhs.shape[0]} (shape {rhs.shape})")
    n = rhs.shape[1]
    _megablox._check_tiling(tiling, m, k, n, fn)
    out_dtype = v.output_dtype(preferred_element_type, None, fn)
    cdt = _compute(lhs.dtype, rhs.dtype, out_dtype)
    gs = _group_sizes(group_sizes, fn, (), m, "lhs.shape[1]")
    g = gs.shape[1] if num_actual_groups is None else v.index(num_actual_groups, "num_actual_groups", fn)
    off = _offset(0 if group_offset is None else group_offset, gs.shape[1], g, fn, "num_actual_groups")
    out = contract_p.bind(lhs[None], rhs[None], gs, off, tl=False, tr=False, dtype=cdt, g=g)[0]
    out = out.astype(out_dtype)
    if existing_out is not None:
        existing_out = jnp.asarray(existing_out)
        if existing_out.shape != out.shape:
            raise ValueError(f"{fn}: 'existing_out' must have shape {out.shape}, got {existing_out.shape}")
        out = out + existing_out.astype(out_dtype)
    return out


# ------------------------------------------------------------ ragged_dot_general

def _permute(x, order):
    return x if tuple(order) == tuple(range(x.ndim)) else jnp.transpose(x, order)


def _prod(shape, dims):
    return math.prod(shape[d] for d in dims)


def ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, precision=None,
                       preferred_element_type=None, group_offset=None):
    """``jax.lax.ragged_dot_general`` in its three modes (``raggeddot.ragged_dot_general``
    states them), on the same custom calls as ragged_dot:

    1. ragged non-contracting ``[b..., m..., k...] x [g, b..., k..., n...] -> [b..., m..., n...]``;
    2. ragged contracting ``[b..., m..., k...] x [b..., k..., n...] -> [g, b..., m..., n...]``;
    3. ragged batch: a plain batched dot (group_sizes checked when concrete).

    Operands are permuted into ``[batch, rows, depth]`` order (a transpose only
    when their dims are not already in that order); free dims after the ragged
    one are folded into its rows (group sizes scaled), contracting or free
    dims before it that index group_sizes become batch entries. group_offset
    as in ragged_dot (mode 1 only).
    """
    fn = "ragged_dot_general"
    dn = _dimension_numbers(ragged_dot_dimension_numbers)
    lhs = _operand(lhs, "lhs", fn)
    rhs = _operand(rhs, "rhs", fn)
    out_dtype, cdt, algo = _types(lhs, rhs, preferred_element_type, precision, fn)
    lhs, rhs = _for_algorithm(algo, lhs, rhs)
    ls, rs = lhs.shape, rhs.shape
    lb, rb, lc, rc, lf, rf, r, groups = v.ragged_dimensions(dn, ls, rs, fn)
    bsz = _prod(ls, lb)
    if r in lf:
        before = tuple(d for d in lf if d < r)
        after = tuple(d for d in lf if d > r)
        gs = _group_sizes(group_sizes, fn, tuple(ls[d] for d in lb + before), ls[r], f"lhs.shape[{r}]")
        scale = _prod(ls, after)
        gs = gs * scale if scale != 1 else gs
        nb = _prod(ls, before)
        x = _permute(lhs, lb + lf + lc).reshape((bsz * nb, ls[r] * scale, _prod(ls, lc)))
        gd = groups[0]
        w = _permute(rhs, rb + (gd,) + rc + rf).reshape((bsz, rs[gd], _prod(rs, rc), _prod(rs, rf)))
        if nb > 1 and bsz > 1:   # the rhs of a batch entry serves every position before r
            w = jnp.repeat(w, nb, axis=0)
        off = _offset(group_offset, gs.shape[1], rs[gd], fn, f"rhs.shape[{gd}]")
        out = rows_p.bind(x, w, gs, off, tl=False, tr=False, dtype=cdt)
        shape = tuple(ls[d] for d in lb + lf) + tuple(rs[d] for d in rf)
        return out.reshape(shape).astype(out_dtype)
    if group_offset is not None:
        raise NotImplementedError(f"{fn}: group_offset is implemented for a ragged non-contracting "
                                  "dimension only (jax implements it in no mode)")
    if r in lc:
        i = lc.index(r)
        cb, ca = lc[:i], lc[i + 1:]
        gs = _group_sizes(group_sizes, fn, tuple(ls[d] for d in lb + cb), ls[r], f"lhs.shape[{r}]")
        scale = _prod(ls, ca)
        gs = gs * scale if scale != 1 else gs
        nb, depth = _prod(ls, cb), ls[r] * scale
        # lhs as [B, rows, free] (read transposed) or [B, free, rows]
        rows_last = lb + cb + lf + (r,) + ca
        tl = _permute(lhs, rows_last) is not lhs
        x = _permute(lhs, lb + cb + (r,) + ca + lf if tl else rows_last)
        x = x.reshape((bsz * nb,) + ((depth, _prod(ls, lf)) if tl else (_prod(ls, lf), depth)))
        rcb, rr, rca = rc[:i], rc[i], rc[i + 1:]
        y = _permute(rhs, rb + rcb + (rr,) + rca + rf).reshape((bsz * nb, depth, _prod(rs, rf)))
        g = gs.shape[1]
        out = contract_p.bind(x, y, gs, jnp.zeros((1,), jnp.int32), tl=tl, tr=False, dtype=cdt, g=g)
        out = out.reshape((bsz, nb, g) + tuple(ls[d] for d in lf) + tuple(rs[d] for d in rf))
        out = out.sum(axis=1, dtype=cdt) if nb > 1 else out[:, 0]
        out = jnp.moveaxis(out, 1, 0).reshape((g,) + tuple(ls[d] for d in lb + lf) + tuple(rs[d] for d in rf))
        return out.astype(out_dtype)
    # ragged batch: one group of all rows per batch entry
    j = lb.index(r)
    _group_sizes(group_sizes, fn, tuple(ls[d] for d in lb[:j]), ls[r], f"lhs.shape[{r}]")
    mf, kk = _prod(ls, lf), _prod(ls, lc)
    x = _permute(lhs, lb + lf + lc).reshape((bsz, mf, kk))
    w = _permute(rhs, rb + rc + rf).reshape((bsz, 1, kk, _prod(rs, rf)))
    gs = jnp.full((1, 1), mf, jnp.int32)
    out = rows_p.bind(x, w, gs, jnp.zeros((1,), jnp.int32), tl=False, tr=False, dtype=cdt)
    shape = tuple(ls[d] for d in lb + lf) + tuple(rs[d] for d in rf)
    return out.reshape(shape).astype(out_dtype)
