"""Forward- and reverse-mode derivatives of raggeddot's operations, in jax's style.

There is no tracing here: the differentiable functions are the package's ops
(``ragged_dot``, ``gmm``, ``tgmm``, ``ragged_dot_general``, ``ragged_gather``,
``ragged_gather_reduce``, ``moe_block``),
each with a registered rule, or a ``functools.partial`` of one of them (for
instance ``partial(gmm, transpose_rhs=True)``)::

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

An op may have differentiable keyword-only parameters that cannot be
primals (moe_block's router_bias, per-expert biases, shared experts and
shared_expert_gate). ``vjp`` returns one gradient per positional primal, so
it has no place for theirs: binding an array to one of them in a partial
is a ValueError pointing to the op's own vjp function (``moe_block_vjp``,
which returns every gradient), rather than a silent constant.

Every rule is computed by the C-backed ops themselves, in the op's compute
dtype (float32, or float64 when an input or the output is float64); gradients
are cast to the primal's dtype once, at the end.

This module is the machinery only and imports no op: each op's module
registers its rules beside the op, at import, through :func:`defvjp` and
:func:`defjvp`; :func:`primal`, :func:`primal_dtype` and :func:`sum_terms`
are the helpers those rules share.
"""
import functools
import inspect

import numpy as np

from . import _gateway as gw
from . import _validate as v
from ._prepack import PackedRhs
from .quant import AsQArray, QArray

# operands the rules take as they are: quantized values (straight through)
# and prepacked weights (differentiated as the [g, k, n] weights they hold)
_HELD = (QArray, PackedRhs)

__all__ = ["vjp", "jvp", "grad", "defvjp", "defjvp"]

# op -> (rule, argnames)
_VJP_RULES = {}
_JVP_RULES = {}
# op -> the parameters of its jvp that take a PackedRhs
_PACKED_ARGS = {}
# op -> (keyword-only differentiable names, the op's own vjp function's name)
_KEYWORD_GRADS = {}


def defvjp(op, vjp_rule, argnames, keyword_argnames=(), full_vjp=None):
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
      keyword_argnames: differentiable keyword-only parameters, whose
        gradients ``vjp`` has no place for: ``vjp`` of a partial binding
        any of them to a value other than None raises ValueError naming
        ``full_vjp``, the function that returns their gradients.
    """
    _VJP_RULES[op] = (vjp_rule, tuple(argnames))
    if keyword_argnames:
        _KEYWORD_GRADS[op] = (tuple(keyword_argnames), full_vjp)


def defjvp(op, jvp_rule, argnames, packed_argnames=()):
    """Register the forward-mode rule of ``op``.

    ``packed_argnames``: the parameters that take a
    :class:`~raggeddot.PackedRhs` (a PackedRhs given for any other one is
    refused with a TypeError before its tangent is read).

    ``jvp_rule(args, tangents) -> (out, tangent_out)``: ``args`` as for
    :func:`defvjp`; ``tangents`` maps each name in ``argnames`` whose value is
    not None to its tangent (an array of the primal's shape and dtype) or to
    None for a zero tangent. ``tangent_out`` may come in any float dtype; the
    caller casts it to ``out``'s dtype.
    """
    _JVP_RULES[op] = (jvp_rule, tuple(argnames))
    _PACKED_ARGS[op] = tuple(packed_argnames)


# ---------------------------------------------------------------------------
# Resolving `fun` and binding primals
# ---------------------------------------------------------------------------


def _op_name(op):
    mod = getattr(op, "__module__", "") or ""
    name = getattr(op, "__qualname__", getattr(op, "__name__", repr(op)))
    return f"raggeddot.{name}" if mod.startswith("raggeddot") else f"{mod}.{name}"


def _resolve(fun, rules, what):
    """(op, partial positional args, partial keywords) of a registered op or a partial of one."""
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


def primal_dtype(x):
    """The dtype of a primal's gradient: the primal's, in native byte order
    (a QArray's: that of its dequantized value, whose gradient it gets; a
    PackedRhs's: that of the weights it holds; an AsQArray's: its array's)."""
    if isinstance(x, AsQArray):
        x = x.array
    return x.dtype if isinstance(x, _HELD) else v.native(np.asarray(x).dtype)


def operand(x):
    """A differentiable operand as the rules use it: a QArray as it is
    (straight through: its gradient is that of its dequantized value), an
    AsQArray quantized once, anything else as an array."""
    if isinstance(x, AsQArray):
        return x.quantize()
    return x if isinstance(x, _HELD) else np.asarray(x)


# ---------------------------------------------------------------------------
# vjp / jvp / grad
# ---------------------------------------------------------------------------


def vjp(fun, *primals, **kwargs):
    """``(out, vjp_fn)`` like ``jax.vjp``: ``out = fun(*primals, **kwargs)``
    and ``vjp_fn(ct)`` the gradient of ``sum(out * ct)``.

    Args:
      fun: ``raggeddot.ragged_dot``, ``gmm``, ``tgmm``, ``ragged_dot_general``,
        ``ragged_gather``, ``ragged_gather_reduce``, ``moe_block`` or a
        ``functools.partial`` of one (anything else: TypeError).
      *primals: the positional arguments of the call.
      **kwargs: keyword arguments of the call, not differentiated (as
        those a partial binds: e.g. ``preferred_element_type=np.float64``).

    Returns:
      ``(out, vjp_fn)``. ``vjp_fn(ct)``, ``ct`` an array of ``out``'s shape,
      returns a tuple with one entry per primal: the gradient with the primal's
      shape and dtype for a differentiable argument (``lhs``, ``rhs`` and
      ``existing_out``; the gathers' rows and weights; moe_block's x,
      router_weights, w0, w1, wo), ``None`` for ``group_sizes``, indices
      and any other (non-differentiable) argument. ``vjp_fn``
      can be called any number of times; the primals are read, never written,
      and must not be modified while ``vjp_fn`` is in use.

    Example::

        out, vjp_fn = raggeddot.vjp(raggeddot.ragged_dot, lhs, rhs, group_sizes)
        d_lhs, d_rhs, _ = vjp_fn(np.ones_like(out))
    """
    op, pargs, pkwargs = _resolve(fun, _VJP_RULES, "vjp")
    pkwargs = {**pkwargs, **kwargs}
    rule, argnames = _VJP_RULES[op]
    _refuse_bound_gradients(op, pkwargs)
    args, names = _bind(op, pargs, pkwargs, primals, "vjp")
    diff = [name in argnames and p is not None for name, p in zip(names, primals)]
    wanted = frozenset(name for name, d in zip(names, diff) if d)
    dtypes = [primal_dtype(p) if d else None for p, d in zip(primals, diff)]
    shapes = [np.shape(p.array) if isinstance(p, AsQArray) else tuple(p.shape) if isinstance(p, _HELD)
              else np.shape(p) if d else None
              for p, d in zip(primals, diff)]
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


def _refuse_bound_gradients(op, pkwargs):
    """ValueError when a partial binds a value to a differentiable
    keyword-only parameter of ``op`` (see the module docstring)."""
    names, full_vjp = _KEYWORD_GRADS.get(op, ((), None))
    bound = [name for name in names if pkwargs.get(name) is not None]
    if bound:
        raise ValueError(
            f"vjp of {_op_name(op)}: {', '.join(map(repr, bound))} bound in the partial would be "
            f"differentiable, but raggeddot.vjp returns gradients of the positional primals only and "
            f"would treat {'it' if len(bound) == 1 else 'them'} as constant; call {full_vjp}, which "
            "returns the gradients of every array argument")


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


def jvp(fun, primals, tangents, **kwargs):
    """``(out, tangent_out)`` like ``jax.jvp``: ``out = fun(*primals,
    **kwargs)`` and ``tangent_out`` its derivative along ``tangents``.

    Args:
      fun: as for :func:`vjp`. For ``moe_block`` the expert choice (top-k,
        piecewise constant) is held fixed: the tangent flows through the
        router weights of the chosen experts, as in the vjp.
      primals: tuple of the positional arguments of the call.
      tangents: tuple of the same length. For a differentiable argument
        (``lhs``, ``rhs``, ``existing_out``; the gathers' rows and
        weights; moe_block's x, router_weights, w0, w1, wo): an array of
        the primal's shape (cast to its dtype) or ``None`` for zero. For
        every other argument the tangent is ignored (``None``, or jax's
        float0 zeros for ``group_sizes``).
      **kwargs: keyword arguments of the call, constants of the derivative
        (as those a partial binds).

    Returns:
      ``(out, tangent_out)``, ``tangent_out`` with ``out``'s shape and dtype.
      The ops are linear in each float argument, so e.g. for ragged_dot
      ``tangent_out = ragged_dot(t_lhs, rhs, gs) + ragged_dot(lhs, t_rhs, gs)``.
    """
    op, pargs, pkwargs = _resolve(fun, _JVP_RULES, "jvp")
    pkwargs = {**pkwargs, **kwargs}
    rule, argnames = _JVP_RULES[op]
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ValueError(
            f"jvp: got {len(primals)} primals but {len(tangents)} tangents; give one tangent per primal")
    args, names = _bind(op, pargs, pkwargs, primals, "jvp")
    tdict = {}
    what = f"jvp of {_op_name(op)}"
    for name, p, t in zip(names, primals, tangents):
        if isinstance(p, PackedRhs) and name not in _PACKED_ARGS.get(op, ()):
            raise v.packed_refused(p, f"'{name}'", what)
        if isinstance(t, PackedRhs):
            raise v.packed_refused(t, f"the tangent of '{name}'", what)
        if name not in argnames or p is None:
            continue
        if t is None:
            tdict[name] = None
            continue
        pa = np.asarray(p.array) if isinstance(p, AsQArray) else operand(p)
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
    """Gradient of the scalar ``sum(fun(*primals, **kwargs) * cotangent)``.

    The ops return arrays and there is no tracer to differentiate a reduction
    written by the user, so ``grad`` fixes the reduction: the returned function
    ``g(*primals, cotangent=None, **kwargs)`` gives the gradient of
    ``L = sum(fun(*primals, **kwargs) * cotangent)`` with respect to
    ``primals[argnums]`` (``cotangent=None`` means ones, i.e. ``L =
    sum(out)``). Keyword arguments are passed to ``fun`` and not
    differentiated, as ``jax.grad`` does. It equals
    ``jax.grad(lambda *a, **kw: (f(*a, **kw) * cotangent).sum(), argnums)``.
    ``inspect.signature(g)`` is that of ``fun`` with the keyword-only
    ``cotangent=None`` added.

    Args:
      fun: as for :func:`vjp`.
      argnums: an int (one array is returned) or a tuple of ints (a tuple is
        returned); each must point at a differentiable argument.
    """
    single = isinstance(argnums, (int, np.integer))
    nums = (int(argnums),) if single else tuple(int(a) for a in argnums)
    op, _, _ = _resolve(fun, _VJP_RULES, "grad")  # fail early on a non-differentiable fun

    @functools.wraps(fun if not isinstance(fun, functools.partial) else fun.func)
    def g(*primals, cotangent=None, **kwargs):
        for a in nums:
            if not -len(primals) <= a < len(primals):
                raise ValueError(f"grad: argnums={a} is out of range for {len(primals)} primals")
        out, vjp_fn = vjp(fun, *primals, **kwargs)
        ct = np.ones_like(out) if cotangent is None else cotangent
        grads = vjp_fn(ct)
        picked = []
        for a in nums:
            if grads[a] is None:
                raise TypeError(
                    f"grad: argument {a} is not differentiable (the differentiable arguments of "
                    f"{_op_name(op)} are {', '.join(_VJP_RULES[op][1])}; group_sizes, indices and "
                    "options have no gradient)")
            picked.append(grads[a])
        return picked[0] if single else tuple(picked)

    g.__signature__ = _with_cotangent(inspect.signature(fun))
    return g


def _with_cotangent(sig):
    """``sig`` with a keyword-only ``cotangent=None`` (before any ``**kwargs``)."""
    params = [p for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD]
    var_kw = [p for p in sig.parameters.values() if p.kind == p.VAR_KEYWORD]
    extra = inspect.Parameter("cotangent", inspect.Parameter.KEYWORD_ONLY, default=None)
    return sig.replace(parameters=params + [extra] + var_kw)


# ---------------------------------------------------------------------------
# Helpers of the rules
# ---------------------------------------------------------------------------


def primal(op, args):
    """Evaluate an op whose differentiable arguments are ``lhs`` and ``rhs``
    at its bound arguments ``args``.

    Returns ``(lhs, rhs, group_sizes, out, compute dtype)``, lhs and rhs as
    arrays; the compute dtype (float32, or float64 when an input or the
    output is float64) is the one the rule's products run in."""
    lhs, rhs = operand(args["lhs"]), operand(args["rhs"])
    out = op(**{**args, "lhs": lhs, "rhs": rhs})
    return lhs, rhs, args["group_sizes"], out, gw.compute_dtype(lhs.dtype, rhs.dtype, out.dtype)


def sum_terms(terms, like):
    """The sum of the tangent terms (in order), or zeros like ``like``."""
    if not terms:
        return np.zeros_like(like)
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total
