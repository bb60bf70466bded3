"""out= of ragged_dot, gmm and tgmm: the result is written into the caller's
array, equal to the result without it, and bad buffers are refused."""
import numpy as np
import pytest

import raggeddot
from raggeddot import reference

from helpers import FLOATS, assert_allclose, assert_unchanged, dtype_id, randn, snapshot


def nan_like(a):
    return np.full_like(a, np.nan)


def check_into(make, expected):
    """make(out) returns out, holding exactly `expected`, whatever out held."""
    out = nan_like(expected)
    got = make(out)
    assert got is out
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_out_equals_the_returned_result(rng, dtype):
    m, k, n = 50, 12, 40
    gs = np.array([9, 0, 20, 4, 0])  # empty groups and 17 tail rows
    lhs = randn(rng, (m, k), dtype)
    rhs = randn(rng, (5, k, n), dtype)
    ct = randn(rng, (m, n), dtype)
    check_into(lambda o: raggeddot.ragged_dot(lhs, rhs, gs, out=o), raggeddot.ragged_dot(lhs, rhs, gs))
    check_into(lambda o: raggeddot.ragged_dot(lhs, rhs[1:3], gs, group_offset=1, out=o),
               raggeddot.ragged_dot(lhs, rhs[1:3], gs, group_offset=1))
    check_into(lambda o: raggeddot.gmm(lhs, rhs, gs, out=o), raggeddot.gmm(lhs, rhs, gs))
    w_t = np.ascontiguousarray(rhs.transpose(0, 2, 1))
    check_into(lambda o: raggeddot.gmm(lhs, w_t, gs, transpose_rhs=True, out=o),
               raggeddot.gmm(lhs, w_t, gs, transpose_rhs=True))
    check_into(lambda o: raggeddot.gmm(lhs, rhs[2:4], gs, group_offset=2, out=o),
               raggeddot.gmm(lhs, rhs[2:4], gs, group_offset=2))
    check_into(lambda o: raggeddot.tgmm(lhs.T, ct, gs, out=o), raggeddot.tgmm(lhs.T, ct, gs))
    check_into(lambda o: raggeddot.tgmm(lhs.T, ct, gs, group_offset=1, num_actual_groups=3, out=o),
               raggeddot.tgmm(lhs.T, ct, gs, group_offset=1, num_actual_groups=3))
    want = reference.tgmm(lhs.T, ct, gs)
    out = nan_like(want)
    raggeddot.tgmm(lhs.T, ct, gs, out=out)
    assert_allclose(out, want)


def test_out_with_existing_out(rng):
    m, k, n = 30, 6, 10
    gs = np.array([10, 0, 12])
    lhs = randn(rng, (m, k), np.float64)
    rhs = randn(rng, (3, k, n), np.float64)
    ct = randn(rng, (m, n), np.float64)
    # a separate out: existing_out is read, never written
    e = randn(rng, (3, k, n), np.float64)
    e0 = e.copy()
    check_into(lambda o: raggeddot.tgmm(lhs.T, ct, gs, existing_out=e, out=o),
               raggeddot.tgmm(lhs.T, ct, gs, existing_out=e))
    np.testing.assert_array_equal(e, e0)
    # out is existing_out: accumulation in place
    want = raggeddot.tgmm(lhs.T, ct, gs, existing_out=e)
    assert raggeddot.tgmm(lhs.T, ct, gs, existing_out=e, out=e) is e
    np.testing.assert_array_equal(e, want)
    # gmm: rows not computed keep existing_out's values, in place too
    eg = randn(rng, (m, n), np.float64)
    want = raggeddot.gmm(lhs, rhs[1:], gs, group_offset=1, existing_out=eg)
    assert raggeddot.gmm(lhs, rhs[1:], gs, group_offset=1, existing_out=eg, out=eg) is eg
    np.testing.assert_array_equal(eg, want)


def test_out_strided_and_half_precision(rng):
    m, k, n = 40, 8, 24
    gs = np.array([15, 5, 20])
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (3, k, n), np.float32)
    want = raggeddot.ragged_dot(lhs, rhs, gs)
    # a transposed (Fortran-ordered) view and a column slice
    out_t = np.full((n, m), np.nan, np.float32).T
    assert raggeddot.ragged_dot(lhs, rhs, gs, out=out_t) is out_t
    np.testing.assert_array_equal(out_t, want)
    big = np.full((m, 2 * n), np.nan, np.float32)
    raggeddot.ragged_dot(lhs, rhs, gs, out=big[:, ::2])
    np.testing.assert_array_equal(big[:, ::2], want)
    assert np.isnan(big[:, 1::2]).all()  # the columns between are untouched
    # float16 results are computed in float32 and written once, rounded
    want16 = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float16)
    check_into(lambda o: raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float16, out=o), want16)


def _op_call(op, rng, arrays=None):
    """(call(**kw), out shape, {input name: array}) of a small problem of `op`;
    `arrays` replaces inputs by name."""
    m, k, n = 12, 4, 6
    gs = np.array([5, 7])
    if op == "tgmm":
        inputs = {"lhs": randn(rng, (k, m), np.float32), "rhs": randn(rng, (m, n), np.float32)}
        shape = (2, k, n)
    else:
        inputs = {"lhs": randn(rng, (m, k), np.float32), "rhs": randn(rng, (2, k, n), np.float32)}
        shape = (m, n)
    inputs.update(arrays or {})
    fn = getattr(raggeddot, op)
    return (lambda **kw: fn(inputs["lhs"], inputs["rhs"], gs, **kw)), shape, inputs


@pytest.mark.parametrize("op", ["ragged_dot", "gmm", "tgmm"])
def test_bad_out_is_refused_and_names_it(rng, op):
    call, shape, inputs = _op_call(op, rng)
    good = np.zeros(shape, np.float32)
    readonly = good.copy()
    readonly.flags.writeable = False
    repeated = np.lib.stride_tricks.as_strided(good, shape, (0,) * len(shape), writeable=True)
    bad = [
        ([0.0] * 3, TypeError, "'out' must be a numpy.ndarray"),
        (np.zeros(shape[:-1] + (shape[-1] + 1,), np.float32), ValueError, "'out' must have shape"),
        (np.zeros(shape, np.float64), TypeError, "'out' must have the result's dtype float32"),
        (readonly, ValueError, "'out' is read-only"),
        (good.astype(good.dtype.newbyteorder()), ValueError, "native byte order"),
        (repeated, ValueError, "repeat"),
    ]
    for out, exc, match in bad:
        with pytest.raises(exc, match=match):
            call(out=out)
    # an out whose memory overlaps an input's by one element
    for name, arr in inputs.items():
        size = int(np.prod(shape))
        buf = np.zeros(arr.size + size, np.float32)
        shared = buf[:arr.size].reshape(arr.shape)
        shared[...] = arr
        call2, _, _ = _op_call(op, rng, {name: shared})
        with pytest.raises(ValueError, match=f"'out' shares memory with '{name}'"):
            call2(out=buf[arr.size - 1:arr.size - 1 + size].reshape(shape))


def test_out_partly_overlapping_existing_out_is_refused(rng):
    lhs = randn(rng, (10, 3), np.float64)
    ct = randn(rng, (10, 4), np.float64)
    gs = np.array([4, 6])
    e = np.zeros((3, 3, 4))
    with pytest.raises(ValueError, match="partly overlaps 'existing_out'"):
        raggeddot.tgmm(lhs.T, ct, gs, existing_out=e[:2], out=e[1:])


def test_out_leaves_inputs_unchanged(rng):
    lhs = randn(rng, (20, 5), np.float32)
    rhs = randn(rng, (2, 5, 7), np.float32)
    ct = randn(rng, (20, 7), np.float32)
    gs = np.array([8, 9])
    inputs = (lhs, rhs, ct, gs)
    copies = snapshot(inputs)
    raggeddot.ragged_dot(lhs, rhs, gs, out=np.empty((20, 7), np.float32))
    raggeddot.gmm(lhs, rhs, gs, out=np.empty((20, 7), np.float32))
    raggeddot.tgmm(lhs.T, ct, gs, out=np.empty((2, 5, 7), np.float32))
    assert_unchanged(inputs, copies, ["lhs", "rhs", "ct", "group_sizes"])
