"""moe_block's options for the MoE families beyond Mixtral's shape, against
the NumPy oracle (raggeddot.reference.moe_block) and central finite
differences:

- swiglu_alpha (gpt-oss's config value, routed and shared experts);
- shared_expert_gate (Qwen2-MoE: the shared MLP's output times
  sigmoid(x @ gate), gate [d] or [d, 1]);
- router_weights_on="input" (Llama4: each expert sees w * x, outputs summed
  unweighted);
- fused gate/up weights (w1=None): "edf" [E, d, 2f] / "efd" [E, 2f, d],
  "concat" / "interleaved", with a fused [E, 2f] bias; read as views of
  the stored array, never copied; gradients returned fused;
- the aux outputs: load_balance "switch" / "hf" / "maxtext" (closed forms),
  router_z_loss, router_logits, and their gradients (moe_block_vjp with
  return_aux=True) into x, router_weights and router_bias only;
- raggeddot.vjp refusing a partial that binds a differentiable array.

Forward cases run in float32 and float64 with experts left without tokens
(E = 8, T * top_k < E for some), with and without a capacity, in both
layouts. Gradients: float64 against central differences of moe_block
(relative error below GRAD_TOLERANCE, the routing asserted unchanged at
every evaluation), float32 against the float64 gradients. Bad arguments
raise errors naming them.
"""

import functools
import math

import numpy as np
import pytest

import raggeddot
from raggeddot import reference as ref
from raggeddot._moe.config import prepare

from helpers import FLOATS, GRAD_TOLERANCE, assert_unchanged, check_close, dtype_id, snapshot

pytestmark = pytest.mark.usefixtures("restore_runtime")

FD_STEP = 1e-6
FD_RTOL = GRAD_TOLERANCE[np.dtype(np.float64)]


# ----------------------------------------------------------------- problems

def fuse(w0, w1, axis, gate_up):
    """One array holding w0 and w1 along ``axis``: halves or interleaved."""
    if gate_up == "concat":
        return np.concatenate([w0, w1], axis=axis)
    shape = list(w0.shape)
    shape[axis] *= 2
    out = np.empty(shape, dtype=w0.dtype)
    even = [slice(None)] * w0.ndim
    odd = [slice(None)] * w0.ndim
    even[axis], odd[axis] = slice(0, None, 2), slice(1, None, 2)
    out[tuple(even)], out[tuple(odd)] = w0, w1
    return out


def problem(rng, *, T=6, d=5, f=3, E=8, layout="edf", fused=None, biases=False, shared=0,
            gate=None, router_bias=False, dtype=np.float64, x_shape=None):
    """(args [x, rw, w0, w1, wo], kwargs) with O(1) values; fused = None |
    "concat" | "interleaved" (w1=None, w0 fused along its 2f axis)."""
    x = rng.standard_normal(x_shape or (T, d))
    rw = rng.standard_normal((d, E)) * (2.0 / math.sqrt(d))
    w0 = rng.standard_normal((E, d, f)) / math.sqrt(d)
    w1 = rng.standard_normal((E, d, f)) / math.sqrt(d)
    wo = rng.standard_normal((E, f, d)) / math.sqrt(f)
    kw = {}
    if biases:
        b0, b1 = 0.3 * rng.standard_normal((E, f)), 0.3 * rng.standard_normal((E, f))
        kw["wo_bias"] = 0.3 * rng.standard_normal((E, d))
        if fused:
            kw["w0_bias"] = fuse(b0, b1, 1, fused)
        else:
            kw["w0_bias"], kw["w1_bias"] = b0, b1
    if router_bias:
        kw["router_bias"] = 0.5 * rng.standard_normal(E)
    if shared:
        kw["shared_experts"] = (rng.standard_normal((d, shared)) / math.sqrt(d),
                                rng.standard_normal((d, shared)) / math.sqrt(d),
                                rng.standard_normal((shared, d)) / math.sqrt(shared))
    if gate is not None:
        kw["shared_expert_gate"] = rng.standard_normal(gate)
    if layout == "efd":
        w0, w1, wo = (np.ascontiguousarray(w.transpose(0, 2, 1)) for w in (w0, w1, wo))
    if fused:
        w0, w1 = fuse(w0, w1, 2 if layout == "edf" else 1, fused), None
        kw["gate_up"] = fused
    kw["weights_layout"] = layout
    cast = lambda a: None if a is None else a.astype(dtype)  # noqa: E731
    for k, val in list(kw.items()):
        if isinstance(val, np.ndarray):
            kw[k] = cast(val)
        elif isinstance(val, tuple):
            kw[k] = tuple(cast(a) for a in val)
    return [cast(a) for a in (x, rw, w0, w1, wo)], kw


def compare(args, kw, label):
    """moe_block against the oracle: out and every aux entry."""
    out, aux = raggeddot.moe_block(*args, return_aux=True, **kw)
    want, want_aux = ref.moe_block(*args, return_aux=True, **kw)
    assert out.dtype == want.dtype and out.shape == want.shape, label
    assert set(aux) == set(want_aux), f"{label}: aux keys {sorted(aux)} != {sorted(want_aux)}"
    np.testing.assert_array_equal(aux["topk_indices"], want_aux["topk_indices"], err_msg=label)
    check_close(out, want, err_msg=label)
    for name in ("group_sizes", "bias_updates", "dropped", "slot_of", "token_of_slot"):
        np.testing.assert_array_equal(aux[name], want_aux[name], err_msg=f"{label}: {name}")
    assert aux["router_logits"].dtype == want.dtype, label
    check_close(aux["router_logits"], want_aux["router_logits"], err_msg=f"{label}: router_logits")
    for name in ("load_balance_loss", "router_z_loss"):
        assert isinstance(aux[name], float), f"{label}: {name} is {type(aux[name])}"
        check_close(np.float64(aux[name]), np.float64(want_aux[name]), want.dtype, err_msg=f"{label}: {name}")
    return out, aux


# ------------------------------------------------------------------ forward

FORWARD_CASES = {
    # id: (problem kwargs, moe_block kwargs)
    "alpha": (dict(biases=True, shared=3), dict(top_k=2, activation="swiglu_oai", swiglu_limit=1.0,
                                                swiglu_alpha=1.3, norm_topk_prob=True)),
    "alpha_default": (dict(), dict(top_k=2, activation="swiglu_oai", swiglu_limit=1.0)),
    "gated_shared": (dict(shared=4, gate=(5,)), dict(top_k=2)),
    "gated_shared_d1": (dict(shared=4, gate=(5, 1)), dict(top_k=2, activation="gelu")),
    "input_weights": (dict(shared=3), dict(top_k=1, score_func="sigmoid", router_weights_on="input")),
    "input_weights_top2": (dict(biases=True), dict(top_k=2, norm_topk_prob=True, routed_scaling_factor=1.5,
                                                   router_weights_on="input")),
    "fused_concat": (dict(fused="concat"), dict(top_k=2)),
    "fused_interleaved": (dict(fused="interleaved", biases=True, router_bias=True),
                          dict(top_k=2, norm_topk_prob=True, activation="swiglu_oai", swiglu_limit=1.0,
                               swiglu_alpha=1.5)),
    "llama4": (dict(fused="concat", shared=3), dict(top_k=1, score_func="sigmoid", router_weights_on="input")),
    "qwen2_moe": (dict(fused="concat", shared=4, gate=(5, 1)), dict(top_k=2, load_balance="hf")),
    "maxtext": (dict(x_shape=(1, 3, 5)), dict(top_k=2, load_balance="maxtext")),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("capacity_factor", [None, 0.3])
@pytest.mark.parametrize("layout", ["edf", "efd"])
@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward_against_reference(rng, case, layout, capacity_factor, dtype):
    pkw, kw = FORWARD_CASES[case]
    args, extra = problem(rng, T=3, layout=layout, dtype=dtype, **pkw)   # 3 * top_k < E: idle experts
    kw = dict(kw, **extra, capacity_factor=capacity_factor)
    if capacity_factor is not None:   # capacity 1; two equal tokens make their experts drop one
        args[0].reshape(-1, args[0].shape[-1])[1] = args[0].reshape(-1, args[0].shape[-1])[0]
    copies = snapshot(args[:3] + args[4:] if args[3] is None else args)
    out, aux = compare(args, kw, f"{case}/{layout}/{capacity_factor}")
    assert_unchanged(args[:3] + args[4:] if args[3] is None else args, copies)
    assert (aux["group_sizes"] == 0).any(), "some expert should have no tokens"
    if capacity_factor is not None:
        assert aux["dropped"] > 0


@pytest.mark.parametrize("gate_up", ["concat", "interleaved"])
@pytest.mark.parametrize("layout", ["edf", "efd"])
def test_fused_equals_separate_weights_and_is_not_copied(rng, layout, gate_up):
    """Fused weights give bitwise the separate weights' result, and the kernels
    read views of the stored array."""
    args, kw = problem(rng, layout=layout, fused=gate_up, biases=True, dtype=np.float32)
    axis = 2 if layout == "edf" else 1
    n = args[2].shape[axis] // 2
    if gate_up == "concat":
        w0, w1 = np.split(args[2], 2, axis=axis)
        b0, b1 = np.split(kw["w0_bias"], 2, axis=1)
    else:
        w0, w1 = np.take(args[2], np.arange(0, 2 * n, 2), axis=axis), np.take(args[2], np.arange(1, 2 * n, 2), axis=axis)
        b0, b1 = kw["w0_bias"][:, 0::2], kw["w0_bias"][:, 1::2]
    sep_kw = {k: val for k, val in kw.items() if k != "gate_up"}
    sep_kw.update(w0_bias=b0, w1_bias=b1)
    fused_out = raggeddot.moe_block(*args, top_k=2, **kw)
    sep_out = raggeddot.moe_block(args[0], args[1], w0, w1, args[4], top_k=2, **sep_kw)
    np.testing.assert_array_equal(fused_out, sep_out)
    layer = prepare(*args, top_k=2, score_func="softmax", router_bias=None, selection_bias=None,
                    n_groups=None, topk_groups=None, norm_topk_prob=False, routed_scaling_factor=1.0,
                    activation="silu", shared_experts=None, capacity_factor=None, swiglu_limit=7.0,
                    **{k: val for k, val in kw.items() if k != "shared_experts"},
                    w1_bias=None)
    assert np.shares_memory(layer.experts.w0, args[2]) and np.shares_memory(layer.experts.w1, args[2])


def test_swiglu_alpha_changes_routed_and_shared_experts(rng):
    args, kw = problem(rng, shared=3)
    base = dict(top_k=2, activation="swiglu_oai", **kw)
    a = raggeddot.moe_block(*args, **base)
    b = raggeddot.moe_block(*args, swiglu_alpha=1.0, **base)
    assert np.abs(a - b).max() > 1e-3
    check_close(b, ref.moe_block(*args, swiglu_alpha=1.0, **base))
    # without shared experts too (the routed path alone)
    no_shared = {k: val for k, val in base.items() if k != "shared_experts"}
    check_close(raggeddot.moe_block(*args, swiglu_alpha=0.5, **no_shared),
                ref.moe_block(*args, swiglu_alpha=0.5, **no_shared))


def test_shared_expert_gate_formula(rng):
    """out = routed + sigmoid(x @ g) * shared MLP(x), stated by hand."""
    args, kw = problem(rng, shared=4, gate=(5,))
    g = kw.pop("shared_expert_gate")
    routed_and_shared = raggeddot.moe_block(*args, top_k=2, **kw)
    routed = raggeddot.moe_block(*args, top_k=2, **{k: val for k, val in kw.items() if k != "shared_experts"})
    s = 1 / (1 + np.exp(-(args[0] @ g)))
    check_close(raggeddot.moe_block(*args, top_k=2, shared_expert_gate=g, **kw),
                routed + s[:, None] * (routed_and_shared - routed))


def test_router_weights_on_input_formula(rng):
    """out[t] = sum_j FFN_e(w[t, j] x[t]), stated by hand for top_k = 2."""
    args, kw = problem(rng)
    x, rw, w0, w1, wo = args
    out, aux = raggeddot.moe_block(*args, top_k=2, router_weights_on="input", return_aux=True, **kw)
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    want = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, w in zip(aux["topk_indices"][t], aux["topk_weights"][t]):
            z = w * x[t]
            want[t] += (silu(z @ w0[e]) * (z @ w1[e])) @ wo[e]
    check_close(out, want)


# ---------------------------------------------------------------- aux losses

@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_load_balance_conventions(rng, dtype):
    args, kw = problem(rng, T=12, dtype=dtype, x_shape=(3, 4, 5))
    aux = {c: compare(args, dict(kw, top_k=3, load_balance=c), c)[1] for c in ("switch", "hf", "maxtext")}
    x = args[0].astype(np.float64).reshape(-1, 5)
    logits = x @ args[1].astype(np.float64)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    E = 8
    idx = aux["switch"]["topk_indices"].reshape(12, 3)
    counts = np.bincount(idx.ravel(), minlength=E)
    switch = E * np.sum(counts / (12 * 3) * p.mean(0))
    check_close(np.float64(aux["switch"]["load_balance_loss"]), np.float64(switch), dtype)
    check_close(np.float64(aux["hf"]["load_balance_loss"]), np.float64(3 * switch), dtype)
    per_seq = [E * np.sum(np.bincount(idx[4 * b:4 * b + 4].ravel(), minlength=E) / 4 * p[4 * b:4 * b + 4].mean(0))
               for b in range(3)]
    check_close(np.float64(aux["maxtext"]["load_balance_loss"]), np.float64(np.mean(per_seq)), dtype)
    # one sequence (2-D x): maxtext is hf
    flat = [x.astype(dtype)] + args[1:]
    a_hf = raggeddot.moe_block(*flat, top_k=3, load_balance="hf", return_aux=True, **kw)[1]
    a_mt = raggeddot.moe_block(*flat, top_k=3, load_balance="maxtext", return_aux=True, **kw)[1]
    check_close(np.float64(a_mt["load_balance_loss"]), np.float64(a_hf["load_balance_loss"]), dtype)
    # z-loss: mean_t logsumexp(logits[t])**2
    lse = np.log(np.exp(logits).sum(1))
    check_close(np.float64(aux["hf"]["router_z_loss"]), np.float64(np.mean(lse ** 2)), dtype)
    assert aux["hf"]["router_logits"].shape == (3, 4, E)


def test_aux_of_no_tokens():
    rng = np.random.default_rng(3)
    args, kw = problem(rng, T=0)
    for convention in ("switch", "hf", "maxtext"):
        out, aux = raggeddot.moe_block(*args, top_k=2, load_balance=convention, return_aux=True, **kw)
        assert out.shape == (0, 5) and aux["load_balance_loss"] == 0.0 and aux["router_z_loss"] == 0.0
        assert aux["router_logits"].shape == (0, 8)


# ---------------------------------------------------------------- gradients

GRAD_CASES = {
    # id: (problem kwargs, moe_block kwargs)
    "alpha": (dict(biases=True, shared=2), dict(top_k=2, activation="swiglu_oai", swiglu_alpha=1.3)),
    "gated_shared": (dict(shared=3, gate=(4,)), dict(top_k=2)),
    "gated_shared_d1_efd": (dict(shared=3, gate=(4, 1), layout="efd"), dict(top_k=2, activation="gelu")),
    "input_weights": (dict(shared=2), dict(top_k=1, score_func="sigmoid", router_weights_on="input")),
    "input_weights_norm": (dict(router_bias=True, biases=True),
                           dict(top_k=2, norm_topk_prob=True, router_weights_on="input")),
    "input_weights_capacity": (dict(), dict(top_k=2, router_weights_on="input", capacity_factor=0.6)),
    "fused_concat_edf": (dict(fused="concat", biases=True), dict(top_k=2)),
    "fused_concat_efd": (dict(fused="concat", layout="efd", shared=2, gate=(4,)), dict(top_k=2)),
    "fused_interleaved_edf": (dict(fused="interleaved", biases=True, router_bias=True),
                              dict(top_k=2, norm_topk_prob=True, activation="swiglu_oai", swiglu_alpha=1.5)),
    "fused_interleaved_efd_capacity": (dict(fused="interleaved", layout="efd", biases=True),
                                       dict(top_k=2, capacity_factor=0.6)),
}
GRAD_SIZES = dict(T=5, d=4, f=3, E=6)


def _flat_inputs(args, kw):
    """{name: array} of every differentiable input (shared experts as shared_experts[i])."""
    names = ["x", "router_weights", "w0", "w1", "wo"]
    inputs = {n: a for n, a in zip(names, args) if a is not None}
    for n in ("router_bias", "w0_bias", "w1_bias", "wo_bias", "shared_expert_gate"):
        if kw.get(n) is not None:
            inputs[n] = kw[n]
    for i, a in enumerate(kw.get("shared_experts") or ()):
        inputs[f"shared_experts[{i}]"] = a
    return inputs


def _rebuild(inputs, args, kw):
    names = ["x", "router_weights", "w0", "w1", "wo"]
    new_args = [inputs.get(n) if a is not None else None for n, a in zip(names, args)]
    new_kw = dict(kw)
    for n in ("router_bias", "w0_bias", "w1_bias", "wo_bias", "shared_expert_gate"):
        if n in inputs:
            new_kw[n] = inputs[n]
    if kw.get("shared_experts") is not None:
        new_kw["shared_experts"] = tuple(inputs[f"shared_experts[{i}]"] for i in range(3))
    return new_args, new_kw


def numeric_gradients(args, kw, loss_of):
    """Central differences of ``loss_of(out, aux)`` w.r.t. every input; the routing
    (sorted top-k per token and the kept sizes) is asserted unchanged at every point."""
    _, base = raggeddot.moe_block(*args, return_aux=True, **kw)
    route = (np.sort(base["topk_indices"], axis=-1), base["group_sizes"])
    inputs = _flat_inputs(args, kw)
    grads = {}
    for name, src in inputs.items():
        g = np.zeros(src.shape)
        for i in np.ndindex(src.shape):
            vals = []
            for step in (FD_STEP, -FD_STEP):
                arr = src.copy()
                arr[i] += step
                a, k = _rebuild(dict(inputs, **{name: arr}), args, kw)
                out, aux = raggeddot.moe_block(*a, return_aux=True, **k)
                assert np.array_equal(np.sort(aux["topk_indices"], axis=-1), route[0]) and \
                    np.array_equal(aux["group_sizes"], route[1]), f"routing flipped at {name}{i}"
                vals.append(loss_of(out, aux))
            g[i] = (vals[0] - vals[1]) / (2 * FD_STEP)
        grads[name] = g
    return grads


def flat_analytic(grads):
    flat = dict(grads)
    for i, a in enumerate(flat.pop("shared_experts", ())):
        flat[f"shared_experts[{i}]"] = a
    return flat


def assert_grad_close(got, want, label):
    assert got.shape == want.shape, f"{label}: shape {got.shape} != {want.shape}"
    scale = max(float(np.abs(want).max()), float(np.abs(got).max()), 1e-8)
    err = float(np.abs(got - want).max()) / scale
    assert err < FD_RTOL, f"{label}: relative error {err:.2e} >= {FD_RTOL:.0e} (scale {scale:.3e})"


def well_separated(case, seed):
    """A float64 problem of the case whose routing margins exceed 1e-3."""
    pkw, kw = GRAD_CASES[case]
    rng = np.random.default_rng(seed)
    for _ in range(100):
        args, extra = problem(rng, **GRAD_SIZES, **pkw)
        args[1] = args[1] * 1.5
        full = dict(kw, **extra)
        logits = args[0] @ args[1] + full.get("router_bias", 0.0)
        s = np.sort(logits, axis=1)[:, ::-1]
        k = full["top_k"]
        if np.min(s[:, k - 1] - s[:, k]) > 1e-2:
            return args, full
    raise AssertionError(f"no well-separated data for {case}")


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradients_finite_differences(case):
    args, kw = well_separated(case, seed=sum(map(ord, case)))
    out, vjp_fn = raggeddot.moe_block_vjp(*args, **kw)
    ct = np.random.default_rng(1).standard_normal(out.shape)
    grads = flat_analytic(vjp_fn(ct))
    inputs = _flat_inputs(args, kw)
    assert set(grads) == set(inputs), f"gradient keys {sorted(grads)} != {sorted(inputs)}"
    if args[3] is None:
        assert "w1" not in grads and "w1_bias" not in grads
    numeric = numeric_gradients(args, kw, lambda o, aux: float(np.sum(o * ct)))
    for name in inputs:
        assert grads[name].shape == inputs[name].shape and grads[name].dtype == np.float64, name
        assert_grad_close(grads[name], numeric[name], f"{case}: d{name}")


@pytest.mark.parametrize("case", ["alpha", "gated_shared_d1_efd", "input_weights_norm", "fused_interleaved_edf",
                                  "fused_concat_efd"])
def test_float32_gradients_match_float64(case):
    args, kw = well_separated(case, seed=sum(map(ord, case)))
    ct = np.random.default_rng(2).standard_normal(args[0].shape)
    g64 = flat_analytic(raggeddot.moe_block_vjp(*args, **kw)[1](ct))
    to32 = lambda a: a.astype(np.float32) if isinstance(a, np.ndarray) else a  # noqa: E731
    kw32 = {k: (tuple(map(to32, val)) if isinstance(val, tuple) else to32(val)) for k, val in kw.items()}
    args32 = [None if a is None else to32(a) for a in args]
    g32 = flat_analytic(raggeddot.moe_block_vjp(*args32, **kw32)[1](ct.astype(np.float32)))
    assert set(g32) == set(g64)
    for name in g64:
        assert g32[name].dtype == np.float32, name
        check_close(g32[name], g64[name], rtol=2e-4, err_msg=name)


AUX_CASES = {
    "switch": (dict(router_bias=True), dict(top_k=2)),
    "hf_sigmoid": (dict(router_bias=True), dict(top_k=2, score_func="sigmoid", load_balance="hf")),
    "maxtext_batch": (dict(x_shape=(2, 3, 4)), dict(top_k=2, load_balance="maxtext")),
    "hf_input_weights_fused": (dict(fused="interleaved", shared=2, gate=(4,)),
                               dict(top_k=2, router_weights_on="input", load_balance="hf")),
}


@pytest.mark.parametrize("case", list(AUX_CASES))
def test_aux_gradients_finite_differences(case):
    """vjp_fn(d_out, d_aux) against central differences of
    sum(out * ct) + a * load_balance_loss + b * router_z_loss + sum(router_logits * c)."""
    pkw, kw = AUX_CASES[case]
    GRAD_CASES["_aux"] = (pkw, kw)
    try:
        args, kw = well_separated("_aux", seed=sum(map(ord, case)))
    finally:
        del GRAD_CASES["_aux"]
    (out, aux), vjp_fn = raggeddot.moe_block_vjp(*args, return_aux=True, **kw)
    np.testing.assert_array_equal(out, raggeddot.moe_block(*args, **kw))
    r = np.random.default_rng(4)
    ct, a, b = r.standard_normal(out.shape), 1.7, -0.6
    c = r.standard_normal(aux["router_logits"].shape)
    d_aux = {"load_balance_loss": a, "router_z_loss": np.float64(b), "router_logits": c}
    grads = flat_analytic(vjp_fn(ct, d_aux))
    numeric = numeric_gradients(args, kw, lambda o, x: float(
        np.sum(o * ct) + a * x["load_balance_loss"] + b * x["router_z_loss"] + np.sum(x["router_logits"] * c)))
    for name in grads:
        assert_grad_close(grads[name], numeric[name], f"{case}: d{name}")
    # the aux cotangents reach only x, router_weights and router_bias
    plain = flat_analytic(vjp_fn(ct))
    for name in plain:
        if name not in ("x", "router_weights", "router_bias"):
            np.testing.assert_array_equal(grads[name], plain[name], err_msg=name)
    # aux alone (d_out=None)
    only = flat_analytic(vjp_fn(None, {"router_z_loss": 1.0}))
    numeric_z = numeric_gradients(args, kw, lambda o, x: x["router_z_loss"])
    for name in only:
        assert_grad_close(only[name], numeric_z[name], f"{case}: z-loss alone d{name}")


# ------------------------------------------------------- raggeddot.vjp, errors

def test_generic_vjp_refuses_bound_arrays_and_accepts_fused(rng):
    args, kw = problem(rng, fused="concat", shared=2, gate=(5,))
    for name in ("shared_experts", "shared_expert_gate"):
        with pytest.raises(ValueError, match=f"'{name}'.*moe_block_vjp"):
            raggeddot.vjp(functools.partial(raggeddot.moe_block, top_k=2, **{k: kw[k] for k in (name, "gate_up")},
                                            **({"shared_experts": kw["shared_experts"]}
                                               if name == "shared_expert_gate" else {})), *args)
    # fused weights, no bound arrays: w1 (None) gets None, the others their gradients
    out, fn = raggeddot.vjp(functools.partial(raggeddot.moe_block, top_k=2, gate_up="concat",
                                              selection_bias=np.zeros(8)), *args)
    ct = rng.standard_normal(out.shape)
    generic = fn(ct)
    want = raggeddot.moe_block_vjp(*args, top_k=2, gate_up="concat", selection_bias=np.zeros(8))[1](ct)
    assert generic[3] is None
    for name, g in zip(("x", "router_weights", "w0"), generic[:3]):
        np.testing.assert_array_equal(g, want[name], err_msg=name)
    np.testing.assert_array_equal(generic[4], want["wo"])


BAD = [
    (dict(gate_up="halves", fused="concat"), "gate_up"),
    (dict(gate_up="interleaved"), "gate_up"),
    (dict(router_weights_on="inputs"), "router_weights_on"),
    (dict(load_balance="gshard"), "load_balance"),
    (dict(shared_expert_gate=np.zeros(5)), "shared_expert_gate"),                       # no shared experts
    (dict(shared_expert_gate=np.zeros((5, 2)), shared=2), "shared_expert_gate"),       # wrong shape
    (dict(shared_expert_gate=np.zeros(4), shared=2), "shared_expert_gate"),
    (dict(fused="concat", w1_bias=np.zeros((8, 3))), "w1_bias"),
    (dict(fused="concat", w0_bias=np.zeros((8, 3))), "w0_bias"),
    (dict(odd_fused=True), "2f"),
]


@pytest.mark.parametrize("change, needle", BAD, ids=[f"{n}-{i}" for i, (_, n) in enumerate(BAD)])
def test_bad_arguments_name_themselves(rng, change, needle):
    change = dict(change)
    fused, shared = change.pop("fused", None), change.pop("shared", 0)
    odd = change.pop("odd_fused", False)
    args, kw = problem(rng, fused=fused, shared=shared)
    if odd:
        args[2], args[3] = np.concatenate([args[2], args[3], args[3][:, :, :1]], axis=2), None   # 2f + 1
    kw.update(change)
    with pytest.raises(ValueError, match=needle):
        raggeddot.moe_block(*args, top_k=2, **kw)
    with pytest.raises(ValueError, match=needle):
        raggeddot.moe_block_vjp(*args, top_k=2, **kw)


def test_bad_aux_cotangents(rng):
    args, kw = problem(rng)
    (out, aux), fn = raggeddot.moe_block_vjp(*args, top_k=2, return_aux=True, **kw)
    with pytest.raises(ValueError, match="topk_weights"):
        fn(np.ones_like(out), {"topk_weights": np.ones_like(aux["topk_weights"])})
    with pytest.raises(ValueError, match="router_z_loss"):
        fn(np.ones_like(out), {"router_z_loss": np.ones(2)})
    with pytest.raises(ValueError, match="router_logits"):
        fn(np.ones_like(out), {"router_logits": np.ones((3, 8))})
    with pytest.raises(TypeError, match="d_aux"):
        fn(np.ones_like(out), [1.0])
    # without return_aux the vjp function takes d_out alone
    _, plain = raggeddot.moe_block_vjp(*args, top_k=2, **kw)
    with pytest.raises(TypeError):
        plain(np.ones_like(out), {"router_z_loss": 1.0})
