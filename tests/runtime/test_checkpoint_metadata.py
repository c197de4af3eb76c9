"""A sharded checkpoint's `.metadata` (torch.distributed.checkpoint's pickle) is read with only what rlc writes
there, on every Python rlc supports: Python 3.11.0-3.11.4 pickle an enum member as `getattr(EnumClass, "NAME")`,
later ones as `EnumClass(value)`, and a checkpoint written under one must resume under the other."""

from __future__ import annotations

import enum
import io
import pickle

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from rlc.runtime.workers.common import check_metadata  # noqa: E402  (needs torch)


class EnumPickler(pickle.Pickler):
    """Pickles enum members in one of the two ways Pythons do, whatever Python runs the test, and keeps them."""

    as_getattr = False  # True: as Python 3.11.0-3.11.4 do, getattr(class, name); else class(value)

    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.enums: list[enum.Enum] = []

    def reducer_override(self, obj):
        if not isinstance(obj, enum.Enum):
            return NotImplemented
        self.enums.append(obj)
        return (getattr, (type(obj), obj.name)) if self.as_getattr else (type(obj), (obj.value,))


class OldEnumPickler(EnumPickler):
    as_getattr = True


def saved(tmp_path, name: str):
    """A real checkpoint directory, as the workers' save writes one (a model's sharded state dict)."""
    directory = tmp_path / name
    dcp.save({"model": torch.nn.Linear(3, 2).state_dict()}, checkpoint_id=str(directory))
    return directory


def repickled(directory, pickler: type[EnumPickler]) -> list[enum.Enum]:
    """Rewrite the directory's metadata as `pickler` writes it (the same checkpoint written by another Python);
    returns the enum members it holds."""
    path = directory / ".metadata"
    with open(path, "rb") as f:
        metadata = pickle.load(f)  # our own file, just written by dcp.save
    buffer = io.BytesIO()
    writer = pickler(buffer)
    writer.dump(metadata)
    path.write_bytes(buffer.getvalue())
    return writer.enums


@pytest.mark.parametrize("pickler", [OldEnumPickler, EnumPickler], ids=["python-3.11.0-3.11.4", "other-pythons"])
def test_a_checkpoint_from_either_pickle_of_enums_is_read_and_loads(tmp_path, pickler):
    directory = saved(tmp_path, "step")
    assert repickled(directory, pickler), "the metadata holds torch's enums: the case this test is about"
    check_metadata(directory)
    model = torch.nn.Linear(3, 2)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(directory))
    assert all(torch.equal(a, b) for a, b in zip(state["model"].values(), model.state_dict().values()))


class Attribute:
    """getattr(target, name) in a pickle; callable so that a pickle may call what it finds."""

    def __init__(self, target, name: str):
        self.target, self.name = target, name

    def __reduce__(self):
        return getattr, (self.target, self.name)

    def __call__(self, *args):
        raise AssertionError("only pickled, never called here")


class Call:
    """fn(*args) in a pickle."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args

    def __call__(self, *args):
        raise AssertionError("only pickled, never called here")


def shell_through_getattr(command: str) -> Call:
    """os.system(command), reached from a function the metadata may name through getattr and calls alone:
    _get_layout.__globals__.get("os").system(command)."""
    globals_ = Attribute(torch.serialization._get_layout, "__globals__")
    os_module = Call(Attribute(globals_, "get"), "os")
    return Call(Attribute(os_module, "system"), command)


def test_a_payload_hidden_behind_getattr_is_refused_before_it_runs(tmp_path, monkeypatch):
    marker = tmp_path / "PWNED"
    monkeypatch.setenv("RLC_PWNED", str(marker))
    payload = pickle.dumps({"state": shell_through_getattr('touch "$RLC_PWNED"')})
    (tmp_path / "step").mkdir()
    (tmp_path / "step" / ".metadata").write_bytes(payload)
    with pytest.raises(pickle.UnpicklingError, match="getattr"):
        check_metadata(tmp_path / "step")
    assert not marker.exists()
    pickle.loads(payload)  # the payload is live: a plain unpickler runs it
    assert marker.exists()


@pytest.mark.parametrize("name", ["__init_subclass__", "_missing_", "__call__", "mro", "NOT_A_MEMBER"])
def test_getattr_of_an_allowed_enum_is_refused_for_anything_but_a_members_name(tmp_path, name):
    directory = saved(tmp_path, "step")
    cls = type(repickled(directory, EnumPickler)[0])
    (directory / ".metadata").write_bytes(pickle.dumps({"state": Attribute(cls, name)}))
    with pytest.raises(pickle.UnpicklingError, match="no enum member"):
        check_metadata(directory)


@pytest.mark.parametrize("target", ["torch.Size", "torch.serialization._get_layout", "collections.OrderedDict"])
def test_getattr_of_any_other_allowed_name_is_refused(tmp_path, target):
    module, _, name = target.rpartition(".")
    found = getattr(__import__(module, fromlist=[name]), name)
    (tmp_path / "step").mkdir()
    (tmp_path / "step" / ".metadata").write_bytes(pickle.dumps({"state": Attribute(found, "__class__")}))
    with pytest.raises(pickle.UnpicklingError, match="no enum member"):
        check_metadata(tmp_path / "step")


def test_weights_with_a_nan_or_an_infinity_are_named_and_finite_ones_pass():
    """What a rank checks before it saves a checkpoint and after it loads one (docs/faults.md): a NaN or an infinity
    (a model that diverged) is named; a huge but finite value is a value like any other."""
    from rlc.runtime.workers.common import first_non_finite

    ok = {"a.weight": torch.tensor([1.0, 3e38]), "steps": torch.tensor([7]), "note": "not a tensor"}
    assert first_non_finite(ok) is None
    assert first_non_finite({**ok, "b.bias": torch.tensor([0.0, float("nan")])}) == "b.bias"
    assert first_non_finite({"c": torch.tensor([float("-inf")]), "b": torch.tensor([float("nan")])}) == "c"
