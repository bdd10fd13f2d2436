"""`se-bridge consume`: the standalone consumer worker.

It reads record batches from Event Hubs (or a local hub directory), runs them through
the consumer core, sends approvals down the per-VM command channels, and writes each
Decision record to a local spool first, from which the configured sinks (Log Analytics
in production) receive them with the agent's own at-least-once delivery.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bridge import host
from bridge.config import Config, ConfigError, warn_if_secrets_readable
from bridge.consumer import validation, wiring
from bridge.consumer.sources.eventhubs import run_eventhubs
from bridge.consumer.sources.hub import run_local
from bridge.logfile import setup_logging
from bridge.outbox.delivery import Delivery, interruptible_wait
from bridge.outbox.spool import Spool, SpoolError
from bridge.redact import describe
from bridge.retry import DeliveryError
from bridge.sinks import Sink, build

log = logging.getLogger(__name__)


class PoisonFile:
    """Messages that are not records (malformed, invalid against the schema, oversized, or
    from another VM), kept whole with the reason in a JSONL file beside the state: the
    consumer's dead-letter store. A sample line:

        {"partition": "3", "offset": "118", "reason": "not valid against record.schema.json:
         RecordType must be one of [...], got 'Evil'", "body": "{...}"}
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, partition: str, offset: str, body: str, reason: str) -> None:
        entry = {"partition": partition, "offset": offset, "reason": reason, "body": body}
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
        log.warning("set aside the message at offset %s of partition %s in %s: it is not a "
                    "record (%s)", offset, partition, self.path, reason)  # fmt: skip


class ConsumerService:
    """The worker: decisions spool and delivery, the consumer core, and its re-evaluation timer."""

    def __init__(self, config: Config, *, extra_sinks: Sequence[Sink] = ()) -> None:
        self.config = config
        state_dir = config.agent.state_dir
        host.private_directory(state_dir)
        self.sinks = [build(spec, config) for spec in wiring.decision_sinks(config)] + list(
            extra_sinks
        )
        self.spool = Spool(state_dir / "decisions-spool.db", [s.name for s in self.sinks])
        self.delivery = Delivery(self.spool, self.sinks)
        self.consumer = wiring.build_consumer(config, self._emit)
        self.poison = PoisonFile(state_dir / "poison.jsonl")

    def _emit(self, records: list[dict[str, Any]]) -> None:
        self.spool.commit(records)

    def _process(self, records: list[dict[str, Any]]) -> None:
        """Records valid against the schema go to the consumer; the rest to the dead letters.

        A retried batch sets the same invalid record aside again: a duplicate line in
        poison.jsonl, never a lost one.
        """
        valid = []
        for record in records:
            problem = validation.problem(record)
            if problem is None:
                valid.append(record)
                continue
            reason = f"not valid against record.schema.json: {problem}"
            self.poison("?", f"RecordId {record.get('RecordId')}", json.dumps(record), reason)
        if valid:
            self.consumer.process(valid)

    def run(self, stop: threading.Event) -> int:
        self.delivery.start()
        timer = threading.Thread(target=self._ticks, args=(stop,), name="se-bridge reevaluate")
        timer.start()
        log.info("consuming from %s; policy: %s; decisions to %s", self._source(),
                 self.consumer.policy.source, ", ".join(s.name for s in self.sinks))  # fmt: skip
        try:
            self._read(stop)
        finally:
            stop.set()
            timer.join()
            self.close()
        return 0

    def _read(self, stop: threading.Event) -> None:
        if self.config.consumer.hub is not None:
            run_local(self.config.consumer.hub, self._process, stop, poison=self.poison,
                      group=self.config.consumer.consumer_group)  # fmt: skip
            return
        settings = self.config.consumer
        run_eventhubs(self.config, self._process, stop, poison=self.poison,
                      load_balancing_interval=settings.load_balancing_interval,
                      checkpoint_interval=settings.checkpoint_interval)  # fmt: skip

    def _ticks(self, stop: threading.Event) -> None:
        while not stop.is_set():
            interruptible_wait(stop, self.config.consumer.reevaluate_interval)
            try:
                self.consumer.tick()
            except Exception as err:
                log.warning("re-evaluating deferred events failed (%s); trying again in %gs",
                            err, self.config.consumer.reevaluate_interval)  # fmt: skip

    def _source(self) -> str:
        if self.config.consumer.hub is not None:
            return f"the local hub {self.config.consumer.hub}"
        return f"event hub {self.config.eventhubs.name or '(from the connection string)'}"

    def close(self) -> None:
        if not self.delivery.flush(timeout=10.0):
            log.warning("%d Decision records not yet delivered stay in the spool %s",
                        self.spool.depth(), self.spool.path)  # fmt: skip
        self.delivery.stop(timeout=5.0)
        self.spool.close()
        self.consumer.close()


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "consume", help="apply the approval policy to the fleet's records (runs until stopped)"
    )
    p.add_argument("--config", type=Path, help="TOML settings file")
    p.add_argument("--state-dir", type=Path, help="decisions spool and default state directory")
    p.add_argument("--hub", type=Path, metavar="DIR", help="read a local hub, not Event Hubs")
    p.add_argument(
        "--commands", metavar="SPEC", help="where approvals go: local:DIR or storagequeue"
    )
    p.add_argument("--state", metavar="SPEC", help="fleet state: sqlite:PATH or tables")
    p.add_argument("--policy", type=Path, metavar="FILE", help="approval policy (YAML)")
    p.add_argument(
        "--sink", action="append", metavar="SPEC", help="where Decision records go; repeatable"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    host.install_stop_handler(stop.set)
    host.restrict_new_files()
    flags = {
        "agent.state_dir": args.state_dir,
        "consumer.hub": args.hub,
        "commands.channel": args.commands,
        "consumer.state": args.state,
        "consumer.policy": args.policy,
        "consumer.sinks": args.sink,
        "agent.log_level": args.log_level,
        "agent.log_format": args.log_format,
    }
    try:
        config = wiring.load_config(args.config, flags=flags)
        setup_logging(config.agent.log_level, fmt=config.agent.log_format, program="consumer")
        warn_if_secrets_readable(args.config)
        service = ConsumerService(config)
    except ConfigError as err:
        print(f"se-bridge: configuration error: {err}", file=sys.stderr)
        return 2
    except (SpoolError, DeliveryError, OSError) as err:
        print(f"se-bridge: cannot start the consumer: {describe(err)}", file=sys.stderr)
        return 1
    return service.run(stop)
