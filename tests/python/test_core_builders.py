"""Every Graph builder once, with the shape the C API gives; set_update,
checkpointed gradients, the FSDP and batch wrappers, copies along an
independent axis."""
import numpy as np
import pytest

import libspmd


def test_every_builder_gives_its_shape():
    g = libspmd.Graph()
    x = g.input("x", (2, 4, 8))
    ids = g.input("ids", (2, 4), "int32")
    pos = g.input("pos", (1,), np.int32)
    table = g.param("table", (10, 8), init="normal", scale=0.02)
    gamma = g.param("gamma", (8,), init="ones")
    beta = g.param("beta", (8,))
    st = g.state("cache", (2, 6, 8))
    assert g.fill((2, 1), 3.0).shape == (2, 1)
    for name in ["neg", "exp", "log", "tanh", "gelu", "relu", "sqrt", "rsqrt", "softmax", "log_softmax",
                 "gelu_erf", "silu", "sigmoid"]:
        assert getattr(g, name)(x).shape == (2, 4, 8), name
    for name in ["add", "sub", "mul", "div"]:
        assert getattr(g, name)(x, gamma).shape == (2, 4, 8), name
    assert g.scale(x, 0.5).op == "scale"
    assert g.pow_scalar(x, 3.0).shape == (2, 4, 8)
    assert g.where(g.fill((4, 1), 1.0), x, gamma).shape == (2, 4, 8)
    assert g.expand(gamma, (3, 8)).shape == (3, 8)
    assert g.reshape(x, (8, 8)).shape == (8, 8)
    assert g.sum(x, (0, 2)).shape == (4,) and g.mean(x, 1, keepdim=True).shape == (2, 1, 8)
    assert g.max(x, 2).shape == (2, 4)
    assert g.cumsum(x, 1).shape == (2, 4, 8) and g.cumsum(x, -1, reverse=True).op == "cumsum"
    assert g.layernorm(x, gamma, beta).shape == (2, 4, 8)
    mean, var = g.batch_norm_stats(x)  # channels on dim 1: x is [N, C, L]
    assert (mean.op, var.op, var.shape) == ("mean", "batch_norm_var", (4,))
    assert g.batch_norm_var(x, mean).shape == (4,)
    assert g.batch_norm(x, mean, var).shape == (2, 4, 8)
    assert g.batch_norm(x, mean, var, var, mean, eps=1e-3).op == "batch_norm"
    w = g.param("w", (5, 8))
    assert g.matmul(x, w, trans_b=True).shape == (2, 4, 5)
    assert g.bmm(x, x, trans_b=True).shape == (2, 4, 4)
    assert g.attention(x, x, x, 2).shape == (2, 4, 8)
    emb = g.embedding(table, ids)
    assert emb.shape == (2, 4, 8)
    logits = g.matmul(emb, table, trans_b=True)
    assert g.cross_entropy(logits, ids).shape == () and g.mse(x, x).shape == ()
    assert g.permute(x, (2, 0, 1)).shape == (8, 2, 4) and g.transpose(x, 0, 2).shape == (8, 4, 2)
    assert g.slice(x, 2, 2, 4).shape == (2, 4, 4) and g.concat([x, x], 1).shape == (2, 8, 8)
    img = g.reshape(x, (2, 4, 2, 4))
    assert g.max_pool2d(img, 3, 2, 1).shape == (2, 4, 1, 2)
    assert g.max_pool2d(img, (1, 2), dilation=(1, 2), ceil_mode=True).shape == (2, 4, 2, 2)
    assert g.avg_pool2d(img, 2, stride=1, count_include_pad=False).shape == (2, 4, 1, 3)
    assert g.avg_pool2d(x, (2, 3), divisor_override=5).shape == (2, 2, 2)
    assert g.adaptive_avg_pool2d(img, (3, 5)).shape == (2, 4, 3, 5)
    with pytest.raises(libspmd.InvalidError, match="divisor_override 0"):
        g.avg_pool2d(img, 2, divisor_override=0)
    with pytest.raises(libspmd.InvalidError, match="kernel_size"):
        g.max_pool2d(img, (1, 2, 3))
    written = g.cache_write(st, x, pos)
    assert written.shape == (2, 6, 8)
    assert g.cached_attention(x, written, written, pos, 2).shape == (2, 4, 8)
    g.set_update(st, written)
    g.check()


def test_set_update_and_a_cache_step():
    g = libspmd.Graph()
    rows = g.input("rows", (1, 1, 2))
    pos = g.input("pos", (1,), "int32")
    cache = g.state("cache", (1, 3, 2))
    g.set_update(cache, g.cache_write(cache, rows, pos))
    p = g.compile()
    for i in range(3):
        p.set_input(rows, np.full((1, 1, 2), i + 1, np.float32))
        p.set_input(pos, np.array([i], np.int32))
        p.run()
    np.testing.assert_array_equal(p.read(cache)[0], [[1, 1], [2, 2], [3, 3]])


def mlp_grads(checkpoints):
    g = libspmd.Graph()
    x = g.input("x", (4, 6))
    h = x
    outs = []
    for i in range(3):
        w = g.param("w%d" % i, (6, 6), init="normal", scale=0.3)
        h = g.tanh(g.matmul(h, w, trans_b=True))
        outs.append(h)
    loss = g.mean(g.mul(h, h))
    g.grad(loss, checkpoints=outs[:2] if checkpoints else None)
    grads = [p.grad for p in g.params()]
    for t in grads:
        g.mark_output(t)
    p = g.compile(seed=2)
    p.set_input(x, np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6))
    p.run()
    return [p.read(t) for t in grads]


def test_checkpointed_gradients_are_the_same_bits():
    for a, b in zip(mlp_grads(False), mlp_grads(True)):
        np.testing.assert_array_equal(a, b)


def test_fsdp_wrap_and_shard_batch_marks():
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    g = libspmd.Graph()
    x = g.input("x", (16, 8))
    y = g.input("y", (16, 4))
    w = g.param("w", (4, 8))
    b = g.param("b", (4,))
    loss = g.mse(g.add(g.matmul(x, w, trans_b=True), b), y)
    g.fsdp_wrap(mesh, "fsdp", [x], data_axes=("replica", "fsdp"))
    g.shard_batch(mesh, [y], "replica")
    assert w.sharding == "None, fsdp" or w.sharding == "fsdp, None"
    assert x.sharding == "(replica, fsdp), None" and y.sharding == "replica, None"
    assert g.mesh is mesh
    g.clear_sharding(y)
    assert y.sharding == ""


def test_copies_along_an_independent_axis():
    mesh = libspmd.Mesh((2, 2), ("copy", "data"))
    mesh.set_axis_independent("copy")
    assert mesh.is_axis_independent(0) and mesh.copies == 2
    g = libspmd.Graph()
    x = g.input("x", (4, 3))
    w = g.param("w", (2, 3), init="normal", scale=1.0)
    out = g.sum(g.matmul(x, w, trans_b=True))
    g.mark_sharding(x, mesh, ("data", None))
    g.mark_output(out)
    with pytest.raises(ValueError, match="copy_seeds: 1 seeds for 2 copies"):
        g.compile(copy_seeds=[1])
    p = g.compile(copy_seeds=[1, 2])
    assert p.copies == 2 and p.devices == 4
    assert not np.array_equal(p.read(w, copy=0), p.read(w, copy=1))
    p.write(w, np.ones((2, 3), np.float32), copy=1)
    p.set_input(x, np.ones((4, 3), np.float32))
    p.run()
    np.testing.assert_array_equal(p.read(w, copy=1), np.ones((2, 3)))
    assert float(p.read(out, copy=1)) == 24.0


def test_new_elementwise_builders_compute_torch_formulas():
    v = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    g = libspmd.Graph()
    x = g.input("x", (3, 4))
    cond = g.input("cond", (3, 1))
    outs = {name: getattr(g, name)(x) for name in ("gelu_erf", "silu", "sigmoid")}
    outs["pow"] = g.pow_scalar(x, 3.0)
    outs["where"] = g.where(cond, x, g.fill((), -1.0))
    for t in outs.values():
        g.mark_output(t)
    p = g.compile()
    p.set_input(x, v)
    p.set_input(cond, np.array([[1], [0], [1]], np.float32))
    p.run()
    from math import erf
    want_gelu = np.array([0.5 * a * (1 + erf(a / np.sqrt(2))) for a in v.ravel()]).reshape(3, 4)
    np.testing.assert_allclose(p.read(outs["gelu_erf"]), want_gelu, rtol=1e-5, atol=1e-6)
    sig = 1 / (1 + np.exp(-v.astype(np.float64)))
    np.testing.assert_allclose(p.read(outs["sigmoid"]), sig, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p.read(outs["silu"]), v * sig, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p.read(outs["pow"]), v.astype(np.float64) ** 3, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(p.read(outs["where"])[1], -1.0)
    np.testing.assert_array_equal(p.read(outs["where"])[0], v[0])


def test_optimizer_groups_give_each_group_its_lr_and_settings():
    g = libspmd.Graph()
    x = g.input("x", (4, 3))
    w = g.param("w", (2, 3), init="normal", scale=0.5)
    b = g.param("b", (2,), init="ones")
    loss = g.mean(g.add(g.matmul(x, w, trans_b=True), b))
    g.grad(loss)
    lrs = g.optimizer_apply_groups("sgd", [{"params": ["w"], "momentum": 0.9},
                                           {"params": ["b"], "weight_decay": 0.5}], clip_norm=0)
    assert [t.name for t in lrs] == ["lr", "lr.1"]
    assert g.find("w.momentum") is not None and g.find("b.momentum") is None
    p = g.compile(seed=3)
    w0, b0 = p.read(w), p.read(b)
    p.set_input(x, np.ones((4, 3), np.float32))
    p.set_input(lrs[0], np.array(0.0, np.float32))  # group 0 frozen by its lr
    p.set_input(lrs[1], np.array(0.1, np.float32))
    p.run()
    np.testing.assert_array_equal(p.read(w), w0)
    # d loss / d b = 1/2 each; plus the L2 decay 0.5 * b
    np.testing.assert_allclose(p.read(b), b0 - 0.1 * (0.5 + 0.5 * b0), rtol=1e-6)


def test_optimizer_kinds_and_settings_by_keyword():
    """Each kind's settings by name, in optimizer_apply and in a group's
    dict; Adagrad's sum starts at its initial accumulator (init
    'constant'), a frozen parameter gets no state."""
    g = libspmd.Graph()
    x = g.input("x", (4, 3))
    w = g.param("w", (2, 3), init="normal", scale=0.5)
    f = g.param("f", (2,), init="constant", scale=0.25)
    g.param_freeze(f)
    assert f.is_param and f.is_frozen and not w.is_frozen
    g.grad(g.mean(g.add(g.matmul(x, w, trans_b=True), f)))
    assert f.grad is None and g.param_count == 6
    g.optimizer_apply("adagrad", lr_decay=0.1, initial_accumulator_value=0.5, eps=1e-6, maximize=True)
    assert g.find("w.sum") is not None and g.find("f.sum") is None
    p = g.compile(seed=1)
    np.testing.assert_array_equal(p.read("w.sum"), np.full((2, 3), 0.5, np.float32))
    np.testing.assert_array_equal(p.read(f), np.full((2,), 0.25, np.float32))

    g = libspmd.Graph()
    w = g.param("w", (2,), init="ones")
    b = g.param("b", (2,), init="ones")
    g.grad(g.sum(g.mul(g.mul(w, b), w)))
    g.optimizer_apply_groups("rmsprop", [
        {"params": ["w"], "momentum": 0.9, "centered": True, "alpha": 0.9, "eps": 1e-6},
        {"params": ["b"], "weight_decay": 0.1, "maximize": True}])
    assert {t.name for t in g.tensors() if t.op == "state"} >= {
        "w.square_avg", "w.grad_avg", "w.momentum", "b.square_avg"}
    assert g.find("b.momentum") is None


def test_optimizer_groups_refuse_bad_groups():
    g = libspmd.Graph()
    w = g.param("w", (2,), init="ones")
    g.grad(g.sum(g.mul(w, w)))
    with pytest.raises(ValueError, match="key 'lr' is not one of"):
        g.optimizer_apply_groups("adamw", [{"params": ["w"], "lr": 1.0}])
    with pytest.raises(ValueError, match="no 'params'"):
        g.optimizer_apply_groups("adamw", [{}])
    with pytest.raises(ValueError, match="'adamw', 'adam', 'sgd', 'rmsprop' or 'adagrad'"):
        g.optimizer_apply_groups("lamb", [{"params": ["w"]}])
    with pytest.raises(ValueError, match="nope"):
        g.optimizer_apply_groups("adam", [{"params": ["w"]}, {"params": ["nope"]}])


def test_cumsum_runs_either_way_along_an_axis():
    v = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7
    g = libspmd.Graph()
    x = g.input("x", (2, 3, 4))
    fwd, rev = g.cumsum(x, 1), g.cumsum(x, -1, reverse=True)
    g.mark_output(fwd)
    g.mark_output(rev)
    p = g.compile()
    p.set_input(x, v)
    p.run()
    np.testing.assert_array_equal(p.read(fwd), np.cumsum(v, axis=1))
    np.testing.assert_array_equal(p.read(rev), np.flip(np.cumsum(np.flip(v, -1), axis=-1), -1))
