"""Rewrite the README's generated sections from their single sources (`./dev docs`).

The test suite calls `expected()` and fails when the README has drifted.
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
SEEDS = ROOT / "tests" / "data" / "seeds"


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


SECTIONS: dict[str, Callable[[], str]] = {
    "schema": schema.markdown_table,
    "settings": config.markdown_table,
    "example": example_record,
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
