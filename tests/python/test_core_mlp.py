"""An MLP built through libspmd.Graph: its loss against NumPy's forward pass
of the same parameters, against the C API's spmd_mlp_build (Graph.mlp), and
on a 4x2 mesh (four replicas of a model sharded over pairs) against one
device; reads and writes of parameters round trip."""
import math

import numpy as np
import pytest

import libspmd

IN, HIDDEN, LAYERS, OUT, BATCH = 16, 32, 1, 8, 16
STEPS, LR = 5, 1e-2


def dims(i):
    """(in, out) of Linear i, as spmd_mlp_build lays them out."""
    return (IN if i == 0 else HIDDEN, OUT if i == LAYERS else HIDDEN)


def build_mlp(g):
    """The MLP of spmd/models.h, op by op: the same names, shapes and init."""
    x = g.input("input", (BATCH, IN))
    h = x
    for i in range(LAYERS + 1):
        n_in, n_out = dims(i)
        w = g.param("fc.%d.weight" % i, (n_out, n_in), init="uniform", scale=1 / math.sqrt(n_in))
        b = g.param("fc.%d.bias" % i, (n_out,))
        h = g.add(g.matmul(h, w, trans_b=True), b)
        if i < LAYERS:
            h = g.gelu(h)
    targets = g.input("targets", (BATCH,), "int32")
    return x, targets, g.cross_entropy(h, targets)


def train_step_graph(build, mesh=None, shard_state=None):
    """A Graph with the model, its loss marked, AdamW with clipping (ZeRO
    by default, shard_state=False: off); on a mesh the FSDP-in-replicas
    marks."""
    g = libspmd.Graph()
    x, targets, loss = build(g)
    if mesh is not None:
        for p in g.params():
            if p.rank == 2:
                g.mark_sharding(p, mesh, ("fsdp", None))
        g.mark_sharding(x, mesh, (("replica", "fsdp"), None))
        g.mark_sharding(targets, mesh, (("replica", "fsdp"),))
    g.mark_output(loss)
    g.grad(loss)
    opt = g.optimizer_apply("adamw", weight_decay=0.01, clip_norm=1.0, shard_state=shard_state)
    return g, x, targets, loss, opt


def batches():
    rng = np.random.default_rng(7)
    for _ in range(STEPS):
        yield (rng.standard_normal((BATCH, IN)).astype(np.float32),
               rng.integers(0, OUT, BATCH).astype(np.int32))


def losses(g, x, targets, loss, opt, **options):
    p = g.compile(seed=3, threads=2, **options)
    out = []
    xb, tb = next(batches())  # one batch again and again: the loss must fall
    for _ in range(STEPS):
        p.set_input(x, xb)
        p.set_input(targets, tb)
        p.set_input(opt.lr, np.float32(LR))
        p.run()
        out.append(float(p.read(loss)))
    return out


def gelu(v):
    return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


def numpy_loss(params, xb, tb):
    h = xb.astype(np.float64)
    for i in range(LAYERS + 1):
        h = h @ params["fc.%d.weight" % i].T.astype(np.float64) + params["fc.%d.bias" % i]
        if i < LAYERS:
            h = gelu(h)
    m = h.max(axis=1, keepdims=True)
    logp = h - m - np.log(np.exp(h - m).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(tb)), tb].mean()


def c_api_mlp(g):
    t = g.mlp(IN, HIDDEN, LAYERS, OUT, BATCH, loss="cross_entropy")
    return t["input"], t["targets"], t["loss"]


def test_loss_matches_numpy_forward():
    g = libspmd.Graph()
    x, targets, loss = build_mlp(g)
    g.mark_output(loss)
    p = g.compile(seed=5)
    params = {t.name: p.read(t) for t in g.params()}
    # The init is what spmd/models.h says: uniform in [-1/sqrt(in), 1/sqrt(in)), biases zero.
    bound = 1 / math.sqrt(IN)
    assert np.all(np.abs(params["fc.0.weight"]) <= bound) and params["fc.0.weight"].std() > bound / 4
    assert not params["fc.0.bias"].any()
    for xb, tb in batches():
        p.set_input(x, xb)
        p.set_input(targets, tb)
        p.run()
        assert float(p.read(loss)) == pytest.approx(numpy_loss(params, xb, tb), rel=1e-5)


def test_graph_mlp_equals_c_api_mlp_bit_for_bit():
    ours = losses(*train_step_graph(build_mlp))
    theirs = losses(*train_step_graph(c_api_mlp))
    assert ours == theirs
    assert ours[-1] < ours[0]


def test_mesh_4x2_equals_one_device():
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    one = losses(*train_step_graph(build_mlp))
    many = losses(*train_step_graph(build_mlp, mesh))
    assert len(many) == STEPS
    for a, b in zip(one, many):
        assert b == pytest.approx(a, rel=1e-5)
    # The mesh from its text form plans the same program.
    text = libspmd.Mesh("4x2", "replica,fsdp")
    assert text.shape == (4, 2) and text.axis_names == ("replica", "fsdp") and text.devices() == 8
    assert losses(*train_step_graph(build_mlp, text)) == many


def test_mesh_4x2_overlap_off_same_bits():
    """Collectives in flight or each a blocking step (the default), and in
    flight within a small byte budget: the same bits."""
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    on = losses(*train_step_graph(build_mlp, mesh), overlap=True)
    off = losses(*train_step_graph(build_mlp, mesh))
    tight = losses(*train_step_graph(build_mlp, mesh), overlap=True, inflight_bytes=4096)
    assert on == off == tight
    with pytest.raises(ValueError, match="inflight_bytes"):
        train_step_graph(build_mlp, mesh)[0].compile(overlap=True, inflight_bytes=-1)


def test_read_write_round_trip():
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    g, x, targets, loss, opt = train_step_graph(build_mlp, mesh)
    p = g.compile(seed=1)
    rng = np.random.default_rng(1)
    new = {t.name: (rng.standard_normal(t.shape) * 0.1).astype(np.float32) for t in g.params()}
    for name, value in new.items():
        p.write(name, value)
    for t in g.params():
        back = p.read(t)
        assert back.dtype == np.float32 and back.shape == t.shape
        np.testing.assert_array_equal(back, new[t.name])
    # A non-contiguous array is copied in the tensor's layout.
    w0 = g.find("fc.0.weight")
    wide = np.zeros((w0.shape[0], w0.shape[1] * 2), np.float32)
    wide[:, ::2] = new["fc.0.weight"]
    p.write(w0, wide[:, ::2])
    np.testing.assert_array_equal(p.read(w0), new["fc.0.weight"])
    # The written parameters are the ones the next step's forward pass uses.
    xb, tb = next(batches())
    p.set_input(x, xb)
    p.set_input(targets, tb)
    p.set_input(opt.lr, np.float32(0))
    p.run()
    assert float(p.read(loss)) == pytest.approx(numpy_loss(new, xb, tb), rel=1e-5)
    np.testing.assert_array_equal(p.read(x), xb)


def test_tensor_queries():
    g = libspmd.Graph()
    x, targets, loss = build_mlp(g)
    w = g.find("fc.0.weight")
    assert w.is_param and w.op == "param" and w.shape == (HIDDEN, IN) and w.dtype == np.float32
    assert targets.dtype == np.int32 and loss.shape == () and loss.name is None
    assert g.find("no such tensor") is None
    assert w == g.find("fc.0.weight") and hash(w) == hash(g.find("fc.0.weight")) and w != x
    assert [t.name for t in g.params()] == ["fc.0.weight", "fc.0.bias", "fc.1.weight", "fc.1.bias"]
    assert g.param_count == HIDDEN * IN + HIDDEN + OUT * HIDDEN + OUT
    assert len(g) == len(g.tensors())
    assert w.grad is None
    g.grad(loss)
    assert w.grad.name == "fc.0.weight.grad" and w.grad.shape == w.shape
    loss.name = "loss"
    assert g.find("loss") == loss
    assert g.matmul(x, w, trans_b=True).signature == "mk,nk->mn"
