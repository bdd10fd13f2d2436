"""The Dockerfile, read (no Docker engine here), and its install steps run in a clean venv."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from bridge import __version__, host
from bridge.extras import EXTRAS
from tests.support import lock

ROOT = Path(__file__).resolve().parents[2]
VENV = "/opt/se-bridge"  # the image's virtual environment, first on PATH
SECRET_NAME = re.compile(r"KEY|SECRET|PASSWORD|TOKEN|CONNECTION_STRING|SAS", re.IGNORECASE)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


DOCKERFILE_TEXT = (ROOT / "Dockerfile").read_text(encoding="utf-8")
STEPS = instructions(DOCKERFILE_TEXT)


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for step in STEPS:
        if step[0] == "FROM":
            found.append([])
        if found:  # a global ARG before the first FROM belongs to no stage
            found[-1].append(step)
    return found


def test_every_stage_starts_from_the_base_image_pinned_by_digest() -> None:
    [base] = [args for kind, args in STEPS[:1] if kind == "ARG"]
    name, image = base.split("=", 1)
    assert re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", image), image
    assert [s[0][1].split()[0] for s in stages()] == [f"${{{name}}}"] * 2


def test_two_stages_and_the_runtime_takes_only_the_installed_wheels_from_the_build() -> None:
    build, runtime = stages()
    assert build[0][1].endswith(" AS build")
    installs = [args for kind, args in build if kind == "RUN" and " install " in args]
    assert installs
    for install in installs:  # from the downloaded, hash-checked wheels only
        assert "--no-index" in install
    assert [args for kind, args in runtime if kind == "COPY"] == [f"--from=build {VENV} {VENV}"]
    assert not [args for kind, args in runtime if "pip" in args]  # the runtime needs no network


def test_the_final_user_is_numeric_and_not_root() -> None:
    users = [args for kind, args in stages()[-1] if kind == "USER"]
    uid = users[-1].split(":")[0]
    assert uid.isdigit(), users
    assert int(uid) != 0


def test_the_entry_point_is_the_console_script() -> None:
    [entry] = [args for kind, args in STEPS if kind == "ENTRYPOINT"]
    assert json.loads(entry) == ["se-bridge"]
    [env] = [args for kind, args in stages()[-1] if kind == "ENV"]
    assert env.startswith(f"PATH={VENV}/bin:$PATH "), env  # where the console script is
    [cmd] = [args for kind, args in STEPS if kind == "CMD"]
    assert json.loads(cmd) == ["agent"]


def test_no_secret_is_baked_into_the_image() -> None:
    for kind, args in STEPS:
        if kind in ("ENV", "ARG", "LABEL"):
            names = re.findall(r"(\w+)=", args) or [args.split()[0]]
            assert not [n for n in names if SECRET_NAME.search(n)], args


def test_healthcheck_or_the_documented_reason_for_none() -> None:
    [check] = [args for kind, args in STEPS if kind == "HEALTHCHECK"]
    if check.strip().upper() == "NONE":
        assert "# No HEALTHCHECK:" in DOCKERFILE_TEXT


def test_the_build_context_holds_only_what_the_build_copies() -> None:
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    rules = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert rules[0] == "*"
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    assert allowed == set(copied_paths())


def copied_paths() -> list[str]:
    """The sources of the build stage's COPY steps (the last word is the destination)."""
    paths: list[str] = []
    for kind, args in stages()[0]:
        if kind == "COPY":
            paths += args.split()[:-1]
    return paths


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build stage's steps: download and check the locked wheels, build the project's, and
    install them with no index into a fresh venv."""
    work = tmp_path_factory.mktemp("image")
    context = work / "src"
    context.mkdir()
    for name in copied_paths():
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (context / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, context / name)
    wheels = work / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # The build stage: the locked wheels, each checked against its hash, then the project's.
    [export] = [name for name in copied_paths() if name.startswith("packaging/requirements/")]
    requirements = context / export
    run([*pip, "download", "--require-hashes", "--only-binary", ":all:", "--dest", str(wheels),
         "-r", str(requirements)])  # fmt: skip
    run([*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(context)])
    [wheel] = wheels.glob("se_bridge-*.whl")
    target = work / "venv"
    venv.create(target, with_pip=True, symlinks=sys.platform != "win32")
    bin_dir = target / ("Scripts" if sys.platform == "win32" else "bin")
    # The runtime stage: no index, every hash checked again, the project without dependencies.
    python = [str(bin_dir / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    run([*python, "install", "--no-index", "--find-links", str(wheels), "--require-hashes",
         "-r", str(requirements)])  # fmt: skip
    run([*python, "install", "--no-index", "--no-deps", str(wheel)])
    return bin_dir


def run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{argv}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_installed_console_script_reports_its_version(installed: Path) -> None:
    assert run([str(installed / "se-bridge"), "--version"]).strip() == f"se-bridge {__version__}"


def test_the_installed_agent_has_its_options(installed: Path) -> None:
    text = run([str(installed / "se-bridge"), "agent", "--help"])
    for option in ("--config", "--state-dir", "--sink", "--log-file"):
        assert option in text


def test_the_image_holds_exactly_the_locked_packages(installed: Path) -> None:
    got = lock.installed(installed / "python")
    assert got == lock.locked("image") | {"se-bridge": __version__}
    assert "packaging/requirements/image.txt" in copied_paths()


def test_the_image_runs_the_consumer_and_the_agent_that_drains_its_node(installed: Path) -> None:
    code = "from bridge import extras; print([extras.missing(e) for e in extras.EXTRAS])"
    assert run([str(installed / "python"), "-c", code]).strip() == str([[]] * len(EXTRAS))


def test_the_wheel_carries_the_schema_and_type_marker(installed: Path) -> None:
    code = "import importlib.resources as r; print([p.name for p in r.files('bridge').iterdir()])"
    names = run([str(installed / "python"), "-c", code])
    assert "record.schema.json" in names
    assert "py.typed" in names


def test_the_image_says_what_it_is_and_where_it_came_from() -> None:
    labels = " ".join(args for kind, args in stages()[-1] if kind == "LABEL")
    for key in ("title", "description", "licenses", "version", "revision", "source"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    args = {args.split("=")[0]: args.split("=", 1)[1] for kind, args in STEPS if kind == "ARG"}
    assert args["VERSION"] == __version__


def test_the_state_directory_is_made_with_the_mode_the_agent_wants() -> None:
    """The agent closes its state directory to other users at each start, and says so when it
    was open (bridge.host.private_directory): the image makes it closed, so a container does
    not say it at every start (issue 39)."""
    [volume] = json.loads(next(args for kind, args in STEPS if kind == "VOLUME"))
    mode = f"{0o777 & ~host.PRIVATE_UMASK:04o}"
    runs = [args for kind, args in stages()[-1] if kind == "RUN"]
    assert [run for run in runs if re.search(rf"\bchmod {mode} {re.escape(volume)}(\s|$)", run)], (
        runs
    )
