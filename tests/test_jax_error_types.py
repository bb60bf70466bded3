"""Bad group_sizes under jax.jit: the two exception types jax raises (its
error on a first call, ValueError from its fast path once the function has
run) both name the sizes, and the README names both (item 7)."""
import pathlib

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_both_types_name_the_sizes_and_are_documented(jax):
    rj = pytest.importorskip("raggeddot.jax")
    jnp = jax.numpy
    lhs, rhs = jnp.ones((6, 3)), jnp.ones((2, 3, 4))
    bad = jnp.array([-1, 3])
    documented = (jax.errors.JaxRuntimeError, ValueError)
    seen = set()
    first = jax.jit(rj.ragged_dot)           # fails on its first call
    with pytest.raises(documented, match=r"group_sizes\[0, 0\]=-1 is negative") as info:
        first(lhs, rhs, bad)
    seen.add(info.type)
    ran = jax.jit(rj.ragged_dot)             # has run: jax's fast path
    assert np.asarray(ran(lhs, rhs, jnp.array([2, 3]))).shape == (6, 4)
    for _ in range(2):
        with pytest.raises(documented, match=r"group_sizes\[0, 0\]=-1 is negative") as info:
            ran(lhs, rhs, bad)
        seen.add(info.type)
    text = " ".join(README.read_text().split())
    assert "`jax.errors.JaxRuntimeError` (a `RuntimeError`)" in text
    assert "a plain `ValueError` once it has run" in text
    assert "catch `(jax.errors.JaxRuntimeError, ValueError)`" in text
    assert seen <= set(documented)
