"""The conformance tests' oracle is jax on the CPU in full float32 precision
(item 10): on a machine where jax finds a GPU it would otherwise run
jax.lax.ragged_dot there, in TF32, and the comparisons would fail."""
import os

import numpy as np


def test_jax_runs_on_the_cpu_in_full_precision(jax):
    assert os.environ["JAX_PLATFORMS"] == "cpu"
    assert jax.default_backend() == "cpu"
    assert {d.platform for d in jax.devices()} == {"cpu"}
    assert str(jax.config.jax_default_matmul_precision).lower() == "highest"
    # a float32 product as the oracle computes it: float32-exact, not TF32-rounded
    a = np.full((1, 3), 1 + 2.0 ** -20, np.float32)
    b = np.ones((3, 1), np.float32)
    assert float(jax.numpy.dot(a, b)[0, 0]) == np.float32(3 * (1 + 2.0 ** -20))
