"""Build the one command that probes a node, and read its answer from between the sentinels.

The probe's JSON travels between sentinel lines, so a chatty ``.bashrc`` or a motd printed around
it cannot corrupt what is parsed.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ..plan.types import ContainerPlan
from ..shell import command_line
from .probe_script import BEGIN, END


@functools.lru_cache(maxsize=1)
def probe_source() -> str:
    """The probe program's source, sent to the node with ``python -c``: the probe's functions, the
    rendezvous-port check (``port_probe``), init's
    discovery functions (``discover_script``), the hardware checks (``fsdpctl.node.health_probe``,
    also run by the GPU watcher beside the ranks), the container part (``fsdpctl.container.probe_part``),
    then the probe's main guard."""
    here = Path(__file__).resolve().parent
    probe, guard, main = (here / "probe_script.py").read_text(encoding="utf-8").rpartition(
        '\nif __name__ == "__main__":')
    if not guard:
        raise AssertionError("the probe script lost its main guard")
    discover = (here / "discover_script.py").read_text(encoding="utf-8")
    ports = (here / "port_probe.py").read_text(encoding="utf-8")
    health = (here.parent / "node" / "health_probe.py").read_text(encoding="utf-8")
    inside = (here.parent / "container" / "probe_part.py").read_text(encoding="utf-8")
    return probe + "\n\n" + ports + "\n\n" + discover + "\n\n" + health + "\n\n" + inside + "\n" + guard + main


PORT_ROUND_MAIN = f"""
if __name__ == "__main__":
    import json, sys

    def say(text):
        sys.stdout.write(text + "\\n")
        sys.stdout.flush()

    line = sys.stdin.readline()
    if line.startswith(PORT_WORD + " "):
        found = answer_port(json.loads(line[len(PORT_WORD) + 1:]), sys.stdin.readline, say)
        say({BEGIN!r}); say(json.dumps(found)); say({END!r})
"""


@functools.lru_cache(maxsize=1)
def port_round_source() -> str:
    """The rendezvous-port check alone (``port_probe``, standard library only), for the round that
    checks the port again once every probe has answered (``fanout.recheck_ports``)."""
    return (Path(__file__).resolve().parent / "port_probe.py").read_text(encoding="utf-8") + PORT_ROUND_MAIN


def port_round_command(python: str) -> str:
    """The shell command line that runs a node's part of a port round alone (doctor's; a launch asks
    the node agents it already has): it reads the request (``port_probe.port_round_request``) on stdin."""
    return command_line(python, ["-c", port_round_source()])


def probe_command(python: str, args: dict[str, Any]) -> str:
    """The shell command line that runs the probe with the node's ``python``."""
    return command_line(python, ["-c", probe_source(), json.dumps(args, sort_keys=True)])


class ProbeOutputError(ValueError):
    """The probe ran but its answer could not be found or read."""


def parse_probe_output(stdout: str) -> dict[str, Any]:
    """The facts dict from the probe's stdout (anything outside the sentinels is ignored)."""
    start = stdout.rfind(BEGIN)
    end = stdout.find(END, start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        raise ProbeOutputError("no probe answer in the output")
    try:
        facts = json.loads(stdout[start + len(BEGIN):end].strip())
    except json.JSONDecodeError as exc:
        raise ProbeOutputError(f"the probe answer is not JSON ({exc.msg})") from None
    if not isinstance(facts, dict):
        raise ProbeOutputError("the probe answer is not a JSON object")
    return facts


def container_probe_args(container: ContainerPlan, python: str) -> dict[str, Any]:
    """What the probe's container part is asked (``container.runtime.probe_spec``), with the probe's own
    source to run inside the image."""
    from ..container.runtime import probe_spec

    return probe_spec(container, python, packed_probe_source())


@functools.lru_cache(maxsize=1)
def packed_probe_source() -> str:
    """The probe's source, zlib-compressed and base64 (under half its size): how a probe hands itself
    to another Python (the image's, or one ``init`` tries), within one command line's limits."""
    import base64
    import zlib

    return base64.b64encode(zlib.compress(probe_source().encode("utf-8"), 9)).decode("ascii")
