"""The approval page's HTML: server-rendered, every value escaped, forms only (it works with
scripting off, and the Content-Security-Policy allows no script), one style sheet."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from html import escape

from bridge.consumer.people.desk import Answer, OpenEvent, PatchAsk
from bridge.policy.model import Pause, Person
from bridge.records import iso

STYLE = """\
body { font-family: system-ui, sans-serif; margin: 1.5rem; max-width: 60rem; color: #1b1b1b; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.who, .note { color: #555; }
.answer { padding: .6rem .8rem; border-radius: .3rem; font-weight: 600; }
.accepted { background: #e3f4e1; border: 1px solid #3c8c34; }
.refused { background: #fbe4e1; border: 1px solid #b3261e; }
.event { border: 1px solid #ccc; border-radius: .3rem; padding: .4rem 1rem 1rem; margin: 1rem 0; }
form { display: inline-block; margin: .3rem 1rem .3rem 0; vertical-align: top; }
label { display: block; font-size: .9rem; }
input[type=text] { width: 16rem; }
table { border-collapse: collapse; } td, th { padding: .2rem .8rem .2rem 0; text-align: left; }
"""


@dataclass(frozen=True)
class View:
    person: Person
    local: bool
    csrf: str
    events: list[OpenEvent]
    pauses: list[Pause]
    budgets: dict[str, float]
    answer: Answer | None
    now: datetime
    only: str | None = None  # the one event asked for (a notice's link), else every open event
    patch_asks: tuple[PatchAsk, ...] = ()  # the patch runs a person is asked about
    only_run: str | None = None  # the one patch run asked for (`(patch:C/R)`, a notice's link)


def render(view: View) -> str:
    parts = [
        f'<p class="who">Signed in as {_e(view.person.name)} ({_e(view.person.object_id)}).',
        " This is the standalone consumer's page for one operator on this machine (loopback)."
        if view.local
        else "",
        "</p>",
    ]
    if view.answer is not None:
        state = "accepted" if view.answer.accepted else "refused"
        parts.append(
            f'<p class="answer {state}" id="answer" role="status">'
            f"{_e(view.answer.code)}: {_e(view.answer.detail)}</p>"
        )
        if view.answer.warning:
            parts.append(f'<p class="answer warning">Warning: {_e(view.answer.warning)}</p>')
    if view.only_run is not None:
        gone = "is not asked about now: it was answered, or its deadline passed and it was decided"
        parts += _alone(f"Patch run {view.only_run}", gone, bool(view.patch_asks))
        parts += [_patch_ask(a, view.csrf, view.local) for a in view.patch_asks]
        parts.append(f'<p class="note">As of {_e(iso(view.now))}. Reload for what changed.</p>')
        return _document("se-bridge approvals", "".join(parts))
    if view.only is not None:
        gone = "is not open: it has started, ended or was canceled"
        parts += _alone(f"Event {view.only}", gone, bool(view.events))
    else:
        parts.append(f"<h2>Open events ({len(view.events)})</h2>")
        if not view.events:
            parts.append('<p class="note">No event is open.</p>')
    parts += [_event(e, view.csrf, view.local) for e in view.events]
    if view.only is None and view.patch_asks:
        parts.append(f"<h2>Patch runs asked about ({len(view.patch_asks)})</h2>")
        parts += [_patch_ask(a, view.csrf, view.local) for a in view.patch_asks]
    parts += _budgets(view.budgets)
    parts += _pauses(view)
    parts.append(f'<p class="note">As of {_e(iso(view.now))}. Reload for what changed.</p>')
    return _document("se-bridge approvals", "".join(parts))


def _alone(what: str, gone: str, shown: bool) -> list[str]:
    """The heading of a page with one thing alone (a notice's link), and why it is not there."""
    said = [f"<h2>{_e(what)}</h2>"]
    if not shown:
        said.append(f'<p class="note">{_e(what)} {_e(gone)}.</p>')
    return [*said, '<p><a href="/">All open events</a></p>']


def login(reason: str | None, then: str = "/") -> str:
    """The local operator's sign-in form; `then` is the page's path to go on to."""
    said = f'<p class="answer refused">{_e(reason)}</p>' if reason else ""
    return _document(
        "se-bridge: sign in",
        f"{said}<p>This page is for the one operator of this consumer. Open the one-time login "
        "address in the file operator-login in its state directory, or give the operator "
        "token from the file operator-token there.</p>"
        '<form method="post" action="/login"><label for="token">Operator token</label>'
        f'<input type="hidden" name="next" value="{_e(then)}">'
        '<input type="password" id="token" name="token" autocomplete="off" required>'
        '<button type="submit">Sign in</button></form>',
    )


def refused(reason: str) -> str:
    return _document(
        "se-bridge: refused",
        f'<p class="answer refused" id="answer">{_e(reason)}</p><p><a href="/">Back</a></p>',
    )


def _document(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{_e(title)}</title><link rel="stylesheet" href="/style.css"></head>'
        f"<body><h1>{_e(title)}</h1>{body}</body></html>"
    )


def _pauses(view: View) -> list[str]:
    parts = ["<h2>Pauses</h2>"]
    if not view.pauses:
        parts.append('<p class="note">Nothing is paused: early approvals go ahead.</p>')
    for pause in view.pauses:
        until = f"until {iso(pause.until)}" if pause.until else "until resumed"
        scope = pause.scope or "the whole fleet"
        said = (
            f"<p>Paused: <strong>{_e(scope)}</strong>, {_e(until)}, by {_e(pause.by.name)} "
            f"at {_e(iso(pause.at))}: {_e(pause.reason)}</p>"
        )
        resume = _form(
            view.csrf, "resume", f"Resume {scope}", {"scope": pause.scope or ""}, token=view.local
        )
        parts.append(said + resume)
    inputs = (
        ("scope", "Scope (empty: the whole fleet; or KIND:VALUE, a budget group)"),
        ("until", "Until (ISO time, UTC, or a duration such as 2h; empty: until resumed)"),
    )
    parts.append(_form(view.csrf, "pause", "Pause", {}, inputs=inputs, token=view.local))
    return parts


def _budgets(budgets: dict[str, float]) -> list[str]:
    parts = ["<h2>Budgets</h2>"]
    if not budgets:
        return [*parts, '<p class="note">The policy has no budget.</p>']
    rows = "".join(
        f"<tr><td>{_e(name)}</td><td>{use:.0%} of its limit in its fullest group</td></tr>"
        for name, use in sorted(budgets.items())
    )
    return [*parts, f"<table><tr><th>Budget</th><th>Holds</th></tr>{rows}</table>"]


def _advisory(event: OpenEvent) -> str:
    """A Spot rebalance recommendation: what it is and what the policy did, no forms (the
    rebalance gate decides before any person's decision, and the desk refuses one)."""
    why = "".join(f"<li>{_e(line)}</li>" for line in event.explanation)
    return (
        f'<section class="event advisory" id="event-{_e(event.event_id)}">'
        f"<h3>Advisory: {_e(event.event_type)} {_e(event.event_id)}</h3>"
        f"<p>VMs: {_e(', '.join(event.vms))}</p>"
        "<p>A Spot rebalance recommendation: Azure may evict these VMs soon. It is an "
        "advisory, never approved or held here; the policy's rebalance section acts on it.</p>"
        f"<p>What the policy did: {_e(event.action)}: {_e(event.reason)}</p>"
        f"<ul>{why}</ul></section>"
    )


def _event(event: OpenEvent, csrf: str, local: bool) -> str:
    if event.advisory:
        return _advisory(event)
    ident = {"event": event.event_id, "digest": event.resources_digest}
    not_before = iso(event.not_before) if event.not_before else "none given (it may start now)"
    ask = f"<p>Asked: {_e(event.ask)}</p>" if event.ask else ""
    why = "".join(f"<li>{_e(line)}</li>" for line in event.explanation)
    return (
        f'<section class="event" id="event-{_e(event.event_id)}">'
        f"<h3>{_e(event.event_type)} {_e(event.event_id)}</h3>"
        f"<p>VMs: {_e(', '.join(event.vms))}<br>NotBefore: {_e(not_before)}</p>{ask}"
        f"<ul>{why}</ul>"
        + _form(csrf, "approve", "Approve now", ident, reason=False, token=local)
        + _form(csrf, "override", "Approve over the budget", ident, token=local)
        + _form(csrf, "hold", "Hold until NotBefore", ident, reason=False, token=local)
        + "</section>"
    )


def _patch_ask(ask: PatchAsk, csrf: str, local: bool) -> str:
    """An Update Manager patch run that would break a budget: run it over the budget or
    cancel it (through applyUpdates), until the ask's deadline before its cut-off."""
    ident = {"run": ask.subject}
    cutoff = iso(ask.cutoff) if ask.cutoff else "none given"
    deadline = iso(ask.deadline) if ask.deadline else cutoff
    broken = "".join(f"<li>{_e(line)}</li>" for line in ask.breaches)
    return (
        f'<section class="event patchrun" id="patchrun-{_e(ask.subject)}">'
        f"<h3>Patch run {_e(ask.name)} of {_e(ask.configuration)}</h3>"
        f"<p>{ask.vms} VMs, from {_e(iso(ask.start))} to {_e(iso(ask.end))}<br>"
        f"Cut-off (Azure cancels nothing after it): {_e(cutoff)}<br>"
        f"Asked: {_e(ask.target)}, until {_e(deadline)}; unanswered, it is "
        f"{'cancelled' if ask.on_deadline == 'cancel' else 'let run'}</p>"
        f"<p>It would break:</p><ul>{broken}</ul>"
        + _form(csrf, "patch_run", "Let it run over the budget", ident, token=local)
        + _form(csrf, "patch_cancel", "Cancel the run", ident, token=local)
        + "</section>"
    )


def _form(
    csrf: str,
    action: str,
    label: str,
    hidden: dict[str, str],
    *,
    reason: bool = True,
    inputs: tuple[tuple[str, str], ...] = (),
    token: bool = False,
) -> str:
    """A decision's form; with `token`, it asks for the operator token (the loopback page,
    where the session cookie alone does not decide)."""
    fields = [
        f'<input type="hidden" name="csrf" value="{_e(csrf)}">',
        f'<input type="hidden" name="action" value="{_e(action)}">',
    ]
    fields += [f'<input type="hidden" name="{_e(k)}" value="{_e(v)}">' for k, v in hidden.items()]
    for name, text in inputs:
        fields.append(f'<label>{_e(text)} <input type="text" name="{_e(name)}"></label>')
    required = " required" if reason else ""
    what = "Reason (required)" if reason else "Reason"
    fields.append(f'<label>{what} <input type="text" name="reason"{required}></label>')
    if token:
        fields.append(
            '<label>Operator token <input type="password" name="token" '
            'autocomplete="current-password" required></label>'
        )
    fields.append(f'<button type="submit" name="do" value="{_e(action)}">{_e(label)}</button>')
    return f'<form method="post" action="/decide">{"".join(fields)}</form>'


def _e(text: str) -> str:
    return escape(text, quote=True)
