"""Walking a composed YAML node tree with errors that name the line and the field.

`yaml.safe_load` forgets where each value came from, so a validator built on it can only say
*what* is wrong. `YamlNode` keeps the node (and its `start_mark`) with the path that names it
(`rules[2].action.deadline`), so every check can fail as
`policy.yaml:14: rules[2].action.deadline: expected a duration such as 10m or 90s, got 'soon'`.

Scalars are read as the text written (`text()`), not as YAML 1.1 types: `zone: 1`,
`start: 23:00` (a base-60 integer to YAML 1.1) and `tier: yes` (a boolean) stay what the user
typed. Numbers are numbers only where a number is asked for (`integer()`, `number()`).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import yaml
from yaml.constructor import SafeConstructor

_NULL = "tag:yaml.org,2002:null"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"


def suggest(word: str, choices: Sequence[str]) -> str:
    """` (did you mean 'x'?)` when `word` is close to one of `choices` in any case, else ''."""
    by_lower = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


@dataclass(frozen=True)
class YamlNode:
    """A YAML node with the path that names it; `fail` raises `error` with line and path."""

    node: yaml.Node
    path: str
    source: str
    error: type[Exception] = ValueError

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1

    def fail(self, message: str) -> NoReturn:
        raise self.error(f"{self.source}:{self.line}: {self.path or '(top level)'}: {message}")

    def at(self, node: yaml.Node, step: str) -> YamlNode:
        dot = "" if not self.path or step.startswith("[") else "."
        return YamlNode(node, f"{self.path}{dot}{step}", self.source, self.error)

    def describe(self) -> str:
        node = self.node
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if not isinstance(node, yaml.ScalarNode):
            return "a list"
        if node.tag == _NULL and node.style is None:
            return "nothing"
        quoted = node.style is not None and node.tag not in (_INT, _FLOAT)
        return f"the string {node.value!r}" if quoted else repr(node.value)

    def pairs(self, allowed: Sequence[str] | None = None) -> list[tuple[str, YamlNode]]:
        """(key, value) in file order. A key repeated in any case is an error rather than a
        silent overwrite, and so is a key not in `allowed` (when given)."""
        if not isinstance(self.node, yaml.MappingNode):
            self.fail(f"expected a mapping, got {self.describe()}")
        seen: dict[str, YamlNode] = {}
        out = []
        for key_node, value_node in self.node.value:
            key = self._key(key_node)
            here = self.at(key_node, key)
            if allowed is not None and key not in allowed:
                expected = f"expected one of {', '.join(allowed)}"
                here.fail(f"unknown key{suggest(key, allowed)}; {expected}")
            first = seen.get(key.lower())
            if first is not None:
                here.fail(f"duplicate key (first on line {first.line})")
            seen[key.lower()] = here
            out.append((key, self.at(value_node, key)))
        return out

    def _key(self, node: yaml.Node) -> str:
        where = YamlNode(node, self.path, self.source, self.error)
        if node.tag == _MERGE:
            # compose() leaves merges unapplied; resolving them here would hide which line
            # a merged value came from, and they are rare in hand-written policies.
            where.fail("merge keys (<<) are not supported")
        if not isinstance(node, yaml.ScalarNode) or not node.value:
            where.fail("keys must be plain names")
        return str(node.value)

    def mapping(self, allowed: Sequence[str], required: Sequence[str] = ()) -> dict[str, YamlNode]:
        """The mapping's values by key; unknown keys and missing required keys are errors."""
        if not isinstance(self.node, yaml.MappingNode):
            self.fail(f"expected a mapping with keys {', '.join(allowed)}; got {self.describe()}")
        fields = dict(self.pairs(allowed))
        for key in required:
            if key not in fields:
                self.at(self.node, key).fail("missing (required)")
        return fields

    def items(self, *, allow_empty: bool = False) -> list[YamlNode]:
        if not isinstance(self.node, yaml.SequenceNode):
            self.fail(f"expected a list, got {self.describe()}")
        if not self.node.value and not allow_empty:
            self.fail("empty list: give at least one, or leave the key out")
        return [self.at(node, f"[{i}]") for i, node in enumerate(self.node.value)]

    def one_or_more(self) -> list[YamlNode]:
        """A value or a list of values: `event_type: Freeze` and `[Reboot, Redeploy]` both read."""
        return self.items() if isinstance(self.node, yaml.SequenceNode) else [self]

    def text(self, expected: str = "a string") -> str:
        node = self.node
        if not isinstance(node, yaml.ScalarNode) or (node.tag == _NULL and node.style is None):
            self.fail(f"expected {expected}, got {self.describe()}")
        if not node.value.strip():
            self.fail(f"expected {expected}, got an empty string")
        return str(node.value)

    def integer(self, least: int | None = None) -> int:
        node = self.node
        if not isinstance(node, yaml.ScalarNode) or node.tag != _INT or node.style is not None:
            self.fail(f"expected a whole number, got {self.describe()}")
        try:
            value = SafeConstructor().construct_yaml_int(node)
        except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
            self.fail(f"expected a whole number of reasonable size, not {len(node.value)} digits")
        if least is not None and value < least:
            self.fail(f"must be at least {least}, got {value}")
        return value

    def number(self) -> float:
        node = self.node
        if not isinstance(node, yaml.ScalarNode) or node.tag not in (_INT, _FLOAT) or node.style:
            self.fail(f"expected a number, got {self.describe()}")
        try:
            if node.tag == _INT:
                return float(SafeConstructor().construct_yaml_int(node))
            return float(SafeConstructor().construct_yaml_float(node))
        except (ValueError, OverflowError):  # too many digits for int(), or for a float
            self.fail(f"expected a number of reasonable size, got {len(node.value)} characters")


class Names:
    """Names already given in one list, so that a repeat (in any case) can point at the first."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seen: dict[str, YamlNode] = {}

    def claim(self, node: YamlNode) -> str:
        name = node.text().strip()
        first = self.seen.get(name.lower())
        if first is not None:
            where = f"first at {first.path}, line {first.line}"
            node.fail(f"duplicate {self.what} name {name!r} ({where})")
        self.seen[name.lower()] = node
        return name
