"""Every engine and worker class has every method the driver calls on it, with a signature that takes the call."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("torch")

from rlc.runtime.inference.hf import HFEngine  # noqa: E402
from rlc.runtime.inference.http import RemoteEngine  # noqa: E402
from rlc.runtime.inference.vllm import VLLMEngine  # noqa: E402  (imports vLLM only when an engine is built)
from rlc.runtime.protocols import (  # noqa: E402
    EngineProtocol,
    IPCWeightSourceProtocol,
    LocalEngineProtocol,
    RemoteEngineProtocol,
    WorkerProtocol,
)
from rlc.runtime.workers.fsdp import FSDPWorker  # noqa: E402
from rlc.runtime.workers.megatron import MegatronWorker  # noqa: E402

IMPLEMENTATIONS = [
    (HFEngine, LocalEngineProtocol),
    (VLLMEngine, LocalEngineProtocol),
    (RemoteEngine, RemoteEngineProtocol),
    (FSDPWorker, IPCWeightSourceProtocol),
    (MegatronWorker, WorkerProtocol),
]
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def protocol_methods(protocol: type) -> list[str]:
    return sorted(
        name
        for klass in protocol.__mro__
        if getattr(klass, "_is_protocol", False)
        for name, value in vars(klass).items()
        if callable(value) and not name.startswith("_")
    )


def incompatibilities(impl, wanted) -> list[str]:
    """Why a call that fits `wanted` could fail on `impl` (empty when every such call binds)."""
    have, want = inspect.signature(impl).parameters, inspect.signature(wanted).parameters
    problems = []
    have_positional = [n for n, p in have.items() if p.kind in POSITIONAL]
    for i, (name, p) in enumerate(want.items()):
        if name not in have:
            problems.append(f"no parameter {name}")
        elif p.kind in POSITIONAL and (i >= len(have_positional) or have_positional[i] != name):
            problems.append(f"{name} is not positional argument {i}")
        elif p.default is not inspect.Parameter.empty and have[name].default is inspect.Parameter.empty:
            problems.append(f"{name} has no default")
    for name, p in have.items():
        if (
            name not in want
            and p.default is inspect.Parameter.empty
            and p.kind in (*POSITIONAL, inspect.Parameter.KEYWORD_ONLY)
        ):
            problems.append(f"extra parameter {name} without a default")
    return problems


@pytest.mark.parametrize("impl, protocol", IMPLEMENTATIONS, ids=[i.__name__ for i, _ in IMPLEMENTATIONS])
def test_every_method_the_driver_calls_is_there_and_takes_the_call(impl, protocol):
    methods = protocol_methods(protocol)
    assert methods and issubclass(impl, protocol)
    for name in methods:
        assert callable(getattr(impl, name, None)), f"{impl.__name__} has no {name}"
        problems = incompatibilities(getattr(impl, name), getattr(protocol, name))
        assert not problems, f"{impl.__name__}.{name}: {problems}"


def test_the_check_catches_a_method_that_drifted():
    class Drifted:
        def generate(self, prompts, n=1, seed=0):  # lost `sampling`
            return []

        def sleep(self, level):  # lost its default
            return None

        def wake_up(self, tags=None, force=False):
            return None

    assert incompatibilities(Drifted.generate, EngineProtocol.generate)
    assert incompatibilities(Drifted.sleep, EngineProtocol.sleep) == ["level has no default"]
    assert not incompatibilities(Drifted.wake_up, EngineProtocol.wake_up)
    assert not issubclass(Drifted, EngineProtocol)
