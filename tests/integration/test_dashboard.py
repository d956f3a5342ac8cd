"""``fsdpctl dashboard`` in a real browser (Debian's Chromium, driven by Playwright), on a live two-node
run of the namespace testbed: two hosts with a fake nvidia-smi (two GPUs each, sampled every second),
their sshd pinned to a core each. The run is a program of the user's: each rank times a busy loop per
step and writes it to metrics.jsonl; rank 1 prints hostile markup. While it goes: the runs page lists
it; its page shows both nodes, its step count and its loss chart grow, a throttled rank is marked the
straggler, d2's GPU reporting a HW slowdown shows on d2's line and chart, the markup shows as text and
runs nothing; the charts by time read wall-clock times, the plan is tables with its JSON folded, a
program that logs no tokens/s gets a line, not an empty chart; the stop button ends the run. The hosts
page, the attacks a page of another origin can try, and ``report --html`` of two runs (one without
per-rank timings) opened from a file with the network off: one loss chart with a series per run,
tables whole. Screenshots go to tmp_path (and to ``$FSDPCTL_SCREENSHOTS`` when set, e.g.
docs/screenshots).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.conftest import require_netns
from tests.integration.test_launch import processes_of, run, run_dir_of, start
from tests.integration.test_live import SLOWED, healthy
from tests.testbed import fake_gpu
from tests.testbed.lab import Lab
from tests.testbed.throttle import Throttle

pytestmark = pytest.mark.integration
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PROGRAM = """\
import json, os, sys, time
rank, run_dir = int(os.environ["RANK"]), os.environ["FSDPCTL_RUN_DIR"]
plain = sys.argv[2:] == ["plain"]  # rank 0's loss alone, one row a step: no per-rank timings
if rank == 1:
    print("<script>alert(1)</script> and <img src=x onerror=alert(2)>", flush=True)
for step in range(1, int(sys.argv[1]) + 1):
    started, spin = time.perf_counter(), time.process_time()
    while time.process_time() - spin < 0.05:  # compute, slowed for real when the rank is held off the CPU
        pass
    took = time.perf_counter() - started
    row = {"step": step, "rank": rank, "loss": 4.0 / step, "step_time_s": took, "time": time.time()}
    if plain:
        row = {"step": step, "loss": 3.0 / step + 0.1, "time": time.time()} if rank == 0 else None
    if row:
        with open(os.path.join(run_dir, "metrics.jsonl"), "a") as out:
            out.write(json.dumps(row) + "\\n")
    if rank == 0:
        print(f"step={step} loss={4.0 / step:.4f}", flush=True)
    time.sleep(0.2)
"""


def browser_or_skip():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("the dashboard's browser tests need playwright (the test extra)")
        pytest.skip("needs playwright")
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI") == "true":
            pytest.fail("the dashboard's browser tests need Debian's chromium (.ci/run installs it)")
        pytest.skip("needs chromium")
    return sync_playwright


@pytest.fixture(scope="module")
def dash_lab(tmp_path_factory):
    require_netns()
    sync_playwright = browser_or_skip()
    lab = Lab(tmp_path_factory.mktemp("dashlab"), ["d1", "d2"]).up()
    try:
        for index, name in enumerate(("d1", "d2")):
            scenario = lab.hosts[name].dir / "gpu.json"
            bin_dir = fake_gpu.install(lab.hosts[name].dir / "bin", scenario)
            healthy(lab, name)
            lab.start_sshd(name, f"SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin\n",
                           setup=f"taskset -p -c {index} $$ >/dev/null && ")
        # The browser runs in the client namespace, beside the dashboard (whose stop button reaches the
        # nodes from there): Playwright talks to it over a pipe, which no namespace stands in the way of.
        wrapper = lab.root / "chromium-in-client"
        wrapper.write_text(f"#!/bin/sh\nexec ip netns exec {lab.client_ns} {CHROMIUM} \"$@\"\n")
        wrapper.chmod(0o755)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(wrapper), args=["--no-sandbox"])
            try:
                yield lab, browser
            finally:
                browser.close()
    finally:
        lab.down()


class Dashboard:
    """``fsdpctl dashboard`` on loopback, for the test's runs directory."""

    def __init__(self, lab: Lab, tmp_path: Path):
        # the same HOME and state as the launches' (test_launch.fsdpctl): the hosts' last checks
        env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(lab.in_client([sys.executable, "-m", "fsdpctl", "dashboard", "--runs-dir",
                                                       str(tmp_path / "runs"), "--port", "0"]),
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.url = self.process.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), self.process.stderr.read()
        self.base = self.url.split("/?")[0]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def shot(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    where = os.environ.get("FSDPCTL_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(where) / path.name)
    return path


def wait(test, what: str, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = test()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"never: {what}")


def test_a_live_run_in_the_browser_then_stopped_from_it(dash_lab, tmp_path):
    lab, browser = dash_lab
    d1, d2 = lab.hosts["d1"].address, lab.hosts["d2"].address
    profile = tmp_path / "dash.yaml"
    profile.write_text(lab.profile_yaml(["d1", "d2"], python=sys.executable, name="dash",
                                        extra="health:\n  sample_seconds: 1\n"))
    code = tmp_path / "project"
    code.mkdir()
    (code / "train.py").write_text(PROGRAM)
    started = run(lab, tmp_path, "launch", "-p", str(profile), "--code", str(code), "--detach", "--", "train.py", "400")
    assert started.returncode == 0, started.stderr[-2000:]
    run_id = started.stdout.strip().splitlines()[0]
    dashboard = Dashboard(lab, tmp_path)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    dialogs: list[str] = []
    errors: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
    page.on("pageerror", lambda error: errors.append(str(error)))
    throttle = None
    try:
        page.goto(dashboard.url)
        assert page.url == dashboard.base + "/"  # the token left the address bar for a cookie
        page.wait_for_selector(f'#runs-table tr[data-run="{run_id}"]', timeout=30_000)
        shot(page, tmp_path, "dashboard-runs")
        page.click(f'#runs-table tr[data-run="{run_id}"]')
        page.wait_for_selector('#nodes-table tr[data-node="1"]', timeout=30_000)
        nodes = page.inner_text("#nodes-table")
        assert d1 in nodes and d2 in nodes

        def step() -> int:
            text = page.inner_text("#run-step") if page.query_selector("#run-step") else "0"
            return int(text) if text.isdigit() else 0

        def points() -> int:
            return int(page.get_attribute("#chart-loss", "data-points") or 0)

        first_step = wait(lambda: step() or None, "a step")
        first_points = wait(lambda: points() or None, "the loss chart drawn")
        wait(lambda: step() > first_step + 3 and points() > first_points, "the step count and the loss chart growing")

        throttle = Throttle(lab.root, rank=1, module="train.py")
        healthy(lab, "d2", **SLOWED)
        wait(lambda: "straggler: rank 1" in page.inner_text("#nodes"), "rank 1 marked the straggler", 150)
        d2_row = '#nodes-table tr[data-node="1"][data-gpu="0"]'
        wait(lambda: "HW slowdown" in page.inner_text(d2_row), "d2's GPU 0 slowed on d2's line")
        assert "HW slowdown" not in page.inner_text('#nodes-table tr[data-node="0"][data-gpu="0"]')
        slowed = wait(lambda: int(page.get_attribute(f'[data-node-key="1 {d2}"] .gpu-chart', "data-slowed") or 0),
                      "the slowdown marked on d2's GPU chart")
        assert slowed > 0 and page.get_attribute(f'[data-node-key="0 {d1}"] .gpu-chart', "data-slowed") == "0"
        charts_by_time = ("[...document.querySelectorAll('#gpus .gpu-chart, #gpus .compute-chart')]"
                          ".filter((c) => c.fsdpctlChart).map((c) => [c.className, c.fsdpctlChart.axes[0]._values])")
        drawn = wait(lambda: (got := page.evaluate(charts_by_time)) and
                     {"gpu-chart", "compute-chart"} <= {kind for kind, _ in got} and got, "the charts by time drawn")
        for _, labels in drawn:  # the labels uPlot drew on each chart's time axis
            assert labels and all(re.fullmatch(r"\d\d:\d\d:\d\d", label) for label in labels), labels
            assert len(set(labels)) == len(labels), labels  # whole seconds: no two ticks read the same

        # the program logs neither tokens/s nor MFU: one line says so, no empty chart
        assert page.inner_text("#chart-loss #no-speed") == "this program logs no tokens/s or MFU"
        assert page.is_hidden("#chart-speed") and not page.query_selector("#chart-speed .uplot")
        # the plan: its facts and nodes in tables, the JSON folded away
        assert "train.py 400" in page.inner_text("#plan-run") and page.query_selector("#plan-env")
        plan_nodes = page.inner_text("#plan-nodes")
        assert d1 in plan_nodes and d2 in plan_nodes
        assert not page.evaluate("document.querySelector('#plan-raw').open") and page.is_hidden("#plan-json")

        logs = page.inner_text("#logs")
        assert "<script>alert(1)</script> and <img src=x onerror=alert(2)>" in logs
        assert page.evaluate("document.querySelectorAll('#logs script, #logs img').length") == 0
        page.select_option("#log-rank", "1")
        only_rank_1 = page.inner_text("#logs").strip().splitlines()
        assert f"[{d2} r1] <script>alert(1)</script> and <img src=x onerror=alert(2)>" in only_rank_1
        assert all(line.startswith(f"[{d2} r1] ") for line in only_rank_1), only_rank_1
        print(f"\n--- screenshots in {tmp_path} ---")
        shot(page, tmp_path, "dashboard-run-straggler-and-slowed-gpu")
        throttle.stop()
        healthy(lab, "d2")

        page.click("#stop-button")  # confirm() is accepted
        wait(lambda: "stopped" in page.inner_text("#run-state"), "the run stopped", 60)
        assert dialogs == [f"Stop run {run_id} on every node?"]  # the markup raised no alert
        assert not errors, errors
        wait(lambda: not processes_of(run_id), "every process of the run gone", 30)

        page.goto(f"{dashboard.base}/hosts/dash")
        page.wait_for_selector("#hosts-table")
        hosts = page.inner_text("#hosts-table")
        assert d1 in hosts and d2 in hosts and "active" in hosts and "the preflight of run" in hosts
        shot(page, tmp_path, "dashboard-hosts")
    finally:
        if throttle is not None:
            throttle.stop()
        healthy(lab, "d2")
        page.close()
        dashboard.close()
    assert not processes_of(run_id)


def test_a_page_of_another_origin_can_neither_read_nor_act(dash_lab, tmp_path):
    lab, browser = dash_lab
    profile = tmp_path / "dash.yaml"
    profile.write_text(lab.profile_yaml(["d1", "d2"], python=sys.executable, name="dash"))
    code = tmp_path / "project"
    code.mkdir()
    (code / "train.py").write_text(PROGRAM)
    launched = start(lab, tmp_path, "launch", "-p", str(profile), "--code", str(code), "--", "train.py", "150")
    run_dir = run_dir_of(tmp_path)
    dashboard = Dashboard(lab, tmp_path)
    evil = subprocess.Popen(lab.in_client([sys.executable, "-m", "tests.testbed.other_origin", dashboard.base,
                                           run_dir.name]), stdout=subprocess.PIPE, text=True, cwd=REPO)
    context = browser.new_context()
    try:
        evil_port = evil.stdout.readline().strip()
        page = context.new_page()
        page.goto(dashboard.url)  # the victim is logged in: the cookie is set for 127.0.0.1
        evil_page = context.new_page()
        evil_page.goto(f"http://127.0.0.2:{evil_port}/")
        results = wait(lambda: evil_page.evaluate("window.results.length === 3 && window.results"),
                       "the attacker's three tries", 30)
        print(f"\n--- a page of another origin tried: {results} ---")
        assert "read refused" in results  # no CORS: it cannot read the runs
        assert "post refused" in results or "post:403" in results or "post:401" in results
        time.sleep(1)
        assert launched.process.poll() is None, "a page of another origin stopped the run"
        assert '"state": "running"' in (run_dir / "run.json").read_text()
    finally:
        context.close()
        evil.terminate()
        evil.wait(timeout=30)
        dashboard.close()
        launched.process.terminate()
        launched.finish(timeout=120)


def test_report_html_opens_from_a_file_with_the_network_off(dash_lab, tmp_path):
    lab, browser = dash_lab
    profile = tmp_path / "dash.yaml"
    profile.write_text(lab.profile_yaml(["d1", "d2"], python=sys.executable, name="dash",
                                        extra="health:\n  sample_seconds: 1\n"))
    code = tmp_path / "project"
    code.mkdir()
    (code / "train.py").write_text(PROGRAM)
    ids = []
    for args in (["30"], ["40", "plain"]):  # the second run writes rank 0's loss alone: no per-rank timings
        done = run(lab, tmp_path, "launch", "-p", str(profile), "--code", str(code), "--", "train.py", *args)
        assert done.returncode == 0, done.stderr[-2000:]
        ids.append(re.search(r"run (\S+) succeeded", done.stderr).group(1))
    timed, plain = ids
    hostile = "<img src=x onerror=alert(3)>"
    profiled = profile_of_two_ranks(tmp_path / "runs" / timed, hostile)
    out = tmp_path / "report.html"
    reported = run(lab, tmp_path, "report", *ids, "--html", str(out))
    assert reported.returncode == 0, reported.stderr[-2000:]
    context = browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
    requests: list[str] = []
    try:
        page = context.new_page()
        page.on("request", lambda request: requests.append(request.url))
        page.goto(out.as_uri())
        # the runs compared on one loss chart: a series (and a legend entry) per run
        page.wait_for_selector("#compare-loss .uplot", timeout=30_000)
        assert page.evaluate("document.querySelector('#compare-loss').fsdpctlChart.series"
                             ".slice(1).map((s) => s.label)") == ids
        assert page.get_attribute("#compare-loss", "data-points") == "40"
        legend = page.inner_text("#compare-loss .u-legend")
        assert timed in legend and plain in legend
        assert page.query_selector_all("#chart-loss, #chart-speed") == []  # no loss chart of a run's own
        assert page.inner_text("#compare #no-speed") == "no run here logs tokens/s or MFU"
        for run_id in ids:
            part = f'.report-run[data-run="{run_id}"]'
            page.wait_for_selector(f"{part} .uplot", timeout=30_000)
            assert "<script>alert(1)</script>" in page.inner_text(f"{part} #logs")
        assert page.evaluate("document.querySelectorAll('#logs script').length") == 0
        stray = page.evaluate("[...document.querySelectorAll('.report-run')].flatMap((c) => [...c.childNodes])"
                              ".filter((n) => n.nodeType !== 1).map((n) => n.textContent)")
        assert stray == [], stray  # every part of a run's section is a panel: no stray text such as "null"
        # where each run's time went: its ratios, a bar part and a table row per category it has
        for run_id in ids:
            account = f'.report-run[data-run="{run_id}"] #goodput'
            assert page.inner_text(f"{account} #goodput-line").startswith("ETTR ")
            shown = page.evaluate(f"[...document.querySelectorAll('{account} #goodput-table tr[data-category]')]"
                                  ".map((r) => r.dataset.category)")
            assert {"startup", "productive"} <= set(shown) and "unattributed" not in shown, shown
            widths = page.evaluate(f"[...document.querySelectorAll('{account} #goodput-bar > span')]"
                                   ".map((s) => parseFloat(s.style.width))")
            assert sum(widths) == pytest.approx(100, abs=0.5), widths  # every second of the run, once
            # ... and over the run's time: every column but the last (the run's end in it) full, start-up first
            columns = page.evaluate(f"[...document.querySelectorAll('{account} #goodput-minutes > .gp-column')]"
                                    ".map((c) => [...c.children]"
                                    ".map((s) => [s.dataset.category, parseFloat(s.style.height)]))")
            assert len(columns) >= 5 and columns[0][0][0] == "startup", columns
            assert all(sum(h for _, h in column) == pytest.approx(100, abs=1) for column in columns[:-1]), columns
        # its profile: the verdict and each rank's times, a host name with markup shown as text
        shown = f'.report-run[data-run="{timed}"] #profiles'
        assert page.inner_text(f'{shown} [data-profile="p1"]') == profiled["verdict"]
        assert page.evaluate(f"[...document.querySelectorAll('{shown} tr[data-rank]')].map((r) => r.dataset.rank)") \
            == ["0", "1"]
        assert hostile in page.inner_text(f'{shown} tr[data-rank="1"]')
        assert page.evaluate(f"document.querySelectorAll('{shown} img').length") == 0
        picture = f'{shown} canvas.profile-timeline[data-profile="p1"]'
        assert page.get_attribute(picture, "data-ranks") == "2"
        # two steps on each of two ranks, a compute and a communication span in each: 8 spans drawn
        assert page.get_attribute(picture, "data-drawn") == "8"
        assert page.inner_text(f'.report-run[data-run="{plain}"] #profiles').endswith("or the button above")
        # a run without per-rank timings: the line alone, no blank box under it
        heat = f'.report-run[data-run="{plain}"] #heat'
        assert page.inner_text(f"{heat} #heat-legend") == "no per-rank timings"
        assert page.is_hidden(f"{heat} canvas")
        assert page.evaluate(f"document.querySelector('{heat}').offsetHeight") < 120
        assert page.is_visible(f'.report-run[data-run="{timed}"] #heat canvas')
        # every table whole: it fits its panel, or (narrower window) scrolls in it; none cut at the edge
        fits = ("[...document.querySelectorAll('table:not(.u-legend)')].map((t) => t.parentElement).map((w) =>"
                " [w.firstChild.id, w.className, w.scrollWidth <= w.clientWidth, getComputedStyle(w).overflowX])")
        tables = page.evaluate(fits)
        assert {"compare-table", "nodes-table", "plan-run", "plan-nodes"} <= {t[0] for t in tables}
        assert all(t[1] == "table-wrap" and t[2] for t in tables), tables
        shot(page, tmp_path, "report-html")
        page.set_viewport_size({"width": 560, "height": 900})
        assert all(t[1] == "table-wrap" and (t[2] or t[3] == "auto") for t in page.evaluate(fits))
        assert not all(t[2] for t in page.evaluate(fits))  # some do scroll there: the check can tell
    finally:
        context.close()
    assert requests == [out.as_uri()], requests  # nothing but the file itself


def profile_of_two_ranks(run_dir: Path, host: str) -> dict:
    """A profile's summary written where ``fsdpctl profile`` leaves it, from two ranks' traces (rank 1 on
    ``host``, four times slower in compute)."""
    import json

    from fsdpctl.diagnose.trace_summary import PROFILES, summarize
    from tests.unit.test_profiling import rank_trace

    summary = summarize([rank_trace(0, "10.0.0.1", 0, 2_000.0, 6_500.0), rank_trace(1, host, 0, 8_000.0, 500.0)])
    folder = run_dir / PROFILES / "p1"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({**summary, "profile_id": "p1", "steps": [5, 6],
                                                     "ranks_profiled": [0, 1], "notes": []}))
    return summary


def _finished_run(runs: Path, nodes: int, steps: int) -> str:
    """A finished run of ``nodes`` x 2 ranks written as its collector leaves one: metrics with every
    rank's timings, each node's GPU samples, no chart index (the page keeps one)."""
    import json

    from fsdpctl.backends import plan_run, render_scripts
    from fsdpctl.plan.types import Overrides, overrides_to_json
    from fsdpctl.profiles.loader import parse_profile
    from fsdpctl.rundir.rundir import create_run
    from fsdpctl.rundir.state import RunState

    hosts = [f"10.9.0.{n + 1}" for n in range(nodes)]
    text = f"name: wide\nbackend: ssh\nhosts: [{', '.join(hosts)}]\nnproc_per_node: 2\nworkdir: /scratch/w\n"
    run_id = "wide-20261127-120000-0001"
    inputs = {"profile_source": "wide.yaml", "local_python": "/usr/bin/python3", "home": "/home/me",
              "local_cwd": str(runs)}
    plan = plan_run(parse_profile(text, "wide.yaml"), run_id=run_id, local_run_dir=str(runs / run_id),
                    overrides=Overrides(), **inputs)
    run = create_run(plan, parse_profile(text, "wide.yaml"), render_scripts(plan), text,
                     {**inputs, "overrides": overrides_to_json(Overrides())})
    run.change(state=RunState.SUCCEEDED, started_at="2026-11-27T12:00:00+00:00",
               finished_at="2026-11-27T12:10:00+00:00", exit_code=0)
    live, t0 = run.root / "live", 1_790_000_000.0
    (live / "node0").mkdir(parents=True)
    with (live / "node0" / "metrics.jsonl").open("w") as out:
        for step in range(1, steps + 1):
            ranks = [{"rank": r, "node": r // 2, "host": hosts[r // 2], "local_rank": r % 2,
                      "compute_s": 0.3 + 0.01 * (step % 3), "comm_s": 0.1, "wall_s": 0.5} for r in range(2 * nodes)]
            out.write(json.dumps({"kind": "train", "step": step, "loss": 5 / step, "time": t0 + step,
                                  "step_time_s": 1.0, "ranks": ranks}) + "\n")
    for node in range(nodes):
        samples = live / f"node{node}" / "gpu" / f"node{node}.jsonl"
        samples.parent.mkdir(parents=True)
        samples.write_text("".join(json.dumps({"t": t0 + i * 5, "node": node, "host": hosts[node], "gpus": [
            {"index": str(g), "sm_mhz": 1980.0 - node, "sm_max_mhz": 1980.0, "reasons": []} for g in range(2)]}) + "\n"
            for i in range(steps // 5)))
    return run_id


def test_a_wide_runs_page_brings_its_first_nodes_curves_and_each_other_node_s_as_it_comes_into_view(dash_lab,
                                                                                                     tmp_path):
    lab, browser = dash_lab
    run_id = _finished_run(tmp_path / "runs", nodes=5, steps=300)
    dashboard = Dashboard(lab, tmp_path)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url) if "/nodes/" in request.url else None)
    try:
        page.goto(dashboard.url)
        page.goto(f"{dashboard.base}/run/{run_id}")
        page.wait_for_selector('[data-node-key="0 10.9.0.1"] .gpu-chart .uplot', timeout=30_000)
        boxes = page.eval_on_selector_all(".node-charts",
                                          "els => els.map(e => [e.dataset.node, e.dataset.loaded || ''])")
        assert [b[0] for b in boxes] == ["0", "1", "2", "3", "4"]
        assert dict(boxes)["0"] == dict(boxes)["1"] == "page" and dict(boxes)["4"] == ""  # not drawn, not asked
        assert not any(url.endswith("/nodes/4") for url in asked)
        page.eval_on_selector('[data-node-key="4 10.9.0.5"]', "e => e.scrollIntoView()")
        wait(lambda: page.get_attribute('[data-node-key="4 10.9.0.5"]', "data-loaded") == "asked", "node 4 drawn")
        page.wait_for_selector('[data-node-key="4 10.9.0.5"] .gpu-chart .uplot')
        page.wait_for_selector('[data-node-key="4 10.9.0.5"] .compute-chart .uplot')
        assert int(page.get_attribute('[data-node-key="4 10.9.0.5"] .gpu-chart', "data-points")) == 60
        assert any(url.endswith("/nodes/4") for url in asked) and not errors, errors
    finally:
        page.close()
        dashboard.close()
    assert (tmp_path / "runs" / run_id / "live" / "charts.idx").is_file()  # kept by the page's first look
