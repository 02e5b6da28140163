"""The GPU panel is the run's: the sampler samples the GPUs the ranks report (their heartbeats' CUDA
UUIDs), else those CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER show them; NVML itself is a stand-in."""
from __future__ import annotations

import os
from pathlib import Path

from mt.contract.heartbeat import Heartbeat, gpu_fragment
from mt.contract.paths import RunPaths
from mt.contract.system import clean_sample
from tests.tui.fakenvml import FakeGpu, FakeNvml, eight_gpus, uuid_of
from tui.read.gpus import GpuReader, parse_visible
from tui.supervise.sampler import SystemSampler

GIB = 2**30


def test_cuda_visible_devices_is_read_as_cuda_reads_it() -> None:
    assert parse_visible(None) is None
    assert parse_visible("3,1") == [3, 1]
    assert parse_visible("0,-1,2") == [0]            # a negative entry ends the list
    assert parse_visible("1gpu,2") == [1, 2]         # strtoul: the number it starts with
    assert parse_visible("0,0") == []                # a repeated entry hides every GPU
    assert parse_visible("GPU-ab,GPU-cd,3") == ["GPU-ab", "GPU-cd"]
    assert parse_visible("MIG-ab") == ["MIG-ab"]
    assert parse_visible("") == []


def _reader(gpus: list[FakeGpu], **env: str) -> GpuReader:
    return GpuReader(nvml=FakeNvml(gpus), env=env)


def _indices(reader: GpuReader, uuids: dict[int, str] | None = None, expect: int | None = None) -> list[int]:
    return [g["index"] for g in reader.read(uuids, expect)]


def test_before_the_ranks_report_the_gpus_cuda_shows_them_in_cudas_order() -> None:
    gpus = eight_gpus()   # NVML index i sits on PCI bus 7 - i: CUDA's PCI order is 7, 6, ... 0
    assert _indices(_reader(gpus), expect=2) == [7, 6]
    assert _indices(_reader(gpus, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES="2,5"), expect=2) == [5, 2]
    # UUIDs (or a unique prefix of one) name their GPU whatever the order; an unknown one ends the list
    assert _indices(_reader(gpus, CUDA_VISIBLE_DEVICES=f"{uuid_of(3)},{uuid_of(6)[:12]},GPU-ffff")) == [3, 6]
    assert _reader(gpus, CUDA_VISIBLE_DEVICES="-1").visible() == 0
    assert _reader(gpus, CUDA_VISIBLE_DEVICES="6,7,8").visible() == 2   # CUDA stops at the first it lacks
    # two models under CUDA's default order (fastest first): the order is unknown, so every visible GPU is sampled
    mixed = eight_gpus()[:2] + [FakeGpu(uuid_of(9), "00000000:90:00.0", name="NVIDIA L4")]
    assert sorted(_indices(_reader(mixed), expect=1)) == [0, 1, 2]
    assert _indices(_reader(mixed, CUDA_DEVICE_ORDER="PCI_BUS_ID"), expect=1) == [1]


def test_the_ranks_reported_gpus_are_sampled_alone_with_their_ranks(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    busy = [FakeGpu(uuid_of(i), f"00000000:{0x10 + i:02X}:00.0", used=79 * GIB) for i in range(8)]
    for rank, (gpu, peak) in enumerate([(5, 40 * GIB), (2, 41 * GIB)]):   # CUDA's UUID: no GPU- prefix
        hb = Heartbeat(paths.heartbeat(rank), rank, 1)
        hb.gpu = gpu_fragment(uuid_of(gpu)[4:], 30 * GIB, 70 * GIB, peak, 80 * GIB)
        hb.beat(12)
    stale = Heartbeat(paths.heartbeat(2), 2, 1)   # another process's file (an old attempt's): not this rank's GPU
    stale._tail = stale._tail.replace(f'"pid":{os.getpid()}', '"pid":1')
    stale.gpu = gpu_fragment(uuid_of(7)[4:], 1, 1, 1, 80 * GIB)
    stale.beat(3)
    sampler = SystemSampler(GpuReader(nvml=FakeNvml(busy), env={}), heartbeats=paths, expect=3)
    sample = clean_sample(sampler.sample({0: os.getpid(), 1: os.getpid(), 2: os.getpid()}))
    assert sample is not None
    assert [(g["index"], g["ranks"], g["uuid"]) for g in sample["gpus"]] == [(2, [1], uuid_of(2)), (5, [0], uuid_of(5))]
    r0, r1, r2 = sample["ranks"]
    assert (r0["gpu"], r0["mem_alloc_bytes"], r0["mem_reserved_bytes"], r0["mem_peak_bytes"], r0["mem_total_bytes"]) == \
        (uuid_of(5)[4:], 30 * GIB, 70 * GIB, 40 * GIB, 80 * GIB)
    assert r1["mem_peak_bytes"] == 41 * GIB and "gpu" not in r2 and "mem_peak_bytes" not in r2   # its file was not its own


def test_a_mig_slice_is_found_by_its_uuid() -> None:
    parent = FakeGpu(uuid_of(0), "00000000:10:00.0",
                     migs=[FakeGpu("MIG-aaaaaaaa-0000-0000-0000-000000000001", "", name="NVIDIA H100 MIG 1g.10gb",
                                   used=2 * GIB, total=10 * GIB)])
    other = FakeGpu(uuid_of(1), "00000000:11:00.0")
    reader = _reader([parent, other], CUDA_VISIBLE_DEVICES="MIG-aaaaaaaa")
    (g,) = reader.read({0: "aaaaaaaa-0000-0000-0000-000000000001"})
    assert (g["index"], g["mig"], g["ranks"], g["mem_total_bytes"], g["util_pct"]) == (0, 0, [0], 10 * GIB, None)
    assert reader.visible() == 1
    assert [(g["index"], g["mig"]) for g in reader.read()] == [(0, 0)]   # before the rank reports: CUDA's one device


def test_the_longest_heartbeat_with_its_gpu_still_fits_its_record(tmp_path: Path) -> None:
    from mt.contract.anatomy import StepAnatomy
    from mt.contract.heartbeat import STEP_LIMIT, read_heartbeats
    paths = RunPaths(tmp_path)
    hb = Heartbeat(paths.heartbeat(1023), 1023, 10**6)
    hb.anatomy = StepAnatomy(refresh=1)
    for _ in range(20):
        hb.anatomy.add(123456.789, 123456.789, 123456.789, 123456.789, 123456.789, 123456.789)
    most = 2**63 - 1
    hb.gpu = gpu_fragment("MIG-" + "f" * 8 + "-ffff-ffff-ffff-" + "f" * 12, most, most, most, most)
    hb.beat(STEP_LIMIT - 1, "checkpoint")
    got = read_heartbeats(paths)[1023]
    assert got["gpu"] == {"uuid": "MIG-ffffffff-ffff-ffff-ffff-ffffffffffff", "alloc": most, "reserved": most,
                          "peak": most, "total": most} and len(got["anatomy"]) == 7


def test_hostile_gpu_fields_in_a_sample_are_dropped_one_by_one() -> None:
    raw = {"t": 1_800_000_000.0, "gpus": [{"index": 0, "ranks": [1, "x", True, 2**70, 3], "uuid": 7, "mig": "a"}],
           "ranks": [{"rank": 0, "gpu": ["x"], "mem_peak_bytes": -1.5, "mem_total_bytes": 80}, {"rank": 1}]}
    sample = clean_sample(raw)
    assert sample is not None
    (g,) = sample["gpus"]
    assert (g["ranks"], g["uuid"], g["mig"]) == ([1, 3], None, None)
    r0, r1 = sample["ranks"]
    assert (r0["gpu"], r0["mem_peak_bytes"], r0["mem_total_bytes"]) == (None, None, 80) and "gpu" not in r1
