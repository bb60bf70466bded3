"""Forward mode of moe_block: raggeddot.jvp through route, dispatch, experts
and combine, checked against central finite differences (check_grads, both
modes) and against the reverse mode through the identity
<jvp(t), c> == <t, vjp(c)>, which must hold for every option, including
those finite differences cannot follow (quantized rows: straight through)."""
import functools

import ml_dtypes
import numpy as np
import pytest

import raggeddot
from raggeddot.testing import check_grads

T, D, F, E = 6, 4, 5, 4
PRIMALS = ("x", "router_weights", "w0", "w1", "wo")


def _args(rng, dtype=np.float64, layout="edf", fused=False):
    x = rng.standard_normal((T, D))
    router = rng.standard_normal((D, E))
    w0, w1 = rng.standard_normal((E, D, F)), rng.standard_normal((E, D, F))
    wo = rng.standard_normal((E, F, D))
    if fused:
        w0, w1 = np.concatenate([w0, w1], axis=2), None
    if layout == "efd":
        w0, w1, wo = (None if w is None else np.ascontiguousarray(w.transpose(0, 2, 1)) for w in (w0, w1, wo))
    return tuple(None if a is None else a.astype(dtype) for a in (x, router, w0, w1, wo))


ROUTINGS = {
    "softmax": {},
    "softmax-norm": {"norm_topk_prob": True},
    "sigmoid-scaled": {"score_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5},
    "input-weights": {"score_func": "sigmoid", "router_weights_on": "input"},
    "capacity": {"capacity_factor": 0.5},
    "swiglu_oai": {"activation": "swiglu_oai", "swiglu_limit": 1.0},
    "gelu-efd": {"activation": "gelu", "weights_layout": "efd"},
}


@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_check_grads_both_modes(name):
    """check_grads with its default modes ("rev", "fwd"): every element of
    every primal against finite differences, float64."""
    kw = ROUTINGS[name]
    args = _args(np.random.default_rng(1), layout=kw.get("weights_layout", "edf"))
    err = check_grads(functools.partial(raggeddot.moe_block, top_k=2, **kw), args, return_error=True)
    assert err < 1e-6


def test_jvp_readme_call_and_fused_weights():
    """The call of the issue (a partial binding top_k), and fused gate/up
    weights (w1=None: its tangent is ignored like that of any None)."""
    rng = np.random.default_rng(2)
    args = _args(rng)
    tangents = tuple(rng.standard_normal(a.shape) for a in args)
    out, t_out = raggeddot.jvp(functools.partial(raggeddot.moe_block, top_k=2), args, tangents)
    assert np.array_equal(out, raggeddot.moe_block(*args, top_k=2))
    assert t_out.shape == out.shape and t_out.dtype == out.dtype and np.abs(t_out).max() > 0
    for layout, gate_up in (("edf", "interleaved"), ("efd", "concat")):
        fused = _args(rng, layout=layout, fused=True)
        check_grads(functools.partial(raggeddot.moe_block, top_k=2, weights_layout=layout, gate_up=gate_up),
                    fused, modes=("fwd",))


def _identity(args, kw, rng, tangents=None):
    """(<jvp(t), c>, <t, vjp(c)>, scale) in float64."""
    fun = functools.partial(raggeddot.moe_block, **kw)
    if tangents is None:
        tangents = tuple(None if a is None else rng.standard_normal(np.shape(a)) for a in args)
    out, t_out = raggeddot.jvp(fun, args, tangents)
    c = rng.standard_normal(out.shape)
    _, vjp_fn = raggeddot.moe_block_vjp(*args, **kw)
    grads = vjp_fn(c.astype(out.dtype))
    lhs = float(np.sum(t_out.astype(np.float64) * c))
    terms = [np.asarray(t, np.float64) * grads[n].astype(np.float64)
             for n, t in zip(PRIMALS, tangents) if t is not None]
    rhs = float(sum(np.sum(t) for t in terms))
    scale = float(np.sum(np.abs(t_out.astype(np.float64) * c)) + sum(np.sum(np.abs(t)) for t in terms))
    return lhs, rhs, scale


@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_jvp_vjp_identity(name):
    kw = {"top_k": 2, **ROUTINGS[name]}
    rng = np.random.default_rng(3)
    lhs, rhs, scale = _identity(_args(rng, layout=kw.get("weights_layout", "edf")), kw, rng)
    assert abs(lhs - rhs) <= 1e-12 * scale


def test_identity_with_constant_keywords():
    """Biases and (gated) shared experts bound in the partial are constants
    of the jvp: the identity holds with their tangents zero."""
    rng = np.random.default_rng(4)
    kw = {"top_k": 2, "router_bias": rng.standard_normal(E), "w0_bias": rng.standard_normal((E, F)),
          "wo_bias": rng.standard_normal((E, D)),
          "shared_experts": (rng.standard_normal((D, 3)), rng.standard_normal((D, 3)),
                             rng.standard_normal((3, D))),
          "shared_expert_gate": rng.standard_normal(D)}
    args = _args(rng)
    lhs, rhs, scale = _identity(args, kw, rng)
    assert abs(lhs - rhs) <= 1e-12 * scale
    check_grads(functools.partial(raggeddot.moe_block, **kw), args, modes=("fwd",))


def test_identity_one_tangent_at_a_time():
    """Each primal's tangent alone (the others None) matches its gradient."""
    rng = np.random.default_rng(5)
    args = _args(rng)
    for i in range(5):
        tangents = [None] * 5
        tangents[i] = rng.standard_normal(args[i].shape)
        lhs, rhs, scale = _identity(args, {"top_k": 2, "norm_topk_prob": True}, rng, tuple(tangents))
        assert abs(lhs - rhs) <= 1e-12 * scale, PRIMALS[i]


@pytest.mark.parametrize("case", ["int8-weights", "activation_qtype", "prepacked", "bfloat16"])
def test_identity_quantized_packed_half(case):
    """Options finite differences cannot follow (quantized rows are piecewise
    constant, taken straight through) or only coarsely (16-bit)."""
    rng = np.random.default_rng(6)
    args = _args(rng, dtype=np.float32)
    kw, tol = {"top_k": 2}, 1e-5
    if case == "int8-weights":
        args = args[:2] + tuple(raggeddot.quantize(w, "int8") for w in args[2:])
    elif case == "activation_qtype":
        kw["activation_qtype"] = "int8"
    elif case == "prepacked":
        args = args[:2] + tuple(raggeddot.prepack(w) for w in args[2:])
    else:
        args, tol = tuple(a.astype(ml_dtypes.bfloat16) for a in args), 2e-2
    lhs, rhs, scale = _identity(args, kw, rng)
    assert abs(lhs - rhs) <= tol * scale


def test_jvp_refuses_return_aux():
    args = _args(np.random.default_rng(7))
    with pytest.raises(ValueError, match="return_aux"):
        raggeddot.jvp(functools.partial(raggeddot.moe_block, top_k=2, return_aux=True), args, args)
