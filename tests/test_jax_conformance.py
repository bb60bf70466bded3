"""raggeddot.ragged_dot against jax.lax.ragged_dot itself (CPU).

float64 runs inside the ``x64`` fixture's context, so the global x64 flag is
never flipped for other test modules.

NaN/inf inputs are deliberately not compared here: JAX's CPU lowering
multiplies dense masks, so a NaN in the rhs of one group leaks into every
row, while raggeddot (per the spec) confines it to the group's rows.
"""

import numpy as np
import pytest

import raggeddot

from helpers import FLOATS, check_close, dtype_id, looser_dtype, random_group_sizes, randn

SHAPES = [  # m, k, n, g
    (1, 1, 1, 1), (7, 3, 5, 3), (16, 16, 16, 4), (33, 65, 17, 5), (128, 64, 96, 8),
    (300, 128, 7, 3), (100, 257, 33, 16), (64, 1, 130, 2), (5, 40, 1, 7), (200, 30, 50, 64),
]


def _jax_ragged_dot(jax, lhs, rhs, gs, **kwargs):
    jnp = jax.numpy
    return np.asarray(jax.lax.ragged_dot(jnp.asarray(lhs), jnp.asarray(rhs),
                                         jnp.asarray(gs, dtype=jnp.int32), **kwargs))


def _cases(rng, m, k, n, g, dtype):
    lhs = randn(rng, (m, k), dtype)
    rhs = randn(rng, (g, k, n), dtype)
    yield "full", lhs, rhs, random_group_sizes(rng, g, m)
    yield "below", lhs, rhs, random_group_sizes(rng, g, int(rng.integers(0, m)))
    gs = random_group_sizes(rng, g, m)
    gs[rng.random(g) < 0.4] = 0  # empty groups, sum usually below m
    yield "holes", lhs, rhs, gs


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("m,k,n,g", SHAPES)
def test_matches_jax(jax, x64, rng, m, k, n, g, dtype):
    with x64(dtype == np.float64):
        for name, lhs, rhs, gs in _cases(rng, m, k, n, g, dtype):
            want = _jax_ragged_dot(jax, lhs, rhs, gs)
            assert want.dtype == dtype  # x64 really is on for float64
            got = raggeddot.ragged_dot(lhs, rhs, gs)
            label = f"{name} m={m} k={k} n={n} gs={gs.tolist()}"
            assert got.dtype == want.dtype, label
            check_close(got, want, dtype, err_msg=label)
            total = int(gs.sum())
            assert np.all(got[total:] == 0) and np.all(want[total:] == 0), label


@pytest.mark.parametrize("lhs_dtype,rhs_dtype,pet", [
    (np.float32, np.float32, np.float32),
    (np.float32, np.float32, np.float64),
    (np.float64, np.float64, np.float32),
    (np.float64, np.float64, np.float64),
    (np.float32, np.float64, None),
    (np.float64, np.float32, None),
    (np.float32, np.float64, np.float32),
], ids=dtype_id)
def test_preferred_element_type_and_mixed(jax, x64, rng, lhs_dtype, rhs_dtype, pet):
    m, k, n, g = 90, 70, 40, 6
    lhs = randn(rng, (m, k), lhs_dtype)
    rhs = randn(rng, (g, k, n), rhs_dtype)
    gs = random_group_sizes(rng, g, 80)
    gs[2] = 0
    with x64(True):
        kwargs = {} if pet is None else {"preferred_element_type": pet}
        want = _jax_ragged_dot(jax, lhs, rhs, gs, **kwargs)
        got = raggeddot.ragged_dot(lhs, rhs, gs, **kwargs)
    assert got.dtype == want.dtype
    tol = looser_dtype(got.dtype, np.result_type(lhs_dtype, rhs_dtype))
    check_close(got, want, tol)
    assert np.all(got[80:] == 0)


def test_float32_preferred_element_type_without_x64(jax, rng):
    m, k, n, g = 50, 20, 30, 4
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (g, k, n), np.float32)
    gs = np.array([10, 0, 25, 10], np.int32)
    want = _jax_ragged_dot(jax, lhs, rhs, gs, preferred_element_type=jax.numpy.float32)
    got = raggeddot.ragged_dot(lhs, rhs, gs, preferred_element_type=np.float32)
    assert got.dtype == want.dtype == np.float32
    check_close(got, want, np.float32)


@pytest.mark.parametrize("precision", ["DEFAULT", "HIGH", "HIGHEST"])
def test_precision_enum(jax, rng, precision):
    m, k, n, g = 40, 24, 16, 3
    lhs = randn(rng, (m, k), np.float32)
    rhs = randn(rng, (g, k, n), np.float32)
    gs = np.array([15, 0, 20], np.int32)
    p = getattr(jax.lax.Precision, precision)
    got = raggeddot.ragged_dot(lhs, rhs, gs, precision=p)
    # On the CPU, JAX computes float32 dots in float32 at every precision.
    want = _jax_ragged_dot(jax, lhs, rhs, gs, precision=jax.lax.Precision.HIGHEST)
    check_close(got, want, np.float32)

