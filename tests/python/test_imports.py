"""No import circle among the modules of python/libspmd: every import of a
module of the package, at the top of a file or inside a function, read
with ast from the sources (nothing is imported), is an edge, and the
graph has no cycle.  The check is a function on sources held in memory,
so a planted circle shows that it fails."""
import ast
import os

PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "libspmd")
# Modules of the package that are not Python files: the C extension
# (python/src/), which imports no module of the package.
EXTENSIONS = ("libspmd._core",)


def package_sources(root=PACKAGE_DIR, package="libspmd"):
    """Module name -> source of every .py file under root ("libspmd.torch"
    for torch/__init__.py)."""
    sources = {}
    for folder, _, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        parts = [package] + ([] if rel == "." else rel.split(os.sep))
        for f in files:
            if not f.endswith(".py"):
                continue
            name = ".".join(parts if f == "__init__.py" else parts + [f[:-3]])
            with open(os.path.join(folder, f)) as fh:
                sources[name] = fh.read()
    return sources


def _packages(sources):
    """The module names that are packages (have modules under them)."""
    return {n.rsplit(".", 1)[0] for n in sources if "." in n}


def imports(name, source, modules, packages):
    """The modules of `modules` that module `name` imports."""
    base = name if name in packages else name.rsplit(".", 1)[0]  # the package `from .` means
    found = set()

    def add(target):
        # "libspmd.torch.aten" imports that module; an attribute of a
        # module ("from .lowering import Lowering") imports the module.
        while target and target not in modules:
            target = target.rsplit(".", 1)[0] if "." in target else None
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parent = ".".join(parts[:len(parts) - (node.level - 1)])
                origin = parent + ("." + node.module if node.module else "")
            else:
                origin = node.module
            for alias in node.names:
                full = origin + "." + alias.name
                add(full if full in modules else origin)
    return found


def cycles(sources, extensions=EXTENSIONS):
    """Every import circle among `sources` (module name -> source) and the
    `extensions` they may import, each as the list of its modules from the
    first met; empty when there is none."""
    modules, packages = set(sources) | set(extensions), _packages(sources)
    edges = {n: sorted(imports(n, s, modules, packages)) for n, s in sources.items()}
    edges.update({n: [] for n in extensions})
    found, state = [], {}
    stack = []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in edges[n]:
            if state.get(m) == "open":
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = "done"

    for n in sorted(edges):
        if n not in state:
            visit(n)
    return found


def test_the_package_has_no_import_circle():
    sources = package_sources()
    assert "libspmd.torch.aten" in sources and "libspmd.torch.lowering" in sources
    assert cycles(sources) == []


def test_edges_are_read_from_every_form_of_import():
    sources = package_sources()
    modules, packages = set(sources) | set(EXTENSIONS), _packages(sources)
    trace = imports("libspmd.torch.trace", sources["libspmd.torch.trace"], modules, packages)
    assert {"libspmd.torch.aten", "libspmd.torch.lowering", "libspmd.errors"} <= trace
    init = imports("libspmd", sources["libspmd"], modules, packages)
    assert {"libspmd._core", "libspmd._processes", "libspmd.errors", "libspmd._explain"} <= init
    lazy = imports("libspmd.torch.mesh", sources["libspmd.torch.mesh"], modules, packages)
    assert "libspmd" in lazy  # `import libspmd` inside a function


def test_a_planted_circle_fails():
    # The circle the torch lowering once had: the op table imports the
    # tracer for a class, the tracer imports the table inside a function.
    planted = {
        "pkg": "",
        "pkg.table": "from .tracer import Unavailable\n",
        "pkg.tracer": "class Unavailable:\n    pass\n\n\ndef trace():\n    from .table import TABLE\n",
        "pkg.other": "import pkg.table\n",
    }
    assert cycles(planted) == [["pkg.table", "pkg.tracer", "pkg.table"]]
    del planted["pkg.tracer"]
    assert cycles(planted) == []
    assert cycles({"a": "import b\n", "b": "from a import x\n"}) == [["a", "b", "a"]]
