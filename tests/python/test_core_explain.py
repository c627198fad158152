"""explain() and explain_text() of an FSDP-in-replicas MLP on a 4x2 mesh
('replica', 'fsdp'): the weights gathered over 'fsdp'; with ZeRO (the
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
    assert gathers and gathers[0].split()[-1] == "fc.0.weight"
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
    assert "mesh 1 device" in libspmd.explain_text(r).splitlines()[0]


def test_processes_line():
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    mesh.place_processes(2)
    assert mesh.processes == 2 and not mesh.is_axis_local("replica") and mesh.is_axis_local("fsdp")
    g, *_ = train_step_graph(build_mlp, mesh)
    r = g.explain()
    assert r["mesh"]["processes"] == 2 and r["mesh"]["local"] == [False, True]
    assert ("processes: 2 x 4 devices (mesh position r in process r / 4); across processes: replica; "
            "inside a process: fsdp") in libspmd.explain_text(r)


def test_visualize():
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    by_text = libspmd.visualize(mesh, "fsdp, None", (8, 6))
    assert by_text == libspmd.visualize(mesh, ("fsdp", None), (8, 6))
    assert "0" in by_text and "7" in by_text and len(by_text.splitlines()) > 2
    split = libspmd.visualize(mesh, (("replica", "fsdp"), None), (8, 6))
    assert split != by_text
    with pytest.raises(ValueError, match="grouped split"):
        libspmd.visualize(mesh, "3*fsdp, None", (12, 6))
