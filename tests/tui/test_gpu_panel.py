"""The GPU panel at 80x24 with eight GPUs: every GPU on screen with its rank, each rank's GPU and allocator,
and the note that NCCL's spin makes a waiting GPU read busy (Textual's Pilot, a real run directory)."""
from __future__ import annotations

import json

from tests.tui.synth import SynthRun
from tests.tui.test_app import loaded, make_app, screen_text, wait_for

GIB = 2**30


def _eight_gpu_sample(t: float, pid: int) -> dict:
    """A supervisor's sample of a node of 8 GPUs, rank r on NVML's GPU 7 - r (CUDA's order is not NVML's)."""
    gpus = [{"index": i, "mig": None, "uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000", "name": "NVIDIA H100 80GB HBM3",
             "ranks": [7 - i], "util_pct": 97.0, "mem_used_bytes": 78 * GIB, "mem_total_bytes": 80 * GIB,
             "temp_c": 71.0, "power_w": 690.0} for i in range(8)]
    ranks = [{"rank": r, "pid": pid, "cpu_pct": 100.0, "rss_bytes": 3 * GIB, "alive": True,
              "gpu": f"{7 - r:08x}-0000-0000-0000-000000000000", "mem_alloc_bytes": 30 * GIB,
              "mem_reserved_bytes": 70 * GIB, "mem_peak_bytes": (40 + r) * GIB, "mem_total_bytes": 80 * GIB}
             for r in range(8)]
    return {"v": 1, "t": t, "nvml": True, "nvml_error": None, "gpus": gpus, "ranks": ranks,
            "host": {"cpu_pct": 50.0, "mem_used_bytes": 100 * GIB, "mem_total_bytes": 1000 * GIB, "load1": 8.0}}


async def test_eight_gpus_and_their_ranks_fit_an_80x24_screen(tmp_path) -> None:
    r = SynthRun(tmp_path)
    r.run_start(device="NVIDIA H100 80GB HBM3", world_size=8)
    for s in range(1, 4):
        r.step(s)
    r.flush()
    r.status("running")
    r.paths.system.write_text("".join(json.dumps(_eight_gpu_sample(r.t + k, 1)) + "\n" for k in range(3)))
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("2")          # 80 columns: the panels are tabs; the system panel, the screen's width
        await wait_for(pilot, lambda: "GPU7" in screen_text(app, "#system"))
        await pilot.pause(0.2)
        shown = screen_text(app, "#system")
        lines = shown.splitlines()
        for i in range(8):   # every GPU on screen, with the rank on it and the most its rank allocated in a step
            line = next((ln for ln in lines if f"GPU{i} " in ln), None)
            assert line is not None, f"GPU{i} not on the screen:\n{shown}"
            assert f" r{7 - i} " in line and f"pk {40 + 7 - i:.1f}G" in line and "78.0/80.0G" in line, line
            assert "…" not in line, line   # nothing cut at 80 columns
        assert "util: NCCL spins while it waits, so a GPU waiting for a peer reads busy" in shown, shown
        # each rank's own GPU and allocator (reserved: the cache NVML counts as used; peak: this step's), on screen too
        for rank in range(8):
            line = next((ln for ln in lines if f"rank{rank} " in ln), None)
            assert line is not None and f"rank{rank} GPU{7 - rank} " in line, shown
            assert f"alloc 30.0 res 70.0 pk {40 + rank:.1f}/80.0 GiB" in line and "…" not in line, line
