"""The per-node layout of a job's shared run directory (mt/contract/paths.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from mt.contract.paths import RunPaths


def test_a_node_keeps_its_supervisor_files_in_its_folder_and_the_job_files_at_the_top(tmp_path: Path) -> None:
    top, n2 = RunPaths(tmp_path), RunPaths(tmp_path, "n2")
    for job_file in ("config", "preset", "status", "events", "incidents", "control", "checkpoints"):
        assert getattr(n2, job_file) == getattr(top, job_file), job_file
    node = tmp_path / "nodes" / "n2"
    assert n2.here == node and top.here == tmp_path
    assert n2.system == node / "system.jsonl"
    assert n2.heartbeat(5) == node / "heartbeat" / "rank5"
    assert n2.rank_log(5) == node / "logs" / "rank5.log"
    assert n2.supervisor_log == node / "logs" / "supervisor.log"
    assert n2.node_status == node / "status.json" and top.node_status == top.status
    assert n2.stacks == node / "stacks" and n2.supervisor_lock == node / "supervisor.lock"
    assert top.on("n2") == n2 and n2.on(None) == top


def test_node_names_lists_node_folders_and_skips_what_cannot_be_one(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    assert paths.node_names() == []
    for name in ("n2", "gpu-07", "n1"):
        (tmp_path / "nodes" / name).mkdir(parents=True)
    (tmp_path / "nodes" / "stray.txt").write_text("x")  # a file, not a node
    (tmp_path / "nodes" / "-bad").mkdir()
    (tmp_path / "nodes" / "link").symlink_to(tmp_path)  # a link out of nodes/ is not followed
    assert paths.node_names() == ["gpu-07", "n1", "n2"]


@pytest.mark.parametrize("bad", ["..", ".", "a/b", "", "-x", "x" * 200])
def test_a_node_name_that_is_a_path_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="not a node name"):
        RunPaths(tmp_path, bad)
