"""`mt stacks` on users' own scripts under `mt launch`: the mt library's dump, and py-spy for a script without mt."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import REPO, events, mt, wait_for
from tui.stacks.capture import NoRanksError, capture, find_ranks, py_spy

pytestmark = pytest.mark.slow
SCRIPT = REPO / "tests" / "library" / "scripts" / "faulty.py"
LINES = SCRIPT.read_text().splitlines()
HANG_LINE = next(i for i, line in enumerate(LINES, 1) if "time.sleep(1.0)" in line)
REDUCE_LINE = next(i for i, line in enumerate(LINES, 1) if "dist.all_reduce(t)" in line)


def _hung(tmp_path: Path, name: str, *extra: str) -> Path:
    """A 2-rank faulty.py run whose rank 1 sleeps forever before step 3's all_reduce."""
    out = mt("launch", SCRIPT, "--nproc", "2", "--runs-dir", tmp_path / "runs", "--name", name, "--detach", "--",
             "--fault", "hang", "--rank", "1", "--at", "3", "--steps", "400", *extra, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip().splitlines()[-1])


def _settled(run_dir: Path, wait_s: float = 2.0):
    """Captures until rank 1 sits in its hang and rank 0 waits in the all_reduce (the script first imports torch and
    joins the group; on a busy machine rank 0 may still be on its way to the collective)."""
    def hung():
        try:
            cap = capture(run_dir, wait_s=wait_s)
        except NoRanksError:  # torchrun has not started them yet
            return None
        lines = {g.ranks: g.place.frame.line for g in cap.verdict.groups if g.place is not None and g.place.frame is not None}
        return cap if lines.get((1,)) == HANG_LINE and lines.get((0,)) == REDUCE_LINE else None
    return wait_for(hung, 120, "rank 1 in its hang and rank 0 in the all_reduce", every=1.0)


def test_a_script_using_mt_gets_the_faulthandler_path_and_one_without_gets_py_spy(tmp_path):
    # both launched at once: the second's start-up overlaps the first one's checks
    runs = [lib := _hung(tmp_path, "lib")]
    try:
        runs.append(bare := _hung(tmp_path, "bare", "--no-mt"))
        wait_for(lambda: len(events(lib, "step")) >= 2, 120, "the script's first steps")
        cap = _settled(lib)
        assert [s.source for s in cap.stacks] == ["faulthandler", "faulthandler"], cap
        assert cap.verdict.line == (f"rank 1 is in `<module>` (faulty.py:{HANG_LINE}); "
                                    f"rank 0 waits in `all_reduce` (faulty.py:{REDUCE_LINE})")

        if py_spy() is None:  # the faulthandler path has nothing to read: the capture says what py-spy would add
            wait_for(lambda: len(find_ranks(bare)) == 2, 60, "2 ranks")
            cap = capture(bare, wait_s=0.5)
            assert cap.verdict.missing == (0, 1) and all("pip install 'mt[stacks]'" in s.note for s in cap.stacks)
            return
        cap = _settled(bare, wait_s=0.5)
        assert [s.source for s in cap.stacks] == ["py-spy", "py-spy"], cap
        assert all("no SIGUSR2 handler" in s.note for s in cap.stacks)
        assert cap.verdict.line == (f"rank 1 is in `<module>` (faulty.py:{HANG_LINE}); "
                                    f"rank 0 waits in `all_reduce` (faulty.py:{REDUCE_LINE})")
        assert (cap.folder / "rank1.txt").read_text().startswith("Process ")
    finally:
        assert [mt("kill", run).returncode for run in runs] == [0] * len(runs)
