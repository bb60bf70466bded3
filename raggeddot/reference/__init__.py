"""Pure-NumPy reference implementations (the oracle) of raggeddot's operations.

This module states the semantics of ``jax.lax.ragged_dot``,
``jax.lax.ragged_dot_general`` and megablox's ``make_group_metadata``, ``gmm``
and ``tgmm`` (``jax.experimental.pallas.ops.tpu.megablox.gmm``) as plainly as
possible.  It imports nothing but NumPy, so it stays independent of the
C kernel it is used to check.  Speed is not a goal: products are accumulated in
float64 (int64 for integer inputs, complex128 for complex ones) and cast to the
output dtype once, at the end.

Conventions used throughout:

* ``group_sizes`` ``gs`` of length ``g`` splits a ragged dimension of size ``m``
  into consecutive row ranges: group ``i`` owns ``[start_i, start_i + gs[i])``
  with ``start_i = sum(gs[:i])``.  Sizes must be ``>= 0`` and ``sum(gs) <= m``
  (``ValueError`` otherwise).  Positions at or past ``sum(gs)`` belong to no
  group.
* Output rows that no computed group owns are exactly zero, unless a function
  documents otherwise (``existing_out``).
* A quantized operand (an object with ``qvalue``, ``scale`` and
  ``zero_point``, e.g. ``raggeddot.QArray``) stands for its dequantized value
  (``reference.dequantize``, float64); the output dtype is the one its
  scales' dtype would give.
* ``precision`` and ``tiling`` are accepted for signature compatibility and
  ignored: the oracle always computes in (at least) float64.
"""


from .megablox import gmm, make_group_metadata, tgmm
from .quant import dequantize
from .moe import moe_block, ragged_gather, ragged_gather_reduce
from .ragged import ragged_dot, ragged_dot_general

__all__ = [
    "ragged_dot",
    "ragged_dot_general",
    "make_group_metadata",
    "gmm",
    "tgmm",
    "moe_block",
    "ragged_gather",
    "ragged_gather_reduce",
    "dequantize",
]
