"""The parts of bench/gpu_check.py that start the engine through torchrun: precision, exact resume,
syncs per step, FSDP + compile, the flight recorder; and the helpers every part shares."""
from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from mt.contract.jsonl import read_events, read_json
from mt.contract.preset import config_from_dict

NEEDS_CUDA = "skipped on --dry: needs CUDA"
OVERFLOW_AT = 20
KILL_AT = 25  # the killed run hangs here ([faults] hang_at_step), so the SIGKILL lands before its end
# async needs sharded checkpoints (docs/checkpoints.md); "sharded" says so under any strategy
ASYNC_CKPT = {"format": "sharded", "async": True}
COMPILE_COST = 2.5  # a compiled run's wall time in eager runs' (its compile, then the same steps): a guess to refine on a GPU
SYNC_WARM = 5  # steps before the sync count starts: the first steps compile kernels, build the DDP buckets
Result = tuple[dict, list[str]]


class Skipped(Exception):
    """A part that cannot run here (one GPU, --dry): its reason, and what its setup found so far."""

    def __init__(self, reason: str, res: dict | None = None) -> None:
        super().__init__(reason)
        self.reason, self.res = reason, res or {}


@dataclass(frozen=True)
class Ctx:
    """What a part gets: its own work folder, the shared deadline, the presets, and the other parts' results."""

    root: Path
    dry: bool
    deadline: float  # time.monotonic() by which the whole check ends
    tiny: dict
    gpt2: dict
    gpt2_steps: int = 120
    fsdp_steps: int = 60
    wait_for: Callable[[str], dict] = field(default=lambda name: {})

    def left(self) -> float:
        """Seconds left before the deadline; none left is an error, not a run without a timeout."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError("the check's deadline passed")
        return left


def merged(raw: dict, **over: dict) -> dict:
    raw = json.loads(json.dumps(raw))
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
    return raw


def make(root: Path, name: str, raw: dict, **over: dict) -> Path:
    raw = merged(raw, **over)
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config_from_dict(raw, name).to_dict()))
    return run


def start(run: Path, attempt: int = 1, entry: list[str] | None = None, env: dict | None = None, nproc: int = 1) -> subprocess.Popen:
    """torchrun with `nproc` ranks of `entry` (default: mt's engine) on `run`, its output in the run's torchrun.log."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           *(entry or ["-m", "engine"]), "--run-dir", str(run), "--attempt", str(attempt)]
    return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                            start_new_session=True, stdout=open(run / "torchrun.log", "ab"), stderr=subprocess.STDOUT)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL a process and every process under it, as a lost node would."""
    try:
        parent = psutil.Process(proc.pid)
        for p in [parent] + parent.children(recursive=True):
            p.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass
    proc.wait()


def finish(proc: subprocess.Popen, ctx: Ctx) -> int:
    """The run's exit code; one still going at the deadline is killed and named, not waited on."""
    try:
        return proc.wait(timeout=ctx.left())
    except subprocess.TimeoutExpired:
        kill(proc)
        raise RuntimeError("still running at the check's deadline (killed)") from None


def steps(run: Path, attempt: int | None = None) -> list[dict]:
    out, cur = [], 0
    for e in read_events(run / "events.jsonl"):
        cur = e["attempt"] if e["kind"] == "run_start" else cur
        if e["kind"] == "step" and (attempt is None or cur == attempt):
            out.append(e)
    return out


def exited_ok(rc: int | None) -> list[str]:
    return [] if rc == 0 else [f"exit code {rc} (see its logs in the output folder)"]


def ran_all(rc: int | None, got: int, want: int) -> list[str]:
    """The problems of a run that should have exited 0 after `want` steps."""
    return exited_ok(rc) + ([] if got == want else [f"{got} steps of {want}"])


def precision_part(ctx: Ctx, precision: str) -> Result:
    faults = {"overflow_at_step": OVERFLOW_AT} if precision == "fp16" else {}
    run = make(ctx.root, precision, ctx.tiny, train={"precision": precision}, faults=faults)
    rc = finish(start(run), ctx)
    s = steps(run)
    res = {"run": str(run), "rc": rc, "steps": len(s), "first_loss": s[0]["loss"] if s else None,
           "last_loss": s[-1]["loss"] if s else None, "skipped_steps": [e["step"] for e in s if e["skipped"]],
           "median_tok_s": statistics.median(e["tokens_per_s"] for e in s[5:]) if len(s) > 5 else None}
    problems = ran_all(rc, len(s), ctx.tiny["train"]["max_steps"])
    res["anatomy"] = (read_json(run / "heartbeat" / "rank0") or {}).get("anatomy")
    if not isinstance(res["anatomy"], dict) or not res["anatomy"].get("n") or "compute_s" not in res["anatomy"]:
        problems.append(f"no step anatomy in heartbeat/rank0: {res['anatomy']}")
    want_skipped = [OVERFLOW_AT] if faults else []
    if res["skipped_steps"] != want_skipped:
        problems.append(f"skipped steps {res['skipped_steps']}, expected {want_skipped}")
    losses = " -> ".join(f"{x:.4f}" for x in (res["first_loss"], res["last_loss"]) if x is not None)
    res["summary"] = f"{len(s)} steps, loss {losses or 'none'}, overflow steps skipped {res['skipped_steps']}"
    return res, problems


def resume_part(ctx: Ctx) -> Result:
    """SIGKILL mid-run after a checkpoint, resume, and compare every later loss with the uninterrupted
    bf16 part's run, the same config (the control: one launch fewer; waited for at the end)."""
    max_steps, every = ctx.tiny["train"]["max_steps"], ctx.tiny["checkpoint"]["every_steps"]
    run = make(ctx.root, "killed", ctx.tiny, train={"precision": "bf16"}, faults={"hang_at_step": KILL_AT})
    proc = start(run)
    while not any(e["step"] >= KILL_AT - 1 for e in steps(run)):
        if proc.poll() is not None or ctx.deadline < time.monotonic():
            kill(proc)
            raise RuntimeError(f"the run to kill never reached step {KILL_AT - 1} (exit code {proc.returncode})")
        time.sleep(0.2)
    kill(proc)
    resumed_rc = finish(start(run, attempt=2), ctx)
    control = ctx.wait_for("bf16")
    if not control.get("run"):
        raise RuntimeError(f"no control run: the bf16 part {control.get('status', 'did not run')} ({control.get('reason')})")
    res, problems = resume_verdict({e["step"]: e["loss"] for e in steps(Path(control["run"]))}, steps(run, 2), max_steps, every)
    res = {"control_rc": control.get("rc"), "killed_rc": proc.returncode, "resumed_rc": resumed_rc, **res}
    problems += [f"control run: {p}" for p in exited_ok(control.get("rc"))]
    problems += [f"resumed attempt: {p}" for p in exited_ok(resumed_rc)]
    res["summary"] = (f"killed at step {KILL_AT}, resumed from {res['resumed_at']}: {res['steps_compared']} losses "
                      f"compared with the control run, {'all equal' if res['bitwise_equal'] else 'NOT equal'}")
    return res, problems


def resume_verdict(refs: dict[int, float], after: list[dict], max_steps: int, every: int) -> Result:
    """The resumed attempt's steps against the uninterrupted run's losses: every step after the last
    checkpoint before KILL_AT must be there and equal, bit for bit (none compared is a failure)."""
    want_at = (KILL_AT - 1) // every * every
    diffs = [abs(e["loss"] - refs[e["step"]]) for e in after if e["step"] in refs]
    resumed_at = after[0]["step"] - 1 if after else None
    res = {"resumed_at": resumed_at, "steps_compared": len(diffs), "bitwise_equal": bool(diffs) and all(d == 0 for d in diffs),
           "max_abs_loss_diff": max(diffs) if diffs else None}
    problems = []
    if len(refs) != max_steps:
        problems.append(f"the uninterrupted run logged {len(refs)} steps of {max_steps}")
    if resumed_at != want_at:
        problems.append(f"resumed at step {resumed_at}, expected the checkpoint of step {want_at}")
    if len(diffs) != max_steps - want_at:
        problems.append(f"{len(diffs)} steps compared, expected {max_steps - want_at}: the check compared too little")
    elif not res["bitwise_equal"]:
        problems.append(f"losses after the resume differ from the uninterrupted run (max {res['max_abs_loss_diff']})")
    return res, problems


def syncs_part(ctx: Ctx) -> Result:
    """Host-device syncs per optimizer step: one rank under torch's sync debug mode (bench/sync_rank.py
    logs the time of each warning), counted between the run's own step events after SYNC_WARM."""
    # two ranks where there are two GPUs: DDP's agreement (an all_gather read on the host) counts only there
    nproc = 2 if not ctx.dry and cuda_devices() >= 2 else 1
    run = make(ctx.root, "syncs", ctx.tiny, launch={"nproc_per_node": nproc}, train={"precision": "bf16", "eval_every": 0},
               checkpoint={"every_steps": 0})
    times_file = ctx.root / "sync_warnings"  # bench/sync_rank.py adds .rank<N>; rank 0's are counted
    # --dry: the stand-in warning proves the hook counts what a GPU would warn of
    env = {"GPU_CHECK_SYNC_PROBE": "1"} if ctx.dry else {}
    rc = finish(start(run, entry=[str(REPO / "bench" / "sync_rank.py"), str(times_file)], env=env, nproc=nproc), ctx)
    rank0 = ctx.root / "sync_warnings.rank0"
    text = rank0.read_text() if rank0.exists() else ""
    times = [float(line) for line in text.split()]
    res, problems = sync_verdict(times, steps(run))
    problems = ran_all(rc, res["steps"], ctx.tiny["train"]["max_steps"]) + problems
    res = {"rc": rc, "world_size": nproc, "grad_accum_steps": ctx.tiny["train"]["grad_accum_steps"], **res}
    if nproc == 1:
        res["ddp_agreement"] = "not counted: needs 2 GPUs (one rank agrees with no one)"
    if ctx.dry:
        if not res["syncs_before_first_step"]:
            problems.append("the stand-in sync warning was not counted: the count would read 0 on any GPU")
        if problems:
            return res, problems
        raise Skipped(f"{NEEDS_CUDA} (the counting ran: {res['syncs_before_first_step']} stand-in warning seen)", res)
    res["summary"] = (f"{res['syncs_per_step']} syncs per optimizer step on {nproc} rank(s) over {res['steps_counted']} "
                      f"steps (most in one: {res['most_in_a_step']})")
    return res, problems


def sync_verdict(times: list[float], logged: list[dict]) -> Result:
    """Sync warnings (epoch seconds) counted between the step events of steps SYNC_WARM..last:
    per optimizer step, more than one is a problem (the CPU could never run ahead of the GPU)."""
    ts = [e["t"] for e in logged]
    window = ts[SYNC_WARM:]
    per = [sum(1 for t in times if a < t <= b) for a, b in zip(window, window[1:])]
    res: dict[str, Any] = {"steps": len(ts), "steps_counted": len(per), "warnings": len(times),
                           "syncs_before_first_step": sum(1 for t in times if ts and t <= ts[0]),
                           "syncs_per_step": round(sum(per) / len(per), 2) if per else None,
                           "most_in_a_step": max(per) if per else None}
    if len(per) < 5:
        return res, [f"{len(per)} steps counted: too few to say how many syncs a step makes"]
    if res["syncs_per_step"] > 1:
        return res, [f"{res['syncs_per_step']} host-device syncs per optimizer step, expected at most 1"]
    return res, []


def fsdp_part(ctx: Ctx) -> Result:
    """gpt2-small under fsdp, eager then compiled: MFU side by side, and what async checkpoints cost the loop."""
    n = ctx.fsdp_steps
    ckpt = {"every_steps": max(1, min(20, n // 2)), **ASYNC_CKPT}
    out: dict = {}
    problems: list[str] = []
    eager_s = 0.0
    for name, compiled in (("fsdp_eager", False), ("fsdp_compile", True)):
        if compiled and not problems and ctx.left() < COMPILE_COST * eager_s:
            # killed at the deadline it would fail the check for want of time, not for what it measures
            raise Skipped(f"fsdp_compile skipped: deadline: {ctx.left():.0f} s left, about {COMPILE_COST * eager_s:.0f} needed", out)
        t0 = time.monotonic()
        run = make(ctx.root, name, ctx.gpt2, train={"max_steps": n, "strategy": "fsdp", "compile": compiled}, checkpoint=ckpt)
        rc = finish(start(run), ctx)
        eager_s = time.monotonic() - t0
        s = steps(run)
        later = s[min(10, n // 2):]
        cks = [e for e in read_events(run / "events.jsonl") if e["kind"] == "checkpoint"]
        out[name] = {"rc": rc, "steps": len(s), "first_step_s": s[0]["step_time_s"] if s else None,
                     "median_tok_s": statistics.median(e["tokens_per_s"] for e in later) if later else None,
                     "median_mfu": statistics.median(e.get("mfu") or 0 for e in later) if later else None,
                     "recompiles": sum(e.get("recompiles") or 0 for e in s),
                     "async_checkpoint": (read_json(run / "config.json") or {}).get("checkpoint", {}).get("async"),
                     "checkpoints": [{"step": e["step"], "seconds": e.get("seconds"), "blocking_s": e.get("blocking_s")} for e in cks]}
        problems += [f"{name}: {p}" for p in ran_all(rc, len(s), n)]
        if not out[name]["checkpoints"] or any(c["blocking_s"] is None for c in out[name]["checkpoints"]):
            problems.append(f"{name}: no async checkpoint measured (blocking_s)")
        if not ctx.dry and not out[name]["median_mfu"]:
            problems.append(f"{name}: no MFU measured on the GPU")
    eager, comp = out["fsdp_eager"], out["fsdp_compile"]
    if eager["median_tok_s"] and comp["median_tok_s"]:
        out["compile_speedup"] = comp["median_tok_s"] / eager["median_tok_s"]
    out["summary"] = (f"MFU eager {eager['median_mfu']}, compiled {comp['median_mfu']}, "
                      f"compile speed-up {out.get('compile_speedup')}, {comp['recompiles']} recompiles")
    return out, problems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cuda_devices() -> int:
    """How many GPUs torch sees, asked in a child (this process never imports torch)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                         capture_output=True, text=True, timeout=120).stdout.strip()
    return int(out) if out.isdigit() else 0


def flight_part(ctx: Ctx, backend: str) -> Result:
    """PyTorch's flight recorder with mt's variables: a 2-rank job whose rank 1 never joins collective #4
    (bench/flight_job.py); whether torch dumped on the timeout into flight/, and what mt's reader names."""
    from tui.stacks.recorder import analyze, dumps_in, recorder_env

    flight, explicit = ctx.root / "flight", ctx.root / "explicit"
    explicit.mkdir(parents=True)
    # gloo's timeout needs no GPU start-up's margin (tests/diagnose/test_flight.py: 4 s too)
    env = {**os.environ, "FLIGHT_TIMEOUT_S": "10" if backend == "nccl" else "4",
           **recorder_env(config_from_dict(ctx.tiny, "gpu_check"), flight, dict(os.environ))}
    if backend == "nccl" and (gpus := cuda_devices()) < 2:
        raise Skipped(f"skipped: needs 2 GPUs (found {gpus})")
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                          "127.0.0.1", "--master-port", str(free_port()), str(REPO / "bench" / "flight_job.py"),
                          backend, str(explicit), "--dump"], capture_output=True, text=True, env=env, timeout=ctx.left())
    (ctx.root / "job.log").write_text(job.stdout + job.stderr)
    dumped = sorted(dumps_in(flight))
    res = {"rc": job.returncode, "dumped_on_timeout": dumped,
           "analyzer_on_timeout_dump": analyze(flight).line() if dumped else None,
           "analyzer_on_explicit_dump": analyze(explicit).line() if any(explicit.iterdir()) else None}
    named = "rank 1 did not join collective #4"
    problems = []
    if backend == "gloo" and not any(explicit.iterdir()):
        problems.append("gloo's explicit dump is missing: the recorder did not record the collectives")
    elif backend == "gloo" and named not in (res["analyzer_on_explicit_dump"] or ""):
        problems.append(f"gloo's explicit dumps did not name rank 1 ({res['analyzer_on_explicit_dump']})")
    if backend == "nccl" and named not in (res["analyzer_on_timeout_dump"] or ""):
        problems.append(f"NCCL's dump on timeout did not name rank 1 ({res['analyzer_on_timeout_dump']})")
    res["summary"] = res["analyzer_on_timeout_dump" if backend == "nccl" else "analyzer_on_explicit_dump"] or "no dump"
    return res, problems
