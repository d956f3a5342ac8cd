"""Watching runs as they go, on a namespace testbed of its own: three hosts (w1 and w2 run, w3 is the
spare), each with a fake nvidia-smi (two GPUs, sampled every second) and its sshd pinned to a core.

``fsdpctl top`` runs in tmux (send-keys, capture-pane) on a live two-node run of the bundled workload:
both nodes and the step rising, a rank held off the CPU named the straggler, w2's GPU reporting a HW
slowdown shown on w2's line, w2's link cut and the spare's replacement shown, ``q`` leaving the run
running; the TensorBoard and Prometheus exports read back with TensorBoard's own reader and
prometheus_client's parser, and the textfile scraped by a real Prometheus (through Debian's node_exporter)
whose HTTP API answers w2's slowed GPU by host and gpu, and the step and rank 1's compute time rising.
``watch()`` on a detached run, a finished one and one whose launcher was SIGKILLed.
A Slurm job watched with ``top`` too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fsdpctl
from fsdpctl.live import layout
from fsdpctl.metrics.rows import read_rows
from tests.conftest import REPO
from tests.integration.conftest import require_netns
from tests.integration.test_launch import fsdpctl as fsdpctl_argv
from tests.integration.test_launch import processes_of, run, run_dir_of, start, wait_for_line
from tests.integration.test_spares import Cut
from tests.testbed import fake_gpu
from tests.testbed.lab import Lab
from tests.testbed.prometheus import Scraper, require_prometheus, value
from tests.testbed.throttle import Throttle

pytestmark = pytest.mark.integration

STEPS = 140
"""The live run's steps: enough to outlast the Prometheus textfile's 15 s writes and the scrapes that
follow them while the straggler and the slowed GPU are checked, on a loaded machine."""
HOSTS = ("w1", "w2", "w3")
SLOWED = {"clocks.sm": 1095, "clocks_event_reasons.hw_slowdown": "Active",
          "clocks_event_reasons.gpu_idle": "Not Active"}
USER_PROGRAM = """\
import json, os, sys, time
rank, run_dir = int(os.environ["RANK"]), os.environ["FSDPCTL_RUN_DIR"]
steps = int(sys.argv[1])
for step in range(1, steps + 1):
    time.sleep(0.25)
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as out:
        out.write(json.dumps({"step": step, "rank": rank, "loss": 4.0 / step, "step_time_s": 0.25}) + "\\n")
    print(f"step={step} loss={4.0 / step:.4f}", flush=True)
"""


@pytest.fixture(scope="module")
def live_lab(tmp_path_factory):
    require_netns()
    if not shutil.which("tmux"):
        pytest.fail("the live-view tests need tmux (.ci/run installs it)") if os.environ.get("CI") == "true" \
            else pytest.skip("needs tmux")
    lab = Lab(tmp_path_factory.mktemp("livelab"), list(HOSTS)).up()
    try:
        for index, name in enumerate(HOSTS):
            scenario = lab.hosts[name].dir / "gpu.json"
            bin_dir = fake_gpu.install(lab.hosts[name].dir / "bin", scenario)
            healthy(lab, name)
            lab.start_sshd(name, f"SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin\n",
                           setup=f"taskset -p -c {index % 2} $$ >/dev/null && ")
        yield lab
    finally:
        lab.down()


@pytest.fixture(scope="module")
def scraper(tmp_path_factory):
    """node_exporter on a textfile folder and Prometheus scraping it every second."""
    require_prometheus()
    scraper = Scraper(tmp_path_factory.mktemp("prometheus"))
    try:
        yield scraper
    finally:
        scraper.stop()


def healthy(lab: Lab, name: str, **gpu0: object) -> None:
    fake_gpu.write_scenario(lab.hosts[name].dir / "gpu.json",
                            [fake_gpu.gpu(0x18, **{"clocks.sm": 1980, "utilization.gpu": 97, **gpu0}),
                             fake_gpu.gpu(0x19, **{"clocks.sm": 1980, "utilization.gpu": 97})])


def profile(lab: Lab, tmp_path: Path, *, spares: bool = False, extra: str = "", name: str = "live") -> Path:
    spare = f"spares:\n  - host: {lab.hosts['w3'].address}\n    port: 22\n" if spares else ""
    path = tmp_path / f"{name}.yaml"
    path.write_text(lab.profile_yaml(["w1", "w2"], python=sys.executable, name=name,
                                     extra="health:\n  sample_seconds: 1\nnode_timeout: 8\n") + spare + extra)
    return path


class Tmux:
    """A terminal of its own (a private tmux server) running one command."""

    def __init__(self, tmp_path: Path, argv: list[str], env: dict[str, str], width: int = 100, height: int = 32):
        self.socket = f"fsdpctl-live-{os.getpid()}-{time.monotonic_ns()}"
        words = ["env", *(f"{k}={v}" for k, v in env.items() if k in ("HOME", "FSDPCTL_RUNS_DIR", "PYTHONPATH",
                                                                      "PATH", "SLURM_CONF", "TERM")), *argv]
        subprocess.run(["tmux", "-L", self.socket, "new-session", "-d", "-s", "top", "-x", str(width), "-y",
                        str(height), "-c", str(tmp_path), subprocess.list2cmdline(words) + "; sleep 600"],
                       check=True, timeout=30, env={**os.environ, "TERM": "xterm-256color"})

    def screen(self) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, "capture-pane", "-p", "-t", "top"], capture_output=True,
                              text=True, timeout=30)
        return done.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "-L", self.socket, "send-keys", "-t", "top", *keys], check=True, timeout=30)

    def wait(self, test, what: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        shown = ""
        while time.monotonic() < deadline:
            shown = self.screen()
            if test(shown):
                return shown
            time.sleep(0.3)
        raise AssertionError(f"the screen never showed {what}; it showed:\n{shown}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def step_on(screen: str) -> int:
    match = re.search(r"step ([\d,]+)/", screen)
    return int(match.group(1).replace(",", "")) if match else -1


def node_line(screen: str, host: str) -> list[str]:
    """The node table's line for ``host`` and the line under it (where a slowed GPU is named)."""
    lines = screen.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"\s+\d+ {re.escape(host)}", line):
            return lines[i:i + 2]
    return []


def test_top_follows_a_two_node_run_names_the_straggler_and_the_slowed_gpu_and_shows_the_spare(live_lab, scraper,
                                                                                            tmp_path):
    lab = live_lab
    w1, w2, w3 = (lab.hosts[n].address for n in HOSTS)
    tb, prom = tmp_path / "tb", scraper.textfile_dir  # node_exporter's textfile folder
    train = (f"train:\n  preset: tiny\n  steps: {STEPS}\n  batch_size: 8\n  seq_len: 128\n  log_interval: 1\n"
             "  eval_interval: 0\n  vocab_size: 2000\n  checkpoint_interval: 10\n")
    path = profile(lab, tmp_path, spares=True, extra=train + f"export:\n  tensorboard: {tb}\n  prometheus: {prom}\n")
    launcher = start(lab, tmp_path, "launch", "-p", str(path), "--max-restarts", "1")
    run_dir = run_dir_of(tmp_path)
    argv, env = fsdpctl_argv(lab, tmp_path, "top", run_dir.name)
    view = Tmux(tmp_path, argv, env)
    throttle = None
    try:
        first = view.wait(lambda s: node_line(s, w1) and node_line(s, w2) and step_on(s) > 0, "both nodes stepping")
        view.wait(lambda s: step_on(s) > step_on(first), "the step count rising")
        assert "2x 97% 1980/1980MHz" in node_line(first, w1)[0], first  # the fake GPUs' own clocks
        this_run = f'run="{run_dir.name}"'
        computed = scraper.wait_for(f"fsdpctl_rank_compute_seconds{{{this_run}}}", lambda r: len(r) == 2,
                                    "both ranks' compute time")
        compute_before = {s["metric"]["rank"]: value(s) for s in computed}
        step_before = value(scraper.wait_for(f"fsdpctl_step{{{this_run}}}", lambda r: True, "the step")[0])
        # rank 1 (on w2: c10d orders the nodes by address) is held off the CPU half the time, and
        # w2's first GPU reports a HW slowdown at 1095 MHz
        throttle = Throttle(lab.root, rank=1)
        healthy(lab, "w2", **SLOWED)
        slowed = view.wait(lambda s: "straggler: rank 1" in s and "HW slowdown" in "".join(node_line(s, w2)),
                           "the straggler and w2's slowed GPU", timeout=150)
        print(f"\n--- fsdpctl top, a straggler and a slowed GPU ---\n{slowed}")
        assert "GPU 0 (00000000:18:00.0) HW slowdown 1,095/1,980 MHz" in node_line(slowed, w2)[1]
        assert "HW slowdown" not in "".join(node_line(slowed, w1))
        assert re.search(rf"straggler: rank 1 on {re.escape(w2)} \(node 1\) computed", slowed)

        deadline = time.monotonic() + 40  # the textfile is written every 15 s
        while True:
            families = prometheus_families(next(prom.glob("*.prom")))
            clocks = {(s.labels["node"], s.labels["gpu"]): s.value for s in families["DCGM_FI_DEV_SM_CLOCK"].samples}
            if clocks[("1", "0")] == 1095 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert clocks[("1", "0")] == 1095 and clocks[("0", "0")] == 1980 and clocks[("1", "1")] == 1980
        reasons = {s.labels["node"]: s.value for s in families["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"].samples
                   if s.labels["gpu"] == "0"}
        assert reasons == {"0": 0, "1": 8}  # NVML's HW slowdown bit
        rows = {r["step"]: r for r in read_rows(layout.collected(run_dir, 0, "metrics.jsonl").read_text()
                                                .splitlines(), "x").train}
        step = int(families["fsdpctl_step"].samples[0].value)
        assert families["fsdpctl_loss"].samples[0].value == pytest.approx(rows[step]["loss"])
        assert {s.labels["rank"] for s in families["fsdpctl_rank_compute_seconds"].samples} == {"0", "1"}

        # Prometheus, scraping node_exporter's textfile collector, answers the same by host and gpu
        slowed_gpu = scraper.wait_for(f'DCGM_FI_DEV_SM_CLOCK{{{this_run},host="{w2}",gpu="0"}}',
                                      lambda r: value(r[0]) == 1095, "w2's GPU 0 at 1095 MHz")
        print(f"\n--- Prometheus /api/v1/query: w2's slowed GPU ---\n{json.dumps(slowed_gpu)}")
        assert len(slowed_gpu) == 1 and slowed_gpu[0]["metric"]["node"] == "1"
        clocks = {(s["metric"]["host"], s["metric"]["gpu"]): value(s)
                  for s in scraper.query(f"DCGM_FI_DEV_SM_CLOCK{{{this_run}}}")}
        assert clocks == {(w1, "0"): 1980, (w1, "1"): 1980, (w2, "0"): 1095, (w2, "1"): 1980}
        step_after = value(scraper.query(f"fsdpctl_step{{{this_run}}}")[0])
        assert step_after > step_before
        held = scraper.wait_for(f'fsdpctl_rank_compute_seconds{{{this_run},rank="1"}}',
                                lambda r: value(r[0]) > 1.2 * compute_before["1"], "rank 1's compute time up")
        print(f"--- rank 1's compute time, s: {compute_before['1']:.4f} before the throttle, {value(held[0]):.4f} "
              f"held off the CPU; steps {step_before:g} -> {step_after:g} ---")

        throttle.stop()
        healthy(lab, "w2")
        view.wait(lambda s: step_on(s) >= 12, "a step past the first checkpoint (10)", timeout=150)
        with Cut(lab, "w2"):  # w2's link goes: lost after the node timeout, w3 takes its place
            replaced = view.wait(lambda s: f"{w3} in the place of {w2}" in s, "the spare in w2's place", timeout=150)
        print(f"\n--- fsdpctl top, the spare in place ---\n{replaced}")
        view.wait(lambda s: node_line(s, w3) and "attempt 2" in s, "attempt 2 on w3", timeout=60)
        view.keys("q")  # the view goes; the run does not
        view.wait(lambda s: "step " not in s, "the view closed", timeout=20)
        assert launcher.process.poll() is None, "q ended the launch"
        code, out, err = launcher.finish(timeout=300)
    finally:
        view.close()
        if throttle is not None:
            throttle.stop()
        healthy(lab, "w2")
        if launcher.process.poll() is None:
            launcher.process.kill()
    assert code == 0, err[-3000:]
    assert not list(prom.glob("*.prom")), "the textfile of a run that ended stays"

    # TensorBoard's own reader finds what metrics.jsonl and the GPU samples hold
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb / run_dir.name), size_guidance={"scalars": 0})
    events.Reload()
    copies = [p.read_text() for p in sorted((run_dir / "live").glob("node*/metrics.jsonl"))]
    train_rows = read_rows("\n".join(copies).splitlines(), "x").train
    logged = {e.step: e.value for e in events.Scalars("loss/train")}
    assert set(logged) == {r["step"] for r in train_rows} and len(logged) == STEPS
    assert all(logged[r["step"]] == pytest.approx(r["loss"], rel=1e-6) for r in train_rows)
    assert 1095 in {e.value for e in events.Scalars("gpu/node1/gpu0/sm_clock_mhz")}
    assert {e.value for e in events.Scalars("gpu/node0/gpu0/sm_clock_mhz")} == {1980}
    assert "rank1/compute_s" in events.Tags()["scalars"]

    final = list(fsdpctl.get_run(run_dir.name, runs_dir=tmp_path / "runs").watch())
    assert len(final) == 1 and final[0].over and final[0].run.state == "succeeded" and final[0].run.step == STEPS
    assert [(r.host, r.by) for r in final[0].replacements] == [(w2, w3)]
    assert not processes_of(run_dir.name)


def prometheus_families(path: Path) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(path.read_text())}


def user_profile(lab: Lab, tmp_path: Path) -> tuple[Path, Path]:
    code = tmp_path / "project"
    code.mkdir(exist_ok=True)
    (code / "train.py").write_text(USER_PROGRAM)
    return profile(lab, tmp_path, name="mine"), code


def test_watch_a_detached_run_to_its_end_and_a_run_whose_launcher_was_killed(live_lab, tmp_path):
    lab = live_lab
    path, code = user_profile(lab, tmp_path)
    started = run(lab, tmp_path, "launch", "-p", str(path), "--code", str(code), "--detach", "--", "train.py", "30")
    assert started.returncode == 0, started.stderr[-2000:]
    run_id = started.stdout.strip().splitlines()[0]
    runs_dir = tmp_path / "runs"
    steps, live_seen = [], []
    for snap in fsdpctl.watch(run_id, interval=1, runs_dir=runs_dir):
        steps.append(snap.run.step)
        live_seen.append(snap.run.live)
        nodes = {n.host: n for n in snap.nodes}
    assert snap.over and snap.run.state == "succeeded", snap.run  # the detached run's follower recorded its end
    assert any(live_seen[:-1]) and snap.run.step == 30
    seen = [s for s in steps if s is not None]
    assert seen == sorted(seen) and len(set(seen)) >= 3, steps  # it rose while watched
    assert set(nodes) == {lab.hosts["w1"].address, lab.hosts["w2"].address}
    assert all(n.gpus and n.gpus[0].sm_mhz == 1980 for n in nodes.values())  # the nodes' samples, collected here
    run_dir = runs_dir / run_id
    assert (run_dir / "live" / "node1" / "gpu" / "node1.jsonl").exists()
    assert "step=30 loss=0.1333" in (run_dir / "logs" / "merged.log").read_text()
    again = list(fsdpctl.watch(run_id, runs_dir=runs_dir))  # a finished run: one snapshot
    assert len(again) == 1 and again[0].over and again[0].run.step == 30

    argv, env = fsdpctl_argv(lab, tmp_path, "launch", "-p", str(path), "--code", str(code), "--", "train.py", "200")
    launcher = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        killed = run_dir_of_new(runs_dir, {run_dir})
        wait_for_line(killed / "logs" / "merged.log", r"step=4 loss=")
        watching = fsdpctl.get_run(killed.name, runs_dir=runs_dir).watch(interval=1)
        assert next(watching).run.live
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        gone = next(s for s in watching if not s.run.live)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert gone.run.state == "running" and "not live: the data stops at" in gone.run.note, gone.run
    assert gone.run.data_until is not None and gone.run.data_until <= time.time()
    deadline = time.monotonic() + 30  # its agents end the run within the node timeout (8 s)
    while processes_of(killed.name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_of(killed.name)


def run_dir_of_new(runs_dir: Path, before: set[Path], timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [p.parent for p in runs_dir.glob("*/run.json") if p.parent not in before]
        if new:
            return new[0]
        time.sleep(0.2)
    raise AssertionError("no new run directory")


def test_a_slurm_job_watched_with_top(lab, slurm, tmp_path):
    if not shutil.which("tmux"):
        pytest.skip("needs tmux")
    from tests.integration.test_slurm import profile as slurm_profile

    env = {**os.environ, **slurm.env, "HOME": str(tmp_path), "FSDPCTL_RUNS_DIR": str(tmp_path / "runs"),
           "PYTHONPATH": str(REPO)}
    submitted = subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", "submit", "--slurm", "-p",
                                              str(slurm_profile(lab, tmp_path, 40))]),
                               env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    run_id = submitted.stdout.strip().splitlines()[0]
    view = Tmux(tmp_path, [sys.executable, "-m", "fsdpctl", "top", run_id], env)
    try:
        first = view.wait(lambda s: re.search(r"\d+ n1 ", s) and re.search(r"\d+ n2 ", s) and step_on(s) > 0,
                          "both Slurm nodes and a step", timeout=180)
        later = view.wait(lambda s: step_on(s) > step_on(first), "the step rising", timeout=120)
        print(f"\n--- fsdpctl top on a Slurm job ---\n{later}")
        assert " live" in later.splitlines()[0] and "slurm" in later.splitlines()[0]
        view.wait(lambda s: "[n1 r0] Train Epoch" in s and "[n2" in s,
                  "both nodes' lines, from the shared run directory", timeout=60)
        done = view.wait(lambda s: "succeeded" in s.splitlines()[0], "the job's end", timeout=240)
        assert step_on(done) == 40
    finally:
        view.close()
    deadline = time.monotonic() + 30  # the job's follower records its end, nobody having asked
    while json.loads((tmp_path / "runs" / run_id / "run.json").read_text())["state"] != "succeeded":
        assert time.monotonic() < deadline, (tmp_path / "runs" / run_id / "live" / "follower.log").read_text()
        time.sleep(0.5)
    said = (tmp_path / "runs" / run_id / "live" / "follower.log").read_text()
    assert f"run {run_id} succeeded (exit 0)" in said, said
