"""Where the KQL in .bicep files comes from: loaded from a file, or written inline.

A Bicep property that holds KQL (`query:` of a scheduled query rule or workbook item,
`transformKql:` of a data collection rule, `serializedData:` of a workbook) should take it
from a file with loadTextContent/loadJsonContent, so the file is what the tests check. Any
value written inline as a string literal is extracted and checked too; a value we cannot
trace at all is reported, never silently skipped.

A sample of what this reads (infra/modules/alerts.bicep): line 1 of a parameterised query
is replaced, which still counts as loaded from the file.

    var heartbeatText = loadTextContent('../kql/alerts/heartbeat-missing.kql')
    var heartbeatQuery = 'let MissingFor = ${heartbeatMissingMinutes}m;\n${join(skip(split(...'
    var rules = [ { name: 'heartbeat-missing', query: heartbeatQuery } ... ]
    ... criteria: { allOf: [ { query: rule.query, timeAggregation: 'Count' } ] }
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

KQL_PROPERTIES = ("query", "transformKql", "serializedData")
_PROPERTY = re.compile(r"(?<![\w.])(" + "|".join(KQL_PROPERTIES) + r")\s*:\s*")
_LOAD = re.compile(r"load(?:Text|Json)Content\(\s*'([^']+)'")
_WORD = re.compile(r"(?<![\w.'])[A-Za-z_]\w*")
_VARIABLE = re.compile(r"^\s*var\s+(\w+)\s*=\s*", re.MULTILINE)
_MEMBER = re.compile(r"(?<![\w.])(\w+)\s*:\s*")
_MEMBER_ACCESS = re.compile(r"[A-Za-z_]\w*(?:\[[^\]]*\])?\.(\w+)")


@dataclass(frozen=True)
class KqlValue:
    """One KQL-holding property: where it is and how its value is made."""

    file: str
    line: int
    prop: str
    loads: tuple[str, ...]  # files it loads, relative to the repository root
    inline: str | None  # the text of a string literal written in place
    traced: bool  # False when the value is neither loaded nor a literal


def values(path: Path, root: Path) -> list[KqlValue]:
    """Every KQL-holding property of one .bicep file."""
    text = path.read_text(encoding="utf-8")
    variables = {m.group(1): _expression(text, m.end()) for m in _VARIABLE.finditer(text)}
    loaded_members = {
        m.group(1)
        for m in _MEMBER.finditer(text)
        if _LOAD.search(_expand(_expression(text, m.end()), variables))
    }
    name = path.relative_to(root).as_posix()
    found = []
    for match in _PROPERTY.finditer(text):
        expr = _expression(text, match.end())
        expanded = _expand(expr, variables)
        loads = tuple(_resolve(path, root, rel) for rel in _LOAD.findall(expanded))
        inline = None if loads else _literal(variables.get(expr, expr))
        # `query: rule.query` in a loop: traced when that member is loaded where it is set.
        member = _MEMBER_ACCESS.fullmatch(expr)
        indirect = member is not None and member.group(1) in loaded_members
        line = text.count("\n", 0, match.start()) + 1
        traced = bool(loads) or inline is not None or indirect
        found.append(KqlValue(name, line, match.group(1), loads, inline, traced))
    return found


def _expand(expr: str, variables: dict[str, str], seen: frozenset[str] = frozenset()) -> str:
    """The expression with the variables it mentions (and theirs, in turn) appended."""
    parts = [expr]
    for word in set(_WORD.findall(expr)) - seen:
        if word in variables:
            parts.append(_expand(variables[word], variables, seen | {word}))
    return "\n".join(parts)


def _resolve(path: Path, root: Path, relative: str) -> str:
    return (path.parent / relative).resolve().relative_to(root.resolve()).as_posix()


def inline_kql(path: Path, root: Path) -> list[tuple[str, str]]:
    """(name, text) of every KQL query written inline as a string literal."""
    return [
        (f"{v.file}:{v.line}", v.inline)
        for v in values(path, root)
        if v.inline is not None and v.prop != "serializedData"
    ]


def _expression(text: str, start: int) -> str:
    """The expression starting at `start`: to the end of line, or of its brackets or string."""
    if text.startswith("'''", start):
        end = text.index("'''", start + 3)
        return text[start : end + 3]
    depth, i, quoted = 0, start, False
    while i < len(text):
        ch = text[i]
        if quoted:
            i += 2 if ch == "\\" else 1
            quoted = ch != "'"
            continue
        if ch == "'":
            quoted = True
        elif ch in "([{":
            depth += 1
        elif ch in ")]}" and depth > 0:
            depth -= 1
        elif ch in ")]},\n" and depth == 0:
            break
        i += 1
    return text[start:i].strip()


def _literal(expr: str) -> str | None:
    """The value of a Bicep string literal without interpolation; None for anything else."""
    if expr.startswith("'''") and expr.endswith("'''") and len(expr) >= 6:
        return expr[3:-3].removeprefix("\n")
    if len(expr) >= 2 and expr[0] == expr[-1] == "'" and "${" not in expr:
        body = expr[1:-1]
        escapes = {"\\'": "'", "\\\\": "\\", "\\n": "\n", "\\r": "\r", "\\t": "\t", "\\$": "$"}
        return re.sub(r"\\.", lambda m: escapes.get(m.group(0), m.group(0)), body)
    return None
