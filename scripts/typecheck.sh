#!/usr/bin/env bash
# mypy needs the installed package layout (chronoshard.scheduler <- scheduler/, ...), which
# the editable install provides only through an import hook mypy cannot follow. Build a
# tree of symlinks with that layout and check it.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck
rm -rf "$tree"
mkdir -p "$tree/chronoshard"
for entry in chronoshard/*; do
    ln -s "$PWD/$entry" "$tree/chronoshard/$(basename "$entry")"
done
ln -s "$PWD/scheduler" "$tree/chronoshard/scheduler"
ln -s "$PWD/worker" "$tree/chronoshard/worker"
ln -s "$PWD/watchdog" "$tree/chronoshard/watchdog"
ln -s "$PWD/proto/chronoshard/v1" "$tree/chronoshard/v1"
cd "$tree"
exec ../../.venv/bin/mypy --config-file ../../pyproject.toml -p chronoshard
