"""The import rules of the layout, read from the source: which package may use what.

Each rule keeps a promise: the workload runs on nodes without the launcher; the plan stays pure;
backends never reach up into the CLI; a third-party library has one home; ``fsdpctl --help`` is instant.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fsdpctl.bundle import SHIPPED_PACKAGES
from tests.conftest import REPO

PACKAGE = REPO / "fsdpctl"
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (at any depth in the file), relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import x` names modules
    return found


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
IMPORTS = {name: imports_of(path) for name, path in MODULES.items()}


def internal(name: str) -> set[str]:
    return {m for m in IMPORTS[name] if m in MODULES}


def closure(name: str) -> set[str]:
    """Every fsdpctl module that importing ``name`` can load (its imports, theirs, ...)."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        for dep in internal(current) | {p for p in _parents(current) if p in MODULES}:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def third_party(name: str) -> set[str]:
    return {m.split(".")[0] for m in IMPORTS[name] if not m.startswith("fsdpctl")}


def under(prefix: str) -> list[str]:
    return [m for m in MODULES if m == prefix or m.startswith(prefix + ".")]


def test_the_rules_see_every_package():
    for package in ("fsdpctl.cli", "fsdpctl.plan", "fsdpctl.backends", "fsdpctl.hostcheck", "fsdpctl.workload",
                    "fsdpctl.profiles", "fsdpctl.rundir", "fsdpctl.diagnose"):
        assert len(under(package)) >= 3, package
    assert "fsdpctl.backends.nodes.backend" in internal("fsdpctl.backends.local")  # relative imports are resolved


SHIPPED = tuple(f"fsdpctl.{p.split('/')[0]}" for p in SHIPPED_PACKAGES)


@pytest.mark.parametrize("package", ["fsdpctl.workload", "fsdpctl.node"])
def test_what_the_nodes_get_imports_nothing_of_the_launcher(package):
    for name in under(package):
        outside = {m for m in closure(name) if m not in ("fsdpctl",) and not m.startswith(SHIPPED)}
        assert not outside, f"{name} imports {sorted(outside)}: the nodes get only the shipped packages"
    if package == "fsdpctl.node":  # next to any user's program: the standard library alone, and torch for the
        # rank telemetry, which the start-up hook imports only once the program itself has imported torch
        for name in under(package):
            allowed = set(sys.stdlib_module_names) | ({"torch"} if name.startswith(IN_RANK) else set())
            assert not third_party(name) - allowed, name


@pytest.mark.parametrize("name", [m for m in MODULES if m.startswith("fsdpctl.plan")])
def test_plan_and_render_stay_pure(name):
    forbidden = {"subprocess", "socket", "paramiko", "submitit", "threading", "urllib", "http", "torch"}
    reached = {name, *closure(name)}
    modules = {m for m in reached if m.startswith(("fsdpctl.backends", "fsdpctl.cli", "fsdpctl.hostcheck"))}
    assert not modules, f"{name} reaches {sorted(modules)}"
    libraries = set().union(*(third_party(m) for m in reached)) & forbidden
    assert not libraries, f"{name} (through {sorted(reached)}) imports {sorted(libraries)}"


def test_backends_never_import_the_cli():
    for name in under("fsdpctl.backends"):
        assert not any(m.startswith("fsdpctl.cli") for m in closure(name)), name


def test_diagnosis_sits_above_the_backends():
    """The backends keep the watchdog's clock and read stacks; what a hang means is decided above them."""
    for name in under("fsdpctl.backends"):
        assert not any(m.startswith("fsdpctl.diagnose") for m in closure(name)), name
    for name in under("fsdpctl.diagnose"):
        assert not any(m.startswith("fsdpctl.cli") for m in closure(name)), name


@pytest.mark.parametrize("library, homes", [
    ("paramiko", {"fsdpctl.backends.ssh.transport"}),
    ("submitit", {"fsdpctl.backends.slurm.via_submitit", "fsdpctl.workload.slurm_task"}),
    ("jinja2", {"fsdpctl.plan.render"}),
    ("yaml", {"fsdpctl.profiles.loader"}),
    ("apprise", {"fsdpctl.notify.apprise_send"}),
])
def test_a_third_party_library_has_one_home(library, homes):
    users = {m for m in MODULES if library in third_party(m)}
    assert users <= homes, f"{library} imported by {sorted(users - homes)}"


# Sent to the nodes and run there by their own Python: it may import torch there, never in the CLI process.
NODE_SIDE = {"fsdpctl.hostcheck.probe_script"}
IN_RANK = ("fsdpctl.node.telemetry", "fsdpctl.node.profiling")
"""Code that runs in every rank of a user's program: torch only inside its functions, once the program has it."""


def test_typer_and_rich_only_in_the_cli_and_torch_only_in_the_workload():
    for name in MODULES:
        libraries = third_party(name)
        if not name.startswith("fsdpctl.cli"):
            assert not libraries & {"typer", "rich"}, name
        if not name.startswith(("fsdpctl.workload", *IN_RANK)) and name not in NODE_SIDE:
            assert "torch" not in libraries, name
    telemetry = {name for name in MODULES if name.startswith(IN_RANK)}
    for name in NODE_SIDE | telemetry:  # torch stays inside the functions run on the node, next to the program's
        top = ast.parse(MODULES[name].read_text()).body
        assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) and "torch" in ast.dump(n) for n in top), name


def test_no_module_is_over_400_lines():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by role: {long}"


def test_help_imports_no_heavy_library():
    code = textwrap.dedent("""\
        import sys
        from fsdpctl.cli.app import main
        try:
            main(["--help"])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        print("LOADED", sorted(m for m in ("torch", "paramiko", "submitit", "jinja2", "yaml", "numpy", "apprise")
                              if m in sys.modules))
        """)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout
    for command in ("doctor", "launch", "submit", "logs", "status", "stop", "runs", "render", "profiles"):
        assert command in result.stdout


def module_level_imports(name: str) -> set[str]:
    """The fsdpctl modules ``name`` imports at its top level, for type checkers too (not inside functions)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(statements) -> None:
        for node in statements:
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*base, node.module] if node.module else base)
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)

    visit(tree.body)
    return {m for m in found if m in MODULES and m != name}


def cycles_in(graph: dict[str, set[str]]) -> list[str]:
    """Every import path that leads a module back to itself, as text."""
    cycles = []
    for start in graph:
        todo, seen = [(start, [start])], set()
        while todo:
            current, path = todo.pop()
            for nxt in graph[current]:
                if nxt == start:
                    cycles.append(" -> ".join([*path, nxt]))
                elif nxt not in seen:
                    seen.add(nxt)
                    todo.append((nxt, [*path, nxt]))
    return sorted(set(cycles))


def test_no_import_cycle_between_modules():
    """Modules form layers: none reaches itself through the others' top-level imports (type-only
    imports count: a cycle there is still two modules that need each other). A package's own
    ``__init__`` re-exporting its modules is not a cycle."""
    cycles = cycles_in({name: {m for m in module_level_imports(name) if not name.startswith(m + ".")}
                        for name in MODULES})
    assert not cycles, "\n".join(cycles[:10])


# What runs on the nodes prints its own output (to the node's log); the launcher reports events.
PRINTS_ALLOWED = ("fsdpctl.cli", "fsdpctl.workload", "fsdpctl.node", "fsdpctl.backends.nodes.agent",
                  "fsdpctl.hostcheck.probe_script")


def test_nothing_below_the_cli_prints():
    for name, path in MODULES.items():
        if name.startswith(PRINTS_ALLOWED):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                raise AssertionError(f"{name}:{node.lineno} prints; report an event or return a value instead")
            if isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr") and \
                    isinstance(node.value, ast.Name) and node.value.id == "sys":
                raise AssertionError(f"{name}:{node.lineno} writes to sys.{node.attr}")


def test_importing_the_api_loads_no_heavy_library():
    """What a notebook pays for ``import fsdpctl`` and for reaching the API's names."""
    code = ("import sys, fsdpctl; fsdpctl.launch, fsdpctl.Run, fsdpctl.get_run, fsdpctl.doctor; "
            "print(sorted(m for m in ('torch', 'paramiko', 'submitit', 'jinja2', 'yaml', 'typer', 'rich', 'numpy') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


BACKEND_NAMES = {"local", "ssh", "slurm"}
OUTSIDE_BACKENDS = [m for m in MODULES if not m.startswith("fsdpctl.backends") and not m.startswith("fsdpctl.workload")
                    and not m.startswith("fsdpctl.node")]


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@pytest.mark.parametrize("name", OUTSIDE_BACKENDS)
def test_no_module_outside_the_backends_branches_on_a_backends_name(name):
    """Which backend runs a job is decided in the registry; everything else calls the interface.
    (What runs on the nodes, the workload and node helpers, is left out: it never sees a backend.)"""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            named = _strings(ast.Tuple(elts=[node.left, *node.comparators])) & BACKEND_NAMES
            assert not named, f"{name}:{node.lineno} compares with the backend name {sorted(named)}"
        if isinstance(node, (ast.Name, ast.arg, ast.keyword, ast.Attribute)):
            word = getattr(node, "id", None) or getattr(node, "arg", None) or getattr(node, "attr", None)
            assert word not in ("for_slurm", "from_slurm", "slurm_ending"), f"{name}:{node.lineno} {word}"


@pytest.mark.parametrize("name", OUTSIDE_BACKENDS)
def test_outside_the_backends_only_the_registry_and_the_interface_are_used(name):
    allowed = {"fsdpctl.backends", "fsdpctl.backends.registry", "fsdpctl.backends.base", "fsdpctl.backends.hang_watch"}
    used = {m for m in IMPORTS[name] if m.startswith("fsdpctl.backends.") and m in MODULES} - allowed
    assert not used, f"{name} imports {sorted(used)}: a backend's own modules are its own"


def test_every_import_counts_for_cycles_the_lazy_ones_too():
    """Imports inside functions (to keep `fsdpctl --help` fast) still make two modules need each
    other; none may close a cycle either (a package's ``__init__`` re-exporting its modules aside)."""
    cycles = cycles_in({name: {m for m in internal(name) if m != name and not name.startswith(m + ".")}
                        for name in MODULES})
    assert not cycles, "\n".join(cycles[:10])
