"""The mt library in a plain `python` process: its own run directory, control, resume, the contract."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mt.contract.checkpoints import reported
from mt.contract.events import EVENT_FIELDS, SCHEMA, schema_errors
from mt.contract.records import Metrics, Rejected, Step, parse_event
from tests.cli.conftest import events, mt, status, wait_for

SCRIPTS = Path(__file__).parent / "scripts"


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """plain_loop.py from its own folder (which holds a user's engine.py and tui/), with no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MT_RUN_DIR", "RANK", "WORLD_SIZE")}
    return subprocess.Popen([sys.executable, str(SCRIPTS / "plain_loop.py"), "--runs-dir", str(tmp_path / "runs"), *args],
                            cwd=SCRIPTS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_dir(tmp_path: Path) -> Path:
    found = wait_for(lambda: [p for p in (tmp_path / "runs").glob("plain_loop-*") if (p / "status.json").exists()],
                     30, "the run directory mt.init makes")
    return found[0]


def test_a_plain_python_script_makes_a_run_that_mt_watches_checkpoints_stops_and_resumes(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        run_dir = _run_dir(tmp_path)
        wait_for(lambda: len(events(run_dir, "step")) >= 5, 30, "steps")
        once = mt("watch", run_dir, "--once")
        assert once.returncode == 0, once.stderr
        assert "[running]" in once.stdout and "plain_loop" in once.stdout

        ckpt = mt("ckpt", run_dir, "--timeout", "30")
        assert ckpt.returncode == 0, ckpt.stdout + ckpt.stderr
        saved = [e for e in events(run_dir, "checkpoint")]
        assert len(saved) == 1 and Path(saved[0]["path"]).parent == run_dir and saved[0]["reason"] == "request"
        assert saved[0]["path"] in ckpt.stdout

        stop = mt("stop", run_dir, "--timeout", "30")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    st = status(run_dir)
    assert st["state"] == "stopped" and st["owner"] == "script"
    end = events(run_dir, "run_end")[-1]
    last = events(run_dir, "checkpoint")[-1]
    assert end["status"] == "stopped" and last["reason"] == "stop" and last["step"] == end["step"]
    assert "engine" not in proc.stderr.read()

    # the step events carry the script's own metric, run.log's val loss is a metrics event
    steps = [parse_event(json.dumps(e)) for e in events(run_dir, "step")]
    assert all(isinstance(s, Step) and s.extra["accuracy"] > 0 for s in steps)
    assert [s.step for s in steps] == list(range(1, end["step"] + 1))
    metrics = [parse_event(json.dumps(e)) for e in events(run_dir, "metrics")]
    assert metrics and all(isinstance(m, Metrics) and m.values["val_loss"] == 2.0 / m.step for m in metrics)

    # mt resume starts the script again under a supervisor; run.resume_from is the stop checkpoint
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["launch"]["script"] == str(SCRIPTS / "plain_loop.py") and "--runs-dir" in cfg["launch"]["script_args"]
    res = mt("resume", run_dir, "--detach")
    assert res.returncode == 0, res.stderr
    wait_for(lambda: len([e for e in events(run_dir, "run_start") if e["attempt"] == 2]) == 1
             and len(events(run_dir, "step")) > end["step"] + 3, 60, "attempt 2 stepping")
    start2 = [e for e in events(run_dir, "run_start") if e["attempt"] == 2][0]
    assert start2["start_step"] == end["step"] and start2["resumed_from"] == {"path": last["path"]}
    assert (run_dir / "logs" / "rank0.log").read_text().startswith("run dir: ")
    kill = mt("kill", run_dir)
    assert kill.returncode == 0, kill.stderr


def test_an_exception_escaping_the_script_ends_the_run_as_failed(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text("import mt\nrun = mt.init(runs_dir='runs')\nrun.step(1, loss=2.0)\nraise ValueError('bad batch 7')\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "ValueError: bad batch 7" in proc.stderr  # the traceback still prints
    run_dir = next((tmp_path / "runs").iterdir())
    assert status(run_dir)["state"] == "failed"
    assert events(run_dir, "run_end")[-1]["reason"] == "rank 0: ValueError: bad batch 7"


HEAVY = ("torch", "numpy", "engine", "tui", "psutil", "textual", "typer", "pynvml")


def test_importing_mt_loads_nothing_heavy() -> None:
    code = f"import sys, mt; mt.init; print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_the_lint_keeps_what_a_script_may_lack_out_of_mt() -> None:
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip("no ruff beside this python")
    repo = Path(__file__).resolve().parents[2]
    for name in HEAVY:  # inside a function too: the import a script would pay on first use
        probe = f"def f():\n    from {name} import x\n    return x\n"
        out = subprocess.run([str(ruff), "check", "--select", "TID251", "--stdin-filename", "mt/_probe.py", "-"],
                             input=probe, cwd=repo, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and f"`{name}` is banned" in out.stdout, (name, out.stdout + out.stderr)


def test_step_metrics_that_are_not_numbers_are_refused_in_the_script_and_by_the_parser(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text("import mt\nrun = mt.init(runs_dir='runs')\nrun.step(1, loss='low')\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "mt: loss must be a number, got str" in proc.stderr
    line = {"v": 1, "t": 1.8e9, "kind": "step", "step": 3, "loss": 1.0, "extra": {"acc": [1]}}
    assert isinstance(parse_event(json.dumps(line)), Rejected)
    assert isinstance(parse_event(json.dumps({**line, "kind": "metrics", "values": "x"})), Rejected)


REFUSED = """
import mt
run = mt.init(runs_dir="runs")
assert mt.init(runs_dir="runs") is run  # the same run, not a second directory
for kw in (dict(step=-1), dict(step=2**70), dict(step=True), dict(step=1, grad_norm=-1.0), dict(step=1, lr=-1e-3),
           dict(step=1, loss="1.5"), dict(step=1, loss=b"1"), dict(step=1, tokens=-5), dict(step=1, tokens=float("inf")),
           dict(step=1, acc="2"), dict(step=1, data_s=-0.5), dict(step=1, data_s="0.1")):
    try:
        run.step(**kw)
        print("accepted", kw)
    except (TypeError, ValueError) as e:
        print(type(e).__name__, e)
for call in (lambda: run.log({"v": 1.0}, step=-2), lambda: run.checkpoint_saved("x.pt", 2**64)):
    try:
        call()
        print("accepted")
    except ValueError as e:
        print(type(e).__name__, e)
run.step(1, loss=float("nan"), lr=0.0, grad_norm=float("nan"), tokens=8)
run.finish()
"""


def test_values_the_parser_would_reject_are_refused_at_the_call_and_init_twice_is_one_run(tmp_path: Path) -> None:
    (tmp_path / "refused.py").write_text(REFUSED)
    proc = subprocess.run([sys.executable, "refused.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "ValueError mt: step -1 is out of range", "ValueError mt: step 1180591620717411303424 is out of range",
        "TypeError mt: step must be a whole number, got bool", "ValueError mt: grad_norm -1 is negative",
        "ValueError mt: lr -0.001 is negative", "TypeError mt: loss must be a number, got str '1.5'",
        "TypeError mt: loss must be a number, got bytes b'1'", "ValueError mt: tokens -5 is negative",
        "ValueError mt: tokens inf is not finite", "TypeError mt: acc must be a number, got str '2'",
        "ValueError mt: data_s -0.5 is negative", "TypeError mt: data_s must be a number, got str '0.1'",
        "ValueError mt: step -2 is out of range", "ValueError mt: step 18446744073709551616 is out of range"]
    [run_dir] = (tmp_path / "runs").iterdir()
    lines = (run_dir / "events.jsonl").read_bytes().splitlines()
    assert [r for r in map(parse_event, lines) if isinstance(r, Rejected)] == []
    # every line has the schema's required fields (as the engine's do: tests/cli/test_doctor_and_preset.py),
    # and the script's run_start only fields of the schema (mt/contract/builders.py builds both)
    assert [schema_errors(json.loads(line)) for line in lines] == [[]] * len(lines)
    start = events(run_dir, "run_start")[0]
    assert list(start)[3:21] == list(EVENT_FIELDS["run_start"]) and set(start) - {"v", "t", "kind"} <= {f.name for f in SCHEMA["run_start"]}
    assert [e["step"] for e in events(run_dir, "step")] == [1] and events(run_dir, "run_end")[0]["step"] == 1
    assert status(run_dir)["state"] == "completed"


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_the_newest_reported_checkpoint_that_still_exists_is_found_reading_backwards(tmp_path: Path, chunk: int) -> None:
    lines = []
    for step in range(1, 40):
        lines.append(json.dumps({"v": 1, "t": 1.8e9, "kind": "step", "step": step, "loss": 1.0}))
        if step % 10 == 0:
            path = tmp_path / f"ck{step}.pt"
            if step != 30:  # the newest one's file was deleted
                path.write_text("x")
            lines.append(json.dumps({"v": 1, "t": 1.8e9, "kind": "checkpoint", "step": step, "path": str(path), "reason": "script"}))
    lines.append('{"kind": "checkpoint", "torn')
    (tmp_path / "events.jsonl").write_text("\n".join(lines))
    assert reported(tmp_path / "events.jsonl", chunk) == tmp_path / "ck20.pt"
    assert reported(tmp_path / "missing.jsonl") is None


def test_mt_kill_ends_a_run_that_mt_init_made_without_a_supervisor(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    try:
        run_dir = _run_dir(tmp_path)
        wait_for(lambda: len(events(run_dir, "step")) >= 2, 30, "steps")
        kill = mt("kill", run_dir, "--grace", "5")
        assert kill.returncode == 0, kill.stdout + kill.stderr
        assert proc.wait(10) is not None
    finally:
        proc.kill()
    assert status(run_dir)["state"] == "killed"
    assert not events(run_dir, "checkpoint")   # killed, not stopped: the script saved nothing on the way out
    again = mt("kill", run_dir)
    assert again.returncode != 0 and "already ended" in again.stderr


def test_sigterm_to_a_script_becomes_a_stop_with_a_final_save(tmp_path: Path) -> None:
    import signal

    proc = _start(tmp_path)
    try:
        run_dir = _run_dir(tmp_path)
        wait_for(lambda: len(events(run_dir, "step")) >= 2, 30, "steps")
        proc.send_signal(signal.SIGTERM)  # the handler only sets a flag: the save happens at the next step
        assert proc.wait(20) == 0
    finally:
        proc.kill()
    end, last = events(run_dir, "run_end")[-1], events(run_dir, "checkpoint")[-1]
    assert end["status"] == "stopped" and end["reason"] == "SIGTERM received"
    assert last["reason"] == "stop" and last["step"] == end["step"] and Path(last["path"]).is_file()


@pytest.mark.parametrize("args, words", [
    (["missing.py"], ["missing.py", "no such script"]),
    (["{preset}", "--", "--lr", "3"], ["are for a script", "mt's engine"]),
    (["{script_preset}"], ["launch.script", "no such file"]),
])
def test_bad_script_launches_are_one_line_exit_2(tmp_path: Path, args: list[str], words: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from tests.cli.conftest import toml_text
    from tui.cli import app

    preset = tmp_path / "p.toml"
    preset.write_text(toml_text({"run": {"name": "x", "runs_dir": str(tmp_path / "runs")}}))
    script_preset = tmp_path / "s.toml"
    script_preset.write_text(toml_text({"run": {"name": "x", "runs_dir": str(tmp_path / "runs")},
                                        "launch": {"script": str(tmp_path / "gone.py")}}))
    argv = [a.format(preset=preset, script_preset=script_preset) for a in args]
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["launch", *argv, "--detach"])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert len(line.splitlines()) == 1 and all(w in line for w in words), line
    assert not (tmp_path / "runs").exists()  # nothing was created


def test_the_batched_step_lines_and_index_rows_equal_the_generic_writers() -> None:
    """StepBatch makes a script's lines and index records without the generic encoder: same bytes."""
    import math

    from mt.contract.eventindex import RECORD, encode
    from mt.contract.events import dumps, make_event
    from mt.stepbatch import StepBatch

    t = 1.8e9 + 0.123456789
    cases = [(7, t, 0.01, 2.5, 1e-3, 0.5, 1024.0, None), (8, t, None, None, None, None, None, None),
             (9, t, 0.02, math.nan, 3e-4, math.inf, 512.0, None), (10, t, 0.0, -math.inf, -1.0, 0.25, 3.0, None),
             (11, t, 0.5, 1.0, 1e-3, -math.nan, -5000.0, None), (12, t, 0.1, 1.0, None, 0.5, 10.0, {"acc": 0.5}),
             (-1, t, 0.1, 1.0, 0.1, 0.5, 10.0, None), (13, 5.0, 0.1, 1.0, 0.1, 0.5, 10.0, {"v": math.nan})]
    batch, seen, expect = StepBatch(), 0.0, []
    for i, (step, at, dt, loss, lr, gn, tokens, extra) in enumerate(cases):
        epoch = (None, 1.25, 2.0)[i % 3]   # a script's own, or a Trainer's fractional one
        batch.note((step, at, dt, loss, lr, gn, tokens, extra, 1, epoch))
        if tokens is not None:
            seen += tokens
        fields = {"t": at, "step": step, "epoch": epoch, "loss": loss, "lr": lr, "grad_norm": gn, "clipped": None,
                  "tokens_per_s": tokens / dt if tokens and dt else None, "step_time_s": dt, "data_wait_s": None,
                  "samples_seen": None, "tokens_seen": int(seen) if tokens is not None else None, "skipped": False,
                  "mem_alloc_bytes": None, "mem_peak_bytes": None, **({"extra": extra} if extra else {})}
        expect.append((dumps(make_event("step", **fields)) + "\n").encode())
    lines, rows, fields_out = batch.drain()
    assert lines == expect and not batch
    fast = 0
    for i, (line, row) in enumerate(zip(lines, rows)):
        generic = encode(parse_event(line), 1000 + i)
        if row is not None:
            fast += 1
            assert RECORD.pack(1000 + i, *row) == generic, cases[i]
        assert json.loads(line)["step"] == cases[i][0]
    assert fast >= 3 and rows[5] is None and rows[6] is None  # extras and odd values go to the parser
    assert [f["step"] for f in fields_out] == [c[0] for c in cases]


BLOCKED = """
import sys, time
from pathlib import Path
import mt
run = mt.init(runs_dir="runs", name="blocked")
for step in (1, 2, 3):
    run.step(step, loss=1.0 / step, lr=1e-3)
print(run.dir, flush=True)
while not Path("go").exists():  # a long step: the training thread does not call mt
    time.sleep(0.05)
for step in (4, 5):
    ctl = run.step(step, loss=0.25, lr=1e-3)
    if ctl.checkpoint:
        time.sleep(2.5)  # a save of several seconds (ten polls): the request stays in control/ until it is answered
        Path(f"ck{step}.pt").write_bytes(b"saved")
        run.checkpoint_saved(f"ck{step}.pt", step)
run.finish()
"""


def test_a_request_is_seen_while_the_loop_is_blocked_and_answered_by_the_next_step(tmp_path: Path) -> None:
    # rank 0's heartbeat thread polls control/ and writes the batched steps: a run.step only notes itself
    (tmp_path / "blocked.py").write_text(BLOCKED)
    env = {k: v for k, v in os.environ.items() if k not in ("MT_RUN_DIR", "RANK", "WORLD_SIZE")}
    proc = subprocess.Popen([sys.executable, "blocked.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        run_dir = Path(proc.stdout.readline().strip())
        wait_for(lambda: len(events(run_dir, "step")) == 3, 10, "the three steps, written while the loop is blocked")
        tmp = run_dir / "control" / ".req.json"
        tmp.write_text(json.dumps({"id": "ck-1", "action": "checkpoint", "t": 1.0}))
        tmp.rename(run_dir / "control" / "ck-1.json")
        accepted = wait_for(lambda: [e for e in events(run_dir, "control") if e["status"] == "accepted"], 10, "the request accepted")
        assert accepted[0]["request_id"] == "ck-1" and accepted[0]["detail"] == "at step 4"
        time.sleep(0.8)  # a long step: several polls see the request file before a step takes it
        assert proc.poll() is None  # still blocked: no step has happened since
        (tmp_path / "go").touch()
        assert proc.wait(20) == 0
    finally:
        proc.kill()
    kinds = [(e["kind"], e.get("step"), e.get("status")) for e in events(run_dir) if e["kind"] in ("step", "control", "checkpoint")]
    assert kinds == [("step", 1, None), ("step", 2, None), ("step", 3, None), ("control", None, "accepted"),
                     ("step", 4, None), ("checkpoint", 4, None), ("control", None, "done"), ("step", 5, None)]
    assert events(run_dir, "checkpoint")[0]["request_id"] == "ck-1" and not list((run_dir / "control").glob("*.json"))


WITH = """
import json, os, signal, sys
import mt
try:
    with mt.init(runs_dir="runs", name="boom") as run:
        run.step(1, loss=2.0)
        raise RuntimeError("bad batch 7\\nsecond line")
except RuntimeError as e:  # re-raised, and the run already ended before anyone caught it
    print("re-raised", repr(e), json.loads((run.dir / "status.json").read_text())["state"])
with mt.init(runs_dir="runs", name="stop") as stopped:
    assert stopped is not run
    os.kill(os.getpid(), signal.SIGTERM)
    print("stop", stopped.step(1, loss=1.0).stop)
with mt.init(runs_dir="runs", name="done") as done:
    done.step(1, loss=1.0)
    sys.exit(0)  # a clean exit is not a failure
"""


def test_with_mt_init_ends_the_run_completed_stopped_or_failed_with_the_exception_re_raised(tmp_path: Path) -> None:
    (tmp_path / "with.py").write_text(WITH)
    proc = subprocess.run([sys.executable, "with.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["re-raised RuntimeError('bad batch 7\\nsecond line') failed", "stop True"]
    ends = {}
    for run_dir in (tmp_path / "runs").iterdir():
        [end] = events(run_dir, "run_end")
        st = status(run_dir)
        assert (st["state"], st["reason"]) == (end["status"], end["reason"]), run_dir
        ends[run_dir.name.split("-")[0]] = (end["status"], end["reason"])
    assert ends == {"boom": ("failed", "rank 0: RuntimeError: bad batch 7"), "stop": ("stopped", "SIGTERM received"),
                    "done": ("completed", "the script finished")}


SPLIT = """
import os, signal
import mt
run = mt.init(runs_dir="runs", name="split")
assert isinstance(run, mt.Run)
try:
    mt.Run()
except TypeError as e:
    print(e)
for step in range(1, 7):
    if step == 5:
        os.kill(os.getpid(), signal.SIGTERM)
    ctl = run.sync(step)  # every step: heartbeat, control, agreement; the numbers come apart, as a framework logs them
    print(step, ctl.checkpoint, ctl.stop)
    if step % 2 == 0:
        run.record(step, loss=1.0 / step, lr=1e-3, grad_norm=0.5, tokens=64, acc=step / 10)
for bad in (dict(lr=-1.0), dict(loss="x"), dict(step=-1)):
    try:
        run.record(**{"step": 7, **bad})
    except (TypeError, ValueError) as e:
        print(type(e).__name__, e)
run.finish()
"""


def test_the_public_halves_of_a_step_sync_every_step_and_record_the_numbers_apart(tmp_path: Path) -> None:
    # what the HF adapter (mt/integrations/hf.py) uses: run.sync in on_step_end, run.record in on_log
    (tmp_path / "split.py").write_text(SPLIT)
    env = {k: v for k, v in os.environ.items() if k not in ("MT_RUN_DIR", "RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "split.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "mt: a Run is made by mt.init(...), not by calling mt.Run",
        "1 False False", "2 False False", "3 False False", "4 False False", "5 False True", "6 False True",
        "ValueError mt: lr -1 is negative", "TypeError mt: loss must be a number, got str 'x'", "ValueError mt: step -1 is out of range"]
    [run_dir] = (tmp_path / "runs").iterdir()
    steps = [parse_event(json.dumps(e)) for e in events(run_dir, "step")]
    assert [(s.step, s.loss, s.lr, s.grad_norm, s.extra) for s in steps] == [
        (2, 0.5, 1e-3, 0.5, {"acc": 0.2}), (4, 0.25, 1e-3, 0.5, {"acc": 0.4}), (6, 1 / 6, 1e-3, 0.5, {"acc": 0.6})]
    assert [e["tokens_seen"] for e in events(run_dir, "step")] == [64, 128, 192]
    assert events(run_dir, "run_start")[0]["start_step"] == 0
    end = events(run_dir, "run_end")[-1]
    assert (end["status"], end["step"], end["reason"]) == ("stopped", 6, "SIGTERM received")


FACTS = """
import time
import mt
for bad in (dict(precision=""), dict(effective_batch=0), dict(effective_batch=2.5), dict(grad_clip=-1.0), dict(device=3),
            dict(params_total=10, params_trainable=11), dict(params_trainable="5")):
    try:
        mt.init(**bad)
    except (TypeError, ValueError) as e:
        print(type(e).__name__, e)
run = mt.init(config={"lr": 0.1}, precision="bf16", tokens_per_step=512)
again = mt.init(config={"lr": 0.2, "layers": 2}, effective_batch=16, grad_clip=1.0, device="cpu",  # an adapter's words, before the first step
                params_total=1000, params_trainable=24)
print(again is run)
for step in range(1, 4):
    time.sleep(0.05)
    run.step(step, loss=1.0 / step, epoch=step / 2)
for bad in (-1.0, float("nan"), "1"):
    try:
        run.step(4, epoch=bad)
    except (TypeError, ValueError) as e:
        print(type(e).__name__, e)
mt.init(precision="fp16")  # after run_start: nothing changes
run.finish()
"""


def test_mt_init_says_the_runs_precision_device_batch_tokens_and_clip(tmp_path: Path) -> None:
    (tmp_path / "facts.py").write_text(FACTS)
    env = {k: v for k, v in os.environ.items() if k not in ("MT_RUN_DIR", "RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "facts.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "TypeError mt: precision must be non-empty text, got str ''", "ValueError mt: effective_batch must be > 0, got 0",
        "TypeError mt: effective_batch must be a whole number, got float", "ValueError mt: grad_clip -1 is negative",
        "TypeError mt: device must be non-empty text, got int 3", "ValueError mt: params_trainable 11 is more than params_total 10",
        "TypeError mt: params_trainable must be a whole number, got str", "True", "ValueError mt: epoch -1 is negative",
        "ValueError mt: epoch nan is not finite", "TypeError mt: epoch must be a number, got str '1'"]
    [run_dir] = (tmp_path / "runs").iterdir()
    start = events(run_dir, "run_start")[0]
    assert (start["precision"], start["device"], start["effective_batch"], start["tokens_per_step"], start["grad_clip"]) == \
        ("bf16", "cpu", 16, 512, 1.0)
    assert (start["params_total"], start["params_trainable"]) == (1000, 24)
    assert start["config"] == {"lr": 0.2, "layers": 2} and schema_errors(start) == []
    steps = events(run_dir, "step")
    assert [s["tokens_seen"] for s in steps] == [512, 1024, 1536]   # tokens_per_step counts a step given none
    assert [s["epoch"] for s in steps] == [0.5, 1.0, 1.5]   # the script's own, as it said it
    assert all(abs(s["tokens_per_s"] * s["step_time_s"] - 512) < 1e-6 for s in steps[1:]), steps
    config = json.loads((run_dir / "config.json").read_text())
    assert set(config) == {"run", "launch", "monitor", "slurm"}, config   # the engine's tables are not this run's
