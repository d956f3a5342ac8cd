"""What the launching machine keeps of a run beside its logs, sent from each node as it grows: the
run's ``metrics.jsonl``, the node's GPU samples (``gpu/node<R>.jsonl``) and the bundled workload's
``summary.json``. New bytes only, a bounded amount per file and poll, so a file that floods never
holds back the node's log or another file, and the launcher's memory stays bounded.

Read in two places: the node agent of a foreground run sends these frames on the connection it
already keeps (``SideFiles``), and a follower of a run it did not start (a detached run's) runs
``python -m fsdpctl.node.side_files SPEC`` in the run directory, which writes them on stdout until
the node has ended and everything is out. Standard library only (3.8+): it runs with the node's
Python, shipped with the run.

A frame: ``+<index> <inode> <offset> <n>``, a newline, then n bytes: bytes of the ``index``-th file
of the launcher's list, starting at ``offset`` of the file whose inode is ``inode``. A file that was
replaced (an attempt rewrites ``metrics.jsonl``; ``summary.json`` is written whole and renamed) or
cut shorter is read again from its start under its new inode, so the launcher can tell a file that
goes on from one that began again. The launcher may give each file the inode and offset it already
has (``ino``, ``offset``): an agent of a later attempt on the same host sends only what is new.
"""

import json
import os
import sys
import time

FRAME = "+"
CHUNK = 64 << 10
"""Bytes read from one file per poll."""
POLL_SECONDS = 0.25
KEEPALIVE = b".\n"
"""Written by the standalone reader every few seconds while nothing else is: a follower that is
gone is noticed (the write fails) and the reader leaves."""
KEEPALIVE_SECONDS = 5.0


def header(index, inode, offset, size):
    """A frame's first line, as bytes."""
    return ("%s%d %d %d %d\n" % (FRAME, index, inode, offset, size)).encode()


def parse_header(line):
    """(index, inode, offset, size) of a frame's first line (bytes or str, with or without its
    newline), or None when it is not one."""
    if isinstance(line, bytes):
        line = line.decode("ascii", "replace")
    words = line[len(FRAME):].split() if line.startswith(FRAME) else []
    if len(words) != 4 or not all(w.isdigit() for w in words):
        return None
    return tuple(int(w) for w in words)


class SideFiles:
    """The files one node sends, each followed from where the launcher has it."""

    def __init__(self, specs):
        """``specs``: one ``{"path": relative path, "ino": inode or 0, "offset": bytes}`` per file,
        relative to the current directory (the node's run directory)."""
        self.paths = [spec["path"] for spec in specs]
        self.inodes = [int(spec.get("ino") or 0) for spec in specs]
        self.offsets = [int(spec.get("offset") or 0) for spec in specs]
        self.handles = [None] * len(specs)

    def _open(self, index):
        """The file's handle, positioned where the launcher's copy ends (or at its start, for a file
        other than the one the launcher had, or one that got shorter)."""
        try:
            handle = open(self.paths[index], "rb")  # noqa: SIM115 - kept open while the file grows
        except OSError:
            return None
        stat = os.fstat(handle.fileno())
        if stat.st_ino != self.inodes[index] or stat.st_size < self.offsets[index]:
            self.inodes[index], self.offsets[index] = stat.st_ino, 0
        handle.seek(self.offsets[index])
        self.handles[index] = handle
        return handle

    def _replaced(self, index):
        """The name now stands for another file, or this one got shorter."""
        try:
            stat = os.stat(self.paths[index])
        except OSError:
            return False  # gone for now (moved aside between attempts): what was read stands
        return stat.st_ino != self.inodes[index] or stat.st_size < self.offsets[index]

    def poll(self, budget=None):
        """Frames of what each file gained since the last poll (at most ``CHUNK`` bytes per file,
        and ``budget`` bytes in all when given)."""
        frames = []
        for index in range(len(self.paths)):
            if budget is not None and budget <= 0:
                break
            handle = self.handles[index]
            if handle is not None and self._replaced(index):
                handle.close()
                self.handles[index] = handle = None
            if handle is None:
                handle = self._open(index)
                if handle is None:
                    continue
            limit = CHUNK if budget is None else min(CHUNK, budget)
            data = handle.read(limit)
            if not data:
                continue
            frames.append(header(index, self.inodes[index], self.offsets[index], len(data)) + data)
            self.offsets[index] += len(data)
            if budget is not None:
                budget -= len(data)
        return frames

    def close(self):
        for handle in self.handles:
            if handle is not None:
                handle.close()
        self.handles = [None] * len(self.paths)


class FrameReader:
    """The launcher's side of the standalone reader's output: bytes in any pieces, frames out."""

    def __init__(self):
        self.buffer = b""

    def feed(self, chunk):
        """The frames ``chunk`` completes: ``(index, inode, offset, data)`` each."""
        self.buffer += chunk
        frames = []
        while True:
            newline = self.buffer.find(b"\n")
            if newline < 0:
                return frames
            line = self.buffer[:newline]
            found = parse_header(line)
            if found is None:  # a keepalive, or what a chatty shell printed: not a frame
                self.buffer = self.buffer[newline + 1:]
                continue
            index, inode, offset, size = found
            if len(self.buffer) < newline + 1 + size:
                return frames
            data = self.buffer[newline + 1:newline + 1 + size]
            self.buffer = self.buffer[newline + 1 + size:]
            frames.append((index, inode, offset, data))


def _ended(rank, pid):
    """The node's script has ended (its exit file is there) or its wrapper is gone."""
    if os.path.exists("node%d.exit" % rank):
        return True
    if pid:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
    return False


def follow(specs, rank, pid, out=None):
    """Write every file's new bytes as frames until the node has ended and all is out, or the
    reader of ``out`` is gone."""
    out = out if out is not None else sys.stdout.buffer
    files = SideFiles(specs)
    quiet_since = time.time()
    try:
        while True:
            ended = _ended(rank, pid)  # asked before reading: what was written before the end gets out
            frames = files.poll()
            if not frames and time.time() - quiet_since >= KEEPALIVE_SECONDS:
                frames = [KEEPALIVE]
            if frames:
                out.write(b"".join(frames))
                out.flush()
                quiet_since = time.time()
            elif ended:
                return 0
            else:
                time.sleep(POLL_SECONDS)
    except (BrokenPipeError, OSError):
        return 0  # the follower is gone
    finally:
        files.close()


def main(argv=None):
    args = json.loads((argv if argv is not None else sys.argv[1:])[0])
    return follow(args["files"], int(args["rank"]), int(args.get("pid") or 0))


if __name__ == "__main__":
    sys.exit(main())
