"""Shared test helpers: the record schema validator and the seed documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker

from bridge import schema

DATA = Path(__file__).parent / "data"


def seed(name: str) -> Any:
    """A real IMDS document from the seeds, decoded exactly as the agent decodes it."""
    return json.loads((DATA / "seeds" / name).read_text(encoding="utf-8"))


_VALIDATOR = Draft202012Validator(schema.load(), format_checker=FormatChecker())


def assert_valid(record: dict[str, Any]) -> None:
    """Fail with every schema violation of `record`, not just the first."""
    errors = sorted(_VALIDATOR.iter_errors(record), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
