"""Two jax primitives over the FFI custom calls, with their differentiation,
transposition and batching rules.

``rows_p(lhs, rhs, gs, off; tl, tr, dtype)``  (ragged rows, the forward of ragged_dot / gmm)::

    lhs [B, m, k] ([B, k, m] when tl), rhs [B, g, k, n] ([B, g, n, k] when tr),
    gs [B, G] int32, off [B] int32   ->   out [B, m, n] of `dtype`
    out[b, r] = L[b, r, :] @ R[b, i - off[b]]  for rows r of groups i in [off[b], off[b] + g)
    out[b, r] = 0                               for every other row

``contract_p(lhs, rhs, gs, off; tl, tr, dtype)``  (ragged contraction, tgmm)::

    lhs [B, k, m] ([B, m, k] when tl), rhs [B, m, n] ([B, n, m] when tr),
    gs, off as above; param g   ->   out [B, g, k, n] of `dtype`
    out[b, j] = L[b][:, rows] @ R[b][rows, :],  rows = the rows of group off[b] + j

Every operand's leading (batch) dimension is 1 (shared) or B. Both are
bilinear in (lhs, rhs), so their tangents are two more calls and their
transposes are calls of the other kind (L, R, C the operands and cotangent
as the math above reads them)::

    rows:      dL = rows(C, R with tr flipped)         dR = contract(L read as [k, m], C)
    contract:  dL^T = rows(R read as [m, n], C read as [g, n, k])
               dR   = rows(L read as [m, k], C)

Reading an operand transposed is a stride change inside the kernels, never a
copy; only a cotangent asked for in the other layout is transposed after.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import _build

rows_p = Primitive("raggeddot_ragged_rows")
contract_p = Primitive("raggeddot_ragged_contract")


# ------------------------------------------------------------------ evaluation

def _batch(*xs):
    return max(x.shape[0] for x in xs)


def _rows_abstract(lhs, rhs, gs, off, *, tl, tr, dtype):
    m = lhs.shape[2] if tl else lhs.shape[1]
    n = rhs.shape[2] if tr else rhs.shape[3]
    return jax.core.ShapedArray((_batch(lhs, rhs, gs, off), m, n), dtype)


def _contract_abstract(lhs, rhs, gs, off, *, tl, tr, dtype, g):
    k = lhs.shape[2] if tl else lhs.shape[1]
    n = rhs.shape[1] if tr else rhs.shape[2]
    return jax.core.ShapedArray((_batch(lhs, rhs, gs, off), g, k, n), dtype)


rows_p.def_abstract_eval(_rows_abstract)
contract_p.def_abstract_eval(_contract_abstract)


def _lowering(prim, abstract):
    def call(lhs, rhs, gs, off, **params):
        _build.load()
        aval = abstract(lhs, rhs, gs, off, **params)
        return jax.ffi.ffi_call(prim.name, jax.ShapeDtypeStruct(aval.shape, aval.dtype))(
            lhs, rhs, gs, off, transpose_lhs=np.int32(params["tl"]), transpose_rhs=np.int32(params["tr"]))
    return mlir.lower_fun(call, multiple_results=False)


mlir.register_lowering(rows_p, _lowering(rows_p, _rows_abstract), platform="cpu")
mlir.register_lowering(contract_p, _lowering(contract_p, _contract_abstract), platform="cpu")


@functools.lru_cache(maxsize=None)
def _jitted(prim, items):
    params = dict(items)
    return jax.jit(lambda *args: prim.bind(*args, **params))


def _impl(prim):
    def impl(*args, **params):   # eager: one compiled call per parameter set
        return _jitted(prim, tuple(sorted(params.items())))(*args)
    return impl


rows_p.def_impl(_impl(rows_p))
contract_p.def_impl(_impl(contract_p))


# --------------------------------------------------------- differentiation

def _zero(x):
    return type(x) is ad.Zero


def _jvp(prim):
    def jvp(primals, tangents, **params):
        lhs, rhs, gs, off = primals
        dl, dr = tangents[:2]
        out = prim.bind(lhs, rhs, gs, off, **params)
        terms = []
        if not _zero(dl):
            terms.append(prim.bind(ad.instantiate_zeros(dl), rhs, gs, off, **params))
        if not _zero(dr):
            terms.append(prim.bind(lhs, ad.instantiate_zeros(dr), gs, off, **params))
        if not terms:
            return out, ad.Zero.from_primal_value(out)
        return out, functools.reduce(jnp.add, terms)
    return jvp


ad.primitive_jvps[rows_p] = _jvp(rows_p)
ad.primitive_jvps[contract_p] = _jvp(contract_p)


_typeof = getattr(jax, "typeof", None) or jax.core.get_aval


def _aval(x):
    return x.aval if ad.is_undefined_primal(x) else _typeof(x)


def _fit(ct, aval, swap):
    """A cotangent computed for the full batch, in the operand's layout:
    transposed back when `swap`, summed over the batch when the operand was
    shared (leading dimension 1)."""
    if swap:
        ct = jnp.swapaxes(ct, -1, -2)
    if aval.shape[0] == 1 and ct.shape[0] != 1:
        ct = jnp.sum(ct, axis=0, keepdims=True)
    return ct.astype(aval.dtype)


def _rows_transpose(ct, lhs, rhs, gs, off, *, tl, tr, dtype):
    la, ra = _aval(lhs), _aval(rhs)
    if _zero(ct):
        return [None if not ad.is_undefined_primal(x) else ad.Zero(_aval(x)) for x in (lhs, rhs)] + [None, None]
    d_lhs = d_rhs = None
    if ad.is_undefined_primal(lhs):   # [B, m, n] x R^T -> [B, m, k]
        d_lhs = _fit(rows_p.bind(ct, rhs, gs, off, tl=False, tr=not tr, dtype=np.dtype(la.dtype)), la, tl)
    if ad.is_undefined_primal(rhs):   # L^T [k, m] x C [m, n] per group -> [B, g, k, n]
        g = ra.shape[1]
        d = contract_p.bind(lhs, ct, gs, off, tl=not tl, tr=False, dtype=np.dtype(ra.dtype), g=g)
        d_rhs = _fit(d, ra, tr)
    return [d_lhs, d_rhs, None, None]


def _contract_transpose(ct, lhs, rhs, gs, off, *, tl, tr, dtype, g):
    la, ra = _aval(lhs), _aval(rhs)
    if _zero(ct):
        return [None if not ad.is_undefined_primal(x) else ad.Zero(_aval(x)) for x in (lhs, rhs)] + [None, None]
    d_lhs = d_rhs = None
    if ad.is_undefined_primal(lhs):   # R [m, n] x C[j]^T [n, k] -> dL^T [B, m, k]
        d = rows_p.bind(rhs, ct, gs, off, tl=tr, tr=True, dtype=np.dtype(la.dtype))
        d_lhs = _fit(d, la, not tl)
    if ad.is_undefined_primal(rhs):   # L^T [m, k] x C[j] [k, n] -> dR [B, m, n]
        d = rows_p.bind(lhs, ct, gs, off, tl=not tl, tr=False, dtype=np.dtype(ra.dtype))
        d_rhs = _fit(d, ra, tr)
    return [d_lhs, d_rhs, None, None]


ad.primitive_transposes[rows_p] = _rows_transpose
ad.primitive_transposes[contract_p] = _contract_transpose


# ------------------------------------------------------------------ batching

def _batcher(prim):
    """vmap: the mapped axis goes in front of the batch dimension and merges
    with it; an unmapped operand keeps its batch (shared when it is 1, else
    broadcast over the mapped axis)."""
    def rule(args, dims, **params):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        full = max((a.shape[:d] + a.shape[d + 1:] if d is not None else a.shape)[0] for a, d in zip(args, dims))
        merged = []
        for a, d in zip(args, dims):
            if d is None:
                if a.shape[0] == 1:
                    merged.append(a)
                    continue
                a = jnp.broadcast_to(a[None], (size,) + a.shape)
            else:
                a = jnp.moveaxis(a, d, 0)
            if a.shape[1] != full:
                a = jnp.broadcast_to(a, (size, full) + a.shape[2:])
            merged.append(a.reshape((size * full,) + a.shape[2:]))
        out = prim.bind(*merged, **params)
        return out.reshape((size, full) + out.shape[1:]), 0
    return rule


batching.primitive_batchers[rows_p] = _batcher(rows_p)
batching.primitive_batchers[contract_p] = _batcher(contract_p)
