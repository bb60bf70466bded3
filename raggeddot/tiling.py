"""How much of a tiled grouped matmul's work is useful: megablox's tile-revisit model.

A kernel that tiles the rows of ``lhs [m, k]`` by ``tm`` and gives every tile one group's
weights must visit a tile that holds the end of one group and the start of the next once
per group in it. Those extra visits compute rows that are thrown away; the fraction of
visits that are not extra is the *efficiency* of the tiling. Small tiles waste less at
group boundaries but run the matmul less efficiently, so the best tile shrinks with the
groups.

    >>> from raggeddot.tiling import efficiency
    >>> efficiency([100, 28, 0, 128], tm=64)
    Efficiency(model=0.575..., exact=0.8, tiles=4, visits=5, groups=3)
"""
from typing import NamedTuple

import numpy as np

from . import _validate as v

__all__ = ["efficiency", "Efficiency"]


class Efficiency(NamedTuple):
    """The result of :func:`efficiency`: two efficiencies in (0, 1] and the counts they
    come from."""

    model: float     #: N / (N + G (1 - 1/tm)): G boundaries, each inside a tile with probability 1 - 1/tm
    exact: float     #: N / visits, the row tiles these group sizes make a kernel visit
    tiles: int       #: N = ceil(m / tm), m = sum(group_sizes): the tiles of a dense product
    visits: int      #: row tiles visited when empty groups are skipped (make_group_metadata's num_tiles)
    groups: int      #: G, the non-empty groups


def efficiency(group_sizes, tm):
    """The tile-revisit efficiency of row tiles of ``tm`` over groups of ``group_sizes``.

    Args:
      group_sizes: ``[g]`` non-negative integers; group ``i`` owns rows
        ``[start_i, end_i)`` with ``end_i = group_sizes[0] + ... + group_sizes[i]`` and
        ``start_i = end_i - group_sizes[i]``.
      tm: the row tile, a positive integer.

    With ``m = sum(group_sizes)``, ``N = ceil(m / tm)`` (the tiles one dense product of
    ``m`` rows visits) and ``G`` the number of non-empty groups:

    - ``model = N / (N + G (1 - 1/tm))``: megablox's estimate, in which each group boundary
      falls inside a tile (not on its edge) with probability ``1 - 1/tm``, and each such
      tile is visited once more.
    - ``exact = N / visits`` with ``visits`` the sum over non-empty groups of
      ``ceil(end_i / tm) - floor(start_i / tm)``, the tiles that group's rows touch: the
      count a kernel skipping empty groups visits, megablox's ``num_tiles`` of
      ``make_group_metadata(..., visit_empty_groups=False)``.

    Both are 1.0 when ``m = 0`` (no tiles, none wasted).

    Returns:
      ``Efficiency(model, exact, tiles, visits, groups)``.

    Raises:
      TypeError for non-integer ``group_sizes`` or ``tm``; ValueError for ``group_sizes``
      not 1-D or with a negative entry, and for ``tm < 1``.
    """
    fn = "efficiency"
    arr = v.as_array(group_sizes, "group_sizes", fn)
    if arr.size == 0 and arr.dtype.kind == "f":   # np.asarray([]) is float64
        arr = arr.astype(np.int64)
    gs, m = v.group_sizes_array(arr, fn)
    tm = v.index(tm, "tm", fn)
    if tm < 1:
        raise ValueError(f"{fn}: 'tm' must be a positive integer, got {tm}")
    ends = np.cumsum(gs, dtype=np.int64)
    starts = ends - gs
    full = gs > 0
    groups = int(full.sum())
    visits = int((-(-ends[full] // tm) - starts[full] // tm).sum())
    tiles = -(-m // tm)
    if m == 0:
        return Efficiency(1.0, 1.0, 0, 0, 0)
    model = tiles / (tiles + groups * (1.0 - 1.0 / tm))
    return Efficiency(model, tiles / visits, tiles, visits, groups)
