"""Every node's capture of one request, read from real files: what is not a request or a verdict is
skipped, never a crash; the verdict groups the ranks across nodes and names the silent ones."""
from __future__ import annotations

import json
import time

from mt.contract.paths import RunPaths
from tui.stacks.nodes import nodes_verdict, pending_requests, request_stacks


def _run(tmp_path):
    run = tmp_path / "job"
    for node in ("n1", "n2"):
        (run / "nodes" / node / "stacks").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    return run


def test_requests_are_taken_once_per_node_and_junk_is_skipped(tmp_path):
    run = _run(tmp_path)
    since = time.time() - 1
    rid = request_stacks(run, workers=True)
    box = RunPaths(run).stack_requests
    (box / "junk.json").write_text("{not json")
    (box / "dir.json").mkdir()
    other = rid[:-1] + ("1" if rid.endswith("0") else "0")   # named like a request, never the real one
    (box / f"{other}.json").write_text(json.dumps({"v": 1, "id": "../../x", "t": time.time()}))
    old = request_stacks(run)
    (box / f"{old}.json").write_text(json.dumps({"v": 1, "id": old, "t": since - 100, "workers": False}))
    n1, n2 = RunPaths(run, "n1"), RunPaths(run, "n2")
    (got,) = pending_requests(n1, since)
    assert got.id == rid and got.workers is True
    (n1.stacks / f"20260101T000000Z-request-{rid}").mkdir()   # n1 answered it
    assert pending_requests(n1, since) == [] and [r.id for r in pending_requests(n2, since)] == [rid]
    assert pending_requests(n2, since, frozenset({rid})) == []


def test_the_verdict_over_nodes_groups_ranks_and_names_the_silent_node(tmp_path):
    run = _run(tmp_path)
    rid = "20260101T000000Z-abc123"
    folder = RunPaths(run, "n1").stacks / f"20260101T000000Z-request-{rid}"
    folder.mkdir()
    place = {"file": "/w/train.py", "line": 9, "func": "step", "waits_in": "all_reduce"}
    (folder / "verdict.json").write_text(json.dumps({"ranks": {
        "0": {"place": place}, "1": {"place": "bad"}, "x": {"place": place}, "2": {"place": {**place, "line": "9"}},
        "3": {"place": {"file": "/w/data.py", "line": 4, "func": "load", "waits_in": None}}}}))
    (RunPaths(run, "n2").stacks / f"20260101T000000Z-request-{rid}").mkdir()  # n2's folder, no verdict.json yet
    found = nodes_verdict(run, rid)
    assert found.silent == ("n2",) and found.folders == {"n1": folder}
    assert found.verdict.line == ("rank 3 is in `load` (data.py:4); rank 0 waits in `all_reduce` (train.py:9); "
                                  "no stack from ranks 1, 2")
    (folder / "verdict.json").write_text("[1, 2")
    assert nodes_verdict(run, rid).silent == ("n1", "n2")


def test_an_incident_says_what_py_spy_would_add_for_the_ranks_without_a_stack(tmp_path):
    from tui.stacks.auto import detail_of, evidence_of
    from tui.stacks.capture import PY_SPY_HINT, Capture
    from tui.stacks.verdict import Frame, RankStack, ThreadStack, verdict

    main = ThreadStack("0x1", (Frame("/w/train.py", 9, "step"),), main=True)
    note = f"no dump within 2 s of SIGUSR2; {PY_SPY_HINT}"
    stacks = (RankStack(0, 10, "faulthandler", (main,)), RankStack(1, 11, "none", note=note))
    cap = Capture(tmp_path / "stacks" / "x-hang", stacks, verdict(list(stacks)), 0.1)
    ev = evidence_of(cap, tmp_path)
    assert ev["no_stack"] == {"1": note} and ev["verdict"].endswith("no stack from rank 1")
    assert detail_of(cap).endswith(f"; rank 1: {PY_SPY_HINT}")
