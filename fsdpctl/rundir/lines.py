"""One line of a run's output, as the launcher, ``logs`` and the API hand it on: which node and host
said it, which rank (when a rank did), and the text.

torchrun prefixes every line a rank prints with ``[rank<N>]:`` (the template fsdpctl gives it in
``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``); the node's own lines (its script's, torchrun's) have none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

RANK_PREFIX = "[rank"
_RANK = re.compile(r"\[rank(\d+)\]:")


@dataclass(frozen=True, slots=True)
class LogLine:
    """A line of a run: ``text`` as the node logged it; ``rank`` the global rank that printed it
    (None for the node's own lines)."""

    node_rank: int
    host: str
    text: str
    rank: Optional[int] = None

    @classmethod
    def of(cls, node_rank: int, host: str, text: str) -> LogLine:
        """A node's log line, its rank read from torchrun's prefix."""
        rank = None
        if text.startswith(RANK_PREFIX) and (match := _RANK.match(text)):
            rank = int(match.group(1))
        return cls(node_rank, host, text, rank)

    @property
    def message(self) -> str:
        """The text without torchrun's ``[rank<N>]:`` prefix."""
        if self.rank is None:
            return self.text
        return self.text[self.text.index("]:") + 2:]

    def __str__(self) -> str:
        return f"[{self.host} r{self.node_rank}] {self.text}"
