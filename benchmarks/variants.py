"""The variants the benchmarks time, and the problem (inputs, FLOPs, oracle) they share.

A variant's build(case) returns a function computing the case's outputs as a dict named like
the oracle's (out, dense, d_lhs, d_rhs, the MoE gradients, quant's out:<mode>), or raises Skip.
A 16-bit case holds the float32 draws rounded; its float32 copies (Case.inputs32, made once,
outside any timing) are the same values, so the "f32" variants (rd-f32, the NumPy ones)
compute the same product, their results rounded for the check.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

import moe_baselines as MB
import raggeddot
from raggeddot import reference, specs
from raggeddot._timing import call_time

#: sections of each benchmark: the tables it prints
SECTIONS = {"ragged_dot": ("ragged_dot",), "backward": ("step", "tgmm"), "moe": ("fwd", "fwd+bwd"),
            "quant": ("quant",)}
#: tokens of an MoE spec on which the NumPy layer is checked against raggeddot.reference
REFERENCE_TOKENS = 48
#: quantized modes of the quant benchmark: (lhs quantization, rhs quantization), each
#: (qtype, scale layout) or None (float32); per channel: lhs one scale per row [m, 1], rhs
#: one per output column of each group [g, 1, n]; "sub128": one per block of 128 along k
QUANT_MODES = {"int8": (("int8", "channel"),) * 2, "int8-sub128": (("int8", "sub128"),) * 2,
               "int8w": (None, ("int8", "channel")), "fp8w": (None, ("float8_e4m3fn", "channel"))}
QUANT_BLOCK = 128
#: the weight-only modes also timed on weights prepacked once ("<mode>-prepacked")
QUANT_PREPACKED = ("int8w", "fp8w")


class Skip(Exception):
    """The variant does not run on this case (the reason is the message)."""


@dataclass
class Variant:
    name: str
    section: str
    build: Callable
    refs: tuple          # oracle outputs it must return
    flops: str           # key of Case.flops its GFLOP/s uses
    threads: str | None = None   # 'rd' (raggeddot's) or 'blas' (OpenBLAS's): expected for the '*' mark
    numpy: bool = False  # timed again in a process with OPENBLAS_CORETYPE set
    memory: bool = False  # peak extra memory measured (tracemalloc)
    f32: bool = False    # on a 16-bit case: a float32 result, rounded to the case's dtype for the check
    mode: str | None = None  # quant: the QUANT_MODES entry it multiplies
    wsize: Callable | None = None  # bytes it reads per weight value (default: its dtype's itemsize)


@dataclass
class Case:
    spec: specs.Spec     # resized
    dtype: np.dtype
    inputs: dict
    flops: dict
    refs: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def half(self) -> bool:
        return specs.is_half(self.dtype)

    @property
    def inputs32(self) -> dict:
        """The inputs in float32 (those of a float32 or float64 case as they are), made once."""
        if "inputs32" not in self.extra:
            self.extra["inputs32"] = to_float32(self.inputs) if self.half else self.inputs
        return self.extra["inputs32"]

    @property
    def memory_bound(self) -> bool:
        """ragged_dot and quant: <= MEMORY_BOUND_ROWS rows a group (after resizing; the specs
        tagged 'memory-bound'): the time is reading the weights."""
        s = self.spec.shape
        return "m" in s and s["m"] // s["g"] <= specs.MEMORY_BOUND_ROWS

    def weight_bytes(self, v: Variant) -> float:
        """Bytes of the weights ``v`` reads: rhs[i] of every group with rows, at v.wsize(case)
        bytes a value (default: 4 for a float32 variant of a 16-bit case, else the itemsize)."""
        gs, (_, k, n) = self.inputs["group_sizes"], self.inputs["rhs"].shape
        size = v.wsize(self) if v.wsize else 4 if (v.f32 and self.half) else self.dtype.itemsize
        return float(np.count_nonzero(gs)) * k * n * size


def to_float32(inputs):
    """float32 copies of the 16-bit arrays in ``inputs`` (dicts, tuples and lists walked)."""
    if isinstance(inputs, dict):
        return {k: to_float32(v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(map(to_float32, inputs))
    return inputs.astype(np.float32) if isinstance(inputs, np.ndarray) and specs.is_half(inputs.dtype) else inputs


def need_torch():
    """torch and raggeddot.torch's conversions of arrays to tensors and back (no copies), or Skip."""
    try:
        from raggeddot.torch import _convert
    except Exception as e:  # noqa: BLE001 - an optional baseline
        raise Skip(f"torch not importable: {type(e).__name__}") from None
    return _convert.torch, _convert.tensor, _convert.array


def check(v: Variant, fn, c: Case) -> tuple[dict, float]:
    """({status 'ok' or 'FAILED', rel_err(s), reason}, seconds) of one call of fn() (raising:
    FAILED), every output compared with the oracle in its dtype (f32 variants' outputs rounded)."""
    errs = {}
    time.sleep(0.05)  # the spinning threads of the previous library (OpenMP, OpenBLAS) go idle
    try:
        res, first = call_time(fn)
        bad = [f"missing output {name}" for name in v.refs if name not in res]
        bad += [f"unexpected output {name}" for name in res if name not in c.refs]
        for name, out in res.items():
            if name in c.refs:
                out = np.asarray(need_torch()[2](out) if type(out).__module__.startswith("torch") else out)
                ok, errs[name] = specs.check(out.astype(c.dtype) if v.f32 and c.half else out, c.refs[name],
                                             c.refs[name].dtype)
                if not ok:
                    bad.append(f"{name}: rel err {errs[name]:.3g}, dtype {out.dtype}")
    except Exception as e:  # noqa: BLE001 - a variant that raises is reported, not fatal
        return {"status": "FAILED", "reason": f"{type(e).__name__}: {str(e)[:200]}"}, 0.0
    rec = dict(rel_err=max(errs.values()), rel_errs=errs) if errs else {}
    return dict(rec, status="FAILED", reason="; ".join(bad)[:300]) if bad else dict(rec, status="ok"), first


def prepare(spec: specs.Spec, dtype, seed: int, needed: set, cache: dict | None = None) -> Case:
    """The case of ``spec`` (already resized): its inputs, FLOPs and the oracle outputs in
    ``needed``. ragged_dot and backward: raggeddot.reference (``dense`` = reference of
    lhs @ rhs[0]); moe: the NumPy layer, itself checked against raggeddot.reference on
    the first REFERENCE_TOKENS tokens (Case.extra['numpy_vs_reference']); a 16-bit moe case
    runs both in float32 on the rounded values and rounds the results to the case's dtype.
    ``out:<mode>`` (quant): the reference product of the dequantized operands."""
    dtype = specs.dtype_of(dtype)
    c = Case(spec, dtype, specs.make_inputs(spec, dtype, seed=seed, cache=cache), flops={})
    s = spec.shape
    if spec.op == "moe":
        i32 = c.inputs32
        fwd = 2.0 * s["T"] * s["d"] * (3 * s["top_k"] * s["f"] + s["E"] + 3 * s.get("shared", 0))
        c.flops = {"fwd": fwd, "fwd+bwd": 3 * fwd}
        xs, args = i32["x"][:REFERENCE_TOKENS], [i32[a] for a in specs.MOE_ARGS[1:]]
        ok, err = specs.check(MB.np_forward(i32, x=xs)[0], reference.moe_block(xs, *args, **i32["options"]),
                              np.float32 if c.half else dtype)
        c.extra["numpy_vs_reference"] = dict(status="ok" if ok else "FAILED", rel_err=err, tokens=len(xs))
        out, c.extra["np_res"] = MB.np_forward(i32, save=True)
        grads = MB.flat_grads(MB.np_backward(i32, c.extra["np_res"], i32["ct"])) if needed - {"out"} else {}
        c.refs = {k: r.astype(dtype) if c.half else r for k, r in dict(grads, out=out).items()}
        return c
    c.flops = {"flops": 2.0 * float(c.inputs["group_sizes"].sum()) * s["k"] * s["n"],
               "dense": 2.0 * s["m"] * s["k"] * s["n"]}
    c.flops["step"] = 3 * c.flops["flops"]
    if needed & {"out", "d_lhs", "d_rhs"}:
        c.refs.update(specs.run_reference(spec, c.inputs))
    if "dense" in needed:
        c.refs["dense"] = reference.ragged_dot(c.inputs["lhs"], c.inputs["rhs"][:1], np.array([s["m"]]))
    for name in sorted(n for n in needed if n.startswith("out:")):
        try:
            ops = [raggeddot.dequantize(a) if isinstance(a, raggeddot.QArray) else a
                   for a in quant_operands(c, name[4:])]
        except Skip:  # its variants skip too
            continue
        c.refs[name] = reference.ragged_dot(*ops, c.inputs["group_sizes"])
    return c


def quant_operands(c: Case, mode: str):
    """(lhs, rhs) of a quant mode: QUANT_MODES' quantized operands (QArray, made once and
    kept in the case); Skip when the mode cannot run on the case (k not a multiple of QUANT_BLOCK)."""
    key, k, hows = f"q:{mode}", c.inputs["lhs"].shape[1], QUANT_MODES[mode]
    if any(how and how[1] == "sub128" for how in hows) and k % QUANT_BLOCK:
        raise Skip(f"k = {k} is not a multiple of the scale block {QUANT_BLOCK}")

    def q(a, how):  # the scales run along every axis but k (axis 1 of both operands)
        if how is None:
            return a
        return raggeddot.quantize(a, how[0], channelwise_axes=tuple(x for x in range(a.ndim) if x != 1),
                                  tiled_axes={1: QUANT_BLOCK} if how[1] == "sub128" else None)

    if key not in c.extra:
        c.extra[key] = (q(c.inputs["lhs"], hows[0]), q(c.inputs["rhs"], hows[1]))
    return c.extra[key]


def _rd(c: Case, key: str = "inputs", prepacked: bool = False):
    """raggeddot.ragged_dot on the case's inputs (key "inputs32": their float32 copies, a 16-bit
    case only); ``prepacked``: on rhs packed once by raggeddot.prepack (outside the timing)."""
    if key == "inputs32" and not c.half:
        raise Skip("a float32 twin of a 16-bit case only")
    lhs, rhs, gs = (getattr(c, key)[x] for x in ("lhs", "rhs", "group_sizes"))
    rhs = raggeddot.prepack(rhs) if prepacked else rhs
    return lambda: {"out": raggeddot.ragged_dot(lhs, rhs, gs)}


def _on_kernel(c: Case, build, named: str | None = None):
    """build(c) on a bfloat16 case run on one kernel family: ``named`` (the vdpbf16ps family, where
    the CPU has it: measured whatever auto takes here), or the best float family, whose products
    widen to float32 and run FMAs, not the dot kernels."""
    if c.dtype.name != "bfloat16":
        raise Skip(f"the {'vdpbf16ps' if named else 'forced widening'} path of a bfloat16 case only")
    if named and named not in raggeddot.runtime.runnable_kernels():
        raise Skip("this CPU has no vdpbf16ps")
    fn = build(c)
    family = named or next(k["name"] for k in raggeddot.build_info()["kernels"]
                           if k["runnable"] and "float32" in k["types"])

    def call():
        with raggeddot.runtime.configured(kernel=family):
            return fn()
    return call


def _np_loop(c: Case):
    return specs.numpy_loop(c.spec, c.inputs32)


def _np_dense(c: Case):
    lhs, rhs0 = c.inputs32["lhs"], c.inputs32["rhs"][0]
    return lambda: {"dense": lhs @ rhs0}


def _np_tgmm(c: Case):
    lhs, ct, (g, k, n) = c.inputs32["lhs"], c.inputs32["ct"], c.inputs["rhs"].shape
    bounds, empty = specs.group_bounds(c.inputs["group_sizes"]), np.flatnonzero(c.inputs["group_sizes"] == 0)

    def loop():
        d_rhs = np.empty((g, k, n), dtype=lhs.dtype)
        for i, s, e in bounds:
            np.matmul(lhs[s:e].T, ct[s:e], out=d_rhs[i])
        d_rhs[empty] = 0
        return {"d_rhs": d_rhs}
    return loop


def _tgmm(c: Case, fresh: bool = False):
    """tgmm(lhs.T, ct, gs) in the case's dtype (megablox's default is float32); ``fresh``: with
    raggeddot's result-buffer cache off, so that every call pays the OS's zeroing of new pages."""
    lhs_t, ct, gs, dt = c.inputs["lhs"].T, c.inputs["ct"], c.inputs["group_sizes"], c.dtype

    def call():
        limit = raggeddot.set_buffer_cache(0) if fresh else None  # also frees the last call's block
        try:
            return {"d_rhs": raggeddot.tgmm(lhs_t, ct, gs, preferred_element_type=dt)}
        finally:
            if fresh:
                raggeddot.set_buffer_cache(limit)
    return call


def _torch(c: Case, product, name: str = "out", dense: bool = False):
    """A torch baseline: product(torch, tensor, case) -> fn(i, s, e, rows) writing rows s:e of the
    [m, n] result for every group i with rows (the rows past the groups zeroed; ``dense``: rows
    of lhs @ rhs[0]), under torch.inference_mode; its result named ``name``."""
    torch, tensor, _ = need_torch()
    fn, gs = product(torch, tensor, c), c.inputs["group_sizes"]
    m, n, total = c.inputs["lhs"].shape[0], c.inputs["rhs"].shape[2], int(gs.sum())
    dt = tensor(c.inputs["lhs"]).dtype if name == "out" else torch.float32

    def call():
        with torch.inference_mode():
            out = torch.empty((m, n), dtype=dt)
            for i, s, e in [(0, 0, m)] if dense else specs.group_bounds(gs):
                fn(i, s, e, out[s:e])
            out[m if dense else total:] = 0
            return {"dense" if dense else name: out}
    return call


def _torch_matmul(torch, tensor, c: Case):
    lhs, rhs = tensor(c.inputs["lhs"]), tensor(c.inputs["rhs"])
    return lambda i, s, e, rows: torch.matmul(lhs[s:e], rhs[i], out=rows)


def _torch_gmm(c: Case):
    torch, tensor, _ = need_torch()
    k, n = c.inputs["rhs"].shape[1:]
    if c.dtype == np.float64 or (c.half and ((k * c.dtype.itemsize) % 16 or (n * c.dtype.itemsize) % 16)):
        raise Skip("torch._grouped_mm takes float32 and 16-bit operands with 16-byte strides on CPU")
    lhs, rhs, gs = tensor(c.inputs["lhs"]), tensor(c.inputs["rhs"]), c.inputs["group_sizes"]
    offs, total = torch.from_numpy(np.cumsum(gs).astype(np.int32)), int(gs.sum())

    def gmm():
        with torch.inference_mode():
            out = torch._grouped_mm(lhs, rhs, offs=offs)
            out[total:] = 0  # torch leaves the rows past sum(group_sizes) uninitialised
            return {"out": out}
    return gmm


def _moe(c: Case, kind: str, backward: bool):
    """moe_block ("moe_block", "rd-f32"), or moe_baselines' "numpy" or "torch" layer."""
    if kind == "numpy":
        if c.extra["numpy_vs_reference"]["status"] != "ok":
            raise Skip(f"the NumPy layer disagrees with raggeddot.reference ({REFERENCE_TOKENS} tokens)")
        return MB.numpy_fn(c.inputs32, backward)
    if kind == "torch":
        if c.dtype == np.float64 or (c.half and backward):
            raise Skip("torch's expert loop here: float32, and 16-bit forwards")
        try:
            return MB.torch_fn(need_torch()[0], c.inputs32, backward, c.dtype.name)
        except MB.Unsupported as e:
            raise Skip(str(e)) from None
    if kind == "rd-f32" and not c.half:
        raise Skip("a float32 twin of a 16-bit case only")
    inputs = c.inputs32 if kind == "rd-f32" else c.inputs
    args, kw = [inputs[a] for a in specs.MOE_ARGS], inputs["options"]
    if not backward:
        return lambda: {"out": raggeddot.moe_block(*args, **kw)}

    def fwd_bwd():
        out, vjp_fn = raggeddot.moe_block_vjp(*args, **kw)
        return dict(MB.flat_grads(vjp_fn(inputs["ct"])), out=out)
    return fwd_bwd


def _moe_variants(phase: str, backward: bool) -> list[Variant]:
    refs = ("out",) + (MB.MAIN_GRADS if backward else ())

    def v(name, kind, **kw):
        return Variant(name, phase, partial(_moe, kind=kind, backward=backward), refs, phase, **kw)
    rd = v("raggeddot", "moe_block", memory=True)
    return [rd, v("rd-f32", "rd-f32", f32=True),
            Variant("rd-widen", phase, partial(_on_kernel, build=rd.build), refs, phase),
            Variant("rd-vdpbf16", phase, partial(_on_kernel, build=rd.build, named="avx512-bf16"), refs, phase),
            v("numpy", "numpy", numpy=True, memory=True, f32=True), v("torch", "torch")]


def run_gathers(c: Case, timer) -> dict:
    """ragged_gather (x -> [N, d]) and ragged_gather_reduce ([N, d] -> [T, d], weighted) on the
    NumPy forward's routing (a 16-bit case: y, w rounded), checked, then timed with timer(fn)."""
    r, x, k = c.extra["np_res"], c.inputs["x"], c.spec.shape["top_k"]
    tok, slot, w, y = r["tok"], r["slot"], *(r[a].astype(c.dtype, copy=False) for a in "wy")
    want = np.zeros(x.shape, dtype=np.float64)
    for j in range(k):
        want += w[:, j, None].astype(np.float64) * y[slot[:, j]].astype(np.float64)
    ok, err = specs.check(raggeddot.ragged_gather_reduce(y, slot, w), want.astype(c.dtype), c.dtype)
    if not (ok and np.array_equal(raggeddot.ragged_gather(x, tok), x[tok])):
        return {"status": "FAILED", "rel_err": err}
    tg = timer(lambda: raggeddot.ragged_gather(x, tok))
    tr = timer(lambda: raggeddot.ragged_gather_reduce(y, slot, w))
    return {"status": "ok", "gather": tg, "gather_reduce": tr, "total_s": tg["median_s"] + tr["median_s"],
            "bytes": int((tok.size * x.shape[1] * 2 + x.shape[0] * x.shape[1] * (k + 1)) * c.dtype.itemsize)}


def _quant_rhs(c: Case, mode: str, prepacked: bool):
    """The quantized rhs of ``mode``; ``prepacked``: prepacked once (kept in the case), or Skip."""
    key = f"qp:{mode}"
    if prepacked and key not in c.extra:
        try:
            c.extra[key] = raggeddot.prepack(quant_operands(c, mode)[1])
        except (TypeError, ValueError) as e:
            raise Skip(f"prepack refuses the {mode} weights: {str(e)[:120]}") from None
    return c.extra[key] if prepacked else quant_operands(c, mode)[1]


def _rd_quant(c: Case, mode: str, prepacked: bool = False):
    """ragged_dot on the operands of ``mode``; ``prepacked``: on its rhs prepacked outside the
    timing, one byte a weight read in place and dequantized in the micro-kernel."""
    lhs, rhs, gs = quant_operands(c, mode)[0], _quant_rhs(c, mode, prepacked), c.inputs["group_sizes"]
    return lambda: {f"out:{mode}": raggeddot.ragged_dot(lhs, rhs, gs)}


def _qsize(c: Case, mode: str, prepacked: bool = False):
    """Bytes a quantized weight value costs: its storage plus its share of the scales; prepacked:
    the layout's bytes (values, panel padding, the scales after each panel) over the values."""
    w = _quant_rhs(c, mode, prepacked)
    return (w.nbytes if prepacked else w.qvalue.nbytes + w.scale.nbytes) / max(int(np.prod(w.shape)), 1)


def _torch_int_mm(torch, tensor, c: Case):
    """int8 x int8 per group with torch._int_mm (int32 accumulation), the per-row and
    per-column scales applied after: the per-channel "int8" mode."""
    lq, rq = quant_operands(c, "int8")
    a, b, sa, sb = (torch.from_numpy(x) for x in (lq.qvalue, rq.qvalue, lq.scale, rq.scale))  # sa [m, 1]

    def product(i, s, e, rows):
        torch.mul(torch._int_mm(a[s:e], b[i]).to(torch.float32), sa[s:e] * sb[i], out=rows)
    return product


def _quant(mode: str, prepacked: bool) -> Variant:
    """The variant of quant mode ``mode`` (``prepacked``: "<mode>-prepacked")."""
    how = dict(mode=mode, prepacked=prepacked)
    return Variant(mode + ("-prepacked" if prepacked else ""), "quant", partial(_rd_quant, **how), (f"out:{mode}",),
                   "flops", threads="rd", mode=mode, wsize=partial(_qsize, **how))


STEP = ("out", "d_lhs", "d_rhs")
VARIANTS: dict[str, list[Variant]] = {
    "ragged_dot": [
        Variant("raggeddot", "ragged_dot", _rd, ("out",), "flops", threads="rd"),
        Variant("rd-f32", "ragged_dot", partial(_rd, key="inputs32"), ("out",), "flops", threads="rd", f32=True),
        Variant("rd-widen", "ragged_dot", partial(_on_kernel, build=_rd), ("out",), "flops", threads="rd"),
        Variant("rd-vdpbf16", "ragged_dot", partial(_on_kernel, build=_rd, named="avx512-bf16"), ("out",), "flops",
                threads="rd"),
        Variant("rd-prepacked", "ragged_dot", partial(_rd, prepacked=True), ("out",), "flops", threads="rd"),
        Variant("np-dense", "ragged_dot", _np_dense, ("dense",), "dense", threads="blas", numpy=True, f32=True),
        Variant("np-loop", "ragged_dot", _np_loop, ("out",), "flops", numpy=True, f32=True),
        Variant("torch-dense", "ragged_dot", partial(_torch, product=_torch_matmul, dense=True), ("dense",), "dense"),
        Variant("torch-loop", "ragged_dot", partial(_torch, product=_torch_matmul), ("out",), "flops"),
        Variant("torch-gmm", "ragged_dot", _torch_gmm, ("out",), "flops"),
    ],
    "backward": [
        Variant("raggeddot", "step", lambda c: lambda: specs.run_raggeddot(c.spec, c.inputs), STEP, "step",
                threads="rd"),
        Variant("np-loop", "step", _np_loop, STEP, "step", numpy=True, f32=True),
        Variant("tgmm", "tgmm", _tgmm, ("d_rhs",), "flops", threads="rd"),
        Variant("tgmm-fresh", "tgmm", partial(_tgmm, fresh=True), ("d_rhs",), "flops", threads="rd"),
        Variant("forward", "tgmm", _rd, ("out",), "flops", threads="rd"),
        Variant("np-loop", "tgmm", _np_tgmm, ("d_rhs",), "flops", numpy=True, f32=True),
    ],
    "moe": _moe_variants("fwd", False) + _moe_variants("fwd+bwd", True),
    "quant": [Variant("rd-f32", "quant", _rd, ("out",), "flops", threads="rd"),
              *(_quant(mode, False) for mode in QUANT_MODES), *(_quant(mode, True) for mode in QUANT_PREPACKED),
              Variant("torch-int8", "quant", partial(_torch, product=_torch_int_mm, name="out:int8"), ("out:int8",),
                      "flops", mode="int8", wsize=partial(_qsize, mode="int8"))],
}


def variant(op: str, name: str, section: str | None = None) -> Variant:
    """The variant ``name`` of benchmark ``op`` in ``section`` (default its first: moe's forward)."""
    return next(v for v in VARIANTS[op] if v.name == name and section in (None, v.section))
