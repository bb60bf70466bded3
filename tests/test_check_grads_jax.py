"""raggeddot.testing.check_grads is called as jax.test_util.check_grads is
(item 6): ``check_grads(f, args, order, modes=..., atol=, rtol=, eps=)``,
orders 1 and 2, returning None; the worst error behind ``return_error``."""
import functools
import inspect

import numpy as np
import pytest

import raggeddot
from raggeddot.testing import check_grads


def _args(rng, dtype=np.float64):
    return (rng.standard_normal((6, 3)).astype(dtype), rng.standard_normal((2, 3, 4)).astype(dtype),
            np.array([2, 3]))


def test_jax_signature():
    params = list(inspect.signature(check_grads).parameters.values())
    assert [p.name for p in params[:7]] == ["fun", "args", "order", "modes", "atol", "rtol", "eps"]
    assert params[2].default == 1 and tuple(params[3].default) == ("fwd", "rev")
    assert all(p.kind is p.KEYWORD_ONLY for p in params[7:])


def test_called_as_jax_returns_none(rng):
    args = _args(rng)
    assert check_grads(raggeddot.ragged_dot, args, 1, modes=["rev"]) is None
    assert check_grads(raggeddot.ragged_dot, args, order=1) is None
    assert check_grads(raggeddot.ragged_dot, args, 2) is None
    assert check_grads(raggeddot.ragged_dot, args, 2, ["fwd"], 1e-9, 1e-5, 1e-4) is None
    err = check_grads(raggeddot.ragged_dot, args, 1, return_error=True)
    assert isinstance(err, float) and err < 1e-6
    with pytest.raises(ValueError, match="'order' must be 1 or 2"):
        check_grads(raggeddot.ragged_dot, args, 3)
    with pytest.raises(ValueError, match="modes"):
        check_grads(raggeddot.ragged_dot, args, 1, modes=["backward"])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_order_two_of_raggeddot_ops(rng, dtype):
    check_grads(raggeddot.ragged_dot, _args(rng, dtype), 2)
    f = functools.partial(raggeddot.moe_block, top_k=2, norm_topk_prob=True)
    a = (rng.standard_normal((6, 4)), rng.standard_normal((4, 3)), rng.standard_normal((3, 4, 5)),
         rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 4)))
    if dtype == np.float64:
        check_grads(f, a, 2)


def test_order_two_finds_a_derivative_wrong_around_the_point(rng):
    """A jvp/vjp frozen at the base point is right there (order 1 passes)
    and wrong around it: order 2 fails."""
    x0 = rng.standard_normal(5)

    def cube(x):
        return x ** 3

    def frozen_jvp(fun, args, tangents):
        return fun(*args), 3 * x0 ** 2 * tangents[0]

    def frozen_vjp(fun, x):
        return fun(x), lambda ct: (3 * x0 ** 2 * ct,)

    def true_jvp(fun, args, tangents):
        return fun(*args), 3 * args[0] ** 2 * tangents[0]

    def true_vjp(fun, x):
        return fun(x), lambda ct: (3 * x ** 2 * ct,)

    check_grads(cube, (x0,), 1, jvp=frozen_jvp, vjp=frozen_vjp)
    check_grads(cube, (x0,), 2, jvp=true_jvp, vjp=true_vjp)
    for mode in ("fwd", "rev"):
        with pytest.raises(AssertionError, match=f"order 2, {mode}"):
            check_grads(cube, (x0,), 2, modes=[mode], jvp=frozen_jvp, vjp=frozen_vjp)


def test_scalar_failure_names_no_index(rng):
    """A failing contraction with the cotangent is one number: its message
    says so, not 'at ()'."""
    args = _args(rng)

    def broken_vjp(fun, *a):
        out, back = raggeddot.vjp(fun, *a)
        return out, lambda ct: tuple(None if g is None else 1.01 * g for g in back(ct))

    with pytest.raises(AssertionError) as info:
        check_grads(raggeddot.ragged_dot, args, 1, modes=["rev"], vjp=broken_vjp)
    msg = str(info.value)
    assert "at ()" not in msg and "index" not in msg and "analytic" in msg, msg

    def broken_jvp(fun, a, t):
        out, tan = raggeddot.jvp(fun, a, t)
        return out, 1.01 * tan

    with pytest.raises(AssertionError, match=r"worst at index \(\d+, \d+\)"):
        check_grads(raggeddot.ragged_dot, args, 1, modes=["fwd"], jvp=broken_jvp)
