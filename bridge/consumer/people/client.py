"""`se-bridge approve|hold|pause|resume`: a person's decision, sent to the approval API.

The person is proven, never claimed: the CLI sends a bearer token and the API validates it.
Against the consumer's API in Azure (or any consumer with Entra ID settings) the token is the
person's own, for `<audience>/.default`, from their Azure sign-in (DefaultAzureCredential
without the managed identity, workload identity and environment credentials, so that a VM's
or an app's identity is never taken for a person: `az login`, Azure PowerShell, azd or VS
Code). Against a standalone consumer's loopback page it is the operator token file
`<state dir>/operator-token` that consumer wrote.

`approve` and `hold` first list the open events and send the Resources digest of the one
named, so that the consumer refuses the decision if its VMs changed since (ResourcesChanged).
Exit 0 when the consumer accepted it, 1 when it refused it or could not be reached, 2 on a bad
option or setting.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlsplit

from bridge.config import Config, ConfigError, given, load
from bridge.consumer.people.app import parse_until
from bridge.consumer.people.auth import read_token
from bridge.consumer.people.command import FLAGS
from bridge.consumer.people.server import is_loopback
from bridge.records import iso, utc_now
from bridge.redact import describe

TIMEOUT = 30.0  # seconds for one call to the API


class Failed(Exception):
    """The decision did not go through (exit 1)."""


def run(args: argparse.Namespace) -> int:
    try:
        config = load(args.config, flags=given(args, *FLAGS))
        url = api_url(config)
        body = _body(args)
    except (ConfigError, ValueError) as err:
        print(f"se-bridge {args.decision}: {err}", file=sys.stderr)
        return 2
    try:
        token = bearer_token(config, url)
        if args.decision in ("approve", "hold"):
            event_id, body["ResourcesDigest"] = _shown(url, token, args.event)
            path = f"/api/v1/events/{quote(event_id, safe='')}/{args.decision}"
        else:
            path = f"/api/v1/{args.decision}"
        answer = call(url + path, token, body)
    except Failed as err:
        print(f"se-bridge {args.decision}: {err}", file=sys.stderr)
        return 1
    print(f"{answer.get('Code')}: {answer.get('Detail')}")
    if answer.get("Warning"):
        print(f"se-bridge {args.decision}: warning: {answer['Warning']}", file=sys.stderr)
    return 0 if answer.get("Accepted") is True else 1


def api_url(config: Config) -> str:
    url = config.people.api_url or (
        f"http://{_host_port(config.people.page_address)}" if config.people.page_address else ""
    )
    if not url:
        raise ValueError(
            "no approval API to send it to: give --api URL (or set "
            "consumer.people.api_url or page_address)"
        )
    if urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"--api must be an http(s) URL, got {url!r}")
    return url.rstrip("/")


def _host_port(address: str) -> str:
    return f"127.0.0.1:{address}" if address.isdigit() else address


def bearer_token(config: Config, url: str) -> str:
    """The operator token for a loopback URL of a consumer without Entra ID settings; the
    person's own Entra ID token otherwise."""
    host = urlsplit(url).hostname or ""
    if is_loopback(host) and not config.people.tenant_id:
        state_dir = config.consumer_state_dir()
        try:
            return read_token(state_dir)
        except OSError as err:
            raise Failed(
                f"cannot read the local consumer's operator token in {state_dir} "
                f"({describe(err)}): give its --state-dir, as the same user"
            ) from err
    if not config.people.audience:
        raise Failed(
            "set consumer.people.audience (the API's Application ID URI) to sign in with Entra ID"
        )
    scope = f"{config.people.audience[0]}/.default"
    try:
        token: str = person_credential().get_token(scope).token
    except Exception as err:  # azure-identity's many credential errors all mean the same here
        raise Failed(
            f"cannot get your Entra ID token for {scope}: {describe(err)}; sign in with "
            "az login (or Azure PowerShell, azd, VS Code) and try again"
        ) from err
    return token


def person_credential() -> Any:
    """A credential of the person at the keyboard, never a machine's identity."""
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415 - only this command

    return DefaultAzureCredential(
        exclude_managed_identity_credential=True,
        exclude_workload_identity_credential=True,
        exclude_environment_credential=True,
    )


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"Reason": args.reason}
    if args.decision == "approve":
        if args.override_budget and not args.reason.strip():
            raise ValueError("--override-budget needs --reason")
        body["OverrideBudget"] = args.override_budget
    if args.decision in ("pause", "resume"):
        body["Scope"] = args.scope
    if args.decision == "pause" and args.until:
        until = parse_until(args.until, utc_now())
        body["Until"] = iso(until) if until is not None else None
    return body


def _shown(url: str, token: str, event_id: str) -> tuple[str, str]:
    """The EventId (as the consumer spells it) and Resources digest of the open event
    `event_id`, whatever its case; what it is is printed, so the person sees the VMs they
    decide on."""
    listing = call(url + "/api/v1/events", token, None)
    events = listing.get("Events")
    for event in events if isinstance(events, list) else []:
        if isinstance(event, dict) and str(event.get("EventId", "")).lower() == event_id.lower():
            vms = ", ".join(str(vm) for vm in event.get("Vms") or [])
            print(
                f"{event.get('EventType')} {event.get('EventId')} on {vms} "
                f"(NotBefore {event.get('NotBefore') or 'none'})"
            )
            return str(event["EventId"]), str(event.get("ResourcesDigest", ""))
    raise Failed(f"event {event_id} is not open at {url}")


def call(url: str, token: str, body: dict[str, Any] | None) -> dict[str, Any]:
    """One call to the API: its JSON answer, also the consumer's refusal (409); any other
    error (not signed in, no role, unreachable) is Failed."""
    data = json.dumps(body).encode() if body is not None else None
    # api_url let only http(s) through: no file: or custom scheme reaches urlopen.
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")  # noqa: S310
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:  # noqa: S310
            return _object(answer.read())
    except urllib.error.HTTPError as err:
        try:
            refused = _object(err.read())
        except (ValueError, TypeError):
            raise Failed(f"the API answered {err.code} {err.reason}") from err
        if err.code == 409:
            return refused
        raise Failed(f"the API answered {err.code}: {refused.get('Detail', err.reason)}") from err
    except (urllib.error.URLError, OSError, ValueError, TypeError) as err:
        raise Failed(f"cannot reach the approval API at {url}: {describe(err)}") from err


def _object(raw: bytes) -> dict[str, Any]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise TypeError("the API's answer is no JSON object")
    return data
