"""Approval policy files: YAML in, a validated `bridge.policy.model.Policy` out.

The format (EXAMPLE_POLICY_YAML below uses every part of it):

- `version: 1` (required).
- `budgets:` (optional list): `name`, `group` (fleet, scale_set, zone, fault_domain,
  update_domain, resource_group or tag:NAME) and exactly one of `max_vms` (>= 1) or
  `max_percent` (> 0, <= 100; rounded down, but at least 1 VM). Every budget applies to every
  approval, whichever rule made it.
- `rules:` (required, non-empty list, first match wins): `name`, `action`, and `match`
  (omitted: every event). `match` keys: `event_type` (Freeze, Reboot, Redeploy, Preempt,
  Terminate), `event_source` (User, Platform), `status` (Scheduled, Started): a value or a
  list, case-blind; `duration_seconds: {at_least: N, below: M}` (an event without
  DurationInSeconds never matches it); `vm:` with `tags` (a mapping; values compare
  exactly), `name` (a glob or a list), `scale_set`, `resource_group`, `location`, `zone` (a
  value or a list), which must hold for every VM the event affects.
- `action`: `approve`, `hold`, `{approve_when_ready: {deadline: 10m, on_deadline: hold}}`
  (on_deadline: approve or hold, default hold) or `{approve_in_window: {timezone: IANA name
  (default UTC), windows: [{days, start, end}, ...]}}`. Durations: `30s`, `10m`, `2h`, `1h30m`
  or seconds. `{ask: {target: NAME, deadline: 30m, on_deadline: hold}}` asks a person
  through the notification target NAME (`[[notify.targets]]`); deadline (optional: until
  NotBefore) counts from when the consumer first asked; on_deadline approve or hold (default).
  Days: Mon..Sun or full names, weekdays, weekend, daily. Times: "HH:MM"; an end
  at or before the start wraps past midnight and belongs to the day it opened.
- `rebalance:` (optional): `drain: true` drains the Kubernetes node of a Spot VM with a
  rebalance recommendation at once, a drain granted within the budgets; `notify: NAME` tells
  the notification target NAME of it, once. The recommendation is never approved
  (docs/policy.md#spot-rebalance-recommendations). Left out: nothing is done.

Errors name the file, line and field (`policy.yaml:14: rules[2].action.approve_when_ready.
deadline: expected a duration such as 10m or 90s, got 'soon'`; list indexes count from 0);
see `bridge.policy.yamlnodes`. A rule placed after one that matches every event is an error, since
it could never apply.

`python -m bridge.policy.file FILE` checks a file and prints one line per rule and budget
(exit 0), or the error (exit 2): run it in CI on the policy you deploy.
"""

from __future__ import annotations

import argparse
import re
import sys
import zoneinfo
from collections.abc import Sequence
from dataclasses import replace
from datetime import time, timedelta
from pathlib import Path
from typing import Literal

import yaml

from bridge.config import ConfigError
from bridge.policy.model import (
    DEFAULT_POLICY,
    GROUP_KINDS,
    Action,
    Budget,
    Match,
    Policy,
    Range,
    Rebalance,
    Rule,
    Window,
    group_kind,
)
from bridge.policy.yamlnodes import Names, YamlNode, suggest

EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
EVENT_SOURCES = ("User", "Platform")
STATUSES = ("Scheduled", "Started")
ACTIONS = ("approve", "approve_when_ready", "approve_in_window", "hold", "ask")
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
DAY_WORDS: dict[str, frozenset[int]] = {
    **{day: frozenset({i}) for i, day in enumerate(DAYS)},
    **{day[:3]: frozenset({i}) for i, day in enumerate(DAYS)},
    "weekdays": frozenset(range(5)),
    "weekend": frozenset({5, 6}),
    "daily": frozenset(range(7)),
}

_DURATION = re.compile(r"(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_SECONDS = re.compile(r"[0-9]+")
MAX_DAYS = timedelta.max.days
_CLOCK = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)")

# The policy the consumer runs when none is configured; tests hold it equal to
# `policy.DEFAULT_POLICY`, so the two cannot drift apart.
DEFAULT_POLICY_YAML = """\
# se-bridge default approval policy: the logic of Microsoft's Scheduled Events sample.
version: 1
rules:                          # first match wins
  - name: user-initiated        # someone asked for it in the portal: don't make them wait
    match: {event_source: User}
    action: approve
  - name: short-freeze          # a pause of under 9 seconds is not worth waiting for
    match:
      event_type: Freeze
      duration_seconds: {at_least: 0, below: 9}
    action: approve
  - name: everything-else       # the platform starts it at NotBefore
    action: hold
"""

# Every feature of the format once; the tests load it, so the documented example stays valid.
EXAMPLE_POLICY_YAML = """\
# se-bridge approval policy
version: 1
budgets:
  - name: one-web-vm-at-a-time
    group: scale_set            # fleet | scale_set | zone | fault_domain | update_domain
    max_vms: 1                  #   | resource_group | tag:NAME
  - name: db-quarter
    group: tag:tier
    max_percent: 25             # of each group, rounded down, but at least 1 VM
rules:                          # first match wins
  - name: user-initiated
    match: {event_source: User}
    action: approve
  - name: short-freeze
    match:
      event_type: Freeze        # a string or a list
      duration_seconds: {at_least: 0, below: 9}
    action: approve
  - name: primary-db            # a person decides; nobody in 30 minutes: NotBefore
    match: {vm: {tags: {role: primary}}}
    action: {ask: {target: dba-oncall, deadline: 30m, on_deadline: hold}}
  - name: db-after-drain
    match:
      event_type: [Reboot, Redeploy]
      vm: {tags: {tier: db}, name: "db-*"}
    action: {approve_when_ready: {deadline: 10m, on_deadline: hold}}
  - name: web-nights
    match: {vm: {scale_set: web}}
    action:
      approve_in_window:
        timezone: Europe/Istanbul
        windows:
          - {days: [Sat, Sun], start: "01:00", end: "05:00"}
          - {days: weekdays, start: "23:00", end: "02:00"}   # wraps past midnight
  - name: everything-else
    action: hold                # match omitted: matches every event
rebalance:                      # Spot rebalance recommendations: never approved
  drain: true                   # drain a node at once, within the budgets
  notify: ops                   # and tell the target ops, once
"""


# What agent.policy and consumer.policy (--policy) say for the built-in policy, with no file
# (`./default` is a file of that name).
DEFAULT_NAME = "default"


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the file, and the line and field."""


def load(path: Path) -> Policy:
    """The policy in the file at `path`; PolicyError when it cannot be read or used."""
    try:
        # utf-8-sig: editors on Windows save a byte-order mark that YAML would not expect.
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PolicyError(f"{path}: cannot read the policy file: {reason}") from None
    return loads(text, str(path))


def load_setting(setting: str, path: Path) -> Policy:
    """The policy file that `setting` (agent.policy, consumer.policy) names, read at start, or
    the built-in policy when it says `default`; ConfigError naming the setting, the file, the
    line and the field when it is bad."""
    if path == Path(DEFAULT_NAME):
        return DEFAULT_POLICY
    try:
        policy = load(path)
    except PolicyError as err:
        hint = (
            ""
            if path.exists()
            else (f"; the value {DEFAULT_NAME} (--policy {DEFAULT_NAME}) names the built-in policy")
        )
        raise ConfigError(f"{setting}: {err}{hint}") from err
    asking = next((r for r in policy.rules if r.action.kind == "ask"), None)
    if setting.startswith("agent.") and asking is not None:
        # An agent deciding alone (local mode) has nobody to ask and no page to answer on:
        # its ask would wait until NotBefore whatever on_deadline says.
        raise ConfigError(
            f"{setting}: {path}: rule {asking.name} asks a person (ask), which only the central "
            "consumer can do (consumer.policy); an agent's own policy has nobody to ask: use "
            "hold, or approve_when_ready with a prepare hook"
        )
    return policy


def loads(text: str, source: str = "<string>") -> Policy:
    """The policy in `text`; `source` names it in errors and in `Policy.source`."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is None:
            raise PolicyError(f"{source}:1: the file holds no policy; start with `version: 1`")
        return _policy(YamlNode(root, "", source, PolicyError))
    except yaml.MarkedYAMLError as exc:
        raise PolicyError(_syntax_error(exc, source)) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow, such as NUL
        line = text.count("\n", 0, max(0, exc.position)) + 1
        raise PolicyError(
            f"{source}:{line}: not readable as YAML: {exc.reason}, character {exc.character!r}"
        ) from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}:1: not readable as YAML: {exc}") from None
    except RecursionError:
        raise PolicyError(f"{source}:1: nested too deeply to be a policy") from None


def _syntax_error(exc: yaml.MarkedYAMLError, source: str) -> str:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else 1
    problem = exc.problem or exc.context or "malformed YAML"
    started = ""
    if exc.context and exc.context_mark is not None and exc.problem:
        started = f" ({exc.context} on line {exc.context_mark.line + 1})"
    return f"{source}:{line}: YAML syntax error: {problem}{started}"


# The shape being parsed (EXAMPLE_POLICY_YAML has every feature):
#
#   version: 1
#   budgets:
#     - {name: one-web-vm-at-a-time, group: scale_set, max_vms: 1}
#   rules:
#     - name: db-after-drain
#       match: {event_type: [Reboot, Redeploy], vm: {tags: {tier: db}}}
#       action: {approve_when_ready: {deadline: 10m, on_deadline: hold}}
#     - {name: everything-else, action: hold}
def _policy(root: YamlNode) -> Policy:
    keys = ("version", "budgets", "rules", "rebalance")
    fields = root.mapping(keys, required=("version", "rules"))
    version = fields["version"].integer()
    if version != 1:
        fields["version"].fail(f"this se-bridge reads policy version 1, got {version}")
    budgets = _budgets(fields["budgets"]) if "budgets" in fields else ()
    rebalance = _rebalance(fields["rebalance"]) if "rebalance" in fields else None
    rules = _rules(fields["rules"])
    return Policy(rules=rules, budgets=budgets, source=root.source, rebalance=rebalance)


def _rebalance(node: YamlNode) -> Rebalance:
    fields = node.mapping(("drain", "notify"))
    if not fields:
        node.fail("empty: give drain, notify or both, or leave rebalance out")
    target = (
        fields["notify"].text("a notification target's name").strip()
        if "notify" in fields
        else None
    )
    if target == "":
        fields["notify"].fail("empty: name a notification target of [[notify.targets]]")
    drain = _switch(fields["drain"]) if "drain" in fields else False
    return Rebalance(drain=drain, notify=target)


def _switch(node: YamlNode) -> bool:
    word = node.text("true or false").strip().lower()
    if word not in ("true", "false"):
        node.fail(f"expected true or false, got {word!r}")
    return word == "true"


def _rules(node: YamlNode) -> tuple[Rule, ...]:
    names = Names("rule")
    rules: list[Rule] = []
    catch_all: Rule | None = None
    for item in node.items():
        rule = _rule(item, names)
        if catch_all is not None:
            item.fail(f"unreachable: rule {catch_all.name!r} before it matches every event")
        if rule.match == Match():
            catch_all = rule
        rules.append(rule)
    return tuple(rules)


def _rule(node: YamlNode, names: Names) -> Rule:
    fields = node.mapping(("name", "match", "action"), required=("name", "action"))
    name = names.claim(fields["name"])
    match = _match(fields["match"]) if "match" in fields else Match()
    return Rule(name, match, _action(fields["action"]))


def _match(node: YamlNode) -> Match:
    fields = node.mapping(("event_type", "event_source", "status", "duration_seconds", "vm"))
    vm = _vm(fields["vm"]) if "vm" in fields else Match()
    return replace(
        vm,
        event_types=_choices(fields.get("event_type"), EVENT_TYPES),
        event_sources=_choices(fields.get("event_source"), EVENT_SOURCES),
        statuses=_choices(fields.get("status"), STATUSES),
        duration=_range(fields["duration_seconds"]) if "duration_seconds" in fields else None,
    )


def _choices(node: YamlNode | None, allowed: Sequence[str]) -> frozenset[str]:
    if node is None:
        return frozenset()
    out = set()
    for item in node.one_or_more():
        word = item.text(f"one of {', '.join(allowed)}")
        if word.lower() not in {a.lower() for a in allowed}:
            hint = suggest(word, allowed)
            item.fail(f"expected one of {', '.join(allowed)}, got {word!r}{hint}")
        out.add(word.lower())
    return frozenset(out)


def _range(node: YamlNode) -> Range:
    fields = node.mapping(("at_least", "below"))
    if not fields:
        node.fail("give at_least, below or both")
    low = fields["at_least"].integer() if "at_least" in fields else None
    high = fields["below"].integer() if "below" in fields else None
    if low is not None and high is not None and high <= low:
        fields["below"].fail(f"must be above at_least ({low}), got {high}: nothing would match")
    return Range(at_least=low, below=high)


_VM_KEYS = ("tags", "name", "scale_set", "resource_group", "location", "zone")


def _vm(node: YamlNode) -> Match:
    """VM conditions; every VM the event affects must meet them."""
    fields = node.mapping(_VM_KEYS)
    if not fields:
        node.fail(f"empty: give one of {', '.join(_VM_KEYS)}, or leave vm out")
    names = fields.get("name")
    return Match(
        tags=_tags(fields["tags"]) if "tags" in fields else (),
        names=tuple(n.text("a name or glob") for n in names.one_or_more()) if names else (),
        scale_sets=_words(fields.get("scale_set")),
        resource_groups=_words(fields.get("resource_group")),
        # IMDS reports `westeurope`; people write the display name `West Europe`.
        locations=frozenset(w.replace(" ", "") for w in _words(fields.get("location"))),
        zones=_words(fields.get("zone")),
    )


def _words(node: YamlNode | None) -> frozenset[str]:
    if node is None:
        return frozenset()
    return frozenset(item.text().strip().lower() for item in node.one_or_more())


def _tags(node: YamlNode) -> tuple[tuple[str, str], ...]:
    pairs = node.pairs()
    if not pairs:
        node.fail("empty: give at least one tag, such as {tier: db}")
    # Tag values compare exactly, as Azure stores them; only the names are case-blind.
    return tuple((key, value.text("a tag value")) for key, value in pairs)


def _action(node: YamlNode) -> Action:
    if not isinstance(node.node, yaml.MappingNode):
        return _plain_action(node)
    fields = node.mapping(ACTIONS)
    if len(fields) != 1:
        node.fail(f"expected exactly one action, got {len(fields)}")
    ((kind, body),) = fields.items()
    if kind in ("approve", "hold"):
        body.fail(f"{kind} takes no settings: write `action: {kind}`")
    if kind == "ask":
        return _ask(body)
    return _when_ready(body) if kind == "approve_when_ready" else _in_window(body)


def _plain_action(node: YamlNode) -> Action:
    word = node.text("an action").strip().lower()
    if word in ("approve_when_ready", "approve_in_window", "ask"):
        node.fail(f"{word} needs settings, such as {{{word}: {{...}}}}")
    if word not in ("approve", "hold"):
        hint = suggest(word, ACTIONS)
        node.fail(f"unknown action {word!r}{hint}; expected one of {', '.join(ACTIONS)}")
    return Action("approve") if word == "approve" else Action("hold")


def _when_ready(node: YamlNode) -> Action:
    fields = node.mapping(("deadline", "on_deadline"), required=("deadline",))
    deadline = _duration(fields["deadline"])
    return Action("approve_when_ready", deadline=deadline, on_deadline=_on_deadline(fields))


def _on_deadline(fields: dict[str, YamlNode]) -> Literal["approve", "hold"]:
    if "on_deadline" not in fields:
        return "hold"
    word = fields["on_deadline"].text("approve or hold").strip().lower()
    if word not in ("approve", "hold"):
        fields["on_deadline"].fail(f"expected approve or hold, got {word!r}")
    return "approve" if word == "approve" else "hold"


def _ask(node: YamlNode) -> Action:
    fields = node.mapping(("target", "deadline", "on_deadline"), required=("target",))
    target = fields["target"].text("a notification target's name").strip()
    if not target:
        fields["target"].fail("empty: name a notification target of [[notify.targets]]")
    deadline = _duration(fields["deadline"]) if "deadline" in fields else None
    return Action("ask", deadline=deadline, on_deadline=_on_deadline(fields), target=target)


def _duration(node: YamlNode) -> timedelta:
    expected = "a duration such as 10m or 90s"
    text = node.text(expected).strip()
    found = _DURATION.fullmatch(text)
    try:
        if _SECONDS.fullmatch(text):
            seconds = int(text)
        elif found is not None and any(found.groups()):
            hours, minutes, secs = (int(part or 0) for part in found.groups())
            seconds = hours * 3600 + minutes * 60 + secs
        else:
            node.fail(f"expected {expected}, got {text!r}")
        if seconds <= 0:
            node.fail(f"must be longer than 0s, got {text!r}")
        return timedelta(seconds=seconds)
    except (ValueError, OverflowError) as err:  # PolicyError is a ValueError: let it through
        if isinstance(err, PolicyError):
            raise
        node.fail(f"expected {expected} of at most {MAX_DAYS} days, got {text[:40]!r}")


def _in_window(node: YamlNode) -> Action:
    fields = node.mapping(("timezone", "windows"), required=("windows",))
    timezone = _timezone(fields["timezone"]) if "timezone" in fields else "UTC"
    windows = tuple(_window(item) for item in fields["windows"].items())
    return Action("approve_in_window", windows=windows, timezone=timezone)


def _timezone(node: YamlNode) -> str:
    name = node.text("a time zone such as Europe/Istanbul").strip()
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        hint = suggest(name, sorted(zoneinfo.available_timezones()))
        node.fail(f"unknown time zone {name!r}{hint}; use an IANA name such as Europe/Istanbul")
    return name


def _window(node: YamlNode) -> Window:
    fields = node.mapping(("days", "start", "end"), required=("days", "start", "end"))
    return Window(_days(fields["days"]), _clock(fields["start"]), _clock(fields["end"]))


def _days(node: YamlNode) -> frozenset[int]:
    days: set[int] = set()
    for item in node.one_or_more():
        word = item.text("a day such as Mon or weekdays").strip()
        found = DAY_WORDS.get(word.lower())
        if found is None:
            hint = suggest(word, list(DAY_WORDS))
            item.fail(f"expected Mon..Sun, weekdays, weekend or daily, got {word!r}{hint}")
        days |= found
    return frozenset(days)


def _clock(node: YamlNode) -> time:
    text = node.text("a time such as 23:00").strip()
    found = _CLOCK.fullmatch(text)
    if found is None:
        node.fail(f"expected a time such as 01:00 or 23:30 (HH:MM, 24-hour), got {text!r}")
    return time(int(found[1]), int(found[2]))


def _budgets(node: YamlNode) -> tuple[Budget, ...]:
    names = Names("budget")
    return tuple(_budget(item, names) for item in node.items(allow_empty=True))


def _budget(node: YamlNode, names: Names) -> Budget:
    keys = ("name", "group", "max_vms", "max_percent")
    fields = node.mapping(keys, required=("name", "group"))
    name = names.claim(fields["name"])
    group = _group(fields["group"])
    if "max_vms" in fields and "max_percent" in fields:
        fields["max_percent"].fail("give max_vms or max_percent, not both")
    if "max_vms" in fields:
        return Budget(name, group, max_vms=fields["max_vms"].integer(least=1))
    if "max_percent" not in fields:
        node.fail("missing max_vms or max_percent (one is required)")
    percent = fields["max_percent"].number()
    if not 0 < percent <= 100:  # also false for nan
        fields["max_percent"].fail(f"must be above 0 and at most 100, got {percent:g}")
    return Budget(name, group, max_percent=percent)


def _group(node: YamlNode) -> str:
    text = node.text("a group such as scale_set or tag:tier").strip()
    kind = group_kind(text)
    if kind is not None:
        return kind
    if text.lower().startswith("tag:"):
        node.fail("tag: needs a tag name, such as tag:tier")
    choices = [*GROUP_KINDS, "tag:NAME"]
    return node.fail(f"expected one of {', '.join(choices)}, got {text!r}{suggest(text, choices)}")


def summary(policy: Policy) -> list[str]:
    """One line per rule and per budget, for `python -m bridge.policy.file` and logs."""
    counts = f"{counted(len(policy.rules), 'rule')}, {counted(len(policy.budgets), 'budget')}"
    lines = [f"{policy.source}: valid policy, {counts} (first matching rule wins)"]
    lines += [f"  rule {rule.name}: {describe_rule(rule)}" for rule in policy.rules]
    lines += [f"  budget {budget.name}: {describe_budget(budget)}" for budget in policy.budgets]
    if policy.rebalance is not None:
        drain = "drain the node at once" if policy.rebalance.drain else "drain nothing"
        told = f", tell {policy.rebalance.notify}" if policy.rebalance.notify else ""
        lines.append(
            f"  rebalance: {drain}{told} (a Spot rebalance recommendation is never approved)"
        )
    return lines


def counted(number: int, noun: str) -> str:
    """`1 rule`, `2 rules`."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def describe_rule(rule: Rule) -> str:
    return f"{describe_match(rule.match)} -> {describe_action(rule.action)}"


def describe_match(match: Match) -> str:
    sets = (
        ("event_type", match.event_types),
        ("event_source", match.event_sources),
        ("status", match.statuses),
        ("vm scale_set", match.scale_sets),
        ("vm resource_group", match.resource_groups),
        ("vm location", match.locations),
        ("vm zone", match.zones),
    )
    parts = [f"{label} {'|'.join(sorted(values))}" for label, values in sets if values]
    if match.duration is not None:
        parts.append(_describe_range(match.duration))
    if match.tags:
        parts.append("vm tags " + ",".join(f"{key}={value}" for key, value in match.tags))
    if match.names:
        parts.append("vm name " + "|".join(match.names))
    return ", ".join(parts) or "every event"


def describe_action(action: Action) -> str:
    if action.kind == "approve_when_ready":
        deadline = _span(action.deadline or timedelta(0))
        return f"approve when ready (deadline {deadline}, then {action.on_deadline})"
    if action.kind == "ask":
        until = f"deadline {_span(action.deadline)}" if action.deadline else "until NotBefore"
        return f"ask {action.target} ({until}, then {action.on_deadline})"
    if action.kind == "approve_in_window":
        spans = "; ".join(
            f"{_describe_days(w.days)} {w.start:%H:%M}-{w.end:%H:%M}" for w in action.windows
        )
        return f"approve in window ({action.timezone}: {spans})"
    return action.kind


def describe_budget(budget: Budget) -> str:
    if budget.max_vms is not None:
        most = counted(budget.max_vms, "VM")
    else:
        most = f"{budget.max_percent:g}% (at least 1 VM)"
    return f"at most {most} impacted per {budget.group}"


def _describe_range(bounds: Range) -> str:
    low = "" if bounds.at_least is None else f"{bounds.at_least} <= "
    high = "" if bounds.below is None else f" < {bounds.below}"
    return f"{low}duration{high}"


def _describe_days(days: frozenset[int]) -> str:
    for word in ("daily", "weekdays", "weekend"):
        if days == DAY_WORDS[word]:
            return word
    return ",".join(DAYS[d][:3].title() for d in sorted(days))


def _span(delta: timedelta) -> str:
    hours, rest = divmod(int(delta.total_seconds()), 3600)
    minutes, seconds = divmod(rest, 60)
    parts = ((hours, "h"), (minutes, "m"), (seconds, "s"))
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bridge.policy.file",
        description="Check an se-bridge approval policy file and summarise its rules.",
    )
    parser.add_argument("file", type=Path, help="the policy file (YAML)")
    args = parser.parse_args(argv)
    try:
        policy = load(args.file)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    print("\n".join(summary(policy)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
