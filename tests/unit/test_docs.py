"""The documentation says what the code does: the references generated from the code are current,
nothing the code offers is undocumented, every documented profile field is tried by some test, every
`fsdpctl ...` line and every profile in the docs is accepted, and the site builds strictly."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from fsdpctl import __version__
from fsdpctl.api.reference import reference_markdown as api_markdown
from fsdpctl.api.reference import undocumented
from fsdpctl.cli.app import app
from fsdpctl.cli.reference import commands
from fsdpctl.cli.reference import reference_markdown as cli_markdown
from fsdpctl.profiles.loader import parse_profile
from fsdpctl.profiles.reference import reference_markdown
from fsdpctl.profiles.schema import ClusterProfile
from tests.conftest import REPO, run_cli
from tests.docs_prose import GENERATED_PAGES, HISTORY_PAGES, check_page

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md")) + [REPO / "README.md"]
SHIPPED_PROFILES = {path.stem for path in (REPO / "cluster_profiles").glob("*.yaml")}


def test_the_generated_references_are_current():
    assert (DOCS / "profiles.md").read_text() == reference_markdown(), (
        "docs/profiles.md is stale: run `fsdpctl profiles --reference > docs/profiles.md`")
    assert (DOCS / "reference" / "cli.md").read_text() == cli_markdown(), (
        "docs/reference/cli.md is stale: run `python -m fsdpctl.cli.reference > docs/reference/cli.md`")
    assert (DOCS / "reference" / "api.md").read_text() == api_markdown(), (
        "docs/reference/api.md is stale: run `python -m fsdpctl.cli.reference api > docs/reference/api.md`")


def test_nothing_the_code_offers_is_undocumented():
    assert undocumented() == [], "give these a docstring (the API reference is made of them)"
    for name in ClusterProfile.__dataclass_fields__:
        assert f"| `{name}` |" in reference_markdown()
    for name, command in commands().items():
        assert (command.help or "").strip(), f"fsdpctl {name} has no help"
        for param in command.params:
            if not getattr(param, "hidden", False) and param.name != "help":
                assert (getattr(param, "help", None) or "").strip(), f"fsdpctl {name}: {param.name} has no help"


def test_readme_is_the_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "./dev.sh train" in readme and "./dev.sh test" in readme  # the two fresh-machine commands
    assert ".ci/run" in readme and "./dev.sh test" in (REPO / ".ci" / "run").read_text()
    listed = set(re.findall(r"^\| `fsdpctl (\w+)`", readme, re.MULTILINE))
    assert listed == set(commands()), f"README's command table: {sorted(listed ^ set(commands()))}"
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).is_file(), link


def test_every_documented_profile_field_is_tried_by_a_test():
    fields = re.findall(r"^\| `([^`]+)`", (DOCS / "profiles.md").read_text(), re.MULTILINE)
    # the tests and their golden files (a rendered script shows a field as its flag or directive)
    tests = "\n".join(p.read_text(errors="replace") for p in (REPO / "tests").rglob("*")
                      if p.is_file() and p.suffix in (".py", ".sh", ".yaml", ".json") and p.name != "test_docs.py")
    untried = []
    for field in dict.fromkeys(fields):
        leaf = field.rsplit(".", 1)[-1].split("]")[-1]
        spellings = {leaf, leaf.replace("_", "-")}
        if not any(re.search(rf"(?<![\w-]){re.escape(s)}(?![\w])", tests) for s in spellings):
            untried.append(field)
    assert not untried, f"documented fields no test uses: {untried}"


def _code_blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def _commands_in(page: Path) -> list[str]:
    """The command lines of a page: every ``fsdpctl ...`` line of a bash block, and the ``$ fsdpctl ...``
    prompts of an output block (a synopsis with [optional] parts is no command line)."""
    found = []
    for language, block in _code_blocks(page.read_text()):
        for line in block.splitlines():
            line = line.strip()
            if language != "bash" and not line.startswith("$ fsdpctl "):
                continue
            line = line.removeprefix("$ ")
            if line.startswith("fsdpctl ") and not re.search(r"\.\.\.|<|\s\[", line):
                found.append(line.split("  #")[0].split(" # ")[0].strip())
    return found


EXAMPLES = [(page, line) for page in PAGES for line in _commands_in(page)]


def test_the_docs_show_fsdpctl_at_work():
    assert len(EXAMPLES) >= 40 and {line.split()[1] for _, line in EXAMPLES} >= {"launch", "doctor", "submit",
                                                                                 "report", "top", "init"}


@pytest.mark.parametrize("page,line", EXAMPLES, ids=[f"{p.relative_to(REPO)}:{line[:40]}" for p, line in EXAMPLES])
def test_every_fsdpctl_line_in_the_docs_is_accepted(page, line, tmp_path):
    """Parsed by the application itself (a command or option that does not exist fails here); a launch or
    submit on a shipped profile is also planned for real with --dry-run."""
    words = shlex.split(line)[1:]
    group = typer.main.get_command(app)
    if words[0].startswith("-"):  # fsdpctl --install-completion, --version
        assert words[0] in ("--install-completion", "--show-completion", "--version", "--help"), line
        return
    command = group.commands.get(words[0])
    assert command is not None, f"{page.name}: no command {words[0]!r}"
    command.make_context(words[0], list(words[1:]))  # raises on an unknown option or a bad value
    profile = next((words[i + 1] for i, w in enumerate(words) if w in ("-p", "--profile") and i + 1 < len(words)),
                   None)
    if words[0] in ("launch", "submit") and profile in SHIPPED_PROFILES and "--dry-run" not in words \
            and "--resume" not in words:
        (tmp_path / "train.py").write_text("print('hi')\n")
        at = words.index("--") if "--" in words else len(words)
        planned = run_cli(*words[:at], "--dry-run", *words[at:], cwd=tmp_path)
        assert planned.returncode == 0, f"{page.name}: {line}\n{planned.stderr}"


@pytest.mark.parametrize("page", [p for p in PAGES if "```yaml" in p.read_text()], ids=lambda p: p.name)
def test_every_profile_in_the_docs_loads(page):
    for language, block in _code_blocks(page.read_text()):
        if language == "yaml" and re.search(r"^name: ", block, re.MULTILINE) and "hosts:" in block:
            parse_profile(block, f"{page.name} (example)")


def test_the_changelog_names_this_version():
    newest = re.search(r"^## (\S+)", (DOCS / "changelog.md").read_text(), re.MULTILINE).group(1)
    assert newest == __version__


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs is not installed (pip install -e '.[test]')")
def test_the_site_builds_strictly(tmp_path):
    built = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-d",
                            str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True, timeout=300,
                           env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "troubleshooting" / "nccl-timeout" / "index.html").is_file()


GUIDE_PAGES = sorted(p for p in DOCS.rglob("*.md")
                     if str(p.relative_to(DOCS)) not in (*GENERATED_PAGES, *HISTORY_PAGES, "architecture.md"))
"""The pages a user reads to act: everything but the generated references and the developers' pages."""


@pytest.mark.parametrize("page", [*GUIDE_PAGES, REPO / "README.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_every_users_page_reads_plainly(page):
    """Short sentences and paragraphs, none of the idioms readers stumbled on, no test-bed leftovers
    (README's development section names the testbed: it is the developers' front door too)."""
    assert [str(f) for f in check_page(page, leftovers=page.name != "README.md")] == []


def test_the_home_page_leads_to_every_page_of_the_site():
    import yaml

    def pages(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [p for item in entry for p in pages(item)]
        return [p for value in entry.values() for p in pages(value)]

    nav = pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    linked = set(re.findall(r"\]\(([^)#]+)", (DOCS / "index.md").read_text()))
    assert sorted(set(nav) - linked - {"index.md"}) == []
