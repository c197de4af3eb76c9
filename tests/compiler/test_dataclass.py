"""rlc.core.dataclass: classes built with methods shared instead of compiled behave as the standard library's
dataclasses, class by class: the same fields, doc, construction, errors, equality, hashing, repr and freezing."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
import pkgutil
from functools import partial
from typing import Any

import pytest
from rlc.core import dataclass as lean


def _pair(frozen: bool) -> tuple[type, type]:
    """The same class body built by dataclasses and by rlc.core.dataclass."""

    def body(name: str) -> type:
        return type(
            name,
            (),
            {
                "__annotations__": {
                    "role": str,
                    "size": "int",
                    "tags": list[str],
                    "extra": dict[str, Any],
                    "note": "str | None",
                    "hidden": int,
                    "made": list,
                },
                "__module__": __name__,
                "__qualname__": name,
                "size": 3,
                "tags": dataclasses.field(default_factory=lambda: ["a"]),
                "extra": dataclasses.field(default_factory=dict, compare=False),
                "note": dataclasses.field(default=None, repr=False),
                "hidden": dataclasses.field(default=7, init=False),
                "made": dataclasses.field(default_factory=list, init=False, hash=False),
            },
        )

    return dataclasses.dataclass(frozen=frozen)(body("Thing")), lean.dataclass(frozen=frozen)(body("Thing"))


def _outcome(call) -> Any:
    try:
        return ("ok", call())
    except Exception as exc:  # noqa: BLE001 - the exception itself is what is compared
        return (type(exc), str(exc))


CALLS = [
    ((), {}),
    (("p",), {}),
    (("p", 5), {}),
    (("p", 5, ["x"], {"k": 1}, "n"), {}),
    ((), {"role": "p", "note": "n"}),
    (("p",), {"size": 9, "tags": []}),
    (("p",), {"role": "q"}),
    ((), {"size": 1}),
    (("p",), {"bogus": 1}),
    (("p", 1, [], {}, None, 2), {}),
    (("p",), {"hidden": 1}),
]


@pytest.mark.parametrize("frozen", [False, True])
def test_a_class_behaves_as_the_standard_librarys(frozen):
    std, ours = _pair(frozen)
    assert ours.__doc__ == std.__doc__
    assert [(f.name, f.type, f.init, f.repr, f.compare, f.hash) for f in dataclasses.fields(ours)] == [
        (f.name, f.type, f.init, f.repr, f.compare, f.hash) for f in dataclasses.fields(std)
    ]
    assert ours.__match_args__ == std.__match_args__
    for param in ("init", "repr", "eq", "order", "unsafe_hash", "frozen"):
        assert getattr(ours.__dataclass_params__, param) == getattr(std.__dataclass_params__, param), param
    for args, kwargs in CALLS:
        a, b = _outcome(partial(std, *args, **kwargs)), _outcome(partial(ours, *args, **kwargs))
        if a[0] != "ok":
            assert b == a, (args, kwargs)
            continue
        x, y = a[1], b[1]
        assert repr(y) == repr(x)
        assert vars(y) == vars(x) and list(vars(y)) == list(vars(x))  # the same fields set, in the same order
        assert dataclasses.asdict(y) == dataclasses.asdict(x)
        assert y == copy.deepcopy(y)
        assert (y == dataclasses.replace(y, size=y.size + 1)) is False
        assert y == dataclasses.replace(y, extra={"other": 1})  # compare=False
        assert (y == x) is False  # another class, as two dataclasses are
    first, second = ours("p"), ours("p")
    assert first.tags is not second.tags and first.made is not second.made  # each instance has its own
    if frozen:
        assert _outcome(lambda: hash(first)) == _outcome(lambda: hash(std("p")))  # a list among the hashed fields
        hashable = ours("p", tags=("a",))
        assert hash(hashable) == hash(std("p", tags=("a",))) == hash(ours("p", tags=("a",), extra={"x": 1}))
        for attempt in (lambda: setattr(first, "size", 1), lambda: delattr(first, "role")):
            assert _outcome(attempt)[0] is dataclasses.FrozenInstanceError
        assert type(std("p").__hash__) is type(first.__hash__)
    else:
        assert ours.__hash__ is None
        first.size = 10
        assert first.size == 10


def test_what_the_class_body_defines_is_kept():
    @lean.dataclass
    class Own:
        x: int = 0

        def __repr__(self) -> str:
            return "mine"

        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    assert repr(Own()) == "mine" and Own(1) == Own(2) and hash(Own()) is not None


def test_post_init_runs_after_the_fields():
    @lean.dataclass
    class Derived:
        a: int
        b: int = 0

        def __post_init__(self) -> None:
            self.b = self.b or self.a * 2

    assert Derived(3).b == 6 and Derived(3, 1).b == 1


def test_unsupported_declarations_are_refused():
    with pytest.raises(TypeError, match="follows default argument"):
        lean.dataclass(type("Bad", (), {"__annotations__": {"a": int, "b": int}, "a": 1}))
    with pytest.raises(TypeError, match="keyword-only"):
        lean.dataclass(type("Kw", (), {"__annotations__": {"a": int}, "a": dataclasses.field(kw_only=True)}))
    with pytest.raises(TypeError, match="InitVar"):
        lean.dataclass(type("Iv", (), {"__annotations__": {"a": dataclasses.InitVar[int]}}))
    base = lean.dataclass(frozen=True)(type("Base", (), {"__annotations__": {"a": int}}))
    with pytest.raises(TypeError, match="frozen subclass"):
        lean.dataclass(frozen=True)(type("Sub", (base,), {"__annotations__": {"b": int}, "b": 0}))


def _rlc_lean_classes() -> list[type]:
    """Every class of rlc's light packages built by rlc.core.dataclass."""
    import rlc.compiler
    import rlc.core
    import rlc.spec

    marker = lean.dataclass(type("Marker", (), {})).__init__.__code__
    found = []
    for package in (rlc.core, rlc.spec, rlc.compiler):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if (
                    inspect.isclass(value)
                    and value.__module__ == module.__name__
                    and getattr(value.__init__, "__code__", None) is marker
                ):
                    found.append(value)
    return found


def test_rlc_classes_match_their_standard_twins():
    """Each of rlc's classes against a dataclasses twin of the same fields: the same doc and, where every field has
    a default, the same instance."""
    classes = _rlc_lean_classes()
    assert len(classes) > 80  # the spec's sections, the plan's and the compiled job's types, the compiler's results
    for cls in classes:
        fields = dataclasses.fields(cls)
        twin = dataclasses.make_dataclass(
            cls.__name__,
            [
                (
                    f.name,
                    f.type,
                    dataclasses.field(
                        default=f.default,
                        default_factory=f.default_factory,
                        init=f.init,
                        repr=f.repr,
                        compare=f.compare,
                        hash=f.hash,
                        metadata=f.metadata,
                    ),
                )
                for f in fields
            ],
            frozen=cls.__dataclass_params__.frozen,
        )
        if cls.__doc__.startswith(cls.__name__ + "("):  # undocumented: dataclasses writes the signature
            assert cls.__doc__ == twin.__doc__, cls
        if all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING for f in fields):
            ours, theirs = cls(), twin()
            assert [getattr(ours, f.name) for f in fields] == [getattr(theirs, f.name) for f in fields], cls
            assert repr(ours).split("(", 1)[1] == repr(theirs).split("(", 1)[1], cls
            assert pickle.loads(pickle.dumps(ours)) == ours, cls  # as Ray sends the compiled job's parts
