"""`se-bridge policy check FILE` and `se-bridge policy explain`: a policy checked, and one
event's decision explained, with the consumer's own code (docs/policy.md#checking-a-policy).

`explain` asks the consumer core what a pass would decide now (`Consumer.explain`), so it
says exactly what the consumer says: which rule matched, why every earlier rule did not, the
action's gate, and which budget allowed or deferred it. An event that has started or is over
has nothing left to decide: it is explained by the decision it stood on, as it was taken. It
writes nothing a consumer reads:

- `--state SPEC` (or the config's consumer.state) reads a consumer's fleet state, read only;
- `--records FILE` folds the records of a JSON or JSONL file (what an agent's jsonl sink
  holds, or one record) into a throwaway state first, and looks at them as of the newest
  record's TimeGenerated, so a record from yesterday is explained as it was decided then. An
  event that is over by then is explained by the file's last Decision record about it, or,
  with none, by replaying the records in order through a throwaway shadow consumer.

Exit codes: 0 explained (or the policy is valid), 2 bad input (a policy, a setting, a file
that holds no record, an event the state does not hold), 1 the state could not be read.
"""

from __future__ import annotations

import argparse
import json
import marshal
import mmap
import os
import pickle
import queue
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, cast

from bridge import recordtypes as rt
from bridge import schema
from bridge.commands.message import Command
from bridge.config import Config, ConfigError, given
from bridge.consumer import armcarrier, validation, wiring
from bridge.consumer import documents as fs
from bridge.consumer.command import LOOK_FLAGS
from bridge.consumer.core import Consumer, Explained
from bridge.consumer.replay import History, Replayer, collector_off
from bridge.consumer.state.memory import MemoryStore
from bridge.policy.model import EventView, Policy
from bridge.records import RecordView, is_decision, is_event, iso, parse_time, utc_now
from bridge.redact import describe
from bridge.retry import DeliveryError


class NoCommands:
    """Explaining (or `status --consumer`) sends nothing; a consumer built for it never gets
    this far."""

    def send(self, command: Command, time_to_live: float) -> None:
        raise AssertionError("a consumer that only looks sends no command")

    def close(self) -> None:
        pass


def run_explain(args: argparse.Namespace) -> int:
    try:
        config = wiring.load_config(args.config, flags=given(args, *LOOK_FLAGS))
        policy = wiring.load_policy(config.consumer.policy)
        if args.records is not None:
            event_id, found = _from_records(args.records, args.event, policy, config)
        else:
            event_id, found = _from_state(args.event, policy, config)
    except ConfigError as err:
        print(f"se-bridge: {err}", file=sys.stderr)
        return 2
    except (DeliveryError, OSError) as err:
        print(f"se-bridge: cannot read the fleet state: {describe(err)}", file=sys.stderr)
        return 1
    if found is None:
        print(f"se-bridge: the fleet state holds no event {event_id}", file=sys.stderr)
        return 2
    print(render(found, policy, as_json=args.json))
    return 0


Found = Explained | None


def _from_records(
    path: Path, event: str | None, policy: Policy, config: Config
) -> tuple[str, Found]:
    records = read_records(path)
    event_id = event or last_event(records)
    at = newest(records)
    consumer = Consumer(
        MemoryStore(), NoCommands(), policy, ignore_decisions, config.consumer, now=lambda: at
    )
    consumer.decider.last_resort = armcarrier.wanted(config)  # ARM's acknowledge, as the live one
    try:
        consumer.fold(records)
        found = consumer.explain(event_id)
    finally:
        consumer.close()
    if found is None or found.verdict is not None:
        return event_id, found
    taken = last_decision(records, event_id)
    if taken is not None:
        return event_id, replace(found, taken=taken)
    replayed = _replay(records, event_id, policy, config)
    return event_id, replace(found, taken=replayed, replayed=True)


def last_decision(records: Sequence[rt.Record], event_id: str) -> fs.StandingDecision | None:
    """The last Decision record about `event_id` in `records` (an export of the consumer's
    records, say), as the event document keeps a decision; None when there is none."""
    key = fs.event_key(event_id)
    mine = [r for r in records if is_decision(r) and fs.event_key(r["EventId"]) == key]
    if not mine:
        return None
    # Of records written in the same millisecond, the one written last (the export's order).
    last = max(reversed(mine), key=lambda r: str(r.get("TimeGenerated")))
    return {
        "kind": str(last["DecisionAction"]),
        "rule": str(last["DecisionRule"]),
        "reason": str(last["DecisionReason"]),
        **({"target": str(last["TargetVmId"])} if last.get("TargetVmId") else {}),
        **({"override": True} if last.get("BudgetOverride") is True else {}),
        "at": str(last["TimeGenerated"]),
        "explanation": str(last.get("DecisionExplanation") or "").splitlines(),
    }


def _replay(
    records: Sequence[rt.Record], event_id: str, policy: Policy, config: Config
) -> fs.StandingDecision | None:
    """The decision `event_id` stood on once a consumer had read `records` as they came: in
    TimeGenerated order, on a clock at each one's time (`policy replay`'s Replayer: it
    decides and sends nothing)."""
    history = History.of(records)
    if not history.agents:
        return None
    start = parse_time(history.agents[0].get("TimeGenerated")) or newest(records)
    replayer = Replayer(policy, config.consumer, start, last_resort=armcarrier.wanted(config))
    try:
        replayer.feed(history.agents)
        found = replayer.consumer.explain(event_id)
    finally:
        replayer.close()
    return found.taken if found is not None else None


def _from_state(event: str | None, policy: Policy, config: Config) -> tuple[str, Found]:
    if not event:
        raise ConfigError("--event EVENTID: which event of the fleet state to explain")
    store = wiring.build_store(wiring.state_spec(config), config)
    # The key verifies what people decided (bridge.consumer.people.operatorlog); without it their
    # decisions and pauses cannot be told from forgeries, and are left out.
    try:
        signer = wiring.load_signer(config)
        trusted = wiring.load_previous_keys(config)
    except ConfigError:
        signer, trusted = None, []
    # Read-only: what a previous key signed is explained as the consumer applies it.
    consumer = Consumer(
        store,
        NoCommands(),
        policy,
        ignore_decisions,
        config.consumer,
        signer=signer,
        trusted=trusted,
        sign_again=False,
    )
    consumer.decider.last_resort = armcarrier.wanted(config)  # ARM's acknowledge, as the live one
    try:
        return event, consumer.explain(event)
    finally:
        consumer.close()


def ignore_decisions(records: Sequence[RecordView]) -> None:
    """Explaining (or `status --consumer`) decides nothing, so it emits no Decision record."""


# A records file as an agent's jsonl sink writes it (one record a line), for example:
#   {"SchemaVersion": 1, "RecordId": "5f0c...", "RecordType": "Event", "EventId": "C7061BAC-...",
#    "EventType": "Reboot", "EventStatus": "Scheduled", "Resources": ["web_0"], ...}
# or a Log Analytics export, the table's rows as az prints them (bridge.schema.record_from_row).
def read_records(path: Path) -> list[rt.Record]:
    """The records in a JSON (one record or a list) or JSONL file, or a Log Analytics export
    of whole rows; ConfigError when none, or when one lacks a field or is refused."""
    records = records_in(path)
    if not any(is_event(r) for r in records):
        raise ConfigError(f"--records {path} holds no Event record")
    return records


@dataclass(frozen=True)
class SetAside:
    """A record of a --records file left out, and why (a replay goes on without it, as the
    live consumer sets a refused record aside: docs/policy.md#replaying-history)."""

    path: Path
    number: int  # the line of a JSONL file, the item of a JSON list
    where: str  # "line" or "record"
    record_id: str | None
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.where} {self.number} {self.reason}"


def records_in(path: Path, aside: list[SetAside] | None = None) -> list[rt.Record]:
    """`read_records` of a file that may hold no Event record (a consumer's decisions).

    Without `aside`, a record that is not one (not JSON, lacking a field, refused) is a
    ConfigError; with it, the record is added there (in file order) and the others are read.
    """
    left: list[SetAside] | None = None if aside is None else []
    with collector_off():  # a file of a million records: see collector_off
        records = _records_in(path, left)
    if aside is not None and left:
        aside += sorted(left, key=lambda a: a.number)
    return records


def _records_in(path: Path, aside: list[SetAside] | None) -> list[rt.Record]:
    text = _text_of(path)
    try:
        parsed = json.loads(text)
    except ValueError:
        return _jsonl(path, text, aside)
    values = [(n, v) for n, v in enumerate(parsed if isinstance(parsed, list) else [parsed], 1)]
    records: list[rt.Record] = []
    for number, value in values:
        record, reason = _checked(value)
        if reason is None:
            records.append(cast(rt.Record, record))  # the schema says it is one
            continue
        if aside is None:
            raise ConfigError(f"--records {path}: record {number} {reason}")
        record_id = record.get("RecordId") if isinstance(record, dict) else None
        aside.append(SetAside(path, number, "record", _text(record_id), reason))
    return records


def _text_of(path: Path) -> str:
    try:
        # Decoded whole, without read_text's newline translation (a tenth of reading a large
        # file): splitlines splits at "\r" and "\r\n" as at "\n", and JSON reads both as
        # the space they are between values; inside a text, either is refused alike.
        return _decoded(path, path.read_bytes(), 0)
    except OSError as err:
        raise ConfigError(f"cannot read --records {path}: {err.strerror or err}") from err


def _decoded(path: Path, data: bytes, offset: int) -> str:
    """`data`, the bytes of `path` from `offset` on, as text; ConfigError where it is not
    UTF-8 (as JSON is written), naming the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[err.start : err.start + 1].hex()
        raise ConfigError(
            f"--records {path} is not UTF-8 text (JSON's encoding): byte 0x{bad} at offset "
            f"{offset + err.start} {err.reason}"
        ) from None


# A JSONL file of more characters than this (some 60,000 records) is read by two processes,
# on two cores (issue 40: `policy replay` of a million records in under a minute): this one
# reads the first lines while a helper reads the others and sends back their records, which
# this one loads in a fifth of the time it takes to read them (docs/benchmarks.md, 13).
SPLIT_CHARS = 50_000_000
# The helper's share of the file: this one also loads what the helper sends.
HELPER_SHARE = 0.55


@dataclass
class _Lines:
    """What reading some lines of a JSONL file found, in the order of the lines: the records,
    how many lines were JSON, the lines that are not (line, error) and the records refused
    (line, RecordId, reason). Reading for an error (`strict`) stops at the first one."""

    records: list[rt.Record]
    decoded: int
    not_json: list[tuple[int, ValueError]]
    refused: list[tuple[int, str | None, str]]

    def after(self, lines: int) -> _Lines:
        """These, numbered as lines after `lines` others."""
        self.not_json = [(n + lines, err) for n, err in self.not_json]
        self.refused = [(n + lines, record_id, why) for n, record_id, why in self.refused]
        return self


def _jsonl(path: Path, text: str, aside: list[SetAside] | None) -> list[rt.Record]:
    strict = aside is None
    # Cut after a "\n", which ends a line wherever it is (after a "\r" too: "\r\n" ends
    # one line): the lines of the two parts are the lines of the whole, in order.
    cut = text.find("\n", int(len(text) * (1 - HELPER_SHARE))) + 1 if len(text) > SPLIT_CHARS else 0
    if not 0 < cut < len(text):
        return _merged(path, [_read_lines(text.splitlines(), strict)], strict, aside)
    helper = _Helper(text, cut, strict)
    try:
        lines = text[:cut].splitlines()
        parts = [_read_lines(lines, strict)]
        if not (strict and parts[0].not_json):
            parts.append(helper.result().after(len(lines)))
    finally:
        helper.close()
    return _merged(path, parts, strict, aside)


def _merged(
    path: Path, parts: list[_Lines], strict: bool, aside: list[SetAside] | None
) -> list[rt.Record]:
    """The records of `parts` (a file's lines in order), or the error the first line not
    JSON or refused makes; with `aside`, those lines set aside."""
    not_json = [bad for part in parts for bad in part.not_json]
    refused = [bad for part in parts for bad in part.refused]
    if not_json and (strict or not any(part.decoded for part in parts)):
        err = not_json[0][1]
        raise ConfigError(f"--records {path} is neither JSON nor JSONL: {err}") from err
    if strict and refused:
        number, _, reason = refused[0]
        raise ConfigError(f"--records {path}: line {number} {reason}")
    if aside is not None:
        aside += [SetAside(path, n, "line", None, f"is not JSON: {err}") for n, err in not_json]
        aside += [SetAside(path, n, "line", record_id, why) for n, record_id, why in refused]
    return [record for part in parts for record in part.records]


def _read_lines(lines: list[str], strict: bool) -> _Lines:
    """`lines` (numbered from 1), JSON then the record check."""
    values: list[tuple[int, object, bool]] = []  # number, value, plain (_LineReader)
    found = _Lines([], 0, [], [])
    reader = _LineReader()
    for number, line in enumerate(lines, 1):
        if not line or line.isspace():  # blank: strip() would copy every line
            continue
        try:
            value, plain = reader.read(line)
        except ValueError as err:
            found.not_json.append((number, err))
            if strict:
                return found
            continue
        if type(value) is dict:
            # One string of each field name, not one a record: a million records' names
            # were half their memory, which a large replay spent a tenth of its time getting
            # from the system (docs/benchmarks.md, 13). Equal, in the same order.
            value = {sys.intern(key): item for key, item in value.items()}
        values.append((number, value, plain))
    found.decoded = len(values)
    for number, value, plain in values:
        record, reason = _checked(value, plain=plain)
        if reason is None:
            found.records.append(cast(rt.Record, record))  # the schema says it is one
            continue
        record_id = record.get("RecordId") if isinstance(record, dict) else None
        found.refused.append((number, _text(record_id), reason))
        if strict:
            break
    return found


class _Helper:
    """A forked process reading the lines of `text` from `cut` on (`_read_lines`), its records
    sent back marshalled (their field names interned, as `_read_lines` makes them: loaded,
    they make one string of each, not one a record), the rest pickled. Where it cannot (no
    fork, it failed, it died), this process reads them itself: the same lines, the same way."""

    def __init__(self, text: str, cut: int, strict: bool) -> None:
        self._text: str | None = text  # for reading the lines here, if the helper does not
        self._cut, self._strict = cut, strict
        self._pid: int | None = None
        self._pipe: int | None = None
        if not hasattr(os, "fork"):
            return
        readable, writable = os.pipe()
        pid = os.fork()
        if pid == 0:  # the helper: never returns to the caller
            status = 1
            try:
                os.close(readable)
                with open(writable, "wb") as out:
                    out.write(_helped(text[cut:], strict))
                status = 0
            finally:
                os._exit(status)
        os.close(writable)
        self._pid, self._pipe = pid, readable

    def result(self) -> _Lines:
        if self._pipe is not None:
            with open(self._pipe, "rb") as sent:
                self._pipe = None
                payload = sent.read()
            if self._wait() == 0 and payload:
                self._text = None
                return _unpacked(payload)
        assert self._text is not None, "read once"
        text, self._text = self._text, None
        return _read_lines(text[self._cut :].splitlines(), self._strict)

    def close(self) -> None:
        self._text = None
        if self._pipe is not None:  # not waited for: this process found the error first
            os.close(self._pipe)
            self._pipe = None
        if self._pid is not None:
            with suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            self._wait()

    def _wait(self) -> int:
        pid, self._pid = self._pid, None
        if pid is None:
            return -1
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _helped(text: str, strict: bool) -> bytes:
    """What the helper sends: `_read_lines` of the lines of `text`, packed."""
    return _packed(_read_lines(text.splitlines(), strict))


def _packed(found: _Lines) -> bytes:
    records = found.records
    try:
        packed = b"m" + marshal.dumps(records)
    except ValueError:  # a value marshal does not know: pickle knows every one the check lets by
        packed = b"p" + pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)
    found.records = []
    rest = pickle.dumps(found, protocol=pickle.HIGHEST_PROTOCOL)
    return len(rest).to_bytes(8, "big") + rest + packed


def _unpacked(payload: bytes) -> _Lines:
    size = int.from_bytes(payload[:8], "big")
    found: _Lines = pickle.loads(payload[8 : 8 + size])  # noqa: S301 - our own helper's
    kind, records = payload[8 + size : 9 + size], memoryview(payload)[9 + size :]
    # Our own helper's bytes, from a pipe only it and this process hold.
    found.records = marshal.loads(records) if kind == b"m" else pickle.loads(records)  # noqa: S301, S302
    return found


# A large JSONL file replayed as it is read (`chunked`): the helper sends the records of the
# lines of about this many bytes at a time (some 10,000 records), the first some 0.3 s
# after it starts; this process reads ahead meanwhile (docs/benchmarks.md, 13).
CHUNK_CHARS = 8_000_000


def chunked(path: Path, aside: list[SetAside]) -> Chunked | None:
    """A --records file of more than SPLIT_CHARS bytes that is JSONL, read for `policy replay`
    to replay its first records while the rest are read (bridge.consumer.replay.replay_chunks);
    None for any other file (`records_in` reads it, as it reads this one)."""
    if not hasattr(os, "fork"):
        return None
    try:
        if path.stat().st_size <= SPLIT_CHARS:
            return None
        with path.open("rb") as file:
            # Mapped, not read: the helper reads the pieces it decodes, and this process the
            # lines that name a decision (a million records' text would be 0.8 GB here).
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None  # records_in says why it cannot be read
    if not _lines_of_values(mapped):
        mapped.close()
        return None
    return Chunked(path, mapped, aside)


_SPACE = re.compile(rb"[ \t\n\r]*")  # JSON's white space, as json.loads skips it


def _lines_of_values(data: mmap.mmap) -> bool:
    """Whether `json.loads` of the whole text fails at the end of a first value that its first
    line holds (a JSONL file: `_records_in` then reads its lines); False where it cannot say
    from the first line (a JSON list, a value over several lines, one line, not UTF-8)."""
    start = _SPACE.match(data).end()  # type: ignore[union-attr] # it matches the empty text
    end = data.find(b"\n", start)
    if end < 0 or data[start : start + 1] == b"[":
        return False
    try:
        first = data[start:end].decode("utf-8")
        _, value_end = json.JSONDecoder().raw_decode(first)
    except ValueError:  # UnicodeDecodeError too
        return False
    # A value within the line ends where it would in the whole text: what follows it decides.
    if first[value_end:].strip(" \t\r"):
        return True
    return _SPACE.match(data, end).end() != len(data)  # type: ignore[union-attr]


class Chunked:
    """A large JSONL file's records, read by a forked helper process CHUNK_CHARS bytes at a
    time and handed over chunk by chunk (`chunks`) as `_jsonl` reads them: the same records,
    the same lines set aside (added to `aside` once every chunk is read), the same errors.
    The replay folds one chunk while the helper reads the next, on the second core (issue 40).
    A thread of this process takes each chunk from the pipe as it comes, so the helper never
    waits for the replay. Where the helper cannot (no fork, it failed, it died), this process
    reads the lines it did not send, the same way.

    `decisions`: the file's Decision records, in file order, read ahead by this process from
    the lines that say "Decision" (a replay needs them from its start). A line that does not
    holds none unless it escapes a letter with \\u; the replay checks them against those
    the chunks hold, and replays again, all at once, where they differ."""

    def __init__(self, path: Path, mapped: mmap.mmap, aside: list[SetAside]) -> None:
        self.path, self._aside = path, aside
        self._mapped = mapped
        self.decisions = _decisions_ahead(mapped)
        self._pid: int | None = None
        self._frames: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._pump: threading.Thread | None = None
        readable, writable = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(readable)
            os.close(writable)
            return  # this process reads every line
        if pid == 0:  # the helper: never returns to the caller
            status = 1
            try:
                os.close(readable)
                with open(writable, "wb") as out:
                    _send_chunks(mapped, out)
                status = 0
            finally:
                os._exit(status)
        os.close(writable)
        self._pid = pid
        self._pump = threading.Thread(
            target=_pump, args=(readable, self._frames), name="se-bridge records", daemon=True
        )
        self._pump.start()

    def chunks(self) -> Iterator[list[rt.Record]]:
        """Every record of the file, in file order, a chunk at a time; then the lines set
        aside go to `aside`. ConfigError, after the last, when no line is JSON; at the first
        byte that is not UTF-8, where there is one."""
        parts: list[_Lines] = []
        lines = done = 0  # the lines read, and the bytes they are
        try:
            while self._pump is not None and (frame := self._frames.get()) is not None:
                count, done = (int.from_bytes(frame[n : n + 8], "big") for n in (0, 8))
                found = _unpacked(frame[16:]).after(lines)
                lines += count
                yield self._handed(found, parts)
            if self._wait() != 0:  # the lines the helper did not send, read here
                for start, end in _pieces(self._mapped, done):
                    piece = _decoded(self.path, self._mapped[start:end], start).splitlines()
                    yield self._handed(_read_lines(piece, False).after(lines), parts)
                    lines += len(piece)
        finally:
            self.close()
        left: list[SetAside] = []
        _merged(self.path, parts, False, left)
        self._aside += sorted(left, key=lambda a: a.number)

    @staticmethod
    def _handed(found: _Lines, parts: list[_Lines]) -> list[rt.Record]:
        records, found.records = found.records, []
        parts.append(found)
        return records

    def close(self) -> None:
        if self._pid is not None:
            with suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            self._wait()
        if self._pump is not None:
            self._pump.join()  # the pipe's end: the helper is gone
            self._pump = None
        self._mapped.close()

    def _wait(self) -> int:
        pid, self._pid = self._pid, None
        if pid is None:
            return -1
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _pieces(data: mmap.mmap, start: int) -> Iterator[tuple[int, int]]:
    """`data` from `start` cut after a "\\n" every CHUNK_CHARS bytes or so: "\\n" is one
    byte in UTF-8 and ends a line wherever it is (see `_jsonl`), so the lines of the pieces
    are the lines of the whole, in order."""
    while start < len(data):
        end = data.find(b"\n", start + CHUNK_CHARS) + 1 or len(data)
        yield start, end
        start = end


def _send_chunks(data: mmap.mmap, out: BinaryIO) -> None:
    """The helper's work: each piece of `data` read, packed and sent, in order, after the
    count of its lines and where it ends. A piece that is not UTF-8 ends it (exit 1): this
    process says so."""
    for start, end in _pieces(data, 0):
        lines = data[start:end].decode("utf-8").splitlines()
        payload = _packed(_read_lines(lines, False))
        out.write(len(payload).to_bytes(8, "big") + len(lines).to_bytes(8, "big"))
        out.write(end.to_bytes(8, "big"))
        out.write(payload)
        out.flush()


def _pump(readable: int, frames: queue.SimpleQueue[bytes | None]) -> None:
    """The chunks the helper sends, each whole, then None (at the pipe's end, or one cut)."""
    try:
        with open(readable, "rb") as pipe:
            while len(head := pipe.read(8)) == 8:
                size = int.from_bytes(head, "big") + 16  # the line count and the end
                if len(frame := pipe.read(size)) < size:
                    break
                frames.put(frame)
    finally:
        frames.put(None)


def _decisions_ahead(data: mmap.mmap) -> list[rt.Record]:
    """The Decision records of the lines of `data` that say "Decision", in file order, read
    and checked as `_read_lines` reads them (a line that is not UTF-8 is left to it)."""
    found: list[rt.Record] = []
    reader = _LineReader()
    at = 0
    while (hit := data.find(b"Decision", at)) >= 0:
        start = data.rfind(b"\n", 0, hit) + 1
        end = data.find(b"\n", hit)
        end = len(data) if end < 0 else end
        at = end + 1
        try:
            text = data[start:end].decode("utf-8")
        except UnicodeDecodeError:
            continue
        for line in text.splitlines():  # splitlines' lines, as _read_lines'
            if "Decision" not in line:
                continue
            try:
                value, plain = reader.read(line)
            except ValueError:
                continue
            if type(value) is dict:
                value = {sys.intern(key): item for key, item in value.items()}
            record, reason = _checked(value, plain=plain)
            if reason is None and is_decision(cast(rt.Record, record)):
                found.append(cast(rt.Record, record))
    return found


class _LineReader:
    """The lines of a JSONL file decoded as `json.loads` decodes them, each with whether it is
    plain: one JSON value and nothing else, that escapes no character with \\u and holds no
    number with a fraction or an exponent (`validation.problem`'s `plain`)."""

    def __init__(self) -> None:
        self._floats = 0
        # parse_float is called for each number with a fraction or an exponent, and only for
        # those: the one way a float comes out of JSON but NaN and Infinity (parse_constant),
        # which no integer field takes (the schema refuses them).
        self._decoder = json.JSONDecoder(parse_float=self._float)

    def _float(self, text: str) -> float:
        self._floats += 1
        return float(text)

    def read(self, line: str) -> tuple[object, bool]:
        """`json.loads(line)` and whether the line is plain. A line that is one value and
        nothing else skips json.loads' looks around the value (a tenth of reading each line
        of a large --records file); any other goes through json.loads, which says what is
        wrong with it."""
        floats = self._floats
        try:
            value, end = self._decoder.raw_decode(line)
        except ValueError:
            return json.loads(line), False
        if end != len(line):
            return json.loads(line), False
        # The file was read as UTF-8, which holds no lone surrogate: only an escape makes one.
        return value, self._floats == floats and "\\u" not in line


def _checked(
    value: object, *, plain: bool = False
) -> tuple[dict[str, Any], None] | tuple[object, str]:
    """The record `value` (a JSON value read; `plain` as `_LineReader` says) is (made one
    when it is a Log Analytics row), or why it is not one the consumer folds in."""
    if not isinstance(value, dict):
        return value, "is not a JSON object"
    if schema.is_table_row(value):
        # A row's values are text read in their types: a float may come of one.
        record, plain = schema.record_from_row(value), False
    else:
        record = value
    problem = validation.problem(record, plain=plain)
    if problem is None:
        return record, None
    # The schema requires every field: what lacks one is named with what most often left it out.
    missing = [f for f in schema.required_fields(record.get("RecordType")) if f not in record]
    if missing:
        return record, (
            f"lacks {', '.join(missing)}: explain and replay need whole records, every column "
            "(an export of a query that keeps some columns, with project, leaves the rest out; "
            "docs/getting-started.md, step 3, exports them all)"
        )
    return record, f"is refused: {problem}"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def last_event(records: Sequence[rt.Record]) -> str:
    return next(r["EventId"] for r in reversed(records) if is_event(r))


def newest(records: Sequence[rt.Record]) -> datetime:
    times = [parse_time(r.get("TimeGenerated")) for r in records]
    return max((t for t in times if t is not None), default=utc_now())


def render(found: Explained, policy: Policy, *, as_json: bool) -> str:
    view, verdict, taken = found.view, found.verdict, found.taken
    if verdict is not None:
        decided: dict[str, Any] = {
            "DecisionAction": verdict.kind,
            "DecisionRule": verdict.rule,
            "DecisionReason": verdict.reason,
            "TargetVmId": verdict.target,
            "DecisionExplanation": list(verdict.explanation),
            "DecidedAt": None,
        }
    else:
        decided = {
            "DecisionAction": taken.get("kind") if taken else None,
            "DecisionRule": taken.get("rule") if taken else None,
            "DecisionReason": taken.get("reason") if taken else None,
            "TargetVmId": taken.get("target") if taken else None,
            "DecisionExplanation": list(taken.get("explanation", ())) if taken else [],
            "DecidedAt": taken.get("at") if taken else None,
        }
    # Records say null of the status of an event that is gone; Gone is no EventStatus.
    status = None if view.status == fs.GONE else view.status
    people = _people(found)
    if verdict is None:
        # Started or over: the override is the decision's it stood on (issue 37).
        people["BudgetOverride"] = bool(taken and taken.get("override"))
    if as_json:
        return json.dumps(
            {
                "EventId": view.event_id,
                "EventType": view.event_type,
                "EventSource": view.event_source,
                "EventStatus": status,
                **decided,
                **people,
                "Drains": _drains(view),
                "PolicySource": policy.source,
            },
            indent=2,
        )
    lines = [
        f"event {view.event_id}: {view.event_type} from {view.event_source or 'an unknown source'}"
        f", {status or 'over (completed or canceled)'}, NotBefore {view.not_before or 'none'}",
        f"  VMs it names: {', '.join(view.affected) or 'none resolved'}"
        + (f"; unresolved: {', '.join(view.unresolved)}" if view.unresolved else ""),
        *_drain_lines(view),
        *_decision_lines(found),
        *_people_lines(people),
        f"policy: {policy.source}",
        "why:",
        *(f"  {line}" for line in decided["DecisionExplanation"]),
    ]
    return "\n".join(lines)


def _people(found: Explained) -> dict[str, Any]:
    """What people have to do with the decision: the ask (who, since, until), the last
    decision a person made, the pause that stops it (the Decision record's names)."""
    verdict, person = found.verdict, found.view.person
    pause = verdict.pause if verdict else None
    asked = verdict.asked if verdict and verdict.kind == "Ask" else None
    return {
        "AskedTarget": asked,
        "AskedSince": iso(found.view.asked_at) if asked and found.view.asked_at else None,
        "AskDeadline": iso(verdict.ask_deadline)
        if asked and verdict and verdict.ask_deadline
        else None,
        "PersonDecision": None
        if person is None
        else {
            "Kind": person.kind,
            "DecidedBy": person.by.object_id,
            "DecidedByName": person.by.name,
            "OperatorReason": person.reason,
            "At": iso(person.at),
            "OverrideBudget": person.override_budget,
        },
        "BudgetOverride": bool(verdict and verdict.override),
        "Pause": None
        if pause is None
        else {
            "PauseScope": pause.where,
            "PauseUntil": iso(pause.until) if pause.until else None,
            "DecidedBy": pause.by.object_id,
            "DecidedByName": pause.by.name,
            "OperatorReason": pause.reason,
            "At": iso(pause.at),
        },
    }


def _people_lines(people: dict[str, Any]) -> list[str]:
    lines = []
    if people["AskedTarget"]:
        since = people["AskedSince"] or "this pass (not asked yet)"
        until = people["AskDeadline"] or "NotBefore"
        lines.append(f"asked: {people['AskedTarget']} since {since}, waiting until {until}")
    person = people["PersonDecision"]
    if person:
        over = " over the budgets (break-glass)" if person["OverrideBudget"] else ""
        lines.append(
            f"person: {person['Kind']}{over} by {person['DecidedByName']} "
            f"({person['DecidedBy']}) at {person['At']}: "
            f"{person['OperatorReason'] or 'no reason given'}"
        )
    pause = people["Pause"]
    if pause:
        until = f"until {pause['PauseUntil']}" if pause["PauseUntil"] else "until resumed"
        lines.append(
            f"paused: {pause['PauseScope']} by {pause['DecidedByName']} "
            f"({pause['DecidedBy']}) {until}: {pause['OperatorReason']}"
        )
    return lines


def _drains(view: EventView) -> list[dict[str, Any]]:
    """The drain of each VM of the event, as its latest drain record says (issue 30)."""
    return [
        {
            "VmId": vm_id,
            "DrainStatus": drain.status,
            "At": iso(drain.at),
            "BlockedSince": iso(drain.blocked_since) if drain.blocked_since else None,
            "DrainBlockers": [
                {
                    "Namespace": b.namespace,
                    "Pod": b.pod,
                    "Reason": b.reason,
                    "PodDisruptionBudget": b.pdb,
                }
                for b in drain.blockers
            ],
        }
        for vm_id, drain in sorted(view.drains.items())
    ]


def _drain_lines(view: EventView) -> list[str]:
    said = []
    for vm_id, drain in sorted(view.drains.items()):
        line = f"{vm_id} {drain.status}"
        if drain.blocked_since:
            line += f" since {iso(drain.blocked_since)}"
        if drain.blockers:
            count = len(drain.blockers)
            line += f" ({count} {'pod' if count == 1 else 'pods'} in the way)"
        said.append(line)
    return [f"  drains: {'; '.join(said)}"] if said else []


def _decision_lines(found: Explained) -> list[str]:
    if found.verdict is not None:
        verdict = found.verdict
        return [f"decision: {verdict.kind} by {verdict.rule}: {verdict.reason}"]
    since = "had started" if found.view.status == "Started" else "was over"
    taken = found.taken
    if taken is None:
        return [
            f"decision: none: the event {since} when it was first read, so there was "
            "nothing to approve"
        ]
    now = "has started" if found.view.status == "Started" else "is over"
    at = taken.get("at", "an unknown time")
    how = (
        f"as a consumer reading these records would have taken it at {at}"
        if found.replayed
        else f"taken at {at}"
    )
    return [
        f"decision: {taken.get('kind')} by {taken.get('rule')}: {taken.get('reason')}",
        f"  {how}; the event {now} since: nothing is left to decide",
    ]
