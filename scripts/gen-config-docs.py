"""Regenerate the generated tables in docs/configuration.md from the code: each process's
keys from its config dataclass, and the other ``CHRONOSHARD_*`` variables from
``chronoshard.settings.OTHER_VARIABLES``."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from chronoshard.settings import CONFIG_CLASSES, OTHER_VARIABLES, config_classes, reference_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
SECTIONS = {"scheduler": "chronoshard-scheduler", "watchdog": "chronoshard-watchdog"}
"""Generated section of the document → the program whose configuration it lists."""


def other_variables_table() -> str:
    lines = ["| variable | read by | what for |", "|---|---|---|"]
    for name, variable in sorted(OTHER_VARIABLES.items()):
        readers = ", ".join(f"`{reader}`" for reader in variable.readers)
        purpose = f"tests only: {variable.purpose}" if variable.test_only else variable.purpose
        lines.append(f"| `{name}` | {readers} | {purpose} |")
    return "\n".join(lines)


def render(text: str) -> str:
    missing = set(CONFIG_CLASSES) - set(SECTIONS.values())
    if missing:
        raise SystemExit(f"no section of {DOC.name} for {', '.join(sorted(missing))}")
    classes = config_classes()
    tables = {name: reference_table(classes[program]) for name, program in SECTIONS.items()}
    tables["other-variables"] = other_variables_table()
    for name, table in tables.items():
        pattern = re.compile(
            rf"(<!-- BEGIN GENERATED {name} -->\n).*?(<!-- END GENERATED {name} -->)", re.S
        )
        if not pattern.search(text):
            raise SystemExit(f"{DOC} has no generated section {name!r}")
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
