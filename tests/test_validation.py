"""Argument validation of raggeddot.ragged_dot (make_group_metadata's is in
test_metadata.py, gmm's and tgmm's in test_megablox.py).

Every error is raised before any computation, names the offending argument,
and leaves the inputs unmodified.
"""

import re

import numpy as np
import pytest

import raggeddot

from helpers import assert_unchanged, snapshot


def _args(m=10, k=4, n=3, g=2, dtype=np.float32, sizes=None):
    rng = np.random.default_rng(m * 1000 + k * 100 + n * 10 + g)
    lhs = rng.standard_normal((m, k)).astype(dtype)
    rhs = rng.standard_normal((g, k, n)).astype(dtype)
    if sizes is None:
        sizes = [m // g] * g
    return lhs, rhs, np.asarray(sizes, dtype=np.int32)


def raises(exc_type, *patterns):
    """Context manager: raises exc_type whose message matches every pattern."""
    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(exc_type)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *exc):
            suppressed = self.cm.__exit__(*exc)
            if suppressed:
                msg = str(self.info.value)
                for p in patterns:
                    assert re.search(p, msg), (
                        f"{exc_type.__name__} message {msg!r} does not match {p!r}")
            return suppressed
    return _Ctx()


# ---------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(10,), (2, 5, 4), (), (1, 10, 4)])
def test_lhs_not_2d(shape):
    _, rhs, gs = _args()
    lhs = np.ones(shape, np.float32)
    with raises(ValueError, "lhs"):
        raggeddot.ragged_dot(lhs, rhs, gs)


@pytest.mark.parametrize("shape", [(4, 3), (2, 4, 3, 1), (3,), ()])
def test_rhs_not_3d(shape):
    lhs, _, gs = _args()
    rhs = np.ones(shape, np.float32)
    with raises(ValueError, "rhs"):
        raggeddot.ragged_dot(lhs, rhs, gs)


@pytest.mark.parametrize("m", [10, 0])
def test_contracting_dim_mismatch(m):
    lhs, _, _ = _args(m=m, k=4)
    _, rhs, _ = _args(m=m, k=5)
    gs = np.array([0, m], np.int32)
    with raises(ValueError, "lhs", "rhs"):
        raggeddot.ragged_dot(lhs, rhs, gs)


@pytest.mark.parametrize("gs", [np.array(5, np.int32), np.array([[5, 5]], np.int32),
                                np.zeros((2, 1), np.int32)], ids=["0d", "1x2", "2x1"])
def test_group_sizes_not_1d(gs):
    lhs, rhs, _ = _args()
    with raises(ValueError, "group_sizes"):
        raggeddot.ragged_dot(lhs, rhs, gs)


@pytest.mark.parametrize("gs", [[10], [5, 5, 0], []], ids=["short", "long", "empty"])
def test_group_sizes_length_mismatch(gs):
    lhs, rhs, _ = _args(g=2)
    with raises(ValueError, "group_sizes"):
        raggeddot.ragged_dot(lhs, rhs, np.array(gs, np.int32))


@pytest.mark.parametrize("offset,g_local", [(-1, 2), (4, 2), (5, 1), (0, 6), (2, 4), (6, 0), (-5, 5)])
def test_group_offset_out_of_range(offset, g_local):
    # 5 groups in group_sizes; rhs holds g_local of them.
    lhs, rhs, _ = _args(g=max(g_local, 1))
    rhs = rhs[:g_local] if g_local else np.ones((0, 4, 3), np.float32)
    gs = np.array([2, 2, 2, 2, 2], np.int32)
    if 0 <= offset and offset + g_local <= 5:
        pytest.fail("bad parametrization")
    with raises(ValueError, "group_offset"):
        raggeddot.ragged_dot(lhs, rhs, gs, group_offset=offset)


# ---------------------------------------------------------------------------
# group_sizes values and dtype
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.bool_, np.complex64],
                         ids=lambda d: np.dtype(d).name)
def test_group_sizes_non_integer_dtype(dtype):
    lhs, rhs, _ = _args(g=2)
    gs = np.array([1, 1]).astype(dtype)
    with raises(TypeError, "group_sizes"):
        raggeddot.ragged_dot(lhs, rhs, gs)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("sizes", [[-1, 5], [5, -2, 3], [0, 0, -1], [-128, 127, 1]],
                         ids=["first", "middle-sum-ok", "last", "cancelling"])
def test_group_sizes_negative(dtype, sizes):
    lhs, rhs, _ = _args(g=len(sizes))
    with raises(ValueError, "group_sizes", "negative"):
        raggeddot.ragged_dot(lhs, rhs, np.array(sizes).astype(dtype))


@pytest.mark.parametrize("m,sizes", [(10, [6, 5]), (0, [1, 0]), (10, [11]), (7, [0, 0, 8]),
                                     (10, [2 ** 31 - 1, 1])])
def test_group_sizes_sum_exceeds_m(m, sizes):
    lhs, rhs, _ = _args(m=m, g=len(sizes))
    gs = np.array(sizes, np.int64)
    msg = f"sum(group_sizes)={sum(sizes)} exceeds lhs.shape[0]={m}"
    with raises(ValueError, re.escape(msg)):
        raggeddot.ragged_dot(lhs, rhs, gs)


@pytest.mark.parametrize("dtype,sizes", [
    (np.int32, [2 ** 31 - 1, 2 ** 31 - 1, 4]),      # wraps to a small value in int32
    (np.uint64, [2 ** 63, 2 ** 63]),                 # wraps to 0 in uint64
    (np.uint32, [2 ** 32 - 1, 3]),                   # wraps to 2 in uint32
    (np.int64, [2 ** 62, 2 ** 62, 2 ** 62, 2 ** 62 + 5]),  # wraps in int64
], ids=["int32", "uint64", "uint32", "int64"])
def test_group_sizes_sum_overflow_is_not_wrapped(dtype, sizes):
    lhs, rhs, _ = _args(m=10, g=len(sizes))
    gs = np.array(sizes, dtype=dtype)
    with raises(ValueError, "group_sizes", "exceeds", re.escape("lhs.shape[0]=10")):
        raggeddot.ragged_dot(lhs, rhs, gs)


def test_group_sizes_huge_single_entry():
    lhs, rhs, _ = _args(m=10, g=2)
    for gs in (np.array([2 ** 40, 0], np.int64), np.array([0, 2 ** 64 - 1], np.uint64)):
        with raises(ValueError, "exceeds"):
            raggeddot.ragged_dot(lhs, rhs, gs)


# ---------------------------------------------------------------------------
# Value dtypes
# ---------------------------------------------------------------------------

BAD_DTYPES = [np.int8, np.int32, np.int64, np.uint8, np.bool_, np.complex64, np.complex128]


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=lambda d: np.dtype(d).name)
def test_unsupported_lhs_dtype(dtype):
    lhs, rhs, gs = _args()
    lhs = lhs.astype(dtype)
    with raises(TypeError, "lhs", np.dtype(dtype).name):
        raggeddot.ragged_dot(lhs, rhs, gs)


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=lambda d: np.dtype(d).name)
def test_unsupported_rhs_dtype(dtype):
    lhs, rhs, gs = _args()
    rhs = rhs.astype(dtype)
    with raises(TypeError, "rhs", np.dtype(dtype).name):
        raggeddot.ragged_dot(lhs, rhs, gs)


@pytest.mark.parametrize("which", ["lhs", "rhs"])
def test_object_arrays(which):
    lhs, rhs, gs = _args()
    if which == "lhs":
        lhs = lhs.astype(object)
    else:
        rhs = rhs.astype(object)
    with raises(TypeError):
        raggeddot.ragged_dot(lhs, rhs, gs)


@pytest.mark.parametrize("pet", [np.int32, np.int8, np.bool_, np.complex64, np.complex128, object],
                         ids=lambda d: np.dtype(d).name)
def test_preferred_element_type_not_float(pet):
    lhs, rhs, gs = _args()
    with raises(TypeError, "preferred_element_type"):
        raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=pet)


# ---------------------------------------------------------------------------
# A failed call leaves its inputs unmodified
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["sum", "negative", "offset", "k", "dtype", "pet"])
def test_failed_call_leaves_inputs_unmodified(case):
    lhs, rhs, gs = _args(m=12, k=5, n=7, g=3, dtype=np.float64, sizes=[4, 4, 4])
    kwargs = {}
    exc = ValueError
    if case == "sum":
        gs = np.array([4, 4, 5], np.int32)
    elif case == "negative":
        gs = np.array([4, -1, 4], np.int64)
    elif case == "offset":
        kwargs = {"group_offset": 2}
    elif case == "k":
        rhs = np.ascontiguousarray(rhs[:, :4])
    elif case == "dtype":
        rhs = rhs.astype(np.int32)
        exc = TypeError
    elif case == "pet":
        kwargs = {"preferred_element_type": np.int32}
        exc = TypeError
    lhs = np.asfortranarray(lhs)
    rhs_view = rhs[:, :, ::-1]
    inputs = (lhs, rhs_view, gs)
    before = snapshot(inputs)
    with pytest.raises(exc):
        raggeddot.ragged_dot(lhs, rhs_view, gs, **kwargs)
    assert_unchanged(inputs, before, [f"{name} ({case})" for name in ("lhs", "rhs", "group_sizes")])
    assert lhs.flags.f_contiguous
