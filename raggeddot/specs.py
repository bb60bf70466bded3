"""Named problem shapes of raggeddot: the benchmarks' scenarios and the main job's checks.

A spec names one problem: an operation, its shapes, how its groups are sized and a few
tags. Inputs are made from the spec deterministically (seeded from the spec's shapes), so
two processes that make the same spec get the same arrays.

Operations (``Spec.op``):

- ``'ragged_dot'``: ``ragged_dot(lhs [m, k], rhs [g, k, n], group_sizes [g]) -> [m, n]``.
- ``'backward'``: the same product with a cotangent ``ct [m, n]``: the forward, then
  ``d_lhs = ragged_dot(ct, rhs^T)`` and ``d_rhs = tgmm(lhs^T, ct)``.
- ``'moe'``: ``moe_block(x [T, d], router [d, E], w0, w1 [E, d, f], wo [E, f, d], top_k=...)``.

Group-size patterns (ragged_dot and backward), drawn from
``default_rng([seed, m, g, PATTERNS.index(pattern)])``:

- ``balanced``: ``m // g`` rows each, the remainder spread over the first groups.
- ``skewed``: Zipf-like, ``p_i ~ 1 / rank_i`` over a random ranking, ``multinomial(m, p)``.
- ``empty``: a quarter of the groups (at least one) empty, the rest multinomial-uniform.
- ``partial``: multinomial-uniform with sum ``3m/4``: the last ``m/4`` rows are in no group.

Data: ``lhs`` from ``default_rng([seed, 1, m, k])``, ``rhs`` from ``[seed, 2, g, k, n]``,
``ct`` from ``[seed, 3, m, n]``, all standard normal; in bfloat16 or float16, the float32
draws rounded to that dtype (so the float32 copy of a 16-bit input is exact). An MoE spec draws its arrays in a fixed
order from ``default_rng(seed)``, weights scaled by ``1/sqrt(fan_in)``.

    >>> from raggeddot import specs
    >>> s = specs.get("qwen3-m4096-g64-skewed")
    >>> inputs = specs.make_inputs(s, "float32", scale=1 / 16)     # m, k, n / 16, g kept
    >>> ok, err = specs.check(specs.run_raggeddot(s, inputs)["out"],
    ...                       specs.run_reference(s, inputs)["out"], "float32")
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field, replace

import numpy as np

import raggeddot
from raggeddot import reference

try:  # registers numpy's "bfloat16" dtype name; raggeddot.quant imports it too when present
    import ml_dtypes
except ImportError:
    ml_dtypes = None

OPS = ("ragged_dot", "backward", "moe")
PATTERNS = ("balanced", "skewed", "empty", "partial")

#: every tag a spec may carry, and what it means
TAGS = {
    "quick": "the --quick subset of the benchmark runner",
    "primary": "the shapes behind the README's performance figures",
    "main": "the set `python -m raggeddot` checks and times",
    "compute": "a single group: a dense product, compute-bound",
    "moe": "the expert matmul of a real MoE model, scaled to a 2-core machine",
    "memory-bound": "<= 32 rows per group: reading the weights sets the time",
    "decode": "1-4 rows an expert, as when generating: matrix-vector products that read each weight once",
}
MEMORY_BOUND_ROWS = 32

#: the dtypes a spec runs in: the 16-bit ones hold the float32 draws rounded to them
DTYPES = ("float32", "float64", "bfloat16", "float16")
HALF_DTYPES = ("bfloat16", "float16")

#: max |out - ref| / max |ref| a result may differ from the oracle by (a 16-bit result: its
#: rounding, ~2^-9 of the largest value for bfloat16, ~2^-12 for float16, with headroom)
REL_TOL = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-10, np.dtype(np.float16): 2e-3}
if ml_dtypes is not None:
    REL_TOL[np.dtype(ml_dtypes.bfloat16)] = 1e-2


def dtype_of(name) -> np.dtype:
    """np.dtype of a name of DTYPES (bfloat16 is ml_dtypes'): ValueError when unknown or
    when bfloat16 is asked for without the ml_dtypes package."""
    if str(name) == "bfloat16" and ml_dtypes is None:
        raise ValueError("dtype 'bfloat16' needs the ml_dtypes package")
    try:
        dt = np.dtype(name)
    except TypeError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {DTYPES}") from None
    if dt not in REL_TOL:
        raise ValueError(f"dtype {dt.name!r} has no tolerance; expected one of {DTYPES}")
    return dt


def is_half(dtype) -> bool:
    """bfloat16 or float16."""
    return np.dtype(dtype).name in HALF_DTYPES

_SIZE_DIMS = {"ragged_dot": ("m", "k", "n"), "backward": ("m", "k", "n"), "moe": ("T", "d", "f", "shared")}


@dataclass(frozen=True)
class Spec:
    """One named problem.

    shape: ``m, k, n, g`` (ragged_dot, backward) or ``T, d, f, E, top_k, shared`` (moe;
    ``shared`` is the width of the shared expert, 0 for none). options: moe_block's keyword
    arguments; array-valued ones are given as ``True`` (``router_bias``, ``selection_bias``,
    ``w0_bias``, ``w1_bias``, ``wo_bias``) and made by make_inputs. quick_shape: shape values
    the benchmark runner's ``--quick`` uses instead.
    """

    name: str
    op: str
    shape: dict
    pattern: str = "balanced"
    options: dict = field(default_factory=dict)
    dtypes: tuple = DTYPES
    tags: frozenset = frozenset()
    quick_shape: dict = field(default_factory=dict)
    note: str = ""

    def resized(self, scale: float = 1.0, **shape) -> "Spec":
        """The spec with ``shape`` values replaced, then every size (not g, E or top_k)
        multiplied by ``scale``, rounded, at least 1 (0 stays 0)."""
        new = dict(self.shape, **shape)
        if scale != 1.0:
            for key in _SIZE_DIMS[self.op]:
                if new.get(key):
                    new[key] = max(1, int(round(new[key] * scale)))
        return replace(self, shape=new)

    def describe(self) -> str:
        s = self.shape
        if self.op == "moe":
            text = f"T={s['T']} d={s['d']} f={s['f']} E={s['E']} top_k={s['top_k']}"
            return text + (f" shared={s['shared']}" if s.get("shared") else "")
        return f"m={s['m']} k={s['k']} n={s['n']} g={s['g']} {self.pattern}"


def _ragged(name, m, k, n, g, pattern, tags, op="ragged_dot"):
    tags = set(tags.split())
    if m // g <= MEMORY_BOUND_ROWS:
        tags.add("memory-bound")
    return Spec(name, op, dict(m=m, k=k, n=n, g=g), pattern, tags=frozenset(tags))


# MoE expert matmuls: m = tokens * top_k rows of the permuted activations, (k, n) = the first
# expert matmul (d_model -> d_ff) of a real model, scaled to fit a 2-core, 24 GiB machine:
#   mixtral   Mixtral 8x7B       4096 -> 14336, 8 experts top-2     scaled 1/4: 1024 -> 3584
#   qwen3     Qwen3-30B-A3B      2048 -> 768, 128 experts top-8     real size
#   deepseek  DeepSeek-V3        7168 -> 2048, 256 experts top-8    scaled 1/4: 1792 -> 512
# Each model shape also runs at other group counts, so GFLOP/s can be plotted against g.
_RAGGED_DOT = [
    # name                              m      k     n     g    pattern     tags
    ("dense-2048",                      2048,  2048, 2048, 1,   "balanced", "compute quick primary"),
    ("dense-4096x1024x4096",            4096,  1024, 4096, 1,   "balanced", "compute"),
    ("mixtral-m4096-g8-balanced",       4096,  1024, 3584, 8,   "balanced", "moe main"),
    ("mixtral-m4096-g8-partial",        4096,  1024, 3584, 8,   "partial",  "moe main"),
    ("mixtral-m16384-g8-balanced",      16384, 1024, 3584, 8,   "balanced", "moe primary"),
    ("mixtral-m16384-g8-skewed",        16384, 1024, 3584, 8,   "skewed",   "moe"),
    ("mixtral-m16384-g64-balanced",     16384, 1024, 3584, 64,  "balanced", "moe primary"),
    ("qwen3-m4096-g64-skewed",          4096,  2048, 768,  64,  "skewed",   "moe quick main"),
    ("qwen3-m4096-g128-balanced",       4096,  2048, 768,  128, "balanced", "moe"),
    ("qwen3-m16384-g8-balanced",        16384, 2048, 768,  8,   "balanced", "moe"),
    ("qwen3-m16384-g64-balanced",       16384, 2048, 768,  64,  "balanced", "moe primary"),
    ("qwen3-m16384-g128-balanced",      16384, 2048, 768,  128, "balanced", "moe primary"),
    ("qwen3-m16384-g128-skewed",        16384, 2048, 768,  128, "skewed",   "moe"),
    ("qwen3-m16384-g128-empty",         16384, 2048, 768,  128, "empty",    "moe"),
    ("qwen3-m16384-g256-balanced",      16384, 2048, 768,  256, "balanced", "moe primary"),
    ("deepseek-m4096-g256-balanced",    4096,  1792, 512,  256, "balanced", "moe quick primary main"),
    ("deepseek-m2048-g256-balanced",    2048,  1792, 512,  256, "balanced", "moe quick"),
    ("deepseek-m16384-g64-balanced",    16384, 1792, 512,  64,  "balanced", "moe"),
    ("deepseek-m16384-g256-balanced",   16384, 1792, 512,  256, "balanced", "moe primary"),
    ("deepseek-m16384-g256-skewed",     16384, 1792, 512,  256, "skewed",   "moe"),
    ("deepseek-m16384-g256-partial",    16384, 1792, 512,  256, "partial",  "moe"),
    # decode: 1-4 rows an expert, a matrix-vector product each; the time is reading the weights
    ("decode-deepseek-m256-g256",       256,   1792, 512,  256, "balanced", "decode quick"),
    ("decode-qwen3-m256-g64",           256,   2048, 768,  64,  "balanced", "decode quick"),
    # many tiny experts: the weights, not the FLOPs, set the time
    ("tiny-m4096-g256-k64-n64",         4096,  64,   64,   256, "balanced", "quick primary"),
    ("tiny-m4096-g256-k64-n64-skewed",  4096,  64,   64,   256, "skewed",   "main"),
]

# The backward step on every MoE shape of the forward: "bwd-" + the forward's name.
_BACKWARD_TAGS = {
    "mixtral-m4096-g8-balanced": "quick primary main",
    "qwen3-m4096-g64-skewed": "quick",
    "deepseek-m4096-g256-balanced": "quick primary",
    "mixtral-m16384-g64-balanced": "primary",
    "qwen3-m16384-g128-balanced": "primary",
    "qwen3-m4096-g128-balanced": "primary",
    "deepseek-m16384-g256-balanced": "primary",
}


def _moe(name, note, d, f, E, top_k, options, shared=0, T=4096, quick_T=1024, tags="moe quick primary"):
    return Spec(name, "moe", dict(T=T, d=d, f=f, E=E, top_k=top_k, shared=shared), options=options,
                tags=frozenset(tags.split()), quick_shape={"T": quick_T}, note=note)


# A whole MoE layer at T = 4096 tokens, d = 1024, the expert width f chosen so that one forward
# takes ~0.5 s on a 2-core machine; the routing (E, top_k, score function, groups) is the
# model's, E halved or quartered where noted.
_MOE = [
    _moe("mixtral", "Mixtral 8x7B: d 4096, f 14336, E 8, top-2, softmax + renormalise, SiLU",
         1024, 512, 8, 2, dict(norm_topk_prob=True)),
    _moe("qwen3-moe", "Qwen3-30B-A3B: d 2048, f 768, E 128, top-8, softmax + renormalise, SiLU",
         1024, 128, 64, 8, dict(norm_topk_prob=True)),
    _moe("deepseek-v3", "DeepSeek-V3: d 7168, f 2048, E 256 in 8 groups keep 4, top-8, sigmoid + bias, "
         "x2.5, 1 shared", 1024, 128, 64, 8, shared=256,
         options=dict(score_func="sigmoid", selection_bias=True, n_groups=8, topk_groups=4,
                      norm_topk_prob=True, routed_scaling_factor=2.5)),
    _moe("gpt-oss", "gpt-oss-20b: d 2880, f 2880, E 32, top-4, router bias, softmax over top-k, "
         "clipped SwiGLU, biases", 1024, 256, 32, 4,
         dict(router_bias=True, norm_topk_prob=True, activation="swiglu_oai", swiglu_limit=7.0,
              w0_bias=True, w1_bias=True, wo_bias=True)),
    _moe("small-e8", "a small Mixtral-like layer on which jax's masked lowering still runs",
         512, 256, 8, 2, dict(norm_topk_prob=True), T=1024, quick_T=512, tags="moe quick"),
]

SPECS: list[Spec] = (
    [_ragged(*row) for row in _RAGGED_DOT]
    + [_ragged("bwd-" + name, m, k, n, g, pat, _BACKWARD_TAGS.get(name, ""), op="backward")
       for name, m, k, n, g, pat, tags in _RAGGED_DOT if "moe" in tags.split()]
    + _MOE
)
BY_NAME = {s.name: s for s in SPECS}


def get(name: str) -> Spec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no spec named {name!r}") from None


def select(op: str | None = None, patterns=(), tags=()) -> list[Spec]:
    """Specs of ``op`` (any op if None) carrying every tag in ``tags`` and, when patterns
    are given, whose name matches one of the glob ``patterns`` (for backward specs the name
    without its "bwd-" prefix matches too), in table order. ValueError for a pattern that
    matches nothing."""
    pool = [s for s in SPECS if (op is None or s.op == op) and set(tags) <= s.tags]
    if not patterns:
        return pool
    names = set()
    for pat in patterns:
        hits = {s.name for s in pool if fnmatch.fnmatchcase(s.name, pat)
                or fnmatch.fnmatchcase(s.name.removeprefix("bwd-"), pat)}
        if not hits:
            raise ValueError(f"no {op or ''} spec matches {pat!r}; known: {', '.join(s.name for s in pool)}")
        names |= hits
    return [s for s in pool if s.name in names]


# ----------------------------------------------------------------------------------------------
# Inputs


def group_sizes(pattern: str, m: int, g: int, rng: np.random.Generator) -> np.ndarray:
    """int32 group sizes of ``pattern`` (see the module docstring), deterministic given rng."""
    if pattern == "balanced":
        gs = np.full(g, m // g, dtype=np.int64)
        gs[: m - int(gs.sum())] += 1
    elif pattern == "skewed":
        p = 1.0 / np.arange(1, g + 1, dtype=np.float64)
        gs = rng.multinomial(m, rng.permutation(p / p.sum()))
    elif pattern == "empty":
        p = np.ones(g)
        p[rng.choice(g, size=max(1, g // 4) if g > 1 else 0, replace=False)] = 0.0
        gs = rng.multinomial(m, p / p.sum())
    elif pattern == "partial":
        gs = rng.multinomial(3 * m // 4, np.full(g, 1.0 / g))
    else:
        raise ValueError(f"unknown group-size pattern {pattern!r}; expected one of {PATTERNS}")
    return np.asarray(gs, dtype=np.int32)


def _cached(cache, key, make):
    """make(), or the array of ``key``'s role (key[0]) kept in ``cache`` when its key matches;
    one array per role is kept, so specs sharing a shape share their operands."""
    if cache is None:
        return make()
    hit = cache.get(key[0])
    if hit is not None and hit[0] == key:
        return hit[1]
    cache.pop(key[0], None)
    arr = make()
    cache[key[0]] = (key, arr)
    return arr


def make_inputs(spec: Spec, dtype="float32", seed: int = 0, scale: float = 1.0, cache: dict | None = None) -> dict:
    """The inputs of ``spec`` (resized by ``scale``) as a dict of arrays.

    ragged_dot: lhs, rhs, group_sizes; backward: also ct. moe: x, router_weights, w0, w1,
    wo, ct and ``options`` (moe_block's keyword arguments with top_k, arrays made).
    ``cache`` (a dict the caller keeps) reuses large operands across specs of one shape."""
    spec = spec.resized(scale)
    dtype = dtype_of(dtype)
    if spec.op == "moe":
        return _moe_inputs(spec, dtype, seed)
    m, k, n, g = (spec.shape[x] for x in "mkng")
    rng = np.random.default_rng([seed, m, g, PATTERNS.index(spec.pattern)])
    draw = dtype if dtype == np.float64 else np.dtype(np.float32)

    def normal(stream, shape):
        a = np.random.default_rng(stream).standard_normal(shape, dtype=draw)
        return a if a.dtype == dtype else a.astype(dtype)

    out = {
        "lhs": _cached(cache, ("lhs", m, k, dtype.name, seed), lambda: normal([seed, 1, m, k], (m, k))),
        "rhs": _cached(cache, ("rhs", g, k, n, dtype.name, seed), lambda: normal([seed, 2, g, k, n], (g, k, n))),
        "group_sizes": group_sizes(spec.pattern, m, g, rng),
    }
    if spec.op == "backward":
        out["ct"] = _cached(cache, ("ct", m, n, dtype.name, seed), lambda: normal([seed, 3, m, n], (m, n)))
    return out


def _moe_inputs(spec: Spec, dtype: np.dtype, seed: int) -> dict:
    s = spec.shape
    T, d, f, E, fs = s["T"], s["d"], s["f"], s["E"], s.get("shared", 0)
    rng = np.random.default_rng(seed)

    def randn(*shape, scale=1.0):
        a = rng.standard_normal(shape, dtype=np.float32)
        a *= scale
        return a.astype(dtype, copy=False)

    out = {"x": randn(T, d), "router_weights": randn(d, E, scale=1 / math.sqrt(d)),
           "w0": randn(E, d, f, scale=1 / math.sqrt(d)), "w1": randn(E, d, f, scale=1 / math.sqrt(d)),
           "wo": randn(E, f, d, scale=1 / math.sqrt(f))}
    opts = dict(spec.options, top_k=s["top_k"])
    made = {"router_bias": lambda: randn(E, scale=0.2), "selection_bias": lambda: randn(E, scale=0.05),
            "w0_bias": lambda: randn(E, f, scale=0.1), "w1_bias": lambda: randn(E, f, scale=0.1),
            "wo_bias": lambda: randn(E, d, scale=0.1)}
    for key, make in made.items():  # in this order: the draws of a spec never change
        if opts.get(key) is True:
            opts[key] = make()
    if fs:
        opts["shared_experts"] = (randn(d, fs, scale=1 / math.sqrt(d)), randn(d, fs, scale=1 / math.sqrt(d)),
                                  randn(fs, d, scale=1 / math.sqrt(fs)))
    out["ct"] = randn(T, d)
    out["options"] = opts
    return out


MOE_ARGS = ("x", "router_weights", "w0", "w1", "wo")


def group_bounds(group_sizes) -> list[tuple[int, int, int]]:
    """(group, start row, end row) of every non-empty group."""
    ends = np.cumsum(np.asarray(group_sizes, dtype=np.int64))
    return [(i, int(e - z), int(e)) for i, (z, e) in enumerate(zip(group_sizes, ends)) if z > 0]


# ----------------------------------------------------------------------------------------------
# What a spec computes: the oracle, raggeddot, and the NumPy per-group loop


def run_reference(spec: Spec, inputs: dict) -> dict:
    """The outputs of ``spec`` from raggeddot.reference (the pure-NumPy oracle):
    ``out`` (all ops) and ``d_lhs``, ``d_rhs`` (backward)."""
    if spec.op == "moe":
        return {"out": reference.moe_block(*(inputs[a] for a in MOE_ARGS), **inputs["options"])}
    lhs, rhs, gs = inputs["lhs"], inputs["rhs"], inputs["group_sizes"]
    out = {"out": reference.ragged_dot(lhs, rhs, gs)}
    if spec.op == "backward":
        ct = inputs["ct"]
        out["d_lhs"] = reference.ragged_dot(ct, rhs.transpose(0, 2, 1), gs)
        # in rhs's dtype, as the vjp gives it (megablox's tgmm would default to float32)
        out["d_rhs"] = reference.tgmm(lhs.T, ct, gs, preferred_element_type=rhs.dtype)
    return out


def run_raggeddot(spec: Spec, inputs: dict) -> dict:
    """The outputs of ``spec`` computed by raggeddot, named as in run_reference."""
    if spec.op == "moe":
        return {"out": raggeddot.moe_block(*(inputs[a] for a in MOE_ARGS), **inputs["options"])}
    lhs, rhs, gs = inputs["lhs"], inputs["rhs"], inputs["group_sizes"]
    if spec.op == "ragged_dot":
        return {"out": raggeddot.ragged_dot(lhs, rhs, gs)}
    out, vjp_fn = raggeddot.vjp(raggeddot.ragged_dot, lhs, rhs, gs)
    d_lhs, d_rhs, _ = vjp_fn(inputs["ct"])
    return {"out": out, "d_lhs": d_lhs, "d_rhs": d_rhs}


def numpy_loop(spec: Spec, inputs: dict):
    """A function computing ``spec``'s outputs (as run_raggeddot names them) with one
    ``np.matmul`` per group into preallocated results; rows past the groups and empty
    groups get zeros. ragged_dot and backward only."""
    if spec.op not in ("ragged_dot", "backward"):
        raise ValueError(f"numpy_loop: no per-group loop for op {spec.op!r}")
    lhs, rhs, gs = inputs["lhs"], inputs["rhs"], inputs["group_sizes"]
    bounds, total = group_bounds(gs), int(np.sum(gs))
    empty = np.flatnonzero(np.asarray(gs) == 0)
    (m, k), (g, _, n), dt = lhs.shape, rhs.shape, np.result_type(lhs, rhs)

    def forward():
        out = np.empty((m, n), dtype=dt)
        for i, s, e in bounds:
            np.matmul(lhs[s:e], rhs[i], out=out[s:e])
        out[total:] = 0
        return {"out": out}

    if spec.op == "ragged_dot":
        return forward
    ct = inputs["ct"]

    def step():
        res = forward()
        d_lhs = np.empty((m, k), dtype=dt)
        d_rhs = np.empty((g, k, n), dtype=dt)
        for i, s, e in bounds:
            np.matmul(ct[s:e], rhs[i].T, out=d_lhs[s:e])
            np.matmul(lhs[s:e].T, ct[s:e], out=d_rhs[i])
        d_lhs[total:] = 0
        d_rhs[empty] = 0
        return dict(res, d_lhs=d_lhs, d_rhs=d_rhs)

    return step


# ----------------------------------------------------------------------------------------------
# The check


def rel_err(out, ref, block: int = 1 << 20) -> float:
    """max |out - ref| / max |ref| (max |out - ref| when ref is all zeros); inf on a shape
    mismatch or a non-finite difference. Works through the leading axis in blocks of about
    ``block`` elements, so large results need no full-size float64 temporaries."""
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        return math.inf
    if out.size == 0:
        return 0.0
    if out.ndim == 0:
        out, ref = out.reshape(1), ref.reshape(1)
    rows = max(1, block // max(1, out.size // out.shape[0]))
    worst = scale = 0.0
    for s in range(0, out.shape[0], rows):
        r = ref[s:s + rows].astype(np.float64, copy=False)
        d = float(np.abs(out[s:s + rows].astype(np.float64, copy=False) - r).max())
        if not math.isfinite(d):
            return math.inf
        worst, scale = max(worst, d), max(scale, float(np.abs(r).max()))
    return worst / scale if scale > 0 else worst


def check(out, ref, dtype) -> tuple[bool, float]:
    """(passed, relative error) of ``out`` against the oracle's ``ref``: the error within
    REL_TOL[dtype] and ``out`` of that dtype."""
    dtype = dtype_of(dtype)
    err = rel_err(out, ref)
    return err <= REL_TOL[dtype] and np.asarray(out).dtype == dtype, err
