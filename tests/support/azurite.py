"""Azurite, Microsoft's Azure Storage emulator (blob, queue, table), run from node_modules.

`./dev test` installs it (package.json). Each test session starts one instance on free
ports, in memory, with telemetry off (otherwise it calls out, 169.254.169.254 included).
Under pytest-xdist every worker is a session of its own, so each worker that runs a test
needing Azurite starts its own, and none waits for another's. Tests share their worker's
instance and keep apart by using their own table, queue and container names.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "node_modules" / ".bin" / "azurite"

# Azurite's one well-known development account (public, documented by Microsoft).
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

_LISTENING = re.compile(r"Azurite (Blob|Queue|Table) service is successfully listening at (\S+)")


class Azurite:
    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._proc: subprocess.Popen[str] | None = None
        self.endpoints: dict[str, str] = {}
        self._output: deque[str] = deque(maxlen=50)

    def start(self, timeout: float = 60.0) -> Azurite:
        if not BINARY.exists() or shutil.which("node") is None:
            raise RuntimeError(
                "Azurite is not installed: run ./dev setup (it needs Node.js and npm)"
            )
        self._workdir.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [str(BINARY), *_ARGS],
            cwd=self._workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "AZURITE_ACCOUNTS": ""},
        )
        ready = threading.Event()
        threading.Thread(target=self._read_output, args=(ready,), daemon=True).start()
        if not ready.wait(timeout):
            self.stop()
            raise RuntimeError("Azurite did not start:\n" + "\n".join(self._output))
        return self

    def _read_output(self, ready: threading.Event) -> None:
        assert self._proc is not None
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._output.append(line.rstrip())
            found = _LISTENING.search(line)
            if found:
                self.endpoints[found.group(1).lower()] = found.group(2).rstrip("/")
                if len(self.endpoints) == 3:
                    ready.set()

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._proc = None

    def endpoint(self, service: str) -> str:
        """http://127.0.0.1:PORT/devstoreaccount1 for "blob", "queue" or "table"."""
        return f"{self.endpoints[service]}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        """A full connection string (the blob checkpoint store insists on BlobEndpoint=)."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.endpoint('blob')};"
            f"QueueEndpoint={self.endpoint('queue')};"
            f"TableEndpoint={self.endpoint('table')};"
        )


_ARGS = [
    "--inMemoryPersistence",
    "--disableTelemetry",
    "--skipApiVersionCheck",
    "--loose",
    "--silent",
    "--extentMemoryLimit",
    "256",
    "--blobPort",
    "0",
    "--queuePort",
    "0",
    "--tablePort",
    "0",
]
