"""The modules of raggeddot import one another in one direction: the graph of
their imports, read from the source, has no cycle.

Every ``import`` and ``from ... import`` statement counts, at module level or
inside a function (an import deferred into a function still ties the two
modules together), relative or absolute. An import of ``a.b.c`` is an edge to
``a.b.c`` and to the packages on the way (``a.b``) that the importing module
does not already live in: those run their ``__init__`` first; ``from a import
b`` is an edge to ``a.b`` when that is a module, and to ``a`` unless the
importer lives in it. The package's lazy submodules (``importlib.import_module``
in its ``__getattr__``) are not import statements and are not edges.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "raggeddot"


def _modules():
    """{dotted name: (path, is a package)} of every Python module of the package."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, package)
    return found


def _targets(node, module, package, modules):
    """Dotted names of the package's modules that the import ``node`` in
    ``module`` (a package when ``package``) loads."""
    # the importer's own packages, initialised before it
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1 + package)}
    if isinstance(node, ast.Import):      # import a.b: a.b, and a unless it is an own package
        named = {alias.name for alias in node.names}
    else:                                 # from a import b: a (unless own), and a.b if a module
        if node.level:
            base = module.split(".")
            base = base[:len(base) - node.level + (1 if package else 0)]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module
        named = {f"{stem}.{alias.name}" for alias in node.names} | ({stem} - own)
    out = {name for name in named if name in modules}
    for name in list(out):
        parts = name.split(".")
        out.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p not in own)
    return out


def import_graph():
    """{module: {imported module: line of the first import}} of the package."""
    modules = _modules()
    graph = {}
    for module, (path, package) in modules.items():
        edges = graph.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(node, module, package, modules):
                    if target != module:
                        edges.setdefault(target, node.lineno)
    return graph


def find_cycle(graph):
    """One cycle of ``graph`` as a list of modules (first == last), or None."""
    state = {}          # module -> "open" while on the path, "done" after

    def visit(module, path):
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target, path)
                if cycle:
                    return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [])
            if cycle:
                return cycle
    return None


def _describe(cycle, graph):
    """One line per import of the cycle, with the file and line that makes it."""
    modules = _modules()
    return "\n".join(f"  {a} -> {b}  ({modules[a][0].relative_to(ROOT)}:{graph[a][b]})"
                     for a, b in zip(cycle, cycle[1:]))


def test_the_graph_sees_the_imports():
    """The graph reads module-level, function-level, relative and absolute imports."""
    graph = import_graph()
    assert "raggeddot._core" not in graph           # the extension has no source to read
    assert "raggeddot._gateway" in graph["raggeddot._ragged_dot"]              # from . import _gateway as gw
    assert "raggeddot._ragged_dot" in graph["raggeddot._ragged_dot_general"]   # inside a function
    assert "raggeddot._moe" in graph["raggeddot.distributed.moe"]              # from .._moe import ...
    assert "raggeddot._moe.config" in graph["raggeddot.distributed.moe"]       # from .._moe.config import
    assert "raggeddot.reference" in graph["raggeddot.specs"]                   # from raggeddot import reference
    assert "raggeddot" not in graph["raggeddot._ragged_dot"]                   # its own package, ...
    assert "raggeddot" in graph["raggeddot.specs"]                             # ... unless named: import raggeddot


def test_find_cycle_reports_a_closed_path():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}}) is None


def test_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "raggeddot's modules import each other in a circle:\n" + _describe(cycle, graph)
