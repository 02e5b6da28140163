"""The engine on a real GPU, in one short script (for a session that is lent one; see README).

    python3 bench/gpu_check.py [--out DIR] [--gpt2-steps 200] [--fsdp-steps 60] [--dry]

1. the tiny GPT on CUDA through torchrun (NCCL), bf16 and fp16 (with a forced overflow), and the
   step anatomy in its heartbeat (on CUDA from events read a step late, engine/anatomy.py);
2. checkpoint + SIGKILL + resume on CUDA: later losses compared with the uninterrupted bf16 run;
3. MFU of gpt2-small (124M, seq 1024, bf16) on one GPU for a few hundred steps;
4. gpt2-small under fsdp, eager then `train.compile = true` (MFU of each, the ratio, the first
   step's compile time, recompiles), both with sharded `[checkpoint] async = true` checkpoints;
5. PyTorch's flight recorder with mt's variables (tui/stacks/recorder.py): a 2-rank job whose rank 1
   never joins collective #4 (bench/flight_job.py), on NCCL (needs 2 GPUs) and on gloo: whether
   torch dumped on the timeout into flight/, and what mt's reader (tui/stacks/recorder.py `analyze`:
   plain values only, never torch's pickle.load) names (the report's `analyzer_*` keys).
OUT/gpu_check.json is rewritten after every part; a part that failed, compared nothing or was
skipped is listed under "problems" and the script exits 1. Needs only torch, numpy and psutil.
`--dry`: the same code on CPU with tiny models and a few steps (checks the script itself on a
machine without a GPU; numbers mean nothing), two parts at a time (`--jobs`): each part's time is
mostly its processes' start-up, one core each.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from mt.contract.jsonl import read_events, read_json
from mt.contract.preset import config_from_dict

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
OVERFLOW_AT = 20
KILL_AT = 25  # the killed run hangs here ([faults] hang_at_step), so the SIGKILL lands before its end
# async needs sharded checkpoints (docs/checkpoints.md); "sharded" says so under any strategy
ASYNC_CKPT = {"format": "sharded", "async": True}


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
        print(name, result, flush=True)
        for p in problems:
            print(f"PROBLEM {name}: {p}", flush=True)
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def merged(raw: dict, **over: dict) -> dict:
    raw = json.loads(json.dumps(raw))
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
    return raw


def dry(raw: dict) -> dict:
    """The CPU stand-in of a preset for --dry: a tiny model, few samples, fp32 where CPU autocast is slow."""
    return merged(raw, launch={"device": "cpu"}, data={"num_workers": 0, "synthetic_samples": 512},
                  model={"vocab_size": 64, "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32},
                  train={"micro_batch_size": 4, "grad_accum_steps": 1})


def make(root: Path, name: str, raw: dict, **over: dict) -> Path:
    raw = merged(raw, **over)
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config_from_dict(raw, name).to_dict()))
    return run


def start(run: Path, attempt: int = 1) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", "-m", "engine", "--run-dir", str(run), "--attempt", str(attempt)]
    return subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), start_new_session=True,
                            stdout=open(run / "torchrun.log", "ab"), stderr=subprocess.STDOUT)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and every rank under it, as a lost node would."""
    try:
        parent = psutil.Process(proc.pid)
        for p in [parent] + parent.children(recursive=True):
            p.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass
    proc.wait()


def finish(proc: subprocess.Popen, timeout: float) -> int:
    """The run's exit code; one still going after `timeout` is killed and named, not waited on forever."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(proc)
        raise RuntimeError(f"still running after {timeout:.0f} s (killed)") from None


def steps(run: Path, attempt: int | None = None) -> list[dict]:
    out, cur = [], 0
    for e in read_events(run / "events.jsonl"):
        cur = e["attempt"] if e["kind"] == "run_start" else cur
        if e["kind"] == "step" and (attempt is None or cur == attempt):
            out.append(e)
    return out


def exited_ok(rc: int | None) -> list[str]:
    return [] if rc == 0 else [f"exit code {rc} (see its torchrun.log)"]


def ran_all(rc: int | None, got: int, want: int) -> list[str]:
    """The problems of a run that should have exited 0 after `want` steps."""
    return exited_ok(rc) + ([] if got == want else [f"{got} steps of {want}"])


def precision_part(root: Path, tiny: dict, precision: str) -> tuple[dict, list[str]]:
    faults = {"overflow_at_step": OVERFLOW_AT} if precision == "fp16" else {}
    run = make(root, precision, tiny, train={"precision": precision}, faults=faults)
    rc = finish(start(run), 600)
    s = steps(run)
    res = {"rc": rc, "steps": len(s), "first_loss": s[0]["loss"] if s else None, "last_loss": s[-1]["loss"] if s else None,
           "skipped_steps": [e["step"] for e in s if e["skipped"]],
           "median_tok_s": statistics.median(e["tokens_per_s"] for e in s[5:]) if len(s) > 5 else None}
    problems = ran_all(rc, len(s), tiny["train"]["max_steps"])
    res["anatomy"] = (read_json(run / "heartbeat" / "rank0") or {}).get("anatomy")
    if not isinstance(res["anatomy"], dict) or not res["anatomy"].get("n") or "compute_s" not in res["anatomy"]:
        problems.append(f"no step anatomy in heartbeat/rank0: {res['anatomy']}")
    want_skipped = [OVERFLOW_AT] if faults else []
    if res["skipped_steps"] != want_skipped:
        problems.append(f"skipped steps {res['skipped_steps']}, expected {want_skipped}")
    return res, problems


def resume_part(root: Path, tiny: dict, ref: Path, ref_rc: Callable[[], int | None]) -> tuple[dict, list[str]]:
    """SIGKILL mid-run after a checkpoint, resume, and compare every later loss with `ref`, the same
    config uninterrupted (the bf16 part's run: one launch fewer; `ref_rc` waits for its end)."""
    max_steps, every = tiny["train"]["max_steps"], tiny["checkpoint"]["every_steps"]
    run = make(root, "killed", tiny, train={"precision": "bf16"}, faults={"hang_at_step": KILL_AT})
    proc = start(run)
    deadline = time.monotonic() + 600
    while not any(e["step"] >= KILL_AT - 1 for e in steps(run)):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill(proc)
            raise RuntimeError(f"the run to kill never reached step {KILL_AT - 1} (exit code {proc.returncode})")
        time.sleep(0.2)
    kill(proc)
    resumed_rc = finish(start(run, attempt=2), 600)
    ref_rc = ref_rc()
    res, problems = resume_verdict({e["step"]: e["loss"] for e in steps(ref)}, steps(run, 2), max_steps, every)
    res = {"ref_rc": ref_rc, "killed_rc": proc.returncode, "resumed_rc": resumed_rc, **res}
    problems += [f"reference run: {p}" for p in exited_ok(ref_rc)] + [f"resumed attempt: {p}" for p in exited_ok(resumed_rc)]
    return res, problems


def resume_verdict(refs: dict[int, float], after: list[dict], max_steps: int, every: int) -> tuple[dict, list[str]]:
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


def gpt2_part(root: Path, gpt2: dict, n: int, dry_run: bool) -> tuple[dict, list[str]]:
    run = make(root, "gpt2", gpt2, train={"max_steps": n})
    rc = finish(start(run), 540)
    every = steps(run)
    s = every[min(20, n // 2):]  # past warm-up
    res = {"rc": rc, "steps": len(every), "median_tok_s": statistics.median(e["tokens_per_s"] for e in s) if s else None,
           "median_mfu": statistics.median(e.get("mfu") or 0 for e in s) if s else None,
           "peak_mem_gib": max(e["mem_peak_bytes"] for e in s) / 2**30 if s else None}
    problems = ran_all(rc, len(every), n)
    if not dry_run and not res["median_mfu"]:
        problems.append("no MFU measured on the GPU")
    return res, problems


def fsdp_part(root: Path, gpt2: dict, n: int, dry_run: bool) -> tuple[dict, list[str]]:
    """gpt2-small under fsdp, eager then compiled: MFU side by side, and what async checkpoints cost the loop."""
    ckpt = {"every_steps": max(1, min(20, n // 2)), **ASYNC_CKPT}
    out: dict = {}
    problems: list[str] = []
    for name, compiled in (("fsdp_eager", False), ("fsdp_compile", True)):
        run = make(root, name, gpt2, train={"max_steps": n, "strategy": "fsdp", "compile": compiled}, checkpoint=ckpt)
        rc = finish(start(run), 300)
        s = steps(run)
        later = s[min(10, n // 2):]
        cks = [e for e in read_events(run / "events.jsonl") if e["kind"] == "checkpoint"]
        out[name] = {"rc": rc, "steps": len(s), "first_step_s": s[0]["step_time_s"] if s else None,
                     "median_tok_s": statistics.median(e["tokens_per_s"] for e in later) if later else None,
                     "median_mfu": statistics.median(e.get("mfu") or 0 for e in later) if later else None,
                     "recompiles": sum(e.get("recompiles") or 0 for e in s),
                     "async_checkpoint": json.loads((run / "config.json").read_text())["checkpoint"]["async"],
                     "checkpoints": [{"step": e["step"], "seconds": e.get("seconds"), "blocking_s": e.get("blocking_s")} for e in cks]}
        problems += [f"{name}: {p}" for p in ran_all(rc, len(s), n)]
        if not out[name]["checkpoints"] or any(c["blocking_s"] is None for c in out[name]["checkpoints"]):
            problems.append(f"{name}: no async checkpoint measured (blocking_s)")
        if not dry_run and not out[name]["median_mfu"]:
            problems.append(f"{name}: no MFU measured on the GPU")
    eager, comp = out["fsdp_eager"], out["fsdp_compile"]
    if eager["median_tok_s"] and comp["median_tok_s"]:
        out["compile_speedup"] = comp["median_tok_s"] / eager["median_tok_s"]
    return out, problems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flight_part(root: Path, dry_run: bool) -> tuple[dict, list[str]]:
    """The flight recorder on NCCL (2 GPUs) and gloo: dumps on timeout, and mt's reader's verdict
    (--dry: gloo only, which must at least record the collectives: its explicit dump)."""
    from tui.stacks.recorder import analyze, dumps_in, recorder_env

    gpus = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                          capture_output=True, text=True).stdout.strip()
    backends = ["gloo"] + (["nccl"] if gpus.isdigit() and int(gpus) >= 2 else [])
    out: dict[str, Any] = {"gpus": gpus}
    problems = [] if "nccl" in backends or dry_run else [f"flight: NCCL needs 2 GPUs (found {gpus or '?'}): not checked"]
    for backend in backends:
        flight, explicit = root / f"flight-{backend}", root / f"explicit-{backend}"
        explicit.mkdir(parents=True)
        # gloo's timeout needs no GPU start-up's margin (tests/diagnose/test_flight.py: 4 s too)
        env = {**os.environ, "FLIGHT_TIMEOUT_S": "10" if backend == "nccl" else "4",
               **recorder_env(config_from_dict(TINY, "gpu_check"), flight, dict(os.environ))}
        job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                              "127.0.0.1", "--master-port", str(free_port()), str(REPO / "bench" / "flight_job.py"),
                              backend, str(explicit), "--dump"], capture_output=True, text=True, env=env, timeout=240)
        dumped = sorted(dumps_in(flight))
        res = out[backend] = {
            "rc": job.returncode, "dumped_on_timeout": dumped,
            "analyzer_on_timeout_dump": analyze(flight).line() if dumped else None,
            "analyzer_on_explicit_dump": analyze(explicit).line() if any(explicit.iterdir()) else None,
            "job_tail": (job.stdout + job.stderr)[-1500:]}
        if backend == "gloo" and not any(explicit.iterdir()):
            problems.append("flight: gloo's explicit dump is missing: the recorder did not record the collectives")
        elif backend == "gloo" and "rank 1 did not join collective #4" not in (res["analyzer_on_explicit_dump"] or ""):
            problems.append(f"flight: gloo's explicit dumps did not name rank 1 ({res['analyzer_on_explicit_dump']})")
        if backend == "nccl" and "rank 1 did not join collective #4" not in (res["analyzer_on_timeout_dump"] or ""):
            problems.append(f"flight: NCCL's dump on timeout did not name rank 1 ({res['analyzer_on_timeout_dump']})")
    return out, problems


Part = Callable[[], tuple[dict, list[str]]]


def timed(part: Part) -> tuple[dict, list[str]]:
    """One part's result and its seconds; one that raises is a problem, and the other parts still run."""
    t0 = time.monotonic()
    try:
        res, problems = part()
    except Exception as e:  # noqa: BLE001 - a bug in one part must not cost the lent GPU's other parts
        res, problems = {}, [f"raised {type(e).__name__}: {e}"]
    return {**res, "seconds": round(time.monotonic() - t0, 1)}, problems


def run_parts(report: Report, root: Path, tiny: dict, gpt2: dict, a: argparse.Namespace) -> None:
    """Every part, `a.jobs` at a time, each into the report as it ends; a part that needs another's
    run waits for it, which was submitted earlier and so has a worker (a GPU check: one at a time)."""
    pool = ThreadPoolExecutor(a.jobs)
    parts: dict[Future, str] = {}

    def submit(name: str, part: Part) -> Future:
        fut = pool.submit(timed, part)
        parts[fut] = name
        return fut

    try:
        # the parts of two launches first, the shortest last: two at a time, they end together
        bf16 = submit("bf16", lambda: precision_part(root, tiny, "bf16"))
        submit("resume", lambda: resume_part(root, tiny, root / "bf16", lambda: bf16.result()[0].get("rc")))
        submit("gpt2_fsdp", lambda: fsdp_part(root, gpt2, a.fsdp_steps, a.dry))
        submit("fp16", lambda: precision_part(root, tiny, "fp16"))
        submit("flight", lambda: flight_part(root, a.dry))
        submit("gpt2_small", lambda: gpt2_part(root, gpt2, a.gpt2_steps, a.dry))
        for fut in as_completed(parts):
            report.add(parts[fut], *fut.result())
    finally:  # Ctrl-C: the parts not started yet never start
        pool.shutdown(cancel_futures=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--gpt2-steps", type=int, default=200)
    ap.add_argument("--fsdp-steps", type=int, default=60)
    ap.add_argument("--dry", action="store_true", help="the same code on CPU, tiny models, a few steps")
    ap.add_argument("--jobs", type=int, default=None, help="parts at a time (default: 2 with --dry, else 1: "
                    "a GPU part measures alone)")
    a = ap.parse_args()
    a.jobs = a.jobs or (2 if a.dry else 1)
    tiny, gpt2 = (dry(TINY), dry(GPT2)) if a.dry else (TINY, GPT2)
    if a.dry:
        tiny["train"]["max_steps"] = 30
        gpt2["train"]["precision"] = "fp32"  # bf16 autocast on CPU is slow and says nothing here
        gpt2["train"]["warmup_steps"] = 2
        a.gpt2_steps, a.fsdp_steps = min(a.gpt2_steps, 25), min(a.fsdp_steps, 25)
    report = Report(Path(a.out) / "gpu_check.json", {"dry": a.dry})
    with tempfile.TemporaryDirectory() as tmp:
        run_parts(report, Path(tmp), tiny, gpt2, a)
    if report.data["problems"]:
        print(f"gpu_check FAILED, {len(report.data['problems'])} problem(s) (in {report.path}):", file=sys.stderr)
        for p in report.data["problems"]:
            print(f"  {p}", file=sys.stderr)
        sys.exit(1)
    print(f"gpu_check passed: {report.path}")


if __name__ == "__main__":
    main()
