"""raggeddot.make_group_metadata against the NumPy reference and megablox.

Outputs must equal element for element (int32), with group_offsets of
length g+1 and group_ids / m_tile_ids of length tiles_m + g - 1.
"""

import itertools

import numpy as np
import pytest

import raggeddot
from raggeddot import reference

from helpers import dtype_id, random_group_sizes


def _check_equal(got, want, *, g, m, tm, label):
    (go, gi, mt), nt = got
    (wgo, wgi, wmt), wnt = want
    tiles_m = m // tm
    for name, a, b, length in (("group_offsets", go, wgo, g + 1),
                               ("group_ids", gi, wgi, tiles_m + g - 1),
                               ("m_tile_ids", mt, wmt, tiles_m + g - 1)):
        assert isinstance(a, np.ndarray), f"{label}: {name} is {type(a)}, not np.ndarray"
        assert a.dtype == np.int32, f"{label}: {name}.dtype = {a.dtype}"
        assert a.shape == (length,), f"{label}: {name}.shape = {a.shape}, want ({length},)"
        b = np.asarray(b)
        assert np.array_equal(a, b), (
            f"{label}: {name} differs\n  got  {a.tolist()}\n  want {b.tolist()}")
    assert int(nt) == int(wnt), f"{label}: num_tiles {int(nt)} != {int(wnt)}"
    assert np.asarray(nt).ndim == 0


def _patterns(rng, g, m):
    """(name, group_sizes) test patterns summing to at most m."""
    yield "random-full", random_group_sizes(rng, g, m)
    yield "random-below", random_group_sizes(rng, g, int(rng.integers(0, m + 1)))
    yield "all-zero", np.zeros(g, np.int32)
    one = np.zeros(g, np.int32)
    one[int(rng.integers(0, g))] = m
    yield "single-group", one
    sparse = random_group_sizes(rng, g, m)
    sparse[rng.random(g) < 0.5] = 0
    yield "half-zeroed", sparse
    if m >= g:  # every group non-empty, boundaries at arbitrary rows
        yield "all-nonempty", (random_group_sizes(rng, g, m - g) + 1).astype(np.int32)


def _shards(g):
    """(start_group, num_nonzero_groups) pairs, including the defaults."""
    pairs = [(0, None), (0, g)]
    if g <= 5:
        pairs += [(s, c) for s in range(g) for c in range(1, g - s + 1)]
    else:
        pairs += [(0, 1), (g - 1, 1), (g // 2, g - g // 2), (1, g // 3), (g // 4, g // 2)]
    return pairs


@pytest.mark.parametrize("visit_empty_groups", [True, False], ids=["visit", "skip"])
@pytest.mark.parametrize("g", [1, 2, 5, 16])
@pytest.mark.parametrize("tiles_m", [1, 3, 8])
@pytest.mark.parametrize("tm", [1, 2, 4, 8, 128])
def test_against_reference(rng, tm, tiles_m, g, visit_empty_groups):
    m = tm * tiles_m
    for name, gs in _patterns(rng, g, m):
        for start, count in _shards(g):
            kwargs = dict(group_sizes=gs, m=m, tm=tm, start_group=start,
                          visit_empty_groups=visit_empty_groups)
            if count is not None:
                kwargs["num_nonzero_groups"] = count
            label = (f"{name} gs={gs.tolist()} m={m} tm={tm} start_group={start} "
                     f"num_nonzero_groups={count} visit_empty_groups={visit_empty_groups}")
            got = raggeddot.make_group_metadata(**kwargs)
            want = reference.make_group_metadata(**kwargs)
            _check_equal(got, want, g=g, m=m, tm=tm, label=label)


def test_defaults(rng):
    gs = np.array([3, 0, 9, 2], np.int32)
    explicit = raggeddot.make_group_metadata(group_sizes=gs, m=16, tm=4, start_group=0,
                                             num_nonzero_groups=4, visit_empty_groups=True)
    default = raggeddot.make_group_metadata(group_sizes=gs, m=16, tm=4)
    _check_equal(default, explicit, g=4, m=16, tm=4, label="defaults")


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64],
                         ids=dtype_id)
def test_group_sizes_dtypes(rng, dtype):
    gs = random_group_sizes(rng, 6, 60)
    want = reference.make_group_metadata(group_sizes=gs.astype(np.int32), m=64, tm=8)
    got = raggeddot.make_group_metadata(group_sizes=gs.astype(dtype), m=64, tm=8)
    _check_equal(got, want, g=6, m=64, tm=8, label=np.dtype(dtype).name)


def test_invariants(rng):
    """Properties megablox documents, checked on the C output directly."""
    for _ in range(50):
        tm = int(rng.choice([1, 2, 4, 8]))
        tiles_m = int(rng.integers(1, 10))
        g = int(rng.integers(1, 9))
        m = tm * tiles_m
        gs = random_group_sizes(rng, g, m)
        (go, gi, mt), nt = raggeddot.make_group_metadata(group_sizes=gs, m=m, tm=tm,
                                                         visit_empty_groups=False)
        assert go[0] == 0 and np.array_equal(go[1:], np.cumsum(gs))
        assert tiles_m <= int(nt) <= tiles_m + g - 1
        # Every visited (group, tile) pair overlaps: the tile holds rows of that group.
        for i in range(int(nt)):
            grp, tile = gi[i], mt[i]
            lo, hi = go[grp], go[grp + 1]
            assert lo < hi and lo < (tile + 1) * tm and tile * tm < hi, (gs.tolist(), i)
        # Tile ids are non-decreasing (tiles are only revisited consecutively).
        assert np.all(np.diff(mt[:int(nt)]) >= 0)


@pytest.mark.parametrize("m,tm", [(10, 4), (7, 2), (128, 3), (5, 8)])
def test_m_not_multiple_of_tm(m, tm):
    with pytest.raises(ValueError):
        raggeddot.make_group_metadata(group_sizes=np.array([m], np.int32), m=m, tm=tm)


# ---------------------------------------------------------------------------
# megablox's own make_group_metadata
# ---------------------------------------------------------------------------

def test_against_megablox(jax, megablox, rng):
    jnp = jax.numpy
    megablox_metadata = megablox.make_group_metadata

    cases = 0
    # Eager JAX recompiles for every new (g, m, tm) (and visit flag), which costs
    # ~0.5 s each; once warm a call is a few ms. So: few configurations, many
    # group-size patterns and shards per configuration.
    for tm, tiles_m, g in [(1, 8, 3), (2, 4, 5), (4, 3, 8), (8, 2, 4), (128, 2, 3),
                           (1, 1, 1), (4, 5, 16)]:
        m = tm * tiles_m
        shards = _shards(g)[1:]  # megablox needs explicit start_group/num_nonzero_groups
        for visit in (True, False):
            for name, gs in _patterns(rng, g, m):
                for sidx in rng.choice(len(shards), size=min(4, len(shards)), replace=False):
                    start, count = shards[sidx]
                    label = (f"{name} gs={gs.tolist()} m={m} tm={tm} start_group={start} "
                             f"num_nonzero_groups={count} visit_empty_groups={visit}")
                    want = megablox_metadata(
                        group_sizes=jnp.asarray(gs, dtype=jnp.int32), m=m, tm=tm,
                        start_group=jnp.int32(start), num_nonzero_groups=count,
                        visit_empty_groups=visit)
                    got = raggeddot.make_group_metadata(
                        group_sizes=gs, m=m, tm=tm, start_group=start,
                        num_nonzero_groups=count, visit_empty_groups=visit)
                    _check_equal(got, want, g=g, m=m, tm=tm, label=label)
                    cases += 1
    assert cases > 100
