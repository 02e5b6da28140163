"""`mt doctor`: check torch, CUDA/NCCL, NVML and a 2-process gloo group, one line per finding.

torch is only imported in a child process, so the CLI itself stays torch-free.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from tui.format.fmt import fmt_gib

# Runs in a child `python -c`: torch facts, then a real 2-process gloo all_reduce (fork, so the
# worker function needs no importable module).
_PROBE = r"""
import json, socket, sys
out = {}
try:
    import torch, torch.distributed as dist, torch.multiprocessing as mp
except Exception as e:
    print(json.dumps({"torch_error": f"{type(e).__name__}: {e}"})); sys.exit(0)
out["torch_version"] = torch.__version__
out["cuda_build"] = torch.version.cuda
out["cuda_available"] = torch.cuda.is_available()
out["cuda_devices"] = torch.cuda.device_count() if out["cuda_available"] else 0
out["nccl_available"] = dist.is_nccl_available()
out["gloo_available"] = dist.is_gloo_available()
def work(rank, port, q):
    try:
        import datetime
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2, timeout=datetime.timedelta(seconds=30))
        t = torch.ones(1) * (rank + 1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        q.put((rank, float(t.item()), None))
    except Exception as e:
        q.put((rank, None, f"{type(e).__name__}: {e}"))
try:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=work, args=(r, port, q)) for r in range(2)]
    for p in ps: p.start()
    res = [q.get(timeout=60) for _ in ps]
    for p in ps: p.join(10)
    errs = [e for _, _, e in res if e]
    out["gloo_error"] = errs[0] if errs else (None if all(v == 3.0 for _, v, _ in res) else f"all_reduce gave {res}")
except Exception as e:
    out["gloo_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@dataclass
class Check:
    """One `mt doctor` check and its line: ok, or a problem with what it means (not a diagnosed Incident)."""

    ok: bool
    text: str

    def line(self) -> str:
        return f"{'ok ' if self.ok else 'FAIL'}  {self.text}"


def torch_checks(timeout: float = 120.0) -> list[Check]:
    """Facts about torch, CUDA, NCCL and gloo, read in a child process."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [Check(False, f"torch probe did not finish within {timeout:.0f} s")]
    try:
        r = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [Check(False, f"torch probe failed: {(proc.stderr or proc.stdout).strip()[-300:]}")]
    if "torch_error" in r:
        return [Check(False, f"torch cannot be imported: {r['torch_error']}")]
    cuda = r["cuda_build"] or "none (CPU-only build)"
    found = [Check(True, f"torch {r['torch_version']}, CUDA build {cuda}")]
    if r["cuda_available"]:
        found.append(Check(True, f"CUDA available: {r['cuda_devices']} device(s)"))
    else:
        found.append(Check(not r["cuda_build"], "CUDA not available" + (
            " (CPU build; device = \"cpu\" runs work)" if not r["cuda_build"]
            else ": the CUDA build finds no usable GPU (driver? CUDA_VISIBLE_DEVICES?)")))
    found.append(Check(r["nccl_available"] or not r["cuda_available"],
                         "NCCL available" if r["nccl_available"] else "NCCL not available (gloo will be used)"))
    if not r["gloo_available"]:
        found.append(Check(False, "gloo backend not built into this torch: CPU DDP cannot run"))
    elif r.get("gloo_error"):
        found.append(Check(False, f"a 2-process gloo group could not start: {r['gloo_error']}"))
    else:
        found.append(Check(True, "a 2-process gloo group starts and all_reduce works"))
    return found


def nvml_checks() -> list[Check]:
    """GPUs as NVML sees them (what the dashboard's GPU panel will show)."""
    from tui.read.gpus import GpuReader

    gpus = GpuReader()
    try:
        if not gpus.ok:
            return [Check(True, f"NVML not available ({gpus.error}): no GPU readings; CPU sampling only")]
        seen = gpus.read()
        if not seen:
            return [Check(True, "NVML works but sees no GPU")]
        return [Check(True, f"GPU {g['index']}: {g['name']}, {fmt_gib(g['mem_total_bytes'] or 0)} GiB") for g in seen]
    finally:
        gpus.close()


def run_doctor() -> list[Check]:
    """Every check, in order."""
    return torch_checks() + nvml_checks()
