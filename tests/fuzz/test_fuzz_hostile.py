"""Hostile neighbours, fuzzed: what answers at IMDS's address, and what a local user puts in a
command channel directory. Whatever they do, the agent gets a bridge.retry failure or good
data, within its deadline and its memory cap, and touches nothing that is not a command file.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.agent import imds
from bridge.channels.local import LocalInbox, LocalSender
from bridge.retry import DeliveryError
from tests.fuzz.strategies import FUZZ
from tests.support.channel_contract import command, new_vm

DEADLINE = 0.5
CAP = imds.MAX_BODY["scheduledevents"]

# What a hostile or broken server sends: headers (with a Content-Length that may lie, or
# chunked), then pieces of body with pauses between them, then it may hang up.
answers = st.fixed_dictionaries(
    {
        "status": st.sampled_from([200, 200, 200, 404, 500]),
        "framing": st.sampled_from(["length", "lying-length", "chunked", "close"]),
        "size": st.sampled_from([0, 10, 1000, CAP - 1, CAP + 1, 3 * CAP]),
        "pause": st.sampled_from([0.0, 0.0, 0.02, 0.2]),
        "pieces": st.integers(1, 8),
        "hang_up_early": st.booleans(),
    }
)


class OneAnswer:
    """A loopback server that gives exactly one scripted answer, then stops by itself."""

    def __init__(self, answer: dict[str, object]) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        a = self.answer
        size, pieces, pause = int(str(a["size"])), int(str(a["pieces"])), float(str(a["pause"]))
        body = b"{" + b" " * max(0, size - 2) + b"}" if size >= 2 else b"x" * size
        head = f"HTTP/1.1 {a['status']} X\r\n"
        if a["framing"] == "length":
            head += f"Content-Length: {len(body)}\r\n"
        elif a["framing"] == "lying-length":
            head += f"Content-Length: {len(body) * 2 + 1}\r\n"
        elif a["framing"] == "chunked":
            head += "Transfer-Encoding: chunked\r\n"
        else:
            head += "Connection: close\r\n"
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(head.encode() + b"\r\n")
                step = max(1, len(body) // pieces)
                for start in range(0, len(body), step):
                    piece = body[start : start + step]
                    if a["framing"] == "chunked":
                        piece = b"%x\r\n%s\r\n" % (len(piece), piece)
                    conn.sendall(piece)
                    if a["hang_up_early"] and start > 0:
                        return
                    time.sleep(pause)
                if a["framing"] == "chunked":
                    conn.sendall(b"0\r\n\r\n")
            except OSError:
                return  # the client hung up: allowed

    def close(self) -> None:
        self.sock.close()
        self.thread.join(5)


# Each example may take up to the deadline: a tenth of the suite's examples.
@settings(FUZZ, max_examples=max(10, (FUZZ.max_examples or 100) // 10),
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(answer=answers)
def test_whatever_answers_at_imds_gives_data_or_a_retry_failure_in_time(
    answer: dict[str, object],
) -> None:
    server = OneAnswer(answer)
    client = imds.ImdsClient(server.url, timeout=DEADLINE, first_call_timeout=DEADLINE)
    began = time.monotonic()
    try:
        body = client.scheduled_events()
    except DeliveryError:
        pass  # a retry failure: the poll loop backs off and reports it
    else:
        assert len(body) <= CAP
        assert answer["status"] == 200
    finally:
        client.close()
        server.close()
    assert time.monotonic() - began < DEADLINE + 1.5


# --- a hostile local channel directory --------------------------------------------------------

entries = st.lists(
    st.tuples(
        st.sampled_from(["file", "link-file", "link-dir", "dir", "fifo", "garbage"]),
        st.binary(max_size=64),
    ),
    max_size=8,
)


@pytest.mark.skipif(os.name != "posix", reason="links, pipes and modes are POSIX's")
@settings(FUZZ, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(planted=entries)
def test_a_channel_full_of_strange_entries_yields_only_command_files(
    tmp_path_factory: pytest.TempPathFactory, planted: list[tuple[str, bytes]]
) -> None:
    root = tmp_path_factory.mktemp("hostile")
    directory, victim = root / "commands", root / "victim"
    victim.mkdir()
    (victim / "keep").write_bytes(b"precious")
    vm = new_vm()
    LocalSender(directory).send(command(vm), 60)
    folder = directory / vm.lower()
    strange: list[Path] = []
    for n, (kind, data) in enumerate(planted):
        path = folder / f"{kind}-{n}.json"
        if kind == "link-file":
            path.symlink_to(victim / "keep")
        elif kind == "link-dir":
            path.symlink_to(victim, target_is_directory=True)
        elif kind == "dir":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path.write_bytes(data)  # a file of garbage: handed over, refused by the agent
            continue
        strange.append(path)
    inbox = LocalInbox(directory, vm, 30.0)
    received = inbox.receive(50)
    for message in received:
        inbox.delete(message)
    assert len(received) == 1 + sum(kind in ("file", "garbage") for kind, _ in planted)
    assert all(os.path.lexists(p) for p in strange)  # skipped, never removed or renamed
    assert (victim / "keep").read_bytes() == b"precious"
    assert [p.name for p in victim.iterdir()] == ["keep"]
    assert stat.S_ISDIR(os.lstat(folder).st_mode)
