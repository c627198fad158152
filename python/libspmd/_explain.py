"""The report `spmd explain` prints (tools/explain.c), for a Program: as a
dict built from the public accessors, and as text in the tool's layout."""


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


def _human(n):
    units = ["B", "KiB", "MiB", "GiB"]
    u = 0
    n = float(n)
    while n >= 1024 and u < 3:
        n /= 1024
        u += 1
    return ("%.1f %s" if u else "%.0f %s") % (n, units[u])


def _mesh_text(mesh):
    if mesh["shape"] == [1] and mesh["axes"] == ["data"]:
        return "1 device"
    return "%s (%s)" % ("x".join(str(s) for s in mesh["shape"]), ", ".join(mesh["axes"]))


def explain_text(report):
    """A report of explain() as text, in the layout of `spmd explain`."""
    mesh = report["mesh"]
    out = ["spmd explain: graph, %.2fM parameters, mesh %s" % (report["params"] / 1e6, _mesh_text(mesh))]
    if mesh.get("processes", 1) > 1:
        procs, n = mesh["processes"], report["devices"]
        across = [a for a, local in zip(mesh["axes"], mesh["local"]) if not local]
        inside = [a for a, local in zip(mesh["axes"], mesh["local"]) if local]
        out.append("processes: %d x %d devices (mesh position r in process r / %d); across processes: %s; "
                   "inside a process: %s" % (procs, n // procs, n // procs, ", ".join(across) or "none",
                                             ", ".join(inside) or "none"))
        out.append("network (prices the axes across processes): %.1f us per message, %.2f GB/s (set_network)"
                   % (mesh["network"]["latency_s"] * 1e6, mesh["network"]["bytes_per_s"] / 1e9))
    out.append("")
    out.append("tensors (named):")
    out.append("  %-34s %-18s %s" % ("name", "shape", "sharding"))
    for t in report["tensors"]:
        shape = "[" + ", ".join(str(d) for d in t["shape"]) + "]"
        out.append("  %-34s %-18s %s" % (t["name"], shape, t["sharding"]))
    cs = report["collectives"]
    # With gradient accumulation the forward and backward collectives run
    # once per micro-batch (count), the update's once a step.
    micro = max([c["count"] for c in cs] + [1])
    out.append("")
    out.append("collectives per step (%d):" % len(cs))
    if cs and micro > 1:
        out.append("  a step is %d micro-batches: the forward and backward ones run in each (x %d), "
                   "the update's (the gradients' reductions) once" % (micro, micro))
    times = "x   " if micro > 1 else ""
    if cs:
        out.append("  %-9s %-15s %-16s %12s %9s  %s%s" % ("phase", "kind", "axes", "bytes/device", "est. us",
                                                         times, "moves"))
    for c in cs:
        n = "%-3d " % c["count"] if micro > 1 else ""
        out.append("  %-9s %-15s %-16s %12s %9.1f  %s%s" % (c["phase"], c["kind"], ",".join(c["axes"]),
                                                           _human(c["bytes"]), c["seconds"] * 1e6, n,
                                                           c["value"]))
    total = sum(c["bytes"] * c["count"] for c in cs)
    seconds = sum(c["seconds"] * c["count"] for c in cs)
    if cs and micro > 1:
        per_micro = sum(c["bytes"] for c in cs if c["count"] > 1)
        out.append("  in all: %s per device per step (%s in each micro-batch, %s in the update), about "
                   "%.2f ms by the alpha-beta model"
                   % (_human(total), _human(per_micro), _human(total - per_micro * micro), seconds * 1e3))
    elif cs:
        out.append("  in all: %s per device per step, about %.2f ms by the alpha-beta model"
                   % (_human(total), seconds * 1e3))
    mem = report["memory"]
    out.append("")
    out.append("memory per device: %s parameters + gradients + optimizer state, %s peak"
               % (_human(mem["param_bytes"]), _human(mem["peak_bytes"])))
    out.append("fallbacks (whole-tensor gathers an op forced): %d" % len(report["fallbacks"]))
    out.extend("  " + f for f in report["fallbacks"])
    rounds = report["propagation_unsettled_rounds"]
    if rounds:
        out.append("propagation: not settled after %d rounds (a long chain of unmarked tensors): "
                   "some may stay replicated where more rounds would split them; mark them" % rounds)
    return "\n".join(out) + "\n"
