"""What torch's flight-recorder analyzer (`python -m torch.distributed.flight_recorder.fr_trace`)
printed, parsed (pure): each collective not every rank joined, and who did not."""
from __future__ import annotations

import re
from dataclasses import dataclass

_HEAD = re.compile(r"^Not all ranks joining collective, sequence number: (\d+)\s*$")
_FIELD = re.compile(r"^([a-z][a-z ]*): (.*)$")


@dataclass(frozen=True)
class Unjoined:
    """One collective some ranks of its group never entered: its sequence number, op and group."""

    seq: int
    op: str
    group: str
    missing: tuple[int, ...]
    expected: tuple[int, ...]
    state: str

    def line(self) -> str:
        """`rank 1 did not join collective #4 (nccl:all_reduce, group 0:default_pg); rank 0 waits in it`."""
        who = ("rank " if len(self.missing) == 1 else "ranks ") + ", ".join(map(str, self.missing))
        rest = [r for r in self.expected if r not in self.missing]
        waits = f"; {'rank' if len(rest) == 1 else 'ranks'} {', '.join(map(str, rest))} {'waits' if len(rest) == 1 else 'wait'} in it" if rest else ""
        return f"{who} did not join collective #{self.seq} ({self.op}, group {self.group}){waits}"


def _ranks(text: str) -> tuple[int, ...]:
    return tuple(sorted({int(n) for n in re.findall(r"\d+", text)}))


def parse_fr_trace(text: str) -> list[Unjoined]:
    """Every `Not all ranks joining collective` block of the analyzer's output, in its order."""
    found: list[Unjoined] = []
    block: dict[str, str] | None = None
    seq = 0

    def close() -> None:
        if block is not None and "missing ranks" in block:
            found.append(Unjoined(seq, block.get("collective", "?"), block.get("group info", "?"),
                                  _ranks(block["missing ranks"]), _ranks(block.get("expected ranks", "")),
                                  block.get("collective state", "?")))

    for line in text.splitlines():
        head = _HEAD.match(line.strip())
        if head:
            close()
            block, seq = {}, int(head.group(1))
            continue
        field = _FIELD.match(line.strip())
        if field and block is not None and field.group(1) not in block:
            block[field.group(1)] = field.group(2).strip()
    close()
    return found
