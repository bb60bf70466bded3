"""One suite for every grouped matmul, run for each op x dtype x kernel.

The ops: ragged_dot, gmm (rhs as [g, k, n] and transposed as [g, n, k]), tgmm,
and ragged_dot_general in its three modes (ragged non-contracting, ragged
contracting, ragged batch). A small adapter per op builds its operands from
(m, k, n, g, group sizes, dtype), calls raggeddot and raggeddot.reference, and
says which output positions must be exactly 0. ``check`` then asserts, on
every call: the result equals the oracle (helpers.check_close), has the
oracle's shape and dtype, is exactly 0 where no group writes, is a fresh
C-contiguous writeable array sharing no memory with the inputs, and the
inputs are unchanged.

The dtypes are float16, bfloat16, float32 and float64; the kernels are every
kernel family this CPU runs (``raggeddot.runtime.runnable_kernels()``), each
forced with ``runtime.configured(kernel=...)``. What is specific to one op
(its errors, jax conformance, group_offset, existing_out, gradients) lives in
that op's own test module.
"""

import itertools
import os

import numpy as np
import pytest

import raggeddot
from raggeddot import RaggedDotDimensionNumbers as DN
from raggeddot import reference, runtime

from helpers import (BFLOAT16, DOT_KERNELS, DTYPES, FLOATS, INT_DTYPES, KERNELS, LAYOUTS, THREAD_COUNTS,
                     VALUE_LAYOUTS, assert_unchanged, check_close, dtype_id,
                     empty_group_patterns, group_size_patterns, random_group_sizes, randn,
                     snapshot, with_layout)

BATCH = 2   # batch entries of the ragged_dot_general adapters


# ---------------------------------------------------------------------------
# The adapters
# ---------------------------------------------------------------------------


class Op:
    """How the suite drives one operation.

    m is the size of the dimension that ``group_sizes`` splits in ragged_dot
    (the rows), k the other lhs dimension, n the rhs columns, g the number of
    groups. ``splits`` says what the groups split: the output rows
    (ragged_dot, gmm, mode 1), the contraction (tgmm, mode 2: k is then the
    output rows and a group's size its contraction length) or the batch
    (mode 3).
    """

    name = ""
    splits = "rows"

    def shapes(self, m, k, n, g):
        raise NotImplementedError

    def group_sizes(self, gs):
        """The op's group_sizes argument for 1-D sizes ``gs``."""
        return gs

    def call(self, lhs, rhs, gs):
        raise NotImplementedError

    def reference(self, lhs, rhs, gs):
        raise NotImplementedError

    def zeros(self, out, gs):
        """Boolean mask of the output positions that must be exactly 0."""
        return np.zeros(out.shape, bool)

    def outside(self, lhs, rhs, gs):
        """Index expressions (``(0 or 1, index)`` for lhs or rhs) of input
        positions that no group reads."""
        return []

    def __repr__(self):
        return self.name


def _total(gs):
    return int(np.asarray(gs).astype(np.int64).sum())


class RaggedDot(Op):
    name = "ragged_dot"

    def shapes(self, m, k, n, g):
        return (m, k), (g, k, n)

    def call(self, lhs, rhs, gs):
        return raggeddot.ragged_dot(lhs, rhs, gs)

    def reference(self, lhs, rhs, gs):
        return reference.ragged_dot(lhs, rhs, gs)

    def zeros(self, out, gs):
        mask = np.zeros(out.shape, bool)
        mask[_total(gs):] = True
        return mask

    def outside(self, lhs, rhs, gs):
        return [(0, np.s_[_total(gs):])] + [(1, i) for i in np.flatnonzero(np.asarray(gs) == 0)]


class Gmm(RaggedDot):
    def __init__(self, transpose_rhs):
        self.transpose_rhs = transpose_rhs
        self.name = "gmm_transposed" if transpose_rhs else "gmm"

    def shapes(self, m, k, n, g):
        return (m, k), ((g, n, k) if self.transpose_rhs else (g, k, n))

    def call(self, lhs, rhs, gs):
        return raggeddot.gmm(lhs, rhs, gs, transpose_rhs=self.transpose_rhs)

    def reference(self, lhs, rhs, gs):
        return reference.gmm(lhs, rhs, gs, transpose_rhs=self.transpose_rhs)


class Tgmm(Op):
    """lhs [k, m] x rhs [m, n] -> [g, k, n]."""

    name = "tgmm"
    splits = "contraction"

    def shapes(self, m, k, n, g):
        return (k, m), (m, n)

    def call(self, lhs, rhs, gs):
        return raggeddot.tgmm(lhs, rhs, gs)

    def reference(self, lhs, rhs, gs):
        return reference.tgmm(lhs, rhs, gs)

    def zeros(self, out, gs):
        mask = np.zeros(out.shape, bool)
        mask[np.asarray(gs) == 0] = True
        return mask

    def outside(self, lhs, rhs, gs):
        return [(0, np.s_[:, _total(gs):]), (1, np.s_[_total(gs):])]


class General(Op):
    """ragged_dot_general with a batch dimension of BATCH entries and group
    sizes per entry ([BATCH, g]: the sizes, then the same sizes reversed)."""

    dims = None

    def group_sizes(self, gs):
        return np.stack([gs, gs[::-1]])

    def call(self, lhs, rhs, gs):
        return raggeddot.ragged_dot_general(lhs, rhs, gs, self.dims)

    def reference(self, lhs, rhs, gs):
        return reference.ragged_dot_general(lhs, rhs, gs, self.dims)


class RaggedFree(General):
    """Mode 1: lhs [b, m, k] x rhs [g, b, k, n] -> [b, m, n]."""

    name = "general_ragged_free"
    dims = DN((((2,), (2,)), ((0,), (1,))), [1], [0])

    def shapes(self, m, k, n, g):
        return (BATCH, m, k), (g, BATCH, k, n)

    def zeros(self, out, gs):
        mask = np.zeros(out.shape, bool)
        for b in range(BATCH):
            mask[b, _total(gs[b]):] = True
        return mask

    def outside(self, lhs, rhs, gs):
        out = []
        for b in range(BATCH):
            out.append((0, np.s_[b, _total(gs[b]):]))
            out += [(1, (i, b)) for i in np.flatnonzero(gs[b] == 0)]
        return out


class RaggedContracting(General):
    """Mode 2: lhs [b, k, m] x rhs [b, m, n] -> [g, b, k, n]."""

    name = "general_ragged_contracting"
    splits = "contraction"
    dims = DN((((2,), (1,)), ((0,), (0,))), [2], [])

    def shapes(self, m, k, n, g):
        return (BATCH, k, m), (BATCH, m, n)

    def zeros(self, out, gs):
        mask = np.zeros(out.shape, bool)
        for b in range(BATCH):
            mask[gs[b] == 0, b] = True
        return mask

    def outside(self, lhs, rhs, gs):
        out = []
        for b in range(BATCH):
            out += [(0, np.s_[b, :, _total(gs[b]):]), (1, np.s_[b, _total(gs[b]):])]
        return out


class RaggedBatch(General):
    """Mode 3: lhs [b, m, k] x rhs [b, k, n] -> [b, m, n], a plain batched
    product whatever the group sizes. The groups split the BATCH entries:
    the sizes keep their empty groups and are cut down to sum to at most
    BATCH (each non-empty group takes one entry while any is left)."""

    name = "general_ragged_batch"
    splits = "batch"
    dims = DN((((2,), (1,)), ((0,), (0,))), [0], [])

    def group_sizes(self, gs):
        taken = np.minimum(np.cumsum(np.asarray(gs) > 0), BATCH)
        return np.diff(np.concatenate([[0], taken])).astype(np.asarray(gs).dtype)

    def shapes(self, m, k, n, g):
        return (BATCH, m, k), (BATCH, k, n)


OPS = [RaggedDot(), Gmm(False), Gmm(True), Tgmm(), RaggedFree(), RaggedContracting(), RaggedBatch()]


@pytest.fixture(params=OPS, ids=repr)
def op(request):
    return request.param


@pytest.fixture
def dtype(request):
    return request.param


def pytest_generate_tests(metafunc):
    """A test of a dtype on a kernel runs every dtype on every float family,
    and bfloat16 also on every bfloat16 dot-product family (natives and
    twins: the bfloat16 products then run on vdpbf16ps, AMX tiles or their
    emulations)."""
    marked = set()   # names a test parametrizes itself
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        marked |= {x.strip() for x in (names.split(",") if isinstance(names, str) else names)}
    wanted = {"dtype", "kernel"} & set(metafunc.fixturenames) - marked
    if wanted == {"dtype", "kernel"}:
        pairs = [(d, k) for d in DTYPES for k in KERNELS]
        if BFLOAT16 is not None:
            pairs += [(BFLOAT16, k) for k in DOT_KERNELS["bfloat16-dot"] + DOT_KERNELS["bfloat16-tile"]
                      + DOT_KERNELS["bfloat16-mmla"]]
        metafunc.parametrize(("dtype", "kernel"), pairs, indirect=True,
                             ids=[f"{dtype_id(d)}-{k}" for d, k in pairs])
    elif "dtype" in wanted:
        metafunc.parametrize("dtype", DTYPES, indirect=True, ids=dtype_id)
    elif "kernel" in wanted:
        metafunc.parametrize("kernel", KERNELS, indirect=True)


@pytest.fixture
def kernel(request):
    with runtime.configured(kernel=request.param):
        assert runtime.get_kernel() == request.param
        yield request.param


def make(op, rng, m, k, n, gs, dtype):
    """(lhs, rhs, group_sizes) of ``op`` for 1-D sizes ``gs`` over m rows."""
    lhs_shape, rhs_shape = op.shapes(m, k, n, len(gs))
    return randn(rng, lhs_shape, dtype), randn(rng, rhs_shape, dtype), op.group_sizes(gs)


def check(op, lhs, rhs, gs, label=""):
    """Run ``op`` and assert everything the suite promises; return its result."""
    label = f"{op.name} {label} gs={np.asarray(gs).tolist()}"
    inputs = (lhs, rhs, gs)
    before = snapshot(inputs)
    out = op.call(lhs, rhs, gs)
    assert_unchanged(inputs, before, ["lhs", "rhs", "group_sizes"])
    want = op.reference(*(np.ascontiguousarray(a) for a in inputs))
    assert isinstance(out, np.ndarray), label
    assert out.shape == want.shape, f"{label}: shape {out.shape} != {want.shape}"
    assert out.dtype == want.dtype, f"{label}: dtype {out.dtype} != {want.dtype}"
    check_close(out, want, err_msg=label)
    zeros = op.zeros(out, gs)
    assert np.all(out[zeros] == 0), (
        f"{label}: {int(np.count_nonzero(out[zeros]))} entries that no group writes are not 0")
    assert out.flags.c_contiguous and out.flags.writeable, label
    assert not any(np.may_share_memory(out, a) for a in (lhs, rhs)), label
    return out


# ---------------------------------------------------------------------------
# Group sizes
# ---------------------------------------------------------------------------


def test_every_empty_group_pattern(op, dtype, kernel, rng):
    """Every subset of 3 and of 4 groups empty, the others holding 1..20 rows
    (across the 6- and 12-row register blocks). The sum is m when an even
    number of groups is empty, 5 below m when an odd number is: each group is
    empty in patterns of both kinds."""
    k, n = 19, 23
    for g in (3, 4):
        for mask, gs in empty_group_patterns(rng.integers(1, 21, g).astype(np.int32)):
            m = _total(gs) + 5 * (bin(mask).count("1") % 2)
            check(op, *make(op, rng, m, k, n, gs, dtype), label=f"empty mask {mask} m={m}")


SIZE_LISTS = [  # (m, sizes): sums below m, all empty, single groups
    (10, [0]), (10, [0, 0, 0]), (10, [3]), (10, [0, 9]), (50, [7, 0, 13]),
    (300, [1, 2, 3, 4, 5, 6, 7, 8]), (257, [0, 128, 0, 0, 128, 0]), (1, [0, 0]),
]


def test_group_size_patterns(op, dtype, kernel, rng):
    """Random (sum m and below), random with empty groups, skewed, all empty,
    one full, all non-empty; more groups than rows; the SIZE_LISTS."""
    k, n = 33, 17
    for m, g in [(50, 5), (20, 40)]:
        for name, gs in group_size_patterns(rng, g, m):
            check(op, *make(op, rng, m, k, n, gs, dtype), label=f"{name} m={m}")
    for m, sizes in SIZE_LISTS:
        check(op, *make(op, rng, m, k, n, np.array(sizes, np.int32), dtype), label=f"m={m}")


def test_many_small_groups(op, rng):
    """200 groups over 1000 rows in every pattern: the tile list and its split
    across threads, which neither the dtype nor the kernel changes."""
    for name, gs in group_size_patterns(rng, 200, 1000):
        check(op, *make(op, rng, 1000, 24, 40, gs, np.float32), label=name)


def test_group_sizes_of_every_integer_dtype(op, rng):
    """Every integer dtype (and a list) gives the same result as int32."""
    m, k, n, g = 120, 17, 19, 5
    gs = random_group_sizes(rng, g, 110, np.int64)  # each size fits int8
    lhs, rhs, gs32 = make(op, rng, m, k, n, gs.astype(np.int32), np.float32)
    want = check(op, lhs, rhs, gs32)
    aliases = [np.intc, np.intp, np.uintp, np.longlong, np.ulonglong, np.short, np.byte]
    for dt in INT_DTYPES + [np.dtype(a) for a in aliases]:
        got = check(op, lhs, rhs, gs32.astype(dt), label=np.dtype(dt).name)
        assert np.array_equal(got, want), np.dtype(dt).name
    assert np.array_equal(op.call(lhs, rhs, gs32.tolist()), want)


# ---------------------------------------------------------------------------
# Shapes: register blocks, cache blocks, empty and unit dimensions
# ---------------------------------------------------------------------------

# Output rows and columns around the register blocks (6 and 12 rows; 8, 16 and
# 32 columns) and contraction lengths around KC = 256 (and past two blocks).
TILE_ROWS = (1, 5, 6, 7, 11, 12, 13, 25)
TILE_COLS = (1, 7, 8, 9, 15, 16, 17, 31, 32, 33)
DEPTHS = (1, 255, 256, 257, 513)


def _tile_problems(op):
    """(m, k, n, group sizes) covering the tables. Where the groups split the
    rows, every call holds all of TILE_ROWS (a group of r rows makes row tiles
    of r rows); where they split the contraction, every call holds all of
    DEPTHS (a group of d rows is a contraction of length d). Each column
    count meets two entries of each other table."""
    rows = np.array(TILE_ROWS + (0,), np.int32)
    depths = np.array(DEPTHS + (0,), np.int32)
    for j, n in enumerate(TILE_COLS):
        for step in (0, 3):
            k = DEPTHS[(j + step) % len(DEPTHS)]
            r = TILE_ROWS[(j + step) % len(TILE_ROWS)]
            if op.splits == "rows":
                yield int(rows.sum()), k, n, rows
            elif op.splits == "contraction":   # k is the output rows
                yield int(depths.sum()), r, n, depths
            else:                              # batch: m and k themselves
                yield r, k, n, np.array([1, 0, 1], np.int32)


def test_partial_tiles(op, dtype, kernel, rng):
    """Tiles cut by the register blocks in rows and columns, contractions cut
    by KC (groups in a shuffled order)."""
    for m, k, n, gs in _tile_problems(op):
        gs = rng.permutation(gs)
        check(op, *make(op, rng, m, k, n, gs, dtype), label=f"m={m} k={k} n={n}")


def test_empty_and_unit_dimensions(op, dtype, kernel, rng):
    """m, k and n of 0, 1 and 7 in every combination, each group count of 0, 1
    and 3 with nine of them (a Latin square: every size of every dimension
    meets every group count); an empty contraction gives exact zeros."""
    for i, (m, k, n) in enumerate(itertools.product((0, 1, 7), repeat=3)):
        g = (0, 1, 3)[(i + i // 3 + i // 9) % 3]
        gs = random_group_sizes(rng, g, m if g else 0)
        out = check(op, *make(op, rng, m, k, n, gs, dtype), label=f"m={m} k={k} n={n}")
        if (m if op.splits == "contraction" else k) == 0:
            assert not out.any(), f"m={m} k={k} n={n}: an empty contraction must give 0"


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_cache_blocks(op, dtype, rng):
    """Past MC (144 / 72 rows) and NC (4080 columns) with partial blocks, and
    past KC (256) with two NC blocks. (The blocks are those of the
    float32 and float64 kernels; half precision computes in float32.)"""
    if op.splits == "contraction":   # k is the rows, the group sizes the contraction
        problems = [(20, 145, 4081, [9, 0, 8]), (310, 13, 4081, [300, 0, 2])]
    else:
        problems = [(145, 17, 4081, [73, 0, 70]), (13, 300, 4081, [6, 0, 7])]
    for m, k, n, gs in problems:
        check(op, *make(op, rng, m, k, n, np.array(gs, np.int32), dtype), label=f"m={m} k={k}")


# ---------------------------------------------------------------------------
# Memory layouts and values
# ---------------------------------------------------------------------------


def test_memory_layouts(op, dtype, rng):
    """Fortran order, transposed, strided and negative-stride views, an offset
    and a byte-misaligned start, read-only and stride-0 broadcast operands
    (group sizes strided, reversed, offset or read-only alike). Packing turns
    every layout into the same panels before a micro-kernel runs, so the
    default kernel."""
    for m, k, n, g in [(40, 13, 21, 3), (7, 1, 1, 2)]:
        for layout in LAYOUTS:
            gs = random_group_sizes(rng, g, m - 3)
            lhs, rhs, gs = make(op, rng, m, k, n, gs, dtype)
            lhs, rhs = with_layout(lhs, layout), with_layout(rhs, layout)
            if layout in VALUE_LAYOUTS:
                gs = with_layout(gs, layout)
            check(op, lhs, rhs, gs, label=f"{layout} m={m} k={k} n={n}")


@pytest.mark.parametrize("op", [op for op in OPS if op.splits != "batch"], ids=repr)
def test_nonfinite_values_outside_every_group(op, dtype, kernel, rng):
    """Rows past sum(group_sizes) and weights of empty groups are never read:
    filling them with NaN and inf changes no bit of the result. (In the ragged
    batch mode every input takes part.)"""
    m, k, n = 30, 9, 11
    gs = np.array([4, 0, 9, 0, 8], np.int32)   # 9 rows in no group
    lhs, rhs, gs = make(op, rng, m, k, n, gs, dtype)
    clean = check(op, lhs, rhs, gs)
    places = op.outside(lhs, rhs, gs)
    assert places
    for which, index in places:
        arr = (lhs, rhs)[which]
        arr[index] = np.nan
        arr[index][..., :1] = np.inf
    out = op.call(lhs, rhs, gs)
    assert np.array_equal(out, clean), "a value outside every group reached the result"


# ---------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_bitwise_identical_across_threads_and_calls(op, dtype, kernel, rng):
    """Results do not depend on the thread count (the blocking alone fixes the
    order of every sum) nor on the call: 1, 2 and 3 threads, and a repeat.
    Past KC, with several full column blocks and a partial one. (Half-precision
    inputs run the float32 kernels.)"""
    m, k, n, g = 300, 300, 161, 5
    gs = random_group_sizes(rng, g, 290)
    lhs, rhs, gs = make(op, rng, m, k, n, gs, dtype)
    results = {}
    for t in THREAD_COUNTS:
        with runtime.configured(num_threads=t):
            results[t] = op.call(lhs, rhs, gs)
    with runtime.configured(num_threads=THREAD_COUNTS[-1]):
        results["repeat"] = op.call(lhs, rhs, gs)
    first = results[THREAD_COUNTS[0]]
    for t, out in results.items():
        diff = out != first
        assert not diff.any(), (
            f"{t} threads differ from 1 thread at {int(diff.sum())} entries, "
            f"first {np.argwhere(diff)[0].tolist()}")
    check_close(first, op.reference(lhs, rhs, gs))


# ---------------------------------------------------------------------------
# The kernels and thread counts the suite runs on
# ---------------------------------------------------------------------------


def test_kernels_are_selectable_exactly_when_the_cpu_runs_them():
    """Every compiled kernel family is either selectable (the CPU has its ISA)
    or refused with RuntimeError, never silently run on a CPU without it."""
    compiled = runtime.compiled_kernels()
    assert "ref" in KERNELS and set(KERNELS) <= set(compiled)
    dot = (DOT_KERNELS["bfloat16-dot"] + DOT_KERNELS["int8-dot"] + DOT_KERNELS["bfloat16-tile"]
           + DOT_KERNELS["bfloat16-mmla"] + DOT_KERNELS["int8-mmla"])
    with runtime.configured():
        for name in compiled:
            if name in dot:   # a dot-product family: selectable by name, never automatic
                runtime.set_kernel(name)
                assert runtime.get_kernel() == name
                assert runtime.set_kernel("auto") == name and runtime.get_kernel() in KERNELS
            elif name in KERNELS:
                runtime.set_kernel(name)
                assert runtime.get_kernel() == name
                assert raggeddot.build_info()["kernel"] == name
                assert runtime.set_kernel("auto") == name
                assert runtime.get_kernel() in KERNELS
            else:
                with pytest.raises(RuntimeError):
                    runtime.set_kernel(name)
                assert runtime.get_kernel() != name
        with pytest.raises((ValueError, RuntimeError)):
            runtime.set_kernel("no-such-kernel")
        assert runtime.get_kernel() in KERNELS


def test_num_threads_round_trips(restore_runtime):
    if not raggeddot.build_info()["openmp"]:
        pytest.skip("built without OpenMP: always 1 thread")
    assert isinstance(raggeddot.get_num_threads(), int) and raggeddot.get_num_threads() >= 1
    procs = len(os.sched_getaffinity(0))
    for t in THREAD_COUNTS + (procs + 1, 1000):
        raggeddot.set_num_threads(t)
        # more threads than processors only wait for each other: a call uses at most those
        assert raggeddot.get_num_threads() == runtime.get_num_threads() == min(t, procs)
