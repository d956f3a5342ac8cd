"""Every rank prints the same 1,000 lines, as progress lines and warnings printed on every rank do, then
one line of its own.

    torchrun --nproc-per-node 2 same_lines.py
"""

import os
import sys

rank = os.environ.get("RANK", "0")
for i in range(1000):
    sys.stdout.write(f"loading shard {i} of 1000\n")
sys.stdout.write(f"rank {rank} has its own say\n")
sys.stdout.flush()
