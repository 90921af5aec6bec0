"""Regenerate the key tables in docs/configuration.md from the config dataclasses."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from chronoshard.settings import reference_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
SECTIONS = {
    "scheduler": "chronoshard.scheduler.config:SchedulerConfig",
    "watchdog": "chronoshard.watchdog.config:WatchdogConfig",
}


def render(text: str) -> str:
    for name, target in SECTIONS.items():
        module, _, attr = target.partition(":")
        cls = getattr(__import__(module, fromlist=[attr]), attr)
        pattern = re.compile(
            rf"(<!-- BEGIN GENERATED {name} -->\n).*?(<!-- END GENERATED {name} -->)", re.S
        )
        table = reference_table(cls)
        text = pattern.sub(lambda m, table=table: m.group(1) + table + "\n" + m.group(2), text)
    return text


def main() -> int:
    current = DOC.read_text()
    fresh = render(current)
    if "--check" in sys.argv:
        if fresh != current:
            print(f"{DOC} is stale: run python scripts/gen-config-docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
