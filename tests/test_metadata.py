"""make_group_metadata: raggeddot's (C) against the NumPy oracle, both against
megablox's own, the invariants megablox documents, and the errors.

Outputs must equal element for element (int32), with group_offsets of
length g+1 and group_ids / m_tile_ids of length tiles_m + g - 1.

megablox counts tile visits with a float32 histogram, which misplaces counts
once m // tm passes about 4100 tiles (first seen at 4109); the comparisons
stay far below that, and raggeddot and the oracle count exactly.
"""

import numpy as np
import pytest

import raggeddot
from raggeddot import reference

from helpers import dtype_id, group_size_patterns, random_group_sizes


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


def _shards(g):
    """(start_group, num_nonzero_groups) pairs, the defaults first: every pair
    for g <= 5; else the groups cut into shards of 2 and of 3, and a few more."""
    pairs = [(0, None), (0, g)]
    if g <= 5:
        pairs += [(s, c) for s in range(g) for c in range(1, g - s + 1)]
    else:
        pairs += [(0, 1), (g - 1, 1), (g // 2, g - g // 2), (1, g // 3), (g // 4, g // 2)]
        pairs += [(s, min(size, g - s)) for size in (2, 3) for s in range(0, g, size)]
    return list(dict.fromkeys(pairs))


def _label(gs, m, tm, start, count, visit):
    return (f"gs={np.asarray(gs).tolist()} m={m} tm={tm} start_group={start} "
            f"num_nonzero_groups={count} visit_empty_groups={visit}")


# ---------------------------------------------------------------------------
# raggeddot against the oracle
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("visit_empty_groups", [True, False], ids=["visit", "skip"])
@pytest.mark.parametrize("g", [1, 2, 5, 16])
@pytest.mark.parametrize("tiles_m", [1, 3, 8])
@pytest.mark.parametrize("tm", [1, 2, 4, 8, 128])
def test_against_reference(rng, tm, tiles_m, g, visit_empty_groups):
    m = tm * tiles_m
    for name, gs in group_size_patterns(rng, g, m):
        for start, count in _shards(g):
            kwargs = dict(group_sizes=gs, m=m, tm=tm, start_group=start,
                          visit_empty_groups=visit_empty_groups)
            if count is not None:
                kwargs["num_nonzero_groups"] = count
            got = raggeddot.make_group_metadata(**kwargs)
            want = reference.make_group_metadata(**kwargs)
            _check_equal(got, want, g=g, m=m, tm=tm,
                         label=name + " " + _label(gs, m, tm, start, count, visit_empty_groups))


@pytest.mark.parametrize("make", [raggeddot.make_group_metadata, reference.make_group_metadata],
                         ids=["raggeddot", "reference"])
def test_defaults(make):
    gs = np.array([3, 0, 9, 2], np.int32)
    explicit = make(group_sizes=gs, m=16, tm=4, start_group=0, num_nonzero_groups=4,
                    visit_empty_groups=True)
    _check_equal(make(group_sizes=gs, m=16, tm=4), explicit, g=4, m=16, tm=4, label="defaults")
    # num_nonzero_groups defaults to the groups from start_group on
    explicit = make(group_sizes=gs, m=16, tm=4, start_group=1, num_nonzero_groups=3)
    _check_equal(make(group_sizes=gs, m=16, tm=4, start_group=1), explicit, g=4, m=16, tm=4,
                 label="start_group=1")


@pytest.mark.parametrize("make", [raggeddot.make_group_metadata, reference.make_group_metadata],
                         ids=["raggeddot", "reference"])
def test_padding_uses_the_last_input_value(make):
    """jnp.repeat pads with the last *input* value, even when its repeat count is 0."""
    (_, group_ids, m_tile_ids), num_tiles = make(
        group_sizes=np.array([8, 0, 0], np.int32), m=16, tm=8, visit_empty_groups=False)
    np.testing.assert_array_equal(group_ids, [0, 2, 2, 2])  # not [0, 0, 0, 0]
    np.testing.assert_array_equal(m_tile_ids, [0, 1, 1, 1])
    assert num_tiles == 1


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64], ids=dtype_id)
def test_group_sizes_dtypes(rng, dtype):
    gs = random_group_sizes(rng, 6, 60)
    want = reference.make_group_metadata(group_sizes=gs.astype(np.int32), m=64, tm=8)
    got = raggeddot.make_group_metadata(group_sizes=gs.astype(dtype), m=64, tm=8)
    _check_equal(got, want, g=6, m=64, tm=8, label=np.dtype(dtype).name)


def test_invariants(rng):
    """Properties megablox documents, checked on raggeddot's output directly."""
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


@pytest.mark.parametrize("make", [raggeddot.make_group_metadata, reference.make_group_metadata],
                         ids=["raggeddot", "reference"])
@pytest.mark.parametrize("m,tm,sizes", [(10, 4, [10]), (7, 2, [7]), (128, 3, [128]), (5, 8, [5]),
                                        (18, 4, [3, 0, 9]), (16, 4, [10, 9])],
                         ids=["10/4", "7/2", "128/3", "5/8", "18/4", "sum>m"])
def test_errors(make, m, tm, sizes):
    """tm must divide m; the sizes must not sum past m."""
    with pytest.raises(ValueError):
        make(group_sizes=np.array(sizes, np.int32), m=m, tm=tm)


# ---------------------------------------------------------------------------
# Against megablox's make_group_metadata
# ---------------------------------------------------------------------------

MEGABLOX_CONFIGS = [  # (g, m, tm, group sizes to try besides the random patterns)
    # Each configuration costs two compiles (visit_empty_groups is static).
    (4, 32, 8, [[8, 8, 16, 0],                      # every boundary on a tile edge
                [5, 11, 0, 16],                     # groups starting inside tiles, one empty
                [10, 22, 0, 0],                     # sum == m, trailing empty groups start at m
                [3, 0, 0, 0]]),                     # sum < m, trailing empty groups (padding uses g - 1)
    (8, 48, 48, [[2, 3, 4, 5, 6, 7, 8, 9],          # tm == m, many groups in the only tile
                 [1, 1, 1, 1, 1, 0, 0, 0],          # one tile shared by groups, sum < m
                 [0, 7, 0, 1, 0, 0, 2, 0]]),        # one tile, empty groups before/between/after
    (1, 64, 16, [[40]]),                            # a single group
    (3, 8, 1, []),                                  # tm = 1
    (16, 20, 4, []),                                # more groups than tiles
    (9, 64, 8, []),
    (3, 256, 128, []),                              # a large tile
]


@pytest.fixture(scope="module")
def megablox_metadata(jax, megablox):
    """megablox's make_group_metadata under jit, as gmm/tgmm run it.

    start_group and num_nonzero_groups are traced (megablox only does integer
    arithmetic on them), so one compile serves every group-size pattern and
    shard of a (g, m, tm, visit_empty_groups) configuration.
    """
    def metadata(group_sizes, start_group, num_nonzero_groups, *, m, tm, visit_empty_groups):
        return megablox.make_group_metadata(
            group_sizes=group_sizes, m=m, tm=tm, start_group=start_group,
            num_nonzero_groups=num_nonzero_groups, visit_empty_groups=visit_empty_groups)
    jitted = jax.jit(metadata, static_argnames=("m", "tm", "visit_empty_groups"))
    jnp = jax.numpy

    def call(group_sizes, m, tm, start_group, num_nonzero_groups, visit_empty_groups):
        return jitted(jnp.asarray(group_sizes, jnp.int32), jnp.asarray(start_group, jnp.int32),
                      jnp.asarray(num_nonzero_groups, jnp.int32), m=m, tm=tm,
                      visit_empty_groups=visit_empty_groups)
    return call


@pytest.mark.parametrize("g,m,tm,edge_sizes", MEGABLOX_CONFIGS,
                         ids=[f"g{c[0]}-m{c[1]}-tm{c[2]}" for c in MEGABLOX_CONFIGS])
def test_against_megablox(megablox_metadata, x64, rng, g, m, tm, edge_sizes):
    """raggeddot and the oracle both equal megablox, element for element: the
    edge sizes in every shard, every random pattern in six shards (megablox
    needs explicit start_group and num_nonzero_groups)."""
    patterns = list(group_size_patterns(rng, g, m))
    patterns += [("edge", np.array(s, np.int32)) for s in edge_sizes]
    shards = _shards(g)[1:]
    cases = 0
    with x64(False):
        for visit in (True, False):
            for name, gs in patterns:
                chosen = (range(len(shards)) if name == "edge"
                          else rng.choice(len(shards), size=min(6, len(shards)), replace=False))
                for i in chosen:
                    start, count = shards[i]
                    label = name + " " + _label(gs, m, tm, start, count, visit)
                    want = megablox_metadata(gs, m, tm, start, count, visit)
                    kwargs = dict(group_sizes=gs, m=m, tm=tm, start_group=start,
                                  num_nonzero_groups=count, visit_empty_groups=visit)
                    oracle = reference.make_group_metadata(**kwargs)
                    assert isinstance(oracle[1], int), label
                    _check_equal(oracle, want, g=g, m=m, tm=tm, label="reference: " + label)
                    _check_equal(raggeddot.make_group_metadata(**kwargs), want, g=g, m=m, tm=tm,
                                 label="raggeddot: " + label)
                    cases += 1
    assert cases >= 2 * len(patterns)
