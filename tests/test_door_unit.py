"""The one door (mt/contract/door.py): what it refuses, on real FIFOs, devices, links and folders."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mt.contract import door


def test_a_regular_file_is_read_whole_within_its_bound(tmp_path: Path) -> None:
    p = tmp_path / "status.json"
    p.write_text('{"state": "running"}')
    assert door.read_json(p) == {"state": "running"}
    assert door.read_bytes(p, 100) == b'{"state": "running"}'
    with pytest.raises(door.Refused, match="more than the 5 bytes"):
        door.read_bytes(p, 5)
    assert door.read_head(p, 5) == b'{"sta'
    assert door.read_tail(p, 5) == b'ing"}'


def test_a_fifo_is_refused_at_once_without_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "status.json"
    os.mkfifo(fifo)
    done = threading.Event()
    got: list[object] = []

    def read() -> None:
        got.append(door.read_json(fifo))
        with pytest.raises(door.Refused, match="a FIFO"):
            door.read_bytes(fifo, 10)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(10), "the door blocked on a FIFO"
    assert got == [None]


def test_a_device_a_folder_and_a_link_are_refused(tmp_path: Path) -> None:
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(door.Refused, match="symbolic link"):
        door.read_bytes(tmp_path / "zero", 10)
    with pytest.raises(door.Refused, match="a device"):
        door.read_head(tmp_path / "zero", 10, follow=True)
    with pytest.raises(door.Refused, match="a folder"):
        door.read_bytes(tmp_path, 10)
    assert door.read_json(tmp_path / "zero") is None
    assert door.read_json(tmp_path / "missing") is None
    assert door.read_json_why(tmp_path / "missing") == (None, "missing")
    with pytest.raises(FileNotFoundError):
        door.read_bytes(tmp_path / "missing", 10)


def test_append_refuses_a_fifo_and_a_link(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError):   # no reader: ENXIO at once, never a block
        door.open_append(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        door.open_append(tmp_path / "link")
    fd = door.open_append(tmp_path / "log")
    os.write(fd, b"x\n")
    os.close(fd)
    assert (tmp_path / "log").read_bytes() == b"x\n"


def test_a_folder_is_listed_only_when_it_is_no_link(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "n1").mkdir(parents=True)
    (tmp_path / "nodes" / "file").write_text("x")
    (tmp_path / "link").symlink_to("/proc")
    assert sorted(door.folder_names(tmp_path / "nodes")) == ["file", "n1"]
    assert door.folder_names(tmp_path / "nodes", folders_only=True) == ["n1"]
    assert door.folder_names(tmp_path / "link") == []
    assert door.folder_names(tmp_path / "missing") == []


def test_a_ranks_heartbeat_writer_never_writes_through_a_dropped_link_or_fifo(tmp_path: Path) -> None:
    """A heartbeat/rank0 that is a link to a user's file, or a FIFO, is replaced, not followed or hung on."""
    from mt.contract.heartbeat import Heartbeat, read_heartbeats
    from mt.contract.paths import RunPaths

    paths = RunPaths(tmp_path)
    paths.heartbeat(0).parent.mkdir(parents=True)
    victim = tmp_path / "bashrc"
    victim.write_text("export KEEP=1\n")
    paths.heartbeat(0).symlink_to(victim)
    os.mkfifo(paths.heartbeat(1))
    for rank in (0, 1):
        Heartbeat(paths.heartbeat(rank), rank, attempt=1).beat(7)
    assert victim.read_text() == "export KEEP=1\n"
    assert {r: hb["step"] for r, hb in read_heartbeats(paths).items()} == {0: 7, 1: 7}
