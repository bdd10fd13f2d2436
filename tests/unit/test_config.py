"""Settings: precedence flags > environment > file > defaults, and errors that name the setting."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge import host
from bridge.config import (
    Config,
    ConfigError,
    bound,
    consumer_settings_under_agent,
    dotted,
    load,
    markdown_table,
    warn_of_consumer_settings_under_agent,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "se-bridge.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults() -> None:
    config = load(environ={})
    assert config.agent.poll_interval == 1.0
    assert config.imds.url == "http://169.254.169.254"
    assert config.imds.api_version == "2020-07-01"
    assert config.sink_specs() == [f"jsonl:{config.agent.state_dir / 'records.jsonl'}"]
    assert config.hooks.prepare is None


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent]\npoll_interval = 2.0\nheartbeat_interval = 60\n")
    env = {"SE_BRIDGE_AGENT_POLL_INTERVAL": "3", "SE_BRIDGE_AGENT_HEARTBEAT_INTERVAL": "90"}
    config = load(path, environ=env, flags={"agent.poll_interval": 0.5})
    assert config.agent.poll_interval == 0.5
    assert config.agent.heartbeat_interval == 90.0
    assert load(path, environ={}).agent.poll_interval == 2.0


def test_lists_from_environment_and_file(tmp_path: Path) -> None:
    env = {"SE_BRIDGE_AGENT_SINKS": "stdout, jsonl:/tmp/x.jsonl"}
    assert load(environ=env).sink_specs() == ["stdout", "jsonl:/tmp/x.jsonl"]
    path = write(tmp_path, '[agent]\nsinks = ["stdout"]\n')
    assert load(path, environ={}).sink_specs() == ["stdout"]


def test_a_rebalance_drain_lasts_an_hour_at_most_unless_set(tmp_path: Path) -> None:
    assert load(environ={}).kubernetes.rebalance_drain_for == 3600
    path = write(tmp_path, "[kubernetes]\nrebalance_drain_for = 900\n")
    assert load(path, environ={}).kubernetes.rebalance_drain_for == 900


def test_hook_commands_string_or_argv(tmp_path: Path) -> None:
    path = write(tmp_path, '[hooks]\nprepare = "drain.sh --all, now"\nrecover = ["a", "b,c"]\n')
    hooks = load(path, environ={}).hooks
    assert hooks.prepare == "drain.sh --all, now"
    assert hooks.recover == ["a", "b,c"]


ERRORS = {
    "number out of range": (
        {"SE_BRIDGE_AGENT_POLL_INTERVAL": "0"},
        "agent.poll_interval (from SE_BRIDGE_AGENT_POLL_INTERVAL): must be between 0.2 and 60",
    ),
    "not a number": (
        {"SE_BRIDGE_IMDS_TIMEOUT": "soon"},
        "imds.timeout (from SE_BRIDGE_IMDS_TIMEOUT)",
    ),
    "not a whole number": (
        {"SE_BRIDGE_SPOOL_MAX_RECORDS": "10.5"},
        "spool.max_records (from SE_BRIDGE_SPOOL_MAX_RECORDS): expected a whole number",
    ),
    "bad identity kind": (
        {"SE_BRIDGE_IDENTITY_KIND": "password"},
        "identity.kind (from SE_BRIDGE_IDENTITY_KIND): must be one of auto, managed",
    ),
    "rebalance drain cap out of range": (
        {"SE_BRIDGE_KUBERNETES_REBALANCE_DRAIN_FOR": "0"},
        "kubernetes.rebalance_drain_for (from SE_BRIDGE_KUBERNETES_REBALANCE_DRAIN_FOR): must "
        "be between 1 and 86400",
    ),
    "bad choice": (
        {"SE_BRIDGE_AGENT_LOG_LEVEL": "chatty"},
        "agent.log_level (from SE_BRIDGE_AGENT_LOG_LEVEL): must be one of DEBUG",
    ),
}


@pytest.mark.parametrize(("env", "message"), ERRORS.values(), ids=ERRORS)
def test_errors_name_the_setting(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        load(environ=env)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[agent]\npoll_interval = true\n", "se-bridge.toml:2: agent.poll_interval: expected"),
        ("[agent]\npol_interval = 1\n", "unknown setting agent.pol_interval"),
        ("[agnt]\n", "unknown section [agnt]"),
        ("agent = 3\n", "se-bridge.toml:1: [agent] must be a table"),
        ("[agent\n", "is not valid TOML"),
        ("[hooks]\nprepare = []\n", "se-bridge.toml:2: hooks.prepare: an argv list"),
    ],
)
def test_file_errors(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, text), environ={})
    assert message in str(info.value)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(tmp_path / "absent.toml", environ={})


def test_identity_kind_is_case_insensitive() -> None:
    assert load(environ={"SE_BRIDGE_IDENTITY_KIND": "Managed"}).identity.kind == "managed"


# --- every numeric setting has bounds, and a value outside them is a ConfigError ------------

NUMERIC = [
    (section.name, f)
    for section in dataclasses.fields(Config)
    for f in dataclasses.fields(getattr(Config(), section.name))
    if get_type_hints(type(getattr(Config(), section.name)))[f.name] in (int, float)
]


@pytest.mark.parametrize(("section", "setting"), NUMERIC, ids=lambda v: getattr(v, "name", v))
def test_every_numeric_setting_has_documented_bounds(
    section: str, setting: dataclasses.Field[Any]
) -> None:
    low, high = setting.metadata["low"], setting.metadata["high"]
    assert low is not None, f"{section}.{setting.name} has no lower bound"
    assert high is not None, f"{section}.{setting.name} has no upper bound"
    assert math.isfinite(low)
    assert math.isfinite(high)
    assert low <= high


@given(
    pick=st.sampled_from(NUMERIC),
    raw=st.one_of(
        st.sampled_from(["0", "-1", "nan", "NaN", "inf", "-inf", "1e308", "-1e308", "", " ", "x"]),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(min_value=-(10**20), max_value=10**20).map(str),
    ),
)
def test_any_value_of_any_numeric_setting_is_accepted_in_bounds_or_a_config_error(
    pick: tuple[str, dataclasses.Field[Any]], raw: str
) -> None:
    section, setting = pick
    name = dotted(section)  # consumer.people for people
    env = {f"SE_BRIDGE_{name.replace('.', '_').upper()}_{setting.name.upper()}": raw}
    try:
        config = load(environ=env)
    except ConfigError as err:
        problem = str(err)
    else:
        problem = ""
    if problem:
        assert f"{name}.{setting.name}" in problem
        return
    value = getattr(getattr(config, section), setting.name)
    assert math.isfinite(value)
    assert setting.metadata["low"] <= value <= setting.metadata["high"]
    # A value in bounds is usable as a duration wherever the code makes one of it.
    timedelta(seconds=value)


def test_the_settings_table_shows_each_numeric_bound() -> None:
    table = markdown_table()
    for section, setting in NUMERIC:
        named = f"`{dotted(section)}.{setting.name}`"
        row = next(line for line in table.splitlines() if named in line)
        assert f"{bound(setting.metadata['low'])} to {bound(setting.metadata['high'])}" in row


def test_the_consumer_has_its_own_state_dir_and_log_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[agent]\nstate_dir = "/srv/agent"\nlog_level = "DEBUG"\n'
        '[consumer]\nstate_dir = "/srv/consumer"\nlog_level = "WARNING"\nlog_format = "json"\n',
    )
    config = load(path, environ={})
    assert (config.consumer_state_dir(), config.consumer_log_level(),
            config.consumer_log_format()) == (Path("/srv/consumer"), "WARNING", "json")  # fmt: skip
    assert (config.agent.state_dir, config.agent.log_level) == (Path("/srv/agent"), "DEBUG")
    assert consumer_settings_under_agent(config) == []
    env = {"SE_BRIDGE_CONSUMER_LOG_LEVEL": "error", "SE_BRIDGE_CONSUMER_STATE_DIR": "/srv/c"}
    from_env = load(environ=env)
    assert (from_env.consumer_log_level(), from_env.consumer_state_dir()) == (
        "ERROR",
        Path("/srv/c"),
    )
    plain = load(environ={})
    assert (plain.consumer_state_dir(), plain.consumer_log_level(),
            plain.consumer_log_format()) == (host.default_state_dir(), "INFO", "text")  # fmt: skip


def test_a_consumer_config_written_with_agent_settings_keeps_working_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, '[agent]\nstate_dir = "/srv/old"\nlog_format = "json"\n')
    config = load(path, environ={})
    assert config.consumer_state_dir() == Path("/srv/old")
    assert (config.consumer_log_format(), config.consumer_log_level()) == ("json", "INFO")
    assert consumer_settings_under_agent(config) == ["state_dir", "log_format"]
    warn_of_consumer_settings_under_agent(config)
    [warning] = [r for r in caplog.records if r.levelname == "WARNING"]
    said = warning.getMessage()
    assert "agent.state_dir, agent.log_format" in said
    assert "consumer.state_dir, consumer.log_format" in said
    # Where both are set, the consumer's own wins, wherever each came from.
    env = {"SE_BRIDGE_AGENT_STATE_DIR": "/srv/env", "SE_BRIDGE_CONSUMER_LOG_FORMAT": "text"}
    both = load(path, environ=env, flags={"consumer.state_dir": "/srv/flag"})
    assert (both.consumer_state_dir(), both.consumer_log_format()) == (Path("/srv/flag"), "text")
    assert consumer_settings_under_agent(both) == []


# --- [consumer.people]: a section nested in another's table ----------------------------------


def test_people_settings_come_from_their_nested_table(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '[consumer]\nmode = "shadow"\n[consumer.people]\ntenant_id = "t1"\n'
        'audience = ["api://se-bridge", "c1"]\n',
        encoding="utf-8",
    )
    config = load(path, environ={"SE_BRIDGE_CONSUMER_PEOPLE_PAGE_ADDRESS": "8089"})
    assert config.consumer.mode == "shadow"
    assert config.people.tenant_id == "t1"
    assert config.people.audience == ["api://se-bridge", "c1"]
    assert config.people.page_address == "8089"


def test_a_people_table_at_the_top_is_refused_with_the_right_name(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[people]\ntenant_id = "t1"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[consumer\.people\]"):
        load(path, environ={})


def test_a_bad_people_setting_is_named_as_the_file_spells_it() -> None:
    with pytest.raises(ConfigError, match=r"consumer\.people\.nope"):
        load(environ={}, flags={"people.nope": "x"})


# --- issue 39, item 5: errors as good as the policy checker's --------------------------------

SETTINGS_ERRORS = {
    "unknown key": (
        "[imds]\ntimeout = 5\n\n[agent]\nstate_dir = '/tmp/x'\npoll_intervall = 2\n",
        "se-bridge.toml:6: unknown setting agent.poll_intervall (did you mean "
        "agent.poll_interval?); the settings of [agent]: poll_interval, state_dir, sinks,",
    ),
    "unknown key of a nested table": (
        "[consumer]\nmode = 'shadow'\n[consumer.people]\ntenant = 't1'\n",
        "se-bridge.toml:4: unknown setting consumer.people.tenant (did you mean "
        "consumer.people.tenant_id?); the settings of [consumer.people]: tenant_id, audience,",
    ),
    "a duration where seconds are asked for": (
        "[agent]\npoll_interval = '5s'\n",
        "se-bridge.toml:2: agent.poll_interval: expected a number of seconds from 0.2 to 60 "
        "(no unit: write 5 for 5s), got '5s'",
    ),
    "a word where a whole number is asked for": (
        "[spool]\nmax_records = 'many'\n",
        "se-bridge.toml:2: spool.max_records: expected a whole number from 100 to 100000000, "
        "got 'many'",
    ),
    "an unknown section": (
        "[agent]\n[imdss]\nurl = 'http://x'\n",
        "se-bridge.toml:2: unknown section [imdss] (did you mean [imds]?); the sections: agent, "
        "imds, spool, hooks, eventhubs, loganalytics, identity, storage, commands, consumer, "
        "consumer.people, notify, kubernetes",
    ),
    "an unknown table in a known one": (
        "[consumer.peeple]\nrole = 'x'\n",
        "se-bridge.toml:1: unknown setting consumer.peeple (did you mean [consumer.people]?)",
    ),
}


@pytest.mark.parametrize(("text", "message"), SETTINGS_ERRORS.values(), ids=SETTINGS_ERRORS)
def test_settings_errors_give_the_line_the_path_a_suggestion_and_the_form(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, text), environ={})
    assert f"{tmp_path / message}" in str(info.value)
    assert "could not convert" not in str(info.value)


def test_the_known_sections_are_the_ones_a_file_may_have(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, "[nothing_like_it]\n"), environ={})
    known = str(info.value).split("the sections: ", 1)[1].split(", ")
    for section in known:  # each one named is accepted
        load(write(tmp_path, f"[{section}]\n"), environ={})
    assert "consumer.people" in known
    assert "people" not in known


def test_a_bad_value_from_the_environment_says_the_form_not_pythons_words() -> None:
    with pytest.raises(ConfigError) as info:
        load(environ={"SE_BRIDGE_HOOKS_TIMEOUT": "2m"})
    assert str(info.value) == (
        "hooks.timeout (from SE_BRIDGE_HOOKS_TIMEOUT): expected a number of seconds from 1 to "
        "86400 (no unit: write 120 for 2m), got '2m'"
    )


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("SE_BRIDGE_AGENT_POLL_INTERVALL", "SE_BRIDGE_AGENT_POLL_INTERVAL"),
        ("SE_BRIDGE_AGNT_POLL_INTERVAL", "SE_BRIDGE_AGENT_POLL_INTERVAL"),
        ("SE_BRIDGE_CONSUMER_PEOPLE_TENANT", "SE_BRIDGE_CONSUMER_PEOPLE_TENANT_ID"),
    ],
)
def test_an_unknown_environment_variable_is_named_as_the_user_typed_it(
    name: str, suggestion: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert load(environ={name: "3"}) == Config()
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning == f"ignoring {name}: no setting has that name (did you mean {suggestion}?)"
