"""A plain training loop that keeps its own ground truth of where its time went (TRUTH, a folder):
rank 0 appends one JSON line per interval it injected, on its own clock, never through fsdpctl.

Injected: a DCP save of a known blocking length every 15 steps (the storage writer waits SAVE_S
before it finishes), a data loader that sleeps DATA_S on every 10th batch, rank 1 slowed by SLOW_S
per step for steps 20-27 (rank 0 waits for it in the all-reduce), on the first attempt rank 1
killed (SIGKILL) at step KILL_AT (11 steps after the save at step 30) after a pause (the launcher
runs the next attempt on a spare in its node's place), a load of the newest checkpoint there, and an
idle tail of TAIL_S after the last step.

    python goodput_truth.py TRUTH
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.utils.data import DataLoader, Dataset

STEPS, SAVE_EVERY, KILL_AT = 48, 15, 41
SAVE_S, DATA_S, SLOW_S, TAIL_S, STEP_S = 1.5, 0.6, 0.25, 3.0, 0.08
SLOW_STEPS = range(20, 28)

truth_dir = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = int(os.environ.get("FSDPCTL_ATTEMPT", "1"))
run_dir = os.environ["FSDPCTL_RUN_DIR"]
checkpoints = os.path.join(truth_dir, "checkpoints")


def truth(kind, began, ended, every_rank=False, **fields):
    if rank == 0 or every_rank:
        with open(os.path.join(truth_dir, "truth.jsonl"), "a") as out:
            out.write(json.dumps({"kind": kind, "began": began, "end": ended, "attempt": attempt, **fields}) + "\n")


class SlowWriter(FileSystemWriter):
    """Finishes SAVE_S late: every rank waits for the coordinator's finish before the save returns."""

    def finish(self, metadata, results):
        time.sleep(SAVE_S)
        return super().finish(metadata, results)


class Batches(Dataset):
    """Every 10th batch (of 4) DATA_S late: the loader's wait is the step's data wait."""

    def __len__(self):
        return 10_000

    def __getitem__(self, index):
        if index % 40 == 36:
            began = time.time()
            time.sleep(DATA_S)
            truth("data_wait", began, time.time())
        return torch.full((8,), float(index % 7))


model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
saved = sorted(int(name) for name in os.listdir(checkpoints)) if os.path.isdir(checkpoints) else []
if saved:
    began = time.time()
    state = {"model": model.state_dict(), "step": 0}
    dcp.load(state, checkpoint_id=os.path.join(checkpoints, str(saved[-1])))
    model.load_state_dict(state["model"])
    step = int(state["step"])
    truth("checkpoint_load", began, time.time(), step=step)
for batch in DataLoader(Batches(), batch_size=4):
    if step >= STEPS:
        break
    step += 1
    step_began = time.time()
    loss = model(batch).pow(2).mean()
    loss.backward()
    time.sleep(STEP_S)  # the step's compute
    if rank == 1 and step in SLOW_STEPS:
        time.sleep(SLOW_S)
    if rank == 0 and step in SLOW_STEPS:
        began = time.time()
    for param in model.parameters():
        dist.all_reduce(param.grad)
    if rank == 0 and step in SLOW_STEPS:
        truth("slowed_wait", began, time.time(), step=step)
    optimizer.step()
    optimizer.zero_grad()
    truth("step", step_began, time.time(), step=step)
    if step % SAVE_EVERY == 0:
        began = time.time()
        dcp.save({"model": model.state_dict(), "step": step},
                 storage_writer=SlowWriter(os.path.join(checkpoints, str(step))))
        truth("checkpoint_save", began, time.time(), step=step)
    if attempt == 1 and step == KILL_AT:
        time.sleep(2.5)  # every rank's telemetry writes its window up to here
        if rank == 1:
            truth("killed", time.time(), time.time(), every_rank=True, step=step, last_saved=step - step % SAVE_EVERY)
            os.kill(os.getpid(), signal.SIGKILL)
began = time.time()
time.sleep(TAIL_S)
truth("tail", began, time.time())
dist.destroy_process_group()
