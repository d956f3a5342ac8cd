"""known_hosts read once per file and looked up by name, as paramiko and OpenSSH match names."""

from __future__ import annotations

import os

import paramiko

from fsdpctl.backends.ssh import known_hosts
from fsdpctl.backends.ssh.known_hosts import known_hosts_name, known_lines

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIfnwveOOU2Ob+yDOehGaSVGpIDz8ge4+5IwAdh5Kv1E"
OTHER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBzTvvbcw6HsmUhjsW9Zb2ZxnkK5T6Wo5mX7MrVxTnnB"


def test_a_host_is_found_by_its_plain_bracketed_listed_and_hashed_names_and_nothing_else(tmp_path):
    path = tmp_path / "known_hosts"
    hashed = paramiko.HostKeys.hash_host("10.0.0.9")
    path.write_text("\n".join([
        "# a comment", "",
        f"10.0.0.1 {KEY}",
        f"[10.0.0.1]:2222 {OTHER}",
        f"gpu-a,10.0.0.2 {KEY}",
        f"{hashed} {OTHER}",
        f"@cert-authority *.example {KEY}",
        f"|1|not-base64!|x {KEY}",
        *(f"10.1.{i // 250}.{i % 250 + 1} {KEY}" for i in range(2000)),
    ]) + "\n")
    assert known_lines(str(path), "10.0.0.1") == [f"10.0.0.1 {KEY}"]
    assert known_lines(str(path), known_hosts_name("10.0.0.1", 2222)) == [f"[10.0.0.1]:2222 {OTHER}"]
    assert known_lines(str(path), "10.0.0.2") == known_lines(str(path), "gpu-a") == [f"gpu-a,10.0.0.2 {KEY}"]
    assert known_lines(str(path), "10.0.0.9") == [f"{hashed} {OTHER}"]
    assert known_lines(str(path), "10.0.0.3") == [] and known_lines(str(path), "*.example") == []
    assert known_lines(str(tmp_path / "none"), "10.0.0.1") == []


def test_the_file_is_read_once_and_again_only_when_it_changes(tmp_path, monkeypatch):
    path = tmp_path / "known_hosts"
    path.write_text(f"10.0.0.1 {KEY}\n")
    reads = []
    real = known_hosts._read
    monkeypatch.setattr(known_hosts, "_read", lambda p: reads.append(p) or real(p))
    for _ in range(100):
        assert known_lines(str(path), "10.0.0.1") == [f"10.0.0.1 {KEY}"]
    assert len(reads) == 1
    with path.open("a") as handle:  # what accept-new does
        handle.write(f"10.0.0.1 {OTHER}\n")
    os.utime(path, ns=(1, 1))  # a change within the clock's tick is still a change of size
    assert known_lines(str(path), "10.0.0.1") == [f"10.0.0.1 {KEY}", f"10.0.0.1 {OTHER}"]
    assert len(reads) == 2
