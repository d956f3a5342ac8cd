"""docs/getting-started.md, run line for line on two fake hosts named as the page names them.

Every ```bash block of the page runs in order, from the user's project folder, on a launching machine of
its own (the lab's client namespace); the ```text block right after one is its output as the page shows
it. Each shown line must be a line the command printed, numbers, ids and addresses aside (a shown
``...`` stands for lines left out). ``FSDPCTL_REFRESH_DOCS=1`` writes the real output into the page
instead. A block after ``<!-- tutorial: not run -->`` is left out: only the install is.

The machines are set up as the page's prerequisites say, and no further: ``gpu-a`` and ``gpu-b`` resolve
by name, the launching machine logs in with its default key, each node has its own home (its own
disk) with torch in ``~/venv``; no profile exists before ``init`` writes one. Every machine's home is
``/home/you``, as on a cluster: a folder of the test's own mounted there in that machine's private mount
namespace, and the user's home in that machine's own ``/etc/passwd`` (``ip netns exec`` puts a
namespace's ``/etc/netns`` files in place), so OpenSSH, fsdpctl and the nodes' shells all find it
without touching this machine's.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.conftest import require_netns
from tests.testbed.lab import Lab

pytestmark = pytest.mark.integration

PAGE = REPO / "docs" / "getting-started.md"
NOT_RUN = "<!-- tutorial: not run -->"
BLOCK = re.compile(r"(?P<skip><!-- tutorial: not run -->\s*)?```bash\n(?P<code>.*?)```"
                   r"(?P<out>\s*```text\n(?P<text>.*?)```)?", re.S)
SHOWN_LINES = 24
"""A refreshed output block shows the first and last lines of a longer output, ``...`` between."""


def blocks(text: str) -> list[re.Match]:
    return list(BLOCK.finditer(text))


def masked(line: str) -> str:
    """A line with what changes from run to run masked: anything holding a digit (numbers, ids,
    addresses, times), sparklines, runs of spaces and of table rules (their widths follow the numbers')."""
    line = re.sub(r"[\w.:/+-]*\d[\w.:/+-]*", "#", line)
    line = re.sub(r"[▁▂▃▄▅▆▇█]+", "~", line)
    line = re.sub(r"([─━═┈-])\1+", r"\1", line)
    return re.sub(r"\s+", " ", line).strip(" │┃|")


def shown_but_not_printed(shown: str, printed: str) -> list[str]:
    """The page's lines (``...`` aside) that the command did not print."""
    real = {masked(line) for line in printed.splitlines()}
    return [line for line in shown.splitlines() if line.strip() not in ("", "...") and masked(line) not in real]


def trimmed(output: str) -> str:
    lines = [line.rstrip() for line in output.strip("\n").splitlines()]
    if len(lines) > SHOWN_LINES:
        head = SHOWN_LINES * 2 // 3
        lines = lines[:head] + ["..."] + lines[-(SHOWN_LINES - head):]
    return "\n".join(lines) + "\n"


HOME = Path("/home/you")


def passwd_with_home(home: Path) -> str:
    """This machine's /etc/passwd, root's home moved to ``home``."""
    rows = []
    for row in Path("/etc/passwd").read_text().splitlines():
        fields = row.split(":")
        if fields[0] == "root":
            fields[5] = str(home)
        rows.append(":".join(fields))
    return "\n".join(rows) + "\n"


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    require_netns()
    root = tmp_path_factory.mktemp("tutorial")
    made_home = not HOME.exists()
    HOME.mkdir(parents=True, exist_ok=True)  # only where each machine mounts its own home
    lab = Lab(root / "lab", ["gpu-a", "gpu-b"]).up()
    try:
        venv = Path(sys.executable).parent.parent  # this Python's environment: torch, as on a node
        for name in ("gpu-a", "gpu-b"):
            home = root / f"home-{name}"
            home.mkdir()
            (home / "venv").symlink_to(venv)
            (Path("/etc/netns") / f"{lab.tag}{name}" / "passwd").write_text(passwd_with_home(HOME))
            lab.start_sshd(name, overlays={str(HOME): home})
        laptop = root / "home-laptop"
        ssh = laptop / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        shutil.copy(lab.client_key, ssh / "id_ed25519")
        (ssh / "id_ed25519").chmod(0o600)
        shutil.copy(lab.known_hosts, ssh / "known_hosts")
        assert lab.client_ns is not None
        (Path("/etc/netns") / lab.client_ns / "passwd").write_text(passwd_with_home(HOME))
        project = laptop / "my-project"
        project.mkdir()
        shutil.copy(REPO / "examples" / "fsdp2_minimal" / "train.py", project / "train.py")
        for argv in (["init", "-q"], ["add", "train.py"],
                     ["-c", "user.name=you", "-c", "user.email=you@example.com", "commit", "-qm", "train.py"]):
            subprocess.run(["git", *argv], cwd=project, check=True, capture_output=True)
        yield lab, laptop, project
    finally:
        lab.down()
        if made_home:
            HOME.rmdir()


def run_block(lab: Lab, laptop: Path, project: Path, code: str) -> subprocess.CompletedProcess:
    """The block as one shell script on the launching machine, in the project, stopping at a failure."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(HOME),
           "USER": "root", "LANG": "C.UTF-8", "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb",
           "FSDPCTL_STATE_DIR": os.environ.get("FSDPCTL_STATE_DIR", str(laptop / ".fsdpctl-state"))}
    folder = HOME / project.relative_to(laptop)
    script = f"mount --bind {laptop} {HOME} && cd {folder} && exec bash -e -o pipefail -c " \
             f"{shlex.quote('exec 2>&1' + chr(10) + code)}"
    return subprocess.run(lab.in_client(["unshare", "--mount", "sh", "-c", script]), env=env, capture_output=True,
                          text=True, timeout=420)


def test_getting_started_runs_as_written(machines):
    lab, laptop, project = machines
    page = PAGE.read_text(encoding="utf-8")
    found = blocks(page)
    assert len(found) >= 6, "the tutorial's steps are ```bash blocks"
    skipped = [b for b in found if b.group("skip")]
    assert all(re.fullmatch(r"(\s*(pipx|pip) install [^\n]*\n?)+", b.group("code")) for b in skipped), \
        "only the install is left out of the run"
    refresh = os.environ.get("FSDPCTL_REFRESH_DOCS") == "1"
    new_page, at = [], 0
    problems = []
    for block in found:
        if block.group("skip"):
            continue
        code = block.group("code")
        done = run_block(lab, laptop, project, code)
        print(f"\n$ {code.strip()}\n{done.stdout}")
        assert done.returncode == 0, f"{code.strip()}\nexited {done.returncode}:\n{done.stdout[-4000:]}"
        assert "Traceback" not in done.stdout, done.stdout[-4000:]
        if block.group("out") is None:
            continue
        if refresh:
            new_page += [page[at:block.start("text")], trimmed(done.stdout)]
            at = block.end("text")
        else:
            missing = shown_but_not_printed(block.group("text"), done.stdout)
            if missing:
                problems.append(f"{code.strip()}: shown but not printed: {missing}")
    if refresh:
        PAGE.write_text("".join(new_page) + page[at:], encoding="utf-8")
    assert not problems, "the page's output is not what the commands print (FSDPCTL_REFRESH_DOCS=1 " \
                         "writes it):\n" + "\n".join(problems)
    runs = [p for p in (project / "runs").iterdir() if not p.name.startswith(".")]
    assert len(runs) == 1 and (runs[0] / "run.json").is_file(), "one run, launched by the page"
    assert not list(laptop.glob("cluster_profiles")), "init wrote the profile in the project"
    assert (project / "cluster_profiles" / "lab.yaml").is_file()
