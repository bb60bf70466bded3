"""A whole Mixture-of-Experts layer (MaxText's sparse path), forward and
backward, as named steps on the gateway's kernels:

- ``route``: router logits, scores, top-k choice and weights;
- ``dispatch``: counting sort of the assignments by expert, gather of the
  token rows into that order;
- ``experts``: three grouped matmuls, biases and the gated activation over
  the sorted rows, for the experts a process holds;
- ``combine``: the router-weighted gather-reduce back to the tokens;
- ``shared``: the shared experts, a dense gated MLP;
- ``block``: ``moe_block`` and ``moe_block_vjp`` composing them;
- ``gather``: the public ``ragged_gather`` and ``ragged_gather_reduce``;
- ``config``: moe_block's argument checks.

Each step's backward sits beside its forward and reads an explicit
residuals object. All of it runs in C (routing, sort, gathers, activations,
the grouped matmuls) with no Python loop over tokens or experts.
"""
from .block import moe_block, moe_block_vjp
from .gather import ragged_gather, ragged_gather_reduce

__all__ = ["moe_block", "moe_block_vjp", "ragged_gather", "ragged_gather_reduce"]
