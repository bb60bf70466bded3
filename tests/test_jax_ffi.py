"""raggeddot.jax: the XLA FFI custom calls against jax.lax.ragged_dot /
ragged_dot_general and megablox's gmm / tgmm (raggeddot.reference), eager and
under jax.jit; run-time errors; gradients against jax's own; vmap; a MoE
layer written in JAX, jitted with value_and_grad, against the same layer on
jax.lax.ragged_dot, and under shard_map over 2 CPU devices with the experts
sharded (in a subprocess: the device count is fixed when jax starts)."""
import itertools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import raggeddot
from raggeddot.reference import megablox as ref_mb

jax = pytest.importorskip("jax")
jnp = jax.numpy
rj = pytest.importorskip("raggeddot.jax")

# what a custom call's FFI error becomes in Python
RUNTIME_ERROR = getattr(jax.errors, "JaxRuntimeError", RuntimeError)
TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "bfloat16": dict(rtol=2e-2, atol=2e-2)}


def arr(rng, shape, dtype="float32"):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def close(a, b, dtype="float32"):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, **TOL[str(np.dtype(dtype))])


def test_build_info_reports_the_handlers():
    info = rj.build_info()
    assert "compiled on first use" in info["handlers"]
    assert os.path.exists(info["library"])
    assert info["diagnostics"] == ""           # -Wall -Wextra -pedantic, no warnings
    assert info["targets"] == ["raggeddot_ragged_contract", "raggeddot_ragged_rows"]


def test_the_handlers_run_with_raggeddots_thread_count(restore_runtime):
    for n in (1, 3):
        raggeddot.set_num_threads(n)
        # what the NumPy calls use: at most the processors this process may run on
        assert rj.build_info()["num_threads"] == raggeddot.get_num_threads() == min(n, len(os.sched_getaffinity(0)))


def test_import_raggeddot_leaves_jax_alone():
    code = "import sys, raggeddot; assert 'jax' not in sys.modules; raggeddot.jax.ragged_dot; assert 'jax' in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr[-2000:]


SHAPES = [(64, 32, 16, [10, 0, 30, 20]),       # an empty group, sum below m
          (33, 17, 9, [33]),                   # one group, odd sizes
          (40, 8, 24, [0, 0, 0]),              # no rows in any group: all zeros
          (7, 1, 1, [2, 5]),                   # k = n = 1
          (0, 4, 3, [0, 0]),                   # m = 0
          (12, 0, 5, [6, 6])]                  # k = 0: zeros


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("m,k,n,sizes", SHAPES)
def test_ragged_dot_matches_jax(rng, m, k, n, sizes, dtype):
    x, w = arr(rng, (m, k), dtype), arr(rng, (len(sizes), k, n), dtype)
    gs = jnp.asarray(sizes, jnp.int32)
    want = jax.lax.ragged_dot(x, w, gs, preferred_element_type=jnp.float32)
    got = jax.jit(rj.ragged_dot)(x, w, gs)
    assert got.dtype == jnp.dtype(dtype)
    close(got, want.astype(dtype), dtype)
    close(rj.ragged_dot(x, w, gs, preferred_element_type=jnp.float32), want, "float32")


def test_every_pattern_of_empty_groups(rng):
    x, w = arr(rng, (20, 8)), arr(rng, (3, 8, 5))
    f = jax.jit(rj.ragged_dot)
    for sizes in itertools.product([0, 3], repeat=3):
        gs = jnp.asarray(sizes, jnp.int32)
        close(f(x, w, gs), jax.lax.ragged_dot(x, w, gs))


def test_mixed_dtypes_and_float16_out(rng):
    x, w = arr(rng, (24, 16), "bfloat16"), arr(rng, (2, 16, 8))
    gs = jnp.asarray([10, 9], jnp.int32)
    want = jax.lax.ragged_dot(x.astype(jnp.float32), w, gs)
    close(rj.ragged_dot(x, w, gs), want)                           # promoted: float32
    got = rj.ragged_dot(x, w, gs, preferred_element_type=jnp.float16)
    assert got.dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2e-3, atol=2e-3)


def test_float64_under_x64(rng, x64):
    with x64(True):
        x, w = jnp.asarray(rng.standard_normal((20, 6))), jnp.asarray(rng.standard_normal((2, 6, 5)))
        gs = jnp.asarray([5, 9])
        got = jax.jit(rj.ragged_dot)(x, w, gs)
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(got, jax.lax.ragged_dot(x, w, gs), rtol=1e-13, atol=1e-13)


DNUMS = [  # (lhs shape, rhs shape, group sizes shape, dimension numbers)
    ((2, 12, 6), (3, 2, 6, 5), (2, 3), (([2], [2]), ([0], [1])), [1], [0]),   # mode 1, batch
    ((12, 3, 6), (6, 3, 4, 2), (3,), (([2], [0]), ([], [])), [0], [1]),       # mode 1, free dim after r
    ((3, 12, 6), (4, 6, 5), (3, 4), (([2], [1]), ([], [])), [1], [0]),        # mode 1, sizes per free dim before r
    ((2, 12, 6), (2, 12, 5), (2, 3), (([1], [1]), ([0], [0])), [1], []),      # mode 2, batch
    ((12, 6), (12, 5), (3,), (([0], [0]), ([], [])), [0], []),                # mode 2 (tgmm)
    ((3, 8, 6), (3, 6, 5), (2,), (([2], [1]), ([0], [0])), [0], []),          # mode 3
]


@pytest.mark.parametrize("case", range(len(DNUMS)))
def test_ragged_dot_general_matches_jax(rng, case):
    ls, rs, gshape, dot, lr, rg = DNUMS[case]
    x, w = arr(rng, ls), arr(rng, rs)
    total = ls[lr[0]]
    gs = jnp.asarray(rng.integers(0, total // gshape[-1] + 1, size=gshape), jnp.int32)
    dn = jax.lax.RaggedDotDimensionNumbers(dot, lr, rg)
    want = jax.lax.ragged_dot_general(x, w, gs, dn)
    got = jax.jit(rj.ragged_dot_general, static_argnums=3)(x, w, gs, dn)
    close(got, want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gmm_and_tgmm_match_megablox(rng, dtype):
    m, k, n, G = 48, 16, 12, 6
    sizes = np.array([5, 0, 11, 9, 0, 13])                  # sum 38 < m
    x, w = arr(rng, (m, k), dtype), arr(rng, (3, n, k), dtype)
    prev, acc = arr(rng, (m, n)), arr(rng, (3, k, n))
    f32 = lambda a: np.asarray(a, np.float32)              # noqa: E731
    gmm = jax.jit(rj.gmm, static_argnames=("transpose_rhs",))
    got = gmm(x, w, jnp.asarray(sizes), group_offset=jnp.asarray([2]), existing_out=prev, transpose_rhs=True)
    want = ref_mb.gmm(f32(x), f32(w), sizes, group_offset=2, existing_out=f32(prev), transpose_rhs=True)
    close(got, want, dtype)
    got = jax.jit(rj.tgmm, static_argnames=("num_actual_groups",))(
        x.T, x[:, :n], jnp.asarray(sizes), group_offset=jnp.asarray([3]), num_actual_groups=3, existing_out=acc)
    want = ref_mb.tgmm(f32(x).T, f32(x)[:, :n], sizes, group_offset=3, num_actual_groups=3, existing_out=f32(acc))
    close(got, want, dtype)
    assert got.dtype == jnp.float32                         # megablox's default output


@pytest.mark.parametrize("k,m,n,sizes", [(5, 0, 3, [0, 0]), (4, 9, 2, [0, 0, 0]), (3, 8, 2, [8, 0])])
def test_tgmm_edges_give_zeros_for_empty_groups(rng, k, m, n, sizes):
    x, y = arr(rng, (k, m)), arr(rng, (m, n))
    got = jax.jit(rj.tgmm)(x, y, jnp.asarray(sizes, jnp.int32))
    want = ref_mb.tgmm(np.asarray(x), np.asarray(y), np.asarray(sizes))
    assert got.shape == (len(sizes), k, n)
    close(got, want)


BAD = [([10, 0, 60, 20], "sums past m=64"), ([10, -1, 3, 2], "group_sizes[0, 1]=-1 is negative")]


@pytest.mark.parametrize("sizes,message", BAD)
def test_bad_group_sizes_raise_when_the_call_runs(rng, sizes, message):
    x, w = arr(rng, (64, 8)), arr(rng, (4, 8, 4))
    gs = jnp.asarray(sizes, jnp.int32)
    for fn in (jax.jit(rj.ragged_dot), jax.jit(lambda x, w, gs: rj.tgmm(x.T, x, gs))):
        with pytest.raises(RUNTIME_ERROR, match=message.replace("[", r"\[").replace("]", r"\]")):
            jax.block_until_ready(fn(x, w, gs))
    with pytest.raises(ValueError, match="group_sizes"):     # concrete: checked before the call
        rj.ragged_dot(x, w, gs)
    close(jax.jit(rj.ragged_dot)(x, w, jnp.asarray([1, 2, 3, 4])), jax.lax.ragged_dot(x, w, jnp.asarray([1, 2, 3, 4])))


def test_traced_group_offset_out_of_range_raises(rng):
    x, w = arr(rng, (16, 8)), arr(rng, (2, 8, 4))
    f = jax.jit(lambda o: rj.gmm(x, w, jnp.asarray([4, 4, 4, 4]), group_offset=o))
    with pytest.raises(RUNTIME_ERROR, match="group_offset=3"):
        jax.block_until_ready(f(jnp.asarray([3])))
    with pytest.raises(TypeError, match="'lhs' has dtype int32"):
        rj.ragged_dot(jnp.ones((4, 8), jnp.int32), w, jnp.asarray([2, 2]))
    with pytest.raises(ValueError, match="contracting dimensions differ"):
        rj.ragged_dot(x[:, :5], w, jnp.asarray([2, 2]))


def test_direct_custom_calls_with_bad_operands_are_errors(rng):
    """The handlers check what reaches them (ranks, dtypes, shapes, batches,
    attributes) and answer with an FFI error, whoever calls them."""
    rj.build_info()                                          # the targets are registered
    x, w = arr(rng, (1, 8, 4)), arr(rng, (1, 2, 4, 3))
    gs, off = jnp.asarray([[4, 4]], jnp.int32), jnp.zeros((1,), jnp.int32)
    out = jax.ShapeDtypeStruct((1, 8, 3), jnp.float32)
    call = lambda *a, out=out, **kw: jax.block_until_ready(                     # noqa: E731
        jax.jit(lambda *a: jax.ffi.ffi_call("raggeddot_ragged_rows", out)(*a, **kw))(*a))
    close(call(x, w, gs, off)[0], jax.lax.ragged_dot(x[0], w[0], gs[0]))        # well-formed: right
    cases = [((x[0], w, gs, off), {}, "operand ranks"),
             ((x.astype(jnp.int32), w, gs, off), {}, "must be float16, bfloat16"),
             ((x, w, gs.astype(jnp.float32), off), {}, "int32 or int64"),
             ((x[:, :5], w, gs, off), {}, "shapes disagree"),
             ((jnp.concatenate([x] * 3), w, gs, off), {}, "batch"),
             ((x, w, gs, off), {"transpose_lhs": "yes"}, "must be integers"),
             ((x, w, gs, off + 1), {}, "group_offset=1"),
             ((x, w), {}, "expected 4 buffer operands")]
    for args, kw, message in cases:
        with pytest.raises(RUNTIME_ERROR, match=message):
            call(*args, **kw)


def test_gradients_match_jax(rng):
    x, w = arr(rng, (40, 12)), arr(rng, (4, 12, 6))
    gs = jnp.asarray([9, 0, 17, 8], jnp.int32)
    ct = arr(rng, (40, 6))

    def loss(f):
        return lambda x, w: jnp.sum(jnp.tanh(f(x, w, gs)) * ct)

    v1, g1 = jax.jit(jax.value_and_grad(loss(rj.ragged_dot), (0, 1)))(x, w)
    v2, g2 = jax.value_and_grad(loss(jax.lax.ragged_dot), (0, 1))(x, w)
    close(v1, v2)
    for a, b in zip(g1, g2):
        close(a, b)
    t1 = jax.jit(lambda *a: jax.jvp(lambda x, w: rj.ragged_dot(x, w, gs), a[:2], a[2:]))(x, w, x, w)
    t2 = jax.jvp(lambda x, w: jax.lax.ragged_dot(x, w, gs), (x, w), (x, w))
    close(t1[1], t2[1])
    out, pull = jax.vjp(lambda x, w: rj.ragged_dot(x, w, gs), x, w)
    for a, b in zip(pull(ct), jax.vjp(lambda x, w: jax.lax.ragged_dot(x, w, gs), x, w)[1](ct)):
        close(a, b)


def _dense_gmm(x, w, sizes, offset, transpose_rhs):
    """gmm as masked dense products (an independent oracle for gradients)."""
    ends = jnp.cumsum(sizes)
    group = jnp.searchsorted(ends, jnp.arange(x.shape[0]), side="right") - offset
    w = jnp.swapaxes(w, 1, 2) if transpose_rhs else w
    hot = (group[:, None] == jnp.arange(w.shape[0])[None, :]).astype(x.dtype)
    return jnp.einsum("mg,mk,gkn->mn", hot, x, w)


def test_gmm_tgmm_gradients_and_second_order(rng):
    x, w = arr(rng, (30, 8)), arr(rng, (2, 6, 8))
    sizes = jnp.asarray([7, 0, 12, 6], jnp.int32)
    ct = arr(rng, (30, 6))
    ours = lambda x, w: jnp.sum(rj.gmm(x, w, sizes, group_offset=1, transpose_rhs=True) ** 2 * ct)  # noqa: E731
    dense = lambda x, w: jnp.sum(_dense_gmm(x, w, sizes, 1, True) ** 2 * ct)                    # noqa: E731
    for a, b in zip(jax.jit(jax.grad(ours, (0, 1)))(x, w), jax.grad(dense, (0, 1))(x, w)):
        close(a, b)
    # second order: the gradient of a gradient goes through tgmm's own rules
    h1 = jax.jit(jax.grad(lambda x, w: jnp.sum(jax.grad(ours, 1)(x, w) ** 2), (0, 1)))(x, w)
    h2 = jax.grad(lambda x, w: jnp.sum(jax.grad(dense, 1)(x, w) ** 2), (0, 1))(x, w)
    for a, b in zip(h1, h2):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)


def test_vmap_maps_onto_the_batch(rng):
    xs, ws = arr(rng, (3, 20, 8)), arr(rng, (2, 3, 8, 5))       # rhs mapped on axis 1
    gss = jnp.asarray([[5, 15], [20, 0], [0, 7]], jnp.int32)
    got = jax.jit(jax.vmap(rj.ragged_dot, (0, 1, 0)))(xs, ws, gss)
    want = jnp.stack([jax.lax.ragged_dot(xs[i], ws[:, i], gss[i]) for i in range(3)])
    close(got, want)
    g = jax.grad(lambda w: jnp.sum(jax.vmap(rj.ragged_dot, (0, None, 0))(xs, w, gss) ** 2))(ws[:, 0])
    want = jax.grad(lambda w: sum(jnp.sum(jax.lax.ragged_dot(xs[i], w, gss[i]) ** 2) for i in range(3)))(ws[:, 0])
    close(g, want)


MOE = '''
def moe_layer(params, x, ragged_dot, top_k=2, group_offset=None):
    """Top-k routing, tokens sorted by expert, three grouped matmuls (SwiGLU),
    weighted combine: x [T, d] -> [T, d]."""
    router, w0, w1, wo = params                      # [d, E], [E, d, f], [E, d, f], [E, f, d]
    E = router.shape[1]
    probs = jax.nn.softmax(x @ router, axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)   # [T, k]
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    token = order // top_k                           # the token of each sorted slot
    sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
    kw = {} if group_offset is None else {"group_offset": group_offset}
    xs = x[token]
    h = jax.nn.silu(ragged_dot(xs, w0, sizes, **kw)) * ragged_dot(xs, w1, sizes, **kw)
    y = ragged_dot(h, wo, sizes, **kw) * weights.reshape(-1)[order][:, None]
    return jnp.zeros_like(x).at[token].add(y)
'''
exec(MOE)


def _moe_params(rng, d=16, f=24, E=8):
    return (arr(rng, (d, E)), arr(rng, (E, d, f)) * 0.3, arr(rng, (E, d, f)) * 0.3, arr(rng, (E, f, d)) * 0.3)


def test_moe_layer_value_and_grad_matches_lax(rng):
    params, x = _moe_params(rng), arr(rng, (64, 16))
    loss = lambda rd: lambda p, x: jnp.mean(moe_layer(p, x, rd) ** 2)    # noqa: E731
    v1, (gp1, gx1) = jax.jit(jax.value_and_grad(loss(rj.ragged_dot), (0, 1)))(params, x)
    v2, (gp2, gx2) = jax.jit(jax.value_and_grad(loss(jax.lax.ragged_dot), (0, 1)))(params, x)
    close(v1, v2)
    close(gx1, gx2)
    for a, b in zip(gp1, gp2):
        close(a, b)


SHARDED = MOE + '''
import raggeddot.jax as rj
from jax.sharding import PartitionSpec as P
assert len(jax.devices()) == 2
rng = np.random.default_rng(7)
a = lambda *s: jnp.asarray(rng.standard_normal(s).astype(np.float32))
E, d, f = 8, 16, 24
params = (a(d, E), a(E, d, f) * 0.3, a(E, d, f) * 0.3, a(E, f, d) * 0.3)
x = a(64, d)
mesh = jax.make_mesh((2,), ("x",))

def local(router, w0, w1, wo, x):       # this device's experts: [E / 2, ...]
    off = jax.lax.axis_index("x") * w0.shape[0]
    y = moe_layer((router, w0, w1, wo), x, rj.ragged_dot, group_offset=off)
    return jax.lax.psum(y, "x")

sharded = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("x"), P("x"), P("x"), P()), out_specs=P(),
                        check_vma=False)
put = lambda v, spec: jax.device_put(v, jax.sharding.NamedSharding(mesh, spec))
sharded_params = (put(params[0], P()),) + tuple(put(w, P("x")) for w in params[1:])
loss = lambda p, x: jnp.mean(sharded(*p, x) ** 2)
ref = lambda p, x: jnp.mean(moe_layer(p, x, jax.lax.ragged_dot) ** 2)
v1, g1 = jax.jit(jax.value_and_grad(loss, (0, 1)))(sharded_params, put(x, P()))
v2, g2 = jax.jit(jax.value_and_grad(ref, (0, 1)))(params, x)
err = max(float(jnp.max(jnp.abs(p - q))) for p, q in zip(jax.tree.leaves((v1, g1)), jax.tree.leaves((v2, g2))))
print(json.dumps({"err": err, "value": float(v1), "compiled_now": rj.build_info()["compiled_now"]}))
'''


def test_moe_layer_under_shard_map_with_sharded_experts(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               RAGGEDDOT_CACHE_DIR=str(tmp_path))       # a fresh cache: the handlers compile here
    code = "import json, numpy as np, jax, jax.numpy as jnp\n" + textwrap.dedent(SHARDED)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["compiled_now"] is True
    assert res["value"] > 0
    assert res["err"] < 2e-5, res


def test_bfloat16_takes_the_fast_kernels_and_highest_the_exact_products(rng):
    """Two bfloat16 operands under jit: the kernels a NumPy call of the same
    product runs (here the AMX twin, named: its sums run on across the KC
    blocks, where the float32 kernels add block sums, so the bits tell them
    apart), bit for bit; precision HIGHEST: the float32 product of the
    widened operands."""
    from raggeddot import runtime
    x = rng.standard_normal((40, 600)).astype(np.float32)
    w = rng.standard_normal((3, 600, 36)).astype(np.float32)
    gs = np.array([10, 0, 25])
    xb, wb = jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)
    xn, wn = np.asarray(xb), np.asarray(wb)
    with runtime.configured(kernel="amx-twin"), jax.default_matmul_precision("default"):
        # (precision=None reads jax's default matmul precision, "highest" in this suite)
        fast = np.asarray(jax.jit(lambda a, b: rj.ragged_dot(a, b, gs, preferred_element_type=jnp.float32))(xb, wb))
        want = raggeddot.ragged_dot(xn, wn, gs, preferred_element_type=np.float32)
        exact = np.asarray(jax.jit(lambda a, b: rj.ragged_dot(a, b, gs, precision=jax.lax.Precision.HIGHEST,
                                                              preferred_element_type=jnp.float32))(xb, wb))
    wide = raggeddot.ragged_dot(xn.astype(np.float32), wn.astype(np.float32), gs)
    assert np.array_equal(fast.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(exact.view(np.uint32), wide.view(np.uint32))
    assert not np.array_equal(fast, exact)
