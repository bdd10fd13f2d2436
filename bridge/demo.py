"""`se-bridge demo`: the whole loop on one machine, no Azure.

An IMDS simulator with a small fleet, one agent per VM (in this process, each with its
own spool, a jsonl sink and a view sink), demo hooks, a driver that plays the scenarios,
and a live terminal view, until Ctrl-C or --duration; then a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from bridge import extras, host
from bridge import recordtypes as rt
from bridge.agent.wiring import build_agent
from bridge.commands import signing
from bridge.commands.message import LATE, is_late
from bridge.config import (
    AgentSettings,
    CommandsSettings,
    Config,
    ConfigError,
    ConsumerSettings,
    EventGridSettings,
    HooksSettings,
    IdentitySettings,
    ImdsSettings,
    PeopleSettings,
)
from bridge.policy.file import DEFAULT_POLICY_YAML
from bridge.policy.model import PERSON_RULE
from bridge.records import parse_time
from bridge.recordtypes import RECORD_TYPE
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.arm import ArmServer
from bridge.simulator.eventgrid import EventGridDouble, GridFaults
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms
from bridge.sinks import BaseSink, SpooledRecord, build

if TYPE_CHECKING:
    from bridge.consumer.service import ConsumerService

SCENARIOS = (
    "live-migration",
    "user-reboot",
    "availability-set",
    "spot-preempt",
    "canceled",
    "hardware-failure",
    "redeploy",
    "vmss-terminate",
    "platform-reboot",
    "reset-24h",
)
DEMO_NOTICE = 300.0  # simulated seconds
# The scenario a person is asked about (the demo policy's ask rule names its VM, db-0): it
# gives them a minute of real time before NotBefore, and the ask half of it.
ASKED = "availability-set"
ASKED_NOTICE = 60.0  # real seconds
ASK_RULE = """\
  - name: ask-the-db-owner      # a person decides; nobody in 30 s: it waits for NotBefore
    match: {event_type: Reboot, vm: {name: "db-*"}}
    action: {ask: {target: db-owner, deadline: 30s, on_deadline: hold}}
"""
HOLD_RULE = "  - name: everything-else"
# The built-in policy, with the ask before its last rule.
DEMO_POLICY_YAML = DEFAULT_POLICY_YAML.replace(HOLD_RULE, ASK_RULE + HOLD_RULE, 1)
# The demo hooks print one line; real ones drain a load balancer or checkpoint work.
HOOK = "import os; print('{0}: ' + os.environ['SE_BRIDGE_EVENT_TYPE'] + ' ' + os.environ['SE_BRIDGE_EVENT_ID'])"  # noqa: E501


@dataclass(frozen=True)
class Answering:
    """How a person answers an ask in the demo: the consumer's loopback page and its API."""

    url: str  # the page, http://127.0.0.1:PORT
    state_dir: Path  # the consumer's, where its operator-token is
    login_code: Callable[[], str | None]  # the page's one-time code; None once used

    def lines(self, ask: rt.Decision, width: int | None = None) -> list[str]:
        """The page and the command that approve `ask`; within `width` columns when given, the
        command then continued over lines with a backslash, so it still pastes into a shell."""
        code = self.login_code()
        token = f"{self.state_dir}/operator-token"
        page = (
            f"signs you in once: {self.url}/login?code={code} (each decision asks for "
            f"the token in {token})"
            if code
            else (f"signed in already; else the token in {token}: {self.url}/")
        )
        vms = ", ".join(ask["Resources"]) or "its VMs"
        words = [
            se_bridge(),
            ["approve", ask["EventId"]],
            ["--api", self.url],
            ["--state-dir", str(self.state_dir)],
            ["--reason", f"checked {vms}"],
        ]
        lines = (
            [f"    answer on the page ({page})"]
            if width is None
            else wrap(f"    answer on the page, {page}", width, "      ")
        )
        return lines + continued("    or approve it: ", words, width)


def wrap(text: str, width: int, indent: str) -> list[str]:
    """`text` in lines of `width` at most, broken at spaces; a word too long for a line is
    cut, as every line of the live view is, rather than broken where a person would copy it."""
    lines = textwrap.wrap(
        text,
        width,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
        drop_whitespace=True,
    )
    return [line[:width] for line in lines] or [""]


def continued(prefix: str, groups: Sequence[Sequence[str]], width: int | None) -> list[str]:
    """A shell command of the words in `groups` after `prefix`: on one line, or within `width`
    columns on lines that end in a backslash, each group (an option and its value) kept on
    one line when it fits. A word longer than a line is broken where the line ends: the shell
    drops a backslash and the newline after it even within a word, so it still pastes whole."""
    if width is None:
        return [prefix + " ".join(shlex.join(group) for group in groups)]
    lines, line, indent = [], prefix.rstrip(), "      "

    def add(text: str) -> None:
        nonlocal line
        if len(line) + 1 + len(text) + 2 > width and line.strip():
            lines.append(line + " \\")
            line = indent
        line = f"{line} {text}" if line.strip() else line + text
        while len(line) > width - 1 and text == shlex.quote(text):
            lines.append(line[: width - 1] + "\\")
            line = line[width - 1 :]

    for group in groups:
        joined = shlex.join(group)
        if len(indent) + len(joined) + 2 <= width:
            add(joined)
        else:
            for word in group:
                add(shlex.quote(word))
    return [*lines, line]


def se_bridge() -> list[str]:
    """How to run this se-bridge from a shell: by name when PATH finds this one (an activated
    venv, an installed package), else by its path (`./dev demo` runs .venv/bin/se-bridge)."""
    beside = Path(sys.executable).with_name("se-bridge")
    found = shutil.which("se-bridge")
    if found and Path(found).resolve() == beside.resolve():
        return ["se-bridge"]
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "bridge"]


class View:
    """What the terminal shows: the latest record per VM, the asks waiting for a person and
    how to answer them, and the most recent lines."""

    def __init__(self, out: TextIO, live: bool) -> None:
        self.out, self.live = out, live
        self.lock = threading.Lock()
        self.recent: deque[str] = deque(maxlen=16)
        self.latest: dict[str, str] = {}
        self.counts: Counter[str] = Counter()
        self.latencies: list[int] = []
        # What the summary says of each approve decision: its answer, if any came (by
        # CommandId), and when its event Started (by EventId).
        self.approves: dict[str, rt.Decision] = {}
        self.answers: dict[str, rt.Approval] = {}
        self.event_started: dict[str, str] = {}
        # What the summary says of each event (by EventId, lower-cased): what the VMs saw of
        # it and what the consumer decided.
        self.events: dict[str, Seen] = {}
        # Asks waiting for a person, by EventId: the first Ask decision (since when).
        self.asks: dict[str, rt.Decision] = {}
        self.answering: Answering | None = None
        self.started = time.monotonic()

    def add(self, vm: str, record: rt.Record) -> None:
        line = f"{record['TimeGenerated'][11:19]} {vm:<7} {summarise(record)}"
        with self.lock:
            self.counts[record[RECORD_TYPE]] += 1  # the summary's count of records
            if record[RECORD_TYPE] == "Approval" and record["ApprovalLatencyMs"] is not None:
                self.latencies.append(record["ApprovalLatencyMs"])
            self._follow(record)
            if record[RECORD_TYPE] != "Heartbeat":
                self.recent.append(line)
                self.latest[vm] = summarise(record)
            asked = self._ask(record)
        if not self.live and record[RECORD_TYPE] != "Heartbeat":
            print(line, file=self.out, flush=True)
            for said in asked:
                print(said, file=self.out, flush=True)

    def _ask(self, record: rt.Record) -> list[str]:
        """Follow the asks; what to print when `record` is a new one."""
        if record[RECORD_TYPE] == "Event" and record["Transition"] != "Scheduled":
            self.asks.pop(str(record["EventId"]).lower(), None)
        if record[RECORD_TYPE] != "Decision" or not record["EventId"]:
            return []
        key = record["EventId"].lower()
        if record["DecisionAction"] != "Ask":
            self.asks.pop(key, None)
            return []
        if key in self.asks:
            return []
        self.asks[key] = record
        return [line for block in self._asked_lines([record]) for line in block]

    def _asked_lines(
        self, asks: Sequence[rt.Decision], width: int | None = None
    ) -> list[list[str]]:
        """Each ask's lines: what was asked, and how to answer it."""
        blocks = []
        for ask in asks:
            since = ask["TimeGenerated"][11:19]
            deadline = (ask.get("AskDeadline") or "")[11:19] or "NotBefore"
            not_before = (ask["NotBefore"] or "")[11:19] or "unknown"
            head = (
                f"  {ask['EventType']} {ask['EventId']} on {', '.join(ask['Resources'])}: "
                f"asked {ask.get('AskedTarget')} at {since}, waits until {deadline} "
                f"(NotBefore {not_before})"
            )
            lines = [head] if width is None else wrap(head, width, "    ")
            if self.answering is not None:
                lines += self.answering.lines(ask, width)
            blocks.append(lines)
        return blocks

    def _follow(self, record: rt.Record) -> None:
        if record[RECORD_TYPE] in ("Event", "Decision") and record["EventId"]:
            seen = self.events.setdefault(str(record["EventId"]).lower(), Seen())
            seen.add(record)
        if record[RECORD_TYPE] == "Decision":
            command = record.get("CommandId")
            if record["DecisionAction"] == "Approve" and command:
                self.approves[command] = record
        elif record[RECORD_TYPE] == "Approval":
            if command := record.get("CommandId"):
                self.answers.setdefault(command, record)
        elif record[RECORD_TYPE] == "Event" and record["Transition"] == "Started":
            self.event_started.setdefault(str(record["EventId"]).lower(), record["TimeGenerated"])

    def event_lines(self) -> list[str]:
        """The summary's lines on events: how many, what the consumer decided of them and
        how they ended; then each ask, and how it ended."""
        with self.lock:
            events = {key: seen.copy() for key, seen in self.events.items()}
        if not events:
            return ["events 0"]
        decided = Counter(seen.outcome() for seen in events.values())
        # Approved and held always, then whatever else: waiting for a person, not decided.
        said = [f"{decided.pop(k, 0)} {k}" for k in ("approved", "held")]
        said += [f"{n} {k}" for k, n in sorted(decided.items())]
        ended = Counter(seen.ending() for seen in events.values())
        endings = ("Completed", "Canceled", "still open")
        how = ", ".join(f"{ended[k]} {k}" for k in endings if ended[k])
        lines = [f"events {len(events)}: {', '.join(said)}; {how}"]
        asked = [(key, seen) for key, seen in events.items() if seen.ask is not None]
        if asked:
            lines.append(f"asked a person {len(asked)}:")
            lines += [f"  {seen.asked_line()}" for _, seen in asked]
        return lines

    def approvals(self) -> list[str]:
        """The summary's lines on approve decisions: how many reached IMDS, and each one that
        did not, with why (a command that came after its event started, or that no agent
        ever answered, is an approval that never happened)."""
        with self.lock:
            approves, answers = list(self.approves.items()), dict(self.answers)
            started = dict(self.event_started)
        counts: Counter[str] = Counter()
        missed = []
        for command, decision in approves:
            answer = answers.get(command)
            how = _how(decision, answer, started.get(str(decision["EventId"]).lower()))
            counts[how[0]] += 1
            if how[0] not in ("reached IMDS", "approved through ARM"):
                target = decision["TargetVmName"] or decision["TargetVmId"]
                missed.append(
                    f"  {str(decision['EventId'])[:8]} {decision['EventType']:<9} "
                    f"via {target}: {how[1]}"
                )
        order = (
            "reached IMDS",
            "approved through ARM",
            "came too late",
            "refused",
            "failed",
            "never answered",
        )
        said = ", ".join(f"{counts[k]} {k}" for k in order if counts[k] or k == order[0])
        return [f"approve decisions {len(approves)}: {said}", *missed] if approves else []

    def render(
        self, vms: Sequence[str], scale: float, width: int | None = None, height: int | None = None
    ) -> str:
        """The live view's frame; within `width` x `height` when given (a terminal's size):
        each line cut or, for an ask, wrapped, and only the newest records that fit."""
        with self.lock:
            elapsed = time.monotonic() - self.started
            rows = [f"  {vm:<7} {self.latest.get(vm, '-')}" for vm in vms]
            recent = list(self.recent)
            asks = self._asked_lines(list(self.asks.values()), width)
        head = f"se-bridge demo: {len(vms)} VMs, time x{scale:g}, {elapsed:5.1f} s (Ctrl-C stops)"
        shown = [head, "", "Latest per VM", *rows]
        if width is not None:
            shown = [line[:width] for line in shown]
            recent = [line[:width] for line in recent]
        room = (height or 10**6) - len(shown)
        if asks:
            waiting = ["", "Waiting for a person"]
            for number, block in enumerate(asks):
                # The first ask always (cut if the screen is that small), the others if they
                # and the line that counts the rest fit.
                rest = len(asks) - number - 1
                if number and len(waiting) + len(block) + (1 if rest else 0) > room:
                    waiting.append(f"  and {len(asks) - number} more: see the page")
                    break
                waiting += block
            shown += waiting if width is None else [line[:width] for line in waiting]
            room -= len(waiting)
        if room >= 2:  # the newest records in the rows left, the gap above them if it fits
            gap = [""] if room >= 3 else []
            shown += [*gap, "Recent records", *recent[-(room - 1 - len(gap)) :]]
        return "\n".join(shown[:height])


@dataclass
class Seen:
    """One event, as the demo saw it: the transitions its VMs recorded and the consumer's
    decisions on it, in order."""

    transitions: set[str] = field(default_factory=set)
    decisions: list[rt.Decision] = field(default_factory=list)
    ask: rt.Decision | None = None  # the first Ask decision

    def add(self, record: rt.Record) -> None:
        if record[RECORD_TYPE] == "Event":
            self.transitions.add(str(record["Transition"]))
        elif record[RECORD_TYPE] == "Decision":
            self.decisions.append(record)
            if record["DecisionAction"] == "Ask" and self.ask is None:
                self.ask = record

    def copy(self) -> Seen:
        return Seen(set(self.transitions), list(self.decisions), self.ask)

    def outcome(self) -> str:
        """What the consumer made of it, in the summary's words."""
        actions = [d["DecisionAction"] for d in self.decisions]
        if "Approve" in actions:
            return "approved"
        if "Hold" in actions:
            return "held"
        if not actions:
            return "not decided (seen only once Started)"
        return "waiting for a person" if actions[-1] == "Ask" else actions[-1].lower()

    def ending(self) -> str:
        return next((t for t in ("Completed", "Canceled") if t in self.transitions), "still open")

    def asked_line(self) -> str:
        """`EventId EventType on VMS: how the ask ended`."""
        assert self.ask is not None
        ask = self.ask
        after = self.decisions[self.decisions.index(ask) + 1 :]
        answer = next((d for d in after if d["DecisionAction"] in ("Approve", "Hold")), None)
        vms = ", ".join(ask["Resources"]) or "its VMs"
        on = f"{str(ask['EventId'])[:8]} {ask['EventType']} on {vms}"
        if answer is not None:
            done = "approved" if answer["DecisionAction"] == "Approve" else "held"
            at = answer["TimeGenerated"][11:19]
            if answer["DecisionRule"] == PERSON_RULE:
                who = answer.get("DecidedByName") or answer.get("DecidedBy") or "a person"
                return f"{on}: {done} by {who} at {at}"
            return f"{on}: nobody answered; {done} at its deadline, {at}"
        if self.ending() == "Canceled":
            return f"{on}: the event was Canceled before anyone answered"
        if self.transitions & {"Started", "Completed"}:
            return f"{on}: nobody answered before the event Started"
        return f"{on}: still waiting for a person when the demo stopped"


def summarise(record: rt.Record) -> str:  # noqa: PLR0911 - one line per record type
    if record[RECORD_TYPE] == "Decision":
        target = f" via {record['TargetVmName']}" if record["TargetVmName"] else ""
        if record["DecisionAction"] == "Approve" and not record["TargetVmId"]:
            target = " via ARM" if "ARM" in record["DecisionReason"] else target
        return (
            f"Decision {record['DecisionAction']:<7} {record['EventId'][:8]} "
            f"rule {record['DecisionRule']}{target}"
        )
    if record[RECORD_TYPE] == "Approval":
        latency = record["ApprovalLatencyMs"]
        took = f" {latency} ms after the decision" if latency is not None else ""
        refused = record["ApprovalOutcome"] == "Refused"
        code = record["ApprovalDetail"].partition(":")[0] if refused else ""
        code = f" {code}" if code.isalpha() else ""  # Late, Expired, ...: why, in a word
        arm = " through ARM" if record["ApprovalSource"] == "ARM" else ""
        return f"Approval {record['ApprovalOutcome']}{code}{arm} {str(record['EventId'])[:8]}{took}"
    if record[RECORD_TYPE] == "Event":
        mine = {True: "this VM", False: "other VM", None: "?"}[record["AffectsThisVm"]]
        inferred = " (inferred)" if record["Inferred"] else ""
        return (
            f"Event {record['EventType']:<9} {record['EventId'][:8]} "
            f"{record['Transition']}{inferred} [{mine}]"
        )
    if record[RECORD_TYPE] == "Hook":
        result = "timed out" if record["HookTimedOut"] else f"exit {record['HookExitCode']}"
        return f"Hook  {record['HookPhase']:<9} {record['EventId'][:8]} {result}"
    if record[RECORD_TYPE] == "Advisory":
        return f"Advisory Spot rebalance {record['EventId'][:8]} {record['AdvisoryState']}"
    if record[RECORD_TYPE] == "Upcoming":
        return f"Upcoming {record['MaintenanceConfiguration']} {record['WindowStart']}"
    return f"Heartbeat {record['HeartbeatReason']}"


def _how(decision: rt.Decision, answer: rt.Approval | None, started: str | None) -> tuple[str, str]:
    """What became of one approve decision: a kind the summary counts, and a sentence."""
    if answer is None:
        decided, began = parse_time(decision["TimeGenerated"]), parse_time(started)
        if decided is None or began is None:
            return "never answered", "never answered; the event did not start during the demo"
        after = (began - decided).total_seconds()
        return "never answered", (
            f"never answered: the event Started {after:.1f} s after the decision, before "
            "the VM read the command"
        )
    outcome, detail = answer["ApprovalOutcome"], answer["ApprovalDetail"]
    if outcome == "Approved":
        return (
            "approved through ARM" if answer["ApprovalSource"] == "ARM" else "reached IMDS",
            detail,
        )
    if is_late(answer):
        return "came too late", f"came too late: {detail.removeprefix(LATE + ': ')}"
    if outcome == "Refused" and detail.startswith("Expired:"):
        return "came too late", f"came too late: {detail}"
    return (
        ("failed", f"IMDS rejected it: {detail}")
        if outcome == "Failed"
        else ("refused", f"refused: {detail}")
    )


class ViewSink(BaseSink):
    """A real sink: records reach the view through the spool and delivery, like any other."""

    max_batch = 200

    def __init__(self, vm: str, view: View) -> None:
        self.vm, self.view = vm, view

    @property
    def name(self) -> str:
        return "demo-view"

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        for item in batch:
            self.view.add(self.vm, json.loads(item.body))

    def close(self) -> None:
        """Nothing to release."""


def agent_config(
    url: str, state_dir: Path, poll: float, commands: str, *, verify_key: str = ""
) -> Config:
    hook = [sys.executable, "-c"]
    return Config(
        agent=AgentSettings(poll_interval=poll, state_dir=state_dir, heartbeat_interval=60),
        commands=CommandsSettings(
            channel=commands, poll_interval=max(0.2, poll), verify_key=verify_key
        ),
        imds=ImdsSettings(url=url, first_call_timeout=10, timeout=5),
        hooks=HooksSettings(
            prepare=[*hook, HOOK.format("prepare")],
            recover=[*hook, HOOK.format("recover")],
            timeout=30,
        ),
    )


def demo_keys(root: Path) -> tuple[str, str]:
    """A signing key pair for this run, so the demo's commands are signed as in production:
    (commands.signing_key, commands.verify_key)."""
    path = root / "signing.pem"
    if not path.exists():  # a --state-dir used before keeps its key
        root.mkdir(parents=True, exist_ok=True)
        signing.keygen(path)
    try:
        signer = signing.load_signer(
            CommandsSettings(signing_key=f"file:{path}"), IdentitySettings()
        )
    except signing.SigningError as err:
        raise ConfigError(str(err)) from err
    return f"file:{path}", signing.verify_key_text(signer.public_key())


# With --event-grid: the VM that runs no agent (a Spot VM of the scale set web), whose events
# reach the consumer only through the simulator's Event Grid (issue 36); a live agent of its set
# (web_0, web_1) carries their approvals, as Azure lets any VM of the placement group approve.
AGENTLESS = "web_2"
# And a standalone VM that runs no agent: no agent sees its events at all, so their approvals go
# through ARM's acknowledge (the simulator's, over HTTPS, with a real managed-identity token).
UNSEEN = "vm-0"


def consumer_config(
    root: Path,
    policy: Path | None,
    *,
    signing_key: str = "",
    grid_subscription: str = "",
    arm_endpoint: str = "",
) -> Config:
    """The central half, on local transports: the hub the agents write, their command dirs;
    its approval page on a free loopback port; with `grid_subscription`, Event Grid's
    deliveries of that subscription from the local hub `eventgrid` too, and with
    `arm_endpoint` ARM's acknowledge there as the carrier of last resort, as the consumer's
    managed identity."""
    grid = EventGridSettings()
    if grid_subscription:
        grid = EventGridSettings(
            enabled=True,
            health=True,
            hub=str(root / "eventgrid"),
            subscriptions=[grid_subscription],
        )
    if grid_subscription and arm_endpoint:
        grid = dataclasses.replace(grid, acknowledge=True, arm_endpoint=arm_endpoint)
    return Config(
        identity=IdentitySettings(kind="managed") if arm_endpoint else IdentitySettings(),
        eventgrid=grid,
        commands=CommandsSettings(
            channel=f"local:{root / 'commands'}",
            signing_key=signing_key,
            allow_unsigned=not signing_key,
        ),
        consumer=ConsumerSettings(
            state_dir=root / "consumer",
            policy=policy,
            state=f"sqlite:{root / 'fleet.db'}",
            hub=root / "hub",
            sinks=[f"jsonl:{root / 'decisions.jsonl'}"],
            reevaluate_interval=1.0,
            approval_timeout=10.0,
        ),
        people=PeopleSettings(page_address="127.0.0.1:0"),
    )


def demo_policy(root: Path) -> Path:
    """The demo's policy file: the built-in policy and a rule that asks a person."""
    path = root / "policy.yaml"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(DEMO_POLICY_YAML, encoding="utf-8")
    return path


class Demo:
    def __init__(
        self,
        root: Path,
        scale: float,
        poll: float,
        view: View,
        policy: Path | None = None,
        *,
        event_grid: bool = False,
    ) -> None:
        self.root, self.scale, self.poll, self.view = root, scale, poll, view
        signing_key, self.verify_key = demo_keys(root)
        # The consumer's libraries load here, not with the command line (bridge.extras).
        from bridge.consumer.service import ConsumerService  # noqa: PLC0415

        self.simulator = Simulator(Fleet(demo_vms(seed=0), time_scale=scale))
        self.server = SimulatorServer(self.simulator)
        self.grid: EventGridDouble | None = None
        self.arm: ArmServer | None = None
        self.agentless: tuple[str, ...] = ()
        subscription = endpoint = ""
        if event_grid:
            subscription = self.simulator.fleet.vm(AGENTLESS).subscription_id
            self.grid = EventGridDouble(self.simulator, root / "eventgrid", GridFaults(delay=0.5))
            self.agentless = (AGENTLESS, UNSEEN)
            self.arm = ArmServer.for_simulator(self.simulator).start()
            endpoint = self.arm.endpoint
            # The consumer (in this process) reaches ARM as it would in Azure: its managed
            # identity's token from the simulator's identity endpoint, and trust in the
            # simulator's throwaway CA. This process is the demo's alone.
            self.server.start()
            os.environ.update(self.arm.client_environment(self.server.vm_url(UNSEEN)))
        config = consumer_config(
            root,
            policy or demo_policy(root),
            signing_key=signing_key,
            grid_subscription=subscription,
            arm_endpoint=endpoint,
        )
        self.consumer: ConsumerService = ConsumerService(
            config, extra_sinks=[ViewSink("central", view)]
        )
        self.consumer_state_dir = config.consumer_state_dir()
        self.stops: list[threading.Event] = []
        self.threads: list[threading.Thread] = []
        self.played: list[tuple[str, list[str]]] = []

    def start(self) -> None:
        if self.arm is None:  # with --event-grid it serves the consumer's token already
            self.server.start()
        from bridge.consumer.people.app import LocalSignIn  # noqa: PLC0415 - as above

        page = self.consumer.serve_page()
        if page is not None and isinstance(page.app.sign_in, LocalSignIn):
            operator = page.app.sign_in.operator
            self.view.answering = Answering(
                page.url, self.consumer_state_dir, lambda: operator.login_code
            )
        self._start_thread("consumer", self.consumer.run)
        if self.grid is not None:
            self.grid.start()
        for vm in self.simulator.vm_names:
            if vm not in self.agentless:
                self._start_agent(vm)

    def _start_thread(self, name: str, target: Callable[[threading.Event], int]) -> None:
        stop = threading.Event()
        thread = threading.Thread(target=target, args=(stop,), name=name, daemon=True)
        thread.start()
        self.stops.append(stop)
        self.threads.append(thread)

    def _start_agent(self, vm: str) -> None:
        state_dir = self.root / vm
        commands = f"local:{self.root / 'commands'}"
        config = agent_config(
            self.server.vm_url(vm), state_dir, self.poll, commands, verify_key=self.verify_key
        )
        sinks = [
            build(f"jsonl:{state_dir / 'records.jsonl'}"),
            build(f"hub:{self.root / 'hub'}"),
            ViewSink(vm, self.view),
        ]
        self._start_thread(f"agent-{vm}", build_agent(config, sinks=sinks).run)

    def play(self, index: int) -> None:
        name = SCENARIOS[index % len(SCENARIOS)]
        # Every state lasts a few real seconds, so a poll of well under a second sees it, and
        # a whole lifecycle fits in a short demo: 5 simulated minutes of notice (the minimum a
        # scale-set Terminate allows) except the Spot eviction, which keeps its 30 s.
        notice = None if name == "spot-preempt" else DEMO_NOTICE
        if name == ASKED:
            notice = ASKED_NOTICE * self.scale
        cancel_after = DEMO_NOTICE / 2 if name == "canceled" else None
        ids = self.simulator.run_scenario(
            name, notice=notice, run_time=4 * self.scale, cancel_after=cancel_after
        )
        self.played.append((name, ids))

    def stop(self) -> None:
        for stop in self.stops:
            stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        if self.grid is not None:
            self.grid.stop()
        if self.arm is not None:
            self.arm.stop()
        self.server.stop()


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "demo",
        help="run the whole loop locally with a simulated fleet",
        description="The whole loop on one machine, no Azure: a simulated fleet's IMDS, an agent "
        "per VM, a local hub, the consumer with its policy and signed approvals, and a live "
        "view of what happens. Stops at Ctrl-C or after --duration.",
        epilog="""examples:
  se-bridge demo
  se-bridge demo --duration 60 --time-scale 60
  se-bridge demo --policy policy.yaml --state-dir /tmp/demo
  se-bridge demo --event-grid
""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="stop after this many seconds (default: at Ctrl-C)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=30.0,
        metavar="X",
        help="simulated seconds per second (default %(default)g)",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="the agents' seconds between polls (default %(default)g)",
    )
    p.add_argument(
        "--every",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between scenarios (default %(default)g)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where the agents and the consumer keep their state and records "
        "(default: a new directory under the system's temporary directory)",
    )
    p.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="approval policy file (default: the built-in policy, with a rule that "
        "asks a person about db-0)",
    )
    p.add_argument(
        "--event-grid",
        action="store_true",
        help=f"Azure's view as a second source (preview): {AGENTLESS} and {UNSEEN} "
        "run no agent, every event and VM health change also reaches the consumer "
        "through a simulated Event Grid, so the budgets count their events too, and "
        f"the consumer approves {UNSEEN}'s events, which no agent sees, through a "
        "simulated ARM acknowledge",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    message = extras.missing_message("consumer", "demo")
    if message:
        print(f"se-bridge: {message}", file=sys.stderr)
        return 2
    root = args.state_dir or Path(tempfile.mkdtemp(prefix="se-bridge-demo-"))
    live = sys.stdout.isatty()
    view = View(sys.stdout, live)
    try:
        demo = Demo(
            root, args.time_scale, args.poll_interval, view, args.policy, event_grid=args.event_grid
        )
    except ConfigError as err:
        print(f"se-bridge: configuration error: {err}", file=sys.stderr)
        return 2
    stop = threading.Event()
    host.install_stop_handler(stop.set)
    demo.start()
    try:
        drive(demo, stop, args, live)
    finally:
        demo.stop()
    print_summary(demo, root)
    return 0


def drive(demo: Demo, stop: threading.Event, args: argparse.Namespace, live: bool) -> None:
    deadline = time.monotonic() + args.duration if args.duration else float("inf")
    next_play, played = time.monotonic() + 1.0, 0
    with LiveScreen(sys.stdout) if live else contextlib.nullcontext() as screen:
        while not stop.is_set() and time.monotonic() < deadline:
            if time.monotonic() >= next_play:
                demo.play(played)
                played, next_play = played + 1, next_play + args.every
            if screen is not None:
                width, height = screen.size()
                vms = demo.simulator.vm_names
                screen.draw(demo.view.render(vms, args.time_scale, width, height))
            stop.wait(0.5)


class LiveScreen:
    """The live view, on the terminal's alternate screen (as `top` and `less` draw).

    Each frame fits the terminal, whose size is read before each one (a resize shows at the
    next), and is drawn over the last one, line by line at its row: nothing scrolls, so nothing
    reaches the scrollback, and nothing flickers; what is below the frame is cleared. Leaving
    restores the screen the user had, and the summary then prints there.
    """

    ENTER = "\x1b[?1049h\x1b[?25l"  # alternate screen, cursor hidden
    LEAVE = "\x1b[?25h\x1b[?1049l"
    SMALLEST = os.terminal_size((80, 24))  # when the size cannot be read

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __enter__(self) -> LiveScreen:
        self.out.write(self.ENTER)
        return self

    def size(self) -> tuple[int, int]:
        """(columns, rows)."""
        try:
            size = os.get_terminal_size(self.out.fileno())
        except (OSError, ValueError):
            size = self.SMALLEST
        return size.columns or self.SMALLEST.columns, size.lines or self.SMALLEST.lines

    def draw(self, frame: str) -> None:
        width, height = self.size()
        lines = frame.splitlines()
        # A line as wide as the screen leaves the cursor past its end, where clearing to the
        # end of the line would take its last character: only shorter lines are cleared.
        drawn = "".join(
            f"\x1b[{row};1H{line}" + ("\x1b[K" if len(line) < width else "")
            for row, line in enumerate(lines, 1)
        )
        below = f"\x1b[{len(lines) + 1};1H\x1b[J" if len(lines) < height else ""
        self.out.write(drawn + below)
        self.out.flush()

    def __exit__(self, *exc: object) -> None:
        self.out.write(self.LEAVE)
        self.out.flush()


def print_summary(demo: Demo, root: Path) -> None:
    print("\nSummary")
    print("  scenarios played: " + (", ".join(name for name, _ in demo.played) or "none"))
    for line in demo.view.event_lines():
        print(f"  {line}")
    for line in demo.view.approvals():
        print(f"  {line}")
    latencies = sorted(demo.view.latencies)
    if latencies:
        median = latencies[len(latencies) // 2]
        print(f"  approval latency (decision to IMDS): median {median} ms, max {latencies[-1]} ms")
    kinds = demo.view.counts
    print(
        f"  records written {sum(kinds.values())}: "
        + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
        + " (each VM records every change it sees of an event)"
    )
    if demo.grid is not None:
        counts = demo.grid.counts
        print(
            f"  {AGENTLESS} ran no agent: the consumer heard of its events from Event Grid "
            f"({counts['sent']} deliveries in all) and as names in its neighbours' events, "
            "its scale set's budget counted them, and a neighbour's agent carries their "
            "approvals"
        )
        arm = [a for a in demo.simulator.approvals() if a.via == "ARM"]
        said = ", ".join(f"{(a.event_id or '')[:8]} on {a.vm}" for a in arm) if arm else "none yet"
        print(
            f"  {UNSEEN} ran no agent and no agent sees its events: the consumer approved "
            f"them through ARM's acknowledge ({said}; its Approval records say "
            "ApprovalSource ARM)"
        )
    print(f"  records of each VM: {root}/<vm>/records.jsonl")
    print(f"  the consumer's decisions: {root}/decisions.jsonl")
