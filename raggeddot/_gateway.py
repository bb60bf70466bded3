"""The one door to the compiled kernels: every computation of the package
reaches ``raggeddot._core`` through the functions here.

The functions take already-checked arguments (the public ops validate them;
the operands of a product come from ``_operand``: arrays, QArrays and
PackedRhs) and hold three policies that would otherwise be repeated by every
op:

- the compute dtype (:func:`compute_dtype`): what precision the kernels
  accumulate in for given input and output dtypes;
- the operand policy (:func:`operand`): how an input array becomes something
  a kernel can read, copying only when it has to. It is the one function to
  change when the kernels learn to read more dtypes directly;
- the result buffers (:func:`empty`, :func:`result_buffer`, :func:`deliver`):
  64-byte aligned, cached blocks the kernels can stream into, and the
  caller's ``out=`` array.

Shapes below: ``g`` groups, ``bounds`` an int64 array of ``g + 1``
non-decreasing row offsets, group ``j`` owning rows ``[bounds[j],
bounds[j + 1])``. Every kernel result is deterministic: the order of each
reduction depends on the blocking alone, never on the number of threads.
"""
import numpy as np

from . import _core
from . import _validate as v
from .quant import QArray

__all__ = [
    "ACTIVATIONS",
    "SCORE_FUNCS",
    "compute_dtype",
    "operand",
    "empty",
    "result_buffer",
    "check_out",
    "deliver",
    "group_bounds",
    "rows",
    "contract",
    "quantizes_in_kernel",
    "matmul",
    "group_metadata",
    "route",
    "sort_by_expert",
    "gather_rows",
    "gather_reduce",
    "combine_rows",
    "slot_dots",
    "gated_act",
    "gated_act_grad",
    "gated_rows",
    "gated_grad_rows",
]

#: Names of the gated activations the kernels compute (``act(gate) * up``
#: for all but "swiglu_oai"); the codes are the C enum's, read from _core.
ACTIVATIONS = tuple(_core.ACTIVATIONS)
#: Names of the router score functions ("softmax", "sigmoid").
SCORE_FUNCS = tuple(_core.SCORE_FUNCS)

#: Layouts an operand may be asked for (see :func:`operand`).
STRIDED, ROWS, CONTIGUOUS, PACKED = "strided", "rows", "contiguous", "packed"

_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)


# --------------------------------------------------------------- policies

def compute_dtype(*dtypes):
    """The dtype the kernels compute in for inputs/outputs of ``dtypes``:
    float64 when any of them is float64, else float32 (so half-precision
    inputs are accumulated in float32)."""
    for d in dtypes:
        if (d if isinstance(d, np.dtype) else np.dtype(d)).itemsize == 8:
            return _FLOAT64
    return _FLOAT32


#: The storage dtypes the grouped-matmul kernels read directly for a product
#: in each compute dtype, converting while packing (float16, bfloat16 and
#: float32 for any product, float64 for a float64 one): the C packing table's.
_PACKING_READS = {name: frozenset(reads) for name, reads in _core.PACKING_READS.items()}


def _packing_reads(dtype, ct):
    """Whether the grouped-matmul kernels read storage ``dtype`` (native
    byte order) directly for a product in compute dtype ``ct``."""
    return v._dtype_name(dtype) in _PACKING_READS[v._dtype_name(ct)]


def operand(arr, dtype, layout=STRIDED):
    """``arr`` as the kernels read an operand of compute dtype ``dtype``.

    The operand policy, in one place: an array of another dtype is converted
    (one copy, keeping its memory order); a misaligned or byte-swapped array
    of the right dtype is copied into aligned native memory; anything else
    is returned as it is: the matmul kernels read any strides, transposed
    and negative-stride views included (``layout="strided"``). The grouped
    matmuls' own operands (``layout="packed"``) keep every storage dtype
    the packing reads (float16, bfloat16, float32; float64 for a float64
    product): those are converted value by value while packed, never as a
    whole-array copy. A :class:`~raggeddot.QArray` is passed as the tuple
    ``(qvalue, scale, zero_point)`` with its (small) scale and zero-point
    arrays in the compute dtype: the packing dequantizes each value with the
    scale of its tile (only ``layout="packed"`` takes one); 4-bit values
    (qtypes "float4_e2m1fn", "mxfp4") as ``(codes, scale, None, axis,
    length)``, their bytes as :class:`~raggeddot.quant.PackedFloat4` holds
    them, e8m0 scales widened exactly to the compute dtype. The gathers read whole rows (``layout="rows"``: unit
    column stride, copied otherwise) and the element-wise kernels flat
    memory (``layout="contiguous"``: C-contiguous)."""
    if isinstance(arr, QArray):
        if layout != PACKED:
            raise TypeError("a QArray is read only by the grouped matmuls (layout='packed')")
        zp = arr.zero_point
        scale = np.ascontiguousarray(arr.scale, dtype=dtype)
        if arr.qtype in ("float4_e2m1fn", "mxfp4"):   # 4-bit codes two a byte: (codes, ..., axis, length)
            return (arr.qvalue.codes, scale, None, arr.qvalue.axis, arr.qvalue.length)
        return (arr.qvalue, scale, None if zp is None else np.ascontiguousarray(zp, dtype=dtype))
    if layout == PACKED:
        native = arr.dtype.newbyteorder("=") if not arr.dtype.isnative else arr.dtype
        if _packing_reads(native, dtype):
            if not arr.flags.aligned or not arr.dtype.isnative:
                arr = np.array(arr, dtype=native)
            return arr
        layout = STRIDED
    if arr.dtype is not dtype or not arr.flags.aligned:   # else: nothing to do (the common case)
        if arr.dtype != dtype:
            arr = arr.astype(dtype)
        elif not arr.flags.aligned or not arr.dtype.isnative:
            arr = np.array(arr, dtype=dtype.newbyteorder("="))
    if layout == STRIDED:
        return arr
    if layout == ROWS:
        if arr.ndim == 2 and arr.shape[0] > 0 and arr.shape[1] > 1 and arr.strides[1] != arr.itemsize:
            arr = np.ascontiguousarray(arr)
    elif layout == CONTIGUOUS:
        arr = np.ascontiguousarray(arr)
    return arr


def _indices(idx):
    return np.ascontiguousarray(idx, dtype=np.int64)


# ----------------------------------------------------------- result buffers

def empty(shape, dtype):
    """An uninitialised C-contiguous array of ``shape`` (float32, float64,
    float16 or bfloat16),
    64-byte aligned (the kernels write whole cache lines of it with
    non-temporal stores), whose memory comes from, and goes back to, the
    cache of result buffers (``runtime.set_buffer_cache``)."""
    return _core.empty(tuple(shape), np.dtype(dtype))


def result_buffer(out, existing, shape, out_dtype, ct, fn, inputs):
    """The array a kernel writes a result of ``shape`` into.

    The caller's ``out`` (checked: ``_validate.out_buffer``) when the
    kernels write it directly (its dtype is the compute dtype ``ct``, or
    float16 / bfloat16 for a float32 product: :func:`kernel_dtype`), else a
    fresh array: of ``out_dtype`` when they write that directly, of ``ct``
    otherwise (:func:`empty`; :func:`deliver` converts it). When
    ``existing`` is given the buffer starts with its values (a copy, unless
    ``out`` is ``existing`` itself: inputs are never written otherwise).
    ``inputs`` maps names to the arrays ``out`` must not overlap."""
    out = check_out(out, existing, shape, out_dtype, fn, inputs)
    direct = out_dtype == ct or (ct == _FLOAT32 and out_dtype.itemsize == 2)   # see kernel_dtype
    if out is not None and direct:
        if existing is not None and not v.same_buffer(out, existing):
            np.copyto(out, existing)
        return out
    res = empty(shape, ct) if out_dtype == ct or not direct else np.empty(shape, dtype=out_dtype)
    if existing is not None:
        np.copyto(res, existing)
    return res


def check_out(out, existing, shape, out_dtype, fn, inputs):
    """The caller's ``out`` checked as :func:`result_buffer` takes it
    (``_validate.out_buffer``, and no partial overlap with ``existing``),
    without writing anything: the ops check it before the steps that
    allocate (a PackedRhs's new layout), so that a refused call changes
    nothing. None stays None."""
    if out is None:
        return None
    out = v.out_buffer(out, shape, out_dtype, fn, inputs)
    if existing is not None and not v.same_buffer(out, existing) and np.may_share_memory(out, existing):
        raise ValueError(f"{fn}: 'out' partly overlaps 'existing_out'; pass the same array or separate ones")
    return out


def kernel_dtype(out):
    """The compute dtype of a grouped matmul writing into ``out``: its own
    dtype, or float32 for a float16 / bfloat16 ``out``, which the kernels
    fill tile by tile, each tile computed in float32 and rounded once (to
    nearest even) when complete: the values of a float32 result narrowed
    afterwards, without the float32 array."""
    return _FLOAT32 if out.dtype.itemsize == 2 else out.dtype


def narrow(res, dtype):
    """float32 ``res`` (C-contiguous) as a new float16 / bfloat16 array,
    rounded to nearest even (NumPy's and ml_dtypes' casts give the same
    values, one at a time)."""
    out = empty(res.shape, dtype)
    _core.narrow(res, out)
    return out


def deliver(res, out, out_dtype):
    """The result ``res`` (held in the compute dtype) as ``out_dtype``:
    written into ``out`` and returned as ``out`` when the caller gave one."""
    if out is None:
        if res.dtype == out_dtype:
            return res
        if res.dtype == _FLOAT32 and out_dtype.itemsize == 2 and res.flags.c_contiguous:
            return narrow(res, out_dtype)
        return res.astype(out_dtype)
    if res is not out:
        np.copyto(out, res, casting="unsafe")
    return out


# ------------------------------------------------------------- grouped matmuls

def group_bounds(group_sizes, start, count):
    """Row bounds ``[count + 1]`` (int64) of groups ``[start, start + count)``
    of ``group_sizes [g]`` (checked: non-negative, ``start + count <= g``):
    ``bounds[j] = sum(group_sizes[:start + j])``."""
    offsets = np.empty(group_sizes.shape[0] + 1, dtype=np.int64)
    offsets[0] = 0
    np.add.accumulate(group_sizes, out=offsets[1:])
    return offsets[start:start + count + 1]          # a unit-stride slice: contiguous


def rows(lhs, rhs, bounds, out, accumulate=False, algo=None, quantize_lhs=False):
    """Ragged rows, the forward of ragged_dot/gmm: for each group j,
    ``out[r] (+)= lhs[r] @ rhs[j]`` for r in ``[bounds[j], bounds[j + 1])``.

    lhs ``[m, k]``, rhs ``[g, k, n]``, bounds ``[g + 1]``, out ``[m, n]``
    (writeable, of the compute dtype; operands of any float dtype, read as
    :func:`operand` says for ``layout="packed"``). Rows outside ``[bounds[0], bounds[g])`` are left as
    they are; with ``k = 0`` the group rows become 0 (or stay, when
    accumulating). ``algo`` (``_precision.resolve``): "bf16": float32 operands
    are read as bfloat16, rounded to nearest even while packed; "exact": no
    dot-product instruction. A product of two bfloat16 operands (so read)
    otherwise runs on the fastest bfloat16 kernels this CPU has (AMX tiles,
    vdpbf16ps where it outruns the float32 FMAs). ``quantize_lhs```
    (:func:`quantizes_in_kernel`): a float32 / bfloat16 lhs is quantized to
    int8 per row while packed, the product that of
    ``quantize(lhs, "int8", channelwise_axes=(0,))`` and the int8 QArray rhs,
    bit for bit, without the int8 copy. Returns ``out``."""
    if bounds.item(-1) > bounds.item(0) and out.shape[1] > 0:
        ct = kernel_dtype(out)
        rhs = int8_rows_rhs(lhs, rhs, quantize_lhs)
        _core.ragged_rows(operand(lhs, ct, PACKED), operand(rhs, ct, PACKED), bounds, out, bool(accumulate),
                          algo == "bf16", bool(quantize_lhs), algo == "exact")
    return out


def mxfp4_as_int8(q):
    """The int8 QArray an "mxfp4" QArray ``q`` multiplies int8 rows as (w4a8):
    each value v as the integer 2v (in [-12, 12]) and each scale 2^(e - 127)
    as 2^(e - 128), both exact (the same dequantized weights), so that the
    products are the exact int8 ones."""
    values = (np.asarray(q.qvalue).astype(np.float32) * np.float32(2)).astype(np.int8)
    return QArray(values, np.asarray(q.scale, dtype=np.float32) * np.float32(0.5), None, "int8")


def int8_rows_rhs(lhs, rhs, quantize_lhs=False):
    """``rhs`` as a product with ``lhs`` reads it: an "mxfp4" QArray meeting
    int8 rows (an int8 QArray lhs, or rows the kernels quantize to int8) as
    :func:`mxfp4_as_int8`'s int8 QArray, whose products with them are the
    exact int8 ones (what its 4-bit layout for int8 rows computes); else
    ``rhs`` itself."""
    if isinstance(rhs, QArray) and rhs.qtype == "mxfp4" and (
            quantize_lhs or (isinstance(lhs, QArray) and lhs.qvalue.dtype == np.int8)):
        return mxfp4_as_int8(rhs)
    return rhs


def quantizes_in_kernel(lhs, rhs, qtype):
    """Whether a per-row ``qtype`` quantization of the float ``lhs`` rows
    multiplied by ``rhs`` can be done by the kernels while they pack lhs
    (``rows(..., quantize_lhs=True)``): int8, a float32 or bfloat16 lhs, an
    int8 (or int4) QArray rhs with integral zero points or weights prepacked
    for int8 dot products, and the int8 dot-product kernels served."""
    if qtype not in ("int8", np.int8) or not isinstance(lhs, np.ndarray) or lhs.dtype.name not in (
            "float32", "bfloat16"):
        return False
    if getattr(rhs, "ctype", None) in ("int8-dot", "int8-mmla", "int8-int4-dot", "int8-mxfp4-dot"):
        return True
    if not (isinstance(rhs, QArray) and rhs.qtype in ("int8", "int4", "mxfp4") and rhs.dtype == _FLOAT32):
        return False
    return integral_zero_points(rhs.zero_point) and (served("int8-dot") or served("int8-mmla"))


def integral_zero_points(zp):
    """Zero points the exact int8 products fold in: none, or integers in
    [-128, 127] (the values less them are then exact int16s)."""
    return zp is None or bool(np.all((zp == np.round(zp)) & (zp >= -128) & (zp <= 127)))


def prepack_layout(ctype, dtype, k, n, qtile=0, zero_points=False):
    """``(bytes per group, NR, KC, kernel family)`` of weights ``[g, k, n]``
    of storage ``dtype`` laid out for compute type ``ctype`` (a name of
    ``_core.PACKING_READS``) with the kernel selected now; quantized weights
    (ctype "float32-int8w" / "float32-float8w") with scale tiles ``qtile``
    deep along k, and zero points when ``zero_points``."""
    return _core.prepack_layout(ctype, dtype, int(k), int(n), int(qtile), bool(zero_points))


def prepack(w, buf, ctype, kc, nr):
    """Lay ``w [g, k, n]`` (any strides; for quantized weights the tuple
    :func:`operand` makes of a QArray, float32 scales) out in ``buf``
    (uint8, 64-byte aligned, of prepack_layout's size times g) for
    ``ctype``'s kernel with blocking ``kc`` and panel width ``nr``."""
    _core.prepack(w, buf, ctype, int(kc), int(nr))


# the types that multiply weights laid out for a dot type besides it: the
# tile types (AMX)
_READERS = {"bfloat16-dot": ("bfloat16-tile",), "int8-dot": ("int8-tile",)}


def served(ctype):
    """Whether a kernel serves compute type ``ctype`` (a name of
    ``_core.PACKING_READS``, e.g. "bfloat16-dot") with the kernel selection
    in force: the dot-product types are served only where the CPU has their
    instruction (or a twin was selected by name). A dot type's layout is
    also served where the tile type that reads it is (AMX)."""
    gen = selection()
    hit = _SERVED.get(ctype)
    if hit is not None and hit[0] == gen:
        return hit[1]
    now = _core.kernel_for(ctype) != "none" or \
        any(_core.kernel_for(reader) != "none" for reader in _READERS.get(ctype, ()))
    _SERVED[ctype] = (gen, now)
    return now


# served's answers, {ctype: (selection generation, served)}: a decode step
# asks the same a few dozen times
_SERVED = {}


def selection():
    """A number that changes whenever the kernel selection or a blocking
    does (``runtime.set_kernel``, ``set_blocking``): decisions drawn from
    the selection in force may be kept while it stays the same."""
    return _core.selection_generation()


def rows_packed(lhs, packed, bounds, out, accumulate=False, quantize_lhs=False):
    """:func:`rows` with rhs a :class:`~raggeddot.PackedRhs` (weights laid
    out once by prepack, read where they lie). ``out`` of the compute dtype
    the weights were laid out for (float64 for float64 weights, float32
    otherwise). ``quantize_lhs`` as for :func:`rows` (weights prepacked for
    int8 dot products). Returns ``out``."""
    if bounds.item(-1) > bounds.item(0) and out.shape[1] > 0:
        g, k, n = packed.shape
        _core.ragged_rows_packed(operand(lhs, kernel_dtype(out), PACKED), packed._buf, v._dtype_name(packed._storage),
                                 packed.ctype, g, k, n, packed.kc, packed.nr, bounds, out, bool(accumulate),
                                 packed._qtile, packed._zero_point is not None, bool(quantize_lhs))
    return out


def contract(lhs, rhs, bounds, out, accumulate=False, algo=None, lhs_cols=None, rhs_rows=None, rhs_row_scale=None):
    """Ragged contraction, the weight gradient (tgmm): for each group j,
    ``out[j] (+)= lhs[:, rows_j] @ rhs[rows_j, :]``, rows_j = ``[bounds[j],
    bounds[j + 1])``.

    lhs ``[k, m]``, rhs ``[m, n]``, bounds ``[g + 1]``, out ``[g, k, n]``
    of the compute dtype. An empty group gives zeros (or leaves ``out[j]``
    as it is when accumulating). Each output tile is owned by one thread: no
    reduction across threads. ``algo`` and the dot-product kernels as for
    :func:`rows`. With ``lhs_cols`` (int64 ``[m]``), lhs is ``[k, t]`` and
    the product reads ``lhs[:, lhs_cols]``; with ``rhs_rows``, rhs is ``[t,
    n]`` and it reads ``rhs[rhs_rows]``: through the index while packing
    (float operands, algo None), never gathered whole, with the bits of the
    gathered array's product; ``rhs_row_scale`` (``[m]``, float32 or float64
    rhs): it reads ``rhs_row_scale[:, None] * rhs[rhs_rows]``, each product
    rounded to rhs's dtype. Returns ``out``."""
    if out.size:
        ct = kernel_dtype(out)
        a, b = operand(lhs, ct, PACKED), operand(rhs, ct, PACKED)
        if lhs_cols is None and rhs_rows is None:
            _core.ragged_contract(a, b, bounds, out, bool(accumulate), algo == "bf16", False, algo == "exact")
        else:
            _core.ragged_contract_gathered(a, b, bounds, out, bool(accumulate),
                                           *(None if i is None else _indices(i) for i in (lhs_cols, rhs_rows)),
                                           rhs_row_scale)
    return out


def matmul(a, b, out=None, accumulate=False):
    """Dense ``out (+)= a [m, k] @ b [k, n]`` on the grouped kernel (one group
    of m rows); a new ``[m, n]`` array of the compute dtype when ``out`` is
    None. Returns ``out``.

    The MoE layer keeps its dense products (router, shared experts, their
    gradients) off NumPy's BLAS: OpenBLAS leaves its worker threads spinning
    after each call, and they take the cores from the OpenMP threads of the
    grouped kernels that run next."""
    m, n = a.shape[0], b.shape[1]
    if out is None:
        out = np.empty((m, n), dtype=compute_dtype(a.dtype, b.dtype))
        accumulate = False
    if m == 0 or n == 0:
        return out
    if a.shape[1] == 0:
        if not accumulate:
            out[...] = 0
        return out
    ct = out.dtype
    _core.ragged_rows(operand(a, ct, PACKED), operand(b, ct, PACKED)[None], np.array([0, m], dtype=np.int64),
                      out, bool(accumulate))
    return out


def group_metadata(group_sizes, m, tm, start_group, num_nonzero_groups, visit_empty_groups):
    """megablox's tile metadata (see ``make_group_metadata``) for checked
    arguments: ``((group_offsets, group_ids, m_tile_ids), num_tiles)``."""
    return _core.make_group_metadata(_indices(group_sizes), m, tm, start_group, num_nonzero_groups,
                                     bool(visit_empty_groups))


# ------------------------------------------------------------------ MoE pieces

def route(logits, score_func, selection_bias, n_groups, topk_groups, top_k, norm_topk_prob, scaling):
    """Router scores and top-k choice of ``logits [T, E]`` (compute dtype).

    ``scores = softmax(logits)`` or ``sigmoid(logits)`` (``score_func``);
    the top_k experts of ``scores + selection_bias`` per token (ties to the
    lower index), among the topk_groups best of n_groups expert groups (a
    group ranked by the sum of its two best biased scores; ``n_groups = 1``
    for none); weights = the unbiased scores of the chosen experts, divided
    by their sum when ``norm_topk_prob`` (+1e-20 for sigmoid), times
    ``scaling``. Returns ``(scores [T, E], topk_idx [T, k] int64,
    topk_weights [T, k])``."""
    ct = logits.dtype
    if selection_bias is not None:
        selection_bias = operand(selection_bias, ct, CONTIGUOUS)
    return _core.moe_route(operand(logits, ct, CONTIGUOUS), _core.SCORE_FUNCS[score_func], selection_bias,
                           n_groups, topk_groups, top_k, bool(norm_topk_prob), float(scaling))


def sort_by_expert(topk_idx, num_experts, capacity):
    """Stable counting sort of the ``[T, k]`` assignments by expert.

    Returns ``(slot_of [T, k], token_of_slot [N], group_sizes [E])`` (int64):
    assignment (t, j) goes to sorted slot ``slot_of[t, j]``, expert e's
    slots are consecutive and in token order. ``capacity >= 0`` keeps at
    most that many assignments per expert, first come first served; a
    dropped one gets slot -1. ``N = sum(group_sizes)``."""
    return _core.moe_sort(_indices(topk_idx), num_experts, capacity)


def gather_rows(x, indices, scale=None, out_dtype=None):
    """``out[i] = x[indices[i]]`` (times ``scale[i]``): x ``[T, d]``,
    indices ``[n]`` in ``[0, T)``, scale ``[n]`` or None; ``out [n, d]`` in
    x's compute dtype, or in ``out_dtype`` (float16 or bfloat16, for
    float32 x): each scaled row computed in float32 and rounded once to
    nearest even (:func:`narrow`'s values, without the float32 array)."""
    ct = compute_dtype(x.dtype)
    if scale is not None:
        scale = operand(np.asarray(scale), ct, CONTIGUOUS)
    if out_dtype is not None:   # (the binding refuses any other than float16 / bfloat16 of float32 rows)
        return _core.gather_rows(operand(x, ct, ROWS), _indices(indices), scale, np.empty(0, out_dtype))
    rows = x.dtype if x.dtype.itemsize == 2 else ct   # 16-bit rows: copied as they are (float32 when scaled)
    return _core.gather_rows(operand(x, rows, ROWS), _indices(indices), scale)


def gather_reduce(y, indices, weights=None, ordered=False):
    """``out[t] = sum_j weights[t, j] * y[indices[t, j]]``, j in order (or,
    ``ordered``, in the order of the indices): y ``[n, d]``, indices ``[T,
    k]`` in ``[-1, n)`` (-1 adds nothing; with ``ordered`` a row's indices
    distinct), weights ``[T, k]`` or None (ones); ``out [T, d]`` in y's
    compute dtype."""
    ct = compute_dtype(y.dtype)
    if weights is not None:
        weights = operand(np.asarray(weights), ct, CONTIGUOUS)
    idx = _indices(indices)
    rows = y.dtype if y.dtype.itemsize == 2 else ct   # 16-bit rows: widened in the kernel, summed in float32
    return _core.gather_reduce(operand(y, rows, ROWS), idx, weights, bool(ordered))


def slot_dots(a, rows, slot_of):
    """``out[t, j] = <a[t], rows[slot_of[t, j]]>`` (0 where the index is
    -1): a ``[T, d]``, rows ``[n, d]`` (float32, float64, float16,
    bfloat16), slot_of ``[T, k]``; ``out [T, k]`` in their compute dtype,
    each sum taken in double and rounded once."""
    ct = compute_dtype(a.dtype, rows.dtype)
    keep = lambda x: x.dtype if x.dtype.itemsize == 2 else ct   # noqa: E731 - 16-bit rows read as they are
    return _core.slot_dots(operand(a, keep(a), ROWS), operand(rows, keep(rows), ROWS), _indices(slot_of))


def combine_rows(lhs, w, bounds, out, tokens, weights, bias, hidden, lhs1=None, w1=None):
    """The experts' down product with the combine in its epilogue: for each
    group j, rows r in ``[bounds[j], bounds[j + 1])``, ``y = lhs[r] @ w[j]
    (+ bias[j])`` rounded to ``hidden`` (a dtype: float32, float64,
    bfloat16, float16), then ``out[tokens[r]] += weights[r] * y``, each
    output element summing its rows in row order whatever the number of
    threads. lhs ``[m, k]``, w ``[g, k, n]`` (as :func:`operand` reads
    them for ``layout="packed"``, or a PackedRhs of a float layout), out
    ``[T, n]`` of the compute dtype with contiguous rows, tokens ``[m]``,
    weights ``[m]`` or None (ones), bias ``[g, n]`` or None. The values of
    :func:`rows` into y (rounded to ``hidden``) then :func:`gather_reduce`
    with ``ordered``, bit for bit, without the ``[m, n]`` array of y.
    With ``lhs1`` (as lhs) and ``w1`` (plain weights as w): ``y = lhs[r] @
    w[j] + lhs1[r] @ w1[j]``, the values of :func:`rows` of the first pair
    then :func:`rows` of the second with ``accumulate``. Returns ``out``."""
    ct = compute_dtype(np.dtype(hidden))
    more = () if lhs1 is None else (operand(lhs1, ct, PACKED), operand(w1, ct, PACKED))
    if getattr(w, "ctype", None) is not None:     # a PackedRhs
        g, k, n = w.shape
        w = (w._buf, w._buf, v._dtype_name(w._storage), w.ctype, g, k, n, w.kc, w.nr, w._qtile,
             w._zero_point is not None)
    else:
        w = operand(w, ct, PACKED)
    if weights is not None:
        weights = operand(np.asarray(weights), ct, CONTIGUOUS)
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=ct)
    _core.combine_rows(operand(lhs, ct, PACKED), w, bounds, out, _indices(tokens), weights, bias,
                       np.empty(0, dtype=hidden), *more)
    return out


def gated_act(gate, up, activation, limit, alpha=1.702):
    """Element-wise ``act(gate) * up`` (``activation`` one of
    :data:`ACTIVATIONS`; "swiglu_oai" is ``g * sigmoid(alpha g) * (u + 1)``
    with ``g = min(gate, limit)``, ``u = clip(up, -limit, limit)``). gate
    and up: one shape, one compute dtype."""
    ct = gate.dtype
    return _core.gated_act(operand(gate, ct, CONTIGUOUS), operand(up, ct, CONTIGUOUS),
                           _core.ACTIVATIONS[activation], float(limit), float(alpha))


def gated_act_grad(gate, up, d_out, activation, limit, alpha=1.702):
    """``(d_gate, d_up)`` of :func:`gated_act` for the cotangent ``d_out``
    (all three of one shape and compute dtype)."""
    ct = gate.dtype
    return _core.gated_act_grad(operand(gate, ct, CONTIGUOUS), operand(up, ct, CONTIGUOUS),
                                operand(d_out, ct, CONTIGUOUS), _core.ACTIVATIONS[activation], float(limit),
                                float(alpha))


def gated_rows(lhs, w0, w1, bounds, a, h0, h1, b0, b1, activation, limit, alpha=1.702, rows=None,
               quantize_lhs=False):
    """The gate and up products of the experts in one pass: for each group
    j, rows r in ``[bounds[j], bounds[j + 1])``, ``h0 = lhs[r] @ w0[j] (+
    b0[j])``, ``h1 = lhs[r] @ w1[j] (+ b1[j])`` rounded to ``a``'s dtype,
    ``a[r] = act(h0) * h1`` (:func:`gated_act`) written as each tile of the
    products completes; h0 and h1 written too when given (arrays like
    ``a``), else never stored whole. lhs ``[m, k]``, w0 and w1 ``[g, k, n]``
    of one dtype (as :func:`operand` reads them for ``layout="packed"``) or
    two PackedRhs of one float layout, a ``[m, n]`` of the hidden dtype
    (float32, float64, bfloat16, float16) with contiguous rows, b0 and b1
    ``[g, n]`` or None. The values of
    :func:`rows` into h0 and h1, then :func:`gated_act`, bit for bit.
    ``rows``: None, or int64 ``[m]`` indices into lhs's rows (lhs ``[T,
    k]``): row i of the product reads ``lhs[rows[i]]``, gathered while the
    kernels pack it (an MoE layer's dispatch without the ``[m, k]`` copy).
    ``quantize_lhs``: float32 or bfloat16 lhs rows quantized to int8 per row
    while packed (no ``rows``), times int8 QArray weights or two int8 dot
    layouts: the values of :func:`rows` with ``quantize_lhs`` into h0 and
    h1. Returns ``a``."""
    ct = compute_dtype(a.dtype)
    biases = [None if b is None else np.ascontiguousarray(b, dtype=ct) for b in (b0, b1)]
    if getattr(w0, "ctype", None) is not None:     # two PackedRhs of one layout
        g, k, n = w0.shape
        weights = ((w0._buf, w1._buf, v._dtype_name(w0._storage), w0.ctype, g, k, n, w0.kc, w0.nr, w0._qtile,
                    w0._zero_point is not None), None)
    else:
        weights = (operand(w0, ct, PACKED), operand(w1, ct, PACKED))
    _core.gated_rows(operand(lhs, ct, PACKED), *weights, bounds, a, h0, h1, *biases, _core.ACTIVATIONS[activation],
                     float(limit), float(alpha), None if rows is None else _indices(rows), bool(quantize_lhs))
    return a


def gated_grad_rows(lhs, w, bounds, h0, h1, dh0, dh1, activation, limit, alpha=1.702, rows=None, row_scale=None):
    """The first product of the experts' backward with the activation's
    gradient in its epilogue: for each group j, rows r in ``[bounds[j],
    bounds[j + 1])``, ``d_a = lhs[r] @ w[j]`` rounded to h0's dtype, then
    ``dh0[r], dh1[r] = gated_act_grad(h0[r], h1[r], d_a)`` (written into
    dh0, dh1), as each tile completes: the values of :func:`rows` into d_a
    then :func:`gated_act_grad`, bit for bit, without the d_a array. lhs
    ``[m, k]``, w ``[g, k, n]`` (as :func:`operand` reads them for
    ``layout="packed"``), h0, h1, dh0, dh1 ``[m, n]`` of one dtype with
    contiguous rows, h0 and h1 of one row stride, dh0 and dh1 of one (the
    halves of one ``[m, 2n]`` array, say). With ``rows`` (int64 ``[m]``),
    lhs is ``[t, k]`` and row r reads ``lhs[rows[r]]``, times
    ``row_scale[r]`` where given (``[m]``, float32 or float64 lhs, each
    product rounded to its dtype): through the index while packed. Returns
    ``(dh0, dh1)``."""
    ct = compute_dtype(h0.dtype)
    _core.gated_grad_rows(operand(lhs, ct, PACKED), operand(w, ct, PACKED), bounds, h0, h1, dh0, dh1,
                          _core.ACTIVATIONS[activation], float(limit), float(alpha),
                          None if rows is None else _indices(rows), row_scale)
    return dh0, dh1
