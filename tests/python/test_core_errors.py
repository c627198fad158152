"""Every failure raises a libspmd.Error with libspmd's message, of the class
of its status and also the built-in exception of its kind: ValueError for
invalid input, shapes and unsupported requests (NotImplementedError too),
MemoryError, OSError for files, TimeoutError for the collective watchdog,
RuntimeError otherwise; and nothing crashes the interpreter (None tensors,
closed graphs and programs, wrong types, wrong arrays)."""
import gc
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import libspmd


def small():
    g = libspmd.Graph()
    x = g.input("x", (4, 8))
    w = g.param("w", (3, 8), init="normal", scale=0.1)
    y = g.matmul(x, w, trans_b=True)
    loss = g.mean(g.mul(y, y))
    g.mark_output(loss)
    return g, x, w, loss


def test_bad_spec_is_value_error_with_the_specs_message():
    g, x, w, loss = small()
    mesh = libspmd.Mesh((4, 2), ("replica", "fsdp"))
    with pytest.raises(ValueError) as e:
        g.mark_sharding(w, mesh, "fsdp, tensor")
    assert "unknown axis 'tensor'" in str(e.value) and "fsdp, tensor" in str(e.value)
    assert e.value.status == "invalid argument"
    with pytest.raises(ValueError, match="rank"):
        g.mark_sharding(w, mesh, ("fsdp",))  # one entry for a 2-D tensor
    with pytest.raises(ValueError, match="out of range"):
        g.mark_sharding(w, mesh, (5, None))  # no axis 5
    with pytest.raises(TypeError, match="partition spec"):
        g.mark_sharding(w, mesh, (1.5, None))
    # An axis index is the axis of that position.
    g.mark_sharding(w, mesh, (1, None))
    assert w.sharding == "fsdp, None"
    with pytest.raises(ValueError, match="unknown axis"):
        libspmd.mark_sharding(x, mesh, ("data", None))


def test_shape_mismatch_names_the_shapes():
    g = libspmd.Graph()
    a = g.input("a", (4, 8))
    b = g.input("b", (9, 3))
    with pytest.raises(ValueError, match=r"matmul: contracted dims differ .*\[4, 8\] and \[9, 3\]") as e:
        g.matmul(a, b)
    assert e.value.status == "shape mismatch"
    # A later failure on the same graph raises its own message and kind.
    with pytest.raises(ValueError, match="dtype bf16; inputs, parameters and state are f32 or i32") as e:
        g.input("c", (2,), "bf16")
    assert e.value.status == "unsupported"
    # None is the C API's NULL operand: the graph's first failure again.
    with pytest.raises(ValueError, match="matmul: contracted dims differ"):
        g.add(None, a)
    with pytest.raises(ValueError, match="matmul: contracted dims differ"):
        g.check()
    fresh = libspmd.Graph()
    with pytest.raises(ValueError, match="operand 0 is NULL"):
        fresh.exp(None)
    with pytest.raises(ValueError, match="operand 0 is NULL"):
        fresh.check()  # the NULL operand is fresh's first failure


def test_the_classes_of_the_statuses():
    # Each status its class, each class a libspmd.Error and the built-in
    # exception callers caught before the classes existed.
    kinds = {libspmd.InvalidError: ((ValueError,), "invalid argument"),
             libspmd.ShapeError: ((ValueError,), "shape mismatch"),
             libspmd.UnsupportedError: ((NotImplementedError, ValueError), "unsupported"),
             libspmd.OutOfMemoryError: ((MemoryError,), "out of memory"),
             libspmd.FileError: ((OSError,), "i/o error"),
             libspmd.BackendError: ((RuntimeError,), "backend error"),
             libspmd.InternalError: ((RuntimeError,), "internal error"),
             libspmd.CollectiveTimeoutError: ((TimeoutError,), "timed out")}
    for cls, (builtins, status) in kinds.items():
        assert issubclass(cls, libspmd.Error) and all(issubclass(cls, b) for b in builtins), cls
        assert cls.status == status, (cls, cls.status)
    assert issubclass(libspmd.ShapeError, libspmd.InvalidError) and libspmd.Error.status is None

    g = libspmd.Graph()
    a, b = g.input("a", (4, 8)), g.input("b", (9, 3))
    with pytest.raises(libspmd.ShapeError) as e:
        g.matmul(a, b)
    assert e.value.status == "shape mismatch"
    with pytest.raises(libspmd.UnsupportedError) as e:
        g.input("c", (2,), "bf16")  # a C refusal: caught as NotImplementedError or ValueError
    assert isinstance(e.value, NotImplementedError) and isinstance(e.value, ValueError)
    with pytest.raises(libspmd.InvalidError, match="belongs to another graph"):
        libspmd.Graph().exp(a)  # the binding's own check


def test_argument_checks_of_the_binding():
    g, x, w, loss = small()
    with pytest.raises(TypeError, match="expected a libspmd Tensor, got int"):
        g.add(1, x)
    with pytest.raises(ValueError, match="belongs to another graph"):
        libspmd.Graph().exp(x)
    with pytest.raises(ValueError, match="permute: 1 entries for a tensor of rank 2"):
        g.permute(x, (0,))
    with pytest.raises(ValueError, match="axis 5 is out of range"):
        g.sum(x, 5)
    with pytest.raises(ValueError, match="at most 6 dimensions"):
        g.input("big", (1,) * 7)
    with pytest.raises(ValueError, match="init 'gauss'"):
        g.param("p", (2,), init="gauss")
    with pytest.raises(ValueError, match="dtype"):
        g.input("f64", (2,), np.float64)
    with pytest.raises(ValueError, match="optimizer kind 'lamb'"):
        g.optimizer_apply("lamb")
    with pytest.raises(ValueError, match="axis names"):
        libspmd.Mesh((4, 2), ("replica",))
    with pytest.raises(ValueError, match="device_ids: 3 ids for a mesh of 8 devices"):
        libspmd.Mesh((4, 2), ("replica", "fsdp"), device_ids=(0, 1, 2))
    with pytest.raises(ValueError):
        libspmd.Mesh((4, 2), ("replica", "fsdp"), device_ids=(0,) * 8)  # not a permutation
    with pytest.raises(ValueError):
        libspmd.Mesh("4x", "replica")
    with pytest.raises(TypeError):
        libspmd.Tensor()
    with pytest.raises(TypeError):
        libspmd.Program()
    # Sums and means take ints, tuples or None; max a negative axis.
    assert g.sum(x, (0, 1)).shape == () and g.mean(x, -1, keepdim=True).shape == (4, 1)
    assert g.max(x, -1).shape == (4,) and g.sum(x).shape == ()


def test_optimizer_settings_of_the_other_kind_are_refused():
    g, x, w, loss = small()
    g.grad(loss)
    with pytest.raises(ValueError, match="SGD|sgd"):
        g.optimizer_apply("sgd", betas=(0.9, 0.99))
    opt = g.optimizer_apply("sgd", momentum=0.9)
    assert opt.lr.name == "lr" and opt.grad_norm.name == "opt.grad_norm" and opt.weight_decay is None
    lr, norm, decay = opt
    assert lr == opt.lr


def test_collective_timeout_is_a_compile_option():
    # The watchdog's limit reaches the C side: on, off, the default; the
    # same losses either way (it only watches the waits).
    losses = []
    for timeout in (0, 2.5, -1):
        g, x, w, loss = small()
        mesh = libspmd.Mesh((2,), ("data",))
        g.mark_sharding(x, mesh, ("data", None))
        with g.compile(seed=1, collective_timeout=timeout) as p:
            p.set_input(x, np.arange(32, dtype=np.float32).reshape(4, 8) / 32)
            p.run()
            losses.append(float(p.read(loss)))
    assert losses[0] == losses[1] == losses[2]
    with pytest.raises(TypeError):
        small()[0].compile(collective_timeout="soon")


def test_compile_numbers_are_checked_as_the_tool_checks_its_flags():
    # The tool refuses --seed 18446744073709551616, --threads -1 and
    # --collective-timeout nan naming the flag and the value; compile()
    # refuses the same values in the same words, naming the argument,
    # instead of wrapping the seed to 0 or taking the defaults.
    refused = [
        (dict(seed=2**64), "compile: seed wants an integer from 0 to 18446744073709551615, "
                           "got 18446744073709551616"),
        (dict(seed=-1), "compile: seed wants an integer from 0 to 18446744073709551615, got -1"),
        (dict(threads=-1), r"compile: threads wants an integer from 0 \(every core\) to 2147483647, "
                           r"got -1"),
        (dict(threads=2**40), r"compile: threads wants an integer from 0 \(every core\) to "
                              r"2147483647, got 1099511627776"),
        (dict(inflight_bytes=-1), r"compile: inflight_bytes wants an integer from 0 \(the default\) "
                                  r"to 9223372036854775807, got -1"),
        (dict(copy_seeds=(2**64,)), "compile: copy_seeds\\[0\\] wants an integer from 0 to "
                                    "18446744073709551615, got 18446744073709551616"),
    ]
    for value in (float("nan"), float("inf"), -float("inf"), 1e8, -1e8):
        refused.append((dict(collective_timeout=value),
                        r"compile: collective_timeout_s wants a number from -1e\+07 to 1e\+07 "
                        rf"\(included\), got {re.escape(f'{value:g}')}"))
    for options, message in refused:
        g = small()[0]
        with pytest.raises(libspmd.InvalidError, match=message) as e:
            g.compile(**options)
        assert isinstance(e.value, ValueError)
    # The ends of each range are taken, as the tool takes them.
    g, x, w, loss = small()
    for options in (dict(seed=2**64 - 1), dict(seed=0, threads=1, collective_timeout=1e7),
                    dict(collective_timeout=-1e7), dict(copy_seeds=(2**64 - 1,))):
        with g.compile(**options):
            pass
    with pytest.raises(TypeError):
        g.compile(seed=1.5)
    with pytest.raises(TypeError):
        g.compile(threads="2")


def test_arrays_are_checked_against_the_tensor():
    g, x, w, loss = small()
    p = g.compile(seed=1)
    with pytest.raises(ValueError, match=r"set_input 'x': an array of shape \(3, 8\) for a tensor of shape \(4, 8\)"):
        p.set_input(x, np.ones((3, 8), np.float32))
    with pytest.raises(ValueError, match="an array of float64 for a tensor of float32"):
        p.set_input(x, np.ones((4, 8)))
    with pytest.raises(ValueError, match="write 'w': an array of shape"):
        p.write(w, np.ones((8, 3), np.float32))
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        p.read("nope")
    with pytest.raises(ValueError, match="run: input 'x' was never set") as e:
        p.run()
    assert e.value.status == "invalid argument"
    p.set_input("x", [[1.0] * 8] * 4)  # a list is converted to the tensor's dtype
    p.run()
    assert np.isfinite(p.read(loss))
    with pytest.raises(ValueError, match="plan_only"):
        g.compile(plan_only=True).run()


def test_files_raise_os_error(tmp_path):
    g, x, w, loss = small()
    p = g.compile(seed=1)
    with pytest.raises(OSError, match="neither a latest file nor an index.json") as e:
        p.load(str(tmp_path / "missing"))
    assert e.value.status == "i/o error"
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match="cannot create directory"):
        p.save(str(blocker / "ckpt"))
    # And a checkpoint round trip through the same calls.
    before = p.read(w)
    p.save(tmp_path / "ckpt", step=7, meta_json='{"note": 1}')
    p.write(w, np.zeros_like(before))
    step, meta = p.load(tmp_path / "ckpt")
    assert step == 7 and '"note"' in meta
    np.testing.assert_array_equal(p.read(w), before)


def test_allocation_failure_is_memory_error():
    g = libspmd.Graph()
    w = g.param("w", (1 << 20, 1 << 22))  # 16 TiB
    g.mark_output(g.sum(w))
    with pytest.raises(MemoryError, match="out of memory allocating .* bytes for w"):
        g.compile()


def test_backend_failure_is_runtime_error():
    # A BLAS that cannot load fails every later run of the process: so in
    # a process of its own.
    code = ("import libspmd\n"
            "try:\n"
            "    libspmd.blas_select('/nonexistent/libcblas.so')\n"
            "except RuntimeError as e:\n"
            "    print('RuntimeError', e.status)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "RuntimeError backend error"


def test_closed_handles_and_lifetimes():
    g, x, w, loss = small()
    p = g.compile(seed=1)
    with pytest.raises(libspmd.InvalidError, match="1 open program: close them first"):
        g.close()
    p.close()
    p.close()  # twice is fine
    with pytest.raises(ValueError, match="the program is closed"):
        p.run()
    g.close()
    assert g.closed and p.closed
    with pytest.raises(ValueError, match="the graph is closed"):
        g.exp(x)
    with pytest.raises(ValueError, match="graph is closed"):
        x.shape
    with pytest.raises(ValueError, match="the graph is closed"):
        g.compile()
    assert "closed graph" in repr(x)

    # A Tensor keeps its Graph alive, a Program its Graph, a Graph its Mesh.
    def orphan():
        g, x, w, loss = small()
        mesh = libspmd.Mesh((2,), ("data",))
        g.mark_sharding(x, mesh, ("data", None))
        return g.compile(seed=1), x, loss

    p, x, loss = orphan()
    gc.collect()
    p.set_input(x, np.ones((4, 8), np.float32))
    p.run()
    assert np.isfinite(p.read(loss)) and p.graph.mesh.devices() == 2
    with libspmd.Graph() as g2:
        t = g2.input("t", (2,))
    assert g2.closed
    with pytest.raises(ValueError):
        t.name

    # A cycle through a subclass's __dict__ is collected without a crash,
    # the program freed before its graph.
    class Holder(libspmd.Graph):
        pass

    h = Holder()
    h.keep = [h.input("a", (2,)), None]
    h.mark_output(h.keep[0])
    h.keep[1] = h.compile()
    h.prog = h.keep[1]
    del h
    assert gc.collect() > 0


_NARROW = """
import warnings
import numpy as np
import libspmd
g = libspmd.Graph()
x = g.input("x", (4, 8))
w = g.param("w", (3, 8), init="normal", scale=0.1)
g.mark_output(g.mean(g.matmul(x, w, trans_b=True)))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    p = g.compile(seed=1)
    p.set_input(x, np.ones((4, 8), np.float32))
    p.run()
print("DESCRIBED", libspmd.blas_describe())
for w in caught:
    print("WARNED", w.category.__name__, w.message)
"""


def _run_narrow(core):
    env = dict(os.environ, OPENBLAS_CORETYPE=core)
    out = subprocess.run([sys.executable, "-c", _NARROW], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_an_openblas_loaded_before_with_narrow_kernels_is_named_and_warned():
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx512f" not in flags:
        pytest.skip("the warning is for CPUs with AVX-512 kernels")
    out = _run_narrow("Prescott")
    if "loaded before libspmd" not in out:
        pytest.skip("NumPy does not load OpenBLAS here: libspmd chose its own core")
    assert "OpenBLAS" in out and "(Prescott, loaded before libspmd; this CPU fits" in out
    assert "WARNED RuntimeWarning libspmd: GEMMs run on OpenBLAS" in out
    assert "set OPENBLAS_CORETYPE=" in out
    # With the core that fits, nothing to say.
    fits = out.split("this CPU fits ")[1].split(":")[0]
    out = _run_narrow(fits)
    assert "loaded before libspmd" not in out and "WARNED" not in out, out
