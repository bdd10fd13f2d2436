"""A seeded fleet description: what N VMs look like to instance metadata.

The same seed and size always give the same fleet, VmIds included, so a run can be repeated
and a failing check reproduced. The fleet is as messy as real ones in the ways the consumer
must get right:

- subscriptions that each hold resource groups of the same names (`rg-prod`, `rg-batch`...),
  and scale sets and availability sets whose names repeat across resource groups, so VM names
  such as `web_0` or `sql-1` repeat across the fleet;
- scale sets of up to 1,000 VMs in placement groups of at most 100, spread over zones 1-3 and
  five fault domains; availability sets of up to 200 VMs over three fault and five update
  domains, without a zone; standalone VMs, zonal or not;
- tags: `env`, `tier`, `maintenance: rolling` on the scale sets whose platform reboots the
  policy approves, `avset` on availability-set VMs (IMDS does not name the availability set,
  so a budget per availability set is a tag budget), `spot` on Spot VMs (about `spot_share`
  of the fleet, in Spot scale sets and standalone).

VMs are kept as compact rows (one slotted object each, identity tuples shared by a set) so
100,000 of them cost tens of megabytes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from bridge.records import Origin, VmIdentity, record_id

LOCATION = "westeurope"
RG_NAMES = (
    "rg-prod",
    "rg-stage",
    "rg-batch",
    "rg-data",
    "rg-web",
    "rg-shared",
    "rg-ml",
    "rg-edge",
    "rg-ops",
    "rg-legacy",
)
SET_NAMES = ("web", "api", "worker", "ingest", "cache", "render", "etl", "queue", "search", "auth")
SPOT_SET_NAMES = ("spot-batch", "spot-render", "spot-ci", "spot-etl")
AVSET_NAMES = ("sql", "app", "dc", "mq", "files", "web", "jump", "ad")
SET_SIZES = (10, 20, 50, 100, 100, 200, 300, 500, 1000)
AVSET_SIZES = (2, 3, 5, 10, 20, 50, 100, 200)
VMS_PER_SUBSCRIPTION = 25_000
PLACEMENT_GROUP = 100  # Azure's limit for a placement group of a scale set
SCALE_SET_SHARE, AVSET_SHARE = 0.6, 0.25  # the rest are standalone VMs
ROLLING_SHARE = 0.5  # of the regular scale sets: those tagged maintenance: rolling

Kind = str  # "scale_set" | "avset" | "standalone"


@dataclass(frozen=True, slots=True)
class Vm:
    """One VM: `index` in the fleet, and what instance metadata says about it."""

    index: int
    vm_id: str
    name: str
    kind: Kind
    subscription: str
    resource_group: str
    scale_set: str | None
    placement_group: int | None  # within its scale set
    avset: str | None
    zone: str | None
    fault_domain: int
    update_domain: int
    spot: bool
    tags: tuple[tuple[str, str], ...]

    @property
    def scope(self) -> tuple[str, str, str | None]:
        """Where Azure keeps the VM's name unique: subscription, resource group, scale set."""
        return (self.subscription, self.resource_group, self.scale_set)

    @property
    def scale_set_key(self) -> tuple[str, str, str] | None:
        """The scale set as Azure identifies it (the subscription included)."""
        if self.scale_set is None:
            return None
        return (self.subscription, self.resource_group, self.scale_set)

    @property
    def avset_key(self) -> tuple[str, str, str] | None:
        if self.avset is None:
            return None
        return (self.subscription, self.resource_group, self.avset)

    def tag(self, name: str) -> str | None:
        return next((v for k, v in self.tags if k == name), None)

    def origin(self) -> Origin:
        """The agent's identity as it reads it from instance metadata."""
        identity = VmIdentity(
            vm_id=self.vm_id,
            vm_name=self.name,
            resource_id=self.resource_id,
            subscription_id=self.subscription,
            resource_group=self.resource_group,
            location=LOCATION,
            zone=self.zone,
            vm_scale_set_name=self.scale_set,
            platform_fault_domain=self.fault_domain,
            platform_update_domain=self.update_domain,
            tags=self.tags,
        )
        return Origin(identity, host_name=self.host_name)

    @property
    def resource_id(self) -> str:
        group = f"/subscriptions/{self.subscription}/resourceGroups/{self.resource_group}"
        if self.scale_set is None:
            return f"{group}/providers/Microsoft.Compute/virtualMachines/{self.name}"
        instance = self.name.rsplit("_", 1)[-1]
        return (
            f"{group}/providers/Microsoft.Compute/virtualMachineScaleSets/{self.scale_set}"
            f"/virtualMachines/{instance}"
        )

    @property
    def host_name(self) -> str:
        # Scale-set instances have computer names unlike their instance names, as in Azure.
        if self.scale_set is not None:
            return f"{self.scale_set}{self.index:06x}"
        return self.name


@dataclass
class Fleet:
    """Every VM, and the sets they belong to (lists of VM indices)."""

    seed: int
    vms: list[Vm]
    scale_sets: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    placement_groups: dict[tuple[str, str, str, int], list[int]] = field(default_factory=dict)
    avsets: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    standalone: list[int] = field(default_factory=list)
    _by_id: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for vm in self.vms:
            self._by_id[vm.vm_id] = vm.index
            if vm.scale_set_key is not None:
                self.scale_sets.setdefault(vm.scale_set_key, []).append(vm.index)
                pg = (*vm.scale_set_key, vm.placement_group or 0)
                self.placement_groups.setdefault(pg, []).append(vm.index)
            elif vm.avset_key is not None:
                self.avsets.setdefault(vm.avset_key, []).append(vm.index)
            else:
                self.standalone.append(vm.index)

    def __len__(self) -> int:
        return len(self.vms)

    def __iter__(self) -> Iterator[Vm]:
        return iter(self.vms)

    def by_vm_id(self, vm_id: str) -> Vm | None:
        index = self._by_id.get(vm_id.lower())
        return None if index is None else self.vms[index]

    def spot(self) -> list[int]:
        return [vm.index for vm in self.vms if vm.spot]

    def neighbours(self, index: int) -> list[int]:
        """The VMs an event of VM `index` reaches as Microsoft documents it ("all the VMs in
        an availability set", "in a scale set placement group"): its own set's, itself
        included; a standalone VM alone."""
        vm = self.vms[index]
        if vm.scale_set_key is not None:
            key = (*vm.scale_set_key, vm.placement_group or 0)
            return self.placement_groups[key]
        if vm.avset_key is not None:
            return self.avsets[vm.avset_key]
        return [index]

    def summary(self) -> str:
        subs = len({vm.subscription for vm in self.vms})
        groups = len({(vm.subscription, vm.resource_group) for vm in self.vms})
        in_sets = sum(len(v) for v in self.scale_sets.values())
        in_avsets = sum(len(v) for v in self.avsets.values())
        return (
            f"{len(self.vms):,} VMs (seed {self.seed}): {subs} subscriptions, {groups} "
            f"resource groups; {len(self.scale_sets)} scale sets ({in_sets:,} VMs, "
            f"{len(self.placement_groups)} placement groups), {len(self.avsets)} "
            f"availability sets ({in_avsets:,} VMs), {len(self.standalone):,} standalone; "
            f"{len(self.spot()):,} Spot VMs"
        )


def build(size: int, seed: int = 1, *, spot_share: float = 0.1) -> Fleet:
    """The fleet of `size` VMs that `seed` describes."""
    if size < 1:
        raise ValueError("a fleet has at least one VM")
    rng = random.Random(seed)
    builder = _Builder(rng, seed, size)
    spot_target = round(size * spot_share)
    sets_target = round(size * SCALE_SET_SHARE)
    avset_target = round(size * AVSET_SHARE)
    # Most Spot capacity runs in Spot scale sets; the rest are standalone Spot VMs.
    spot_in_sets = min(round(spot_target * 0.7), sets_target)
    builder.scale_sets(spot_in_sets, spot=True)
    builder.scale_sets(sets_target - spot_in_sets, spot=False)
    builder.avsets(avset_target)
    spot_left = max(0, spot_target - spot_in_sets)
    builder.standalone(size - builder.count, spot=spot_left)
    return Fleet(seed, builder.vms)


class _Builder:
    def __init__(self, rng: random.Random, seed: int, size: int) -> None:
        self.rng, self.seed = rng, seed
        self.vms: list[Vm] = []
        # Two at least from a few hundred VMs on, so small fleets also repeat resource group
        # names across subscriptions.
        subscriptions = max(1 if size < 200 else 2, math.ceil(size / VMS_PER_SUBSCRIPTION))
        per_sub = max(1, min(len(RG_NAMES), size // 100))
        self.groups = [
            (str(record_id("loadgen-subscription", seed, s)), RG_NAMES[g])
            for s in range(subscriptions)
            for g in range(per_sub)
        ]
        self.used: dict[tuple[str, str], set[str]] = {}  # names of sets per resource group
        self.standalone_names: dict[tuple[str, str], int] = {}
        self.rolling = False  # a scale set tagged maintenance: rolling was made

    @property
    def count(self) -> int:
        return len(self.vms)

    def _vm(
        self,
        name: str,
        kind: Kind,
        group: tuple[str, str],
        *,
        scale_set: str | None = None,
        placement_group: int | None = None,
        avset: str | None = None,
        zone: str | None = None,
        fault_domain: int = 0,
        update_domain: int = 0,
        spot: bool = False,
        tags: tuple[tuple[str, str], ...] = (),
    ) -> None:
        index = len(self.vms)
        vm_id = str(record_id("loadgen-vm", self.seed, index))
        self.vms.append(
            Vm(
                index,
                vm_id,
                name,
                kind,
                group[0],
                group[1],
                scale_set,
                placement_group,
                avset,
                zone,
                fault_domain,
                update_domain,
                spot,
                tags,
            )
        )

    def _set_name(self, group: tuple[str, str], names: tuple[str, ...]) -> str:
        taken = self.used.setdefault(group, set())
        free = [n for n in names if n not in taken]
        name = self.rng.choice(free) if free else f"{self.rng.choice(names)}{len(taken)}"
        taken.add(name)
        return name

    def scale_sets(self, total: int, *, spot: bool) -> None:
        left = total
        while left > 0:
            size = min(left, self.rng.choice(SET_SIZES))
            group = self.rng.choice(self.groups)
            name = self._set_name(group, SPOT_SET_NAMES if spot else SET_NAMES)
            env = "prod" if group[1] in ("rg-prod", "rg-web", "rg-data") else "stage"
            tags: list[tuple[str, str]] = [("env", env), ("tier", name)]
            if spot:
                tags.append(("spot", "true"))
            elif self.rng.random() < ROLLING_SHARE or not self.rolling:
                # The first regular scale set rolls, so that even a small fleet has one.
                tags.append(("maintenance", "rolling"))
                self.rolling = True
            shared = tuple(sorted(tags))
            for i in range(size):
                self._vm(
                    f"{name}_{i}",
                    "scale_set",
                    group,
                    scale_set=name,
                    placement_group=i // PLACEMENT_GROUP,
                    zone=str(1 + i % 3),
                    fault_domain=(i // 3) % 5,
                    update_domain=i % 5,
                    spot=spot,
                    tags=shared,
                )
            left -= size

    def avsets(self, total: int) -> None:
        left = total
        while left > 0:
            size = min(left, self.rng.choice(AVSET_SIZES))
            group = self.rng.choice(self.groups)
            name = self._set_name(group, AVSET_NAMES)
            env = "prod" if group[1] in ("rg-prod", "rg-web", "rg-data") else "stage"
            # The subscription is part of the tag: a budget per availability set must not
            # join two sets of the same name in two subscriptions.
            label = f"{group[0][:8]}/{group[1]}/{name}"
            shared = tuple(sorted([("avset", label), ("env", env), ("tier", name)]))
            for i in range(size):
                self._vm(
                    f"{name}-{i}",
                    "avset",
                    group,
                    avset=name,
                    fault_domain=i % 3,
                    update_domain=i % 5,
                    tags=shared,
                )
            left -= size

    def standalone(self, total: int, *, spot: int) -> None:
        plain = (("env", "stage"), ("tier", "standalone"))
        spotted = (("env", "stage"), ("spot", "true"), ("tier", "standalone"))
        for i in range(total):
            group = self.rng.choice(self.groups)
            number = self.standalone_names.get(group, 0)
            self.standalone_names[group] = number + 1
            zone = self.rng.choice((None, "1", "2", "3"))
            is_spot = i < spot
            self._vm(
                f"vm-{number}",
                "standalone",
                group,
                zone=zone,
                spot=is_spot,
                tags=spotted if is_spot else plain,
            )
