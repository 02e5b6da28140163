"""The parts of bench/gpu_check.py that go through mt's own launch path (the CLI, the supervisor, its
device check, NVML sampler and rules): `mt doctor`, a GPT-2 124M run under `mt launch --headless`
(MFU, NVML samples) and a deliberate CUDA OOM. They judge by mt's public output only: exit codes,
events.jsonl, system.jsonl, incidents.jsonl, status.json."""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.gpu_parts import NEEDS_CUDA, REPO, Ctx, Result, Skipped, merged, ran_all
from mt.contract.jsonl import read_events, read_json
from mt.contract.preset import config_from_dict, toml_string
from mt.contract.system import clean_sample

MT = [sys.executable, "-m", "tui.cli"]
MFU_BAND = (0.15, 0.75)  # GPT-2 124M in bf16 on one H100/H200: well below is a wrong peak or a slow path, above is a wrong count
OOM_MICRO_BATCH = 1024  # GPT-2's logits alone at 1024 x 1024 tokens are 100 GiB in bf16: more than any one GPU holds
INCIDENT_WAIT_S = 30.0  # the supervisor's rules classify an exit after the follower returns


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def write_preset(root: Path, name: str, raw: dict) -> Path:
    """A preset file of `raw` (validated first: a bad one is this script's bug, said before any launch)."""
    raw = merged(raw, run={"name": name})
    config_from_dict(raw, name)
    lines = []
    for section, values in raw.items():
        lines += [f"[{section}]", *(f"{k} = {toml_value(v)}" for k, v in values.items()), ""]
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}.toml"
    path.write_text("\n".join(lines))
    return path


def mt(args: list[str], log: Path, ctx: Ctx) -> tuple[int, str]:
    """Run `mt ARGS` into `log` until it ends or the deadline; at the deadline its run is killed (`mt kill`)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log, "wb") as f:
        proc = subprocess.Popen([*MT, *args], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=ctx.left())
        except subprocess.TimeoutExpired:
            if run := run_dir_of(log.read_text(errors="replace")):
                subprocess.run([*MT, "kill", str(run)], cwd=REPO, env=env, capture_output=True, timeout=60)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"mt {args[0]} still running at the check's deadline (its run killed)") from None
    return rc, log.read_text(errors="replace")


def run_dir_of(out: str) -> Path | None:
    """The run directory `mt launch` printed first (`run dir: PATH`)."""
    for line in out.splitlines():
        if line.startswith("run dir: "):
            return Path(line.removeprefix("run dir: ").strip())
    return None


def headless(ctx: Ctx, preset: Path) -> tuple[int, str, Path]:
    rc, out = mt(["launch", str(preset), "--headless", "--runs-dir", str(ctx.root / "runs"), "--every", "5"],
                 ctx.root / f"{preset.stem}.headless.log", ctx)
    run = run_dir_of(out)
    if run is None:
        raise RuntimeError(f"mt launch printed no run dir (exit code {rc}): {out.strip()[-300:]}")
    return rc, out, run


def doctor_part(ctx: Ctx) -> Result:
    """`mt doctor`: every check ok (on a GPU machine: CUDA, NCCL and NVML found)."""
    ctx.root.mkdir(parents=True, exist_ok=True)
    rc, out = mt(["doctor"], ctx.root / "doctor.txt", ctx)
    lines = out.strip().splitlines()
    problems = [] if rc == 0 else [f"exit code {rc}: " + "; ".join(ln for ln in lines if not ln.startswith("ok"))]
    if not ctx.dry:
        problems += [f"no line says {want!r}" for want in ("CUDA", "NCCL", "NVML") if not any(want in ln for ln in lines)]
    return {"rc": rc, "lines": lines, "summary": f"{len(lines)} checks, {sum(ln.startswith('ok') for ln in lines)} ok"}, problems


def launch_part(ctx: Ctx) -> Result:
    """GPT-2 124M in bf16 (--dry: the tiny stand-in on CPU) under `mt launch --headless`: completed,
    MFU inside MFU_BAND against the peak mt chose, and NVML samples of the run's GPU in system.jsonl."""
    n = ctx.gpt2_steps
    raw = merged(ctx.gpt2, train={"max_steps": n, "log_every": 1}, checkpoint={"every_steps": 0})
    rc, out, run = headless(ctx, write_preset(ctx.root, "launch", raw))
    events = read_events(run / "events.jsonl")
    start = next((e for e in events if e["kind"] == "run_start"), {})
    s = [e for e in events if e["kind"] == "step"]
    later = s[min(20, n // 2):]  # past warm-up
    mfus = [e["mfu"] for e in later if e.get("mfu") is not None]
    status = read_json(run / "status.json") or {}
    res: dict[str, Any] = {
        "run": str(run), "rc": rc, "state": status.get("state"), "steps": len(s), "device": start.get("device"),
        "precision": start.get("precision"), "peak_flops": start.get("peak_flops"),
        "median_mfu": statistics.median(mfus) if mfus else None,
        "median_tok_s": statistics.median(e["tokens_per_s"] for e in later) if later else None,
        "error_incidents": [i.get("code") for i in read_events(run / "incidents.jsonl") if i.get("severity") == "error"]}
    problems = ran_all(rc, len(s), n) + ([] if res["state"] == "completed" else [f"status.json says {res['state']}"])
    problems += [f"error incident {code} in a clean run" for code in res["error_incidents"]]
    res.update(gpu_samples(run, min((e["mem_alloc_bytes"] for e in later), default=0)))
    if ctx.dry:
        res["mfu"] = res["nvml"] = NEEDS_CUDA
        if not res["rank_samples"]:
            problems.append("system.jsonl holds no sample of the run's rank: the supervisor's sampler did not run")
        res["summary"] = f"{len(s)} steps through mt launch --headless, {res['rank_samples']} samples of its rank (MFU, NVML: {NEEDS_CUDA})"
        return res, problems
    problems += mfu_problems(res)
    if not res["gpu_samples"]:
        problems.append(f"no NVML sample of the run's GPU in system.jsonl (a GPU using at least the run's "
                        f"{res['min_alloc_bytes']} allocated bytes; nvml_error: {res['nvml_error']})")
    peak = f"{res['peak_flops'] / 1e12:.0f} TFLOP/s" if res["peak_flops"] else "no peak"
    res["summary"] = (f"MFU {res['median_mfu'] or 0:.1%} of {peak} (the peak mt chose for {res['gpu_names'] or res['device']}), "
                      f"{res['median_tok_s'] or 0:.0f} tok/s, {res['gpu_samples']} NVML samples of GPU {res['gpu_indices']}")
    return res, problems


def mfu_problems(res: dict) -> list[str]:
    lo, hi = MFU_BAND
    if not res["peak_flops"]:
        return [f"no peak FLOP/s for {res['device']}: MFU unknown"]
    if res["median_mfu"] is None or not lo <= res["median_mfu"] <= hi:
        return [f"MFU {res['median_mfu']} outside {lo:.0%}..{hi:.0%} against a peak of {res['peak_flops'] / 1e12:.0f} TFLOP/s"]
    return []


def gpu_samples(run: Path, min_alloc: int) -> dict[str, Any]:
    """What system.jsonl says of the run: samples of its rank, and NVML samples of a GPU holding at least
    the bytes the run itself allocated (NVML's "used" counts the allocator's, the context's and more)."""
    samples = [s for s in map(clean_sample, read_events(run / "system.jsonl")) if s]
    gpus = [g for s in samples if s.get("nvml") for g in s.get("gpus") or []
            if (g.get("mem_used_bytes") or 0) >= max(min_alloc, 1) and g.get("util_pct") is not None]
    return {"samples": len(samples), "rank_samples": sum(1 for s in samples if any(r.get("alive") for r in s.get("ranks") or [])),
            "nvml_error": next((s.get("nvml_error") for s in samples if s.get("nvml_error")), None),
            "min_alloc_bytes": min_alloc, "gpu_samples": len(gpus),
            "gpu_indices": sorted({g["index"] for g in gpus}), "gpu_names": ", ".join(sorted({g.get("name") or "?" for g in gpus}))}


def oom_part(ctx: Ctx) -> Result:
    """GPT-2 with a micro-batch no GPU holds, under `mt launch --headless`: the run fails, classified `oom`."""
    raw = merged(ctx.gpt2, train={"max_steps": 3, "micro_batch_size": OOM_MICRO_BATCH}, checkpoint={"every_steps": 0})
    preset = write_preset(ctx.root, "oom", raw)
    if ctx.dry:
        raise Skipped(NEEDS_CUDA, {"preset": str(preset)})
    rc, out, run = headless(ctx, preset)
    codes: list[str] = []
    until = time.monotonic() + min(INCIDENT_WAIT_S, ctx.left())
    while "oom" not in codes and time.monotonic() < until:
        codes = [i.get("code") for i in read_events(run / "incidents.jsonl")]
        time.sleep(0.5)
    ended = [ln for ln in out.splitlines() if ln.startswith(("run ended", "run failed", "incident"))]
    res = {"run": str(run), "rc": rc, "incidents": codes, "lines": ended,
           "summary": f"exit code {rc}, incidents {codes}: {ended[-1] if ended else 'no end line'}"}
    problems = [] if rc != 0 else [f"the run did not fail: a micro-batch of {OOM_MICRO_BATCH} fit"]
    if "oom" not in codes:
        problems.append(f"classified {codes or 'nothing'}, not oom")
    return res, problems
