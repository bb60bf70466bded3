"""Per-call plans: the streaming kernel of every family against the packed one (bit for bit),
the plan table's API, and determinism of a plan across thread counts."""

import numpy as np
import pytest

import raggeddot
from raggeddot import _core, reference, runtime

from helpers import KERNELS

STREAMING = [k for k in KERNELS if k in ("avx512", "avx2", "ref")]


def _classes(fn):
    _core.plan_record(True)
    try:
        fn()
    finally:
        classes = _core.plan_record(False)
    return classes


def _with_plan(fn, plan):
    """fn() with `plan` set for every class fn's products have, the table restored after."""
    classes = _classes(fn)
    saved = [(c, _core.plan_get(c)) for c in classes]
    try:
        for c in classes:
            _core.plan_set(c, plan)
        return fn()
    finally:
        for c, p in saved:
            _core.plan_set(c, p)


@pytest.fixture(autouse=True)
def _empty_table():
    table = _core.plan_table()
    _core.plan_clear()
    yield
    _core.plan_clear()
    for c, p in table:
        _core.plan_set(c, p)


def _operands(rng, sizes, k, n, ldb_pad=0):
    m = int(sum(sizes))
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((len(sizes), k, n + ldb_pad), dtype=np.float32)[:, :, :n]
    return x, w, np.asarray(sizes, dtype=np.int64)


@pytest.mark.parametrize("kernel", STREAMING)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 16, 25])
def test_stream_equals_packed_rows(kernel, rows):
    """Rows around the streaming block (4) and the packed one (12); n across the strip (up to
    128 columns a strip of 1-4 rows is summed in registers: every count of vectors)."""
    rng = np.random.default_rng(rows)
    for k, n in [(1, 1), (5, 17), (300, 33), (7, 48), (33, 64), (9, 80), (65, 100), (128, 112), (200, 128),
                 (5, 129), (257, 511), (64, 512), (40, 513), (3, 1030), (1, 2047), (2, 2048), (1, 2049), (2, 2100)]:
        x, w, gs = _operands(rng, [rows, 0, rows + 1, 2], k, n, ldb_pad=3 if n % 2 else 0)
        with runtime.configured(kernel=kernel):
            packed = _with_plan(lambda: raggeddot.ragged_dot(x, w, gs), {"kernel": "main"})
            streamed = _with_plan(lambda: raggeddot.ragged_dot(x, w, gs), {"kernel": "stream"})
        np.testing.assert_array_equal(streamed, packed, err_msg=f"{kernel} k={k} n={n}")
        want = reference.ragged_dot(x.astype(np.float64), w.astype(np.float64), gs)
        np.testing.assert_allclose(streamed, want, rtol=2e-4, atol=2e-4 * np.sqrt(k))


@pytest.mark.parametrize("lhs_dtype", ["float16", "bfloat16", "float64"])
def test_stream_with_other_operands(lhs_dtype):
    """16-bit lhs (widened while packed) and float64 products: streamed where B is float32
    rows of unit stride, packed otherwise; gmm with a transposed rhs; a 16-bit output."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
    rng = np.random.default_rng(5)
    x, w, gs = _operands(rng, [3, 1, 6], 70, 90)
    x = x.astype(lhs_dtype)
    want = reference.ragged_dot(x.astype(np.float64), w.astype(np.float64), gs)
    plans = [{"kernel": "stream"}, {"kernel": "main"}]
    if lhs_dtype == "float64":          # a float64 product: no streaming kernel, and a plan saying so is refused
        with pytest.raises(ValueError, match="no streaming kernel"):
            _with_plan(lambda: raggeddot.ragged_dot(x, w, gs), plans.pop(0))
    for plan in plans:
        got = _with_plan(lambda: raggeddot.ragged_dot(x, w, gs), plan)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)
        wt = np.ascontiguousarray(w.transpose(0, 2, 1))
        got = _with_plan(lambda: raggeddot.gmm(x, wt, gs, transpose_rhs=True), plan)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kernel", STREAMING)
def test_stream_contract_and_accumulate(kernel):
    """tgmm (the ragged contraction) and accumulating outputs through the streaming kernel."""
    rng = np.random.default_rng(7)
    gs = np.array([3, 0, 5, 1], dtype=np.int64)
    m, k, n = int(gs.sum()), 6, 530
    lhs = rng.standard_normal((m, k), dtype=np.float32)
    rhs = rng.standard_normal((m, n), dtype=np.float32)
    acc = rng.standard_normal((len(gs), k, n), dtype=np.float32)
    with runtime.configured(kernel=kernel):
        got = {p: _with_plan(lambda: raggeddot.tgmm(lhs.T, rhs, gs, existing_out=acc.copy()), {"kernel": p})
               for p in ("main", "stream")}
    np.testing.assert_array_equal(got["stream"], got["main"])
    want = acc + reference.tgmm(lhs.T.astype(np.float64), rhs.astype(np.float64), gs)
    np.testing.assert_allclose(got["stream"], want, rtol=1e-5, atol=1e-5)


def test_stream_strided_lhs_and_out_of_place_rhs():
    """A strided lhs, a transposed rhs (not streamable: packed instead), a 16-bit output."""
    rng = np.random.default_rng(3)
    gs = np.array([2, 3], dtype=np.int64)
    x = rng.standard_normal((10, 2 * 40), dtype=np.float32)[::2, ::2]
    w = rng.standard_normal((2, 50, 40), dtype=np.float32).transpose(0, 2, 1)
    want = reference.ragged_dot(x.astype(np.float64), w.astype(np.float64), gs[:2])
    for plan in ({"kernel": "stream"}, {"kernel": "main"}):
        got = _with_plan(lambda: raggeddot.ragged_dot(x[:5], w, gs), plan)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("plan", [{"kernel": "stream"}, {"kernel": "main"}, {"kernel": "main", "kc": 64},
                                  {"kernel": "main", "split": "n", "tm": 48, "tn": 64}])
def test_plan_results_equal_across_threads(plan):
    rng = np.random.default_rng(11)
    x, w, gs = _operands(rng, [1, 7, 30, 0, 200], 300, 200)
    results = []
    for t in (1, 2, 3):
        with runtime.configured(num_threads=t):
            results.append(_with_plan(lambda: raggeddot.ragged_dot(x, w, gs), dict(plan, threads=t)))
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_classes_and_default_plan():
    rng = np.random.default_rng(0)
    x, w, gs = _operands(rng, [2, 3, 0, 1], 64, 40)
    with runtime.configured(num_threads=2):
        classes = _classes(lambda: raggeddot.ragged_dot(x, w, gs))
    assert len(classes) == 1
    op, ct, family, k, n, g, bucket, threads = classes[0]
    assert (op, ct, k, n, g, bucket, threads) == ("rows", "float32", 64, 40, 4, 2, 2)
    assert family == raggeddot.build_info()["blocking"]["float32"]["kernel"]
    d = _core.plan_default(classes[0])
    assert d == _core.plan_default(classes[0])          # deterministic
    assert d["kernel"] == "stream" and d["threads"] == 0 and d["mr"] == 8
    cands = _core.plan_candidates(classes[0])
    assert cands[0] == d and len(cands) >= 4 and {c["kernel"] for c in cands} == {"main", "stream"}
    big = ("rows", "float32", family, 2048, 2048, 1, 12, 2)
    assert _core.plan_default(big)["kernel"] == "main"
    # a tgmm records a contraction class, bucketed by the mean depth
    g_rows = rng.standard_normal((6, 40), dtype=np.float32)
    classes = _classes(lambda: raggeddot.tgmm(x[:6].T, g_rows, np.array([6, 0], dtype=np.int64)))
    assert classes[0][0] == "contract" and classes[0][6] == 3


def test_table_round_trip_and_use():
    rng = np.random.default_rng(1)
    x, w, gs = _operands(rng, [20, 20], 80, 96)
    cls = _classes(lambda: raggeddot.ragged_dot(x, w, gs))[0]
    assert _core.plan_get(cls) is None
    _core.plan_set(cls, {"kernel": "main", "kc": 32, "threads": 1, "split": "n"})
    got = _core.plan_get(cls)
    assert got["kc"] == 32 and got["threads"] == 1 and got["split"] == "n" and got["kernel"] == "main"
    assert _core.plan_table() == [(cls, got)]
    _core.plan_set(cls, got)                              # what it reads back, it takes
    # kc 32 changes the order of the sums: results differ from the default's in the last bits only
    a = raggeddot.ragged_dot(x, w, gs)
    _core.plan_set(cls, None)
    assert _core.plan_get(cls) is None and _core.plan_table() == []
    np.testing.assert_allclose(a, raggeddot.ragged_dot(x, w, gs), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("cls, plan, exc, match", [
    (("rows", "float32", "avx2", 1, 1, 1, 1), {}, TypeError, "'cls' must be a tuple"),
    (("cols", "float32", "ref", 1, 1, 1, 1, 1), {}, ValueError, "op must be 'rows' or 'contract'"),
    (("rows", "float128", "ref", 1, 1, 1, 1, 1), {}, ValueError, "ctype 'float128'"),
    (("rows", "float32", "nosuch", 1, 1, 1, 1, 1), {}, ValueError, "family 'nosuch'"),
    (("rows", "bfloat16-dot", "ref", 1, 1, 1, 1, 1), {}, ValueError, "family 'ref'"),
    (("rows", "float32", "ref", 1, 1, 1, 1, 0), {}, ValueError, "threads >= 1"),
    (("rows", "float32", "ref", 1, 1, 1, 1, 1), [], TypeError, "'plan' must be a dict"),
    (("rows", "float32", "ref", 1, 1, 1, 1, 1), {"kernel": "small"}, ValueError, "plan\\['kernel'\\]"),
    (("rows", "float64", "ref", 1, 1, 1, 1, 1), {"kernel": "stream"}, ValueError, "no streaming kernel"),
    (("rows", "float32", "ref", 1, 1, 1, 1, 1), {"kc": 0}, ValueError, "plan\\['kc'\\] must be an int"),
    (("rows", "float32", "ref", 1, 1, 1, 1, 1), {"tm": -1}, ValueError, "plan\\['tm'\\]"),
    (("rows", "float32", "ref", 1, 1, 1, 1, 1), {"threads": 1.5}, ValueError, "plan\\['threads'\\]"),
    (("rows", "float32", "ref", 1, 1, 1, 1, 1), {"kernel": "main", "mr": 5}, ValueError, "register block, 6"),
    (("rows", "float32", "ref", 1, 1, 1, 1, 1), {"speed": 1}, ValueError, "unknown plan key 'speed'"),
    (("rows", "float32", "ref", 1, 1, 1, 1, 1), {1: 1}, TypeError, "keys are strings"),
])
def test_plan_errors_name_what_is_wrong(cls, plan, exc, match):
    with pytest.raises(exc, match=match):
        _core.plan_set(cls, plan)
    assert _core.plan_table() == []


def test_threads_capped_by_processors(restore_runtime):
    import os
    procs = len(os.sched_getaffinity(0))
    runtime.set_num_threads(1000)
    assert runtime.get_num_threads() == min(1000, procs) if raggeddot.build_info()["openmp"] else 1


def _team_cases(rng):
    """Products with a group of >= threads x MC rows (team tiles) beside small groups."""
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    gs = np.array([700, 0, 5, 333], dtype=np.int64)       # 700 > 4 MC rows: a team tile
    x = rng.standard_normal((1038, 300), dtype=np.float32)
    w = rng.standard_normal((4, 300, 170), dtype=np.float32)
    yield "f32", lambda: raggeddot.ragged_dot(x, w, gs)
    yield "bf16", lambda: raggeddot.ragged_dot(x.astype(bf16), w.astype(bf16), gs)
    yield "bf16-out", lambda: raggeddot.ragged_dot(x, w, gs, preferred_element_type=bf16)
    yield "prepacked", lambda: raggeddot.ragged_dot(x, raggeddot.prepack(w), gs)
    wide, ct = rng.standard_normal((1038, 600), dtype=np.float32), rng.standard_normal((1038, 170), dtype=np.float32)
    yield "tgmm", lambda: raggeddot.tgmm(wide.T, ct, gs)     # 600 output rows a group: team tiles
    q = raggeddot.quantize(x, "int8", channelwise_axes=(0,))
    qw = raggeddot.quantize(w, "int8", channelwise_axes=(0, 2))
    yield "int8", lambda: raggeddot.ragged_dot(q, qw, gs)


@pytest.mark.parametrize("case", ["f32", "bf16", "bf16-out", "prepacked", "tgmm", "int8"])
def test_team_tiles_equal_tiles_of_one_thread(case):
    """A group of many rows run by the team (B panels packed once, shared, rows split) gives
    the results of the same plan on one thread, and of the plan without teams."""
    fn = dict(_team_cases(np.random.default_rng(2)))[case]
    got = {}
    for team in (1, 0):
        for t in (2, 1):
            with runtime.configured(num_threads=t):
                got[team, t] = _with_plan(fn, {"kernel": "main", "team": team})
    for key, value in got.items():
        np.testing.assert_array_equal(np.asarray(value).view(np.uint8), np.asarray(got[1, 2]).view(np.uint8),
                                      err_msg=str(key))


@pytest.mark.parametrize("plan", [{"kernel": "main", "mc": 1 << 24}, {"kernel": "stream", "kc": 1 << 24}])
def test_huge_blocking_of_a_plan_costs_no_memory_beyond_the_tiles(plan):
    """The packing buffers are sized by what the tiles use, not by the plan's bounds: a plan
    (from a file, say) with MC or KC in the millions still runs a small product."""
    rng = np.random.default_rng(4)
    x, w, gs = _operands(rng, [20, 20], 30, 20)
    want = raggeddot.ragged_dot(x, w, gs)
    np.testing.assert_array_equal(_with_plan(lambda: raggeddot.ragged_dot(x, w, gs), plan), want)
