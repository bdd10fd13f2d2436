"""Every sub-command explains itself: a description and examples, and every option of the
programs that read settings names its setting and environment variable."""

from __future__ import annotations

import argparse

import pytest

from bridge.cli import build_parser
from bridge.config import Config, dotted
from bridge.simulator.core import vm_path

# Options that are no setting: the file of settings itself, and help.
NOT_SETTINGS = {"-h", "--help", "--config"}
SETTINGS_COMMANDS = ("agent", "check", "consume")


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_sub_command_has_a_description_and_examples(name: str) -> None:
    sub = commands()[name]
    assert sub.description, name
    assert sub.epilog is not None
    assert "examples:" in sub.epilog
    assert f"se-bridge {name}" in sub.epilog


@pytest.mark.parametrize("name", SETTINGS_COMMANDS)
def test_every_option_names_its_setting_and_environment_variable(name: str) -> None:
    known = {
        f"{dotted(section)}.{key}"
        for section, settings in vars(Config()).items()
        for key in vars(settings)
    }
    for action in commands()[name]._actions:
        options = set(action.option_strings)
        if not options or options & NOT_SETTINGS:
            continue
        text = action.help or ""
        assert "setting " in text, (name, options)
        setting = text.split("setting ", 1)[1].split(",")[0].split(";")[0].strip(" )")
        assert setting in known, (name, options, setting)
        env = "SE_BRIDGE_" + setting.replace(".", "_").upper()
        assert env in text, (name, options, env)


@pytest.mark.parametrize("name", ["agent", "check", "consume"])
def test_sink_help_lists_all_five_kinds(name: str) -> None:
    [sink] = [a for a in commands()[name]._actions if "--sink" in a.option_strings]
    for kind in ("jsonl:PATH", "stdout", "hub:DIR", "eventhubs", "loganalytics"):
        assert kind in (sink.help or ""), (name, kind)


# The section whose log settings each command's --log-level and --log-format stand for; the
# others read no settings file and name none.
LOG_SECTIONS = {"agent": "agent", "check": "agent", "status": "agent", "service": "agent",
                "consume": "consumer", "policy": "consumer"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(commands()))
def test_log_options_name_the_settings_of_the_program_that_reads_them(name: str) -> None:
    helps = {
        option: action.help or ""
        for action in commands()[name]._actions
        for option in action.option_strings
    }
    section = LOG_SECTIONS.get(name)
    for option, key in (("--log-level", "log_level"), ("--log-format", "log_format")):
        if section is None:
            assert "setting" not in helps[option], (name, option)
            assert "SE_BRIDGE_" not in helps[option], (name, option)
        else:
            assert (
                f"setting {section}.{key}, SE_BRIDGE_{section.upper()}_{key.upper()}"
                in (helps[option])
            ), (name, option)
    if name == "consume":
        assert "setting consumer.state_dir, SE_BRIDGE_CONSUMER_STATE_DIR" in helps["--state-dir"]


def test_the_agents_example_url_is_one_the_simulator_serves() -> None:
    epilog = commands()["agent"].epilog or ""
    assert f"--imds-url http://127.0.0.1:8080{vm_path('vm-0')} " in epilog
