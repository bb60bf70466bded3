"""raggeddot.torch's operators (torch 2.13, the hf extra).

For each operator: its result equals the NumPy function's on the same
values (bit for bit: one kernel path); ``torch.library.opcheck`` passes
(schema, autograd registration, fake tensors, AOT dispatch with dynamic
shapes); ``torch.autograd.gradcheck`` passes in float64 (the autograd rules
against finite differences), including second derivatives of the grouped
products, whose gradients are grouped products again. Also: inputs are read
and results written in place (no copies), bfloat16 included; inputs are never
modified; bad arguments give errors naming them; torch.compile(fullgraph=True)
and torch.export trace the operators.
"""
import numpy as np
import pytest

import raggeddot
from helpers import import_hf

torch, _ = import_hf()
import ml_dtypes  # noqa: E402

import raggeddot.torch as rt  # noqa: E402
from raggeddot.torch import _convert as cv  # noqa: E402

OPS = torch.ops.raggeddot
GS = [2, 0, 3, 1]          # an empty group, and 6 of 7 rows grouped (row 6 in no group)


def _t(rng, *shape, dtype=torch.float64, grad=False):
    t = torch.from_numpy(rng.standard_normal(shape)).to(dtype)
    return t.requires_grad_(grad)


def _gs(sizes=GS):
    return torch.tensor(sizes, dtype=torch.int64)


def _cases(rng, grad=False, dtype=torch.float64):
    """(name, op, args, kwargs) for every operator, small shapes."""
    m, k, n, g = 7, 3, 4, len(GS)
    t = lambda *s: _t(rng, *s, dtype=dtype, grad=grad)   # noqa: E731
    idx = torch.tensor([0, 2, 2, 1, 4, 3, 0, 1], dtype=torch.int64)
    slots = torch.tensor([[0, 3], [5, -1], [1, 2], [7, 6]], dtype=torch.int64)
    return [
        ("ragged_dot", OPS.ragged_dot, (t(m, k), t(g, k, n), _gs()), {}),
        ("ragged_dot-offset", OPS.ragged_dot, (t(m, k), t(2, k, n), _gs()), {"group_offset": 1}),
        ("gmm", OPS.gmm, (t(m, k), t(g, k, n), _gs()), {}),
        ("gmm-transposed-existing", OPS.gmm, (t(m, k), t(2, n, k), _gs()),
         {"group_offset": 2, "existing_out": t(m, n), "transpose_rhs": True}),
        ("tgmm", OPS.tgmm, (t(k, m), t(m, n), _gs()), {}),
        ("tgmm-offset-existing", OPS.tgmm, (t(k, m), t(m, n), _gs()),
         {"group_offset": 1, "num_actual_groups": 2, "existing_out": t(2, k, n)}),
        ("ragged_dot_general", OPS.ragged_dot_general,   # batched mode 1: [b, m, k] x [g, b, k, n]
         (t(2, m, k), t(g, 2, k, n), _gs(), [2], [2], [0], [1], 1, [0]), {}),
        ("ragged_dot_general-contracting", OPS.ragged_dot_general,   # mode 2: [k, m] x [m, n] -> [g, k, n]
         (t(k, m), t(m, n), _gs(), [1], [0], [], [], 1, []), {}),
        ("ragged_gather", OPS.ragged_gather, (t(5, n), idx, t(8)), {}),
        ("ragged_gather-unweighted", OPS.ragged_gather, (t(5, n), idx), {}),
        ("ragged_gather_reduce", OPS.ragged_gather_reduce, (t(8, n), slots, t(4, 2)), {}),
        ("ragged_gather_reduce-ordered", OPS.ragged_gather_reduce, (t(8, n), slots, t(4, 2)), {"ordered": True}),
        ("gated_activation-silu", OPS.gated_activation, (t(5, 2 * n),), {"activation": "silu"}),
        ("gated_activation-gelu", OPS.gated_activation, (t(5, 2 * n),), {"activation": "gelu"}),
        ("gated_activation-gelu_tanh", OPS.gated_activation, (t(5, 2 * n),), {"activation": "gelu_tanh"}),
        ("gated_activation-swiglu_oai", OPS.gated_activation, (t(5, 2 * n) * 3,),
         {"activation": "swiglu_oai", "layout": "interleaved", "limit": 2.5, "alpha": 1.702}),
    ]


NAMES = [c[0] for c in _cases(np.random.default_rng(0))]


def _case(rng, name, **kw):
    return next(c for c in _cases(rng, **kw) if c[0] == name)


def _numpy_reference(name, args, kwargs):
    a = [cv.array(x) if isinstance(x, torch.Tensor) else x for x in args]
    kw = {key: cv.array(x) if isinstance(x, torch.Tensor) else x for key, x in kwargs.items()}
    base = name.split("-")[0]
    if base == "ragged_dot_general":
        dn = raggeddot.RaggedDotDimensionNumbers(((a[3], a[4]), (a[5], a[6])), (a[7],), a[8])
        return raggeddot.ragged_dot_general(a[0], a[1], a[2], dn)
    if base == "gated_activation":
        return None
    return getattr(raggeddot, base)(*a, **kw)


@pytest.mark.parametrize("name", NAMES)
def test_matches_numpy_and_leaves_inputs(name, rng):
    _, op, args, kwargs = _case(rng, name, dtype=torch.float32)
    before = [x.clone() for x in args if isinstance(x, torch.Tensor)]
    got = op(*args, **kwargs)
    want = _numpy_reference(name, args, kwargs)
    if want is not None:
        np.testing.assert_array_equal(got.numpy(), want)
    for b, x in zip(before, [x for x in args if isinstance(x, torch.Tensor)]):
        assert torch.equal(b, x)


@pytest.mark.parametrize("name", NAMES)
def test_opcheck(name, rng):
    _, op, args, kwargs = _case(rng, name, grad=True)
    torch.library.opcheck(op, args, kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_float64(name, rng):
    _, op, args, kwargs = _case(rng, name, grad=True)
    inputs = [x for x in list(args) + list(kwargs.values()) if isinstance(x, torch.Tensor) and x.requires_grad]
    assert inputs

    def f(*xs):
        it = iter(xs)
        a = [next(it) if isinstance(x, torch.Tensor) and x.requires_grad else x for x in args]
        kw = {k: next(it) if isinstance(x, torch.Tensor) and x.requires_grad else x for k, x in kwargs.items()}
        return op(*a, **kw)

    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("name", ["ragged_dot", "gmm-transposed-existing", "tgmm-offset-existing"])
def test_gradgradcheck_float64(name, rng):
    _, op, args, kwargs = _case(rng, name, grad=True)
    lhs, rhs, gs = args
    assert torch.autograd.gradgradcheck(lambda a, b: op(a, b, gs, **kwargs), (lhs, rhs))


def test_gradients_are_grouped_products(rng):
    """The backward graph of ragged_dot is raggeddot's own operators."""
    lhs, rhs = _t(rng, 7, 3, grad=True), _t(rng, 4, 3, 5, grad=True)
    out = rt.ragged_dot(lhs, rhs, _gs())
    names = set()

    def walk(fn):
        if fn is None or fn.name() in names:
            return
        names.add(fn.name())
        for nxt, _ in fn.next_functions:
            walk(nxt)
    walk(out.grad_fn)
    assert any("ragged_dot" in n for n in names), names
    with torch.profiler.profile() as prof:
        out.sum().backward()
    ran = {e.name for e in prof.events()}
    assert {"raggeddot::ragged_dot", "raggeddot::tgmm"} <= ran, ran


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_zero_copy_in_and_out(dtype, rng, monkeypatch):
    """The NumPy function receives views of the tensors' memory and writes
    the result into the returned tensor's memory (bfloat16 as ml_dtypes)."""
    lhs, rhs = _t(rng, 6, 4, dtype=dtype), _t(rng, 2, 5, 4, dtype=dtype).transpose(1, 2)   # strided rhs
    seen = {}
    real = raggeddot.ragged_dot

    def spy(l, r, gs, **kw):
        seen.update(lhs=l, rhs=r, out=kw["out"])
        return real(l, r, gs, **kw)
    monkeypatch.setattr(raggeddot, "ragged_dot", spy)
    out = rt.ragged_dot(lhs, rhs, _gs([3, 2]))
    assert seen["lhs"].ctypes.data == lhs.data_ptr() and seen["rhs"].ctypes.data == rhs.data_ptr()
    assert seen["rhs"].strides == tuple(s * rhs.element_size() for s in rhs.stride())
    assert seen["out"].ctypes.data == out.data_ptr()
    want_np = ml_dtypes.bfloat16 if dtype == torch.bfloat16 else cv.np_dtype(dtype)
    assert seen["lhs"].dtype == want_np and out.dtype == dtype
    ref = torch.einsum("mk,mkn->mn", lhs.double()[:5], rhs.double()[[0, 0, 0, 1, 1]])
    tol = {torch.float32: 1e-5}.get(dtype, 1e-2)
    assert torch.allclose(out[:5].double(), ref, rtol=tol, atol=tol) and not out[5].any()


def test_bfloat16_matches_numpy_bitwise(rng):
    x, w = _t(rng, 9, 8, dtype=torch.bfloat16), _t(rng, 3, 8, 6, dtype=torch.bfloat16)
    gs = _gs([4, 0, 5])
    got = rt.gmm(x, w, gs, torch.bfloat16)
    want = raggeddot.gmm(cv.array(x), cv.array(w), cv.array(gs), preferred_element_type=ml_dtypes.bfloat16)
    np.testing.assert_array_equal(cv.array(got), want)


def test_compile_fullgraph_and_export(rng):
    x, w, w2 = _t(rng, 7, 3, dtype=torch.float32), _t(rng, 4, 3, 6, dtype=torch.float32), \
        _t(rng, 4, 3, 5, dtype=torch.float32)
    idx = torch.tensor([[0, 1], [2, 3], [4, 5]])

    def f(x, w, w2, gs):
        h = rt.gated_activation(rt.ragged_dot(x, w, gs))
        return rt.ragged_gather_reduce(rt.gmm(h, w2, gs), idx, None)
    want = f(x, w, w2, _gs())
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, w2, _gs())
    torch.testing.assert_close(got, want, rtol=0, atol=0)

    class M(torch.nn.Module):
        def forward(self, x, w, w2, gs):
            return f(x, w, w2, gs)
    ep = torch.export.export(M(), (x, w, w2, _gs()))
    targets = {str(n.target) for n in ep.graph.nodes}
    assert "raggeddot.ragged_dot.default" in targets and "raggeddot.gmm.default" in targets, targets
    torch.testing.assert_close(ep.module()(x, w, w2, _gs()), want, rtol=0, atol=0)


def test_opcheck_backward_operators(rng):
    """The operators the autograd rules call (no autograd of their own)."""
    x, w, ct = _t(rng, 5, 4), _t(rng, 8), _t(rng, 8, 4)
    idx = torch.tensor([0, 2, 2, 1, 4, 3, 0, 1])
    slots = torch.tensor([[0, 3], [5, -1], [1, 2], [7, 6]])
    torch.library.opcheck(OPS.ragged_gather_backward, (ct, x, idx, w, True))
    torch.library.opcheck(OPS.ragged_gather_backward, (ct, x, idx, None, False))
    torch.library.opcheck(OPS.ragged_gather_reduce_backward,
                          (_t(rng, 4, 3), _t(rng, 8, 3), slots, _t(rng, 4, 2), True))
    torch.library.opcheck(OPS.gated_activation_backward,
                          (_t(rng, 5, 4), _t(rng, 5, 8), "gelu", "interleaved", 7.0, 1.0))
    lhs, rhs = _t(rng, 2, 7, 3), _t(rng, 4, 2, 3, 5)
    torch.library.opcheck(OPS.ragged_dot_general_backward,
                          (_t(rng, 2, 7, 5), lhs, rhs, _gs(), [2], [2], [0], [1], 1, [0]))


def test_cuda_tensors_are_refused():
    """A CUDA tensor (a fake one: this torch is a CPU build) is refused by
    name, in a fake trace as it would be at run time."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x, w = torch.empty(5, 3, device="cuda"), torch.empty(2, 3, 4, device="cuda")
        _raises(ValueError, "'lhs' is a cuda:0 tensor; raggeddot computes on the CPU", rt.ragged_dot, x, w,
                torch.tensor([2, 3], device="cuda"))


def _raises(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)


def test_float16_with_bfloat16_promotes_as_jax_lax(rng):
    """float16 lhs with bfloat16 rhs (and back): a bfloat16 result (jax.lax's
    rule: the larger range), the NumPy op's values bit for bit, and
    gradients in each operand's own dtype."""
    x, w = _t(rng, 5, 3, dtype=torch.float16), _t(rng, 2, 3, 4, dtype=torch.bfloat16)
    for a, b in ((x, w), (x.bfloat16(), w.half())):
        got = rt.ragged_dot(a, b, _gs([2, 3]))
        assert got.dtype == torch.bfloat16
        want = raggeddot.ragged_dot(cv.array(a), cv.array(b), np.array([2, 3]))
        assert want.dtype == ml_dtypes.bfloat16
        assert torch.equal(got.view(torch.int16), torch.from_numpy(want.view(np.int16)))
        a2, b2 = a.clone().requires_grad_(), b.clone().requires_grad_()
        rt.ragged_dot(a2, b2, _gs([2, 3])).float().sum().backward()
        assert a2.grad.dtype == a.dtype and b2.grad.dtype == b.dtype


def test_errors_name_the_argument(rng):
    x, w = _t(rng, 5, 3, dtype=torch.float32), _t(rng, 2, 3, 4, dtype=torch.float32)
    _raises(ValueError, "'lhs' is a meta tensor", rt.ragged_dot, x.to("meta"), w.to("meta"), _gs([2, 3]))
    _raises(TypeError, "'rhs' must be float16, bfloat16, float32 or float64, got torch.int32",
            rt.ragged_dot, x, w.to(torch.int32), _gs([2, 3]))
    _raises(TypeError, "'group_sizes' must hold integers", rt.ragged_dot, x, w, torch.tensor([2.0, 3.0]))
    _raises(ValueError, "'rhs' must have 3 dimensions", rt.gmm, x, w[0], _gs([2, 3]))
    _raises(ValueError, "contracting dimensions differ", rt.ragged_dot, x, w.transpose(1, 2), _gs([2, 3]))
    _raises(ValueError, "group_sizes", rt.ragged_dot, x, w, _gs([4, 3]))      # sum > m
    _raises(ValueError, "group_sizes", rt.ragged_dot, x, w, _gs([-1, 3]))
    _raises(ValueError, "'existing_out' must have shape", rt.gmm, x, w, _gs([2, 3]), existing_out=x)
    _raises(ValueError, "'indices'", rt.ragged_gather, x, torch.tensor([0, 5]))
    _raises(ValueError, "'weights' must have the shape", rt.ragged_gather_reduce, x,
            torch.tensor([[0, 1]]), torch.ones(2))
    _raises(ValueError, "'activation' must be one of", rt.gated_activation, x[:, :2], "tanh")
    _raises(ValueError, "even number of columns", rt.gated_activation, x)


def test_the_experts_sort_in_numpy_is_the_traced_one():
    """The experts implementation sorts the assignments in NumPy outside
    torch.compile and in torch operators inside it: the same four tensors
    (sentinel ids >= E, int32 ids, a non-contiguous index, no tokens)."""
    from raggeddot.torch import _experts
    g = torch.Generator().manual_seed(0)
    cases = [torch.randint(0, 10, (7, 3), generator=g), torch.randint(0, 8, (33, 4), generator=g, dtype=torch.int32),
             torch.randint(0, 8, (4, 6), generator=g).t(), torch.zeros((0, 2), dtype=torch.int64)]
    for idx in cases:
        got, want = _experts._sort_by_expert(idx, 8), _experts._sort_by_expert_traced(idx, 8)
        assert all(a.dtype == b.dtype == torch.int64 and torch.equal(a, b) for a, b in zip(got, want))
    assert int(_experts._sort_by_expert(cases[0], 8)[3].sum()) < 21      # (some sentinels: outside every group)
