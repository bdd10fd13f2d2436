"""Fuzzing the policy file: any text gives a Policy or a PolicyError naming file and line.

Inputs: the docs' example policy with bytes cut, replaced or inserted; YAML documents built
near the real shape; and the classic hostile files (alias bombs, deep nesting, huge numbers).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from bridge.policy.file import EXAMPLE_POLICY_YAML, PolicyError, loads
from bridge.policy.model import Policy
from tests.fuzz.strategies import FUZZ, NASTY_TEXT, json_values, mutations

SOURCE = "fuzz.yaml"
# Every error names the file, then the line (docs/policy.md, "Checking a policy").
ERROR_FORMAT = re.compile(rf"^{re.escape(SOURCE)}:\d+: \S")


def loads_or_refuses(text: str) -> Policy | None:
    try:
        policy = loads(text, SOURCE)
    except PolicyError as err:
        message = str(err)
    else:
        assert policy.rules, "a policy without rules was accepted"
        return policy
    assert ERROR_FORMAT.match(message), f"no file and line in {message[:300]!r}"
    return None


def test_the_example_policy_loads() -> None:
    # Without this, a loader that refused everything would pass every test below.
    assert loads_or_refuses(EXAMPLE_POLICY_YAML) is not None


@FUZZ
@given(data=mutations([EXAMPLE_POLICY_YAML.encode()]))
def test_a_mutated_example_is_a_policy_or_a_policy_error(data: bytes) -> None:
    loads_or_refuses(data.decode("utf-8", "replace"))


# Near the real shape: the example's structure with any value replaced by anything.
values = json_values | NASTY_TEXT | st.sampled_from(
    ["approve", "hold", "Reboot", "User", "scale_set", "tag:", "10m", "0s", "1h30m", "99999999h",
     "Europe/Istanbul", "../../etc/passwd", "Mon", "weekend", "25:00", "23:59", -1, 0, 101, 1e308]
)  # fmt: skip
matches = st.dictionaries(
    st.sampled_from(["event_type", "event_source", "status", "duration_seconds", "vm", "other"]),
    values
    | st.dictionaries(st.sampled_from(["at_least", "below", "tags", "name", "zone"]), values),
    max_size=3,
)
actions = values | st.fixed_dictionaries(
    {},
    optional={
        "approve_when_ready": st.dictionaries(
            st.sampled_from(["deadline", "on_deadline"]), values, max_size=2
        ),
        "approve_in_window": st.dictionaries(
            st.sampled_from(["timezone", "windows"]),
            values | st.lists(st.dictionaries(st.sampled_from(["days", "start", "end"]), values)),
            max_size=2,
        ),
    },
)
rules = st.lists(
    st.fixed_dictionaries({}, optional={"name": values, "match": matches, "action": actions}),
    max_size=3,
)
budgets = st.lists(
    st.dictionaries(st.sampled_from(["name", "group", "max_vms", "max_percent"]), values),
    max_size=2,
)
policies = st.fixed_dictionaries(
    {}, optional={"version": st.just(1) | values, "rules": rules | values, "budgets": budgets}
)


def dump(document: Any) -> str:
    return yaml.safe_dump(document, allow_unicode=True, sort_keys=False)


@FUZZ
@given(text=policies.map(dump) | st.text(max_size=200))
@example(text="version: 1\nrules:\n  - {name: a, action: hold}\n  - {name: b, action: hold}\n")
def test_any_yaml_is_a_policy_or_a_policy_error(text: str) -> None:
    loads_or_refuses(text)


def bomb(levels: int) -> str:
    """The billion laughs: each level a list of nine aliases of the one before."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


HOSTILE = {
    "alias-bomb-top": bomb(10) + "version: 1\nrules: *a9\n",
    "alias-bomb-in-names": bomb(10).replace("a0: &a0", "x: &a0")
    + "version: 1\nrules:\n  - {name: n, match: {vm: {name: *a9}}, action: hold}\n",
    "alias-bomb-in-tags": bomb(10)
    + "version: 1\nrules:\n  - {name: n, match: {vm: {tags: {t: *a9}}}, action: hold}\n",
    "recursive-alias": "version: 1\nrules: &r [*r]\n",
    "deep-flow": "version: 1\nrules: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep-block": "version: 1\nrules:\n" + "".join("  " * i + "- \n" for i in range(1, 400)),
    "huge-integer": "version: 1\nbudgets:\n  - {name: b, group: fleet, max_vms: "
    + "9" * 5000
    + "}\nrules:\n  - {name: r, action: hold}\n",
    "huge-float": "version: 1\nbudgets:\n  - {name: b, group: fleet, max_percent: 1e400}\n"
    "rules:\n  - {name: r, action: hold}\n",
    "huge-version": "version: " + "1" * 5000 + "\nrules:\n  - {name: r, action: hold}\n",
    "huge-duration": "version: 1\nrules:\n  - name: r\n    action: {approve_when_ready: "
    "{deadline: 99999999999999999999h}}\n",
    "huge-duration-seconds": "version: 1\nrules:\n  - name: r\n    match: {duration_seconds: "
    "{at_least: " + "9" * 400 + "}}\n    action: approve\n",
    "bad-timezone": "version: 1\nrules:\n  - name: r\n    action: {approve_in_window: "
    "{timezone: ../../etc/passwd, windows: [{days: daily, start: '01:00', end: '02:00'}]}}\n",
    "nul-timezone": "version: 1\nrules:\n  - name: r\n    action: {approve_in_window: "
    "{timezone: \"a\\0b\", windows: [{days: daily, start: '01:00', end: '02:00'}]}}\n",
    "tab-indent": "version: 1\nrules:\n\t- {name: r, action: hold}\n",
    "two-documents": "version: 1\nrules: [{name: r, action: hold}]\n---\nversion: 1\n",
    "python-tag": "version: !!python/object/apply:os.system ['true']\nrules: []\n",
    "binary-tag": "version: !!binary aGVsbG8=\nrules: []\n",
    "set-tag": "version: 1\nrules: !!set {a, b}\n",
    "merge-key": "version: 1\nbase: &b {name: r}\nrules:\n  - {<<: *b, action: hold}\n",
    "nul-byte": "version: 1\x00\nrules: []\n",
    "bom-inside": "version: 1\n\ufeffrules: []\n",
    "surrogate": 'version: 1\nrules: [{name: "\\ud800", action: hold}]\n',
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_file_is_a_policy_error_quickly(text: str) -> None:
    loads_or_refuses(text)
