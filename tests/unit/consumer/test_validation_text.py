"""The record check's look for unpaired surrogates: the quick look every record gets says a
record is clean exactly when the walk that names where finds nothing (issue 40 made the
quick one; the walk now runs only for a record it refuses)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bridge.consumer import validation

# Text as a record may hold it: ASCII, other Unicode, and the lone halves of a surrogate pair
# that JSON's "\ud800" escapes let through.
TEXT = st.lists(st.sampled_from(["a", "_", "é", "日", "\U0001d11e", "\ud800", "\udfff"]),
                max_size=4).map("".join)  # fmt: skip
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(TEXT, VALUES, max_size=6))
def test_the_quick_look_finds_a_surrogate_exactly_where_the_walk_does(record: Any) -> None:
    assert validation._unicode(record) == (validation._unpaired_surrogate(record, "") is None)


def test_a_surrogate_in_a_list_or_a_field_name_is_named() -> None:
    assert validation._unicode({"Resources": ["web_0", "web_\udfff"]}) is False
    assert validation._unpaired_surrogate({"Resources": ["web_0", "web_\udfff"]}, "") == (
        "Resources[1]"
    )
    assert validation._unicode({"Tags": {"r\ud800le": "web"}}) is False
    assert validation._unicode({"Tags": {"rôle": "wéb"}, "Resources": ["日本"]}) is True
