"""Expert weights kept in MXFP4 inside transformers' experts modules.

An experts module (``gate_up_proj``, ``down_proj`` or ``up_proj``
parameters, see ``_experts``) may hold some of its weights as prepacked
MXFP4 (:func:`hold_mxfp4`): 4.25 bits a weight in the 4-bit micro-kernels'
panels (4.5 with the exponent copy ``unpack`` reads), multiplied by the
"raggeddot" experts implementation for inference. The parameter is then a
tensor of no elements, and the module holds no other copy of the weight:
neither the float tensor nor the prepacked float copies inference keeps
(``_experts.set_weight_cache``).

A held module says what the rest of torch and transformers get:

- forward: only the "raggeddot" experts implementation multiplies MXFP4
  weights; another one (``model.set_experts_implementation("eager")``)
  raises a RuntimeError saying so, instead of failing inside its loop.
- ``state_dict()``: each held weight ``W`` is given as the checkpoint's
  ``W_blocks`` (uint8 ``[E, out, in / 32, 16]``) and ``W_scales`` (uint8
  ``[E, out, in / 32]``), gpt-oss's names and layout, in place of the empty
  ``W``; so ``save_pretrained`` writes the MXFP4 weights as gpt-oss's
  checkpoints hold them, which :func:`load_mxfp4_checkpoint` (or
  :func:`load_mxfp4_experts`) reads back.
- ``load_state_dict``: ``W_blocks`` / ``W_scales`` are held again; a float
  ``W`` of the weight's shape makes it a float parameter again.

:func:`load_mxfp4_checkpoint` loads a whole checkpoint into a model built on
the meta device, holding its experts in MXFP4 from the ``*_blocks`` /
``*_scales`` tensors: the float experts are never made.
:func:`set_activation_qtype` makes the held weights multiply rows quantized
to int8 (w4a8) instead of the float rows.
"""
import json
import os
import struct

import numpy as np
import torch

import raggeddot as _rd

from . import _convert as cv

__all__ = ["hold_mxfp4", "quantize_experts_mxfp4", "load_mxfp4_experts", "load_mxfp4_checkpoint",
           "set_activation_qtype"]

MXFP4_ATTR = "_raggeddot_mxfp4"     # {weight name: PackedRhs} of the weights a module holds in MXFP4
ACT_ATTR = "_raggeddot_activation_qtype"    # "int8": held weights multiply rows quantized to int8 (w4a8)
_HOOKS_ATTR = "_raggeddot_mxfp4_hooks"
# the prepacked float copies inference keeps on a parameter (``_experts._prepacked``)
CACHE_ATTRS = ("_raggeddot_prepacked", "_raggeddot_prepacked_halves")
WEIGHTS = ("gate_up_proj", "up_proj", "down_proj")
_SUFFIXES = ("_blocks", "_scales")
_IMPLEMENTATION = "raggeddot"


def _out_in(module, shape):
    """``[E, out, in]`` of a weight stored ``shape`` by ``module``
    (``[E, out, in]``, or ``[E, in, out]`` when it is transposed)."""
    return (shape[0], shape[2], shape[1]) if module.is_transposed else tuple(shape)


def _stored(module, out_in):
    return (out_in[0], out_in[2], out_in[1]) if module.is_transposed else tuple(out_in)


def _expected(module, name, fn):
    """``[E, out, in]`` of weight ``name``: the parameter's (a meta one
    included), or the held weights' when the parameter is already empty."""
    held = getattr(module, MXFP4_ATTR, {})
    if name in held:
        g, k, n = held[name].shape          # laid out [E, in, out] (transpose_rhs of [E, out, in])
        return (g, n, k)
    param = module._parameters.get(name)
    if param is None or param.numel() == 0:
        raise ValueError(f"{fn}: the weight {name!r} of the module is empty and not held in MXFP4: its shape, "
                         "which the MXFP4 weights must have, is unknown")
    return _out_in(module, param.shape)


def _free(param):
    """Drop what ``param`` holds: its values (when it has real storage) and
    the prepacked copies inference kept on it."""
    for attr in CACHE_ATTRS:
        if hasattr(param, attr):
            delattr(param, attr)
    if param.device.type != "meta" and param.numel():
        param.data = torch.empty(0, dtype=param.dtype)


def hold_mxfp4(module, **weights):
    """Keep expert weights of ``module`` (a transformers experts module) in
    MXFP4 for inference: each keyword names a weight parameter
    (``gate_up_proj``, ``down_proj``, ``up_proj``) and gives its MXFP4
    :class:`~raggeddot.QArray` ``[E, out, in]`` (a checkpoint's layout,
    :func:`raggeddot.quant.from_mxfp4`; transformers' gpt-oss module holds
    its float weights transposed, ``[E, in, out]``, and takes the same
    ``[E, out, in]`` QArray).

    All weights are checked first (a parameter of that name, an "mxfp4"
    QArray of the weight's shape: the parameter's, or the held weights'
    when it is already held) and prepacked (4.25 bits a weight) before any
    is held: a refused call changes nothing. Then each parameter becomes a
    tensor of no elements, and the float weights and the prepacked float
    copies inference kept of them are dropped: the module holds no other
    copy. Forward calls with no gradient asked for multiply the MXFP4
    weights, whose products equal those of the dequantized weights in
    float32; they are frozen (no gradient flows to them). What forward,
    ``state_dict`` and ``load_state_dict`` do with a held module: see the
    module docstring. Returns the bytes the module now holds in MXFP4."""
    fn = "hold_mxfp4"
    made = {}
    for name, q in weights.items():
        if name not in WEIGHTS or not isinstance(module._parameters.get(name), torch.nn.Parameter):
            raise ValueError(f"{fn}: the module has no expert weight parameter {name!r} "
                             f"(its weights: {[w for w in WEIGHTS if w in module._parameters]})")
        if not isinstance(q, _rd.QArray) or q.qtype != "mxfp4" or q.ndim != 3:
            raise TypeError(f"{fn}: '{name}' must be an [E, out, in] MXFP4 QArray, got {q!r}")
        want = _expected(module, name, fn)
        if tuple(q.shape) != want:
            raise ValueError(f"{fn}: '{name}' has shape {tuple(q.shape)}, but the module's weight is "
                             f"[E, out, in] = {want}")
    for name, q in weights.items():     # (laid out for the rows set_activation_qtype says)
        made[name] = _rd.prepack(q, transpose_rhs=True, lhs_dtype=_lhs_dtype(module))
    held = getattr(module, MXFP4_ATTR, None)
    if held is None:
        held = {}
        setattr(module, MXFP4_ATTR, held)
    for name, packed in made.items():
        old = module._parameters[name]
        held[name] = packed
        _free(old)
        module._parameters[name] = torch.nn.Parameter(torch.empty(0, dtype=old.dtype), requires_grad=False)
    _hook(module)
    return sum(p.nbytes for p in held.values())


def _lhs_dtype(module):
    """The lhs dtype ``module``'s held weights are laid out for: int8 rows
    under ``set_activation_qtype(..., "int8")``, else float ones (None)."""
    return np.int8 if getattr(module, ACT_ATTR, None) == "int8" else None


def set_activation_qtype(model, qtype):
    """Multiply the expert weights held in MXFP4 (:func:`hold_mxfp4`, and
    the loaders and :func:`quantize_experts_mxfp4` that call it) by rows
    quantized to int8 (``qtype="int8"``), or by the float rows as they come
    (None, the default), in every experts module of ``model`` (a model, or
    one experts module); weights held later follow the module's setting.

    With "int8" each product's rows (the tokens' hidden states for the gate
    and up weights, the gated activations for the down weights) are
    quantized per row (one absmax scale a row, :func:`raggeddot.quantize`
    with ``channelwise_axes=(0,)``) by the kernels while they pack them, and
    the MXFP4 weights multiply them as the int8 QArray of the same values
    (``2 v``, the scale halved: exact) on the int8 dot-product instructions,
    as moe_block's ``activation_qtype="int8"`` does (w4a8): at decode the
    weights' 4.25 bits stream at about the read bandwidth, where the float
    rows' products (float32, each weight widened and scaled) run at about
    half of it. The result is the product of the quantized rows, each
    row's rounding error up to half its absmax / 127 a value: a numerical
    change, which is why it is asked for. The held weights are laid out
    again for the rows chosen, as ``prepack(..., lhs_dtype=np.int8)`` lays
    them out: where the kernels selected have the 4-bit int8 layout
    (AVX-512 VNNI, Arm DotProd) in the same bytes, nothing else kept;
    elsewhere (AMX, AVX-VNNI, Arm I8MM) the int8 rows meet a one-byte int8
    copy made on first use and kept beside them. Returns the number of
    experts modules set.

    Raises ValueError for a qtype other than "int8" or None, or a
    ``model`` with no experts module."""
    fn = "set_activation_qtype"
    if qtype is not None and qtype != "int8":
        raise ValueError(f"{fn}: 'qtype' must be \"int8\" or None, got {qtype!r}")
    modules = [m for _, m in experts_modules(model)]     # (an experts module is its own first)
    if not modules:
        raise ValueError(f"{fn}: {type(model).__name__} has no transformers experts module (a module with "
                         "has_gate and down_proj)")
    for m in modules:
        setattr(m, ACT_ATTR, qtype)
        held = getattr(m, MXFP4_ATTR, {})
        for name, packed in list(held.items()):
            held[name] = _rd.prepack(packed.unpack(), lhs_dtype=_lhs_dtype(m))
    return len(modules)


def _hook(module):
    """The hooks of a held module (once): the forward's implementation
    check, state_dict's MXFP4 tensors, load_state_dict's."""
    if getattr(module, _HOOKS_ATTR, None) is not None:
        return
    setattr(module, _HOOKS_ATTR, (module.register_forward_pre_hook(_check_implementation),
                                  module.register_state_dict_post_hook(_state_dict),
                                  module.register_load_state_dict_pre_hook(_load_state_dict)))


def _check_implementation(module, args):
    held = getattr(module, MXFP4_ATTR, {})
    impl = getattr(getattr(module, "config", None), "_experts_implementation", None)
    if held and impl != _IMPLEMENTATION:
        raise RuntimeError(
            f"{type(module).__name__}: the expert weights {sorted(held)} are held in MXFP4 by raggeddot "
            f"(hold_mxfp4), which only the {_IMPLEMENTATION!r} experts implementation multiplies, and this "
            f"model's is {impl!r}; run model.set_experts_implementation({_IMPLEMENTATION!r}), or load the "
            "float weights again (load_state_dict with them makes them parameters again)")


def mxfp4_tensors(module, name):
    """``(blocks, scales)`` of the held weight ``name`` as a checkpoint
    holds them: uint8 ``[E, out, in / 32, 16]`` and ``[E, out, in / 32]``
    (the bytes :func:`raggeddot.quant.from_mxfp4` reads back)."""
    q = getattr(module, MXFP4_ATTR)[name].unpack()          # [E, in, out], pairs along out
    codes = np.asarray(q.qvalue).view(np.uint8).transpose(0, 2, 1)     # [E, out, in], one a byte
    packed = np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4))
    scales = np.ascontiguousarray(q.scale.transpose(0, 2, 1)).view(np.uint8)
    E, out, half = packed.shape
    return (torch.from_numpy(packed.reshape(E, out, half // 16, 16)), torch.from_numpy(scales))


def _state_dict(module, state_dict, prefix, local_metadata):
    for name in sorted(getattr(module, MXFP4_ATTR, {})):
        state_dict.pop(prefix + name, None)
        blocks, scales = mxfp4_tensors(module, name)
        state_dict[prefix + name + "_blocks"] = blocks
        state_dict[prefix + name + "_scales"] = scales


def _load_state_dict(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                     error_msgs):
    held = getattr(module, MXFP4_ATTR, {})
    again = {}
    for name in WEIGHTS:
        b, s = prefix + name + "_blocks", prefix + name + "_scales"
        if b in state_dict and s in state_dict and name in module._parameters:
            again[name] = _rd.quant.from_mxfp4(cv.array(state_dict.pop(b)), cv.array(state_dict.pop(s)))
            state_dict[prefix + name] = torch.empty(0, dtype=module._parameters[name].dtype)
        elif name in held and prefix + name in state_dict:
            given = state_dict[prefix + name]
            shape = _stored(module, _expected(module, name, "load_state_dict"))
            if tuple(given.shape) == shape:       # float weights: a float parameter again
                del held[name]
                old = module._parameters[name]
                module._parameters[name] = torch.nn.Parameter(torch.empty(shape, dtype=old.dtype))
    if again:
        hold_mxfp4(module, **again)


def quantize_experts_mxfp4(model):
    """Quantize the expert weights of every experts module of ``model`` to
    MXFP4 (``raggeddot.quantize(w, "mxfp4")``, one scale per 32 inputs, as
    the OCP format and gpt-oss's checkpoints hold them) and keep them that
    way (:func:`hold_mxfp4`). Every weight is checked first (an infinity or
    NaN, which MXFP4 does not hold, is refused naming the parameter, before
    any module changes); each module is then held whole. Returns
    ``{module name: bytes held}``."""
    fn = "quantize_experts_mxfp4"
    todo = []
    for name, m in experts_modules(model):
        found = []
        for wname in WEIGHTS:
            p = m._parameters.get(wname)
            if not isinstance(p, torch.nn.Parameter) or p.numel() == 0:
                continue
            if p.device.type == "meta":
                raise ValueError(f"{fn}: '{name}.{wname}' is on the meta device: it holds no values to quantize "
                                 "(load the checkpoint's MXFP4 weights with load_mxfp4_checkpoint)")
            with torch.no_grad():
                finite = bool(torch.isfinite(p.sum(dtype=torch.float64)))
            if not finite:
                _rd.quant.refuse_non_finite(cv.array(p.detach().float()), "mxfp4", fn, f"'{name}.{wname}'")
            found.append(wname)
        todo.append((name, m, found))
    held = {}
    for name, m, found in todo:
        weights = {}
        for wname in found:
            w = cv.array(getattr(m, wname).detach().float())
            w = w.transpose(0, 2, 1) if m.is_transposed else w        # [E, out, in]
            weights[wname] = _rd.quantize(w, "mxfp4", channelwise_axes=(0, 1), tiled_axes={2: 32})
        held[name] = hold_mxfp4(m, **weights)
    return held


def experts_modules(model):
    """``(name, module)`` of every transformers experts module of ``model``."""
    return [(name, m) for name, m in model.named_modules() if hasattr(m, "has_gate") and hasattr(m, "down_proj")]


def _checkpoint_shape(tensors, key):
    """The shape of ``key`` in ``tensors`` without reading its values where
    the source can say (safetensors' ``get_slice``)."""
    if hasattr(tensors, "get_slice"):
        return tuple(tensors.get_slice(key).get_shape())
    get = tensors.get_tensor if hasattr(tensors, "get_tensor") else tensors.__getitem__
    return tuple(get(key).shape)


def load_mxfp4_experts(model, tensors):
    """Keep the experts of ``model`` in MXFP4 straight from a checkpoint's
    tensors: ``tensors`` maps names to tensors (a dict, or
    ``safetensors.safe_open(path, "pt")``-like: ``keys()`` and
    ``get_tensor(name)``); for each experts module ``P`` and weight ``W``
    found as ``P.W_blocks`` and ``P.W_scales`` (gpt-oss's names), the weight
    is held as :func:`raggeddot.quant.from_mxfp4` of them
    (:func:`hold_mxfp4`). The shapes of all are checked before any module
    changes; each module is then held whole, one after another, so that one
    module's tensors are in memory at a time. Returns the names of the
    weights loaded."""
    fn = "load_mxfp4_experts"
    keys = set(tensors.keys())
    get = tensors.get_tensor if hasattr(tensors, "get_tensor") else tensors.__getitem__
    todo = []
    for name, m in experts_modules(model):
        found = [w for w in WEIGHTS if f"{name}.{w}_blocks" in keys and f"{name}.{w}_scales" in keys]
        for wname in found:
            want = _expected(m, wname, fn)
            blocks = _checkpoint_shape(tensors, f"{name}.{wname}_blocks")
            if blocks[:-2] + (blocks[-2] * 32,) != want or blocks[-1:] != (16,):
                raise ValueError(f"{fn}: '{name}.{wname}_blocks' has shape {blocks}, but the module's weight "
                                 f"is [E, out, in] = {want}, whose blocks are {want[:2] + (want[2] // 32, 16)}")
        if found:
            todo.append((name, m, found))
    loaded = []
    for name, m, found in todo:
        hold_mxfp4(m, **{w: _rd.quant.from_mxfp4(cv.array(get(f"{name}.{w}_blocks")),
                                                  cv.array(get(f"{name}.{w}_scales"))) for w in found})
        loaded += [f"{name}.{w}" for w in found]
    return loaded


# ------------------------------------------------------------- whole checkpoints

_ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
              "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
              "BOOL": torch.bool}


class SafetensorsFile:
    """The tensors of one safetensors file, read with plain reads into
    tensors of their own (``keys()``, ``get_tensor(name)``, ``get_slice(
    name).get_shape()``): unlike a memory map, whose pages count in the
    process's resident memory while the file is open, only the tensors
    asked for are in memory. The format: an 8-byte little-endian header
    size, the JSON header (each tensor's dtype, shape and byte offsets
    after the header), the data."""

    def __init__(self, path):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        header.pop("__metadata__", None)
        self._start, self._header = 8 + size, header

    def keys(self):
        return list(self._header)

    def get_slice(self, name):
        return _Shape(self._header[name]["shape"])

    def get_tensor(self, name):
        entry = self._header[name]
        dtype = _ST_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"load_mxfp4_checkpoint: {name!r} in {self.path} has dtype {entry['dtype']}, "
                             f"not one of {sorted(_ST_DTYPES)}")
        begin, end = entry["data_offsets"]
        out = torch.empty(entry["shape"], dtype=dtype)
        view = out.view(-1).view(torch.uint8).numpy() if out.numel() else np.empty(0, np.uint8)
        if view.nbytes != end - begin:
            raise ValueError(f"load_mxfp4_checkpoint: {name!r} in {self.path} has {end - begin} bytes for shape "
                             f"{entry['shape']} {entry['dtype']}")
        with open(self.path, "rb") as f:
            f.seek(self._start + begin)
            if f.readinto(memoryview(view)) != view.nbytes:
                raise ValueError(f"load_mxfp4_checkpoint: {self.path} ends inside {name!r}")
        return out


class _Shape:
    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(shape)

    def get_shape(self):
        return list(self.shape)


class _Checkpoint:
    """The tensors of several sources (files, or mappings) as one mapping:
    ``keys()``, ``get_tensor``, ``get_slice`` (a weight's blocks and scales
    may lie in different shards)."""

    def __init__(self, sources, fn):
        self._where = {}
        for src in sources:
            tensors = SafetensorsFile(src) if isinstance(src, (str, os.PathLike)) else src
            for key in tensors.keys():
                if key in self._where:
                    raise ValueError(f"{fn}: the checkpoint holds {key!r} twice")
                self._where[key] = tensors

    def keys(self):
        return list(self._where)

    def get_tensor(self, key):
        t = self._where[key]
        return t.get_tensor(key) if hasattr(t, "get_tensor") else t[key]

    def get_slice(self, key):
        t = self._where[key]
        return t.get_slice(key) if hasattr(t, "get_slice") else _Shape(t[key].shape)


def load_mxfp4_checkpoint(model, checkpoint):
    """Load a checkpoint into ``model``, built on the meta device, keeping
    its experts in MXFP4: the float expert weights are never made.

    ``model`` is a transformers model built with ``with
    torch.device("meta"):`` (``from_config(config,
    experts_implementation="raggeddot", dtype=...)``; a gpt-oss config's
    ``quantization_config`` set to None): its parameters hold no memory.
    ``checkpoint`` is a safetensors file's path, a list of them (the
    shards), or mappings of names to tensors (dicts, ``safe_open``
    handles), read as one: the experts' ``*_blocks`` / ``*_scales`` are held
    in MXFP4 (:func:`load_mxfp4_experts`), module after module, then every
    other tensor becomes the parameter or buffer of its name (in the dtype
    the model gave it). Then, as ``from_pretrained`` does, the buffers the
    checkpoint does not hold (rotary frequencies) are computed by the
    model's own initialisation, and tied weights tied. A parameter or buffer
    left without values, or a checkpoint tensor of no parameter or of
    another shape, raises a ValueError naming it. Files are read tensor by
    tensor (:class:`SafetensorsFile`): the peak memory is the model's own
    plus about one expert weight's blocks. The names are the model's own
    (gpt-oss's checkpoints use them). Returns ``model``, in eval mode."""
    fn = "load_mxfp4_checkpoint"
    sources = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) or hasattr(checkpoint, "keys") \
        else list(checkpoint)
    tensors = _Checkpoint(sources, fn)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    experts = {name for name, _ in experts_modules(model)}
    for key in tensors.keys():
        owner, _, leaf = key.rpartition(".")
        if owner in experts and leaf.endswith(_SUFFIXES) and leaf.rsplit("_", 1)[0] in WEIGHTS:
            continue
        target = params.get(key, buffers.get(key))
        if target is None:
            raise ValueError(f"{fn}: the checkpoint's tensor {key!r} is no parameter or buffer of the model")
        shape = tuple(tensors.get_slice(key).get_shape())
        if shape != tuple(target.shape):
            raise ValueError(f"{fn}: the checkpoint's {key!r} has shape {shape}, the model's {tuple(target.shape)}")
    load_mxfp4_experts(model, tensors)
    for key in tensors.keys():
        if key in params or key in buffers:
            _assign(model, key, tensors.get_tensor(key).to((params.get(key, buffers.get(key))).dtype), key in params)
    _tie(model)
    left = [k for k, t in list(model.named_parameters()) + list(model.named_buffers())
            if t.device.type == "meta" and not _non_persistent(model, k)]
    if left:
        raise ValueError(f"{fn}: the checkpoint holds no values for {len(left)} of the model's parameters and "
                         f"buffers: {left[:8]}{' ...' if len(left) > 8 else ''}")
    _init_buffers(model)
    return model.eval()


def _assign(model, key, value, is_param):
    """Make ``value`` the parameter (or buffer) ``key`` of ``model``."""
    owner, _, leaf = key.rpartition(".")
    module = model.get_submodule(owner)
    if is_param:
        old = module._parameters[leaf]
        module._parameters[leaf] = torch.nn.Parameter(value, requires_grad=old.requires_grad)
        module._parameters[leaf]._is_hf_initialized = True
    else:
        module._buffers[leaf] = value
        value._is_hf_initialized = True


def _tie(model):
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def _non_persistent(model, key):
    owner, _, leaf = key.rpartition(".")
    return leaf in model.get_submodule(owner)._non_persistent_buffers_set


def _init_buffers(model):
    """The non-persistent buffers still on the meta device (computed in
    ``__init__``, as rotary frequencies are, so never in a checkpoint):
    given memory and computed by the model's own initialisation of their
    module (transformers' ``_init_weights``, as from_pretrained does),
    which leaves the loaded tensors as they are (marked initialised)."""
    for owner, module in model.named_modules():
        meta = [name for name, b in module._buffers.items()
                if b is not None and b.device.type == "meta" and name in module._non_persistent_buffers_set]
        if not meta:
            continue
        for name in meta:
            module._buffers[name] = torch.empty_like(module._buffers[name], device="cpu")
        init = getattr(model, "_init_weights", None)
        if init is None:
            raise ValueError(f"load_mxfp4_checkpoint: the buffers {meta} of {owner!r} are computed when the model "
                             "is built and the model has no _init_weights to compute them again")
        for p in module.parameters(recurse=False):
            p._is_hf_initialized = True
        with torch.no_grad():
            init(module)
