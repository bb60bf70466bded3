"""raggeddot from torch programs and Hugging Face transformers.

Importing this module (it imports torch; ``import raggeddot`` alone does
not) defines operators in the ``raggeddot`` namespace of ``torch.ops``, each
a ``torch.library.custom_op`` with a fake implementation (``torch.compile``
with ``fullgraph=True``, ``torch.export``) and an autograd rule whose
gradients are raggeddot's grouped products again:

- ``ragged_dot(lhs [m, k], rhs [g, k, n], group_sizes [g]) -> [m, n]``
- ``gmm(lhs [m, k], rhs [g, k, n] or [g, n, k], group_sizes, ...) -> [m, n]``
- ``tgmm(lhs [k, m], rhs [m, n], group_sizes) -> [g, k, n]``
- ``ragged_dot_general(lhs, rhs, group_sizes, <dimension numbers>)``
- ``ragged_gather(x [T, d], indices [N], weights [N]) -> [N, d]``
- ``ragged_gather_reduce(y [N, d], indices [T, k], weights [T, k]) -> [T, d]``
- ``gated_activation(h [N, 2f], activation, layout) -> [N, f]``

They take CPU tensors of float16, bfloat16, float32 or float64 (any
strides) and read and write their memory in place: no copies in or out
(bfloat16 through a 16-bit view), the GIL released while the C kernels run.
CUDA tensors, and meta tensors outside a fake trace, are refused with an
error naming the argument.

It also registers the "raggeddot" experts implementation with transformers
(when transformers is installed), so that::

    import raggeddot.torch
    model = AutoModelForCausalLM.from_pretrained(name, experts_implementation="raggeddot")

runs the experts of every MoE layer through these operators (forward and
backward; inference reads prepacked copies of the expert weights, see
:func:`set_weight_cache`). :func:`register_transformers` registers it
explicitly.
"""
from ._matmul import gmm, ragged_dot, ragged_dot_general, ragged_dot_general_backward, tgmm
from ._moe_ops import (ACTIVATIONS, LAYOUTS, gated_activation, gated_activation_backward, ragged_gather,
                       ragged_gather_backward, ragged_gather_reduce, ragged_gather_reduce_backward)
from ._experts import (EXPERTS_IMPLEMENTATION, clear_weight_cache, experts_forward, register_transformers,
                       set_weight_cache)
from ._mxfp4 import (hold_mxfp4, load_mxfp4_checkpoint, load_mxfp4_experts, quantize_experts_mxfp4,
                     set_activation_qtype)

__all__ = [
    "ragged_dot",
    "gmm",
    "tgmm",
    "ragged_dot_general",
    "ragged_dot_general_dn",
    "ragged_gather",
    "ragged_gather_reduce",
    "gated_activation",
    "experts_forward",
    "register_transformers",
    "set_weight_cache",
    "clear_weight_cache",
    "hold_mxfp4",
    "quantize_experts_mxfp4",
    "load_mxfp4_experts",
    "load_mxfp4_checkpoint",
    "set_activation_qtype",
    "EXPERTS_IMPLEMENTATION",
    "ACTIVATIONS",
    "LAYOUTS",
    # the backward operators (called by the autograd rules)
    "ragged_dot_general_backward",
    "ragged_gather_backward",
    "ragged_gather_reduce_backward",
    "gated_activation_backward",
]


def ragged_dot_general_dn(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type=None,
                          group_offset=None):
    """:func:`ragged_dot_general` with a ``RaggedDotDimensionNumbers``
    (raggeddot's or jax's) instead of the dimension lists."""
    dn = ragged_dot_dimension_numbers
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers
    (lr,) = dn.lhs_ragged_dimensions
    return ragged_dot_general(lhs, rhs, group_sizes, list(lc), list(rc), list(lb), list(rb), int(lr),
                              list(dn.rhs_group_dimensions), preferred_element_type, group_offset)


register_transformers(missing_ok=True)
