"""A real Prometheus reading a textfile folder: Debian's node_exporter (textfile collector only) on it and a
Prometheus server scraping that node_exporter every second, both on free ports of 127.0.0.1, stopped by PID."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
PROMETHEUS = "/usr/bin/prometheus"
APT = "apt-get install prometheus prometheus-node-exporter"


def require_prometheus() -> None:
    """Skip (fail in CI, where ``.ci/run`` installs them) when Debian's binaries are not here."""
    missing = [path for path in (NODE_EXPORTER, PROMETHEUS) if not shutil.which(path)]
    if missing:
        reason = f"needs {' and '.join(missing)} ({APT})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"the Prometheus test must run in CI, but it {reason}")
        pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - loopback, a URL built here
        return answer.read()


class Scraper:
    """node_exporter on ``textfile_dir`` and a Prometheus scraping it every second."""

    def __init__(self, root: Path) -> None:
        self.textfile_dir = root / "textfile"
        self.textfile_dir.mkdir(parents=True)
        self.processes: list[subprocess.Popen] = []
        self.logs = root / "logs"
        self.logs.mkdir()
        exporter_port, self.port = free_port(), free_port()
        self._start("node_exporter", [NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
                                      f"--collector.textfile.directory={self.textfile_dir}",
                                      f"--web.listen-address=127.0.0.1:{exporter_port}"])
        config = root / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                          f"  - job_name: fsdpctl\n    static_configs:\n"
                          f"      - targets: ['127.0.0.1:{exporter_port}']\n")
        self._start("prometheus", [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={root / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{self.port}"])
        self._wait_until(lambda: get(f"http://127.0.0.1:{exporter_port}/metrics"), "node_exporter's /metrics")
        self._wait_until(lambda: get(f"http://127.0.0.1:{self.port}/-/ready"), "Prometheus ready")

    def _start(self, name: str, argv: list[str]) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        self.processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.logs))
        log.close()

    def _wait_until(self, probe, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for process in self.processes:
                if process.poll() is not None:
                    self.stop()
                    raise AssertionError(f"{process.args[0]} exited ({process.returncode}):\n{self.said()}")
            try:
                probe()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"no {what} in {timeout:g} s:\n{self.said()}") from None
                time.sleep(0.2)

    def said(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs.glob("*.log"))

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector Prometheus' HTTP API (``/api/v1/query``) answers for ``expr`` now."""
        answer = json.loads(get(f"http://127.0.0.1:{self.port}/api/v1/query?"
                                + urllib.parse.urlencode({"query": expr})))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def wait_for(self, expr: str, test, what: str, timeout: float = 60) -> list[dict[str, Any]]:
        """The answer to ``expr`` once ``test(answer)`` holds (each scrape is a second apart)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result and test(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus never answered {what} to {expr}; last: {result}\n{self.said()}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Both servers stopped by their PIDs (SIGTERM, then SIGKILL after 10 s)."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def value(sample: dict[str, Any]) -> float:
    """An instant vector sample's value (Prometheus gives ``[time, "text"]``)."""
    return float(sample["value"][1])
