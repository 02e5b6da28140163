"""Panel texts rendered from data, without a terminal."""
from __future__ import annotations

from tui.watch import SystemView
from tui.widgets.system import render_system, sparkline


def sample(n_gpus: int, unreadable: bool = False) -> dict:
    g = lambda i: {"index": i, "name": "GPU", "util_pct": None if unreadable else 10 * i,  # noqa: E731
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


def test_no_gpus_says_why_and_sparkline_blanks_unknowns():
    view = SystemView()
    rec = sample(0)
    rec.update(nvml=False, nvml_error="NVML Shared Library Not Found")
    view.add(rec)
    assert "GPUs: none (NVML Shared Library Not Found)" in render_system(view).plain
    assert sparkline([0, None, 100, "x"]) == "▁ █ "
