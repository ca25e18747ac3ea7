"""A faster `__init__` for the frozen, slotted dataclasses a controller tick builds by the
ten thousand (windows, memories, decisions, claims, grants).

A frozen dataclass's generated `__init__` sets each field through `object.__setattr__`
(its own `__setattr__` refuses): a global lookup, an attribute lookup, then a search of
the class for the field's slot, ~100 ns a field. `fast_init` gives the class an `__init__`
with the same signature that sets each field through its slot's descriptor directly, the
search done once, at import: about half the cost (an 11-field value: 1.14 -> 0.57 us).
Nothing else changes: the class stays frozen (assignment still raises
`FrozenInstanceError`), compares, hashes, pickles and `dataclasses.replace`s as before.

Only for what a plain frozen slotted dataclass is: every field in `__init__`, positional
or keyword, no `__post_init__`, no `InitVar`; anything else raises TypeError at import.
Apply it above `@dataclass`:

    @fast_init
    @dataclass(frozen=True, slots=True)
    class Window: ...
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """`cls` with an `__init__` that sets its slots directly (module docstring)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"fast_init: {cls.__name__} is not a frozen, slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"fast_init: {cls.__name__} has a __post_init__")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # a dataclass, checked above
    generated = inspect.signature(cls.__init__).parameters.values()
    plain = [p.name for p in generated if p.kind is p.POSITIONAL_OR_KEYWORD]
    if plain != ["self", *(f.name for f in fields)] or len(plain) != len(generated):
        raise TypeError(f"fast_init: {cls.__name__} has a field outside a plain __init__")
    names: dict[str, Any] = {"_FACTORY": _FACTORY}
    args: list[str] = []
    lines: list[str] = []
    for f in fields:
        # the slot's descriptor, in the class that declares the field (a subclass's own
        # __slots__ hold only its new fields)
        owner = next(c for c in cls.__mro__ if f.name in c.__dict__)
        names[f"_set_{f.name}"] = owner.__dict__[f.name].__set__
        value = f.name
        if f.default is not dataclasses.MISSING:
            names[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            names[f"_factory_{f.name}"] = f.default_factory
            args.append(f"{f.name}=_FACTORY")
            value = f"_factory_{f.name}() if {f.name} is _FACTORY else {f.name}"
        else:
            args.append(f.name)
        lines.append(f"    _set_{f.name}(self, {value})")
    source = f"def __init__(self, {', '.join(args)}):\n" + ("\n".join(lines) or "    pass")
    exec(source, names)  # the way dataclasses builds its own __init__
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(getattr(cls.__init__, "__annotations__", {}))
    cls.__init__ = init  # type: ignore[method-assign]  # the same signature, a faster body
    return cls


class _Factory:
    """The default of a field with a `default_factory`: call the factory."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()
