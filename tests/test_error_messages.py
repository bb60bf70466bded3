"""Messages of errors a new user meets: an allocation that does not fit
names the function, what it was allocating, the shape, dtype and bytes;
a non-array argument names what was received; vjp's docstring lists the
functions it differentiates."""
import re

import numpy as np
import pytest

import raggeddot
from raggeddot import _autodiff, _core

# 2^40 rows of one value each: a broadcast view, no memory behind it
BIG_ROWS = np.broadcast_to(np.zeros((1, 1), np.float32), (2 ** 40, 1))
RESULT = r"(\d+) bytes .*shape \((\d+), (\d+)(?:, (\d+))?\) and dtype (float32|float64)"


def _check_named(message, fn, what, shape, dtype):
    assert message.startswith(f"{fn}: out of memory for {what}"), message
    m = re.search(RESULT, message)
    assert m, message
    got_shape = tuple(int(s) for s in m.groups()[1:4] if s is not None)
    assert got_shape == shape and m.group(5) == dtype
    assert int(m.group(1)) == np.prod(shape, dtype=object) * np.dtype(dtype).itemsize


def test_tgmm_result_that_does_not_fit():
    """The case of the report: [10^6, 10^4, 10^4] float32 (400 TB)."""
    with pytest.raises(MemoryError) as e:
        raggeddot.tgmm(np.zeros((10000, 1), np.float32), np.zeros((1, 10000), np.float32),
                       np.zeros(10 ** 6, np.int64))
    _check_named(str(e.value), "tgmm", "the result [num_actual_groups, k, n]", (10 ** 6, 10000, 10000),
                 "float32")


@pytest.mark.parametrize("op", ["ragged_dot", "gmm"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ragged_dot_and_gmm_results(op, dtype):
    rhs = np.zeros((1, 1, 1024), np.float32)
    with pytest.raises(MemoryError) as e:
        getattr(raggeddot, op)(BIG_ROWS, rhs, np.array([2 ** 40]), preferred_element_type=dtype)
    _check_named(str(e.value), op, "the result [m, n]", (2 ** 40, 1024), dtype)


def test_ragged_dot_general_result():
    dn = raggeddot.RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0])
    with pytest.raises(MemoryError, match=r"^ragged_dot_general: out of memory for the result .*"
                                          r"1099511627776, 1024.*float32"):
        raggeddot.ragged_dot_general(BIG_ROWS, np.zeros((1, 1, 1024), np.float32), np.array([2 ** 40]), dn)


def test_moe_block_activations():
    x = np.broadcast_to(np.zeros(4, np.float32), (2 ** 40, 4))
    w = np.zeros((4, 4, 3), np.float32)
    with pytest.raises(MemoryError, match=r"^moe_block: out of memory for the layer's activations.*"
                                          r"1099511627776, 4.*float32"):
        raggeddot.moe_block(x, np.zeros((4, 4), np.float32), w, w, np.zeros((4, 3, 4), np.float32), top_k=2)


def test_core_empty_states_shape_dtype_bytes():
    with pytest.raises(MemoryError, match=r"^cannot allocate 4503599627370496 bytes \(4294967296 MiB\) for "
                                          r"an array of shape \(1099511627776, 1024\) and dtype float32: more "
                                          r"than this machine's memory \(\d+ bytes\)$"):
        _core.empty((2 ** 40, 1024), np.dtype(np.float32))
    with pytest.raises(MemoryError, match=r"shape \(1099511627776, 1099511627776, 8\) and dtype float64: it "
                                          r"needs more bytes than memory can hold"):
        _core.empty((2 ** 40, 2 ** 40, 8), np.dtype(np.float64))


@pytest.mark.parametrize("call, pattern", [
    (lambda rhs, gs: raggeddot.ragged_dot("abc", rhs, gs), r"'lhs' must be a numeric array, got str 'abc'"),
    (lambda rhs, gs: raggeddot.ragged_dot(np.ones((4, 3)), None, gs), r"'rhs' must be an array, got None"),
    (lambda rhs, gs: raggeddot.ragged_dot(np.ones((4, 3)), rhs, None), r"'group_sizes' must be an array, got None"),
    (lambda rhs, gs: raggeddot.gmm(np.array(["a", "b"]), rhs, gs),
     r"'lhs' must be a numeric array, got an array of dtype str\d*|<U1 and shape \(2,\)"),
    (lambda rhs, gs: raggeddot.tgmm(np.ones((3, 4)), {"a": 1}, gs), r"'rhs' must be a numeric array, got dict"),
    (lambda rhs, gs: raggeddot.ragged_gather(None, np.array([0])), r"'x' must be an array, got None"),
])
def test_non_arrays_name_what_was_received(call, pattern):
    with pytest.raises(TypeError, match=pattern):
        call(np.ones((2, 3, 2)), np.array([2, 2]))


def test_vjp_docstring_lists_what_its_error_lists():
    """Every function vjp's error message offers is named in vjp's, jvp's
    and grad's docstrings (grad and jvp defer to vjp's list)."""
    with pytest.raises(TypeError) as e:
        raggeddot.vjp(np.sum, np.ones(3))
    offered = re.findall(r"raggeddot\.(\w+)", str(e.value).split("so the differentiable functions are")[1]
                         .split(", or a functools.partial")[0])
    assert set(offered) >= {"ragged_dot", "gmm", "tgmm", "ragged_dot_general", "ragged_gather",
                            "ragged_gather_reduce", "moe_block"}
    for name in offered:
        assert re.search(rf"``(raggeddot\.)?{name}``", _autodiff.vjp.__doc__), name
    assert "as for :func:`vjp`" in _autodiff.jvp.__doc__ and "as for :func:`vjp`" in _autodiff.grad.__doc__
    # and jvp has a rule for every one of them
    for name in offered:
        assert getattr(raggeddot, name) in _autodiff._JVP_RULES, name
