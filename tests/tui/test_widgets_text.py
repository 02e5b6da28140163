"""Panel texts rendered from data, without a terminal."""
from __future__ import annotations

from tui.read.watcher import SystemView
from tui.widgets.system import not_live_note, render_system, sparkline


def sample(n_gpus: int, unreadable: bool = False) -> dict:
    g = lambda i: {"index": i, "name": "GPU", "util_pct": None if unreadable else 10 * i,
                   "mem_used_bytes": None if unreadable else (i + 1) * 2**30, "mem_total_bytes": 80 * 2**30,
                   "temp_c": None, "power_w": None if unreadable else 300.0}
    return {"v": 1, "t": 0.0, "nvml": True, "nvml_error": None, "gpus": [g(i) for i in range(n_gpus)],
            "ranks": [{"rank": 0, "pid": 1, "cpu_pct": None, "rss_bytes": None, "alive": True}],
            "host": {"cpu_pct": None, "mem_used_bytes": None, "mem_total_bytes": None, "load1": None}}


def test_eight_gpus_one_line_each_with_numbers_from_the_sample():
    view = SystemView()
    rec = sample(8)
    view.add(rec)
    lines = render_system(view).plain.splitlines()
    gpu_lines = [l for l in lines if l.startswith("GPU")]
    assert len(gpu_lines) == 8
    for g, line in zip(rec["gpus"], gpu_lines):
        assert f"{g['util_pct']:>3.0f}%" in line
        assert f"{g['mem_used_bytes'] / 2**30:.1f}/80.0G" in line and "N/A" in line  # temp unreadable


def test_unreadable_fields_show_na_never_raise():
    view = SystemView()
    view.add(sample(1, unreadable=True))
    text = render_system(view).plain
    assert "util N/A" in text and "N/A/80.0 GiB" in text and "cpu N/A" in text and "host cpu N/A" in text


def test_a_finished_run_shows_its_last_readings_as_not_live():
    view = SystemView()
    rec = sample(0)
    rec["t"] = 1000.0
    rec["ranks"][0].update(cpu_pct=97.0, rss_bytes=2**30)
    view.add(rec)
    live = render_system(view).plain
    assert "last seen" not in live and not_live_note(view, None, 1090.0) == ""
    assert not_live_note(view, "completed", 1090.0) == "not live (run completed): last sample 1m30s ago"
    text = render_system(view, ended="completed").plain
    rank = next(l for l in text.splitlines() if l.startswith("rank0"))
    assert "97%" in rank and rank.endswith("last seen")


def test_no_gpus_says_why_and_sparkline_blanks_unknowns():
    view = SystemView()
    rec = sample(0)
    rec.update(nvml=False, nvml_error="NVML Shared Library Not Found")
    view.add(rec)
    assert "GPUs: none (NVML Shared Library Not Found)" in render_system(view).plain
    assert sparkline([0, None, 100, "x"]) == "▁ █ "


def test_notice_for_every_state(tmp_path):
    from mt.contract.status import Status
    from tui.state.runstate import CheckpointInfo, RunState
    from tui.widgets.notice import notice_text

    def st(state: str, **kw) -> RunState:
        s = RunState(run_dir=tmp_path, state=state)
        for k, v in kw.items():
            setattr(s, k, v)
        return s

    assert "supervisor to start torchrun" in notice_text(st("starting"), [], None).plain
    assert "run_start" in notice_text(st("starting", status=Status(torchrun_pid=5)), [], None).plain
    assert "first optimizer step" in notice_text(
        st("running", status=Status(torchrun_pid=5), world_size=2), [], None).plain
    assert "final checkpoint" in notice_text(st("stopping", step=3), [], None).plain
    saved = CheckpointInfo(step=3, path="checkpoints/step-3", t=0.0, reason="stop")
    assert "press r" in notice_text(st("stopped", step=3, reason="stop requested", last_checkpoint=saved), [], None).plain
    assert "no checkpoint to resume from" in notice_text(st("stopped", step=3, reason="stop requested"), [], None).plain
    failed = notice_text(st("failed", step=3, reason="rank 1 exited 1"), ["a", "b", "Boom 🏖️"], 1).plain
    assert "Run failed: rank 1 exited 1" in failed and "rank1.log" in failed and "Boom" in failed
    assert "🏖" not in failed
    assert "Run killed" in notice_text(st("killed", step=3), [], None).plain
    assert notice_text(st("completed", step=3), ["x"], 0) is None
    assert notice_text(st("running", step=3), [], None) is None


def test_incident_detail_lists_evidence_as_key_value_lines():
    from mt.contract.incident import IncidentLine
    from tui.widgets.incidents import evidence_value, incident_detail

    inc = IncidentLine(code="nan_loss", severity="warn", step=15, title="Non-finite loss", detail="loss nan at 15",
                       advice="lower lr", evidence={"loss": "nan", "lr": 0.002786, "rank": 1, "signal": None,
                                                    "sample_indices": [948, 1188], "ok": False, "mem": {"a": 1}},
                       source="engine")
    lines = incident_detail(inc).plain.splitlines()
    assert lines[:3] == ["nan_loss (open, from engine)", "loss nan at 15", "advice: lower lr"]
    assert lines[3].startswith("b: roll back past it: continue from the checkpoint before step 15") and lines[4] == "evidence:"
    assert lines[5:] == ["  loss: nan", "  lr: 0.002786", "  rank: 1", "  signal: N/A",
                         "  sample_indices: 948, 1188", "  ok: False", "  mem: a=1"]
    assert evidence_value("x" * 1000).endswith("…") and len(evidence_value("x" * 1000)) == 300


def test_the_synthetic_data_loss_floor_is_shown_beside_the_loss(fixture_run):
    from tui.read.follower import load_run_state
    from tui.report.summary import format_summary
    from tui.widgets.header import render_header

    run = fixture_run("finished")  # a recorded synthetic run: run_start data_loss_floor 0.92729...
    st = load_run_state(run)
    assert "loss " in format_summary(st, now=0.0) and "(floor 0.9273)" in format_summary(st, now=0.0)
    header = render_header(st, 0.0, 160, 0.0, False).plain.splitlines()[2]
    assert header.startswith(f"loss {st.loss:.4g} (floor 0.9273)  best ")
    # a floor that cannot be true is left out; the run_start line itself is kept
    events = run / "events.jsonl"
    events.write_text(events.read_text().replace('"data_loss_floor":0.9272906615636746', '"data_loss_floor":"low"'))
    st = load_run_state(run)
    assert st.world_size == 2 and "floor" not in format_summary(st, now=0.0)


def test_system_numbers_print_as_fmt_num_does_everywhere_else():
    """The panel's numbers share tui.format.fmt: a value as wide as the float range is cut to .4g, a
    bool (not a number in JSON's sense) is N/A, as everywhere the viewer prints a number."""
    from tui.format.fmt import fmt_field, fmt_gib, fmt_num

    view = SystemView()
    rec = sample(1)
    rec["gpus"][0]["util_pct"] = 1e300
    rec["host"]["mem_used_bytes"] = True
    view.add(rec)
    text = render_system(view).plain
    assert f"util {fmt_num(1e300, '>3.0f')}%" in text and len(max(text.splitlines(), key=len)) < 80
    assert "host mem " in text and " N/A/N/A GiB" in text
    assert fmt_field(1e300, ">3.0f", "%") == "1e+300%" and fmt_gib(True) == "N/A" == fmt_field("12")


def test_a_trainers_fractional_epoch_and_a_lora_models_trainable_share_in_every_view(tmp_path):
    """The header, --once, mt ls's step cell and the headless step line say `epoch 1.25` and how
    many of the parameters train; unknown ones say nothing."""
    from tui.report.headless import step_line
    from tui.report.summary import format_summary
    from tui.state.runstate import RunState
    from tui.widgets.header import render_header

    st = RunState(run_dir=tmp_path, name="sft", step=40, max_steps=100, epoch=1.25, params_total=124_000, params_trainable=1_536)
    header = render_header(st, 0.0, 160, 0.6, False).plain
    once = format_summary(st, 0.0)
    assert "step 40/100 40%  epoch 1.25 " in header and "params 124k (1536 trainable)" in header, header
    assert "step 40/100  epoch 1.25  elapsed" in once and "params 124k (1536 trainable)" in once, once
    assert "epoch 1.25  loss" in step_line(st)
    st.epoch, st.params_trainable = 1 / 3, 124_000   # all of them train: no share shown
    assert "epoch 0.33 " in render_header(st, 0.0, 160, 0.6, False).plain and "trainable" not in format_summary(st, 0.0)
    st.epoch = None
    assert "epoch" not in render_header(st, 0.0, 160, 0.6, False).plain + format_summary(st, 0.0) + step_line(st)
