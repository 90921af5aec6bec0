"""Chronoshard's benchmark suite: ``python -m bench WORKLOAD`` (see ``bench/README.md``).

The suite reuses the end-to-end tests' harness (real processes, the history checker),
which lives in ``tests/harness``: that directory is put on the import path here, once,
for every module of the package.
"""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
