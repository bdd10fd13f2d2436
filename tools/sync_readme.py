"""Rewrite the README's generated sections from their single sources (`./dev docs`).

The test suite calls `expected()` and fails when the README has drifted.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from bridge import config, schema

README = Path(__file__).resolve().parent.parent / "README.md"
SECTIONS: dict[str, Callable[[], str]] = {
    "schema": schema.markdown_table,
    "settings": config.markdown_table,
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.DOTALL)


def expected(text: str) -> str:
    for name, render in SECTIONS.items():
        text = _pattern(name).sub(rf"\g<1>{_escape(render())}\g<2>", text)
    return text


def _escape(replacement: str) -> str:
    return replacement.replace("\\", "\\\\")


def main() -> int:
    text = README.read_text(encoding="utf-8")
    updated = expected(text)
    if updated != text:
        README.write_text(updated, encoding="utf-8")
        print("README.md updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
