#!/usr/bin/env python
"""Tables, targets, plot and JSON of a benchmark run of benchmarks/run.py.

    python benchmarks/report.py benchmarks/results/bench_ragged_dot.json [--no-plot]

prints a saved run again and evaluates it against the current targets.toml.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = os.path.join(HERE, "targets.toml")
CONTENDED_SHARE, STOLEN_SHARE = 0.75, 0.05


# ----------------------------------------------------------------------------------------------
# Metrics: ratios of each record, derived from its variants


def _get(sec: dict, name: str, key: str):
    vr = sec.get(name, {})
    return vr.get(key) if vr.get("status") == "ok" else None


def best_of(sec: dict, bases, key: str = "gflops", lowest: bool = False):
    """(value, variant) of the best of the variants named like ``bases``, each base with its
    flavours (``np-loop`` and ``np-loop:skx``); (None, None) when none ran."""
    found = [(v, name) for name in sec for base in bases if name == base or name.startswith(base + ":")
             if (v := _get(sec, name, key)) is not None]
    return (min(found) if lowest else max(found)) if found else (None, None)


def ratio(a, b):
    return a / b if a and b else None


def _peak(ctx: dict, dtype: str, isa_key: str | None = None):
    """The GFLOP/s yardstick of a record's dtype at raggeddot's thread count: the FMA peak of
    the kernel's ISA (float64: half), or for bfloat16 / float16 / int8 the native_peaks entry."""
    t = str(ctx.get("rd_threads"))
    if dtype in ("bfloat16", "float16", "int8") and isa_key is None:
        return ((ctx.get("native_peaks") or {}).get(dtype, {}).get("gflops") or {}).get(t)
    p = (ctx.get("peaks", {}).get(isa_key or ctx.get("peak_isa")) or {}).get(t)
    return p / 2 if p and dtype == "float64" else p


def _pct(a, b):
    return 100 * a / b if a and b else None


def _bandwidth(m: dict, sec: dict, names: dict, ctx: dict) -> None:
    """GB/s of weight bytes and % of the read bandwidth, {metric prefix: variant}."""
    bw = ctx.get("read_gbs")
    for prefix, name in names.items():
        gbs = _get(sec, name, "weight_gbs")
        m[f"{prefix}GB/s"], m[f"{prefix}%bw"] = gbs, _pct(gbs, bw)


#: the metrics of the quant benchmark, besides best/best_is: mode -> its ratio columns
QUANT_RATIOS = {"int8": ("f32", "bf16", "torch"), "int8-sub128": ("f32", "bf16"), "int8w": ("f32", "bf16", "torch"),
                "fp8w": ("f32", "bf16")}


def derive(op: str, rec: dict, ctx: dict) -> None:
    """rec['metrics']: the ratios the tables and targets use. 'best' is the fastest baseline
    computing the same thing: the NumPy variants in every flavour, torch and (moe) transformers'
    own blocks."""
    v, m = rec["variants"], {}
    if op == "ragged_dot":
        sec = v["ragged_dot"]
        rd = _get(sec, "raggeddot", "gflops")
        m["best"], m["best_is"] = best_of(sec, ("np-loop", "torch-loop", "torch-gmm"))
        m.update({"rd/best": ratio(rd, m["best"]), "rd/dense": ratio(rd, best_of(sec, ("np-dense",))[0]),
                  "rd/loop": ratio(rd, best_of(sec, ("np-loop",))[0]),
                  "rd/torch": ratio(rd, best_of(sec, ("torch-loop", "torch-gmm"))[0]),
                  "rd/tdense": ratio(rd, _get(sec, "torch-dense", "gflops")),
                  "rd/jax": ratio(rd, _get(sec, "jax", "gflops")),
                  "rd/f32": ratio(rd, _get(sec, "rd-f32", "gflops")),
                  "pre/rd": ratio(_get(sec, "rd-prepacked", "gflops"), rd)})
        m["pct_peak"] = _pct(rd, _peak(ctx, rec["dtype"]))
        m["pct_peak_avx2"] = _pct(rd, _peak(ctx, rec["dtype"], "avx2"))
        _bandwidth(m, sec, {"": "raggeddot", "f32 ": "rd-f32", "pre ": "rd-prepacked"}, ctx)
    elif op == "quant":
        sec = v["quant"]
        f32, bf16 = _get(sec, "rd-f32", "gflops"), _get(sec, "rd-bf16", "gflops")
        m["best"], m["best_is"] = best_of(sec, ("torch-int8", "torch-int8w"))
        for mode, over in QUANT_RATIOS.items():
            g = _get(sec, mode, "gflops")
            base = {"f32": f32, "bf16": bf16, "torch": _get(sec, f"torch-{mode}", "gflops")}
            for b in over:
                m[f"{mode}/{b}"] = ratio(g, base[b])
            m[f"{mode} %fma"] = _pct(g, _peak(ctx, "float32"))
        m["int8 %vnni"] = _pct(_get(sec, "int8", "gflops"), _peak(ctx, "int8"))
        for mode in ("int8w", "fp8w"):   # weights prepacked once: over float32 and the per-call mode
            pre = _get(sec, f"{mode}-prepacked", "gflops")
            m[f"{mode}-pre/f32"], m[f"{mode}-pre/{mode}"] = ratio(pre, f32), ratio(pre, _get(sec, mode, "gflops"))
        _bandwidth(m, sec, {"f32 ": "rd-f32", "bf16 ": "rd-bf16", "int8w ": "int8w", "fp8w ": "fp8w",
                            "int8w-pre ": "int8w-prepacked", "fp8w-pre ": "fp8w-prepacked"}, ctx)
    elif op == "backward":
        st, tg = v["step"], v["tgmm"]
        rd = _get(st, "raggeddot", "gflops")
        m["step best"], m["step best_is"] = best_of(st, ("np-loop", "torch-loop"))
        m.update({"step rd/best": ratio(rd, m["step best"]), "step rd/loop": ratio(rd, best_of(st, ("np-loop",))[0]),
                  "step rd/torch": ratio(rd, _get(st, "torch-loop", "gflops")),
                  "step rd/jax": ratio(rd, _get(st, "jax", "gflops")),
                  "step/fwd t": ratio(_get(st, "raggeddot", "median_s"), _get(tg, "forward", "median_s"))})
        t, fresh, fwd = (_get(tg, x, "gflops") for x in ("tgmm", "tgmm-fresh", "forward"))
        m["tgmm best"], m["tgmm best_is"] = best_of(tg, ("np-loop",))
        m.update({"tgmm/fwd": ratio(t, fwd), "tgmm/loop": ratio(t, m["tgmm best"]),
                  "tgmm/dense": ratio(t, best_of(tg, ("np-dense",))[0]),
                  "fresh/fwd": ratio(fresh, fwd), "fresh/loop": ratio(fresh, m["tgmm best"])})
    else:
        for phase in ("fwd", "fwd+bwd"):
            sec = v[phase]
            rd = _get(sec, "raggeddot", "median_s")
            m[f"{phase} best"], m[f"{phase} best_is"] = best_of(sec, ("numpy", "torch", "hf-eager", "hf-gmm"), "median_s",
                                                                 lowest=True)
            m[f"{phase} best/rd"] = ratio(m[f"{phase} best"], rd)
            m[f"{phase} np/rd"] = ratio(best_of(sec, ("numpy",), "median_s", lowest=True)[0], rd)
            m[f"{phase} f32/rd"] = ratio(_get(sec, "rd-f32", "median_s"), rd)
            m[f"{phase} torch/rd"] = ratio(_get(sec, "torch", "median_s"), rd)
            mem = [_get(sec, x, "peak_extra_bytes") for x in ("raggeddot", "numpy")]
            m[f"{phase} mem rd/np"] = mem[0] / mem[1] if None not in mem and mem[1] else None
        g = rec.get("gathers", {})
        share = ratio(g.get("total_s"), _get(v["fwd"], "raggeddot", "median_s"))
        m["gathers %fwd"] = 100 * share if share is not None else None
    rec["metrics"] = m


# ----------------------------------------------------------------------------------------------
# Tables

#: per benchmark: (section, title, value shown per variant, metric columns)
TABLES = {
    "ragged_dot": [("ragged_dot", "ragged_dot: GFLOP/s (median); FLOPs = 2*sum(gs)*k*n (np-dense: 2*m*k*n)", "gflops",
                    ["best", "best_is", "rd/best", "rd/dense", "rd/loop", "rd/torch", "rd/tdense", "rd/jax", "rd/f32",
                     "pre/rd", "pct_peak"]),
                   ("ragged_dot", "weights streamed (memory-bound specs): GB/s of the weight bytes of the groups with "
                                  "rows; %bw: raggeddot's share of the read bandwidth measured at start", "gbs",
                    ["%bw", "f32 %bw", "pre %bw"])],
    "quant": [("quant", "quantized ragged_dot: GFLOP/s (median; 2*sum(gs)*k*n operations); X/f32, X/bf16: "
                        "over raggeddot float32 / bfloat16; %fma: of the FMA peak; %vnni: of the vpdpbusd peak; "
                        "GB/s, %bw: weight bytes (scales included), memory-bound specs", "gflops",
               ["best", "best_is", *(f"{mode}/{b}" for mode, over in QUANT_RATIOS.items() for b in over),
                "int8 %fma", "int8 %vnni", "int8w %fma", "int8w-pre/f32", "int8w-pre/int8w", "fp8w-pre/f32",
                "fp8w-pre/fp8w"]),
              ("quant", "weights streamed (memory-bound specs): GB/s of the weight bytes (scales included); %bw: of "
                        "the read bandwidth measured at start", "gbs",
               ["f32 %bw", "bf16 %bw", "int8w %bw", "fp8w %bw", "int8w-pre %bw", "fp8w-pre %bw"])],
    "backward": [
        ("step", "forward + backward step: GFLOP/s (median); FLOPs = 3 x 2*sum(gs)*k*n; step/fwd t = raggeddot "
                 "step time / forward time (3.0: backward at forward speed)", "gflops",
         ["step best", "step best_is", "step rd/best", "step rd/loop", "step rd/torch", "step rd/jax", "step/fwd t"]),
        ("tgmm", "tgmm: GFLOP/s of d_rhs = tgmm(lhs.T, ct, gs); FLOPs = 2*sum(gs)*k*n (np-dense: lhs @ rhs[0], "
                 "2*m*k*n)", "gflops",
         ["tgmm best", "tgmm best_is", "tgmm/fwd", "tgmm/loop", "tgmm/dense", "fresh/fwd", "fresh/loop"])],
    "moe": [
        ("fwd", "moe_block forward: median ms; best/rd = best baseline time / raggeddot time; mem = peak extra "
                "memory (tracemalloc) raggeddot / numpy; gathers = dispatch + combine share of the forward", "ms",
         ["fwd best", "fwd best_is", "fwd best/rd", "fwd np/rd", "fwd f32/rd", "fwd torch/rd", "fwd mem rd/np",
          "gathers %fwd"]),
        ("fwd+bwd", "moe_block forward + backward (moe_block_vjp, vjp_fn(ct)): median ms", "ms",
         ["fwd+bwd best", "fwd+bwd best_is", "fwd+bwd best/rd", "fwd+bwd np/rd", "fwd+bwd f32/rd",
          "fwd+bwd torch/rd", "fwd+bwd mem rd/np"])],
}
SHAPE_COLS = {"ragged_dot": ["m", "k", "n", "g"], "backward": ["m", "k", "n", "g"], "quant": ["m", "k", "n", "g"],
              "moe": ["T", "d", "f", "E", "top_k"]}


def fmt(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, str):
        return x
    return str(x) if isinstance(x, int) else f"{x:.{digits}f}"


def cell(vr: dict | None, kind: str) -> str:
    if vr is None:
        return "-"
    if vr["status"] != "ok":
        return vr["status"]
    if kind == "ms":
        return fmt(vr["median_s"] * 1e3, 0 if vr["median_s"] > 0.1 else 1) + ("*" if vr.get("contended") else "")
    if kind == "gbs":
        return fmt(vr.get("weight_gbs")) + ("*" if vr.get("contended") and vr.get("weight_gbs") else "")
    return fmt(vr["gflops"]) + ("*" if vr.get("contended") else "")


def metric_cell(name: str, x, kind: str) -> str:
    if name == "best" or name.endswith(" best"):
        return fmt(x * 1e3 if kind == "ms" and x else x)
    if "pct" in name or "%" in name or name.endswith("GB/s"):
        return fmt(x, 1)
    return fmt(x, 2)


def format_table(headers, rows) -> str:
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in [headers] + rows) for i in range(len(headers))]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def section_table(op: str, records: list[dict], section: str, kind: str, metrics: list[str]) -> str | None:
    """One row per record: its variants' figures (``kind``: gflops, ms, or gbs: weight GB/s,
    memory-bound records only), then the metric columns that have a figure somewhere;
    None when no record has a row."""
    if kind == "gbs":
        records = [r for r in records if any(vr.get("weight_gbs") for vr in r["variants"][section].values())]
        if not records:
            return None
    metrics = [x for x in metrics if any(r["metrics"].get(x) is not None for r in records)]
    seen = list(dict.fromkeys(n for r in records for n in r["variants"][section]
                              if kind != "gbs" or any(r2["variants"][section].get(n, {}).get("weight_gbs")
                                                      for r2 in records)))
    base = {n: n.split(":")[0] for n in seen}  # a flavour (np-loop:skx) right after its base
    names = sorted(seen, key=lambda n: seen.index(base[n]) if base[n] in seen else seen.index(n))
    short = [re.sub(r"^(step|tgmm|fwd\+bwd|fwd) ", "", x).replace("pct_peak", "%peak") for x in metrics]
    headers = ["spec", *SHAPE_COLS[op]] + (["pattern"] if op != "moe" else []) + names + short
    rows = []
    for r in records:
        row = [r["spec"], *(r["shape"][x] for x in SHAPE_COLS[op])] + ([r["pattern"]] if op != "moe" else [])
        row += [cell(r["variants"][section].get(n), kind) for n in names]
        rows.append(row + [metric_cell(x, r["metrics"].get(x), kind) for x in metrics])
    return format_table(headers, rows)


def notes(records: list[dict]) -> list[str]:
    """One line per distinct skip or failure reason with the specs it applies to, then the
    contention mark's meaning when a figure carries it."""
    reasons: dict[tuple, list] = {}
    for r in records:
        for section, sec in r["variants"].items():
            for v, vr in sec.items():
                if vr["status"] != "ok":
                    why = re.sub(r"[0-9.]+ (s|GiB)", r"N \1", vr.get("reason", ""))
                    reasons.setdefault((section, v, vr["status"], why), []).append(r["spec"])
        if r.get("numpy_vs_reference", {}).get("status") == "FAILED":
            reasons.setdefault(("numpy", "vs raggeddot.reference", "FAILED", ""), []).append(r["spec"])
    out = []
    for (section, v, status, why), names in reasons.items():
        where = "all" if len(names) == len(records) else ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")
        out.append(f"  {section} {v} {status}: {why}  [{where}]")
    if any(vr.get("contended") for r in records for sec in r["variants"].values() for vr in sec.values()):
        out.append(f"  * got < {CONTENDED_SHARE:.0%} of its threads' CPU time (other processes), or > "
                   f"{STOLEN_SHARE:.0%} of the CPU time was stolen by the hypervisor, while timed: figure unreliable")
    return out


def print_header(info: dict) -> None:
    cpu, blas, rd = info["cpu"], info["numpy_blas"], info["raggeddot"]
    print(f"CPU: {cpu.get('model name')} (family {cpu.get('cpu family')}, {cpu.get('logical_cpus')} cpus, "
          f"{' '.join(cpu.get('flags', []))})")
    print(f"NumPy {info['numpy']}: {blas.get('name')} {blas.get('version')} core={blas.get('corename')} "
          f"threads={blas.get('num_threads')}" + (f"; also timed with OPENBLAS_CORETYPE={info['coretype']}"
                                                  if info.get("coretype") else ""))
    print(f"raggeddot: kernel={rd['kernel']} threads={rd['threads']} runnable={rd['runnable_kernels']}")
    for name in ("torch", "jax"):
        print(f"{name}: {info[name].get('version', '-')} {info[name].get('note', '')}")
    for isa, pk in (info.get("fma_peak_gflops_f32") or {}).items():
        print(f"FMA peak {isa} (float32 GFLOP/s; float64 half): "
              + ", ".join(f"{t} thr {fmt(p)}" for t, p in pk.items()))
    for dtype, pk in (info.get("native_peaks") or {}).items():
        figs = ", ".join(f"{t} thr {fmt(p)}" for t, p in (pk.get("gflops") or {}).items()) or "not measured"
        print(f"{dtype} peak ({pk.get('instruction')}): {figs} ({pk.get('note', '')})")
    bw = info.get("read_bandwidth")
    if bw:
        print(f"read bandwidth (runtime.read_bandwidth, {bw['threads']} thr, {bw['megabytes']} MB): "
              f"{fmt(bw['gbs'])} GB/s")
    for w in info.get("warnings", []):
        print(f"warning: {w}")
    sys.stdout.flush()


def print_run(run: dict) -> None:
    op, records = run["benchmark"], run["results"]
    for dtype in dict.fromkeys(r["dtype"] for r in records):
        rows = [r for r in records if r["dtype"] == dtype]
        for section, title, kind, metrics in TABLES[op]:
            table = section_table(op, rows, section, kind, metrics)
            if table is not None:
                print(f"\n== {dtype} {title}")
                print(table)
        lines = notes(rows)
        if lines:
            print("notes:\n" + "\n".join(lines))
    vnni = (run["machine"].get("native_peaks") or {}).get("int8")
    if op == "quant" and vnni and not vnni.get("gflops"):
        print(f"\nint8 %vnni: the vpdpbusd peak is absent ({vnni.get('note')}); %fma is against the FMA peak")
    sc = run.get("scaling")
    if sc:
        print(f"\n== scaling: {sc['spec']} ({sc['dtype']}, {sc['describe']}), raggeddot at 1..ncpu threads")
        print(format_table(["threads", "actual", "GFLOP/s", "ms", "%peak"], [
            [t, vr.get("actual_threads", "-"), cell(vr, "gflops"),
             fmt(vr["median_s"] * 1e3, 2) if vr["status"] == "ok" else "-", fmt(vr.get("pct_peak"), 0)]
            for t, vr in sc["threads"].items()]))
        print(f"2 vs 1 thread: {fmt(sc.get('speedup_2_vs_1'), 2)}x; bitwise identical across thread counts: "
              f"{sc.get('bitwise_identical_across_threads', 'n/a')}")
    print("\n== targets (benchmarks/targets.toml)" + ("; a smoke run: its figures mean nothing"
                                                      if run["config"].get("smoke") else ""))
    w = max((len(t["target"]) for t in run["targets"]), default=0)
    for t in run["targets"]:
        print(f"  {t['status']:7s}  {t['target']:{w}s}  {t['figure']}")


# ----------------------------------------------------------------------------------------------
# Targets


def load_targets(op: str, path: str = TARGETS) -> list[dict]:
    with open(path, "rb") as f:
        return tomllib.load(f).get(op, [])


def _matches(r: dict, t: dict) -> bool:
    g = r["shape"].get("g", r["shape"].get("E"))
    return (r["dtype"] == t.get("dtype", r["dtype"]) and set(t.get("tags", ())) <= set(r["tags"])
            and t.get("min_g", 0) <= g <= t.get("max_g", math.inf))


def _status(t: dict, v: float) -> str:
    if "at_least" in t:
        return "REACHED" if v >= t["at_least"] else "MISSED"
    if "at_most" in t:
        return "REACHED" if v <= t["at_most"] else "MISSED"
    return "REPORT"


def evaluate(op: str, records: list[dict], scaling: dict | None, ctx: dict, path: str = TARGETS) -> list[dict]:
    """Each target of targets.toml as REACHED / MISSED / REPORT (no bound) / n/a with the
    measured figure."""
    out = []
    at = "" if ctx.get("rd_threads") == 2 else f" (at {ctx.get('rd_threads')} threads; targets are for 2)"
    for t in load_targets(op, path):
        unit, metric, over = t.get("unit", "x"), t["metric"], t.get("over", "worst")
        show = (lambda x: f"{x:.1f}%") if unit == "%" else (lambda x: f"{x:.2f}x")  # noqa: E731
        if over == "scaling":
            v = (scaling or {}).get(metric)
            out.append({"target": t["target"], "status": "n/a" if v is None else _status(t, v), "value": v,
                        "figure": f"{show(v)} ({scaling['spec']})" if v is not None else "scaling not run"})
            continue
        vals = [(r["metrics"].get(metric), f"{r['spec']} {r['dtype']}") for r in records if _matches(r, t)]
        if not vals:
            out.append({"target": t["target"], "status": "n/a", "figure": "no matching spec run"})
            continue
        if over == "each":
            out += [{"target": f"{where}: {t['target']}", "value": v, "figure": show(v) if v is not None else
                     "not measured", "status": _status(t, v) if v is not None else "n/a"} for v, where in vals]
            continue
        missing = [where for v, where in vals if v is None]
        if missing and ("at_least" in t or "at_most" in t):
            out.append({"target": t["target"], "status": "MISSED",
                        "figure": f"no figure for {', '.join(missing[:3])} (raggeddot or a baseline did not run)"})
            continue
        vals = sorted((v, w) for v, w in vals if v is not None)
        if not vals:
            out.append({"target": t["target"], "status": "n/a", "figure": "no figure measured"})
            continue
        v, where = vals[0] if over == "worst" else vals[-1]
        fig = (f"{over} {show(v)} ({where}); median {show(vals[len(vals) // 2][0])}; "
               f"range {show(vals[0][0])}-{show(vals[-1][0])} over {len(vals)} specs")
        if metric.startswith("pct_peak") and ctx.get("peak_warnings"):
            fig += "  [FMA peak probe suspect: see warnings]"
        out.append({"target": t["target"], "status": _status(t, v), "value": v, "figure": fig + at})
    return out


# ----------------------------------------------------------------------------------------------
# JSON and the plot


def write_json(path: str, obj) -> None:
    def default(o):
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        return list(o) if isinstance(o, (set, frozenset, tuple)) else str(o)

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1, default=default)
        f.write("\n")
    os.replace(path + ".tmp", path)


def plot(run: dict, path: str) -> str | None:
    """ragged_dot: GFLOP/s against the group count, one panel per model shape and dtype.
    Returns why no plot was made, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not importable"
    moe = [r for r in run["results"] if "moe" in r["tags"]]
    fams: dict[tuple, list] = {}
    for r in moe:
        s = r["shape"]
        fams.setdefault((r["dtype"], r["spec"].split("-")[0], s["m"], s["k"], s["n"]), []).append(r)
    if not fams:
        return "no MoE-shaped spec run"
    keys = sorted(fams)
    ncol = min(3, len(keys))
    fig, axes = plt.subplots(math.ceil(len(keys) / ncol), ncol, figsize=(5.2 * ncol, 4.2 * math.ceil(len(keys) / ncol)),
                             squeeze=False)
    names = list(dict.fromkeys(n for r in moe for n in r["variants"]["ragged_dot"] if not n.startswith("np-dense")))
    colors = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2))
    markers = {"balanced": "o", "skewed": "^", "empty": "s", "partial": "x"}
    peak_isa, threads = run["machine"].get("peak_isa"), run["machine"]["raggeddot"]["threads"]
    for ax, key in zip(axes.flat, keys):
        rows = sorted(fams[key], key=lambda r: r["shape"]["g"])
        for v in reversed(names):  # raggeddot drawn last, on top
            pts = [(r["shape"]["g"], g, r["pattern"]) for r in rows
                   if (g := _get(r["variants"]["ragged_dot"], v, "gflops"))]
            lw, z = (2.5, 3) if v == "raggeddot" else (1.5, 2)
            line = [(g, y) for g, y, p in pts if p == "balanced"]
            if len(line) > 1:
                ax.plot(*zip(*line), "-", color=colors[v], lw=lw, zorder=z)
            for g, y, p in pts:
                ax.plot([g], [y], markers.get(p, "o"), color=colors[v], ms=6, zorder=z,
                        mfc=colors[v] if p == "balanced" else "none")
        dense = [d for r in rows if (d := best_of(r["variants"]["ragged_dot"], ("np-dense",))[0])]
        if dense:
            ax.axhline(sorted(dense)[len(dense) // 2], color="k", ls="--", lw=1)
        p = (run["machine"].get("fma_peak_gflops_f32", {}).get(peak_isa) or {}).get(str(threads))
        if p:
            ax.axhline(p / (2 if key[0] == "float64" else 1), color="r", ls=":", lw=1)
        gs = sorted({r["shape"]["g"] for r in rows})
        ax.set_xscale("log", base=2)
        ax.set_xticks(gs, [str(g) for g in gs])
        ax.set_ylim(bottom=0)
        ax.set(xlabel="groups g", ylabel="GFLOP/s", title=f"{key[1]}  m={key[2]} k={key[3]} n={key[4]}  {key[0]}")
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    L2D = plt.Line2D
    handles = [L2D([], [], color=colors[v], marker="o", lw=2.5 if v == "raggeddot" else 1.5, label=v) for v in names]
    handles += [L2D([], [], color="k", ls="--", lw=1, label="dense NumPy lhs @ rhs[0] (same m, k, n)"),
                L2D([], [], color="r", ls=":", lw=1, label=f"{(peak_isa or '').upper()} FMA peak ({threads} thr)")]
    handles += [L2D([], [], marker=mk, ls="", color="gray", mfc="gray" if p == "balanced" else "none", label=p)
                for p, mk in markers.items() if any(r["pattern"] == p for r in moe)]
    fig.legend(handles=handles, loc="lower center", ncol=min(6, len(handles)), fontsize=9, frameon=False)
    fig.suptitle(f"ragged_dot GFLOP/s vs group count (raggeddot threads={threads}; lines: balanced groups)",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", help="a JSON file written by benchmarks/run.py")
    p.add_argument("--targets", default=TARGETS, help="targets file (default benchmarks/targets.toml)")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    with open(args.json) as f:
        run = json.load(f)
    run["targets"] = evaluate(run["benchmark"], run["results"], run.get("scaling"), run["context"], args.targets)
    print_header(run["machine"])
    print_run(run)
    if run["benchmark"] == "ragged_dot" and not args.no_plot:
        png = os.path.splitext(args.json)[0] + ".png"
        err = plot(run, png)
        print(f"plot: {err}" if err else f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
