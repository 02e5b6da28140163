"""PyTorch's flight recorder: mt's variables for NCCL runs, its dumps read by mt itself (plain values
only: a pickle dropped into flight/ never runs) over real dumps of a real 2-rank job, torch's own
analyzer as the oracle of the verdict, and flight/ watched only where mt turned the recorder on.

The gloo finding (torch 2.13): gloo collectives are recorded, but nothing is dumped on a gloo
timeout, and its dump keys pg_config '' while its entries name group '0' (torch's analyzer fails on
it with a KeyError; mt's reader takes the lone entry); the NCCL path is checked on a lent GPU
(bench/gpu_check.py, the flight part)."""
from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mt.contract.config import Config
from mt.contract.paths import RunPaths
from mt.contract.preset import config_from_dict
from mt.contract.status import Status
from tests.cli.conftest import REPO, SMALL, end_run, events, mt, status, wait_for, write_preset
from tui.stacks.auto import IncidentCaptures, flight_evidence
from tui.stacks.flight import NotADump, Unjoined, load_dump, plain_unpickle
from tui.stacks.recorder import MAX_DUMP_BYTES, analyze, dumps_here, recorder_env
from tui.supervise.diagnosis import IncidentHook
from tui.supervise.torchrun import worker_env

JOB = REPO / "bench" / "flight_job.py"
WANT = "rank 1 did not join collective #4 (gloo:all_reduce, group 0:default_pg); rank 0 waits in it"


class Payload:
    """A real pickle payload: unpickling it runs `touch MARKER` as whoever unpickles it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def payload_bytes(marker: Path, protocol: int = 4) -> bytes:
    import pickle

    return pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [Payload(marker)]}, protocol=protocol)


def proven_payload(tmp_path: Path) -> bytes:
    """The payload, shown to run when unpickled plainly (in a throwaway process), so its marker's absence means something."""
    probe = tmp_path / "probe-marker"
    (tmp_path / "probe").write_bytes(payload_bytes(probe))
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read())",
                    str(tmp_path / "probe")], check=True, timeout=60)
    assert probe.exists()
    return payload_bytes(tmp_path / "marker")


def _cfg(device: str) -> Config:
    raw = json.loads(json.dumps(SMALL))
    raw["launch"]["device"] = device
    return config_from_dict(raw, "test")


def test_the_recorder_is_on_for_runs_that_may_use_nccl_and_the_users_values_win(tmp_path):
    flight = tmp_path / "run" / "flight"
    assert recorder_env(_cfg("cpu"), flight, {}) == {} and not flight.exists()
    assert not dumps_here(_cfg("cpu"), flight, {})
    env = worker_env(_cfg("cuda"), base={}, flight_dir=flight)
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(flight / "rank_") and flight.is_dir()
    assert dumps_here(_cfg("cuda"), flight, {}) and dumps_here(_cfg("auto"), flight, {})
    mine = worker_env(_cfg("auto"), base={"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_FR_DUMP_TEMP_FILE": "/x/y"},
                      flight_dir=flight)
    assert "TORCH_FR_BUFFER_SIZE" not in mine and mine["TORCH_FR_DUMP_TEMP_FILE"] == "/x/y"
    assert not dumps_here(_cfg("auto"), flight, {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/y"})  # dumps go elsewhere
    assert "TORCH_FR_BUFFER_SIZE" not in worker_env(_cfg("cpu"), base={}, flight_dir=flight)
    for off in ({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, {"TORCH_FR_BUFFER_SIZE": "0"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}):
        assert recorder_env(_cfg("cuda"), flight, off) == {} and not dumps_here(_cfg("cuda"), flight, off), off


def test_a_pickle_naming_any_global_is_refused_by_the_reader_and_never_runs(tmp_path):
    payload = proven_payload(tmp_path)
    folder = tmp_path / "flight"
    folder.mkdir()
    (folder / "rank_0").write_bytes(payload)
    report = analyze(folder)
    assert not (tmp_path / "marker").exists()
    assert report.unjoined == () and report.error == (
        "rank_0 refused: it names posix.system; a flight-recorder dump holds plain values only"), report
    assert report.line() == f"flight recorder: no analysis ({report.error})"
    for protocol in range(6):   # GLOBAL+REDUCE (0-3) and STACK_GLOBAL (4, 5): every way a pickle names a callable
        with pytest.raises(NotADump, match="names posix.system"):
            load_dump(payload_bytes(tmp_path / "marker", protocol), 0)
    for raw, why in ((b"\x80\x04K\x01Q.", "persistent id"), (b"\x80\x04\x82\x01.", "not a pickle"),
                     (b"garbage", "not a pickle"), (b"\x80\x04]\x94.", "a list, not a dump")):
        with pytest.raises(NotADump, match=why):   # a persistent id, an extension code, no pickle, the wrong shape
            load_dump(raw, 0)
    assert not (tmp_path / "marker").exists()
    # the door's refusals, each a line of the report: a FIFO (never blocks), a link, a dump over the bound
    os.mkfifo(folder / "rank_1")
    (folder / "rank_2").symlink_to(tmp_path / "probe")
    with open(folder / "rank_3", "wb") as f:
        f.truncate(MAX_DUMP_BYTES + 1)
    error = analyze(folder).error   # returns: the FIFO and the link are not even opened (not regular files)
    assert "rank_1" not in error and "rank_2" not in error, error
    assert f"rank_3 refused: {MAX_DUMP_BYTES + 1} bytes, more than the {MAX_DUMP_BYTES}" in error, error
    assert not (tmp_path / "marker").exists()


def test_flight_is_watched_only_where_mt_turned_the_recorder_on(tmp_path):
    """The same payload dropped into two runs' flight/: the one whose recorder mt turned on reads it
    (and refuses it); by then the other has had as many ticks, and has not looked."""
    payload = proven_payload(tmp_path)
    caps = {}
    for device in ("cpu", "auto"):
        run = tmp_path / device
        (run / "control").mkdir(parents=True)
        (run / "config.json").write_text("{}")
        hook = IncidentHook(run, _cfg(device), logging.getLogger("test"))
        caps[device] = hook.captures
    caps["auto"].flight.settle_s = 0.3
    for device in caps:
        RunPaths(tmp_path / device).flight.mkdir(exist_ok=True)
        (RunPaths(tmp_path / device).flight / "rank_0").write_bytes(payload)
    seen: dict[str, list] = {"cpu": [], "auto": []}

    def read() -> bool:
        for device, c in caps.items():
            c.take()
            seen[device] += c.take_flight()
        return bool(seen["auto"])
    wait_for(read, 60, "the recorder's run to read its flight/", every=0.1)
    assert seen["cpu"] == [] and not (tmp_path / "marker").exists()
    assert caps["cpu"].flight is None   # not even a scan of the folder
    (done,) = seen["auto"]
    assert done.flight.error.startswith("rank_0 refused: it names posix.system")


def test_a_laggard_is_named_only_where_its_dump_shows_it_never_entered(tmp_path):
    """p2p entries do not count; a rank whose wrapped buffer holds none of the group is not blamed
    (it may have joined, its records overwritten), one whose buffer never wrapped is."""
    import pickle

    def entry(rid: int, group: str, seq: int, p2p: bool = False) -> dict[str, Any]:
        return {"record_id": rid, "process_group": (group, "default_pg" if group == "0" else "tp"),
                "collective_seq_id": seq, "profiling_name": "nccl:send" if p2p else "nccl:all_reduce",
                "state": "started", "is_p2p": p2p}
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}, "1": {"name": "1", "desc": "tp", "ranks": "[1]"}}
    dumps = {0: [entry(0, "0", 1), entry(1, "0", 0, p2p=True)], 1: [entry(50, "1", 40)], 2: []}
    for rank, entries in dumps.items():
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps({"version": "2.10", "pg_config": cfg, "entries": entries}))
    (u,) = analyze(tmp_path).unjoined
    assert (u.seq, u.missing, u.waiting, u.expected) == (1, (2,), (0,), (0, 1, 2))
    assert u.line() == "rank 2 did not join collective #1 (nccl:all_reduce, group 0:default_pg); rank 0 waits in it"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_pickle_dropped_into_a_live_cpu_runs_flight_folder_is_never_read(tmp_path):
    """The issue's attack: a payload written as flight/rank_0 into a live CPU run. The old watcher ran
    torch's analyzer (pickle.load) on it within 15 s; now a CPU run never looks at flight/."""
    payload = proven_payload(tmp_path)
    preset = write_preset(tmp_path / "p.toml", tmp_path / "runs", launch={"nproc_per_node": 1},
                          train={"max_steps": 100000}, checkpoint={"every_steps": 0}, faults={"step_sleep_s": 0.05})
    res = mt("launch", preset, "--detach")
    assert res.returncode == 0, res.stderr
    run_dir = Path(res.stdout.strip())
    try:   # the run is ended by `mt stop`, or killed if the test fails first
        wait_for(lambda: events(run_dir, "step"), 180, "the run's first step")
        flight = RunPaths(run_dir).flight
        flight.mkdir(exist_ok=True)
        (flight / "rank_0").write_bytes(payload)
        # a read would move the file's atime off 1 s (relatime updates an atime older than its mtime);
        # checked only where this file system keeps atimes at all
        os.utime(flight / "rank_0", (1, time.time()))
        probe = tmp_path / "atime-probe"
        probe.write_bytes(b"x")
        os.utime(probe, (1, time.time()))
        probe.read_bytes()
        keeps_atime = os.stat(probe).st_atime != 1
        ticks = RunPaths(run_dir).system
        at_drop = len(ticks.read_text().splitlines())
        # one sample a supervisor tick (1 s): 15 ticks cover the old watcher's 2 s settle and its analyzer
        wait_for(lambda: len(ticks.read_text().splitlines()) >= at_drop + 15, 120, "15 supervisor ticks")
        assert status(run_dir).get("state") == "running"
        stop = mt("stop", run_dir)
        assert stop.returncode == 0, stop.stdout + stop.stderr
    except BaseException:
        end_run(run_dir)
        raise
    assert not (tmp_path / "marker").exists()
    if keeps_atime:
        assert os.stat(flight / "rank_0").st_atime == 1, "the supervisor read the dropped file"
    log = RunPaths(run_dir).supervisor_log.read_text()
    assert "flight recorder" not in log and "fr_trace" not in log, log[-2000:]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gloo_dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-rank gloo job with mt's recorder variables whose rank 1 never joins collective #4:
    torch's own dumps of both ranks (bench/flight_job.py --dump); torch dumped nothing on the timeout."""
    tmp = tmp_path_factory.mktemp("gloo")
    flight, out = tmp / "flight", tmp / "explicit"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FLIGHT_TIMEOUT_S": "4",
           **recorder_env(_cfg("auto"), flight, dict(os.environ))}
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                          "127.0.0.1", "--master-port", str(_port()), str(JOB), "gloo", str(out), "--dump"],
                         capture_output=True, text=True, env=env, timeout=240)
    assert "rank 0: collective #4 failed" in job.stdout, job.stdout + job.stderr
    assert list(flight.iterdir()) == []   # the finding: no dump on a gloo timeout, even with the recorder on
    assert sorted(p.name for p in out.iterdir()) == ["rank_0", "rank_1"]
    return out


def fr_trace(folder: Path) -> set[tuple[int, tuple[int, ...]]]:
    """Torch's own analyzer over dumps this test built (the oracle): the first (seq, missing ranks) it
    reports (after it, it reports each later collective of the same laggards too; mt keeps the first)."""
    out = subprocess.run([sys.executable, "-P", "-m", "torch.distributed.flight_recorder.fr_trace", str(folder),
                          "--prefix", "rank_", "--allow-incomplete-ranks"], capture_output=True, text=True, timeout=240)
    text = out.stdout + out.stderr
    found = re.findall(r"Not all ranks joining collective, sequence number: (\d+)\n(?:.*\n)*?missing ranks: \{([\d, ]*)\}", text)
    assert out.returncode == 0 or found, text[-2000:]
    return set() if not found else {min((int(seq), tuple(sorted(int(r) for r in ranks.split(",")))) for seq, ranks in found)}


def mine(folder: Path) -> set[tuple[int, tuple[int, ...]]]:
    return {(u.seq, u.missing) for u in analyze(folder).unjoined}


def write_dumps(folder: Path, dumps: dict[int, dict[str, Any]]) -> Path:
    import pickle

    folder.mkdir(parents=True)
    for rank, dump in dumps.items():
        (folder / f"rank_{rank}").write_bytes(pickle.dumps(dump))
    return folder


def nccl_shaped(template: dict[str, Any], groups: dict[str, tuple[str, list[int]]],
                seqs: dict[int, list[tuple[str, int]]], first_record: int = 0) -> dict[int, dict[str, Any]]:
    """Dumps as NCCL writes them (pg_config keyed by group name: FlightRecorderDetail.hpp getPgConfig),
    each entry a real gloo entry with its group, seq and record id set: rank -> its (group, seq)s in order."""
    pg_config = {g: {"name": g, "desc": desc, "ranks": str(ranks)} for g, (desc, ranks) in groups.items()}
    out = {}
    for rank, calls in seqs.items():
        entries = [{**template, "record_id": first_record + i, "process_group": (g, groups[g][0]),
                    "collective_seq_id": seq, "op_id": seq, "profiling_name": "nccl:all_reduce",
                    "state": "completed" if i < len(calls) - 1 else "started"} for i, (g, seq) in enumerate(calls)]
        out[rank] = {"version": "2.10", "pg_config": pg_config, "pg_status": {}, "entries": entries}
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_gloo_dumps_give_torch_analyzers_verdict_and_the_supervisor_reports_it(tmp_path, gloo_dumps):
    raw = analyze(gloo_dumps)   # gloo's own shape (pg_config keyed ''): torch's analyzer fails on it, mt's reader not
    assert raw.error == "" and raw.line() == f"flight recorder: {WANT}", raw
    assert raw.unjoined == (Unjoined(4, "gloo:all_reduce", "0:default_pg", (1,), (0, 1), "scheduled", (0,)),)

    # the same real dumps with pg_config keyed by the group's name, as NCCL's dumps key it
    dumps = {r: plain_unpickle((gloo_dumps / f"rank_{r}").read_bytes()) for r in (0, 1)}
    for dump in dumps.values():
        group, desc = dump["entries"][0]["process_group"]
        dump["pg_config"] = {group: {**next(iter(dump["pg_config"].values())), "name": group, "desc": desc}}
    keyed = write_dumps(tmp_path / "keyed", dumps)
    assert analyze(keyed).line() == f"flight recorder: {WANT}"
    assert mine(keyed) == fr_trace(keyed) == {(4, (1,))}

    # NCCL-shaped dumps of 4 ranks, each verdict torch's analyzer's
    t = dumps[0]["entries"][0]
    dp = {"0": ("default_pg", [0, 1, 2, 3])}
    two = {**dp, "1": ("tp", [2, 3])}
    cases = {
        "two_lag": nccl_shaped(t, dp, {r: [("0", s) for s in range(1, 6 if r < 2 else 5)] for r in range(4)}),
        "subgroup": nccl_shaped(t, two, {0: [("0", s) for s in (1, 2, 3)], 1: [("0", s) for s in (1, 2, 3)],
                                         2: [("0", 1), ("1", 1), ("0", 2), ("1", 2), ("0", 3), ("1", 3)],
                                         3: [("0", 1), ("1", 1), ("0", 2), ("1", 2), ("0", 3)]}),
        "wrapped": nccl_shaped(t, {"0": ("default_pg", [0, 1])},
                               {0: [("0", s) for s in range(101, 121)], 1: [("0", s) for s in range(101, 119)]}, 100),
    }
    want = {"two_lag": {(5, (2, 3))}, "subgroup": {(3, (3,))}, "wrapped": {(119, (1,))}}
    for name, case in cases.items():
        folder = write_dumps(tmp_path / name, case)
        assert mine(folder) == fr_trace(folder) == want[name], name
    assert analyze(tmp_path / "two_lag").line() == ("flight recorder: ranks 2, 3 did not join collective #5 "
                                                    "(nccl:all_reduce, group 0:default_pg); ranks 0, 1 wait in it")
    assert analyze(tmp_path / "subgroup").unjoined[0].group == "1:tp"

    # the supervisor's capture thread notices dumps landing in the run's flight/ and reads them once
    run = tmp_path / "run"
    (run / "control").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    caps = IncidentCaptures(run, logging.getLogger("test"), flight=True)
    caps.flight.settle_s = 0.3
    shutil.copytree(keyed, RunPaths(run).flight)
    done = wait_for(lambda: caps.take() == [] and caps.take_flight(), 120, "the analysis", every=0.2)
    ev = flight_evidence(done[0].flight, run)
    assert ev["flight"] == "flight" and ev["flight_line"] == f"flight recorder: {WANT}"
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
    shutil.copytree(keyed, RunPaths(hooked).flight)

    def updated() -> dict | None:
        hook.poll(Status(state="running"), [], [], {})
        lines = [json.loads(line) for line in (hooked / "incidents.jsonl").read_text().splitlines()]
        return next((r for r in lines if r["status"] == "update" and "flight" in r["evidence"]), None)
    upd = wait_for(updated, 120, "the hang's flight update", every=0.3)
    assert upd["code"] == "hang" and upd["evidence"]["unjoined"][0]["missing_ranks"] == [1]
    assert upd["detail"] == f"rank 1 has not reported for 60 s; flight recorder: {WANT}"


FULL_BUFFER = """
import os, sys
os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
import torch, torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
x = torch.ones(4)
def deep(n):
    if n:
        return deep(n - 1)
    for _ in range(2100):
        dist.all_reduce(x)
deep(60)
sys.stdout.buffer.write(_dump_fr_trace())
"""


@pytest.mark.slow
def test_a_full_buffer_dump_fits_well_inside_the_readers_bound(tmp_path):
    """A real dump of torch's 2000-entry buffer, each collective 64 frames deep: MAX_DUMP_BYTES is many times its size."""
    out = subprocess.run([sys.executable, "-c", FULL_BUFFER], capture_output=True, timeout=240,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    dump = load_dump(out.stdout, 0)
    assert len(dump.entries) == 2000 and len(out.stdout) * 8 < MAX_DUMP_BYTES, len(out.stdout)


ENV_DUMP = """\
import json, os, sys
with open(sys.argv[1] + f".{os.environ['RANK']}", "w") as f:
    json.dump({k: v for k, v in os.environ.items() if k.startswith("TORCH_")}, f)
"""


@pytest.mark.slow
def test_the_ranks_get_the_recorder_under_the_names_of_every_torch_from_2_2(tmp_path):
    # torch 2.2 to 2.8 read only TORCH_NCCL_*; 2.9 on reads TORCH_FR_* first: a rank must get both
    script, out, runs = tmp_path / "envdump.py", tmp_path / "env", tmp_path / "runs"
    script.write_text(ENV_DUMP)
    res = mt("launch", script, "--headless", "--nproc", "2", "--runs-dir", runs, "--", out, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    flight = next(runs.iterdir()) / "flight"
    for rank in (0, 1):
        env = json.loads((tmp_path / f"env.{rank}").read_text())
        assert {k: env.get(k) for k in env if "FR_" in k or "TRACE" in k or "DUMP" in k or "DEBUG_INFO" in k} == {
            "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            "TORCH_FR_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": str(flight / "rank_"), "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(flight / "rank_"),
        }, rank
