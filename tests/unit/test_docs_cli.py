"""The docs agree with the CLI (issue 39, item 11): the synopsis in docs/contracts.md is the
parser's, every `se-bridge ...` command in a page's code blocks parses as the parser reads it,
every option with a default says it, index.md lists every page, every pip command installs
from the lock, and development.md says how many workers `./dev test` runs."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Iterator

import pytest

from bridge.cli import LOGGING_OPTIONS, build_parser
from tools.sync_docs import DOCS, README, ROOT, commands, pages

LOGGING = {*LOGGING_OPTIONS, "--help", "-h"}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")} - LOGGING


def section(text: str, name: str) -> str:
    found = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", text, re.DOTALL)
    assert found, f"no generated section {name}"
    return found.group(1)


def test_the_synopsis_in_contracts_names_every_command_and_option() -> None:
    synopsis = section((DOCS / "contracts.md").read_text(encoding="utf-8"), "cli-synopsis")
    entries = re.split(r"\n(?=se-bridge )", synopsis)
    for words, parser in commands(build_parser()):
        entry = next((e for e in entries if e.split()[1 : 1 + len(words)] == list(words)), None)
        assert entry is not None, f"the synopsis has no se-bridge {' '.join(words)}"
        missing = {o for o in options(parser) if not re.search(rf"{o}(?![\w-])", entry)}
        assert not missing, f"se-bridge {' '.join(words)}: the synopsis lacks {sorted(missing)}"


def code_lines(text: str) -> Iterator[str]:
    """The lines of a page's fenced code blocks, a line continued with \\ joined to the next."""
    inside, held = False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside, held = not inside, ""
            continue
        if not inside:
            continue
        if line.rstrip().endswith("\\"):
            held += line.rstrip()[:-1] + " "
            continue
        yield held + line
        held = ""


# `se-bridge` (or a path to it, or the image se-bridge:TAG) and what follows it.
_INVOCATION = re.compile(r"(?:^|[\s/\\])se-bridge(?::\S+)?\s+(\S.*)$")
# Where a command starts: the line's start or after a separator, sudo, `--` or `$`, past
# VAR=value assignments and a directory (/opt/se-bridge/venv/bin/, C:\se-bridge\venv\Scripts\).
_COMMAND_POSITION = re.compile(
    r"(?:^|&&|\|\||[;|(]|\bsudo|\s--|\$)\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\S*[/\\])?$"
)
_ENDS = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&"}
NAMES = {words[0] for words, _ in commands(build_parser())} | {"--version", "--help", "-h"}


def invocations() -> Iterator[tuple[str, str]]:
    """(page, command) for each `se-bridge COMMAND ...` run in a code block of the docs or the
    README (a `se-bridge` followed by no command is a user, group or namespace of that name),
    the generated synopsis left out (the test above holds it)."""
    for page in [*pages(), README]:
        text = page.read_text(encoding="utf-8")
        text = re.sub(r"<!-- cli-synopsis:start -->.*?<!-- cli-synopsis:end -->", "", text,
                      flags=re.DOTALL)  # fmt: skip
        for line in code_lines(text):
            if line.lstrip().startswith(("#", "//")):
                continue
            for start in re.finditer(r"se-bridge", line):
                found = _INVOCATION.match(line, max(0, start.start() - 1))
                image = line[start.end() : start.end() + 1] == ":"
                placed = image or _COMMAND_POSITION.search(line[: start.start()])
                if found and placed and found.group(1).split()[0] in NAMES:
                    yield page.name, found.group(1)
                    break


def argv_of(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    argv = []
    for word in lexer:
        if word in _ENDS or word.endswith(")"):
            break
        argv.append(word)
    return argv


def problem(command: str) -> str | None:
    """What the parser says of `command`, or of a synopsis line its options; None if fine."""
    parser = build_parser()
    if "[" in command:  # a synopsis written by hand: its options must be the command's
        words = command.split()
        found = dict(commands(parser))
        key = next((k for k in found if tuple(words[: len(k)]) == k), None)
        if key is None:
            return f"no command {words[0]}"
        unknown = set(re.findall(r"--[a-z][\w-]*", command)) - options(found[key]) - LOGGING
        return f"unknown options {sorted(unknown)}" if unknown else None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv_of(command))
    except SystemExit as exit:
        return None if exit.code == 0 else err.getvalue().strip().splitlines()[-1]
    return None


def test_there_are_commands_to_check() -> None:
    assert len(list(invocations())) > 50


@pytest.mark.parametrize(("page", "command"), list(invocations()))
def test_every_command_in_the_docs_is_one_the_parser_takes(page: str, command: str) -> None:
    assert problem(command) is None, f"{page}: se-bridge {command}: {problem(command)}"


def test_a_command_the_parser_refuses_is_caught() -> None:
    assert problem("agent --drip 1") is not None
    assert problem("status [--nope]") is not None
    assert problem("agent --sink stdout   # and a comment --drip") is None


@pytest.mark.parametrize(("words", "parser"), list(commands(build_parser())),
                         ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")  # fmt: skip
def test_every_option_with_a_default_says_it(
    words: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    for action in parser._actions:
        default = action.default
        if not action.option_strings or action.help in (None, argparse.SUPPRESS):
            continue
        if default in (None, False, "", [], argparse.SUPPRESS) or isinstance(
            action, argparse._HelpAction
        ):
            continue
        assert "default" in str(action.help) or "%(default)" in str(action.help), (
            f"se-bridge {' '.join(words)} {action.option_strings[0]} (default {default!r}) "
            "does not say its default"
        )


def test_the_index_lists_every_page() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8").split("## The pages", 1)[1]
    linked = set(re.findall(r"\]\(([\w-]+\.md)", index))
    missing = {p.name for p in pages() if p.parent == DOCS} - linked - {"index.md"}
    assert not missing, f"index.md's page list misses {sorted(missing)}"


def test_every_pip_install_in_the_docs_installs_from_the_lock() -> None:
    for page in pages():
        for line in code_lines(page.read_text(encoding="utf-8")):
            if not re.search(r"pip\s+install\b", line):
                continue
            argv = shlex.split(line, comments=True)
            where = f"{page.name}: {line.strip()}"
            assert "." not in argv, f"{where}: not from the lock"
            assert "se-bridge" not in argv, f"{where}: not from the lock"
            if "--require-hashes" in argv:
                assert "--only-binary" in argv, f"{where}: as deploying.md, --only-binary :all:"
            elif any(word.endswith(".whl") for word in argv):
                assert "--no-deps" in argv, f"{where}: a wheel goes in with --no-deps"
            else:
                assert "--target" in argv, f"{where}: neither the lock nor a wheel"


WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}


def test_development_says_how_many_workers_dev_test_runs() -> None:
    dev = (ROOT / "dev").read_text(encoding="utf-8")
    per_core = re.search(r"_NPROCESSORS_ONLN[^)]*\)\s*\*\s*(\d+)", dev)
    assert per_core, "./dev no longer says its workers per core"
    development = (DOCS / "development.md").read_text(encoding="utf-8")
    running = development.split("## Running the tests", 1)[1].split("\n## ", 1)[0]
    assert "-n auto" not in running
    assert f"{WORDS[int(per_core.group(1))]} workers per core" in running.split("\n\n")[1]


def test_the_getting_started_and_deploying_pip_commands_agree() -> None:
    def installs(page: str) -> set[str]:
        text = (DOCS / page).read_text(encoding="utf-8")
        found = set()
        for line in code_lines(text):
            if "--require-hashes" in line:
                argv = shlex.split(line, comments=True)
                start = argv.index("install")
                found.add(" ".join(a for a in argv[start:] if not a.endswith(".txt")))
        return found

    assert installs("getting-started.md") == installs("deploying.md")
