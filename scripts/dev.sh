#!/usr/bin/env bash
# Install into .venv (the first run takes a while) and start a local development cluster.
# Without arguments it runs `chronoshard dev --demo`: the cluster, a demo worker, and a
# few hundred demo tasks shown completing live. With arguments they go to `chronoshard
# dev` instead (try --help). Ctrl-C stops everything.
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
if [ "$#" -eq 0 ]; then
    set -- --demo
fi
exec .venv/bin/chronoshard dev "$@"
