"""The README's Python examples run as written."""
import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 3
    namespace = {}
    for block in blocks:          # later examples may use names from earlier ones
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["y"].shape == (512, 256)
    # the MoE example runs in float32 as written (NumPy 2 promotes a float32
    # array divided by a NumPy float64 scalar such as np.sqrt(d) to float64)
    for name in ("x", "router", "w0", "w1", "wo", "y", "gate_up", "down", "gate", "y_hf"):
        assert namespace[name].dtype == np.float32, (name, namespace[name].dtype)
    assert all(g.dtype == np.float32 for g in namespace["grads"].values())
    assert set(namespace["grads"]) >= {"x", "router_weights", "w0", "w1", "wo"}


def _claimed_differentiable():
    """The functions the README's Gradients section says vjp and jvp work for."""
    text = README.read_text()
    sentence = re.search(r"`raggeddot\.vjp` and `raggeddot\.jvp` work like jax's for (.*?), or a "
                         r"`functools\.partial` of one", text, re.S).group(1)
    return re.findall(r"`(\w+)`", sentence)


def _small_call(name, rng):
    """(fun, float64 args) of a small call of the README-named op ``name``."""
    import functools

    import numpy as np

    import raggeddot

    f = lambda *s: rng.standard_normal(s)  # noqa: E731
    gs = np.array([2, 0, 3])
    if name in ("ragged_dot", "gmm"):
        return getattr(raggeddot, name), (f(6, 3), f(3, 3, 4), gs)
    if name == "tgmm":
        return raggeddot.tgmm, (f(3, 6), f(6, 4), gs)
    if name == "ragged_dot_general":
        dn = raggeddot.RaggedDotDimensionNumbers((([1], [1]), ([], [])), [0], [0])
        return functools.partial(raggeddot.ragged_dot_general, ragged_dot_dimension_numbers=dn), \
            (f(6, 3), f(3, 3, 4), gs)
    if name == "ragged_gather":
        return raggeddot.ragged_gather, (f(4, 3), np.array([0, 2, 2, 3, 1]), f(5))
    if name == "ragged_gather_reduce":
        return raggeddot.ragged_gather_reduce, (f(5, 3), np.array([[0, 4], [1, -1], [2, 3]]), f(3, 2))
    if name == "moe_block":
        return functools.partial(raggeddot.moe_block, top_k=2, norm_topk_prob=True), \
            (f(6, 4), f(4, 3), f(3, 4, 5), f(3, 4, 5), f(3, 5, 4))
    raise AssertionError(f"the README claims gradients of {name!r}, which this test does not know")


def test_readme_differentiation_claims_hold():
    """Every function the README says vjp and jvp work for passes
    check_grads in both modes (vjp and jvp against finite differences)."""
    import numpy as np

    from raggeddot.testing import check_grads

    claimed = _claimed_differentiable()
    assert {"ragged_dot", "gmm", "tgmm", "ragged_dot_general", "ragged_gather", "ragged_gather_reduce",
            "moe_block"} <= set(claimed)
    rng = np.random.default_rng(0)
    for name in claimed:
        fun, args = _small_call(name, rng)
        assert check_grads(fun, args, modes=("rev", "fwd"), return_error=True) < 1e-6, name


def test_readme_table_signatures_of_vjp_jvp_grad():
    """The table's signatures of vjp, jvp and grad are the functions' own."""
    import inspect

    import raggeddot

    text = README.read_text()
    for name in ("vjp", "jvp", "grad"):
        shown = re.search(rf"`{name}\((.*?)\)`", text).group(1)
        assert shown == str(inspect.signature(getattr(raggeddot, name)))[1:-1], name
