"""ragged_dot (jax.lax.ragged_dot) and its derivative rules: validation here,
arithmetic through the gateway."""
from . import _autodiff
from . import _gateway as gw
from . import _operand
from . import _precision
from . import _validate as v
from ._megablox import tgmm
from ._prepack import PackedRhs, meet

__all__ = ["ragged_dot"]


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, group_offset=None, *,
               out=None):
    """Grouped matrix multiplication with the semantics of ``jax.lax.ragged_dot``.

    The rows of ``lhs`` are split into consecutive groups; group ``i`` owns rows
    ``[s_i, s_i + group_sizes[i])`` with ``s_i = sum(group_sizes[:i])``, and::

        out[r, :] = lhs[r, :] @ rhs[i]      for every row r of group i
        out[r, :] = 0                        for r >= sum(group_sizes)

    Args:
      lhs: ``[m, k]`` float array (float16, bfloat16, float32 or float64), or
        a :class:`~raggeddot.QArray` (any tiling of its scales, e.g. per
        token ``[m, 1]``), read as its dequantized value.
      rhs: ``[g, k, n]`` float array, one ``[k, n]`` matrix per group, or a
        QArray (per channel ``[g, 1, n]``, subchannel ``[g, k/bk, n]``, ...).
        A QArray's values are dequantized while packed, never copied whole.
        Or a :class:`~raggeddot.PackedRhs` (:func:`~raggeddot.prepack`):
        weights laid out once, read in place (an lhs it was not laid out
        for gets the plain weights' result: see prepack).
      group_sizes: ``[g]`` integers, non-negative, ``sum(group_sizes) <= m``.
      precision: what jax.lax takes, meaning what it means there
        (``raggeddot._precision`` has the whole rule). None, DEFAULT,
        HIGH (and their strings, the preset DEFAULT): the fastest kernels,
        bfloat16 x bfloat16 on AMX tiles or ``vdpbf16ps`` where the CPU has
        them. HIGHEST ("highest", "float32", either entry of a pair),
        ``DotAlgorithmPreset.F32_F32_F32`` and every algorithm whose
        operand types hold the operands as they are (``DotAlgorithm(float32,
        float32, float32)``, F16_F16_F32 on float16 operands, TF32_TF32_F32
        on 16-bit ones, the _X3/_X6/_X9 emulations of float32): exact
        products summed in float32, no flushing, bit for bit the product of
        the widened operands. ``BF16_BF16_F32`` (also BF16_BF16_BF16, a
        ``DotAlgorithm`` of bfloat16 operands): float32 operands rounded to
        bfloat16 (nearest even) while packed, products summed in float32 on
        the bfloat16 dot-product kernels where the CPU has them. Refused
        (TypeError or ValueError naming it) before anything runs: a rounding
        the kernels do not do (e.g. F16_F16_F32 on float32 operands, any
        algorithm rounding float64 operands), float64 accumulation in a
        float32 call, the float8 presets, a value jax does not take.
      preferred_element_type: dtype of the result; default is the promoted
        type of lhs and rhs as jax.lax promotes them (the wider float wins;
        float16 with bfloat16 gives bfloat16).
      group_offset: megablox's expert sharding. When given, ``rhs`` holds only
        groups ``[group_offset, group_offset + rhs.shape[0])`` of the
        ``len(group_sizes)`` groups; rows of those groups are computed and all
        other rows are 0.
      out: optional ``[m, n]`` array of the result's dtype to write the result
        into (NumPy's ``out=``; it must not share memory with lhs or rhs). A
        caller that reuses one buffer across calls skips the page faults of a
        fresh large array.

    Returns:
      ``[m, n]`` array (``out`` when given). Products accumulate in float32
      (float64 when an input or the output is float64) and are cast once at
      the end.

    Runs on the tiled C kernel: one list of (group, row block, column block)
    tiles over all groups, shared by the threads (see ``set_num_threads``).
    Results do not depend on the number of threads.
    """
    return _ragged_dot(lhs, rhs, group_sizes, precision, preferred_element_type, group_offset, out, "ragged_dot")


def _ragged_dot(lhs, rhs, group_sizes, precision, preferred_element_type, group_offset, out, fn):
    """ragged_dot, its messages naming ``fn`` (ragged_dot_general of a
    PackedRhs comes here). Every check runs before anything is allocated or
    written: a refused call leaves the caller's ``out`` and a PackedRhs's
    layouts as they were (but for rows the kernels quantize, refused by the
    kernels before they write: a layout made for them stays cached)."""
    # an AsQArray lhs of one int8 scale a row: quantized by the kernels while they pack it, where they can
    lhs, rhs, lt, rt, quantize_lhs = _operand.operands(lhs, rhs, fn, " [m, k]", " [g, k, n]", packed=True,
                                                       in_kernel=True)
    packed = isinstance(rhs, PackedRhs)
    out_dtype = v.output_dtype(preferred_element_type, v.promote(lt, rt), fn)
    ct = gw.compute_dtype(lt, rt, out_dtype)
    algo = _precision.resolve(precision, lt, rt, ct, fn, packed=rhs if packed else None)
    m, k = lhs.shape
    if rhs.shape[1] != k:
        raise ValueError(
            f"{fn}: contracting dimensions differ: 'lhs' has k={k} (shape {lhs.shape}) "
            f"but 'rhs' has k={rhs.shape[1]} (shape {rhs.shape})"
        )
    gs, _ = v.group_sizes_array(group_sizes, fn, limit=m)
    start = v.local_group_start(group_offset, gs.shape[0], rhs.shape[0], fn)
    bounds = gw.group_bounds(gs, start, rhs.shape[0])

    n = rhs.shape[2]
    inputs = {"lhs": _operand.storage(lhs), "rhs": _operand.storage(rhs)}
    gw.check_out(out, None, (m, n), out_dtype, fn, inputs)
    if packed:   # the layout for this lhs (prepack's rule), checked, then made if it is new
        lhs, rhs = meet(rhs, lhs, ct, fn, "rhs", quantize_lhs, exact=(algo == "exact"))
    with v.memory_for(fn, "the result [m, n]"):
        res = gw.result_buffer(out, None, (m, n), out_dtype, ct, fn, inputs)
    with v.memory_for(fn, "the kernels' packed panels of lhs and rhs"):
        _operand.product_rows(lhs, rhs, bounds, res, algo, quantize_lhs, fn)
    res[:bounds[0]] = 0       # (rows of no local group; the kernels write none)
    res[bounds[-1]:] = 0
    with v.memory_for(fn, f"the result [m, n] in {out_dtype}"):
        return gw.deliver(res, out, out_dtype)


# ---------------------------------------------------------------------------
# Derivative rules
# ---------------------------------------------------------------------------
# out[rows_i] = lhs[rows_i] @ rhs[i - off] for the local groups, 0 elsewhere.
#   d_lhs = ragged_dot(ct, rhs^T, gs)   [m, k]        (rows of no local group: 0)
#   d_rhs = tgmm(lhs^T, ct, gs)         [g_local, k, n] (empty groups: 0)
#   t_out = ragged_dot(t_lhs, rhs, gs) + ragged_dot(lhs, t_rhs, gs)


def _ragged_dot_vjp(a, wanted):
    lhs, rhs, gs, out, cdt = _autodiff.primal(ragged_dot, a)
    off = a["group_offset"]

    def backward(ct):
        ct = ct.astype(cdt, copy=False)
        grads = {}
        if "lhs" in wanted:  # [m, n] x [g_local, n, k] -> [m, k]
            w = rhs.unpack() if isinstance(rhs, PackedRhs) else rhs    # (laid out for B, not B^T)
            grads["lhs"] = ragged_dot(ct, w.transpose(0, 2, 1), gs, precision=a["precision"],
                                      preferred_element_type=cdt, group_offset=off)
        if "rhs" in wanted:  # [k, m] x [m, n] -> [g_local, k, n]
            grads["rhs"] = tgmm(lhs.T, ct, gs, preferred_element_type=cdt, group_offset=off,
                                num_actual_groups=rhs.shape[0], precision=a["precision"])
        return grads

    return out, backward


def _ragged_dot_jvp(a, t):
    lhs, rhs, gs, out, cdt = _autodiff.primal(ragged_dot, a)
    kw = dict(precision=a["precision"], group_offset=a["group_offset"])
    terms = []
    if t.get("lhs") is not None:
        terms.append(ragged_dot(t["lhs"], rhs, gs, preferred_element_type=cdt, **kw))
    if t.get("rhs") is not None:
        terms.append(ragged_dot(lhs, t["rhs"], gs, preferred_element_type=cdt, **kw))
    return out, _autodiff.sum_terms(terms, out)


_autodiff.defvjp(ragged_dot, _ragged_dot_vjp, ("lhs", "rhs"))
_autodiff.defjvp(ragged_dot, _ragged_dot_jvp, ("lhs", "rhs"), packed_argnames=("rhs",))
