"""Prepacked weights (raggeddot.prepack / PackedRhs): the same results as
the plain weights, bit for bit, in every op that takes weights, on every
kernel family; their memory; derivatives; the errors."""
import numpy as np
import pytest

import raggeddot
from raggeddot import RaggedDotDimensionNumbers as DN
from raggeddot import runtime

from helpers import DOT_KERNELS, DTYPES, KERNELS, dot_layout, dtype_id, random_group_sizes

SHAPES = [  # m, k, n, g: k across several KC blocks, n partial panels, empty groups
    (300, 70, 50, 16), (64, 1, 33, 8), (500, 600, 100, 7), (40, 300, 1, 3), (9, 257, 64, 1)]


def _case(rng, dtype, m, k, n, g):
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs = rng.standard_normal((g, k, n)).astype(dtype)
    gs = random_group_sizes(rng, g, m)
    gs[rng.random(g) < 0.3] = 0
    return lhs, rhs, gs


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_same_results_as_the_plain_weights(rng, dtype, kernel):
    with runtime.configured(kernel=kernel):
        for m, k, n, g in SHAPES:
            lhs, rhs, gs = _case(rng, dtype, m, k, n, g)
            packed = raggeddot.prepack(rhs)
            assert packed.shape == rhs.shape and packed.dtype == rhs.dtype and packed.kernel == kernel
            assert np.array_equal(packed.unpack(), rhs)
            want = raggeddot.ragged_dot(lhs, rhs, gs)
            got = raggeddot.ragged_dot(lhs, packed, gs)
            assert got.dtype == want.dtype and np.array_equal(got, want), (m, k, n, g)
            assert np.array_equal(raggeddot.gmm(lhs, packed, gs), raggeddot.gmm(lhs, rhs, gs))
            dn = DN((([1], [1]), ([], [])), [0], [0])
            assert np.array_equal(raggeddot.ragged_dot_general(lhs, packed, gs, dn),
                                  raggeddot.ragged_dot_general(lhs, rhs, gs, dn))
            # a transposed layout given to prepack, as gmm's transpose_rhs reads it
            rt = np.ascontiguousarray(rhs.transpose(0, 2, 1))
            pt = raggeddot.prepack(rt, transpose_rhs=True)
            assert np.array_equal(raggeddot.gmm(lhs, pt, gs), raggeddot.gmm(lhs, rt, gs, transpose_rhs=True))


@pytest.mark.parametrize("kernel", ["auto"] + DOT_KERNELS["bfloat16-dot"] + DOT_KERNELS["bfloat16-tile"]
                         + DOT_KERNELS["bfloat16-mmla"])
def test_bfloat16_weights_in_k_pairs(rng, kernel):
    """bfloat16 weights for a bfloat16 lhs are laid out in k-pairs for the
    bfloat16 dot-product or tile kernels where they serve (the widening layout
    elsewhere, and for lhs_dtype=float32): the same bits as the plain
    weights, unpack() gives them back, and a float32 lhs gets the plain
    weights' bits too."""
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    with runtime.configured(kernel=kernel):
        # the k-pair layout where vdpbf16ps or AMX tiles serve bfloat16 products,
        # Arm's blocks of 4 steps where BFMMLA does
        layout = dot_layout("bfloat16")
        unit = {"bfloat16-dot": 2, "bfloat16-mmla": 4}.get(layout, 1)
        for m, k, n, g in SHAPES + [(40, 1025, 33, 3)]:
            lhs, rhs, gs = _case(rng, bf16, m, k, n, g)
            packed = raggeddot.prepack(rhs)
            assert packed.ctype == (layout or "float32-bfloat16w")
            assert np.array_equal(packed.unpack(), rhs)
            want = raggeddot.ragged_dot(lhs, rhs, gs)
            assert np.array_equal(raggeddot.ragged_dot(lhs, packed, gs).view(np.uint16), want.view(np.uint16))
            assert packed.nbytes == g * -(-n // packed.nr) * packed.nr * 2 * sum(
                -(-min(packed.kc, k - p) // unit) * unit for p in range(0, k, packed.kc))
            lhs32 = lhs.astype(np.float32)
            # a float32 lhs: the widening layout, made once and kept (prepack's rule)
            assert np.array_equal(raggeddot.ragged_dot(lhs32, packed, gs), raggeddot.ragged_dot(lhs32, rhs, gs))
            wide = raggeddot.prepack(rhs, lhs_dtype=np.float32)
            assert wide.ctype == "float32-bfloat16w"
            assert np.array_equal(raggeddot.ragged_dot(lhs32, wide, gs), raggeddot.ragged_dot(lhs32, rhs, gs))
    with pytest.raises(TypeError, match="lhs_dtype"):
        raggeddot.prepack(rhs, lhs_dtype="int8")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_mixed_lhs_group_offset_and_threads(rng, dtype):
    lhs, rhs, gs = _case(rng, dtype, 400, 300, 70, 8)
    packed = raggeddot.prepack(rhs[2:6])
    want = raggeddot.ragged_dot(lhs, rhs[2:6], gs, group_offset=2)
    for threads in (1, 2, 3):
        with runtime.configured(num_threads=threads):
            assert np.array_equal(raggeddot.ragged_dot(lhs, packed, gs, group_offset=2), want)
    if dtype != np.float64:   # float32 accumulation: an lhs of another half/float32 dtype
        other = lhs.astype(np.float32)
        packed = raggeddot.prepack(rhs[2:6], lhs_dtype=np.float32)
        assert np.array_equal(raggeddot.ragged_dot(other, packed, gs, group_offset=2,
                                                   preferred_element_type=np.float32),
                              raggeddot.ragged_dot(other, rhs[2:6], gs, group_offset=2,
                                                   preferred_element_type=np.float32))


def test_memory_is_the_layout_only(rng):
    """bfloat16 weights keep 2 bytes an element (plus the padding of the last
    panel); the PackedRhs holds its own copy."""
    import ml_dtypes
    rhs = rng.standard_normal((4, 512, 256)).astype(ml_dtypes.bfloat16)
    packed = raggeddot.prepack(rhs, lhs_dtype=np.float32)
    assert packed.nbytes == rhs.nbytes
    rhs32 = rhs.astype(np.float32)
    assert raggeddot.prepack(rhs32).nbytes == rhs32.nbytes
    odd = raggeddot.prepack(rng.standard_normal((2, 10, 33)).astype(np.float32))
    nr = odd.nr
    assert odd.nbytes == 2 * 10 * (-(-33 // nr) * nr) * 4
    lhs = rng.standard_normal((64, 512)).astype(np.float32)
    gs = np.array([16, 16, 16, 16])
    want = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float32)
    rhs[...] = 0       # the packed copy does not depend on the array it came from
    assert np.array_equal(raggeddot.ragged_dot(lhs, packed, gs, preferred_element_type=np.float32), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=dtype_id)
def test_derivatives_are_those_of_the_weights(rng, dtype):
    lhs, rhs, gs = _case(rng, dtype, 120, 40, 24, 5)
    packed = raggeddot.prepack(rhs)
    ct = rng.standard_normal((120, 24)).astype(dtype)
    for op in (raggeddot.ragged_dot, raggeddot.gmm):
        out, vjp_fn = raggeddot.vjp(op, lhs, packed, gs)
        want_out, want_fn = raggeddot.vjp(op, lhs, rhs, gs)
        assert np.array_equal(out, want_out)
        (dl, dr, _), (wl, wr, _) = vjp_fn(ct), want_fn(ct)
        assert np.array_equal(dl, wl) and np.array_equal(dr, wr) and dr.shape == rhs.shape
        t_l, t_r = rng.standard_normal(lhs.shape).astype(dtype), rng.standard_normal(rhs.shape).astype(dtype)
        _, tan = raggeddot.jvp(op, (lhs, packed, gs), (t_l, t_r, None))
        _, want_tan = raggeddot.jvp(op, (lhs, rhs, gs), (t_l, t_r, None))
        assert np.array_equal(tan, want_tan)


def test_errors_name_what_is_wrong(rng):
    lhs, rhs, gs = _case(rng, np.float32, 64, 32, 16, 4)
    packed = raggeddot.prepack(rhs)
    with pytest.raises(ValueError, match="transpose_rhs"):
        raggeddot.gmm(lhs, packed, gs, transpose_rhs=True)
    with pytest.raises(ValueError, match="^ragged_dot: 'rhs' was prepacked for float32 products.*float64"):
        raggeddot.ragged_dot(lhs.astype(np.float64), packed, gs)
    with pytest.raises(ValueError, match="contracting"):
        raggeddot.ragged_dot(lhs[:, :10], packed, gs)
    with pytest.raises(ValueError, match="prepacked 'rhs'"):
        raggeddot.ragged_dot_general(lhs.T, packed, gs, DN((([0], [1]), ([], [])), [1], [0]))
    with pytest.raises(TypeError, match="'rhs'"):
        raggeddot.prepack(rhs.astype(np.int32))
    with pytest.raises(ValueError, match="'rhs'"):
        raggeddot.prepack(rhs[0])
    # a call's checks of a PackedRhs are kept while the selection stays: they
    # must not outlive a change of kernels, nor refuse it once restored
    want = raggeddot.ragged_dot(lhs, packed, gs)
    others = [k for k in runtime.runnable_kernels() if k != packed.kernel]
    for kernel in others:
        with runtime.configured(kernel=kernel):
            if raggeddot.prepack(rhs).nr != packed.nr:
                with pytest.raises(ValueError, match=r"^ragged_dot: 'rhs' was prepacked for the .* kernels.*prepack the weights again"):
                    raggeddot.ragged_dot(lhs, packed, gs)
    np.testing.assert_array_equal(raggeddot.ragged_dot(lhs, packed, gs), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_moe_block_with_prepacked_experts(rng, dtype):
    """moe_block and moe_block_vjp take prepacked w0, w1, wo ([E, d, f],
    [E, d, f], [E, f, d]): the same output and gradients, bit for bit."""
    T, d, f, E = 96, 40, 24, 6
    x = rng.standard_normal((T, d)).astype(dtype)
    rw = rng.standard_normal((d, E)).astype(dtype)
    w0, w1 = (rng.standard_normal((E, d, f)).astype(dtype) / 4 for _ in range(2))
    wo = rng.standard_normal((E, f, d)).astype(dtype) / 4
    p0, p1, po = (raggeddot.prepack(w) for w in (w0, w1, wo))
    kw = dict(top_k=2, norm_topk_prob=True)
    assert np.array_equal(raggeddot.moe_block(x, rw, p0, p1, po, **kw), raggeddot.moe_block(x, rw, w0, w1, wo, **kw))
    out, vjp_fn = raggeddot.moe_block_vjp(x, rw, p0, p1, po, **kw)
    want, want_fn = raggeddot.moe_block_vjp(x, rw, w0, w1, wo, **kw)
    assert np.array_equal(out, want)
    d_out = rng.standard_normal(out.shape).astype(dtype)
    got, exp = vjp_fn(d_out), want_fn(d_out)
    assert got.keys() == exp.keys()
    for name in exp:
        assert got[name].dtype == exp[name].dtype and np.array_equal(got[name], exp[name]), name
    with pytest.raises(ValueError, match="prepacked expert weights"):
        raggeddot.moe_block(x, rw, p0, w1, wo, **kw)


@pytest.mark.parametrize("shape", [(2, 0, 3), (2, 4, 0), (0, 4, 3)])
def test_empty_weights_give_the_plain_results(shape):
    """k = 0 (rows of a group become 0), n = 0 and no local groups, as with
    the plain array."""
    g, k, n = shape
    lhs = np.ones((5, k), np.float32)
    rhs = np.ones(shape, np.float32)
    gs = np.array([2, 2])
    off = 2 if g == 0 else None
    got = raggeddot.ragged_dot(lhs, raggeddot.prepack(rhs), gs, group_offset=off)
    assert np.array_equal(got, raggeddot.ragged_dot(lhs, rhs, gs, group_offset=off)) and got.shape == (5, n)
