"""Helpers shared by the oracle's modules: JAX's dtype rules, group sizes
and group ranges.  NumPy only."""

import numpy as np



# (maxexp, nmant, bits) of float dtypes that NumPy knows only through extensions.
_EXTENSION_FLOATS = {"bfloat16": (128, 7, 16)}


def _dtype_rank(dtype):
    """JAX's ordering key for dot result types (lax._dot_general_dtype_rule).

    The input whose key is larger decides the result dtype: complex beats real,
    then the wider exponent range, then the wider mantissa, then the bit width,
    then signed beats unsigned.
    """
    dtype = np.dtype(dtype)
    if dtype.name in _EXTENSION_FLOATS:  # e.g. ml_dtypes' bfloat16, unknown to np.finfo
        return (False,) + _EXTENSION_FLOATS[dtype.name] + (True,)
    is_complex = np.issubdtype(dtype, np.complexfloating)
    real = np.empty(0, dtype).real.dtype if is_complex else dtype
    if np.issubdtype(real, np.floating):
        info = np.finfo(real)
        maxexp, nmant, bits = info.maxexp, info.nmant, info.bits
    elif np.issubdtype(real, np.integer):
        maxexp, nmant, bits = -1, -1, np.iinfo(real).bits
    elif real == np.bool_:
        maxexp, nmant, bits = -1, -1, 1
    else:
        raise TypeError(f"Unsupported input dtype {dtype}.")
    signed = not np.issubdtype(real, np.unsignedinteger)
    return (is_complex, maxexp, nmant, bits, signed)


def _result_dtype(lhs, rhs, preferred_element_type):
    """Output dtype of a dot: ``preferred_element_type`` if given, else JAX's rule.

    For float32/float64 inputs JAX's rule is ``np.result_type(lhs, rhs)``.  For
    other mixes it differs from NumPy (int32 x float32 -> float32, int32 x
    uint32 -> int32, float16 x bfloat16 -> bfloat16, the wider exponent
    range) and two different dtypes of equal rank are a TypeError.
    """
    if preferred_element_type is not None:
        return np.dtype(preferred_element_type)
    lhs_key, rhs_key = _dtype_rank(lhs.dtype), _dtype_rank(rhs.dtype)
    if lhs_key > rhs_key:
        return lhs.dtype
    if rhs_key > lhs_key:
        return rhs.dtype
    if lhs.dtype != rhs.dtype:
        raise TypeError(f"Incompatible input dtypes {lhs.dtype} and {rhs.dtype}.")
    return lhs.dtype


def _accumulator_dtype(out_dtype):
    """The dtype the oracle accumulates in: the widest type of out_dtype's kind."""
    out_dtype = np.dtype(out_dtype)
    if np.issubdtype(out_dtype, np.complexfloating):
        return np.dtype(np.complex128)
    if np.issubdtype(out_dtype, np.integer) or out_dtype == np.bool_:
        return np.dtype(np.int64)
    return np.dtype(np.float64)


def _group_sizes_array(group_sizes):
    """group_sizes as an int64 array; any integer dtype is accepted."""
    gs = np.asarray(group_sizes)
    if not np.issubdtype(gs.dtype, np.integer):
        raise TypeError(f"'group_sizes' must have an integer dtype, got {gs.dtype}.")
    return gs.astype(np.int64)


def _check_group_sizes(gs, size, what):
    """ValueError unless every size is >= 0 and every row of gs sums to <= size.

    gs may have leading (prefix) dimensions; the groups run along its last axis.
    """
    if np.any(gs < 0):
        raise ValueError(f"'group_sizes' must be non-negative, got {gs.tolist()}.")
    totals = gs.sum(axis=-1)
    if np.any(totals > size):
        raise ValueError(
            f"sum('group_sizes') = {int(np.max(totals))} exceeds {what} = {size}."
        )


def _group_bounds(gs):
    """(starts, ends) of each group along the last axis of gs: ends = cumsum(gs)."""
    ends = np.cumsum(gs, axis=-1)
    return ends - gs, ends


def _first_group(group_offset, num_groups, num_local_groups):
    """Index of the first group held by rhs (megablox's group_offset); validated."""
    if group_offset is None:
        first = 0
    else:
        offset = np.asarray(group_offset)
        if offset.size != 1 or not np.issubdtype(offset.dtype, np.integer):
            raise ValueError(
                f"'group_offset' must be an integer scalar, got {group_offset!r}."
            )
        first = int(offset.reshape(()))
    if first < 0 or first + num_local_groups > num_groups:
        raise ValueError(
            f"groups [{first}, {first + num_local_groups}) held by 'rhs' are not "
            f"within the {num_groups} groups of 'group_sizes'."
        )
    return first


def _check_ndim(x, ndim, name):
    if x.ndim != ndim:
        raise ValueError(f"Expected {ndim}-tensor for '{name}' but got {x.ndim}-tensor.")
