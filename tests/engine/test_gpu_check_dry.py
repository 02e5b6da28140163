"""bench/gpu_check.py --dry: every part of the GPU check runs on the CPU and checks something."""
from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from .runner import REPO

SCRIPT = REPO / "bench" / "gpu_check.py"


def test_a_resume_check_that_compared_nothing_or_differs_is_a_problem() -> None:
    verdict = runpy.run_path(str(SCRIPT), run_name="gpu_check")["resume_verdict"]
    refs = {s: 1.0 / s for s in range(1, 31)}
    resumed = [{"step": s, "loss": 1.0 / s} for s in range(21, 31)]
    assert verdict(refs, resumed, 30, 10)[1] == []
    res, problems = verdict(refs, [], 30, 10)  # the old check: 0 steps, "bitwise_equal: True"
    assert res["steps_compared"] == 0 and res["bitwise_equal"] is False
    assert any("0 steps compared, expected 10" in p for p in problems)
    off = resumed[:3] + [{"step": 24, "loss": 0.5}] + resumed[4:]
    assert any("differ from the uninterrupted run" in p for p in verdict(refs, off, 30, 10)[1])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_dry_gpu_check_runs_every_part_and_writes_its_report_into_a_new_folder(tmp_path: Path) -> None:
    out = tmp_path / "not" / "yet"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--out", str(out), "--gpt2-steps", "6", "--fsdp-steps", "6"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=560)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["problems"] == []
    assert report["fp16"]["skipped_steps"] == [20] and report["bf16"]["steps"] == 30
    assert report["bf16"]["anatomy"]["n"] == 20 and report["bf16"]["anatomy"]["compute_s"] > 0
    resume = report["resume"]
    assert resume["killed_rc"] == -9 and resume["resumed_at"] == 20
    assert resume["steps_compared"] == 10 and resume["bitwise_equal"] is True
    assert report["gpt2_small"]["steps"] == 6
    gloo = report["flight"]["gloo"]   # torch 2.13 records gloo's collectives but dumps nothing on its timeout
    assert gloo["dumped_on_timeout"] == [] and "rank 1 did not join collective #4" in gloo["analyzer_on_explicit_dump"]
    for name in ("fsdp_eager", "fsdp_compile"):
        part = report["gpt2_fsdp"][name]
        assert part["steps"] == 6 and part["async_checkpoint"] is True
        assert [c["step"] for c in part["checkpoints"]] == [3, 6]
        assert all(c["blocking_s"] is not None for c in part["checkpoints"])


@pytest.mark.parametrize("jobs", [1, 2])
def test_parts_run_jobs_at_a_time_and_the_resume_part_waits_for_its_reference(tmp_path: Path, jobs: int) -> None:
    # run_parts itself with stand-in parts (each a short sleep): which ran beside which, and when
    # the resume part's reference rc was read
    import argparse
    import threading
    import time

    g = runpy.run_path(str(SCRIPT), run_name="gpu_check")["run_parts"].__globals__
    log: list[tuple[str, str]] = []
    lock = threading.Lock()

    def part(name: str, ref_rc=None) -> tuple[dict, list[str]]:
        with lock:
            log.append(("start", name))
        time.sleep(0.4 if name == "bf16" else 0.1)
        rc = ref_rc() if ref_rc else 0
        with lock:
            log.append(("end", name))
        return {"rc": rc}, []

    g.update(precision_part=lambda root, tiny, p: part(p), resume_part=lambda root, tiny, ref, ref_rc: part("resume", ref_rc),
             gpt2_part=lambda *a: part("gpt2_small"), fsdp_part=lambda *a: part("gpt2_fsdp"), flight_part=lambda *a: part("flight"))
    report = g["Report"](tmp_path / "gpu_check.json")
    g["run_parts"](report, tmp_path, {}, {}, argparse.Namespace(jobs=jobs, gpt2_steps=1, fsdp_steps=1, dry=True))
    names = ["bf16", "resume", "gpt2_fsdp", "fp16", "flight", "gpt2_small"]
    assert sorted(report.data) == sorted(["problems", *names]) and report.data["problems"] == []
    assert report.data["resume"]["rc"] == 0
    assert log.index(("end", "bf16")) < log.index(("end", "resume"))   # it read the reference's rc after its end
    running, most = 0, 0
    for what, _ in log:
        running += 1 if what == "start" else -1
        most = max(most, running)
    assert most == jobs
    if jobs == 1:  # a GPU check: one part after another, in their order
        assert log == [(w, n) for n in names for w in ("start", "end")]
