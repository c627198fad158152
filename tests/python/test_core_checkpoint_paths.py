"""Program.save and Program.load go through the rules and the lock the
tool's --save and --resume do (the library's, shared): a save into a
directory a running `spmd train --save` holds is refused naming that
process, and a save into another checkpoint's step directory is refused;
a save lets go of the lock when done (a run can save there next); a load
refuses a FIFO in the checkpoint at once instead of waiting on it."""
import os
import select
import subprocess
import time

import pytest

import libspmd

BUILD = os.environ.get("SPMD_BUILD_DIR")


def small_program():
    g = libspmd.Graph()
    x = g.input("x", (4, 8))
    w = g.param("w", (3, 8), init="normal", scale=0.1)
    g.mark_output(g.mean(g.matmul(x, w, trans_b=True)))
    return g.compile(seed=1)


def spmd_test():
    path = os.path.join(BUILD or "", "spmd-test")
    if not BUILD or not os.access(path, os.X_OK):
        pytest.skip("spmd-test is not built here (SPMD_BUILD_DIR)")
    return path


def start_paused_run(tool, ckpt):
    """`spmd-test train --save ckpt` stopped inside its save of step 3
    (SPMD_TEST_SAVE_PAUSE): it holds ckpt's lock until killed."""
    env = dict(os.environ, SPMD_TEST_SAVE_PAUSE="3:index.json")
    run = subprocess.Popen([tool, "train", "--model", "mlp", "--steps", "3", "--eval", "0",
                            "--save", str(ckpt)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    said, deadline = "", time.monotonic() + 60
    while "paused after" not in said and time.monotonic() < deadline:
        ready, _, _ = select.select([run.stderr], [], [], 1.0)
        if ready:
            line = run.stderr.readline()
            if not line:
                break
            said += line
    if "paused after" not in said:
        run.kill()
        run.wait()
        pytest.fail("the run never paused in its save:\n" + said)
    return run


def test_save_into_a_directory_a_run_holds_is_refused(tmp_path):
    tool = spmd_test()
    ckpt = tmp_path / "ckpt"
    run = start_paused_run(tool, ckpt)
    try:
        p = small_program()
        with pytest.raises(OSError, match="in use") as e:
            p.save(ckpt, step=9)
        assert f"process {run.pid}" in str(e.value), str(e.value)
        assert not (ckpt / "step-00000009").exists()
    finally:
        run.kill()
        run.wait()
    # Its holder gone, the directory takes the save.
    small_program().save(ckpt, step=9)
    assert (ckpt / "step-00000009" / "index.json").exists()


def test_a_save_lets_go_of_the_lock(tmp_path):
    ckpt = tmp_path / "ckpt"
    p = small_program()
    p.save(ckpt, step=1)
    p.save(ckpt, step=2)  # this process again
    small_program().save(ckpt, step=3)  # and another program of it
    assert (ckpt / "latest").read_text().strip() == "step-00000003"
    tool = spmd_test()
    done = subprocess.run([tool, "train", "--model", "mlp", "--steps", "2", "--eval", "0",
                           "--save", str(tmp_path / "ckpt")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "in use" not in done.stderr, done.stderr


def test_save_into_another_checkpoint_is_refused(tmp_path):
    p = small_program()
    p.save(tmp_path / "ckpt", step=4)
    step_dir = tmp_path / "ckpt" / "step-00000004"
    before = sorted(os.listdir(step_dir))
    with pytest.raises(ValueError, match="inside the checkpoint"):
        p.save(step_dir, step=5)
    with pytest.raises(ValueError, match="inside the checkpoint"):
        p.save(step_dir / "more", step=5)
    assert sorted(os.listdir(step_dir)) == before
    with pytest.raises(OSError, match="not a directory"):
        p.save(tmp_path / "ckpt" / "latest", step=5)


def test_load_refuses_a_fifo_at_once(tmp_path):
    p = small_program()
    p.save(tmp_path / "ckpt", step=4)
    latest = tmp_path / "ckpt" / "latest"
    latest.unlink()
    os.mkfifo(latest)
    with pytest.raises(OSError, match="not a regular file"):
        p.load(tmp_path / "ckpt")
