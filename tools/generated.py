"""What the generators of committed files share: write the file, or check that it is current."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(output: Path, text: str, regenerate: str, argv: list[str]) -> int:
    """Write `text` to `output`; with argv ["--check"], exit 1 when the file differs instead."""
    if argv == ["--check"]:
        current = output.read_text(encoding="utf-8") if output.exists() else ""
        if current != text:
            sys.stderr.write(f"{output} is out of date: run `{regenerate}`\n")
            return 1
        return 0
    if argv:
        sys.stderr.write(f"usage: {regenerate} [--check]\n")
        return 2
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    sys.stdout.write(f"wrote {output}\n")
    return 0
