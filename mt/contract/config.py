"""The preset schema: one dataclass per TOML table, validated once at load. Stdlib only.

Both sides import this; mt/contract/preset.py reads a preset or config.json into it, checking every value.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

# Hugging Face libraries read these when imported: no download, no hub lookup, no telemetry.
# Every worker gets them (tui/supervise/torchrun.py), and engine/kinds/hf.py sets them before importing.
HF_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
              "HF_HUB_DISABLE_TELEMETRY": "1"}

# A worker started without torchrun (one process) serves its process group's store on the
# loopback socket its supervisor bound and handed down as this descriptor (engine/direct.py).
STORE_FD_ENV = "MT_STORE_FD"


class ConfigError(ValueError):
    """A preset or config.json that cannot be used; str() is the one line to show the user."""

    def __init__(self, source: str, key: str, message: str) -> None:
        self.source, self.key, self.message = source, key, message
        where = f"{source}: {key}: " if key else f"{source}: "
        super().__init__(where + message)

    def __reduce__(self) -> tuple:
        return type(self), (self.source, self.key, self.message)  # args holds the joined line only


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
    exit_grace_s: float = _c(60.0, gt=0)
    """A rank whose work is done (run_end and checkpoints written) ends itself if its shutdown
    (destroy_process_group, exit handlers) has not returned after this many seconds."""
    script: str = ""
    """A training script of the user's own (`train.py`) run on every rank instead of mt's engine;
    it reports through the `mt` library ([model], [data], [train] are then unused)."""
    script_args: list[str] = _c([])
    """Command-line arguments for the script (`mt launch train.py -- ARGS`)."""


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
    bias: bool = True
    """Biases in the GPT's Linear and LayerNorm layers (GPT-2 has them; LLaMA-style configs and
    nanoGPT's `bias = False` do not, and train a little faster without them)."""


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
class FsdpConfig:
    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward (gather again in backward): less memory."""
    param_dtype: Literal["", "bf16", "fp32"] = ""
    """The dtype blocks compute in; "" follows train.precision (bf16 runs: bf16, gradients reduced in fp32)."""
    wrap: list[str] = _c([])
    """Class names of a factory model's blocks, each sharded on its own (mt's GPT and HF models: found)."""


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
    on_nan: Literal["skip", "stop", "rollback"] = "skip"
    on_spike: Literal["none", "rollback"] = "none"
    """rollback: a loss spike (mt/rules.py) rolls the run back as on_nan = "rollback" does."""
    rollback_skip_batches: int = _c(0, ge=0)
    """Batches an automatic rollback skips; 0: every batch from the checkpoint through the bad step."""
    rollback_budget: int = _c(3, ge=0)
    """Automatic rollbacks allowed per run; past it the run stops (a NaN) or goes on (a spike)."""
    allow_batch_change: bool = False
    """Resume with another global batch size only when this says it is intended."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """ddp: every rank holds the whole model; fsdp: FSDP2 fully_shard of each block, then the root."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward instead of keeping them: memory for compute."""
    compile: bool = False
    """torch.compile (mode "default") each block in place (a factory model without fsdp.wrap: the whole
    model); on CPU it needs a C++ compiler (checked at launch)."""
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)


@dataclass
class EvalConfig:
    """What each eval adds to the validation loss (docs/presets.md#eval); when it runs: [train] eval_every."""

    prompts: list[str] = _c([])
    """Continued at each eval by the model (mt's GPT, an HF model, a factory model with `generate`): `sample` events."""
    max_new_tokens: int = _c(32, ge=1, le=4096)
    temperature: float = _c(1.0, ge=0)
    """0: greedy; else sampled from a generator seeded by (run.seed, step), so a resume repeats them."""
    factory: str = ""
    """module:callable, `fn(model, step) -> {name: number}` at each eval: the eval event's metrics."""


@dataclass
class CheckpointConfig:
    every_steps: int = _c(0, ge=0)
    keep_last: int = _c(3, ge=1)
    format: Literal["auto", "full", "sharded"] = "auto"
    """full: whole state dicts gathered to rank 0; sharded: torch.distributed.checkpoint, every
    rank writes its shards; auto: sharded under train.strategy = "fsdp", full under ddp."""
    async_: bool = field(default=False, metadata={"toml": "async"})  # `async` is a Python keyword
    """The loop waits only while the state is copied to CPU; the write finishes in the background (sharded only)."""
    keep_best: int = _c(0, ge=0)
    """The best N checkpoints by best_metric (the eval at their own step) are never deleted by keep_last; 0: none."""
    best_metric: str = "val_loss"
    """The eval's `val_loss`, or a name of its `metrics` (`[eval] factory`)."""
    best_mode: Literal["min", "max"] = "min"


@dataclass
class ReleaseConfig:
    require: list[str] = _c([])
    """What `mt release` requires at the released step, each `NAME OP NUMBER` (mt/contract/release.py)."""


@dataclass
class MonitorConfig:
    """Thresholds of the diagnosis rules (mt/rules.py on rank 0, tui/diagnose/ in the supervisor)."""

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
    spike_min_abs: float = _c(0.05, ge=0)
    """And its rise over the median in loss units: near zero loss a relative jump is noise."""
    spike_min_history: int = _c(20, ge=3)
    """Steps of history before loss and grad-norm spikes are judged (per attempt)."""
    spike_window: int = _c(100, ge=5)
    """Steps in the loss-noise estimate and in the grad-norm rolling median."""
    grad_explosion_factor: float = _c(10.0, gt=1)
    """Grad norm this many times its rolling median is an explosion."""
    grad_explosion_min_norm: float = _c(0.1, ge=0)
    """A grad norm at or below this is never an explosion (a converged run's norms jump 10x at 1e-3)."""
    clip_active_share: float = _c(0.9, gt=0, le=1)
    """Clipping on this share of the last clip_window steps is reported (info)."""
    clip_window: int = _c(50, ge=1)
    """Steps over which the clipped share is measured (only after the first spike_window)."""
    overflow_window: int = _c(20, ge=1)
    """fp16: steps in which skipped steps are counted."""
    overflow_max_skipped: int = _c(5, ge=1)
    """fp16: this many skipped steps in the window is an overflow incident."""
    replay_on_nan: bool = False
    """After the run ends, its supervisor replays to the newest NaN incident's step (`mt replay`): the incident gains its cause."""
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
    """No step for max(this, hang_step_factor x the median step interval) is a hang, whatever the
    ranks show; one rank stopped while the others wait in a collective is named sooner (docs/events.md)."""
    hang_step_factor: float = _c(20.0, gt=1)
    """No step for this many median step intervals (3 s at least) makes a hang suspected."""
    hang_timeout_s: float = _c(300.0, ge=0)
    """A hang verdict this old ends the attempt (stacks kept): a restart from the newest checkpoint
    within [launch] max_restarts, else the run fails with the verdict as its reason; 0: never."""
    straggler_steps: int = _c(3, ge=1)
    """A rank's heartbeat this many steps behind the leading one, steadily, is a straggler."""
    memory_pressure_share: float = _c(0.95, gt=0, le=1)
    """GPU memory above this share of total, for all of memory_window_s, is pressure."""
    memory_window_s: float = _c(30.0, gt=0)
    tensorboard: str = ""
    """Mirror the run into TensorBoard event files in this folder (relative: to the run directory),
    written by the supervisor; needs the tensorboard extra. Empty: no mirror."""
    wandb: dict[str, Any] = field(default_factory=dict)
    """Mirror the run into one W&B run: { project = "...", entity = "...", mode = "offline" } (offline unless
    mode says otherwise; also name, group); needs the wandb extra. Empty: no mirror."""
    notify: list[str] = _c([])
    """Apprise URLs (`ntfy://topic`, `slack://...`, `mailto://...`, `json://host/path`) the supervisor tells of
    incidents, automatic rollbacks and the run's end; needs the notify extra. Empty: no notifications."""
    notify_severity: Literal["info", "warn", "error"] = "warn"
    """The lowest incident severity that notifies."""
    notify_repeat_s: float = _c(300.0, ge=0)
    """An incident kind notifies at most once per this many seconds (the rest is summed up in the next one)."""
    notify_per_minute: int = _c(6, ge=1)
    """At most this many notifications a minute (the run's end always goes)."""


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
    fail_checkpoint_at_step: int = _c(0, ge=0)
    """Rank 0's write of this step's checkpoint raises OSError after its first file (async: a checkpoint_failed incident)."""
    hang_at_exit: bool = False
    """`hang_rank` hangs once its work is done, where destroy_process_group runs (as a hung shutdown would)."""
    step_work_s: float = _c(0.0, ge=0)
    """Every rank spends this long in every step's forward (timed as compute, unlike step_sleep_s), every attempt."""
    slow_rank: int = _c(0, ge=0)
    slow_step_s: float = _c(0.0, ge=0)
    """`slow_rank` spends this much longer in every step's forward (a slower device), every attempt."""
    slow_checkpoint_s: float = _c(0.0, ge=0)
    """Rank 0 sleeps this long in every checkpoint write, after its first file (a slow filesystem)."""
    module: str = ""
    """A module's qualified name (e.g. "blocks.1.mlp"): module_fault hits its output at module_at_step on module_rank."""
    module_at_step: int = _c(0, ge=0)
    module_rank: int = _c(0, ge=0)
    module_fault: Literal["nan", "inf", "grad_nan", "spike"] = "nan"
    """nan or inf: its output becomes non-finite; grad_nan: the gradient at its output; spike: its output x 100."""


@dataclass
class DebugConfig:
    trace_samples: bool = False
    """Each rank appends the dataset indices it trained on to trace/rank<N>.jsonl."""
    count_syncs: bool = False
    """Each step event carries host_syncs: the host-device synchronizations CUDA reported in that step."""


@dataclass
class SlurmConfig:
    """`mt launch --slurm`: the allocation; the shape is [launch] nnodes x nproc_per_node."""

    partition: str = ""
    time: str = ""
    """Slurm's time limit (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`); empty: the partition's."""
    account: str = ""
    qos: str = ""
    gpus_per_node: int = _c(0, ge=0)
    cpus_per_task: int = _c(0, ge=0)
    """CPUs for each node's one task (the supervisor and its ranks); 0: Slurm's default."""
    signal_grace_s: int = _c(120, ge=0, le=65535)
    """Slurm sends SIGUSR1 to the batch shell this long before the time limit (`--signal=B:USR1@N`); 0: none."""
    extra: list[str] = _c([])
    """Raw `#SBATCH` lines (`--hold`, `--exclusive`, ...), written after mt's own."""


SCRIPT_TABLES = ("run", "launch", "monitor", "slurm")  # what a script's run reads of its config (the rest is the engine's)


@dataclass
class Config:
    run: RunConfig
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    release: ReleaseConfig = field(default_factory=ReleaseConfig)

    def to_dict(self) -> dict[str, Any]:
        """The preset's tables as TOML spells them (a field named for a keyword keeps its TOML key)."""
        raw = dataclasses.asdict(self)
        for section in dataclasses.fields(self):
            for f in dataclasses.fields(getattr(self, section.name)):
                if "toml" in f.metadata:
                    raw[section.name][f.metadata["toml"]] = raw[section.name].pop(f.name)
        return raw

    def recorded(self) -> dict[str, Any]:
        """config.json: every table, or for a script's run only the tables it uses (docs/run-directory.md),
        so `mt diff` compares what was used, not the engine's defaults; a missing table reads back as its defaults."""
        raw = self.to_dict()
        return {k: v for k, v in raw.items() if k in SCRIPT_TABLES} if self.launch.script else raw

    @property
    def checkpoint_format(self) -> Literal["full", "sharded"]:
        """checkpoint.format with "auto" resolved: sharded under fsdp, full under ddp."""
        if self.checkpoint.format == "auto":
            return "sharded" if self.train.strategy == "fsdp" else "full"
        return self.checkpoint.format

    @property
    def world_size(self) -> int:
        return self.launch.nproc_per_node * self.launch.nnodes
