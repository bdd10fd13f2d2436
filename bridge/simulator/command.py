"""A local Azure IMDS that behaves like the real one: `se-bridge simulate`.

In-process use and addressing: see the package (bridge.simulator).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from bridge.simulator import scenarios
from bridge.simulator.core import Simulator
from bridge.simulator.faults import FaultError, FaultPlan, Faults, fields_from_json
from bridge.simulator.fleet import Fleet, SimulationError
from bridge.simulator.server import SimulatorServer
from bridge.simulator.vms import FleetSpecError, demo_vms, load_fleet_file, numbered_vms

logger = logging.getLogger("bridge.simulator")

_FAULT_FLAGS = (
    ("--latency", "latency", "seconds added to every IMDS response"),
    ("--rate-429", "rate_429", "share (0..1) of IMDS requests answered 429 with Retry-After"),
    ("--rate-410", "rate_410", "share answered 410 Gone"),
    ("--rate-500", "rate_500", "share answered 500"),
    ("--rate-503", "rate_503", "share answered 503"),
    ("--retry-after", "retry_after", "Retry-After seconds sent with 429 (default 1)"),
    ("--first-call-delay", "first_call_delay", "the first call after start/reset waits this long"),
    ("--rate-not-json", "rate_not_json", "share of 200 bodies that are not JSON"),
    ("--rate-not-document", "rate_not_document", "share of 200 bodies that are not a document"),
    ("--rate-no-instance", "rate_no_instance", "share of instance metadata requests answered 404"),
    ("--drip", "drip", "seconds between the bytes of every 200 body (a stalled IMDS)"),
    ("--rate-endless", "rate_endless", "share of 200 bodies that never end"),
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `simulate` sub-command to an argparse subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="run a local Azure IMDS with a simulated fleet",
        description="Serve a simulated Azure IMDS (Scheduled Events, instance metadata, "
        "managed identity tokens) for a fleet of VMs, with a control API under /control.",
        epilog="""examples:
  se-bridge simulate --vms 3 --port 8080
  se-bridge simulate --fleet fleet.json --time-scale 60 --scenario live-migration
  se-bridge simulate --vms 2 --rate-503 0.2 --vm-fault vm-1:latency=11
""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8080, help="main port (default 8080; 0 = any free port)"
    )
    fleet = parser.add_mutually_exclusive_group()
    fleet.add_argument("--vms", type=int, metavar="N", help="N standalone VMs vm-0..vm-N-1")
    fleet.add_argument("--fleet", metavar="FILE", help="JSON fleet file (see bridge.simulator.vms)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="divide every duration by X (default %(default)g)",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        choices=scenarios.names(),
        metavar="NAME",
        help=f"run a scenario at start (repeatable): {', '.join(scenarios.names())}",
    )
    parser.add_argument("--per-vm-ports", action="store_true", help="also serve VM i on port+1+i")
    parser.add_argument("--seed", type=int, default=0, help="seed for names, ids and faults")
    parser.add_argument(
        "--approval-delay",
        type=float,
        default=0.0,
        metavar="S",
        help="simulated seconds from an approval to Started (default 0)",
    )
    for flag, dest, text in _FAULT_FLAGS:
        parser.add_argument(flag, dest=dest, type=float, default=None, metavar="X", help=text)
    parser.add_argument(
        "--vm-fault",
        action="append",
        default=[],
        metavar="VM:KEY=VALUE",
        help="a fault for one VM only, e.g. web_0:rate503=0.5 (repeatable)",
    )
    parser.set_defaults(func=run)
    return parser


def build_simulator(args: argparse.Namespace) -> Simulator:
    """The Simulator the `simulate` flags describe; raises ValueError naming a bad flag."""
    if args.fleet:
        vms = load_fleet_file(args.fleet, args.seed)
    elif args.vms is not None:
        if args.vms < 1:
            raise FleetSpecError("--vms must be at least 1")
        vms = numbered_vms(args.vms, args.seed)
    else:
        vms = demo_vms(args.seed)
    if args.time_scale <= 0:
        raise SimulationError("--time-scale must be greater than 0")
    fleet = Fleet(
        vms, time_scale=args.time_scale, seed=args.seed, approval_delay=args.approval_delay
    )
    values = {
        dest: getattr(args, dest) for _, dest, _ in _FAULT_FLAGS if getattr(args, dest) is not None
    }
    plan = FaultPlan(Faults(**fields_from_json(values)), seed=args.seed)
    for item in args.vm_fault:
        vm, key, value = _parse_vm_fault(item)
        fleet.vm(vm)
        plan.set({key: value}, vm)
    return Simulator(fleet, plan)


def _parse_vm_fault(item: str) -> tuple[str, str, float]:
    vm, _, setting = item.partition(":")
    key, _, value = setting.partition("=")
    try:
        return vm, key, float(value)
    except ValueError:
        raise FaultError(f"--vm-fault {item!r}: use VM:KEY=VALUE, e.g. web_0:rate503=0.5") from None


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (or SIGBREAK on Windows); 0 then, 2 on a bad setting."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        simulator = build_simulator(args)
    except (OSError, ValueError) as exc:
        print(f"se-bridge simulate: {exc}", file=sys.stderr)
        return 2
    server = SimulatorServer(simulator, args.host, args.port, per_vm_ports=args.per_vm_ports)
    try:
        server.start()
    except OSError as exc:
        where = f"{args.host}:{args.port}"
        print(
            f"se-bridge simulate: cannot listen on {where} ({exc}); choose another --port",
            file=sys.stderr,
        )
        return 2
    try:
        # Stopping on a signal from before the first line: whoever read it may signal at once.
        with _stopped_by_signals() as stop:
            _announce(server)
            for name in args.scenario:
                ids = simulator.run_scenario(name)
                print(f"scenario {name}: {', '.join(ids) or 'no event (reset only)'}", flush=True)
            # A timed wait keeps the main thread responsive to signals on Windows too.
            while not stop.wait(0.2):
                pass
    except SimulationError as exc:
        print(f"se-bridge simulate: {exc}", file=sys.stderr)
        return 2
    finally:
        server.stop()
    logger.info("IMDS simulator stopped.")
    return 0


def _announce(server: SimulatorServer) -> None:
    sim = server.simulator
    print(
        f"IMDS simulator for {len(sim.vm_names)} VMs at {server.url} "
        f"(time scale {sim.fleet.time_scale:g}); control API: {server.url}/control/fleet",
        flush=True,
    )
    own = server.vm_port_urls
    width = max(len(name) for name in sim.vm_names)
    for name in sim.vm_names:
        extra = f"  own port: {own[name]}" if name in own else ""
        print(f"  {name:<{width}}  {server.vm_url(name)}{extra}", flush=True)
    print("Use a VM's URL as the agent's --imds-url. Stop with Ctrl-C.", flush=True)


@contextmanager
def _stopped_by_signals() -> Iterator[threading.Event]:
    """An event that SIGINT, SIGTERM (or SIGBREAK on Windows) set; their handlers restored after."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {}
    for name in ("SIGINT", "SIGTERM", "SIGBREAK"):
        number = getattr(signal, name, None)
        if number is not None:
            previous[number] = signal.signal(number, on_signal)
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
