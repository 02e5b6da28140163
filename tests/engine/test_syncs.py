"""At most one host-device sync per optimizer step (issue 31 item 10): mt's own code reads a tensor's value
once a step, the agreement's row, whatever the precision and the number of ranks."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .runner import REPO, _env, engine_cmd, events, finish, logs, make_run, run_engine

pytestmark = pytest.mark.slow


def _reads(tmp: Path, name: str, steps: int, nproc: int, precision: str) -> dict[int, dict[str, int]]:
    """{rank: {"read file:line": times}} of the tensor reads mt's code made over a whole run of `steps` steps."""
    run = make_run(tmp, name, launch={"nproc_per_node": nproc}, train={"max_steps": steps, "precision": precision,
                                                                        "log_every": 1})
    out = tmp / f"{name}.reads"
    log = open(run / "launcher-1.log", "ab")
    proc = subprocess.Popen(_wrapped(engine_cmd(run, nproc, 1), out), cwd=REPO, env=_env(), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    assert finish(proc, run) == 0, logs(run)
    assert len(events(run, "step")) == steps
    counts = {}
    for rank in range(nproc):
        lines = Path(f"{out}.{rank}").read_text().splitlines()
        counts[rank] = {where: int(n) for n, where in (line.split("\t") for line in lines)}
    return counts


def _wrapped(cmd: list[str], out: Path) -> list[str]:
    """`... -m engine ARGS` becomes `... -m tests.engine.readcount OUT -- ARGS`."""
    i = cmd.index("engine")
    return cmd[:i] + ["tests.engine.readcount", str(out), "--"] + cmd[i + 1:]


@pytest.mark.parametrize("nproc,precision", [(1, "fp32"), (2, "fp32"), (1, "fp16")])
def test_the_loop_reads_the_device_once_per_optimizer_step(tmp_path, nproc, precision):
    # the runs differ only in their number of steps: start and end (checkpoint, events) cancel out
    short = _reads(tmp_path, "short", 3, nproc, precision)
    long = _reads(tmp_path, "long", 9, nproc, precision)
    for rank in range(nproc):
        per_step = {where: (n - short[rank].get(where, 0)) / 6 for where, n in long[rank].items()}
        per_step = {where: n for where, n in per_step.items() if n}
        assert sum(per_step.values()) <= 1, f"rank {rank} reads tensors each step: {per_step}"


def test_count_syncs_puts_each_steps_count_in_its_event(tmp_path):
    # a CPU run has no device to synchronize with: every step says 0 (on a GPU the loop's 1, bench/gpu_check.py)
    run = make_run(tmp_path, "counted", train={"max_steps": 3, "log_every": 1}, debug={"count_syncs": True})
    assert run_engine(run) == 0, logs(run)
    assert [s["host_syncs"] for s in events(run, "step")] == [0, 0, 0]
