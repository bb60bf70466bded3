"""Every C entry point on small inputs, each kernel family, each storage dtype,
the streaming path and the error paths: the set `.ci/sanitize` runs under
AddressSanitizer and UndefinedBehaviorSanitizer (it also runs in the ordinary
suite, where it checks the results against the oracle)."""
import os

import numpy as np
import pytest

import raggeddot
from raggeddot import _core, reference, runtime

ml_dtypes = pytest.importorskip("ml_dtypes")


def test_the_sanitized_build_is_the_one_under_test():
    """Under .ci/sanitize the extension must be the instrumented copy, with
    the sanitizer runtime loaded; elsewhere this states which build runs."""
    with open("/proc/self/maps") as f:
        maps = f.read()
    if os.environ.get("RAGGEDDOT_SANITIZED_BUILD") == "1":
        assert "libasan" in maps and "libubsan" in maps
        lib = os.environ["PYTHONPATH"].split(os.pathsep)[0]
        assert os.path.realpath(_core.__file__).startswith(os.path.realpath(lib))
    else:
        assert "libasan" not in maps


SHAPES = [(1, 1, 1, 1), (13, 7, 33, 3), (40, 257, 65, 4)]


@pytest.mark.parametrize("kernel", runtime.runnable_kernels())
@pytest.mark.parametrize("m,k,n,g", SHAPES)
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64],
                         ids=lambda d: np.dtype(d).name)
def test_grouped_products_every_kernel(rng, kernel, m, k, n, g, dtype):
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs = rng.standard_normal((g, k, n)).astype(dtype)
    gs = np.diff(np.sort(np.concatenate([[0, max(0, m - 2)], rng.integers(0, m, g - 1)])))[:g]
    gs = np.concatenate([gs, np.zeros(g - gs.size, dtype=gs.dtype)]).astype(np.int64)
    ct = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    with runtime.configured(kernel=kernel, stream_threshold=0):
        out = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=ct)
        d_rhs = raggeddot.tgmm(lhs.T, out.astype(dtype), gs, preferred_element_type=ct)
        acc = raggeddot.tgmm(lhs.T, out.astype(dtype), gs, preferred_element_type=ct,
                             existing_out=d_rhs)
    lhs64, rhs64 = lhs.astype(np.float64), rhs.astype(np.float64)
    want = reference.ragged_dot(lhs64, rhs64, gs)
    tol = 1e-10 if ct == np.float64 else 1e-4
    assert np.max(np.abs(out - want), initial=0) <= tol * max(1.0, np.max(np.abs(want), initial=0))
    want_t = reference.tgmm(lhs64.T, out.astype(dtype).astype(np.float64), gs)
    scale = max(1.0, np.max(np.abs(want_t), initial=0))
    assert np.max(np.abs(d_rhs - want_t), initial=0) <= tol * scale
    assert np.max(np.abs(acc - 2 * want_t), initial=0) <= 2 * tol * scale


@pytest.mark.parametrize("activation", sorted(_core.ACTIVATIONS))
@pytest.mark.parametrize("score_func", sorted(_core.SCORE_FUNCS))
def test_moe_pieces(rng, activation, score_func):
    T, d, f, E = 9, 8, 6, 4
    x = rng.standard_normal((T, d))
    args = (x, rng.standard_normal((d, E)), rng.standard_normal((E, d, f)),
            rng.standard_normal((E, d, f)), rng.standard_normal((E, f, d)))
    kw = dict(top_k=2, score_func=score_func, activation=activation, n_groups=2, topk_groups=1,
              capacity_factor=1.0, selection_bias=rng.standard_normal(E))
    out = raggeddot.moe_block(*args, **kw)
    want = reference.moe_block(*args, **kw)
    assert np.max(np.abs(out - want)) <= 1e-10 * max(1.0, np.max(np.abs(want)))
    _, vjp_fn = raggeddot.moe_block_vjp(*args, **kw)
    grads = vjp_fn(np.ones_like(out))
    assert all(np.isfinite(g).all() for g in grads.values() if isinstance(g, np.ndarray))


def test_metadata_and_gathers(rng):
    gs = np.array([3, 0, 5, 1], dtype=np.int64)
    got = raggeddot.make_group_metadata(group_sizes=gs, m=12, tm=4)
    want = reference.make_group_metadata(group_sizes=gs, m=12, tm=4)
    for a, b in zip(got[0], want[0]):
        assert np.array_equal(a, b)
    assert got[1] == want[1]
    x = rng.standard_normal((5, 3)).astype(np.float32)
    idx = np.array([4, 0, 0, 2])
    assert np.array_equal(raggeddot.ragged_gather(x, idx), x[idx])
    slots = np.array([[0, -1], [3, 1]])
    y = raggeddot.ragged_gather_reduce(x[idx], slots)
    assert np.allclose(y, [x[4], x[2] + x[0]])


@pytest.mark.parametrize("call, exc", [
    (lambda: _core.ragged_rows(np.zeros((2, 2)), np.zeros((1, 2, 2)), np.array([0, 3]),
                               np.zeros((2, 2)), False), ValueError),
    (lambda: _core.ragged_contract(np.zeros((2, 2)), np.zeros((3, 2)), np.array([0, 2]),
                                   np.zeros((1, 2, 2)), False), ValueError),
    (lambda: _core.gather_rows(np.zeros((2, 2)), np.array([2]), None), ValueError),
    (lambda: _core.gather_reduce(np.zeros((2, 2)), np.array([[-2]]), None), ValueError),
    (lambda: _core.moe_sort(np.array([[5]]), 4, -1), ValueError),
    (lambda: _core.moe_route(np.zeros((2, 4)), 0, None, 1, 1, 5, False, 1.0), ValueError),
    (lambda: _core.gated_act(np.zeros(3), np.zeros(4), 0, 7.0), ValueError),
    (lambda: _core.gated_act(np.zeros(3), np.zeros(3), 9, 7.0), ValueError),
    (lambda: _core.make_group_metadata(np.array([-1]), 4, 2, 0, 1, True), ValueError),
    (lambda: _core.empty((2, -1), np.dtype(np.float32)), ValueError),
    (lambda: _core.empty((1 << 62, 1 << 62), np.dtype(np.float32)), MemoryError),
    (lambda: _core.fma_peak(0, 0.1, "avx2"), ValueError),
])
def test_binding_error_paths(call, exc):
    with pytest.raises(exc):
        call()
