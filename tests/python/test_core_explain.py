"""explain() and explain_text() (the library's text, which the spmd tool
prints too) of an FSDP-in-replicas MLP on a 4x2 mesh ('replica', 'fsdp'):
the weights gathered over 'fsdp'; with ZeRO (the
default) each gradient reduce-scattered over both axes, the optimizer
state split over both and the new weights all-gathered over 'replica';
without it the gradients reduce-scattered over 'fsdp', then all-reduced
over 'replica'; and visualize's picture."""
import libspmd
import pytest

from test_core_mlp import build_mlp, train_step_graph


@pytest.fixture(scope="module")
def planned():
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    g, x, targets, loss, opt = train_step_graph(build_mlp, mesh)
    p = g.compile(plan_only=True)
    return g, p


def test_explain_without_zero():
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    g, x, targets, loss, opt = train_step_graph(build_mlp, mesh, shard_state=False)
    r = g.compile(plan_only=True).explain()
    tensors = {t["name"]: t for t in r["tensors"]}
    assert tensors["fc.0.weight.exp_avg"]["sharding"] == "fsdp, None"
    kinds = {(c["phase"], c["kind"], tuple(c["axes"]), c["value"]) for c in r["collectives"]}
    assert ("update", "reduce-scatter", ("fsdp",), "fc.0.weight.grad") in kinds
    assert ("update", "all-reduce", ("replica",), "fc.0.weight.grad") in kinds
    assert not any(c["phase"] == "update" and c["kind"] == "all-gather" for c in r["collectives"])


def test_explain_dict(planned):
    g, p = planned
    r = p.explain()
    assert r["mesh"] == {"shape": [4, 2], "axes": ["replica", "fsdp"]}
    assert r["devices"] == 8 and r["params"] == g.param_count
    tensors = {t["name"]: t for t in r["tensors"]}
    assert tensors["fc.0.weight"] == {"name": "fc.0.weight", "shape": [32, 16], "sharding": "fsdp, None"}
    assert tensors["fc.0.weight.exp_avg"]["sharding"] == "(fsdp, replica), None"
    assert tensors["input"]["sharding"] == "(replica, fsdp), None"
    assert "partial(replica, fsdp)" in tensors["fc.0.weight.grad"]["sharding"]

    kinds = {(c["phase"], c["kind"], tuple(c["axes"]), c["value"]) for c in r["collectives"]}
    assert ("forward", "all-gather", ("fsdp",), "fc.0.weight") in kinds
    assert ("backward", "all-gather", ("fsdp",), "fc.1.weight") in kinds
    assert ("update", "reduce-scatter", ("fsdp", "replica"), "fc.0.weight.grad") in kinds
    assert not any(c["kind"] == "all-reduce" and c["value"] == "fc.0.weight.grad"
                   for c in r["collectives"])
    # The new weights come back over 'replica'.
    assert any(c["phase"] == "update" and c["kind"] == "all-gather" and c["axes"] == ["replica"]
               for c in r["collectives"])
    for c in r["collectives"]:
        assert c["bytes"] > 0 and c["seconds"] > 0 and c["count"] >= 1
    # A gradient [32, 16] of f32 reduce-scattered over the pair: its whole 2 KiB.
    rs = [c for c in r["collectives"] if c["kind"] == "reduce-scatter" and c["value"] == "fc.0.weight.grad"]
    assert rs[0]["bytes"] == 32 * 16 * 4

    mem = r["memory"]
    assert mem["peak_bytes"] == p.peak_bytes > 0
    assert mem["param_bytes"] == p.persistent_bytes + p.param_bytes
    assert len(mem["per_device"]) == 8
    assert r["fallbacks"] == [] and r["propagation_unsettled_rounds"] == 0


def test_explain_text_layout(planned):
    g, p = planned
    text = p.explain_text()
    lines = text.splitlines()
    assert lines[0].startswith("spmd explain: graph, 0.00M parameters, mesh 4x2 (replica, fsdp)")
    assert "tensors (named):" in lines
    n = len(p.collectives())
    assert "collectives per step (%d):" % n in lines
    assert any(l.split() == ["fc.0.weight", "[32,", "16]", "fsdp,", "None"] for l in lines)
    gathers = [l for l in lines if l.split()[:3] == ["forward", "all-gather", "fsdp"]]
    assert gathers and gathers[0].split("  ")[-1].startswith("fc.0.weight")  # ", read in place"
    assert any(l.startswith("memory per device: ") and l.endswith(" peak") for l in lines)
    assert "fallbacks (whole-tensor gathers an op forced): 0" in lines
    # Graph.explain: the same report from a plan-only compile of its own.
    assert g.explain()["collectives"] == p.explain()["collectives"]


def test_explain_one_device():
    g = libspmd.Graph()
    x, targets, loss = build_mlp(g)
    g.mark_output(loss)
    r = g.explain()
    assert r["mesh"] == {"shape": [1], "axes": ["data"]} and r["collectives"] == []
    with g.compile(plan_only=True) as p:
        assert "mesh 1 device" in libspmd.explain_text(p).splitlines()[0]


def test_processes_line():
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    mesh.place_processes(2)
    assert mesh.processes == 2 and not mesh.is_axis_local("replica") and mesh.is_axis_local("fsdp")
    g, *_ = train_step_graph(build_mlp, mesh)
    r = g.explain()
    assert r["mesh"]["processes"] == 2 and r["mesh"]["local"] == [False, True]
    with g.compile(plan_only=True) as p:
        text = p.explain_text()
    assert ("processes: 2 x 4 devices (mesh position r in process r / 4); across processes: replica; "
            "inside a process: fsdp") in text
    assert "network (prices the axes across processes): 25.0 us per message, 1.25 GB/s (set_network)" \
        in text


def test_explain_text_is_the_tools():
    # The text is the library's, as `spmd explain` prints it: the tool's
    # first line with its model and batch, the collectives in flight (a
    # column and a line), the copies along an independent axis.
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    g, *_ = train_step_graph(build_mlp, mesh)
    with g.compile(plan_only=True, overlap=True) as p:
        text = p.explain_text(model="mlp", batch="batch 32")
        lines = text.splitlines()
        assert lines[0].startswith("spmd explain: mlp, 0.00M parameters, mesh 4x2 (replica, fsdp), batch 32")
        assert any("in flight" in l and l.split()[:2] == ["phase", "kind"] for l in lines)
        assert any(l.startswith("  in flight: ") for l in lines)
        assert text == libspmd.explain_text(p).replace("spmd explain: graph,", "spmd explain: mlp,", 1) \
            .replace(" (replica, fsdp)\n", " (replica, fsdp), batch 32\n", 1)
    copies = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    copies.set_axis_independent("replica")
    g = libspmd.Graph()
    x, targets, loss = build_mlp(g)
    g.mark_sharding(x, copies, ("fsdp", None))
    g.mark_output(loss)
    with g.compile(plan_only=True) as p:
        assert ("copies: 4 along 'replica', independent: each group along it trains a model of its own "
                "and no collective crosses it; the plan below is one copy's, on its group") in \
            p.explain_text().splitlines()


def test_visualize():
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    by_text = libspmd.visualize(mesh, "fsdp, None", (8, 6))
    assert by_text == libspmd.visualize(mesh, ("fsdp", None), (8, 6))
    assert "0" in by_text and "7" in by_text and len(by_text.splitlines()) > 2
    split = libspmd.visualize(mesh, (("replica", "fsdp"), None), (8, 6))
    assert split != by_text
    with pytest.raises(ValueError, match="grouped split"):
        libspmd.visualize(mesh, "3*fsdp, None", (12, 6))
