"""No code goes around the one door: every open or read of a file in mt/, tui/ and engine/ is a call
of mt/contract/door.py, or is in the short allow-list below with the reason it is not a read of a
run-directory file (issue #34: a FIFO hung the supervisor, a /dev/zero link ate 16 GB)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mt", "tui", "engine")
DOOR = "mt/contract/door.py"

# module.function calls that open or read a file (or unpickle one) by themselves
FORBIDDEN_CALLS = {
    ("io", "open"), ("os", "open"), ("os", "fdopen"), ("json", "load"), ("pickle", "load"), ("pickle", "loads"),
    ("np", "fromfile"), ("numpy", "fromfile"), ("np", "load"), ("numpy", "load"), ("np", "memmap"),
    ("numpy", "memmap"), ("torch", "load"), ("mmap", "mmap"),
}
# any object's method of these names opens or reads a file (pathlib.Path's, tarfile's, ...)
FORBIDDEN_METHODS = {"read_text", "read_bytes", "open"}

_OWNED = "owned by another helper, converted in its branch"
ALLOWED: dict[tuple[str, str], str] = {
    # (module, enclosing function): why this open is not a read of a run-directory file
    ("mt/contract/jsonl.py", "write_json_atomic"): "writes a new temp file from mkstemp, renamed into place",
    ("mt/contract/preset.py", "load_preset"): "the user's preset named on the command line",
    ("engine/checkpoint/pick.py", "_broadcast"): "weights_only torch.load of bytes rank 0 sent over gloo, no file",
    ("mt/contract/preset.py", "write_script_preset"): "writes a new file (O_CREAT | O_EXCL)",
    ("mt/contract/heartbeat.py", "_mapped"): "maps the fd _own_file opened, to write this rank's own heartbeat",
    ("tui/supervise/lock.py", "acquire"): "the run's lock file: O_NOFOLLOW, flock only, nothing read",
    ("tui/mirror/table.py", "write_csv"): "writes the export file the user named",
    ("tui/mirror/tensorboard.py", "EventFile.__init__"): "creates a new, uniquely named TensorBoard event file",
    ("tui/tools/prepare.py", "load_tokenizer"): "the user's tokenizer named to mt prepare",
    ("tui/tools/prepare.py", "tokenize_file"): "the user's corpus and the new temp token file it writes",
    ("tui/tools/prepare.py", "cache_key"): "hashes the user's corpus and tokenizer",
    ("engine/data.py", "_token_splits"): "the user's text file named in the preset (data.path)",
    ("engine/data.py", "_token_file"): "the user's token file named in the preset, memory-mapped read-only",
    ("engine/checkpoint/folder.py", "_fsync_dir"): "opens a folder this process made, to fsync it",
    ("engine/checkpoint/folder.py", "_write_manifest"): "writes a new manifest in the checkpoint's temp folder",
    ("engine/checkpoint/full.py", "write_parts"): "writes new files in the checkpoint's temp folder",
    ("engine/checkpoint/sharded.py", "SafePlanner.load_bytes"): "torch.load(weights_only=True) of bytes DCP already read",
}


@dataclass(frozen=True)
class Opening:
    """One call that opens or reads a file outside the door."""

    module: str
    function: str
    line: int
    call: str


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _is_door_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and _dotted(node.func).startswith("door.")


def _not_a_run_dir_arg(arg: ast.expr, door_names: set[str]) -> bool:
    """A first argument that cannot name a run-directory file: /proc, a numbered fd, or what the door opened."""
    if isinstance(arg, ast.Constant):
        return isinstance(arg.value, int) or (isinstance(arg.value, str) and arg.value.startswith("/proc/"))
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).startswith("/proc/")
    return _is_door_call(arg) or (isinstance(arg, ast.Name) and arg.id in door_names)


class _Walker(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.door_names: list[set[str]] = [set()]
        self.found: list[Opening] = []

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.door_names.append(set())
        self.generic_visit(node)
        self.door_names.pop()
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:   # `with door.open_file(p) as f`: f is a file the door opened
            if _is_door_call(item.context_expr) and isinstance(item.optional_vars, ast.Name):
                self.door_names[-1].add(item.optional_vars.id)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        parts = tuple(name.rsplit(".", 1))
        forbidden = (name == "open" or parts in FORBIDDEN_CALLS
                     or (isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN_METHODS
                         and not name.startswith("door.")))
        if forbidden and not (node.args and _not_a_run_dir_arg(node.args[0], self.door_names[-1])):
            self.found.append(Opening(self.module, ".".join(self.scope) or "<module>", node.lineno, name))
        self.generic_visit(node)


def openings(source: str, module: str) -> list[Opening]:
    """Every open or read of a file in `source` that does not go through the door."""
    walker = _Walker(module)
    walker.visit(ast.parse(source))
    return walker.found


def _allowed(o: Opening) -> bool:
    return (o.module, o.function) in ALLOWED or (o.module, "*") in ALLOWED


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if p.relative_to(ROOT).as_posix() != DOOR)


def test_every_file_read_goes_through_the_door() -> None:
    around = [o for p in _sources() for o in openings(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix())
              if not _allowed(o)]
    assert not around, "opens outside mt/contract/door.py (use the door, or allow-list with a reason):\n" + "\n".join(
        f"  {o.module}:{o.line} {o.function}: {o.call}(...)" for o in around)


def test_every_allow_list_entry_is_still_needed() -> None:
    """An entry whose code went through the door since is taken out, so the list stays short."""
    used = {(o.module, o.function) for p in _sources()
            for o in openings(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix())}
    used |= {(m, "*") for m, _ in used}
    stale = sorted(k for k, why in ALLOWED.items() if k not in used and why != _OWNED)
    assert not stale, f"allow-list entries with no open left: {stale}"


def test_the_walker_flags_a_plain_open_of_a_run_directory_file() -> None:
    snippet = '''
import json, os, numpy as np, torch
from mt.contract import door

def status(run):
    with open(run / "status.json") as f:
        return json.load(f)

class Reader:
    def tail(self, run):
        return (run / "events.jsonl").read_bytes(), np.fromfile(run / "idx"), torch.load(run / "x.pt")

def fine(run, pid):
    with door.open_file(run / "events.jsonl") as f:
        m = np.fromfile(f, dtype="<f8")
    with open(f"/proc/{pid}/stat", "rb") as g:
        return m, g.read(), os.fdopen(1, "w"), door.read_json(run / "status.json")
'''
    found = openings(snippet, "tui/read/example.py")
    assert [(o.function, o.call) for o in found] == [
        ("status", "open"), ("status", "json.load"),
        ("Reader.tail", "?.read_bytes"), ("Reader.tail", "np.fromfile"), ("Reader.tail", "torch.load")]
    assert not _allowed(found[0])
