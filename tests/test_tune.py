"""raggeddot.tiling.efficiency (megablox's tile-revisit model), and the plan tuner:
raggeddot.tune / tabulate, the plans file and ``python -m raggeddot tune``.

Every test here runs with RAGGEDDOT_CACHE_DIR in a temporary directory (the autouse
fixture below), so nothing is written into the user's cache, and puts the plan table back
as it found it.
"""
import math

import numpy as np
import pytest

import raggeddot
from raggeddot.tiling import efficiency

# ---------------------------------------------------------------------------
# efficiency
# ---------------------------------------------------------------------------


def _visits_brute(group_sizes, tm):
    """Row tiles visited, counted row by row: the distinct tiles of each non-empty group."""
    visits, start = 0, 0
    for size in group_sizes:
        visits += len({row // tm for row in range(start, start + size)})
        start += size
    return visits


@pytest.mark.parametrize("tm", [1, 2, 3, 8, 16])
def test_efficiency_against_brute_force(rng, tm):
    for _ in range(20):
        g = int(rng.integers(1, 9))
        sizes = rng.integers(0, 20, size=g) * (rng.random(g) > 0.3)
        eff = efficiency(sizes, tm)
        m, groups = int(sizes.sum()), int((sizes > 0).sum())
        if m == 0:
            assert eff == (1.0, 1.0, 0, 0, 0)
            continue
        tiles = math.ceil(m / tm)
        assert (eff.tiles, eff.groups, eff.visits) == (tiles, groups, _visits_brute(sizes, tm))
        assert eff.exact == pytest.approx(tiles / eff.visits)
        assert eff.model == pytest.approx(tiles / (tiles + groups * (1 - 1 / tm)))
        assert 0 < eff.exact <= 1 and 0 < eff.model <= 1


@pytest.mark.parametrize("tm", [4, 8, 32])
def test_efficiency_exact_is_make_group_metadata_tiles(rng, tm):
    """When tm divides m, exact = tiles_m / num_tiles of megablox's metadata (empty groups
    not visited)."""
    for _ in range(10):
        g = int(rng.integers(1, 12))
        m = tm * int(rng.integers(1, 8))
        sizes = rng.multinomial(m, np.full(g, 1 / g)).astype(np.int32)
        _, num_tiles = raggeddot.make_group_metadata(group_sizes=sizes, m=m, tm=tm, visit_empty_groups=False)
        assert efficiency(sizes, tm).exact == pytest.approx((m // tm) / int(num_tiles))


def test_efficiency_single_group_and_aligned_groups():
    assert efficiency([64], 16).exact == 1.0
    eff = efficiency([16, 0, 32, 16], 16)          # every boundary on a tile edge: no revisits
    assert (eff.exact, eff.visits, eff.groups) == (1.0, 4, 3)
    assert eff.model < 1.0                          # the model counts 1 - 1/tm of a revisit per group
    assert efficiency(np.array([], dtype=np.int32), 4) == (1.0, 1.0, 0, 0, 0)
    assert efficiency([], 4).tiles == 0


@pytest.mark.parametrize("sizes, tm, kind, match", [
    ([3, -1], 4, ValueError, r"efficiency: 'group_sizes' has a negative entry: group_sizes\[1\]=-1"),
    ([[1, 2]], 4, ValueError, r"efficiency: expected 1-D 'group_sizes'"),
    ([1.5, 2], 4, TypeError, r"efficiency: 'group_sizes' must have an integer dtype, got float64"),
    (None, 4, TypeError, r"efficiency: 'group_sizes' must be an array, got None"),
    ([1, 2], 0, ValueError, r"efficiency: 'tm' must be a positive integer, got 0"),
    ([1, 2], 2.0, TypeError, r"efficiency: 'tm' must be an integer, got float 2.0"),
    ([1, 2], True, TypeError, r"efficiency: 'tm' must be an integer, got True"),
])
def test_efficiency_errors_name_the_argument(sizes, tm, kind, match):
    with pytest.raises(kind, match=match):
        efficiency(sizes, tm)


# ---------------------------------------------------------------------------
# tune and tabulate
# ---------------------------------------------------------------------------

from raggeddot import _core, _plans  # noqa: E402
from raggeddot import reference  # noqa: E402


@pytest.fixture(autouse=True)
def private_plans(tmp_path, monkeypatch):
    """A temporary cache directory, an empty plan table and no class tuned or loaded;
    the table and the module's sets as they were afterwards."""
    monkeypatch.setenv("RAGGEDDOT_CACHE_DIR", str(tmp_path / "cache"))
    saved = _core.plan_table()
    tuned, loaded = set(_plans.tuned), set(_plans.loaded)
    _core.plan_clear()
    _plans.tuned.clear()
    _plans.loaded.clear()
    yield
    _core.plan_clear()
    for cls, plan in saved:
        _core.plan_set(cls, _plans.settable(plan))
    _plans.tuned.clear()
    _plans.tuned.update(tuned)
    _plans.loaded.clear()
    _plans.loaded.update(loaded)


SIZES = np.array([7, 9, 8], dtype=np.int32)          # 3 groups of 8 rows on average: bucket 4


def _operands(rng, dtype=np.float32):
    return rng.standard_normal((24, 8)).astype(dtype), rng.standard_normal((3, 8, 16)).astype(dtype), SIZES


def _tune(hyperparams=None, **kw):
    kw = dict(dict(repeats=2, progress=False, persist=False), **kw)
    return raggeddot.tune(raggeddot.ragged_dot, hyperparams, **kw)


def _unique(plans):
    out = []
    for p in plans:
        if p not in out:
            out.append(p)
    return out


def test_tune_picks_a_plan_that_later_calls_use(rng):
    lhs, rhs, gs = _operands(rng)
    want = reference.ragged_dot(lhs, rhs, gs)
    tuned = _tune()
    np.testing.assert_allclose(tuned(lhs, rhs, gs), want, rtol=1e-5, atol=1e-5)
    (cls,) = tuned.classes
    assert cls == ("rows", "float32", cls[2], 8, 16, 3, 4, raggeddot.get_num_threads())
    assert cls[2] in raggeddot.runtime.runnable_kernels()
    rows = raggeddot.tabulate(tuned).rows
    assert [r["plan"] for r in rows] == _unique(_plans.settable(p) for p in _core.plan_candidates(cls))
    assert rows[0]["plan"] == _plans.settable(_core.plan_default(cls))
    (chosen,) = [r for r in rows if r["chosen"]]
    timed = [r for r in rows if r["error"] is None]
    assert chosen["median"] == min(r["median"] for r in timed) and all(r["spread"] >= 0 for r in timed)
    assert _plans.settable(_core.plan_get(cls)) == chosen["plan"]
    assert cls in _plans.tuned

    # a plain call of that class runs with the table's entry, and computes the same
    _core.plan_record(True)
    got = raggeddot.ragged_dot(lhs, rhs, gs)
    assert _core.plan_record(False) == [cls]
    assert _plans.settable(_core.plan_get(cls)) == chosen["plan"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    # a class tuned once is not timed again, by this wrapper or another
    np.testing.assert_allclose(tuned(lhs, rhs, gs), want, rtol=1e-5, atol=1e-5)
    other = _tune()
    other(lhs, rhs, gs)
    assert len(raggeddot.tabulate(tuned).rows) == len(rows) and raggeddot.tabulate(other).rows == []


def test_tabulate_text_is_aligned(rng):
    tuned = _tune()
    tuned(*_operands(rng))
    table = raggeddot.tabulate(tuned)
    lines = str(table).splitlines()
    assert len(lines) == len(table.rows) + 1 and len(table) == len(table.rows)
    assert lines[0].split()[:8] == list(_plans.CLASS_FIELDS)
    assert "median ms" in lines[0] and "chosen" in lines[0]
    col = lines[0].index("median ms") + len("median ms")          # right-aligned under its header
    assert all(line[col - 1] != " " for line in lines[1:])
    assert sum(line.rstrip().endswith("*") for line in lines[1:]) == 1
    assert set(table.rows[0]) == {"class", "plan", "median", "spread", "chosen", "error"}


def test_hyperparams_are_the_product_over_the_default(rng):
    lhs, rhs, gs = _operands(rng)
    tuned = _tune({"split": ["n", "m"], "kernel": ["main"]})
    tuned(lhs, rhs, gs)
    (cls,) = tuned.classes
    default = _plans.settable(_core.plan_default(cls))
    plans = [r["plan"] for r in raggeddot.tabulate(tuned).rows]
    expected = [dict(default, split=s, kernel="main") for s in ("n", "m")]
    assert sorted(map(str, plans)) == sorted(map(str, _unique(expected)))
    if default in plans:
        assert plans[0] == default                  # the default first, so ties go to it
    _core.plan_clear()
    _plans.tuned.clear()
    one = _tune({"split": ["n"]})                   # one value: that plan only
    np.testing.assert_allclose(one(lhs, rhs, gs), reference.ragged_dot(lhs, rhs, gs), rtol=1e-5, atol=1e-5)
    (row,) = raggeddot.tabulate(one).rows
    assert row["chosen"] and row["plan"] == dict(default, split="n")
    assert _core.plan_get(cls)["split"] == "n"


def test_failing_candidates_are_dropped(rng):
    tuned = _tune({"split": ["m", "diagonal"]})
    tuned(*_operands(rng))
    rows = raggeddot.tabulate(tuned).rows
    bad = [r for r in rows if r["plan"]["split"] == "diagonal"]
    assert len(bad) == 1 and bad[0]["error"].startswith("ValueError") and not bad[0]["chosen"]
    assert _core.plan_get(tuned.classes[0])["split"] == "m"


def test_every_candidate_failing_leaves_the_table_alone(rng):
    tuned = _tune({"split": ["diagonal"]})
    with pytest.warns(RuntimeWarning, match="every candidate plan of class"):
        tuned(*_operands(rng))
    (cls,) = tuned.classes
    assert _core.plan_get(cls) is None and cls not in _plans.tuned


@pytest.mark.parametrize("args, kw, kind, match", [
    ((5,), {}, TypeError, r"tune: 'fn' must be callable, got int 5"),
    ((len, [("mc", [64])]), {}, TypeError, r"tune: 'hyperparams' must be None or a dict"),
    ((len, {"mr": [4]}), {}, ValueError, r"tune: 'hyperparams' has the key 'mr', which is not a plan key"),
    ((len, {"mc": 64}), {}, TypeError, r"tune: 'hyperparams\['mc'\]' must be a list of values, got int 64"),
    ((len, {"mc": []}), {}, ValueError, r"tune: 'hyperparams\['mc'\]' is empty"),
    ((len,), {"repeats": 0}, ValueError, r"tune: 'repeats' must be >= 1, got 0"),
    ((len,), {"repeats": 2.5}, TypeError, r"tune: 'repeats' must be an integer"),
    ((len,), {"progress": "yes"}, TypeError, r"tune: 'progress' must be a bool, got str 'yes'"),
    ((len,), {"persist": None}, TypeError, r"tune: 'persist' must be a bool, got None"),
])
def test_tune_errors_name_the_argument(args, kw, kind, match):
    with pytest.raises(kind, match=match):
        raggeddot.tune(*args, **kw)


def test_tabulate_refuses_what_tune_did_not_make():
    with pytest.raises(TypeError, match=r"tabulate: 'tuned' must be a function returned by raggeddot.tune, "
                                        r"got function"):
        raggeddot.tabulate(raggeddot.ragged_dot)


def test_progress_line_without_tqdm(rng, monkeypatch, capsys):
    import sys
    monkeypatch.setitem(sys.modules, "tqdm", None)       # `from tqdm import tqdm` raises ImportError
    tuned = _tune(progress=True)
    tuned(*_operands(rng))
    err = capsys.readouterr().err
    n = len(raggeddot.tabulate(tuned).rows) * (tuned.repeats + 1)    # a warm-up and the timed calls
    assert f"tuning op=rows ctype=float32" in err and f"{n}/{n}" in err


# ---------------------------------------------------------------------------
# The plans file
# ---------------------------------------------------------------------------

import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _tuned_class(rng, persist=True):
    """Tune the tiny product; (its class, the chosen plan)."""
    tuned = _tune(persist=persist)
    tuned(*_operands(rng))
    (cls,) = tuned.classes
    return cls, _plans.settable(_core.plan_get(cls))


def _forget():
    """This process as if freshly started: an empty table, nothing tuned or loaded."""
    _core.plan_clear()
    _plans.tuned.clear()
    _plans.loaded.clear()


def _write(doc):
    file = pathlib.Path(_plans.path())
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return file


def test_tuned_plans_persist_and_load(rng, tmp_path):
    cls, plan = _tuned_class(rng)
    file = pathlib.Path(_plans.path())
    assert file.parent == tmp_path / "cache" and file.name.startswith("plans-")
    doc = json.loads(file.read_text())
    assert doc == {"format": _plans.FORMAT, "cpu": _plans.cpu_model(), "build": _plans.build_id(),
                   "entries": [{"class": list(cls), "plan": plan}]}
    assert [p.name for p in file.parent.iterdir()] == [file.name]        # no temporary file left
    _forget()
    assert _plans.load() == 1
    assert _plans.settable(_core.plan_get(cls)) == plan and cls in _plans.loaded
    tuned = _tune()                                   # a loaded class is not tuned again
    tuned(*_operands(rng))
    assert raggeddot.tabulate(tuned).rows == []


def test_import_reads_the_file_unless_disabled(rng):
    cls, plan = _tuned_class(rng)
    code = ("import json, raggeddot\nfrom raggeddot import _core, _plans\n"
            f"p = _core.plan_get({cls!r})\nprint(json.dumps(p and _plans.settable(p)))\n")
    env = {k: val for k, val in os.environ.items() if k != "RAGGEDDOT_PLANS"}

    def run(**extra):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(env, **extra), capture_output=True,
                             text=True, timeout=120, check=True)
        assert "Warning" not in out.stderr, out.stderr
        return json.loads(out.stdout)

    assert run() == plan
    assert run(RAGGEDDOT_PLANS="0") is None


def test_save_keeps_other_entries(rng):
    other = ("rows", "float64", "ref", 5, 7, 2, 3, 1)
    _core.plan_set(other, {"split": "n"})
    _plans.save([other])
    _core.plan_set(other, None)
    cls, plan = _tuned_class(rng)               # writes its class beside the other one
    _forget()
    assert _plans.load() == 2
    assert _core.plan_get(other)["split"] == "n" and _plans.settable(_core.plan_get(cls)) == plan


@pytest.mark.parametrize("content", [b"{not json", b"", b"[1, 2]", b'{"format": 99, "entries": []}',
                                     b"\xff\xfe{", b'{"format": 1, "entries": {}}'])
def test_a_corrupt_file_is_ignored_with_a_warning(content):
    _write(content)
    with pytest.warns(RuntimeWarning, match="ignoring the plans file"):
        assert _plans.load() == 0
    assert _core.plan_table() == []


@pytest.mark.parametrize("field", ["cpu", "build"])
def test_a_foreign_file_is_ignored_whole(rng, field):
    cls, plan = _tuned_class(rng)
    file = pathlib.Path(_plans.path())
    doc = json.loads(file.read_text())
    doc[field] = "some other " + field
    file.write_text(json.dumps(doc))
    _forget()
    with pytest.warns(RuntimeWarning, match=f"it was written for .*some other {field}"):
        assert _plans.load() == 0
    assert _core.plan_get(cls) is None and not _plans.loaded


def test_invalid_entries_are_ignored_and_valid_ones_kept(rng):
    cls, plan = _tuned_class(rng)
    good = {"class": list(cls), "plan": plan}
    doc = json.loads(pathlib.Path(_plans.path()).read_text())
    doc["entries"] = [
        {"class": list(cls)[:5], "plan": plan},                     # a class of 5 fields
        {"class": list(cls), "plan": dict(plan, split="diagonal")},  # a value the library refuses
        {"class": list(cls), "plan": dict(plan, bogus=1)},           # a key it does not know
        {"class": ["sideways"] + list(cls)[1:], "plan": plan},      # an op it does not know
        "not an entry",
        good,
    ]
    _write(doc)
    _forget()
    with pytest.warns(RuntimeWarning, match=r"ignored 5 invalid entries .*entries\[0\]"):
        assert _plans.load() == 1
    assert _plans.settable(_core.plan_get(cls)) == plan and _plans.loaded == {cls}


def test_an_unwritable_cache_warns_and_keeps_the_plans(rng, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("RAGGEDDOT_CACHE_DIR", str(blocker / "cache"))   # a directory under a file
    with pytest.warns(RuntimeWarning, match="the tuned plans were not saved"):
        cls, plan = _tuned_class(rng)
    assert _plans.settable(_core.plan_get(cls)) == plan


# ---------------------------------------------------------------------------
# python -m raggeddot tune
# ---------------------------------------------------------------------------


def test_cli_tunes_a_spec_and_compares_with_the_default(capsys):
    from raggeddot.__main__ import main

    spec = "tiny-m4096-g256-k64-n64-skewed"
    assert main(["tune", "--spec", spec, "--scale", "0.05", "--repeats", "2", "--rounds", "2",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"{spec} (m=205 k=3 n=3 g=256 skewed), float32: ok against the oracle" in out
    assert "median ms" in out and "tuned/default speed" in out
    last = out.strip().splitlines()[-1].split()
    assert last[:2] == [spec, "ok"] and float(last[2]) > 0
    assert pathlib.Path(_plans.path()).exists()


def test_cli_refuses_specs_that_are_not_ragged_dot(capsys):
    from raggeddot.__main__ import main

    with pytest.raises(SystemExit):
        main(["tune", "--spec", "mixtral"])
    assert "no ragged_dot spec matches 'mixtral'" in capsys.readouterr().err
