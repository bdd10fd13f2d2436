"""Building a consumer from the configuration: its policy, fleet state store, command channel,
signing key and notification targets. The standalone worker (`service`), the Functions app and
the demo all start a consumer this way, so each refuses the same bad settings with the same words.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import CollectorRegistry

from bridge import channels, host, sinks, telemetry
from bridge.channels import CommandSender
from bridge.cloud import identity
from bridge.cloud.armack import ArmAcknowledge
from bridge.commands import signing
from bridge.config import Config, ConfigError, ConsumerSettings, load
from bridge.consumer import armcarrier, patchruns, weekaheadpass
from bridge.consumer.core import Consumer
from bridge.consumer.ledger import Emit
from bridge.consumer.sources import eventgrid, resourcegraph
from bridge.consumer.state import Store
from bridge.consumer.state.kinds import KINDS as STORES
from bridge.notify import kinds as notify_kinds
from bridge.policy import file as policyfile
from bridge.policy.model import DEFAULT_POLICY, Policy
from bridge.records import RecordView, utc_now
from bridge.recordtypes import Approval

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

log = logging.getLogger(__name__)


def load_config(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """The consumer's settings: config.load, then the channel and Decision sink SPECs."""
    config = load(path, environ, flags)
    channels.check_config(config)
    sinks.check_config(config, decision_sinks(config), "consumer.sinks")
    notify_kinds.check_config(config)
    eventgrid.check_settings(config.eventgrid, config.eventhubs.name)
    grid, local = config.eventgrid, config.consumer.hub
    if grid.enabled and local is not None and Path(grid.hub).resolve() == Path(local).resolve():
        raise ConfigError(
            f"eventgrid.hub {grid.hub!r} is the local hub the agents send to "
            "(consumer.hub): a VM could then send what reads as Azure's word, so "
            "give Event Grid's deliveries a directory of their own"
        )
    resourcegraph.check_settings(config.eventgrid)
    patchruns.check_settings(config.patchruns, config.eventgrid.enabled)
    weekaheadpass.check_settings(config.weekahead, config.eventgrid)
    try:
        telemetry.check_address("consumer.metrics_address", config.consumer.metrics_address)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return config


LIVE = ConsumerSettings()  # what a live consumer reads with and keeps, unless told otherwise


def check_shadow(settings: ConsumerSettings) -> None:
    """ConfigError when a shadow consumer would share what the live consumer keeps (checked
    by what consumes, the worker and the Functions app; `policy explain` only reads).

    In the live consumer's group it would resume from the live checkpoints and read nothing
    the live one had read (on Event Hubs it would also take partitions from it, each
    processor closing the other's receiver); on the live fleet state table it would mark
    approvals sent that it never sent, and the live consumer would not send them either. The
    live consumer is taken to use the defaults (consumer group $Default, table sebridgefleet):
    a live consumer that names its own must not be copied into a shadow's settings.
    """
    if settings.mode != "shadow":
        return
    # Event Hubs consumer groups and Table Storage tables are named without regard to case.
    if settings.consumer_group.strip().casefold() == LIVE.consumer_group.casefold():
        raise ConfigError(
            f"a shadow consumer (consumer.mode = shadow) reads in a consumer group of its own, "
            f"not {LIVE.consumer_group}, where a live consumer reads and keeps its checkpoints: "
            "set consumer.consumer_group (SE_BRIDGE_CONSUMER_CONSUMER_GROUP), for example to "
            "se-bridge-shadow, after creating it on the event hub (az eventhubs eventhub "
            "consumer-group create; a local hub needs nothing created)"
        )
    try:
        tables = bool(settings.state) and STORES.parse(settings.state)[0].name == "tables"
    except ValueError:  # refused with its own words when the store is built
        tables = False
    if tables and settings.table_name.strip().casefold() == LIVE.table_name.casefold():
        raise ConfigError(
            f"a shadow consumer (consumer.mode = shadow) keeps its own fleet state, not the "
            f"live consumer's table {LIVE.table_name}, where it would mark approvals sent "
            "that it never sent: set consumer.table_name (SE_BRIDGE_CONSUMER_TABLE_NAME), for "
            "example to sebridgeshadow"
        )


def load_policy(path: Path | None) -> Policy:
    """The policy file's, or the built-in default; ConfigError when bad."""
    return DEFAULT_POLICY if path is None else policyfile.load_setting("consumer.policy", path)


def state_spec(config: Config) -> str:
    return config.consumer.state or f"sqlite:{config.consumer_state_dir() / 'fleet.db'}"


def decision_sinks(config: Config) -> list[str]:
    return config.consumer.sinks or [f"jsonl:{config.consumer_state_dir() / 'decisions.jsonl'}"]


def build_consumer(
    config: Config,
    emit: Emit,
    *,
    now: Callable[[], datetime] = utc_now,
    registry: CollectorRegistry | None = None,
) -> Consumer:
    """The consumer core wired to the configured state store, channel, policy and notification
    targets (`registry`: where the notifier's metrics go)."""
    if not config.commands.channel:
        raise ConfigError(
            "the consumer needs commands.channel (local:DIR or storagequeue) to send approvals "
            "(SE_BRIDGE_COMMANDS_CHANNEL or --commands)"
        )
    policy = load_policy(config.consumer.policy)
    signer = load_signer(config)
    trusted = load_previous_keys(config)
    store = build_store(state_spec(config), config)
    sender: CommandSender = channels.sender(config.commands.channel, config)
    if signer is not None:
        sender = channels.SigningSender(sender, signer)
    # Its threads start here: built last, so that a bad setting above starts none.
    notifier = notify_kinds.build(config, registry) if config.notify.targets else None
    health = config.eventgrid.enabled and config.eventgrid.health
    consumer = Consumer(
        store,
        sender,
        policy,
        emit,
        config.consumer,
        now=now,
        host_name=host.host_name(),
        signer=signer,
        notifier=notifier,
        trusted=trusted,
        health=health,
    )
    if armcarrier.wanted(config):
        arm = ArmAcknowledge(identity.credential(config.identity), config.eventgrid.arm_endpoint)
        # The consumer's sinks take any record: an Approval record as well as a Decision.
        armcarrier.install(
            consumer, arm, cast(Callable[[Sequence[Approval]], None], emit), now, host.host_name()
        )
    if config.patchruns.enabled:
        # The consumer's sinks take a patch run's Decision records as the policy's.
        patchruns.install(consumer, config, cast(Callable[[Sequence[RecordView]], None], emit))
    return consumer


def load_signer(config: Config) -> signing.Signer | None:
    """The key that signs every command; ConfigError when it is missing or unusable.

    None only with commands.allow_unsigned and no key: agents with a verify key refuse
    what this consumer then sends, which is the point of the setting's name.
    """
    settings = config.commands
    if not settings.signing_key:
        if not settings.allow_unsigned:
            raise ConfigError(
                "the consumer signs its commands with commands.signing_key "
                "(SE_BRIDGE_COMMANDS_SIGNING_KEY=file:PATH or keyvault:URL; `se-bridge keygen "
                "--out FILE` makes one), or set commands.allow_unsigned = true (not for production)"
            )
        if config.consumer.mode == "shadow":
            log.info(
                "shadow mode: no command is sent (none would be signed: "
                "commands.allow_unsigned is set and commands.signing_key is not)"
            )
        else:
            log.warning(
                "commands.allow_unsigned is set and commands.signing_key is not: sending "
                "UNSIGNED commands, which agents with a verify key refuse"
            )
        return None
    try:
        signer = signing.load_signer(settings, config.identity)
    except signing.SigningError as err:
        raise ConfigError(str(err)) from err
    if config.consumer.mode == "shadow":
        log.info("shadow mode: no command is sent (key %s would sign them)", signer.key_id)
    else:
        log.info("signing commands with key %s", signer.key_id)
    return signer


def load_previous_keys(config: Config) -> list[Ed25519PublicKey]:
    """On the consumer, `commands.verify_key` names the previous signing key(s) while they
    rotate: what people decided under them still applies, re-signed with the new key when read
    (bridge.consumer.people.operatorlog). ConfigError when one cannot be read."""
    try:
        keys = signing.split_keys(config.commands.verify_key)
        return [signing.parse_public(part) for part in keys]
    except signing.SigningError as err:
        raise ConfigError(str(err)) from err


def build_store(spec: str, config: Config) -> Store:
    """The store a `consumer.state` SPEC names (`sqlite:PATH` or `tables`)."""
    return STORES.build(spec, config)
