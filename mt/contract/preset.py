"""Reading presets and config.json into the schema of mt/contract/config.py: types, bounds, cross-key rules.

Every error names the file and the key (`x.toml: train.lr: ...`). Stdlib only.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

from mt.contract import door
from mt.contract.config import Config, ConfigError
from mt.contract.events import JSON_ERRORS
from mt.contract.release import requirement_error

_RULE_TEXT = {"gt": "> {}", "ge": ">= {}", "lt": "< {}", "le": "<= {}"}
_RULE_TEST = {
    "gt": lambda v, b: v > b,
    "ge": lambda v, b: v >= b,
    "lt": lambda v, b: v < b,
    "le": lambda v, b: v <= b,
}


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, list, dict)) else repr(value)


def _coerce(source: str, key: str, tp: Any, value: Any, rules: dict[str, Any]) -> Any:
    bounds = " and ".join(_RULE_TEXT[r].format(b) for r, b in rules.items())
    if typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(source, key, f"expected one of {', '.join(choices)}, got {_show(value)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, key, f"expected true or false, got {_show(value)}")
        return value
    if tp in (int, float):
        ok = isinstance(value, int) if tp is int else isinstance(value, (int, float))
        expected = f"expected {'an integer' if tp is int else 'a number'}{' ' + bounds if bounds else ''}"
        if isinstance(value, bool) or not ok or not all(_RULE_TEST[r](tp(value), b) for r, b in rules.items()):
            raise ConfigError(source, key, f"{expected}, got {_show(value)}")
        return tp(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(source, key, f"expected a string, got {_show(value)}")
        return value
    if typing.get_origin(tp) is dict:
        if not isinstance(value, dict):
            raise ConfigError(source, key, f"expected a table, got {_show(value)}")
        bad = _not_plain(value)
        if bad is not None:
            raise ConfigError(source, f"{key}.{bad[0]}" if bad[0] else key, f"expected a string, number, boolean, list or table, got {bad[1]!r}")
        return value
    if dataclasses.is_dataclass(tp):  # a sub-table such as [train.fsdp]
        return _build(tp, source, key, value)
    if tp == list[str]:
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise ConfigError(source, key, f"expected a list of strings, got {_show(value)}")
        return list(value)
    if typing.get_origin(tp) is list:
        if not isinstance(value, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value
        ):
            raise ConfigError(source, key, f"expected a list of numbers, got {_show(value)}")
        return [float(x) for x in value]
    raise AssertionError(f"unsupported config type {tp!r}")


def _not_plain(value: Any, path: str = "") -> tuple[str, Any] | None:
    """The first value JSON cannot hold as is (a TOML date, say), with where it is."""
    if isinstance(value, dict):
        for k, v in value.items():
            bad = _not_plain(v, f"{path}.{k}" if path else str(k))
            if bad is not None:
                return bad
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            bad = _not_plain(v, f"{path}[{i}]")
            if bad is not None:
                return bad
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return None
    return path, value


_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _build(cls: type, source: str, section: str, table: Any) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(source, section, f"expected a table [{section}], got {_show(table)}")
    hints = typing.get_type_hints(cls)
    # by TOML key: a field named for a Python keyword (checkpoint.async) says its key in metadata
    fields = {f.metadata.get("toml", f.name): f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            known = ", ".join(fields)
            raise ConfigError(source, f"{section}.{key}", f"unknown key (known: {known})")
    kwargs = {}
    for name, f in fields.items():
        key = f"{section}.{name}"
        if name in table:
            rules = {r: b for r, b in f.metadata.items() if r != "toml"}
            kwargs[f.name] = _coerce(source, key, hints[f.name], table[name], rules)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(source, key, "missing (required)")
    return cls(**kwargs)


MAX_NAME = 200
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x1b": "an escape character", "\x00": "a NUL byte"}
# the names and paths a run carries into its folder name, batch script and supervisor's command line
CARRIED = ("run.name", "run.runs_dir", "run.workdir", "launch.script")


def control_char(value: str) -> str | None:
    """The first control character (\\x00-\\x1f, \\x7f) or unpaired surrogate of a name or path, in
    words (`a newline (\\n) at character 4`); None when it has none."""
    m = _CONTROL.search(value) or re.search("[\ud800-\udfff]", value)
    if m is None:
        return None
    ch = m[0]
    what = _NAMES.get(ch, "a control character") if ord(ch) < 0x80 else "a byte that is not UTF-8"
    return f"{what} ({json.dumps(ch)[1:-1]}) at character {m.start() + 1}"


def require_plain(source: str, key: str, value: str) -> None:
    """A name or path a run carries (CARRIED, the preset's own path): no control characters, which
    would end a line of the batch script, of preset.toml or of the terminal; ConfigError naming it."""
    bad = control_char(value)
    if bad is not None:
        raise ConfigError(source, key, f"{bad}: not allowed in a name or path, got {_show(value)}")


_ENDPOINT = re.compile(r"^[A-Za-z0-9_.\-]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$")


def _check(cfg: Config, source: str) -> None:
    """Rules that span several keys."""
    m, t, launch = cfg.model, cfg.train, cfg.launch
    for key in CARRIED:
        section, name = key.split(".")
        require_plain(source, key, getattr(getattr(cfg, section), name))
    if not cfg.run.name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", cfg.run.name):
        raise ConfigError(source, "run.name", f"expected letters, digits, '.', '_' or '-', got {_show(cfg.run.name)}")
    if cfg.run.name.startswith("."):  # `..` escapes runs_dir; a dot folder is hidden from `mt ls`
        raise ConfigError(source, "run.name", f"must not start with '.', got {_show(cfg.run.name)}")
    if len(cfg.run.name) > MAX_NAME:  # the folder adds -YYYYmmdd-HHMMSS[-nodeK][.N]; a file name is <= 255 bytes
        raise ConfigError(source, "run.name", f"at most {MAX_NAME} characters, got {len(cfg.run.name)}")
    if m.kind == "hf":
        _check_hf(m.hf, source)
    if m.kind == "gpt" and m.d_model % m.n_head:
        raise ConfigError(source, "model.n_head", f"must divide model.d_model ({m.d_model}), got {m.n_head}")
    for key, spec, needed in (("model.factory", m.factory, m.kind == "python"),
                              ("data.factory", cfg.data.factory, cfg.data.source == "python"),
                              ("data.collate", cfg.data.collate, False),
                              ("eval.factory", cfg.eval.factory, False)):
        if needed and not spec:
            raise ConfigError(source, key, "required (module:callable, e.g. \"my_models:build\")")
        if spec and not _SPEC.match(spec):
            raise ConfigError(source, key, f"expected module:callable (e.g. \"my_models:build\"), got {_show(spec)}")
    if any(not p for p in cfg.eval.prompts):
        raise ConfigError(source, "eval.prompts", "a prompt is empty: each one is text the model continues")
    if cfg.eval.prompts and m.kind != "hf" and not cfg.data.tokenizer and m.vocab_size < 256:
        raise ConfigError(source, "eval.prompts", f"prompts are read as bytes (no data.tokenizer), so model.vocab_size "
                          f"must be >= 256, got {m.vocab_size}")
    if t.min_lr > t.lr:
        raise ConfigError(source, "train.min_lr", f"must be <= train.lr ({t.lr}), got {t.min_lr}")
    if t.warmup_steps > t.max_steps:
        raise ConfigError(source, "train.warmup_steps", f"must be <= train.max_steps ({t.max_steps}), got {t.warmup_steps}")
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        raise ConfigError(source, "train.betas", f"expected two numbers in [0, 1), got {_show(t.betas)}")
    if launch.rdzv_endpoint:
        if not _ENDPOINT.match(launch.rdzv_endpoint) or not 0 < int(launch.rdzv_endpoint.rsplit(":", 1)[1]) < 65536:
            raise ConfigError(source, "launch.rdzv_endpoint", f"expected host:port, got {_show(launch.rdzv_endpoint)}")
    if launch.node_rank >= launch.nnodes:
        raise ConfigError(source, "launch.node_rank", f"must be < launch.nnodes ({launch.nnodes}), got {launch.node_rank}")
    if cfg.data.source in ("text", "tokens") and not cfg.data.path:
        raise ConfigError(source, "data.path", f"required when data.source = {_show(cfg.data.source)}")
    if cfg.data.tokenizer and cfg.data.source != "text":
        raise ConfigError(source, "data.tokenizer", f"only used with data.source = \"text\", got {_show(cfg.data.source)}")
    if cfg.faults.crash_rank >= cfg.world_size and cfg.faults.crash_at_step:
        raise ConfigError(source, "faults.crash_rank", f"must be < world size ({cfg.world_size})")
    if t.fsdp.wrap and m.kind != "python":
        raise ConfigError(source, "train.fsdp.wrap", f"only for model.kind = \"python\" (mt's GPT and HF models name their blocks), got {_show(m.kind)}")
    if m.kind == "python" and (t.strategy == "fsdp" or t.activation_checkpointing) and not t.fsdp.wrap:
        what = "train.strategy = \"fsdp\"" if t.strategy == "fsdp" else "train.activation_checkpointing"
        raise ConfigError(source, "train.fsdp.wrap", f"{what} with a factory model needs its block class names, e.g. wrap = [\"MyBlock\"]")
    if cfg.faults.overflow_at_step and t.precision != "fp16":
        raise ConfigError(source, "faults.overflow_at_step", f"needs train.precision = \"fp16\", got {_show(t.precision)}")
    if cfg.checkpoint.async_ and cfg.checkpoint_format != "sharded":
        raise ConfigError(source, "checkpoint.async", "needs sharded checkpoints (checkpoint.format = \"sharded\", "
                          "or \"auto\" under train.strategy = \"fsdp\"); full checkpoints are written blocking")
    if cfg.faults.hang_rank >= cfg.world_size and (cfg.faults.hang_at_step or cfg.faults.hang_at_exit):
        raise ConfigError(source, "faults.hang_rank", f"must be < world size ({cfg.world_size})")
    if cfg.faults.slow_rank >= cfg.world_size and cfg.faults.slow_step_s:
        raise ConfigError(source, "faults.slow_rank", f"must be < world size ({cfg.world_size})")
    for i, text in enumerate(cfg.release.require):
        if (bad := requirement_error(text)) is not None:
            raise ConfigError(source, f"release.require[{i}]", bad)
    _check_slurm(cfg, source)


# sbatch --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (Slurm's own list), or unlimited
_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}(:\d{1,2})?)?|unlimited|infinite)$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.,\-]*$")  # partitions, accounts, qos: what lands in an #SBATCH line


def sbatch_option(line: str) -> str:
    """An [slurm] extra entry as the sbatch option it is (`#SBATCH --hold` and `--hold` alike)."""
    line = line.strip()
    return line[len("#SBATCH"):].strip() if line.startswith("#SBATCH") else line


def _check_slurm(cfg: Config, source: str) -> None:
    """[slurm] values that sbatch would refuse, or that would break the batch script, named here."""
    s = cfg.slurm
    if s.time and not _SLURM_TIME.match(s.time):
        raise ConfigError(source, "slurm.time", f"expected Slurm's time format (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                                                f"D-HH:MM:SS), got {_show(s.time)}")
    for key in ("partition", "account", "qos"):
        if not _SLURM_NAME.match(getattr(s, key)):
            raise ConfigError(source, f"slurm.{key}", f"expected letters, digits, '.', '_', ',' or '-', got {_show(getattr(s, key))}")
    for i, line in enumerate(s.extra):
        if not sbatch_option(line).startswith("-") or control_char(line):   # a newline would end its #SBATCH line
            raise ConfigError(source, f"slurm.extra[{i}]", f"expected one sbatch option such as \"--hold\", got {_show(line)}")
        if any(c.isspace() for c in sbatch_option(line).split("=", 1)[0]):  # one #SBATCH line is one option
            raise ConfigError(source, f"slurm.extra[{i}]", f"one option per entry, got {_show(line)}")


def _check_hf(hf: dict[str, Any], source: str) -> None:
    """[model.hf] names a local folder or a model_type; never a hub id (nothing is downloaded)."""
    path, model_type = hf.get("path"), hf.get("model_type")
    if path is not None and not isinstance(path, str):
        raise ConfigError(source, "model.hf.path", f"expected a folder, got {_show(path)}")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(source, "model.hf.model_type", f"expected a string such as \"gpt2\", got {_show(model_type)}")
    if bool(path) == bool(model_type):
        raise ConfigError(source, "model.hf", "set model_type (a config built here) or path (a local folder), not both"
                          if path else "needs model_type (e.g. \"gpt2\" with n_layer, n_embd, ...) or path (a local folder)")


def config_from_dict(raw: dict[str, Any], source: str) -> Config:
    """Validate a parsed preset (or config.json) and fill in every default."""
    sections = {f.name: f for f in dataclasses.fields(Config)}
    for key in raw:
        if key not in sections:
            raise ConfigError(source, key, f"unknown section (known: {', '.join(sections)})")
    if "run" not in raw:
        raise ConfigError(source, "run", "missing section [run] (it needs at least name)")
    hints = typing.get_type_hints(Config)
    parts = {name: _build(hints[name], source, name, raw.get(name, {})) for name in sections}
    cfg = Config(**parts)
    _check(cfg, source)
    return cfg


def require_rendezvous(cfg: Config, source: str) -> None:
    """Several nodes started by hand (`--node-rank K`) must be told where to meet; under Slurm
    (`--slurm`) the allocation says (tui/cluster/slurm.py), so this is not part of the preset's checks."""
    if cfg.launch.nnodes > 1 and not cfg.launch.rdzv_endpoint:
        raise ConfigError(source, "launch.rdzv_endpoint",
                          f"required when launch.nnodes > 1 (got nnodes = {cfg.launch.nnodes}), unless mt launch --slurm")


def load_preset(path: str | Path) -> Config:
    """Read and validate a TOML preset; a relative data path is made absolute from the cwd."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "", "no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(source, "", f"cannot read: {e}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, "", f"invalid TOML: {e}") from None
    cfg = config_from_dict(raw, source)
    for section, key in ((cfg.data, "path"), (cfg.data, "tokenizer"), (cfg.model, "init_from"), (cfg.run, "workdir"),
                         (cfg.launch, "script")):
        value = getattr(section, key)
        if value and not Path(value).expanduser().is_absolute():
            setattr(section, key, str(Path(value).expanduser().resolve()))
    hf_path = cfg.model.hf.get("path")
    if isinstance(hf_path, str) and hf_path and not Path(hf_path).expanduser().is_absolute():
        cfg.model.hf["path"] = str(Path(hf_path).expanduser().resolve())
    return cfg


def _not_a_file(p: Path) -> str:
    """What a path that is not a regular file is instead (for the one-line error)."""
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot read ({e.strerror})"
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return f"{what}, not a regular file"
    return "not a regular file"


def check_paths(cfg: Config, source: str) -> None:
    """The files a preset names must exist before a run is created for them."""
    if cfg.data.source in ("text", "tokens"):
        p = Path(cfg.data.path)
        if not p.is_file():
            raise ConfigError(source, "data.path", f"{_not_a_file(p)}: {p}")
    hf_path = cfg.model.hf.get("path") if cfg.model.kind == "hf" else None
    if hf_path and not Path(hf_path).expanduser().is_dir():
        raise ConfigError(source, "model.hf.path", f"not a local folder: {hf_path} (mt never downloads models)")
    if cfg.model.init_from and not Path(cfg.model.init_from).expanduser().exists():
        raise ConfigError(source, "model.init_from", f"no such file or run directory: {cfg.model.init_from}")
    if cfg.launch.script and not Path(cfg.launch.script).is_file():
        what = "a folder, not a script" if Path(cfg.launch.script).is_dir() else "no such file"
        raise ConfigError(source, "launch.script", f"{what}: {cfg.launch.script}")
    if cfg.run.workdir and not Path(cfg.run.workdir).is_dir():
        raise ConfigError(source, "run.workdir", f"no such folder: {cfg.run.workdir}")


def load_config_json(path: str | Path) -> Config:
    """Read a run's resolved `config.json`."""
    source = str(path)
    try:
        data = door.read_bytes(path, door.SMALL_JSON)
    except FileNotFoundError:
        raise ConfigError(source, "", "no such file") from None
    except OSError as e:    # refused by the door: a FIFO, a device, a link, too big
        raise ConfigError(source, "", str(e).removeprefix(f"{source}: ")) from None
    try:
        raw = json.loads(data)
    except JSON_ERRORS as e:
        raise ConfigError(source, "", f"not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(source, "", "expected a JSON object")
    return config_from_dict(raw, source)


def script_run_name(name: str) -> str:
    """A run name made from a script's file name (or a name given in code): characters run.name
    does not take become '-'."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", name).strip(".-") or "script"


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(value: str) -> str:
    """`value` as a TOML basic string that tomllib reads back exactly: quote, backslash and every control
    character (DEL too) escaped, as the TOML spec requires; an unpaired surrogate (a byte of an
    argument that was not UTF-8) has no TOML form and becomes U+FFFD."""
    out = []
    for ch in value:
        code = ord(ch)
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\uFFFD")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def write_script_preset(path: Path, cfg: Config, why: str) -> None:
    """The preset.toml of a run of a script (`mt launch train.py`, or mt.init on its own), new and 0600."""
    q = toml_string
    why = _CONTROL.sub("?", why)   # a comment ends at the line's end: nothing of `why` may start a new one
    lines = [f"# {why}", "[run]", f"name = {q(cfg.run.name)}", f"runs_dir = {q(cfg.run.runs_dir)}",
             "", "[launch]", f"script = {q(cfg.launch.script)}",
             f"script_args = [{', '.join(q(a) for a in cfg.launch.script_args)}]",
             f"nproc_per_node = {cfg.launch.nproc_per_node}", f"nnodes = {cfg.launch.nnodes}", ""]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
