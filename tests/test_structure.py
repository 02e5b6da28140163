"""The tree's habits: no import cycles (lazy and TYPE_CHECKING imports count), no module over 400
lines, and the run-directory contract (mt/contract/) at the bottom: stdlib and itself only."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mt", "engine", "tui")
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


def _imported(mod: str, path: Path) -> set[str]:
    """Every module name `mod` imports anywhere in its body, with relative imports resolved."""
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            names.add(parent)
            names.update(f"{parent}.{a.name}" for a in node.names)
    return names


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for name in _imported(m, p):
            while name and name not in mods:  # `from pkg import name` names a module or a symbol
                name = name.rpartition(".")[0]
            if name and name != m:
                graph[m].add(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_modules() -> None:
    assert _cycles(_graph()) == []


def test_no_module_over_400_lines() -> None:
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize("mod", sorted(m for m in _modules() if m.startswith("mt.contract")))
def test_the_contract_imports_only_the_stdlib_and_itself(mod: str) -> None:
    path = _modules()[mod]
    outside = {n for n in _imported(mod, path)
               if n.split(".")[0] not in sys.stdlib_module_names and not n.startswith("mt.contract")
               and n != "__future__" and not n.startswith("__future__.")}
    assert outside == set()


def test_each_tui_package_bans_the_packages_above_it_in_the_order_of_docs_map() -> None:
    """tui/ is held in layers by ruff: every package's .ruff.toml is the one docs/map.md's order implies."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "scripts" / "layer_rules.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_layer_rule_is_held_by_ruff_against_an_upward_import() -> None:
    """A module in tui/format/ importing tui/state/ (above it) fails ruff: the rule holds, not just exists.
    The module is given on stdin (no file is written where the other tests walk the tree)."""
    root = Path(__file__).resolve().parent.parent
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run([str(ruff), "check", "--no-cache", "--select", "TID251", "--stdin-filename",
                           str(root / "tui" / "format" / "probe.py"), "-"], input="from tui.state import series\n\nprint(series)\n",
                          capture_output=True, text=True, cwd=root)
    assert done.returncode == 1 and "format is below state" in done.stdout, done.stdout + done.stderr
