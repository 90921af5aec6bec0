#!/usr/bin/env bash
# The one place the container image's Python environment is made: the Dockerfile's builder
# stage runs it (into /opt/chronoshard, which the runtime stage copies), and
# tests/integration/test_image.py runs it into a temporary venv and starts every process
# of the image from there. A step added to the image goes here, so the test runs it too.
#
#   scripts/image-install.sh SOURCE_DIR WHEEL_DIR VENV_DIR
#
# SOURCE_DIR is the project (what the Dockerfile copies into the builder); WHEEL_DIR
# receives the wheels of the project and of every runtime dependency; VENV_DIR becomes a
# venv with exactly those installed, from WHEEL_DIR alone: the project with its `otel`
# extra (the OpenTelemetry API, so tracing works once configured), never `dev` or
# `bench`. No compiler is needed: every dependency ships binary wheels for CPython 3.11
# on x86_64 and aarch64 Linux. The interpreter is $PYTHON (default python3). pip's cache
# is used as configured: the Dockerfile keeps it in a BuildKit cache mount, out of the
# image's layers, and the test shares the developer's.
set -euo pipefail

if [ "$#" -ne 3 ]; then
    echo "usage: $0 SOURCE_DIR WHEEL_DIR VENV_DIR" >&2
    exit 2
fi
source_dir=$1
wheel_dir=$2
venv_dir=$3
python=${PYTHON:-python3}

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

"$python" -m venv "$venv_dir"
# The project's wheel and one for each runtime dependency, resolved once, here.
"$venv_dir/bin/python" -m pip wheel --quiet --wheel-dir "$wheel_dir" "$source_dir[otel]"
# Installed from those wheels only: the venv holds what was resolved above and nothing
# an index could add later.
"$venv_dir/bin/python" -m pip install --quiet --no-index --find-links "$wheel_dir" \
    "chronoshard[otel]"
"$venv_dir/bin/python" -m pip check
