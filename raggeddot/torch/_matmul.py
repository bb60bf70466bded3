"""The grouped products as torch operators: ``torch.ops.raggeddot.ragged_dot``,
``gmm``, ``tgmm`` and ``ragged_dot_general``.

Each is a ``torch.library.custom_op`` whose CPU implementation calls the
NumPy function of the same name on views of the tensors (no copies; the
result is written into a torch tensor through ``out=`` where the function
takes one), a fake implementation giving the result's shape and dtype (for
``torch.compile(fullgraph=True)`` and ``torch.export``), and an autograd rule
made of the same operators, so gradients are grouped products again and
can themselves be differentiated and traced:

- ``out = ragged_dot(lhs, rhs, gs)``: ``d_lhs = ragged_dot(ct, rhs^T, gs)``,
  ``d_rhs = tgmm(lhs^T, ct, gs)``;
- ``out = gmm(lhs, rhs, gs, transpose_rhs=t)``: ``d_lhs = gmm(ct, rhs, gs,
  transpose_rhs=not t)``, ``d_rhs = tgmm(lhs^T, ct)`` (``tgmm(ct^T, lhs)``
  when t), ``d_existing_out = ct`` with the computed rows zeroed;
- ``out = tgmm(lhs, rhs, gs)``: ``d_lhs = gmm(rhs, ct^T, gs)^T``,
  ``d_rhs = gmm(lhs^T, ct, gs)``, ``d_existing_out = ct``;
- ``ragged_dot_general``: raggeddot's own rule (``raggeddot.vjp``) in one
  operator, ``torch.ops.raggeddot.ragged_dot_general_backward``.

Gradients come in the primal's dtype (accumulated in float32, or float64,
and rounded once). ``precision`` and megablox's ``tiling`` are not
parameters here: the CPU kernels accumulate in at least float32 and choose
their own blocking.
"""
import functools
from typing import List, Optional

import torch

import raggeddot as _rd

from . import _convert as cv

__all__ = ["ragged_dot", "gmm", "tgmm", "ragged_dot_general"]

_NS = "raggeddot::"


def _needs(ctx, i):
    """Whether input i wants a gradient (a trace may list only the inputs passed)."""
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


def _group_sizes(gs, fn):
    return cv.check_tensor(gs, "group_sizes", fn, kinds="int")


def _check_k(lhs_k, rhs_k, lhs, rhs, fn, what="contracting"):
    if lhs_k != rhs_k:
        raise ValueError(f"raggeddot.torch.{fn}: {what} dimensions differ: 'lhs' has {lhs_k} "
                         f"(shape {tuple(lhs.shape)}) but 'rhs' has {rhs_k} (shape {tuple(rhs.shape)})")


def _mm_result(shape, preferred, existing_out, lhs, rhs, fn):
    """``(shape, dtype)`` of gmm's / tgmm's result, ``existing_out`` (if
    given) checked to have that shape; the dtype as :func:`_mm_dtype`."""
    if existing_out is not None and tuple(existing_out.shape) != shape:
        raise ValueError(f"raggeddot.torch.{fn}: 'existing_out' must have shape {shape}, "
                         f"got {tuple(existing_out.shape)}")
    return shape, _mm_dtype(preferred, existing_out, lhs, rhs, fn)


def _mm_dtype(preferred, existing_out, lhs, rhs, fn):
    """megablox's result dtype for gmm/tgmm: preferred_element_type (which
    existing_out must then have), else existing_out's, else float32 (float64
    when an input is float64)."""
    if preferred is not None:
        dt = cv.result_dtype(preferred, lhs.dtype, lhs.dtype, fn)
        if existing_out is not None and existing_out.dtype != dt:
            raise ValueError(f"raggeddot.torch.{fn}: 'existing_out' has dtype {existing_out.dtype} but "
                             f"preferred_element_type is {dt}; they must match")
        return dt
    if existing_out is not None:
        return existing_out.dtype
    return cv.compute_dtype(lhs.dtype, rhs.dtype)


# ------------------------------------------------------------------ ragged_dot

def _ragged_dot_meta(lhs, rhs, group_sizes, preferred_element_type):
    fn = "ragged_dot"
    cv.check_tensor(lhs, "lhs", fn, ndim=2)
    cv.check_tensor(rhs, "rhs", fn, ndim=3)
    _check_k(lhs.shape[1], rhs.shape[1], lhs, rhs, fn)
    cv.check_tensor(_group_sizes(group_sizes, fn), "group_sizes", fn, kinds="int", ndim=1)
    return (lhs.shape[0], rhs.shape[2]), cv.result_dtype(preferred_element_type, lhs.dtype, rhs.dtype, fn)


@torch.library.custom_op(_NS + "ragged_dot", mutates_args=())
def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor,
               preferred_element_type: Optional[torch.dtype] = None,
               group_offset: Optional[int] = None) -> torch.Tensor:
    """``jax.lax.ragged_dot`` on torch tensors (see ``raggeddot.ragged_dot``).

    ``out[r] = lhs[r] @ rhs[i]`` for the rows r of group i (group i owns
    rows ``[s_i, s_i + group_sizes[i])``, ``s_i = sum(group_sizes[:i])``);
    rows past ``sum(group_sizes)`` are 0. With ``group_offset``, rhs holds
    groups ``[group_offset, group_offset + rhs.shape[0])`` only and the rows
    of other groups are 0.

    Args: lhs ``[m, k]``, rhs ``[g, k, n]`` (float16, bfloat16, float32,
    float64; any strides), group_sizes ``[g]`` integers. Returns ``[m, n]``
    of ``preferred_element_type`` or the promoted dtype.
    """
    shape, dt = _ragged_dot_meta(lhs, rhs, group_sizes, preferred_element_type)
    out = cv.empty(shape, dt)
    _rd.ragged_dot(cv.array(lhs), cv.array(rhs), cv.array(group_sizes), preferred_element_type=cv.np_dtype(dt),
                   group_offset=group_offset, out=cv.array(out))
    return out


@ragged_dot.register_fake
def _(lhs, rhs, group_sizes, preferred_element_type=None, group_offset=None):
    shape, dt = _ragged_dot_meta(lhs, rhs, group_sizes, preferred_element_type)
    return lhs.new_empty(shape, dtype=dt)


def _ragged_dot_setup(ctx, inputs, output):
    lhs, rhs, gs, _, off = inputs
    ctx.save_for_backward(lhs, rhs, gs)
    ctx.group_offset = off


def _ragged_dot_backward(ctx, ct):
    lhs, rhs, gs = ctx.saved_tensors
    off = ctx.group_offset
    d_lhs = d_rhs = None
    if _needs(ctx, 0):   # [m, n] x [g, n, k] -> [m, k]
        d_lhs = ragged_dot(ct, rhs.transpose(1, 2), gs, lhs.dtype, off)
    if _needs(ctx, 1):   # [k, m] x [m, n] -> [g, k, n]
        d_rhs = tgmm(lhs.t(), ct, gs, rhs.dtype, off, rhs.shape[0], None)
    return d_lhs, d_rhs, None, None, None


ragged_dot.register_autograd(_ragged_dot_backward, setup_context=_ragged_dot_setup)


# ------------------------------------------------------------------------- gmm

def _gmm_meta(lhs, rhs, group_sizes, preferred_element_type, existing_out, transpose_rhs):
    fn = "gmm"
    cv.check_tensor(lhs, "lhs", fn, ndim=2)
    cv.check_tensor(rhs, "rhs", fn, ndim=3)
    cv.check_tensor(_group_sizes(group_sizes, fn), "group_sizes", fn, kinds="int", ndim=1)
    cv.check_tensor(existing_out, "existing_out", fn, optional=True)
    k_axis, n_axis = (2, 1) if transpose_rhs else (1, 2)
    _check_k(lhs.shape[1], rhs.shape[k_axis], lhs, rhs, fn)
    shape = (lhs.shape[0], rhs.shape[n_axis])
    return _mm_result(shape, preferred_element_type, existing_out, lhs, rhs, fn)


@torch.library.custom_op(_NS + "gmm", mutates_args=())
def gmm(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor,
        preferred_element_type: Optional[torch.dtype] = None, group_offset: Optional[int] = None,
        existing_out: Optional[torch.Tensor] = None, transpose_rhs: bool = False) -> torch.Tensor:
    """megablox's ``gmm`` on torch tensors (see ``raggeddot.gmm``).

    ``out[r] = lhs[r] @ rhs[i - group_offset]`` (``rhs[i - group_offset].T``
    with ``transpose_rhs``) for the rows r of the groups rhs holds; the other
    rows are ``existing_out``'s, or 0.

    Args: lhs ``[m, k]``; rhs ``[g_local, k, n]`` (``[g_local, n, k]`` with
    transpose_rhs); group_sizes ``[g]``; existing_out ``[m, n]`` or None.
    Returns ``[m, n]``: preferred_element_type, else existing_out's dtype,
    else float32 (float64 with a float64 input).
    """
    shape, dt = _gmm_meta(lhs, rhs, group_sizes, preferred_element_type, existing_out, transpose_rhs)
    out = cv.empty(shape, dt)
    _rd.gmm(cv.array(lhs), cv.array(rhs), cv.array(group_sizes), preferred_element_type=cv.np_dtype(dt),
            group_offset=group_offset, existing_out=cv.array(existing_out), transpose_rhs=transpose_rhs,
            out=cv.array(out))
    return out


@gmm.register_fake
def _(lhs, rhs, group_sizes, preferred_element_type=None, group_offset=None, existing_out=None,
      transpose_rhs=False):
    shape, dt = _gmm_meta(lhs, rhs, group_sizes, preferred_element_type, existing_out, transpose_rhs)
    return lhs.new_empty(shape, dtype=dt)


def _gmm_setup(ctx, inputs, output):
    lhs, rhs, gs, _, off, _, tr = inputs
    ctx.save_for_backward(lhs, rhs, gs)
    ctx.group_offset, ctx.transpose_rhs = off, tr


def _computed_rows_mask(gs, start, count, m):
    """``[m, 1]`` bool: the rows of groups ``[start, start + count)``
    (tensor ops only: no read of the sizes on the host)."""
    ends = torch.cumsum(gs.to(torch.int64), 0)
    zero = ends.new_zeros(1)
    bounds = torch.cat([zero, ends])
    rows = torch.arange(m, device=gs.device)
    return ((rows >= bounds[start]) & (rows < bounds[start + count])).unsqueeze(1)


def _gmm_backward(ctx, ct):
    lhs, rhs, gs = ctx.saved_tensors
    off, tr = ctx.group_offset, ctx.transpose_rhs
    d_lhs = d_rhs = d_existing = None
    if _needs(ctx, 0):
        d_lhs = gmm(ct, rhs, gs, lhs.dtype, off, None, not tr)
    if _needs(ctx, 1):
        a, b = (ct.t(), lhs) if tr else (lhs.t(), ct)
        d_rhs = tgmm(a, b, gs, rhs.dtype, off, rhs.shape[0], None)
    if _needs(ctx, 5):
        computed = _computed_rows_mask(gs, 0 if off is None else off, rhs.shape[0], ct.shape[0])
        d_existing = ct.masked_fill(computed, 0)
    return d_lhs, d_rhs, None, None, None, d_existing, None


gmm.register_autograd(_gmm_backward, setup_context=_gmm_setup)


# ------------------------------------------------------------------------ tgmm

def _tgmm_meta(lhs, rhs, group_sizes, preferred_element_type, group_offset, num_actual_groups, existing_out):
    fn = "tgmm"
    cv.check_tensor(lhs, "lhs", fn, ndim=2)
    cv.check_tensor(rhs, "rhs", fn, ndim=2)
    cv.check_tensor(_group_sizes(group_sizes, fn), "group_sizes", fn, kinds="int", ndim=1)
    cv.check_tensor(existing_out, "existing_out", fn, optional=True)
    _check_k(lhs.shape[1], rhs.shape[0], lhs, rhs, fn, what="ragged (m)")
    g = group_sizes.shape[0]
    count = g - (group_offset or 0) if num_actual_groups is None else num_actual_groups
    shape = (count, lhs.shape[0], rhs.shape[1])
    return _mm_result(shape, preferred_element_type, existing_out, lhs, rhs, fn)


@torch.library.custom_op(_NS + "tgmm", mutates_args=())
def tgmm(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor,
         preferred_element_type: Optional[torch.dtype] = None, group_offset: Optional[int] = None,
         num_actual_groups: Optional[int] = None, existing_out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """megablox's ``tgmm`` on torch tensors (see ``raggeddot.tgmm``), the
    weight gradient of gmm: ``out[j] = lhs[:, rows_i] @ rhs[rows_i]`` for
    group ``i = group_offset + j`` (zeros for an empty group), plus
    ``existing_out[j]``.

    Args: lhs ``[k, m]`` (e.g. ``x.t()``, read through strides), rhs
    ``[m, n]``, group_sizes ``[g]``. Returns ``[num_actual_groups, k, n]``
    (default ``g``; pass it with a group_offset).
    """
    shape, dt = _tgmm_meta(lhs, rhs, group_sizes, preferred_element_type, group_offset, num_actual_groups,
                           existing_out)
    out = cv.empty(shape, dt)
    _rd.tgmm(cv.array(lhs), cv.array(rhs), cv.array(group_sizes), preferred_element_type=cv.np_dtype(dt),
             group_offset=group_offset, num_actual_groups=num_actual_groups,
             existing_out=cv.array(existing_out), out=cv.array(out))
    return out


@tgmm.register_fake
def _(lhs, rhs, group_sizes, preferred_element_type=None, group_offset=None, num_actual_groups=None,
      existing_out=None):
    shape, dt = _tgmm_meta(lhs, rhs, group_sizes, preferred_element_type, group_offset, num_actual_groups,
                           existing_out)
    return lhs.new_empty(shape, dtype=dt)


def _tgmm_setup(ctx, inputs, output):
    lhs, rhs, gs, _, off, _, _ = inputs
    ctx.save_for_backward(lhs, rhs, gs)
    ctx.group_offset = 0 if off is None else off


def _tgmm_backward(ctx, ct):
    lhs, rhs, gs = ctx.saved_tensors
    off = ctx.group_offset
    d_lhs = d_rhs = d_existing = None
    if _needs(ctx, 0):   # [m, n] x [count, n, k] -> [m, k] -> [k, m]
        d_lhs = gmm(rhs, ct.transpose(1, 2), gs, lhs.dtype, off, None, False).t()
    if _needs(ctx, 1):   # [m, k] x [count, k, n] -> [m, n]
        d_rhs = gmm(lhs.t(), ct, gs, rhs.dtype, off, None, False)
    if _needs(ctx, 6):
        d_existing = ct
    return d_lhs, d_rhs, None, None, None, None, d_existing


tgmm.register_autograd(_tgmm_backward, setup_context=_tgmm_setup)


# ---------------------------------------------------------- ragged_dot_general

def _dimension_numbers(lc, rc, lb, rb, lr, rg):
    return _rd.RaggedDotDimensionNumbers(((lc, rc), (lb, rb)), (lr,), tuple(rg))


def _general_meta(lhs, rhs, group_sizes, lc, rc, lb, rb, lr, rg, preferred_element_type):
    """Shape and dtype of ragged_dot_general's result: ``(g,)`` in the
    ragged contracting mode, then the batch dims, lhs's free dims, rhs's free
    dims (those neither contracting, batch nor group dims), as jax orders them."""
    fn = "ragged_dot_general"
    cv.check_tensor(lhs, "lhs", fn)
    cv.check_tensor(rhs, "rhs", fn)
    cv.check_tensor(_group_sizes(group_sizes, fn), "group_sizes", fn, kinds="int")
    for name, dims, t in (("lhs_contracting", lc, lhs), ("rhs_contracting", rc, rhs), ("lhs_batch", lb, lhs),
                          ("rhs_batch", rb, rhs), ("lhs_ragged", [lr], lhs), ("rhs_group", rg, rhs)):
        if any(not 0 <= d < t.dim() for d in dims):
            raise ValueError(f"raggeddot.torch.{fn}: '{name}' dimensions {list(dims)} out of range for a "
                             f"{t.dim()}-dimensional operand")
    for a, b, what in ((lc, rc, "contracting"), (lb, rb, "batch")):
        if len(a) != len(b) or any(lhs.shape[i] != rhs.shape[j] for i, j in zip(a, b)):
            raise ValueError(f"raggeddot.torch.{fn}: {what} dimensions {list(a)} of 'lhs' (shape "
                             f"{tuple(lhs.shape)}) and {list(b)} of 'rhs' (shape {tuple(rhs.shape)}) differ")
    lfree = [lhs.shape[d] for d in range(lhs.dim()) if d not in lc and d not in lb]
    rfree = [rhs.shape[d] for d in range(rhs.dim()) if d not in rc and d not in rb and d not in rg]
    shape = [lhs.shape[d] for d in lb] + lfree + rfree
    if lr in lc:
        shape = [group_sizes.shape[-1]] + shape
    return tuple(shape), cv.result_dtype(preferred_element_type, lhs.dtype, rhs.dtype, fn)


@torch.library.custom_op(_NS + "ragged_dot_general", mutates_args=())
def ragged_dot_general(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor,
                       lhs_contracting: List[int], rhs_contracting: List[int], lhs_batch: List[int],
                       rhs_batch: List[int], lhs_ragged: int, rhs_group: List[int],
                       preferred_element_type: Optional[torch.dtype] = None,
                       group_offset: Optional[int] = None) -> torch.Tensor:
    """``jax.lax.ragged_dot_general`` on torch tensors (see
    ``raggeddot.ragged_dot_general`` for the three modes), with the dimension
    numbers spelled out: ``((lhs_contracting, rhs_contracting), (lhs_batch,
    rhs_batch))``, ``lhs_ragged_dimensions = (lhs_ragged,)`` and
    ``rhs_group_dimensions = rhs_group``. :func:`raggeddot.torch.ragged_dot_general_dn`
    takes a ``RaggedDotDimensionNumbers`` instead."""
    _general_meta(lhs, rhs, group_sizes, lhs_contracting, rhs_contracting, lhs_batch, rhs_batch, lhs_ragged,
                  rhs_group, preferred_element_type)
    dn = _dimension_numbers(lhs_contracting, rhs_contracting, lhs_batch, rhs_batch, lhs_ragged, rhs_group)
    res = _rd.ragged_dot_general(cv.array(lhs), cv.array(rhs), cv.array(group_sizes), dn,
                                 preferred_element_type=cv.np_dtype(preferred_element_type),
                                 group_offset=group_offset)
    return cv.tensor(res).contiguous()   # (a copy only if the result came as a transposed view)


@ragged_dot_general.register_fake
def _(lhs, rhs, group_sizes, lhs_contracting, rhs_contracting, lhs_batch, rhs_batch, lhs_ragged, rhs_group,
      preferred_element_type=None, group_offset=None):
    shape, dt = _general_meta(lhs, rhs, group_sizes, lhs_contracting, rhs_contracting, lhs_batch, rhs_batch,
                              lhs_ragged, rhs_group, preferred_element_type)
    return lhs.new_empty(shape, dtype=dt)


@torch.library.custom_op(_NS + "ragged_dot_general_backward", mutates_args=())
def ragged_dot_general_backward(ct: torch.Tensor, lhs: torch.Tensor, rhs: torch.Tensor,
                                group_sizes: torch.Tensor, lhs_contracting: List[int],
                                rhs_contracting: List[int], lhs_batch: List[int], rhs_batch: List[int],
                                lhs_ragged: int, rhs_group: List[int],
                                preferred_element_type: Optional[torch.dtype] = None,
                                group_offset: Optional[int] = None) -> List[torch.Tensor]:
    """``[d_lhs, d_rhs]`` of ``ragged_dot_general`` for the cotangent ``ct``
    (``raggeddot.vjp``'s rule: each a grouped product), in the operands' dtypes."""
    fn = "ragged_dot_general_backward"
    cv.check_tensor(ct, "ct", fn)
    dn = _dimension_numbers(lhs_contracting, rhs_contracting, lhs_batch, rhs_batch, lhs_ragged, rhs_group)
    op = functools.partial(_rd.ragged_dot_general, ragged_dot_dimension_numbers=dn,
                           preferred_element_type=cv.np_dtype(preferred_element_type), group_offset=group_offset)
    _, vjp_fn = _rd.vjp(op, cv.array(lhs), cv.array(rhs), cv.array(group_sizes))
    d_lhs, d_rhs, _ = vjp_fn(cv.array(ct))
    return [cv.tensor(d_lhs).contiguous(), cv.tensor(d_rhs).contiguous()]


@ragged_dot_general_backward.register_fake
def _(ct, lhs, rhs, group_sizes, *args, **kwargs):
    return [torch.empty_like(lhs, memory_format=torch.contiguous_format),
            torch.empty_like(rhs, memory_format=torch.contiguous_format)]


def _general_setup(ctx, inputs, output):
    lhs, rhs, gs = inputs[:3]
    ctx.save_for_backward(lhs, rhs, gs)
    ctx.rest = inputs[3:]


def _general_backward(ctx, ct):
    lhs, rhs, gs = ctx.saved_tensors
    d_lhs, d_rhs = ragged_dot_general_backward(ct, lhs, rhs, gs, *ctx.rest)
    return (d_lhs, d_rhs) + (None,) * 9


ragged_dot_general.register_autograd(_general_backward, setup_context=_general_setup)
