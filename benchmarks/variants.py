"""The variants the benchmarks time, and the problem (inputs, FLOPs, oracle) they share.

A variant's build(case) returns a function that computes the case and returns its outputs as
a dict named like the oracle's (out, dense, d_lhs, d_rhs, and the MoE gradients; the quant
benchmark's out:<mode>), or raises Skip. check() compares every output a variant returns with
the oracle; only then is the function timed.

A 16-bit case (bfloat16, float16) holds the float32 draws rounded; its float32 copies
(Case.inputs32, converted once, outside any timing) are exactly the same values, so the
float32 variants ("f32" variants: rd-f32, the NumPy ones) compute the same product; their
outputs are rounded to the case's dtype before the check.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import moe_baselines as MB
import raggeddot
from raggeddot import reference, specs
from raggeddot._timing import call_time

try:
    import ml_dtypes
except ImportError:  # bfloat16 cases and fp8 weights are then unavailable
    ml_dtypes = None

#: sections of each benchmark: the tables it prints
SECTIONS = {"ragged_dot": ("ragged_dot",), "backward": ("step", "tgmm"), "moe": ("fwd", "fwd+bwd"),
            "quant": ("quant",)}
#: tokens of an MoE spec on which the NumPy version is checked against raggeddot.reference
REFERENCE_TOKENS = 48
#: quantized modes of the quant benchmark: (lhs quantization, rhs quantization), each
#: (qtype, scale layout) or None (float32); per channel: lhs one scale per row [m, 1], rhs
#: one per output column of each group [g, 1, n]; "sub128": one per block of 128 along k
QUANT_MODES = {
    "int8": (("int8", "channel"), ("int8", "channel")),
    "int8-sub128": (("int8", "sub128"), ("int8", "sub128")),
    "int8w": (None, ("int8", "channel")),
    "fp8w": (None, ("float8_e4m3fn", "channel")),
}
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
    f32: bool = False    # on a 16-bit case: gives a float32 result (computed in float32, on Case.inputs32 or
    #                      widening the 16-bit values), rounded to the case's dtype for the check
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
    def bounds(self):
        return specs.group_bounds(self.inputs["group_sizes"])

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
        """ragged_dot and quant: tagged 'memory-bound' or <= MEMORY_BOUND_ROWS rows per group
        (after resizing): the time is reading the weights."""
        s = self.spec.shape
        return "m" in s and ("memory-bound" in self.spec.tags or s["m"] // s["g"] <= specs.MEMORY_BOUND_ROWS)

    def weight_bytes(self, v: Variant) -> float:
        """Bytes of the weights ``v`` reads: rhs[i] of every group with rows, at v.wsize(case)
        bytes a value (default: 4 for a float32 variant of a 16-bit case, else the itemsize)."""
        gs, (g, k, n) = self.inputs["group_sizes"], self.inputs["rhs"].shape
        size = v.wsize(self) if v.wsize else 4 if (v.f32 and self.half) else self.dtype.itemsize
        return float(np.count_nonzero(gs)) * k * n * size


def to_float32(inputs):
    """float32 copies of the 16-bit arrays in ``inputs`` (dicts, tuples and lists walked),
    everything else as it is."""
    if isinstance(inputs, dict):
        return {k: to_float32(v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(to_float32(v) for v in inputs)
    if isinstance(inputs, np.ndarray) and specs.is_half(inputs.dtype):
        return inputs.astype(np.float32)
    return inputs


def as_numpy(x):
    """A variant's output as a NumPy array (torch tensors, bfloat16 ones through ml_dtypes)."""
    if type(x).__module__.startswith("torch"):
        x = x.detach()
        if str(x.dtype) == "torch.bfloat16":
            import torch

            return x.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return x.numpy()
    return np.asarray(x)


def to_torch(torch, a: np.ndarray):
    """A torch tensor sharing ``a``'s memory (bfloat16 through an int16 view)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def need_torch():
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - an optional baseline
        raise Skip(f"torch not importable: {type(e).__name__}") from None
    return torch


def check(v: Variant, fn, c: Case) -> tuple[dict, float]:
    """({status 'ok' or 'FAILED', rel_err(s), reason}, seconds) of one call of fn(), every output
    compared with the oracle in the oracle's dtype (a float32 output of an f32 variant of a
    16-bit case rounded to it first). A variant that raises FAILS."""
    rec, bad, errs = {}, [], {}
    time.sleep(0.05)  # the spinning threads of the previous library (OpenMP, OpenBLAS) go idle
    try:
        res, first = call_time(fn)
        bad = [f"missing output {name}" for name in v.refs if name not in res]
        for name, out in res.items():
            if name not in c.refs:
                bad.append(f"unexpected output {name}")
                continue
            out, ref = as_numpy(out), c.refs[name]
            if v.f32 and c.half and out.dtype == np.float32:
                out = out.astype(c.dtype)
            ok, errs[name] = specs.check(out, ref, ref.dtype)
            if not ok:
                bad.append(f"{name}: rel err {errs[name]:.3g}, dtype {out.dtype}")
    except Exception as e:  # noqa: BLE001 - a variant that raises is reported, not fatal
        return {"status": "FAILED", "reason": f"{type(e).__name__}: {str(e)[:200]}"}, 0.0
    if errs:
        rec["worst"] = max(errs, key=errs.get)
        rec.update(rel_err=errs[rec["worst"]], rel_errs=errs)
    if bad:
        return dict(rec, status="FAILED", reason="; ".join(bad)[:300]), first
    return dict(rec, status="ok"), first


# ----------------------------------------------------------------------------------------------
# The problem of a case: inputs, FLOPs and the oracle


def prepare(spec: specs.Spec, dtype, seed: int, needed: set, cache: dict | None = None) -> Case:
    """The case of ``spec`` (already resized): its inputs, FLOPs and the oracle outputs in
    ``needed``. ragged_dot and backward: raggeddot.reference (``dense`` = reference of
    lhs @ rhs[0]); moe: the NumPy version, itself checked against raggeddot.reference on
    the first REFERENCE_TOKENS tokens (Case.extra['numpy_vs_reference']); a 16-bit moe case
    runs both in float32 on the rounded values and rounds the results to the case's dtype.
    ``out:<mode>`` (quant): the reference product of the dequantized operands."""
    dtype = specs.dtype_of(dtype)
    inputs = specs.make_inputs(spec, dtype, seed=seed, cache=cache)
    c = Case(spec, dtype, inputs, flops={})
    if spec.op == "moe":
        s = spec.shape
        fwd = 3 * 2.0 * s["T"] * s["top_k"] * s["d"] * s["f"] + 2.0 * s["T"] * s["d"] * s["E"]
        fwd += 3 * 2.0 * s["T"] * s["d"] * s.get("shared", 0)
        c.flops = {"fwd": fwd, "fwd+bwd": 3 * fwd}
        i32, dt32 = c.inputs32, (np.dtype(np.float32) if c.half else dtype)
        xs = i32["x"][:REFERENCE_TOKENS]
        ok, err = specs.check(MB.np_forward(i32, x=xs)[0],
                              reference.moe_block(xs, *(i32[a] for a in specs.MOE_ARGS[1:]), **i32["options"]),
                              dt32)
        c.extra["numpy_vs_reference"] = {"status": "ok" if ok else "FAILED", "rel_err": err, "tokens": len(xs)}
        out, res = MB.np_forward(i32, save=True)
        refs = dict(MB.flat_grads(MB.np_backward(i32, res, i32["ct"])) if needed - {"out"} else {}, out=out)
        c.refs = {k: r.astype(dtype) if c.half else r for k, r in refs.items()}
        c.extra["np_res"] = res
        return c
    k, n = spec.shape["k"], spec.shape["n"]
    c.flops = {"flops": 2.0 * float(inputs["group_sizes"].sum()) * k * n, "dense": 2.0 * spec.shape["m"] * k * n}
    c.flops["step"] = 3 * c.flops["flops"]
    if needed & {"out", "d_lhs", "d_rhs"}:
        c.refs.update(specs.run_reference(spec, inputs))
    if "dense" in needed:
        lhs = inputs["lhs"]
        c.refs["dense"] = reference.ragged_dot(lhs, inputs["rhs"][:1], np.array([lhs.shape[0]]))
    for name in sorted(needed):
        if name.startswith("out:"):
            try:
                lhs, rhs = quant_operands(c, name[4:])
            except Skip:  # its variants skip too
                continue
            lhs, rhs = (raggeddot.dequantize(a) if isinstance(a, raggeddot.QArray) else a for a in (lhs, rhs))
            c.refs[name] = reference.ragged_dot(lhs, rhs, inputs["group_sizes"])
    return c


def quant_operands(c: Case, mode: str):
    """(lhs, rhs) of a quant mode: QUANT_MODES' quantized operands (QArray, made once and
    kept in the case), "bf16": the inputs rounded to bfloat16; Skip when the mode cannot
    run on the case (k not a multiple of QUANT_BLOCK, no ml_dtypes)."""
    key = f"q:{mode}"
    if key in c.extra:
        return c.extra[key]
    lhs, rhs = c.inputs["lhs"], c.inputs["rhs"]
    hows = (None, None) if mode == "bf16" else QUANT_MODES[mode]
    if ml_dtypes is None and (mode == "bf16" or "float8_e4m3fn" in hows[1]):
        raise Skip(f"{mode} needs ml_dtypes")
    if any(how and how[1] == "sub128" for how in hows) and lhs.shape[1] % QUANT_BLOCK:
        raise Skip(f"k = {lhs.shape[1]} is not a multiple of the scale block {QUANT_BLOCK}")

    def q(a, how):  # the scales run along every axis but k (axis 1 of both operands)
        if mode == "bf16":
            return a.astype(ml_dtypes.bfloat16)
        if how is None:
            return a
        chan = tuple(x for x in range(a.ndim) if x != 1)
        return raggeddot.quantize(a, how[0], channelwise_axes=chan,
                                  tiled_axes={1: QUANT_BLOCK} if how[1] == "sub128" else None)

    c.extra[key] = (q(lhs, hows[0]), q(rhs, hows[1]))
    return c.extra[key]


# ----------------------------------------------------------------------------------------------
# ragged_dot (and the parts the backward shares)


def _rd(key: str = "inputs"):
    """raggeddot.ragged_dot on the case's inputs (key "inputs32": their float32 copies, a
    16-bit case only)."""
    def build(c):
        if key == "inputs32" and not c.half:
            raise Skip("a float32 twin of a 16-bit case only")
        lhs, rhs, gs = (getattr(c, key)[x] for x in ("lhs", "rhs", "group_sizes"))
        return lambda: {"out": raggeddot.ragged_dot(lhs, rhs, gs)}

    return build


def widening(fn):
    """``fn`` run with the best float kernel family named: bfloat16 products then widen to
    float32 and run FMAs (as on a CPU without vdpbf16ps) instead of the dot-product kernels."""
    family = next(k["name"] for k in raggeddot.build_info()["kernels"] if k["runnable"] and "float32" in k["types"])

    def call():
        with raggeddot.runtime.configured(kernel=family):
            return fn()
    return call


def _widened(build):
    """The variant of ``build`` on a bfloat16 case with the widening path forced."""
    def widened(c):
        if c.dtype.name != "bfloat16":
            raise Skip("the forced widening path of a bfloat16 case only")
        return widening(build(c))

    return widened


def _rd_prepacked(c):
    """ragged_dot on rhs packed once by raggeddot.prepack (outside the timing)."""
    lhs, gs = c.inputs["lhs"], c.inputs["group_sizes"]
    packed = raggeddot.prepack(c.inputs["rhs"])
    return lambda: {"out": raggeddot.ragged_dot(lhs, packed, gs)}


def _np_dense(c):
    lhs, rhs0 = c.inputs32["lhs"], c.inputs32["rhs"][0]
    return lambda: {"dense": lhs @ rhs0}


def _np_loop(c):
    return specs.numpy_loop(c.spec, c.inputs32)


def _torch_dense(c):
    torch = need_torch()
    lhs, rhs0 = to_torch(torch, c.inputs["lhs"]), to_torch(torch, np.ascontiguousarray(c.inputs["rhs"][0]))

    def dense():
        with torch.inference_mode():
            return {"dense": lhs @ rhs0}

    return dense


def _torch_groups(torch, c: Case, name: str, dtype, product):
    """A torch per-group loop: product(i, s, e, rows) writes rows s:e of an [m, n] result of
    ``dtype`` for every group i with rows (the rows past the groups are zeroed): {name: out}."""
    bounds, total = c.bounds, int(c.inputs["group_sizes"].sum())
    m, n = c.inputs["lhs"].shape[0], c.inputs["rhs"].shape[2]

    def loop():
        with torch.inference_mode():
            out = torch.empty((m, n), dtype=dtype)
            for i, s, e in bounds:
                product(i, s, e, out[s:e])
            out[total:] = 0
            return {name: out}

    return loop


def _torch_loop(c):
    torch = need_torch()
    lhs, rhs = to_torch(torch, c.inputs["lhs"]), to_torch(torch, c.inputs["rhs"])
    return _torch_groups(torch, c, "out", lhs.dtype, lambda i, s, e, o: torch.matmul(lhs[s:e], rhs[i], out=o))


def _torch_gmm(c):
    torch = need_torch()
    if not hasattr(torch, "_grouped_mm") or c.dtype == np.float64:
        raise Skip("torch._grouped_mm takes float32/bfloat16/float16 only")
    k, n = c.inputs["rhs"].shape[1:]
    if c.half and ((k * c.dtype.itemsize) % 16 or (n * c.dtype.itemsize) % 16):
        raise Skip(f"torch._grouped_mm needs 16-byte strides on CPU: k = {k}, n = {n} in {c.dtype.name}")
    lhs, rhs = to_torch(torch, c.inputs["lhs"]), to_torch(torch, c.inputs["rhs"])
    offs = torch.from_numpy(np.cumsum(c.inputs["group_sizes"]).astype(np.int32))
    total = int(c.inputs["group_sizes"].sum())

    def gmm():
        with torch.inference_mode():
            out = torch._grouped_mm(lhs, rhs, offs=offs)
            out[total:] = 0  # torch leaves the rows past sum(group_sizes) uninitialised
            return {"out": out}

    return gmm


# ----------------------------------------------------------------------------------------------
# backward: the step and tgmm


def _rd_step(c):
    return lambda: specs.run_raggeddot(c.spec, c.inputs)


def _tgmm(fresh: bool):
    """tgmm(lhs.T, ct, gs) in the case's dtype (megablox's default is float32); ``fresh``: with
    raggeddot's result-buffer cache off, so that every call pays the OS's zeroing of new pages."""
    def build(c):
        lhs_t, ct, gs, dt = c.inputs["lhs"].T, c.inputs["ct"], c.inputs["group_sizes"], c.dtype

        def call():
            limit = raggeddot.set_buffer_cache(0) if fresh else None  # also frees the previous call's block
            try:
                return {"d_rhs": raggeddot.tgmm(lhs_t, ct, gs, preferred_element_type=dt)}
            finally:
                if fresh:
                    raggeddot.set_buffer_cache(limit)

        return call

    return build


def _np_tgmm(c):
    lhs, ct, bounds = c.inputs32["lhs"], c.inputs32["ct"], c.bounds
    (g, k, n), dt = c.inputs["rhs"].shape, lhs.dtype
    empty = np.flatnonzero(c.inputs["group_sizes"] == 0)

    def loop():
        d_rhs = np.empty((g, k, n), dtype=dt)
        for i, s, e in bounds:
            np.matmul(lhs[s:e].T, ct[s:e], out=d_rhs[i])
        d_rhs[empty] = 0
        return {"d_rhs": d_rhs}

    return loop


# ----------------------------------------------------------------------------------------------
# moe


def _moe(kind: str, backward: bool):
    def build(c):
        if kind == "numpy":
            if c.extra["numpy_vs_reference"]["status"] != "ok":
                raise Skip(f"the NumPy version disagrees with raggeddot.reference ({REFERENCE_TOKENS} tokens)")
            return MB.numpy_fn(c.inputs32, backward)
        if kind in ("torch", *MB.HF_IMPLEMENTATIONS):
            if (not c.half or backward) if kind == "torch" else c.dtype != np.float32:
                raise Skip("the 16-bit expert loop, forward only (float32: hf-eager)" if kind == "torch" else
                           "transformers' blocks run float32 specs (16-bit: the torch loop)")
            try:
                if kind == "torch":
                    return MB.torch_half_fn(need_torch(), c.inputs32, c.dtype.name)
                return MB.hf_fn(need_torch(), c.inputs, backward, kind)
            except (ImportError, MB.Unsupported) as e:
                raise Skip(f"{type(e).__name__}: {e}") from None
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

    return build


def _moe_variants(phase: str, backward: bool) -> list[Variant]:
    refs = ("out",) + (MB.MAIN_GRADS if backward else ())
    return [Variant("raggeddot", phase, _moe("raggeddot", backward), refs, phase, memory=True),
            Variant("rd-f32", phase, _moe("rd-f32", backward), refs, phase, f32=True),
            Variant("rd-widen", phase, _widened(_moe("raggeddot", backward)), refs, phase),
            Variant("numpy", phase, _moe("numpy", backward), refs, phase, numpy=True, memory=True, f32=True),
            Variant("torch", phase, _moe("torch", backward), refs, phase),
            Variant("hf-eager", phase, _moe("eager", backward), refs, phase),
            Variant("hf-gmm", phase, _moe("grouped_mm", backward), refs, phase)]


def run_gathers(c: Case, timer) -> dict:
    """ragged_gather (x -> [N, d]) and ragged_gather_reduce ([N, d] -> [T, d], weighted) on
    the routing of the NumPy forward, checked, then timed with timer(fn) -> timing dict.
    A 16-bit case gathers its own arrays (y and w rounded to its dtype)."""
    r, x, k = c.extra["np_res"], c.inputs["x"], c.spec.shape["top_k"]
    tok, slot, w, y = r["tok"], r["slot"], r["w"], r["y"]
    if c.half:
        w, y = w.astype(c.dtype), y.astype(c.dtype)
    w32, y32 = (w.astype(np.float32), y.astype(np.float32)) if c.half else (w, y)
    want = np.zeros(x.shape, dtype=np.result_type(w32, y32))
    for j in range(k):
        want += w32[:, j, None] * y32[slot[:, j]]
    ok, err = specs.check(raggeddot.ragged_gather_reduce(y, slot, w), want.astype(c.dtype, copy=False), c.dtype)
    if not (ok and np.array_equal(raggeddot.ragged_gather(x, tok), x[tok])):
        return {"status": "FAILED", "rel_err": err}
    tg = timer(lambda: raggeddot.ragged_gather(x, tok))
    tr = timer(lambda: raggeddot.ragged_gather_reduce(y, slot, w))
    return {"status": "ok", "gather": tg, "gather_reduce": tr, "total_s": tg["median_s"] + tr["median_s"],
            "bytes": int((tok.size * x.shape[1] * 2 + x.shape[0] * x.shape[1] * (k + 1)) * c.dtype.itemsize)}


# ----------------------------------------------------------------------------------------------
# quant: raggeddot on quantized operands against its float32 and bfloat16 products and torch


def _rd_quant(mode: str, prepacked: bool = False):
    """ragged_dot on the operands of ``mode``; ``prepacked``: on its quantized rhs laid out once
    by raggeddot.prepack (outside the timing), one byte a weight read in place and dequantized
    in the micro-kernel."""
    def build(c):
        lhs, rhs = quant_operands(c, mode)
        rhs = _prepacked(c, mode) if prepacked else rhs
        gs = c.inputs["group_sizes"]
        return lambda: {f"out:{mode}": raggeddot.ragged_dot(lhs, rhs, gs)}

    return build


def _prepacked(c: Case, mode: str):
    """The quantized rhs of ``mode`` prepacked once (kept in the case), or Skip."""
    key = f"qp:{mode}"
    if key not in c.extra:
        try:
            c.extra[key] = raggeddot.prepack(quant_operands(c, mode)[1])
        except (TypeError, ValueError) as e:
            raise Skip(f"prepack refuses the {mode} weights: {str(e)[:120]}") from None
    return c.extra[key]


def _qsize(mode: str, prepacked: bool = False):
    """Bytes a quantized weight value costs: its storage plus its share of the scales; prepacked:
    the layout's bytes (values, panel padding, the scales after each panel) over the values."""
    def size(c):
        if prepacked:
            packed = _prepacked(c, mode)
            return packed.nbytes / max(int(np.prod(packed.shape)), 1)
        rhs = quant_operands(c, mode)[1]
        return (rhs.qvalue.nbytes + rhs.scale.nbytes) / max(rhs.size, 1)

    return size


def _torch_int_mm(c):
    """int8 x int8 per group with torch._int_mm (int32 accumulation), the per-row and
    per-column scales applied after: the per-channel "int8" mode."""
    torch = need_torch()
    lq, rq = quant_operands(c, "int8")
    a, b = torch.from_numpy(lq.qvalue), torch.from_numpy(rq.qvalue)
    sa, sb = torch.from_numpy(lq.scale), torch.from_numpy(rq.scale)  # [m, 1], [g, 1, n]

    def product(i, s, e, rows):
        torch.mul(torch._int_mm(a[s:e], b[i]).to(torch.float32), sa[s:e] * sb[i], out=rows)

    return _torch_groups(torch, c, "out:int8", torch.float32, product)


def _torch_int8w(c):
    """Weight-only int8 per group with torch._weight_int8pack_mm (float32 activations, int8
    weights in nn.Linear's [n, k] layout made once, one scale per output column): "int8w"."""
    torch = need_torch()
    rq = quant_operands(c, "int8w")[1]
    x = torch.from_numpy(c.inputs["lhs"])
    w = torch.from_numpy(np.ascontiguousarray(rq.qvalue.transpose(0, 2, 1)))  # [g, n, k]
    sc = torch.from_numpy(np.ascontiguousarray(rq.scale[:, 0, :]))  # [g, n]

    def product(i, s, e, rows):
        rows[:] = torch._weight_int8pack_mm(x[s:e], w[i], sc[i])

    return _torch_groups(torch, c, "out:int8w", torch.float32, product)


def _quant_variants() -> list[Variant]:
    out = [Variant("rd-f32", "quant", _rd(), ("out",), "flops", threads="rd"),
           Variant("rd-bf16", "quant", _rd_quant("bf16"), ("out:bf16",), "flops", threads="rd", wsize=lambda c: 2)]
    for mode in QUANT_MODES:
        out.append(Variant(mode, "quant", _rd_quant(mode), (f"out:{mode}",), "flops", threads="rd", mode=mode,
                           wsize=_qsize(mode)))
    for mode in QUANT_PREPACKED:
        out.append(Variant(f"{mode}-prepacked", "quant", _rd_quant(mode, True), (f"out:{mode}",), "flops",
                           threads="rd", mode=mode, wsize=_qsize(mode, True)))
    return out + [
        Variant("torch-int8", "quant", _torch_int_mm, ("out:int8",), "flops", mode="int8", wsize=_qsize("int8")),
        Variant("torch-int8w", "quant", _torch_int8w, ("out:int8w",), "flops", mode="int8w", wsize=_qsize("int8w"))]


VARIANTS: dict[str, list[Variant]] = {
    "ragged_dot": [
        Variant("raggeddot", "ragged_dot", _rd(), ("out",), "flops", threads="rd"),
        Variant("rd-f32", "ragged_dot", _rd("inputs32"), ("out",), "flops", threads="rd", f32=True),
        Variant("rd-widen", "ragged_dot", _widened(_rd()), ("out",), "flops", threads="rd"),
        Variant("rd-prepacked", "ragged_dot", _rd_prepacked, ("out",), "flops", threads="rd"),
        Variant("np-dense", "ragged_dot", _np_dense, ("dense",), "dense", threads="blas", numpy=True, f32=True),
        Variant("np-loop", "ragged_dot", _np_loop, ("out",), "flops", numpy=True, f32=True),
        Variant("torch-dense", "ragged_dot", _torch_dense, ("dense",), "dense"),
        Variant("torch-loop", "ragged_dot", _torch_loop, ("out",), "flops"),
        Variant("torch-gmm", "ragged_dot", _torch_gmm, ("out",), "flops"),
    ],
    "backward": [
        Variant("raggeddot", "step", _rd_step, ("out", "d_lhs", "d_rhs"), "step", threads="rd"),
        Variant("np-loop", "step", _np_loop, ("out", "d_lhs", "d_rhs"), "step", numpy=True, f32=True),
        Variant("tgmm", "tgmm", _tgmm(False), ("d_rhs",), "flops", threads="rd"),
        Variant("tgmm-fresh", "tgmm", _tgmm(True), ("d_rhs",), "flops", threads="rd"),
        Variant("forward", "tgmm", _rd(), ("out",), "flops", threads="rd"),
        Variant("np-loop", "tgmm", _np_tgmm, ("d_rhs",), "flops", numpy=True, f32=True),
        Variant("np-dense", "tgmm", _np_dense, ("dense",), "dense", threads="blas", numpy=True, f32=True),
    ],
    "moe": _moe_variants("fwd", False) + _moe_variants("fwd+bwd", True),
    "quant": _quant_variants(),
}


def variant(op: str, name: str) -> Variant:
    """The variant ``name`` of benchmark ``op`` (of its first section: moe's forward)."""
    return next(v for v in VARIANTS[op] if v.name == name)
