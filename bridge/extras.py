"""What each optional part of se-bridge needs installed, and what to say when it is missing.

The bare package is the agent: only what runs on every VM. `se-bridge[consumer]` adds what the
consumer, `se-bridge policy` and the demo need; `se-bridge[functions]` adds the Azure Functions
worker library to that; `se-bridge[kubernetes]` adds the Kubernetes client an agent that
drains its node uses (pyproject.toml's extras, which tests/unit/test_layout.py holds this
table to).
"""

from __future__ import annotations

from importlib import metadata

# The distributions each extra adds (names as pip knows them).
EXTRAS: dict[str, tuple[str, ...]] = {
    "consumer": (
        "azure-data-tables",
        "azure-eventhub-checkpointstoreblob",
        "fastjsonschema",
        "azure-keyvault-secrets",
    ),
    # The agent on a Kubernetes node ([kubernetes]: drains before maintenance).
    "kubernetes": ("lightkube",),
}


def missing(extra: str) -> list[str]:
    """The distributions of `extra` that are not installed (nothing is imported to find out)."""
    absent = []
    for name in EXTRAS[extra]:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            absent.append(name)
    return absent


def missing_message(extra: str, command: str) -> str:
    """Empty when `extra` is installed, else a sentence that says what to install."""
    absent = missing(extra)
    if not absent:
        return ""
    return (
        f"`{command}` needs the {extra} extra, and {', '.join(absent)} "
        f"{'is' if len(absent) == 1 else 'are'} not installed: this looks like an agent-only "
        f"install. Where the {extra} runs, install the {extra}'s packages from the lock: "
        f"pip install --require-hashes -r packaging/requirements/{extra}.txt (a release has it "
        f"as se-bridge-VERSION-requirements-{extra}.txt; docs/deploying.md)."
    )
