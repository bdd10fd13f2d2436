"""The patch-run gate (issue 40, item 1): what a guest patch run of Azure Update Manager gets
when it would take a budget group over its limit. Pure: the run, the fleet, the rule, a
person's answer and the clock in; a PatchVerdict out.

Update Manager starts a run whatever se-bridge thinks: the one thing that stops it is a cancel
(the maintenance RP's applyUpdates with status Cancel) before its cancellation cut-off. So the
rule (`PatchRule`, the [patchruns] settings) says, for a run that would break a budget:

- run: it runs, its VMs counted; a WARNING and a Decision record say which budget it breaks.
- ask: a person decides until `ask_deadline` (two cancel margins before the cut-off, so that
  their cancel, or on_deadline cancel, still reaches ARM in time); unanswered, on_deadline.
- cancel: se-bridge cancels it, only with patchruns.cancel on, and only until `cancel_by`
  (one margin before the cut-off). Never after: past it the cancel is refused, said, and the
  run is counted as running. A run that fits is never cancelled, whatever the rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from bridge.policy.groups import can_hold, groups_of
from bridge.policy.model import Budget, FleetView, Scope
from bridge.policy.patchruns import RunView

PatchKind = Literal["Run", "Ask", "Cancel"]


@dataclass(frozen=True)
class PatchRule:
    """The [patchruns] settings' rule."""

    on_breach: Literal["run", "ask", "cancel"] = "run"
    cancel: bool = False  # cancelling is allowed at all
    ask_target: str = ""
    on_deadline: Literal["run", "cancel"] = "run"
    margin: timedelta = timedelta(minutes=2)


@dataclass(frozen=True)
class PatchVerdict:
    kind: PatchKind
    reason: str
    warn: bool = False  # a run that breaks a budget runs: said at WARNING
    deadline: datetime | None = None  # an ask's
    breaches: tuple[str, ...] = ()
    explanation: tuple[str, ...] = field(default=())
    too_late: bool = False  # a cancel was wanted after cancel_by: refused


def cancel_by(run: RunView, rule: PatchRule) -> datetime | None:
    """The last moment se-bridge asks ARM to cancel `run`: a margin before its cut-off."""
    return None if run.cutoff is None else run.cutoff - rule.margin


def ask_deadline(run: RunView, rule: PatchRule) -> datetime | None:
    """Until when a person is asked: a margin before `cancel_by`."""
    last = cancel_by(run, rule)
    return None if last is None else last - rule.margin


@dataclass(frozen=True)
class Breach:
    """A budget group a run would take over its limit: `count` of its VMs impacted at once
    (the run's and the others'), more than `limit`."""

    budget: str
    group: str
    count: int
    limit: int
    line: str
    busy: frozenset[str] = frozenset()  # the group's VMs the others impact (not the run's)


def breaches(
    budgets: Iterable[Budget],
    fleet: FleetView,
    run: RunView,
    run_vms: frozenset[str],
    now: datetime,
    *,
    overlapping: Mapping[str, frozenset[str]] | None = None,
    notes: list[str] | None = None,
    places: Mapping[str, Scope | None] | None = None,
) -> list[str]:
    """The budgets `run_vms` would break, each a line (`breach_list`)."""
    found = breach_list(
        budgets, fleet, run, run_vms, now, overlapping=overlapping, notes=notes, places=places
    )
    return [b.line for b in found]


def breach_list(
    budgets: Iterable[Budget],
    fleet: FleetView,
    run: RunView,
    run_vms: frozenset[str],
    now: datetime,
    *,
    overlapping: Mapping[str, frozenset[str]] | None = None,
    notes: list[str] | None = None,
    places: Mapping[str, Scope | None] | None = None,
) -> list[Breach]:
    """The budgets `run_vms` (VmIds, and names of VMs no agent reports) would break: a group's
    impacted VMs and the run's together over its limit. Impacted: every other event and run of
    FleetView.impacted, and the runs `overlapping` this one's window that have not started yet
    (two configurations that split a scale set, each of which fits, may run at once). Names no
    VM is known by count in the `fleet` budgets; with `places` (name -> where Resource Graph
    placed it, None: nobody could tell; of this run's names and of the other runs'), in the
    other budgets' groups too: each group that can hold it, or a group of their own (a scale
    set no agent reports), and a name not placed in every group (the worst case)."""
    impacted = {**fleet.impacted, **(overlapping or {})}
    others = {vm for key, vms in impacted.items() if not run.owns(key) for vm in vms}
    known = [v for v in fleet.vms.values() if v.vm_id in run_vms or v.vm_id in others
             or fleet.alive(v.vm_id, now)]  # fmt: skip
    unknown = {v for v in run_vms if v not in fleet.vms}
    broken: list[Breach] = []
    for budget in budgets:
        groups = groups_of(budget.group, known)
        if budget.group == "fleet" and unknown:
            groups = {k: g | unknown for k, g in groups.items()} or {"fleet": set(unknown)}
        elif places is not None and unknown:
            # The other runs' names `places` says where they are (runs that overlap) count in
            # those groups too: two runs that split a set no agent reports add up.
            theirs = {n for n in others if n in places and n not in fleet.vms}
            named = {n: places.get(n) for n in unknown | theirs}
            groups = _with_names(budget.group, groups, fleet, named)
        for key, group in sorted(groups.items()):
            mine = group & run_vms
            if not mine:
                continue
            busy = (group & others) - mine
            limit = budget.limit(len(group))
            line = (
                f"budget {budget.name}: {key} has {len(busy)} of {len(group)} VMs impacted; "
                f"the run patches {len(mine)} of them at once"
            )
            if len(busy | mine) > limit:
                line = f"{line}, more than the {limit} allowed"
                broken.append(
                    Breach(budget.name, key, len(busy | mine), limit, line, frozenset(busy))
                )
            elif notes is not None:
                notes.append(f"{line}, within the limit of {limit}")
    if notes is not None and places is not None and unknown:
        notes.append(_where_said({n: places.get(n) for n in unknown}))
    return broken


NO_AGENT = " (VMs no agent reports)"


def _with_names(
    kind: str, groups: dict[str, set[str]], fleet: FleetView, names: Mapping[str, Scope | None]
) -> dict[str, set[str]]:
    """`groups` (of known VMs) with the run's names no agent reports in each group that can
    hold them (`can_hold`; a name not placed: every group); a name no known group holds forms
    a group with the others of its scale set or resource group's availability sets."""
    out = {key: set(group) for key, group in groups.items()}
    samples = {key: fleet.vms[min(g)] for key, g in groups.items() if g}
    by_scope: dict[Scope | None, set[str]] = {}
    for name, scope in names.items():
        by_scope.setdefault(scope, set()).add(name)
    # A scope at a time (a run's names share a few): 10,000 instances and 1,000 groups cost
    # a check per scope and group, not per name and group.
    for scope, named in sorted(by_scope.items(), key=lambda item: repr(item[0])):
        held = False
        for key, sample in samples.items():
            if scope is None or can_hold(kind, sample, (scope,)):
                out[key] |= named
                held = True
        if held or (kind in ("scale_set", "node_pool") and scope is not None and not scope[2]):
            continue  # a VM in no scale set is in no such group
        if scope is None:
            label = f"(anywhere){NO_AGENT}"
        else:
            label = f"{scope[0]}/{scope[1]}/{scope[2] or 'availability set'}{NO_AGENT}"
        out.setdefault(label, set()).update(named)
    return out


def _where_said(names: Mapping[str, Scope | None]) -> str:
    """Where the run's names no agent reports counted, for the Decision's explanation."""
    placed: dict[str, list[str]] = {}
    nowhere = sorted(n for n, scope in names.items() if scope is None)
    for name, scope in sorted(names.items(), key=lambda item: item[0]):
        if scope is not None:
            where = f"{scope[0]}/{scope[1]}/{scope[2] or 'availability set'}"
            placed.setdefault(where, []).append(name)
    parts = [
        f"{len(listed)} in {where} ({_few(listed)})" for where, listed in sorted(placed.items())
    ]
    said = "the run's VMs no agent reports: "
    if parts:
        said += f"{'; '.join(parts)}, where Resource Graph placed them"
    if nowhere:
        said += "; " if parts else ""
        said += (
            f"{len(nowhere)} where nobody could tell ({_few(nowhere)}), counted in every group "
            "(worst case)"
        )
    return said


def _few(names: list[str], shown: int = 3) -> str:
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def decide(
    rule: PatchRule,
    run: RunView,
    broken: list[str],
    now: datetime,
    answer: Literal["run", "cancel"] | None = None,
) -> PatchVerdict:
    """What `run` gets now, `broken` the budgets it would break (`breaches`), `answer` a
    person's when one was asked and answered."""
    said = tuple(broken)
    if not broken:
        return PatchVerdict("Run", "the run fits every budget")
    if run.cancelled:
        return PatchVerdict("Cancel", "the run was cancelled", breaches=said)
    wanted: Literal["run", "cancel"]
    why: str
    if answer is not None:
        wanted, why = answer, f"{rule.ask_target or 'a person'} answered {answer}"
    elif rule.on_breach == "ask":
        deadline = ask_deadline(run, rule)
        if deadline is not None and now < deadline:
            return PatchVerdict(
                "Ask",
                f"asked {rule.ask_target}; waiting for an answer until "
                f"{deadline:%Y-%m-%d %H:%M:%S}Z, then {rule.on_deadline}",
                deadline=deadline,
                breaches=said,
            )
        wanted = rule.on_deadline
        why = f"nobody answered {rule.ask_target} in time: on_deadline {rule.on_deadline}"
    else:
        wanted, why = ("cancel", "on_breach cancel") if rule.on_breach == "cancel" else (
            "run", "on_breach run")  # fmt: skip
    if wanted == "run":
        return PatchVerdict("Run", f"{why}: it runs over the budget", warn=True, breaches=said)
    return _cancel(rule, run, why, said, now)


def _cancel(
    rule: PatchRule, run: RunView, why: str, said: tuple[str, ...], now: datetime
) -> PatchVerdict:
    """A cancel that is wanted: taken when allowed and not too late, else the run runs."""
    if not rule.cancel:
        return PatchVerdict(
            "Run",
            f"{why}, but patchruns.cancel is off: it runs over the budget",
            warn=True,
            breaches=said,
        )
    last = cancel_by(run, rule)
    if last is None or now > last:
        until = "no cut-off" if last is None else f"{last:%Y-%m-%d %H:%M:%S}Z"
        return PatchVerdict(
            "Run",
            f"{why}, but too late to cancel (se-bridge cancels until {until}, "
            "a margin before the cut-off, never after): it runs over the budget",
            warn=True,
            breaches=said,
            too_late=True,
        )
    return PatchVerdict("Cancel", f"{why}: cancelled before its cut-off", breaches=said)
