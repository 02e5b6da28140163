"""mt on a real GPU, in one script of at most ~7 minutes (for a session that is lent one; see README).

    python3 bench/gpu_check.py [--out DIR] [--deadline 420] [--gpt2-steps 120] [--fsdp-steps 60] [--dry]

The parts, in order of value, each given what is left of one overall deadline (a part not started
for lack of time is skipped, one running at the deadline is killed and fails):
 doctor      `mt doctor`: CUDA, NCCL, NVML found (bench/gpu_mt.py)
 launch      GPT-2 124M in bf16 under `mt launch --headless` (supervisor, device check, NVML sampler,
             rules): completed, MFU inside 15%..75% of the peak mt chose (printed), NVML samples of the run's GPU
 oom         a micro-batch no GPU holds, under `mt launch --headless`: classified `oom` by mt
 syncs       host-device syncs per optimizer step under torch's sync debug mode (bench/sync_rank.py): at most 1
 bf16, fp16  the tiny GPT through torchrun (fp16 with a forced overflow), the step anatomy in its heartbeat
 resume      SIGKILL after a checkpoint, resume: every later loss equal to the bf16 run's (the control)
 flight_gloo, flight_nccl  PyTorch's flight recorder with mt's variables (bench/flight_job.py; NCCL needs 2 GPUs)
 fsdp        gpt2-small under fsdp, eager then compiled, with async sharded checkpoints
One line per part at the end (pass, fail or skipped, with the reason and its seconds), also in
OUT/summary.txt; OUT/gpu_check.json is rewritten after every part; OUT/<part>/ holds a copy of each
part's logs, events.jsonl, system.jsonl, incidents.jsonl, status and heartbeats (not its checkpoints),
so a failure can be read after the machine is gone. Exit 1 when a part failed; skipped is no failure (`flight_nccl` on one GPU; the compiled fsdp run
when the deadline leaves less than COMPILE_COST eager runs). Needs mt installed with its dependencies
(the parts run `python -m tui.cli`) and nothing from the network.
`--dry`: the same code on CPU (gloo) with tiny models and a few steps; a part that needs CUDA runs its
setup and says "skipped on --dry: needs CUDA". Numbers mean nothing there. Two parts at a time
(`--jobs`): each part's time is mostly its processes' start-up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.gpu_mt import doctor_part, launch_part, oom_part
from bench.gpu_parts import Ctx, Result, Skipped, flight_part, fsdp_part, merged, precision_part, resume_part, syncs_part
from mt.contract import door

TINY = {
    "run": {"name": "gpu-tiny", "seed": 3},
    "launch": {"device": "cuda", "nproc_per_node": 1},
    "model": {"vocab_size": 256, "n_layer": 4, "n_head": 4, "d_model": 128, "seq_len": 128, "dropout": 0.1},
    "data": {"source": "synthetic", "num_workers": 2, "val_fraction": 0.05},
    "train": {"micro_batch_size": 16, "grad_accum_steps": 2, "max_steps": 60, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 5, "eval_every": 30},
    "checkpoint": {"every_steps": 10},
}
GPT2 = {
    "run": {"name": "gpu-gpt2", "seed": 3},
    "launch": {"device": "cuda", "nproc_per_node": 1},
    "model": {"vocab_size": 50304, "n_layer": 12, "n_head": 12, "d_model": 768, "seq_len": 1024},
    "data": {"source": "synthetic", "synthetic_samples": 8192, "num_workers": 4, "val_fraction": 0.0},
    "train": {"micro_batch_size": 16, "grad_accum_steps": 4, "lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 20, "precision": "bf16", "log_every": 1},
}
MIN_PART_S = 15.0  # a part started with less than this left would only be killed at the deadline
COPY_MAX_BYTES = 8 << 20  # per file copied out: a longer log keeps its last 8 MiB
PartFn = Callable[[Ctx], Result]
PARTS: list[tuple[str, PartFn]] = [
    ("doctor", doctor_part), ("launch", launch_part), ("oom", oom_part), ("syncs", syncs_part),
    ("bf16", lambda ctx: precision_part(ctx, "bf16")), ("resume", resume_part),
    ("fp16", lambda ctx: precision_part(ctx, "fp16")), ("flight_gloo", lambda ctx: flight_part(ctx, "gloo")),
    ("flight_nccl", lambda ctx: flight_part(ctx, "nccl")), ("fsdp", fsdp_part)]


@dataclass
class Report:
    """The parts' results, rewritten to OUT/gpu_check.json after each, so a later failure loses nothing."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.data.setdefault("problems", [])
        self.write()

    def add(self, name: str, result: dict[str, Any], problems: list[str]) -> None:
        self.data[name] = result
        self.data["problems"] += [f"{name}: {p}" for p in problems]
        print(summary_line(name, result), flush=True)
        for p in problems:
            print(f"PROBLEM {name}: {p}", flush=True)
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def summary_line(name: str, res: dict[str, Any]) -> str:
    """`pass launch  52.1 s  MFU 41.0% of ...`: a part's verdict, time and its reason or summary."""
    why = res.get("reason") or res.get("summary") or ""
    return f"{res.get('status', '?'):<7} {name:<11} {res.get('seconds', 0):6.1f} s  {why}".rstrip()


def dry(raw: dict) -> dict:
    """The CPU stand-in of a preset for --dry: a tiny model, few samples, fp32 where CPU autocast is slow."""
    return merged(raw, launch={"device": "cpu"}, data={"num_workers": 0, "synthetic_samples": 512},
                  model={"vocab_size": 64, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32},
                  train={"micro_batch_size": 4, "grad_accum_steps": 1})


def copy_out(src: Path, dst: Path) -> int:
    """Every file of a part's work folder but its checkpoints, into `dst` (a log over COPY_MAX_BYTES keeps
    its tail); read through the door: a FIFO or link a run left there is skipped, never followed."""
    copied = 0
    for folder, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d != "checkpoints"]
        for name in files:
            path = Path(folder, name)
            try:
                data = door.read_tail(path, COPY_MAX_BYTES)
            except OSError:
                continue
            target = dst / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            copied += 1
    return copied


def timed(name: str, part: PartFn, ctx: Ctx, out: Path, total_s: float) -> Result:
    """One part's result with its status, reason and seconds; its work folder copied out whatever happened.
    One that raises fails, and the other parts still run."""
    t0, problems = time.monotonic(), []
    left = ctx.deadline - t0
    if left < MIN_PART_S:
        return {"status": "skipped", "reason": f"deadline: {max(left, 0):.0f} s left of {total_s:.0f}", "seconds": 0.0}, []
    ctx.root.mkdir(parents=True, exist_ok=True)
    try:
        res, problems = part(ctx)
        status, reason = ("fail", problems[0]) if problems else ("pass", None)
    except Skipped as s:
        res, status, reason = s.res, "skipped", s.reason
    except Exception as e:  # noqa: BLE001 - a bug in one part must not cost the lent GPU's other parts
        res, problems = {}, [f"raised {type(e).__name__}: {e}"]
        status, reason = "fail", problems[0]
    finally:
        copied = copy_out(ctx.root, out / name)
    return {**res, "status": status, "reason": reason, "files": str(out / name), "copied_files": copied, "seconds": round(time.monotonic() - t0, 1)}, problems


def run_parts(report: Report, parts: list[tuple[str, PartFn]], base: Ctx, out: Path, jobs: int, total_s: float) -> None:
    """Every part, `jobs` at a time in their order, each into the report as it ends; a part that needs
    another's result (resume: the bf16 run) waits for it, submitted earlier and so already started."""
    pool = ThreadPoolExecutor(jobs)
    futures: dict[str, Future] = {}

    def wait_for(name: str) -> dict:
        return futures[name].result()[0] if name in futures else {}

    try:
        for name, part in parts:
            futures[name] = pool.submit(timed, name, part, replace(base, root=base.root / name, wait_for=wait_for), out, total_s)
        names = {fut: name for name, fut in futures.items()}
        for fut in as_completed(names):
            report.add(names[fut], *fut.result())
    finally:  # Ctrl-C: the parts not started yet never start
        pool.shutdown(cancel_futures=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="where the report and every part's files go (default: $OUT, else .)")
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds for the whole check (default 420)")
    ap.add_argument("--gpt2-steps", type=int, default=120)
    ap.add_argument("--fsdp-steps", type=int, default=60)
    ap.add_argument("--dry", action="store_true", help="the same code on CPU, tiny models, a few steps")
    ap.add_argument("--jobs", type=int, default=None, help="parts at a time (default: 2 with --dry, else 1: "
                    "a GPU part measures alone)")
    a = ap.parse_args()
    if a.deadline <= 0 or a.gpt2_steps < 1 or a.fsdp_steps < 1 or (a.jobs is not None and a.jobs < 1):
        print(f"gpu_check: --deadline {a.deadline}, --gpt2-steps {a.gpt2_steps}, --fsdp-steps {a.fsdp_steps}, "
              f"--jobs {a.jobs}: each must be above 0", file=sys.stderr)
        sys.exit(2)
    tiny, gpt2 = (dry(TINY), dry(GPT2)) if a.dry else (TINY, GPT2)
    if a.dry:
        tiny["train"]["max_steps"] = 30
        gpt2["train"]["precision"] = "fp32"  # bf16 autocast on CPU is slow and says nothing here
        gpt2["train"]["warmup_steps"] = 2
        a.gpt2_steps, a.fsdp_steps = min(a.gpt2_steps, 25), min(a.fsdp_steps, 25)
    out = Path(a.out)
    report = Report(out / "gpu_check.json", {"dry": a.dry, "deadline_s": a.deadline})
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:  # checkpoints stay out of OUT: GiBs each
        base = Ctx(root=Path(tmp), dry=a.dry, deadline=time.monotonic() + a.deadline, tiny=tiny, gpt2=gpt2,
                   gpt2_steps=a.gpt2_steps, fsdp_steps=a.fsdp_steps)
        run_parts(report, PARTS, base, out, a.jobs or (2 if a.dry else 1), a.deadline)
    lines = [summary_line(name, report.data[name]) for name, _ in PARTS if name in report.data]
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(["", "summary:", *lines]))
    counts = {s: sum(1 for name, _ in PARTS if report.data.get(name, {}).get("status") == s) for s in ("pass", "fail", "skipped")}
    tally = f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped"
    if report.data["problems"]:
        print(f"gpu_check FAILED ({tally}), {len(report.data['problems'])} problem(s) (in {report.path}):", file=sys.stderr)
        for p in report.data["problems"]:
            print(f"  {p}", file=sys.stderr)
        sys.exit(1)
    print(f"gpu_check passed ({tally}): {report.path}")


if __name__ == "__main__":
    main()
