"""Pipeline stages through the binding: Mesh.set_stage_axis, Graph.set_stage,
Graph.stage_transfer and Tensor.stage.  A two-layer model on two stages
(each layer on its stage, the activation crossing by a transfer, two
micro-batches) trains as the same graph on one device, where the transfer
is a copy."""
import math

import numpy as np
import pytest

import libspmd

IN, HIDDEN, OUT, ROWS, MICRO, STEPS = 8, 16, 4, 4, 2, 4


def build(g):
    """Layer 0 on stage 0, layer 1 and the loss on stage 1, MICRO
    micro-batches over the same parameters; the loss their mean."""
    g.set_stage(0)
    w0 = g.param("fc.0.weight", (HIDDEN, IN), init="uniform", scale=1 / math.sqrt(IN))
    g.set_stage(1)
    w1 = g.param("fc.1.weight", (OUT, HIDDEN), init="uniform", scale=1 / math.sqrt(HIDDEN))
    inputs, total = [], None
    for m in range(MICRO):
        g.set_stage(-1)
        x = g.input(f"x.{m}", (ROWS, IN))
        t = g.input(f"t.{m}", (ROWS,), "int32")
        inputs.append((x, t))
        g.set_stage(0)
        h = g.gelu(g.matmul(x, w0, trans_b=True))
        h = g.stage_transfer(h, 0, 1)
        g.set_stage(1)
        loss = g.cross_entropy(g.matmul(h, w1, trans_b=True), t)
        total = loss if total is None else g.add(total, loss)
    loss = g.scale(total, 1.0 / MICRO)
    g.set_stage(-1)
    return inputs, loss


def train(mesh):
    g = libspmd.Graph()
    inputs, loss = build(g)
    if mesh is not None:
        for x, t in inputs:
            g.mark_sharding(x, mesh, (None, None))
            g.mark_sharding(t, mesh, (None,))
    g.mark_output(loss)
    g.grad(loss)
    opt = g.optimizer_apply("adamw", weight_decay=0.01, clip_norm=1.0)
    p = g.compile(seed=1, threads=2)
    rng = np.random.default_rng(5)
    out = []
    for _ in range(STEPS):
        for x, t in inputs:
            p.set_input(x, rng.standard_normal((ROWS, IN)).astype(np.float32))
            p.set_input(t, rng.integers(0, OUT, ROWS).astype(np.int32))
        p.set_input(opt.lr, np.float32(1e-2))
        p.run()
        out.append(float(p.read(loss)))
    return out, p.read("fc.0.weight"), p.read("fc.1.weight")


def stage_mesh():
    mesh = libspmd.Mesh((2,), ("pp",))
    mesh.set_stage_axis("pp")
    return mesh


def test_stage_axis_is_the_meshs():
    mesh = libspmd.Mesh((2, 2), ("pp", "data"))
    assert mesh.stage_axis == -1
    mesh.set_stage_axis("pp")
    assert mesh.stage_axis == 0
    mesh.set_stage_axis(None)
    assert mesh.stage_axis == -1
    mesh.set_stage_axis(1)
    assert mesh.stage_axis == 1
    with pytest.raises(libspmd.InvalidError):
        mesh.set_stage_axis("tensor")


def test_nodes_carry_their_stage():
    g = libspmd.Graph()
    x = g.input("x", (2, 3))
    assert x.stage == -1
    g.set_stage(1)
    y = g.relu(x)
    assert y.stage == 1
    assert g.stage_transfer(y, 1, 0).stage == 0  # a transfer lives where it arrives
    with pytest.raises(libspmd.InvalidError, match="stage_transfer"):
        g.stage_transfer(y, 1, 1)
    with pytest.raises(libspmd.InvalidError, match="graph_set_stage"):
        g.set_stage(-2)


def test_two_stages_train_as_one_device():
    one, w0, w1 = train(None)
    two, v0, v1 = train(stage_mesh())
    np.testing.assert_allclose(two, one, rtol=1e-5)
    np.testing.assert_allclose(v0, w0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v1, w1, rtol=1e-5, atol=1e-6)
    assert train(stage_mesh())[0] == two  # the same bits on a rerun


def test_a_mark_over_the_stage_axis_is_refused():
    g = libspmd.Graph()
    x = g.input("x", (4, 2))
    with pytest.raises(libspmd.InvalidError, match="stage axis"):
        g.mark_sharding(x, stage_mesh(), ("pp", None))
