"""Rewrite the docs pages' generated sections from their single sources (`./dev generate`).

A generated section sits between `<!-- NAME:start -->` and `<!-- NAME:end -->` in a page under
docs/; PAGES says which page holds which section. The test suite calls `expected()` on every
page and fails when one has drifted.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

from bridge import config, schema
from bridge.agent.normalise import Context, normalise
from bridge.cli import LOGGING_OPTIONS, build_parser
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


def commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command's words and parser, a command's sub-commands in its place: ("agent",),
    ..., ("policy", "check"), ("policy", "explain"), ..."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from commands(sub, (*words, name))
                else:
                    yield (*words, name), sub


def synopsis(only: Sequence[str] = ()) -> str:
    """The usage of every command (or of those named in `only`) as the parser has it, without
    -h and the logging options every command takes; a repeatable option ends in `...`."""
    lines = []
    for words, parser in commands(build_parser()):
        if only and words[0] not in only:
            continue
        grouped = {
            id(a) for group in parser._mutually_exclusive_groups for a in group._group_actions
        }
        shown: list[argparse.Action] = []
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or set(action.option_strings) & set(
                LOGGING_OPTIONS
            ):
                continue
            if isinstance(action, argparse._AppendAction) and id(action) not in grouped:
                repeated = copy.copy(action)
                repeated.metavar = f"{action.metavar or action.dest.upper()} ..."
                shown.append(repeated)
            else:
                shown.append(action)
        formatter = argparse.HelpFormatter(f"se-bridge {' '.join(words)}", width=100)
        formatter.add_usage(None, shown, parser._mutually_exclusive_groups, prefix="")
        lines.append(formatter.format_help().rstrip("\n"))
    return "```\n" + "\n".join(lines) + "\n```\n"


PEOPLE_COMMANDS = ("approve", "hold", "pause", "resume")
RUNNING_COMMANDS = ("agent", "check", "simulate", "demo")

# Each generated section, by the page that holds it.
PAGES: dict[str, dict[str, Callable[[], str]]] = {
    "records.md": {"schema": schema.markdown_table, "example": example_record},
    "configuration.md": {"settings": config.markdown_table},
    "contracts.md": {"cli-synopsis": synopsis},
    "deploying.md": {"cli-running": lambda: synopsis(RUNNING_COMMANDS)},
    "people-page.md": {"cli-people": lambda: synopsis(PEOPLE_COMMANDS)},
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
