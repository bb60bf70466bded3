"""Argument checking shared by the public functions.

Every check raises with the name of the argument and what was received. The
checks are of plain values (arrays, dtypes, integers, dimension numbers), and
this module imports no other of the package: the operands of a product
(QArray, AsQArray, PackedRhs) are brought into shape by ``_operand``, and
converted for the kernels by the gateway (``_gateway``).
"""
import math
import operator
import os
import reprlib
import sys

import functools

import numpy as np

__all__ = []

@functools.lru_cache(maxsize=512)
def _cached_name(dtype):
    return dtype.name


def _dtype_name(dtype):
    """``dtype.name`` (NumPy computes it anew on each read: a few microseconds
    that the calls of a decoding step add up), cached per dtype."""
    try:
        return _cached_name(dtype)
    except (TypeError, AttributeError):   # unhashable, or not a dtype
        return getattr(dtype, "name", str(dtype))


def is_bfloat16(dtype):
    return _dtype_name(dtype) == "bfloat16"


def native(dtype):
    """``dtype`` in the machine's byte order (a byte-swapped '>f4' is float32)."""
    dtype = np.dtype(dtype)
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def float_dtype(arr, name, fn):
    """The dtype of a float operand, in native byte order (a byte-swapped
    operand is converted once, by the gateway, and its results are native),
    or TypeError naming `name`."""
    dt = arr.dtype
    if (dt.kind == "f" and dt.itemsize in (2, 4, 8)) or is_bfloat16(dt):
        return native(dt)
    raise TypeError(
        f"{fn}: unsupported dtype for '{name}': {_dtype_name(dt)} "
        "(supported: float16, bfloat16, float32, float64)"
    )


def _rank(dt):
    """jax.lax's order of float types (XLA's HigherPrecisionType): by largest
    exponent, then mantissa bits: float16 < bfloat16 < float32 < float64."""
    return {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}[_dtype_name(dt)]


def promote(a, b):
    """jax.lax's result type of a product of two float dtypes (its
    dot_general dtype rule): the one of the larger range, then of the more
    mantissa bits, so float16 with bfloat16 gives bfloat16 (jax.numpy's
    promotion, which gives float32 there, is not the rule of jax.lax's
    products)."""
    if a == b:
        return a
    return a if _rank(a) > _rank(b) else b


def output_dtype(preferred_element_type, promoted, fn):
    if preferred_element_type is None:
        return promoted
    try:
        dt = np.dtype(preferred_element_type)
    except TypeError:
        raise TypeError(
            f"{fn}: 'preferred_element_type' must be a float dtype, got {preferred_element_type!r}"
        ) from None
    if (dt.kind == "f" and dt.itemsize in (2, 4, 8)) or is_bfloat16(dt):
        return native(dt)
    raise TypeError(
        f"{fn}: 'preferred_element_type' must be a float dtype "
        f"(float16, bfloat16, float32, float64), got {_dtype_name(dt)}"
    )


# Where raggeddot.prepack's PackedRhs is taken: everywhere else it is refused
# by :func:`packed_refused`, and the message says so.
PACKED_TAKEN = ("a PackedRhs is accepted only as the weights (rhs [g, k, n]) of ragged_dot, gmm, "
                "ragged_dot_general with ragged_dot's dimension numbers, and as the expert weights "
                "w0, w1, wo of moe_block")


class Prepacked:
    """The base of :class:`~raggeddot.PackedRhs` (``_prepack``), all that the
    checks here know of it: weights laid out for the kernels, not an array.
    :func:`as_array` and :func:`out_buffer` refuse one with
    :func:`packed_refused`'s message; the modules that accept one (the
    weights of the grouped matmuls) take it before they get here."""
    __slots__ = ()


def is_packed(x):
    """Whether ``x`` is a :class:`~raggeddot.PackedRhs`."""
    return isinstance(x, Prepacked)


def packed_refused(x, what, fn):
    """The TypeError for a PackedRhs ``x`` passed as ``what`` (e.g. "'lhs'"),
    where prepacked weights are not taken: what was received, where a
    PackedRhs is accepted, and how to get the plain weights back."""
    kind = "QArray" if getattr(x, "qtype", None) is not None else "array"
    return TypeError(
        f"{fn}: {what} is a PackedRhs (weights laid out by raggeddot.prepack, shape {tuple(x.shape)}, "
        f"dtype {_dtype_name(x.dtype)}), which is not accepted here; {PACKED_TAKEN}. Pass the plain "
        f"weights instead: PackedRhs.unpack() returns them as a new {kind}")


def received(x):
    """What was received, for a message: ``None``, ``str 'abc'``, ``an
    array of dtype <U3 and shape (2,)``, ``list [1, 'a']`` (values
    abbreviated)."""
    if x is None:
        return "None"
    if isinstance(x, np.ndarray):
        return f"an array of dtype {_dtype_name(x.dtype)} and shape {x.shape}"
    return f"{type(x).__name__} {reprlib.repr(x)}"


def refuse_masked(x, name, fn):
    """TypeError naming ``name`` for a numpy.ma masked array: the kernels
    read its data and would ignore the mask (NumPy's own matmul honours or
    refuses it), so the caller says which values the masked entries take."""
    ma = sys.modules.get("numpy.ma")    # (no masked array exists before numpy.ma is imported)
    if ma is not None and isinstance(x, ma.MaskedArray):
        raise TypeError(f"{fn}: '{name}' is a masked array (numpy.ma), whose mask raggeddot would ignore: "
                        f"pass '{name}'.filled(value) for the values the masked entries take (e.g. 0), "
                        f"or '{name}'.data to use the data as it is")


def as_array(x, name, fn, ndim=None, shape_doc=""):
    """np.asarray(x) with a readable error; non-numeric values (None,
    strings, objects) are refused naming what was received (and a
    PackedRhs, with :func:`packed_refused`'s message)."""
    if x is None:
        raise TypeError(f"{fn}: '{name}' must be an array, got None")
    refuse_masked(x, name, fn)
    try:
        arr = np.asarray(x)
    except Exception as e:  # ragged nested lists and similar
        raise TypeError(f"{fn}: '{name}' could not be converted to an array: {e}") from None
    if arr.dtype.kind in "OUSMm":   # (not "V": ml_dtypes' bfloat16 and float8 are of that kind)
        if is_packed(x):
            raise packed_refused(x, f"'{name}'", fn)
        raise TypeError(f"{fn}: '{name}' must be a numeric array, got {received(x)}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(
            f"{fn}: expected {ndim}-D '{name}'{shape_doc} but got a {arr.ndim}-D array of shape {arr.shape}"
        )
    return arr


def axes(axes, ndim, name, fn):
    """``axes`` (integers, negative ones counted from the end) as a list of
    axes in ``[0, ndim)``; TypeError or ValueError naming ``name`` for a
    non-integer, one out of range or a repeated one."""
    out = []
    for a in axes:
        try:
            a = operator.index(a)
        except TypeError:
            raise TypeError(f"{fn}: '{name}' must hold integer axes, got {a!r}") from None
        if not -ndim <= a < ndim:
            raise ValueError(f"{fn}: '{name}' has axis {a}, out of range for {ndim} dimensions")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{fn}: '{name}' repeats an axis: {tuple(axes)!r}")
    return out


def physical_memory():
    """Bytes of the machine's physical memory (None where the system does
    not say): no array larger than it can ever be filled, whatever the
    operating system promises when it is allocated (an overcommitting Linux
    hands out any size and ends the process when the pages are touched)."""
    global _PHYSICAL
    if _PHYSICAL is False:
        try:
            _PHYSICAL = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
        except (AttributeError, ValueError, OSError):
            _PHYSICAL = None
        if _PHYSICAL is not None and _PHYSICAL <= 0:
            _PHYSICAL = None
    return _PHYSICAL


_PHYSICAL = False    # not read yet


def check_fits(arrays):
    """MemoryError, before anything is allocated, when one of ``arrays``
    (``(shape, dtype)`` pairs) or all of them together need more bytes than
    the machine's physical memory; worded as the allocator's message (the
    bytes, shape and dtype of the first that cannot fit), for
    :class:`memory_for` to name the function. Nothing when the size of the
    memory is unknown."""
    limit = physical_memory()
    if limit is None:
        return
    total = 0
    for shape, dtype in arrays:
        dtype = np.dtype(dtype)
        nbytes = math.prod(int(n) for n in shape) * dtype.itemsize     # (exact, any size)
        total += nbytes
        if nbytes > limit:
            raise MemoryError(f"cannot allocate {nbytes} bytes ({nbytes >> 20} MiB) for an array of shape "
                              f"{tuple(int(n) for n in shape)} and dtype {dtype.name}: more than this "
                              f"machine's memory ({limit} bytes)")
    if total > limit:
        raise MemoryError(f"cannot allocate {total} bytes ({total >> 20} MiB) for arrays of shapes "
                          f"{', '.join(str(tuple(int(n) for n in s)) for s, _ in arrays)}: more than this "
                          f"machine's memory ({limit} bytes) together")


class memory_for:
    """``with memory_for(fn, what):`` re-raises a MemoryError of the block
    as one that names the function ``fn`` and ``what`` it was allocating
    (e.g. "the result [g, k, n]"), followed by the allocator's own words
    (the shape, dtype and bytes of the array that did not fit). A class
    rather than a generator: it wraps every call of the ops, so it is kept
    cheap."""
    __slots__ = ("fn", "what")

    def __init__(self, fn, what):
        self.fn, self.what = fn, what

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if kind is None or not issubclass(kind, MemoryError):
            return False
        if str(e).startswith(f"{self.fn}: "):   # already named by an inner block
            return False
        detail = str(e) or "the allocator has no memory left"
        raise MemoryError(f"{self.fn}: out of memory for {self.what}: {detail}") from e


def index(value, name, fn):
    """A Python int from an int, a NumPy integer or a 0-d/1-element integer array."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fn}: '{name}' must be an integer, got {value!r}")
    if isinstance(value, np.ndarray) or hasattr(value, "__array__") and not isinstance(value, int):
        arr = np.asarray(value)
        if arr.size != 1 or arr.dtype.kind not in "iu":
            raise TypeError(f"{fn}: '{name}' must be an integer scalar, got an array {arr.dtype} {arr.shape}")
        return int(arr.reshape(()))
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: '{name}' must be an integer, got {type(value).__name__} {value!r}") from None


def group_sizes_array(group_sizes, fn, limit=None, limit_doc="lhs.shape[0]"):
    """group_sizes as int64 [g], checked: 1-D, integer, non-negative, sum <= limit."""
    gs = as_array(group_sizes, "group_sizes", fn, ndim=1, shape_doc=" [g]")
    if gs.dtype.kind not in "iu":
        raise TypeError(f"{fn}: 'group_sizes' must have an integer dtype, got {_dtype_name(gs.dtype)}")
    if gs.dtype.kind == "i":
        neg = np.flatnonzero(gs < 0)
        if neg.size:
            i = int(neg[0])
            raise ValueError(f"{fn}: 'group_sizes' has a negative entry: group_sizes[{i}]={int(gs[i])}")
    if gs.size:
        top = int(gs.max())
        total = int(np.sum(gs, dtype=object)) if top > 2**40 else int(gs.sum(dtype=np.int64))
    else:
        total = 0
    if limit is not None and total > limit:
        raise ValueError(f"{fn}: sum(group_sizes)={total} exceeds {limit_doc}={limit}")
    return np.ascontiguousarray(gs, dtype=np.int64), total


def local_group_start(group_offset, g, num_local, fn, local_doc="rhs.shape[0]"):
    """First of the groups [start, start + num_local) that rhs holds.

    group_offset None: rhs holds every group, so num_local must equal g (jax);
    otherwise megablox's meaning: 0 <= group_offset <= g - num_local."""
    if group_offset is None:
        if num_local != g:
            raise ValueError(
                f"{fn}: len(group_sizes)={g} does not match {local_doc}={num_local} "
                "(the number of groups in 'rhs')"
            )
        return 0
    start = index(group_offset, "group_offset", fn)
    if start < 0 or start + num_local > g:
        raise ValueError(
            f"{fn}: 'group_offset'={start} with {local_doc}={num_local} local groups must satisfy "
            f"0 <= group_offset and group_offset + {local_doc} <= len(group_sizes)={g}"
        )
    return start


# ----------------------------------------------------- ragged_dot_general

def _check_dims(dims, rank, what, arg, fn):
    for d in dims:
        if not 0 <= d < rank:
            raise ValueError(
                f"{fn}: {what} {d} is out of range for '{arg}' of rank {rank} "
                "(dimension numbers must be in [0, rank))"
            )


def _check_distinct(dims, arg, what, fn):
    if len(set(dims)) != len(dims):
        raise ValueError(f"{fn}: the {what} of '{arg}' repeat a dimension: {list(dims)}")


def prefixed_group_sizes(group_sizes, fn, prefix_shape, prefix_doc, ragged_size, r):
    """group_sizes of ragged_dot_general, checked, as int64 of shape ``[g]``
    or ``prefix_shape + (g,)``; every row sums to at most ``ragged_size``
    (lhs.shape[r])."""
    gs = as_array(group_sizes, "group_sizes", fn)
    if gs.dtype.kind not in "iu":
        raise TypeError(f"{fn}: 'group_sizes' must have an integer dtype, got {gs.dtype}")
    if gs.ndim == 0:
        raise ValueError(f"{fn}: 'group_sizes' must be at least 1-D [g], got a scalar")
    if gs.ndim > 1 and gs.shape != prefix_shape + gs.shape[-1:]:
        raise ValueError(
            f"{fn}: 'group_sizes' must have shape [g] or {prefix_shape + gs.shape[-1:]} "
            f"(lhs.shape at {prefix_doc} + (g,)), got {gs.shape}"
        )
    if gs.size == 0:
        return gs.astype(np.int64)
    if gs.dtype.kind == "i" and gs.min() < 0:
        i = tuple(int(j) for j in np.argwhere(gs < 0)[0])
        raise ValueError(f"{fn}: 'group_sizes' has a negative entry: group_sizes[{', '.join(map(str, i))}]={gs[i]}")
    if int(gs.max()) > 2**40:  # sums could overflow int64: add exactly
        totals = gs.astype(object).sum(axis=-1)
    else:
        totals = gs.sum(axis=-1, dtype=np.int64)
    over = np.asarray(totals > ragged_size)
    if over.any():
        where = tuple(int(j) for j in np.argwhere(over)[0]) if over.ndim else ()
        at = f" at group_sizes[{', '.join(map(str, where))}, :]" if where else ""
        raise ValueError(
            f"{fn}: sum(group_sizes)={int(np.asarray(totals)[where])} exceeds lhs.shape[{r}]={ragged_size} "
            f"(the lhs ragged dimension){at}"
        )
    return gs.astype(np.int64)


def ragged_dimensions(dn, lhs_shape, rhs_shape, fn):
    """The dimension numbers ``dn`` of ragged_dot_general checked against the
    operand shapes: ``(lb, rb, lc, rc, lf, rf, r, groups)``, the lhs/rhs
    batch, contracting and free dims (free dims in increasing order, rhs's
    without the group dim), the lhs ragged dim and the rhs group dims."""
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    if len(lc) != len(rc):
        raise ValueError(
            f"{fn}: 'lhs' and 'rhs' list different numbers of contracting dimensions: {list(lc)} vs {list(rc)}"
        )
    if len(lb) != len(rb):
        raise ValueError(f"{fn}: 'lhs' and 'rhs' list different numbers of batch dimensions: {list(lb)} vs {list(rb)}")
    _check_dims(lc + lb, len(lhs_shape), "contracting/batch dimension", "lhs", fn)
    _check_dims(rc + rb, len(rhs_shape), "contracting/batch dimension", "rhs", fn)
    _check_distinct(lc + lb, "lhs", "contracting and batch dimensions", fn)
    _check_distinct(rc + rb, "rhs", "contracting and batch dimensions", fn)
    for what, ld, rd in (("contracting", lc, rc), ("batch", lb, rb)):
        for a, b in zip(ld, rd):
            if lhs_shape[a] != rhs_shape[b]:
                raise ValueError(
                    f"{fn}: {what} dimensions differ: lhs.shape[{a}]={lhs_shape[a]} (lhs shape {lhs_shape}) "
                    f"but rhs.shape[{b}]={rhs_shape[b]} (rhs shape {rhs_shape})"
                )

    if len(dn.lhs_ragged_dimensions) != 1:
        raise ValueError(
            f"{fn}: 'lhs_ragged_dimensions' must hold exactly one dimension, got {list(dn.lhs_ragged_dimensions)}"
        )
    r = dn.lhs_ragged_dimensions[0]
    _check_dims((r,), len(lhs_shape), "ragged dimension", "lhs", fn)
    lf = tuple(d for d in range(len(lhs_shape)) if d not in lc and d not in lb)
    groups = dn.rhs_group_dimensions
    if r in lf:
        if len(groups) != 1:
            raise ValueError(
                f"{fn}: 'rhs_group_dimensions' must hold exactly one dimension when the lhs ragged "
                f"dimension {r} is non-contracting, got {list(groups)}"
            )
        _check_dims(groups, len(rhs_shape), "group dimension", "rhs", fn)
        if groups[0] in rc or groups[0] in rb:
            raise ValueError(
                f"{fn}: the rhs group dimension {groups[0]} must not be a contracting or batch dimension "
                f"of 'rhs' (contracting {list(rc)}, batch {list(rb)})"
            )
    elif groups:
        kind = "contracting" if r in lc else "batch"
        raise ValueError(
            f"{fn}: 'rhs_group_dimensions' must be empty when the lhs ragged dimension {r} is {kind}, "
            f"got {list(groups)}"
        )
    rf = tuple(d for d in range(len(rhs_shape)) if d not in rc and d not in rb and d not in groups)
    return lb, rb, lc, rc, lf, rf, r, groups


def out_buffer(out, shape, dtype, fn, inputs):
    """A caller's ``out=`` array, checked: an ndarray of exactly `shape` and of
    the result's `dtype`, writeable, aligned, native, with no repeated
    elements and sharing no memory with any of `inputs` (name -> array)."""
    refuse_masked(out, "out", fn)
    if not isinstance(out, np.ndarray):
        if is_packed(out):
            raise packed_refused(out, "'out'", fn)
        raise TypeError(f"{fn}: 'out' must be a numpy.ndarray, got {type(out).__name__}")
    shape = tuple(shape)
    if out.shape != shape:
        raise ValueError(f"{fn}: 'out' must have shape {shape}, got {out.shape}")
    if not out.dtype.isnative:
        raise ValueError(f"{fn}: 'out' must be in native byte order, got dtype {out.dtype.str}")
    if out.dtype != dtype:
        raise TypeError(f"{fn}: 'out' must have the result's dtype {_dtype_name(dtype)}, got {_dtype_name(out.dtype)}")
    if not out.flags.writeable:
        raise ValueError(f"{fn}: 'out' is read-only")
    if not out.flags.aligned:
        raise ValueError(f"{fn}: 'out' must be aligned")
    if any(s % out.itemsize or (s == 0 and d > 1) for s, d in zip(out.strides, out.shape)):
        raise ValueError(f"{fn}: 'out' has strides {out.strides} that repeat or split its elements")
    for name, arr in inputs.items():
        if arr is not None and np.may_share_memory(out, arr):
            raise ValueError(f"{fn}: 'out' shares memory with '{name}'")
    return out


def same_buffer(a, b):
    """Whether two arrays are the same elements in the same layout."""
    return (a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def flag(value, name, fn):
    """A boolean option; TypeError naming it otherwise (a string "False" is
    not False)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{fn}: '{name}' must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)
