"""Where an expert-parallel MoE layer's rows go: the capacity shares and the
two ragged all-to-alls, computed from the per-expert counts of every rank.

P ranks, E experts, rank q holding experts ``[q*El, (q+1)*El)``, El = E/P.
Every rank knows ``counts [P, E]``, the assignments of rank p's tokens to
expert e (one Allgather), so every rank computes the same plan and no
further sizes or offsets need to be exchanged.

Capacity. Single-process moe_block keeps, for each expert, the first
``C = ceil(T * top_k / E * capacity_factor)`` assignments in token order.
Spread over ranks, the tokens are taken in rank order (rank 0's, then
rank 1's, ...), T is the total over ranks, and rank p keeps::

    kept[p, e] = clip(C - sum_{p' < p} counts[p', e], 0, counts[p, e])

so expert e keeps exactly the assignments single-process moe_block keeps
on the concatenated tokens, and receives at most C rows in all.

Layouts. Rank p's dispatched rows ``xs_p`` are sorted by expert (group e
starts at ``start[p, e] = sum_{e' < e} kept[p, e']``). The rank holding
expert e receives its rows expert by expert and, within an expert, rank
by rank::

    block[e]     = sum of total[e'] over the held experts e' before e
    here[p, e]   = block[e] + sum_{p' < p} kept[p', e]     (rank p's rows of e)
    total[e]     = sum_p kept[p, e]

which is the single-process order of expert e's rows (global token order),
so the experts step sees the very groups single-process moe_block sees.

In jax's ragged_all_to_all terms (N = E entries, entry i for rank i // El),
rank r's forward exchange (tokens to experts) is::

    input_offsets[e]  = start[r, e]       send_sizes[e] = kept[r, e]
    output_offsets[e] = here[r, e]
    recv_sizes[p*El + l] = kept[p, r*El + l]

and the reverse exchange (expert outputs back to the tokens) swaps the
send and receive sides.
"""
from typing import NamedTuple

import numpy as np

from .alltoall import move_rows

__all__ = ["Moves", "ExpertExchange", "kept_counts", "plan", "move"]


class Moves(NamedTuple):
    """One exchange of rows (see :func:`~.alltoall.move_rows`): index arrays
    ``[N]`` (int64), entries ``[q*m, (q+1)*m)`` for peer q, and the rows the
    result has."""
    send_offsets: np.ndarray
    send_sizes: np.ndarray
    recv_offsets: np.ndarray
    recv_sizes: np.ndarray
    out_rows: int

    def reverse(self, out_rows):
        """The same blocks moving back; ``out_rows`` rows in the result."""
        return Moves(self.recv_offsets, self.recv_sizes, self.send_offsets, self.send_sizes, out_rows)

    def bytes_to_peers(self, rank, num_ranks, row_bytes):
        """Bytes this rank sends to the other ranks (its rows to itself
        excluded), for rows of ``row_bytes`` bytes."""
        m = self.send_sizes.shape[0] // num_ranks
        own = int(self.send_sizes[rank * m:(rank + 1) * m].sum())
        return (int(self.send_sizes.sum()) - own) * row_bytes


class ExpertExchange(NamedTuple):
    """The plan of one expert-parallel layer call on one rank.

    Attributes:
      kept: ``[P, E]`` assignments of rank p's tokens kept for expert e.
      to_experts: the token rows to the expert ranks.
      to_tokens: the expert outputs back (``to_experts`` reversed).
      sizes_here: ``[E]`` rows of each held expert received here, 0 for
        the experts held elsewhere (the experts step's group_sizes).
      first_expert: the first expert held here, r * E/P (its group_offset).
    """
    kept: np.ndarray
    to_experts: Moves
    to_tokens: Moves
    sizes_here: np.ndarray
    first_expert: int


def kept_counts(counts, capacity):
    """``kept [P, E]`` from ``counts [P, E]`` and the capacity C per expert
    over all ranks' tokens (-1: no capacity): see the module docstring."""
    if capacity < 0:
        return counts.copy()
    before = np.cumsum(counts, axis=0) - counts
    return np.clip(capacity - before, 0, counts)


def plan(kept, rank):
    """The :class:`ExpertExchange` of rank ``rank`` for ``kept [P, E]``."""
    P, E = kept.shape
    El = E // P
    held = slice(rank * El, (rank + 1) * El)
    start = np.cumsum(kept, axis=1) - kept                        # [P, E] group starts in xs_p
    total = kept.sum(axis=0)                                      # [E]
    per_owner = total.reshape(P, El)
    block = (np.cumsum(per_owner, axis=1) - per_owner).reshape(E)  # [E] within the owner's buffer
    here = block + (np.cumsum(kept, axis=0) - kept)               # [P, E]
    to_experts = Moves(
        send_offsets=np.ascontiguousarray(start[rank]),
        send_sizes=np.ascontiguousarray(kept[rank]),
        recv_offsets=np.ascontiguousarray(here[:, held].reshape(-1)),
        recv_sizes=np.ascontiguousarray(kept[:, held].reshape(-1)),
        out_rows=int(total[held].sum()))
    sizes_here = np.zeros(E, dtype=np.int64)
    sizes_here[held] = total[held]
    return ExpertExchange(kept, to_experts, to_experts.reverse(int(kept[rank].sum())), sizes_here,
                          rank * El)


def move(comm, rows, moves):
    """``rows [n, d]`` (C-contiguous) exchanged by ``moves``: a new
    ``[moves.out_rows, d]`` array of the same dtype, every row of it
    written by some rank."""
    out = np.empty((moves.out_rows,) + rows.shape[1:], dtype=rows.dtype)
    rows = np.ascontiguousarray(rows)
    if rows.dtype.itemsize == 2:   # bfloat16 / float16 moved as their bits (no MPI type for ml_dtypes')
        move_rows(comm, rows.view(np.uint16), out.view(np.uint16), moves.send_offsets, moves.send_sizes,
                  moves.recv_offsets, moves.recv_sizes)
        return out
    return move_rows(comm, rows, out, moves.send_offsets, moves.send_sizes,
                     moves.recv_offsets, moves.recv_sizes)
