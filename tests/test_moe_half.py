"""moe_block with float16 / bfloat16 tokens and weights keeps its hidden
activations in that dtype: the dispatched rows, h0, h1, a and the experts'
outputs are 16-bit, each rounded once from its float32 accumulation, while
routing, the combine and the gradients' accumulations stay float32."""
import math
import tracemalloc

import numpy as np
import pytest

import raggeddot
from raggeddot import _core, runtime
from raggeddot import reference as ref

from helpers import HALF_DTYPES, dtype_id


def _layer(rng, dtype, T=96, d=64, f=160, E=8):
    x = rng.standard_normal((T, d)).astype(dtype)
    rw = (rng.standard_normal((d, E)) / math.sqrt(d)).astype(dtype)
    w0, w1 = ((rng.standard_normal((E, d, f)) / math.sqrt(d)).astype(dtype) for _ in range(2))
    wo = (rng.standard_normal((E, f, d)) / math.sqrt(f)).astype(dtype)
    return x, rw, w0, w1, wo


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint16)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=dtype_id)
def test_forward_is_the_16bit_composition(rng, dtype):
    """The layer equals its composition from ragged_dot with 16-bit outputs
    (each product rounded once) and the float32 gated activation rounded
    once, bit for bit: one expert a token with its weight normalised to 1,
    so that the combine adds no rounding of its own (top_k > 1 is checked
    against float64 below)."""
    x, rw, w0, w1, wo = _layer(rng, dtype)
    top_k = 1
    out, aux = raggeddot.moe_block(x, rw, w0, w1, wo, top_k=top_k, norm_topk_prob=True, return_aux=True)
    assert out.dtype == dtype
    idx, w = aux["topk_indices"], aux["topk_weights"].astype(np.float32)
    assert (w == 1).all()
    order = np.argsort(idx.ravel(), kind="stable")          # slots sorted by expert, token order
    xs = x[order // top_k]
    gs = aux["group_sizes"]
    h0 = raggeddot.ragged_dot(xs, w0, gs)
    h1 = raggeddot.ragged_dot(xs, w1, gs)
    assert h0.dtype == dtype
    a = _core.gated_act(h0.astype(np.float32), h1.astype(np.float32), _core.ACTIVATIONS["silu"], 7.0).astype(dtype)
    y = raggeddot.ragged_dot(a, wo, gs)
    slot = np.empty(order.size, dtype=np.int64)
    slot[order] = np.arange(order.size)
    slot = slot.reshape(idx.shape)
    want = np.zeros(out.shape, np.float32)
    for j in range(top_k):
        want += w[:, j, None] * y[slot[:, j]].astype(np.float32)
    np.testing.assert_array_equal(_bits(out), _bits(want.astype(dtype)))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=dtype_id)
def test_down_gradient_is_the_16bit_composition(rng, dtype):
    """The experts' outputs' cotangent is 16-bit like the other hidden
    cotangents: each slot's ``weight * d_out[t]`` rounded once, so the down
    weights' gradient is tgmm of the 16-bit ``a`` and that 16-bit cotangent,
    bit for bit (one expert a token, weight 1, a float32 d_out whose values
    the rounding changes)."""
    x, rw, w0, w1, wo = _layer(rng, dtype)
    out, aux = raggeddot.moe_block(x, rw, w0, w1, wo, top_k=1, norm_topk_prob=True, return_aux=True)
    _, vjp_fn = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, top_k=1, norm_topk_prob=True)
    d_out = rng.standard_normal(out.shape).astype(np.float32)
    assert (d_out.astype(dtype).astype(np.float32) != d_out).any()
    dwo = vjp_fn(d_out)["wo"]
    order = np.argsort(aux["topk_indices"].ravel(), kind="stable")
    xs, gs = x[order], aux["group_sizes"]
    h0, h1 = raggeddot.ragged_dot(xs, w0, gs), raggeddot.ragged_dot(xs, w1, gs)
    a = _core.gated_act(h0.astype(np.float32), h1.astype(np.float32), _core.ACTIVATIONS["silu"], 7.0).astype(dtype)
    want = raggeddot.tgmm(a.T, d_out[order].astype(dtype), gs, preferred_element_type=dtype)
    assert dwo.dtype == want.dtype == dtype
    np.testing.assert_array_equal(_bits(dwo), _bits(want))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=dtype_id)
def test_hidden_activations_take_half_the_memory(rng, dtype):
    """With f >> d the layer's memory is its hidden activations: in 16 bits
    the traced peak of forward and backward is well under the float32
    layer's on the same values."""
    x, rw, w0, w1, wo = _layer(rng, dtype, T=512, d=32, f=1024, E=4)
    as32 = [a.astype(np.float32) for a in (x, rw, w0, w1, wo)]

    def peak(args):
        def run():
            out, vjp_fn = raggeddot.moe_block_vjp(*args, top_k=2)
            vjp_fn(np.ones_like(out))
        run()                                   # warm-up: packing buffers
        with runtime.configured(buffer_cache=0):
            tracemalloc.start()
            try:
                run()
                return tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()

    half, full = peak((x, rw, w0, w1, wo)), peak(as32)
    assert half < 0.65 * full, (half, full)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("variant", ["plain", "biases-shared", "input-weights", "fused", "efd"])
def test_forward_and_gradients_close_to_float64(rng, dtype, variant):
    """Output and every gradient (16-bit, of the inputs' dtype) agree with
    float64 on the same 16-bit values (the reference's output, the float64
    layer's gradients), within what rounding the hidden activations to 16
    bits allows."""
    T, d, f, E, top_k = 64, 48, 96, 8, 2
    x, rw, w0, w1, wo = _layer(rng, dtype, T, d, f, E)
    kw = dict(top_k=top_k)
    if variant == "biases-shared":
        kw.update(w0_bias=(0.3 * rng.standard_normal((E, f))).astype(dtype),
                  w1_bias=(0.3 * rng.standard_normal((E, f))).astype(dtype),
                  wo_bias=(0.3 * rng.standard_normal((E, d))).astype(dtype),
                  shared_experts=tuple((rng.standard_normal(s) / math.sqrt(s[0])).astype(dtype)
                                       for s in ((d, 32), (d, 32), (32, d))))
    elif variant == "input-weights":
        kw.update(router_weights_on="input", score_func="sigmoid")
    elif variant == "fused":
        w0, w1 = np.concatenate([w0, w1], axis=2), None
        kw.update(gate_up="interleaved")
    elif variant == "efd":
        w0, w1, wo = (a.transpose(0, 2, 1).copy() for a in (w0, w1, wo))
        kw.update(weights_layout="efd")
    args = (x, rw, w0, w1, wo)
    out, vjp_fn = raggeddot.moe_block_vjp(*args, **kw)
    d_out = rng.standard_normal(out.shape).astype(dtype)
    grads = vjp_fn(d_out)
    args64 = tuple(None if a is None else a.astype(np.float64) for a in args)
    kw64 = {k: (tuple(a.astype(np.float64) for a in v) if isinstance(v, tuple)
                else v.astype(np.float64) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    want = ref.moe_block(*args64, **kw64)
    # the float64 layer's gradients (checked against finite differences and
    # jax in the other suites)
    _, vjp64 = raggeddot.moe_block_vjp(*args64, **kw64)
    want_grads = vjp64(d_out.astype(np.float64))
    tol = 2e-2 if dtype == np.dtype(np.float16) else 5e-2

    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)

    assert out.dtype == dtype and rel(out, want) < tol / 4
    for name, g in grads.items():
        if g is None:
            assert want_grads.get(name) is None, name
            continue
        gw = want_grads[name]
        for gi, wi in zip(g if isinstance(g, tuple) else (g,), gw if isinstance(gw, tuple) else (gw,)):
            assert gi.dtype == dtype, (name, gi.dtype)
            assert rel(gi, wi) < tol, (name, rel(gi, wi))


# ------------------------------------------------ dynamic activation quantization

def _float_layer(rng, T=64, d=48, f=96, E=8):
    x = rng.standard_normal((T, d)).astype(np.float32)
    rw = (rng.standard_normal((d, E)) / math.sqrt(d)).astype(np.float32)
    w0, w1 = ((rng.standard_normal((E, d, f)) / math.sqrt(d)).astype(np.float32) for _ in range(2))
    wo = (rng.standard_normal((E, f, d)) / math.sqrt(f)).astype(np.float32)
    return x, rw, w0, w1, wo


@pytest.mark.parametrize("qtype", ["int8", "float8_e4m3fn"])
@pytest.mark.parametrize("weights", ["float", "int8"])
def test_activation_quantization_is_the_quantized_composition(rng, qtype, weights):
    """activation_qtype quantizes the dispatched rows and the gated
    activations per token before their products: the layer equals that
    composition of public ops bit for bit (one expert a token, weight 1);
    with int8 weights and int8 rows the products are the exact int8 ones."""
    x, rw, w0, w1, wo = _float_layer(rng)
    if weights == "int8":
        w0, w1, wo = (raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)) for w in (w0, w1, wo))
    out, aux = raggeddot.moe_block(x, rw, w0, w1, wo, top_k=1, norm_topk_prob=True, return_aux=True,
                                   activation_qtype=qtype)
    order = np.argsort(aux["topk_indices"].ravel(), kind="stable")
    gs = aux["group_sizes"]
    per_token = dict(channelwise_axes=(0,))
    xq = raggeddot.quantize(x[order], qtype, **per_token)
    h0, h1 = raggeddot.ragged_dot(xq, w0, gs), raggeddot.ragged_dot(xq, w1, gs)
    a = _core.gated_act(h0, h1, _core.ACTIVATIONS["silu"], 7.0)
    y = raggeddot.ragged_dot(raggeddot.quantize(a, qtype, **per_token), wo, gs)
    want = np.empty_like(y)
    want[order] = y
    np.testing.assert_array_equal(out, want)
    plain = raggeddot.moe_block(x, rw, w0, w1, wo, top_k=1, norm_topk_prob=True)
    assert not np.array_equal(out, plain)      # the quantization took place


@pytest.mark.parametrize("weights", ["float", "int8", "prepacked"])
def test_activation_quantization_gradients_are_straight_through(rng, weights):
    """Gradients of the int8-activation layer: of every input's dtype and
    shape, and within int8 per-token error of the float layer's."""
    x, rw, w0, w1, wo = _float_layer(rng)
    if weights == "int8":
        w0, w1, wo = (raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)) for w in (w0, w1, wo))
    elif weights == "prepacked":
        w0, w1, wo = (raggeddot.prepack(w) for w in (w0, w1, wo))
    out, vjp_fn = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, top_k=2, activation_qtype="int8")
    base, vjp_base = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, top_k=2)
    d_out = rng.standard_normal(out.shape).astype(np.float32)
    grads, want = vjp_fn(d_out), vjp_base(d_out)

    def rel(a, b):
        return np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b)

    assert 1e-4 < rel(out, base) < 3e-2
    assert set(grads) == set(want)
    for name in ("x", "router_weights", "w0", "w1", "wo"):
        assert grads[name].shape == want[name].shape and grads[name].dtype == want[name].dtype
        assert rel(grads[name], want[name]) < 3e-2, name


def test_activation_qtype_refused(rng):
    x, rw, w0, w1, wo = _float_layer(rng)
    with pytest.raises(ValueError, match="activation_qtype.*int3"):
        raggeddot.moe_block(x, rw, w0, w1, wo, top_k=2, activation_qtype="int3")
