"""raggeddot.ragged_dot_general against the NumPy oracle and against jax.

Cases are written with one letter per axis so that the layout of every operand
is visible at a glance:

    b, c  batch dims         m, p, q  lhs free dims     k, l  contracting dims
    n, o  rhs free dims      g        the rhs group dim (mode 1)

A case is (lhs axes, rhs axes, contracting letters in listed order, batch
letters in listed order, ragged letter). The mode follows from the kind of the
ragged letter: free (1), contracting (2) or batch (3).

The cases shared by every grouped matmul (group-size patterns, register and
cache blocks, empty dimensions, layouts, dtypes, kernels, threads, values
outside every group) run on one case of each mode in test_ops_suite.py.
"""

import dataclasses
import types

import numpy as np
import pytest

import raggeddot
from raggeddot import reference
from raggeddot import RaggedDotDimensionNumbers, ragged_dot_general

from helpers import (check_close, dtype_id, empty_group_patterns, prefixed_group_sizes,
                     random_group_sizes, randn, with_layout)

SIZES = dict(b=2, c=3, m=9, p=3, q=2, k=7, l=3, n=5, o=2)
NUM_GROUPS = 4

CASES = {
    # Mode 1: ragged non-contracting.
    "1_basic": ("mk", "gkn", "k", "", "m"),
    "1_lhs_transposed_group_mid": ("km", "kgn", "k", "", "m"),
    "1_batch": ("bmk", "gbkn", "k", "b", "m"),
    "1_inner_free": ("mpk", "gkn", "k", "", "m"),        # bounds scale by p
    "1_outer_free": ("pmk", "ngk", "k", "", "m"),        # p is a prefix dim
    "1_multi": ("bpmqkl", "lgbnko", "lk", "b", "m"),     # outer p, inner q, 2 contracting, 2 rhs free
    "1_batch_out_of_order": ("cmbk", "bgckn", "k", "bc", "m"),
    "1_contracting_first": ("kbmp", "gbkn", "k", "b", "p"),
    # Mode 2: ragged contracting.
    "2_basic": ("mk", "kn", "k", "", "k"),
    "2_tgmm": ("km", "kn", "k", "", "k"),                # d_rhs of the MoE forward
    "2_batch": ("bmk", "bkn", "k", "b", "k"),
    "2_inner_contracting": ("mkl", "lkn", "kl", "", "k"),
    "2_outer_contracting": ("mkl", "kln", "kl", "", "l"),  # k is a prefix dim
    "2_multi": ("lbmpk", "kbnlo", "lk", "b", "k"),
    "2_batch_out_of_order": ("cmkb", "bknc", "k", "cb", "k"),
    # Mode 3: ragged batch.
    "3_basic": ("bmk", "bkn", "k", "b", "b"),
    "3_second_batch": ("bcmk", "bckn", "k", "bc", "c"),
    "3_unmergeable": ("mbk", "kbn", "k", "b", "b"),      # lhs is not viewable as [b*m, k]
    "3_multi": ("cbmpkl", "lbcnk", "kl", "bc", "c"),
}


@dataclasses.dataclass
class Case:
    lhs_axes: str
    rhs_axes: str
    contract: str
    batch: str
    ragged: str

    @property
    def free(self):
        return [a for a in self.lhs_axes if a not in self.contract and a not in self.batch]

    @property
    def mode(self):
        if self.ragged in self.contract:
            return 2
        if self.ragged in self.batch:
            return 3
        return 1

    @property
    def prefix(self):
        """Letters of group_sizes' prefix dims, as jax defines them."""
        r = self.ragged
        if self.mode == 1:
            return list(self.batch) + self.free[:self.free.index(r)]
        if self.mode == 2:
            return list(self.batch) + list(self.contract[:self.contract.index(r)])
        return list(self.batch[:self.batch.index(r)])

    def dims(self, cls=RaggedDotDimensionNumbers):
        li, ri = self.lhs_axes.index, self.rhs_axes.index
        return cls(
            dot_dimension_numbers=(([li(a) for a in self.contract], [ri(a) for a in self.contract]),
                                   ([li(a) for a in self.batch], [ri(a) for a in self.batch])),
            lhs_ragged_dimensions=[li(self.ragged)],
            rhs_group_dimensions=[ri("g")] if "g" in self.rhs_axes else [],
        )

    def shapes(self, g, sizes=None):
        size = dict(SIZES if sizes is None else sizes, g=g)
        return tuple(size[a] for a in self.lhs_axes), tuple(size[a] for a in self.rhs_axes)


def _group_sizes(rng, case, g, prefixed, full_first=True, sizes=SIZES):
    """[g] or prefix + (g,) sizes; row totals random in [0, ragged size]."""
    prefix_shape = tuple(sizes[a] for a in case.prefix) if prefixed else ()
    return prefixed_group_sizes(rng, prefix_shape, g, sizes[case.ragged], full_first=full_first)


def _inputs(rng, case, dtype, g=NUM_GROUPS, layout="contiguous", sizes=None):
    lhs_shape, rhs_shape = case.shapes(g, sizes)
    return (with_layout(randn(rng, lhs_shape, dtype), layout),
            with_layout(randn(rng, rhs_shape, dtype), layout))


def check(actual, expected, label=""):
    """Same dtype, and close to the oracle (helpers.check_close)."""
    assert actual.dtype == expected.dtype, f"{label}: dtype {actual.dtype} != {expected.dtype}"
    check_close(actual, expected, err_msg=label)


# ---------------------------------------------------------------------------
# C kernel vs the NumPy oracle
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["contiguous", "fortran", "negative"])
@pytest.mark.parametrize("prefixed", [False, True], ids=["gs1d", "gsprefixed"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=dtype_id)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(rng, name, dtype, prefixed, layout):
    case = Case(*CASES[name])
    dims = case.dims()
    lhs, rhs = _inputs(rng, case, dtype, layout=layout)
    lhs0, rhs0 = lhs.copy(), rhs.copy()
    for full_first in (True, False):
        gs = _group_sizes(rng, case, NUM_GROUPS, prefixed, full_first)
        got = ragged_dot_general(lhs, rhs, gs, dims)
        want = reference.ragged_dot_general(lhs, rhs, gs, dims)
        check(got, want, f"{name} gs={gs.tolist()}")
        assert got.flags.c_contiguous
        if case.mode != 3:
            # Positions in no group are exactly 0 (mode 1); empty groups give exactly 0 (mode 2).
            np.testing.assert_array_equal(got[want == 0], 0)
    np.testing.assert_array_equal(lhs, lhs0)
    np.testing.assert_array_equal(rhs, rhs0)


@pytest.mark.parametrize("name", ["1_outer_free", "1_multi", "2_outer_contracting", "2_multi"])
def test_every_empty_group_pattern(rng, name):
    """Every subset of 3 groups empty, with sums at and below the ragged size."""
    case = Case(*CASES[name])
    dims = case.dims()
    g = 3
    lhs, rhs = _inputs(rng, case, np.float64, g=g)
    ragged = SIZES[case.ragged]
    for total in (ragged, ragged - 2):
        for _, gs in empty_group_patterns(random_group_sizes(rng, g, total, np.int64)):
            got = ragged_dot_general(lhs, rhs, gs, dims)
            want = reference.ragged_dot_general(lhs, rhs, gs, dims)
            check(got, want, f"{name} gs={gs.tolist()}")
            if case.mode == 2:
                for i in np.flatnonzero(gs == 0):
                    np.testing.assert_array_equal(got[i], 0)


def test_mode2_prefixed_but_constant_group_sizes(rng):
    """group_sizes given with its prefix but equal along the outer contracting dim
    (the kernel then merges that dim) and different along it (accumulation)."""
    case = Case(*CASES["2_multi"])
    dims = case.dims()
    lhs, rhs = _inputs(rng, case, np.float64)
    row = random_group_sizes(rng, NUM_GROUPS, SIZES["k"] - 1)
    prefix_shape = tuple(SIZES[a] for a in case.prefix)
    constant = np.broadcast_to(row, prefix_shape + (NUM_GROUPS,)).copy()
    got = ragged_dot_general(lhs, rhs, constant, dims)
    check(got, reference.ragged_dot_general(lhs, rhs, constant, dims))
    np.testing.assert_array_equal(got, ragged_dot_general(lhs, rhs, row, dims))
    varying = constant.copy()
    varying[:, 1] = np.roll(row, 1)
    check(ragged_dot_general(lhs, rhs, varying, dims),
          reference.ragged_dot_general(lhs, rhs, varying, dims))


@pytest.mark.parametrize("name", ["1_multi", "2_multi", "3_multi"])
def test_degenerate_sizes(rng, name):
    """Zero-sized contracting, free and prefix dims."""
    case = Case(*CASES[name])
    dims = case.dims()
    for letter in "klmnp":
        if letter not in case.lhs_axes + case.rhs_axes or letter == case.ragged:
            continue
        sizes = dict(SIZES, **{letter: 0})
        lhs, rhs = _inputs(rng, case, np.float32, sizes=sizes)
        gs = _group_sizes(rng, case, NUM_GROUPS, prefixed=False, sizes=sizes)
        got = ragged_dot_general(lhs, rhs, gs, dims)
        want = reference.ragged_dot_general(lhs, rhs, gs, dims)
        assert got.shape == want.shape, letter
        np.testing.assert_array_equal(got, want)


BIG = dict(b=2, c=2, m=150, p=3, q=3, k=70, l=4, n=37, o=3)


@pytest.mark.parametrize("dtype,layout", [(np.float32, "contiguous"), (np.float64, "negative")],
                         ids=["float32-contiguous", "float64-negative"])
@pytest.mark.parametrize("name", ["1_batch", "1_multi", "2_tgmm", "2_multi", "3_multi"])
def test_larger_than_a_tile(rng, name, dtype, layout):
    """Sizes past the kernels' register and cache blocks, 9 groups."""
    case = Case(*CASES[name])
    lhs, rhs = _inputs(rng, case, dtype, g=9, layout=layout, sizes=BIG)
    gs = _group_sizes(rng, case, 9, prefixed=True, full_first=False, sizes=BIG)
    check(ragged_dot_general(lhs, rhs, gs, case.dims()),
          reference.ragged_dot_general(lhs, rhs, gs, case.dims()), name)


@pytest.mark.parametrize("lhs_dtype,rhs_dtype,pet", [
    (np.float32, np.float64, None),
    (np.float64, np.float32, None),
    (np.float64, np.float64, np.float32),
    (np.float32, np.float32, np.float64),
    (np.float16, np.float16, None),
])
def test_dtypes(rng, lhs_dtype, rhs_dtype, pet):
    for name in ("1_multi", "2_multi", "3_multi"):
        case = Case(*CASES[name])
        lhs, _ = _inputs(rng, case, lhs_dtype)
        _, rhs = _inputs(rng, case, rhs_dtype)
        gs = _group_sizes(rng, case, NUM_GROUPS, prefixed=True)
        got = ragged_dot_general(lhs, rhs, gs, case.dims(), preferred_element_type=pet)
        want = reference.ragged_dot_general(lhs, rhs, gs, case.dims(), preferred_element_type=pet)
        check(got, want, name)


# ---------------------------------------------------------------------------
# ragged_dot is ragged_dot_general with the basic dimension numbers
# ---------------------------------------------------------------------------

BASIC = RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=dtype_id)
def test_equals_ragged_dot(rng, dtype):
    for m, k, n, g in [(1, 1, 1, 1), (50, 33, 17, 5), (130, 64, 40, 8), (20, 8, 9, 12)]:
        lhs = rng.standard_normal((m, k)).astype(dtype)
        rhs = rng.standard_normal((g, k, n)).astype(dtype)
        for total in (m, m // 2):
            gs = random_group_sizes(rng, g, total)
            np.testing.assert_array_equal(ragged_dot_general(lhs, rhs, gs, BASIC),
                                          raggeddot.ragged_dot(lhs, rhs, gs))
            np.testing.assert_array_equal(ragged_dot_general(lhs.T.copy().T, rhs[:, ::-1][:, ::-1], gs, BASIC),
                                          raggeddot.ragged_dot(lhs, rhs, gs))


def test_group_offset_mode1(rng):
    """group_offset in mode 1 means megablox's: rhs holds groups
    [offset, offset + local); rows of all other groups are 0."""
    lhs = rng.standard_normal((30, 6))
    rhs_local = rng.standard_normal((2, 6, 4))
    gs = np.array([5, 7, 0, 9, 4], np.int32)
    for offset in range(4):
        got = ragged_dot_general(lhs, rhs_local, gs, BASIC, group_offset=offset)
        np.testing.assert_array_equal(got, raggeddot.ragged_dot(lhs, rhs_local, gs, group_offset=offset))
        check(got, reference.ragged_dot(lhs, rhs_local, gs, group_offset=offset))
    # With batch, outer/inner free dims and prefixed group sizes: compare with the
    # full computation where the groups not held by rhs have zero matrices.
    case = Case(*CASES["1_multi"])
    lhs, rhs = _inputs(rng, case, np.float64, g=5)
    gs = _group_sizes(rng, case, 5, prefixed=True)
    g_axis = case.rhs_axes.index("g")
    for offset, local in [(0, 5), (1, 3), (3, 2), (4, 1)]:
        held = np.take(rhs, range(offset, offset + local), axis=g_axis)
        zeroed = np.zeros_like(rhs)
        index = [slice(None)] * rhs.ndim
        index[g_axis] = slice(offset, offset + local)
        zeroed[tuple(index)] = held
        got = ragged_dot_general(lhs, held, gs, case.dims(), group_offset=np.array([offset]))
        check(got, reference.ragged_dot_general(lhs, zeroed, gs, case.dims()), f"offset={offset}")


# ---------------------------------------------------------------------------
# RaggedDotDimensionNumbers
# ---------------------------------------------------------------------------

def test_dimension_numbers_normalised():
    dn = RaggedDotDimensionNumbers(dot_dimension_numbers=[[[2, 1], [0, 3]], [[], []]],
                                   lhs_ragged_dimensions=np.array([0]), rhs_group_dimensions=[np.int32(1)])
    assert dn.dot_dimension_numbers == (((2, 1), (0, 3)), ((), ()))
    assert dn.lhs_ragged_dimensions == (0,)
    assert dn.rhs_group_dimensions == (1,)
    assert all(type(d) is int for d in dn.dot_dimension_numbers[0][0])
    assert dn == RaggedDotDimensionNumbers((((2, 1), (0, 3)), ((), ())), (0,), (1,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        dn.lhs_ragged_dimensions = (1,)
    hash(dn)


@pytest.mark.parametrize("args", [
    ((([1.5], [1]), ([], [])), [0], [0]),
    ((([1], [1]), ([], [])), 0, [0]),
    ((([1], [1]),), [0], [0]),
    (((1, 1), ([], [])), [0], [0]),
    ((([1], [1]), ([], [])), [0], "0"),
])
def test_dimension_numbers_bad(args):
    with pytest.raises(TypeError, match="RaggedDotDimensionNumbers"):
        RaggedDotDimensionNumbers(*args)


def test_duck_typed_dimension_numbers(rng):
    case = Case(*CASES["1_multi"])
    lhs, rhs = _inputs(rng, case, np.float64)
    gs = _group_sizes(rng, case, NUM_GROUPS, prefixed=True)
    want = ragged_dot_general(lhs, rhs, gs, case.dims())
    duck = case.dims(types.SimpleNamespace)
    np.testing.assert_array_equal(ragged_dot_general(lhs, rhs, gs, duck), want)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------

def _dn(contract=((1,), (1,)), batch=((), ()), ragged=(0,), group=(0,)):
    return RaggedDotDimensionNumbers((contract, batch), ragged, group)


_L, _R, _GS = np.ones((6, 2)), np.ones((2, 2, 3)), np.array([3, 3])
_L3, _R3 = np.ones((2, 6, 4)), np.ones((2, 4, 3))   # [b, m, k], [b, k, n]

ERRORS = [
    # (exception, message pattern, lhs, rhs, group_sizes, dims, kwargs)
    (ValueError, "exactly one", _L, _R, _GS, _dn(ragged=(0, 1)), {}),
    (ValueError, "exactly one", _L, _R, _GS, _dn(ragged=()), {}),
    (ValueError, "ragged dimension 2 is out of range for 'lhs'", _L, _R, _GS, _dn(ragged=(2,)), {}),
    (ValueError, "rhs_group_dimensions.*exactly one", _L, _R, _GS, _dn(group=()), {}),
    (ValueError, "rhs_group_dimensions.*exactly one", _L, _R, _GS, _dn(group=(0, 2)), {}),
    (ValueError, "group dimension 3 is out of range for 'rhs'", _L, _R, _GS, _dn(group=(3,)), {}),
    (ValueError, "group dimension 1 must not be a contracting", _L, _R, _GS, _dn(group=(1,)), {}),
    (ValueError, "rhs_group_dimensions' must be empty .* contracting", _L3, _R3, _GS,
     _dn(contract=((2,), (1,)), batch=((0,), (0,)), ragged=(2,), group=(0,)), {}),
    (ValueError, "rhs_group_dimensions' must be empty .* batch", _L3, _R3, _GS,
     _dn(contract=((2,), (1,)), batch=((0,), (0,)), ragged=(0,), group=(2,)), {}),
    (ValueError, r"contracting dimensions differ: lhs.shape\[1\]=2", _L, np.ones((2, 3, 3)), _GS, _dn(), {}),
    (ValueError, r"batch dimensions differ: lhs.shape\[0\]=2", _L3, np.ones((3, 4, 3)), _GS,
     _dn(contract=((2,), (1,)), batch=((0,), (0,)), ragged=(1,), group=()), {}),
    (ValueError, "different numbers of contracting", _L, _R, _GS, _dn(contract=((1,), (1, 2))), {}),
    (ValueError, "different numbers of batch", _L3, _R3, _GS,
     _dn(contract=((2,), (1,)), batch=((0,), ()), ragged=(1,), group=()), {}),
    (ValueError, "contracting/batch dimension 5 is out of range for 'lhs'", _L, _R, _GS,
     _dn(contract=((5,), (1,))), {}),
    (ValueError, "contracting/batch dimension -1 is out of range for 'rhs'", _L, _R, _GS,
     _dn(contract=((1,), (-1,))), {}),
    (ValueError, "'lhs' repeat a dimension", _L3, _R3, _GS,
     _dn(contract=((2,), (1,)), batch=((2,), (0,)), ragged=(1,), group=()), {}),
    (ValueError, "'group_sizes' must have shape", _L, _R, np.ones((2, 2), np.int32), _dn(), {}),
    (ValueError, r"'group_sizes' must have shape \[g\] or \(2, 2\)", _L3, np.ones((2, 2, 4, 3)),
     np.ones((3, 2), np.int32), _dn(contract=((2,), (2,)), batch=((0,), (1,)), ragged=(1,), group=(0,)), {}),
    (ValueError, "at least 1-D", _L, _R, np.int32(3), _dn(), {}),
    (TypeError, "'group_sizes' must have an integer dtype", _L, _R, np.array([3.0, 3.0]), _dn(), {}),
    (ValueError, r"negative entry: group_sizes\[1\]=-1", _L, _R, np.array([3, -1]), _dn(), {}),
    (ValueError, r"sum\(group_sizes\)=8 exceeds lhs.shape\[0\]=6", _L, _R, np.array([4, 4]), _dn(), {}),
    (ValueError, r"sum\(group_sizes\)=7 exceeds lhs.shape\[1\]=6 .* at group_sizes\[1, :\]", _L3,
     np.ones((2, 2, 4, 3)), np.array([[3, 3], [3, 4]]),
     _dn(contract=((2,), (2,)), batch=((0,), (1,)), ragged=(1,), group=(0,)), {}),
    (ValueError, r"sum\(group_sizes\)=3 exceeds lhs.shape\[0\]=2", _L3, _R3, np.array([1, 2]),
     _dn(contract=((2,), (1,)), batch=((0,), (0,)), ragged=(0,), group=()), {}),
    (ValueError, r"sum\(group_sizes\)=\d+ exceeds", _L, _R, np.array([2**62, 2**62], np.uint64), _dn(), {}),
    (ValueError, r"len\(group_sizes\)=3 does not match rhs.shape\[0\]=2", _L, _R, np.array([1, 1, 1]), _dn(), {}),
    (ValueError, "'group_offset'=2", _L, _R, np.array([1, 1, 1]), _dn(), dict(group_offset=2)),
    (TypeError, "'group_offset' must be an integer", _L, _R, _GS, _dn(), dict(group_offset=1.0)),
    (NotImplementedError, "group_offset", _L3, _R3, _GS,
     _dn(contract=((2,), (1,)), batch=((0,), (0,)), ragged=(2,), group=()), dict(group_offset=0)),
    (NotImplementedError, "group_offset", _L3, _R3, _GS,
     _dn(contract=((2,), (1,)), batch=((0,), (0,)), ragged=(0,), group=()), dict(group_offset=0)),
    (TypeError, "ragged_dot_dimension_numbers", _L, _R, _GS, ((([1], [1]), ([], [])), [0], [0]), {}),
    (TypeError, "unsupported dtype for 'lhs'", np.ones((6, 2), np.int32), _R, _GS, _dn(), {}),
    (TypeError, "unsupported dtype for 'rhs'", _L, np.ones((2, 2, 3), complex), _GS, _dn(), {}),
    (TypeError, "preferred_element_type", _L, _R, _GS, _dn(), dict(preferred_element_type=np.int32)),
    (ValueError, "precision", _L, _R, _GS, _dn(), dict(precision="fast")),
]


@pytest.mark.parametrize("exc,pattern,lhs,rhs,gs,dims,kwargs", ERRORS,
                         ids=[f"{i}-{e[0].__name__}" for i, e in enumerate(ERRORS)])
def test_errors(exc, pattern, lhs, rhs, gs, dims, kwargs):
    with pytest.raises(exc, match=pattern) as info:
        ragged_dot_general(lhs, rhs, gs, dims, **kwargs)
    assert str(info.value).startswith("ragged_dot_general:") or exc is NotImplementedError


# ---------------------------------------------------------------------------
# Against jax.lax.ragged_dot_general itself
# ---------------------------------------------------------------------------

def _jax_per_last_batch(jax, case, lhs, rhs, gs):
    """jax's answer assembled from one call per index of the last listed batch
    dim (each call then has one batch dim fewer)."""
    last = case.batch[-1]
    sub = Case(case.lhs_axes.replace(last, ""), case.rhs_axes.replace(last, ""), case.contract,
               case.batch[:-1], case.ragged)
    jdims = sub.dims(jax.lax.RaggedDotDimensionNumbers)
    outs = []
    for i in range(SIZES[last]):
        gs_i = gs[(slice(None),) * (len(case.batch) - 1) + (i,)] if gs.ndim > 1 else gs
        outs.append(np.asarray(jax.lax.ragged_dot_general(
            np.take(lhs, i, axis=case.lhs_axes.index(last)),
            np.take(rhs, i, axis=case.rhs_axes.index(last)), gs_i, jdims)))
    return np.stack(outs, axis=(1 if case.mode == 2 else 0) + len(case.batch) - 1)


# Each case once per dtype and once per form of group_sizes (each a compile).
@pytest.mark.parametrize("dtype,prefixed", [(np.float32, False), (np.float64, True)],
                         ids=["float32-gs1d", "float64-gsprefixed"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(jax, x64, rng, name, dtype, prefixed):
    case = Case(*CASES[name])
    lhs, rhs = _inputs(rng, case, dtype, layout="negative")
    gs = _group_sizes(rng, case, NUM_GROUPS, prefixed, full_first=False)
    jdims = case.dims(jax.lax.RaggedDotDimensionNumbers)
    with x64(dtype == np.float64):
        try:
            want = np.asarray(jax.lax.ragged_dot_general(lhs, rhs, gs, jdims))
        except jax.errors.JaxRuntimeError as e:
            # jax 0.10.2 on the CPU: XLA's HLO verifier rejects the jitted dense
            # lowering of mode-2 problems with two batch dims of different
            # sizes (even lhs [b, c, m, k] x rhs [b, c, k, n]); jax's impl run
            # op by op is right. Ask jax one batch slice at a time instead.
            assert "hlo verifier" in str(e) and case.mode == 2 and len(case.batch) > 1
            want = _jax_per_last_batch(jax, case, lhs, rhs, gs)
    assert want.dtype == dtype
    got = ragged_dot_general(lhs, rhs, gs, jdims)   # jax's dimension numbers object
    check(got, want, f"{name} gs={gs.tolist()}")
