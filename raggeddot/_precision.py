"""What a ``precision=`` value asks of the kernels, decided as jax decides it.

jax takes for ``precision`` (``jax.lax.canonicalize_precision``): None; a
``jax.lax.Precision`` or one of its strings ("default", "fastest",
"bfloat16" -> DEFAULT; "high", "bfloat16_3x", "tensorfloat32" -> HIGH;
"highest", "float32" -> HIGHEST); a pair of Precision values or a pair of
such strings, one for each operand; a ``jax.lax.DotAlgorithmPreset`` or its
exact name; a ``jax.lax.DotAlgorithm``. Nothing else. An algorithm names the
types the operands are rounded to before they are multiplied and the type
the products are summed in.

The CPU sums in float32 (float64 when an operand or the result is float64).
So a precision here means one of three things for the kernels
(:func:`resolve`):

- ``None``: the fastest kernels for the operands' dtypes (AMX tiles, or
  ``vdpbf16ps`` where it outruns the float32 FMAs, for bfloat16 x bfloat16;
  both flush denormals and sum each pair of products in their own order).
  None, DEFAULT, HIGH and their strings, and the preset DEFAULT.
- ``"exact"``: exact products summed in float32 (or float64) with no
  flushing: bit for bit the product of the operands widened first. HIGHEST
  (or "highest", "float32", either entry of a pair), and every algorithm
  whose operand types hold the operands exactly without being bfloat16:
  F32_F32_F32 and ``DotAlgorithm(float32, float32, float32)`` on 16-bit or
  float32 operands; F16_F16_F32 and F16_F16_F16 on float16 operands;
  TF32_TF32_F32 on 16-bit operands (TF32 holds every float16 and bfloat16
  value); the emulations of float32 from bfloat16 or TF32 parts
  (BF16_BF16_F32_X3/_X6/_X9, TF32_TF32_F32_X3) on 16-bit or float32
  operands; F64_F64_F64 in a float64 call.
- ``"bf16"``: operands rounded to bfloat16 (nearest even; the identity for
  bfloat16 ones) and their products summed in float32, on the bfloat16
  dot-product kernels where the CPU has them: BF16_BF16_F32,
  BF16_BF16_BF16 and ``DotAlgorithm(bfloat16, bfloat16, ...)`` on float32
  or bfloat16 operands.

An accumulation type narrower than the CPU's (float16, bfloat16) is met by
float32 sums, as jax's CPU backend meets F16_F16_F16. Everything else is
refused with an exception naming the function, ``precision`` and what would
run: a rounding the kernels do not do (float32 operands to float16 or TF32,
float64 operands to float32 or bfloat16, float16 to bfloat16 or back), a
float64 accumulation in a float32 call, float8 operands (the ANY_F8
presets: raggeddot takes float8 values only inside QArrays), an integer
accumulation, an algorithm of several components or operations other than
jax's presets, and a value jax does not take.

Duck-typed: jax is not imported (a Precision or preset is recognised by its
class name and ``name``, a DotAlgorithm by its fields).
"""
import operator

import numpy as np

__all__ = ["resolve"]

# jax's strings for the Precision values (jax._src.lax.lax._precision_strings)
_STRINGS = {"highest": "highest", "float32": "highest", "high": "high", "bfloat16_3x": "high",
            "tensorfloat32": "high", "default": "default", "bfloat16": "default", "fastest": "default"}
_LEVELS = {"DEFAULT": "default", "HIGH": "high", "HIGHEST": "highest"}

# jax.lax.DotAlgorithmPreset -> (lhs type, rhs type, accumulation type):
# "float8" for any float8, "tf32", None for ANY (the backend's choice), and
# "float32" operand types for the presets that emulate float32 products
# from bfloat16 or TF32 parts (their _X suffix).
_PRESETS = {
    "DEFAULT": None,
    "ANY_F8_ANY_F8_F32": ("float8", "float8", "float32"),
    "ANY_F8_ANY_F8_F32_FAST_ACCUM": ("float8", "float8", "float32"),
    "ANY_F8_ANY_F8_ANY": ("float8", "float8", None),
    "ANY_F8_ANY_F8_ANY_FAST_ACCUM": ("float8", "float8", None),
    "F16_F16_F16": ("float16", "float16", "float16"),
    "F16_F16_F32": ("float16", "float16", "float32"),
    "BF16_BF16_BF16": ("bfloat16", "bfloat16", "bfloat16"),
    "BF16_BF16_F32": ("bfloat16", "bfloat16", "float32"),
    "BF16_BF16_F32_X3": ("float32", "float32", "float32"),
    "BF16_BF16_F32_X6": ("float32", "float32", "float32"),
    "BF16_BF16_F32_X9": ("float32", "float32", "float32"),
    "TF32_TF32_F32": ("tf32", "tf32", "float32"),
    "TF32_TF32_F32_X3": ("float32", "float32", "float32"),
    "F32_F32_F32": ("float32", "float32", "float32"),
    "F64_F64_F64": ("float64", "float64", "float64"),
}
_FLOAT_TYPES = ("float16", "bfloat16", "float32", "float64")
# the operand dtypes each operand type holds exactly (its rounding is the identity)
_HOLDS = {"float16": ("float16",), "bfloat16": ("bfloat16",), "tf32": ("float16", "bfloat16"),
          "float32": ("float16", "bfloat16", "float32"), "float64": _FLOAT_TYPES, None: _FLOAT_TYPES}
_WIDTH = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}

_JAX_TAKES = ("None, a jax.lax.Precision or one of its strings ('default', 'fastest', 'bfloat16', 'high', "
              "'bfloat16_3x', 'tensorfloat32', 'highest', 'float32'), a pair of them, a "
              "jax.lax.DotAlgorithmPreset or its name, or a jax.lax.DotAlgorithm")


class _Spec:
    """A parsed precision: ``levels`` (a pair of "default" / "high" /
    "highest") or an algorithm ``(lhs type, rhs type, accumulation)``;
    ``label`` names it in messages."""
    __slots__ = ("label", "levels", "types")

    def __init__(self, label, levels=None, types=None):
        self.label, self.levels, self.types = label, levels, types


def _type_name(t):
    """An algorithm's type as a name: a float name, "float8", None for ANY;
    the dtype's own name for another type (refused by the caller)."""
    if t is None:
        return None
    try:
        name = np.dtype(t).name
    except TypeError:
        return getattr(t, "__name__", repr(t))
    return "float8" if name.startswith("float8") else name


def _level(p):
    """A Precision member or one of jax's strings as "default" / "high" /
    "highest", else None."""
    if isinstance(p, str):
        return _STRINGS.get(p)
    if type(p).__name__ == "Precision" and isinstance(getattr(p, "name", None), str):
        return _LEVELS.get(p.name)
    return None


def _is_dot_algorithm(p):
    return type(p).__name__ == "DotAlgorithm" or all(
        hasattr(p, a) for a in ("lhs_precision_type", "rhs_precision_type", "accumulation_type"))


def _parse(precision, fn):
    """``precision`` as a :class:`_Spec` (None for None), as jax reads it;
    ValueError naming ``fn`` for a value jax does not take."""
    if precision is None:
        return None
    level = _level(precision)
    if level is not None:
        return _Spec(f"{precision!r}", levels=(level, level))
    if _is_dot_algorithm(precision):   # (a NamedTuple: before the pairs)
        return _algorithm(precision, fn)
    preset = None
    if isinstance(precision, str):
        preset = precision if precision in _PRESETS else None
    elif type(precision).__name__ == "DotAlgorithmPreset":
        preset = getattr(precision, "name", None)
    if preset in _PRESETS:
        types = _PRESETS[preset]
        return _Spec(f"DotAlgorithmPreset.{preset}", levels=("default", "default") if types is None else None,
                     types=types)
    if isinstance(precision, (tuple, list)) and len(precision) == 2:
        strings = all(isinstance(p, str) for p in precision)
        members = all(type(p).__name__ == "Precision" for p in precision)
        levels = tuple(_level(p) for p in precision)
        if (strings or members) and None not in levels:
            return _Spec(f"{tuple(precision)!r}", levels=levels)
    raise ValueError(f"{fn}: 'precision' must be {_JAX_TAKES} (as jax.lax takes it), got {precision!r}")


def _algorithm(a, fn):
    """A DotAlgorithm as a :class:`_Spec`: its types when it is one
    operation on one component of each operand, or jax's emulation of
    float32 from bfloat16 parts (``num_primitive_operations`` 3, 6 or 9, as
    the presets BF16_BF16_F32_X3/_X6/_X9)."""
    lhs, rhs, acc = (_type_name(t) for t in (a.lhs_precision_type, a.rhs_precision_type, a.accumulation_type))
    label = (f"DotAlgorithm(lhs_precision_type={lhs or 'ANY'}, rhs_precision_type={rhs or 'ANY'}, "
             f"accumulation_type={acc or 'ANY'})")
    try:
        counts = tuple(operator.index(getattr(a, f, 1)) for f in
                       ("lhs_component_count", "rhs_component_count", "num_primitive_operations"))
    except TypeError:
        raise ValueError(f"{fn}: precision={a!r}: its component and operation counts must be integers") from None
    if counts == (1, 1, 1):
        return _Spec(label, types=(lhs, rhs, acc))
    if lhs == rhs == "bfloat16" and counts[:2] == (1, 1) and counts[2] in (3, 6, 9):
        return _Spec(label + f" in {counts[2]} operations", types=("float32", "float32", acc))
    raise ValueError(f"{fn}: precision={label} with component counts {counts[:2]} and "
                     f"{counts[2]} operations is not an algorithm raggeddot computes: it computes those of one "
                     "operation on one component of each operand, and jax's emulations of float32 from "
                     "bfloat16 parts (3, 6 or 9 operations, as DotAlgorithmPreset.BF16_BF16_F32_X3/_X6/_X9)")


def _check_accumulation(spec, acc, ct, fn):
    if acc is None:
        return
    if acc not in _WIDTH:
        raise ValueError(f"{fn}: precision={spec.label} accumulates in {acc}, but raggeddot multiplies float "
                         f"operands and accumulates them in a float type ({ct.name} here)")
    if _WIDTH[acc] > ct.itemsize:
        raise ValueError(
            f"{fn}: precision={spec.label} asks for {acc} accumulation, but this call accumulates in "
            f"{ct.name} (the CPU accumulates in float32, or in float64 when an input or the output is "
            "float64); pass float64 operands or preferred_element_type=float64, or an algorithm that "
            "accumulates in float32 or narrower")


def resolve(precision, lhs_dtype, rhs_dtype, ct, fn, packed=None):
    """What ``precision`` asks of a product of operands contributing
    ``lhs_dtype`` and ``rhs_dtype`` (numpy dtypes; a QArray's is that of
    its dequantized values) computed in ``ct`` (float32 or float64): None
    (the fastest kernels), "exact" or "bf16", as the module docstring says.

    ``packed``: the PackedRhs ``rhs`` is, when it is one. Its weights are
    laid out already, so "bf16" needs them to hold bfloat16 values exactly
    (bfloat16 or power-of-two-scaled 4-bit weights) and an lhs that needs
    no rounding (bfloat16).

    Raises ValueError (a value jax does not take, or an algorithm whose
    accumulation this call cannot give) or TypeError (operands the
    algorithm would round in a way the kernels do not), naming ``fn``, the
    precision and the operand, before anything is computed or allocated."""
    spec = _parse(precision, fn)
    if spec is None:
        return None
    if spec.levels is not None:
        return "exact" if "highest" in spec.levels else None
    lt, rt, acc = spec.types
    _check_accumulation(spec, acc, ct, fn)
    dts = (np.dtype(lhs_dtype).name, np.dtype(rhs_dtype).name)
    if "float8" in (lt, rt):
        raise TypeError(f"{fn}: precision={spec.label} multiplies float8 operands, but 'lhs' is {dts[0]} and "
                        f"'rhs' {dts[1]}: raggeddot takes float8 values only inside QArrays, which are "
                        "dequantized exactly while packed; pass precision=None for that product")
    for t in (lt, rt):
        if t not in _HOLDS:
            raise ValueError(f"{fn}: precision={spec.label}: operand type {t} is not one raggeddot multiplies "
                             f"in (float16, bfloat16, tf32, float32, float64)")
    bf16 = lt == rt == "bfloat16"
    for name, d, t in (("lhs", dts[0], lt), ("rhs", dts[1], rt)):
        if d in _HOLDS[t] or (bf16 and d == "float32"):
            continue
        raise TypeError(f"{fn}: precision={spec.label} rounds '{name}' ({d}) to {t} before multiplying, a "
                        "rounding the kernels do not do: cast the operands to the algorithm's types first "
                        f"(as jax rounds them: astype), or pass precision='highest' for exact {ct.name} "
                        "products of the operands as they are")
    if not bf16:
        return "exact"
    if ct.name != "float32":
        raise TypeError(f"{fn}: precision={spec.label} multiplies bfloat16-rounded operands into float32 sums, "
                        f"but this call computes in {ct.name}: give float32 or bfloat16 operands and a float32 "
                        "(or narrower) result")
    if packed is not None:
        if not (packed.dtype.name == "bfloat16" or packed.ctype == "float32-float4w"):
            raise TypeError(f"{fn}: precision={spec.label} rounds the weights to bfloat16 while packing them, "
                            f"but 'rhs' is prepacked {packed.dtype.name} weights"
                            f"{' (' + packed.qtype + ')' if packed.qtype else ''}, laid out already: prepack "
                            "bfloat16 weights, or pass the plain weights ('rhs'.unpack())")
        if dts[0] != "bfloat16":
            raise TypeError(f"{fn}: precision={spec.label} rounds 'lhs' ({dts[0]}) to bfloat16, which a product "
                            "with prepacked 'rhs' does not do: pass a bfloat16 'lhs' (the same values), or the "
                            "plain weights ('rhs'.unpack())")
    return "bf16"

