"""A throw-away Slurm cluster on the namespace lab: munged, slurmctld on the first host, one slurmd per host.

Everything (keys, configuration, state, spool, logs, pid files) lives under ``<lab root>/slurm``;
daemons are stopped by the PIDs they wrote, checked against their command lines. Clients (sbatch,
squeue, scancel, fsdpctl) run in the lab's client namespace with ``SLURM_CONF`` set.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.testbed.lab import Lab, _is_ours, _wait_gone

DAEMONS = ("munged", "slurmctld", "slurmd", "mungekey", "sbatch")


def slurm_available() -> str | None:
    """None when the Slurm and munge programs are installed, else what is missing."""
    missing = [d for d in DAEMONS if not shutil.which(d) and not Path(f"/usr/sbin/{d}").exists()]
    return f"needs {' '.join(missing)} (apt-get install slurm-wlm munge)" if missing else None


def _wait_pidfile(path: Path, seconds: float = 15) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip().isdigit():
            pid = int(path.read_text())
            try:
                os.kill(pid, 0)
                return pid
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"no live pid in {path}")


class SlurmCluster:
    """munge + slurmctld + slurmd on the lab's hosts (started with ``up``, stopped with ``down``).
    The default partition ``debug`` has the ``default`` hosts (all when not given); ``spares`` has all."""

    def __init__(self, lab: Lab, names: list[str], default: list[str] | None = None, slurmd_setup: str = ""):
        """``slurmd_setup``: shell run in each slurmd's own mount namespace before it starts (each
        command ending in ``&&``), as ``Lab.start_sshd``'s ``setup`` (cgroups for a container runtime)."""
        self.lab, self.names, self.default = lab, names, default or names
        self.slurmd_setup = slurmd_setup
        self.dir = lab.root / "slurm"
        # munged wants every parent of its socket traversable by all; pytest's tmp root is 0700.
        self.munge = Path(tempfile.mkdtemp(prefix="fsdpctl-munge-"))
        self.conf = self.dir / "slurm.conf"
        self.socket = self.munge / "run" / "munge.socket.2"
        self.pids: dict[str, tuple[int, str]] = {}

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def client(self, argv: list[str]) -> list[str]:
        """A Slurm client command run from the lab's client namespace."""
        return self.lab.in_client(["env", f"SLURM_CONF={self.conf}", *argv])

    def up(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.down()
            raise
        return self

    def _start(self) -> None:
        for folder in (self.munge / "etc", self.munge / "run", self.munge / "log", self.munge / "lib",
                       self.dir / "state", self.dir / "run", self.dir / "log", *(self.dir / "spool" / n
                                                                                  for n in self.names)):
            folder.mkdir(parents=True, exist_ok=True)
        # munged refuses a socket directory others cannot traverse, and a key others can read.
        for folder in (self.munge, self.munge / "run"):
            folder.chmod(0o755)
        (self.munge / "etc").chmod(0o700)
        (self.munge / "lib").chmod(0o700)
        key = self.munge / "etc" / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o600)
        started = subprocess.run(["munged", f"--key-file={key}", f"--socket={self.socket}",
                                  f"--pid-file={self.munge / 'run' / 'munged.pid'}",
                                  f"--log-file={self.munge / 'log' / 'munged.log'}",
                                  f"--seed-file={self.munge / 'lib' / 'munged.seed'}"], capture_output=True, text=True)
        if started.returncode != 0:
            raise RuntimeError(f"munged did not start: {started.stderr.strip()}")
        self.pids["munged"] = (_wait_pidfile(self.munge / "run" / "munged.pid"), "munged")
        head = self.lab.hosts[self.names[0]]
        nodes = "".join(f"NodeName={n} NodeAddr={self.lab.hosts[n].address} CPUs=2 RealMemory=2000 State=UNKNOWN\n"
                        for n in self.names)
        self.conf.write_text(
            f"ClusterName=fsdpctl\nSlurmctldHost={head.name}({head.address})\nSlurmUser=root\nSlurmdUser=root\n"
            f"SlurmctldPort=6817\nSlurmdPort=6818\nAuthType=auth/munge\nCredType=cred/munge\n"
            f"AuthInfo=socket={self.socket},cred_expire=10\nStateSaveLocation={self.dir}/state\nSlurmdSpoolDir={self.dir}/spool/%n\n"
            f"SlurmctldPidFile={self.dir}/run/slurmctld.pid\nSlurmdPidFile={self.dir}/run/slurmd.%n.pid\n"
            f"SlurmctldLogFile={self.dir}/log/slurmctld.log\nSlurmdLogFile={self.dir}/log/slurmd.%n.log\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            f"JobAcctGatherType=jobacct_gather/none\nJobCompType=jobcomp/filetxt\nJobCompLoc={self.dir}/log/jobcomp.txt\n"
            "AccountingStorageType=accounting_storage/none\nSchedulerType=sched/backfill\n"
            # A requeued job may start again cred_expire seconds later (default 120); backfill
            # (every bf_interval s) is what starts it once that time has come.
            "SchedulerParameters=bf_interval=1\nSelectType=select/cons_tres\n"
            "SelectTypeParameters=CR_Core\nMpiDefault=none\nReturnToService=2\nSlurmctldTimeout=30\n"
            "SlurmdTimeout=30\nInactiveLimit=0\nKillWait=5\nMinJobAge=600\n"
            f"{nodes}PartitionName=debug Nodes={','.join(self.default)} Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=NO\n"
            "PartitionName=spares Nodes=ALL Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO\n")
        # Inside `ip netns exec` there is no /sys/fs/cgroup to detect: pin the v1 plugin (never used).
        (self.dir / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        self._in_host(head.name, ["slurmctld", "-f", str(self.conf)])
        self.pids["slurmctld"] = (_wait_pidfile(self.dir / "run" / "slurmctld.pid"), "slurmctld")
        for name in self.names:
            self.start_slurmd(name, wait=False)
        self.wait_idle()

    def start_slurmd(self, name: str, wait: bool = True) -> None:
        """Start the slurmd of host ``name`` (again, after ``kill_slurmd``); with ``wait``, until every
        node is idle (a node that comes back returns to service: ReturnToService=2)."""
        pidfile = self.dir / "run" / f"slurmd.{name}.pid"
        pidfile.unlink(missing_ok=True)
        self._in_host(name, ["slurmd", "-f", str(self.conf), "-N", name], self.slurmd_setup)
        self.pids[f"slurmd.{name}"] = (_wait_pidfile(pidfile), "slurmd")
        if wait:
            self.wait_idle()

    def kill_slurmd(self, name: str) -> None:
        """SIGKILL host ``name``'s slurmd, as when its node dies (the job steps it started go on)."""
        pid, marker = self.pids.pop(f"slurmd.{name}")
        if _is_ours(pid, marker):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 10)

    def wait_idle(self, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        states = ""
        while time.monotonic() < deadline:
            done = subprocess.run(self.client(["sinfo", "-h", "-o", "%T"]), capture_output=True, text=True)
            states = " ".join(sorted(set(done.stdout.split())))
            if states == "idle":
                return
            time.sleep(0.3)
        raise RuntimeError(f"Slurm nodes did not become idle (sinfo says {states!r})")

    def _in_host(self, name: str, argv: list[str], setup: str = "") -> None:
        ns = self.lab.hosts[name].namespace
        private = ["--mount"] if setup else []
        subprocess.run(["ip", "netns", "exec", ns, "unshare", "--uts", *private, "sh", "-c",
                        f'hostname "$0" && {setup}exec "$@"', name, "env", f"SLURM_CONF={self.conf}", *argv],
                       check=True, capture_output=True, timeout=30)

    def down(self) -> None:
        if self.conf.exists():
            subprocess.run(self.client(["scancel", "--full", "-u", "root"]), capture_output=True, timeout=30)
            time.sleep(0.5)
        for pid, marker in reversed(list(self.pids.values())):
            if _is_ours(pid, marker):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                _wait_gone(pid, 10)
        self.pids.clear()
        shutil.rmtree(self.munge, ignore_errors=True)
