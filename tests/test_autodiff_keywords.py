"""grad, vjp and jvp pass keyword arguments through to the differentiated
op, as jax's transformations do: not differentiated, bound like a
partial's keywords; and grad's returned function reports its true signature."""
import functools
import inspect

import numpy as np
import pytest

import raggeddot


def _problem(rng):
    lhs = rng.standard_normal((6, 3)).astype(np.float32)
    rhs = rng.standard_normal((2, 3, 4)).astype(np.float32)
    return lhs, rhs, np.array([2, 3])


def test_grad_passes_keywords(rng):
    lhs, rhs, gs = _problem(rng)
    g = raggeddot.grad(raggeddot.ragged_dot)(lhs, rhs, gs, preferred_element_type=np.float64)
    want = raggeddot.grad(functools.partial(raggeddot.ragged_dot, preferred_element_type=np.float64))(
        lhs, rhs, gs)
    assert g.dtype == np.float32 and np.array_equal(g, want)
    # a cotangent of the float64 output, with keywords around it
    ct = rng.standard_normal((6, 4))
    g1, g2 = raggeddot.grad(raggeddot.ragged_dot, argnums=(0, 1))(
        lhs, rhs, gs, cotangent=ct, preferred_element_type=np.float64)
    _, vjp_fn = raggeddot.vjp(raggeddot.ragged_dot, lhs, rhs, gs, preferred_element_type=np.float64)
    w1, w2, _ = vjp_fn(ct)
    assert np.array_equal(g1, w1) and np.array_equal(g2, w2)


def test_vjp_and_jvp_pass_keywords(rng):
    lhs, rhs, gs = _problem(rng)
    out, vjp_fn = raggeddot.vjp(raggeddot.gmm, lhs, rhs, gs, preferred_element_type=np.float64)
    assert out.dtype == np.float64
    assert len(vjp_fn(np.ones_like(out))) == 3          # keywords have no gradient entry
    t = (rng.standard_normal(lhs.shape).astype(np.float32), None, None)
    out_j, t_out = raggeddot.jvp(raggeddot.ragged_dot, (lhs, rhs, gs), t, preferred_element_type=np.float64)
    assert out_j.dtype == t_out.dtype == np.float64
    np.testing.assert_allclose(t_out, raggeddot.ragged_dot(t[0], rhs, gs, preferred_element_type=np.float64),
                               rtol=1e-12)
    # call-time keywords override a partial's, as functools.partial does
    fun = functools.partial(raggeddot.ragged_dot, preferred_element_type=np.float32)
    out2, _ = raggeddot.vjp(fun, lhs, rhs, gs, preferred_element_type=np.float64)
    assert out2.dtype == np.float64


def test_keywords_of_moe_block(rng):
    x = rng.standard_normal((5, 4))
    router = rng.standard_normal((4, 3))
    w0, w1 = rng.standard_normal((3, 4, 2)), rng.standard_normal((3, 4, 2))
    wo = rng.standard_normal((3, 2, 4))
    g = raggeddot.grad(raggeddot.moe_block)(x, router, w0, w1, wo, top_k=2, norm_topk_prob=True)
    _, vjp_fn = raggeddot.moe_block_vjp(x, router, w0, w1, wo, top_k=2, norm_topk_prob=True)
    assert np.array_equal(g, vjp_fn(np.ones((5, 4)))["x"])
    # a differentiable keyword is refused as it is in a partial
    with pytest.raises(ValueError, match="router_bias.*moe_block_vjp"):
        raggeddot.vjp(raggeddot.moe_block, x, router, w0, w1, wo, top_k=2, router_bias=np.zeros(3))
    with pytest.raises(TypeError, match="bad arguments.*unknown_option"):
        raggeddot.grad(raggeddot.moe_block)(x, router, w0, w1, wo, top_k=2, unknown_option=1)


def test_grad_signature_is_honest():
    sig = inspect.signature(raggeddot.grad(raggeddot.ragged_dot))
    params = sig.parameters
    assert list(params)[:3] == ["lhs", "rhs", "group_sizes"]
    assert params["preferred_element_type"].default is None
    assert params["cotangent"].kind is inspect.Parameter.KEYWORD_ONLY and params["cotangent"].default is None
    # every advertised parameter is accepted by name
    for name in params:
        assert name in inspect.signature(raggeddot.ragged_dot).parameters or name == "cotangent"
    # a partial's bound keyword shows with its bound default
    sig = inspect.signature(raggeddot.grad(functools.partial(raggeddot.gmm, transpose_rhs=True)))
    assert sig.parameters["transpose_rhs"].default is True
    assert "cotangent" in sig.parameters
