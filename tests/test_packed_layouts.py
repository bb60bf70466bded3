"""A PackedRhs meeting an lhs it was not laid out for (prepack's rule).

Weights are laid out by prepack for one kind of lhs. A call with another
kind gets the result of the plain weights, bit for bit, from the layout
that kind of lhs runs on, made once from the PackedRhs's own copy and kept
on it; or, where no layout serves the product, a ValueError naming the
function, the argument and the fix. Checked for ragged_dot, gmm and
moe_block (forward and backward), under every kernel family that serves the
dot products and under a float family (which serves none of them).
"""
import numpy as np
import pytest

import raggeddot
from raggeddot import QArray, runtime
from raggeddot import _gateway as gw

from helpers import DOT_KERNELS, KERNELS, dot_layout

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

# the dot-product (and MMLA) families, the automatic choice, and a float family (no dot products)
INT8_SELECTIONS = ["auto"] + DOT_KERNELS["int8-dot"] + DOT_KERNELS["int8-mmla"] + [KERNELS[-1]]
BF16_SELECTIONS = ["auto"] + DOT_KERNELS["bfloat16-dot"] + DOT_KERNELS["bfloat16-mmla"] + [KERNELS[-1]]


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint64)


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(_bits(got), _bits(want))


def _layer(rng, E=5, d=48, f=40, T=37):
    x = rng.standard_normal((T, d), dtype=np.float32)
    router = rng.standard_normal((d, E), dtype=np.float32)
    ws = [rng.standard_normal(s, dtype=np.float32) / 6 for s in ((E, d, f), (E, d, f), (E, f, d))]
    return x, router, ws


class _Spy:
    """Records the compute type of every prepacked product run."""

    def __init__(self, monkeypatch):
        self.ctypes = []
        real = gw.rows_packed

        def spy(lhs, packed, *args, **kwargs):
            self.ctypes.append(packed.ctype)
            return real(lhs, packed, *args, **kwargs)

        monkeypatch.setattr(gw, "rows_packed", spy)


def _vjp_equal(args, packed, plain, **kw):
    """moe_block_vjp with the prepacked weights equals it with the plain ones, bit for bit."""
    x, router = args
    out, fn = raggeddot.moe_block_vjp(x, router, *packed, **kw)
    want, want_fn = raggeddot.moe_block_vjp(x, router, *plain, **kw)
    _same(out, want)
    ct = np.random.default_rng(1).standard_normal(out.shape).astype(out.dtype)
    got_g, want_g = fn(ct), want_fn(ct)
    assert set(got_g) == set(want_g)
    for name in want_g:
        _same(np.asarray(got_g[name]), np.asarray(want_g[name]))


@pytest.mark.parametrize("kernel", INT8_SELECTIONS)
def test_int8_weights_prepacked_by_default_meet_int8_activations(rng, kernel, monkeypatch):
    """Item 1: int8 QArray weights prepacked without lhs_dtype, in
    moe_block(activation_qtype="int8"): the QArray call's bits, from the int8
    dot-product layout (made once, kept) where those kernels serve."""
    x, router, ws = _layer(rng)
    q = [raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)) for w in ws]
    with runtime.configured(kernel=kernel):
        dot = dot_layout("int8")
        packed = [raggeddot.prepack(a) for a in q]
        assert all(p.ctype == "float32-int8w" for p in packed)
        spy = _Spy(monkeypatch)
        _vjp_equal((x, router), packed, q, top_k=2, activation_qtype="int8")
        if dot:   # the int8 layout, made once and kept
            assert spy.ctypes and set(spy.ctypes) == {dot}
            assert all(dot in p.layouts for p in packed)
            kept = [p.layouts[dot] for p in packed]
            raggeddot.moe_block(x, router, *packed, top_k=2, activation_qtype="int8")
            assert [p.layouts[dot] for p in packed] == kept
        else:     # no int8 layout runs here: the QArray's own product, never a float one
            assert "float32-int8w" not in spy.ctypes
        # the same for ragged_dot with an int8 QArray lhs
        lhs = raggeddot.quantize(x, "int8", channelwise_axes=(0,))
        gs = np.array([10, 0, 20, 7, 0])
        w0 = raggeddot.prepack(q[0])
        _same(raggeddot.ragged_dot(lhs, w0, gs), raggeddot.ragged_dot(lhs, q[0], gs))
        _same(raggeddot.ragged_dot(raggeddot.AsQArray(x, "int8", channelwise_axes=(0,)), w0, gs),
              raggeddot.ragged_dot(raggeddot.AsQArray(x, "int8", channelwise_axes=(0,)), q[0], gs))
        _same(raggeddot.gmm(lhs, w0, gs), raggeddot.gmm(lhs, q[0], gs))


@pytest.mark.parametrize("kernel", INT8_SELECTIONS)
@pytest.mark.parametrize("act", [None, "int4", "float8_e4m3fn"])
def test_int8_layout_meets_other_activations(rng, kernel, act):
    """Items 1 and 3: weights prepacked for int8 activations, in a layer with
    float, int4 or float8 activations: the QArray call's bits (no message
    that contradicts itself)."""
    x, router, ws = _layer(rng)
    q = [raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)) for w in ws]
    with runtime.configured(kernel=kernel):
        packed = [raggeddot.prepack(a, lhs_dtype=np.int8) for a in q]
        _vjp_equal((x, router), packed, q, top_k=2, activation_qtype=act)
        gs = np.array([10, 0, 20, 7, 0])
        _same(raggeddot.ragged_dot(x, packed[0], gs), raggeddot.ragged_dot(x, q[0], gs))
        if act is not None:
            lhs = raggeddot.quantize(x, act, channelwise_axes=(0,))
            _same(raggeddot.ragged_dot(lhs, packed[0], gs), raggeddot.ragged_dot(lhs, q[0], gs))


def test_quantized_lhs_of_every_kind_meets_quantized_layouts(rng):
    """Any QArray lhs (per row, per tensor, subchannel along k, zero points,
    float8) against int8 weights prepacked either way: the QArray call's bits."""
    m, k, n, g = 30, 64, 24, 3
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = raggeddot.quantize(rng.standard_normal((g, k, n), dtype=np.float32), "int8", channelwise_axes=(0, 2))
    gs = np.array([9, 0, 17])
    lhss = [raggeddot.quantize(x, "int8", channelwise_axes=(0,)),
            raggeddot.quantize(x, "int8"),
            raggeddot.quantize(x, "int8", channelwise_axes=(0,), tiled_axes={1: 16}),
            QArray(rng.integers(-128, 128, (m, k)).astype(np.int8),
                   rng.uniform(0.01, 0.1, (m, 1)).astype(np.float32),
                   rng.integers(-3, 4, (m, 1)).astype(np.float32)),
            raggeddot.quantize(x, "float8_e4m3fn", channelwise_axes=(0,))]
    for lhs_dtype in (None, np.int8):
        p = raggeddot.prepack(w, lhs_dtype=lhs_dtype)
        for lhs in lhss:
            _same(raggeddot.ragged_dot(lhs, p, gs), raggeddot.ragged_dot(lhs, w, gs))


@pytest.mark.parametrize("kernel", BF16_SELECTIONS)
def test_bfloat16_weights_meet_float32_tokens_and_router(rng, kernel, monkeypatch):
    """Item 2: bfloat16 weights prepacked by default, a float32 x or router
    (float32 hidden activations): the plain bfloat16 weights' bits, from the
    widening layout (made once, kept); in moe_block and moe_block_vjp."""
    x, router, ws = _layer(rng)
    bf = [w.astype(BF16) for w in ws]
    with runtime.configured(kernel=kernel):
        packed = [raggeddot.prepack(w) for w in bf]
        spy = _Spy(monkeypatch)
        for xx, rr in ((x, router), (x.astype(BF16), router), (x, router.astype(BF16))):
            _vjp_equal((xx, rr), packed, bf, top_k=2)
        assert not {"bfloat16-dot", "bfloat16-mmla"} & set(spy.ctypes)
        gs = np.array([10, 0, 20, 7, 0])
        _same(raggeddot.ragged_dot(x, packed[0], gs), raggeddot.ragged_dot(x, bf[0], gs))
        # all bfloat16: the dot-product layout where it serves (prepack's own)
        xb, rb = x.astype(BF16), router.astype(BF16)
        _vjp_equal((xb, rb), packed, bf, top_k=2)


@pytest.mark.parametrize("kernel", BF16_SELECTIONS)
def test_widening_layout_meets_bfloat16_lhs(rng, kernel):
    """bfloat16 weights prepacked for a float32 lhs, multiplied by a bfloat16
    lhs: the plain call's bits (the bfloat16 dot products where they serve),
    not the widening kernel's."""
    m, k, n, g = 40, 70, 33, 3
    lhs = rng.standard_normal((m, k), dtype=np.float32).astype(BF16)
    w = rng.standard_normal((g, k, n), dtype=np.float32).astype(BF16)
    gs = np.array([13, 0, 20])
    with runtime.configured(kernel=kernel):
        p = raggeddot.prepack(w, lhs_dtype=np.float32)
        assert p.ctype == "float32-bfloat16w"
        _same(raggeddot.ragged_dot(lhs, p, gs), raggeddot.ragged_dot(lhs, w, gs))
        _same(raggeddot.gmm(lhs, p, gs, preferred_element_type=np.float32),
              raggeddot.gmm(lhs, w, gs, preferred_element_type=np.float32))
        assert set(p.layouts) <= {"float32-bfloat16w", "bfloat16-dot", "bfloat16-mmla"}


def test_layouts_and_their_memory(rng):
    """PackedRhs.layouts: its own layout first, then each one made for
    another lhs, with the bytes each holds."""
    w = rng.standard_normal((2, 64, 40), dtype=np.float32).astype(BF16)
    p = raggeddot.prepack(w, lhs_dtype=np.float32)
    assert list(p.layouts) == ["float32-bfloat16w"] and p.layouts["float32-bfloat16w"] == p.nbytes
    layout = dot_layout("bfloat16")
    if layout is not None:
        raggeddot.ragged_dot(rng.standard_normal((8, 64), dtype=np.float32).astype(BF16), p, np.array([3, 5]))
        assert list(p.layouts) == ["float32-bfloat16w", layout]
        assert p.layouts[layout] == p.nbytes          # k a multiple of 4: the same bytes


def test_compute_dtype_mismatch_names_function_argument_and_fix(rng):
    """No layout serves a float64 product of float32 (or quantized) weights:
    ValueError naming the function, the argument and the fix."""
    w = rng.standard_normal((3, 8, 5), dtype=np.float32)
    p = raggeddot.prepack(w)
    lhs64 = rng.standard_normal((6, 8))
    gs = np.array([2, 2, 2])
    for call, fn in ((lambda: raggeddot.ragged_dot(lhs64, p, gs), "ragged_dot"),
                     (lambda: raggeddot.gmm(lhs64, p, gs), "gmm"),
                     (lambda: raggeddot.ragged_dot(lhs64.astype(np.float32), p, gs,
                                                   preferred_element_type=np.float64), "ragged_dot")):
        with pytest.raises(ValueError) as info:
            call()
        msg = str(info.value)
        assert msg.startswith(f"{fn}: 'rhs'") and "float64" in msg and "prepack" in msg, msg
    q = raggeddot.prepack(raggeddot.quantize(w, "int8", channelwise_axes=(0, 2)))
    with pytest.raises(ValueError, match=r"^ragged_dot: 'rhs'.*float64"):
        raggeddot.ragged_dot(lhs64, q, gs)
    x, router, ws = _layer(rng)
    packed = [raggeddot.prepack(a) for a in ws]
    with pytest.raises(ValueError, match=r"^moe_block: 'w0'.*float64.*prepack"):
        raggeddot.moe_block(x.astype(np.float64), router, *packed, top_k=2)
    with pytest.raises(ValueError, match=r"^moe_block_vjp: 'w0'.*float64"):
        raggeddot.moe_block_vjp(x, router.astype(np.float64), *packed, top_k=2)


def test_prepack_checks_lhs_dtype(rng):
    """Item 4: lhs_dtype is checked for every kind of weights."""
    w = rng.standard_normal((2, 8, 4), dtype=np.float32)
    for bad in ("banana", np.complex64, "int32", 3):
        with pytest.raises(TypeError, match=r"^prepack: 'lhs_dtype'"):
            raggeddot.prepack(w, lhs_dtype=bad)
    with pytest.raises(TypeError, match=r"^prepack: 'lhs_dtype'=int8.*quantize"):
        raggeddot.prepack(w, lhs_dtype=np.int8)
    with pytest.raises(TypeError, match=r"^prepack: 'lhs_dtype'"):
        raggeddot.prepack(w.astype(BF16), lhs_dtype=np.int8)
    q = raggeddot.quantize(w, "int8", channelwise_axes=(0, 2))
    with pytest.raises(TypeError, match=r"^prepack: 'lhs_dtype'"):
        raggeddot.prepack(q, lhs_dtype="banana")
    f8 = raggeddot.quantize(w, "float8_e4m3fn", channelwise_axes=(0, 2))
    with pytest.raises(TypeError, match=r"^prepack: 'lhs_dtype'=int8.*float8_e4m3fn"):
        raggeddot.prepack(f8, lhs_dtype=np.int8)
    for ok in (None, np.float32, "float16", BF16):
        raggeddot.prepack(w, lhs_dtype=ok)


def test_moe_block_options_are_checked(rng):
    """Item 4: options of moe_block of the wrong type or out of range."""
    x, router, ws = _layer(rng)
    cases = [(dict(norm_topk_prob="False"), TypeError, "'norm_topk_prob'"),
             (dict(norm_topk_prob=None), TypeError, "'norm_topk_prob'"),
             (dict(routed_scaling_factor="2"), TypeError, "'routed_scaling_factor'"),
             (dict(routed_scaling_factor=float("nan")), ValueError, "'routed_scaling_factor'"),
             (dict(swiglu_limit=-1.0, activation="swiglu_oai"), ValueError, "'swiglu_limit'"),
             (dict(swiglu_limit=0.0), ValueError, "'swiglu_limit'"),
             (dict(swiglu_limit="7"), TypeError, "'swiglu_limit'"),
             (dict(swiglu_alpha=float("nan")), ValueError, "'swiglu_alpha'"),
             (dict(swiglu_alpha="1.7"), TypeError, "'swiglu_alpha'")]
    for kw, exc, name in cases:
        with pytest.raises(exc, match=f"^moe_block: {name}"):
            raggeddot.moe_block(x, router, *ws, top_k=2, **kw)
    # accepted: bools of NumPy, integers, and an unbounded limit
    want = raggeddot.moe_block(x, router, *ws, top_k=2, norm_topk_prob=True, routed_scaling_factor=2.0)
    _same(raggeddot.moe_block(x, router, *ws, top_k=2, norm_topk_prob=np.bool_(True),
                              routed_scaling_factor=2), want)
    raggeddot.moe_block(x, router, *ws, top_k=2, activation="swiglu_oai", swiglu_limit=float("inf"))


def test_capacity_factor_inf_is_dropless(rng):
    """Item 5: capacity_factor=inf reads as "no capacity limit" (as None),
    1e300 keeps every assignment too, and a string is a TypeError naming it."""
    x, router, ws = _layer(rng)
    want, aux = raggeddot.moe_block(x, router, *ws, top_k=2, return_aux=True)
    for cf in (float("inf"), 1e300, np.float64(1e300)):
        got, got_aux = raggeddot.moe_block(x, router, *ws, top_k=2, capacity_factor=cf, return_aux=True)
        _same(got, want)
        assert got_aux["dropped"] == 0
    out, fn = raggeddot.moe_block_vjp(x, router, *ws, top_k=2, capacity_factor=float("inf"))
    _same(out, want)
    with pytest.raises(TypeError, match="^moe_block: 'capacity_factor'"):
        raggeddot.moe_block(x, router, *ws, top_k=2, capacity_factor="1.5")
    for bad in (0.0, -1.0, float("nan"), float("-inf")):
        with pytest.raises(ValueError, match="^moe_block: 'capacity_factor'"):
            raggeddot.moe_block(x, router, *ws, top_k=2, capacity_factor=bad)
