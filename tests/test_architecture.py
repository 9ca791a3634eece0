"""The house rules, checked: a declared layer order with no import cycles, every module
importable on its own, no file over 600 lines, no function over 80 lines.

The layers (lowest first) are the picture in DESIGN §1: vocabulary and tables at the bottom,
then the readers and the cost model, the analysis stages, the report, and the faces (render,
web, CLI) on top. A module may import only from its own layer or below, at module level or
inside a function; an import upward is an error that names both modules. The few things that
stay over the size limits are listed here with the reason, so that a new one fails.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO

PKG = REPO / "traceroof"

#: lowest first; each module is named (dotted, ``traceroof.`` left out), or its whole package
#: by a name ending in "." — so a new module must be placed here, on purpose.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # words and numbers everything shares; no traceroof imports (errors aside)
    ("vocabulary", ("_allocator", "errors", "units", "dtypes", "sections", "progress", "frames", "intervals", "step_markers",
                    "host", "outputs")),
    # the op and host tables, and putting several of them together
    ("tables", ("schema", "trace", "merge", "duplicates", "parallel")),
    # what an op costs on a chip: chips, cost formulas, roofline, model FLOPs, MFU/HFU, estimate
    ("cost model", ("chip_table", "chip_detect", "chips", "costs.", "costing", "costing_tbe", "costing_copies", "costing_shapes", "costing_shares", "costing_tensorlist",
                    "costing_why", "roofline", "mfu", "model_config", "model", "estimate", "estimate_train",
                    "estimate_memory", "estimate_parallel", "estimate_serve", "estimate_plan", "estimate_floor")),
    # one module per input format behind the registry, and the cache they can be stored in
    ("readers", ("parsers.", "cache")),
    # the one input door, ingest above the cache, step segmentation
    ("inputs", ("io", "ingest", "rank_prep", "graph_capture", "graph_match", "graph_sources", "graph_replay", "unlaunched", "step_windows", "timeline", "steps", "device_accounting")),
    # the detectors and the cross-rank view
    ("findings", ("rank_clock", "ranks", "findings.")),
    # the analysis pipeline and what it produces
    ("report", ("report", "report_schema", "accounting", "utilization", "speed_of_light", "waterfall", "analysis",
                "diff", "op_match", "gate", "capture", "capture_errors", "watch")),
    # the faces: text renderers, dashboard, command line
    ("faces", ("render.", "web.", "mcp_server", "cli", "cli_entry", "cli_common", "cli_perfetto", "cli_estimate", "cli_live",
               "cli_diff", "__main__")),
]

#: files allowed over 600 lines, with the reason
LONG_FILES: dict[str, str] = {}

#: functions allowed over 80 lines (``path:qualname``), with the reason
LONG_FUNCTIONS: dict[str, str] = {}

#: imports allowed up the layers, inside a function only (never at module level), with the reason
LAZY_UP: dict[tuple[str, str], str] = {
    ("report", "render.plots"): "Report.figures: notebooks reach the figures from the report object",
    ("report", "render.html"): "Report._repr_html_: Jupyter's display protocol asks the object itself",
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _layer(mod: str) -> int:
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            if mod == name or (name.endswith(".") and (mod == name[:-1] or mod.startswith(name))):
                return i
    raise AssertionError(f"traceroof.{mod} is in no layer: add it to LAYERS in {__file__}")


def _import_nodes(tree: ast.Module, top_only: bool):
    """Import statements: all of them, or only those run when the module is imported (its
    top level; ``if TYPE_CHECKING:`` blocks are not run)."""
    if not top_only:
        yield from (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
        return
    for n in tree.body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            yield n
        elif isinstance(n, ast.Try):
            yield from (m for m in n.body if isinstance(m, (ast.Import, ast.ImportFrom)))


def _imports(mod: str, path: Path, *, top_only: bool = False) -> list[tuple[str, int]]:
    """The traceroof modules ``mod`` imports (dotted, without ``traceroof.``) and the line."""
    tree = ast.parse(path.read_text())
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    found: list[tuple[str, int]] = []
    for node in _import_nodes(tree, top_only):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                target = ".".join([*base, node.module] if node.module else base)
            elif node.module and node.module.startswith("traceroof"):
                target = node.module.removeprefix("traceroof").lstrip(".")
            else:
                continue
            for a in node.names:  # ``from . import io`` imports a module
                sub = f"{target}.{a.name}" if target else a.name
                found.append((sub if sub in MODULES else target, node.lineno))
        else:
            for a in node.names:
                if a.name.startswith("traceroof."):
                    found.append((a.name.removeprefix("traceroof."), node.lineno))
    return [(t, ln) for t, ln in found if t in MODULES and t not in (mod, "")]


def test_every_module_is_in_a_layer():
    for mod in MODULES:
        if mod:
            _layer(mod)


def test_imports_never_go_up_a_layer():
    bad = []
    for mod, path in MODULES.items():
        if not mod:
            continue  # the package's lazy public API sits above everything
        me = _layer(mod)
        top = {t for t, _ in _imports(mod, path, top_only=True)}
        for target, line in _imports(mod, path):
            if _layer(target) > me and ((mod, target) not in LAZY_UP or target in top):
                bad.append(f"{path.relative_to(REPO)}:{line}: {mod} ({LAYERS[me][0]}) imports "
                           f"{target} ({LAYERS[_layer(target)][0]})")
    assert not bad, "\n".join(bad)


def test_each_allowed_upward_import_is_still_made_and_only_inside_a_function():
    for (mod, target), why in LAZY_UP.items():
        path = MODULES[mod]
        assert target in {t for t, _ in _imports(mod, path)}, f"{mod} no longer imports {target}: drop it from LAZY_UP"
        assert target not in {t for t, _ in _imports(mod, path, top_only=True)}, f"{mod} imports {target} at module level"


def test_no_import_cycle_among_module_level_imports():
    graph = {mod: {t for t, _ in _imports(mod, path, top_only=True)} for mod, path in MODULES.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_each_module_imports_on_its_own():
    """Each module imported first, in a clean ``traceroof`` state: an import cycle or a
    missing module-level dependency shows up as an ImportError naming the module."""
    names = sorted(f"traceroof.{m}" if m else "traceroof" for m in MODULES)
    code = (
        "import importlib, sys\n"
        f"names = {names!r}\n"
        "bad = []\n"
        "for n in names:\n"
        "    for k in [k for k in sys.modules if k == 'traceroof' or k.startswith('traceroof.')]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except ImportError as e:\n"
        "        if 'dash' in str(e) or 'plotly' in str(e) or 'jax' in str(e):\n"
        "            continue\n"
        "        bad.append(f'{n}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "", res.stdout


def test_no_file_over_600_lines():
    over = {}
    for p in PKG.rglob("*.py"):
        n = p.read_text().count("\n")
        rel = str(p.relative_to(REPO))
        if n > 600 and rel not in LONG_FILES:
            over[rel] = n
    assert not over, f"files over 600 lines: {over}"
    for rel in LONG_FILES:  # an exception that no longer applies is removed
        assert (REPO / rel).read_text().count("\n") > 600, f"{rel} is short now: drop it from LONG_FILES"


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            q = f"{prefix}{node.name}"
            yield q, node.end_lineno - node.lineno + 1
            yield from _functions(node, q + ".")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def test_no_function_over_80_lines():
    over = {}
    seen = set()
    for p in PKG.rglob("*.py"):
        rel = str(p.relative_to(REPO))
        for q, n in _functions(ast.parse(p.read_text())):
            key = f"{rel}:{q}"
            if n > 80:
                seen.add(key)
                if key not in LONG_FUNCTIONS:
                    over[key] = n
    assert not over, f"functions over 80 lines: {over}"
    stale = set(LONG_FUNCTIONS) - seen
    assert not stale, f"no longer over 80 lines, drop from LONG_FUNCTIONS: {stale}"


def test_the_layer_check_can_fail(tmp_path):
    """An upward import in a made-up bottom-layer module is seen, with its line."""
    src = tmp_path / "errors.py"
    src.write_text("import os\n\n\ndef f():\n    from .cli import main\n")
    got = _imports("errors", src)
    assert got == [("cli", 5)]
    assert _layer("cli") > _layer("errors")
    assert _imports("errors", src, top_only=True) == []
