"""The variants each benchmark times, and the problem (inputs, FLOPs, oracle) they share.

A variant's build(env, case) returns a function that computes the case and returns its
outputs as a dict named like the oracle's (out, dense, d_lhs, d_rhs, and the MoE gradients;
the quant benchmark's out:<mode>), or raises Skip. The runner checks every output a variant
returns against the oracle, then times the function.

A 16-bit case (bfloat16, float16) holds the float32 draws rounded; its float32 copies
(Case.inputs32, converted once, outside any timing) are exactly the same values, so the
float32 variants ("f32" variants: rd-f32, the NumPy ones) compute the same product; their
outputs are rounded to the case's dtype before the check.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import moe_baselines as MB
import raggeddot
from raggeddot import reference, specs

try:
    import ml_dtypes
except ImportError:  # bfloat16 cases and fp8 weights are then unavailable
    ml_dtypes = None

#: sections of each benchmark: the tables it prints
SECTIONS = {"ragged_dot": ("ragged_dot",), "backward": ("step", "tgmm"), "moe": ("fwd", "fwd+bwd"),
            "quant": ("quant",)}

#: XLA's masked lowering copies an operand per group; above this the jax variant does not run
JAX_MAX_MASK_BYTES = 2 << 30
#: tokens of an MoE spec on which the NumPy version is checked against raggeddot.reference
REFERENCE_TOKENS = 48
#: NumPy's own 16-bit matmul (no BLAS; ~0.05-0.15 GFLOP/s) runs only up to these FLOPs
NP_HALF_MAX_FLOPS = 4e7
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
    jit: bool = False    # the first call compiles: always warmed up
    memory: bool = False  # peak extra memory measured (tracemalloc)
    sync: Callable | None = None
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

    def weight_bytes(self, v: "Variant") -> float:
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
    """A variant's output as a NumPy array: torch tensors (bfloat16 ones through ml_dtypes)
    and jax arrays converted, NumPy arrays as they are."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        x = x.detach()
        if str(x.dtype) == "torch.bfloat16":
            import torch

            return x.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return x.numpy()
    return np.asarray(x)


def to_torch(torch, a: np.ndarray):
    """A torch tensor sharing ``a``'s memory (bfloat16 through an int16 view)."""
    if specs.is_half(a.dtype) and a.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


# ----------------------------------------------------------------------------------------------
# Optional frameworks


@dataclass
class Env:
    torch: Any = None
    torch_gmm: bool = False
    torch_note: str = ""
    torch_gmm_half: dict = field(default_factory=dict)  # dtype name -> "" (works) or why not
    jax: Any = None
    jax_masked: bool | None = None
    jax_gflops: float | None = None
    jax_note: str = ""
    jax_time_limit: float = 4.0

    def setup_torch(self) -> None:
        try:
            import torch
        except Exception as e:  # noqa: BLE001 - an optional baseline
            self.torch_note = f"torch not importable: {type(e).__name__}"
            return
        self.torch = torch
        try:  # on the CPU, with an empty group and sum < m?
            a, b = torch.randn(10, 8), torch.randn(3, 8, 4)
            o = torch._grouped_mm(a, b, offs=torch.tensor([3, 3, 7], dtype=torch.int32))
            self.torch_gmm = bool(torch.allclose(o[:3], a[:3] @ b[0], atol=1e-5)
                                  and torch.allclose(o[3:7], a[3:7] @ b[2], atol=1e-5))
            self.torch_note = "" if self.torch_gmm else "torch._grouped_mm gives wrong results on CPU"
        except Exception as e:  # noqa: BLE001
            self.torch_note = f"torch._grouped_mm fails on CPU: {type(e).__name__}: {str(e)[:120]}"
        for name in specs.HALF_DTYPES:  # k, n multiples of 8: the 16-byte strides it asks for
            dt = getattr(torch, name)
            try:
                a, b = torch.randn(24, 16).to(dt), torch.randn(3, 16, 8).to(dt)
                o = torch._grouped_mm(a, b, offs=torch.tensor([8, 8, 20], dtype=torch.int32)).float()
                ok = bool(torch.allclose(o[:8], (a[:8] @ b[0]).float(), rtol=2e-2, atol=2e-2)
                          and torch.allclose(o[8:20], (a[8:20] @ b[2]).float(), rtol=2e-2, atol=2e-2))
                self.torch_gmm_half[name] = "" if ok else f"torch._grouped_mm gives wrong {name} results on CPU"
            except Exception as e:  # noqa: BLE001
                self.torch_gmm_half[name] = f"torch._grouped_mm {name} fails on CPU: {str(e)[:120]}"

    def setup_jax(self, x64: bool) -> None:
        try:
            import jax

            jax.config.update("jax_platforms", "cpu")
            if x64:
                jax.config.update("jax_enable_x64", True)
            jnp = jax.numpy
        except Exception as e:  # noqa: BLE001 - an optional baseline
            self.jax_note = f"jax not importable: {type(e).__name__}"
            return
        self.jax = jax
        f = jax.jit(jax.lax.ragged_dot)
        try:  # does XLA:CPU materialise lhs as [m, g*k]? (m=8, g=3, k=4 -> f32[8,12])
            self.jax_masked = "f32[8,12]" in f.lower(
                jnp.zeros((8, 4), jnp.float32), jnp.zeros((3, 4, 5), jnp.float32),
                jnp.array([2, 3, 3], jnp.int32)).compile().as_text()
        except Exception:  # noqa: BLE001
            self.jax_masked = None
        # its rate on this machine, counting the FLOPs the masked lowering does (g x)
        m, k, n, g = 1024, 256, 256, 8
        rng = np.random.default_rng(0)
        a = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
        b = jnp.asarray(rng.standard_normal((g, k, n), dtype=np.float32))
        gs = jnp.full((g,), m // g, jnp.int32)
        f(a, b, gs).block_until_ready()
        t0 = time.perf_counter()
        for _ in range(3):
            f(a, b, gs).block_until_ready()
        self.jax_gflops = 2.0 * m * k * n * (g if self.jax_masked else 1) * 3 / (time.perf_counter() - t0) / 1e9
        if self.jax_masked:
            self.jax_note = (f"XLA:CPU lowers ragged_dot to a dense dot over a masked [m, g*k] copy (g x the "
                             f"FLOPs); {self.jax_gflops:.1f} GFLOP/s on those")

    def need_torch(self):
        if self.torch is None:
            raise Skip(self.torch_note or "no torch")
        return self.torch

    def need_jax(self, c: Case, backward: bool = False):
        """jax, or Skip when it is missing, cannot do the dtype, or the masked lowering would
        copy more than JAX_MAX_MASK_BYTES or take longer than jax_time_limit per call
        (estimated from the rate measured by setup_jax)."""
        if self.jax is None:
            raise Skip(self.jax_note or "no jax")
        if c.half:
            raise Skip("jax is not among the 16-bit baselines (its masked CPU lowering is timed in float32)")
        if c.dtype == np.float64 and not self.jax.config.jax_enable_x64:
            raise Skip("float64 needs jax_enable_x64")
        mask_bytes, flops, groups = _jax_cost(c, backward)
        mult = groups if self.jax_masked else 1
        if self.jax_masked and mask_bytes > JAX_MAX_MASK_BYTES:
            raise Skip(f"the masked copy would take {mask_bytes / 2**30:.1f} GiB")
        est = flops * mult / (self.jax_gflops * 1e9) if self.jax_gflops else 0.0
        if est > self.jax_time_limit:
            raise Skip(f"masked lowering, {groups}x the FLOPs: est. {est:.1f} s per call > {self.jax_time_limit:g} s")
        return self.jax


def _jax_cost(c: Case, backward: bool) -> tuple[float, float, int]:
    """(bytes of XLA's masked copy, FLOPs of one call's products as dense dots, groups)."""
    s, item = c.spec.shape, c.dtype.itemsize
    if c.spec.op == "moe":
        N = s["T"] * s["top_k"]
        flops = 3 * 2.0 * N * s["d"] * s["f"] * (3 if backward else 1)
        return N * s["E"] * max(s["d"], s["f"]) * item, flops, s["E"]
    m, k, n, g = (s[x] for x in "mkng")
    if c.spec.op == "backward":
        return m * g * max(k, n) * item, 3 * 2.0 * m * k * n, g
    return m * g * k * item, 2.0 * m * k * n, g


def jax_sync(r):
    import jax

    return jax.block_until_ready(r)


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
        refs = dict(MB.flat_grads(MB.np_backward(i32, res, i32["ct"])), out=out)
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
    if mode == "bf16":
        if ml_dtypes is None:
            raise Skip("bfloat16 needs ml_dtypes")
        ops = (lhs.astype(ml_dtypes.bfloat16), rhs.astype(ml_dtypes.bfloat16))
    else:
        lq, rq = QUANT_MODES[mode]
        k = lhs.shape[1]
        if "sub128" in (lq or ("", ""))[1] + rq[1] and k % QUANT_BLOCK:
            raise Skip(f"k = {k} is not a multiple of the scale block {QUANT_BLOCK}")
        if "float8_e4m3fn" in (rq[0], (lq or ("",))[0]) and ml_dtypes is None:
            raise Skip("float8_e4m3fn needs ml_dtypes")

        def q(a, how, reduced):
            if how is None:
                return a
            qtype, layout = how
            chan = tuple(x for x in range(a.ndim) if x != reduced)
            tiled = {reduced: QUANT_BLOCK} if layout == "sub128" else None
            return raggeddot.quantize(a, qtype, channelwise_axes=chan, tiled_axes=tiled)

        ops = (q(lhs, lq, 1), q(rhs, rq, 1))
    c.extra[key] = ops
    return ops


# ----------------------------------------------------------------------------------------------
# ragged_dot (and the parts the backward shares)


def _rd_forward(env, c):
    lhs, rhs, gs = c.inputs["lhs"], c.inputs["rhs"], c.inputs["group_sizes"]
    return lambda: {"out": raggeddot.ragged_dot(lhs, rhs, gs)}


def _rd_f32(env, c):
    """raggeddot in float32 on the float32 copies of a 16-bit case's inputs."""
    if not c.half:
        raise Skip("a float32 twin of a 16-bit case only")
    i32 = c.inputs32
    lhs, rhs, gs = i32["lhs"], i32["rhs"], i32["group_sizes"]
    return lambda: {"out": raggeddot.ragged_dot(lhs, rhs, gs)}


def _widening(fn):
    """``fn`` run with the best float kernel family named: bfloat16 products then widen to
    float32 and run FMAs (as on a CPU without vdpbf16ps) instead of the dot-product kernels."""
    family = next(k["name"] for k in raggeddot.build_info()["kernels"] if k["runnable"] and "float32" in k["types"])

    def call():
        with raggeddot.runtime.configured(kernel=family):
            return fn()
    return call


def _rd_widen(env, c):
    """raggeddot on the bfloat16 inputs with the widening path forced (_widening)."""
    if c.dtype.name != "bfloat16":
        raise Skip("the forced widening path of a bfloat16 case only")
    return _widening(_rd_forward(env, c))


def _rd_prepacked(env, c):
    """ragged_dot on rhs packed once by raggeddot.prepack (outside the timing)."""
    if not hasattr(raggeddot, "prepack"):
        raise Skip("this raggeddot has no prepack()")
    lhs, gs = c.inputs["lhs"], c.inputs["group_sizes"]
    packed = raggeddot.prepack(c.inputs["rhs"])
    return lambda: {"out": raggeddot.ragged_dot(lhs, packed, gs)}


def _np_dense(env, c):
    lhs, rhs0 = c.inputs32["lhs"], c.inputs32["rhs"][0]
    return lambda: {"dense": lhs @ rhs0}


def _np_half(env, c):
    """NumPy's own matmul on the 16-bit arrays, dense lhs @ rhs[0] (ml_dtypes' bfloat16 one
    gives float32, NumPy's float16 one float16)."""
    if not c.half:
        raise Skip("16-bit cases only")
    if c.flops["dense"] > NP_HALF_MAX_FLOPS:
        raise Skip(f"NumPy's 16-bit matmul is ~0.1 GFLOP/s: only up to {NP_HALF_MAX_FLOPS:.0e} FLOPs")
    lhs, rhs0 = c.inputs["lhs"], c.inputs["rhs"][0]
    return lambda: {"dense": lhs @ rhs0}


def _np_loop(env, c):
    return specs.numpy_loop(c.spec, c.inputs32)


def _torch_half_ok(env, c):
    torch = env.need_torch()
    if c.half and not hasattr(torch, c.dtype.name):
        raise Skip(f"torch has no {c.dtype.name}")
    return torch


def _torch_dense(env, c):
    torch = _torch_half_ok(env, c)
    lhs, rhs0 = to_torch(torch, c.inputs["lhs"]), to_torch(torch, np.ascontiguousarray(c.inputs["rhs"][0]))

    def dense():
        with torch.inference_mode():
            return {"dense": lhs @ rhs0}

    return dense


def _torch_loop(env, c):
    torch = _torch_half_ok(env, c)
    lhs, rhs = to_torch(torch, c.inputs["lhs"]), to_torch(torch, c.inputs["rhs"])
    bounds, total, m, n = c.bounds, int(c.inputs["group_sizes"].sum()), lhs.shape[0], rhs.shape[2]

    def loop():
        with torch.inference_mode():
            out = torch.empty((m, n), dtype=lhs.dtype)
            for i, s, e in bounds:
                torch.matmul(lhs[s:e], rhs[i], out=out[s:e])
            out[total:] = 0
            return {"out": out}

    return loop


def _torch_gmm(env, c):
    torch = _torch_half_ok(env, c)
    if not env.torch_gmm:
        raise Skip(env.torch_note or "no torch._grouped_mm")
    if c.dtype == np.float64:
        raise Skip("torch._grouped_mm supports float32/bfloat16/float16 only")
    if c.half:
        if env.torch_gmm_half.get(c.dtype.name, "untested"):
            raise Skip(env.torch_gmm_half.get(c.dtype.name) or f"torch._grouped_mm {c.dtype.name} not probed")
        k, n = c.inputs["rhs"].shape[1:]
        if (k * c.dtype.itemsize) % 16 or (n * c.dtype.itemsize) % 16:
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


def _jax_ragged_dot(env, c):
    jax = env.need_jax(c)
    f = jax.jit(jax.lax.ragged_dot)
    lhs, rhs, gs = (jax.numpy.asarray(c.inputs[x]) for x in ("lhs", "rhs", "group_sizes"))
    return lambda: {"out": f(lhs, rhs, gs)}


# ----------------------------------------------------------------------------------------------
# backward: the step and tgmm


def _rd_step(env, c):
    return lambda: specs.run_raggeddot(c.spec, c.inputs)


def _torch_step(env, c):
    torch = _torch_half_ok(env, c)
    lhs = to_torch(torch, c.inputs["lhs"]).requires_grad_(True)  # shares memory, never written
    rhs = to_torch(torch, c.inputs["rhs"]).requires_grad_(True)
    ct = to_torch(torch, c.inputs["ct"])
    gs, m = c.inputs["group_sizes"], lhs.shape[0]
    sizes = [int(s) for s in gs] + [m - int(gs.sum())]  # the tail rows belong to no group
    tail = torch.zeros((sizes[-1], ct.shape[1]), dtype=ct.dtype)
    groups = [i for i, _, _ in c.bounds]

    def step():
        rows, ws = torch.split(lhs, sizes), torch.unbind(rhs)
        out = torch.cat([torch.matmul(rows[i], ws[i]) for i in groups] + [tail])
        d_lhs, d_rhs = torch.autograd.grad(out, (lhs, rhs), ct)
        return {"out": out.detach(), "d_lhs": d_lhs, "d_rhs": d_rhs}

    return step


def _jax_step(env, c):
    jax = env.need_jax(c)
    jnp = jax.numpy

    def step(lhs, rhs, gs, ct):
        out, vjp_fn = jax.vjp(lambda a, b: jax.lax.ragged_dot(a, b, gs), lhs, rhs)
        d_lhs, d_rhs = vjp_fn(ct)
        return {"out": out, "d_lhs": d_lhs, "d_rhs": d_rhs}

    f = jax.jit(step)
    args = [jnp.asarray(c.inputs[x]) for x in ("lhs", "rhs", "group_sizes", "ct")]
    return lambda: f(*args)


def _tgmm(env, c):
    lhs_t, ct, gs, dt = c.inputs["lhs"].T, c.inputs["ct"], c.inputs["group_sizes"], c.dtype
    return lambda: {"d_rhs": raggeddot.tgmm(lhs_t, ct, gs, preferred_element_type=dt)}  # megablox: float32


def _tgmm_fresh(env, c):
    lhs_t, ct, gs, dt = c.inputs["lhs"].T, c.inputs["ct"], c.inputs["group_sizes"], c.dtype

    def call():
        limit = raggeddot.set_buffer_cache(0)  # also releases the block of the previous call
        try:
            return {"d_rhs": raggeddot.tgmm(lhs_t, ct, gs, preferred_element_type=dt)}
        finally:
            raggeddot.set_buffer_cache(limit)

    return call


def _np_tgmm(env, c):
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
    def build(env, c):
        inputs = c.inputs
        if kind == "numpy":
            if c.extra["numpy_vs_reference"]["status"] != "ok":
                raise Skip(f"the NumPy version disagrees with raggeddot.reference ({REFERENCE_TOKENS} tokens)")
            return MB.numpy_fn(c.inputs32, backward)
        if kind == "torch":
            if c.half:
                return _torch_moe_half(env.need_torch(), c, backward)
            return MB.torch_fn(env.need_torch(), inputs, backward)
        if kind in MB.HF_IMPLEMENTATIONS:
            if c.half:   # the torch 16-bit per-expert loop ("torch") stands for it there
                raise Skip("the Hugging Face layer baseline runs float32/float64 specs")
            torch = env.need_torch()
            if kind == "grouped_mm" and (not env.torch_gmm or c.dtype != np.float32):
                raise Skip(env.torch_note or "torch._grouped_mm takes float32/bfloat16/float16 only")
            try:
                import transformers  # noqa: F401
            except Exception as e:  # noqa: BLE001 - an optional baseline
                raise Skip(f"transformers not importable: {type(e).__name__}") from None
            try:
                return MB.hf_fn(torch, inputs, backward, kind)
            except MB.HFUnsupported as e:
                raise Skip(str(e)) from None
        if kind == "jax":
            return MB.jax_fn(env.need_jax(c, backward), inputs, backward)
        if kind == "rd-f32":
            if not c.half:
                raise Skip("a float32 twin of a 16-bit case only")
            inputs = c.inputs32
        if kind == "rd-widen" and c.dtype.name != "bfloat16":
            raise Skip("the forced widening path of a bfloat16 case only")
        args, kw = [inputs[a] for a in specs.MOE_ARGS], inputs["options"]
        if not backward:
            fn = lambda: {"out": raggeddot.moe_block(*args, **kw)}  # noqa: E731
            return _widening(fn) if kind == "rd-widen" else fn

        def fwd_bwd():
            out, vjp_fn = raggeddot.moe_block_vjp(*args, **kw)
            return dict(MB.flat_grads(vjp_fn(inputs["ct"])), out=out)

        return _widening(fwd_bwd) if kind == "rd-widen" else fwd_bwd

    return build


def _torch_moe_half(torch, c: Case, backward: bool):
    """A torch per-expert loop with the expert weights and matmuls in the case's 16-bit dtype
    (forward only). The router runs in float32, as in raggeddot's moe_block: a 16-bit router
    picks other experts for near-tied tokens, which makes it another layer. Then, per expert
    that got tokens, F.linear on HF's [out, in] weights in the 16-bit dtype, the activation,
    and the weighted combine accumulated in float32 (index_add_); the result rounded."""
    if backward:
        raise Skip("the 16-bit torch loop is forward only")
    i32, kw = c.inputs32, c.inputs32["options"]
    if kw.get("n_groups"):
        raise Skip("group-limited routing is not in the 16-bit torch loop")
    F, dt = torch.nn.functional, getattr(torch, c.dtype.name)
    act, limit, k = kw.get("activation", "silu"), kw.get("swiglu_limit", 7.0), kw["top_k"]
    sigmoid = kw.get("score_func", "softmax") == "sigmoid"

    def t32(a):
        return torch.from_numpy(np.ascontiguousarray(a))

    def half(a, transpose=False):
        return None if a is None else t32(a.transpose(0, 2, 1) if transpose else a).to(dt)

    x32, rw = t32(i32["x"]), t32(i32["router_weights"])
    rb, sb = (None if kw.get(n) is None else t32(kw[n]) for n in ("router_bias", "selection_bias"))
    xh = x32.to(dt)
    w0, w1, wo = (half(i32[n], True) for n in ("w0", "w1", "wo"))
    b0, b1, bo = (half(kw.get(n)) for n in ("w0_bias", "w1_bias", "wo_bias"))
    shared = [t32(w.T).to(dt) for w in kw["shared_experts"]] if kw.get("shared_experts") is not None else None

    def mlp(h, e0, e1, eo, c0=None, c1=None, co=None):
        g, u = F.linear(h, e0, c0), F.linear(h, e1, c1)
        if act == "silu":
            z = F.silu(g) * u
        else:
            g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
            z = g * torch.sigmoid(g * 1.702) * (u + 1)
        return F.linear(z, eo, co)

    def fwd():
        with torch.inference_mode():
            logits = x32 @ rw if rb is None else x32 @ rw + rb
            scores = logits.sigmoid() if sigmoid else F.softmax(logits, dim=1)
            idx = torch.topk(scores if sb is None else scores + sb, k, dim=1)[1]
            w = scores.gather(1, idx)
            if kw.get("norm_topk_prob"):
                w = w / (w.sum(dim=1, keepdim=True) + (1e-20 if sigmoid else 0.0))
            w = w * kw.get("routed_scaling_factor", 1.0)
            out = torch.zeros(x32.shape, dtype=torch.float32)
            for e in torch.unique(idx).tolist():
                tok, slot = torch.where(idx == e)
                bias = [None if b is None else b[e] for b in (b0, b1, bo)]
                y = mlp(xh[tok], w0[e], w1[e], wo[e], *bias)
                out.index_add_(0, tok, y.float() * w[tok, slot, None])
            if shared is not None:
                out += mlp(xh, *shared).float()
            return {"out": out.to(dt)}

    return fwd


def _moe_variants(phase: str, backward: bool) -> list[Variant]:
    refs = ("out",) + (MB.MAIN_GRADS if backward else ())
    return [Variant("raggeddot", phase, _moe("raggeddot", backward), refs, phase, memory=True),
            Variant("rd-f32", phase, _moe("rd-f32", backward), refs, phase, f32=True),
            Variant("rd-widen", phase, _moe("rd-widen", backward), refs, phase),
            Variant("numpy", phase, _moe("numpy", backward), refs, phase, numpy=True, memory=True, f32=True),
            Variant("torch", phase, _moe("torch", backward), refs, phase),
            Variant("hf-eager", phase, _moe("eager", backward), refs, phase),
            Variant("hf-gmm", phase, _moe("grouped_mm", backward), refs, phase),
            Variant("jax", phase, _moe("jax", backward), refs, phase, jit=True, sync=jax_sync)]


# ----------------------------------------------------------------------------------------------
# quant: raggeddot on quantized operands against its float32 and bfloat16 products and torch


def _rd_quant(mode: str):
    def build(env, c):
        lhs, rhs = quant_operands(c, mode)
        gs = c.inputs["group_sizes"]
        return lambda: {f"out:{mode}": raggeddot.ragged_dot(lhs, rhs, gs)}

    return build


def _prepacked_weights(c: Case, mode: str):
    """The quantized rhs of ``mode`` laid out once by raggeddot.prepack (kept in the case);
    Skip when this raggeddot cannot prepack a QArray."""
    key = f"qp:{mode}"
    if key not in c.extra:
        if not hasattr(raggeddot, "prepack"):
            raise Skip("this raggeddot has no prepack()")
        try:
            c.extra[key] = raggeddot.prepack(quant_operands(c, mode)[1])
        except (TypeError, ValueError) as e:
            raise Skip(f"prepack refuses the {mode} weights: {str(e)[:120]}") from None
    return c.extra[key]


def _rd_quant_prepacked(mode: str):
    """ragged_dot on the mode's quantized rhs prepacked once (outside the timing): one byte a
    weight read in place, dequantized in the micro-kernel."""
    def build(env, c):
        lhs = quant_operands(c, mode)[0]
        packed = _prepacked_weights(c, mode)
        gs = c.inputs["group_sizes"]
        return lambda: {f"out:{mode}": raggeddot.ragged_dot(lhs, packed, gs)}

    return build


def _qpsize(mode: str):
    """Bytes a prepacked quantized weight value costs: the layout's bytes (values, panel
    padding, the scales after each panel) over the values."""
    def size(c):
        packed = _prepacked_weights(c, mode)
        return packed.nbytes / max(int(np.prod(packed.shape)), 1)

    return size


def _qsize(mode: str):
    """Bytes a quantized weight value costs: its storage plus its share of the scales."""
    def size(c):
        rhs = quant_operands(c, mode)[1]
        return (rhs.qvalue.nbytes + rhs.scale.nbytes) / max(rhs.size, 1)

    return size


def _torch_int_mm(env, c):
    """int8 x int8 per group with torch._int_mm (int32 accumulation), the per-row and
    per-column scales applied after: the per-channel "int8" mode."""
    torch = env.need_torch()
    if not hasattr(torch, "_int_mm"):
        raise Skip("this torch has no _int_mm")
    lq, rq = quant_operands(c, "int8")
    a, b = torch.from_numpy(lq.qvalue), torch.from_numpy(rq.qvalue)
    sa, sb = torch.from_numpy(lq.scale), torch.from_numpy(rq.scale)  # [m, 1], [g, 1, n]
    bounds, total, m, n = c.bounds, int(c.inputs["group_sizes"].sum()), a.shape[0], b.shape[2]
    try:
        torch._int_mm(a[:1], b[bounds[0][0]]) if bounds else None
    except RuntimeError as e:
        raise Skip(f"torch._int_mm fails on CPU: {str(e)[:120]}") from None

    def loop():
        with torch.inference_mode():
            out = torch.empty((m, n), dtype=torch.float32)
            for i, s, e in bounds:
                acc = torch._int_mm(a[s:e], b[i]).to(torch.float32)
                torch.mul(acc, sa[s:e] * sb[i], out=out[s:e])
            out[total:] = 0
            return {"out:int8": out}

    return loop


def _torch_int8w(env, c):
    """Weight-only int8 per group with torch._weight_int8pack_mm (float32 activations, int8
    weights in nn.Linear's [n, k] layout made once, one scale per output column): "int8w"."""
    torch = env.need_torch()
    if not hasattr(torch, "_weight_int8pack_mm"):
        raise Skip("this torch has no _weight_int8pack_mm")
    rq = quant_operands(c, "int8w")[1]
    x = torch.from_numpy(c.inputs["lhs"])
    w = torch.from_numpy(np.ascontiguousarray(rq.qvalue.transpose(0, 2, 1)))  # [g, n, k]
    sc = torch.from_numpy(np.ascontiguousarray(rq.scale[:, 0, :]))  # [g, n]
    bounds, total, m, n = c.bounds, int(c.inputs["group_sizes"].sum()), x.shape[0], w.shape[1]
    try:
        torch._weight_int8pack_mm(x[:1], w[bounds[0][0]], sc[bounds[0][0]]) if bounds else None
    except RuntimeError as e:
        raise Skip(f"torch._weight_int8pack_mm fails on CPU: {str(e)[:120]}") from None

    def loop():
        with torch.inference_mode():
            out = torch.empty((m, n), dtype=torch.float32)
            for i, s, e in bounds:
                out[s:e] = torch._weight_int8pack_mm(x[s:e], w[i], sc[i])
            out[total:] = 0
            return {"out:int8w": out}

    return loop


def _quant_variants() -> list[Variant]:
    out = [Variant("rd-f32", "quant", _rd_forward, ("out",), "flops", threads="rd"),
           Variant("rd-bf16", "quant", _rd_quant("bf16"), ("out:bf16",), "flops", threads="rd",
                   wsize=lambda c: 2)]
    for mode in QUANT_MODES:
        out.append(Variant(mode, "quant", _rd_quant(mode), (f"out:{mode}",), "flops", threads="rd", mode=mode,
                           wsize=_qsize(mode)))
    for mode in QUANT_PREPACKED:
        out.append(Variant(f"{mode}-prepacked", "quant", _rd_quant_prepacked(mode), (f"out:{mode}",), "flops",
                           threads="rd", mode=mode, wsize=_qpsize(mode)))
    out += [Variant("torch-int8", "quant", _torch_int_mm, ("out:int8",), "flops", mode="int8", wsize=_qsize("int8")),
            Variant("torch-int8w", "quant", _torch_int8w, ("out:int8w",), "flops", mode="int8w",
                    wsize=_qsize("int8w"))]
    return out


VARIANTS: dict[str, list[Variant]] = {
    "ragged_dot": [
        Variant("raggeddot", "ragged_dot", _rd_forward, ("out",), "flops", threads="rd"),
        Variant("rd-f32", "ragged_dot", _rd_f32, ("out",), "flops", threads="rd", f32=True),
        Variant("rd-widen", "ragged_dot", _rd_widen, ("out",), "flops", threads="rd"),
        Variant("rd-prepacked", "ragged_dot", _rd_prepacked, ("out",), "flops", threads="rd"),
        Variant("np-dense", "ragged_dot", _np_dense, ("dense",), "dense", threads="blas", numpy=True, f32=True),
        Variant("np-loop", "ragged_dot", _np_loop, ("out",), "flops", numpy=True, f32=True),
        Variant("np-half", "ragged_dot", _np_half, ("dense",), "dense", f32=True),
        Variant("torch-dense", "ragged_dot", _torch_dense, ("dense",), "dense"),
        Variant("torch-loop", "ragged_dot", _torch_loop, ("out",), "flops"),
        Variant("torch-gmm", "ragged_dot", _torch_gmm, ("out",), "flops"),
        Variant("jax", "ragged_dot", _jax_ragged_dot, ("out",), "flops", jit=True, sync=jax_sync),
    ],
    "backward": [
        Variant("raggeddot", "step", _rd_step, ("out", "d_lhs", "d_rhs"), "step", threads="rd"),
        Variant("np-loop", "step", _np_loop, ("out", "d_lhs", "d_rhs"), "step", numpy=True, f32=True),
        Variant("torch-loop", "step", _torch_step, ("out", "d_lhs", "d_rhs"), "step"),
        Variant("jax", "step", _jax_step, ("out", "d_lhs", "d_rhs"), "step", jit=True, sync=jax_sync),
        Variant("tgmm", "tgmm", _tgmm, ("d_rhs",), "flops", threads="rd"),
        Variant("tgmm-fresh", "tgmm", _tgmm_fresh, ("d_rhs",), "flops", threads="rd"),
        Variant("forward", "tgmm", _rd_forward, ("out",), "flops", threads="rd"),
        Variant("np-loop", "tgmm", _np_tgmm, ("d_rhs",), "flops", numpy=True, f32=True),
        Variant("np-dense", "tgmm", _np_dense, ("dense",), "dense", threads="blas", numpy=True, f32=True),
    ],
    "moe": _moe_variants("fwd", False) + _moe_variants("fwd+bwd", True),
    "quant": _quant_variants(),
}


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
