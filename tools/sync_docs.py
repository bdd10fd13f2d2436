"""Rewrite the docs pages' generated sections from their single sources (`./dev generate`).

A generated section sits between `<!-- NAME:start -->` and `<!-- NAME:end -->` in a page under
docs/; PAGES says which page holds which section. The test suite calls `expected()` on every
page and fails when one has drifted.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from bridge import config, schema
from bridge.agent.normalise import Context, normalise
from bridge.records import Origin, VmIdentity

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SEEDS = ROOT / "tests" / "data" / "seeds"
_MARKER = re.compile(r"<!-- ([\w-]+):(start|end) -->")


def example_record() -> str:
    """The Scheduled record the normaliser makes of the seeds' live-migration documents 1 -> 2."""
    identity = VmIdentity(
        vm_id="02aab8a4-74ef-476e-8182-f6d2ba4166a6",
        vm_name="WestNO_0",
        resource_id="/subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/rg"
        "/providers/Microsoft.Compute/virtualMachines/WestNO_0",
        subscription_id="8d10da13-8125-4ba9-a717-bf7490507b3d",
        resource_group="rg",
        location="norwayeast",
        platform_fault_domain=0,
        platform_update_domain=0,
    )
    origin = Origin(identity, host_name="westno0", agent_version="0.1.0")
    now = datetime(2022, 4, 11, 22, 10, 1, tzinfo=timezone.utc)
    docs = [json.loads((SEEDS / f"live_migration_{i}.json").read_text()) for i in (1, 2)]
    state = normalise(None, docs[0], Context(now, origin)).state
    [record] = normalise(state, docs[1], Context(now, origin)).records
    return "```json\n" + json.dumps(record, indent=2) + "\n```\n"


# Each generated section, by the page that holds it.
PAGES: dict[str, dict[str, Callable[[], str]]] = {
    "records.md": {"schema": schema.markdown_table, "example": example_record},
    "configuration.md": {"settings": config.markdown_table},
}
SECTIONS: dict[str, Callable[[], str]] = {
    name: render for sections in PAGES.values() for name, render in sections.items()
}


def pages() -> list[Path]:
    """Every page of the site."""
    return sorted(DOCS.rglob("*.md"))


def markers(text: str) -> list[str]:
    """The section names of the start and end markers in `text`, in order."""
    return [match.group(1) for match in _MARKER.finditer(text)]


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.DOTALL)


def expected(text: str) -> str:
    """`text` with every generated section it holds rewritten from its source."""
    for name, render in SECTIONS.items():
        text = _pattern(name).sub(rf"\g<1>{_escape(render())}\g<2>", text)
    return text


def _escape(replacement: str) -> str:
    return replacement.replace("\\", "\\\\")


def main() -> int:
    for page in pages():
        text = page.read_text(encoding="utf-8")
        updated = expected(text)
        if updated != text:
            page.write_text(updated, encoding="utf-8")
            print(f"{page.relative_to(ROOT)} updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
