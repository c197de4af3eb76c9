"""`dataclass` for rlc's own classes: the standard library's fields, with methods shared instead of compiled.

`dataclasses.dataclass` writes each class's `__init__`, `__repr__` and `__eq__` (and a frozen class's `__setattr__`,
`__delattr__` and `__hash__`) as source text and compiles it: ~280 compilations for the ~100 classes built on the way
to `rlc validate`'s answer, about a quarter of that process before (bench/RESULTS.md). This decorator lets
`dataclasses` find the fields (so `fields`, `replace`, `asdict` and type checkers see a dataclass), then gives the
class methods made once here, which read the fields when they run. They behave as the generated ones (tests/compiler/
test_dataclass.py holds them equal); what differs is that `inspect.signature` of the class shows `(*args, **kwargs)`.
Not supported, refused when the class is built: `InitVar` and keyword-only fields, a frozen subclass of a dataclass
(and `order`, `slots`, which it does not take).
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda f: f


T = TypeVar("T")
MISSING: Any = dataclasses.MISSING


@overload
def dataclass(cls: type[T], /) -> type[T]: ...


@overload
def dataclass(*, frozen: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(field_specifiers=(dataclasses.field,))
def dataclass(cls: type[T] | None = None, /, *, frozen: bool = False) -> Any:
    """`@dataclass` or `@dataclass(frozen=True)`, as the standard library's."""

    def build(cls: type[T]) -> type[T]:
        return _build(cls, frozen)

    return build if cls is None else build(cls)


def _build(cls: type[T], frozen: bool) -> type[T]:
    if frozen and any(hasattr(b, "__dataclass_fields__") for b in cls.__mro__[1:]):
        # dataclasses, told frozen=False below, would check the bases against the wrong word
        raise TypeError(f"{cls.__qualname__}: a frozen subclass of a dataclass needs dataclasses.dataclass")
    own = dict(cls.__dict__)  # what the class body defines itself is kept, as dataclasses keeps it
    documented = bool(own.get("__doc__"))
    if not documented:
        cls.__doc__ = "-"  # keeps dataclasses from building a signature for the doc (written below, from the fields)
    cls = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    params = cls.__dataclass_params__  # type: ignore[attr-defined]  # built for this class alone: made to tell the truth
    params.init = params.repr = params.eq = True
    params.frozen = frozen
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    _refuse_unsupported(cls, fields)
    methods: dict[str, Any] = {"__init__": _init(cls, fields, frozen), "__repr__": _repr, "__eq__": _eq}
    if frozen:
        methods["__setattr__"], methods["__delattr__"] = _frozen(cls, fields)
    for name, method in methods.items():
        if name not in own:
            setattr(cls, name, method)
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    if not explicit_hash:
        cls.__hash__ = _hash if frozen else None  # type: ignore[assignment,method-assign]
    if not documented:
        cls.__doc__ = cls.__name__ + _signature_text(fields)
    return cls


def _refuse_unsupported(cls: type, fields: tuple[dataclasses.Field, ...]) -> None:
    real = {f.name for f in fields}
    pseudo = [f for name, f in cls.__dataclass_fields__.items() if name not in real]  # type: ignore[attr-defined]
    if any("InitVar" in str(f.type) for f in pseudo):
        raise TypeError(f"{cls.__qualname__}: InitVar fields need dataclasses.dataclass")
    if any(f.kw_only is True for f in fields):
        raise TypeError(f"{cls.__qualname__}: keyword-only fields need dataclasses.dataclass")
    seen_default = False
    for f in fields:
        if not f.init:
            continue
        if f.default is not MISSING or f.default_factory is not MISSING:
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")


_UNSET: Any = object()  # a field's place in the template that only an argument or its factory fills


def _init(cls: type, fields: tuple[dataclasses.Field, ...], frozen: bool) -> Callable[..., None]:
    names = tuple(f.name for f in fields if f.init)
    accepted = frozenset(names)
    required = tuple(f.name for f in fields if f.init and f.default is MISSING and f.default_factory is MISSING)
    # What __init__ assigns, in field order, each with its default; a field with init=False and a plain default is
    # read from the class attribute, as dataclasses leaves it.
    assigned = [f for f in fields if f.init or f.default_factory is not MISSING]
    template = {f.name: _UNSET if f.default is MISSING else f.default for f in assigned}
    factories: tuple[tuple[str, Any], ...] = tuple(
        (f.name, f.default_factory) for f in assigned if f.default_factory is not MISSING
    )
    every = len(names) == len(template)  # all that __init__ assigns are arguments (no init=False factories)
    # Writing the instance's __dict__ at once is what assigning each field does, unless the class intercepts it.
    direct = (frozen or cls.__setattr__ is object.__setattr__) and not any(
        hasattr(getattr(cls, name, None), "__set__") for name in template
    )
    assign = object.__setattr__ if frozen else setattr
    post_init = hasattr(cls, "__post_init__")
    where = f"{cls.__qualname__}.__init__()"

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if every and not kwargs and len(args) == len(names):  # every field given in order
            values = dict(zip(names, args))
        else:
            if len(args) > len(names):
                taken = _counted(len(names) - len(required), len(names))
                raise TypeError(f"{where} takes {taken} but {len(args) + 1} were given")
            if not accepted.issuperset(kwargs):
                unexpected = next(key for key in kwargs if key not in accepted)
                raise TypeError(f"{where} got an unexpected keyword argument {unexpected!r}")
            values = template.copy()  # field order, as dataclasses assigns
            if args:
                positional = dict(zip(names, args))
                twice = positional.keys() & kwargs.keys()
                if twice:
                    raise TypeError(f"{where} got multiple values for argument {min(twice)!r}")
                values.update(positional)
            values.update(kwargs)
            missing = [name for name in required if values[name] is _UNSET]
            if missing:
                raise TypeError(f"{where} missing {_missing(missing)}")
            for name, factory in factories:
                if values[name] is _UNSET:
                    values[name] = factory()
        if direct:
            self.__dict__.update(values)
        else:
            for name, value in values.items():
                assign(self, name, value)
        if post_init:
            self.__post_init__()

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


def _counted(optional: int, total: int) -> str:
    """CPython's words for how many positional arguments a method takes (self counted)."""
    low, high = total - optional + 1, total + 1
    return (
        f"{high} positional argument{'s' if high > 1 else ''}"
        if low == high
        else f"from {low} to {high} positional arguments"
    )


def _missing(names: list[str]) -> str:
    quoted = [repr(n) for n in names]
    listed = (
        quoted[0]
        if len(quoted) == 1
        else ", ".join(quoted[:-1]) + (" and " if len(quoted) == 2 else ", and ") + quoted[-1]
    )
    return f"{len(names)} required positional argument{'s' if len(names) > 1 else ''}: {listed}"


def _frozen(cls: type, fields: tuple[dataclasses.Field, ...]) -> tuple[Callable, Callable]:
    names = frozenset(f.name for f in fields)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)  # type: ignore[arg-type]  # mypy misreads the closure's cls

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)  # type: ignore[arg-type]

    __setattr__.__qualname__, __delattr__.__qualname__ = (
        f"{cls.__qualname__}.__setattr__",
        f"{cls.__qualname__}.__delattr__",
    )
    return __setattr__, __delattr__


def _values(obj: Any, which: Callable[[dataclasses.Field], bool]) -> tuple:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj) if which(f))


def _compared(f: dataclasses.Field) -> bool:
    return f.compare


def _hashed(f: dataclasses.Field) -> bool:
    return bool(f.compare if f.hash is None else f.hash)


def _eq(self: Any, other: Any) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self, _compared) == _values(other, _compared)


def _hash(self: Any) -> int:
    return hash(_values(self, _hashed))


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
    return f"{self.__class__.__qualname__}({shown})"


def _signature_text(fields: tuple[dataclasses.Field, ...]) -> str:
    """What dataclasses writes into an undocumented class's doc: its __init__'s signature."""
    import inspect  # click has imported it already; only an undocumented class gets here

    params = []
    for f in fields:
        if not f.init:
            continue
        text = f"{f.name}: {inspect.formatannotation(f.type)}"
        if f.default is not MISSING:
            text += f" = {f.default!r}"
        elif f.default_factory is not MISSING:
            text += " = <factory>"
        params.append(text)
    return f"({', '.join(params)})"
