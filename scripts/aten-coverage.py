#!/usr/bin/python3
"""Write docs/aten-coverage.md: what libspmd.torch does with each op of the
Core ATen opset, derived from the lowering table.

    PYTHONPATH=build/python build/venv/bin/python scripts/aten-coverage.py [--print]
    PYTHONPATH=build/python build/venv/bin/python scripts/aten-coverage.py --check [FILE]

The interpreter needs torch (2.6 or later) and the built Python package
(libspmd.torch imports the extension module).  Every fact of the page comes
from the code: an overload is mapped when python/libspmd/torch/aten.py's
TABLE has it, onto what its lowering's docstring says (its first sentence;
the function's name where it has none), and refused where the lowering, or
a function of the package it calls, raises cx.unsupported (the message,
its run-time values shown as "…"; a refusal that says PyTorch refuses it
too is no limit of libspmd's).  torch says which ops are Core ATen, which
it decomposes first (trace.py's _decompositions), which draw random
numbers (trace.py's _RANDOM) and which take no tensor.  Only the reasons
why an op has no mapping are written here (WHY_NOT), where no rule gives
one and the package (aten.NOT_MAPPED) does not.

--print writes the page to stdout.  --check regenerates it in memory and
fails, with a diff, when the page (or FILE) is out of date.  The page
names the torch it was made with; under another torch (Debian 13's 2.6,
say), whose Core ATen set and decompositions differ, the check compares
what the page says for the ops both versions know, less those torch
decomposes (its own choice, not libspmd's), so a lowering added or changed
without regenerating the page is still caught there.  Exit status 77 (a
skip, for CTest) when torch or the package is missing.
"""
import ast
import difflib
import importlib
import inspect
import os
import re
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "aten-coverage.md")
REGENERATE = "PYTHONPATH=build/python build/venv/bin/python scripts/aten-coverage.py"
SKIP = 77


def skip(why):
    print(f"aten-coverage: skipped: {why}")
    sys.exit(SKIP)


try:
    import torch
except ImportError:
    skip(f"torch is not installed for {sys.executable} (scripts/install-deps.sh --venv)")
if not hasattr(torch, "export") or not hasattr(torch.export, "default_decompositions"):
    skip(f"torch {torch.__version__} has no torch.export.default_decompositions; "
         f"libspmd.torch needs torch 2.6 or later")
try:
    # The modules (the package's `trace` is the function of trace.py).
    aten = importlib.import_module("libspmd.torch.aten")
    trace = importlib.import_module("libspmd.torch.trace")
except ModuleNotFoundError as e:
    if e.name not in ("libspmd", "libspmd._core"):
        raise
    skip(f"the Python package is not built or not on the path ({e}); build it and set "
         f"PYTHONPATH=<build>/python")
from libspmd.torch.lowering import op_name  # noqa: E402

# Why an unmapped Core ATen op has none, where it is not "no libspmd op"
# or one of the rules of classify(): by the op's packet name.
WHY_NOT = {
    "as_strided": "a view by strides: libspmd's tensors are contiguous",
    "_fft_r2c": "complex numbers: libspmd's tensors are real",
    "_fft_c2r": "complex numbers: libspmd's tensors are real",
    **aten.NOT_MAPPED,  # those trace() gives when refusing the op
}

# The page's statuses, in its order: (key, heading, what it means).
STATUSES = [
    ("mapped", "Mapped", "the table maps it, whatever its arguments"),
    ("partly", "Mapped, with refusals", "the table maps it and refuses the arguments named"),
    ("folded", "Folded", "it reads no tensor: torch computes it while tracing, a constant"),
    ("decomposed", "Decomposed by torch",
     "`run_decompositions` rewrites it into other ops before the table sees it; those "
     "are mapped or not on their own"),
    ("unreached", "Never in a capture",
     "a backward op, an in-place or `out=` form (the capture is functional) or a "
     "symbolic shape (the capture's shapes are static)"),
    ("not", "Not mapped", "using it on a tensor computed at run time is refused"),
]
HEADINGS = {heading: key for key, heading, _ in STATUSES}


# ---- what torch says ----------------------------------------------------------------


def overload(name):
    """The OpOverload named "aten.add.Tensor", None where this torch has none."""
    _, packet, form = name.split(".")
    p = getattr(torch.ops.aten, packet, None)
    return getattr(p, form, None) if p is not None and form in p.overloads() else None


def core_overloads():
    """The names of the Core ATen opset's overloads: the aten ops torch tags
    torch.Tag.core (native_functions.yaml's `tags: core`, the opset
    `torch.export`'s run_decompositions lowers to, listed in torch's "IRs"
    page).  Every registered op is enumerated from the dispatcher, as
    torch.ops.aten lists only the packets already looked up."""
    names = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        packet, _, form = qualified[len("aten::"):].partition(".")
        try:
            op = getattr(getattr(torch.ops.aten, packet), form or "default")
        except AttributeError:  # registered but not exposed (torch 2.6: hardshrink_)
            continue
        if torch.Tag.core in op.tags:
            names.add(str(op))
    return sorted(names)


def reads_a_tensor(op):
    return any("Tensor" in str(a.type) for a in op._schema.arguments)


def composite_implicit(op):
    """Whether torch decomposes op while capturing (its only kernel is
    CompositeImplicitAutograd's), so no capture reaches it."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


# ---- what the lowering table says ---------------------------------------------------


def shown(node):
    """A message argument as text: a string, or an f-string with its values
    as '…'."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    return "…"


def _callee(fn, call):
    """The package's function a call in fn's body names, else None."""
    f, scope = call.func, fn.__globals__
    target = None
    if isinstance(f, ast.Name):
        target = scope.get(f.id)
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        module = scope.get(f.value.id)
        if inspect.ismodule(module):
            target = getattr(module, f.attr, None)
    if inspect.isfunction(target) and target.__module__.startswith("libspmd.torch"):
        return target
    return None


def refusals(fn, seen=None):
    """The messages of the cx.unsupported calls of fn and of the package's
    functions it calls, in the order met, less those PyTorch refuses too."""
    seen = set() if seen is None else seen
    if fn in seen:
        return []
    seen.add(fn)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)),
                   key=lambda n: (n.lineno, n.col_offset))
    found = []
    for node in calls:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "unsupported" and node.args:
            text = " ".join(shown(node.args[0]).split())
            if not re.search(r"PyTorch refuses (it|them) too", text):
                found.append(text)
        else:
            callee = _callee(fn, node)
            if callee is not None:
                found += refusals(callee, seen)
    return list(dict.fromkeys(found))


def described(fn):
    """What a lowering maps onto: its docstring's first sentence, else its
    name."""
    doc = inspect.getdoc(fn)
    if not doc:
        return f"`{fn.__name__}`"
    first = " ".join(doc.split("\n\n")[0].split())
    m = re.match(r"(.*?\.)(\s|$)", first)
    return f"`{fn.__name__}`: " + (m.group(1) if m else first)


def lowering_row(name):
    """(status, what it maps onto, its refusals) of a table entry."""
    fn = aten.TABLE[name]
    refused = refusals(fn)
    quoted = "; ".join(f"“{m}”" for m in refused)  # the messages themselves hold ';'
    return ("partly" if refused else "mapped"), described(fn), quoted


def classify(name, decomposed):
    """(status, text) of a Core ATen overload."""
    packet, form = name.split(".")[1:]
    op = overload(name)
    if name in aten.TABLE:
        status, onto, refused = lowering_row(name)
        return status, onto + (f" Refuses: {refused}." if refused else "")
    if packet in trace._RANDOM:
        return "not", "draws random numbers (never folded); libspmd's one random op is dropout"
    if name in decomposed:
        return "decomposed", ""
    if packet.endswith("_backward"):
        return "unreached", "a backward op: the capture is of the forward; libspmd " \
                            "differentiates its own graph"
    if packet.endswith("_") or form == "out":
        return "unreached", "in place or into `out=`: the capture is functional"
    if packet.startswith("sym_"):
        return "unreached", "a symbolic shape: the capture's shapes are static"
    if not reads_a_tensor(op):
        return "folded", ""
    return "not", WHY_NOT.get(packet, "no libspmd op")


def reaches(name, decompositions):
    """How a table entry that is no Core ATen op reaches the table."""
    op = overload(name)
    if name == "libspmd.sharding_constraint.default":
        return "`mark_sharding` inside `forward` makes it (`constraint.py`)"
    if name.startswith("libspmd."):
        return "the capture makes it (`dropout_capture.py`)"
    if op is None:
        return f"not in torch {version()}: an overload of another torch"
    if name in decompositions:
        return "kept whole: its decomposition is left out"
    if composite_implicit(op):
        return "torch decomposes it while capturing: no capture reaches it"
    return "torch leaves it in the graph"


# ---- the page -------------------------------------------------------------------------


def version():
    return torch.__version__.split("+")[0]


def cell(text):
    return text.replace("|", "\\|")


def page():
    mapped = {name.split(".")[1] for name in aten.TABLE}
    stale = sorted(p for p in WHY_NOT if p in mapped)
    if stale:
        sys.exit(f"aten-coverage: WHY_NOT says why {', '.join(stale)} has no mapping, but the "
                 f"table maps it: take it out of WHY_NOT")
    decompositions = {op_name(op) for op in torch.export.default_decompositions()}
    decomposed = {op_name(op) for op in trace._decompositions()}
    core = core_overloads()
    rows = {name: classify(name, decomposed) for name in core}
    counts = {key: sum(1 for s, _ in rows.values() if s == key) for key, _, _ in STATUSES}
    others = sorted(n for n in aten.TABLE if n not in rows)
    out = [
        "# Core ATen coverage of libspmd.torch",
        "",
        "<!-- Generated by scripts/aten-coverage.py from python/libspmd/torch/aten.py; "
        "do not edit. -->",
        "",
        f"Generated with torch {version()}. "
        f"[`libspmd.torch`](python.md#from-pytorch) captures `loss_fn(model, *batch)` with "
        f"`torch.export` and lowers it to the Core ATen opset (the aten ops torch tags "
        f"`torch.Tag.core`), keeping whole the ops its lowering table maps; each op of the "
        f"graph is then mapped by one entry of that table "
        f"([`aten.py`](../python/libspmd/torch/aten.py)) onto libspmd's ops. Of the "
        f"{len(core)} Core ATen overloads of this torch:",
        "",
        "| status | overloads | meaning |",
        "|---|---|---|",
    ]
    for key, heading, meaning in STATUSES:
        out.append(f"| [{heading.lower()}](#{anchor(heading)}) | {counts[key]} | {meaning} |")
    out += [
        "",
        "Whatever the table says, an op whose operands are all constants (buffers, "
        "literals, what was folded before) is computed by torch while tracing and never "
        "reaches the table, so a mask or table built from buffers may use any op. Tensors "
        "computed at run time are f32, torch's integers and booleans among them (a "
        "comparison's 1 or 0, argmax's index, a count: whole numbers, exact in f32 below "
        "2^24), or int32 where an op reads indices (the batch's targets and ids, which no "
        "op computes). A float becomes an integer only where libspmd knows it whole, and "
        "a check torch records (`_assert_async`: F.one_hot's) is dropped only where it "
        "holds whatever the values, else refused ([From "
        "PyTorch](python.md#experts-from-pytorch)). A lowering refuses some arguments "
        "naming them (the messages below, "
        "`…` standing for a value), and libspmd's builders may refuse what the library "
        "cannot hold (more than 6 dimensions, say), naming the op and the line. "
        "The page is generated: `scripts/aten-coverage.py` rewrites it and "
        "`--check` (the CTest test `aten_coverage_check`) fails when it is out of date.",
        "",
    ]
    for key, heading, _ in STATUSES:
        names = [n for n in core if rows[n][0] == key]
        out += [f"## {heading}", ""]
        if not names:
            out += ["None.", ""]
            continue
        if key in ("folded", "decomposed"):
            out += [", ".join(f"`{n}`" for n in names) + ".", ""]
            continue
        column = "libspmd ops (the lowering: its docstring)" if key in ("mapped", "partly") \
            else "why"
        out += [f"| overload | {column} |", "|---|---|"]
        out += [f"| `{n}` | {cell(rows[n][1])} |" for n in names]
        out.append("")
    out += [
        "## Other ops the table maps",
        "",
        "Ops that are not Core ATen: libspmd's own (the capture's channel-wise dropout, "
        "a mark inside forward), "
        "aten ops the table keeps whole where torch would decompose them (libspmd has "
        "fused ops for them: cross-entropy's `nll_loss_forward`, ...), and entries for "
        "what other versions of torch capture.",
        "",
        "| op | status | libspmd ops (the lowering: its docstring) | how it reaches the table |",
        "|---|---|---|---|",
    ]
    for name in sorted(others, key=lambda n: (not n.startswith("libspmd."), n)):
        status, onto, refused = lowering_row(name)
        text = onto + (f" Refuses: {refused}." if refused else "")
        out.append(f"| `{name}` | {status} | {cell(text)} | {cell(reaches(name, decompositions))} |")
    return "\n".join(out) + "\n"


def anchor(heading):
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


# ---- the check ------------------------------------------------------------------------


def rows_of(text):
    """What a page says per op: name -> (status, text), from its tables
    (status from the section, or the row's own column) and its lists of
    folded and decomposed ops."""
    rows, status = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            status = HEADINGS.get(line[3:].strip())
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if status in ("folded", "decomposed"):
            for name in re.findall(r"`([\w.]+)`", line):
                rows[name] = (status, "")
        elif len(cells) == 2 and cells[0].startswith("`") and status:
            rows[cells[0].strip("`")] = (status, cells[1])
        elif len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def check(path):
    with open(path) as f:
        old = f.read()
    new = page()
    name = os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path
    if old == new:
        print(f"aten-coverage: {name} is current (torch {version()})")
        return 0
    m = re.search(r"Generated with torch ([\w.]+)\.", old)
    made_with = m.group(1) if m else None
    if made_with == version():
        diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(),
                                         name, "regenerated", n=0,
                                         lineterm=""))
        shown_lines = diff[:60] + ([f"... ({len(diff) - 60} more lines)"] if len(diff) > 60 else [])
        print("\n".join(shown_lines))
        print(f"aten-coverage: {name} is out of date with the lowering table; regenerate it: "
              f"{REGENERATE}")
        return 1
    # Another torch: compare what the page says for the ops both know,
    # less those torch decomposes.
    said, says = rows_of(old), rows_of(new)
    common = sorted(n for n in set(said) & set(says)
                    if "decomposed" not in (said[n][0], says[n][0]))
    differ = [n for n in common if said[n] != says[n]]
    for n in differ:
        print(f"  {n}:\n    the page:    {said[n][0]}: {said[n][1]}\n"
              f"    regenerated: {says[n][0]}: {says[n][1]}")
    print(f"aten-coverage: {name} was generated with torch {made_with}, "
          f"this is torch {version()}: compared the {len(common)} ops both know (not those "
          f"torch decomposes): {len(differ)} differ")
    if differ:
        print(f"aten-coverage: {name} is out of date with the lowering table; regenerate it "
              f"with torch {made_with}: {REGENERATE}")
        return 1
    return 0


def main(argv):
    if argv[:1] == ["--check"]:
        return check(argv[1] if len(argv) > 1 else PAGE)
    text = page()
    if argv[:1] == ["--print"]:
        sys.stdout.write(text)
        return 0
    if argv:
        sys.exit(__doc__)
    with open(PAGE, "w") as f:
        f.write(text)
    print(f"aten-coverage: wrote {os.path.relpath(PAGE, ROOT)} (torch {version()})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
