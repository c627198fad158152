#!/usr/bin/env python3
"""Where a traced step's time goes: from a `spmd train --trace FILE`,
each device's time per traced step split by op (compute events, summed
by their op) and collectives (by kind), largest first, and the part of
the ops' time thread 0 spent waiting for the device's other threads to
end them (a "wait" event lies inside its node's).

    scripts/trace-breakdown.py FILE [--top N]

The figures are per device per step, averaged over the devices and the
traced steps; what no event covers is shown as "outside the events"."""
import argparse
import collections
import json
import sys


def breakdown(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    steps = [e for e in spans if e.get("cat") == "step"]
    lanes = {(e["pid"], e["tid"]) for e in steps}
    if not steps or not lanes:
        sys.exit(f"{path}: no step events (was it written by spmd train --trace?)")
    n_steps = len(steps) / len(lanes)
    per = len(lanes) * n_steps
    step_us = sum(e["dur"] for e in steps) / len(steps)
    sums = collections.Counter()
    for e in spans:
        cat = e.get("cat")
        if cat == "compute":
            sums[e.get("args", {}).get("op", e["name"])] += e["dur"]
        elif cat in ("collective", "wait", "wake", "update"):
            sums[f"{cat}: {e['name']}" if cat == "collective" else cat] += e["dur"]
    ms = {k: v / per / 1e3 for k, v in sums.items()}
    covered = sum(v for k, v in ms.items() if k not in ("update", "wait"))
    return step_us / 1e3, len(lanes), n_steps, ms, step_us / 1e3 - covered


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    step_ms, devices, n_steps, ms, rest = breakdown(a.trace)
    print(f"{a.trace}: {devices} devices, {n_steps:g} traced steps, {step_ms:.1f} ms a step")
    waited = ms.pop("wait", 0.0)
    ms.pop("update", None)  # the update's ops are among the compute events
    for name, v in sorted(ms.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {name:<34} {v:9.1f} ms  {100 * v / step_ms:5.1f}%")
    print(f"  {'outside the events':<34} {rest:9.1f} ms  {100 * rest / step_ms:5.1f}%")
    print(f"  (of the ops' time, thread 0 waiting for the device's other threads: {waited:.1f} ms)")


if __name__ == "__main__":
    main()
