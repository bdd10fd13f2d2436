"""The shared record helpers."""

from __future__ import annotations

import pytest

from bridge.records import vm_key


@pytest.mark.parametrize("name", ["web_3", "WEB_3", "_web_3", " _Web_3 "])
def test_every_spelling_of_a_vm_name_is_one_key(name: str) -> None:
    assert vm_key(name) == "web_3"


def test_other_names_stay_apart() -> None:
    assert vm_key("web_30") != vm_key("web_3")
