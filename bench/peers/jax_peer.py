#!/usr/bin/env python3
"""JAX's runner of the peers benchmark (system "jax", variant "jit"): the
GPT and the MLP of workloads.py in plain jax.numpy, trained the way a JAX
user writes it.

The training step is one jax.jit-ed function: forward, the mean
cross-entropy, jax.value_and_grad, torch's clip_grad_norm_ (scale =
min(1, CLIP / (norm + 1e-6)), written out because optax's
clip_by_global_norm has no 1e-6 and scales by CLIP / norm) and
optax.adamw, whose update is torch.optim.AdamW's (decoupled decay lr * wd
* p, every weight decayed).  The weights and the optimizer state are
donated (donate_argnums), so XLA updates them in place.

Meshes (the devices are XLA:CPU host devices,
--xla_force_host_platform_device_count set before jax is imported):
  1    one device, no sharding.
  2    Mesh (2,) 'data': the batch split P('data'), the weights replicated.
  4x2  Mesh (4, 2) ('replica', 'fsdp'): every weight's fsdp_dim over 'fsdp',
       its AdamW moments laid out like it, the batch's first dim over
       P(('replica', 'fsdp')).  Only the jit's in/out shardings are given;
       GSPMD partitions the step (JAX's counterpart of libspmd's marks).
  gpt-small-processes: the 4x2 mesh over 2 processes of 4 devices each
       (jax.distributed over localhost, gloo collectives), the weights and
       batches global arrays made with jax.make_array_from_callback; this
       script launches both processes and merges their results.

Precision bf16: the matmuls (the Linears, attention's two, the tied head)
take bf16 copies of their operands and accumulate in f32
(preferred_element_type); weights, gradients, AdamW and every other op
stay f32, as libspmd's --precision bf16.

Threads: XLA:CPU runs the devices' work on a PjRt client pool and their
ops' parallel parts on one Eigen intra-op pool, each of max(PJRT_NPROC,
local devices) threads, PJRT_NPROC defaulting to the CPUs of the affinity
mask; the compiler splits an op into at most that many tasks.  The runner
sets PJRT_NPROC to the thread budget (split between processes).  XLA keeps
at least one thread per device (a collective needs them all running), so
on the 4x2 mesh it is the harness's taskset that holds 8 threads to the
budget's cores.

optax.adamw computes the bias corrections 1 - beta**t in float32 where
torch uses Python floats: the updates differ by ~1e-5 relative, far below
the benchmark's 1e-4 over 20 steps."""
import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time

from workloads import (CLIP, BETAS, EPS, LR, WEIGHT_DECAY, LN_EPS, Run, batch, common_args,
                       fsdp_dim, initial_weights, merge_processes, mesh, workload, write_result)

SYSTEM, VARIANT = "jax", "jit"
# A process of a multi-process run that has not finished by then is stuck.
CHILD_TIMEOUT_S = 1200


def parse_args():
    parser = common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    # Set by the launching process on the processes it starts.
    parser.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def mesh_devices(mesh_name):
    n = 1
    for d in mesh(mesh_name)["shape"]:
        n *= d
    return n


def configure_xla(local_devices, threads):
    """The environment XLA:CPU reads when jax starts: the host devices and
    the thread pools' size."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={local_devices}").strip()
    os.environ["PJRT_NPROC"] = str(threads)


def threads_note(threads, local_devices, processes, budget):
    pool = max(threads, local_devices)
    per = f" in each of {processes} processes" if processes > 1 else ""
    return (f"taskset on {budget} CPUs; PJRT_NPROC={threads}: XLA:CPU's Eigen intra-op and PjRt "
            f"client pools {pool} threads each{per} (at least one per device), ops split into "
            f"at most {pool} tasks")


def error_line(exc):
    text = str(exc).strip()
    last = text.splitlines()[-1] if text else ""
    return f"{type(exc).__name__}: {last}" if last else type(exc).__name__


def identity(args, w):
    return dict(system=SYSTEM, variant=args.variant or VARIANT, workload=args.workload,
                mesh=args.mesh, precision=args.precision, processes=w["processes"])


# --- the models ---------------------------------------------------------

def build_model(jnp, jax, model, shape, precision):
    """loss(params, inputs, targets) of the workload's model, params a dict
    of torch-layout weights under nanoGPT's names."""
    if precision == "bf16":
        def matmul(a, b):
            return jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                              preferred_element_type=jnp.float32)
    else:
        def matmul(a, b):
            return jnp.matmul(a, b, preferred_element_type=jnp.float32)

    def linear(p, name, x):
        return matmul(x, p[name + ".weight"].T) + p[name + ".bias"]

    def gelu(x):
        return jax.nn.gelu(x, approximate=True)

    def cross_entropy(logits, targets):
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    if model == "mlp":
        layers = shape["layers"] + 1

        def loss(p, x, targets):
            for i in range(layers):
                x = linear(p, f"fc.{i}", x)
                if i < layers - 1:
                    x = gelu(x)
            return cross_entropy(x, targets)
        return loss

    c, heads = shape["dim"], shape["heads"]
    d_head = c // heads

    def layer_norm(p, name, x):
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + LN_EPS) * p[name + ".weight"] + p[name + ".bias"]

    def attention(p, name, x):
        b, t, _ = x.shape
        q, k, v = jnp.split(linear(p, name + ".c_attn", x), 3, axis=-1)
        q, k, v = (a.reshape(b, t, heads, d_head).transpose(0, 2, 1, 3) for a in (q, k, v))
        att = matmul(q, k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(d_head))
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
        y = matmul(att, v).transpose(0, 2, 1, 3).reshape(b, t, c)
        return linear(p, name + ".c_proj", y)

    def loss(p, idx, targets):
        t = idx.shape[1]
        x = p["wte.weight"][idx] + p["wpe.weight"][:t]
        for i in range(shape["layers"]):
            h = f"h.{i}."
            x = x + attention(p, h + "attn", layer_norm(p, h + "ln_1", x))
            x = x + linear(p, h + "mlp.c_proj",
                           gelu(linear(p, h + "mlp.c_fc", layer_norm(p, h + "ln_2", x))))
        x = layer_norm(p, "ln_f", x)
        return cross_entropy(matmul(x, p["wte.weight"].T), targets)
    return loss


def build_step(jax, jnp, optax, loss_fn):
    """One training step: loss and gradients, torch's clipping, AdamW."""
    optimizer = optax.adamw(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WEIGHT_DECAY)

    def step(params, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets)
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
        scale = jnp.minimum(1.0, CLIP / (norm + 1e-6))
        grads = jax.tree.map(lambda g: g * scale, grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return optimizer, step


# --- one process's run ---------------------------------------------------

def run_workload(args, w, steps):
    """Trains in this process (one of several when --process-id is set);
    returns run.result() and the versions."""
    import jax
    if args.process_id is not None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=args.coordinator,
                                   num_processes=w["processes"], process_id=args.process_id)
    import jax.numpy as jnp
    import jaxlib
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "optax": optax.__version__}
    model, shape = w["model"], w["shape"]
    weights = initial_weights(model, shape)
    loss_fn = build_model(jnp, jax, model, shape, args.precision)
    optimizer, step = build_step(jax, jnp, optax, loss_fn)

    if args.mesh == "1":
        device = jax.devices()[0]
        params = {k: jax.device_put(v, device) for k, v in weights.items()}
        opt_state = jax.jit(optimizer.init)(params)
        train = jax.jit(step, donate_argnums=(0, 1))

        def put_batch(x):
            return jax.device_put(x, device)
    else:
        spec = mesh(args.mesh)
        # Mesh order is process order: process i holds the i-th slice.
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        dev_mesh = Mesh(np.array(devices).reshape(spec["shape"]), spec["axes"])
        replicated = NamedSharding(dev_mesh, P())
        if args.mesh == "4x2":
            fsdp = dev_mesh.shape["fsdp"]
            batch_sharding = NamedSharding(dev_mesh, P(("replica", "fsdp")))

            def weight_sharding(s):
                dim = fsdp_dim(s, fsdp)
                if dim is None:
                    return replicated
                return NamedSharding(dev_mesh, P(*[("fsdp" if i == dim else None) for i in range(len(s))]))
        else:
            batch_sharding = NamedSharding(dev_mesh, P("data"))

            def weight_sharding(s):
                return replicated
        param_sh = {k: weight_sharding(v.shape) for k, v in weights.items()}

        def global_array(value, sharding):
            return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

        params = {k: global_array(v, param_sh[k]) for k, v in weights.items()}
        # The AdamW moments are laid out like their weight; the step count
        # is replicated.
        state_shapes = jax.eval_shape(optimizer.init, params)

        def state_sharding(path, _):
            key = getattr(path[-1], "key", None) if path else None
            return param_sh.get(key, replicated)
        opt_sh = jax.tree_util.tree_map_with_path(state_sharding, state_shapes)
        opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(params)
        train = jax.jit(step, donate_argnums=(0, 1),
                        in_shardings=(param_sh, opt_sh, batch_sharding, batch_sharding),
                        out_shardings=(param_sh, opt_sh, replicated))

        def put_batch(x):
            return global_array(x, batch_sharding)

    jax.block_until_ready((params, opt_state))
    run = Run()
    run.ready()
    for s in range(steps):
        inputs, targets = batch(model, shape, w["batch"], s)
        inputs, targets = put_batch(inputs), put_batch(targets)
        if s > 0:
            run.start_step()
        params, opt_state, loss = train(params, opt_state, inputs, targets)
        run.step_done(float(loss))
    return dict(run.result(), versions=versions)


# --- the launcher of a multi-process run ---------------------------------

def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_processes(args, w):
    """Starts the run's processes on a localhost coordinator, waits for all
    (killing the others when one fails or time runs out) and returns their
    results in process order."""
    n = w["processes"]
    coordinator = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="jax-peer-") as tmp:
        children = []
        for i in range(n):
            out = os.path.join(tmp, f"result{i}.json")
            log = open(os.path.join(tmp, f"log{i}.txt"), "w+")
            cmd = [sys.executable, os.path.abspath(__file__)] + child_argv(args) + [
                "--process-id", str(i), "--coordinator", coordinator, "--out", out]
            children.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), out, log))
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        failure = None
        while failure is None and any(p.poll() is None for p, _, _ in children):
            for i, (p, out, log) in enumerate(children):
                if failure is None and p.poll() not in (None, 0):
                    failure = f"process {i} exited with {p.returncode}: {last_log_line(log)}"
            if failure is None and time.monotonic() > deadline:
                failure = f"processes did not finish in {CHILD_TIMEOUT_S} s"
            time.sleep(0.2)
        for p, _, _ in children:
            if p.poll() is None:
                p.kill()
            p.wait()
        results = []
        for i, (p, out, log) in enumerate(children):
            if failure is None and p.returncode != 0:
                failure = f"process {i} exited with {p.returncode}: {last_log_line(log)}"
            log.close()
            if failure is None:
                with open(out) as f:
                    results.append(json.load(f))
        if failure is not None:
            raise RuntimeError(failure)
        return results


def child_argv(args):
    argv = ["--workload", args.workload, "--mesh", args.mesh, "--precision", args.precision,
            "--steps", str(args.steps), "--threads", str(args.threads)]
    if args.quick:
        argv.append("--quick")
    if args.variant:
        argv += ["--variant", args.variant]
    return argv


def last_log_line(log):
    log.flush()
    log.seek(0)
    lines = [line.strip() for line in log.read().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def main():
    args = parse_args()
    w = workload(args.workload, args.quick)
    steps = args.steps or w["steps"]
    processes = w["processes"]
    local_devices = mesh_devices(args.mesh) // processes
    threads = max(1, args.threads // processes)
    ident = identity(args, w)
    note = threads_note(threads, local_devices, processes, args.threads)

    if args.process_id is not None:
        # One process of a multi-process run: its own result, or its error,
        # for the launcher to read.
        configure_xla(local_devices, threads)
        try:
            result = run_workload(args, w, steps)
        except Exception as exc:  # the system's failure, reported as such
            print(error_line(exc), file=sys.stderr)
            sys.exit(1)
        write_result(args.out, **result)
        return

    if args.variant not in (None, VARIANT):
        write_result(args.out, **ident, threads=note, versions={},
                     error=f"unknown variant {args.variant!r} (jax runs 'jit')")
        return
    try:
        if processes > 1:
            results = run_processes(args, w)
            versions = results[0].pop("versions")
            for r in results[1:]:
                r.pop("versions")
            result = merge_processes(results)
        else:
            configure_xla(local_devices, threads)
            result = run_workload(args, w, steps)
            versions = result.pop("versions")
    except Exception as exc:  # the system's failure, reported as such
        write_result(args.out, **ident, threads=note, versions=jax_versions(), error=error_line(exc))
        return
    write_result(args.out, **ident, threads=note, versions=versions, **result)


def jax_versions():
    try:
        from importlib.metadata import version
        return {name: version(name) for name in ("jax", "jaxlib", "optax")}
    except Exception:
        return {}


if __name__ == "__main__":
    main()
