"""What the dashboard costs and how fast it answers:

  1. 1,000 runs in the registry (written here as runs of a 2-host SSH profile): the runs page's data
     (GET /api/runs) the first time and again, against `fsdpctl runs --json` on the same registry.
     Goal: <= 1 s.
  2. a finished run of 16 nodes x 8 ranks and 100,000 logged steps (1.3 GB of metrics, every rank's
     timings in every row; 8 GPUs per node sampled every 5 s for its 14 hours): its page's data the
     first time (the first paint waits for it), how many points its charts hold, and the server's
     memory afterwards. Goals: <= 2 s, a few thousand points per chart, <= 200 MB.
  3. 20 pages on a live run (the namespace testbed, 2 nodes, a program logging a step every 0.5 s):
     the launcher's CPU and the nodes' new SSH sessions over a window with none open and with 20
     event streams open, and the server's own CPU. Goal: the nodes and the launcher unchanged.

  4. (``--parts lengths``) one run shape, 1 node x 8 ranks, at 100,000 and 1,000,000 steps: the chart
     index's size, its upkeep and the server's memory, this tree against the tree before its quantile
     sketches, and the report's medians against the exact ones. Goal: flat within 2x from 100,000 to
     1,000,000 steps; medians within the sketch's 0.2 %.

Run as root: .venv/bin/python bench/dashboard.py [--runs 1000] [--steps 100000] [--window 30]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, fsdpctl_env, machine, time_command  # noqa: E402

from tests.testbed.lab import Lab, netns_available  # noqa: E402

PROFILE = ("name: big\nbackend: ssh\nhosts: [{hosts}]\nnproc_per_node: 8\nworkdir: /scratch/big\n"
           "train:\n  preset: tiny\n  steps: {steps}\n")


def make_run(runs: Path, index: int, hosts: int, steps: int):
    from fsdpctl.backends import plan_run, render_scripts
    from fsdpctl.plan.types import Overrides, overrides_to_json
    from fsdpctl.profiles.loader import parse_profile
    from fsdpctl.rundir.rundir import create_run
    from fsdpctl.rundir.state import RunState

    text = PROFILE.format(hosts=", ".join(f"10.9.{i // 250}.{i % 250 + 1}" for i in range(hosts)), steps=steps)
    profile = parse_profile(text, "big.yaml")
    clock = f"{index // 3600 % 24:02d}{index // 60 % 60:02d}{index % 60:02d}"
    run_id = f"big-2026{(index // 86400) % 12 + 1:02d}01-{clock}-{index % 65536:04x}"
    inputs = {"profile_source": "big.yaml", "local_python": "/usr/bin/python3", "home": "/home/me",
              "local_cwd": str(runs), "overrides": overrides_to_json(Overrides())}
    plan = plan_run(profile, run_id=run_id, local_run_dir=str(runs / run_id), overrides=Overrides(),
                    **{k: v for k, v in inputs.items() if k != "overrides"})
    run = create_run(plan, profile, render_scripts(plan), text, inputs)
    run.change(state=RunState.SUCCEEDED, started_at="2026-11-01T10:00:00+00:00",
               finished_at="2026-11-01T11:00:00+00:00", exit_code=0)
    return run


class Server:
    """``fsdpctl dashboard`` in a process of its own, for a runs directory."""

    def __init__(self, runs: Path, root: Path, wrap=lambda argv: argv, python_path: Optional[Path] = None):
        """``python_path``: the tree whose fsdpctl serves (default: this one)."""
        env = {**fsdpctl_env(root), "FSDPCTL_STATE_DIR": str(root / "state")}
        if python_path is not None:
            env["PYTHONPATH"] = str(python_path)
        self.process = subprocess.Popen(wrap([sys.executable, "-m", "fsdpctl", "dashboard", "--runs-dir", str(runs),
                                              "--port", "0"]), env=env, stdout=subprocess.PIPE, cwd=root,
                                        stderr=subprocess.DEVNULL, text=True)
        url = self.process.stdout.readline().strip()
        self.port = int(url.split(":")[2].split("/")[0])
        self.cookie = "fsdpctl_token=" + url.split("token=")[1]

    def pid(self) -> int:
        """The server's Python (under ``ip netns exec`` when wrapped)."""
        pid = self.process.pid
        for _ in range(3):
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if not children:
                break
            pid = int(children[0])
        return pid

    def get(self, path: str) -> tuple[float, bytes]:
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        connection.request("GET", path, headers={"Cookie": self.cookie})
        body = connection.getresponse().read()
        connection.close()
        return time.perf_counter() - started, body

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def registry(args, root: Path, baseline: Optional[Path] = None) -> dict:
    runs = root / "many"
    runs.mkdir()
    for i in range(args.runs):
        make_run(runs, i, 2, 100)
    server = Server(runs, root)
    try:
        first, body = server.get("/api/runs")
        again = [server.get("/api/runs")[0] for _ in range(5)]
        listed = len(json.loads(body)["runs"])
    finally:
        server.close()
    env = {**fsdpctl_env(root), "FSDPCTL_RUNS_DIR": str(runs)}
    trees = {"this_tree": env}
    if baseline is not None:
        trees["tree_before"] = {**env, "PYTHONPATH": str(baseline)}
    cli = {name: [] for name in trees}
    for _ in range(3):  # interleaved: each tree's `runs --json` in turn
        for name, tree_env in trees.items():
            cli[name].append(time_command([sys.executable, "-m", "fsdpctl", "runs", "--json"], env=tree_env, cwd=root))
    return {"runs": listed, "first_s": round(first, 3), "again_median_s": round(sorted(again)[2], 3),
            **{f"cli_runs_json_median_s_{name}": round(sorted(times)[1], 3) for name, times in cli.items()}}


def _write_rows(out, first: int, last: int, ranks_total: int, per_node: int, rng: random.Random, t0: float,
                written: Optional[dict[str, list[float]]] = None) -> None:
    for step in range(first, last + 1):
        ranks = [{"rank": r, "node": r // per_node, "host": f"10.9.0.{r // per_node + 1}", "local_rank": r % per_node,
                  "compute_s": round(0.3 * (1.4 if r == 13 else 1.0) + rng.random() * 0.01, 6), "comm_s": 0.1,
                  "data_s": 0.001, "wall_s": 0.5, "mem_mb": 61000.0} for r in range(ranks_total)]
        jitter = 1 + 0.1 * rng.random()  # a step's time as it varies: the medians are of something
        figures = {"tokens_per_s": round(4.2e6 / jitter), "mfu": round(0.41 / jitter, 5),
                   "step_time_s": round(0.5 * jitter, 6)}
        if written is not None:
            for key, value in figures.items():
                written.setdefault(key, []).append(value)
        out.write(json.dumps({"kind": "train", "step": step, "loss": 10 / (1 + step / 1000), **figures,
                              "time": t0 + step * 0.5, "ranks": ranks}) + "\n")


def _write_samples(live: Path, nodes: int, gpus: int, first: int, last: int, rng: random.Random, t0: float) -> None:
    for node in range(nodes):
        path = live / f"node{node}" / "gpu" / f"node{node}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            for i in range(first, last):
                sample = [{"index": str(g), "bus_id": f"00000000:{0x18 + g:02X}:00.0",
                           "sm_mhz": 1980.0 - (rng.random() * 300 if node == 1 and g == 5 else 0.0),
                           "sm_max_mhz": 1980.0, "temp_c": 60.0 + rng.random() * 8,
                           "power_w": 650.0 + rng.random() * 50,
                           "util_pct": 98.0, "mem_mib": 61000.0, "mem_total_mib": 81559.0, "ecc_uncorrected": 0.0,
                           "remap_pending": False, "reasons": ["HW slowdown"] if node == 1 and g == 5 and i % 9 == 0
                           else []} for g in range(gpus)]
                line = {"t": t0 + i * 5, "node": node, "host": f"10.9.0.{node + 1}", "gpus": sample}
                out.write(json.dumps(line) + "\n")


def generated_run(runs: Path, steps: int, nodes: int, per_node: int, keep_every: int,
                  written: Optional[dict[str, list[float]]] = None) -> tuple[Any, dict]:
    """A finished run as its collector leaves it: the copies written ``keep_every`` steps at a time, the
    copies read and the chart index kept after each batch by the collector's own code (``Collector.read``,
    ``Collector.keep_index``)."""
    from fsdpctl.live.collector import Collector

    run = make_run(runs, 1, nodes, steps)
    live = run.root / "live"
    rng = random.Random(0)
    copy = live / "node0" / "metrics.jsonl"
    copy.parent.mkdir(parents=True)
    t0 = 1_790_000_000.0
    collector = Collector(run.root, run.plan)
    kept_cpu = read_cpu = 0.0
    saves = 0
    with copy.open("w") as out:
        for first in range(1, steps + 1, keep_every):
            last = min(steps, first + keep_every - 1)
            _write_rows(out, first, last, nodes * per_node, per_node, rng, t0, written)
            out.flush()
            _write_samples(live, nodes, per_node, int((first - 1) * 0.5 / 5), int(last * 0.5 / 5), rng, t0)
            started = time.process_time()
            collector.read()  # what the collector does every few seconds: the copies' new rows into the charts
            read_cpu += time.process_time() - started
            started = time.process_time()
            collector.keep_index()  # and every 60 s
            kept_cpu += time.process_time() - started
            saves += 1
    (live / "collect.json").write_text("{}")
    run.change(logs_complete=True)  # its follower saw the end: report reads the copies here
    index = live / "charts.idx"
    hours = steps * 0.5 / 3600
    return run, {"metrics_and_samples_mb": round(sum(p.stat().st_size for p in live.rglob("*.jsonl")) / 2**20),
                 "index_mb": round(index.stat().st_size / 2**20, 1), "index_kept_times": saves,
                 "index_upkeep_cpu_s_per_run_hour": round(kept_cpu / hours, 2),
                 "reading_cpu_s_per_run_hour": round(read_cpu / hours, 2),
                 "index_upkeep_pct_of_a_core": round(100 * kept_cpu / (steps * 0.5), 3)}


def open_page(runs: Path, run_id: str, root: Path, python_path: Optional[Path] = None) -> dict:
    """The run's page from a dashboard of this tree (or of ``python_path``'s), as a browser opens it:
    its data (the first time), the same again, a node not on the first view, the server's memory."""
    server = Server(runs, root, python_path=python_path)
    try:
        first, body = server.get(f"/api/runs/{run_id}")
        page = json.loads(body)
        charts = page["charts"]
        again, _ = server.get(f"/api/runs/{run_id}")
        result = {"first_s": round(first, 3), "again_s": round(again, 3), "page_kb": round(len(body) / 1024),
                  "chart_points": {"loss": len(charts["train"]["loss"]["x"]),
                                   "heat_columns": len(charts["heat"]["steps"]),
                                   "gpu_curves_on_the_page": len(charts["gpus"]),
                                   "rank_curves_on_the_page": len(charts["rank_time"])},
                  "straggler": (page["snapshot"]["straggler"] or {}).get("rank")}
        if "nodes" in charts:
            late = max(n["node"] for n in charts["nodes"])
            took, node_body = server.get(f"/api/runs/{run_id}/nodes/{late}")
            result["a_node_on_demand"] = {"node": late, "s": round(took, 3), "kb": round(len(node_body) / 1024)}
        result["server_rss_mb"] = round(rss_mb(server.pid()), 1)
    finally:
        server.close()
    return result


def report_seconds(runs: Path, run_id: str, root: Path, tree: Path = REPO) -> float:
    """``fsdpctl report RUN --json --no-fetch`` of this tree (or ``tree``), start to exit."""
    env = {**fsdpctl_env(root), "FSDPCTL_RUNS_DIR": str(runs), "PYTHONPATH": str(tree)}
    return round(time_command([sys.executable, "-m", "fsdpctl", "report", run_id, "--json", "--no-fetch"],
                              env=env, cwd=root), 2)


def long_run(args, root: Path, baseline: Optional[Path]) -> dict:
    runs = root / "long"
    runs.mkdir()
    run, made = generated_run(runs, args.steps, 16, 8, args.keep_every)
    result = {"steps": args.steps, **made, "this_tree": open_page(runs, run.run_id, root),
              "report_s": {"this_tree": report_seconds(runs, run.run_id, root)}}
    if baseline is not None:
        result["report_s"]["tree_before"] = report_seconds(runs, run.run_id, root, baseline)
    index = run.root / "live" / "charts.idx"
    index.rename(index.with_name("charts.idx.kept"))
    result["this_tree_index_deleted"] = open_page(runs, run.run_id, root)
    result["this_tree_again_after_the_rebuild"] = open_page(runs, run.run_id, root)
    if baseline is not None:
        result["tree_before"] = open_page(runs, run.run_id, root, python_path=baseline)
    return result


def million_steps(args, root: Path) -> dict:
    """A run of 1,000,000 steps (1 node x 8 ranks: 128 ranks' rows for a million steps would be 22 GB),
    its index kept every 2,000 steps."""
    runs = root / "million"
    runs.mkdir()
    run, made = generated_run(runs, args.million, 1, 8, 2000)
    return {"steps": args.million, **made, "this_tree": open_page(runs, run.run_id, root),
            "report_s": report_seconds(runs, run.run_id, root)}


def report_json(runs: Path, run_id: str, root: Path, tree: Path = REPO) -> tuple[dict, float]:
    """``fsdpctl report RUN --json --no-fetch`` of ``tree``: its figures and its wall seconds."""
    env = {**fsdpctl_env(root), "FSDPCTL_RUNS_DIR": str(runs), "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fsdpctl", "report", run_id, "--json", "--no-fetch"], env=env,
                          cwd=root, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)["runs"][0], round(time.perf_counter() - started, 2)


def run_lengths(args, root: Path, before: Optional[Path]) -> dict:
    """The same run shape (1 node x 8 ranks) at each length: the chart index's size, its upkeep and the
    server's memory of this tree, and at ``--before-lengths`` of the tree before too (its own bench, in
    its own process, on the same rows); this tree's report medians against the exact medians of the
    rows written."""
    import statistics

    out: dict[str, Any] = {}
    for steps in (int(n) for n in args.lengths.split(",")):
        runs = root / f"length-{steps}"
        runs.mkdir()
        written: dict[str, list[float]] = {}
        run, made = generated_run(runs, steps, 1, 8, args.keep_every, written)
        page = open_page(runs, run.run_id, root)
        mine, mine_s = report_json(runs, run.run_id, root)
        shutil.rmtree(runs)
        medians = {}
        for key, values in written.items():
            exact = statistics.median(values)
            medians[key] = {"this_tree": mine.get(key), "exact": exact,
                            "relative_error": abs(mine[key] - exact) / abs(exact)
                            if isinstance(mine.get(key), (int, float)) else None}
        del written
        out[str(steps)] = {"this_tree": {**made, "server_rss_mb": page["server_rss_mb"], "report_s": mine_s},
                           "medians": medians}
        if before is not None and str(steps) in args.before_lengths.split(","):
            for name in ("dashboard.py", "harness.py"):  # this bench, on the tree before's code
                shutil.copy(Path(__file__).parent / name, before / "bench" / name)
            theirs = subprocess.run([sys.executable, str(before / "bench" / "dashboard.py"), "--parts", "million",
                                     "--million", str(steps), "--keep-every", str(args.keep_every)],
                                    env={**os.environ, "PYTHONPATH": str(before)}, check=True, capture_output=True,
                                    text=True)
            made_before = json.loads(theirs.stdout[theirs.stdout.index("{"):])["million_steps"]
            out[str(steps)]["tree_before"] = {
                "index_mb": made_before["index_mb"],
                "index_upkeep_cpu_s_per_run_hour": made_before["index_upkeep_cpu_s_per_run_hour"],
                "server_rss_mb": made_before["this_tree"]["server_rss_mb"], "report_s": made_before["report_s"]}
        _keep_lengths(out)  # each length as it is measured: the longest takes the better part of an hour
    return out


def _keep_lengths(measured: dict) -> None:
    """``measured`` added to the lengths kept in ``dashboard_lengths.json``."""
    path = RESULTS / "dashboard_lengths.json"
    kept = json.loads(path.read_text()) if path.exists() else {"benchmark": "dashboard", "run_lengths": {}}
    kept["run_lengths"] = {**kept.get("run_lengths", {}), **measured}
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(kept, indent=2) + "\n")


def pages_on_a_live_run(args, root: Path) -> dict:
    if netns_available():
        return {"skipped": f"the namespace testbed {netns_available()}"}
    lab = Lab(root / "lab", ["p1", "p2"]).up()
    try:
        for name in ("p1", "p2"):
            lab.start_sshd(name)
        code = root / "code"
        code.mkdir()
        (code / "steps.py").write_text(
            "import json, os, time\nrank, d = int(os.environ['RANK']), os.environ['FSDPCTL_RUN_DIR']\n"
            "for step in range(1, 100000):\n    time.sleep(0.5)\n"
            "    open(os.path.join(d, 'metrics.jsonl'), 'a').write(json.dumps({'step': step, 'rank': rank, "
            "'loss': 1 / step, 'step_time_s': 0.5}) + '\\n')\n    print(f'step={step}', flush=True)\n")
        profile = root / "pages.yaml"
        profile.write_text(lab.profile_yaml(["p1", "p2"], python=sys.executable, name="pages"))
        env = fsdpctl_env(root)
        launcher = subprocess.Popen(lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(profile),
                                                   "--code", str(code), "--", "steps.py"]), env=env, cwd=code,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not list((root / "runs").glob("*/logs/merged.log")) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(5)
        run_id = next((root / "runs").glob("*/logs/merged.log")).parent.parent.name
        server = Server(root / "runs", root, lab.in_client)
        launcher_python = launcher.pid  # (`ip netns exec` execs it: the same process)

        def window(pages: int) -> dict:
            logs_from = {n: h.log.stat().st_size for n, h in lab.hosts.items()}
            readers = [subprocess.Popen(lab.in_client(
                [sys.executable, "-c", "import socket,sys\ns=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n"
                 "s.sendall(('GET /api/events/run/'+sys.argv[2]+' HTTP/1.0\\r\\nHost: 127.0.0.1:'+sys.argv[1]+"
                 "'\\r\\nCookie: '+sys.argv[3]+'\\r\\n\\r\\n').encode())\nwhile s.recv(65536): pass",
                 str(server.port), run_id, server.cookie]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(pages)]
            time.sleep(2)
            cpu = {"launcher": cpu_seconds(launcher_python), "server": cpu_seconds(server.pid())}
            time.sleep(args.window)
            used = {k: round(cpu_seconds(launcher_python if k == "launcher" else server.pid()) - v, 2)
                    for k, v in cpu.items()}
            for reader in readers:
                reader.kill()
                reader.wait()
            sessions = sum(h.log.read_bytes()[logs_from[n]:].count(b"Accepted publickey") for n, h in lab.hosts.items())
            return {"pages": pages, "launcher_cpu_s": used["launcher"], "server_cpu_s": used["server"],
                    "server_cpu_pct_of_a_core": round(100 * used["server"] / args.window, 1),
                    "new_ssh_sessions_on_the_nodes": sessions}

        try:
            none, twenty = window(0), window(20)
        finally:
            server.close()
            launcher.terminate()
            launcher.wait(timeout=120)
        return {"window_s": args.window, "no_pages": none, "twenty_pages": twenty}
    finally:
        lab.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--keep-every", type=int, default=120,
                        help="steps between two index upkeeps (120 steps of 0.5 s: the collector's 60 s)")
    parser.add_argument("--million", type=int, default=1_000_000, help="steps of the longest run (0: not run)")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--baseline-rev", default="8160d95", help="the tree before the chart index")
    parser.add_argument("--parts", default="registry,long,million,pages",
                        help="also: lengths (the index and the server at --lengths steps, against --before-rev)")
    parser.add_argument("--lengths", default="100000,1000000")
    parser.add_argument("--before-rev", default="e2f25a3", help="the tree before the index's sketches")
    parser.add_argument("--before-lengths", default="100000,1000000", help="lengths the tree before is run at too")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    root = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-dashboard-"))
    baseline = root / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(baseline), args.baseline_rev],
                   check=True, capture_output=True)
    try:
        result = {"benchmark": "dashboard", "machine": machine(), "baseline": f"the tree at {args.baseline_rev}",
                  "goal": "runs --json <= 0.3 s at 1,000 runs; a 16x8-rank, 100,000-step run's first page <= 2 s "
                          "and <= 2 MB, server <= 200 MB flat with the run's length; 20 pages: nodes and launcher "
                          "unchanged"}
        if "registry" in parts:
            result["registry"] = registry(args, root, baseline)
        if "long" in parts:
            result["long_run"] = long_run(args, root, baseline)
        if "million" in parts and args.million:
            result["million_steps"] = million_steps(args, root)
        if "pages" in parts:
            result["pages"] = pages_on_a_live_run(args, root)
        if "lengths" in parts:
            before = root / "before"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(before), args.before_rev],
                           check=True, capture_output=True)
            try:
                result["run_lengths"] = run_lengths(args, root, before if args.before_lengths else None)
            finally:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)],
                               capture_output=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    if parts == {"lengths"}:  # a file of its own, each length's figures added to those kept
        path = RESULTS / "dashboard_lengths.json"
        result["run_lengths"] = json.loads(path.read_text())["run_lengths"]
    else:
        path = RESULTS / "dashboard.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
