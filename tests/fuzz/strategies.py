"""What the fuzz tests feed the parsers: raw bytes, JSON-ish values and mutated real samples.

The number of examples per test comes from SE_BRIDGE_FUZZ_EXAMPLES (default 200, which keeps
the normal run to seconds); `python -m tests.chaos --fuzz-examples N` raises it on demand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("SE_BRIDGE_FUZZ_EXAMPLES", "200"))
# No deadline: the machine is shared, and a slow example is not a failure; a hang is caught
# by pytest-timeout instead.
FUZZ = settings(max_examples=EXAMPLES, deadline=None)

SEEDS = Path(__file__).resolve().parents[1] / "data" / "seeds"


def seed_bodies() -> list[bytes]:
    """The real Scheduled Events documents the unit tests use, as IMDS sent them."""
    return [path.read_bytes() for path in sorted(SEEDS.glob("*.json"))]


# Strings a parser is likely to trip over: signs, non-ASCII digits, huge numbers, controls.
NASTY_TEXT = st.sampled_from(
    [
        "", " ", "-", "--5", "+5", "²", "٣", "1_000", "1e400", "-1e400", "nan", "inf", "0x10",
        "9" * 5000, "\x00", "\ud800", "Mon, 11 Apr 2022 22:26:58 GMT", "2022-04-11T22:26:58Z",
        "Tue, 99 Foo 2022 99:99:99 GMT", "0001-01-01T00:00:00+05:00", "\u202e", "a" * 2000,
    ]
)  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False)
    | st.text(max_size=30)
    | NASTY_TEXT
)

json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(max_size=12) | NASTY_TEXT, children, max_size=5)
    ),
    max_leaves=20,
)


def _mutate(data: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    """Each edit cuts `length` bytes at `position` (modulo the length) and puts `insert` there."""
    out = bytearray(data)
    for position, length, insert in edits:
        at = position % (len(out) + 1)
        out[at : at + length] = insert
    return bytes(out)


_edits = st.lists(
    st.tuples(
        st.integers(0, 10_000),
        st.integers(0, 8),
        st.binary(max_size=6)
        | st.sampled_from([b'"', b"{", b"}", b"[", b"]", b",", b":", b"-", b"\\u", b"null"]),
    ),
    min_size=1,
    max_size=6,
)


def mutations(samples: list[bytes]) -> st.SearchStrategy[bytes]:
    """Real samples with a few bytes cut, replaced or inserted: near-misses of the real shape."""
    return st.builds(_mutate, st.sampled_from(samples), _edits)


def deep(opening: str, closing: str, depth: int) -> str:
    return opening * depth + closing * depth


DEEP_JSON = [deep("[", "]", 100_000), deep('{"a":', "}", 50_000), "[" * 100_000]


def as_json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()
