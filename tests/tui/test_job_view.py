"""One view of a job: `mt watch` (dashboard, --once, --headless) on a shared run directory with
nodes/<node>/ shows every node and its ranks, grouped; hostile nodes/ entries crash nothing."""
from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest

from tests.cli.conftest import mt
from tests.tui.jobdir import JobDir, two_nodes
from tests.tui.test_app import loaded, make_app, text_of

pytestmark = pytest.mark.timeout(120)


def grouped(text: str) -> list[str]:
    """The job block's lines, each stripped, from the first node line on."""
    lines = [ln.strip() for ln in text.splitlines()]
    return lines[next(i for i, ln in enumerate(lines) if ln.startswith("job: ")):]


def assert_grouped(text: str) -> None:
    lines = grouped(text)
    assert lines[0] == "job: 2 nodes, 4 ranks", text
    assert lines[1].startswith("n1 running 2/2r step 5 hb "), text
    assert lines[2].startswith("r0 step 5 hb ") and lines[3].startswith("r1 step 5 hb "), text
    assert lines[4].startswith("n2 running 2/2r step 5 hb "), text
    assert lines[5].startswith("r2 step 5 hb ") and lines[6].startswith("r3 step 5 hb "), text
    assert f"pid {os.getpid()}" in lines[2] and "cpu " in lines[1] and "cpu " in lines[2], text


def test_once_shows_every_node_and_its_ranks_grouped(tmp_path: Path) -> None:
    two_nodes(tmp_path / "job").close()
    out = mt("watch", "--once", str(tmp_path / "job"))
    assert out.returncode == 0, out.stderr
    assert_grouped(out.stdout)


# step anatomies as the engine wrote them (tests/diagnose/test_rules_slowrank.py INPUT): rank 3 waits for its data
WAITS = {"step_s": 0.09036, "data_s": 0.0007804, "compute_s": 0.002731, "optim_s": 0.0009271, "comm_s": 0.08554}
SLOW_INPUT = {"step_s": 0.09053, "data_s": 0.08346, "compute_s": 0.003233, "optim_s": 0.0009633, "comm_s": 0.002394}


def job_with_anatomy(root: Path) -> JobDir:
    job = two_nodes(root, 3)
    job.anatomy({r: SLOW_INPUT if r == 3 else WAITS for r in range(4)})
    job.step(4)
    job.sample()
    return job


def assert_anatomy_under_each_rank(text: str) -> None:
    lines = grouped(text)
    rows = [i for i, ln in enumerate(lines) if ln.startswith("r")]
    assert [lines[i].split()[0] for i in rows] == ["r0", "r1", "r2", "r3"], text
    for i in rows[:3]:
        assert lines[i + 1] == "90 ms: data 0.78, compute 2.7, optim 0.93, wait 86", text
    assert lines[rows[3] + 1] == "91 ms: data 83, compute 3.2, optim 0.96, wait 2.4", text


def test_once_shows_each_ranks_step_anatomy_under_it(tmp_path: Path) -> None:
    job_with_anatomy(tmp_path / "job").close()
    out = mt("watch", "--once", str(tmp_path / "job"))
    assert out.returncode == 0, out.stderr
    assert_anatomy_under_each_rank(out.stdout)


async def test_dashboard_shows_each_ranks_step_anatomy_under_it(tmp_path: Path) -> None:
    job = job_with_anatomy(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        assert_anatomy_under_each_rank(text_of(app, "#system"))
    job.close()


def test_once_names_a_folder_that_is_not_the_jobs_once_and_reads_nothing_of_it(tmp_path: Path) -> None:
    from mt.contract.status import Status, write_status

    job = two_nodes(tmp_path / "job")
    write_status(job.paths.on("n3"), Status(state="failed", attempt=1, exit_code=1,
                                            worker_pids={str(r): 7 for r in range(64)}), node_only=True)
    job.close()
    out = mt("watch", "--once", str(tmp_path / "job"))
    assert out.returncode == 0, out.stderr
    assert_grouped(out.stdout)
    assert out.stdout.count("n3") == 1 and "not part of this job (ignored): nodes/n3" in out.stdout, out.stdout


async def test_dashboard_shows_every_node_and_its_ranks_at_80x24(tmp_path: Path) -> None:
    job = two_nodes(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("2")   # 80x24 is the tabs layout: the system panel is tab 2
        await pilot.pause(0.3)
        assert_grouped(text_of(app, "#system"))
        job.step(6)
        job.sample()
        deadline = time.monotonic() + 10
        while "step 6" not in text_of(app, "#system") and time.monotonic() < deadline:
            await pilot.pause(0.2)
        assert "n2 running 2/2r step 6" in text_of(app, "#system")
    job.close()


async def test_dashboard_shows_a_dead_rank_on_its_node_when_ranks_do_not_fit(tmp_path: Path) -> None:
    job = JobDir(tmp_path, [f"gpu-{k:02d}" for k in range(8)], 8)
    job.start()
    job.step(1)
    job.sample(alive={45: False})
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        lines = grouped(text_of(app, "#system"))
        assert lines[0] == "job: 8 nodes, 64 ranks"
        at = lines.index(next(ln for ln in lines if ln.startswith("gpu-05 ")))
        assert lines[at].startswith("gpu-05 running 7/8r step 1")
        assert lines[at + 1].startswith("r45 step 1 hb ") and lines[at + 1].endswith("exited")
        assert len(lines) == 1 + 8 + 1   # compact: a line a node, and the one rank that exited
    job.close()


def test_headless_prints_the_nodes_of_a_job(tmp_path: Path) -> None:
    from tui.report.headless import follow_run

    job = two_nodes(tmp_path)
    job.event("run_end", step=5, status="completed", reason="max_steps reached")
    from mt.contract.status import Status, write_status
    write_status(job.paths, Status(state="completed", attempt=1, exit_code=0, ended=time.time()))
    out = io.StringIO()
    assert follow_run(tmp_path, out, poll_s=0.01) == "completed"
    lines = out.getvalue().splitlines()
    assert "job: 2 nodes, 4 ranks" in lines
    assert any(ln.startswith("n1 running 2/2r step 5") for ln in lines)
    assert any(ln.startswith("n2 running 2/2r step 5") for ln in lines)
    job.close()


def hostile_nodes(root: Path) -> JobDir:
    """The 2-node job, and beside it every kind of nodes/ entry a reader must survive (n3-n5 named
    by the job as its nodes, so their hostile files are read)."""
    from mt.contract.status import read_status, write_status

    job = two_nodes(root)
    st = read_status(root)
    st.job_nodes = ["n1", "n2", "n3", "n4", "n5"]
    write_status(job.paths, st)
    nodes = job.paths.nodes_dir
    (nodes / "afile").write_text("not a folder")
    os.symlink("/etc", nodes / "alink")
    os.symlink(root / "nodes" / "n1", nodes / "n1-again")
    (nodes / "bad name\x1b]0;x\x07").mkdir()
    bad = nodes / "n3"
    (bad / "heartbeat").mkdir(parents=True)
    (bad / "status.json").write_text('{"state": "running", "worker_pids": {"1": "x", "99": -4}, "attempt": 1e400}')
    (bad / "system.jsonl").write_text('[1]\n{"t": "now"}\n' + '{"t": 1e400, "ranks": 5}\n' + "\x00" * 100 + "\n")
    (bad / "heartbeat" / "rank7").mkdir()            # a folder where a heartbeat should be
    os.mkfifo(bad / "heartbeat" / "rank8")             # a read of it would block forever
    (bad / "heartbeat" / "rank9").write_text('{"step": 1e400, "t": "x"}')
    (bad / "heartbeat" / "rank10").write_text("\xff\xfe garbage")
    os.symlink("/dev/zero", bad / "heartbeat" / "rank11")
    n4 = nodes / "n4"
    n4.mkdir()
    (n4 / "status.json").mkdir()                      # a folder where status.json should be
    (n4 / "system.jsonl").mkdir()
    (n4 / "heartbeat").write_text("a file where the folder should be")
    (nodes / "n5").mkdir()
    (nodes / "n5" / "status.json").write_text('{"state": "runn')   # torn
    return job


def test_hostile_nodes_entries_crash_no_reader(tmp_path: Path) -> None:
    from mt.contract.config import MonitorConfig
    from tui.diagnose.monitor import IncidentMonitor

    hostile_nodes(tmp_path / "job").close()
    out = mt("watch", "--once", str(tmp_path / "job"), timeout=60)
    assert out.returncode == 0, out.stderr
    lines = grouped(out.stdout)
    assert lines[0] == "job: 5 nodes, 4 ranks", out.stdout   # n1-n5; n1-again is a link: skipped (and not the job's)
    assert any(ln.startswith("n3 running 0/0r step N/A") for ln in lines), out.stdout
    assert any(ln.startswith("n4 N/A 0/0r") for ln in lines), out.stdout
    assert any(ln.startswith("n5 N/A 0/0r") for ln in lines), out.stdout
    assert "alink" not in out.stdout and "afile" not in out.stdout and "bad name" not in out.stdout
    monitor = IncidentMonitor(tmp_path / "job", MonitorConfig())
    monitor.poll()
    assert monitor.nodes == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}


async def test_dashboard_survives_hostile_nodes_entries(tmp_path: Path) -> None:
    hostile_nodes(tmp_path).close()
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        assert grouped(text_of(app, "#system"))[0] == "job: 5 nodes, 4 ranks"


async def test_logs_panel_reads_a_rank_log_under_its_node(tmp_path: Path) -> None:
    from tests.tui.test_app import in_log

    job = two_nodes(tmp_path)
    job.log(0, "hello from rank 0 on n1\n")
    job.log(3, "hello from rank 3 on n2\n")
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        deadline = time.monotonic() + 10
        while not in_log(app, "hello from rank 0 on n1") and time.monotonic() < deadline:
            await pilot.pause(0.2)
        assert in_log(app, "hello from rank 0 on n1")
        for _ in range(3):
            await pilot.press("g")
        deadline = time.monotonic() + 10
        while not in_log(app, "hello from rank 3 on n2") and time.monotonic() < deadline:
            await pilot.pause(0.2)
        assert in_log(app, "hello from rank 3 on n2")
    job.close()


def test_a_script_in_a_job_takes_requests_once_a_node_holds_its_heartbeat(tmp_path: Path) -> None:
    import json

    from mt.contract.status import read_status
    from tui.supervise.control import takes_requests

    job = two_nodes(tmp_path)
    cfg = json.loads(job.paths.config.read_text())
    job.paths.config.write_text(json.dumps({**cfg, "launch": {**cfg["launch"], "script": "train.py"}}))
    status = read_status(tmp_path)
    assert takes_requests(tmp_path, status)     # rank 0's heartbeat is under nodes/n1/heartbeat/
    status.attempt = 2                          # no heartbeat of this attempt anywhere
    assert not takes_requests(tmp_path, status)
    job.close()
