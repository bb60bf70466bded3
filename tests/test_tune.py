"""raggeddot.tiling.efficiency (megablox's tile-revisit model)."""
import math

import numpy as np
import pytest

import raggeddot
from raggeddot.tiling import efficiency

# ---------------------------------------------------------------------------
# efficiency
# ---------------------------------------------------------------------------


def _visits_brute(group_sizes, tm):
    """Row tiles visited, counted row by row: the distinct tiles of each non-empty group."""
    visits, start = 0, 0
    for size in group_sizes:
        visits += len({row // tm for row in range(start, start + size)})
        start += size
    return visits


@pytest.mark.parametrize("tm", [1, 2, 3, 8, 16])
def test_efficiency_against_brute_force(rng, tm):
    for _ in range(20):
        g = int(rng.integers(1, 9))
        sizes = rng.integers(0, 20, size=g) * (rng.random(g) > 0.3)
        eff = efficiency(sizes, tm)
        m, groups = int(sizes.sum()), int((sizes > 0).sum())
        if m == 0:
            assert eff == (1.0, 1.0, 0, 0, 0)
            continue
        tiles = math.ceil(m / tm)
        assert (eff.tiles, eff.groups, eff.visits) == (tiles, groups, _visits_brute(sizes, tm))
        assert eff.exact == pytest.approx(tiles / eff.visits)
        assert eff.model == pytest.approx(tiles / (tiles + groups * (1 - 1 / tm)))
        assert 0 < eff.exact <= 1 and 0 < eff.model <= 1


@pytest.mark.parametrize("tm", [4, 8, 32])
def test_efficiency_exact_is_make_group_metadata_tiles(rng, tm):
    """When tm divides m, exact = tiles_m / num_tiles of megablox's metadata (empty groups
    not visited)."""
    for _ in range(10):
        g = int(rng.integers(1, 12))
        m = tm * int(rng.integers(1, 8))
        sizes = rng.multinomial(m, np.full(g, 1 / g)).astype(np.int32)
        _, num_tiles = raggeddot.make_group_metadata(group_sizes=sizes, m=m, tm=tm, visit_empty_groups=False)
        assert efficiency(sizes, tm).exact == pytest.approx((m // tm) / int(num_tiles))


def test_efficiency_single_group_and_aligned_groups():
    assert efficiency([64], 16).exact == 1.0
    eff = efficiency([16, 0, 32, 16], 16)          # every boundary on a tile edge: no revisits
    assert (eff.exact, eff.visits, eff.groups) == (1.0, 4, 3)
    assert eff.model < 1.0                          # the model counts 1 - 1/tm of a revisit per group
    assert efficiency(np.array([], dtype=np.int32), 4) == (1.0, 1.0, 0, 0, 0)
    assert efficiency([], 4).tiles == 0


@pytest.mark.parametrize("sizes, tm, kind, match", [
    ([3, -1], 4, ValueError, r"efficiency: 'group_sizes' has a negative entry: group_sizes\[1\]=-1"),
    ([[1, 2]], 4, ValueError, r"efficiency: expected 1-D 'group_sizes'"),
    ([1.5, 2], 4, TypeError, r"efficiency: 'group_sizes' must have an integer dtype, got float64"),
    (None, 4, TypeError, r"efficiency: 'group_sizes' must be an array, got None"),
    ([1, 2], 0, ValueError, r"efficiency: 'tm' must be a positive integer, got 0"),
    ([1, 2], 2.0, TypeError, r"efficiency: 'tm' must be an integer, got float 2.0"),
    ([1, 2], True, TypeError, r"efficiency: 'tm' must be an integer, got True"),
])
def test_efficiency_errors_name_the_argument(sizes, tm, kind, match):
    with pytest.raises(kind, match=match):
        efficiency(sizes, tm)
