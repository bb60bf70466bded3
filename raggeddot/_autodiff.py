"""Forward- and reverse-mode derivatives of raggeddot's operations, in jax's style.

There is no tracing here: the differentiable functions are the package's ops
(``ragged_dot``, ``gmm``, ``tgmm``, ``ragged_dot_general``), each with a
registered rule, or a ``functools.partial`` of one of them (for instance
``partial(gmm, transpose_rhs=True)``)::

    out, vjp_fn = raggeddot.vjp(raggeddot.ragged_dot, lhs, rhs, group_sizes)
    d_lhs, d_rhs, d_gs = vjp_fn(cotangent)          # d_gs is None

    out, t_out = raggeddot.jvp(raggeddot.ragged_dot, (lhs, rhs, group_sizes),
                               (t_lhs, t_rhs, None))

Primals are the positional arguments of the call: ``vjp(fun, *primals)``
computes ``out = fun(*primals)`` and ``vjp_fn`` returns one entry per primal,
bound to the op's parameters by position. The entry is an array of the primal's
shape and dtype for a differentiable parameter (``lhs``, ``rhs`` and
``existing_out``) and ``None`` for every other one (``group_sizes``, and any
non-array argument passed positionally). ``existing_out`` of gmm/tgmm is
differentiated only when it is passed positionally (e.g.
``vjp(gmm, lhs, rhs, gs, None, None, None, existing_out)``); bound by keyword
(in a partial) it is a constant.

Every rule is computed by the C-backed ops themselves, in the op's compute
dtype (float32, or float64 when an input or the output is float64); gradients
are cast to the primal's dtype once, at the end.

Other modules register their own rules through :func:`defvjp` and
:func:`defjvp`.
"""
import functools
import inspect

import numpy as np

from . import _gateway as gw
from . import _validate as v
from ._megablox import gmm, tgmm
from ._ops import ragged_dot

__all__ = ["vjp", "jvp", "grad", "defvjp", "defjvp"]

# op -> (rule, argnames)
_VJP_RULES = {}
_JVP_RULES = {}
_BUILTINS_DONE = False


def defvjp(op, vjp_rule, argnames):
    """Register the reverse-mode rule of ``op``.

    Args:
      op: the function (``vjp`` and ``jvp`` accept it, or a ``functools.partial``
        of it).
      vjp_rule: ``vjp_rule(args, wanted) -> (out, backward)``. ``args`` maps
        every parameter name of ``op`` to its value (defaults filled in);
        ``wanted`` is the frozenset of names in ``argnames`` whose gradient is
        asked for. The rule computes ``out = op(**args)`` and returns it with
        ``backward(ct) -> {name: gradient}``, ``ct`` an array of ``out``'s shape.
        A missing or ``None`` gradient means zero; gradients are cast to the
        primal's dtype by the caller, so they may come in the compute dtype.
      argnames: the names of the differentiable parameters (float arrays).
    """
    _VJP_RULES[op] = (vjp_rule, tuple(argnames))


def defjvp(op, jvp_rule, argnames):
    """Register the forward-mode rule of ``op``.

    ``jvp_rule(args, tangents) -> (out, tangent_out)``: ``args`` as for
    :func:`defvjp`; ``tangents`` maps each name in ``argnames`` whose value is
    not None to its tangent (an array of the primal's shape and dtype) or to
    None for a zero tangent. ``tangent_out`` may come in any float dtype; the
    caller casts it to ``out``'s dtype.
    """
    _JVP_RULES[op] = (jvp_rule, tuple(argnames))


# ---------------------------------------------------------------------------
# Resolving `fun` and binding primals
# ---------------------------------------------------------------------------


def _register_builtins():
    """Register the package's rules. ragged_dot_general's is registered lazily,
    on the first call after raggeddot._general can be imported."""
    global _BUILTINS_DONE
    if _BUILTINS_DONE:
        return
    if ragged_dot not in _VJP_RULES:
        defvjp(ragged_dot, _ragged_dot_vjp, ("lhs", "rhs"))
        defjvp(ragged_dot, _ragged_dot_jvp, ("lhs", "rhs"))
        defvjp(gmm, _gmm_vjp, ("lhs", "rhs", "existing_out"))
        defjvp(gmm, _gmm_jvp, ("lhs", "rhs", "existing_out"))
        defvjp(tgmm, _tgmm_vjp, ("lhs", "rhs", "existing_out"))
        defjvp(tgmm, _tgmm_jvp, ("lhs", "rhs", "existing_out"))
    try:
        from . import _general
    except ImportError:
        return  # not there yet: look again on the next call
    defvjp(_general.ragged_dot_general, _rdg_vjp, ("lhs", "rhs"))
    defjvp(_general.ragged_dot_general, _rdg_jvp, ("lhs", "rhs"))
    _BUILTINS_DONE = True


def _op_name(op):
    mod = getattr(op, "__module__", "") or ""
    name = getattr(op, "__qualname__", getattr(op, "__name__", repr(op)))
    return f"raggeddot.{name}" if mod.startswith("raggeddot") else f"{mod}.{name}"


def _resolve(fun, rules, what):
    """(op, partial positional args, partial keywords) of a registered op or a partial of one."""
    _register_builtins()
    args, kwargs = (), {}
    op = fun
    while isinstance(op, functools.partial):
        args = tuple(op.args) + args
        kwargs = {**(op.keywords or {}), **kwargs}
        op = op.func
    if op in rules:
        return op, args, kwargs
    names = ", ".join(sorted(_op_name(f) for f in rules))
    raise TypeError(
        f"{what}: cannot differentiate {fun!r}: raggeddot has no tracer, so the differentiable "
        f"functions are {names}, or a functools.partial of one of them binding arguments "
        "(e.g. partial(raggeddot.gmm, transpose_rhs=True)); write compositions out with "
        "vjp/jvp of each op"
    )


def _bind(op, pargs, pkwargs, primals, what):
    """{name: value} of every parameter, and the parameter name of each primal."""
    sig = inspect.signature(op)
    try:
        bound = sig.bind(*pargs, *primals, **pkwargs)
    except TypeError as e:
        raise TypeError(f"{what}: bad arguments for {_op_name(op)}: {e}") from None
    bound.apply_defaults()
    params = list(sig.parameters)
    first = len(pargs)
    if first + len(primals) > len(params):
        raise TypeError(f"{what}: too many positional arguments for {_op_name(op)}")
    return dict(bound.arguments), params[first:first + len(primals)]


def _primal_dtype(x):
    return np.asarray(x).dtype


# ---------------------------------------------------------------------------
# vjp / jvp / grad
# ---------------------------------------------------------------------------


def vjp(fun, *primals):
    """``(out, vjp_fn)`` like ``jax.vjp``: ``out = fun(*primals)`` and
    ``vjp_fn(ct)`` the gradient of ``sum(out * ct)``.

    Args:
      fun: ``raggeddot.ragged_dot``, ``gmm``, ``tgmm``, ``ragged_dot_general``
        or a ``functools.partial`` of one (anything else: TypeError).
      *primals: the positional arguments of the call.

    Returns:
      ``(out, vjp_fn)``. ``vjp_fn(ct)``, ``ct`` an array of ``out``'s shape,
      returns a tuple with one entry per primal: the gradient with the primal's
      shape and dtype for ``lhs``, ``rhs`` and ``existing_out``, ``None`` for
      ``group_sizes`` and any other (non-differentiable) argument. ``vjp_fn``
      can be called any number of times; the primals are read, never written,
      and must not be modified while ``vjp_fn`` is in use.

    Example::

        out, vjp_fn = raggeddot.vjp(raggeddot.ragged_dot, lhs, rhs, group_sizes)
        d_lhs, d_rhs, _ = vjp_fn(np.ones_like(out))
    """
    op, pargs, pkwargs = _resolve(fun, _VJP_RULES, "vjp")
    rule, argnames = _VJP_RULES[op]
    args, names = _bind(op, pargs, pkwargs, primals, "vjp")
    diff = [name in argnames and primal is not None for name, primal in zip(names, primals)]
    wanted = frozenset(name for name, d in zip(names, diff) if d)
    dtypes = [_primal_dtype(p) if d else None for p, d in zip(primals, diff)]
    shapes = [np.shape(p) if d else None for p, d in zip(primals, diff)]
    out, backward = rule(args, wanted)

    def vjp_fn(cotangent):
        ct = _cotangent(cotangent, out, _op_name(op))
        grads = backward(ct)
        result = []
        for name, d, dtype, shape in zip(names, diff, dtypes, shapes):
            if not d:
                result.append(None)
                continue
            g = grads.get(name)
            if g is None:
                g = np.zeros(shape, dtype=dtype)
            g = np.asarray(g)
            if g.shape != shape:  # a broken rule, not a user error
                raise AssertionError(
                    f"vjp rule of {_op_name(op)} returned shape {g.shape} for '{name}', expected {shape}")
            result.append(g if g.dtype == dtype else g.astype(dtype))
        return tuple(result)

    return out, vjp_fn


def _cotangent(ct, out, opname):
    if not isinstance(out, np.ndarray):
        return ct
    arr = v.as_array(ct, "cotangent", f"vjp of {opname}")
    if arr.shape != out.shape:
        raise ValueError(
            f"vjp of {opname}: the cotangent must have the output's shape {out.shape}, got {arr.shape}")
    if arr.dtype.kind not in "fiu" and not v.is_bfloat16(arr.dtype):
        raise TypeError(f"vjp of {opname}: the cotangent must be a real array, got dtype {arr.dtype}")
    return arr


def jvp(fun, primals, tangents):
    """``(out, tangent_out)`` like ``jax.jvp``: ``out = fun(*primals)`` and
    ``tangent_out`` its derivative along ``tangents``.

    Args:
      fun: as for :func:`vjp`.
      primals: tuple of the positional arguments of the call.
      tangents: tuple of the same length. For ``lhs``, ``rhs`` and
        ``existing_out``: an array of the primal's shape (cast to its dtype) or
        ``None`` for zero. For every other argument the tangent is ignored
        (``None``, or jax's float0 zeros for ``group_sizes``).

    Returns:
      ``(out, tangent_out)``, ``tangent_out`` with ``out``'s shape and dtype.
      The ops are linear in each float argument, so e.g. for ragged_dot
      ``tangent_out = ragged_dot(t_lhs, rhs, gs) + ragged_dot(lhs, t_rhs, gs)``.
    """
    op, pargs, pkwargs = _resolve(fun, _JVP_RULES, "jvp")
    rule, argnames = _JVP_RULES[op]
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ValueError(
            f"jvp: got {len(primals)} primals but {len(tangents)} tangents; give one tangent per primal")
    args, names = _bind(op, pargs, pkwargs, primals, "jvp")
    tdict = {}
    for name, p, t in zip(names, primals, tangents):
        if name not in argnames or p is None:
            continue
        if t is None:
            tdict[name] = None
            continue
        pa = np.asarray(p)
        ta = v.as_array(t, f"tangent of '{name}'", f"jvp of {_op_name(op)}")
        if ta.shape != pa.shape:
            raise ValueError(
                f"jvp of {_op_name(op)}: the tangent of '{name}' must have the primal's shape "
                f"{pa.shape}, got {ta.shape}")
        if ta.dtype.kind not in "fiu" and not v.is_bfloat16(ta.dtype):
            raise TypeError(f"jvp of {_op_name(op)}: the tangent of '{name}' has dtype {ta.dtype}")
        tdict[name] = ta if ta.dtype == pa.dtype else ta.astype(pa.dtype)
    for name in argnames:  # differentiable arguments bound by keyword: constants
        if args.get(name) is not None and name not in tdict:
            tdict[name] = None
    out, t_out = rule(args, tdict)
    if isinstance(out, np.ndarray):
        if t_out is None:
            t_out = np.zeros_like(out)
        t_out = np.asarray(t_out)
        if t_out.dtype != out.dtype:
            t_out = t_out.astype(out.dtype)
    return out, t_out


def grad(fun, argnums=0):
    """Gradient of the scalar ``sum(fun(*primals) * cotangent)``.

    The ops return arrays and there is no tracer to differentiate a reduction
    written by the user, so ``grad`` fixes the reduction: the returned function
    ``g(*primals, cotangent=None)`` gives the gradient of
    ``L = sum(fun(*primals) * cotangent)`` with respect to ``primals[argnums]``
    (``cotangent=None`` means ones, i.e. ``L = sum(out)``). It equals
    ``jax.grad(lambda *a: (f(*a) * cotangent).sum(), argnums)``.

    Args:
      fun: as for :func:`vjp`.
      argnums: an int (one array is returned) or a tuple of ints (a tuple is
        returned); each must point at a differentiable argument.
    """
    single = isinstance(argnums, (int, np.integer))
    nums = (int(argnums),) if single else tuple(int(a) for a in argnums)
    _resolve(fun, _VJP_RULES, "grad")  # fail early on a non-differentiable fun

    @functools.wraps(fun if not isinstance(fun, functools.partial) else fun.func)
    def g(*primals, cotangent=None):
        for a in nums:
            if not -len(primals) <= a < len(primals):
                raise ValueError(f"grad: argnums={a} is out of range for {len(primals)} primals")
        out, vjp_fn = vjp(fun, *primals)
        ct = np.ones_like(out) if cotangent is None else cotangent
        grads = vjp_fn(ct)
        picked = []
        for a in nums:
            if grads[a] is None:
                raise TypeError(
                    f"grad: argument {a} is not differentiable (only lhs, rhs and existing_out are; "
                    "group_sizes and options have no gradient)")
            picked.append(grads[a])
        return picked[0] if single else tuple(picked)

    return g


# ---------------------------------------------------------------------------
# Rules: ragged_dot
# ---------------------------------------------------------------------------
# out[rows_i] = lhs[rows_i] @ rhs[i - off] for the local groups, 0 elsewhere.
#   d_lhs = ragged_dot(ct, rhs^T, gs)   (rows of no local group: 0)
#   d_rhs = tgmm(lhs^T, ct, gs)         (empty groups: 0)


def _compute_dtype(lhs, rhs, out):
    return gw.compute_dtype(np.asarray(lhs).dtype, np.asarray(rhs).dtype, out.dtype)


def _sum_terms(terms, like):
    if not terms:
        return np.zeros_like(like)
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _primal(op, a):
    """Evaluate ``op`` at the bound arguments ``a``: (lhs, rhs, group_sizes, out,
    compute dtype), lhs and rhs as arrays."""
    lhs, rhs = np.asarray(a["lhs"]), np.asarray(a["rhs"])
    out = op(**{**a, "lhs": lhs, "rhs": rhs})
    return lhs, rhs, a["group_sizes"], out, _compute_dtype(lhs, rhs, out)


def _ragged_dot_vjp(a, wanted):
    lhs, rhs, gs, out, cdt = _primal(ragged_dot, a)
    off = a["group_offset"]

    def backward(ct):
        ct = ct.astype(cdt, copy=False)
        grads = {}
        if "lhs" in wanted:  # [m, n] x [g_local, n, k] -> [m, k]
            grads["lhs"] = ragged_dot(ct, rhs.transpose(0, 2, 1), gs, precision=a["precision"],
                                      preferred_element_type=cdt, group_offset=off)
        if "rhs" in wanted:  # [k, m] x [m, n] -> [g_local, k, n]
            grads["rhs"] = tgmm(lhs.T, ct, gs, preferred_element_type=cdt, group_offset=off,
                                num_actual_groups=rhs.shape[0])
        return grads

    return out, backward


def _ragged_dot_jvp(a, t):
    lhs, rhs, gs, out, cdt = _primal(ragged_dot, a)
    kw = dict(precision=a["precision"], group_offset=a["group_offset"])
    terms = []
    if t.get("lhs") is not None:
        terms.append(ragged_dot(t["lhs"], rhs, gs, preferred_element_type=cdt, **kw))
    if t.get("rhs") is not None:
        terms.append(ragged_dot(lhs, t["rhs"], gs, preferred_element_type=cdt, **kw))
    return out, _sum_terms(terms, out)


# ---------------------------------------------------------------------------
# Rules: gmm and tgmm (megablox ops.py)
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
    lhs, rhs, gs, out, cdt = _primal(gmm, a)
    off, tr = a["group_offset"], bool(a["transpose_rhs"])
    g_local = rhs.shape[0]

    def backward(ct):
        ct = ct.astype(cdt, copy=False)
        grads = {}
        if "lhs" in wanted:
            grads["lhs"] = gmm(ct, rhs, gs, preferred_element_type=cdt, group_offset=off,
                               transpose_rhs=not tr)
        if "rhs" in wanted:
            if tr:  # rhs is [g_local, n, k]: tgmm(ct^T [n, m], lhs [m, k])
                grads["rhs"] = tgmm(ct.T, lhs, gs, preferred_element_type=cdt, group_offset=off,
                                    num_actual_groups=g_local)
            else:
                grads["rhs"] = tgmm(lhs.T, ct, gs, preferred_element_type=cdt, group_offset=off,
                                    num_actual_groups=g_local)
        if "existing_out" in wanted:
            first, last = _computed_rows(gs, off, g_local)
            d = np.array(ct, copy=True)
            d[first:last] = 0
            grads["existing_out"] = d
        return grads

    return out, backward


def _gmm_jvp(a, t):
    lhs, rhs, gs, out, cdt = _primal(gmm, a)
    off, tr = a["group_offset"], bool(a["transpose_rhs"])
    kw = dict(preferred_element_type=cdt, group_offset=off, transpose_rhs=tr)
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
    return out, _sum_terms(terms, out)


# tgmm: out[j] = lhs[:, rows_i] @ rhs[rows_i] (+ existing_out[j]), i = off + j.
#   d_lhs[:, rows_i] = ct[j] @ rhs[rows_i]^T  ->  d_lhs = ragged_dot(rhs, ct^T, gs)^T
#   d_rhs[rows_i]    = lhs[:, rows_i]^T @ ct[j] ->  d_rhs = ragged_dot(lhs^T, ct, gs)
#   d_existing_out = ct
# (positions of no computed group, rows past sum(gs) included, get 0.)


def _tgmm_start(a):
    return 0 if a["group_offset"] is None else v.index(a["group_offset"], "group_offset", "tgmm")


def _tgmm_vjp(a, wanted):
    lhs, rhs, gs, out, cdt = _primal(tgmm, a)
    start = _tgmm_start(a)

    def backward(ct):
        ct = ct.astype(cdt, copy=False)
        grads = {}
        if "lhs" in wanted:  # [m, n] x [count, n, k] -> [m, k] -> [k, m]
            d = ragged_dot(rhs, ct.transpose(0, 2, 1), gs, preferred_element_type=cdt,
                           group_offset=start)
            grads["lhs"] = np.ascontiguousarray(d.T)
        if "rhs" in wanted:  # [m, k] x [count, k, n] -> [m, n]
            grads["rhs"] = ragged_dot(lhs.T, ct, gs, preferred_element_type=cdt, group_offset=start)
        if "existing_out" in wanted:
            grads["existing_out"] = np.array(ct, copy=True)
        return grads

    return out, backward


def _tgmm_jvp(a, t):
    lhs, rhs, gs, out, cdt = _primal(tgmm, a)
    kw = dict(preferred_element_type=cdt, group_offset=a["group_offset"],
              num_actual_groups=out.shape[0])
    terms = []
    if t.get("lhs") is not None:
        terms.append(tgmm(t["lhs"], rhs, gs, **kw))
    if t.get("rhs") is not None:
        terms.append(tgmm(lhs, t["rhs"], gs, **kw))
    if t.get("existing_out") is not None:
        terms.append(t["existing_out"].astype(cdt))
    return out, _sum_terms(terms, out)


# ---------------------------------------------------------------------------
# Rules: ragged_dot_general, all three modes
# ---------------------------------------------------------------------------
# Each operand is first viewed (a free transpose) in a canonical layout:
#   L = lhs as [B, F, K]       B: batch dims (listed order), F: lhs free dims
#                              (ascending), K: contracting dims (listed order)
#   R = rhs as [(G,) B, K, N]  G: the group dim (mode 1 only), N: rhs free dims
# The output layout ([B, F, N], or [g, B, F, N] in mode 2) is the same for the
# canonical and the original operands, and so is group_sizes' prefix (B, then
# the F or K dims before the ragged one, in these orders). Each gradient is one
# ragged_dot_general on canonical operands, transposed back:
#   mode 1 (ragged F, rhs [g, B, K, N], ct [B, F, N]):
#     dL [B,F,K] = rdg(ct, R)  contract N, batch B, ragged F (mode 1, rhs group 0)
#     dR [g,B,K,N] = rdg(L, ct) contract F, batch B, ragged F (mode 2)
#   mode 2 (ragged K, rhs [B, K, N], ct [g, B, F, N]):
#     dL [B,K,F] = rdg(R, ct)  contract N, batch B, ragged K (mode 1, ct's group 0)
#     dR [B,K,N] = rdg(L, ct)  contract F, batch B, ragged K (mode 1, ct's group 0)
#   mode 3 (ragged B, a plain batched dot, ct [B, F, N]):
#     dL [B,F,K] = rdg(ct, R)  contract N, batch B, ragged B (mode 3)
#     dR [B,K,N] = rdg(L, ct)  contract F, batch B, ragged B (mode 3)
# group_offset (mode 1 only): dL passes it on; dR, a mode-2 product that takes
# no group_offset, contracts only the rows of the local groups: with [g] group
# sizes L and ct are sliced to those rows; with per-prefix sizes one leading
# pseudo-group takes the rows before them and is dropped.


def _rdg_layout(dn, lhs_ndim, rhs_ndim):
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    lc, rc, lb, rb = ([int(d) for d in x] for x in (lc, rc, lb, rb))
    r = int(list(dn.lhs_ragged_dimensions)[0])
    rg = [int(d) for d in dn.rhs_group_dimensions]
    lf = [d for d in range(lhs_ndim) if d not in lc and d not in lb]
    rn = [d for d in range(rhs_ndim) if d not in rc and d not in rb and d not in rg]
    if r in lf:
        mode, pos = 1, lf.index(r)
    elif r in lc:
        mode, pos = 2, lc.index(r)
    else:
        mode, pos = 3, lb.index(r)
    return dict(mode=mode, pos=pos, lperm=lb + lf + lc, rperm=rg + rb + rc + rn,
                nb=len(lb), nf=len(lf), nc=len(lc), nn=len(rn))


def _rng(a, b):
    return list(range(a, b))


def _rdg_vjp(a, wanted):
    from . import _general

    rdg, DN = _general.ragged_dot_general, _general.RaggedDotDimensionNumbers
    lhs, rhs = np.asarray(a["lhs"]), np.asarray(a["rhs"])
    gs = np.asarray(a["group_sizes"])
    dn = a["ragged_dot_dimension_numbers"]
    off = a.get("group_offset")
    extra = {k: val for k, val in a.items()
             if k not in ("lhs", "rhs", "group_sizes", "ragged_dot_dimension_numbers",
                          "preferred_element_type")}
    out = rdg(lhs, rhs, gs, dn, preferred_element_type=a["preferred_element_type"], **extra)
    cdt = _compute_dtype(lhs, rhs, out)
    lay = _rdg_layout(dn, lhs.ndim, rhs.ndim)
    L, R = lhs.transpose(lay["lperm"]), rhs.transpose(lay["rperm"])
    mode, p, nb, nf, nc, nn = (lay[x] for x in ("mode", "pos", "nb", "nf", "nc", "nn"))
    B = _rng(0, nb)
    precision = a.get("precision")

    def call(x, y, contract, batch, ragged, group, sizes=gs, group_offset=None):
        d = DN(dot_dimension_numbers=(contract, batch), lhs_ragged_dimensions=[ragged],
               rhs_group_dimensions=group)
        kw = {} if group_offset is None else {"group_offset": group_offset}
        return rdg(x, y, sizes, d, precision=precision, preferred_element_type=cdt, **kw)

    def mode1_drhs(ct):
        """[g_local, B, K, N]: a ragged contracting product over the local groups."""
        contract, batch, ragged = (_rng(nb, nb + nf), _rng(nb, nb + nf)), (B, B), nb + p
        if off is None:
            return call(L, ct, contract, batch, ragged, [])
        start, local = v.index(off, "group_offset", "ragged_dot_general"), R.shape[0]
        if gs.ndim == 1:  # the local groups are one range of the ragged dim: slice it
            ends = np.concatenate([[0], np.cumsum(gs.astype(np.int64))])
            rows = [slice(None)] * L.ndim
            rows[ragged] = slice(int(ends[start]), int(ends[start + local]))
            return call(L[tuple(rows)], ct[tuple(rows)], contract, batch, ragged, [],
                        sizes=gs[start:start + local])
        # group_sizes varies with the prefix: one leading pseudo-group for the
        # rows before the local groups, dropped; rows after belong to no group.
        lead = gs[..., :start].astype(np.int64).sum(axis=-1, keepdims=True)
        sizes = np.concatenate([lead, gs[..., start:start + local].astype(np.int64)], axis=-1)
        return call(L, ct, contract, batch, ragged, [], sizes=sizes)[1:]

    def backward(ct):
        ct = ct.astype(cdt, copy=False)
        grads = {}
        if "lhs" in wanted:
            if mode == 1:
                dL = call(ct, R, (_rng(nb + nf, nb + nf + nn), _rng(1 + nb + nc, 1 + nb + nc + nn)),
                          (B, _rng(1, 1 + nb)), nb + p, [0], group_offset=off)
            elif mode == 2:
                dL = call(R, ct, (_rng(nb + nc, nb + nc + nn), _rng(1 + nb + nf, 1 + nb + nf + nn)),
                          (B, _rng(1, 1 + nb)), nb + p, [0])          # [B, K, F]
                dL = dL.transpose(B + _rng(nb + nc, nb + nc + nf) + _rng(nb, nb + nc))
            else:
                dL = call(ct, R, (_rng(nb + nf, nb + nf + nn), _rng(nb + nc, nb + nc + nn)),
                          (B, B), p, [])
            grads["lhs"] = dL.transpose(np.argsort(lay["lperm"]))
        if "rhs" in wanted:
            if mode == 1:
                dR = mode1_drhs(ct)
            elif mode == 2:
                dR = call(L, ct, (_rng(nb, nb + nf), _rng(1 + nb, 1 + nb + nf)),
                          (B, _rng(1, 1 + nb)), nb + nf + p, [0])
            else:
                dR = call(L, ct, (_rng(nb, nb + nf), _rng(nb, nb + nf)), (B, B), p, [])
            grads["rhs"] = dR.transpose(np.argsort(lay["rperm"]))
        return grads

    return out, backward


def _rdg_jvp(a, t):
    from . import _general

    rdg = _general.ragged_dot_general
    lhs, rhs, gs = np.asarray(a["lhs"]), np.asarray(a["rhs"]), a["group_sizes"]
    dn = a["ragged_dot_dimension_numbers"]
    extra = {k: val for k, val in a.items()
             if k not in ("lhs", "rhs", "group_sizes", "ragged_dot_dimension_numbers",
                          "preferred_element_type")}
    out = rdg(lhs, rhs, gs, dn, preferred_element_type=a["preferred_element_type"], **extra)
    cdt = _compute_dtype(lhs, rhs, out)
    terms = []
    if t.get("lhs") is not None:
        terms.append(rdg(t["lhs"], rhs, gs, dn, preferred_element_type=cdt, **extra))
    if t.get("rhs") is not None:
        terms.append(rdg(lhs, t["rhs"], gs, dn, preferred_element_type=cdt, **extra))
    return out, _sum_terms(terms, out)
