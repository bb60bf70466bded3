"""moe_block's arguments, checked once (errors name the argument) and brought
to the compute dtype as the steps take them: a :class:`Layer` holding the
tokens, the :class:`~.route.Router`, the :class:`~.experts.Experts` and the
:class:`~.shared.SharedExperts`."""
import dataclasses
import functools
import math
import numbers
from typing import Optional

import numpy as np

from .. import _gateway as gw
from .. import _operand
from .. import _validate as v
from .._prepack import PackedRhs, check, quantizes_in_kernel
from .. import quant as qz
from .experts import GATE_UP, Experts, split_gate_up
from .route import Router
from .shared import SharedExperts

__all__ = ["Layer", "prepare", "capacity_of", "ACTIVATION_QTYPES"]

#: The qtypes moe_block's dynamic activation quantization takes.
ACTIVATION_QTYPES = ("int8", "int4", "float8_e4m3fn")


@dataclasses.dataclass
class Layer:
    """One moe_block call, checked.

    Attributes:
      x: the tokens ``[T, d]`` in the compute dtype, contiguous rows.
      x_shape: the shape ``x`` was given in (``[..., d]``).
      out_dtype: the dtype of the result (the promoted input dtype).
      compute_dtype: float32, or float64 when an input is float64.
      router, experts, shared: the steps' parameters (shared may be None).
      num_experts: E.
      capacity: assignments kept per expert, -1 for all (dropless).
      weights_on: "output" (the router weights scale the experts' outputs)
        or "input" (they scale the experts' inputs, Llama4).
      load_balance: the load-balancing loss convention ("switch", "hf",
        "maxtext").
      gate_shape: the shape shared_expert_gate was given in, or None.
      x_hidden: ``x [T, d]`` as given, float16 or bfloat16, when the layer
        keeps its hidden activations in that dtype (x, and every weight,
        of one 16-bit dtype: the dispatched rows, ``h0``, ``h1``, ``a`` and
        the experts' outputs are then 16-bit, each rounded once from its
        float32 accumulation), else None (they are in the compute dtype).
    """
    x: np.ndarray
    x_shape: tuple
    out_dtype: np.dtype
    compute_dtype: np.dtype
    router: Router
    experts: Experts
    shared: Optional[SharedExperts]
    num_experts: int
    capacity: int
    weights_on: str = "output"
    load_balance: str = "switch"
    gate_shape: Optional[tuple] = None
    x_hidden: Optional[np.ndarray] = None


def capacity_of(num_tokens, top_k, num_experts, capacity_factor):
    """Assignments kept per expert: ``ceil(T * top_k / E * capacity_factor)``
    for T tokens (MaxText's rule), at most ``T * top_k``; -1 (all) when
    capacity_factor is None or infinite (dropless)."""
    if capacity_factor is None or math.isinf(capacity_factor):
        return -1
    # no expert is given more than T * top_k assignments: a larger capacity keeps them all
    return min(int(math.ceil(min(num_tokens * top_k / num_experts * capacity_factor, 2.0 ** 62))),
               num_tokens * top_k)


def _check_weight(arr, name, shape, axes_doc, fn, layout):
    if arr.ndim != 3:
        raise ValueError(f"{fn}: expected 3-D '{name}' {axes_doc} (weights_layout={layout!r}), "
                         f"got shape {arr.shape}")
    for axis, (got, want, label) in enumerate(zip(arr.shape, shape, axes_doc.strip("[]").split(", "))):
        if got != want:
            raise ValueError(f"{fn}: '{name}' {axes_doc} (weights_layout={layout!r}) has {label}={got} "
                             f"on axis {axis}, expected {want}; got shape {arr.shape}")


def _group_limits(n_groups, topk_groups, top_k, E, fn):
    """(n_groups, topk_groups) checked; (1, 1) when routing is not group-limited."""
    if n_groups is None:
        if topk_groups is not None:
            raise ValueError(f"{fn}: 'topk_groups'={topk_groups} needs 'n_groups'")
        return 1, 1
    n_groups = v.index(n_groups, "n_groups", fn)
    if n_groups < 1 or E % n_groups:
        raise ValueError(f"{fn}: 'n_groups'={n_groups} must be positive and divide E={E}")
    topk_groups = n_groups if topk_groups is None else v.index(topk_groups, "topk_groups", fn)
    if not 1 <= topk_groups <= n_groups:
        raise ValueError(f"{fn}: 'topk_groups'={topk_groups} must be in [1, n_groups={n_groups}]")
    if topk_groups * (E // n_groups) < top_k:
        raise ValueError(f"{fn}: top_k={top_k} exceeds the {topk_groups * (E // n_groups)} experts "
                         f"in topk_groups={topk_groups} groups of {E // n_groups}")
    return n_groups, topk_groups


def _shared(shared_experts, d, ct, fn):
    """The shared experts' three weights checked and in the compute dtype."""
    try:
        s0, s1, so = shared_experts
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: 'shared_experts' must be a tuple (w0 [d, fs], w1 [d, fs], wo [fs, d])") from None
    s0 = v.as_array(s0, "shared_experts[0]", fn, ndim=2, shape_doc=" [d, fs]")
    fs = s0.shape[1]
    s1 = v.as_array(s1, "shared_experts[1]", fn, ndim=2, shape_doc=" [d, fs]")
    so = v.as_array(so, "shared_experts[2]", fn, ndim=2, shape_doc=" [fs, d]")
    for a, name, want in ((s0, "shared_experts[0]", (d, fs)), (s1, "shared_experts[1]", (d, fs)),
                          (so, "shared_experts[2]", (fs, d))):
        v.float_dtype(a, name, fn)
        if a.shape != want:
            raise ValueError(f"{fn}: '{name}' must have shape {want}, got {a.shape}")
    return tuple(gw.operand(a, ct, gw.PACKED) for a in (s0, s1, so))


ROUTER_WEIGHTS_ON = ("output", "input")
LOAD_BALANCE = ("switch", "hf", "maxtext")


def _shared_gate(gate, d, ct, fn):
    """shared_expert_gate ``[d]`` or ``[d, 1]`` as a ``[d, 1]`` operand."""
    g = v.as_array(gate, "shared_expert_gate", fn)
    v.float_dtype(g, "shared_expert_gate", fn)
    if g.shape not in ((d,), (d, 1)):
        raise ValueError(f"{fn}: 'shared_expert_gate' must have shape ({d},) or ({d}, 1) "
                         f"([d] or [d, 1], d={d}), got {g.shape}")
    return gw.operand(g.reshape(d, 1), ct)


def _activation_qtype(qtype, fn):
    """The name in :data:`ACTIVATION_QTYPES` of ``qtype`` (a name or its
    dtype), or ValueError naming 'activation_qtype': an unknown value, or
    float8_e4m3fn without the ml_dtypes package (checked here, before the
    quantization inside the layer would name its own argument)."""
    if isinstance(qtype, str) and qtype not in ACTIVATION_QTYPES:
        raise ValueError(f"{fn}: 'activation_qtype' must be None or one of {ACTIVATION_QTYPES} "
                         f"(or their dtypes), got {qtype!r}")
    try:
        return qz._qtype_name(qtype, fn, name="activation_qtype")
    except ValueError as e:
        if "ml_dtypes" in str(e):
            raise
        raise ValueError(f"{fn}: 'activation_qtype' must be None or one of {ACTIVATION_QTYPES} "
                         f"(or their dtypes), got {qtype!r}") from None


def _real(value, name, fn):
    """A real number option as a float; TypeError naming it otherwise (a
    string, a bool, an array)."""
    if type(value) is float or type(value) is int:      # (the common case, without the ABC's check)
        return float(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: '{name}' must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def _choice(value, name, allowed, fn):
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{fn}: '{name}' must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


@functools.lru_cache(maxsize=256)
def _promoted(dtypes):
    """``(out_dtype, compute_dtype)`` of the layer's input dtypes (x first):
    x's promoted with every other but bfloat16, and the kernels' compute
    dtype (kept per tuple: NumPy's promotion costs a decode step a few
    microseconds a pair)."""
    out_dtype = dtypes[0]
    for dt in dtypes[1:]:
        out_dtype = np.result_type(out_dtype, dt) if not v.is_bfloat16(dt) else out_dtype
    return out_dtype, gw.compute_dtype(*dtypes)


def prepare(x, router_weights, w0, w1, wo, *, top_k, score_func, router_bias, selection_bias,
            n_groups, topk_groups, norm_topk_prob, routed_scaling_factor, activation, w0_bias,
            w1_bias, wo_bias, shared_experts, capacity_factor, weights_layout, swiglu_limit,
            swiglu_alpha=1.702, shared_expert_gate=None, router_weights_on="output", gate_up="concat",
            load_balance="switch", activation_qtype=None, held_experts=None, fn="moe_block"):
    """The :class:`Layer` of moe_block's arguments (see moe_block for their
    meaning); ValueError or TypeError naming the argument (and ``fn``) when
    one is bad. ``held_experts``: how many experts the expert weights and
    biases hold (the router always scores all E); None for all E (the
    expert-parallel layer gives it, and applies router_weights_on,
    load_balance and shared_expert_gate itself)."""
    x = v.as_array(x, "x", fn)
    if x.ndim < 1:
        raise ValueError(f"{fn}: 'x' must have at least one dimension [..., d], got a scalar")
    rw = v.as_array(router_weights, "router_weights", fn, ndim=2, shape_doc=" [d, E]")
    d = x.shape[-1]
    if rw.shape[0] != d:
        raise ValueError(f"{fn}: 'router_weights' [d, E] has d={rw.shape[0]} but 'x' has d={d} "
                         f"(x.shape={x.shape})")
    E = rw.shape[1]
    if E < 1:
        raise ValueError(f"{fn}: 'router_weights' must have at least one expert, got shape {rw.shape}")
    H, h = (E, "E") if held_experts is None else (held_experts, "E/P")
    fused = w1 is None
    named = [(w0, "w0"), (wo, "wo")] if fused else [(w0, "w0"), (w1, "w1"), (wo, "wo")]
    packed = [name for a, name in named if isinstance(a, PackedRhs)]
    if packed and (fused or weights_layout != "edf" or len(packed) != 3):
        raise ValueError(f"{fn}: prepacked expert weights must be all three of w0, w1, wo, laid out "
                         f"[E, d, f] / [E, d, f] / [E, f, d] (weights_layout='edf', w1 given); got "
                         f"{packed} prepacked with weights_layout={weights_layout!r}, w1 "
                         f"{'None' if fused else 'given'}")
    # expert weights may be QArrays (AsQArray: quantized here, once a call):
    # they stay quantized, read by the grouped kernels' packing; or PackedRhs
    arrays = {name: _operand.operand(a, name, fn, packed=True) for a, name in named}
    w0, wo, w1 = arrays["w0"], arrays["wo"], arrays.get("w1")
    if weights_layout not in ("edf", "efd"):
        raise ValueError(f"{fn}: 'weights_layout' must be 'edf' or 'efd', got {weights_layout!r}")
    _choice(gate_up, "gate_up", GATE_UP, fn)
    if not fused and gate_up != "concat":
        raise ValueError(f"{fn}: 'gate_up'={gate_up!r} describes fused gate/up weights, but 'w1' is "
                         "given (pass w1=None with w0 holding both projections)")
    if w0.ndim != 3:
        raise ValueError(f"{fn}: expected 3-D 'w0', got shape {w0.shape}")
    f = w0.shape[2] if weights_layout == "edf" else w0.shape[1]
    if fused:
        if f % 2:
            raise ValueError(f"{fn}: fused 'w0' (w1=None) must hold 2f gate/up columns, an even "
                             f"number, got {f} (shape {w0.shape}, weights_layout={weights_layout!r})")
        f //= 2
    f0, f0_doc = (2 * f, "2f") if fused else (f, "f")
    if weights_layout == "edf":
        _check_weight(w0, "w0", (H, d, f0), f"[{h}, d, {f0_doc}]", fn, weights_layout)
        if not fused:
            _check_weight(w1, "w1", (H, d, f), f"[{h}, d, f]", fn, weights_layout)
        _check_weight(wo, "wo", (H, f, d), f"[{h}, f, d]", fn, weights_layout)
    else:
        _check_weight(w0, "w0", (H, f0, d), f"[{h}, {f0_doc}, d]", fn, weights_layout)
        if not fused:
            _check_weight(w1, "w1", (H, f, d), f"[{h}, f, d]", fn, weights_layout)
        _check_weight(wo, "wo", (H, d, f), f"[{h}, d, f]", fn, weights_layout)

    dts = [_operand.dtype(a, n, fn) for a, n in [(x, "x"), (rw, "router_weights")] + [(arrays[n], n) for _, n in named]]
    out_dtype, ct = _promoted(tuple(dts))

    top_k = v.index(top_k, "top_k", fn)
    if not 1 <= top_k <= E:
        raise ValueError(f"{fn}: 'top_k' must be in [1, E={E}], got {top_k}")
    if score_func not in gw.SCORE_FUNCS:
        raise ValueError(f"{fn}: 'score_func' must be 'softmax' or 'sigmoid', got {score_func!r}")
    if activation not in gw.ACTIVATIONS:
        raise ValueError(f"{fn}: 'activation' must be one of {sorted(gw.ACTIVATIONS)}, got {activation!r}")
    n_groups, topk_groups = _group_limits(n_groups, topk_groups, top_k, E, fn)
    scale = _real(routed_scaling_factor, "routed_scaling_factor", fn)
    if not math.isfinite(scale):
        raise ValueError(f"{fn}: 'routed_scaling_factor' must be finite, got {scale}")
    if capacity_factor is not None:
        capacity_factor = _real(capacity_factor, "capacity_factor", fn)
        if not capacity_factor > 0:
            raise ValueError(f"{fn}: 'capacity_factor' must be positive (inf: no limit) or None, "
                             f"got {capacity_factor}")

    def vec(a, name, size):
        if a is None:
            return None
        a = v.as_array(a, name, fn, ndim=1, shape_doc=f" [{size}]")
        v.float_dtype(a, name, fn)
        if a.shape[0] != size:
            raise ValueError(f"{fn}: '{name}' must have shape ({size},), got {a.shape}")
        return np.ascontiguousarray(a, dtype=ct)

    def bias(a, name, size):
        if a is None:
            return None
        a = v.as_array(a, name, fn, ndim=2, shape_doc=f" [{h}, {size}]")
        v.float_dtype(a, name, fn)
        if a.shape != (H, size):
            raise ValueError(f"{fn}: '{name}' [{h}, {size}] must have shape ({H}, {size}), got {a.shape}")
        return gw.operand(a, ct)

    router_bias = vec(router_bias, "router_bias", E)
    selection_bias = vec(selection_bias, "selection_bias", E)
    if fused:
        if w1_bias is not None:
            raise ValueError(f"{fn}: 'w1_bias' must be None with fused gate/up weights (w1=None); give "
                             f"the fused bias [{h}, 2f] as 'w0_bias'")
        b0 = bias(w0_bias, "w0_bias", 2 * f)
        b0, b1 = (None, None) if b0 is None else split_gate_up(b0, 1, gate_up)
    else:
        b0, b1 = bias(w0_bias, "w0_bias", f), bias(w1_bias, "w1_bias", f)
    bo = bias(wo_bias, "wo_bias", d)
    limit, alpha = _real(swiglu_limit, "swiglu_limit", fn), _real(swiglu_alpha, "swiglu_alpha", fn)
    if not limit > 0:
        raise ValueError(f"{fn}: 'swiglu_limit' must be positive (inf: no clip), got {limit}")
    if not math.isfinite(alpha):
        raise ValueError(f"{fn}: 'swiglu_alpha' must be finite, got {alpha}")
    norm_topk_prob = v.flag(norm_topk_prob, "norm_topk_prob", fn)
    weights_on = _choice(router_weights_on, "router_weights_on", ROUTER_WEIGHTS_ON, fn)
    load_balance = _choice(load_balance, "load_balance", LOAD_BALANCE, fn)
    shared, gate_shape = None, None
    if shared_expert_gate is not None:
        if shared_experts is None:
            raise ValueError(f"{fn}: 'shared_expert_gate' gates the shared experts' output, but "
                             "'shared_experts' is None")
        gate_shape = np.shape(shared_expert_gate)
        shared_expert_gate = _shared_gate(shared_expert_gate, d, ct, fn)
    if shared_experts is not None:
        shared = SharedExperts(*_shared(shared_experts, d, ct, fn), activation, limit, alpha,
                               shared_expert_gate)

    T = math.prod(x.shape[:-1])      # (exact; NumPy's prod costs a decode step ~8 us)
    xf = gw.operand(x.reshape(T, d), ct, gw.ROWS)
    router = Router(gw.operand(rw, ct), router_bias, selection_bias, score_func, top_k, n_groups,
                    topk_groups, norm_topk_prob, scale)
    # [E, d, f] / [E, f, d] views for the kernels, whatever the stored layout
    # (fused gate/up: two strided views of the one stored array)
    def weight(a):   # QArrays as they are, half weights read in place
        return a if isinstance(a, qz.QArray) else gw.operand(a, ct, gw.PACKED)

    if not packed:
        w0, wo = weight(w0), weight(wo)
    if fused:
        w0, w1 = split_gate_up(w0, 2 if weights_layout == "edf" else 1, gate_up)
    elif not packed:
        w1 = weight(w1)
    if weights_layout == "efd":
        w0, w1, wo = (a.transpose(0, 2, 1) for a in (w0, w1, wo))
    if activation_qtype is not None:
        activation_qtype = _activation_qtype(activation_qtype, fn)
    if activation_qtype == "int8" and not packed:
        # MXFP4 experts meet int8 rows as the int8 QArray of the same values
        # (w4a8: the exact int8 products, what their prepacked layout for int8 rows computes)
        w0, w1, wo = (gw.int8_rows_rhs(None, w, quantize_lhs=True) for w in (w0, w1, wo))
    if packed:   # laid out once by prepack, read where they lie (each product takes the layout
        # for its lhs, _prepack.meet): checked now, before anything runs, for the rows they
        # meet: 16-bit where the layer keeps its hidden activations so, else of the compute
        # dtype, quantized per row with activation_qtype (by the kernels where they can)
        hidden = out_dtype if ct == np.float32 and out_dtype.itemsize == 2 and x.dtype == out_dtype else ct
        for a, name in named:
            w = arrays[name]
            # (passed before for these rows, kernels and layouts: a decode step asks again each call)
            key, gen = ("moe_block rows", hidden, activation_qtype, ct), gw.selection()
            if w._checks.get(key) == (gen, len(w._kept)):
                continue
            rows, in_kernel = np.zeros((1, w.shape[1]), hidden), False
            if activation_qtype is not None:
                in_kernel = activation_qtype == "int8" and quantizes_in_kernel(rows, w)
                rows = rows if in_kernel else qz.quantize(rows, activation_qtype, channelwise_axes=(0,))
            check(w, rows, ct, fn, name, quantize_lhs=in_kernel)
            w._checks[key] = (gen, len(w._kept))
    experts = Experts(w0, w1, wo, b0, b1, bo, activation, limit, transposed=weights_layout == "efd",
                      alpha=alpha, gate_up=gate_up if fused else None, act_qtype=activation_qtype)
    capacity = capacity_of(T, top_k, E, capacity_factor)
    x_hidden = None
    if ct == np.float32 and out_dtype.itemsize == 2 and x.dtype == out_dtype:
        x_hidden = gw.operand(x.reshape(T, d), out_dtype, gw.ROWS)
    return Layer(xf, x.shape, out_dtype, ct, router, experts, shared, E, capacity, weights_on,
                 load_balance, gate_shape, x_hidden)
