#!/usr/bin/env bash
# Regenerates the committed Python code for proto/chronoshard/v1/*.proto.
# `scripts/gen-proto.sh --check` writes nothing and exits 1 naming every stale file.
# The work is done by chronoshard/protogen.py; this wrapper only picks the interpreter.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
if [ ! -x "$python" ]; then
    python=python3
fi
exec "$python" "$root/chronoshard/protogen.py" "$@"
