"""The import contract (DESIGN.md, Layout): dependencies point one way, in layers.

    app      hft_infer.app.*, hft_infer.__main__: may import everything
    core     the rest of hft_infer: core and leaves, never replay or app
    replay   hft_infer.replay.*: replay and leaves only
    leaves   transport, kernels, errors, clock, heap, metrics: each imports only itself, except that
             metrics may use transport's wire types

Every import counts, function-local ones too (they are dependencies all the same), and
the graph of project modules has no cycles. The checker is exercised on a deliberate
violation below, so that a broken checker cannot pass silently. Ruff (lint) runs here too,
so `python -m pytest` (README, .ci/run) enforces both.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# repo folder -> import name (pyproject.toml's package-dir)
PACKAGES = {"hft_infer": "hft_infer", "transport": "hft_infer.transport", "kernels": "hft_infer.kernels",
            "replay": "hft_infer.replay", "configs": "hft_infer.configs"}
LEAVES = {
    "hft_infer.transport": {"hft_infer.transport"},
    "hft_infer.kernels": {"hft_infer.kernels"},
    "hft_infer.errors": set(),
    "hft_infer.clock": set(),
    "hft_infer.heap": set(),
    "hft_infer.metrics": {"hft_infer.metrics", "hft_infer.transport"},
}


def layer_of(module: str) -> str:
    if module == "hft_infer.__main__" or module.startswith("hft_infer.app"):
        return "app"
    for leaf in LEAVES:
        if module == leaf or module.startswith(leaf + "."):
            return leaf
    if module.startswith("hft_infer.replay"):
        return "replay"
    return "core"


def _is_leaf(layer: str) -> bool:
    return layer in LEAVES


def allowed(importer: str, imported: str) -> bool:
    src, dst = layer_of(importer), layer_of(imported)
    if imported == "hft_infer":  # the package itself (__version__)
        return True
    if src == "app":
        return True
    if _is_leaf(src):
        return dst == src or any(imported == a or imported.startswith(a + ".") for a in LEAVES[src])
    if src == "replay":
        return dst == "replay" or _is_leaf(dst)
    return dst == "core" or _is_leaf(dst)  # core


def project_imports(module: str, source: str, is_package: bool = False) -> list[tuple[str, int]]:
    """(imported project module, line) for every import in the source, at any depth."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("hft_infer")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("hft_infer"):
                out.append((name, node.lineno))
    return out


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    return [f"{module}:{line}: {layer_of(module)} imports {name} ({layer_of(name)})"
            for name, line in project_imports(module, source, is_package) if not allowed(module, name)]


def project_modules() -> dict[str, Path]:
    mods = {}
    for folder, pkg in PACKAGES.items():
        for f in sorted((ROOT / folder).rglob("*.py")):
            parts = [p for p in f.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            mods[".".join([pkg, *parts])] = f
    return mods


def test_every_module_obeys_the_layers():
    found = []
    for module, path in project_modules().items():
        found += violations(module, path.read_text(), path.name == "__init__.py")
    assert found == [], "\n".join(found)


def test_no_import_cycles_between_project_modules():
    mods = project_modules()
    graph = {}
    for module, path in mods.items():
        deps = set()
        for name, _ in project_imports(module, path.read_text(), path.name == "__init__.py"):
            # `from package import name` may name a submodule
            target = name if name in mods else None
            if target is None:
                continue
            if target != module and not module.startswith(target + "."):  # a package's own __init__
                deps.add(target)
        graph[module] = deps
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == [], "\n".join(cycles)


@pytest.mark.parametrize("module, source, expected", [
    ("hft_infer.service", "from hft_infer.replay.pacer import Pacer\n", "core imports hft_infer.replay.pacer"),
    ("hft_infer.scheduler", "def f():\n    from hft_infer.app.cli import main\n", "core imports hft_infer.app.cli"),
    ("hft_infer.transport.codec", "from hft_infer.config import Config\n", "imports hft_infer.config (core)"),
    ("hft_infer.kernels.mlp", "import hft_infer.models.mlp\n", "imports hft_infer.models.mlp (core)"),
    ("hft_infer.replay.collector", "from hft_infer.control.hlog import x\n", "replay imports hft_infer.control"),
    ("hft_infer.transport.codec", "from ..config import Config\n", "imports hft_infer.config (core)"),
])
def test_a_deliberate_violation_is_reported(module, source, expected):
    found = violations(module, source)
    assert len(found) == 1 and expected in found[0], found


def test_allowed_directions_are_not_reported():
    assert violations("hft_infer.app.serve", "from hft_infer.replay.pacer import Pacer\n") == []
    assert violations("hft_infer.replay.pacer", "from hft_infer.transport.codec import encode\n") == []
    assert violations("hft_infer.service", "from hft_infer.kernels.reference import decide\n") == []
    assert violations("hft_infer.metrics.hlog", "from hft_infer.transport.stats import Snapshot\n") == []


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert exe, "ruff is a dev dependency: pip install -e '.[dev]'"
    return [exe]


def test_ruff_lint_passes():
    r = subprocess.run([*_ruff(), "check", "--no-cache", str(ROOT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
