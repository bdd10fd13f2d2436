"""`KIND` or `KIND:ARGUMENT` specs, as in `--sink jsonl:PATH`, `--commands local:DIRECTORY` or
`--state sqlite:PATH`, and the registries of the kinds they name.

Sinks, command channels and fleet state stores each keep a `Kinds` registry of `Kind`s: one
parser, so every spec is read and refused the same way, and one door, `Kind.build`, the only
place a component's settings are read from the `Config`. A component itself takes its own
settings and an identity, as the Azure SDK's clients take an endpoint and a credential.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from bridge.config import Config, ConfigError

T = TypeVar("T")


def _nothing_to_check(argument: str, config: Config) -> None:
    """A kind whose settings cannot be wrong before it is used."""


@dataclass(frozen=True)
class Kind(Generic[T]):
    """One kind a spec may name.

    `example`: an argument as a person would write it (`/var/lib/se-bridge/hub`), or None when
    the kind takes none (its settings come from the configuration instead); `argument` says
    what that argument is ("path", "directory"). `build(argument, config)` makes the component;
    `check(argument, config)` raises ValueError naming the setting that would stop it (a
    component's own check, which cannot raise config's ConfigError), and is run at start-up,
    before anything runs, and before each build.
    """

    name: str
    example: str | None
    build: Callable[[str, Config], T]
    check: Callable[[str, Config], None] = _nothing_to_check
    argument: str = "path"

    @property
    def shape(self) -> str:
        """How the kind is written, as in `jsonl:PATH` or `stdout`."""
        return self.name if self.example is None else f"{self.name}:{self.argument.upper()}"


class Kinds(Generic[T]):
    """The kinds of one sort of component (`what`: "sink", "command channel", ...)."""

    def __init__(self, what: str, *kinds: Kind[T]) -> None:
        self.what = what
        self._kinds = {kind.name: kind for kind in kinds}

    def __iter__(self) -> Iterator[Kind[T]]:
        return iter(self._kinds.values())

    def parse(self, spec: str) -> tuple[Kind[T], str]:
        """The kind `spec` names and its argument; ValueError naming what is wrong."""
        name, _, argument = spec.partition(":")
        name, argument = name.strip().lower(), argument.strip()
        kind = self._kinds.get(name)
        if kind is None:
            shapes = ", ".join(k.shape for k in self._kinds.values())
            raise ValueError(f"unknown {self.what} {spec!r}: expected one of {shapes}")
        if kind.example is not None and not argument:
            raise ValueError(
                f"{self.what} {spec!r} needs a {kind.argument}, as in {name}:{kind.example}"
            )
        if kind.example is None and argument:
            raise ValueError(f"{self.what} {spec!r} takes no argument: write {name}")
        return kind, argument

    def check(self, spec: str, config: Config, setting: str) -> None:
        """ConfigError naming `setting` (where `spec` came from) unless it parses, then the
        kind's own check of its settings."""
        try:
            kind, argument = self.parse(spec)
        except ValueError as err:
            raise ConfigError(f"{setting}: {err}") from err
        _checked(kind, argument, config)

    def build(self, spec: str, config: Config) -> T:
        """The component `spec` names, with its settings from `config`; ValueError (a
        ConfigError where a setting is wrong) naming what is wrong."""
        kind, argument = self.parse(spec)
        _checked(kind, argument, config)
        return kind.build(argument, config)


def _checked(kind: Kind[T], argument: str, config: Config) -> None:
    """`kind.check`, its refusal a ConfigError: the message names the setting already."""
    try:
        kind.check(argument, config)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from err
