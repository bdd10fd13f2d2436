"""The simulated VMs: their names, ids and the instance metadata IMDS serves for each.

Everything is derived from a seed, so the same spec and seed always give the same names,
vmIds, subscription and IP addresses (tests rely on that).

Fleet file (`se-bridge simulate --fleet FILE`) is JSON; every key is optional:

    {
      "subscriptionId": "2f1c...",          default: derived from the seed
      "resourceGroupName": "rg-se-bridge-sim",
      "location": "westeurope",
      "vms": [                               standalone VMs
        {"name": "app-0", "zone": "1", "vmSize": "Standard_D2s_v5", "osType": "Linux",
         "tags": {"role": "app"}, "priority": "Regular", "documentIncarnation": 7}
      ],
      "availabilitySets": [                  members db-0, db-1, db-2; fault/update domain = index
        {"name": "db", "count": 3, "vmSize": "Standard_E4s_v5", "tags": {"role": "db"}}
      ],
      "scaleSets": [                         members web_0, web_1, web_2; web_2 is a Spot VM
        {"name": "web", "count": 3, "spot": [2], "zones": ["1", "2", "3"]}
      ]
    }

`vmSize`, `osType`, `tags` and `priority` ("Regular" or "Spot") are accepted on a VM and on
a set (then they apply to every member). `documentIncarnation` sets a VM's starting
DocumentIncarnation; by default each VM starts at its own seeded value, as real VMs do.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_RESOURCE_GROUP = "rg-se-bridge-sim"
DEFAULT_LOCATION = "westeurope"


class FleetSpecError(ValueError):
    """The fleet spec or file is unusable; the message names the offending key."""


@dataclass(frozen=True)
class Vm:
    """One simulated VM and what its instance metadata says about it."""

    name: str
    vm_id: str
    subscription_id: str
    resource_group: str
    location: str
    client_id: str
    private_ip: str
    mac_address: str
    initial_incarnation: int
    zone: str = ""
    availability_set: str = ""
    vm_scale_set_name: str = ""
    platform_fault_domain: int = 0
    platform_update_domain: int = 0
    tags: tuple[tuple[str, str], ...] = ()
    os_type: str = "Linux"
    vm_size: str = "Standard_D2s_v5"
    priority: str = "Regular"

    @property
    def group(self) -> str:
        """The set whose members all see each other's events ("" for a standalone VM)."""
        if self.vm_scale_set_name:
            return f"vmss:{self.vm_scale_set_name}"
        if self.availability_set:
            return f"avset:{self.availability_set}"
        return ""

    @property
    def resource_id(self) -> str:
        base = f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
        base += "/providers/Microsoft.Compute"
        if self.vm_scale_set_name:
            instance = self.name.rsplit("_", 1)[-1]
            scale_set = f"{base}/virtualMachineScaleSets/{self.vm_scale_set_name}"
            return f"{scale_set}/virtualMachines/{instance}"
        return f"{base}/virtualMachines/{self.name}"

    @property
    def events_scope(self) -> str:
        """The compute resource Azure keeps this VM's scheduled events under (Event Grid's
        deliveries name it, ARM's acknowledge is addressed to it): its scale set, its
        availability set, or the VM itself."""
        base = f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
        base += "/providers/Microsoft.Compute"
        if self.vm_scale_set_name:
            return f"{base}/virtualMachineScaleSets/{self.vm_scale_set_name}"
        if self.availability_set:
            return f"{base}/availabilitySets/{self.availability_set}"
        return f"{base}/virtualMachines/{self.name}"

    def instance_metadata(self) -> dict[str, Any]:
        """The /metadata/instance document (api-version 2021-02-01 shape, abridged).

        Trimmed real sample (Microsoft's IMDS docs); note every leaf is a string:

            "compute": {"location": "westus", "name": "examplevmname",
                        "platformFaultDomain": "36", "platformUpdateDomain": "42",
                        "resourceGroupName": "macikgo-test-may-23",
                        "subscriptionId": "xxxxxxxx-xxxxx-xxx-xxx-xxxx",
                        "tags": "baz:bash;foo:bar",
                        "tagsList": [{"name": "baz", "value": "bash"}, ...],
                        "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
                        "vmScaleSetName": "crpteste9vflji9", "vmSize": "Standard_A3",
                        "zone": ""},
            "network": {"interface": [{"ipv4": {"ipAddress": [{"privateIpAddress":
                        "10.144.133.132", "publicIpAddress": ""}], "subnet": [{"address":
                        "10.144.133.128", "prefix": "26"}]}, "ipv6": {"ipAddress": []},
                        "macAddress": "0011AAFFBB22"}]}
        """
        return {"compute": self._compute(), "network": self._network()}

    def _compute(self) -> dict[str, Any]:
        spot = self.priority == "Spot"
        windows = self.os_type == "Windows"
        return {
            "azEnvironment": "AzurePublicCloud",
            "evictionPolicy": "Deallocate" if spot else "",
            "location": self.location,
            "name": self.name,
            "offer": "WindowsServer" if windows else "0001-com-ubuntu-server-jammy",
            "osProfile": {"adminUsername": "azureuser", "computerName": self.name.replace("_", "")},
            "osType": self.os_type,
            "placementGroupId": "",
            "platformFaultDomain": str(self.platform_fault_domain),
            "platformUpdateDomain": str(self.platform_update_domain),
            "priority": self.priority,
            "provider": "Microsoft.Compute",
            "publisher": "MicrosoftWindowsServer" if windows else "canonical",
            "resourceGroupName": self.resource_group,
            "resourceId": self.resource_id,
            "subscriptionId": self.subscription_id,
            "tags": ";".join(f"{k}:{v}" for k, v in self.tags),
            "tagsList": [{"name": k, "value": v} for k, v in self.tags],
            "vmId": self.vm_id,
            "vmScaleSetName": self.vm_scale_set_name,
            "vmSize": self.vm_size,
            "zone": self.zone,
        }

    def _network(self) -> dict[str, Any]:
        subnet = self.private_ip.rsplit(".", 1)[0] + ".0"
        return {
            "interface": [
                {
                    "ipv4": {
                        "ipAddress": [{"privateIpAddress": self.private_ip, "publicIpAddress": ""}],
                        "subnet": [{"address": subnet, "prefix": "24"}],
                    },
                    "ipv6": {"ipAddress": []},
                    "macAddress": self.mac_address,
                }
            ]
        }


class _Builder:
    """Hands out seeded ids and addresses in creation order, so fleets are reproducible."""

    def __init__(self, spec: Mapping[str, Any], seed: int) -> None:
        # Not for security: ids only need to look real and repeat for the same seed.
        self._rng = random.Random(f"fleet-{seed}")  # noqa: S311
        self.subscription = str(spec.get("subscriptionId") or self._uuid())
        self.resource_group = str(spec.get("resourceGroupName", DEFAULT_RESOURCE_GROUP))
        self.location = str(spec.get("location", DEFAULT_LOCATION))
        self.vms: list[Vm] = []

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def add(self, name: str, opts: Mapping[str, Any], **placement: Any) -> None:
        if any(vm.name == name for vm in self.vms):
            raise FleetSpecError(f"VM name {name!r} is used twice in the fleet spec")
        index = len(self.vms)
        mac = "".join(f"{b:02X}" for b in [0x00, 0x0D, 0x3A, *self._rng.sample(range(256), 3)])
        self.vms.append(
            Vm(
                name=name,
                vm_id=self._uuid(),
                subscription_id=self.subscription,
                resource_group=self.resource_group,
                location=self.location,
                client_id=self._uuid(),
                private_ip=f"10.0.{index // 250}.{4 + index % 250}",
                mac_address=mac,
                initial_incarnation=int(opts.get("documentIncarnation", self._rng.randint(2, 199))),
                tags=_tags(opts.get("tags", {}), name),
                os_type=str(opts.get("osType", "Linux")),
                vm_size=str(opts.get("vmSize", "Standard_D2s_v5")),
                priority=_priority(opts.get("priority", "Regular"), name),
                **placement,
            )
        )


def _tags(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise FleetSpecError(f"{where}: 'tags' must be an object of name: value")
    return tuple((str(k), str(v)) for k, v in value.items())


def _priority(value: Any, where: str) -> str:
    if value not in ("Regular", "Spot"):
        raise FleetSpecError(f"{where}: 'priority' must be 'Regular' or 'Spot', not {value!r}")
    return str(value)


def _count(entry: Mapping[str, Any], where: str) -> int:
    count = entry.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1000:
        raise FleetSpecError(f"{where}: 'count' must be an integer from 1 to 1000")
    return count


def _entries(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    entries = spec.get(key, [])
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        raise FleetSpecError(f"'{key}' must be a list of objects")
    for i, entry in enumerate(entries):
        if not isinstance(entry.get("name"), str) or not entry["name"]:
            raise FleetSpecError(f"{key}[{i}]: 'name' is required and must be a string")
    return entries


def vms_from_spec(spec: Mapping[str, Any], seed: int = 0) -> list[Vm]:
    """Build VMs from a fleet spec (the fleet file format in this module's docstring)."""
    if not isinstance(spec, Mapping):
        raise FleetSpecError("the fleet spec must be a JSON object")
    builder = _Builder(spec, seed)
    for entry in _entries(spec, "vms"):
        builder.add(entry["name"], entry, zone=str(entry.get("zone", "")))
    for entry in _entries(spec, "availabilitySets"):
        name = entry["name"]
        for i in range(_count(entry, name)):
            domains = {"platform_fault_domain": i % 3, "platform_update_domain": i % 5}
            builder.add(f"{name}-{i}", entry, availability_set=name, **domains)
    for entry in _entries(spec, "scaleSets"):
        _add_scale_set(builder, entry)
    if not builder.vms:
        raise FleetSpecError("the fleet spec defines no VMs")
    return builder.vms


def _add_scale_set(builder: _Builder, entry: Mapping[str, Any]) -> None:
    name = entry["name"]
    spot = entry.get("spot", [])
    zones = entry.get("zones", [])
    if not isinstance(spot, list) or not isinstance(zones, list):
        raise FleetSpecError(f"{name}: 'spot' and 'zones' must be lists")
    for i in range(_count(entry, name)):
        opts = dict(entry)
        if i in spot:
            opts["priority"] = "Spot"
        zone = str(zones[i % len(zones)]) if zones else ""
        builder.add(
            f"{name}_{i}",
            opts,
            vm_scale_set_name=name,
            zone=zone,
            platform_fault_domain=i % 5,
            platform_update_domain=i % 5,
        )


# Two standalone VMs, an availability set of three and a scale set of three whose last
# instance is Spot: enough to show every scenario, small enough to read in a terminal.
DEMO_SPEC: Mapping[str, Any] = {
    "vms": [
        {"name": "vm-0", "zone": "1", "tags": {"role": "app"}},
        {"name": "vm-1", "zone": "2", "osType": "Windows", "tags": {"role": "app"}},
    ],
    "availabilitySets": [{"name": "db", "count": 3, "tags": {"role": "db"}}],
    "scaleSets": [{"name": "web", "count": 3, "spot": [2], "zones": ["1", "2", "3"]}],
}


def demo_vms(seed: int = 0) -> list[Vm]:
    """The default demo fleet: vm-0, vm-1, db-0..db-2 (availability set), web_0..web_2."""
    return vms_from_spec(DEMO_SPEC, seed)


def numbered_vms(count: int, seed: int = 0) -> list[Vm]:
    """`count` standalone VMs named vm-0, vm-1, ..."""
    return vms_from_spec({"vms": [{"name": f"vm-{i}"} for i in range(count)]}, seed)


def load_fleet_file(path: str | Path, seed: int = 0) -> list[Vm]:
    """Read a fleet file; FleetSpecError names the file and what is wrong with it."""
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FleetSpecError(f"cannot read fleet file {path}: {exc}") from exc
    try:
        return vms_from_spec(spec, seed)
    except FleetSpecError as exc:
        raise FleetSpecError(f"fleet file {path}: {exc}") from exc


def group_members(vms: Sequence[Vm], vm: Vm) -> list[str]:
    """Every VM that sees `vm`'s events: its whole set, or just itself when standalone."""
    if not vm.group:
        return [vm.name]
    return [other.name for other in vms if other.group == vm.group]
