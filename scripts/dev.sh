#!/usr/bin/env bash
# Install into .venv (first run only takes a while) and start a local development cluster.
# Arguments go to `chronoshard dev` (try --help).
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
exec .venv/bin/chronoshard dev "$@"
