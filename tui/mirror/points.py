"""What a mirror shows: each record of the run directory as named numbers (TensorBoard tags).

One mapping for the live mirror and `mt export --tensorboard`, so both show the same series;
docs/run-directory.md#mirrors lists the names.
"""
from __future__ import annotations

from typing import Any

from mt.contract.incident import IncidentLine
from mt.contract.records import Eval, Metrics, Sample, Step

# a step's plotted fields and their tags (the dashboard's series)
STEP_TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tokens_per_s": "train/tokens_per_s"}


def step_values(rec: Step | Eval | Metrics) -> dict[str, float]:
    """The tags and values one step, eval or metrics record carries (unknown fields left out)."""
    out: dict[str, float] = {}
    if isinstance(rec, Step):
        for name, tag in STEP_TAGS.items():
            v = getattr(rec, name)
            if v is not None:
                out[tag] = v
        out.update({f"metrics/{k}": v for k, v in rec.extra.items()})
    elif isinstance(rec, Eval):
        if rec.val_loss is not None:
            out["val/loss"] = rec.val_loss
        out.update({f"metrics/eval/{k}": v for k, v in rec.metrics.items()})  # [eval] factory's
    else:
        out.update({f"metrics/{k}": v for k, v in rec.values.items()})
    return out


def sample_values(sample: dict[str, Any]) -> dict[str, float]:
    """A clean system sample (mt/contract/system.py) as tags: per-GPU load and memory, per-rank CPU and RSS."""
    out: dict[str, float] = {}
    for g in sample["gpus"]:
        for key in ("util_pct", "mem_used_bytes"):
            if g[key] is not None:
                out[f"gpu{g['index']}/{key}"] = float(g[key])
    for r in sample["ranks"]:
        for key in ("cpu_pct", "rss_bytes"):
            if r[key] is not None:
                out[f"rank{r['rank']}/{key}"] = float(r[key])
    return out


def incident_text(inc: IncidentLine) -> str:
    """One incidents.jsonl line as the markdown TensorBoard's text tab shows."""
    step = f" at step {inc.step}" if inc.step is not None else ""
    parts = [f"**[{inc.severity}] {inc.title}** ({inc.code}, {inc.status}{step})"]
    parts += [p for p in (inc.detail, inc.advice and f"Advice: {inc.advice}") if p]
    return "\n\n".join(parts)


def sample_text(rec: Sample) -> tuple[str, str]:
    """A generated sample as (tag, markdown): `samples/<index>`, the prompt in bold, then what the model wrote."""
    return f"samples/{rec.index}", f"**{_md(rec.prompt)}**{_md(rec.text)}"


def _md(text: str) -> str:
    """Text shown as it is in markdown: its special characters escaped, newlines kept as line breaks."""
    return "".join("\\" + ch if ch in "\\`*_{}[]<>()#+-.!|" else ch for ch in text).replace("\n", "  \n")
