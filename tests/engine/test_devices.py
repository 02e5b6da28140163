"""The ranks agree on the device type before any process group exists (issue 31 item 1): a rank that
cannot use what launch.device asks fails every rank at once, naming the ranks and their node."""
from __future__ import annotations

import socket
import time

import pytest

from engine.dist import DeviceError, device_verdict

from .runner import events, make_run, run_engine


def _reports(*devices: str, why: str = "") -> list[dict[str, str]]:
    return [{"host": f"n{r // 2}", "device": d, "why": why if not d else ""} for r, d in enumerate(devices)]


def test_the_verdict_is_one_device_type_or_names_who_cannot():
    assert device_verdict("auto", _reports("cuda", "cuda", "cuda", "cuda")) == "cuda"
    assert device_verdict("auto", _reports("cpu", "cpu")) == "cpu"
    # "auto" finding CUDA on node n0 only: NCCL there and gloo on n1 could never meet; say who
    with pytest.raises(DeviceError, match=r'"auto": ranks 2, 3 on node n1 see no CUDA device'):
        device_verdict("auto", _reports("cuda", "cuda", "cpu", "cpu"))
    # a broken driver on n1: its ranks are named with the driver's reason
    with pytest.raises(DeviceError, match=r"ranks 2, 3 on node n1: no driver"):
        device_verdict("cuda", _reports("cuda", "cuda", "", "", why="no driver"))


@pytest.mark.slow
def test_cuda_without_a_gpu_fails_every_rank_at_start_naming_them(tmp_path):
    # this machine has no GPU: every rank's probe fails, all learn it from the store before init_process_group
    run = make_run(tmp_path, launch={"nproc_per_node": 2, "device": "cuda", "pg_timeout_s": 120})
    t0 = time.monotonic()
    assert run_engine(run, nproc=2, timeout=120) != 0
    took = time.monotonic() - t0
    end = events(run, "run_end")
    assert len(end) == 1 and end[0]["status"] == "failed", end
    assert f"ranks 0, 1 on node {socket.gethostname()}" in end[0]["reason"] and "no CUDA device" in end[0]["reason"]
    assert took < 120 / 2, f"took {took:.0f} s: a device failure must not wait for pg_timeout_s"
