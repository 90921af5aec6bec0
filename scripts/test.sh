#!/usr/bin/env bash
# The whole test suite, from a fresh clone on a machine that has only Python 3.11+:
# installs the project and its dev extra into .venv, then runs ruff (lint and format),
# mypy and pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
. "$(dirname "$0")/_venv.sh"

# Debian tools for the fault tests (as root with apt); prints the export that makes their
# skips failures once they could be installed.
eval "$(scripts/system-tools.sh)"

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check --quiet .
echo "== mypy"
scripts/typecheck.sh
echo "== pytest"
# Not `python -m pytest`: that puts the repo root on sys.path, where ./chronoshard (the
# root package alone) would shadow the installed mapping of chronoshard.scheduler etc.
# The slowest tests are listed at the end: the suite must stay within ~20 minutes on 2
# cores, and this is where to look when it grows.
exec .venv/bin/pytest --durations=25 "$@"
