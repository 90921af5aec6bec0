# Sourced by the scripts in this folder: make .venv and install the project with its dev
# extra, so a fresh clone on a machine with only Python 3.11+ needs nothing else, and its
# bench extra (the peers of `python -m bench peers`), so the suite's smoke test of that
# workload runs the peers too instead of skipping them.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,bench]'
