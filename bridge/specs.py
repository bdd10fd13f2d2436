"""`KIND` or `KIND:ARGUMENT` specs, as in `--sink jsonl:PATH`, `--commands local:DIR` or
`--state sqlite:PATH`: one parser, so every spec is read and refused the same way."""

from __future__ import annotations

from collections.abc import Mapping


def split(spec: str, what: str, kinds: Mapping[str, str | None]) -> tuple[str, str]:
    """(kind, argument) of `spec`; ValueError naming what is wrong.

    `kinds` maps each kind to an example of its argument (`/var/lib/x`), or to None when
    the kind takes none (its settings come from the configuration instead).
    """
    kind, _, arg = spec.partition(":")
    kind, arg = kind.strip().lower(), arg.strip()
    shapes = [k if example is None else f"{k}:{example.split('/')[-1].upper()}"
              for k, example in kinds.items()]  # fmt: skip
    if kind not in kinds:
        raise ValueError(f"unknown {what} {spec!r}: expected one of {', '.join(shapes)}")
    example = kinds[kind]
    if example is not None and not arg:
        raise ValueError(f"{what} {spec!r} needs an argument, as in {kind}:{example}")
    if example is None and arg:
        raise ValueError(f"{what} {spec!r} takes no argument (its settings are in the config)")
    return kind, arg
