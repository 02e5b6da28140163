"""The preset schema: one dataclass per TOML table, validated once at load. Stdlib only.

Both sides import this: the CLI to validate a preset before anything starts, the engine to
read `config.json` back. Every error names the file and the key (`x.toml: train.lr: ...`).
"""
from __future__ import annotations

import dataclasses
import json
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# Hugging Face libraries read these when imported: no download, no hub lookup, no telemetry.
# Every worker gets them (tui/run/torchrun.py), and engine/hf.py sets them before importing.
HF_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
              "HF_HUB_DISABLE_TELEMETRY": "1"}


class ConfigError(ValueError):
    """A preset or config.json that cannot be used; str() is the one line to show the user."""

    def __init__(self, source: str, key: str, message: str) -> None:
        self.source, self.key, self.message = source, key, message
        where = f"{source}: {key}: " if key else f"{source}: "
        super().__init__(where + message)


def _c(default: Any = dataclasses.MISSING, **rules: Any) -> Any:
    """A field with validation rules (gt, ge, le, lt) kept in its metadata."""
    if isinstance(default, list):
        return field(default_factory=lambda d=default: list(d), metadata=rules)
    return field(default=default, metadata=rules)


@dataclass
class RunConfig:
    name: str = _c()
    """Run name; the run directory is `<name>-<YYYYmmdd-HHMMSS>`."""
    runs_dir: str = "runs"
    seed: int = _c(42, ge=0)
    workdir: str = ""
    """The folder user factories are imported from (first, then PYTHONPATH); `mt launch` fills in its own."""


@dataclass
class LaunchConfig:
    nproc_per_node: int = _c(1, ge=1)
    nnodes: int = _c(1, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_restarts: int = _c(0, ge=0)
    """Fresh attempts from the newest checkpoint after a worker dies (not torchrun's in-place)."""
    rdzv_endpoint: str = ""
    """host:port of the c10d rendezvous, required when nnodes > 1."""
    node_rank: int = _c(0, ge=0)
    pg_timeout_s: float = _c(300.0, gt=0)
    """Process-group timeout; gloo's default of 30 minutes hides a hung rank far too long."""


@dataclass
class ModelConfig:
    kind: Literal["gpt", "python", "hf"] = "gpt"
    """gpt: mt's own; python: `factory(**args)` returns any torch.nn.Module; hf: a transformers
    causal LM from [model.hf] (docs/presets.md)."""
    factory: str = ""
    """module:callable building the model (kind = "python")."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the factory ([model.args]): any TOML values."""
    hf: dict[str, Any] = field(default_factory=dict)
    """kind = "hf": `model_type` plus config keys (AutoConfig.for_model), or `path` = a local folder."""
    init_from: str = ""
    """Start from these weights (step 0, fresh optimizer): an mt run directory, a checkpoints/step-N
    folder, a .pt state dict or a .safetensors file."""
    vocab_size: int = _c(256, ge=2)
    n_layer: int = _c(4, ge=1)
    n_head: int = _c(4, ge=1)
    d_model: int = _c(128, ge=1)
    seq_len: int = _c(128, ge=2)
    dropout: float = _c(0.0, ge=0, lt=1)


@dataclass
class DataConfig:
    source: Literal["synthetic", "text", "tokens", "python"] = "synthetic"
    factory: str = ""
    """module:callable, `factory(split, **args)` -> a map-style Dataset, or None for no "val" split."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the data factory ([data.args])."""
    collate: str = ""
    """module:callable collating a list of samples into a batch (default: torch's default collate)."""
    path: str = ""
    """Text file (byte tokens) or flat binary token file; relative to where `mt launch` runs."""
    tokenizer: str = ""
    """A `tokenizers` JSON file for source = "text" (the hf extra); without it text is read as bytes."""
    token_cache: str = ""
    """Set by `mt launch` for text with a tokenizer: the token file it made, `<runs_dir>/.tokens/<key>.bin`."""
    token_dtype: Literal["uint16", "uint32"] = "uint16"
    """Element type of a tokens file (and of the token cache, where `mt launch` sets it)."""
    num_workers: int = _c(0, ge=0)
    val_fraction: float = _c(0.05, ge=0, lt=1)
    synthetic_samples: int = _c(8192, ge=1)
    """Number of sequences the synthetic source holds (one epoch)."""


@dataclass
class TrainConfig:
    micro_batch_size: int = _c(8, ge=1)
    grad_accum_steps: int = _c(1, ge=1)
    max_steps: int = _c(100, ge=1)
    lr: float = _c(1e-3, gt=0)
    min_lr: float = _c(1e-4, ge=0)
    warmup_steps: int = _c(0, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    weight_decay: float = _c(0.1, ge=0)
    betas: list[float] = _c([0.9, 0.95])
    grad_clip: float = _c(1.0, ge=0)
    """0 disables clipping."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    log_every: int = _c(1, ge=1)
    eval_every: int = _c(0, ge=0)
    eval_batches: int = _c(8, ge=1)
    on_nan: Literal["skip", "stop"] = "skip"
    allow_batch_change: bool = False
    """Resume with another global batch size only when this says it is intended."""


@dataclass
class CheckpointConfig:
    every_steps: int = _c(0, ge=0)
    keep_last: int = _c(3, ge=1)


@dataclass
class MonitorConfig:
    """Thresholds of the diagnosis rules (mt/anomaly.py on rank 0, tui/diagnose/ in the supervisor)."""

    stall_window_s: float = _c(20.0, gt=0)
    """Only steps (and GPU samples) this recent count towards a dataloader stall."""
    stall_steps: int = _c(4, ge=1)
    """The data-wait share is taken over this many most recent steps."""
    stall_gpu_util_pct: float = _c(10.0, ge=0, le=100)
    """GPUs at or below this mean utilisation over stall_window_s count as idle (NVML only)."""
    stall_data_share: float = _c(0.5, gt=0, le=1)
    """Share of step time spent waiting for data that makes a stall (half of it with idle GPUs)."""
    stall_min_wait_s: float = _c(0.5, ge=0)
    """Total data wait over those steps must also exceed this (ms-scale jitter is no stall)."""
    spike_mads: float = _c(8.0, gt=0)
    """A loss spike is this many noise sigmas (robust, from step-to-step differences) above the median."""
    spike_min_jump: float = _c(0.5, gt=0)
    """Relative jump over the rolling median a spike must also exceed."""
    spike_min_history: int = _c(20, ge=3)
    """Steps of history before loss and grad-norm spikes are judged (per attempt)."""
    spike_window: int = _c(100, ge=5)
    """Steps in the loss-noise estimate and in the grad-norm rolling median."""
    grad_explosion_factor: float = _c(10.0, gt=1)
    """Grad norm this many times its rolling median is an explosion."""
    clip_active_share: float = _c(0.9, gt=0, le=1)
    """Clipping on this share of the last clip_window steps is reported (info)."""
    clip_window: int = _c(50, ge=1)
    """Steps over which the clipped share is measured (only after the first spike_window)."""
    overflow_window: int = _c(20, ge=1)
    """fp16: steps in which skipped steps are counted."""
    overflow_max_skipped: int = _c(5, ge=1)
    """fp16: this many skipped steps in the window is an overflow incident."""
    overflow_min_scale: float = _c(1.0, gt=0)
    """A GradScaler loss scale below this has collapsed: the gradients overflow even unscaled."""
    close_after_steps: int = _c(10, ge=1)
    """An engine-side incident closes after this many clean logged steps."""
    close_after_s: float = _c(15.0, ge=0)
    """An incident stays open at least this long, and closes once clear this long."""
    throughput_drop_share: float = _c(0.5, gt=0, lt=1)
    """Tokens/s below this share of the run's own median is a drop."""
    throughput_window_s: float = _c(30.0, gt=0)
    """The low rate must hold for half of this window (eval/checkpoint steps excluded)."""
    hang_floor_s: float = _c(30.0, gt=0)
    """No step for max(this, hang_step_factor x the median step interval) is a hang."""
    hang_step_factor: float = _c(20.0, gt=1)
    straggler_steps: int = _c(3, ge=1)
    """A rank's heartbeat this many steps behind the leading one, steadily, is a straggler."""
    memory_pressure_share: float = _c(0.95, gt=0, le=1)
    """GPU memory above this share of total, for all of memory_window_s, is pressure."""
    memory_window_s: float = _c(30.0, gt=0)


@dataclass
class FaultsConfig:
    """Injected faults for demos and tests; 0 means off. They run the real code paths."""

    stall_at_step: int = _c(0, ge=0)
    stall_seconds: float = _c(0.0, ge=0)
    nan_at_step: int = _c(0, ge=0)
    crash_at_step: int = _c(0, ge=0)
    crash_rank: int = _c(0, ge=0)
    hang_at_step: int = _c(0, ge=0)
    hang_rank: int = _c(0, ge=0)
    overflow_at_step: int = _c(0, ge=0)
    """fp16 only: scale the loss to inf at this step so the GradScaler skips it."""
    step_sleep_s: float = _c(0.0, ge=0)
    """Sleep this long in every step (slows a demo down to watchable speed)."""
    crash_in_checkpoint_at_step: int = _c(0, ge=0)
    """Rank 0 dies (SIGKILL-like) after writing the first file of this step's checkpoint."""


@dataclass
class DebugConfig:
    trace_samples: bool = False
    """Each rank appends the dataset indices it trained on to trace/rank<N>.jsonl."""


@dataclass
class Config:
    run: RunConfig
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def world_size(self) -> int:
        return self.launch.nproc_per_node * self.launch.nnodes


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
        if isinstance(value, bool) or not ok:
            noun = "an integer" if tp is int else "a number"
            raise ConfigError(source, key, f"expected {noun}{' ' + bounds if bounds else ''}, got {_show(value)}")
        value = tp(value)
        for rule, bound in rules.items():
            if not _RULE_TEST[rule](value, bound):
                noun = "an integer" if tp is int else "a number"
                raise ConfigError(source, key, f"expected {noun} {bounds}, got {_show(value)}")
        return value
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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            known = ", ".join(fields)
            raise ConfigError(source, f"{section}.{key}", f"unknown key (known: {known})")
    kwargs = {}
    for name, f in fields.items():
        key = f"{section}.{name}"
        if name in table:
            kwargs[name] = _coerce(source, key, hints[name], table[name], dict(f.metadata))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(source, key, "missing (required)")
    return cls(**kwargs)


_ENDPOINT = re.compile(r"^[A-Za-z0-9_.\-]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$")


def _check(cfg: Config, source: str) -> None:
    """Rules that span several keys."""
    m, t, launch = cfg.model, cfg.train, cfg.launch
    if not cfg.run.name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", cfg.run.name):
        raise ConfigError(source, "run.name", f"expected letters, digits, '.', '_' or '-', got {_show(cfg.run.name)}")
    if m.kind == "hf":
        _check_hf(m.hf, source)
    if m.kind == "gpt" and m.d_model % m.n_head:
        raise ConfigError(source, "model.n_head", f"must divide model.d_model ({m.d_model}), got {m.n_head}")
    for key, spec, needed in (("model.factory", m.factory, m.kind == "python"),
                              ("data.factory", cfg.data.factory, cfg.data.source == "python"),
                              ("data.collate", cfg.data.collate, False)):
        if needed and not spec:
            raise ConfigError(source, key, "required (module:callable, e.g. \"my_models:build\")")
        if spec and not _SPEC.match(spec):
            raise ConfigError(source, key, f"expected module:callable (e.g. \"my_models:build\"), got {_show(spec)}")
    if t.min_lr > t.lr:
        raise ConfigError(source, "train.min_lr", f"must be <= train.lr ({t.lr}), got {t.min_lr}")
    if t.warmup_steps > t.max_steps:
        raise ConfigError(source, "train.warmup_steps", f"must be <= train.max_steps ({t.max_steps}), got {t.warmup_steps}")
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        raise ConfigError(source, "train.betas", f"expected two numbers in [0, 1), got {_show(t.betas)}")
    if launch.rdzv_endpoint:
        if not _ENDPOINT.match(launch.rdzv_endpoint) or not 0 < int(launch.rdzv_endpoint.rsplit(":", 1)[1]) < 65536:
            raise ConfigError(source, "launch.rdzv_endpoint", f"expected host:port, got {_show(launch.rdzv_endpoint)}")
    elif launch.nnodes > 1:
        raise ConfigError(source, "launch.rdzv_endpoint", f"required when launch.nnodes > 1 (got nnodes = {launch.nnodes})")
    if launch.node_rank >= launch.nnodes:
        raise ConfigError(source, "launch.node_rank", f"must be < launch.nnodes ({launch.nnodes}), got {launch.node_rank}")
    if cfg.data.source in ("text", "tokens") and not cfg.data.path:
        raise ConfigError(source, "data.path", f"required when data.source = {_show(cfg.data.source)}")
    if cfg.data.tokenizer and cfg.data.source != "text":
        raise ConfigError(source, "data.tokenizer", f"only used with data.source = \"text\", got {_show(cfg.data.source)}")
    if cfg.faults.crash_rank >= cfg.world_size and cfg.faults.crash_at_step:
        raise ConfigError(source, "faults.crash_rank", f"must be < world size ({cfg.world_size})")
    if cfg.faults.overflow_at_step and t.precision != "fp16":
        raise ConfigError(source, "faults.overflow_at_step", f"needs train.precision = \"fp16\", got {_show(t.precision)}")
    if cfg.faults.hang_rank >= cfg.world_size and cfg.faults.hang_at_step:
        raise ConfigError(source, "faults.hang_rank", f"must be < world size ({cfg.world_size})")


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
    for section, key in ((cfg.data, "path"), (cfg.data, "tokenizer"), (cfg.model, "init_from"), (cfg.run, "workdir")):
        value = getattr(section, key)
        if value and not Path(value).expanduser().is_absolute():
            setattr(section, key, str(Path(value).expanduser().resolve()))
    hf_path = cfg.model.hf.get("path")
    if isinstance(hf_path, str) and hf_path and not Path(hf_path).expanduser().is_absolute():
        cfg.model.hf["path"] = str(Path(hf_path).expanduser().resolve())
    return cfg


def check_paths(cfg: Config, source: str) -> None:
    """The files a preset names must exist before a run is created for them."""
    if cfg.data.source in ("text", "tokens"):
        p = Path(cfg.data.path)
        if not p.is_file():
            raise ConfigError(source, "data.path", f"no such file: {p}")
    hf_path = cfg.model.hf.get("path") if cfg.model.kind == "hf" else None
    if hf_path and not Path(hf_path).expanduser().is_dir():
        raise ConfigError(source, "model.hf.path", f"not a local folder: {hf_path} (mt never downloads models)")
    if cfg.model.init_from and not Path(cfg.model.init_from).expanduser().exists():
        raise ConfigError(source, "model.init_from", f"no such file or run directory: {cfg.model.init_from}")
    if cfg.run.workdir and not Path(cfg.run.workdir).is_dir():
        raise ConfigError(source, "run.workdir", f"no such folder: {cfg.run.workdir}")


def load_config_json(path: str | Path) -> Config:
    """Read a run's resolved `config.json`."""
    source = str(path)
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(source, "", "no such file") from None
    except (OSError, ValueError) as e:
        raise ConfigError(source, "", f"not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(source, "", "expected a JSON object")
    return config_from_dict(raw, source)
