"""Mask a run's secrets in what its processes print: ``python -m fsdpctl.node.mask`` copies stdin to
stdout, line by line as it comes, with the value of every variable named in ``FSDPCTL_SECRET_NAMES``
(taken from its own environment, which is the ranks') replaced by ``***``; ``--scrub FOLDER...``
masks the files under each folder in place (torchrun's per-rank log copies, once the node's part ended).

The launcher masks the same way (``Masker``) what it shows and keeps; on the nodes this filter sits
between the node script and its log, so a log read later from any terminal is masked too.
Standard library only, Python 3.8+.
"""

import os
import sys

MASK = b"***"
# A secret that spans lines is printed line by line: each of its lines is masked, when long enough
# not to hide ordinary text.
MIN_PIECE = 4


class Masker:
    """Replaces every secret value (and every line of a multi-line one) in bytes or text."""

    def __init__(self, values):
        pieces = set()
        for value in values:
            if not value:
                continue
            pieces.add(value.encode("utf-8", "surrogateescape"))
            for line in value.splitlines():
                if len(line.strip()) >= MIN_PIECE:
                    pieces.add(line.encode("utf-8", "surrogateescape"))
        self.pieces = sorted(pieces, key=len, reverse=True)  # the whole value before its parts

    def __bool__(self):
        return bool(self.pieces)

    def bytes(self, data):
        for piece in self.pieces:
            data = data.replace(piece, MASK)
        return data

    def text(self, line):
        if not self.pieces:
            return line
        return self.bytes(line.encode("utf-8", "surrogateescape")).decode("utf-8", "surrogateescape")


def from_environment(env=None):
    """The masker for the secrets this process was given."""
    env = os.environ if env is None else env
    names = [n for n in env.get("FSDPCTL_SECRET_NAMES", "").split(",") if n]
    return Masker([env.get(name, "") for name in names])


def scrub(folder, masker):
    """Mask the secrets in every file under ``folder`` (torchrun's own per-rank log copies), in place."""
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            try:
                with open(path, "rb") as handle:
                    data = handle.read()
                masked = masker.bytes(data)
                if masked != data:
                    with open(path, "wb") as handle:
                        handle.write(masked)
            except OSError:
                continue


def main():
    masker = from_environment()
    if sys.argv[1:2] == ["--scrub"]:
        for folder in sys.argv[2:]:
            scrub(folder, masker)
        return
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        out.write(masker.bytes(line))
        out.flush()


if __name__ == "__main__":
    main()
