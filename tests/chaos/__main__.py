"""`python -m tests.chaos` (or `./dev chaos`): the long chaos run, then the fuzz suite.

    ./dev chaos [--cycles 200] [--seed 7] [--report chaos-report.txt] [--fuzz-examples 2000]
                [--drain-cycles 20]

Prints the invariant report and writes it to --report; exits 1 when an invariant broke or
a fuzz test failed. `--fuzz-examples 0` skips the fuzz suite, `--cycles 0` the chaos run,
`--drain-cycles 0` its drain case (Kubernetes nodes, tests/chaos/drains.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.chaos.drains import run_drain_chaos
from tests.chaos.run import run_chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--cycles", type=int, default=200, help="SIGKILL cycles (default 200)")
    parser.add_argument("--drain-cycles", type=int, default=20,
                        help="cycles of the drain case (default 20)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--report", type=Path, default=Path("chaos-report.txt"))
    parser.add_argument("--fuzz-examples", type=int, default=2000, help="per fuzz test")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    texts, failed = [], False
    for runner, cycles in ((run_chaos, args.cycles), (run_drain_chaos, args.drain_cycles)):
        if cycles > 0:
            workdir = Path(tempfile.mkdtemp(prefix="se-bridge-chaos-"))
            report = runner(workdir, cycles=cycles, seed=args.seed)
            kept = workdir if args.keep else "(removed)"
            texts.append(report.text() + f"\n  working directory: {kept}\n")
            print(texts[-1])
            failed = failed or bool(report.problems)
            if not args.keep:
                subprocess.run(["rm", "-rf", str(workdir)], check=False)
    if texts:
        args.report.write_text("\n".join(texts), encoding="utf-8")
    if args.fuzz_examples > 0:
        env = {**os.environ, "SE_BRIDGE_FUZZ_EXAMPLES": str(args.fuzz_examples)}
        fuzz = subprocess.run([sys.executable, "-m", "pytest", "-q", "-W", "error", "tests/fuzz"],
                              env=env, check=False)  # fmt: skip
        failed = failed or fuzz.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
