"""fsdpctl's Python API on the namespace testbed, driven as a user's script would drive it: a training
run followed through ``launch``, a sweep of detached runs waited on and read back from a fresh
process, a failing program's outcome, ``stop``, errors as exceptions, and a KeyboardInterrupt that
stops the run without taking the script's own signal handlers."""

from __future__ import annotations

import json
import signal
import stat
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.api_driver import Background, api, python
from tests.integration.test_launch import processes_of, run_dir_of, wait_for_line, write_profile
from tests.integration.user_project import write_project

pytestmark = pytest.mark.integration


def private(root: Path) -> list[str]:
    """Files and folders under ``root`` that others could read."""
    return [f"{p} {stat.filemode(p.stat().st_mode)}" for p in [root, *root.rglob("*")]
            if not p.is_symlink() and p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO)]


@pytest.mark.parametrize("fsdp", [2])  # FSDP1 on two ranks: the workload's parity and flags tests
def test_a_training_run_followed_through_launch(lab, tmp_path, fsdp):
    profile = write_profile(lab, tmp_path)
    reported, done = api(lab, tmp_path, f"""
        os.umask(0o022)  # a notebook's usual umask: the run's files stay private all the same
        seen = []
        run = fsdpctl.launch({str(profile)!r}, fsdp={fsdp}, on_event=seen.append)
        outcome = run.wait()  # it has ended already: launch followed it
        lines = list(run.logs())
        report({{"outcome": outcome_json(outcome), "status": run.status().to_json(), "run_id": run.run_id,
                "events": sorted({{type(e).__name__ for e in seen}}),
                "live": [[e.node_rank, e.host, e.rank] for e in seen if isinstance(e, LogLine)],
                "lines": [[line.node_rank, line.rank, line.text] for line in lines],
                "rank1": sorted({{line.rank for line in run.logs(rank=1)}})}})
    """)
    assert done.returncode == 0 and reported, done.stderr[-3000:]
    result = reported[0]
    assert result["outcome"] == {"exit_code": 0, "state": "succeeded", "ok": True, "failure": None, "message": None}
    assert {"RunStarted", "RunEnded", "LogLine", "PreflightStarted", "HostChecked"} <= set(result["events"])
    hosts = {lab.hosts["n1"].address, lab.hosts["n2"].address}
    assert {host for _, host, _ in result["live"]} == hosts
    assert {rank for node, _, rank in result["live"] if rank is not None} == {0, 1}
    texts = [text for _, _, text in result["lines"]]
    assert any(f"fsdp={fsdp}" in t for t in texts) and any("step=8 loss=" in t for t in texts)
    assert len(result["lines"]) == len(result["live"]), "logs() reads back every line the launch delivered"
    assert result["rank1"] == [1]
    assert any("node 0 of 2 on n1 " in t for t in texts) and any("node 1 of 2 on n2 " in t for t in texts)
    curve = [float(t.split(" loss=")[1].split()[0]) for t in texts if " step=" in t and " loss=" in t]
    assert len(curve) >= 3 and curve[-1] < curve[0], curve
    status = result["status"]
    assert status["state"] == "succeeded" and [n["state"] for n in status["nodes"]] == ["succeeded"] * 2
    assert status["last_metrics"]["step"] == 8
    run_dir = tmp_path / "runs" / result["run_id"]
    for rank in (0, 1):  # both nodes' logs are here: the streamed copies and torchrun's own log folders
        assert (run_dir / "logs" / f"node{rank}.log").read_text().strip()
        assert list((run_dir / "logs" / f"node{rank}").rglob("stdout.log")), f"torchrun logs of node {rank}"
    assert not private(run_dir), "an API run's files are its owner's alone, whatever the umask"
    assert not processes_of(result["run_id"])


def test_a_sweep_of_detached_runs_waited_on_then_read_back_from_a_fresh_process(lab, tmp_path):
    """examples/sweep.py as written: three learning rates launched detached, each waited on."""
    profile = write_profile(lab, tmp_path)
    started = time.monotonic()
    done = python(lab, tmp_path, str(REPO / "examples" / "sweep.py"), "-p", str(profile), "--steps", "6",
                  timeout=400)
    print(f"\n--- examples/sweep.py on 2 nodes, {time.monotonic() - started:.0f} s ---\n{done.stdout}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = [line for line in done.stdout.splitlines() if line.startswith("lr=")]
    assert len(summary) == 3 and all(": succeeded (exit 0), final loss " in line for line in summary), summary
    assert "best: lr=" in done.stdout
    printed = {line.rsplit(" run ", 1)[1]: line.split("final loss ")[1].split(",")[0] for line in summary}
    assert sorted(printed) == sorted(path.name for path in (tmp_path / "runs").iterdir())

    # Another process, later: the runs as the registry and get_run see them, statuses and logs included.
    reported, done = api(lab, tmp_path, """
        found = {}
        for listed in fsdpctl.runs():
            run = fsdpctl.get_run(listed.run_id)
            status = run.status()
            found[run.run_id] = {"state": str(status.state), "loss": status.last_metrics["loss"],
                                 "lr": run.plan.train["lr"], "outcome": outcome_json(run.wait()),
                                 "steps": [line.text for line in run.logs(rank=0) if "step=" in line.text]}
        report(found)
    """)
    assert done.returncode == 0 and reported, done.stderr[-3000:]
    found = reported[0]
    assert sorted(found) == sorted(printed)
    assert sorted(entry["lr"] for entry in found.values()) == [3e-4, 1e-3, 3e-3]
    for run_id, entry in found.items():
        assert entry["state"] == "succeeded" and entry["outcome"]["ok"] and entry["steps"], entry
        assert f"{entry['loss']:.4f}" == printed[run_id]
        assert not processes_of(run_id)


def test_a_failing_program_and_a_stopped_run_as_outcomes(lab, tmp_path):
    profile = write_profile(lab, tmp_path)
    project = write_project(tmp_path / "project")
    reported, done = api(lab, tmp_path, f"""
        failing = fsdpctl.launch({str(profile)!r}, ["train.py"], code={str(project)!r}, env={{"FAIL_RANK": "1"}},
                                 detach=True)
        failed = failing.wait(timeout=180)
        long = fsdpctl.launch({str(profile)!r}, "train.py", code={str(project)!r},
                              env=["STEPS=100000", "STEP_SLEEP=0.2"], detach=True)
        for line in long.logs(follow=True):
            if "user step=2 " in line.text:
                break
        try:
            long.wait(timeout=2)
            timed_out = None
        except WaitTimeout as exc:
            timed_out = [isinstance(exc, FsdpctlError), isinstance(exc, TimeoutError), exc.message]
        live = long.status()
        remaining = long.stop()
        report({{"failed": outcome_json(failed), "failing_status": failing.status().to_json(),
                "timed_out": timed_out, "live": str(live.state), "live_nodes": [str(n.state) for n in live.nodes],
                "remaining": remaining, "stopped": outcome_json(long.wait()), "long": long.run_id}})
    """)
    assert done.returncode == 0 and reported, done.stderr[-3000:]
    result = reported[0]
    failed = result["failed"]
    assert failed["exit_code"] == 3 and failed["state"] == "failed" and not failed["ok"]
    failure = failed["failure"]
    assert failure["rank"] == 1 and failure["host"] == lab.hosts["n2"].address and failure["exit_code"] == 3
    assert any("rank 1 failing on purpose" in line for line in failure["last_lines"])
    assert result["failing_status"]["state"] == "failed"
    assert result["failing_status"]["first_failure"]["rank"] == 1
    assert result["timed_out"][:2] == [True, True] and "still running" in result["timed_out"][2]
    assert result["live"] == "running" and result["live_nodes"] == ["running", "running"]
    assert all(not pids for pids in result["remaining"].values()), result["remaining"]
    assert result["stopped"]["state"] == "stopped"
    assert not processes_of(result["long"])


def test_api_errors_are_exceptions_of_the_hierarchy(lab, tmp_path):
    profile = write_profile(lab, tmp_path)
    unreachable = tmp_path / "gone.yaml"
    unreachable.write_text(profile.read_text().replace(lab.hosts["n2"].address, lab.unused_address()))
    reported, done = api(lab, tmp_path, f"""
        try:
            fsdpctl.launch({str(unreachable)!r}, steps=4)
            report(None)
        except PreflightError as exc:
            hosts = {{h.host: h.status for h in exc.report.hosts}}
            report({{"type": type(exc).__name__, "message": exc.message, "hint": exc.hint, "hosts": hosts,
                    "runs": os.listdir("runs") if os.path.isdir("runs") else []}})
    """, timeout=90)
    assert done.returncode == 0 and reported and reported[0], done.stderr[-3000:]
    result = reported[0]
    assert result["type"] == "PreflightError" and result["message"] == "preflight failed; nothing was started"
    assert result["hosts"] == {lab.hosts["n1"].address: "pass", lab.unused_address(): "fail"}
    assert result["runs"] == []


def test_a_keyboard_interrupt_stops_the_run_and_leaves_the_scripts_own_handlers(lab, tmp_path):
    profile = write_profile(lab, tmp_path, steps=100000)
    script = Background(lab, tmp_path, f"""
        def own_handler(signum, frame):
            print("own handler: SIGTERM", flush=True)

        signal.signal(signal.SIGTERM, own_handler)  # a notebook's, a service's: fsdpctl leaves it alone
        try:
            fsdpctl.launch({str(profile)!r})
            report("not interrupted")
        except KeyboardInterrupt:
            run = fsdpctl.runs()[-1]
            report({{"run": run.run_id, "state": str(run.info.state),
                    "handler_kept": signal.getsignal(signal.SIGTERM) is own_handler}})
    """)
    run_dir = run_dir_of(tmp_path)
    wait_for_line(run_dir / "logs" / "merged.log", r"step=\d+ loss=")
    script.process.send_signal(signal.SIGTERM)
    wait_for_line(script.out_path, "own handler: SIGTERM", timeout=20)
    assert processes_of(run_dir.name), "SIGTERM went to the script's own handler; the run goes on"
    script.process.send_signal(signal.SIGINT)
    code, reported, err = script.finish(timeout=60)
    assert code == 0 and reported, err[-3000:]
    assert reported[0] == {"run": run_dir.name, "state": "interrupted", "handler_kept": True}
    assert not processes_of(run_dir.name)
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"


def test_doctor_with_the_collectives_smoke_test_across_the_namespaces(lab, tmp_path):
    profile = write_profile(lab, tmp_path)
    reported, done = api(lab, tmp_path, f"""
        seen = []
        found = fsdpctl.doctor({str(profile)!r}, collectives=True, on_event=seen.append)
        report({{"ok": found.ok, "hosts": [h.host for h in found.hosts], "collectives": found.collectives,
                "checked": [e.report.host for e in seen if isinstance(e, HostChecked)]}})
    """)
    assert done.returncode == 0 and reported, done.stderr[-3000:]
    result = reported[0]
    assert result["ok"] and sorted(result["checked"]) == sorted(result["hosts"])
    data = result["collectives"]
    assert data["backend"] == "gloo" and data["world_size"] == 2
    assert {row["op"] for row in data["results"]} == {"all_reduce", "all_gather"}
    assert all(row["busbw_gbps"] > 0 for row in data["results"])
    merged = (tmp_path / "runs" / data["run_id"] / "logs" / "merged.log").read_text()
    assert "on n1 " in merged and "on n2 " in merged  # over eth0, between the two hosts


def test_an_estimate_with_no_torch_here_is_traced_on_the_profiles_first_node(lab, tmp_path):
    """The launching machine without torch (as a laptop may be): every choice is traced on node 0
    over SSH, the workload shipped as a zip and its traces side by side there, then the largest
    batch; the same peaks as traced here."""
    profile = write_profile(lab, tmp_path)
    reported, done = api(lab, tmp_path, f"""
        import fsdpctl.memory.runner as runner
        asked = dict(nodes=1, nproc_per_node=2, gpu_mem="2GiB", mixed_precision="fp32")
        here = fsdpctl.estimate({str(profile)!r}, **asked)
        runner.torch_here = lambda: False
        there = fsdpctl.estimate({str(profile)!r}, **asked)
        report({{"where": [here.where, there.where], "best": there.best.label(), "max_batch": there.max_batch,
                "traced": [c.result.get("traced") and c.derived is None for c in there.choices],
                "peaks": [[c.peak for c in r.choices] for r in (here, there)]}})
    """)
    assert done.returncode == 0 and reported, done.stderr[-3000:]
    found = reported[0]
    assert found["where"][0] == "this machine" and found["where"][1] != "this machine", found["where"]
    assert lab.hosts["n1"].address in found["where"][1]
    assert found["traced"].count(True) == 6 and found["peaks"][0] == found["peaks"][1]  # 3 shardings x 2
    assert found["best"] == "no-shard" and found["max_batch"] > 4
