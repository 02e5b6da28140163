"""Pilot tests of the dashboard on recorded and synthetic run directories (no live run)."""
from __future__ import annotations

import json

import pytest
from textual.widgets import OptionList

from mt.contract.jsonl import read_events
from tests.tui.conftest import fixed_now
from tests.tui.synth import SynthRun, write_status
from tui.format.fmt import fmt_duration, fmt_num
from tui.read.follower import load_run_state
from tui.view.app import MtApp
from tui.widgets.dialogs import ConfirmScreen, HelpScreen

pytestmark = pytest.mark.timeout(120)


def text_of(app: MtApp, selector: str) -> str:
    return str(app.query_one(selector).content)


def log_text(app: MtApp) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in app.query_one("#logs").lines)


def in_log(app: MtApp, line: str) -> bool:
    """`line` is in the logs panel, wherever the panel wrapped it."""
    return "".join(line.split()) in "".join(log_text(app).split())


async def wait_for(pilot, cond, timeout: float = 10.0) -> None:
    """Let the app run until cond() is true (the worker polls every 50 ms in tests)."""
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError("condition not met in time")


def make_app(run_dir, now: float | None = None) -> MtApp:
    clock = (lambda: now) if now is not None else None
    return MtApp(run_dir, clock=clock, poll_s=0.05, redraw_s=0.05) if clock else \
        MtApp(run_dir, poll_s=0.05, redraw_s=0.05)


def running_run(tmp_path) -> SynthRun:
    """A live-looking run: one step written, status running."""
    r = SynthRun(tmp_path)
    r.run_start()
    r.step(1)
    r.flush()
    r.status("running")
    return r


async def loaded(pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.loaded)
    await pilot.pause(0.2)  # one redraw after the first update


async def test_header_and_panels_show_recorded_numbers(fixture_run):
    run = fixture_run("cpu_only")
    now = fixed_now(run)
    st = load_run_state(run)
    app = make_app(run, now)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        header = text_of(app, "#header")
        assert f"step {st.step:,}/{st.max_steps:,}" in header
        assert f"loss {fmt_num(st.loss)}" in header and f"best {fmt_num(st.best_loss)}" in header
        assert f"val {fmt_num(st.val_loss)}" in header
        assert st.state.upper() in header and f"{st.world_size} × {st.device}" in header
        ck = st.last_checkpoint
        assert f"ckpt @{ck.step} ({fmt_duration(now - ck.t)} ago)" in header
        # system panel: the newest system.jsonl sample
        last = read_events(run / "system.jsonl")[-1]
        system = text_of(app, "#system")
        assert f"{last['host']['mem_total_bytes'] / 2**30:.1f} GiB" in system
        assert "GPUs: none" in system
        # logs panel: the tail of rank0.log
        want = (run / "logs" / "rank0.log").read_text().strip().splitlines()[-1]
        await wait_for(pilot, lambda: in_log(app, want))
        # plots hold the whole history
        n_steps = sum(1 for e in read_events(run / "events.jsonl") if e["kind"] == "step")
        assert len(app.watcher.follower.series.loss) == n_steps


async def test_gpu_panel_numbers(fixture_run):
    run = fixture_run("finished")
    app = make_app(run, fixed_now(run))
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        last = read_events(run / "system.jsonl")[-1]
        system = text_of(app, "#system")
        for g in last["gpus"]:
            assert f"GPU{g['index']}" in system
            assert f"{g['mem_used_bytes'] / 2**30:.1f}/{g['mem_total_bytes'] / 2**30:.1f} GiB" in system
            assert f"util {g['util_pct']:>3.0f}%" in system
            if g["power_w"] is None:
                assert "N/A" in system


async def test_failed_run_shows_reason_incidents_and_failing_rank_log(fixture_run):
    run = fixture_run("incidents")
    st = load_run_state(run)
    assert st.state == "failed" and st.incidents
    app = make_app(run, fixed_now(run))
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        notice = text_of(app, "#notice")
        assert f"Run failed: {st.reason[:80]}" in notice
        crash = next(i for i in st.incidents if i.code == "crash")
        assert f"first failure: {st.first_failure() if st.exit_incident() else crash.title}" in notice
        rank = app.watcher.log_rank
        assert f"rank{rank}.log" in app.query_one("#logs").border_title
        crash_line = next(line for line in (run / "logs" / f"rank{rank}.log").read_text().splitlines()
                          if "injected crash" in line)
        await wait_for(pilot, lambda: in_log(app, crash_line))
        # incidents: list holds every incident; the highlighted one's detail is shown
        ol = app.query_one("#incident-list", OptionList)
        assert ol.option_count == len(st.incidents)
        await pilot.press("3")
        assert app.focused is ol
        shown = app.query_one("#incidents")._shown
        for i in range(len(shown)):
            ol.highlighted = i
            await pilot.pause(0.05)
            detail = text_of(app, "#incident-detail")
            assert shown[i].code in detail and (shown[i].advice[:30] in detail)


async def test_keys_that_make_no_sense_say_why(fixture_run):
    run = fixture_run("cpu_only")
    app = make_app(run, fixed_now(run))
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        for key, word in (("c", "checkpoint"), ("s", "stop"), ("k", "kill"), ("r", "resumed")):
            await pilot.press(key)
            sev, text = app.dashboard.said[-1]
            assert sev == "warning" and "completed" in text and word in text
        assert not isinstance(app.screen, ConfirmScreen)


async def test_smoothing_logy_focus_help_keys(fixture_run):
    run = fixture_run("cpu_only")
    app = make_app(run, fixed_now(run))
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        assert app.dashboard.smoothing == 0.6
        await pilot.press("e", "e")
        assert app.dashboard.smoothing == pytest.approx(0.4)
        app.dashboard.smoothing = 0.9
        await pilot.press("E", "E")           # clamped below 1 (1 would freeze the curve)
        assert app.dashboard.smoothing == 0.99
        app.dashboard.smoothing = 0.1
        await pilot.press("e", "e")           # clamped at 0 = the raw series
        assert app.dashboard.smoothing == 0.0
        await pilot.pause(0.1)
        assert "smoothing 0.00" in text_of(app, "#header")
        await pilot.press("l")
        assert app.dashboard.logy is True
        await pilot.pause(0.1)
        assert "log-y on" in text_of(app, "#header")
        for n, sel in ((1, "#plot-loss"), (2, "#system"), (3, "#incident-list"), (4, "#logs")):
            await pilot.press(str(n))
            assert app.focused is app.query_one(sel)
        await pilot.press("g")
        assert app.watcher.log_rank == 1
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        help_text = str(app.screen.query_one("#help-text").content)
        for b in app.dashboard.BINDINGS:  # the help is generated from the bindings: every one is there
            assert f"{b.key_display or b.key}  {b.tooltip or b.description}" in help_text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_t_swaps_the_learning_rate_plot_for_tokens_per_s_and_back(fixture_run):
    run = fixture_run("cpu_only")
    steps = [e for e in read_events(run / "events.jsonl") if e["kind"] == "step"]
    app = make_app(run, fixed_now(run))
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        lr, tps = app.query_one("#plot-lr"), app.query_one("#plot-tps")
        assert lr.display and not tps.display
        await pilot.press("t")
        await wait_for(pilot, app.settled)
        assert tps.display and not lr.display and tps.drawn_current()
        x, y = app.watcher.follower.series.tokens_per_s.arrays()
        assert y.tolist() == [s["tokens_per_s"] for s in steps] and x.tolist() == [s["step"] for s in steps]
        from tests.tui.test_plots import figure, value, y_labels
        lines = figure(app, "#plot-tps")
        assert "tokens/s" in lines[0]
        ticks = [value(v) for v in y_labels(lines)]    # round values over the throughput's range
        assert len(ticks) >= 2 and min(y) <= min(ticks) and max(ticks) <= max(y)
        assert max(ticks) >= max(y) - (ticks[0] - ticks[1])
        await pilot.press("t")
        assert lr.display and not tps.display


async def test_kill_asks_and_no_cancels(tmp_path):
    running_run(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await pilot.press("k")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert not isinstance(app.screen, ConfirmScreen)
        assert not any("killing" in t for _, t in app.dashboard.said)


async def test_follows_appended_events_live_and_counts_garbage(tmp_path):
    r = SynthRun(tmp_path, max_steps=50)
    r.status("starting")
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        assert "waiting for" in text_of(app, "#notice")
        r.run_start()
        r.flush()
        r.status("running")
        with open(r.paths.events, "a") as f:
            for s in range(1, 21):
                r.step(s)
                f.write(r.lines[-1] + "\n")
            f.write("garbage{\n")
            r.step(21)
            f.write(r.lines[-1][:15])        # half-written line
        await wait_for(pilot, lambda: "step 20/50" in text_of(app, "#header"))
        assert "1 bad lines skipped" in text_of(app, "#header")
        with open(r.paths.events, "a") as f:
            f.write(r.lines[-1][15:] + "\n")
        await wait_for(pilot, lambda: "step 21/50" in text_of(app, "#header"))
        assert len(app.watcher.follower.series.loss) == 21
        assert not app.query_one("#notice").display


async def test_run_whose_supervisor_is_gone_is_shown_lost(tmp_path):
    r = running_run(tmp_path)
    st = json.loads(r.paths.status.read_text())
    st["supervisor_pid"] = 2**22 + 12345           # above pid_max: never a live process
    write_status(r.paths, st)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await wait_for(pilot, lambda: "LOST" in text_of(app, "#header"))
        assert "supervisor" in text_of(app, "#notice") and "is gone" in text_of(app, "#notice")


def screen_text(app: MtApp, selector: str) -> str:
    """What the screen shows inside a widget's region, one line per row."""
    r = app.query_one(selector).region
    rows = ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]
    return "\n".join(row[r.x:r.right] for row in rows[r.y:r.bottom])


async def test_narrow_terminal_wraps_log_lines_and_lists_evidence(tmp_path):
    r = SynthRun(tmp_path, max_steps=20)
    r.run_start()
    for s in range(1, 21):
        r.step(s)
    advice = ("Read the last frames of the traceback in the failing rank's log, fix the cause, then resume "
              "from the newest checkpoint with r; the run keeps its history. Last words here.")
    r.event("incident", step=20, code="crash", severity="error", title="Worker crashed: rank 1",
            detail="rank 1 raised RuntimeError: injected crash at step 20 on rank 1", advice=advice,
            evidence={"rank": 1, "exit_code": 1, "signal": None, "samples": [948, 1188]})
    r.event("run_end", step=20, status="completed", reason="max_steps reached")
    r.flush()
    r.status("completed", exit_code=0, ended=r.t)
    long_line = ("12:00:05 checkpoint (interval) step 20: /scratch/users/somebody/runs/a-long-run-name"
                 "/checkpoints/step-20 tail-end")
    r.paths.logs.mkdir(parents=True, exist_ok=True)
    r.paths.rank_log(0).write_text("12:00:00 run_start attempt 1: 800000 params, world 2\n" + long_line + "\n")
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 30)) as pilot:
        await loaded(pilot)
        await pilot.press("4")           # 80 columns: the panels are tabs; the logs, 76 wide
        await wait_for(pilot, lambda: in_log(app, long_line) and app.settled())
        await pilot.pause(0.1)
        logs = app.query_one("#logs")
        assert len(long_line) > logs.scrollable_content_region.width   # it does not fit on one line
        assert all(strip.cell_length <= logs.scrollable_content_region.width for strip in logs.lines)
        assert "tail-end" in screen_text(app, "#logs")                  # its tail is on the screen
        # a wider terminal wraps the lines again, to the new width
        await pilot.resize_terminal(140, 44)
        await pilot.pause(0.3)
        assert all(strip.cell_length <= logs.scrollable_content_region.width for strip in logs.lines)
        assert "tail-end" in screen_text(app, "#logs") and in_log(app, long_line)
        await pilot.resize_terminal(80, 30)
        await pilot.press("3")
        await pilot.pause(0.3)
        detail = text_of(app, "#incident-detail")
        lines = [line.strip() for line in detail.splitlines()]
        assert {"rank: 1", "exit_code: 1", "signal: N/A", "samples: 948, 1188"} <= set(lines)
        assert '{"rank"' not in detail
        # the detail wraps to the panel and scrolls: every word of it can be brought on screen
        box = app.query_one("#incident-detail-box")
        seen = ""
        for y in range(0, box.max_scroll_y + box.size.height, max(1, box.size.height)):
            box.scroll_to(y=y, animate=False)
            await pilot.pause(0.05)
            seen += screen_text(app, "#incident-detail-box") + "\n"
        words = " ".join(seen.split())
        assert "Last words here." in words and "rank: 1" in words and "exit_code: 1" in words


def test_fixture_incidents_file_matches_schema():
    from tests.tui.conftest import FIXTURES
    for line in (FIXTURES / "incidents" / "incidents.jsonl").read_text().splitlines():
        rec = json.loads(line)
        assert {"code", "severity", "status", "source", "title"} <= rec.keys()


async def test_answers_to_our_requests_are_notified_in_any_order(tmp_path):
    r = running_run(tmp_path)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        app.dashboard.requests.pending.update({"ck-1": "checkpoint", "ck-2": "checkpoint", "st-1": "stop"})
        with open(r.paths.events, "a") as f:
            for kind, fields in (
                ("control", dict(request_id="ck-1", action="checkpoint", status="done", detail="")),
                ("checkpoint", dict(step=7, path="c/7", bytes=1, seconds=0.1, reason="request", request_id="ck-1")),
                ("checkpoint", dict(step=8, path="c/8", bytes=1, seconds=0.1, reason="request", request_id="ck-2")),
                ("control", dict(request_id="ck-2", action="checkpoint", status="done", detail="")),
                ("control", dict(request_id="st-1", action="stop", status="rejected",
                                 detail="already stopping [/x]\x1b]0;T\x07")),   # no escape obeyed
                ("checkpoint", dict(step=9, path="c/9", bytes=1, seconds=0.1, reason="interval", request_id=None)),
            ):
                r.event(kind, **fields)
                f.write(r.lines[-1] + "\n")
        await wait_for(pilot, lambda: not app.dashboard.requests.pending)
        texts = [t for _, t in app.dashboard.said]
        assert "checkpoint saved at step 7" in texts and "checkpoint saved at step 8" in texts
        assert "stop rejected: already stopping [/x]\\x1b]0;T\\x07" in texts
        assert "checkpoint saved at step 9" not in texts     # not ours: no notification


async def test_big_run_shows_the_newest_state_first_then_the_whole_history(tmp_path, monkeypatch):
    from tests.tui.synth import finished_run
    from tui.read import bulk as scan
    from tui.read import follower

    finished_run(tmp_path, steps=400)
    ref = load_run_state(tmp_path)
    monkeypatch.setattr(follower, "BULK_MIN_BYTES", 1000)
    monkeypatch.setattr(scan, "QUICK_TAIL_BYTES", 4096)
    quick_points: list[int] = []
    real_quick = scan.quick_read

    def spy(*a, **kw):
        res = real_quick(*a, **kw)
        quick_points.append(len(res.series.loss))
        return res

    monkeypatch.setattr(scan, "quick_read", spy)
    before = sorted(p.name for p in tmp_path.iterdir())
    app = make_app(tmp_path, ref.ended)
    async with app.run_test(size=(140, 44)) as pilot:
        await wait_for(pilot, app.settled, 20)
        assert 0 < quick_points[0] < 400                        # the tail came first
        assert len(app.watcher.follower.series.loss) == 400     # then everything
        assert f"best {fmt_num(ref.best_loss)}" in text_of(app, "#header")
        assert sorted(p.name for p in tmp_path.iterdir()) == before   # the viewer wrote nothing


async def test_big_run_with_the_engine_index_opens_with_its_whole_history(tmp_path, monkeypatch):
    from mt.contract.eventindex import open_index
    from tests.tui.synth import finished_run
    from tui.read import bulk as scan
    from tui.read import follower, index_tail

    finished_run(tmp_path, steps=400)
    open_index(tmp_path / "events.jsonl").close()
    ref = load_run_state(tmp_path)
    monkeypatch.setattr(follower, "BULK_MIN_BYTES", 1000)
    monkeypatch.setattr(index_tail, "TAIL_RECORDS", 50)
    monkeypatch.setattr(scan, "quick_read", lambda *a, **kw: pytest.fail("the index has the newest state"))
    quick_steps: list[int] = []
    real_quick = index_tail.quick_read_index

    def spy(*a, **kw):
        res = real_quick(*a, **kw)
        quick_steps.append(res.state.step)
        return res

    monkeypatch.setattr(index_tail, "quick_read_index", spy)
    app = make_app(tmp_path, ref.ended)
    async with app.run_test(size=(140, 44)) as pilot:
        await wait_for(pilot, app.settled, 20)
        assert quick_steps == [400]                             # the newest state came first, from the index
        assert len(app.watcher.follower.series.loss) == 400     # then the whole history
        assert f"best {fmt_num(ref.best_loss)}" in text_of(app, "#header")


async def test_a_failure_shows_the_first_failing_ranks_log_and_offers_resume_only_with_a_checkpoint(tmp_path):
    peer = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"
    crash = "RuntimeError: injected crash on rank 1 at step 6"
    r = SynthRun(tmp_path, max_steps=50)
    r.run_start()
    for s in range(1, 6):
        r.step(s)
    r.event("run_end", step=5, status="failed", reason=f"rank 0: {peer}")  # rank 0 only lost its peer
    r.flush()
    r.paths.logs.mkdir(parents=True, exist_ok=True)
    r.paths.rank_log(0).write_text(f"Traceback (most recent call last):\n{peer}\n")
    r.paths.rank_log(1).write_text(f"Traceback (most recent call last):\n{crash}\n")
    r.status("failed", reason=f"rank 0: {peer}", exit_code=1, ended=r.t)
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await loaded(pilot)
        await wait_for(pilot, lambda: "Run failed" in text_of(app, "#notice"))
        # the supervisor's verdict on who failed first comes after the state, as it does live
        with open(r.paths.incidents, "a") as f:
            f.write(json.dumps(dict(v=1, t=r.t + 1, status="open", source="supervisor", code="crash", severity="error",
                                    step=6, title="Worker crashed: rank 1 at step 6", detail="", advice="",
                                    evidence={"rank": 1, "line": crash})) + "\n")
        await wait_for(pilot, lambda: "last lines of rank1.log" in text_of(app, "#notice")
                       and crash in text_of(app, "#notice"))
        notice = text_of(app, "#notice")
        assert "Connection closed" not in notice.split("last lines of")[1], notice
        assert "no checkpoint to resume from" in notice and "press r" not in notice
        with open(r.paths.events, "a") as f:  # a checkpoint it can resume from
            f.write(json.dumps(dict(v=1, t=r.t + 2, kind="checkpoint", step=5, path="checkpoints/step-5", bytes=1,
                                    seconds=0.1, reason="interval", request_id=None)) + "\n")
        await wait_for(pilot, lambda: "press r to resume from the newest checkpoint" in text_of(app, "#notice"))
