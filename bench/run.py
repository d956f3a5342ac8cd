"""Run fsdpctl's benchmarks and print every goal with where it stands.

    .venv/bin/python bench/run.py [--only NAME[,NAME]] [--summary-only] [--markdown]

Each benchmark measures against a baseline in the same run (interleaved repeats, medians) and
writes bench/results/<name>.json; this collects them into one table. Absolute times depend on the
machine; the ratios are what to compare. The testbed benchmarks (doctor, launch, logs) need root.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BENCHMARKS = {
    "cli": ["cli_startup.py"],
    "workload": ["workload_step.py"],
    "doctor": ["doctor_fanout.py"],
    "launch": ["launch_overhead.py"],
    "copy": ["code_copy.py"],
    "throughput": ["log_throughput.py"],
    "init": ["init_fanout.py"],
    "environment": ["env_build.py --nodes 2,8"],
    "profile": ["profile_cost.py"],
    "heartbeat": ["heartbeat.py"],
    "slurm": ["slurm_submit.py"],
    "logs": ["log_latency.py"],
    "stacks": ["stacks.py"],
    "restart": ["restart.py"],
    "spares": ["spare_recovery.py --nodes 2", "spare_recovery.py --nodes 8"],
    "elastic": ["elastic_recovery.py --nodes 3"],
    "teardown": ["teardown.py --nodes 16"],
    "health": ["health_checks.py"],
    "containers": ["containers.py"],
    "gpu": ["gpu_workload.py"],
    "estimate": ["estimate_time.py"],
    "timing": ["rank_timing.py"],
    "live": ["live_view.py --nodes 16"],
    "dashboard": ["dashboard.py"],
    "collector": ["collector_scale.py --exports-off"],
    "exports": ["export_writers.py"],
}


def _views_at_scale(add, out: list) -> None:
    """The dashboard, report and collector at a long run's and a big cluster's scale, and the exports' writers."""
    board = load("dashboard")
    if board.get("long_run"):
        long, before = board["long_run"], board["long_run"].get("tree_before", {})
        page = long["this_tree"]
        add(f"dashboard: first page of a 16 x 8-rank, {long.get('steps', 0):,}-step run "
            f"({long['metrics_and_samples_mb'] / 1024:.1f} GB), seconds", page["first_s"], 2, "{:.2f}",
            note=f" (the tree before: {before.get('first_s', '-')}; index deleted: "
                 f"{long['this_tree_index_deleted']['first_s']}, once)")
        add("dashboard: that page's weight, MB", page["page_kb"] / 1024, 2, "{:.2f}",
            note=f" (before: {before.get('page_kb', 0) / 1024:.1f}); server {page['server_rss_mb']:.0f} MB "
                 f"(before {before.get('server_rss_mb', '-')})")
        add("`fsdpctl report` of that run, seconds", long["report_s"]["this_tree"], 2, "{:.2f}",
            note=f" (the tree before: {long['report_s'].get('tree_before', '-')})")
        out.append(("chart index of that run: size, upkeep CPU per run hour", f"{long['index_mb']} MB, "
                    f"{long['index_upkeep_cpu_s_per_run_hour']} s ({long['index_upkeep_pct_of_a_core']} % of a core)",
                    "-", "-"))
    if board.get("million_steps"):
        million = board["million_steps"]
        add("dashboard: first page of a 1,000,000-step run (8 ranks), seconds", million["this_tree"]["first_s"], 2,
            "{:.2f}", note=f" ({million['this_tree']['page_kb']} KB; report {million['report_s']} s)")
    lengths = load("dashboard_lengths").get("run_lengths", {})
    if len(lengths) >= 2:
        short, long_ = (lengths[k] for k in sorted(lengths, key=int)[::len(lengths) - 1])
        steps = sorted(lengths, key=int)
        mine = (short["this_tree"], long_["this_tree"])
        theirs = (short.get("tree_before", {}), long_.get("tree_before", {}))
        add(f"chart index, {int(steps[-1]):,} / {int(steps[0]):,} steps (8 ranks): size ratio",
            mine[1]["index_mb"] / max(mine[0]["index_mb"], 1e-9), 2, "{:.2f}",
            note=f" ({mine[0]['index_mb']} -> {mine[1]['index_mb']} MB; the tree before: "
                 f"{theirs[0].get('index_mb', '-')} -> {theirs[1].get('index_mb', '-')} MB)")
        add("dashboard server's memory, the same two runs: ratio", mine[1]["server_rss_mb"] / mine[0]["server_rss_mb"],
            2, "{:.2f}", note=f" ({mine[0]['server_rss_mb']:.0f} -> {mine[1]['server_rss_mb']:.0f} MB; "
                              f"the tree before: {theirs[0].get('server_rss_mb', '-')} -> "
                              f"{theirs[1].get('server_rss_mb', '-')} MB)")
        worst = max(m["relative_error"] or 0.0 for k in steps for m in lengths[k]["medians"].values())
        add("report's medians (tokens/s, MFU, step time) from the sketch / exact: largest relative error", worst,
            0.002, "{:.5f}")
    if board.get("registry"):
        reg = board["registry"]
        add("`fsdpctl runs --json`, 1,000 runs, seconds", reg.get("cli_runs_json_median_s_this_tree"), 0.3, "{:.2f}",
            note=f" (the tree before: {reg.get('cli_runs_json_median_s_tree_before', '-')})")
    scale = {**load("collector_scale").get("sizes", {}), **load("collector_scale_256").get("sizes", {})}
    for size, cases in scale.items():
        mine = cases.get("this (collector + exports)")
        plain = cases.get("this (collector, no exports)")
        base = next((v for k, v in cases.items() if not k.startswith("this")), None)
        if mine and base:
            add(f"launcher CPU while a {size}-node run goes: collector + exports / before the collector",
                mine["cpu_ms_per_node_per_s"] / base["cpu_ms_per_node_per_s"], 1.10,
                note=f" ({mine['cpu_ms_per_node_per_s']:.2f} vs {base['cpu_ms_per_node_per_s']:.2f} ms per node per s"
                     + (f"; collector alone {plain['cpu_ms_per_node_per_s'] / base['cpu_ms_per_node_per_s']:.2f}"
                        if plain else "") + ")")
        elif mine:
            out.append((f"launcher CPU while a {size}-node run goes, ms per node per second",
                        f"{mine['cpu_ms_per_node_per_s']:.2f}", "linear in nodes", "-"))
    written = load("export_writers")
    writers = written.get("cases", {})
    if writers:
        tb = writers.get("tensorboard new (this tree)", {})
        prom = writers.get("prometheus new (this tree)", {})
        out.append((f"export writers' CPU / those of {written.get('rev', 'the tree before')}: TensorBoard, Prometheus",
                    f"{tb.get('ratio_to_baseline', 0):.2f}, {prom.get('ratio_to_baseline', 0):.2f}", "-", "-"))


def load(name: str) -> dict:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def rows() -> list[tuple[str, str, str, str]]:
    """(figure, measured, goal, verdict) for every goal the issues set."""
    out: list[tuple[str, str, str, str]] = []

    def add(figure: str, value: float | None, goal: float, fmt: str = "{:.3f}", lower: bool = True,
            note: str = "") -> None:
        if value is None:
            out.append((figure, "not measured", f"{'<=' if lower else '>='} {goal}", "-"))
            return
        ok = value <= goal if lower else value >= goal
        out.append((figure, fmt.format(value) + note, f"{'<=' if lower else '>='} {goal}", "met" if ok else "MISSED"))

    cli = load("cli_startup").get("cases", {})
    add("`fsdpctl --help` / `import torch`", cli.get("fsdpctl --help", {}).get("ratio_to_baseline"), 0.1)
    add("`import fsdpctl` / `import torch`", cli.get("python -c 'import fsdpctl'", {}).get("ratio_to_baseline"), 0.1)
    imported = cli.get("python -c 'import fsdpctl'")
    if imported:
        floor = cli["python -c pass (interpreter floor)"]["median_s"]
        out.append(("`import fsdpctl` / `python -c pass`", f"{imported['median_s'] / floor:.3f}", "-", "-"))
    fan = load("doctor_fanout_32")
    if fan:
        cases = fan["cases"]
        add("doctor, 32 hosts / parallel OpenSSH (xargs -P 32)", cases["doctor"]["ratio_to_baseline"], 1.0)
        add("doctor, 32 hosts / sequential ssh loop", fan["doctor_vs_sequential"], 0.5)
        out.append(("doctor: SSH connections, remote execs per host",
                    f"{fan['connections_per_host']}, {fan['execs_per_host']}", "exactly 1, 1",
                    "met" if fan["connections_per_host"] == [1] and fan["execs_per_host"] == [1] else "MISSED"))
        out.append(("doctor: client CPU per host (32 hosts)", f"{fan['client_cpu_s_per_host'] * 1e3:.0f} ms", "-", "-"))
    else:
        add("doctor, 32 hosts / parallel OpenSSH", None, 1.0)
    for size, row in (load("init_fanout").get("sizes") or {}).items():
        add(f"init, {size} host(s) / doctor on the same hosts", row["fsdpctl init"]["ratio_to_baseline"], 1.2)
    for size, row in (load("env_build").get("sizes") or {}).items():
        add(f"environment, first made on {size} nodes / `uv pip sync` by hand on each (wheels copied before)",
            row["ratio_A_to_B"], 1.2, note=f" (with the copy timed: {row['ratio_A_to_B_with_copy']:.2f})")
        add(f"environment reused, {size} nodes: seconds a launch adds", row["launch_added_s"], 1.0, "{:.2f}",
            note=f" (its phase {row['environment_phase_reused_s']:.2f} s; the first sent "
                 f"{row['mb_sent_per_node']:.0f} MB per node)")
    cost = load("profile_cost")
    if cost.get("idle"):
        idle, traced = cost["idle"], cost["profiled"]
        add("profiling armed, none asked: share of a step, %", idle["share_of_a_step_pct"], 0.5, "{:.4f}",
            note=f" ({idle['extra_ns']:.0f} ns a step over an empty call; a step {idle['unprofiled_step_ms']:.1f} ms)")
        out.append(("profiled steps / the same rank's steps before (median, max)",
                    f"{traced['ratio_median']:.2f}, {traced['ratio_max']:.2f}", "-",
                    f"{traced['profiles']} profiles; trace {traced['trace_kb_gzipped_median']:.0f} KB gzipped"))
    launch = load("launch_overhead").get("cases", {})
    add("launch: time to first step / hand-typed torchrun", launch.get("fsdpctl launch", {}).get("ratio_to_baseline"),
        1.2)
    if launch.get("fsdpctl.launch() from Python"):
        api, cli_launch = launch["fsdpctl.launch() from Python"], launch["fsdpctl launch"]
        spread = (cli_launch["max_s"] - cli_launch["min_s"]) / cli_launch["median_s"]
        out.append(("launch: time to first step, `fsdpctl.launch()` / `fsdpctl launch` (same run)",
                    f"{api['median_s'] / cli_launch['median_s']:.3f} (CLI spread {spread:.2f})", "within noise",
                    "met" if abs(api["median_s"] / cli_launch["median_s"] - 1) <= max(spread, 0.05) else "MISSED"))
    user = load("launch_user_script").get("cases", {})
    add("launch: user script's first line / hand-typed torchrun (1 MB project)",
        user.get("fsdpctl launch -- user script (1 MB project)", {}).get("ratio_to_baseline"), 1.2)
    for name, size in (("code_copy", "50 MB"), ("code_copy_500mb", "500 MB")):
        copy = load(name).get("cases", {})
        add(f"code copy, {size} to 2 nodes / tar c | ssh tar x in parallel",
            copy.get("fsdpctl (collect, pack, send, unpack, start)", {}).get("ratio_to_baseline"), 1.2)
    flood = load("log_throughput")
    if flood:
        med = flood["median"]
        out.append(("logs: 2 x 200,000 lines, launcher's last line after the ranks' last / ssh cat of the logs",
                    f"{flood['lag_over_cat']:.3f} ({med['lag_s']:.2f} s after a {med['print_s']:.2f} s print; "
                    f"cat {med['cat_s']:.2f} s)", "<= 1.5", "met" if flood["lag_over_cat"] <= 1.5 else "MISSED"))
        out.append(("logs: 2 x 200,000 lines, first printed to last shown / ssh cat of the logs",
                    f"{flood['stream_over_cat']:.3f}", "-", "-"))
        out.append(("logs: launcher peak RSS, 200,000 / 20,000 lines per rank",
                    f"{flood['peak_rss_bytes'] / 2**20:.0f} / "
                    f"{flood['peak_rss_bytes_tenth_of_the_lines'] / 2**20:.0f} MiB", "bounded", "-"))
    beat = load("heartbeat")
    if beat:
        ours = next(row for name, row in beat["cases"].items() if name.startswith("this tree"))
        base = beat["cases"][beat["baseline"]]
        add(f"launch with heartbeats: time to first step / without ({beat['baseline_rev']})",
            ours["ratio_to_baseline"], 1.05)
        kib = [row["bytes_per_node_per_minute"] / 1024 for row in (ours, base)]
        out.append(("heartbeats: bytes per node per minute, silent run (without)",
                    f"{kib[0]:.1f} KiB ({kib[1]:.1f})", "-", "-"))
    else:
        add("launch with heartbeats: time to first step / without", None, 1.05)
    slurm = load("slurm_submit").get("cases", {})
    for case, label in (("fsdpctl submit --slurm", "sbatch"), ("fsdpctl submit --slurm --via submitit", "submitit")):
        ratio = slurm.get(case, {}).get("ratio_to_baseline")
        out.append((f"Slurm submit to first step ({label}) / hand-written sbatch script",
                    f"{ratio:.3f}" if ratio else "not measured", "no goal set", "-"))
    restart = load("restart")
    if restart:
        ours = restart["cases"]["fsdpctl: rank killed -> first step of attempt 2"]
        phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in restart["phases_median_s"].items())
        out.append(("restart: rank killed -> first step of attempt 2 / the same run started fresh by hand",
                    f"{ours['ratio_to_baseline']:.3f} ({ours['median_s']:.1f} s: {phases})", "no goal set", "-"))
    for nodes in (2, 8):
        spared = load(f"spare_recovery_{nodes}")
        if spared:
            ours = next(row for name, row in spared["cases"].items() if name.startswith("fsdpctl"))
            phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in spared["phases_median_s"].items())
            out.append((f"spare, {nodes}+1 nodes: (link cut -> first step on the spare - node timeout) / fresh start",
                        f"{spared['beyond_node_timeout_over_fresh']:.2f} ({ours['median_s']:.1f} s: {phases})",
                        "<= 1.2", "PASS" if spared["beyond_node_timeout_over_fresh"] <= 1.2 else "FAIL"))
    elastic = load("elastic_recovery_3")
    if elastic:
        cases = elastic["cases"]
        shrink = next(row for name, row in cases.items() if name.startswith("shrink"))
        grow = next(row for name, row in cases.items() if name.startswith("grow"))
        phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in elastic["shrink_phases_median_s"].items())
        out.append(("elastic, 3 -> 2 nodes, no spare: (link cut -> first step on 2 - node timeout) / fresh start on 2",
                    f"{elastic['shrink_beyond_node_timeout_over_fresh']:.2f} ({shrink['median_s']:.1f} s: {phases})",
                    "<= 1.2", "PASS" if elastic["shrink_beyond_node_timeout_over_fresh"] <= 1.2 else "FAIL"))
        grown = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in elastic.get("grow_phases_median_s",
                                                                                    {}).items())
        out.append(("elastic, 2 -> 3 nodes: (checkpoint -> first step on 3) / fresh start on 3",
                    f"{elastic['grow_over_fresh']:.2f} ({grow['median_s']:.1f} s{': ' + grown if grown else ''})",
                    "<= 1.2",
                    "PASS" if elastic["grow_over_fresh"] <= 1.2 else "FAIL"))
    teardown = load("teardown_16")
    if teardown:
        floor = next(row for name, row in teardown["cases"].items() if name.startswith("by hand"))
        ours = teardown["empty_median_s"]
        phases = teardown.get("phases_median_s", {})
        named, failed = phases.get("no process on a node names beat.py (ps)"), phases.get("the launcher's FAILED line")
        seen = (f"; `ps | grep` on every node empty after {named:.2f} s; the launcher's FAILED line {failed:.2f} s, "
                f"its exit {phases['the launcher exits']:.2f} s" if named is not None else "")
        out.append(("teardown, 16 nodes: a rank killed -> every other node empty, seconds (/ ssh kill -KILL to all "
                    "16 at once)", f"{ours:.2f} ({ours / floor['median_s']:.2f} x the by-hand floor, "
                    f"{floor['median_s']:.2f} s{seen})", "<= 5 s", "PASS" if ours <= 5.0 else "FAIL"))
    for size in (8, 32):
        cases = load(f"health_doctor_{size}").get("cases", {})
        add(f"doctor --health, {size} hosts x 8 fake GPUs / doctor without the GPU part",
            cases.get("doctor --health", {}).get("ratio_to_baseline"), 1.5,
            note=f" (default doctor, GPU part: {cases['doctor (GPU part, default)']['ratio_to_baseline']:.3f})"
            if cases else "")
    for size in (4, 8, 16):
        links = load(f"health_links_{size}")
        if links:
            seconds = links["cases"]["links"]["median_s"]
            out.append((f"doctor --links, {size} hosts: seconds (rounds, pairs; the check run itself)",
                        f"{seconds:.1f} ({links['rounds']}, {links['pairs']}; {links['check_seconds']:.1f} s)",
                        "< 60 s at 8 hosts" if size == 8 else "-",
                        ("met" if seconds < 60 else "MISSED") if size == 8 else "-"))
    sampling = load("health_sampling").get("cases", {})
    for every in ("5 s (default)", "1 s"):
        add(f"workload step, GPUs sampled every {every} / not sampled (2 hosts, fake nvidia-smi)",
            sampling.get(f"GPUs sampled every {every}", {}).get("ratio_to_baseline"), 1.05)
    first = load("containers_first_step").get("cases", {})
    add("containers: time to the first step, podman / bare (2 hosts, image present)",
        first.get("in a podman container", {}).get("ratio_to_baseline"), 1.15)
    gloo = load("containers_gloo")
    if gloo:
        cases, bare = gloo["cases"], gloo["samples"]["bare"]
        inside = cases["in a podman container"]["ratio_to_baseline"]
        off = cases["in a podman container, seccomp off"]["ratio_to_baseline"]
        # On 2 shared cores one case's runs spread wider than any difference: say so, not "met".
        spread = max(bare) / min(bare)
        out.append(("containers: gloo bus bandwidth (doctor --collectives), podman / bare (higher is better)",
                    f"{inside:.3f} (seccomp off {off:.3f}; bare's own runs spread {spread:.1f}x)", "within 5 %",
                    "met" if inside >= 0.95 and spread < 1.1 else "not resolved: noise"))
    for ranks in (4, 32):
        stacks = load(f"stacks_{ranks}_ranks").get("cases", {})
        ours = stacks.get("fsdpctl stacks", {})
        if ranks == 4:
            add("stacks, 2 nodes x 2 ranks / ssh py-spy dump per rank, in parallel", ours.get("ratio_to_baseline"),
                1.5)
        elif ours:
            by_hand = stacks["ssh host py-spy dump --pid P, all at once"]["median_s"]
            out.append((f"stacks, {ranks} ranks: seconds (ssh py-spy dump per rank, in parallel)",
                        f"{ours['median_s']:.2f} ({by_hand:.2f})", "-", "-"))
    work = load("workload").get("ratios", {})
    add("workload step / bare FSDP2 loop", work.get("workload_over_bare_fsdp2"), 1.05)
    add("workload step, hook + flight recorder on / off", work.get("hooked_over_plain"), 1.02)
    add("per-rank state bytes, world 2 / world 1 (full)", work.get("state_bytes_world2_over_world1_fsdp2_full"), 0.55)
    logs = load("log_latency").get("cases", {})
    ours = logs.get("fsdpctl launch", {})
    add("log p99 latency / `ssh tail -F`", ours.get("p99_ratio_to_baseline"), 1.5)
    add("log p99 latency (s), lines lost", ours.get("p99_s"), 1.0, "{:.3f}",
        note=f", {ours.get('lost')} lost" if ours else "")
    estimate = load("estimate_time").get("cases", {})
    for name, row in estimate.items():
        if "trace_s" in row:
            add(f"estimate: {name}, seconds (whole process; host {row['peak_rss_mib']} MiB)", row["median_s"], 15,
                "{:.1f}")
    timing = load("rank_timing")
    if timing:
        step = timing["workload_step"]
        # The goal: within 1.02x, or within the noise measured in the same run (off against off).
        add("workload step, per-rank timings on / off", step["on_over_off"],
            max(1.02, round(step["noise_off_over_off"], 3)),
            note=f" (off / off: {step['noise_off_over_off']:.3f}, the noise)")
        add("`fsdpctl report`, 10,000 steps x 16 ranks, seconds", timing["report"]["report_s"], 3, "{:.2f}",
            note=f"; with --plot {timing['report']['report_plot_s']:.2f}")
    live = load("live_view_16")
    if live:
        cases = live["cases"]
        add("live view, 16 nodes x 8 fake GPUs: launcher CPU with collector + exports / before the collector",
            cases["collector + exports (this tree)"]["ratio_to_baseline"], 1.05,
            note=f" (collector alone {cases['collector (this tree)']['ratio_to_baseline']:.3f})")
        add("live view: `fsdpctl top` CPU, % of one core", live["top_cpu_pct_of_a_core"], 5, "{:.1f}%",
            note=f", {live['top_rss_mb_max']:.0f} MB")
        shown = live["step_shown_after_landing_s"]
        add("live view: a step line landed here -> shown by top, median s", shown["median"], 1.0, "{:.2f}",
            note=f" (max {shown['max']:.2f})")
        none, ten = live["nodes_cost_no_top"], live["nodes_cost_ten_tops"]
        out.append(("live view: the nodes with ten tops / none (new SSH sessions; their CPU s)",
                    f"{ten['new_ssh_sessions']}, {ten['node_cpu_s']} / {none['new_ssh_sessions']}, "
                    f"{none['node_cpu_s']}", "the same",
                    "met" if ten["new_ssh_sessions"] == none["new_ssh_sessions"] == 0 else "MISSED"))
    _views_at_scale(add, out)
    gpu = load("gpu")
    if gpu.get("skipped") or not gpu:
        out.append(("GPU: MFU of gpt2-124m, bf16, compiled", gpu.get("skipped", "not measured"), ">= 45%", "-"))
    else:
        device = gpu["runs"].get("ref", {}).get("device", "GPU")
        where = f"{device}, batch {gpu['batch_size']}, vocab {gpu['model_vocab_size']}"
        for label, row in gpu.get("ratios", {}).items():
            add(f"GPU ({where}): tokens/s {label}", row["ratio"], row["goal"], lower=False)
        mfu = gpu["runs"].get("fsdp2+compile", {}).get("mfu")
        add(f"GPU ({where}): MFU of fsdp2+compile", mfu * 100 if mfu else None, 45, "{:.1f}%", lower=False)
        spread = gpu["runs"].get("fsdp2+compile", {}).get("window_spread")
        add("GPU: spread between log windows, fsdp2+compile", spread * 100 if spread is not None else None, 5,
            "{:.1f}%")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated: " + ", ".join(BENCHMARKS))
    parser.add_argument("--summary-only", action="store_true", help="only print the table of saved results")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (for README)")
    args = parser.parse_args()
    chosen = [n for n in args.only.split(",") if n] or list(BENCHMARKS)
    unknown = [n for n in chosen if n not in BENCHMARKS]
    if unknown:
        sys.exit(f"bench: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if not args.summary_only:
        for name in chosen:
            print(f"\n=== {name} ===", flush=True)
            for command in BENCHMARKS[name]:
                script, *script_args = command.split()
                done = subprocess.run([sys.executable, str(HERE / script), *script_args], check=False)
                if done.returncode != 0:
                    print(f"bench: {command} exited {done.returncode}", flush=True)
    table = rows()
    print()
    if args.markdown:
        print("| figure | measured | goal | |\n|---|---|---|---|")
        for row in table:
            print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    else:
        for figure, value, goal, verdict in table:
            print(f"{figure:52s} {value:>26s} {goal:>14s}  {verdict}")


if __name__ == "__main__":
    main()
