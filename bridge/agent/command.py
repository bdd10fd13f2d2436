"""`se-bridge agent` and `se-bridge check`: the agent's entry points
(docs/contracts.md#command-line).

`serve_agent` is the one way to run an agent: the command line and the Windows service
both call it, so both refuse a bad setting the same way (exit 2) before anything runs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bridge import channels, host, sinks, telemetry
from bridge.agent import imds
from bridge.agent.document import parse_document
from bridge.agent.wiring import build_agent, check_kubernetes
from bridge.config import (
    Config,
    ConfigError,
    add_flags,
    given,
    load,
    warn_if_secrets_readable,
)
from bridge.logfile import handler, setup_logging
from bridge.outbox.spool import SpoolError
from bridge.policy import file as policyfile
from bridge.policy.model import Policy
from bridge.redact import describe
from bridge.retry import DeliveryError, PermanentError, RetryableError

AGENT_EXAMPLES = """\
examples:
  se-bridge agent --config /etc/se-bridge/agent.toml
  se-bridge agent --sink jsonl:/var/log/se-bridge/records.jsonl --sink eventhubs
  se-bridge agent --imds-url http://127.0.0.1:8080/vm/vm-0 --sink stdout   # the simulator's vm-0
  SE_BRIDGE_AGENT_METRICS_ADDRESS=9465 se-bridge agent --log-format json
"""
CHECK_EXAMPLES = """\
examples:
  se-bridge check --config /etc/se-bridge/agent.toml
  se-bridge check --sink eventhubs --sink loganalytics
  se-bridge check --imds-url http://127.0.0.1:8080/vm/vm-0 --sink stdout   # the simulator's vm-0
"""
# How long `check` waits for IMDS: a person is waiting. The agent itself waits longer for the
# first answer (imds.first_call_timeout), since IMDS may take 2 min after a VM idled.
CHECK_SECONDS = 10.0
# The settings each command takes as options, in the order --help lists them; their names,
# helps and types are the settings' (bridge.config.Flag).
AGENT_FLAGS = (
    "imds.url",
    "agent.poll_interval",
    "agent.state_dir",
    "agent.sinks",
    "commands.channel",
    "agent.policy",
    "agent.vm_name",
    "agent.log_file",
    "agent.metrics_address",
)
CHECK_FLAGS = ("imds.url", "agent.state_dir", "agent.sinks")
LOGGING = ("agent.log_level", "agent.log_format")  # bridge.cli adds them to every command


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `agent` and `check` sub-commands."""
    p = subparsers.add_parser(
        "agent",
        help="poll IMDS and ship records (runs until stopped)",
        description="Poll Azure Scheduled Events, turn each change into records, keep them in a "
        "durable spool and ship them to every sink; run hooks; act on signed approvals. Runs "
        "until SIGTERM or Ctrl-C. Exit 2 on a bad setting, 1 when it cannot start.",
        epilog=AGENT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML settings file")
    add_flags(p, *AGENT_FLAGS)
    p.set_defaults(func=run_agent)

    p = subparsers.add_parser(
        "check",
        help="ask IMDS, make a harmless round trip to every configured sink and give advice",
        description="Ask IMDS for its Scheduled Events document (waiting at most "
        f"{CHECK_SECONDS:g} s) and make a harmless round trip to every configured sink (no "
        "record is sent); print ok or FAILED with what answered, or advice, for each. Exit 0 "
        "when all answered, 1 otherwise, 2 on a bad setting.",
        epilog=CHECK_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML settings file")
    add_flags(p, *CHECK_FLAGS)
    p.set_defaults(func=run_check)


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """The agent's settings: config.load, then the sink and channel SPECs and their settings."""
    config = load(path, environ, flags)
    sinks.check_config(config, config.sink_specs())
    channels.check_config(config)
    check_kubernetes(config)
    try:
        telemetry.check_address("agent.metrics_address", config.agent.metrics_address)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return config


def run_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, flags=given(args, *CHECK_FLAGS))
    except ConfigError as err:
        return _fail(f"configuration error: {err}", 2)
    warn_if_secrets_readable(args.config)
    failed = 0
    try:
        print(f"ok      imds {config.imds.url}: {check_imds(config)}", flush=True)
    except DeliveryError as err:
        failed += 1
        print(f"FAILED  imds {config.imds.url}: {describe(err)}", flush=True)
    for spec in config.sink_specs():
        sink = sinks.build(spec, config)
        try:
            print(f"ok      {sink.name}: {sink.check()}")
        except DeliveryError as err:
            failed += 1
            print(f"FAILED  {sink.name}: {describe(err)}")
        finally:
            sink.close()
    return 1 if failed else 0


def check_imds(config: Config) -> str:
    """What IMDS at imds.url answered, in a sentence; DeliveryError saying what did not."""
    client = imds.ImdsClient(
        config.imds.url,
        config.imds.api_version,
        timeout=CHECK_SECONDS,
        first_call_timeout=CHECK_SECONDS,
    )
    try:
        try:
            body = client.scheduled_events()
        except RetryableError as err:
            if isinstance(err.__cause__, TimeoutError):
                raise RetryableError(
                    f"no answer within {CHECK_SECONDS:g} s; IMDS may take up to 2 minutes to "
                    "answer a VM that idled: try again"
                ) from err
            raise
        try:
            document = parse_document(json.loads(body))
        except (ValueError, RecursionError) as err:
            raise PermanentError(
                f"it answered, but not with a Scheduled Events document ({describe(err)}): "
                f"{imds.excerpt(body)!r}; is this IMDS, or the simulator's VM URL "
                "(http://HOST:PORT/vm/NAME)?"
            ) from err
        count = len(document.events)
        said = (
            f"Scheduled Events answered (DocumentIncarnation {document.incarnation}, "
            f"{count} event{'' if count == 1 else 's'})"
        )
        return f"{said}; {_this_vm(client, config)}"
    finally:
        client.close()


def _this_vm(client: imds.ImdsClient, config: Config) -> str:
    """Which VM the agent will take itself for: instance metadata's, or agent.vm_name."""
    try:
        identity = imds.parse_instance(client.instance_metadata())
    except DeliveryError as err:
        # "IMDS answered 404 to GET ...: '<!doctype html>...'": the status says enough here.
        status = re.search(r"IMDS answered (\d{3})", str(err))
        why = f"IMDS answered {status.group(1)}" if status else describe(err)
        if config.agent.vm_name:
            return f"no instance metadata ({why}): VM {config.agent.vm_name} (agent.vm_name)"
        return (
            f"no instance metadata ({why}): an event naming this host "
            f"({host.host_name()}) counts as this VM's; if the events' Resources call it "
            "otherwise, set agent.vm_name (--vm-name)"
        )
    return f"instance metadata: VM {identity.vm_name} ({identity.vm_id or 'no VmId'})"


def run_agent(args: argparse.Namespace) -> int:
    # First, so a stop signal during start-up still ends in a clean stop with a Stop heartbeat.
    stop = threading.Event()
    host.install_stop_handler(stop.set)
    return serve_agent(args.config, given(args, *AGENT_FLAGS, *LOGGING), stop)


def serve_agent(
    config_file: Path | None,
    flags: dict[str, Any],
    stop: threading.Event,
    *,
    default_log_file: Path | None = None,
) -> int:
    """Run the agent until `stop` is set; the exit code. The Windows service calls this too."""
    host.restrict_new_files()  # first: the log, the spool and the records are not for others
    try:
        config = load_config(config_file, flags=flags)
        policy = _local_policy(config)
    except ConfigError as err:
        return _fail(f"configuration error: {err}", 2)
    settings = config.agent
    log_file = settings.log_file or default_log_file
    try:
        log_to = handler(log_file, max_bytes=settings.log_max_bytes, backups=settings.log_backups)
    except OSError as err:
        return _fail(f"cannot open the log file {log_file}: {err.strerror or err}", 1)
    setup_logging(settings.log_level, log_to, fmt=settings.log_format, program="agent")
    warn_if_secrets_readable(config_file)
    try:
        host.private_directory(settings.state_dir)
        agent = build_agent(config, policy=policy)
    except ConfigError as err:  # e.g. a verify key that cannot be loaded
        return _fail(f"configuration error: {err}", 2)
    except (SpoolError, OSError) as err:
        return _fail(f"cannot start the agent: {err}", 1)
    try:
        agent.serve_telemetry()
    except OSError as err:
        agent.spool.close()
        address = settings.metrics_address
        return _fail(f"cannot listen on agent.metrics_address {address}: {err.strerror or err}", 1)
    return agent.run(stop)


def _local_policy(config: Config) -> Policy | None:
    """The local-mode policy, read at start so a bad file stops the agent with a message."""
    if config.agent.policy is None:
        return None
    return policyfile.load_setting("agent.policy", config.agent.policy)


def _fail(message: str, code: int) -> int:
    print(f"se-bridge: {message}", file=sys.stderr)
    return code
