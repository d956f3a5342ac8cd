"""The user's job before anything runs: job files, --env, requirements files, the code folder, the plan."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fsdpctl.backends import plan_run
from fsdpctl.bundle import collect_code, node_payload
from fsdpctl.errors import ProfileError, UsageError
from fsdpctl.hostcheck.requirements import read_requirements
from fsdpctl.job import JobOptions, parse_env_items, resolve_job
from fsdpctl.plan.types import Overrides
from fsdpctl.profiles.jobs import load_job
from fsdpctl.profiles.loader import load_profile
from tests.conftest import REPO, run_cli


def test_every_shipped_job_file_loads():
    shipped = sorted((REPO / "jobs").glob("*.yaml"))
    assert shipped
    for path in shipped:
        loaded = load_job(str(path))
        assert loaded.job.command and (loaded.resolve(loaded.job.code or ".")).is_dir()


def test_a_job_file_is_read_strictly(tmp_path):
    path = tmp_path / "j.yaml"
    path.write_text("name: j\ncommand: [train.py]\nenvs:\n  A: b\n")
    with pytest.raises(ProfileError, match=r"j.yaml:3: envs: unknown key; did you mean 'env'\?"):
        load_job(str(path))
    path.write_text("name: j\ncommand: []\n")
    with pytest.raises(ProfileError, match=r"command: is empty"):
        load_job(str(path))
    path.write_text("name: j\ncommand: [t.py]\nenv:\n  FSDPCTL_RUN_ID: x\n")
    with pytest.raises(ProfileError, match="FSDPCTL_RUN_ID: is set by fsdpctl for every run"):
        load_job(str(path))
    path.write_text("name: j\ncommand: [t.py]\nfetch: [../etc]\n")
    with pytest.raises(ProfileError, match=r"fetch\[0\]: '../etc' is not a path inside the run directory"):
        load_job(str(path))


def test_env_items_are_checked_like_a_profiles_env():
    assert parse_env_items(("A=1", "B=x=y", "EMPTY=", "HF_TOKEN")) == ({"A": "1", "B": "x=y", "EMPTY": ""},
                                                                       ("HF_TOKEN",))
    for item, words in (("1A=x", "not a valid environment variable name"), ("bad-name", "not a valid"),
                        ("NCCL_SOCKET_IFNAME=eth1", "set from the network section"),
                        ("FSDPCTL_RUN_DIR=/x", "set by fsdpctl")):
        with pytest.raises(UsageError, match=words):
            parse_env_items((item,))


def test_requirements_files_follow_includes_and_name_the_bad_line(tmp_path):
    (tmp_path / "base.txt").write_text("numpy>=1.24  # arrays\n")
    (tmp_path / "req.txt").write_text("# tools\n-r base.txt\n--index-url https://example.invalid/simple\n"
                                      "transformers==4.40.0\n\nflash-attn; platform_system == 'Linux'\n")
    assert read_requirements(tmp_path / "req.txt") == ("numpy>=1.24", "transformers==4.40.0",
                                                       "flash-attn; platform_system == 'Linux'")
    (tmp_path / "bad.txt").write_text("numpy\nthis is not one\n")
    with pytest.raises(UsageError, match=r"bad.txt:2: 'this is not one' is not a requirement"):
        read_requirements(tmp_path / "bad.txt")


def project(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "train.py").write_text("print('hi')\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 3000)
    (root / "runs").mkdir()
    (root / "runs" / "old.log").write_text("old")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"c")
    (root / ".venv").mkdir()
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / ".venv" / "lib.py").write_text("")
    (root / "inside-link").symlink_to("pkg/a.py")
    (root / "outside-link").symlink_to("/etc/hostname")
    return root


def names(manifest) -> list[str]:
    return [name for name, _ in manifest.files]


def test_a_plain_folder_copies_all_but_the_ignored(tmp_path):
    root = project(tmp_path / "p")
    (root / ".fsdpctlignore").write_text("# data sets stay home\ndata/\n*.tmp\n")
    (root / "x.tmp").write_text("t")
    manifest = collect_code(root, 10**6)
    assert names(manifest) == [".fsdpctlignore", "inside-link", "pkg/a.py", "train.py"]
    assert manifest.origin == "files" and manifest.skipped_links == ("outside-link",)


def test_a_git_work_tree_copies_what_git_would(tmp_path):
    root = project(tmp_path / "g")
    (root / ".gitignore").write_text("data/\n.venv/\n")
    (root / "untracked.py").write_text("U = 1\n")
    for argv in (["git", "init", "-q"], ["git", "add", ".gitignore", "train.py", "pkg/a.py"],
                 ["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "x"]):
        subprocess.run(argv, cwd=root, check=True, capture_output=True)
    manifest = collect_code(root, 10**6)
    assert manifest.origin == "git"
    assert names(manifest) == [".gitignore", "inside-link", "pkg/a.py", "train.py", "untracked.py"]


def test_over_the_limit_names_the_largest_files(tmp_path):
    root = project(tmp_path / "p")
    with pytest.raises(UsageError, match=r"3.0 KB in 4 files is over the 1.0 KB limit; "
                                         r"the largest: data/big.bin \(3.0 KB\), train.py"):
        collect_code(root, 1000)


def test_the_payload_holds_scripts_workload_and_code(tmp_path):
    import io
    import tarfile

    manifest = collect_code(project(tmp_path / "p"), 10**6)
    with tarfile.open(fileobj=io.BytesIO(node_payload({"node0.sh": "echo hi\n"}, manifest).getvalue())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["node0.sh"].mode == 0o700 and members["code/pkg/a.py"].mode == 0o600
    assert "pkg/fsdpctl/workload/train.py" in members and "code/pkg/a.py" in members
    assert members["code/inside-link"].issym() and "code/outside-link" not in members


def test_the_payload_goes_out_in_whole_pieces_not_one_per_header_and_file(tmp_path):
    """Each piece is one SSH send to every node: the workload package's hundreds of headers, small
    files and paddings are joined into pieces of 64 KiB or more, and a large file's reads pass as they
    are; the bytes are the archive's all the same."""
    import io
    import tarfile

    root = project(tmp_path / "p")
    (root / "data" / "large.bin").write_bytes(os.urandom(300_000))
    payload = node_payload({"node0.sh": "echo hi\n"}, collect_code(root, 10**6))
    pieces = list(payload.chunks())
    assert len(payload.entries) > 50 and len(pieces) <= len(payload) // (1 << 16) + 1
    assert all(len(piece) >= 1 << 16 for piece in pieces[:-1])
    whole = b"".join(pieces)
    assert len(whole) == len(payload)
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        assert tar.extractfile("code/data/large.bin").read() == (root / "data" / "large.bin").read_bytes()


def test_a_command_plans_its_ranks_in_the_code_folder(tmp_path):
    manifest = collect_code(project(tmp_path / "p"), 10**6)
    plan = plan_run(load_profile("two-node").profile, run_id="two-node-20261121-120000-abcd", local_run_dir="r",
                    overrides=Overrides(command=("-m", "pkg.a", "x y"), code=manifest.plan(),
                                         requirements=("numpy",)))
    assert plan.chdir == "code" and plan.command == ("-m", "pkg.a", "x y") and plan.train == {}
    assert plan.requirements == ("torch", "numpy")
    assert plan.nodes[0].torchrun_args[-4:] == ("--tee", "3", "-m", "pkg.a", "x y")[-4:]
    for bad in (("-m",), ("--lr", "3")):
        with pytest.raises(UsageError):
            plan_run(load_profile("two-node").profile, run_id="two-node-20261121-120000-abcd", local_run_dir="r",
                     overrides=Overrides(command=bad))


def test_resolving_a_job_combines_the_file_and_the_flags(tmp_path):
    root = project(tmp_path / "p")
    (root / "req.txt").write_text("numpy\n")
    (root / "job.yaml").write_text("name: j\nprofile: two-node\ncommand: [train.py, --a]\ncode: .\n"
                                   "env:\n  A: from-file\n  B: b\nrequirements: [torch>=2.6]\n"
                                   "requirements_file: req.txt\nnproc_per_node: 3\n")
    job = resolve_job(JobOptions(job=str(root / "job.yaml"), env={"A": "from-flag"}), tmp_path)
    assert job.command == ("train.py", "--a") and job.profile == "two-node" and job.nproc_per_node == 3
    assert job.env == {"A": "from-flag", "B": "b"} and job.requirements == ("torch>=2.6", "numpy")
    assert job.code is not None and job.code.root == root.resolve()
    flagged = resolve_job(JobOptions(job=str(root / "job.yaml"), command=("other.py",), no_code=True), tmp_path)
    assert flagged.command == ("other.py",) and flagged.code is None and flagged.chdir == str(tmp_path)
    with pytest.raises(UsageError, match="--code: goes with a command of your own"):
        resolve_job(JobOptions(code=root), tmp_path)
    with pytest.raises(UsageError, match="--chdir: goes with --no-code"):
        resolve_job(JobOptions(command=("t.py",), chdir="/x"), tmp_path)


def test_dry_run_of_a_command_shows_what_every_rank_runs_and_the_code(tmp_path):
    root = project(tmp_path / "p")
    result = run_cli("launch", "-p", "two-node", "--code", str(root), "--dry-run", "--", "train.py", "a b",
                     cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "# every rank runs: train.py 'a b'  (in code of the run directory)" in result.stdout
    assert "# code: 4 files, " in result.stdout and "largest: data/big.bin (3.0 KB)" in result.stdout
    assert "# code: not copied, a link out of the folder: outside-link" in result.stdout
    assert not (tmp_path / "runs").exists() and os.listdir(root)  # nothing written, nothing moved


def test_a_script_not_among_the_copied_files_is_refused_before_anything_starts(tmp_path):
    import fsdpctl
    from fsdpctl.bundle import collect_code
    from fsdpctl.job import check_script

    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "train.py").write_text("print(1)\n")
    (project / "sub" / "eval.py").write_text("print(2)\n")
    (project / ".fsdpctlignore").write_text("secret_run.py\n")
    (project / "secret_run.py").write_text("print(3)\n")
    code = collect_code(project, 10**6)
    check_script(("train.py",), code)
    check_script(("./sub/eval.py", "--x"), code)
    check_script(("-m", "pkg.train"), code)  # a module: Python finds it on the nodes
    check_script(("/shared/train.py",), code)  # an absolute path: the nodes' own storage
    with pytest.raises(UsageError, match=r"trian.py: not in the code folder .* \(no such file there\)") as typo:
        check_script(("trian.py",), code)
    assert typo.value.hint.startswith("did you mean train.py?")
    with pytest.raises(UsageError, match=r"eval.py: .*not in the code folder") as moved:
        check_script(("eval.py",), code)
    assert moved.value.hint.startswith("did you mean sub/eval.py?")
    with pytest.raises(UsageError, match="it is there but not copied"):
        check_script(("secret_run.py",), code)
    runs = tmp_path / "runs"
    with pytest.raises(UsageError, match="missing.py: not in the code folder"):
        fsdpctl.launch("local", ["missing.py"], code=project, runs_dir=runs)
    assert not runs.exists()  # refused before a run directory, let alone a node


def test_each_node_gets_its_own_script_and_not_every_nodes():
    import io
    import tarfile

    scripts = {f"node{r}.sh": f"echo node {r}\n" for r in range(300)}
    payload = node_payload(scripts)
    own = payload.for_node("node7.sh")
    whole = own.getvalue()
    assert len(whole) == len(own) < len(payload)
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        names = tar.getnames()
        assert tar.extractfile("node7.sh").read() == b"echo node 7\n"
    assert [n for n in names if n.endswith(".sh")] == ["node7.sh"] and "pkg/fsdpctl/workload/train.py" in names
