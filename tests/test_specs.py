"""Every named spec of raggeddot.specs, at a reduced size, through raggeddot against the
oracle; the spec table's own rules; the main job and the benchmark runner's use of it."""
import pathlib
import sys

import numpy as np
import pytest

import raggeddot
from raggeddot import reference, specs

SCALE = 1 / 64
BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


def _ids(spec):
    return spec.name


@pytest.mark.parametrize("dtype", specs.DTYPES)
@pytest.mark.parametrize("spec", specs.SPECS, ids=_ids)
def test_spec_matches_reference(spec, dtype):
    assert dtype in spec.dtypes
    inputs = specs.make_inputs(spec, dtype, scale=SCALE)
    got, want = specs.run_raggeddot(spec, inputs), specs.run_reference(spec, inputs)
    assert set(got) == set(want)
    for name, ref in want.items():
        assert ref.dtype == specs.dtype_of(dtype), (name, ref.dtype)
        ok, err = specs.check(got[name], ref, dtype)
        assert ok, f"{spec.name} {name}: rel err {err:.3g}, dtype {got[name].dtype}"
    if spec.op != "moe" and not specs.is_half(dtype):  # NumPy has no fast 16-bit matmul
        loop = specs.numpy_loop(spec, inputs)()
        for name, ref in want.items():
            assert specs.check(loop[name], ref, dtype)[0], f"{spec.name} NumPy loop {name}"


@pytest.mark.parametrize("spec", specs.select("moe"), ids=_ids)
def test_moe_spec_backward_runs(spec):
    inputs = specs.make_inputs(spec, "float64", scale=SCALE)
    args = [inputs[a] for a in specs.MOE_ARGS]
    out, vjp_fn = raggeddot.moe_block_vjp(*args, **inputs["options"])
    assert specs.check(out, reference.moe_block(*args, **inputs["options"]), "float64")[0]
    grads = vjp_fn(inputs["ct"])
    for name, a in zip(specs.MOE_ARGS, args):
        assert grads[name].shape == a.shape and np.isfinite(grads[name]).all()


def test_names_ops_tags_patterns():
    assert len({s.name for s in specs.SPECS}) == len(specs.SPECS)
    for s in specs.SPECS:
        assert s.op in specs.OPS and s.tags <= set(specs.TAGS), s.name
        assert set(s.dtypes) <= set(specs.DTYPES)
        if s.op == "moe":
            assert s.shape["E"] % s.options.get("n_groups", 1) == 0
            continue
        assert s.pattern in specs.PATTERNS
        rows = s.shape["m"] // s.shape["g"]
        assert ("memory-bound" in s.tags) == (rows <= specs.MEMORY_BOUND_ROWS), s.name
    for op in specs.OPS:
        assert specs.select(op, tags=["quick"]), op
    assert {s.op for s in specs.select(tags=["main"])} >= {"ragged_dot", "backward"}


def test_inputs_are_deterministic_and_follow_the_pattern():
    for name in ("qwen3-m16384-g128-empty", "deepseek-m16384-g256-partial", "bwd-qwen3-m4096-g64-skewed", "gpt-oss"):
        s = specs.get(name)
        a, b = specs.make_inputs(s, scale=SCALE), specs.make_inputs(s, scale=SCALE)
        for key, value in a.items():
            if isinstance(value, np.ndarray):
                assert np.array_equal(value, b[key]), (name, key)
    m = specs.get("qwen3-m16384-g128-empty").resized(SCALE).shape["m"]
    gs = specs.make_inputs(specs.get("qwen3-m16384-g128-empty"), scale=SCALE)["group_sizes"]
    assert gs.sum() == m and (gs == 0).sum() >= 128 // 4
    gs = specs.make_inputs(specs.get("deepseek-m16384-g256-partial"), scale=SCALE)["group_sizes"]
    assert gs.sum() == 3 * (16384 // 64) // 4
    assert specs.get("dense-2048").resized(0.5).shape == {"m": 1024, "k": 1024, "n": 1024, "g": 1}


@pytest.mark.parametrize("dtype", specs.HALF_DTYPES)
def test_half_inputs_are_the_float32_draws_rounded(dtype):
    for name in ("qwen3-m4096-g64-skewed", "bwd-qwen3-m4096-g64-skewed", "gpt-oss"):
        s = specs.get(name)
        f32, half = specs.make_inputs(s, "float32", scale=SCALE), specs.make_inputs(s, dtype, scale=SCALE)
        for key, value in f32.items():
            if isinstance(value, np.ndarray) and value.dtype == np.float32:
                assert half[key].dtype == specs.dtype_of(dtype), (name, key)
                assert np.array_equal(half[key], value.astype(specs.dtype_of(dtype))), (name, key)


def test_half_tolerances_and_dtype_errors():
    assert specs.REL_TOL[specs.dtype_of("bfloat16")] == pytest.approx(1e-2)
    assert specs.REL_TOL[specs.dtype_of("float16")] == pytest.approx(2e-3)
    ref = np.linspace(-1, 1, 64, dtype=np.float32)
    off = (ref + 0.02).astype(specs.dtype_of("bfloat16"))  # 1% of max |ref|: just over the bound
    assert not specs.check(off, ref.astype(off.dtype), "bfloat16")[0]
    assert specs.check(ref.astype(off.dtype), ref.astype(off.dtype), "bfloat16") == (True, 0.0)
    assert not specs.check(ref, ref, "bfloat16")[0]  # a float32 result is not a bfloat16 one
    with pytest.raises(ValueError, match="int8"):
        specs.dtype_of("int8")
    with pytest.raises(ValueError, match="float128"):
        specs.dtype_of("float128")


def test_select_by_glob_and_errors():
    assert [s.name for s in specs.select("backward", ["qwen3-m4096-*"])] == [
        "bwd-qwen3-m4096-g64-skewed", "bwd-qwen3-m4096-g128-balanced"]
    with pytest.raises(ValueError):
        specs.select("ragged_dot", ["no-such-spec*"])
    with pytest.raises(KeyError):
        specs.get("no-such-spec")


def test_runner_uses_existing_tags_and_specs():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import report
        import run
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert set(run.TAGS_USED) <= set(specs.TAGS)
    for name in run.SCALING_SPEC.values():
        assert specs.get(name).op == "ragged_dot"
    assert set(run.V.SECTIONS) == set(specs.OPS) | {"quant"}
    for op in run.V.SECTIONS:
        record = {"dtype": "float32", "variants": {s: {} for s in run.V.SECTIONS[op]}}
        report.derive(op, record, {})
        targets = report.load_targets(op)
        assert targets, op
        for t in targets:
            assert set(t.get("tags", ())) <= set(specs.TAGS), t
            assert t.get("over", "worst") in ("worst", "best", "each", "scaling"), t
            assert t["metric"] in record["metrics"] or t.get("over") == "scaling", t


def test_main_job_runs(capsys):
    from raggeddot.__main__ import main

    assert main(["--scale", "0.02", "--budget", "0"]) == 0
    out = capsys.readouterr().out
    n = len([s for s in specs.select(tags=["main"]) if s.op != "moe"])
    assert f"{n} passed, 0 failed" in out


def _runner():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import run
    finally:
        sys.path.remove(str(BENCHMARKS))
    return run


def _smoke(tmp_path, argv):
    """A smoke run of benchmarks/run.py; its records (every variant was checked against the
    oracle before being timed)."""
    import json

    run = _runner()
    base = ["--smoke", "--coretype", "none", "--out", str(tmp_path)]
    assert run.main(argv + base) == 0
    name = argv[0]
    with open(tmp_path / f"bench_{name}.json") as f:
        return json.load(f)


def test_runner_half_dtype_checks_raggeddot_and_its_float32_twin(tmp_path):
    res = _smoke(tmp_path, ["ragged_dot", "--spec", "tiny-m4096-g256-k64-n64", "--dtype", "bfloat16", "float16",
                            "--variants", "rd-f32", "np-loop", "rd-prepacked", "--scaling-spec", "none"])
    assert res["machine"]["read_bandwidth"]["gbs"] > 0
    # the instruction of the family serving int8 products here (vpdpbusd on a VNNI x86, USMMLA
    # or UDOT on aarch64), "none" on a CPU with no int8 dot product
    serving = raggeddot.build_info()["products"]["int8"]["kernel"]
    want = {"avx512-vnni": "vpdpbusd", "avx-vnni": "vpdpbusd", "amx": "TDPBUSD", "neon-i8mm": "USMMLA",
            "neon-dot": "UDOT"}.get(serving, "none")
    assert res["machine"]["native_peaks"]["int8"]["instruction"] == want
    assert [r["dtype"] for r in res["results"]] == ["bfloat16", "float16"]
    for r in res["results"]:
        sec = r["variants"]["ragged_dot"]
        for name in ("raggeddot", "rd-f32", "np-loop"):
            assert sec[name]["status"] == "ok", (r["dtype"], name, sec[name])
            assert sec[name]["rel_err"] <= specs.REL_TOL[specs.dtype_of(r["dtype"])]
            assert sec[name]["weight_gbs"] > 0  # 16 rows per group: memory-bound
        assert sec["rd-f32"]["weight_bytes"] == 2 * sec["raggeddot"]["weight_bytes"]
        assert sec["rd-prepacked"]["status"] == ("skip" if not hasattr(raggeddot, "prepack") else "ok")
        assert r["metrics"]["rd/f32"] > 0 and r["metrics"]["%bw"] > 0


def test_runner_quant_checks_every_mode_against_the_dequantized_product(tmp_path):
    res = _smoke(tmp_path, ["quant", "--quant", "int8", "int8-sub128", "int8w", "fp8w",
                            "--spec", "qwen3-m4096-g64-skewed",
                            "--variants", "int8", "int8-sub128", "int8w", "fp8w"])
    assert res["benchmark"] == "quant"
    (r,) = res["results"]
    sec = r["variants"]["quant"]
    for name in ("rd-f32", "int8", "int8-sub128", "int8w", "fp8w"):
        assert sec[name]["status"] == "ok", (name, sec[name])
    assert r["metrics"]["int8/f32"] > 0 and r["metrics"]["fp8w/f32"] > 0
    # weight bytes: int8 one byte a value plus one float32 scale per (group, column)
    k = r["shape"]["k"]
    assert sec["int8w"]["weight_bytes"] == pytest.approx(sec["rd-f32"]["weight_bytes"] * (1 + 4 / k) / 4)


def test_decode_suite_checks_every_format_and_measures_against_the_bandwidth(tmp_path):
    """benchmarks/run.py decode (--smoke): each weight format checked against the NumPy layer on
    its own dequantized values before it is timed (a failed check ends the run), then timed in
    the same rounds as the read-bandwidth probe (and torch's loop where torch is there)."""
    run = _runner()
    assert run.main(["decode", "--smoke", "--out", str(tmp_path)]) == 0
    import json
    with open(tmp_path / "bench_decode.json") as f:
        res = json.load(f)["results"]
    formats = {"bfloat16", "int8", "int4", "mxfp4", "w8a8"}
    for table in ("layer", "rows"):
        assert formats <= {r["format"] for r in res[table]}, table
        for r in res[table]:
            assert r["ms"] > 0 and r["read_gbs"] > 0 and r["pct_bw"] > 0, r
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    assert any(r["format"] == "torch bf16 loop" for r in res["layer"])
