"""raggeddot.moe_block, moe_block_vjp and the gathers against the NumPy oracle.

- Forward: every routing preset (Mixtral, Qwen3-MoE, DeepSeek-V3, gpt-oss,
  Switch), every activation, both weight layouts, biases, shared experts,
  capacity dropping, E in {1, 8, 64} x top_k in {1, 2, 8}, experts without
  tokens, T = 1, leading batch dims, against ``raggeddot.reference.moe_block``
  with helpers.check_close's tolerance (1e-5 float32, 1e-12 float64); the aux
  outputs are compared too (indices, sizes, drops and bias updates exactly).
- Routing semantics stated by hand: ties go to the lower index, group-limited
  selection, selection_bias steers the choice but not the weights, first come
  first served capacity, the closed form of the load-balancing loss.
- Backward: moe_block_vjp against central finite differences of moe_block in
  float64 (relative error < 1e-6) for every trainable input. The data is drawn
  so that the expert choice cannot flip under the perturbation (margins are
  checked, and every finite-difference evaluation re-checks the routing) and so
  that no pre-activation sits on relu's kink or swiglu_oai's clip points.
- Gathers: values, -1 slots, errors, thread-count determinism.
- Inputs are never modified; invalid configurations raise ValueError naming
  the argument.
"""

import functools
import math

import numpy as np
import pytest

import raggeddot
from raggeddot import reference as ref

from helpers import (FLOATS, GRAD_TOLERANCE, THREAD_COUNTS, assert_unchanged, check_close, dtype_id,
                     snapshot)

pytestmark = pytest.mark.usefixtures("restore_runtime")

ACTIVATIONS = ["silu", "gelu", "gelu_tanh", "relu", "swiglu_oai"]


# ----------------------------------------------------------------- helpers

def make_weights(rng, E, d, f, dtype=np.float64, layout="edf"):
    """(router_weights, w0, w1, wo) with O(1) outputs; layout "efd" stores the transposes."""
    rw = rng.standard_normal((d, E)) * (2.0 / math.sqrt(d))
    w0 = rng.standard_normal((E, d, f)) / math.sqrt(d)
    w1 = rng.standard_normal((E, d, f)) / math.sqrt(d)
    wo = rng.standard_normal((E, f, d)) / math.sqrt(f)
    if layout == "efd":
        w0, w1, wo = (np.ascontiguousarray(w.transpose(0, 2, 1)) for w in (w0, w1, wo))
    return tuple(a.astype(dtype) for a in (rw, w0, w1, wo))


def make_extras(rng, E, d, f, dtype, *, router_bias=False, selection_bias=False, biases=False,
                shared=0):
    """Optional keyword arrays of moe_block, drawn from rng."""
    kw = {}
    if router_bias:
        kw["router_bias"] = (0.5 * rng.standard_normal(E)).astype(dtype)
    if selection_bias:
        kw["selection_bias"] = (0.1 * rng.standard_normal(E)).astype(dtype)
    if biases:
        kw["w0_bias"] = (0.3 * rng.standard_normal((E, f))).astype(dtype)
        kw["w1_bias"] = (0.3 * rng.standard_normal((E, f))).astype(dtype)
        kw["wo_bias"] = (0.3 * rng.standard_normal((E, d))).astype(dtype)
    if shared:
        kw["shared_experts"] = (
            (rng.standard_normal((d, shared)) / math.sqrt(d)).astype(dtype),
            (rng.standard_normal((d, shared)) / math.sqrt(d)).astype(dtype),
            (rng.standard_normal((shared, d)) / math.sqrt(shared)).astype(dtype),
        )
    return kw


def compare_aux(aux, want, dtype, label=""):
    assert set(aux) == set(want), f"{label}: aux keys {sorted(aux)} != {sorted(want)}"
    np.testing.assert_array_equal(aux["topk_indices"], want["topk_indices"], err_msg=f"{label}: topk_indices")
    check_close(aux["topk_weights"], want["topk_weights"], dtype, err_msg=f"{label}: topk_weights")
    np.testing.assert_array_equal(aux["group_sizes"], want["group_sizes"], err_msg=f"{label}: group_sizes")
    np.testing.assert_array_equal(aux["bias_updates"], want["bias_updates"], err_msg=f"{label}: bias_updates")
    for name in ("slot_of", "token_of_slot"):   # the dispatch order
        assert aux[name].dtype == np.int64, f"{label}: {name}"
        np.testing.assert_array_equal(aux[name], want[name], err_msg=f"{label}: {name}")
    assert aux["dropped"] == want["dropped"], f"{label}: dropped {aux['dropped']} != {want['dropped']}"
    check_close(np.float64(aux["load_balance_loss"]), np.float64(want["load_balance_loss"]), dtype,
                err_msg=f"{label}: load_balance_loss")


def run_both(x, rw, w0, w1, wo, label="", **kw):
    """moe_block (C) and the reference with return_aux; compare everything; return C's (out, aux)."""
    out, aux = raggeddot.moe_block(x, rw, w0, w1, wo, return_aux=True, **kw)
    want, want_aux = ref.moe_block(x, rw, w0, w1, wo, return_aux=True, **kw)
    assert out.shape == want.shape, f"{label}: shape {out.shape} != {want.shape}"
    assert out.dtype == want.dtype, f"{label}: dtype {out.dtype} != {want.dtype}"
    # the expert choice first: a mismatch there explains any mismatch of the values
    np.testing.assert_array_equal(aux["topk_indices"], want_aux["topk_indices"],
                                  err_msg=f"{label}: topk_indices")
    check_close(out, want, err_msg=label)
    compare_aux(aux, want_aux, want.dtype, label)
    return out, aux


# ------------------------------------------------------------ the oracle itself

def test_reference_matches_dense_formula():
    """The reference against the dense statement: every expert on every token, masked."""
    rng = np.random.default_rng(0)
    T, d, f, E, k = 9, 5, 4, 6, 2
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    logits = x @ rw
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    top = np.argsort(-p, axis=1, kind="stable")[:, :k]
    gate = np.einsum("td,edf->tef", x, w0)
    y = np.einsum("tef,efd->ted", gate / (1 + np.exp(-gate)) * np.einsum("td,edf->tef", x, w1), wo)
    want = np.zeros((T, d))
    for t in range(T):
        for e in top[t]:
            want[t] += p[t, e] * y[t, e]
    check_close(ref.moe_block(x, rw, w0, w1, wo, top_k=k), want)


# ----------------------------------------------------------------- forward

PRESETS = {
    # name: (E, top_k, kwargs, extras)
    "mixtral": (8, 2, dict(norm_topk_prob=True), {}),
    "qwen3_moe": (64, 8, dict(norm_topk_prob=True), {}),
    "deepseek_v3": (64, 8, dict(score_func="sigmoid", n_groups=8, topk_groups=4, norm_topk_prob=True,
                                routed_scaling_factor=2.5),
                    dict(selection_bias=True, shared=16)),
    "gpt_oss": (32, 4, dict(norm_topk_prob=True, activation="swiglu_oai"),
                dict(router_bias=True, biases=True)),
    "switch": (16, 1, {}, {}),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets(rng, preset, dtype):
    E, k, kw, extras = PRESETS[preset]
    T, d, f = 48, 32, 24
    x = rng.standard_normal((T, d)).astype(dtype)
    rw, w0, w1, wo = make_weights(rng, E, d, f, dtype)
    kw = dict(kw, **make_extras(rng, E, d, f, dtype, **extras))
    run_both(x, rw, w0, w1, wo, label=preset, top_k=k, **kw)


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("layout", ["edf", "efd"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activations_and_layouts(rng, activation, layout, dtype):
    T, d, f, E = 40, 16, 12, 8
    x = (1.5 * rng.standard_normal((T, d))).astype(dtype)
    rw, w0, w1, wo = make_weights(rng, E, d, f, dtype, layout)
    kw = make_extras(rng, E, d, f, dtype, biases=True, shared=8)
    # a small swiglu limit so that both clips are active on part of the data
    limit = 1.0 if activation == "swiglu_oai" else 7.0
    run_both(x, rw, w0, w1, wo, label=f"{activation}/{layout}", top_k=2, activation=activation,
             weights_layout=layout, swiglu_limit=limit, **kw)


def test_swiglu_oai_clips():
    """swiglu_oai clips the gate above at limit and up at +-limit; the others do not clip."""
    d, f, E = 1, 1, 1
    limit = 1.5
    rw = np.ones((d, E))
    w0, w1, wo = np.ones((E, d, f)), np.ones((E, d, f)), np.ones((E, f, d))
    for g in (-4.0, -0.5, 0.7, 1.5, 3.0):
        x = np.array([[g]])  # gate = up = g, weight 1 (one expert)
        out = raggeddot.moe_block(x, rw, w0, w1, wo, top_k=1, activation="swiglu_oai", swiglu_limit=limit)
        gc, uc = min(g, limit), min(max(g, -limit), limit)
        want = gc / (1 + math.exp(-1.702 * gc)) * (uc + 1)
        assert abs(out[0, 0] - want) <= 1e-14 * max(1, abs(want)), (g, out[0, 0], want)


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("E,top_k", [(1, 1), (8, 1), (8, 2), (8, 8), (64, 1), (64, 2), (64, 8)])
def test_num_experts_and_top_k(rng, E, top_k, dtype):
    T, d, f = 33, 16, 8
    x = rng.standard_normal((T, d)).astype(dtype)
    rw, w0, w1, wo = make_weights(rng, E, d, f, dtype)
    for norm in (False, True):
        out, aux = run_both(x, rw, w0, w1, wo, label=f"E={E} k={top_k} norm={norm}", top_k=top_k,
                            norm_topk_prob=norm)
        assert aux["group_sizes"].sum() == T * top_k
        # every token's k experts are distinct
        assert all(len(set(row)) == top_k for row in aux["topk_indices"].tolist())


def test_experts_without_tokens(rng):
    T, d, f, E = 3, 8, 6, 64
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    _, aux = run_both(x, rw, w0, w1, wo, top_k=2, label="E=64, T=3")
    assert (aux["group_sizes"] == 0).sum() >= E - 6
    # half the experts made unreachable by the router bias
    T = 40
    x = rng.standard_normal((T, d))
    rb = np.where(np.arange(E) % 2 == 0, -50.0, 0.0)
    kw = make_extras(rng, E, d, f, np.float64, biases=True)
    _, aux = run_both(x, rw, w0, w1, wo, top_k=4, router_bias=rb, label="unreachable experts", **kw)
    assert (aux["group_sizes"][::2] == 0).all()
    assert aux["group_sizes"].sum() == T * 4


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("x_shape", [(1, 16), (16,), (2, 3, 16), (1, 1, 16)], ids=str)
def test_token_shapes(rng, x_shape, dtype):
    """T = 1 (as [1, d] and as a bare [d] vector) and leading batch dims."""
    d, f, E = x_shape[-1], 8, 8
    x = rng.standard_normal(x_shape).astype(dtype)
    rw, w0, w1, wo = make_weights(rng, E, d, f, dtype)
    kw = make_extras(rng, E, d, f, dtype, shared=4)
    out, aux = run_both(x, rw, w0, w1, wo, top_k=2, label=str(x_shape), **kw)
    assert out.shape == x_shape
    assert aux["topk_indices"].shape == x_shape[:-1] + (2,)
    assert aux["topk_weights"].shape == x_shape[:-1] + (2,)


def test_zero_tokens():
    rng = np.random.default_rng(5)
    d, f, E = 8, 4, 4
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    out, aux = raggeddot.moe_block(np.zeros((0, d)), rw, w0, w1, wo, top_k=2, return_aux=True)
    assert out.shape == (0, d) and aux["group_sizes"].sum() == 0


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("capacity_factor", [0.1, 0.5, 1.0, 1.25, 4.0])
def test_capacity(rng, capacity_factor, dtype):
    T, d, f, E, k = 50, 16, 8, 8, 2
    x = rng.standard_normal((T, d)).astype(dtype)
    rw, w0, w1, wo = make_weights(rng, E, d, f, dtype)
    # a skewed router, so that some experts overflow at every factor below ~2
    rb = np.linspace(1.5, -1.5, E).astype(dtype)
    kw = make_extras(rng, E, d, f, dtype, biases=True, shared=4)
    out, aux = run_both(x, rw, w0, w1, wo, top_k=k, capacity_factor=capacity_factor, router_bias=rb,
                        norm_topk_prob=True, label=f"cf={capacity_factor}", **kw)
    cap = math.ceil(T * k / E * capacity_factor)
    assert aux["group_sizes"].max() <= cap
    assert aux["group_sizes"].sum() + aux["dropped"] == T * k
    if capacity_factor <= 1.0:
        assert aux["dropped"] > 0


def test_capacity_first_come_first_served():
    """Every token wants expert 0; it keeps the first `capacity` tokens, the rest get exactly 0."""
    T, d, f, E = 7, 4, 3, 2
    rng = np.random.default_rng(11)
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    rb = np.array([40.0, -40.0])
    out, aux = run_both(x, rw, w0, w1, wo, top_k=1, router_bias=rb, capacity_factor=1.0, label="fcfs")
    cap = math.ceil(T * 1 / E * 1.0)  # 4
    np.testing.assert_array_equal(aux["group_sizes"], [cap, 0])
    assert aux["dropped"] == T - cap
    assert (out[cap:] == 0).all()
    assert (np.abs(out[:cap]).max(axis=1) > 0).all()
    full = raggeddot.moe_block(x, rw, w0, w1, wo, top_k=1, router_bias=rb)
    np.testing.assert_array_equal(out[:cap], full[:cap])


def test_ties_go_to_the_lower_index():
    T, d, f, E = 4, 3, 2, 8
    rng = np.random.default_rng(3)
    x = rng.standard_normal((T, d))
    _, w0, w1, wo = make_weights(rng, E, d, f)
    for dtype in FLOATS:
        xs, ws = x.astype(dtype), [w.astype(dtype) for w in (w0, w1, wo)]
        # all logits equal: experts 0..k-1, in order
        for score_func in ("softmax", "sigmoid"):
            _, aux = run_both(xs, np.zeros((d, E), dtype), *ws, top_k=3, score_func=score_func)
            np.testing.assert_array_equal(aux["topk_indices"], np.tile([0, 1, 2], (T, 1)))
        # experts 5 and 3 share the best logit, 6 and 1 the second best
        rw = np.zeros((d, E), dtype)
        rb = np.zeros(E, dtype)
        rb[[5, 3]], rb[[6, 1]] = 4.0, 2.0
        _, aux = run_both(xs, rw, *ws, top_k=3, router_bias=rb)
        np.testing.assert_array_equal(aux["topk_indices"], np.tile([3, 5, 1], (T, 1)))
        # two groups of equal score: the lower one is kept
        rb = np.array([1, 2, 0, 0, 2, 1, 0, 0], dtype)
        _, aux = run_both(xs, rw, *ws, top_k=2, router_bias=rb, score_func="sigmoid", n_groups=4,
                          topk_groups=1)
        np.testing.assert_array_equal(aux["topk_indices"], np.tile([1, 0], (T, 1)))


def test_group_limited_selection():
    """The best expert overall can be excluded: groups are ranked by their two best scores."""
    d, f, E = 3, 2, 8
    rng = np.random.default_rng(4)
    _, w0, w1, wo = make_weights(rng, E, d, f)
    x = np.zeros((2, d))
    rw = np.zeros((d, E))
    # sigmoid group scores: 1.03, 1.76, 1.0, 0.96; softmax ranks group 0 first (e^3 > 2 e^2)
    rb = np.array([3.0, -2.5, 2.0, 2.0, 0.0, 0.0, 1.0, -1.2])
    for score_func in ("sigmoid", "softmax"):
        _, aux = run_both(x, rw, w0, w1, wo, top_k=2, router_bias=rb, score_func=score_func,
                          n_groups=4, topk_groups=1, label=score_func)
        assert {int(e) for e in aux["topk_indices"][0]} == ({2, 3} if score_func == "sigmoid" else {0, 1})
        # with every group kept, the global top-2
        _, aux = run_both(x, rw, w0, w1, wo, top_k=2, router_bias=rb, score_func=score_func,
                          n_groups=4, topk_groups=4)
        np.testing.assert_array_equal(aux["topk_indices"][0], [0, 2])
        _, aux = run_both(x, rw, w0, w1, wo, top_k=3, router_bias=rb, score_func=score_func,
                          n_groups=4, topk_groups=2)
        # groups 0 and 1 are the best two under both score functions
        np.testing.assert_array_equal(aux["topk_indices"][0], [0, 2, 3])


def test_selection_bias_steers_choice_not_weights():
    T, d, f, E = 6, 4, 3, 8
    rng = np.random.default_rng(6)
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    sb = np.zeros(E)
    sb[7] = 10.0  # expert 7 always chosen
    for score_func in ("softmax", "sigmoid"):
        _, aux = run_both(x, rw, w0, w1, wo, top_k=2, selection_bias=sb, score_func=score_func)
        assert (aux["topk_indices"][:, 0] == 7).all()
        logits = x @ rw
        if score_func == "softmax":
            scores = np.exp(logits - logits.max(1, keepdims=True))
            scores /= scores.sum(1, keepdims=True)
        else:
            scores = 1 / (1 + np.exp(-logits))
        check_close(aux["topk_weights"], np.take_along_axis(scores, aux["topk_indices"], 1))


def test_norm_and_scaling(rng):
    T, d, f, E = 20, 8, 4, 16
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    for score_func in ("softmax", "sigmoid"):
        _, aux = run_both(x, rw, w0, w1, wo, top_k=4, score_func=score_func, norm_topk_prob=True,
                          routed_scaling_factor=2.5)
        check_close(aux["topk_weights"].sum(axis=1), np.full(T, 2.5))
        out1 = raggeddot.moe_block(x, rw, w0, w1, wo, top_k=4, score_func=score_func)
        out2 = raggeddot.moe_block(x, rw, w0, w1, wo, top_k=4, score_func=score_func,
                                   routed_scaling_factor=-0.5)
        check_close(out2, -0.5 * out1)


def test_load_balance_loss_closed_form():
    """Uniform router, ties: experts 0..k-1 take every token; the Switch loss is then exactly 1."""
    T, d, f, E, k = 10, 4, 3, 8, 2
    rng = np.random.default_rng(8)
    x = rng.standard_normal((T, d))
    _, w0, w1, wo = make_weights(rng, E, d, f)
    for score_func in ("softmax", "sigmoid"):
        _, aux = run_both(x, np.zeros((d, E)), w0, w1, wo, top_k=k, score_func=score_func)
        assert aux["load_balance_loss"] == pytest.approx(1.0, rel=1e-12)
        np.testing.assert_array_equal(aux["bias_updates"], [-1] * k + [1] * (E - k))
    # perfectly balanced loads (token t prefers expert t): no update anywhere
    rw, w0, w1, wo = make_weights(rng, E, E, f)
    _, aux = run_both(np.eye(E), 5.0 * np.eye(E), w0, w1, wo, top_k=1)
    np.testing.assert_array_equal(aux["group_sizes"], np.ones(E))
    np.testing.assert_array_equal(aux["bias_updates"], np.zeros(E))


def test_layout_when_d_equals_f(rng):
    """d == f: both layouts accept the same arrays; the argument decides how they are read."""
    T, d, E = 12, 6, 4
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, d)
    a, _ = run_both(x, rw, w0, w1, wo, top_k=2, weights_layout="edf")
    b, _ = run_both(x, rw, w0, w1, wo, top_k=2, weights_layout="efd")
    assert not np.allclose(a, b)
    c, _ = run_both(x, rw, *(w.transpose(0, 2, 1) for w in (w0, w1, wo)), top_k=2, weights_layout="efd")
    check_close(c, a)


def test_non_contiguous_inputs(rng):
    T, d, f, E = 21, 10, 6, 8
    base = rng.standard_normal((d, 2 * T)).T[::2]            # [T, d], strided and transposed
    rw = np.asfortranarray(make_weights(rng, E, d, f)[0])
    w0 = rng.standard_normal((E, f, d)).transpose(0, 2, 1)   # [E, d, f] view
    w1 = rng.standard_normal((E, d, 2 * f))[:, :, ::2]
    wo = rng.standard_normal((E, f, d))[:, ::-1]
    kw = make_extras(rng, E, d, f, np.float64, biases=True, shared=4)
    kw["w0_bias"] = np.asfortranarray(kw["w0_bias"])
    kw["shared_experts"] = tuple(np.asfortranarray(a) for a in kw["shared_experts"])
    assert not base.flags.c_contiguous and not w0.flags.c_contiguous
    out, _ = run_both(base, rw, w0, w1, wo, top_k=3, label="views", **kw)
    contiguous = raggeddot.moe_block(*(np.ascontiguousarray(a) for a in (base, rw, w0, w1, wo)),
                                     top_k=3, **kw)
    check_close(out, contiguous)


def test_mixed_dtypes(rng):
    """float32 tokens with float64 weights compute and return float64, like NumPy's promotion."""
    T, d, f, E = 16, 8, 4, 8
    x = rng.standard_normal((T, d)).astype(np.float32)
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    out, _ = run_both(x, rw, w0, w1, wo, top_k=2, label="f32 x f64")
    assert out.dtype == np.float64


def test_float16(rng):
    T, d, f, E = 16, 8, 8, 8
    x = rng.standard_normal((T, d)).astype(np.float16)
    rw, w0, w1, wo = make_weights(rng, E, d, f, np.float16)
    out = raggeddot.moe_block(x, rw, w0, w1, wo, top_k=2)
    want = ref.moe_block(x, rw, w0, w1, wo, top_k=2)
    assert out.dtype == want.dtype == np.float16
    check_close(out, want)


def test_thread_count_does_not_change_results(rng):
    """Bitwise equal across thread counts, at sizes where routing, gathers and the
    activations take their parallel paths."""
    T, d, f, E = 1100, 64, 48, 64
    for dtype in FLOATS:
        x = rng.standard_normal((T, d)).astype(dtype)
        rw, w0, w1, wo = make_weights(rng, E, d, f, dtype)
        kw = dict(top_k=6, capacity_factor=1.0, score_func="sigmoid", n_groups=8, topk_groups=4,
                  **make_extras(rng, E, d, f, dtype, selection_bias=True, biases=True, shared=32))
        results = []
        for n in THREAD_COUNTS:
            raggeddot.set_num_threads(n)
            out, vjp_fn = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, **kw)
            grads = vjp_fn(np.ones_like(out))
            results.append((out, grads))
        for out, grads in results[1:]:
            np.testing.assert_array_equal(out, results[0][0])
            for key in ("x", "router_weights", "w0", "w1", "wo", "w0_bias", "wo_bias"):
                np.testing.assert_array_equal(grads[key], results[0][1][key], err_msg=key)
    check_close(results[0][0], ref.moe_block(x, rw, w0, w1, wo, **kw))


def test_inputs_not_modified(rng):
    T, d, f, E = 13, 6, 5, 8
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f, layout="efd")
    kw = make_extras(rng, E, d, f, np.float64, router_bias=True, selection_bias=True, biases=True,
                     shared=3)
    kw.update(top_k=2, score_func="sigmoid", n_groups=4, topk_groups=2, norm_topk_prob=True,
              capacity_factor=1.0, weights_layout="efd")
    arrays = [x, rw, w0, w1, wo] + [kw[k] for k in ("router_bias", "selection_bias", "w0_bias",
                                                    "w1_bias", "wo_bias")] + list(kw["shared_experts"])
    saved = snapshot(arrays)
    raggeddot.moe_block(x, rw, w0, w1, wo, return_aux=True, **kw)
    out, vjp_fn = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, **kw)
    ct = rng.standard_normal(out.shape)
    ct_saved = snapshot([ct])
    vjp_fn(ct)
    vjp_fn(ct)
    assert_unchanged(arrays, saved)
    assert_unchanged([ct], ct_saved, ["cotangent"])


# ---------------------------------------------------------------- validation

INVALID = [
    # (id, change to the call, text the message must contain)
    ("top_k>E", dict(top_k=9), "top_k"),
    ("top_k=0", dict(top_k=0), "top_k"),
    ("n_groups_not_dividing", dict(n_groups=3), "n_groups"),
    ("n_groups=0", dict(n_groups=0), "n_groups"),
    ("topk_groups>n_groups", dict(n_groups=4, topk_groups=5), "topk_groups"),
    ("topk_groups=0", dict(n_groups=4, topk_groups=0), "topk_groups"),
    ("topk_groups_without_n_groups", dict(topk_groups=1), "topk_groups"),
    ("top_k>kept_group_experts", dict(top_k=5, n_groups=4, topk_groups=2), "top_k"),
    ("score_func", dict(score_func="tanh"), "score_func"),
    ("activation", dict(activation="gelu_new"), "activation"),
    ("weights_layout", dict(weights_layout="fed"), "weights_layout"),
    ("capacity_factor=0", dict(capacity_factor=0.0), "capacity_factor"),
    ("capacity_factor<0", dict(capacity_factor=-1.0), "capacity_factor"),
    ("router_bias_shape", dict(router_bias=np.zeros(7)), "router_bias"),
    ("selection_bias_shape", dict(selection_bias=np.zeros((8, 1))), "selection_bias"),
    ("w0_bias_shape", dict(w0_bias=np.zeros((8, 6))), "w0_bias"),
    ("w1_bias_shape", dict(w1_bias=np.zeros((7, 4))), "w1_bias"),
    ("wo_bias_shape", dict(wo_bias=np.zeros((8, 4))), "wo_bias"),
    ("shared_w1_shape", dict(shared_experts=(np.zeros((6, 3)), np.zeros((6, 4)), np.zeros((3, 6)))),
     "shared_experts[1]"),
    ("shared_wo_shape", dict(shared_experts=(np.zeros((6, 3)), np.zeros((6, 3)), np.zeros((3, 5)))),
     "shared_experts[2]"),
    ("shared_w0_d", dict(shared_experts=(np.zeros((5, 3)), np.zeros((6, 3)), np.zeros((3, 6)))),
     "shared_experts[0]"),
]


@pytest.mark.parametrize("change,needle", [pytest.param(c, n, id=i) for i, c, n in INVALID])
def test_invalid_configuration(change, needle):
    rng = np.random.default_rng(0)
    T, d, f, E = 5, 6, 4, 8
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    kw = dict(top_k=2)
    kw.update(change)
    with pytest.raises(ValueError) as info:
        raggeddot.moe_block(x, rw, w0, w1, wo, **kw)
    assert needle in str(info.value), str(info.value)
    with pytest.raises(ValueError) as info:
        raggeddot.moe_block_vjp(x, rw, w0, w1, wo, **kw)
    assert needle in str(info.value), str(info.value)


BAD_SHAPES = [
    # (id, which positional argument, its replacement, text the message must contain)
    ("x_d", 0, lambda a: a[:, :5], "router_weights"),
    ("router_weights_1d", 1, lambda a: a[:, 0], "router_weights"),
    ("router_weights_E", 1, lambda a: a[:, :7], "E=8"),
    ("w0_2d", 2, lambda a: a[0], "w0"),
    ("w0_E", 2, lambda a: a[:7], "'w0'"),
    ("w0_d", 2, lambda a: a[:, :5], "'w0'"),
    ("w1_f", 3, lambda a: a[:, :, :3], "'w1'"),
    ("wo_E", 4, lambda a: a[:7], "'wo'"),
    ("wo_d", 4, lambda a: a[:, :, :5], "'wo'"),
    ("wo_f", 4, lambda a: a[:, :3], "'wo'"),
    ("wo_4d", 4, lambda a: a[None], "'wo'"),
]


@pytest.mark.parametrize("pos,change,needle", [pytest.param(p, c, n, id=i) for i, p, c, n in BAD_SHAPES])
def test_bad_shapes(pos, change, needle):
    rng = np.random.default_rng(0)
    T, d, f, E = 5, 6, 4, 8
    args = [rng.standard_normal((T, d)), *make_weights(rng, E, d, f)]
    args[pos] = change(args[pos])
    with pytest.raises(ValueError) as info:
        raggeddot.moe_block(*args, top_k=2)
    assert needle in str(info.value), str(info.value)


@pytest.mark.parametrize("layout", ["edf", "efd"])
def test_layout_mismatch_names_axis_and_sizes(layout):
    """Weights stored in the other layout: the message names the array, the axis and the sizes."""
    rng = np.random.default_rng(0)
    T, d, f, E = 5, 6, 4, 8
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f, layout="efd" if layout == "edf" else "edf")
    with pytest.raises(ValueError) as info:
        raggeddot.moe_block(x, rw, w0, w1, wo, top_k=2, weights_layout=layout)
    msg = str(info.value)
    assert "'w0'" in msg and "axis" in msg and layout in msg and str(w0.shape) in msg, msg


def test_vjp_argument_errors():
    rng = np.random.default_rng(0)
    T, d, f, E = 5, 6, 4, 8
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    with pytest.raises(ValueError, match="return_aux"):
        raggeddot.vjp(functools.partial(raggeddot.moe_block, top_k=2, return_aux=True), x, rw, w0, w1, wo)
    with pytest.raises(TypeError, match="top_k"):
        raggeddot.moe_block_vjp(x, rw, w0, w1, wo)
    with pytest.raises(TypeError, match="bogus"):
        raggeddot.moe_block_vjp(x, rw, w0, w1, wo, top_k=2, bogus=1)
    out, vjp_fn = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, top_k=2)
    with pytest.raises(ValueError, match="cotangent"):
        vjp_fn(np.ones((T + 1, d)))


# ------------------------------------------------------------------ gradients

GRAD_T, GRAD_D, GRAD_F, GRAD_E = 5, 4, 3, 4
FD_STEP = 1e-6
FD_RTOL = GRAD_TOLERANCE[np.dtype(np.float64)]
KINK_GAP = 1e-3      # min distance of any pre-activation from a kink
ROUTE_GAP = 1e-3     # min gap between the last chosen and the first unchosen (group) score

GRAD_CASES = {
    # id: (moe_block kwargs, extras of make_extras, x shape)
    "silu": (dict(top_k=2), {}, None),
    "gelu": (dict(top_k=2, activation="gelu"), {}, None),
    "gelu_tanh": (dict(top_k=2, activation="gelu_tanh"), {}, None),
    "relu": (dict(top_k=2, activation="relu"), {}, None),
    "swiglu_oai": (dict(top_k=2, activation="swiglu_oai", swiglu_limit=0.8), {}, None),
    "efd": (dict(top_k=2, weights_layout="efd"), dict(biases=True), None),
    "efd_swiglu": (dict(top_k=2, weights_layout="efd", activation="swiglu_oai", swiglu_limit=0.8),
                   dict(biases=True, shared=2), None),
    "softmax_norm": (dict(top_k=2, norm_topk_prob=True), {}, None),
    "softmax_norm_scaled": (dict(top_k=3, norm_topk_prob=True, routed_scaling_factor=2.5), {}, None),
    "sigmoid": (dict(top_k=2, score_func="sigmoid"), {}, None),
    "sigmoid_norm": (dict(top_k=2, score_func="sigmoid", norm_topk_prob=True), {}, None),
    "sigmoid_scaled": (dict(top_k=2, score_func="sigmoid", routed_scaling_factor=2.5), {}, None),
    "deepseek": (dict(top_k=2, score_func="sigmoid", n_groups=2, topk_groups=1, norm_topk_prob=True,
                      routed_scaling_factor=2.5), dict(selection_bias=True, shared=2), None),
    "gpt_oss": (dict(top_k=2, norm_topk_prob=True, activation="swiglu_oai", swiglu_limit=0.8),
                dict(router_bias=True, biases=True), None),
    "capacity": (dict(top_k=2, capacity_factor=0.5, norm_topk_prob=True), dict(router_bias=True), None),
    "capacity_biases_shared": (dict(top_k=3, capacity_factor=0.6), dict(biases=True, shared=2), None),
    "shared_gelu": (dict(top_k=2, activation="gelu"), dict(shared=3), None),
    "top1": (dict(top_k=1), dict(biases=True), None),
    "top_all": (dict(top_k=4, norm_topk_prob=True), {}, None),
    "batch_dims": (dict(top_k=2), dict(router_bias=True), (1, 5, 4)),
}


def _scores_and_selection(x2, rw, kw):
    logits = x2 @ rw + (kw["router_bias"] if kw.get("router_bias") is not None else 0.0)
    if kw.get("score_func", "softmax") == "softmax":
        scores = np.exp(logits - logits.max(1, keepdims=True))
        scores /= scores.sum(1, keepdims=True)
    else:
        scores = 1 / (1 + np.exp(-logits))
    sel = scores + (kw["selection_bias"] if kw.get("selection_bias") is not None else 0.0)
    return scores, sel


def _routing_margin(x2, rw, kw):
    """Smallest score gap at any decision the routing makes (groups, then experts)."""
    _, sel = _scores_and_selection(x2, rw, kw)
    k, E = kw["top_k"], rw.shape[1]
    margin = math.inf
    for s in sel:
        s = s.copy()
        if kw.get("n_groups"):
            ng, tg = kw["n_groups"], kw["topk_groups"]
            gscore = np.sort(s.reshape(ng, -1), axis=1)[:, ::-1][:, :2].sum(1)
            order = np.sort(gscore)[::-1]
            if tg < ng:
                margin = min(margin, order[tg - 1] - order[tg])
            s.reshape(ng, -1)[np.argsort(-gscore, kind="stable")[tg:]] = -np.inf
        order = np.sort(s)[::-1]
        if k < E and np.isfinite(order[k]):
            margin = min(margin, order[k - 1] - order[k])
    return margin


def _preactivation_gap(x2, w0, w1, kw):
    """Smallest distance of any gate/up value (every token with every expert, and the
    shared experts) from the kinks of the activation."""
    act = kw.get("activation", "silu")
    if act not in ("relu", "swiglu_oai"):
        return math.inf
    lim = kw.get("swiglu_limit", 7.0)
    if kw.get("weights_layout", "edf") == "efd":
        w0, w1 = w0.transpose(0, 2, 1), w1.transpose(0, 2, 1)
    gate = np.einsum("td,edf->tef", x2, w0)
    up = np.einsum("td,edf->tef", x2, w1)
    if kw.get("w0_bias") is not None:
        gate = gate + kw["w0_bias"]
        up = up + kw["w1_bias"]
    gates, ups = [gate.ravel()], [up.ravel()]
    if kw.get("shared_experts") is not None:
        s0, s1, _ = kw["shared_experts"]
        gates.append((x2 @ s0).ravel())
        ups.append((x2 @ s1).ravel())
    gate, up = np.concatenate(gates), np.concatenate(ups)
    if act == "relu":
        return float(np.abs(gate).min())
    return float(min(np.abs(gate - lim).min(), np.abs(up - lim).min(), np.abs(up + lim).min()))


def grad_problem(case, seed):
    """(primals dict, kwargs) of a gradient case, redrawn until routing and kinks are safe."""
    kw0, extras, x_shape = GRAD_CASES[case]
    T, d, f, E = GRAD_T, GRAD_D, GRAD_F, GRAD_E
    x_shape = x_shape or (T, d)
    rng = np.random.default_rng(seed)
    for _ in range(200):
        x = rng.standard_normal(x_shape)
        rw, w0, w1, wo = make_weights(rng, E, d, f, layout=kw0.get("weights_layout", "edf"))
        rw = rw * 1.5
        kw = dict(kw0, **make_extras(rng, E, d, f, np.float64, **extras))
        x2 = x.reshape(-1, d)
        if (_routing_margin(x2, rw, kw) > ROUTE_GAP
                and _preactivation_gap(x2, w0, w1, kw) > KINK_GAP):
            return dict(x=x, router_weights=rw, w0=w0, w1=w1, wo=wo), kw
    raise AssertionError(f"no well-separated data found for {case}")


PRIMALS = ("x", "router_weights", "w0", "w1", "wo")
KW_GRADS = ("router_bias", "w0_bias", "w1_bias", "wo_bias")


def finite_difference(primals, kw, ct, name, index=None):
    """Central differences of sum(moe_block(...) * ct) w.r.t. one input (every element).
    The routing (chosen experts and kept assignments) is asserted unchanged at every point."""
    base_aux = raggeddot.moe_block(*(primals[p] for p in PRIMALS), return_aux=True, **kw)[1]
    base_route = (np.sort(base_aux["topk_indices"], axis=-1), base_aux["group_sizes"].copy())

    def loss(prim, kwargs):
        out, aux = raggeddot.moe_block(*(prim[p] for p in PRIMALS), return_aux=True, **kwargs)
        route = (np.sort(aux["topk_indices"], axis=-1), aux["group_sizes"])
        assert all(np.array_equal(a, b) for a, b in zip(route, base_route)), (
            f"the routing flipped while differentiating {name}: pick better separated data")
        return float(np.sum(out * ct))

    def target(prim, kwargs):
        if name in primals:
            return prim, kwargs, prim[name]
        if name in KW_GRADS:
            return prim, kwargs, kwargs[name]
        return prim, kwargs, kwargs["shared_experts"][index]

    src = target(primals, kw)[2]
    grad = np.zeros(src.shape)
    for i in np.ndindex(src.shape):
        vals = []
        for step in (FD_STEP, -FD_STEP):
            prim = dict(primals)
            kwargs = dict(kw)
            if name in primals:
                arr = prim[name] = prim[name].copy()
            elif name in KW_GRADS:
                arr = kwargs[name] = kwargs[name].copy()
            else:
                sh = list(kwargs["shared_experts"])
                arr = sh[index] = sh[index].copy()
                kwargs["shared_experts"] = tuple(sh)
            arr[i] += step
            vals.append(loss(prim, kwargs))
        grad[i] = (vals[0] - vals[1]) / (2 * FD_STEP)
    return grad


def assert_grad_close(got, want, label):
    assert got.shape == want.shape, f"{label}: shape {got.shape} != {want.shape}"
    scale = max(float(np.abs(want).max()), float(np.abs(got).max()), 1e-8)
    err = float(np.abs(got - want).max()) / scale
    assert err < FD_RTOL, f"{label}: relative error {err:.2e} >= {FD_RTOL:.0e} (scale {scale:.3e})"


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradients_finite_differences(case):
    primals, kw = grad_problem(case, seed=sum(map(ord, case)))
    out, vjp_fn = raggeddot.moe_block_vjp(*(primals[p] for p in PRIMALS), **kw)
    np.testing.assert_array_equal(out, raggeddot.moe_block(*(primals[p] for p in PRIMALS), **kw))
    ct = np.random.default_rng(1).standard_normal(out.shape)
    grads = vjp_fn(ct)

    expected_keys = set(PRIMALS) | {k for k in KW_GRADS if kw.get(k) is not None}
    if kw.get("shared_experts") is not None:
        expected_keys.add("shared_experts")
    assert set(grads) == expected_keys, f"gradient keys {sorted(grads)} != {sorted(expected_keys)}"

    if kw.get("capacity_factor") is not None:
        aux = raggeddot.moe_block(*(primals[p] for p in PRIMALS), return_aux=True, **kw)[1]
        assert aux["dropped"] > 0, "the capacity case should drop assignments"

    for name in PRIMALS:
        assert grads[name].dtype == np.float64
        assert_grad_close(grads[name], finite_difference(primals, kw, ct, name), f"{case}: d{name}")
    for name in KW_GRADS:
        if kw.get(name) is not None:
            assert_grad_close(grads[name], finite_difference(primals, kw, ct, name), f"{case}: d{name}")
    if kw.get("shared_experts") is not None:
        assert isinstance(grads["shared_experts"], tuple) and len(grads["shared_experts"]) == 3
        for i in range(3):
            assert_grad_close(grads["shared_experts"][i],
                              finite_difference(primals, kw, ct, "shared_experts", i),
                              f"{case}: dshared_experts[{i}]")


@pytest.mark.parametrize("case", ["silu", "efd_swiglu", "deepseek", "capacity", "batch_dims"])
def test_generic_vjp_agrees(case):
    """raggeddot.vjp(partial(moe_block, ...), x, rw, w0, w1, wo) gives moe_block_vjp's five
    gradients; a partial binding a differentiable array (router_bias, biases, shared experts)
    is refused, naming moe_block_vjp, instead of treating it as a constant."""
    primals, kw = grad_problem(case, seed=sum(map(ord, case)))
    args = [primals[p] for p in PRIMALS]
    out, vjp_fn = raggeddot.moe_block_vjp(*args, **kw)
    bound = sorted(k for k in ("router_bias", "w0_bias", "w1_bias", "wo_bias", "shared_experts")
                   if kw.get(k) is not None)
    if bound:
        with pytest.raises(ValueError, match="moe_block_vjp") as info:
            raggeddot.vjp(functools.partial(raggeddot.moe_block, **kw), *args)
        assert all(repr(name) in str(info.value) for name in bound), str(info.value)
        # selection_bias and the options are not differentiable: bound, they are accepted
        kw = {k: val for k, val in kw.items() if k not in bound}
        out, vjp_fn = raggeddot.moe_block_vjp(*args, **kw)
    out2, generic_fn = raggeddot.vjp(functools.partial(raggeddot.moe_block, **kw), *args)
    check_close(out2, out)
    ct = np.random.default_rng(1).standard_normal(out.shape)
    grads, generic = vjp_fn(ct), generic_fn(ct)
    assert len(generic) == 5
    for name, g in zip(PRIMALS, generic):
        check_close(g, grads[name], err_msg=f"raggeddot.vjp d{name}")


def test_gradients_of_experts_without_tokens_are_zero():
    rng = np.random.default_rng(21)
    T, d, f, E = 2, 4, 3, 8
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    kw = make_extras(rng, E, d, f, np.float64, biases=True)
    out, aux = raggeddot.moe_block(x, rw, w0, w1, wo, top_k=2, return_aux=True, **kw)
    _, vjp_fn = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, top_k=2, **kw)
    grads = vjp_fn(np.ones_like(out))
    empty = aux["group_sizes"] == 0
    assert empty.sum() >= E - 4
    for name in ("w0", "w1", "wo", "w0_bias", "w1_bias", "wo_bias"):
        assert (grads[name][empty] == 0).all(), name
        assert (np.abs(grads[name][~empty]).reshape((~empty).sum(), -1).max(axis=1) > 0).all(), name
    assert "selection_bias" not in grads


def test_float32_gradients_match_float64(rng):
    T, d, f, E = 24, 16, 8, 8
    x = rng.standard_normal((T, d))
    rw, w0, w1, wo = make_weights(rng, E, d, f)
    kw = make_extras(rng, E, d, f, np.float64, router_bias=True, biases=True, shared=4)
    kw.update(top_k=2, norm_topk_prob=True)
    out64, fn64 = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, **kw)
    kw32 = {k: (v.astype(np.float32) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    kw32["shared_experts"] = tuple(a.astype(np.float32) for a in kw["shared_experts"])
    out32, fn32 = raggeddot.moe_block_vjp(*(a.astype(np.float32) for a in (x, rw, w0, w1, wo)), **kw32)
    ct = rng.standard_normal(out64.shape)
    g64, g32 = fn64(ct), fn32(ct.astype(np.float32))
    assert set(g64) == set(g32)
    for name in g64:
        pairs = zip(g32[name], g64[name]) if name == "shared_experts" else [(g32[name], g64[name])]
        for a, b in pairs:
            assert a.dtype == np.float32, name
            check_close(a, b, rtol=2e-4, err_msg=name)


# -------------------------------------------------------------------- gathers

@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_ragged_gather(rng, dtype):
    T, d, N = 17, 9, 40
    x = rng.standard_normal((T, d)).astype(dtype)
    idx = rng.integers(0, T, N)
    w = rng.standard_normal(N).astype(dtype)
    for weights in (None, w):
        out = raggeddot.ragged_gather(x, idx, weights)
        want = ref.ragged_gather(x, idx, weights)
        assert out.dtype == want.dtype == dtype and out.shape == (N, d)
        check_close(out, want)
    np.testing.assert_array_equal(raggeddot.ragged_gather(x, idx), x[idx])  # a copy is exact
    assert raggeddot.ragged_gather(x, idx[:0]).shape == (0, d)
    # a strided, non-contiguous x and int32 indices
    xs = rng.standard_normal((d, 2 * T)).astype(dtype).T[::2]
    np.testing.assert_array_equal(raggeddot.ragged_gather(xs, idx.astype(np.int32)), xs[idx])


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_ragged_gather_reduce(rng, dtype):
    N, d, T, k = 30, 7, 12, 3
    y = rng.standard_normal((N, d)).astype(dtype)
    idx = rng.integers(-1, N, (T, k))
    idx[0] = -1                                      # a token whose slots were all dropped
    w = rng.standard_normal((T, k)).astype(dtype)
    for weights in (None, w):
        out = raggeddot.ragged_gather_reduce(y, idx, weights)
        want = ref.ragged_gather_reduce(y, idx, weights)
        assert out.dtype == want.dtype == dtype and out.shape == (T, d)
        check_close(out, want)
        assert (out[0] == 0).all()
    # dispatch then combine with unit weights is k copies of each token
    x = rng.standard_normal((T, d)).astype(dtype)
    slots = np.arange(T * k).reshape(T, k)
    back = raggeddot.ragged_gather_reduce(raggeddot.ragged_gather(x, slots.ravel() // k), slots)
    check_close(back, k * x)


def test_ragged_gather_reduce_no_rows():
    out = raggeddot.ragged_gather_reduce(np.zeros((0, 4)), np.full((3, 2), -1))
    np.testing.assert_array_equal(out, np.zeros((3, 4)))


def test_gather_errors():
    x = np.zeros((5, 3))
    with pytest.raises(ValueError, match="indices"):
        raggeddot.ragged_gather(x, [0, 5])
    with pytest.raises(ValueError, match="indices"):
        raggeddot.ragged_gather(x, [-1, 0])
    with pytest.raises(TypeError, match="indices"):
        raggeddot.ragged_gather(x, [0.0, 1.0])
    with pytest.raises(ValueError, match="weights"):
        raggeddot.ragged_gather(x, [0, 1], np.ones(3))
    with pytest.raises(ValueError, match="'x'"):
        raggeddot.ragged_gather(np.zeros(5), [0])
    with pytest.raises(ValueError, match="indices"):
        raggeddot.ragged_gather(x, [[0, 1]])
    with pytest.raises(TypeError, match="'x'"):
        raggeddot.ragged_gather(np.zeros((5, 3), np.int32), [0])
    y = np.zeros((4, 3))
    with pytest.raises(ValueError, match="indices"):
        raggeddot.ragged_gather_reduce(y, [[0, 4]])
    with pytest.raises(ValueError, match="indices"):
        raggeddot.ragged_gather_reduce(y, [[0, -2]])
    with pytest.raises(ValueError, match="indices"):
        raggeddot.ragged_gather_reduce(y, [0, 1])
    with pytest.raises(TypeError, match="indices"):
        raggeddot.ragged_gather_reduce(y, [[0.5]])
    with pytest.raises(ValueError, match="weights"):
        raggeddot.ragged_gather_reduce(y, [[0, 1]], np.ones((1, 3)))
    with pytest.raises(ValueError, match="'y'"):
        raggeddot.ragged_gather_reduce(np.zeros((2, 2, 2)), [[0]])


def test_gathers_deterministic_across_threads(rng):
    T, d, k = 700, 96, 4          # N * d and T * k * d above the kernels' parallel thresholds
    for dtype in FLOATS:
        x = rng.standard_normal((T, d)).astype(dtype)
        tok = rng.integers(0, T, T * k)
        scale = rng.standard_normal(T * k).astype(dtype)
        y = rng.standard_normal((T * k, d)).astype(dtype)
        slots = rng.permutation(T * k).reshape(T, k)
        slots[::7, 1] = -1
        w = rng.standard_normal((T, k)).astype(dtype)
        results = []
        for n in THREAD_COUNTS:
            raggeddot.set_num_threads(n)
            results.append((raggeddot.ragged_gather(x, tok, scale), raggeddot.ragged_gather_reduce(y, slots, w)))
        for a, b in results[1:]:
            np.testing.assert_array_equal(a, results[0][0])
            np.testing.assert_array_equal(b, results[0][1])
        check_close(results[0][0], ref.ragged_gather(x, tok, scale))
        check_close(results[0][1], ref.ragged_gather_reduce(y, slots, w))


def test_gathers_do_not_modify_inputs(rng):
    x = rng.standard_normal((6, 4))
    idx = np.array([5, 0, 0, 3])
    w = rng.standard_normal(4)
    slots = np.array([[0, -1], [3, 2]])
    w2 = rng.standard_normal((2, 2))
    arrays = (x, idx, w, slots, w2)
    saved = snapshot(arrays)
    raggeddot.ragged_gather(x, idx, w)
    raggeddot.ragged_gather_reduce(x, slots, w2)
    assert_unchanged(arrays, saved, ["x", "indices", "weights", "slots", "combine weights"])
