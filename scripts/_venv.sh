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
# checkov (the security scan of deploy/kubernetes, tests/integration/test_kubernetes_manifests.py)
# gets a venv of its own: it pins ~80 packages exactly (packaging 23.2, older than ours,
# boto3, aiohttp, numpy, ...), which in .venv would downgrade what the project and its
# tools run on. The test finds it at this path.
if [ ! -x .venv/tools/checkov/bin/python ]; then
    "$python" -m venv .venv/tools/checkov
fi
.venv/tools/checkov/bin/python -m pip install -q --disable-pip-version-check checkov==3.3.30
