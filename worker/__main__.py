"""``python -m chronoshard.worker pkg.module:worker [--target host:port ...]``."""

import sys

from chronoshard.worker._runner import main

if __name__ == "__main__":
    sys.exit(main())
