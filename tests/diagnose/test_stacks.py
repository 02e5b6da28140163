"""Stack dumps from real processes: the installer, both parsers on the same process, a rank without a handler."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tui.stacks import capture as capture_mod
from tui.stacks.verdict import Frame, RankStack, ThreadStack, parse_faulthandler, parse_py_spy, verdict

# a main thread in park() -> wait_here(), a second thread in side(); ready once it printed its pid
TARGET = textwrap.dedent('''
    import os, signal, sys, threading, time
    {install}
    def side():
        while True:
            time.sleep(0.05)
    def wait_here():
        while True:
            time.sleep(0.05)
    def park():
        wait_here()
    threading.Thread(target=side, daemon=True).start()
    print("ready", flush=True)
    park()
''')


def _start(tmp_path: Path, install: str, env: dict[str, str] | None = None, argv: tuple[str, ...] = ()) -> subprocess.Popen:
    script = tmp_path / "target.py"
    script.write_text(TARGET.format(install=install))
    proc = subprocess.Popen([sys.executable, str(script), *argv], stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "err.log", "wb"), text=True, env={**os.environ, **(env or {})})
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _dump(tmp_path: Path, proc: subprocess.Popen) -> str:
    """One dump taken once the main thread is in park() (a signal during print("ready") shows <module>)."""
    for _ in range(50):
        before = (tmp_path / "err.log").stat().st_size
        proc.send_signal(signal.SIGUSR2)
        time.sleep(0.2)
        text = (tmp_path / "err.log").read_bytes()[before:].decode()
        if "in park" in text:
            return text
    raise AssertionError("no dump")


def test_the_installed_dump_parses_to_the_main_thread_and_leaves_the_process_running(tmp_path):
    proc = _start(tmp_path, "from mt.stacks import install_stack_dump; assert install_stack_dump()")
    try:
        threads = parse_faulthandler("a line the rank printed\n" + _dump(tmp_path, proc) + "after it\n")
        assert len(threads) == 2 and proc.poll() is None and capture_mod.catches_dump_signal(proc.pid)
        main = next(t for t in threads if t.main)
        assert [f.func for f in main.frames] == ["wait_here", "park", "<module>"]
        assert main.frames[0].file.endswith("target.py") and main.frames[0].line == 9
        side = next(t for t in threads if not t.main)
        assert side.frames[0].func == "side" and side.frames[-1].func == "_bootstrap"
        one = verdict([RankStack(0, proc.pid, "faulthandler", tuple(threads))])
        assert one.line == "rank 0 is in `wait_here` (target.py:9)"
    finally:
        proc.kill()


def test_a_handler_the_script_installed_is_kept(tmp_path):
    install = ("signal.signal(signal.SIGUSR2, lambda *a: print('mine', file=sys.stderr, flush=True))\n"
               "from mt.stacks import install_stack_dump; assert not install_stack_dump()")
    proc = _start(tmp_path, install)
    try:
        proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while "mine" not in (tmp_path / "err.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (tmp_path / "err.log").read_text().strip() == "mine" and proc.poll() is None
    finally:
        proc.kill()


@pytest.mark.skipif(capture_mod.py_spy() is None, reason="py-spy is not installed (the stacks extra)")
def test_py_spy_and_faulthandler_give_the_same_main_thread(tmp_path):
    proc = _start(tmp_path, "from mt.stacks import install_stack_dump; install_stack_dump()")
    try:
        fh = next(t for t in parse_faulthandler(_dump(tmp_path, proc)) if t.main)
        text, failed = capture_mod._spy(capture_mod.py_spy(), proc.pid)
        assert not failed, failed
        spy = next(t for t in parse_py_spy(text) if t.main)
        assert spy.name == "MainThread" and len(parse_py_spy(text)) == 2
        assert [(f.file, f.line, f.func) for f in spy.frames] == [(f.file, f.line, f.func) for f in fh.frames]
    finally:
        proc.kill()


def _fake_run(tmp_path: Path) -> Path:
    """A run directory and a launcher naming it whose one child is rank 0: a script that calls nothing from mt."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    return run


def _end(launcher: subprocess.Popen, run: Path) -> None:
    """Kill the launcher and its rank: the rank first found through the launcher, which must still live."""
    ranks = capture_mod.find_ranks(run)
    launcher.kill()
    launcher.wait()
    for p in ranks.values():
        p.kill()


def test_a_rank_without_a_handler_is_never_signalled_and_py_spy_reads_it(tmp_path, monkeypatch):
    run = _fake_run(tmp_path)
    launcher = subprocess.Popen([sys.executable, "-c", "import os, subprocess, sys; subprocess.run(sys.argv[1:], "
                                 "env={**os.environ, 'RANK': '0'})", sys.executable, "-c", TARGET.format(install=""),
                                 "--run-dir", str(run)], stdout=subprocess.DEVNULL,
                                env={k: v for k, v in os.environ.items() if k != "RANK"})
    try:
        deadline = time.monotonic() + 20
        while not (ranks := capture_mod.find_ranks(run)) and time.monotonic() < deadline:
            time.sleep(0.1)
        rank0 = ranks[0]
        time.sleep(0.5)  # the target is past its imports
        monkeypatch.setattr(capture_mod, "py_spy", lambda: None)
        cap = capture_mod.capture(run, wait_s=0.5)
        assert cap.stacks[0].source == "none" and "no SIGUSR2 handler" in cap.stacks[0].note
        assert capture_mod.PY_SPY_HINT in cap.stacks[0].note and cap.verdict.missing == (0,)
        assert rank0.is_running() and rank0.status() != "zombie"  # SIGUSR2 would have ended it
        monkeypatch.undo()
        if capture_mod.py_spy() is not None:
            cap = capture_mod.capture(run, wait_s=0.5)
            assert cap.stacks[0].source == "py-spy" and cap.verdict.line.startswith("rank 0 is in `wait_here` (")
            assert "in park" not in (cap.folder / "rank0.txt").read_text()  # py-spy's own format, kept raw
            assert "park (" in (cap.folder / "rank0.txt").read_text()
    finally:
        _end(launcher, run)


def test_the_smallest_group_comes_first_and_a_tie_puts_the_running_rank_before_the_waiting_one():
    user, coll = Frame("/u/train.py", 40, "<module>"), Frame("/u/train.py", 45, "<module>")
    lib = Frame(f"{sys.prefix}/lib/python3/site-packages/torch/distributed/c10d.py", 9, "all_reduce")
    stack = lambda rank, frames: RankStack(rank, rank, "py-spy", (ThreadStack("1", tuple(frames), True),))
    two = verdict([stack(0, [lib, coll]), stack(1, [user])])
    assert two.line == "rank 1 is in `<module>` (train.py:40); rank 0 waits in `all_reduce` (train.py:45)"
    assert verdict([stack(r, [lib, coll]) for r in range(4)]).line == "all 4 ranks wait in `all_reduce` (train.py:45)"


def test_installing_never_fails_the_run(monkeypatch):
    import faulthandler

    from mt.stacks import install_stack_dump

    monkeypatch.setattr(sys, "stderr", None)  # pythonw, a closed stderr: no file to dump into
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL and install_stack_dump() is False
    assert not faulthandler.unregister(signal.SIGUSR2)  # nothing was left registered


def test_a_rank_that_never_stops_printing_still_gives_its_dump(tmp_path):
    run = _fake_run(tmp_path)
    chatty = TARGET.format(install=(
        "from pathlib import Path\nfrom mt.contract.ranklog import redirect_output\n"
        f"redirect_output(Path({str(run / 'logs' / 'rank0.log')!r}))\n"
        "from mt.stacks import install_stack_dump; install_stack_dump()\n"
        "def chat():\n    while True:\n        print('a line', file=sys.stderr, flush=True); time.sleep(0.002)\n"
        "threading.Thread(target=chat, daemon=True).start()"))
    launcher = subprocess.Popen([sys.executable, "-c", "import os, subprocess, sys; subprocess.run(sys.argv[1:], "
                                 "env={**os.environ, 'RANK': '0'})", sys.executable, "-c", chatty,
                                 "--run-dir", str(run)], stdout=subprocess.DEVNULL,
                                env={k: v for k, v in os.environ.items() if k != "RANK"})
    try:
        deadline = time.monotonic() + 20
        while not capture_mod.find_ranks(run) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # the target is in park()
        cap = capture_mod.capture(run, wait_s=0.5)
        assert cap.stacks[0].source == "faulthandler", cap.stacks[0]
        assert cap.verdict.line.startswith("rank 0 is in `wait_here` (")
    finally:
        _end(launcher, run)
