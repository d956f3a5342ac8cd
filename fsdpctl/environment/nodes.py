"""Making an environment on a run's nodes, all at once: one conversation per node with the node's side
(``fsdpctl.node.envs``) over its connection. The node says what it is and holds; the environment is
resolved for its platform here; the wheels it lacks and cannot download are sent, each once, over the
same connection; the node makes the environment aside and moves it into place whole."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from ..errors import HostError
from ..plan.environment import EnvPlan
from ..shell import OUTPUT_MARK, command_line, marked
from . import resolve as resolving
from . import wheels as store
from .uv import ResolveError, uv_version

TAG = "FSDPCTL-ENV"
FACTS_TIMEOUT = 120.0
BUILD_TIMEOUT = 3600.0
"""A first environment with torch takes minutes on a slow disk; a reused one, a fraction of a second."""
_PYPI_HOSTS = ("pypi.org", "files.pythonhosted.org")
_TORCH_HOST = "download.pytorch.org"


def helper_command(plan: EnvPlan, args: dict[str, Any]) -> str:
    """The node's side run with the node's own Python, isolated and without ``site`` (stdlib only: a
    site's .pth files cost a node tens of milliseconds at every launch, for nothing)."""
    return marked(command_line(plan.base_python, ["-I", "-S", "-c", node_source(), json.dumps(args)]))


@functools.lru_cache(maxsize=1)
def node_source() -> str:
    """The node's side for ``python -c``: its store's functions, then ``envs`` itself."""
    folder = Path(__file__).resolve().parent.parent / "node"
    store = (folder / "env_store.py").read_text(encoding="utf-8")
    own = (folder / "envs.py").read_text(encoding="utf-8").replace("from __future__ import annotations\n", "", 1)
    return store + "\n\n" + own


@dataclass(frozen=True)
class NodeEnv:
    """What one node's environment took."""

    node_rank: int
    host: str
    key: str
    target: str
    built: bool
    how: str
    """``reused``, ``sent`` (made offline from wheels sent from here) or ``downloaded`` (the node
    downloaded them), ``sent+downloaded`` when both."""
    sent_bytes: int
    seconds: float
    removed: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.how == "staged":
            return (f"environment {self.key} ({self.target}) put in the run directory, {self.sent_bytes / 1e6:.0f} MB "
                    f"of wheels: the job's first step makes it on every node")
        if not self.built:
            return f"environment {self.key} reused ({self.seconds:.1f} s)"
        sent = f", {self.sent_bytes / 1e6:.0f} MB sent" if self.sent_bytes else ""
        how = {"sent": "from wheels sent from here", "downloaded": "from wheels the node downloaded",
               "sent+downloaded": "from wheels sent and downloaded"}.get(self.how, self.how)
        return f"environment {self.key} made {how} in {self.seconds:.1f} s ({self.target}{sent})"


class Progress:
    """Bytes sent to every node together, told to ``on_bytes`` at most every 0.2 s."""

    def __init__(self, on_bytes: Optional[Callable[[int, int], None]]):
        self.on_bytes, self.sent, self.total = on_bytes, 0, 0
        self._lock = threading.Lock()
        self._told = 0.0
        self._told_sent = -1

    def expect(self, count: int) -> None:
        with self._lock:
            self.total += count

    def add(self, count: int, last: bool = False) -> None:
        with self._lock:
            self.sent += count
            now = time.monotonic()
            if self.on_bytes and self.sent != self._told_sent and (last or now - self._told >= 0.2):
                self._told, self._told_sent = now, self.sent
                self.on_bytes(self.sent, self.total)


def index_hosts(plan: EnvPlan) -> list[str]:
    """The hosts a node would download from, asked whether it reaches them."""
    urls = [u for u in (plan.index_url, *plan.extra_index_urls) if u]
    hosts = [urlparse(u).hostname for u in urls if urlparse(u).scheme in ("http", "https")]
    if not plan.index_url:
        hosts += _PYPI_HOSTS
    if plan.torch_backend != "none":
        hosts.append(_TORCH_HOST)
    return sorted({h for h in hosts if h})


def make_environments(plan: EnvPlan, nodes: Sequence[tuple[int, str, Any]],
                      on_bytes: Optional[Callable[[int, int], None]] = None,
                      on_node: Optional[Callable[[NodeEnv], None]] = None) -> list[NodeEnv]:
    """Make (or find) the environment on every node ``(node_rank, host, transport)``, all at once.
    Raises HostError naming the first node that failed (the others finish what they began)."""
    progress = Progress(on_bytes)
    errors: list[HostError] = []

    def one(node: tuple[int, str, Any]) -> Optional[NodeEnv]:
        try:
            return _one_node(plan, node[0], node[1], node[2], progress)
        except HostError as exc:
            errors.append(exc)
            return None

    with ThreadPoolExecutor(max_workers=max(1, min(64, len(nodes)))) as pool:
        made = [m for m in pool.map(one, nodes) if m is not None]
    if progress.total:
        progress.add(0, last=True)
        store.prune_cache()
    for node_env in made:
        if on_node:
            on_node(node_env)
    if errors:
        raise errors[0]
    return made


def _fail(host: str, detail: str, hint: str) -> HostError:
    return HostError(host, "environment", detail, hint)


def _one_node(plan: EnvPlan, rank: int, host: str, transport: Any, progress: Progress) -> NodeEnv:
    started = time.monotonic()
    args = {"root": plan.root, "name": plan.name, "base": plan.base_python, "mode": "build",
            "index_hosts": index_hosts(plan) if plan.install != "sent" else []}
    session = transport.session(helper_command(plan, args))
    try:
        session.read_until(OUTPUT_MARK, FACTS_TIMEOUT)
        facts = _said(session, "facts", host, FACTS_TIMEOUT, plan)
        try:
            target, wheels = resolve_for(plan, facts)
        except CannotMake as exc:
            raise _fail(host, exc.detail, exc.hint) from None
        key = resolving.env_key(wheels, facts)
        ready = key in facts.get("ready", {})
        request: dict[str, Any] = {"key": key, "name": plan.name, "keep": plan.keep, "source": plan.source,
                                   "wheels": [w.as_json() for w in wheels], "send": []}
        sends: list[tuple[Optional[resolving.Wheel], Path]] = []  # the uv binary first (no wheel), then wheels
        downloads = 0
        if not ready:
            online = plan.install == "node" or (plan.install == "auto" and _reaches_all(facts, wheels))
            held = set(facts.get("wheels", []))
            needed = list(wheels)
            binary, uv_wheel = uv_for(plan, target, facts) if not facts.get("uv") else (None, None)
            if binary is not None:  # sent as it is
                request["uv_binary"] = {"version": uv_version(), "size": binary.stat().st_size,
                                        "sha256": own_uv_file()[1]}
                sends.append((None, binary))
            elif uv_wheel is not None:  # always sent: the node takes its uv out of the wheel itself
                request["uv_wheel"] = {**uv_wheel.as_json(), "version": uv_version()}
                needed.append(uv_wheel)
            for wheel in needed:
                if wheel.file in held:
                    continue
                if online and not store.is_local(wheel) and wheel is not uv_wheel:
                    downloads += 1
                    continue
                try:
                    sends.append((wheel, store.fetch(wheel)))
                except ResolveError as exc:
                    raise _fail(host, str(exc), "check this machine's network, or the find_links folders") from None
            request["send"] = [{"file": w.file, "sha256": w.sha256, "size": path.stat().st_size}
                               for w, path in sends if w is not None]
            progress.expect(sum(path.stat().st_size for _, path in sends))
        session.send((json.dumps(request) + "\n").encode())
        sent = 0
        for _, path in sends:
            with path.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    session.send(chunk)
                    sent += len(chunk)
                    progress.add(len(chunk))
        done = _said(session, "done", host, BUILD_TIMEOUT, plan)
    finally:
        session.close()
    how = "reused" if not done.get("built") else "+".join(
        part for part, used in (("sent", bool(sends)), ("downloaded", downloads > 0)) if used) or "sent"
    return NodeEnv(rank, host, key, target.describe(), bool(done.get("built")), how, sent, time.monotonic() - started,
                   tuple(done.get("removed", ())))


class CannotMake(Exception):
    """No environment can be made for a node's platform: what and the fix, for the caller to name the node."""

    def __init__(self, detail: str, hint: str):
        super().__init__(detail)
        self.detail, self.hint = detail, hint


def resolve_for(plan: EnvPlan, facts: dict[str, Any]) -> tuple[resolving.Target, tuple[resolving.Wheel, ...]]:
    """The platform a node's facts describe, and the environment's wheels for it. Raises CannotMake."""
    wanted = resolving.python_refused(plan, facts["python"])
    if wanted:
        raise CannotMake(f"{plan.base_python} there is Python {facts['python']}, and the project needs {wanted} "
                         f"(requires-python in {plan.source})",
                         "set `python:` in the profile to a Python the project allows on every node")
    try:
        target = resolving.target_of(facts, plan.torch_backend, locked="uv.lock" in plan.files)
    except resolving.TargetError as exc:
        raise CannotMake(f"no environment can be made there: {exc}", "use another node, or a container") from None
    try:
        return target, resolving.resolve(plan, target)
    except ResolveError as exc:
        raise CannotMake(f"{plan.source} cannot be resolved for {target.describe()}: {exc}",
                         _python_hint(facts, plan, str(exc))) from None


def answer_in(text: str) -> Optional[tuple[str, dict[str, Any]]]:
    """The node's last word in ``text`` (``facts``, ``done`` or ``error``) and what it said."""
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith(f"{TAG} ")), None)
    if line is None:
        return None
    _, word, body = line.split(" ", 2)
    return word, json.loads(body)


def _said(session: Any, kind: str, host: str, timeout: float, plan: EnvPlan) -> dict[str, Any]:
    """The node's next word (``facts`` or ``done``); its error as a HostError."""
    out = session.read_until(TAG, timeout)
    said = answer_in(out)
    if said is None:
        status, rest, err = session.finish(30.0)
        last = (err.strip() or (out + rest).strip() or f"exit {status}").splitlines()[-1]
        if status == 127 or "No such file" in last:
            raise _fail(host, f"{plan.base_python} not found there ({last})",
                        "set `python:` in the profile to a Python 3 that exists on every node")
        raise _fail(host, f"the node's environment helper ended: {last}", "run the profile's python by hand there")
    word, answer = said
    if word == "error":
        raise _fail(host, answer["message"], "free space under environment.root there" if "full" in
                    answer["message"] else "run `fsdpctl env -p PROFILE` to see what the node holds")
    if word != kind:
        raise _fail(host, f"the node said {word!r} where {kind!r} was due", "report this as a bug")
    return answer


def _reaches_all(facts: dict[str, Any], wheels: Sequence[resolving.Wheel]) -> bool:
    reached = facts.get("reaches", {})
    hosts = {urlparse(w.url).hostname for w in wheels if not store.is_local(w)}
    return bool(hosts) and all(reached.get(h) for h in hosts)


def uv_for(plan: EnvPlan, target: resolving.Target, facts: dict[str, Any]
           ) -> tuple[Optional[Path], Optional[resolving.Wheel]]:
    """What gives a node without uv its uv: this machine's own binary where it runs there (both Linux
    with glibc, the same machine type), else the uv wheel for the node's platform."""
    if facts.get("glibc") and facts.get("machine") == _glibc_machine_here():
        return own_uv_file()[0], None
    return None, uv_wheel_for(plan, target)


@functools.lru_cache(maxsize=1)
def _glibc_machine_here() -> Optional[str]:
    """This machine's type when it is Linux with glibc, else None."""
    import os
    import platform

    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        glibc = ""
    return platform.machine() if platform.system() == "Linux" and glibc.startswith("glibc") else None


@functools.lru_cache(maxsize=1)
def own_uv_file() -> tuple[Path, str]:
    """This machine's uv binary and its sha256."""
    import hashlib

    from .uv import uv_binary

    path = Path(uv_binary())
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def uv_wheel_for(plan: EnvPlan, target: resolving.Target) -> resolving.Wheel:
    """The uv wheel for the node's platform, the version running here (a node without uv gets it)."""
    import dataclasses

    just_uv = dataclasses.replace(plan, files={"requirements.txt": f"uv=={uv_version()}\n"})
    return resolving.resolve(just_uv, resolving.Target(target.python, target.platform, None))[0]


def _python_hint(facts: dict[str, Any], plan: EnvPlan, said: str) -> str:
    if "python" in said.lower() and "version" in said.lower():
        return (f"the node's {plan.base_python} is Python {facts.get('python')}: set `python:` in the profile to one "
                f"the lock allows there")
    return "pin a version that has a wheel for this platform, or add a find_links folder with one"
