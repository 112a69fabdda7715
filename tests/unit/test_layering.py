"""The layers' direction: compile builds a Plan (passes/, schedule/, tune/), the runtime runs it.

Every import in a file counts, the ones inside functions too (they hide a dependency, they do not remove it)."""
import ast
from pathlib import Path

import kiln

ROOT = Path(kiln.__file__).parent


def _imports(path: Path) -> set[str]:
    """Modules ``path`` imports (absolute names; ``from kiln.x import y`` gives both kiln.x and kiln.x.y)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
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
    assert _breaks("ir", ("passes", "schedule", "tune", "runtime", "codegen", "compiler")) == []


def test_the_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from kiln.passes.dce import dce\n    import kiln.tune.db\n")
    assert {"kiln.passes.dce", "kiln.tune.db"} <= _imports(f)
