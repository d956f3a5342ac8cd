#!/usr/bin/env bash
# Developer entry points on a fresh machine: `./dev.sh train` runs the main job, `./dev.sh test` the tests
# (`./dev.sh fast`: the fast lane, unit and contract tests without root).
# Both create .venv (Python 3.10+, torch 2.13.0 pinned) when it is missing or older than pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=.venv
TORCH_SPEC=${FSDPCTL_TORCH_SPEC:-torch==2.13.0}  # pinned: an unpinned torch pulls the CUDA build

setup_venv() {
  if [ -x "$VENV/bin/python" ] && [ "$VENV/.stamp" -nt pyproject.toml ]; then
    return
  fi
  echo "dev.sh: setting up $VENV (first run takes a minute)" >&2
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
  "$VENV/bin/python" -m pip install -q -e ".[workload,test,report]"
  # Holistic Trace Analysis reads `fsdpctl profile`'s traces in a test; it declares jupyterlab and pytest,
  # which it never imports: its own imports are in the test extra.
  "$VENV/bin/python" -m pip install -q --no-deps "holistictraceanalysis==0.5.0"
  touch "$VENV/.stamp"
}

case "${1:-}" in
  train)
    shift
    setup_venv
    exec "$VENV/bin/fsdpctl" launch --profile local "$@"
    ;;
  test)
    shift
    setup_venv
    # pytest exits 5 when it collected no test: that must fail, not pass silently.
    set +e
    # Two workers, one module each at a time (a module's testbed is set up once), the costliest modules
    # first (tests/conftest.py orders them); -n0 to go serially.
    "$VENV/bin/python" -m pytest -n "${FSDPCTL_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 5 ]; then
      echo "dev.sh: pytest collected no tests" >&2
      exit 1
    fi
    exit "$rc"
    ;;
  fast)
    shift
    setup_venv
    # The fast lane: unit tests and the backend contract on the fake and local backends (no root, no
    # namespaces, no Slurm); minutes, not the whole suite's twenty.
    exec "$VENV/bin/python" -m pytest -n "${FSDPCTL_TEST_WORKERS:-2}" --dist loadscope tests/unit tests/contract \
      -m "not integration and not workload and not gpu" "$@"
    ;;
  lint)
    setup_venv
    exec "$VENV/bin/ruff" check .
    ;;
  *)
    echo "usage: ./dev.sh train [launch flags] | test [pytest args] | fast [pytest args] | lint" >&2
    exit 2
    ;;
esac
