"""The markers a test gets from what it needs, so that a new test is marked without a thought.

A test is marked by the fixtures it uses (`azurite`, `broker`, `procs`), by the directory it is in
(tests/e2e, tests/infra, tests/packaging, tests/docs, tests/fuzz) and by what its code reaches:
the test function, its fixtures and the helpers of tests/ they call are read (their code's names,
not run) for the classes and functions that start Azurite, the Event Hubs broker or se-bridge
processes. `slow` is otherwise given by hand, to a test that takes seconds on its own.
`./dev test --fast` deselects every marker in HEAVY; pyproject.toml registers them.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import PurePath
from typing import Any

HEAVY = ("azurite", "broker", "subprocess", "tools", "e2e", "slow", "image", "release", "browser")
FAST = "not (" + " or ".join(HEAVY) + ")"

BY_FIXTURE = {
    "azurite": "azurite",
    "broker": "broker",
    "procs": "subprocess",
    "chromium": "browser",
}
BY_DIRECTORY = {
    "e2e": ("e2e", "subprocess"),
    "infra": ("tools",),
    "packaging": ("tools",),
    "docs": ("tools",),
    "fuzz": ("slow",),  # hypothesis, 200 examples of hostile input per parser
    "image": ("image", "subprocess"),  # podman builds the image and runs it
}


def by_directory(path: PurePath, tests_root: PurePath) -> set[str]:
    """The markers of the directory `path` is in, under tests/."""
    parts = path.relative_to(tests_root).parts
    return set(BY_DIRECTORY.get(parts[0], ())) if len(parts) > 1 else set()


def reached(
    functions: Iterable[Callable[..., Any]],
    marks: dict[object, str],
    depth: int = 4,
    by_name: bool = True,
) -> set[str]:
    """The markers of the objects in `marks` that `functions` name, or that the helpers of tests/
    they call name, down to `depth` calls; with `by_name`, also of the fixtures they ask for by
    name (a parametrized fixture marks the params that need one itself, with pytest.param)."""
    found: set[str] = set()
    seen: set[int] = set()
    frontier = [_code_of(f) for f in functions]
    for _ in range(depth):
        following: list[tuple[types.CodeType, dict[str, Any]]] = []
        for code, scope in (c for c in frontier if c is not None):
            if id(code) in seen:
                continue
            seen.add(id(code))
            if by_name and "getfixturevalue" in _names(code):
                # request.getfixturevalue("azurite"): a fixture asked for by name at run time.
                found |= {BY_FIXTURE[c] for c in _strings(code) if c in BY_FIXTURE}
            for value in _named(code, scope):
                if _hashable(value) and value in marks:
                    found.add(marks[value])
                following.extend(_helpers_in(value))
        frontier = list(following)
    return found


def _code_of(function: Callable[..., Any]) -> tuple[types.CodeType, dict[str, Any]] | None:
    # Hypothesis wraps a test; what it runs is the inner test.
    inner = getattr(getattr(function, "hypothesis", None), "inner_test", function)
    inner = inspect.unwrap(inner)
    code = getattr(inner, "__code__", None)
    return (code, inner.__globals__) if isinstance(code, types.CodeType) else None


@cache
def _names(code: types.CodeType) -> frozenset[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return frozenset(names)


@cache
def _strings(code: types.CodeType) -> frozenset[str]:
    strings = {c for c in code.co_consts if isinstance(c, str)}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            strings |= _strings(const)
    return frozenset(strings)


def _named(code: types.CodeType, scope: dict[str, Any]) -> Iterator[object]:
    names = _names(code)
    for name in names:
        if name not in scope:
            continue
        value = scope[name]
        yield value
        if isinstance(value, types.ModuleType) and _ours(value.__name__):
            # `killtools.spawn_agent`: the names after a module of tests/ are looked up in it.
            yield from (getattr(value, n) for n in names if hasattr(value, n))


def _helpers_in(value: object) -> Iterator[tuple[types.CodeType, dict[str, Any]]]:
    if isinstance(value, types.FunctionType) and _ours(value.__module__):
        found = _code_of(value)
        if found is not None:
            yield found
    elif isinstance(value, type) and _ours(value.__module__):
        for attribute in vars(value).values():
            function = attribute.fget if isinstance(attribute, property) else attribute
            if isinstance(function, (staticmethod, classmethod)):
                function = function.__func__
            if isinstance(function, types.FunctionType):
                found = _code_of(function)
                if found is not None:
                    yield found


def _ours(module: str) -> bool:
    return module == "tests" or module.startswith("tests.")


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
