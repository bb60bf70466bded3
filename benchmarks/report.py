"""Metrics, tables and targets of a benchmark run of benchmarks/run.py."""
from __future__ import annotations

import math
import os
import re
import sys

from common import describe_machine, describe_yardsticks, fmt, format_table

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

TARGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets.toml")
CONTENDED_SHARE, STOLEN_SHARE = 0.75, 0.05


class Figures:
    """The figures of one section of a record (its variants' records) that metrics use; a
    variant name stands for the variant in every flavour (np-loop and np-loop:skx), a tuple of
    names for the best of them. Every method gives None where a figure is missing."""

    def __init__(self, sec: dict, rec: dict, ctx: dict):
        self.sec, self.rec, self.ctx = sec, rec, ctx

    def best(self, names, key: str = "gflops"):
        """(highest `key` of the variants ``names``, the variant that has it)."""
        names = (names,) if isinstance(names, str) else names
        found = [(vr[key], n) for n, vr in self.sec.items()
                 if n.split(":")[0] in names and vr["status"] == "ok" and vr.get(key) is not None]
        return max(found) if found else (None, None)

    def ratio(self, a, b, key: str = "gflops"):
        x, y = self.best(a, key)[0], self.best(b, key)[0]
        return x / y if x and y else None

    def pct(self, x, of):
        return 100 * x / of if x and of else None

    def peak(self, name: str, dtype: str | None = None, isa: str | None = None):
        """% of the yardstick of ``dtype`` (default the record's) at raggeddot's thread count:
        the FMA peak of the kernel's ISA (or ``isa``; float64: half), for bfloat16 / float16 /
        int8 the native_peaks entry."""
        dtype, t, ctx = dtype or self.rec["dtype"], str(self.ctx.get("rd_threads")), self.ctx
        if dtype in ("bfloat16", "float16", "int8") and isa is None:
            p = ((ctx.get("native_peaks") or {}).get(dtype, {}).get("gflops") or {}).get(t)
        else:
            p = (ctx.get("peaks", {}).get(isa or ctx.get("peak_isa")) or {}).get(t)
            p = p / 2 if p and dtype == "float64" else p
        return self.pct(self.best(name)[0], p)

    def mem(self):
        """raggeddot's peak extra memory over the NumPy layer's, both traced in this process."""
        a, b = (self.sec.get(n, {}).get("peak_extra_bytes") for n in ("raggeddot", "numpy"))
        return a / b if a and b else None

    def gathers(self):
        """% of raggeddot's forward time that its dispatch and combine (the ragged gathers) take."""
        return self.pct(self.rec.get("gathers", {}).get("total_s"), self.best("raggeddot", "median_s")[0])

    def bw(self, name: str):
        """% of the read bandwidth measured at start that the variant's weight bytes stream at."""
        return self.pct(self.best(name, "weight_gbs")[0], self.ctx.get("read_gbs"))


#: the baselines computing the same thing, per section: every NumPy flavour, torch and (moe)
#: transformers' blocks; "best" is the fastest of them
BASELINES = {"ragged_dot": ("np-loop", "torch-loop", "torch-gmm"), "quant": ("torch-int8", "torch-int8w"),
             "step": ("np-loop",), "tgmm": ("np-loop",), "fwd": ("numpy", "torch")}
BASELINES["fwd+bwd"] = BASELINES["fwd"]
QUANT = ("int8", "int8-sub128", "int8w", "fp8w")
PRE = ("int8w", "fp8w")


def _moe_metrics(p: str) -> dict:
    """moe: times over raggeddot's (the inverse ratio of the GFLOP/s); mem: peak extra memory."""
    return {f"{p} best/rd": lambda f: f.ratio("raggeddot", BASELINES[p]),
            f"{p} np/rd": lambda f: f.ratio("raggeddot", "numpy"), f"{p} f32/rd": lambda f: f.ratio("raggeddot", "rd-f32"),
            f"{p} torch/rd": lambda f: f.ratio("raggeddot", "torch"),
            f"{p} mem rd/np": Figures.mem, **({"gathers %fwd": Figures.gathers} if p == "fwd" else {})}


#: per benchmark, its tables: (section, title, figure shown per variant (gflops, ms, or gbs:
#: weight GB/s, memory-bound records only), {metric: its figure from a Figures}); every table
#: also shows "best" and "best_is" (BASELINES)
TABLES = {
    "ragged_dot": [
        ("ragged_dot", "ragged_dot: GFLOP/s (median); FLOPs = 2*sum(gs)*k*n (np-dense: 2*m*k*n)", "gflops", {
            "rd/best": lambda f: f.ratio("raggeddot", BASELINES["ragged_dot"]),
            "rd/dense": lambda f: f.ratio("raggeddot", "np-dense"), "rd/loop": lambda f: f.ratio("raggeddot", "np-loop"),
            "rd/torch": lambda f: f.ratio("raggeddot", ("torch-loop", "torch-gmm")),
            "rd/tdense": lambda f: f.ratio("raggeddot", "torch-dense"),
            "rd/f32": lambda f: f.ratio("raggeddot", "rd-f32"), "pre/rd": lambda f: f.ratio("rd-prepacked", "raggeddot"),
            "pct_peak": lambda f: f.peak("raggeddot"), "pct_peak_avx2": lambda f: f.peak("raggeddot", isa="avx2")}),
        ("ragged_dot", "weights streamed (memory-bound specs): GB/s of the weight bytes of the groups with rows; "
                       "%bw: raggeddot's share of the read bandwidth measured at start", "gbs", {
            "%bw": lambda f: f.bw("raggeddot"), "f32 %bw": lambda f: f.bw("rd-f32"),
            "pre %bw": lambda f: f.bw("rd-prepacked")})],
    "quant": [
        ("quant", "quantized ragged_dot: GFLOP/s (median; 2*sum(gs)*k*n operations); X/f32, X/bf16: over raggeddot "
                  "float32 / bfloat16; %fma: of the FMA peak; %vnni: of the vpdpbusd peak", "gflops", {
            **{f"{q}/{b}": (lambda f, q=q, v=v: f.ratio(q, v)) for q in QUANT
               for b, v in (("f32", "rd-f32"), ("bf16", "rd-bf16"), ("torch", f"torch-{q}"))},
            **{f"{q} %fma": (lambda f, q=q: f.peak(q, "float32")) for q in ("int8", "int8w")},
            "int8 %vnni": lambda f: f.peak("int8", "int8"),
            **{f"{q}-pre/{b}": (lambda f, q=q, v=v: f.ratio(f"{q}-prepacked", v)) for q in PRE
               for b, v in (("f32", "rd-f32"), (q, q))}}),
        ("quant", "weights streamed (memory-bound specs): GB/s of the weight bytes (scales included); %bw: of the "
                  "read bandwidth measured at start", "gbs", {
            f"{short} %bw": (lambda f, v=v: f.bw(v)) for short, v in (
                ("f32", "rd-f32"), ("bf16", "rd-bf16"), ("int8w", "int8w"), ("fp8w", "fp8w"),
                ("int8w-pre", "int8w-prepacked"), ("fp8w-pre", "fp8w-prepacked"))})],
    "backward": [
        ("step", "forward + backward step: GFLOP/s (median); FLOPs = 3 x 2*sum(gs)*k*n", "gflops", {
            "step rd/best": lambda f: f.ratio("raggeddot", BASELINES["step"]),
            "step rd/loop": lambda f: f.ratio("raggeddot", "np-loop")}),
        ("tgmm", "tgmm: GFLOP/s of d_rhs = tgmm(lhs.T, ct, gs); FLOPs = 2*sum(gs)*k*n (np-dense: lhs @ rhs[0], "
                 "2*m*k*n)", "gflops", {
            "tgmm/fwd": lambda f: f.ratio("tgmm", "forward"), "tgmm/loop": lambda f: f.ratio("tgmm", "np-loop"),
            "tgmm/dense": lambda f: f.ratio("tgmm", "np-dense"), "fresh/fwd": lambda f: f.ratio("tgmm-fresh", "forward"),
            "fresh/loop": lambda f: f.ratio("tgmm-fresh", "np-loop")})],
    "moe": [
        ("fwd", "moe_block forward: median ms; X/rd = X's time / raggeddot's; mem = peak extra memory "
                "(tracemalloc) raggeddot / numpy; gathers = dispatch + combine share of the forward", "ms",
         _moe_metrics("fwd")),
        ("fwd+bwd", "moe_block forward + backward (moe_block_vjp, vjp_fn(ct)): median ms", "ms",
         _moe_metrics("fwd+bwd"))],
}
SHAPE_COLS = {"ragged_dot": ["m", "k", "n", "g"], "backward": ["m", "k", "n", "g"], "quant": ["m", "k", "n", "g"],
              "moe": ["T", "d", "f", "E", "top_k"]}


def _prefix(section: str) -> str:
    return "" if section in ("ragged_dot", "quant") else f"{section} "


def derive(op: str, rec: dict, ctx: dict) -> None:
    """rec['metrics']: the figures of TABLES' metric columns, which targets.toml names too."""
    m = {}
    for section, _, kind, metrics in TABLES[op]:
        f = Figures(rec["variants"][section], rec, ctx)
        for name, figure in metrics.items():
            m[name] = figure(f)
        best, m[f"{_prefix(section)}best_is"] = f.best(BASELINES[section])
        m[f"{_prefix(section)}best"] = 1e3 * rec["flops"][section] / best / 1e9 if best and kind == "ms" else best
    rec["metrics"] = m


# ----------------------------------------------------------------------------------------------
# Tables


def cell(vr: dict | None, kind: str) -> str:
    if vr is None:
        return "-"
    if vr["status"] != "ok":
        return vr["status"]
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
    names = sorted(seen, key=lambda n: seen.index(n.split(":")[0]) if n.split(":")[0] in seen else seen.index(n))
    headers = ["spec", *SHAPE_COLS[op]] + (["pattern"] if op != "moe" else []) + names
    headers += [re.sub(r"^(step|tgmm|fwd\+bwd|fwd) ", "", x).replace("pct_peak", "%peak") for x in metrics]
    rows = []
    for r in records:
        row = [r["spec"], *(r["shape"][x] for x in SHAPE_COLS[op])] + ([r["pattern"]] if op != "moe" else [])
        row += [cell(r["variants"][section].get(n), kind) for n in names]
        rows.append(row + [fmt(r["metrics"].get(x), 1 if "%" in x or "pct" in x or x.split()[-1] == "best" else 2)
                           for x in metrics])
    return format_table(headers, rows) if records else None


def notes(records: list[dict]) -> list[str]:
    """One line per distinct skip or failure reason with the specs it applies to, then the
    contention mark's meaning when a figure carries it."""
    reasons: dict[tuple, list] = {}
    for r in records:
        for section, sec in r["variants"].items():
            for v, vr in sec.items():
                if vr["status"] != "ok":
                    reasons.setdefault((section, v, vr["status"], vr.get("reason", "")), []).append(r["spec"])
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
    blas, torch = info["numpy_blas"], info.get("torch")
    print(describe_machine(info))
    print(f"NumPy {info['numpy']}: {blas.get('name')} {blas.get('version')} core={blas.get('corename')} "
          f"threads={blas.get('num_threads')}" + (f"; also timed with OPENBLAS_CORETYPE={info['coretype']}"
                                                  if info.get("coretype") else ""))
    if torch:
        print(f"torch {torch['version']}, {torch['threads']} threads")
    for line in describe_yardsticks(info) if info.get("peaks") else ():
        print(line)
    for w in info.get("warnings", []):
        print(f"warning: {w}")
    sys.stdout.flush()


def print_run(run: dict) -> None:
    op, records = run["benchmark"], run["results"]
    for dtype in dict.fromkeys(r["dtype"] for r in records):
        rows = [r for r in records if r["dtype"] == dtype]
        for section, title, kind, metrics in TABLES[op]:
            columns = [f"{_prefix(section)}best", f"{_prefix(section)}best_is", *metrics] if kind != "gbs" else metrics
            table = section_table(op, rows, section, kind, columns)
            if table is not None:
                print(f"\n== {dtype} {title}\n{table}")
        lines = notes(rows)
        if lines:
            print("notes:\n" + "\n".join(lines))
    if op == "quant" and not run["machine"]["native_peaks"]["int8"]["gflops"]:
        print("\nint8 %vnni: this CPU has no vpdpbusd (AVX512_VNNI / AVX-VNNI); %fma is against the FMA peak")
    sc = run.get("scaling")
    if sc:
        print(f"\n== scaling: {sc['spec']} ({sc['dtype']}, {sc['describe']}), raggeddot at 1..ncpu threads")
        print(format_table(["threads", "actual", "GFLOP/s", "ms", "%peak"], [
            [t, vr.get("actual_threads", "-"), cell(vr, "gflops"), cell(vr, "ms"), fmt(vr.get("pct_peak"), 0)]
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


def _status(t: dict, v) -> str:
    if v is None:
        return "n/a"
    if "at_least" in t or "at_most" in t:
        return "REACHED" if v >= t.get("at_least", -math.inf) and v <= t.get("at_most", math.inf) else "MISSED"
    return "REPORT"


def evaluate(op: str, records: list[dict], scaling: dict | None, ctx: dict, path: str = TARGETS) -> list[dict]:
    """Each target of targets.toml as REACHED / MISSED / REPORT (no bound) / n/a with the
    measured figure."""
    out = []
    at = "" if ctx.get("rd_threads") == 2 else f" (at {ctx.get('rd_threads')} threads; targets are for 2)"
    for t in load_targets(op, path):
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
                        "figure": f"no figure for {', '.join(missing[:3])} (raggeddot or a baseline did not run)"})
        else:
            v, where = found[0] if over == "worst" else found[-1]
            fig = (f"{over} {show(v)} ({where}); median {show(found[len(found) // 2][0])}; "
                   f"range {show(found[0][0])}-{show(found[-1][0])} over {len(found)} specs")
            if metric.startswith("pct_peak") and ctx.get("peak_warnings"):
                fig += "  [FMA peak probe suspect: see warnings]"
            out.append({"target": t["target"], "status": _status(t, v), "value": v, "figure": fig + at})
    return out
