"""Verdicts on a host's container facts (the probe's container part): the runtime there and answering,
the image there, the probe inside it, and InfiniBand reachable from inside when the profile uses it.
The image's digest across hosts is a parity row (``hostcheck.checks``)."""

from __future__ import annotations

from typing import Any

from ..hostcheck.checks import Check
from .runtime import short_digest

_INSTALL = {"docker": "install Docker and the NVIDIA container toolkit there",
            "podman": "install Podman there (and nvidia-container-toolkit's CDI spec for GPUs)",
            "apptainer": "install Apptainer there (or load its module in the host's shell rc)"}


def container_checks(found: dict[str, Any], ib: bool) -> list[Check]:
    """The container checks of one host; ``ib``: the profile uses InfiniBand."""
    runtime, image = found.get("runtime", "?"), found.get("image", "?")
    if found.get("error") == "not-installed" and runtime == "pyxis":
        return [Check("container-runtime", "fail", "enroot (which Pyxis runs) is not installed on this node",
                      "ask the cluster's administrator for Pyxis and enroot, or set container.runtime: apptainer")]
    if found.get("error") == "not-installed":
        return [Check("container-runtime", "fail", f"{runtime} is not installed on this host (not on PATH)",
                      f"{_INSTALL.get(runtime, 'install it there')}, or set container.runtime to one it has")]
    if found.get("error") == "not-usable":
        return [Check("container-runtime", "fail", f"{runtime} does not answer: {found.get('detail')}",
                      "start its service (systemctl start docker), or give this user access (the docker group)")]
    version = ("enroot " if runtime == "pyxis" else "") + (found.get("version") or runtime)
    checks = [Check("container-runtime", "pass", f"{version} at {found.get('path')}")]
    state = found.get("image_state")
    if state == "missing":
        why = f"pull failed: {found['pull_error']}" if found.get("pull_error") else \
            f"not pulled (container.pull: never): {found.get('image_error') or 'no such image'}" \
            if "pulled" not in found else "not found after the pull"
        checks.append(Check("container-image", "fail", f"{image} is not on this host; {why}",
                            f"`{runtime} pull {image}` there (or load it), or set container.pull: missing"))
        return checks
    pulled = " (pulled now)" if found.get("pulled") else ""
    if state == "remote":
        checks.append(Check("container-image", "pass", f"{image}: fetched by {runtime} as it starts{pulled}"))
    else:
        checks.append(Check("container-image", "pass", f"{image} {short_digest(found.get('digest'))}{pulled}"))
    if runtime == "pyxis":
        return checks + [Check("container-probe", "warn", "Pyxis starts the image with each step: doctor probed "
                               "this node's own Python, not the image's", "run a short job with --container to try it")]
    inside = found.get("inside") or {}
    if not inside.get("python"):
        checks.append(Check("container-probe", "fail",
                            f"the probe could not run inside {image}: {inside.get('error') or 'no answer'}",
                            "set python: to the image's Python (e.g. /usr/bin/python3 or /opt/venv/bin/python), "
                            f"and try `{runtime} run --rm {image} python3 -V` there"))
        return checks
    version = inside["python"].get("version")
    checks.append(Check("container-probe", "pass", f"probed inside the image: python {version}"))
    if ib:
        missing = [what for what, there in (("/dev/infiniband is not visible inside", inside.get("ib_devices")),
                                            ("the image has no libibverbs", inside.get("libibverbs"))) if not there]
        if missing:
            checks.append(Check("container-ib", "fail",
                                f"{' and '.join(missing)}: NCCL would fall back to sockets (tens of times slower)",
                                "give the container the host's /dev/infiniband (fsdpctl does where the host has "
                                "it), use an image with rdma-core (libibverbs), or set network.ib: false"))
        else:
            checks.append(Check("container-ib", "pass", "/dev/infiniband and libibverbs inside the image"))
    return checks
