"""This VM's identity (VmId, name, scale set, domains, tags) from instance metadata, which
labels every record the agent writes: read at start, then every imds.instance_refresh, and
kept in the spool so a restart while instance metadata fails still labels records with it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from bridge.agent import imds
from bridge.outbox.spool import Spool, SpoolError, StateKey
from bridge.records import Origin, VmIdentity
from bridge.retry import DeliveryError, RetryableError

# The poll loop's lines, whichever of its collaborators says them.
log = logging.getLogger("bridge.agent.loop")
IDENTITY_RETRY_SECONDS = 60.0


class InstanceMetadata:
    """The `origin` of this agent's records, refreshed from instance metadata when due."""

    def __init__(
        self,
        spool: Spool,
        *,
        host_name: str,
        vm_name: str | None,
        refresh_every: float,
        stopping: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._spool, self._vm_name, self._every = spool, vm_name, refresh_every
        self._stopping, self._clock = stopping, clock
        saved = VmIdentity.from_state(spool.load_state(StateKey.IDENTITY))
        self.origin = Origin(self._named(saved), host_name)
        self._next = 0.0
        self._warned = False
        # compute.priority is Spot, as instance metadata last said (False until it answers).
        self.spot = False

    def due(self, at: float) -> bool:
        """Whether a refresh is due at `at` (the monotonic clock)."""
        return at >= self._next

    def refresh(self, fetch: Callable[[], Mapping[str, Any]]) -> bool:
        """Ask instance metadata (`fetch`, which raises a bridge.retry failure) who this VM
        is; True when the answer changed the identity."""
        try:
            raw = fetch()
            identity = imds.parse_instance(raw)
        except DeliveryError as err:
            self._failed(err)
            return False
        if not identity.known:
            # JSON, but not this VM's metadata (no vmId): never trade a known identity for it.
            self._failed(RetryableError("the answer holds no compute.vmId that is a GUID"))
            return False
        self._next = self._clock() + self._every
        self._warned = False
        self.spot = imds.is_spot(raw)
        identity = self._named(identity)
        if identity == self.origin.identity:
            return False
        log.info("this VM is %s (%s)", identity.vm_name, identity.vm_id)
        self.origin = Origin(identity, self.origin.host_name)
        self._save(identity)
        return True

    def _named(self, identity: VmIdentity) -> VmIdentity:
        """`identity`, with agent.vm_name where instance metadata gave no name."""
        if identity.vm_name or not self._vm_name:
            return identity
        return dataclasses.replace(identity, vm_name=self._vm_name)

    def _save(self, identity: VmIdentity) -> None:
        try:
            # Kept so a restart while instance metadata fails still labels records with the
            # VM: an event's end with VmId null would be lost to the consumer, and hold its
            # budget.
            self._spool.commit([], state={StateKey.IDENTITY: identity.to_state()})
        except SpoolError as err:  # kept in memory; saved again when it next changes
            log.warning("cannot save this VM's identity in the spool (%s)", err)

    def _failed(self, err: DeliveryError) -> None:
        self._next = self._clock() + IDENTITY_RETRY_SECONDS
        if not self._warned and not self._stopping():
            known = self.origin.identity
            carry = (
                f"the identity last seen ({known.vm_name}, {known.vm_id})"
                if known.known
                else "null VM fields"
            )
            log.warning(
                "instance metadata is unavailable (%s); records carry %s until it answers; "
                "retrying every %gs%s",
                err,
                carry,
                IDENTITY_RETRY_SECONDS,
                self._unnamed(),
            )
            self._warned = True

    def _unnamed(self) -> str:
        """What a person should know while this VM has no name to match Resources with."""
        if self.origin.identity.vm_name:
            return ""
        return (
            f". Without a VM name, an event whose Resources names this host "
            f"({self.origin.host_name}) counts as this VM's and any other stays unknown "
            "(AffectsThisVm null): set agent.vm_name to this VM's name as Scheduled "
            "Events lists it"
        )
