"""The reading-level check on the hand-written user pages: short sentences, short paragraphs, none of
the idioms readers stumbled on, no test-bed leftovers. ``tests/unit/test_docs.py`` runs it on every
page it covers; run it by hand on a page as you write it:

    .venv/bin/python tests/docs_prose.py docs/guides/two-nodes.md

Prose only: code blocks, tables, headings and HTML comments are left out. A list item is a sentence
of its own even without a full stop, as a reader takes it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_SENTENCE_WORDS = 40
MAX_AVERAGE_WORDS = 20.0
MAX_PARAGRAPH_WORDS = 110

IDIOMS = ("is said", "are said", "held to it", "stood still", "told apart", "tell apart", "wherever it is",
          "as it goes", "the one before")
"""Phrases readers did not follow: say what happens instead (``is printed``, ``is shown``...)."""

GENERATED_PAGES = ("profiles.md", "reference/cli.md", "reference/api.md")
"""docs/ pages made from the code (their tests compare them with what the code makes now)."""
HISTORY_PAGES = ("changelog.md", "performance.md")
"""docs/ pages about the past and about benches: their figures were true when written."""
TESTBED_LEFTOVERS = ("+fake", "/work/", "/tmp/fsdpctl-", "bench/", "namespace testbed", "test bed", "testbed")
"""What belongs on the performance and architecture pages, or nowhere, not in a user's guide."""

_FENCE = re.compile(r"^\s*(```|~~~)")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_CODE = re.compile(r"`[^`]*`")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z`\"'(\[0-9*_])")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


@dataclass(frozen=True)
class Unit:
    """A paragraph or a list item: its first line and its text, markup removed."""
    line: int
    text: str


def prose_units(text: str) -> list[Unit]:
    """The page's paragraphs and list items, with code blocks, tables, headings and comments left out."""
    text = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    units: list[Unit] = []
    current: list[str] = []
    start = 0
    fenced = False

    def close() -> None:
        if current:
            units.append(Unit(start, " ".join(current)))
            current.clear()

    for number, raw in enumerate(text.splitlines(), 1):
        if _FENCE.match(raw):
            close()
            fenced = not fenced
            continue
        stripped = raw.strip()
        if fenced or not stripped or stripped.startswith(("#", "|", "<", "!!!", "???", "---")) \
                or re.match(r"\[[^\]]+\]:\s", stripped):
            close()
            continue
        if raw.startswith("    ") and not current and not _ITEM.match(raw):  # an indented code block
            continue
        if _ITEM.match(raw):
            close()
            stripped = _ITEM.sub("", raw).strip()
        if not current:
            start = number
        current.append(stripped)
    close()
    return units


def _plain(text: str) -> str:
    text = _LINK.sub(r"\1", text)
    text = _CODE.sub("CODE", text)
    return re.sub(r"[*_]{1,2}", "", text)


def _split(text: str) -> list[str]:
    for short in _ABBREVIATIONS:
        text = text.replace(short, short.replace(".", ""))
    return [s for s in _SENTENCE_END.split(text) if s.strip()]


def sentences(unit: Unit) -> list[str]:
    """The sentences of a paragraph or list item."""
    return _split(_plain(unit.text))


def raw_sentences(unit: Unit) -> list[str]:
    """The sentences of a paragraph or list item with their inline code kept (links as their text)."""
    return _split(_LINK.sub(r"\1", unit.text))


def words(sentence: str) -> int:
    return len(re.findall(r"[\w'’-]+", sentence))


def check_page(path: Path, *, leftovers: bool = True) -> list[Finding]:
    """Every finding on one page (none: it reads as the guides should)."""
    text = path.read_text(encoding="utf-8")
    found: list[Finding] = []
    counts: list[int] = []
    for unit in prose_units(text):
        said = sentences(unit)
        total = sum(words(s) for s in said)
        if total > MAX_PARAGRAPH_WORDS:
            found.append(Finding(str(path), unit.line, f"a paragraph of {total} words (at most "
                                 f"{MAX_PARAGRAPH_WORDS}): split it, or make its steps a list"))
        for sentence in said:
            count = words(sentence)
            counts.append(count)
            if count > MAX_SENTENCE_WORDS:
                found.append(Finding(str(path), unit.line, f"a sentence of {count} words (at most "
                                     f"{MAX_SENTENCE_WORDS}): {sentence[:70]}..."))
        lowered = unit.text.lower()
        for idiom in IDIOMS:
            if re.search(rf"\b{re.escape(idiom)}\b", lowered):
                found.append(Finding(str(path), unit.line, f"the idiom {idiom!r}: say it plainly"))
        if leftovers:
            for leftover in TESTBED_LEFTOVERS:
                if leftover in lowered:
                    found.append(Finding(str(path), unit.line, f"{leftover!r}: development details belong on "
                                         f"the performance or architecture page"))
    if counts and sum(counts) / len(counts) > MAX_AVERAGE_WORDS:
        found.append(Finding(str(path), 1, f"sentences of {sum(counts) / len(counts):.1f} words on average "
                             f"(at most {MAX_AVERAGE_WORDS:g})"))
    return found


def page_words(path: Path) -> int:
    """The words of a page's prose (its length for the closing figures: code and tables left out)."""
    return sum(words(s) for unit in prose_units(path.read_text(encoding="utf-8")) for s in sentences(unit))


def main(argv: list[str]) -> int:
    findings = [f for name in argv for f in check_page(Path(name))]
    for finding in findings:
        print(finding)
    for name in argv:
        print(f"{name}: {page_words(Path(name))} words of prose")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
