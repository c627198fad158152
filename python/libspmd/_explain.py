"""The report `spmd explain` prints, for a Program: as a dict built from the
public accessors; its text is the library's (spmd_program_explain, which
the tool prints), Program.explain_text()."""


def _mesh(program):
    mesh = program.graph.mesh
    if mesh is None:
        return {"shape": [1], "axes": ["data"]}
    d = {"shape": list(mesh.shape), "axes": list(mesh.axis_names)}
    if mesh.processes > 1:
        latency, bandwidth = mesh.network()
        d["processes"] = mesh.processes
        d["local"] = [mesh.is_axis_local(a) for a in range(mesh.rank)]
        d["network"] = {"latency_s": latency, "bytes_per_s": bandwidth}
    return d


def explain(program):
    """The plan of a compiled (or plan-only) program as a dict."""
    graph = program.graph
    tensors = [{"name": t.name, "shape": list(t.shape), "sharding": t.sharding or "replicated"}
               for t in graph.tensors() if t.name is not None]
    collectives = [{"phase": c["phase"], "kind": c["kind"], "axes": c["axes"].split(","),
                    "bytes": c["bytes"], "seconds": c["seconds"], "count": c["count"],
                    "value": c["tensor"]} for c in program.collectives()]
    # Gradients are held in their parameter's sharding: one more copy of
    # the parameter bytes beside parameters and optimizer state, as
    # `spmd explain` counts them.
    param_bytes = program.persistent_bytes + program.param_bytes
    peak = program.peak_bytes
    memory = {"param_bytes": param_bytes, "peak_bytes": peak,
              "persistent_bytes": program.persistent_bytes, "arena_bytes": program.arena_bytes,
              "per_device": [{"device": d, "param_bytes": param_bytes, "peak_bytes": peak}
                             for d in range(program.devices)]}
    return {"mesh": _mesh(program), "devices": program.devices, "params": graph.param_count,
            "tensors": tensors, "collectives": collectives, "memory": memory,
            "fallbacks": program.fallbacks(),
            "propagation_unsettled_rounds": program.propagation_unsettled}


def explain_text(program):
    """The report of a compiled (or plan-only) program as text, in the
    layout of `spmd explain`: the library's own text (Program.explain_text)."""
    return program.explain_text()
