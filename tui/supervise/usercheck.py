"""The check of a preset's own code that `mt launch` runs before anything exists, and its cache.

The check (`python -P -m engine.user --check`) imports torch and the user's modules: about 3 s.
A passed check is remembered in `<runs_dir>/.checks/<key>.json`, keyed by the preset's model and
data sections, the interpreter and PYTHONPATH, with the (mtime, size) of every file the check
imported (the user's modules, each installed package's `__init__`, the checker itself): the
next launch with nothing changed skips the subprocess. A failed check is never remembered.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mt.contract.config import Config, ConfigError
from mt.contract.jsonl import read_json, write_json_atomic

CACHE_FORMAT = 1


@dataclass(frozen=True)
class UserCheck:
    """What a passed check found: the files it rests on, and an HF config's vocab_size."""

    files: dict[str, list[int]]   # path -> [mtime_ns, size] when the check ran
    model_vocab: int | None
    cached: bool = False


def needs_check(cfg: Config) -> bool:
    """Only a preset naming user code or an HF model has anything to import."""
    return cfg.model.kind != "gpt" or cfg.data.source == "python" or bool(cfg.data.collate) or bool(cfg.eval.factory)


def cache_dir(runs_dir: str | Path) -> Path:
    """Beside the runs (a dot folder: `mt ls` skips it), like the token caches."""
    return Path(runs_dir).expanduser().resolve() / ".checks"


def cache_key(cfg: Config) -> str:
    raw = cfg.to_dict()
    data = {k: v for k, v in raw["data"].items() if k not in ("token_cache", "token_dtype")}  # set by the launch
    what = {"format": CACHE_FORMAT, "model": raw["model"], "data": data, "eval": cfg.eval.factory, "workdir": cfg.run.workdir,
            "python": sys.executable, "pythonpath": os.environ.get("PYTHONPATH", "")}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def cached(cfg: Config) -> UserCheck | None:
    """The remembered check of this preset, if every file it rests on is as it was."""
    entry = read_json(cache_dir(cfg.run.runs_dir) / f"{cache_key(cfg)}.json")
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), dict) or not entry["files"]:
        return None
    if any(_stat(path) != st for path, st in entry["files"].items()):
        return None
    vocab = entry.get("model_vocab")
    return UserCheck(entry["files"], vocab if isinstance(vocab, int) else None, cached=True)


def remember(cfg: Config, check: UserCheck | None) -> None:
    """Keep a passed check for the next launch (after the run exists: bad input leaves nothing)."""
    if check is None or check.cached:
        return
    folder = cache_dir(cfg.run.runs_dir)
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        write_json_atomic(folder / f"{cache_key(cfg)}.json", {"files": check.files, "model_vocab": check.model_vocab})
    except OSError:
        pass  # only a cache: the next launch checks again


def check_user_code(cfg: Config, source: str) -> UserCheck | None:
    """Import the preset's factories and bind their args in a short subprocess (it may import
    torch, which this process never does), or reuse a passed check; a problem is a ConfigError naming the key."""
    if not needs_check(cfg):
        return None
    hit = cached(cfg)
    if hit is not None:
        return hit
    try:
        proc = subprocess.run([sys.executable, "-P", "-m", "engine.user", "--check"], input=json.dumps(cfg.to_dict()),
                              capture_output=True, text=True, cwd=cfg.run.workdir or None, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        raise ConfigError(source, checked_key(cfg), "checking the preset's code took over 300 s") from None
    last = (proc.stdout.strip().splitlines() or ["\t"])[-1]
    if proc.returncode == 0:
        return _passed(last)
    key, _, message = last.partition("\t")
    if not message:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(source, checked_key(cfg), f"checking the preset's code failed: {tail}")
    raise ConfigError(source, key, message)


def checked_key(cfg: Config) -> str:
    """The preset key a check that ended without naming one is about (a preset without a factory
    must not hear of one)."""
    if cfg.model.kind == "python":
        return "model.factory"
    if cfg.model.kind == "gpt" and cfg.eval.factory and cfg.data.source != "python" and not cfg.data.collate:
        return "eval.factory"
    if cfg.model.kind == "hf":
        return "model.hf"
    return "data.factory" if cfg.data.source == "python" else "data.collate"


def _passed(line: str) -> UserCheck:
    """The check's JSON line; the files are stat'ed here, right after it ran."""
    try:
        found: Any = json.loads(line)
    except ValueError:
        found = {}
    files = found.get("files") if isinstance(found, dict) else None
    stats = {p: st for p in files if isinstance(p, str) and (st := _stat(p))} if isinstance(files, list) else {}
    vocab = found.get("model_vocab") if isinstance(found, dict) else None
    return UserCheck(stats, vocab if isinstance(vocab, int) else None)
