"""bench/gpu_check.py: its verdicts, its deadline and skips, its output folder, and --dry, where every
part of the GPU check runs (or sets up and says why it skips) on the CPU."""
from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .runner import REPO

SCRIPT = REPO / "bench" / "gpu_check.py"


def script() -> dict[str, Any]:
    """gpu_check's globals; its parts' modules are importable after it ran (it puts the repository on sys.path)."""
    return runpy.run_path(str(SCRIPT), run_name="gpu_check")


def parts_module() -> Any:
    script()
    return sys.modules["bench.gpu_parts"]


def test_a_resume_check_that_compared_nothing_or_differs_is_a_problem() -> None:
    verdict = parts_module().resume_verdict
    refs = {s: 1.0 / s for s in range(1, 31)}
    resumed = [{"step": s, "loss": 1.0 / s} for s in range(21, 31)]
    assert verdict(refs, resumed, 30, 10)[1] == []
    res, problems = verdict(refs, [], 30, 10)  # the old check: 0 steps, "bitwise_equal: True"
    assert res["steps_compared"] == 0 and res["bitwise_equal"] is False
    assert any("0 steps compared, expected 10" in p for p in problems)
    off = resumed[:3] + [{"step": 24, "loss": 0.5}] + resumed[4:]
    assert any("differ from the uninterrupted run" in p for p in verdict(refs, off, 30, 10)[1])


def test_more_than_one_sync_per_optimizer_step_is_a_problem_and_too_few_steps_count_nothing() -> None:
    parts = parts_module()
    logged = [{"step": s, "t": 100.0 + s} for s in range(1, 31)]
    warm = parts.SYNC_WARM
    # one sync inside each step's interval, two before the first step (set-up is not counted)
    one = [99.0, 99.5] + [100.5 + s for s in range(1, 30)]
    res, problems = parts.sync_verdict(one, logged)
    assert problems == [] and res["syncs_per_step"] == 1.0 and res["most_in_a_step"] == 1
    assert res["steps_counted"] == 30 - warm - 1 and res["syncs_before_first_step"] == 2
    three = sorted(one + [100.6 + s for s in range(1, 30)] + [100.7 + s for s in range(1, 30)])
    res, problems = parts.sync_verdict(three, logged)
    assert res["syncs_per_step"] == 3.0 and problems == ["3.0 host-device syncs per optimizer step, expected at most 1"]
    res, problems = parts.sync_verdict(one, logged[:warm + 3])
    assert res["syncs_per_step"] == 1.0 and "too few" in problems[0]


def test_mfu_outside_its_band_or_without_a_peak_is_a_problem() -> None:
    script()
    mfu = sys.modules["bench.gpu_mt"].mfu_problems
    assert mfu({"peak_flops": 989e12, "median_mfu": 0.41, "device": "cuda"}) == []
    assert "outside 15%..75% against a peak of 989 TFLOP/s" in mfu({"peak_flops": 989e12, "median_mfu": 0.05, "device": "cuda"})[0]
    assert "outside" in mfu({"peak_flops": 989e12, "median_mfu": 0.9, "device": "cuda"})[0]
    assert mfu({"peak_flops": None, "median_mfu": None, "device": "NVIDIA X"}) == ["no peak FLOP/s for NVIDIA X: MFU unknown"]


def test_nvml_samples_count_only_a_gpu_that_holds_the_runs_memory(tmp_path: Path) -> None:
    script()
    gpu_samples = sys.modules["bench.gpu_mt"].gpu_samples
    gib = 1 << 30
    lines = [{"v": 1, "t": time.time() + i, "nvml": True, "nvml_error": None,
              "gpus": [{"index": 0, "name": "H100", "util_pct": 97.0, "mem_used_bytes": 30 * gib, "mem_total_bytes": 80 * gib},
                       {"index": 1, "name": "H100", "util_pct": 0.0, "mem_used_bytes": gib // 2, "mem_total_bytes": 80 * gib}],
              "ranks": [{"rank": 0, "pid": 5, "alive": True}]} for i in range(3)]
    (tmp_path / "system.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    got = gpu_samples(tmp_path, 20 * gib)
    assert (got["samples"], got["rank_samples"], got["gpu_samples"], got["gpu_indices"]) == (3, 3, 3, [0])
    assert gpu_samples(tmp_path, 40 * gib)["gpu_samples"] == 0   # no GPU held what the run allocated


def test_a_run_still_going_at_the_deadline_is_killed_and_named(tmp_path: Path) -> None:
    parts = parts_module()
    ctx = parts.Ctx(root=tmp_path, dry=True, deadline=time.monotonic() + 1.0, tiny={}, gpt2={})
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="deadline"):
        parts.finish(proc, ctx)
    assert proc.returncode is not None and time.monotonic() - t0 < 20


def _stand_in(name: str, log: list[str], seconds: float = 0.0, outcome: str = "pass") -> Any:
    """A part that writes a log, a checkpoint and a FIFO into its folder, then passes, fails, skips or raises."""
    g = script()

    def part(ctx: Any) -> tuple[dict, list[str]]:
        log.append(name)
        (ctx.root / "logs").mkdir()
        (ctx.root / "logs" / "rank0.log").write_text(f"{name} was here\n")
        (ctx.root / "checkpoints" / "step-1").mkdir(parents=True)
        (ctx.root / "checkpoints" / "step-1" / "model.pt").write_bytes(b"x" * 1000)
        os.mkfifo(ctx.root / "events.fifo")
        time.sleep(seconds)
        if outcome == "skip":
            raise g["Skipped"]("skipped: needs 2 GPUs (found 1)")
        if outcome == "raise":
            raise ValueError("a bug in the part")
        return {"summary": f"{name} ok"}, ["it broke"] if outcome == "fail" else []

    return part


def _main(monkeypatch: pytest.MonkeyPatch, out: Path, parts: list, *args: str) -> int:
    g = script()
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(out), *args])
    g["PARTS"][:] = parts
    try:
        g["main"]()
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def test_one_gpu_is_a_full_pass_a_part_skipped_is_no_failure_and_every_parts_files_are_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    log: list[str] = []
    parts = [("first", _stand_in("first", log)), ("flight_nccl", _stand_in("flight_nccl", log, outcome="skip")),
             ("last", _stand_in("last", log))]
    assert _main(monkeypatch, tmp_path / "out", parts, "--jobs", "1") == 0
    assert log == ["first", "flight_nccl", "last"]
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert [ln.split()[:2] for ln in summary] == [["pass", "first"], ["skipped", "flight_nccl"], ["pass", "last"]]
    assert summary[1].endswith("s  skipped: needs 2 GPUs (found 1)")
    assert "gpu_check passed (2 passed, 0 failed, 1 skipped)" in capsys.readouterr().out
    for name in ("first", "flight_nccl", "last"):   # the logs, not the checkpoints, not the FIFO (never blocked on)
        kept = tmp_path / "out" / name
        assert (kept / "logs" / "rank0.log").read_text() == f"{name} was here\n"
        assert not (kept / "checkpoints").exists() and not (kept / "events.fifo").exists()
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["problems"] == [] and report["flight_nccl"]["status"] == "skipped"


def test_a_failed_part_keeps_its_files_fails_the_check_and_the_deadline_skips_what_cannot_finish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    g = script()
    log: list[str] = []
    # 20 s for all: "slow" takes 6 s, so "late" would start with under MIN_PART_S (15 s) left
    assert g["MIN_PART_S"] == 15.0
    parts = [("broken", _stand_in("broken", log, outcome="raise")), ("failing", _stand_in("failing", log, outcome="fail")),
             ("slow", _stand_in("slow", log, seconds=6.0)), ("late", _stand_in("late", log))]
    assert _main(monkeypatch, tmp_path / "out", parts, "--jobs", "1", "--deadline", "20") == 1
    assert log == ["broken", "failing", "slow"]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["problems"] == ["broken: raised ValueError: a bug in the part", "failing: it broke"]
    assert [report[n]["status"] for n in ("broken", "failing", "slow", "late")] == ["fail", "fail", "pass", "skipped"]
    assert report["late"]["reason"].startswith("deadline: ") and report["late"]["reason"].endswith(" s left of 20")
    assert (tmp_path / "out" / "broken" / "logs" / "rank0.log").exists()   # a part that raised: its files too
    err = capsys.readouterr().err
    assert "gpu_check FAILED (1 passed, 2 failed, 1 skipped)" in err


def test_bad_options_are_one_line_and_exit_2(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--deadline", "0", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--deadline 0.0" in p.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_dry_gpu_check_runs_every_part_and_keeps_every_parts_files(tmp_path: Path) -> None:
    out = tmp_path / "not" / "yet"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), OUT=str(out))  # $OUT: the default --out
    p = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--gpt2-steps", "6", "--fsdp-steps", "6", "--deadline", "800"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=860)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = (out / "summary.txt").read_text().splitlines()
    status = {ln.split()[1]: ln.split()[0] for ln in summary}
    assert status == {"doctor": "pass", "launch": "pass", "oom": "skipped", "syncs": "skipped", "bf16": "pass", "resume": "pass",
                      "fp16": "pass", "flight_gloo": "pass", "flight_nccl": "skipped", "fsdp": "pass"}
    assert p.stdout.endswith(f"gpu_check passed (7 passed, 0 failed, 3 skipped): {out / 'gpu_check.json'}\n")
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["problems"] == []
    assert report["oom"]["reason"] == "skipped on --dry: needs CUDA" and (out / "oom" / "oom.toml").exists()
    assert report["flight_nccl"]["reason"] == "skipped: needs 2 GPUs (found 0)"
    syncs = report["syncs"]   # the counting ran: its stand-in warning, before the first step, and none in a CPU step
    assert syncs["syncs_before_first_step"] == 1 and syncs["syncs_per_step"] == 0 and syncs["steps_counted"] == 24
    launch = report["launch"]  # mt launch --headless: the supervisor's run directory, all of it kept
    assert launch["state"] == "completed" and launch["steps"] == 6 and launch["rank_samples"] >= 1
    kept = out / "launch" / "runs" / Path(launch["run"]).name
    for name in ("events.jsonl", "system.jsonl", "status.json", "logs/supervisor.log", "logs/rank0.log"):
        assert (kept / name).stat().st_size > 0, name
    assert (kept / "logs" / "torchrun.log").exists()   # empty when torchrun had nothing to say
    assert "run dir: " in (out / "launch" / "launch.headless.log").read_text()
    assert "ok" in (out / "doctor" / "doctor.txt").read_text()
    assert report["fp16"]["skipped_steps"] == [20] and report["bf16"]["steps"] == 30
    assert report["bf16"]["anatomy"]["n"] == 20 and report["bf16"]["anatomy"]["compute_s"] > 0
    resume = report["resume"]
    assert resume["killed_rc"] == -9 and resume["resumed_at"] == 20
    assert resume["steps_compared"] == 10 and resume["bitwise_equal"] is True
    assert (out / "resume" / "killed" / "events.jsonl").exists() and (out / "bf16" / "bf16" / "events.jsonl").exists()
    gloo = report["flight_gloo"]   # torch 2.13 records gloo's collectives but dumps nothing on its timeout
    assert gloo["dumped_on_timeout"] == [] and "rank 1 did not join collective #4" in gloo["analyzer_on_explicit_dump"]
    for name in ("fsdp_eager", "fsdp_compile"):
        part = report["fsdp"][name]
        assert part["steps"] == 6 and part["async_checkpoint"] is True
        assert [c["step"] for c in part["checkpoints"]] == [3, 6]
        assert all(c["blocking_s"] is not None for c in part["checkpoints"])
        assert not (out / "fsdp" / name / "checkpoints").exists()
