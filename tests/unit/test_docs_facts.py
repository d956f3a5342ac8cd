"""What the hand-written pages state as a default or an interval is what the code does, read from the code
as the generated references are: a page that says "`--concurrency` (default 32)" while the option's
default is 1024 fails here, and so does the next page that says another wrong one.

- Every "`--option` ... default X" in a sentence: the option's default in the command line itself (the
  command the sentence names, else any command with that option).
- Every "`field` ... default X" in a sentence, for a profile field: its default in the profile reference,
  which is made from the schema (``tests/unit/test_docs.py`` keeps that page current).
- Intervals and versions that sentences state without a name to look up: each from its constant.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from fsdpctl.backends.nodes.supervisor import RENDEZVOUS_NOTICE
from fsdpctl.bundle import DEFAULT_CODE_LIMIT_MB
from fsdpctl.cli.reference import commands
from fsdpctl.hostcheck.checks import FSDP2_TORCH
from fsdpctl.live.exports import PROMETHEUS_SECONDS
from fsdpctl.web.serve import DEFAULT_PORT
from fsdpctl.workload.config import DEFAULT_STEPS
from fsdpctl.workload.model import DEFAULT_BATCH
from tests.conftest import REPO
from tests.docs_prose import GENERATED_PAGES, HISTORY_PAGES, prose_units, raw_sentences

DOCS = REPO / "docs"
HAND_WRITTEN = sorted(p for p in DOCS.rglob("*.md")
                      if str(p.relative_to(DOCS)) not in (*GENERATED_PAGES, *HISTORY_PAGES)) + [REPO / "README.md"]

_DEFAULT = re.compile(r"(?<!by )\bdefaults?(?: is| of| to|:|=)?\s+(?P<value>`[^`]+`|(?:\d{1,3}(?:,\d{3})+|[\w.+-]+)"
                      r"(?:\s?(?:ms|s|seconds?|minutes?|min|hours?|h)\b)?)", re.I)
_NAMED = re.compile(r"`(?P<name>--[a-z][\w-]*|[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)(?:[ =][^`]*)?`")
def _one(values: set) -> object:
    assert len(values) == 1, values
    return values.pop()


DESCRIBED = {"for", "when", "if", "on", "the", "this", "a", "an", "its", "their", "your", "what", "whatever", "as",
             "from", "one"}
"""First words of a default described rather than given ("default: the current folder")."""
RUNTIME_DEFAULTS = {"--code-limit": DEFAULT_CODE_LIMIT_MB, "--port": DEFAULT_PORT, "--steps": DEFAULT_STEPS,
                    "--batch-size": _one({DEFAULT_BATCH["cpu"][preset] for preset in DEFAULT_BATCH["cpu"]})}
"""Options whose default the command works out when it runs (the command line's is None): the constant."""
_UNITS = {"ms": 0.001, "s": 1, "sec": 1, "second": 1, "seconds": 1, "min": 60, "minute": 60, "minutes": 60,
          "h": 3600, "hour": 3600, "hours": 3600}


def _options() -> dict[str, list[tuple[str, object]]]:
    """Every option of every command and subcommand: ``--name`` -> [(command path, default)]."""
    found: dict[str, list[tuple[str, object]]] = {}

    def walk(path: str, command) -> None:
        for param in getattr(command, "params", ()):
            for opt in getattr(param, "opts", ()):
                if opt.startswith("--"):
                    found.setdefault(opt, []).append((path, param.default))
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(f"{path} {name}", sub)

    for name, command in commands().items():
        walk(name, command)
    return found


def _fields() -> dict[str, list[str]]:
    """Every profile field's defaults as the profile reference shows them: path -> [default] ('' for none;
    a job file's fields share names with the profile's, so a name may have two)."""
    table = re.compile(r"^\| `(?P<path>[^`]+)` \| [^|]+ \| (?P<default>[^|]+) \|", re.M)
    fields: dict[str, list[str]] = {}
    for row in table.finditer((DOCS / "profiles.md").read_text(encoding="utf-8")):
        default = row.group("default").strip()
        fields.setdefault(row.group("path"), []).append(
            "" if default in ("—", "(section defaults)") or "required" in default else default.strip("`"))
    return fields


def _number(text: str) -> float | None:
    """``30``, ``30 s``, ``10 minutes``, ``1,024`` as a number of the option's own unit (seconds for times)."""
    match = re.fullmatch(r"(\d[\d,]*(?:\.\d+)?)\s*([a-z]+)?", text.strip().lower())
    if match is None or (match.group(2) and match.group(2) not in _UNITS):
        return None
    return float(match.group(1).replace(",", "")) * _UNITS.get(match.group(2) or "s", 1)


def same(stated: str, actual: object) -> bool:
    """A stated default against the code's: numbers by value (units turned into seconds), words as words."""
    stated = stated.strip("`.,;:()").strip()
    if isinstance(actual, bool):
        return stated.lower() in (("true", "on", "yes") if actual else ("false", "off", "no"))
    if actual is None or actual == "":
        return stated.lower() in ("none", "unset", "off", "empty", "nothing")
    number, wanted = _number(stated), _number(str(actual))
    if number is not None and wanted is not None:
        return abs(number - wanted) < 1e-9
    return stated.lower() == str(actual).lower()


@dataclass(frozen=True)
class Claim:
    page: str
    line: int
    names: tuple[str, ...]
    """What the sentence names before the word default, nearest first (a list may share one default)."""
    stated: str
    sentence: str


def statements(page: Path) -> list[tuple[int, str]]:
    """A page's prose sentences and table rows (a row states facts too), each with its line."""
    text = page.read_text(encoding="utf-8")
    found = [(unit.line, sentence) for unit in prose_units(text) for sentence in raw_sentences(unit)]
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        fenced = fenced != line.lstrip().startswith("```")
        if not fenced and line.startswith("|") and not re.fullmatch(r"[|:\- ]+", line.strip()):
            found.append((number, line))
    return found


def _label(page: Path) -> str:
    return str(page.relative_to(REPO)) if page.is_relative_to(REPO) else page.name


def default_claims(page: Path) -> list[Claim]:
    """Each "`name` ... default X" of a page's prose: the name nearest before the word default."""
    claims = []
    for line, sentence in statements(page):
        for match in _DEFAULT.finditer(sentence):
            names = tuple(n.group("name") for n in reversed(list(_NAMED.finditer(sentence[:match.start()]))))
            if names:
                claims.append(Claim(_label(page), line, names, match.group("value"), sentence))
    return claims


def _defaults_of(name: str, claim: Claim, options, fields, leaves) -> tuple[list, str] | None:
    """The code's defaults for what a claim names, and where they come from; None when the code has no
    such name, or gives no default a value could be compared with."""
    if name.startswith("--"):
        found = options.get(name)
        if not found:
            return None
        named = [(c, d) for c, d in found if re.search(rf"\b{re.escape(c)}\b", claim.sentence)]
        candidates = [d if d is not None else RUNTIME_DEFAULTS.get(name) for _, d in (named or found)]
        field = name[2:].replace("-", "_")  # an option that overrides the profile's field of its name
        if all(d is None for d in candidates) and (field in fields or field in leaves):
            candidates = [d for p in ([field] if field in fields else leaves[field]) for d in fields[p]]
        where = "the command line"
    else:
        paths = [name] if name in fields else leaves.get(name, [])
        if not paths:
            return None
        candidates = [d for p in paths for d in fields[p]]
        where = "the profile reference"
    if all(d is None or d == "" for d in candidates) and _number(claim.stated.strip("`.,;:()")) is None:
        return None  # worked out when it runs ("the current folder"), said in words: nothing to compare
    return candidates, where


def wrong_defaults(claims: list[Claim]) -> tuple[list[str], int]:
    """The claims the code contradicts, and how many claims named something the code has."""
    options, fields = _options(), _fields()
    leaves: dict[str, list[str]] = {}
    for path in fields:
        leaves.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    wrong, checked = [], 0
    for claim in claims:
        if claim.stated.lower() in DESCRIBED:
            continue  # "default: the current folder": a description, not a value
        found = [(name, *looked) for name in claim.names
                 if (looked := _defaults_of(name, claim, options, fields, leaves))]
        if not found:
            continue
        checked += 1
        if not any(same(claim.stated, d) for _, candidates, _ in found for d in candidates):
            name, candidates, where = found[0]
            wrong.append(f"{claim.page}:{claim.line}: `{name}` default {claim.stated!r}, but {where} says "
                         f"{' or '.join(repr(d) for d in candidates)}: {claim.sentence[:120]}")
    return wrong, checked


@dataclass(frozen=True)
class Stated:
    """An interval or version that sentences about ``topic`` state in the form ``said``."""
    what: str
    topic: str
    said: str
    right: Callable[[re.Match, str], bool]
    """Whether the figure the match found in the sentence is the code's."""


def _seconds(match: re.Match) -> float:
    return float(match.group("n")) * _UNITS[match.group("unit")]


def _notice_after(seconds: float, sentence: str) -> bool:
    """The notice comes after RENDEZVOUS_NOTICE, or after half the rendezvous timeout the sentence gives."""
    timeout = re.search(r"timeout`? (?:is |of )?(\d+) ?s\b", sentence)
    return seconds in (RENDEZVOUS_NOTICE, *((min(RENDEZVOUS_NOTICE, int(timeout.group(1)) / 2),) if timeout else ()))


NCCL_DEFAULT_TIMEOUT = 600.0
"""torch's NCCL process group timeout when a program sets none (ProcessGroupNCCL's
kProcessGroupNCCLDefaultTimeout, 10 minutes; not importable from a CPU build of torch)."""


GLOO_DEFAULT_TIMEOUT = 1800.0
"""torch's timeout for any other backend string, the bundled workload's ``cpu:gloo,cuda:nccl`` included
(kProcessGroupDefaultTimeout, 30 minutes): its NCCL collectives wait that long."""


def _said_seconds(match: re.Match) -> float:
    if match.group("words"):
        return {"half an hour": 1800.0, "an hour": 3600.0, "a minute": 60.0}[match.group("words").lower()]
    return _seconds(match)


STATED = [
    Stated("the Prometheus textfile's interval", r"textfile",
           r"every (?P<n>\d+(?:\.\d+)?) ?(?P<unit>ms|s|seconds?|minutes?)\b",
           lambda m, _: _seconds(m) == PROMETHEUS_SECONDS),
    Stated("the rendezvous notice's delay", r"rendezvous.*(notice|not started|has started)|"
           r"(notice|not started|has started).*rendezvous",
           r"after (?P<n>\d+(?:\.\d+)?|a) ?(?P<unit>s|seconds?|minutes?)\b",
           lambda m, sentence: _notice_after(60.0 if m.group("n") == "a" else _seconds(m), sentence)),
    Stated("the torch FSDP2 needs", r"FSDP2|fully_shard",
           r"torch (?:>= ?|version )?(?P<version>\d+\.\d+)(?:\.\d+)? (?:or newer|or later|and newer|at least)|"
           r"torch >= ?(?P<version2>\d+\.\d+)",
           lambda m, _: (m.group("version") or m.group("version2")) == FSDP2_TORCH),
    Stated("NCCL's default timeout", r"(NCCL|[Ww]atchdog).*\btimeout|\btimeout.*(NCCL|[Ww]atchdog)",
           r"(?:default|defaults to|by default|600000 milliseconds)[^.]*?"
           r"(?:(?P<n>\d+(?:\.\d+)?) ?(?P<unit>ms|s|seconds?|minutes?)\b|"
           r"(?P<words>half an hour|an hour|a minute))",
           lambda m, sentence: _said_seconds(m) == NCCL_DEFAULT_TIMEOUT
           or (_said_seconds(m) == GLOO_DEFAULT_TIMEOUT and "600000" not in sentence)),
]


def wrong_statements(page: Path) -> list[str]:
    wrong = []
    for line, sentence in statements(page):
        for fact in STATED:
            if not re.search(fact.topic, sentence, re.I):
                continue
            for match in re.finditer(fact.said, sentence, re.I):
                if not fact.right(match, sentence):
                    wrong.append(f"{_label(page)}:{line}: {fact.what}: {match.group(0)!r} "
                                 f"is not the code's: {sentence[:120]}")
    return wrong


def test_every_default_a_page_states_is_the_codes():
    claims = [claim for page in HAND_WRITTEN for claim in default_claims(page)]
    wrong, checked = wrong_defaults(claims)
    assert not wrong, "pages that contradict the code's defaults:\n" + "\n".join(wrong)
    assert checked >= 5, f"only {checked} stated defaults found to check: is the pattern still the pages' form?"


FROM_DOCSTRINGS = [DOCS / page for page in GENERATED_PAGES]
"""Generated, but of docstrings and help texts people write: their intervals are checked too."""


@pytest.mark.parametrize("page", HAND_WRITTEN + FROM_DOCSTRINGS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_interval_and_version_a_page_states_is_the_codes(page):
    assert wrong_statements(page) == []


def test_a_contradiction_is_found(tmp_path):
    """The check finds what the docs once said: doctor's concurrency at 32, the textfile every 5 s, the
    rendezvous notice after 15 s; and passes the right figures."""
    page = tmp_path / "page.md"
    page.write_text("# A page\n\nAll hosts are probed in parallel (`--concurrency`, default 32).\n\n"
                    "Set `node_timeout` (default 30 s) to wait longer.\n\n"
                    "The Prometheus textfile is written again every 5 s.\n\n"
                    "A node whose ranks have not started says what the rendezvous waits for after 15 s.\n")
    wrong, checked = wrong_defaults(default_claims(page))
    assert checked == 2 and len(wrong) == 1 and "`--concurrency` default '32'" in wrong[0], wrong
    assert len(wrong_statements(page)) == 2
    page.write_text(f"# A page\n\nProbed in parallel (`--concurrency`, default 1,024).\n\n"
                    f"The textfile is written every {PROMETHEUS_SECONDS:g} s.\n\n"
                    f"FSDP2 needs torch {FSDP2_TORCH} or newer.\n")
    assert wrong_defaults(default_claims(page)) == ([], 1)
    assert wrong_statements(page) == []

