"""SSH to the nodes with paramiko: ~/.ssh/config, agent and key files, known_hosts. The only paramiko importer.

Host keys are checked by default: an unknown key or a changed key refuses the connection.
``accept-new`` records unknown keys (as OpenSSH's StrictHostKeyChecking=accept-new) and still
refuses changed ones. Every failure becomes an ``SSHError`` with a cause a person can act on.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko

from ...errors import HostError
from ...profiles.schema import HostSpec, SSHSpec
from ..transport import MarkerReader, ReadingSession
from .channels import ChannelOpener, ChannelStream, ChannelTimeout, OpenTimedOut, send_all
from .jumps import CONNECT_TRIES, JUMPS, Hop, handshake_slot, jump_chain, retry_pause
from .known_hosts import AcceptNew, known_hosts_name, known_lines

KEEPALIVE_SECONDS = 5
LATE_CHANNEL_SECONDS = 120.0  # how long a timed-out channel's confirmation is waited for, to close it
IDLE_POLL_SECONDS = 1.0
"""How often a connection's paramiko thread wakes when nothing arrives, once connected (paramiko's
0.1 s: 0.45 ms of launcher CPU per connection per second, 11 % of a core for 256 idle nodes,
measured here; 0.07 ms at 1 s). Data is read the moment it arrives either way; only a close and the
keepalive are noticed on these wakes, and the keepalive is 5 s."""
_SLOW_HANDSHAKE = ("no existing session", "authentication timeout")

# paramiko logs a dropped connection's traceback at ERROR: with no handler, Python's last-resort one
# prints it in the terminal, even for one the next try makes. Each failure is one SSHError instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class SSHError(HostError):
    """A host that could not be reached or authenticated over SSH, or whose command timed out."""


@dataclass(frozen=True)
class Target:
    """Where and as whom to connect, after ~/.ssh/config and the profile are combined."""

    alias: str
    hostname: str
    port: int
    user: str | None
    identity_files: tuple[str, ...]
    known_hosts: str
    proxy_jump: str | None


def _ssh_config(path: Path | None = None) -> paramiko.SSHConfig:
    path = path or Path("~/.ssh/config").expanduser()
    return paramiko.SSHConfig.from_path(str(path)) if path.is_file() else paramiko.SSHConfig()


def resolve_target(host: HostSpec | str, ssh: SSHSpec, config: paramiko.SSHConfig | None = None) -> Target:
    """Combine the profile (host entry over ``ssh`` section) with ~/.ssh/config (profile wins)."""
    spec = HostSpec(host=host) if isinstance(host, str) else host
    entry = (config or _ssh_config()).lookup(spec.host)
    identities = [ssh.identity_file] if ssh.identity_file else list(entry.get("identityfile", []))
    known = ssh.known_hosts or (entry.get("userknownhostsfile") or "~/.ssh/known_hosts").split()[0]
    proxy = ssh.proxy_jump or entry.get("proxyjump")
    return Target(
        alias=spec.host,
        hostname=entry.get("hostname", spec.host),
        port=int(spec.port or ssh.port or entry.get("port", 22)),
        user=spec.user or ssh.user or entry.get("user"),
        identity_files=tuple(os.path.expanduser(i) for i in identities),
        known_hosts=os.path.expanduser(known),
        proxy_jump=None if proxy in (None, "none") else proxy,
    )


def _classify(target: Target, exc: BaseException, timeout: float) -> SSHError:
    where = f"{target.hostname}:{target.port}"
    if _slow(exc):
        return SSHError(target.alias, "ssh", f"the SSH handshake with {where} did not end within {timeout:g} s",
                        "the host or this machine is overloaded: raise ssh.connect_timeout")
    if isinstance(exc, socket.gaierror):
        return SSHError(target.alias, "unresolved", f"host name {target.hostname!r} does not resolve",
                        "check the name in the profile and ~/.ssh/config, or give the IP address")
    if isinstance(exc, paramiko.BadHostKeyException):
        return SSHError(target.alias, "changed-host-key",
                        f"host key of {where} differs from the one in {target.known_hosts}",
                        f"if the host was reinstalled, remove the old key: ssh-keygen -R "
                        f"{known_hosts_name(target.hostname, target.port)!r} -f {target.known_hosts}")
    if isinstance(exc, paramiko.AuthenticationException):
        return SSHError(target.alias, "auth", f"authentication failed as {target.user or 'the local user'}",
                        "check ssh.user and ssh.identity_file, or that the key is in the node's authorized_keys")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errors = list(exc.errors.values())
        exc = errors[0] if errors else exc
    if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
        return SSHError(target.alias, "refused", f"connection to {where} refused",
                        "is sshd running there, and on that port (ssh.port / hosts[].port)?")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return SSHError(target.alias, "unreachable", f"no answer from {where} within {timeout:g} s",
                        "check the address, that the host is up, and firewalls between here and there")
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return SSHError(target.alias, "unreachable", f"no route to {where} ({exc.strerror})",
                        "check the address and that this machine can reach that network")
    text = str(exc)
    if "not found in known_hosts" in text:
        return SSHError(target.alias, "unknown-host-key", f"host key of {where} is not in {target.known_hosts}",
                        f"verify it and add it (ssh-keyscan -p {target.port} {target.hostname} >> "
                        f"{target.known_hosts}), or set ssh.host_key_policy: accept-new")
    if "banner" in text.lower():
        return SSHError(target.alias, "ssh", f"{where} did not speak SSH in time ({text})",
                        "check that the port is an SSH server's")
    return SSHError(target.alias, "ssh", f"SSH to {where} failed: {type(exc).__name__}: {text}",
                    "run `ssh -v` to the same host for details")


# AES-GCM (an AEAD cipher: no separate MAC per packet) first, when the server offers it: code and
# payloads went 25 % faster through paramiko's per-packet Python loop than with aes128-ctr + HMAC.
_AEAD_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _transport(sock, **kwargs) -> paramiko.Transport:
    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    options.ciphers = (*(c for c in _AEAD_FIRST if c in options.ciphers),
                       *(c for c in options.ciphers if c not in _AEAD_FIRST))
    return transport


class _SSHSession(ReadingSession):
    """One exec channel to talk to: stdin written as we go (by any thread), stdout read up to markers."""

    def __init__(self, host: str, channel: paramiko.Channel):
        self.host, self.channel, self.sending = host, channel, threading.Lock()
        self.reader = MarkerReader(host, self._recv)

    def _recv(self, seconds: float) -> bytes:
        self.channel.settimeout(seconds)
        return self.channel.recv(65536)  # raises TimeoutError (socket.timeout) when nothing came

    def send(self, data: bytes) -> None:
        try:
            with self.sending:  # whole: a send can go out in pieces, and two threads send to an agent
                send_all(self.channel, data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SSHError(self.host, "ssh", f"the connection broke while sending ({exc})",
                           "check the node and the network to it") from None

    def finish(self, timeout: float) -> tuple[int, str, str]:
        self.channel.shutdown_write()
        rest = self.reader.rest(timeout)
        err = bytearray()
        while self.channel.recv_stderr_ready():
            err += self.channel.recv_stderr(65536)
        if not self.channel.status_event.wait(timeout):  # recv_exit_status() would wait without end
            raise SSHError(self.host, "timeout", f"command did not end within {timeout:g} s",
                           "the node may be overloaded or stuck")
        return self.channel.exit_status, rest, err.decode("utf-8", "replace")

    def close(self) -> None:
        self.channel.close()


def _dropped(exc: BaseException) -> bool:
    """Dropped while it was set up (a busy sshd's MaxStartups), or its handshake outlasted the timeout (a
    loaded launcher or host): worth trying again; a refusal, a wrong key or a host that does not answer is not."""
    if _slow(exc):
        return True
    if isinstance(exc, (paramiko.AuthenticationException, paramiko.BadHostKeyException, socket.gaierror)):
        return False
    if isinstance(exc, (ConnectionResetError, EOFError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, (paramiko.SSHException, OSError)) and (
        "banner" in text or "reset by peer" in text or "connection closed" in text or "eof" in text)


def _slow(exc: BaseException) -> bool:
    """A handshake that outlasted the timeout (start_client gives up silently: the next step says it)."""
    return any(words in str(exc).lower() for words in _SLOW_HANDSHAKE)


def open_session_once(transport: paramiko.Transport, timeout: float) -> paramiko.Channel:
    """One try (under the connection's ChannelOpener lock): OpenTimedOut when paramiko gives up, and
    the channel it left pending closed if its confirmation comes late (the node would keep it open,
    counted against sshd's MaxSessions, until the connection closes)."""
    pending = set(transport.channel_events)
    try:
        return transport.open_session(timeout=timeout)
    except paramiko.SSHException as exc:
        if "timeout opening channel" not in str(exc).lower():
            raise
        for chanid in set(transport.channel_events) - pending:
            event, channel = transport.channel_events.get(chanid), transport._channels.get(chanid)  # noqa: SLF001
            if event is not None and channel is not None:
                threading.Thread(target=lambda e=event, c=channel: e.wait(LATE_CHANNEL_SECONDS) and c.close(),
                                 name="fsdpctl-late-channel", daemon=True).start()
        raise OpenTimedOut() from None


class SSHTransport:
    """One node over SSH: one connection, reused for every command of one fsdpctl command."""

    def __init__(self, host: HostSpec | str, ssh: SSHSpec, config: paramiko.SSHConfig | None = None,
                 seen: tuple[str, ...] = ()):
        self.spec = ssh
        self.config = config if config is not None else _ssh_config()
        self.target = resolve_target(host, ssh, self.config)
        self.host = self.target.alias
        self.client: paramiko.SSHClient | None = None
        self.jump: SSHTransport | None = None
        self.jump_key: tuple | None = None
        self.seen = (*seen, self.target.hostname)
        """The hosts this connection goes through to get here: a jump host never jumps through itself."""
        self.drops: list[float] = []  # when its sshd dropped it while it was set up, and it was tried again
        self.channels = ChannelOpener()  # its retries: when a channel slow to open was opened again

    def _client(self, target: Target) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        name, keys, types = known_hosts_name(target.hostname, target.port), client.get_host_keys(), set()
        for line in known_lines(target.known_hosts, name):  # not load_host_keys: O(lines^2) per connection
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
            except paramiko.SSHException:
                continue  # paramiko's own reading skips it too
            if entry is not None and entry.key.get_name() not in types:  # the first of a type is the one checked
                types.add(entry.key.get_name())
                keys.add(name, entry.key.get_name(), entry.key)
        if self.spec.host_key_policy == "accept-new":
            client.set_missing_host_key_policy(AcceptNew(target.known_hosts, target.port))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        return client

    def _through(self) -> list[Hop]:
        """The jump hosts on the way to this host, the first one first (none of the hosts this
        connection itself goes through: a jump host never jumps through itself)."""
        if not self.target.proxy_jump or self.target.proxy_jump.strip().lower() == "none":
            return []  # OpenSSH's "none": no jump host (ssh_config's ProxyJump switched off for a host)
        try:
            hops = jump_chain(self.target.proxy_jump)
        except ValueError as exc:
            raise SSHError(self.host, "ssh", f"ssh.proxy_jump {self.target.proxy_jump!r}: {exc}",
                           "write it as OpenSSH does: [user@]host[:port], several separated by commas") from None
        return [hop for hop in hops if hop.host not in self.seen]

    def _open_jump(self, hops: list[Hop]) -> paramiko.Channel:
        """A channel to this host through the last hop, whose own connection (shared by every host
        behind it in this process) goes through the hops before it."""
        target, timeout = self.target, self.spec.connect_timeout
        last, before = hops[-1], hops[:-1]
        spec = dataclasses.replace(self.spec, proxy_jump=",".join(map(str, before)) or None)
        key = (last.user, last.host, last.port, spec.proxy_jump, self.spec.identity_file, self.spec.known_hosts)
        try:
            self.jump = JUMPS.acquire(key, lambda: SSHTransport(HostSpec(host=last.host, port=last.port,
                                                                          user=last.user),
                                                                 spec, self.config, seen=self.seen))
        except SSHError as exc:
            raise SSHError(target.alias, exc.cause, f"via jump host {last.host}: {exc.detail}",
                           exc.hint or "") from None
        self.jump_key = key
        assert self.jump.client is not None
        inner = self.jump.client.get_transport()
        assert inner is not None
        return inner.open_channel("direct-tcpip", (target.hostname, target.port), ("", 0), timeout=timeout)

    def connect(self) -> None:
        """Open the connection (through the jump hosts when there are any; a connection the server
        drops while it is set up is tried again, paced); raises SSHError."""
        if self.client is not None:
            return
        target, timeout = self.target, self.spec.connect_timeout
        hops = self._through()
        dropped = 0
        while True:
            try:
                sock = self._open_jump(hops) if hops else None
                client = self._client(target)
                with handshake_slot(target.hostname, target.port):
                    client.connect(
                        target.hostname, port=target.port, username=target.user,
                        key_filename=list(target.identity_files) or None, timeout=timeout, banner_timeout=timeout,
                        auth_timeout=timeout, channel_timeout=timeout, sock=sock,
                        allow_agent=True, look_for_keys=not target.identity_files, transport_factory=_transport,
                    )
                break
            except SSHError:
                self._drop_jump()
                raise
            except Exception as exc:  # paramiko and socket errors of every kind become one SSHError
                self._drop_jump()
                dropped += 1
                if _dropped(exc) and dropped < CONNECT_TRIES:
                    self.drops.append(time.time())
                    time.sleep(retry_pause(dropped))
                    continue
                error = _classify(target, exc, timeout)
                if _slow(exc):
                    error = SSHError(target.alias, error.cause, f"{error.detail} (tried {dropped} times)", error.hint)
                elif _dropped(exc):
                    error = SSHError(target.alias, error.cause, f"{error.detail} (dropped {dropped} times while the "
                                     f"connection was set up)", "a busy sshd drops connections past its "
                                     "MaxStartups: raise it there, or reach many hosts through one ssh.proxy_jump")
                raise error from None
        self.client = client
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_SECONDS)  # notice a host that stops answering
            transport.sock.settimeout(IDLE_POLL_SECONDS)  # the handshake is over: its 0.1 s poll is not needed

    def _drop_jump(self) -> None:
        if self.jump is not None and self.jump_key is not None:
            JUMPS.release(self.jump_key, self.jump)
        self.jump, self.jump_key = None, None

    def run(self, argv_text: str, timeout: float, stdin: bytes | None = None) -> tuple[int, str, str]:
        """Run one shell command line on the node; returns (exit status, stdout, stderr).

        Raises SSHError(cause="timeout") when it has not finished within ``timeout`` seconds."""
        channel = self._new_channel(timeout)
        deadline = time.monotonic() + timeout
        out = bytearray()
        try:
            channel.exec_command(argv_text)
            if stdin:
                send_all(channel, stdin)
            channel.shutdown_write()
            # stderr waits in paramiko's buffer meanwhile (a probe writes little there): no deadlock
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError()
                channel.settimeout(remaining)
                chunk = channel.recv(65536)
                if not chunk:
                    break
                out += chunk
            err = bytearray()
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            # recv_exit_status() would wait without end on a host that stopped answering.
            if not channel.status_event.wait(max(0.1, deadline - time.monotonic())):
                raise TimeoutError()
            status = channel.exit_status
        except TimeoutError:
            raise SSHError(self.host, "timeout", f"command did not finish within {timeout:g} s",
                           "the node may be overloaded or stuck; raise the timeout or look at it") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise SSHError(self.host, "ssh", f"the command's channel failed: {exc or type(exc).__name__}",
                           "the host may be down or unreachable; check it with fsdpctl doctor") from None
        finally:
            channel.close()
        return status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def _new_channel(self, timeout: float | None = None):
        """A fresh session channel on the connection (opened on first use), within ``timeout`` seconds
        (default: the profile's connect timeout)."""
        self.connect()
        assert self.client is not None
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise SSHError(self.host, "ssh", "the SSH connection closed", "run the command again")
        once, timeout = functools.partial(open_session_once, transport), timeout or self.spec.connect_timeout
        try:
            return self.channels.open(once, timeout)
        except ChannelTimeout as slow:  # answering too slowly, each time (or the launcher too busy to read it)
            raise SSHError(self.host, "timeout", f"could not open a channel: {slow}", "the host or this machine "
                           "may be overloaded; look at both, or raise ssh.connect_timeout") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:  # a connection that stopped answering
            raise SSHError(self.host, "ssh", f"could not open a channel: {exc or type(exc).__name__}",
                           "the host may be down or unreachable; check it with fsdpctl doctor") from None

    def stream(self, command: str) -> ChannelStream:
        """Start a command line and read its output (stderr merged) as it arrives."""
        channel = self._new_channel()
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        channel.shutdown_write()
        return ChannelStream(channel)

    def session(self, command: str) -> _SSHSession:
        """Start a command line to talk to: its stdin stays open until ``finish`` or ``close``."""
        channel = self._new_channel()
        channel.exec_command(command)
        return _SSHSession(self.host, channel)

    def close(self) -> None:
        """Close the connection (and the jump host's, once no other host goes through it)."""
        if self.client is not None:
            self.client.close()
            self.client = None
        self._drop_jump()
