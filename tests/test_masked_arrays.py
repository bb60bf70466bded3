"""numpy.ma masked arrays are refused by every public op, with a TypeError
naming the function and the argument (item 8): the kernels read the data
and would ignore the mask, where NumPy's own matmul honours or refuses it."""
import functools

import numpy as np
import pytest

import raggeddot
from raggeddot import RaggedDotDimensionNumbers as DN


def _m(a):
    mask = np.zeros(np.shape(a), bool)
    mask.flat[0] = True
    return np.ma.masked_array(a, mask=mask)


def _calls(rng):
    lhs = rng.standard_normal((6, 3)).astype(np.float32)
    rhs = rng.standard_normal((2, 3, 4)).astype(np.float32)
    gs = np.array([2, 3])
    y = rng.standard_normal((6, 4)).astype(np.float32)
    idx = np.array([0, 2, 1])
    x = rng.standard_normal((3, 4)).astype(np.float32)
    router = rng.standard_normal((4, 3)).astype(np.float32)
    w0 = rng.standard_normal((3, 4, 5)).astype(np.float32)
    wo = rng.standard_normal((3, 5, 4)).astype(np.float32)
    dn = DN((([1], [1]), ([], [])), [0], [0])
    moe = functools.partial(raggeddot.moe_block, top_k=2)
    return [
        ("ragged_dot", raggeddot.ragged_dot, [lhs, rhs, gs], ["lhs", "rhs", "group_sizes"]),
        ("gmm", raggeddot.gmm, [lhs, rhs, gs], ["lhs", "rhs", "group_sizes"]),
        ("tgmm", raggeddot.tgmm, [lhs.T, y, gs], ["lhs", "rhs", "group_sizes"]),
        ("ragged_dot_general", functools.partial(raggeddot.ragged_dot_general, ragged_dot_dimension_numbers=dn),
         [lhs, rhs, gs], ["lhs", "rhs", "group_sizes"]),
        ("ragged_gather", raggeddot.ragged_gather, [x, idx, np.ones(3, np.float32)], ["x", "indices", "weights"]),
        ("ragged_gather_reduce", raggeddot.ragged_gather_reduce, [y, np.array([[0, 1], [2, 3], [4, 5]]),
                                                                  np.ones((3, 2), np.float32)],
         ["y", "indices", "weights"]),
        ("moe_block", moe, [x, router, w0, w0, wo], ["x", "router_weights", "w0", "w1", "wo"]),
        ("prepack", raggeddot.prepack, [rhs], ["rhs"]),
        ("quantize", functools.partial(raggeddot.quantize, qtype="int8"), [rhs], ["x"]),
    ]


def test_public_ops_refuse_masked_arrays(rng):
    for fn, call, args, names in _calls(rng):
        call(*args)                     # as plain arrays: fine
        for i, name in enumerate(names):
            bad = list(args)
            bad[i] = _m(args[i])
            with pytest.raises(TypeError) as info:
                call(*bad)
            msg = str(info.value)
            assert msg.startswith(f"{fn}: '{name}'") and "masked" in msg and ".filled(" in msg, (fn, name, msg)


def test_out_and_existing_out_refuse_masked_arrays(rng):
    lhs = rng.standard_normal((6, 3)).astype(np.float32)
    rhs = rng.standard_normal((2, 3, 4)).astype(np.float32)
    gs = np.array([2, 3])
    with pytest.raises(TypeError, match="^ragged_dot: 'out'.*masked"):
        raggeddot.ragged_dot(lhs, rhs, gs, out=_m(np.zeros((6, 4), np.float32)))
    with pytest.raises(TypeError, match="^gmm: 'existing_out'.*masked"):
        raggeddot.gmm(lhs, rhs, gs, existing_out=_m(np.zeros((6, 4), np.float32)))
