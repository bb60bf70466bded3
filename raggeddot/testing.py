"""Numerical gradient checks for raggeddot's derivatives and for your own.

:func:`check_grads` compares a function's vjp and jvp against central finite
differences, and is called as ``jax.test_util.check_grads`` is
(``check_grads(f, args, order, modes=("fwd", "rev"), atol=None, rtol=None,
eps=None)``, returning None).
"""
import numpy as np

__all__ = ["check_grads"]

# Defaults per the least precise dtype involved: (eps, rtol).
_DEFAULTS = {
    "float64": (1e-6, 1e-6),
    "float32": (1e-2, 2e-3),
    "float16": (1e-1, 5e-2),
    "bfloat16": (2.5e-1, 1.5e-1),
}
# Order 2's second differences: (eps, rtol). A second difference loses
# eps^2 of the value to rounding, so its step is about machine epsilon ** 1/4.
_DEFAULTS_ORDER2 = {
    "float64": (1e-4, 1e-5),
    "float32": (3e-2, 1e-2),
    "float16": (2.5e-1, 1e-1),
    "bfloat16": (5e-1, 3e-1),
}
# Per-element checks run when the differentiated inputs hold at most this many
# elements in total (each element costs two evaluations of fun and one jvp).
PER_ELEMENT_LIMIT = 512
# Machine epsilon per output dtype: f(x + eps*d) - f(x - eps*d) is trusted only
# down to _NOISE * epsilon * max|f(x)| per output element (rounding noise).
_EPS_MACH = {"float64": 2.0 ** -52, "float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
_NOISE = 8.0


def _is_float(a):
    return isinstance(a, np.ndarray) and (a.dtype.kind == "f" or a.dtype.name == "bfloat16")


def _dtype_key(dtypes):
    order = ["bfloat16", "float16", "float32", "float64"]
    names = [np.dtype(d).name for d in dtypes]
    for name in order:
        if name in names:
            return name
    return "float64"


def _f64(x):
    return np.asarray(x).astype(np.float64)


class _Checker:
    def __init__(self, fun, args, argnums, rtol, atol, name):
        self.fun, self.args, self.argnums = fun, args, argnums
        self.rtol, self.atol, self.name = rtol, atol, name
        self.worst = 0.0
        self.worst_where = None

    def compare(self, got, want, scale, where):
        """Record |got - want| against rtol * scale (+ atol); raise on failure."""
        got, want = _f64(got), _f64(want)
        if got.shape != want.shape:
            raise AssertionError(f"check_grads({self.name}): {where}: shape {got.shape} != {want.shape}")
        if not (np.all(np.isfinite(got)) and np.all(np.isfinite(want))):
            raise AssertionError(f"check_grads({self.name}): {where}: non-finite values "
                                 f"(analytic {got.ravel()[:4]}..., numeric {want.ravel()[:4]}...)")
        diff = np.abs(got - want)
        worst = float(diff.max()) if diff.size else 0.0
        if scale > 0:
            err = worst / scale
        else:
            err = 0.0 if worst == 0 else np.inf
        if err > self.worst:
            self.worst, self.worst_where = err, where
        if worst > self.atol + self.rtol * scale:
            if diff.ndim:
                idx = np.unravel_index(int(np.argmax(diff)), diff.shape)
                at = f"|analytic - numeric| = {worst:.6e}, worst at index {tuple(map(int, idx))}: "
            else:   # one number (a contraction with a cotangent): nothing to locate
                idx, at = (), f"|analytic - numeric| = {worst:.6e}: "
            raise AssertionError(
                f"check_grads({self.name}): {where}: relative error {err:.3e} > rtol {self.rtol:.1e} "
                f"(atol {self.atol:.1e}); {at}analytic {float(got[idx])!r}, numeric {float(want[idx])!r}, "
                f"scale {scale:.6e}")

    def shifted(self, direction, eps, base=None):
        """(x + eps d, x - eps d, steps): the arguments ``base`` (default the
        checked ones) moved both ways along ``direction``, rounded to each
        input's dtype, and the step actually taken, in float64."""
        base = self.args if base is None else base
        plus, minus, steps = list(base), list(base), {}
        for i, d in direction.items():
            x = base[i]
            xp = (_f64(x) + eps * d).astype(x.dtype)
            xm = (_f64(x) - eps * d).astype(x.dtype)
            plus[i], minus[i] = xp, xm
            steps[i] = _f64(xp) - _f64(xm)
        return plus, minus, steps

    def perturb(self, direction, eps, base=None):
        """f(x + eps d) - f(x - eps d) in float64 (x: ``base``, default the
        checked arguments), and the step actually taken ((x + eps d) - (x -
        eps d) after rounding to each input's dtype)."""
        plus, minus, steps = self.shifted(direction, eps, base)
        return _f64(self.fun(*plus)) - _f64(self.fun(*minus)), steps


def _check_out(got, want, tol, name, what):
    """The primal output of vjp/jvp must be fun(*args) (up to rounding)."""
    got, want = _f64(got), _f64(want)
    if got.shape != want.shape:
        raise AssertionError(f"check_grads({name}): {what}'s out has shape {got.shape}, "
                             f"fun(*args) has {want.shape}")
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    err = float(np.abs(got - want).max(initial=0.0)) / scale
    if not err <= tol:
        raise AssertionError(f"check_grads({name}): {what}'s out differs from fun(*args): "
                             f"scaled error {err:.3e} > {tol:.1e}")


def check_grads(fun, args, order=1, modes=("fwd", "rev"), atol=None, rtol=None, eps=None, *,
                argnums=None, seed=0, vjp=None, jvp=None, return_error=False):
    """Check the derivatives of ``fun`` against central finite differences,
    called as ``jax.test_util.check_grads`` is: ``check_grads(f, args, 1)``,
    ``check_grads(f, args, order=2, modes=["rev"])``.

    Order 1. With ``x`` the inputs in ``argnums`` and ``s`` the step
    actually taken (``(x + eps*d) - (x - eps*d)`` after rounding to each
    input's dtype), the finite difference ``f(x + eps*d) - f(x - eps*d) ~ J s``
    is compared with:

    - ``"rev"``: ``<u, J s>`` from ``vjp`` for a random cotangent ``u``;
    - ``"fwd"``: ``J s`` from ``jvp`` (the whole output).

    Directions ``d`` are (a) when the inputs hold at most ``PER_ELEMENT_LIMIT``
    (512) elements in total, every unit vector (each element on its own: this
    finds and names a wrong entry, e.g. a nonzero gradient where it must be
    exactly 0) and (b) two random normal vectors over all inputs at once. A
    comparison fails when ``|analytic - numeric| > atol + rtol * scale``, the
    scale being the magnitude of the terms compared (``sum |u * J s|`` and
    ``sum |vjp(u) * s|`` for rev, ``max |J s|`` for fwd), and at least
    ``noise / rtol``, where ``noise = 8 * machine epsilon * max|fun(*args)|`` (of
    the output's dtype, per output element) is the rounding noise of a finite
    difference: differences at that level always pass. The relative error of a
    comparison is ``|analytic - numeric| / scale``.

    Order 2 checks the first derivatives' own derivatives too. raggeddot's
    vjp and jvp are not themselves differentiable (jax's order 2 nests its
    autodiff), so here the derivative's derivative along a random direction
    ``e`` is taken from the first derivatives at the two points ``y = x +-
    eps*e``: along another random direction ``d``, the change ``J(y+) s+ -
    J(y-) s-`` (from jvp, and contracted with ``u`` from vjp) is compared
    with the same change of the finite differences, ``[f(y+ + eps d) - f(y+
    - eps d)] - [f(y- + eps d) - f(y- - eps d)]``: both are ``4 eps^2`` times
    the second derivative along ``e`` and ``d``. A derivative right at x but
    wrong around it (its curvature) fails there. Two pairs of random
    directions, after every order-1 check.

    A function that is only piecewise smooth (``moe_block``: its top-k
    choice of experts is piecewise constant, and both vjp and jvp hold it
    fixed) agrees with finite differences only while the steps ``x +- eps*d``
    keep the same choice: check it in float64 (eps 1e-6), or with a small
    ``eps``; float32's default 1e-2 can move a token to another expert.

    Args:
      fun: ``fun(*args)`` returns an array. With the default ``vjp``/``jvp`` it
        must be one of raggeddot's differentiable ops or a ``functools.partial``
        of one (see ``raggeddot.vjp``).
      args: tuple of positional arguments; the differentiated ones must be
        float ndarrays.
      order: 1, or 2 (see above); jax's higher orders are not available.
      modes: any of ``"fwd"`` and ``"rev"`` (a string or a sequence), as jax's.
      atol: absolute tolerance (default 0).
      rtol: relative tolerance (default float64 1e-6, float32 2e-3, float16
        5e-2, bfloat16 0.15; order 2: float64 1e-5, float32 1e-2, float16
        0.1, bfloat16 0.3).
      eps: finite-difference step (default by the least precise float dtype
        among the inputs and the output: float64 1e-6, float32 1e-2, float16
        0.1, bfloat16 0.25; order 2's second differences: float64 1e-4,
        float32 3e-2, float16 0.25, bfloat16 0.5). A given eps is used for both.
      argnums: keyword only: indices of the arguments to differentiate
        (default: every float ndarray in ``args``; jax differentiates them all).
      seed: keyword only: seed of the random directions and cotangents.
      vjp: keyword only: ``vjp(fun, *args) -> (out, vjp_fn)`` with
        ``vjp_fn(ct)`` returning one gradient (or None) per argument; default
        ``raggeddot.vjp``.
      jvp: keyword only: ``jvp(fun, args, tangents) -> (out, tangent_out)``,
        tangents None for arguments not in ``argnums``; default ``raggeddot.jvp``.
      return_error: keyword only: return the worst relative error found (a
        float) instead of None.

    Returns:
      None, as jax's (the worst relative error with ``return_error=True``).

    Raises:
      AssertionError with the comparison, the index of the worst element (of
      an array; a contraction with the cotangent is one number) and both
      values when a derivative is off, a gradient has the wrong shape, or the
      ``out`` of vjp/jvp differs from ``fun(*args)``. ValueError for an
      ``order`` other than 1 or 2 or an unknown mode.

    Differences from ``jax.test_util.check_grads``: orders 1 and 2 only
    (order 2 as described above); ``argnums``, ``seed``, ``vjp``, ``jvp`` and
    ``return_error`` are keywords of this one; a failure names the element.

    Example::

        import numpy as np, raggeddot
        from raggeddot.testing import check_grads

        rng = np.random.default_rng(0)
        lhs, rhs = rng.standard_normal((6, 3)), rng.standard_normal((2, 3, 4))
        gs = np.array([2, 3])
        check_grads(raggeddot.ragged_dot, (lhs, rhs, gs), order=2)   # float64: rtol 1e-6

        # Your own composition, with a hand-written vjp:
        def f(x, w):                        # sum of squares per row, grouped
            return raggeddot.ragged_dot(x, w, gs) ** 2
        def f_vjp(fun, x, w):
            out, back = raggeddot.vjp(raggeddot.ragged_dot, x, w, gs)
            return out ** 2, lambda ct: back(2 * out * ct)[:2]
        check_grads(f, (lhs, rhs), 1, modes=["rev"], vjp=f_vjp)
    """
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order not in (1, 2):
        raise ValueError(f"check_grads: 'order' must be 1 or 2, got {order!r}")
    if vjp is None or jvp is None:
        from . import _autodiff
        vjp = _autodiff.vjp if vjp is None else vjp
        jvp = _autodiff.jvp if jvp is None else jvp
    args = tuple(args)
    if argnums is None:
        argnums = tuple(i for i, a in enumerate(args) if _is_float(a))
    elif isinstance(argnums, (int, np.integer)):
        argnums = (int(argnums),)
    argnums = tuple(int(i) % len(args) for i in argnums)
    for i in argnums:
        if not _is_float(args[i]):
            raise TypeError(f"check_grads: argument {i} is not a float ndarray: {type(args[i]).__name__}")
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    for mode in modes:
        if mode not in ("rev", "fwd"):
            raise ValueError(f"check_grads: modes must be 'fwd' and/or 'rev', got {mode!r}")
    name = getattr(getattr(fun, "func", fun), "__name__", repr(fun))

    out = np.asarray(fun(*args))
    key = _dtype_key([args[i].dtype for i in argnums] + [out.dtype])
    d_eps, d_rtol = _DEFAULTS[key]
    given_eps, given_rtol = eps, rtol
    eps = d_eps if eps is None else float(eps)
    rtol = d_rtol if rtol is None else float(rtol)
    atol = 0.0 if atol is None else float(atol)
    chk = _Checker(fun, args, argnums, rtol, atol, name)
    rng = np.random.default_rng(seed)
    out_tol = 1e-12 if key == "float64" else 1e-5 if key == "float32" else 1e-2

    grads = None
    u = rng.standard_normal(out.shape)
    if "rev" in modes:
        out_v, vjp_fn = vjp(fun, *args)
        _check_out(out_v, out, out_tol, name, "vjp")
        grads = _gradients(vjp_fn, u.astype(out.dtype), args, argnums, name)
    u = _f64(u.astype(out.dtype))  # the cotangent as vjp saw it

    # Rounding noise of one finite difference, per output element; each scale
    # below is at least noise / rtol, so differences at the noise level pass.
    noise = _NOISE * _EPS_MACH[_dtype_key([out.dtype])] * float(np.abs(_f64(out)).max(initial=0.0))

    def rev_check(numeric, steps, where):
        analytic = sum(float(np.sum(_f64(grads[i]) * s)) for i, s in steps.items())
        want = float(np.sum(u * numeric))
        scale = max(float(np.sum(np.abs(u * numeric))),
                    sum(float(np.sum(np.abs(_f64(grads[i]) * s))) for i, s in steps.items()),
                    noise * float(np.sum(np.abs(u[numeric != 0]))) / rtol)
        chk.compare(analytic, want, scale, where)

    def tangent_out(at, steps):
        tangents = [None] * len(args)
        for i, s in steps.items():
            tangents[i] = s.astype(args[i].dtype)
        out_j, t_out = jvp(fun, tuple(at), tuple(tangents))
        if np.shape(t_out) != out.shape:
            raise AssertionError(f"check_grads({name}): jvp's tangent_out has shape "
                                 f"{np.shape(t_out)}, expected {out.shape}")
        return out_j, _f64(t_out)

    def fwd_check(numeric, steps, where):
        out_j, t_out = tangent_out(args, steps)
        scale = max(float(np.abs(numeric).max(initial=0.0)), float(np.abs(t_out).max(initial=0.0)),
                    noise / rtol)
        chk.compare(t_out, numeric, scale, where)
        return out_j

    # (a) every element on its own, for small inputs (first: it
    # names the element that is off).
    total = sum(args[i].size for i in argnums)
    if total <= PER_ELEMENT_LIMIT:
        for i in argnums:
            shape = args[i].shape
            results = []
            for flat in range(args[i].size):
                d = np.zeros(args[i].size)
                d[flat] = 1.0
                numeric, steps = chk.perturb({i: d.reshape(shape)}, eps)
                results.append((np.unravel_index(flat, shape), numeric, steps))
            for mode in modes:
                check = rev_check if mode == "rev" else fwd_check
                for idx, numeric, steps in results:
                    check(numeric, steps, f"{mode}, argument {i} element {tuple(int(j) for j in idx)}")
    # (b) random directions over all inputs at once.
    for trial in range(2):
        direction = {i: rng.standard_normal(args[i].shape) for i in argnums}
        numeric, steps = chk.perturb(direction, eps)
        if "rev" in modes:
            rev_check(numeric, steps, f"rev, random direction {trial}")
        if "fwd" in modes:
            out_j = fwd_check(numeric, steps, f"fwd, random direction {trial}")
            if trial == 0:
                _check_out(out_j, out, out_tol, name, "jvp")
    if order == 1:
        return chk.worst if return_error else None

    # (c) order 2: the change of the first derivatives between y+ = x + eps2 e
    # and y- = x - eps2 e, along d, against that of the finite differences.
    d_eps2, d_rtol2 = _DEFAULTS_ORDER2[key]
    eps2 = d_eps2 if given_eps is None else eps
    rtol2 = d_rtol2 if given_rtol is None else rtol
    chk2 = _Checker(fun, args, argnums, rtol2, atol, name)
    for trial in range(2):
        e_dir = {i: rng.standard_normal(args[i].shape) for i in argnums}
        d_dir = {i: rng.standard_normal(args[i].shape) for i in argnums}
        points = chk.shifted(e_dir, eps2)[:2]
        fds = [chk.perturb(d_dir, eps2, base=y) for y in points]     # (numeric, steps) at y+ and y-
        numeric = fds[0][0] - fds[1][0]
        where = f"order 2, {{}}, random directions {trial}"
        if "fwd" in modes:
            analytic = tangent_out(points[0], fds[0][1])[1] - tangent_out(points[1], fds[1][1])[1]
            scale = max(float(np.abs(numeric).max(initial=0.0)), float(np.abs(analytic).max(initial=0.0)),
                        2 * noise / rtol2)
            chk2.compare(analytic, numeric, scale, where.format("fwd"))
        if "rev" in modes:
            terms = []
            for y, (_, steps) in zip(points, fds):
                _, back = vjp(fun, *y)
                g = _gradients(back, u.astype(out.dtype), args, argnums, name)
                terms.append([float(np.sum(_f64(g[i]) * s)) for i, s in steps.items()])
            analytic = sum(terms[0]) - sum(terms[1])
            want = float(np.sum(u * numeric))
            scale = max(float(np.sum(np.abs(u * numeric))), abs(analytic),
                        2 * noise * float(np.sum(np.abs(u))) / rtol2)
            chk2.compare(analytic, want, scale, where.format("rev"))
    return max(chk.worst, chk2.worst) if return_error else None


def _gradients(vjp_fn, u, args, argnums, name):
    """``vjp_fn(u)``, checked: one gradient per argument, of its shape."""
    grads = vjp_fn(u)
    if len(grads) != len(args):
        raise AssertionError(f"check_grads({name}): vjp_fn returned {len(grads)} gradients "
                             f"for {len(args)} arguments")
    for i in argnums:
        if grads[i] is None or np.shape(grads[i]) != args[i].shape:
            raise AssertionError(
                f"check_grads({name}): gradient of argument {i} has shape "
                f"{None if grads[i] is None else np.shape(grads[i])}, expected {args[i].shape}")
    return grads
