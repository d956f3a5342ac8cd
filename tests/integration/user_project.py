"""A user's own training project, written by the tests: a package of two modules, an FSDP2 training
script on gloo, a requirements.txt, and a data folder that git ignores.

The script records on every rank what it received (argv, working folder, host, environment) under
``$FSDPCTL_RUN_DIR/out/``, prints ``user step=S loss=L`` on rank 0, and reads a few knobs from its
environment: ``STEPS``, ``STEP_SLEEP``, ``FAIL_RANK`` (that rank exits 3 after the first step),
``PRINT_SECRET`` (rank 0 prints ``USER_SECRET``, which every rank records as a SHA-256 only),
``HANG_RANK`` (after step 2 that rank waits in ``wait_for_a_lock_that_never_frees`` while the others
enter the next step's collectives), ``SEGV_RANK`` (after step 1 that rank reads address 0 in
``read_a_null_pointer``), ``DUMP_FLIGHT_RECORDER`` (after step 1 every rank writes its flight recorder
where torch's NCCL watchdog writes it when a collective times out).
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

MODEL = '''\
import torch


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x
'''

TRAIN = '''\
import hashlib
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from proj.model import TinyNet


def wait_for_a_lock_that_never_frees():
    time.sleep(3600)


def read_a_null_pointer():
    import ctypes

    return ctypes.string_at(0)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = os.path.join(os.environ["FSDPCTL_RUN_DIR"], "out")
    os.makedirs(out, exist_ok=True)
    secret = os.environ.get("USER_SECRET")
    record = {"argv": sys.argv[1:], "cwd": os.getcwd(), "host": socket.gethostname(), "world": world,
              "local_rank": int(os.environ["LOCAL_RANK"]), "local_world": int(os.environ["LOCAL_WORLD_SIZE"]),
              "run_id": os.environ.get("FSDPCTL_RUN_ID"), "extra": os.environ.get("EXTRA"),
              "secret_sha256": hashlib.sha256(secret.encode()).hexdigest() if secret is not None else None}
    with open(os.path.join(out, "rank%d.json" % rank), "w") as handle:
        json.dump(record, handle)
    with open(os.path.join(out, "attempts.log"), "a") as handle:  # one line per rank and attempt
        handle.write("rank=%d attempt=%s run_dir=%s\\n" % (rank, os.environ.get("FSDPCTL_ATTEMPT"),
                                                         os.environ["FSDPCTL_RUN_DIR"]))
    if os.environ.get("PRINT_SECRET") and rank == 0:
        print("the secret is: %s" % secret, flush=True)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = TinyNet()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1, int(os.environ.get("STEPS", "4")) + 1):
        loss = model(torch.randn(8, 16)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print("user step=%d loss=%.4f" % (step, loss.item()), flush=True)
        if os.environ.get("DUMP_FLIGHT_RECORDER") and step == 1:  # as torch's NCCL watchdog does on a timeout
            import torch._C._distributed_c10d as c10d

            folder = os.path.join(os.environ["FSDPCTL_RUN_DIR"], "flight", "on-timeout")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "rank_%d" % rank), "wb") as handle:
                handle.write(c10d._dump_fr_trace())
        if os.environ.get("FAIL_RANK") == str(rank):
            print("rank %d failing on purpose" % rank, flush=True)
            os._exit(3)  # at once: gloo's threads can abort a normal interpreter exit (134)
        if os.environ.get("HANG_RANK") == str(rank) and step == 2:
            wait_for_a_lock_that_never_frees()
        if os.environ.get("SEGV_RANK") == str(rank):
            read_a_null_pointer()
        time.sleep(float(os.environ.get("STEP_SLEEP", "0")))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's interpreter shutdown can abort after all work is done


if __name__ == "__main__":
    main()
'''


def write_project(root: Path, git: bool = True) -> Path:
    """The project folder (a git work tree with one commit, unless ``git`` is False)."""
    (root / "proj").mkdir(parents=True)
    (root / "proj" / "__init__.py").write_text("")
    (root / "proj" / "model.py").write_text(MODEL)
    (root / "proj" / "train.py").write_text(TRAIN)
    (root / "train.py").write_text("from proj.train import main\n\nmain()\n")
    (root / "requirements.txt").write_text("numpy  # the script's data tools\ntorch>=2.6\n")
    (root / ".gitignore").write_text("data/\n")
    (root / "data").mkdir()
    (root / "data" / "shard-0.bin").write_bytes(b"\0" * 200_000)
    if git:
        for argv in (["git", "init", "-q"], ["git", "add", "-A"],
                     ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "start"]):
            subprocess.run(argv, cwd=root, check=True, capture_output=True, timeout=60)
    else:
        (root / ".fsdpctlignore").write_text(textwrap.dedent("""\
            # like .gitignore
            data/
            """))
    return root
