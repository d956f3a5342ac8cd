"""No default limit a 256-node profile trips: nodes spoken to at once, open descriptors."""

from __future__ import annotations

import subprocess
import sys

from fsdpctl.backends.transport import FAN_OUT, fan_out
from tests.conftest import REPO


def test_every_node_of_a_256_node_run_is_spoken_to_at_once():
    assert fan_out(256) == 256 and fan_out(0) == 1 and fan_out(10_000) == FAN_OUT >= 1024


def test_the_soft_descriptor_limit_is_raised_for_a_big_run_and_never_lowered():
    code = ("import resource\nfrom fsdpctl.backends.transport import raise_open_files\n"
            "raise_open_files(256)\nprint(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
            "raise_open_files(2)\nprint(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    result = subprocess.run(["bash", "-c", f'ulimit -Sn 1024 && exec "{sys.executable}" -c "$0"', code],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    raised, kept = (int(x) for x in result.stdout.split())
    hard = int(subprocess.run(["bash", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout.strip()
               .replace("unlimited", str(10**9)))
    assert raised == min(hard, 256 + 8 * 256) and kept == raised


def test_the_port_window_and_the_probes_time_grow_with_the_nodes():
    from fsdpctl.hostcheck.checks import PORT_WINDOW_SECONDS, port_window, probe_budget

    assert port_window(2) == PORT_WINDOW_SECONDS + 0.2 and port_window(256) > 30
    assert probe_budget(20, 2, False) == 21 and probe_budget(60, 2, False) == 60
    assert probe_budget(20, 100, True) == 70 and probe_budget(20, 10, True) == 25  # the launcher's share
    assert probe_budget(20, 256, True) == 148  # the launcher's share at 256 nodes
