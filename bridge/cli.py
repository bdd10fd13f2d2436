"""The `se-bridge` command line (DESIGN 3.3). Each sub-command's module adds its own parser."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge import __version__, host
from bridge.config import Config, ConfigError, load

if TYPE_CHECKING:
    from bridge.policy.model import Policy

log = logging.getLogger("bridge")


def setup_logging(level: str = "INFO", handler: logging.Handler | None = None) -> None:
    """Log at `level` to `handler` (bridge.logfile.handler), by default stderr."""
    # Logs go to stderr: stdout belongs to the stdout sink.
    logging.basicConfig(
        level=level,
        handlers=[handler or logging.StreamHandler(sys.stderr)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    # The Azure SDKs narrate every retry and request at INFO; the sinks report what matters.
    logging.getLogger("azure").setLevel(max(logging.WARNING, logging.getLevelName(level)))


def add_agent_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("agent", help="poll IMDS and ship records (runs until stopped)")
    p.add_argument("--config", type=Path, help="TOML settings file")
    p.add_argument("--imds-url", help="IMDS base URL (default http://169.254.169.254)")
    p.add_argument("--poll-interval", type=float, help="seconds between polls (default 1)")
    p.add_argument("--state-dir", type=Path, help="spool and state directory")
    p.add_argument(
        "--sink",
        action="append",
        metavar="SPEC",
        help="jsonl:PATH or stdout; repeat for several (default jsonl:<state-dir>/records.jsonl)",
    )
    p.add_argument(
        "--commands",
        metavar="SPEC",
        help="approval command channel to listen on: local:DIR or storagequeue",
    )
    p.add_argument(
        "--policy", type=Path, metavar="FILE", help="approve with this policy here (local mode)"
    )
    p.add_argument(
        "--log-file", type=Path, metavar="PATH", help="log to this size-rotated file, not stderr"
    )
    p.set_defaults(func=run_agent)


def add_check_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "check", help="make a harmless round trip to every configured sink and give advice"
    )
    p.add_argument("--config", type=Path, help="TOML settings file")
    p.add_argument("--state-dir", type=Path, help="spool and state directory")
    p.add_argument("--sink", action="append", metavar="SPEC", help="as for `se-bridge agent`")
    p.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    from bridge.redact import describe  # noqa: PLC0415
    from bridge.retry import DeliveryError  # noqa: PLC0415
    from bridge.sinks import build, check  # noqa: PLC0415

    flags = {"agent.state_dir": args.state_dir, "agent.sinks": args.sink}
    try:
        config = load(args.config, flags=flags)
    except ConfigError as err:
        return _fail(f"configuration error: {err}", 2)
    failed = 0
    for spec in config.sink_specs():
        sink = build(spec, config)
        try:
            print(f"ok      {sink.name}: {check(sink)}")
        except DeliveryError as err:
            failed += 1
            print(f"FAILED  {sink.name}: {describe(err)}")
        finally:
            sink.close()
    return 1 if failed else 0


def run_agent(args: argparse.Namespace) -> int:
    # First, so a stop signal during start-up still ends in a clean stop with a Stop heartbeat.
    stop = threading.Event()
    host.install_stop_handler(stop.set)
    flags = {
        "imds.url": args.imds_url,
        "agent.poll_interval": args.poll_interval,
        "agent.state_dir": args.state_dir,
        "agent.sinks": args.sink,
        "commands.channel": args.commands,
        "agent.policy": args.policy,
        "agent.log_file": args.log_file,
    }
    return serve_agent(args.config, flags, stop)


def serve_agent(
    config_file: Path | None,
    flags: dict[str, Any],
    stop: threading.Event,
    *,
    default_log_file: Path | None = None,
) -> int:
    """Run the agent until `stop` is set; the exit code. The Windows service calls this too."""
    from bridge.agent.loop import Agent  # noqa: PLC0415 - keeps `se-bridge --help` light
    from bridge.logfile import handler  # noqa: PLC0415
    from bridge.outbox.spool import SpoolError  # noqa: PLC0415

    try:
        config = load(config_file, flags=flags)
        policy = _local_policy(config)
    except ConfigError as err:
        return _fail(f"configuration error: {err}", 2)
    settings = config.agent
    log_file = settings.log_file or default_log_file
    try:
        log_to = handler(log_file, max_bytes=settings.log_max_bytes, backups=settings.log_backups)
    except OSError as err:
        return _fail(f"cannot open the log file {log_file}: {err.strerror or err}", 1)
    setup_logging(settings.log_level, log_to)
    try:
        agent = Agent(config, policy=policy)
    except ConfigError as err:  # e.g. a verify key derived from a signing key in Key Vault
        return _fail(f"configuration error: {err}", 2)
    except (SpoolError, OSError) as err:
        return _fail(f"cannot start the agent: {err}", 1)
    return agent.run(stop)


def _local_policy(config: Config) -> Policy | None:
    """The local-mode policy, read at start so a bad file stops the agent with a message."""
    if config.agent.policy is None:
        return None
    from bridge.agent.localmode import load_policy  # noqa: PLC0415 - YAML only when asked for

    try:
        return load_policy(config.agent.policy)
    except ValueError as err:  # policyfile.PolicyError names the file, line and field
        raise ConfigError(f"agent.policy: {err}") from err


def _fail(message: str, code: int) -> int:
    print(f"se-bridge: {message}", file=sys.stderr)
    return code


def build_parser() -> argparse.ArgumentParser:
    from bridge.agent.winservice import add_parser as add_service_parser  # noqa: PLC0415
    from bridge.commands.signing import add_parser as add_keygen_parser  # noqa: PLC0415
    from bridge.consumer.service import add_parser as add_consume_parser  # noqa: PLC0415
    from bridge.demo import add_parser as add_demo_parser  # noqa: PLC0415
    from bridge.simulator.command import add_parser as add_simulate_parser  # noqa: PLC0415

    parser = argparse.ArgumentParser(
        prog="se-bridge",
        description="Azure Scheduled Events to fleet-wide records, alerts and approvals.",
    )
    parser.add_argument("--version", action="version", version=f"se-bridge {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_agent_parser(subparsers)
    add_check_parser(subparsers)
    add_consume_parser(subparsers)
    add_simulate_parser(subparsers)
    add_demo_parser(subparsers)
    add_keygen_parser(subparsers)
    add_service_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command not in ("agent", "check", "consume"):
        setup_logging("INFO")
    if args.command == "check":
        setup_logging("WARNING")
    code: int = args.func(args)
    return code
