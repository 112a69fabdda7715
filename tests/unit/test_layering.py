"""The layers' direction: compile builds a Program (passes/, schedule/, tune/), the runtime runs it; no two
files and no two packages import each other, directly or around a loop.

Every import in a file counts, the ones inside functions too (they hide a dependency, they do not remove it)."""
import ast
from pathlib import Path

import kiln

ROOT = Path(kiln.__file__).parent


def _imports(path: Path, bases: bool = True) -> set[str]:
    """Modules ``path`` imports (absolute names; ``from kiln.x import y`` gives both kiln.x and kiln.x.y, or only
    kiln.x.y without ``bases``: ``from kiln import config`` depends on kiln.config, not on the package root)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if bases:
                out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _breaks(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / package).glob("*.py")):
        for name in sorted(_imports(path)):
            if any(name == f"kiln.{f}" or name.startswith(f"kiln.{f}.") for f in forbidden):
                found.append(f"{path.relative_to(ROOT.parent)} imports {name}")
    return found


def test_runtime_imports_no_compile_stage():
    assert _breaks("runtime", ("passes", "schedule", "tune", "compiler", "frontend.dynamo")) == []


def test_ir_imports_no_later_layer():
    assert _breaks("ir", ("frontend", "passes", "schedule", "tune", "runtime", "codegen", "compiler")) == []


def _module_graph() -> dict[str, set[str]]:
    """kiln's modules (``kiln.ir.graph``; a package by its ``__init__``: ``kiln.tune``) -> the kiln modules each
    imports (a name resolves to its longest module prefix: ``kiln.ir.graph.Node`` -> ``kiln.ir.graph``)."""
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    return {m: {r for r in map(resolve, _imports(p, bases=False)) if r and r != m} for m, p in names.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of nodes that reach each other (strongly connected, more than one node), each sorted."""
    reach = {}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(graph.get(n, ()))
        reach[start] = seen
    groups = {tuple(sorted({m} | {n for n in reach[m] if m in reach.get(n, ())})) for m in graph}
    return sorted(list(g) for g in groups if len(g) > 1)


def _package(module: str) -> str | None:
    """The subpackage a module belongs to (``kiln.ir.graph`` -> ``ir``); None for top-level modules and
    package ``__init__``s, which stand above the layers (``kiln.compile``, ``kiln.tune.kinds``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else None


def test_no_import_cycle_between_files():
    assert _cycles(_module_graph()) == []


def test_no_import_cycle_between_packages():
    packages: dict[str, set[str]] = {}
    for m, targets in _module_graph().items():
        if _package(m):
            packages.setdefault(_package(m), set()).update(
                p for p in map(_package, targets) if p and p != _package(m))
    assert _cycles(packages) == []


def test_the_cycle_check_finds_a_loop():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from kiln.passes.dce import dce\n    import kiln.tune.db\n")
    assert {"kiln.passes.dce", "kiln.tune.db"} <= _imports(f)


def test_no_generic_module_imports_an_operator():
    """kiln's own operators (kiln/library/<op>/) are known to the rest of kiln only through the registry
    (``kiln.library.OPERATORS`` and its helpers): a new operator is a new package, not edits across the stages."""
    from kiln import library
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if ROOT / "library" in path.parents:
            continue
        for name in sorted(_imports(path, bases=False)):
            if name.startswith("kiln.library.") and name.split(".")[2] not in library.__all__:
                found.append(f"{path.relative_to(ROOT.parent)} imports {name}")
    assert found == []


def test_the_registry_lists_every_operator_package():
    from kiln import library
    packages = {p.name for p in (ROOT / "library").iterdir() if (p / "__init__.py").exists()}
    assert {op.name for op in library.OPERATORS} == packages



def test_only_the_choice_service_opens_the_tuning_database():
    """One store, reached through one service (tune/choices.py): the passes, the tuners and the GPU plan get the
    compile's ``Choices``; only the service and ``kiln db`` (the command that manages the file) open it."""
    allowed = {"tune/db.py", "tune/choices.py", "cli.py"}
    opened = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
              if "TuningDB.open(" in p.read_text() and str(p.relative_to(ROOT)) not in allowed]
    assert opened == []
