"""A training loop with no torch at all, reporting to mt: the library alone, fast.

It steps until `mt stop` (or --steps), saves a "checkpoint" file whenever asked (and every
--save-every steps, keeping the newest --keep), and logs a val loss.
"""
import argparse
import json
import sys
import time

import mt

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2000)
p.add_argument("--sleep", type=float, default=0.02)
p.add_argument("--runs-dir", default="runs")
p.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only when asked)")
p.add_argument("--keep", type=int, default=0, help="delete all but the newest K saves, as keep_last does (0: keep all)")
args = p.parse_args()

assert "engine" not in sys.modules and "tui" not in sys.modules, "mt imported a module named engine or tui"
run = mt.init(config=vars(args), runs_dir=args.runs_dir)
print(f"run dir: {run.dir}", flush=True)
start = 0
if run.resume_from:
    start = json.loads(run.resume_from.read_text())["step"]
for step in range(start + 1, args.steps + 1):
    ctl = run.step(step, loss=1.0 / step, lr=1e-3, grad_norm=0.5, tokens=64, accuracy=step / args.steps)
    if step % 10 == 0:
        run.log({"val_loss": 2.0 / step}, step=step)
    if ctl.checkpoint or ctl.stop or (args.save_every and step % args.save_every == 0):
        path = run.dir / f"ckpt-{step}.json"
        path.write_text(json.dumps({"step": step}))
        run.checkpoint_saved(path, step)
        if args.keep:
            for old in sorted(run.dir.glob("ckpt-*.json"), key=lambda f: int(f.stem[5:]))[:-args.keep]:
                old.unlink()
    if ctl.stop:
        break
    time.sleep(args.sleep)
run.finish()
