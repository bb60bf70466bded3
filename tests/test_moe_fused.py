"""The experts' gate and up products in one pass (gw.gated_rows: each block
of rows packed once for both weights, the biases, the rounding to the
hidden dtype and the activation applied to each tile as it completes), and
the backward's d_a product with the activation's gradient in its epilogue
(gw.gated_grad_rows): the same bits as the separate products, gated_act and
gated_act_grad, on every kernel family and hidden dtype, with biases, fused
gate/up weights and every activation; moe_block (no backward) keeps neither
product, moe_block_vjp both."""
import numpy as np
import pytest

import raggeddot
from raggeddot import _core, _gateway as gw
from raggeddot import runtime
from raggeddot._moe import experts

from helpers import DOT_KERNELS, FUSED_FAMILIES, bits

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), BF16, np.dtype(np.float16), np.dtype(np.float64)]
FAMILIES = FUSED_FAMILIES
_bits = bits


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("activation, gate_up, bias", [
    ("silu", None, False), ("gelu", None, True), ("gelu_tanh", "concat", False), ("relu", None, False),
    ("swiglu_oai", "interleaved", True)])
def test_fused_gate_up_equals_the_separate_passes(rng, monkeypatch, family, dtype, activation, gate_up, bias):
    T, d, f, E = 70, 48, 80, 5
    ct = np.float64 if dtype == np.float64 else np.float32
    x = rng.standard_normal((T, d)).astype(dtype)
    router = rng.standard_normal((d, E)).astype(ct)
    if gate_up:
        w01 = (rng.standard_normal((E, d, 2 * f)) / np.sqrt(d)).astype(dtype)
        ws = (w01, None)
    else:
        ws = tuple((rng.standard_normal((E, d, f)) / np.sqrt(d)).astype(dtype) for _ in range(2))
    wo = (rng.standard_normal((E, f, d)) / np.sqrt(f)).astype(dtype)
    kw = dict(top_k=2, activation=activation, **({"gate_up": gate_up} if gate_up else {}))
    if activation == "swiglu_oai":
        kw["swiglu_limit"] = 1.5
    if bias:
        kw["w0_bias"] = rng.standard_normal((E, 2 * f if gate_up else f)).astype(ct)
        if not gate_up:
            kw["w1_bias"] = rng.standard_normal((E, f)).astype(ct)
    ct_out = rng.standard_normal((T, d)).astype(ct)
    calls, grad_calls = [], []
    real, real_grad = gw.gated_rows, gw.gated_grad_rows
    monkeypatch.setattr(gw, "gated_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(gw, "gated_grad_rows", lambda *a, **k: grad_calls.append(1) or real_grad(*a, **k))
    with runtime.configured(kernel=family):
        fused = raggeddot.moe_block(x, router, ws[0], ws[1], wo, **kw)
        out, fn = raggeddot.moe_block_vjp(x, router, ws[0], ws[1], wo, **kw)
        grads = fn(ct_out.astype(out.dtype))
        assert calls and grad_calls, "the fused passes ran"
        monkeypatch.setattr(experts, "_fused", lambda *a: False)
        want = raggeddot.moe_block(x, router, ws[0], ws[1], wo, **kw)
        want_out, want_fn = raggeddot.moe_block_vjp(x, router, ws[0], ws[1], wo, **kw)
        want_grads = want_fn(ct_out.astype(out.dtype))
    assert np.array_equal(_bits(fused), _bits(want))
    assert np.array_equal(_bits(out), _bits(want_out))
    for name, g in want_grads.items():
        if g is not None:
            assert np.array_equal(_bits(np.asarray(grads[name])), _bits(np.asarray(g))), name


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["edf", "efd"])
def test_concatenated_gate_up_gradient_in_one_pass(rng, monkeypatch, dtype, layout):
    """With gate and up concatenated, the fused backward writes dh0 and dh1
    side by side and takes both weight gradients in one contraction over the
    rows (one call where the separate passes make two): the same bits."""
    T, d, f, E = 90, 40, 56, 6
    x = rng.standard_normal((T, d)).astype(dtype)
    router = rng.standard_normal((d, E)).astype(dtype)
    w01 = (rng.standard_normal((E, d, 2 * f)) / np.sqrt(d)).astype(dtype)
    wo = (rng.standard_normal((E, f, d)) / np.sqrt(f)).astype(dtype)
    if layout == "efd":
        w01, wo = w01.transpose(0, 2, 1).copy(), wo.transpose(0, 2, 1).copy()
    kw = dict(top_k=2, gate_up="concat", weights_layout=layout)
    d_out = rng.standard_normal((T, d)).astype(dtype)
    contracts = []
    real = gw.contract
    monkeypatch.setattr(gw, "contract", lambda *a, **k: contracts.append(1) or real(*a, **k))
    grads = raggeddot.moe_block_vjp(x, router, w01, None, wo, **kw)[1](d_out)
    fused_calls = len(contracts)
    monkeypatch.setattr(experts, "_fused", lambda *a: False)
    want = raggeddot.moe_block_vjp(x, router, w01, None, wo, **kw)[1](d_out)
    assert len(contracts) - fused_calls == fused_calls + 1     # down, gate, up apart; down, gate+up fused
    for name, g in want.items():
        if g is not None:
            assert np.array_equal(_bits(np.asarray(grads[name])), _bits(np.asarray(g))), name


def test_forward_alone_keeps_neither_product_and_reads_the_tokens_in_place(rng, monkeypatch):
    """moe_block without a backward asks the fused pass for a only, reading
    the tokens' rows through the dispatch's index (no [N, d] copy of them);
    the vjp keeps h0 and h1, reads the rows so too, and its backward's gate
    and up weight gradients read them through the index again, and the down
    weights' gradient the cotangent's rows times their router weights (no
    gather, no [N, d] copy anywhere), with the bits of the dispatched rows'
    products."""
    T, d, f, E = 40, 32, 24, 4
    x = rng.standard_normal((T, d)).astype(np.float32)
    router = rng.standard_normal((d, E)).astype(np.float32)
    ws = [rng.standard_normal(s).astype(np.float32) for s in ((E, d, f), (E, d, f), (E, f, d))]
    seen, gathers = [], []
    real, real_gather = gw.gated_rows, gw.gather_rows
    monkeypatch.setattr(gw, "gated_rows", lambda lhs, w0, w1, b, a, h0, h1, *r, rows=None, **k:
                        seen.append((h0 is not None, rows is not None, lhs.shape))
                        or real(lhs, w0, w1, b, a, h0, h1, *r, rows=rows, **k))
    monkeypatch.setattr(gw, "gather_rows", lambda *a, **k: gathers.append(1) or real_gather(*a, **k))
    raggeddot.moe_block(x, router, *ws, top_k=2)
    assert seen == [(False, True, (T, d))] and gathers == []
    gathered = []
    real_contract = _core.ragged_contract_gathered
    monkeypatch.setattr(_core, "ragged_contract_gathered",
                        lambda *a: gathered.append(tuple(x is not None for x in a[5:8])) or real_contract(*a))
    out, vjp = raggeddot.moe_block_vjp(x, router, *ws, top_k=2)
    assert seen[1] == (True, True, (T, d)) and gathers == []
    d_out = rng.standard_normal(out.shape).astype(np.float32)
    grads = vjp(d_out)
    # (lhs_cols, rhs_rows, rhs_row_scale): wo's through the cotangent's index and weights, w0's and w1's
    assert sorted(gathered) == [(False, True, True), (True, False, False), (True, False, False)], gathered
    assert gathers == []
    gathered.clear()
    monkeypatch.setattr(experts, "fuses", lambda *a: False)     # the dispatched rows, copied
    out2, vjp2 = raggeddot.moe_block_vjp(x, router, *ws, top_k=2)
    want = vjp2(d_out)
    assert gathers and gathered == [(False, True, True)]     # (gathered; wo's through the index still)
    assert np.array_equal(_bits(out), _bits(out2))
    for name, g in want.items():
        if g is not None:
            assert np.array_equal(_bits(np.asarray(grads[name])), _bits(np.asarray(g))), name


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("qtype", [None, "int8", "float8_e4m3fn"])
def test_fused_pass_reads_prepacked_weights(rng, monkeypatch, family, dtype, qtype):
    """Prepacked weights (float, bfloat16 in either layout, quantized for a
    float lhs) take the fused passes too, with the bits of the separate
    passes on the same PackedRhs."""
    T, d, f, E = 60, 40, 72, 4
    x = rng.standard_normal((T, d)).astype(dtype)
    router = rng.standard_normal((d, E)).astype(np.float32)
    ws = [(rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32) for s in ((E, d, f), (E, d, f), (E, f, d))]
    if qtype:
        ws = [raggeddot.quantize(w, qtype, channelwise_axes=(0, 2)) for w in ws]
    else:
        ws = [w.astype(dtype) for w in ws]
    calls = []
    real = gw.gated_rows
    monkeypatch.setattr(gw, "gated_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    with runtime.configured(kernel=family):
        packed = [raggeddot.prepack(w) for w in ws]
        fused = raggeddot.moe_block(x, router, *packed, top_k=2)
        out, fn = raggeddot.moe_block_vjp(x, router, *packed, top_k=2)
        grads = fn(np.ones_like(out))
        assert calls == [1, 1]
        monkeypatch.setattr(experts, "_fused", lambda *a: None)
        want = raggeddot.moe_block(x, router, *packed, top_k=2)
        want_out, want_fn = raggeddot.moe_block_vjp(x, router, *packed, top_k=2)
        want_grads = want_fn(np.ones_like(out))
    assert np.array_equal(_bits(fused), _bits(want)) and np.array_equal(_bits(out), _bits(want_out))
    for name, g in want_grads.items():
        if g is not None:
            assert np.array_equal(_bits(np.asarray(g)), _bits(np.asarray(grads[name]))), name


W8A8_FAMILIES = ["auto"] + DOT_KERNELS["int8-dot"] + DOT_KERNELS["int8-tile"][:1] + DOT_KERNELS["int8-mmla"][:1]


@pytest.mark.parametrize("family", W8A8_FAMILIES)
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("weights", ["int8", "int8-zp", "int8-prepacked", "int4", "mxfp4", "mxfp4-prepacked"])
def test_w8a8_gate_and_up_in_one_pass(rng, monkeypatch, family, dtype, weights):
    """With activation_qtype="int8" the gate and up products run as one pass
    where the kernels quantize the rows while they pack them (once for both
    weights), the activation in their epilogue: the bits of the separate
    products on the same rows and weights, forward and backward."""
    T, d, f, E = 70, 64, 96, 4
    x = rng.standard_normal((T, d)).astype(dtype)
    router = rng.standard_normal((d, E)).astype(np.float32)
    raw = [(rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32) for s in ((E, d, f), (E, d, f), (E, f, d))]
    qtype = weights.split("-")[0]
    kw = dict(channelwise_axes=(0, 2), tiled_axes={1: 32}) if qtype == "mxfp4" else dict(channelwise_axes=(0, 2))
    ws = [raggeddot.quantize(w, qtype, **kw) for w in raw]
    if weights == "int8-zp":
        ws = [raggeddot.quantize(w + 0.05, "int8", channelwise_axes=(0, 2), calibration_method="minmax")
              for w in raw]
    calls = []
    real = gw.gated_rows
    monkeypatch.setattr(gw, "gated_rows", lambda *a, **k: calls.append(k.get("quantize_lhs")) or real(*a, **k))
    with runtime.configured(kernel=family):
        if weights.endswith("prepacked"):
            ws = [raggeddot.prepack(w, lhs_dtype=np.int8) for w in ws]
        kw = dict(top_k=2, activation_qtype="int8")
        fused = raggeddot.moe_block(x, router, *ws, **kw)
        out, fn = raggeddot.moe_block_vjp(x, router, *ws, **kw)
        grads = fn(np.ones_like(out))
        assert calls == [True, True], calls
        monkeypatch.setattr(experts, "_fused", lambda *a: None)
        want = raggeddot.moe_block(x, router, *ws, **kw)
        want_out, want_fn = raggeddot.moe_block_vjp(x, router, *ws, **kw)
        want_grads = want_fn(np.ones_like(out))
    assert np.array_equal(_bits(fused), _bits(want)) and np.array_equal(_bits(out), _bits(want_out))
    for name, g in want_grads.items():
        if g is not None:
            assert np.array_equal(_bits(np.asarray(g)), _bits(np.asarray(grads[name]))), name


@pytest.mark.parametrize("qtype", ["int8", "float8_e4m3fn", "int4"])
def test_fused_pass_reads_qarray_weights(rng, monkeypatch, qtype):
    """QArray weights with a float lhs (no activation quantization) take the
    fused passes, dequantized while packed: the bits of the separate passes."""
    T, d, f, E = 50, 48, 40, 3
    x = rng.standard_normal((T, d)).astype(np.float32)
    router = rng.standard_normal((d, E)).astype(np.float32)
    ws = [raggeddot.quantize((rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32), qtype,
                             channelwise_axes=(0, 2)) for s in ((E, d, f), (E, d, f), (E, f, d))]
    calls = []
    real = gw.gated_rows
    monkeypatch.setattr(gw, "gated_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    fused = raggeddot.moe_block(x, router, *ws, top_k=2)
    out, fn = raggeddot.moe_block_vjp(x, router, *ws, top_k=2)
    grads = fn(np.ones_like(out))
    assert calls == [1, 1]
    monkeypatch.setattr(experts, "_fused", lambda *a: None)
    assert np.array_equal(_bits(fused), _bits(raggeddot.moe_block(x, router, *ws, top_k=2)))
    want_out, want_fn = raggeddot.moe_block_vjp(x, router, *ws, top_k=2)
    assert np.array_equal(_bits(out), _bits(want_out))
    for name, g in want_fn(np.ones_like(out)).items():
        if g is not None:
            assert np.array_equal(_bits(np.asarray(g)), _bits(np.asarray(grads[name]))), name


def test_the_gated_bindings_refuse_bad_arguments():
    """Direct calls of the C entry points with bad arguments raise, naming
    what is wrong, and never touch memory outside the arrays."""
    from raggeddot import _core
    x, w = np.zeros((4, 8), np.float32), np.zeros((2, 8, 6), np.float32)
    a, b = np.zeros((4, 6), np.float32), np.array([0, 2, 4], np.int64)
    bad = [
        (lambda: _core.gated_rows(x, w, w, b, a, None, None, None, None, 0, 1.0, 1.0, np.array([0, 1, 9, 2])),
         "index 9"),
        (lambda: _core.gated_rows(x, w, w[:, :, :5], b, a, None, None, None, None, 0, 1.0, 1.0), "'w0' and 'w1'"),
        (lambda: _core.gated_rows(x, w, w, np.array([0, 5, 4]), a, None, None, None, None, 0, 1.0, 1.0), "bounds"),
        (lambda: _core.gated_rows(x, w, w, b, a, None, None, None, None, 9, 1.0, 1.0), "activation code 9"),
        (lambda: _core.gated_rows(x, w, w, b, a[:, :5], None, None, None, None, 0, 1.0, 1.0), "disagree"),
        (lambda: _core.gated_rows(x, w, w, b, a, a[:3], None, None, None, 0, 1.0, 1.0), "'h0' must have"),
        (lambda: _core.gated_rows(x, w, w, b, a, None, None, np.zeros((2, 5), np.float32), None, 0, 1.0, 1.0),
         "'b0' must be"),
        (lambda: _core.gated_grad_rows(x, w, b, a, a, a, a[:, :5], 0, 1.0, 1.0), "'dh1' must have"),
        (lambda: _core.gated_grad_rows(x, w, b, a, None, a, a, 0, 1.0, 1.0), "must be arrays"),
        (lambda: _core.gated_grad_rows(x, w, b, a, a, np.zeros((4, 12), np.float32)[:, :6], a, 0, 1.0, 1.0),
         "'dh1' must have the shape, dtype and row stride of 'dh0'"),
    ]
    for call, message in bad:
        with pytest.raises((ValueError, TypeError), match=message):
            call()


@pytest.mark.parametrize("family", sorted(set(FUSED_FAMILIES + DOT_KERNELS["bfloat16-dot"]
                                               + DOT_KERNELS["bfloat16-mmla"])))
def test_contraction_through_an_index_gives_the_gathered_bits(rng, family):
    """ragged_contract_gathered (the weight gradients of the dispatched rows, read through the
    dispatch's index): lhs[:, cols] or rhs[rows], bit for bit the contraction of the gathered
    array, for float32, float64 and 16-bit operands (bfloat16 ones on the dot-product and tile
    families), tokens chosen several times or never, groups empty or past KC, 1 and 3 threads,
    written and accumulated; and the refusals."""
    dot = DOT_KERNELS["bfloat16-dot"] + DOT_KERNELS["bfloat16-mmla"] + DOT_KERNELS["bfloat16-tile"]
    dtypes = ((np.float32, np.float32), (BF16, np.float32), (np.float16, np.float32), (np.float64, np.float64))
    for dt, ct in dtypes[1:2] if family in dot else dtypes:     # (a dot family's own products: bfloat16)
        for T, d, f, N, g in ((7, 5, 3, 11, 3), (40, 130, 70, 160, 5), (90, 33, 40, 1100, 2)):
            x = rng.standard_normal((T, d)).astype(dt)
            idx = rng.integers(0, T, N).astype(np.int64)
            dh = rng.standard_normal((N, f)).astype(dt)
            sizes = rng.multinomial(N - 3, np.ones(g) / g)
            sizes[0] = 0
            bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            xs = x[idx]
            for threads in (1, 3):
                with runtime.configured(kernel=family, num_threads=threads):
                    for lhs, rhs, cols, rows, shape in ((x.T, dh, idx, None, (g, d, f)), (dh.T, x, None, idx, (g, f, d))):
                        plain_l, plain_r = (xs.T, dh) if cols is not None else (dh.T, xs)
                        want = np.zeros(shape, ct)
                        _core.ragged_contract(plain_l, plain_r, bounds, want, False)
                        got = np.full(shape, 7, ct)
                        _core.ragged_contract_gathered(lhs, rhs, bounds, got, False, cols, rows)
                        assert np.array_equal(_bits(got), _bits(want)), (family, dt, T, threads)
                        _core.ragged_contract(plain_l, plain_r, bounds, want, True)
                        _core.ragged_contract_gathered(lhs, rhs, bounds, got, True, cols, rows)
                        assert np.array_equal(_bits(got), _bits(want)), (family, dt, T, threads, "accumulate")
    x = np.ones((6, 4), np.float32)
    dh = np.ones((5, 3), np.float32)
    out = np.zeros((1, 4, 3), np.float32)
    b = np.array([0, 5], np.int64)
    i = np.array([0, 1, 2, 3, 5], np.int64)
    with pytest.raises(TypeError, match="one index"):
        _core.ragged_contract_gathered(x.T, dh, b, out, False, i, i)
    with pytest.raises(TypeError, match="one index"):
        _core.ragged_contract_gathered(x.T, dh, b, out, False, None, None)
    with pytest.raises(ValueError, match="lhs_cols"):
        _core.ragged_contract_gathered(x.T, dh, b, out, False, np.array([0, 1, 2, 3, 6]), None)
    with pytest.raises(ValueError, match="disagree"):
        _core.ragged_contract_gathered(x.T, dh[:4], b, out, False, i, None)
    with pytest.raises(TypeError, match="not quantized"):
        _core.ragged_contract_gathered((x.T.astype(np.int8), np.ones((1, 1), np.float32), None), dh, b, out, False,
                                       i, None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rows_read_through_an_index_times_their_scales_give_the_scaled_arrays_bits(rng, dtype):
    """The backward's cotangent rows d_y[i] = w[i] * d_out[tokens[i]], read
    through the index with their scales while packed (gated_grad_rows with
    rows and row_scale, ragged_contract_gathered with rhs_row_scale): the
    bits of the products of the gathered, scaled array, at 1 and 3 threads,
    past KC (k 600); and the refusals."""
    from raggeddot import _core
    T, N, k, f, g = 30, 90, 600, 40, 4
    d_out = rng.standard_normal((T, k)).astype(dtype)
    idx = rng.integers(0, T, N).astype(np.int64)
    w = rng.random(N).astype(dtype)
    dy = w[:, None] * d_out[idx]
    sizes = rng.multinomial(N, np.ones(g) / g)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    wo_t = rng.standard_normal((g, k, f)).astype(dtype)
    h0, h1 = (rng.standard_normal((N, f)).astype(dtype) for _ in range(2))
    a = rng.standard_normal((N, f)).astype(dtype)
    for threads in (1, 3):
        with runtime.configured(num_threads=threads):
            want = [np.empty((N, f), dtype) for _ in range(2)]
            _core.gated_grad_rows(dy, wo_t, bounds, h0, h1, *want, 0, 1.0, 1.0)
            got = [np.full((N, f), 7, dtype) for _ in range(2)]
            _core.gated_grad_rows(d_out, wo_t, bounds, h0, h1, *got, 0, 1.0, 1.0, idx, w)
            for x, y in zip(got, want):
                assert np.array_equal(_bits(x), _bits(y)), threads
            want_c = np.zeros((g, f, k), dtype)
            _core.ragged_contract(a.T, dy, bounds, want_c, False)
            got_c = np.full((g, f, k), 7, dtype)
            _core.ragged_contract_gathered(a.T, d_out, bounds, got_c, False, None, idx, w)
            assert np.array_equal(_bits(got_c), _bits(want_c)), threads
    bad = [
        (lambda: _core.gated_grad_rows(d_out, wo_t, bounds, h0, h1, *got, 0, 1.0, 1.0, None, w), "'rows' gathers"),
        (lambda: _core.gated_grad_rows(d_out, wo_t, bounds, h0, h1, *got, 0, 1.0, 1.0, idx, w[:-1]), "row_scale"),
        (lambda: _core.gated_grad_rows(d_out.astype(BF16), wo_t.astype(BF16), bounds, *(x.astype(BF16) for x in
                                       (h0, h1, *got)), 0, 1.0, 1.0, idx, w), "not 16-bit"),
        (lambda: _core.ragged_contract_gathered(d_out.T, a, bounds, np.zeros((g, k, f), dtype), False, idx, None,
                                                w), "'rhs_rows'"),
        (lambda: _core.ragged_contract_gathered(a.T, d_out, bounds, got_c, False, None, idx, w.astype(np.float16)),
         "rhs_row_scale"),
    ]
    for call, message in bad:
        with pytest.raises((ValueError, TypeError), match=message):
            call()
