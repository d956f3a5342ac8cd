"""A learning-rate sweep through fsdpctl's Python API: three runs of the bundled GPT launched at once
(detached), each waited on, their final losses compared.

    python examples/sweep.py                      # on this machine (the `local` profile)
    python examples/sweep.py -p two-node --steps 200
"""

from __future__ import annotations

import argparse

import fsdpctl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--profile", default="local", help="cluster profile (name or .yaml path)")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    args = parser.parse_args()

    rates = [3e-4, 1e-3, 3e-3]
    # detach=True: each call returns once its run has started; the three train side by side.
    runs = {lr: fsdpctl.launch(args.profile, detach=True, preset="tiny", steps=args.steps, lr=lr, log_interval=5)
            for lr in rates}
    final = {}
    for lr, run in runs.items():
        outcome = run.wait()  # follows the run to its end (its lines are not printed here)
        metrics = run.status().last_metrics or {}
        final[lr] = metrics.get("loss")
        detail = f"final loss {final[lr]:.4f}" if final[lr] is not None else "no loss logged"
        if outcome.first_failure is not None:
            detail = outcome.first_failure.describe()
        print(f"lr={lr:g}: {outcome.state} (exit {outcome.exit_code}), {detail}, run {run.run_id}")
    finished = {lr: loss for lr, loss in final.items() if loss is not None}
    if finished:
        best = min(finished, key=finished.get)
        print(f"best: lr={best:g} (loss {finished[best]:.4f})")


if __name__ == "__main__":
    main()
