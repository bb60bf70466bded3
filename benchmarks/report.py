"""Metrics, tables and targets of a benchmark run of benchmarks/run.py."""
from __future__ import annotations

import math
import os
import re
import sys

from common import describe_yardsticks, fmt, format_table

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

TARGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets.toml")
CONTENDED_SHARE, STOLEN_SHARE = 0.75, 0.05


class Figures:
    """A section's figures (None where one is missing); a variant name stands for its every flavour
    (np-loop and np-loop:skx), a tuple of names for the best of them."""

    def __init__(self, sec: dict, rec: dict, ctx: dict):
        self.sec, self.rec, self.ctx = sec, rec, ctx

    def best(self, names, key: str = "gflops"):
        """(highest `key` of the variants ``names``, the variant that has it)."""
        names = (names,) if isinstance(names, str) else names
        found = [(vr[key], n) for n, vr in self.sec.items()
                 if n.split(":")[0] in names and vr["status"] == "ok" and vr.get(key) is not None]
        return max(found) if found else (None, None)

    def ratio(self, a, b, key: str = "gflops"):
        return _over(self.best(a, key)[0], self.best(b, key)[0])

    def peak(self, name: str, dtype: str | None = None):
        """% of the yardstick of ``dtype`` (default the record's) at raggeddot's threads: the FMA
        peak of the kernel's ISA (float64: half), for bfloat16 / float16 / int8 native_peaks'."""
        x, dtype, ctx = self.best(name)[0], dtype or self.rec["dtype"], self.ctx
        if x is None:
            return None
        t = str(ctx.get("rd_threads"))
        if dtype in ("bfloat16", "float16", "int8"):
            return _over(x, (ctx["native_peaks"][dtype]["gflops"] or {}).get(t), 100)
        p = ctx["peaks"][ctx["peak_isa"]].get(t)
        return _over(x, p / 2 if p and dtype == "float64" else p, 100)

    def bw(self, name: str):
        """% of the read bandwidth measured at start that the variant's weight bytes stream at."""
        return _over(self.best(name, "weight_gbs")[0], self.ctx.get("read_gbs"), 100)

    def mem(self):
        """raggeddot's peak extra memory over the NumPy layer's, both traced in this process."""
        return _over(*(self.sec.get(n, {}).get("peak_extra_bytes") for n in ("raggeddot", "numpy")))

    def gathers(self):
        """% of raggeddot's forward time that its dispatch and combine (the ragged gathers) take."""
        return _over(self.rec.get("gathers", {}).get("total_s"), self.best("raggeddot", "median_s")[0], 100)


def _over(x, y, times: float = 1):
    """times * x / y, None where either is missing (or zero)."""
    return times * x / y if x and y else None


#: per section, the baselines computing the same thing (every NumPy flavour, torch); "best":
#: the fastest of them
BASELINES = {"ragged_dot": ("np-loop", "torch-loop", "torch-gmm"), "quant": ("torch-int8",),
             "step": ("np-loop",), "tgmm": ("np-loop",), "fwd": ("numpy", "torch")}
BASELINES["fwd+bwd"] = BASELINES["fwd"]
MOE = {"best/rd": ("raggeddot", ("numpy", "torch")), "np/rd": ("raggeddot", "numpy"),
       "f32/rd": ("raggeddot", "rd-f32"), "torch/rd": ("raggeddot", "torch"), "mem rd/np": Figures.mem}
#: per benchmark, its tables: (section, title, the figure shown per variant (gflops; ms; gbs:
#: weight GB/s, memory-bound specs only), {metric: (a, b): a's GFLOP/s over b's, or a function
#: of a Figures}); every table but a gbs one shows "best" and "best_is" first
TABLES = {
    "ragged_dot": [
        ("ragged_dot", "ragged_dot: GFLOP/s (median); FLOPs = 2*sum(gs)*k*n (np-dense: 2*m*k*n)", "gflops", {
            "rd/best": ("raggeddot", BASELINES["ragged_dot"]), "rd/dense": ("raggeddot", "np-dense"),
            "rd/loop": ("raggeddot", "np-loop"), "rd/f32": ("raggeddot", "rd-f32"),
            "pre/rd": ("rd-prepacked", "raggeddot"), "pct_peak": lambda f: f.peak("raggeddot")}),
        ("ragged_dot", "weights streamed (memory-bound specs): GB/s of the weight bytes of the groups "
                       "with rows; %bw: of the read bandwidth measured at start", "gbs",
         {"%bw": lambda f: f.bw("raggeddot"), "f32 %bw": lambda f: f.bw("rd-f32"),
          "pre %bw": lambda f: f.bw("rd-prepacked")})],
    "quant": [
        ("quant", "quantized ragged_dot: GFLOP/s (median; 2*sum(gs)*k*n operations); X/f32: over "
                  "raggeddot float32; %fma: of the FMA peak; %vnni: of the vpdpbusd peak",
         "gflops", {
            **{f"{q}/f32": (q, "rd-f32") for q in ("int8", "int8-sub128", "int8w", "fp8w")},
            "int8/torch": ("int8", "torch-int8"), "int8 %fma": lambda f: f.peak("int8", "float32"),
            "int8 %vnni": lambda f: f.peak("int8", "int8"),
            **{f"{q}-pre/{b}": (f"{q}-prepacked", v) for q in ("int8w", "fp8w")
               for b, v in (("f32", "rd-f32"), (q, q))}}),
        ("quant", "weights streamed (memory-bound specs): GB/s of the weight bytes (scales included); "
                  "%bw: of the read bandwidth measured at start", "gbs",
         {f"{short} %bw": (lambda f, v=v: f.bw(v)) for short, v in (
             ("f32", "rd-f32"), ("int8w", "int8w"), ("fp8w", "fp8w"),
             ("int8w-pre", "int8w-prepacked"), ("fp8w-pre", "fp8w-prepacked"))})],
    "backward": [
        ("step", "forward + backward step: GFLOP/s (median); FLOPs = 3 x 2*sum(gs)*k*n", "gflops",
         {"step rd/best": ("raggeddot", BASELINES["step"]), "step rd/loop": ("raggeddot", "np-loop")}),
        ("tgmm", "tgmm: GFLOP/s of d_rhs = tgmm(lhs.T, ct, gs); FLOPs = 2*sum(gs)*k*n", "gflops",
         {"tgmm/fwd": ("tgmm", "forward"), "tgmm/loop": ("tgmm", "np-loop"),
          "fresh/fwd": ("tgmm-fresh", "forward"), "fresh/loop": ("tgmm-fresh", "np-loop")})],
    "moe": [
        ("fwd", "moe_block forward: median ms; X/rd = X's time / raggeddot's; mem = peak extra memory "
                "(tracemalloc) raggeddot / numpy; gathers = dispatch + combine share of the forward", "ms",
         {**{f"fwd {k}": how for k, how in MOE.items()}, "gathers %fwd": Figures.gathers}),
        ("fwd+bwd", "moe_block forward + backward (moe_block_vjp, vjp_fn(ct)): median ms", "ms",
         {f"fwd+bwd {k}": how for k, how in MOE.items()})],
}
SHAPE_COLS = {"moe": ["T", "d", "f", "E", "top_k"]}


def _prefix(section: str) -> str:
    return "" if section in ("ragged_dot", "quant") else f"{section} "


def derive(op: str, rec: dict, ctx: dict) -> None:
    """rec['metrics']: the figures of TABLES' metric columns, which targets.toml names too."""
    m = {}
    for section, _, kind, metrics in TABLES[op]:
        f = Figures(rec["variants"][section], rec, ctx)
        m.update({name: f.ratio(*how) if isinstance(how, tuple) else how(f) for name, how in metrics.items()})
        best, m[f"{_prefix(section)}best_is"] = f.best(BASELINES[section])
        if best and kind == "ms":  # the best baseline's time
            best = 1e3 * rec["flops"][section] / (best * 1e9)
        m[f"{_prefix(section)}best"] = best
    rec["metrics"] = m


def cell(vr: dict | None, kind: str) -> str:
    if vr is None or vr["status"] != "ok":
        return vr["status"] if vr else "-"
    x = {"ms": 1e3 * vr["median_s"], "gbs": vr.get("weight_gbs"), "gflops": vr["gflops"]}[kind]
    return fmt(x, 0 if kind == "ms" and x > 100 else 1) + ("*" if vr.get("contended") and x else "")


def section_table(op: str, records: list[dict], section: str, kind: str, metrics: list[str]) -> str | None:
    """One row per record: its variants' figures, then the metric columns that have a figure
    somewhere; None when no record has a row."""
    if kind == "gbs":
        records = [r for r in records if any(vr.get("weight_gbs") for vr in r["variants"][section].values())]
    metrics = [x for x in metrics if any(r["metrics"].get(x) is not None for r in records)]
    seen = list(dict.fromkeys(n for r in records for n, vr in r["variants"][section].items()
                              if kind != "gbs" or vr.get("weight_gbs")))
    # a flavour (np-loop:skx) right after its variant
    names = sorted(seen, key=lambda n: seen.index(n.split(":")[0] if n.split(":")[0] in seen else n))
    shape = SHAPE_COLS.get(op, ["m", "k", "n", "g", "pattern"])
    headers = ["spec", *shape, *names]
    headers += [re.sub(r"^(step|tgmm|fwd\+bwd|fwd) ", "", x).replace("pct_peak", "%peak") for x in metrics]
    rows = [[r["spec"], *(r["shape"].get(x, r.get(x)) for x in shape)]
            + [cell(r["variants"][section].get(n), kind) for n in names]
            + [fmt(r["metrics"].get(x), 1 if "%" in x or "pct" in x or x.split()[-1] == "best" else 2)
               for x in metrics]
            for r in records]
    return format_table(headers, rows) if records else None


def notes(records: list[dict]) -> list[str]:
    """Each distinct skip or failure reason, and the '*' mark's meaning when a figure carries it."""
    vrs = [(s, v, vr) for r in records for s, sec in r["variants"].items() for v, vr in sec.items()]
    out = list(dict.fromkeys(f"  {s} {v} {vr['status']}: {vr.get('reason')}" for s, v, vr in vrs
                             if vr["status"] != "ok"))
    if any(vr.get("contended") for *_, vr in vrs):
        out.append(f"  * got < {CONTENDED_SHARE:.0%} of its threads' CPU time, or > {STOLEN_SHARE:.0%} of "
                   "the CPU time was stolen (hypervisor), while timed: unreliable")
    return out


def print_header(info: dict) -> None:
    blas, torch, cpu, rd = info["numpy_blas"], info.get("torch"), info["cpu"], info["raggeddot"]
    print(f"CPU: {cpu.get('model name')} (family {cpu.get('cpu family')}, {cpu['logical_cpus']} cpus, "
          f"{' '.join(cpu['flags'])}); raggeddot kernel={rd['kernel']} threads={rd['threads']}; "
          f"load average {info['loadavg_start']}")
    also = f"; also OPENBLAS_CORETYPE={info['coretype']}" if info["coretype"] else ""
    print(f"NumPy {info['numpy']}: {blas['name']} {blas['version']} core={blas['corename']} "
          f"threads={blas['num_threads']}{also}")
    lines = [f"torch {torch['version']}, {torch['threads']} threads"] if torch else []
    lines += describe_yardsticks(info) if info.get("peaks") else []
    print("\n".join(lines + [f"warning: {w}" for w in info["warnings"]]))
    sys.stdout.flush()


def print_run(run: dict) -> None:
    op, records = run["benchmark"], run["results"]
    for dtype in dict.fromkeys(r["dtype"] for r in records):
        rows = [r for r in records if r["dtype"] == dtype]
        for section, title, kind, metrics in TABLES[op]:
            best = [f"{_prefix(section)}best", f"{_prefix(section)}best_is"] if kind != "gbs" else []
            table = section_table(op, rows, section, kind, [*best, *metrics])
            if table is not None:
                print(f"\n== {dtype} {title}\n{table}")
        lines = notes(rows)
        if lines:
            print("notes:\n" + "\n".join(lines))
    sc = run.get("scaling")
    if sc:
        print(f"\n== scaling: {sc['spec']} ({sc['dtype']}, {sc['describe']}), raggeddot at 1..ncpu threads")
        print(format_table(["threads", "actual", "GFLOP/s", "ms", "%peak"], [
            [t, vr.get("actual_threads", "-"), cell(vr, "gflops"), cell(vr, "ms"), fmt(vr.get("pct_peak"), 0)]
            for t, vr in sc["threads"].items()]))
        print(f"2 vs 1 thread: {fmt(sc.get('speedup_2_vs_1'), 2)}x; bitwise identical across thread counts: "
              f"{sc.get('bitwise_identical_across_threads', 'n/a')}")
    smoke = "; a smoke run: its figures mean nothing" if run["config"]["smoke"] else ""
    print(f"\n== targets (benchmarks/targets.toml){smoke}")
    w = max((len(t["target"]) for t in run["targets"]), default=0)
    for t in run["targets"]:
        print(f"  {t['status']:7s}  {t['target']:{w}s}  {t['figure']}")


def load_targets(op: str) -> list[dict]:
    with open(TARGETS, "rb") as f:
        return tomllib.load(f).get(op, [])


def _status(t: dict, v) -> str:
    if v is None:
        return "n/a"
    if "at_least" in t or "at_most" in t:
        return "REACHED" if t.get("at_least", -math.inf) <= v <= t.get("at_most", math.inf) else "MISSED"
    return "REPORT"


def evaluate(op: str, records: list, scaling: dict | None, ctx: dict) -> list[dict]:
    """Each target of targets.toml as REACHED / MISSED / REPORT (no bound) / n/a with the
    measured figure."""
    out = []
    at = "" if ctx.get("rd_threads") == 2 else f" (at {ctx.get('rd_threads')} threads; targets are for 2)"
    for t in load_targets(op):
        metric, over = t["metric"], t.get("over", "worst")
        show = (lambda x: f"{x:.1f}%") if t.get("unit") == "%" else (lambda x: f"{x:.2f}x")  # noqa: E731
        if over == "scaling":
            v = (scaling or {}).get(metric)
            out.append({"target": t["target"], "status": _status(t, v), "value": v,
                        "figure": f"{show(v)} ({scaling['spec']})" if v is not None else "scaling not run"})
            continue
        vals = [(r["metrics"].get(metric), f"{r['spec']} {r['dtype']}") for r in records
                if r["dtype"] == t.get("dtype", r["dtype"]) and set(t.get("tags", ())) <= set(r["tags"])
                and t.get("min_g", 0) <= r["shape"].get("g", r["shape"].get("E")) <= t.get("max_g", math.inf)]
        missing = [where for v, where in vals if v is None]
        found = sorted((v, w) for v, w in vals if v is not None)
        if not vals or not (found or over == "each"):
            out.append({"target": t["target"], "status": "n/a",
                        "figure": "no figure measured" if vals else "no matching spec run"})
        elif over == "each":
            out += [{"target": f"{where}: {t['target']}", "value": v, "status": _status(t, v),
                     "figure": show(v) if v is not None else "not measured"} for v, where in vals]
        elif missing and ("at_least" in t or "at_most" in t):
            out.append({"target": t["target"], "status": "MISSED",
                        "figure": f"no figure for {', '.join(missing[:3])} (raggeddot or a baseline failed)"})
        else:
            v, where = found[0] if over == "worst" else found[-1]
            fig = (f"{over} {show(v)} ({where}); median {show(found[len(found) // 2][0])}; "
                   f"range {show(found[0][0])}-{show(found[-1][0])} over {len(found)} specs")
            out.append({"target": t["target"], "status": _status(t, v), "value": v, "figure": fig + at})
    return out
