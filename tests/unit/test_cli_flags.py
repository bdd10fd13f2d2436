"""A setting's option comes from its field (bridge.config.Flag): each command's options are the
settings its FLAGS name, and the value given on the command line is the setting's."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bridge.agent import command as agent_command
from bridge.cli import LOGGING_OPTIONS, build_parser
from bridge.config import Config, add_flags, dotted, flag_of, given, load
from bridge.consumer import command as consumer_command
from bridge.consumer.people import command as people_command

# The settings each command reads from its options, as its run function reads them.
READ = {
    ("agent",): (*agent_command.AGENT_FLAGS, *agent_command.LOGGING),
    ("check",): agent_command.CHECK_FLAGS,
    ("status",): ("agent.state_dir", *consumer_command.LOOK_FLAGS),  # the latter --consumer's
    ("consume",): (*consumer_command.CONSUME_FLAGS, *consumer_command.LOGGING),
    ("policy", "explain"): consumer_command.LOOK_FLAGS,
    ("approve",): people_command.FLAGS,
    ("pause",): people_command.FLAGS,
}
# A value each setting takes as given; the others take "x".
GIVEN = {
    "imds.url": "http://127.0.0.1:8080/vm/vm-0",
    "agent.poll_interval": "2.5",
    "agent.sinks": "stdout",
    "consumer.sinks": "stdout",
    "agent.log_level": "debug",
    "consumer.log_level": "debug",
    "agent.log_format": "json",
    "consumer.log_format": "json",
    "people.api_url": "https://se-bridge.example",
}
REQUIRED: dict[tuple[str, ...], list[str]] = {
    ("approve",): ["C7061BAC"],
    ("pause",): ["--reason", "launch week"],
}


def parser_of(words: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for word in words:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


def setting(config: Config, name: str) -> Any:
    section, _, key = name.partition(".")
    return getattr(getattr(config, section), key)


@pytest.mark.parametrize("words", list(READ), ids=" ".join)
def test_each_option_given_is_its_setting(words: tuple[str, ...]) -> None:
    argv: list[str] = [*words, *REQUIRED.get(words, [])]
    for name in READ[words]:
        flag = flag_of(name)
        argv += [flag.name] if flag.const is not None else [flag.name, GIVEN.get(name, "x")]
    config = load(None, environ={}, flags=given(build_parser().parse_args(argv), *READ[words]))
    for name in READ[words]:
        flag = flag_of(name)
        value = flag.const if flag.const is not None else GIVEN.get(name, "x")
        expected = {
            "agent.poll_interval": 2.5,
            "agent.sinks": ["stdout"],
            "consumer.sinks": ["stdout"],
            "agent.log_level": "DEBUG",
            "consumer.log_level": "DEBUG",
        }.get(name, value)
        got = setting(config, name)
        assert (str(got) if isinstance(got, Path) else got) == expected, (words, name)


@pytest.mark.parametrize("words", list(READ), ids=" ".join)
def test_every_option_naming_a_setting_is_read(words: tuple[str, ...]) -> None:
    read = {f"{dotted(name.partition('.')[0])}.{name.partition('.')[2]}" for name in READ[words]}
    for action in parser_of(words)._actions:
        if set(action.option_strings) & set(LOGGING_OPTIONS):
            continue  # bridge.cli's own, for every command; the agent and consume read them
        if "(setting " in (action.help or ""):
            named = (action.help or "").split("(setting ", 1)[1].split(",")[0]
            assert named in read, (words, action.option_strings, named)


def test_a_list_setting_takes_its_option_again_and_a_number_is_converted() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, "agent.sinks", "agent.poll_interval", "consumer.mode")
    args = parser.parse_args(["--sink", "stdout", "--sink", "hub:/srv/hub", "--poll-interval", "2"])
    assert given(args, "agent.sinks", "agent.poll_interval", "consumer.mode") == {
        "agent.sinks": ["stdout", "hub:/srv/hub"],
        "agent.poll_interval": 2.0,
        "consumer.mode": None,
    }
    with pytest.raises(SystemExit):
        parser.parse_args(["--poll-interval", "often"])


def test_a_setting_without_an_option_says_so() -> None:
    with pytest.raises(KeyError, match=r"agent\.heartbeat_interval has no command-line option"):
        flag_of("agent.heartbeat_interval")
