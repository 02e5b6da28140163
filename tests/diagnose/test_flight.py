"""PyTorch's flight recorder: mt's variables for NCCL runs, torch's analyzer run as a subprocess over
real dumps of a real 2-rank job, and the supervisor's capture thread reporting who did not join.

The gloo finding (torch 2.13): gloo collectives are recorded, but nothing is dumped on a gloo
timeout, and torch's analyzer fails on a gloo dump (its pg_config is keyed '' while its entries
name group '0'); the NCCL path is checked on a lent GPU (bench/gpu_check.py, the flight part)."""
from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time

import pytest

from mt.contract.config import Config
from mt.contract.paths import RunPaths
from mt.contract.preset import config_from_dict
from mt.contract.status import Status
from tests.cli.conftest import REPO, SMALL, wait_for
from tui.diagnose.flight import parse_fr_trace
from tui.diagnose.hook import IncidentHook
from tui.run.autostacks import IncidentCaptures, flight_evidence
from tui.run.flight import analyze, recorder_env
from tui.run.torchrun import worker_env

JOB = REPO / "bench" / "flight_job.py"


def _cfg(device: str) -> Config:
    raw = json.loads(json.dumps(SMALL))
    raw["launch"]["device"] = device
    return config_from_dict(raw, "test")


def test_the_recorder_is_on_for_runs_that_may_use_nccl_and_the_users_values_win(tmp_path):
    flight = tmp_path / "run" / "flight"
    assert recorder_env(_cfg("cpu"), flight, {}) == {} and not flight.exists()
    env = worker_env(_cfg("cuda"), base={}, flight_dir=flight)
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(flight / "rank_") and flight.is_dir()
    mine = worker_env(_cfg("auto"), base={"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_FR_DUMP_TEMP_FILE": "/x/y"},
                      flight_dir=flight)
    assert "TORCH_FR_BUFFER_SIZE" not in mine and mine["TORCH_FR_DUMP_TEMP_FILE"] == "/x/y"
    assert "TORCH_FR_BUFFER_SIZE" not in worker_env(_cfg("cpu"), base={}, flight_dir=flight)


def test_the_analyzers_report_is_read_and_bad_output_gives_nothing():
    text = ("tabulate is not installed. Proceeding without it.\nNot all ranks joining collective, sequence number: 7\n"
            "internal record id: 6\ngroup info: 0:default_pg\ncollective: nccl:all_reduce\nmissing ranks: {2, 3}\n"
            "input sizes: [[4]]\nworld size: 4\nexpected ranks: {0, 1, 2, 3}\ncollective state: scheduled\n")
    (u,) = parse_fr_trace(text)
    assert u.line() == "ranks 2, 3 did not join collective #7 (nccl:all_reduce, group 0:default_pg); ranks 0, 1 wait in it"
    assert parse_fr_trace("Not all ranks joining collective, sequence number: x\nmissing ranks: {1}\n\x00") == []


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_gloo_job_is_recorded_but_not_dumped_and_the_analyzer_names_the_rank_that_did_not_join(tmp_path):
    flight, out = tmp_path / "flight", tmp_path / "explicit"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FLIGHT_TIMEOUT_S": "4",
           **recorder_env(_cfg("auto"), flight, dict(os.environ))}
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                          "127.0.0.1", "--master-port", str(_port()), str(JOB), "gloo", str(out), "--dump"],
                         capture_output=True, text=True, env=env, timeout=240)
    assert "rank 0: collective #4 failed" in job.stdout, job.stdout + job.stderr
    assert list(flight.iterdir()) == []   # the finding: no dump on a gloo timeout, even with the recorder on
    assert sorted(p.name for p in out.iterdir()) == ["rank_0", "rank_1"]
    raw = analyze(out)
    assert raw.unjoined == () and raw.error.startswith("torch's analyzer failed: KeyError"), raw  # the finding

    # the same real dumps with pg_config keyed by the group's name, as NCCL's dumps key it
    nccl_like = tmp_path / "keyed"
    nccl_like.mkdir()
    for name in ("rank_0", "rank_1"):
        dump = pickle.loads((out / name).read_bytes())
        group, desc = dump["entries"][0]["process_group"]
        dump["pg_config"] = {group: {**next(iter(dump["pg_config"].values())), "name": group, "desc": desc}}
        (nccl_like / name).write_bytes(pickle.dumps(dump))
    want = "rank 1 did not join collective #4 (gloo:all_reduce, group 0:default_pg); rank 0 waits in it"
    assert analyze(nccl_like).line() == f"flight recorder: {want}"

    # the supervisor's capture thread notices dumps landing in the run's flight/ and analyzes them once
    run = tmp_path / "run"
    (run / "control").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    caps = IncidentCaptures(run, logging.getLogger("test"))
    caps.flight.settle_s = 0.3
    shutil.copytree(nccl_like, RunPaths(run).flight)
    done = wait_for(lambda: caps.take() == [] and caps.take_flight(), 120, "the analysis", every=0.2)
    ev = flight_evidence(done[0].flight, run)
    assert ev["flight"] == "flight" and ev["flight_line"] == f"flight recorder: {want}"
    assert ev["unjoined"] == [{"seq": 4, "op": "gloo:all_reduce", "group": "0:default_pg", "missing_ranks": [1],
                               "expected_ranks": [0, 1], "state": "scheduled"}]
    time.sleep(1.0)
    assert caps.take() == [] and caps.take_flight() == []   # once per set of dumps

    # the supervisor's hook: the report joins the open incident (a hang an earlier tick opened)
    hooked = tmp_path / "hooked"
    (hooked / "control").mkdir(parents=True)
    (hooked / "config.json").write_text("{}")
    (hooked / "incidents.jsonl").write_text(json.dumps({
        "v": 1, "t": time.time(), "code": "hang", "severity": "error", "step": 3, "title": "no progress",
        "detail": "rank 1 has not reported for 60 s", "advice": "py-spy dump it", "evidence": {}, "status": "open",
        "source": "supervisor"}) + "\n")
    hook = IncidentHook(hooked, _cfg("auto"), logging.getLogger("test"))
    hook.captures.flight.settle_s = 0.3
    shutil.copytree(nccl_like, RunPaths(hooked).flight)

    def updated() -> dict | None:
        hook.poll(Status(state="running"), [], [], {})
        lines = [json.loads(line) for line in (hooked / "incidents.jsonl").read_text().splitlines()]
        return next((r for r in lines if r["status"] == "update" and "flight" in r["evidence"]), None)
    upd = wait_for(updated, 120, "the hang's flight update", every=0.3)
    assert upd["code"] == "hang" and upd["evidence"]["unjoined"][0]["missing_ranks"] == [1]
    assert upd["detail"] == f"rank 1 has not reported for 60 s; flight recorder: {want}"
