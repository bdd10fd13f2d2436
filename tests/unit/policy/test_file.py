"""Policy files: valid YAML becomes the expected model; every mistake names its line and field."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import textwrap
from datetime import time, timedelta
from pathlib import Path

import pytest

from bridge.config import ConfigError
from bridge.policy import file as policyfile
from bridge.policy import model as policy
from bridge.policy.file import PolicyError, load, loads
from bridge.policy.model import Action, Budget, Match, Policy, Range, Rebalance, Rule, Window

HOLD_ALL = Rule("everything-else", Match(), Action("hold"))


def doc(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def test_default_policy_yaml_is_the_default_policy() -> None:
    loaded = loads(policyfile.DEFAULT_POLICY_YAML)
    assert dataclasses.replace(loaded, source=policy.DEFAULT_POLICY.source) == policy.DEFAULT_POLICY


def test_example_policy_loads_to_the_model_it_documents() -> None:
    nights = (
        Window(frozenset({5, 6}), time(1, 0), time(5, 0)),
        Window(frozenset(range(5)), time(23, 0), time(2, 0)),
    )
    expected = Policy(
        rules=(
            Rule("user-initiated", Match(event_sources=frozenset({"user"})), Action("approve")),
            Rule(
                "short-freeze",
                Match(event_types=frozenset({"freeze"}), duration=Range(0, 9)),
                Action("approve"),
            ),
            Rule(
                "primary-db",
                Match(tags=(("role", "primary"),)),
                Action("ask", deadline=timedelta(minutes=30), target="dba-oncall"),
            ),
            Rule(
                "db-after-drain",
                Match(
                    event_types=frozenset({"reboot", "redeploy"}),
                    tags=(("tier", "db"),),
                    names=("db-*",),
                ),
                Action("approve_when_ready", deadline=timedelta(minutes=10), on_deadline="hold"),
            ),
            Rule(
                "web-nights",
                Match(scale_sets=frozenset({"web"})),
                Action("approve_in_window", windows=nights, timezone="Europe/Istanbul"),
            ),
            HOLD_ALL,
        ),
        budgets=(
            Budget("one-web-vm-at-a-time", "scale_set", max_vms=1),
            Budget("db-quarter", "tag:tier", max_percent=25.0),
        ),
        source="example.yaml",
        rebalance=Rebalance(drain=True, notify="ops"),
    )
    assert loads(policyfile.EXAMPLE_POLICY_YAML, "example.yaml") == expected


def rule_of(match: str = "", action: str = "hold") -> Rule:
    """The one rule of a policy whose rule has `match` (YAML flow) and `action`."""
    body = f"version: 1\nrules:\n  - name: r\n    action: {action}\n"
    if match:
        body += f"    match: {match}\n"
    (rule,) = loads(body).rules
    return rule


@pytest.mark.parametrize(
    ("match", "expected"),
    [
        ("{}", Match()),
        ("{event_type: FREEZE}", Match(event_types=frozenset({"freeze"}))),
        ("{event_source: [user, Platform]}", Match(event_sources=frozenset({"user", "platform"}))),
        ("{status: Scheduled}", Match(statuses=frozenset({"scheduled"}))),
        ("{duration_seconds: {below: 0}}", Match(duration=Range(below=0))),
        ("{duration_seconds: {at_least: -1}}", Match(duration=Range(at_least=-1))),
        # YAML 1.1 would read these as an int and a boolean; the file means the text.
        ("{vm: {zone: 1}}", Match(zones=frozenset({"1"}))),
        (
            "{vm: {tags: {managed: yes, Tier: DB}}}",
            Match(tags=(("managed", "yes"), ("Tier", "DB"))),
        ),
        ("{vm: {location: West Europe}}", Match(locations=frozenset({"westeurope"}))),
        ("{vm: {scale_set: [Web, api]}}", Match(scale_sets=frozenset({"web", "api"}))),
        ("{vm: {resource_group: RG-1}}", Match(resource_groups=frozenset({"rg-1"}))),
        ('{vm: {name: [db-*, "cache?"]}}', Match(names=("db-*", "cache?"))),
    ],
)
def test_match_conditions(match: str, expected: Match) -> None:
    assert rule_of(match).match == expected


def window_action(window: str, timezone: str = "") -> Action:
    zone = f"timezone: {timezone}, " if timezone else ""
    return rule_of(action=f"{{approve_in_window: {{{zone}windows: [{window}]}}}}").action


@pytest.mark.parametrize(
    ("window", "days", "start", "end"),
    [
        ("{days: daily, start: '00:00', end: '00:00'}", range(7), time(0), time(0)),
        # Unquoted 23:00 is the base-60 integer 1380 to YAML 1.1; it must stay a time.
        ("{days: weekdays, start: 23:00, end: 2:30}", range(5), time(23), time(2, 30)),
        ("{days: weekend, start: '01:00', end: '05:00'}", {5, 6}, time(1), time(5)),
        ("{days: [Mon, tuesday, SUN], start: '09:15', end: '09:45'}", {0, 1, 6}, time(9, 15),
         time(9, 45)),
        ("{days: [weekend, Fri], start: '12:00', end: '13:00'}", {4, 5, 6}, time(12), time(13)),
    ],
)  # fmt: skip
def test_windows(window: str, days: set[int], start: time, end: time) -> None:
    action = window_action(window)
    assert action == Action(
        "approve_in_window", windows=(Window(frozenset(days), start, end),), timezone="UTC"
    )


def test_window_time_zone_is_kept() -> None:
    window = "{days: daily, start: '01:00', end: '02:00'}"
    assert window_action(window, "America/New_York").timezone == "America/New_York"


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("approve", Action("approve")),
        ("HOLD", Action("hold")),
        (
            "{approve_when_ready: {deadline: 90}}",
            Action("approve_when_ready", timedelta(seconds=90)),
        ),
        (
            "{approve_when_ready: {deadline: 1h30m, on_deadline: approve}}",
            Action("approve_when_ready", timedelta(hours=1, minutes=30), "approve"),
        ),
        (
            "{approve_when_ready: {deadline: 45s}}",
            Action("approve_when_ready", timedelta(seconds=45)),
        ),
        ("{approve_when_ready: {deadline: 2h}}", Action("approve_when_ready", timedelta(hours=2))),
        ("{ask: {target: dba}}", Action("ask", target="dba")),
        (
            "{ask: {target: ops, deadline: 15m, on_deadline: approve}}",
            Action("ask", timedelta(minutes=15), "approve", target="ops"),
        ),
    ],
)
def test_actions(action: str, expected: Action) -> None:
    assert rule_of(action=action).action == expected


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        ("{name: b, group: Zone, max_vms: 2}", Budget("b", "zone", max_vms=2)),
        (
            "{name: b, group: tag:Tier, max_percent: 12.5}",
            Budget("b", "tag:Tier", max_percent=12.5),
        ),
        ("{name: b, group: fleet, max_percent: 100}", Budget("b", "fleet", max_percent=100.0)),
        ("{name: b, group: fault_domain, max_vms: 1}", Budget("b", "fault_domain", max_vms=1)),
        ("{name: b, group: update_domain, max_vms: 3}", Budget("b", "update_domain", max_vms=3)),
        ("{name: b, group: resource_group, max_vms: 1}", Budget("b", "resource_group", max_vms=1)),
        ("{name: b, group: node_pool, max_vms: 1}", Budget("b", "node_pool", max_vms=1)),
    ],
)
def test_budgets(budget: str, expected: Budget) -> None:
    text = f"version: 1\nbudgets: [{budget}]\nrules: [{{name: r, action: hold}}]\n"
    assert loads(text).budgets == (expected,)


def test_an_empty_budget_list_and_aliases_are_fine() -> None:
    text = doc("""
        version: 1
        budgets: []
        rules:
          - name: a
            match: {event_type: Reboot}
            action:
              approve_in_window:
                windows: &nights [{days: daily, start: '01:00', end: '02:00'}]
          - name: b
            match: {event_type: Redeploy}
            action: {approve_in_window: {windows: *nights}}
        """)  # fmt: skip
    loaded = loads(text, "p.yaml")
    assert loaded.budgets == ()
    assert loaded.rules[0].action.windows == loaded.rules[1].action.windows
    assert loaded.source == "p.yaml"


BAD = [
    ("empty file", "", 1, "", "holds no policy"),
    ("top level is a list", "- version: 1\n", 1, "(top level)", "expected a mapping"),
    ("unknown key, no suggestion", "version: 1\ncolour: red\n", 2, "colour", "unknown key;"),
    ("typo with suggestion", "versoin: 1\n", 1, "versoin", "unknown key (did you mean 'version'?)"),
    ("missing version", "rules: [{name: a, action: hold}]\n", 1, "version", "missing"),
    ("future version", "version: 2\nrules: [{name: a, action: hold}]\n", 1, "version",
     "reads policy version 1, got 2"),
    ("version as text", "version: '1'\nrules: [{name: a, action: hold}]\n", 1, "version",
     "expected a whole number, got the string"),
    ("missing rules", "version: 1\n", 1, "rules", "missing (required)"),
    ("empty rules", "version: 1\nrules: []\n", 2, "rules", "empty list"),
    ("rules not a list", "version: 1\nrules: {name: a}\n", 2, "rules",
     "expected a list, got a mapping"),
    ("duplicate key", "version: 1\nrules: []\nversion: 1\n", 3, "version",
     "duplicate key (first on line 1)"),
    ("YAML syntax", "version: 1\nrules:\n  - name: [a\n  - name: b\n", 4, "", "YAML syntax error"),
    ("tab indent", "version: 1\nrules:\n\t- name: a\n", 3, "", "YAML syntax error"),
    ("merge key", "version: 1\nrules:\n  - <<: {name: a}\n    action: hold\n", 3, "rules[0]",
     "merge keys"),
]  # fmt: skip

RULES = "version: 1\nrules:\n  - name: a\n"  # a rule begins on line 3; its fields from line 4
BAD += [
    ("typo'd rule key", RULES + "    acton: approve\n", 4, "rules[0].acton",
     "did you mean 'action'?"),
    ("missing action", RULES + "    match: {}\n", 3, "rules[0].action", "missing (required)"),
    ("null action", RULES + "    action:\n", 4, "rules[0].action", "got nothing"),
    ("unknown action", RULES + "    action: aprove\n", 4, "rules[0].action",
     "unknown action 'aprove' (did you mean 'approve'?)"),
    ("action needing settings", RULES + "    action: approve_when_ready\n", 4, "rules[0].action",
     "needs settings"),
    ("two actions",
     RULES + "    action: {approve_when_ready: {deadline: 1m}, approve_in_window: {}}\n",
     4, "rules[0].action", "exactly one action, got 2"),
    ("approve with settings", RULES + "    action: {approve: {}}\n", 4, "rules[0].action.approve",
     "takes no settings"),
    ("bad duration", RULES + "    action:\n      approve_when_ready:\n        deadline: soon\n", 6,
     "rules[0].action.approve_when_ready.deadline",
     "expected a duration such as 10m or 90s, got 'soon'"),
    ("negative duration", RULES + "    action: {approve_when_ready: {deadline: -5}}\n", 4,
     "rules[0].action.approve_when_ready.deadline", "got '-5'"),
    ("zero duration", RULES + "    action: {approve_when_ready: {deadline: 0m}}\n", 4,
     "rules[0].action.approve_when_ready.deadline", "longer than 0s"),
    ("missing deadline", RULES + "    action:\n      approve_when_ready: {on_deadline: hold}\n", 5,
     "rules[0].action.approve_when_ready.deadline", "missing (required)"),
    ("ask without settings", RULES + "    action: ask\n", 4, "rules[0].action",
     "ask needs settings"),
    ("ask without target", RULES + "    action:\n      ask: {deadline: 5m}\n", 5,
     "rules[0].action.ask.target", "missing (required)"),
    ("ask empty target", RULES + "    action: {ask: {target: ' '}}\n", 4,
     "rules[0].action.ask.target", "empty"),
    ("ask bad on_deadline", RULES + "    action: {ask: {target: a, on_deadline: later}}\n", 4,
     "rules[0].action.ask.on_deadline", "expected approve or hold, got 'later'"),
    ("bad on_deadline",
     RULES + "    action: {approve_when_ready: {deadline: 1m, on_deadline: wait}}\n",
     4, "rules[0].action.approve_when_ready.on_deadline", "expected approve or hold, got 'wait'"),
    ("duplicate rule names", RULES + "    action: hold\n    match: {event_type: Reboot}\n"
     "  - name: A\n    action: hold\n", 6, "rules[1].name",
     "duplicate rule name 'A' (first at rules[0].name, line 3)"),
    ("unreachable rule", RULES + "    action: hold\n  - name: b\n    action: approve\n", 5,
     "rules[1]", "unreachable: rule 'a'"),
    ("rule name is a list", "version: 1\nrules:\n  - name: [a]\n    action: hold\n", 3,
     "rules[0].name", "expected a string, got a list"),
    ("rule name empty", "version: 1\nrules:\n  - name:\n    action: hold\n", 3, "rules[0].name",
     "got nothing"),
]  # fmt: skip

MATCH = RULES + "    action: hold\n    match:\n"  # match fields from line 6
BAD += [
    ("match is a list", RULES + "    action: hold\n    match: [User]\n", 5, "rules[0].match",
     "expected a mapping with keys event_type"),
    ("unknown event type", MATCH + "      event_type: [Reboot, Rebot]\n", 6,
     "rules[0].match.event_type[1]", "got 'Rebot' (did you mean 'Reboot'?)"),
    ("unknown event source", MATCH + "      event_source: Admin\n", 6,
     "rules[0].match.event_source", "expected one of User, Platform, got 'Admin'"),
    ("unknown status", MATCH + "      status: Completed\n", 6, "rules[0].match.status",
     "expected one of Scheduled, Started"),
    ("empty event type list", MATCH + "      event_type: []\n", 6, "rules[0].match.event_type",
     "empty list"),
    ("empty duration range", MATCH + "      duration_seconds: {}\n", 6,
     "rules[0].match.duration_seconds", "give at_least, below or both"),
    ("inverted duration range", MATCH + "      duration_seconds: {at_least: 9, below: 9}\n", 6,
     "rules[0].match.duration_seconds.below", "must be above at_least (9)"),
    ("fractional duration bound", MATCH + "      duration_seconds: {below: 8.5}\n", 6,
     "rules[0].match.duration_seconds.below", "expected a whole number, got '8.5'"),
    ("typo'd duration key", MATCH + "      duration_seconds: {at_most: 9}\n", 6,
     "rules[0].match.duration_seconds.at_most", "did you mean 'at_least'?"),
    ("empty vm", MATCH + "      vm: {}\n", 6, "rules[0].match.vm", "empty"),
    ("typo'd vm key", MATCH + "      vm:\n        scaleset: web\n", 7,
     "rules[0].match.vm.scaleset", "did you mean 'scale_set'?"),
    ("vm key at match level", MATCH + "      tags: {tier: db}\n", 6, "rules[0].match.tags",
     "unknown key"),
    ("tags not a mapping", MATCH + "      vm: {tags: [db]}\n", 6, "rules[0].match.vm.tags",
     "expected a mapping, got a list"),
    ("duplicate tag in any case", MATCH + "      vm:\n        tags:\n          tier: db\n"
     "          Tier: web\n", 9, "rules[0].match.vm.tags.Tier", "duplicate key (first on line 8)"),
]  # fmt: skip

WINDOW = RULES + "    action:\n      approve_in_window:\n"  # settings from line 6
IN = "rules[0].action.approve_in_window"
ITEM = WINDOW + "        windows:\n          - "  # the first window, on line 7
BAD += [
    ("unknown zone", WINDOW + "        timezone: Europe/Istambul\n        windows: []\n", 6,
     f"{IN}.timezone", "unknown time zone 'Europe/Istambul' (did you mean 'Europe/Istanbul'?)"),
    ("zone in the wrong case", WINDOW + "        timezone: utc\n        windows: []\n", 6,
     f"{IN}.timezone", "did you mean 'UTC'?"),
    ("missing windows", WINDOW + "        timezone: UTC\n", 6, f"{IN}.windows", "missing"),
    ("empty windows", WINDOW + "        windows: []\n", 6, f"{IN}.windows", "empty list"),
    ("bad time", ITEM + "{days: daily, start: '25:00', end: '02:00'}\n",
     7, f"{IN}.windows[0].start",
     "expected a time such as 01:00 or 23:30 (HH:MM, 24-hour), got '25:00'"),
    ("time with seconds",
     WINDOW + "        windows:\n          - days: daily\n            start: '01:00'\n"
     "            end: '02:00:30'\n", 9, f"{IN}.windows[0].end", "got '02:00:30'"),
    ("unknown day", ITEM + "{days: [Mon, Fro], start: '1:00', end: '2:00'}\n",
     7, f"{IN}.windows[0].days[1]", "got 'Fro' (did you mean 'fri'?)"),
    ("missing end", ITEM + "{days: daily, start: '01:00'}\n", 7,
     f"{IN}.windows[0].end", "missing"),
]  # fmt: skip

BUDGETS = "version: 1\nrules: [{name: a, action: hold}]\nbudgets:\n  - name: b\n"  # fields from 5
BAD += [
    ("both limits", BUDGETS + "    group: zone\n    max_vms: 1\n    max_percent: 10\n", 7,
     "budgets[0].max_percent", "give max_vms or max_percent, not both"),
    ("neither limit", BUDGETS + "    group: zone\n", 4, "budgets[0]",
     "missing max_vms or max_percent"),
    ("negative max_vms", BUDGETS + "    group: zone\n    max_vms: -1\n", 6, "budgets[0].max_vms",
     "must be at least 1, got -1"),
    ("zero max_vms", BUDGETS + "    group: zone\n    max_vms: 0\n", 6, "budgets[0].max_vms",
     "must be at least 1, got 0"),
    ("percent over 100", BUDGETS + "    group: zone\n    max_percent: 150\n", 6,
     "budgets[0].max_percent", "must be above 0 and at most 100, got 150"),
    ("percent zero", BUDGETS + "    group: zone\n    max_percent: 0\n", 6, "budgets[0].max_percent",
     "must be above 0"),
    ("percent nan", BUDGETS + "    group: zone\n    max_percent: .nan\n", 6,
     "budgets[0].max_percent", "got nan"),
    ("percent as text", BUDGETS + "    group: zone\n    max_percent: 25%\n", 6,
     "budgets[0].max_percent", "expected a number, got '25%'"),
    ("unknown group", BUDGETS + "    group: scaleset\n    max_vms: 1\n", 5, "budgets[0].group",
     "(did you mean 'scale_set'?)"),
    ("tag group without a name", BUDGETS + "    group: 'tag:'\n    max_vms: 1\n", 5,
     "budgets[0].group", "needs a tag name"),
    ("missing group", BUDGETS + "    max_vms: 1\n", 4, "budgets[0].group", "missing"),
    ("duplicate budget names", BUDGETS + "    group: zone\n    max_vms: 1\n  - name: B\n"
     "    group: fleet\n    max_vms: 3\n", 7, "budgets[1].name",
     "duplicate budget name 'B' (first at budgets[0].name, line 4)"),
    ("budgets not a list", "version: 1\nbudgets: {name: b}\nrules: []\n", 2, "budgets",
     "expected a list"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "line", "path", "message"), [case[1:] for case in BAD], ids=[case[0] for case in BAD]
)
def test_errors_name_the_line_and_the_field(text: str, line: int, path: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        loads(text, "p.yaml")
    error = str(caught.value)
    prefix = f"p.yaml:{line}: {path}: " if path else f"p.yaml:{line}: "
    assert error.startswith(prefix), error
    assert message in error, error


def test_a_typo_far_from_any_key_gets_no_suggestion() -> None:
    with pytest.raises(PolicyError) as caught:
        loads("version: 1\ncolour: red\n", "p.yaml")
    assert "did you mean" not in str(caught.value)


def test_load_reads_a_file_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + policyfile.DEFAULT_POLICY_YAML.encode())
    assert load(path).source == str(path)
    assert load(path).rules == policy.DEFAULT_POLICY.rules


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read the policy file"), (b"version: 1\n\xff\xfe\n", "cannot read")],
)
def test_load_reports_unreadable_files(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "policy.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(PolicyError, match=message) as caught:
        load(path)
    assert str(caught.value).startswith(f"{path}: ")


def test_check_command_summarises_a_valid_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policyfile.EXAMPLE_POLICY_YAML, encoding="utf-8")
    assert policyfile.main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}: valid policy, 6 rules, 2 budgets (first matching rule wins)"
    assert lines[1:] == [
        "  rule user-initiated: event_source user -> approve",
        "  rule short-freeze: event_type freeze, 0 <= duration < 9 -> approve",
        "  rule primary-db: vm tags role=primary -> ask dba-oncall (deadline 30m, then hold)",
        "  rule db-after-drain: event_type reboot|redeploy, vm tags tier=db, vm name db-* -> "
        "approve when ready (deadline 10m, then hold)",
        "  rule web-nights: vm scale_set web -> approve in window (Europe/Istanbul: weekend "
        "01:00-05:00; weekdays 23:00-02:00)",
        "  rule everything-else: every event -> hold",
        "  budget one-web-vm-at-a-time: at most 1 VM impacted per scale_set",
        "  budget db-quarter: at most 25% (at least 1 VM) impacted per tag:tier",
        "  rebalance: drain the node at once, tell ops (a Spot rebalance recommendation is never "
        "approved)",
    ]


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("{drain: true}", Rebalance(drain=True)),
        ("{drain: false}", Rebalance()),
        ("{notify: ops}", Rebalance(notify="ops")),
        ("{drain: true, notify: ops}", Rebalance(drain=True, notify="ops")),
    ],
)
def test_the_rebalance_section(section: str, expected: Rebalance) -> None:
    body = f"version: 1\nrules: [{{name: r, action: hold}}]\nrebalance: {section}\n"
    assert loads(body).rebalance == expected
    assert loads("version: 1\nrules: [{name: r, action: hold}]\n").rebalance is None


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ("{drain: maybe}", "rebalance.drain: expected true or false, got 'maybe'"),
        ("{}", "rebalance: empty: give drain, notify or both"),
        ("{drain: true, ask: x}", "rebalance"),
        ("{notify: ''}", "rebalance.notify: expected a notification target's name"),
    ],
)
def test_a_wrong_rebalance_section_is_named(section: str, error: str) -> None:
    body = f"version: 1\nrules: [{{name: r, action: hold}}]\nrebalance: {section}\n"
    with pytest.raises(policyfile.PolicyError, match=re.escape(error)):
        loads(body)


def test_check_command_prints_the_error_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\nrules:\n  - name: a\n    action: soon\n", encoding="utf-8")
    assert policyfile.main([str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"{path}:4: rules[0].action: unknown action 'soon'")


def test_check_command_runs_as_a_module(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policyfile.DEFAULT_POLICY_YAML, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "bridge.policy.file", str(path)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "rule short-freeze: event_type freeze, 0 <= duration < 9 -> approve" in done.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "bridge.policy.file", str(tmp_path / "nope.yaml")],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "cannot read the policy file" in missing.stderr


def test_only_the_consumers_policy_may_ask_a_person(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policyfile.EXAMPLE_POLICY_YAML, encoding="utf-8")
    assert policyfile.load_setting("consumer.policy", path).rules[2].action.kind == "ask"
    with pytest.raises(ConfigError, match=r"agent.policy: .*rule primary-db asks a person"):
        policyfile.load_setting("agent.policy", path)
