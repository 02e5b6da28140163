"""Every number, byte count, duration and run-directory text the viewer prints, and one meaning of
"not available". mt's own messages use `mt/contract/fmt.py` (mt cannot import tui)."""
from __future__ import annotations

import math
import re

from mt.contract.fmt import NA, human_bytes

_WIDE = 16   # a number printed wider than this (1e308 with ",.0f" is 400 characters) goes to ".4g"


def fmt_num(v: float | None, spec: str = ".4g") -> str:
    if v is None:
        return NA
    if not math.isfinite(v):
        return str(v)
    text = format(v, spec)
    return text if len(text) <= _WIDE else format(v, ".4g")


def fmt_field(v: object, spec: str = ".0f", unit: str = "") -> str:
    """A value read from a run's file as `fmt_num` prints it, with its unit; `N/A` for anything not a number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return NA
    return fmt_num(v, spec) + unit


def fmt_gib(v: object) -> str:
    """A byte count from a run's file in GiB, one decimal (`12.5`); `N/A` for anything not a number."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    return human_bytes(v if ok else None, "GiB", suffix=False)  # type: ignore[arg-type]


def at_step(step: int | None) -> str:
    """`at step S`; `before the first step` when no step ran (none, or 0: a run_end before any)."""
    return f"at step {step}" if step else "before the first step"


def fmt_loss(loss: float | None, floor: float | None) -> str:
    """The loss, with the data's floor (the best loss possible) beside it when the source has one."""
    return fmt_num(loss) + ("" if floor is None else f" (floor {fmt_num(floor)})")


def fmt_loss_cell(v: float | None) -> str:
    """A loss in a table (`mt ls`, `mt diff`, the compare view): four decimals, or four significant
    digits where decimals would hide it (7.456e-05, 1e+308); NA when there is none."""
    if v is None:
        return NA
    return fmt_num(v, ".4f" if v == 0 or 1e-3 <= abs(v) < 1e6 else ".4g")


def fmt_best(best: float | None, step: int | None, partial: bool = False) -> str:
    """A best loss and its step (`0.9630 @140`); `≤` when only the newest steps were read (the
    true best may be lower); NA when there is none."""
    if best is None:
        return NA
    return f"{'≤' if partial else ''}{fmt_loss_cell(best)}{'' if step is None else f' @{step}'}"


def fmt_best_checkpoints(metric: str | None, best: dict[int, float]) -> str:
    """The best checkpoints kept, best first (`@40 val_loss 1.234, @60 1.301`); "" when there is none."""
    shown = [f"@{s} {fmt_num(v)}" for s, v in best.items()]
    return f"{shown[0].replace(' ', f' {metric or NA} ', 1)}{''.join(', ' + x for x in shown[1:])}" if shown else ""


def fmt_step(step: int | None, total: int | None, grouped: bool = False) -> str:
    """A run's progress `step/total` (`1,200/5,000` when grouped); NA for the part not known."""
    spec = "," if grouped else ""
    return f"{NA if step is None else format(step, spec)}/{NA if total is None else format(total, spec)}"


def fmt_epoch(epoch: float | None, prefix: str = "epoch ") -> str:
    """`epoch 2` (the engine's whole one) or `epoch 1.25` (a Trainer's, two decimals as it prints them); "" unknown."""
    if epoch is None or not math.isfinite(epoch):
        return ""
    text = f"{epoch:.2f}".rstrip("0").rstrip(".") if epoch < 1e9 else fmt_num(epoch)
    return prefix + text


def fmt_params(total: int | None, trainable: int | None = None, active: int | None = None) -> str:
    """`params 124k`, with `(1.5k trainable)` under a frozen base (LoRA) and `(12M active)` for a mixture of experts."""
    trains = f" ({fmt_compact(trainable)} trainable)" if trainable is not None and total is not None and trainable < total else ""
    acts = f" ({fmt_compact(active)} active)" if active is not None else ""
    return f"params {fmt_compact(total)}{acts}{trains}"


def or_na(v: object) -> str:
    """A value from a run's file as it is, or NA when it is missing (None, 0, empty)."""
    return str(v) if v else NA


def fmt_duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return NA
    if abs(s) >= 1e9:   # 30 years: a time from elsewhere, not a count of hours to print whole
        return f"{fmt_num(s / 3600, '.3g')}h"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt_eta(eta_s: float | None, quiet_s: float | None) -> str:
    """The ETA, or `— (no step for 6m02s)` on a run that stopped stepping (RunState.quiet_s)."""
    quiet = quiet_s
    return fmt_duration(eta_s) if quiet is None else f"— (no step for {fmt_duration(quiet)})"


def fmt_s(seconds: float | None) -> str:
    """Seconds in an incident's sentence: 0.42 s, 12 s, 3.5 min; NA when unknown."""
    if seconds is None:
        return NA
    if seconds < 10:
        return f"{seconds:.2g} s" if seconds < 1 else f"{seconds:.1f} s"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def fmt_ms(seconds: float | None) -> str:
    """A step's part in a sentence: 130 ms, 4.2 ms, 0.31 ms; NA when unknown."""
    if seconds is None:
        return NA
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.2g} ms"


def fmt_write_time(seconds: float | None, blocking_s: float | None) -> str:
    """A checkpoint's write time and what the loop waited of it: `0.94 s, loop waited 0.18 s`."""
    if seconds is None:
        return ""
    waited = "" if blocking_s is None or blocking_s >= seconds else f", loop waited {fmt_num(blocking_s, '.2f')} s"
    return f"{fmt_num(seconds, '.2f')} s{waited}"


_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_compact(v: float | None, sig: int = 3) -> str:
    """A number in a few characters for an axis: 8259, 34.6k, 1.2M, 0.25, 3e-4 (`sig` digits)."""
    if v is None:
        return NA
    if not math.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    sign = "-" if v < 0 else ""
    if abs(v) < 1e4 and abs(v) == int(abs(v)):
        return f"{sign}{int(abs(v))}"   # whole numbers below 10k as they are: step 1234, 8200 tok/s
    a = float(f"{abs(v):.{sig - 1}e}")   # rounded first: 999,950 is 1M, not 1000k
    if not math.isfinite(a):             # the largest floats round past the float range
        a = abs(v)
    for scale, suffix in _SUFFIXES:
        if a >= scale and a < scale * 1000:
            return f"{sign}{a / scale:.{sig}g}{suffix}"
    if 0.01 <= a < 1e15:
        return f"{sign}{a:.{sig}g}"
    mantissa, exp = f"{a:.{sig - 1}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{sign}{mantissa}e{int(exp)}"


def fmt_mb(n: int) -> str:
    """Bytes as decimal megabytes, one decimal: how `mt prepare` reports text it tokenizes."""
    return human_bytes(n, "MB", suffix=False)


def fmt_mb_rate(n: int, seconds: float) -> str:
    """Decimal megabytes a second, one decimal; NA before any time has passed."""
    return human_bytes(n / seconds, "MB", suffix=False) if seconds > 0 else NA


def fmt_rate(tokens_per_s: float | None, samples_per_s: float | None) -> str:
    """Throughput: tokens/s where the samples have tokens, else samples/s (the label says which)."""
    if tokens_per_s is None and samples_per_s is not None:
        return f"samples/s {fmt_num(samples_per_s, ',.1f')}"
    return f"tok/s {fmt_num(tokens_per_s, ',.0f')}"


def fmt_parallel(strategy: str | None, compiled: bool, activation_checkpointing: bool) -> str:
    """How the model is spread, compiled and recomputed, e.g. "fsdp + compile + act. ckpt"; "" when the run does not say."""
    return " + ".join(p for p, on in ((strategy, bool(strategy)), ("compile", compiled), ("act. ckpt", activation_checkpointing)) if on)


_KNOB_TEXT = {"lr_scale": "lr×{:g}", "grad_clip": "clip {:g}", "eval_every": "eval/{:g}",
              "checkpoint_every": "ckpt/{:g}", "log_every": "log/{:g}"}


def fmt_knobs(knobs: dict[str, float]) -> str:
    """Turned knobs in a few characters each, e.g. "lr×0.5 clip 1"; "" when none is turned."""
    return " ".join(_KNOB_TEXT.get(k, k + " {:g}").format(v) for k, v in knobs.items() if not (k == "lr_scale" and v == 1))


# C0 and C1 controls (ESC starts every terminal sequence; CSI is \x9b on its own) and the bidi
# overrides that reorder what a line seems to say
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def safe_text(text: object, lines: bool = False) -> str:
    """Text from the run directory as it may reach a terminal: every control character shown as
    `\\x1b`, never obeyed (an OSC sequence in a run name would retitle the terminal); `lines`
    keeps newlines and tabs, for a block of text."""
    s = str(text)
    if not _CONTROL.search(s):
        return s
    return _CONTROL.sub(lambda m: m[0] if lines and m[0] in "\n\t" else _visible(m[0]), s)


_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\r\b]")


def terminal_line(line: str) -> str:
    """A log line as a terminal leaves it: `\r` and backspace rewrite it (a progress bar's last
    state), erase-line sequences clear it; other escape sequences (cursor moves, colours) are dropped."""
    if "\r" not in line and "\x1b" not in line and "\b" not in line:
        return line
    buf: list[str] = []
    col = 0
    at = 0
    for m in [*_CSI.finditer(line), None]:
        text = line[at: m.start() if m else len(line)]
        buf[col:col + len(text)] = text          # overwrite from the cursor
        col += len(text)
        if m is None:
            break
        at, code = m.end(), m[0]
        if code == "\r":
            col = 0
        elif code == "\b":
            col = max(0, col - 1)
        elif code[-1] == "K":                     # erase in line: 0/none to the end, 1 to the cursor, 2 all
            arg = code[2:-1]
            if arg in ("", "0"):
                del buf[col:]
            else:
                buf[: col if arg == "1" else len(buf)] = " " * (col if arg == "1" else len(buf))
    return "".join(buf).rstrip()


def _visible(ch: str) -> str:
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


_ANATOMY_NAMES = (("data_s", "data"), ("compute_s", "compute"), ("work_s", "compute"), ("optim_s", "optim"),
                  ("comm_s", "wait"), ("mt_s", "mt"))


def anatomy_text(parts: dict[str, object], short: bool = False) -> str:
    """One rank's median step in parts (a heartbeat's anatomy or an incident's): `step 90 ms: data 83 ms, wait 2.4 ms`;
    `short` (a panel's row): `90 ms: data 83, wait 2.4`."""
    def part(key: str) -> float | None:
        v = parts.get(key)
        return float(v) if type(v) in (int, float) else None  # type: ignore[arg-type]
    shown = [f"{name} {fmt_ms(part(key)).removesuffix(' ms') if short else fmt_ms(part(key))}"
             for key, name in _ANATOMY_NAMES if part(key) is not None]
    return ("" if short else "step ") + fmt_ms(part("step_s")) + (": " + ", ".join(shown) if shown else "")


def anatomy_lines(evidence: dict[str, object]) -> list[str]:
    """A straggler's verdict, then each rank's step anatomy (nothing without them; wrong types are skipped)."""
    why, anatomy = evidence.get("why"), evidence.get("anatomy")
    if not isinstance(why, str) or not isinstance(anatomy, dict):
        return []
    ranks = sorted((k for k, v in anatomy.items() if isinstance(v, dict)), key=lambda k: (len(str(k)), str(k)))
    return [safe_text(why), *(safe_text(f"rank {r}: {anatomy_text(anatomy[r])}") for r in ranks)]


def stacks_lines(evidence: dict[str, object]) -> list[str]:
    """An incident's captured stacks in words: `stacks: <verdict>`, then each DataLoader worker's place
    (nothing when it has none; values of the wrong type are skipped, as a file may hold anything)."""
    verdict = evidence.get("verdict")
    if not isinstance(verdict, str):
        return []
    workers = evidence.get("workers")
    more = [w for w in workers if isinstance(w, str)] if isinstance(workers, list) else []
    return [safe_text(f"stacks: {verdict}"), *(safe_text(w) for w in more)]


def fmt_rank(rank: int, node: str | None) -> str:
    """A rank as an incident names it: `rank 5 on node gpu-07` in a job, `rank 5` on one machine."""
    return f"rank {rank}" if node is None else f"rank {rank} on node {safe_text(node)}"


def fmt_ranks(ranks: list[int]) -> str:
    """`rank 1`, `ranks 2, 3`, `ranks 8-15`: a run of three or more in a row as a range (a node's 8 GPUs)."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [f"{g[0]}-{g[-1]}" if len(g) >= 3 else ", ".join(map(str, g)) for g in runs]
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(parts)}"


def fmt_sample(prompt: str, text: str, limit: int | None = None) -> str:
    """A generated sample as one line: its prompt, then what the model wrote after it (a newline shown as ⏎,
    control characters escaped); `limit` cuts it to that many characters."""
    line = f"{safe_text(prompt.replace(chr(10), '⏎'))} ▸ {safe_text(text.replace(chr(10), '⏎'))}"
    return line if limit is None or len(line) <= limit else line[: max(limit - 1, 0)] + "…"


def fmt_values(values: dict[str, float], limit: int = 8) -> str:
    """Named numbers as `name 0.25  other 3.1` (the first `limit` of them)."""
    return "  ".join(f"{safe_text(k)} {fmt_num(v, '.4g')}" for k, v in list(values.items())[:limit])


def fmt_rollback(step: int | None, to_step: int | None, skip: int | None, lr_scale: float | None, why: str, by: str,
                 count: int | None) -> str:
    """A `rollback` event in one line (headless, --once, the dashboard's notice)."""
    def n(v: int | None) -> str:  # 0 is a step and a skip: not "not available"
        return NA if v is None else str(v)

    lr = "" if lr_scale is None or lr_scale == 1.0 else f", lr x{lr_scale:g}"
    return (f"rolled back from step {n(step)} to step {n(to_step)} ({why or 'no reason given'}; by {by or NA}):"
            f" {n(skip)} batches skipped{lr} (rollback {n(count)})")
