"""`sluice.core.frozen.fast_init`: a faster `__init__` that changes nothing else about a
frozen, slotted dataclass."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import InitVar, dataclass, field

import pytest

from sluice.core.frozen import fast_init
from sluice.policy.autoscale.windows import SlidingMean


@fast_init
@dataclass(frozen=True, slots=True)
class _Value:
    a: int
    b: str = "x"
    c: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: str = "x"
    c: dict[str, int] = field(default_factory=dict)


@fast_init
@dataclass(frozen=True, slots=True)
class _Sub(_Value):
    """A subclass: its own slots hold only `d`; `a`, `b` and `c` are set through the
    parent's."""

    d: float = 0.5


def test_a_subclass_sets_its_parents_fields_too() -> None:
    v = _Sub(1, "y", {"k": 1}, 2.5)
    assert (v.a, v.b, v.c, v.d) == (1, "y", {"k": 1}, 2.5)
    assert _Sub(1) == _Sub(1, "x", {}, 0.5) and _Sub(1) != _Value(1)
    assert pickle.loads(pickle.dumps(v)) == v
    assert dataclasses.replace(v, d=3.0).d == 3.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.a = 2  # type: ignore[misc]


def test_builds_the_same_value_as_the_dataclass_init() -> None:
    for args, kwargs in [((1,), {}), ((1, "y"), {}), ((1,), {"c": {"k": 2}}), ((), {"a": 3})]:
        fast, plain = _Value(*args, **kwargs), _Plain(*args, **kwargs)
        assert (fast.a, fast.b, fast.c) == (plain.a, plain.b, plain.c)
    assert _Value(1) == _Value(1, "x", {})
    assert _Value(1).c is not _Value(1).c  # a fresh default from the factory each time


def test_same_signature_and_errors() -> None:
    assert str(inspect.signature(_Value.__init__)) == str(inspect.signature(_Plain.__init__))
    with pytest.raises(TypeError):
        _Value()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Value(1, "x", {}, 4)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Value(1, d=2)  # type: ignore[call-arg]


def test_still_frozen_comparable_picklable_replaceable() -> None:
    v = _Value(1, "y", {"k": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.a = 2  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(v)) == v
    assert dataclasses.replace(v, b="z") == _Value(1, "z", {"k": 1})
    assert repr(v) == "_Value(a=1, b='y', c={'k': 1})"
    w = SlidingMean(30.0).add(1.0, 2.0)  # one of the policy's values
    assert pickle.loads(pickle.dumps(w)) == w and w.count == 1


def test_refuses_what_it_does_not_rebuild() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclass(frozen=True, slots=True)
    class KwOnly:
        a: int
        b: int = field(default=0, kw_only=True)

    @dataclass(frozen=True, slots=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        scale: InitVar[int] = 1

    @dataclass(frozen=True, slots=True)
    class NotInInit:
        a: int
        b: int = field(default=0, init=False)

    for cls in (NoSlots, NotFrozen, KwOnly, PostInit, WithInitVar, NotInInit):
        with pytest.raises(TypeError):
            fast_init(cls)
