#!/usr/bin/env python3
"""`pip install .` as a user runs it (pyproject.toml): a fresh virtual
environment of the python3 first on PATH, a clean copy of the source (the
files git tracks and the new ones it does not ignore: no build folder),
`pip install` of that copy (pip builds the wheel with scikit-build-core in
an isolated environment: a full build of the library), then from the
environment, with nothing of the source or the build tree in reach:

  - `python -m libspmd` reports the project's version, loaded from the
    environment's site-packages, and each of its lines;
  - README.md's first Python example (a (4, 2) mesh) runs as written;
  - `spmd`, found on the environment's PATH, trains 20 steps, with the
    losses of the build's own tool bit for bit (--compare-tool);
  - the package requires numpy alone, torch>=2 only through the extra
    `torch`, and the install pulled in no torch; `import libspmd.torch`
    without torch says to install libspmd[torch];
  - README.md's PyTorch example runs as written, with the torch of the
    interpreter running this test (the tests' environment) made visible
    to the new one by a .pth file, not installed again (several GB);
    skipped, saying so, where the two Pythons differ;
  - the wheel installed the package and the tool, and no headers, static
    library, pkg-config file or CMake package;
  - the extension module without libspmd.so.0 beside it fails to import
    with the ImportError that says so.

Exits 77 (skipped, saying why) where python3 has no venv or pip, or pip
cannot get the build's requirements (offline).

    test_pip_install.py [--compare-tool BUILD/spmd] [--keep]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SKIP = 77
TRAIN_ARGS = ["train", "--steps", "20"]


class Failed(Exception):
    pass


def run(cmd, timeout=600, **kwargs):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def tail(result, lines=40):
    return "\n".join((result.stdout + result.stderr).splitlines()[-lines:])


def check(condition, what, detail=""):
    if not condition:
        raise Failed(f"{what}\n{detail}".rstrip())
    print(f"ok: {what}", flush=True)


def source_files():
    """The files of a clone (tracked, and new ones git does not ignore);
    without git, the tree less build folders and caches."""
    try:
        listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True)
    except OSError:  # no git
        listed = None
    if listed and listed.returncode == 0:
        return [f for f in listed.stdout.decode().split("\0")
                if f and os.path.isfile(os.path.join(ROOT, f))]
    files = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not (d.startswith("build") or d in (".git", "__pycache__"))]
        files += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names]
    return files


def copy_source(dest):
    for rel in source_files():
        os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), os.path.join(dest, rel))


def build_requirements(source):
    with open(os.path.join(source, "pyproject.toml")) as f:
        found = re.search(r"^requires = \[(.*)\]", f.read(), re.M)
    return re.findall(r'"([^"]+)"', found.group(1))


def losses(out):
    return re.findall(r"^step +\d+/\d+ +loss (\S+)", out, re.M)


def example_blocks(source):
    """README.md's Python examples, in order: libspmd's, then PyTorch's."""
    with open(os.path.join(source, "README.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def torch_site_packages():
    """The folder torch is installed in for this interpreter, or None."""
    try:
        import torch
    except ImportError:
        return None
    return os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))


def test(work, compare_tool):
    python3 = shutil.which("python3")
    if not python3:
        return "no python3 on PATH"
    venv = os.path.join(work, "venv")
    made = run([python3, "-m", "venv", venv])
    if made.returncode != 0:
        return f"{python3} -m venv failed (Debian: apt-get install python3-venv):\n{tail(made, 5)}"
    python, bindir = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin")
    if run([python, "-m", "pip", "--version"]).returncode != 0:
        return f"the virtual environment of {python3} has no pip"
    # Run as from an activated environment, away from the source and build.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=bindir + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=venv,
               CMAKE_BUILD_PARALLEL_LEVEL=env.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    away = os.path.join(work, "run")
    os.makedirs(away)

    source = os.path.join(work, "libspmd")
    copy_source(source)
    needs = build_requirements(source)
    got = run([python, "-m", "pip", "install", *needs], env=env, timeout=900)
    if got.returncode != 0:
        return f"pip cannot install the build's requirements {needs} (offline?):\n{tail(got, 5)}"

    installed = run([python, "-m", "pip", "install", source], env=env, timeout=1800, cwd=away)
    check(installed.returncode == 0, "pip install . builds and installs libspmd", tail(installed))

    def py(code, **kwargs):
        return run([python, "-c", code], env=env, cwd=away, **kwargs)

    with open(os.path.join(source, "CMakeLists.txt")) as f:
        version = re.search(r"project\(libspmd VERSION ([0-9.]+)", f.read()).group(1)
    site = py("import sysconfig; print(sysconfig.get_path('platlib'))").stdout.strip()
    report = run([python, "-m", "libspmd"], env=env, cwd=away)
    lines = report.stdout.splitlines()
    check(report.returncode == 0 and len(lines) == 8, "python -m libspmd reports", tail(report))
    check(lines[0] == f"libspmd {version} ({os.path.join(site, 'libspmd')})",
          "the project's version, loaded from the environment", lines[0])
    for line, start in zip(lines[1:], ("Python ", "CPU: ", "devices: ", "f32 products: ",
                                       "bf16 products: ", "MPI: ", "processes: 1")):
        check(line.startswith(start) and "None" not in line, f"its line {start.strip()!r}", line)

    ran = py(example_blocks(source)[0], timeout=300)
    check(ran.returncode == 0 and "mesh 4x2 (replica, fsdp)" in ran.stdout
          and re.search(r"fc\.weight\s+\[4, 8\]\s+fsdp, None", ran.stdout),
          "README.md's Python example runs", tail(ran))

    tool = shutil.which("spmd", path=env["PATH"])
    check(tool == os.path.join(bindir, "spmd"), "spmd is on the environment's PATH", str(tool))
    trained = run(["spmd", *TRAIN_ARGS], env=env, cwd=away)
    steps = losses(trained.stdout)
    check(trained.returncode == 0 and len(steps) == 20 and "done: loss" in trained.stdout
          and float(steps[-1]) < float(steps[0]), "spmd train --steps 20 trains", tail(trained))
    if compare_tool:
        reference = run([compare_tool, *TRAIN_ARGS], cwd=away)
        check(reference.returncode == 0 and losses(reference.stdout) == steps,
              "its losses are the build's tool's, bit for bit",
              f"installed: {steps}\nbuild:     {losses(reference.stdout)}")

    requires = py("import importlib.metadata as m; print('\\n'.join(m.requires('libspmd')))")
    requires = requires.stdout.splitlines()
    plain = [r for r in requires if "extra ==" not in r]
    extra = [r for r in requires if "extra ==" in r]
    check(plain == ["numpy"], "libspmd requires numpy alone", str(requires))
    check(extra and all(re.match(r'torch>=2 *; *extra == "torch"$', r) for r in extra),
          "torch>=2 only through the extra libspmd[torch]", str(requires))
    has_torch = py("import importlib.util as u; print(u.find_spec('torch') is not None)")
    check(has_torch.stdout.strip() == "False", "the install pulled in no torch")
    no_torch = py("import libspmd.torch")
    check(no_torch.returncode != 0 and "pip install 'libspmd[torch]'" in no_torch.stderr,
          "import libspmd.torch without torch says to install libspmd[torch]", tail(no_torch, 5))

    torch_site = torch_site_packages()
    if torch_site is None:
        print("test_pip_install: README.md's PyTorch example not run: no torch for "
              f"{sys.executable}")
    elif py("import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip() != \
            "%d.%d" % sys.version_info[:2]:
        print(f"test_pip_install: README.md's PyTorch example not run: {python3} is not "
              f"Python {sys.version_info[0]}.{sys.version_info[1]}, whose torch this test has")
    else:
        with open(os.path.join(site, "libspmd-test-torch.pth"), "w") as f:
            f.write(torch_site + "\n")  # after the environment's own paths: its NumPy first
        torch_example = example_blocks(source)[1]
        ran = py(torch_example, timeout=600)
        check(ran.returncode == 0 and "import torch, libspmd.torch as xs" in torch_example
              and re.match(r"[0-9.]+ spmd explain: .*mesh 4x2 \(replica, fsdp\)", ran.stdout)
              and re.search(r"^\s+weight\s+\[4, 8\]\s+fsdp, None", ran.stdout, re.M),
              "README.md's PyTorch example runs", tail(ran))
        os.remove(os.path.join(site, "libspmd-test-torch.pth"))

    files = py("import importlib.metadata as m\n"
               "for f in m.files('libspmd'): print(f.locate())").stdout.splitlines()
    files = [os.path.normpath(f) for f in files]
    names = [os.path.relpath(f, venv) for f in files]
    package = [os.path.relpath(f, site) for f in files if f.startswith(site + os.sep)]
    check(os.path.join(bindir, "spmd") in files and os.access(os.path.join(bindir, "spmd"), os.X_OK),
          "the tool is installed in the environment's bin/", "\n".join(names))
    check("libspmd/libspmd.so.0" in package and "libspmd/torch/step.py" in package
          and any(re.match(r"libspmd/_core\..*\.so$", f) for f in package),
          "the package: its modules, the extension module and libspmd.so.0", "\n".join(package))
    extras = [n for n in names if re.search(r"\.(h|a|pc|cmake)$", n) or "/include/" in n]
    check(not extras, "no headers, static library, pkg-config file or CMake package", str(extras))

    broken = os.path.join(work, "broken")
    shutil.copytree(os.path.join(site, "libspmd"), os.path.join(broken, "libspmd"))
    os.remove(os.path.join(broken, "libspmd", "libspmd.so.0"))
    imported = run([python, "-c", "import libspmd"], env=dict(env, PYTHONPATH=broken), cwd=away)
    check(imported.returncode != 0 and "ImportError: libspmd cannot load its extension module: "
          "libspmd.so.0, which is installed beside it, is missing" in imported.stderr,
          "without libspmd.so.0 beside it the import says so", tail(imported, 5))
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare-tool", help="a build's spmd, whose losses the installed one's must equal")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="libspmd-pip-")
    try:
        skipped = test(work, args.compare_tool)
    except (Failed, subprocess.TimeoutExpired) as failure:
        print(f"FAILED: {failure}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if skipped:
        print(f"test_pip_install skipped: {skipped}")
        return SKIP
    print("test_pip_install: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
