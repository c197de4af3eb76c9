"""The colocation state machine: which model and optimizer state sit on the GPUs in every phase, in what order."""

from __future__ import annotations

import pytest
from rlc.runtime.colocation import Colocation


def _ops(actions) -> list[str]:
    return [str(a) for a in actions]


def _ppo(**kw) -> Colocation:
    return Colocation(roles={"policy": True, "ref": False, "critic": True}, **kw)


def test_a_colocated_ppo_step_moves_one_role_at_a_time():
    c = _ppo()
    assert _ops(c.start()) == [
        "policy.offload(model, optimizer)",
        "ref.offload(model)",
        "critic.offload(model, optimizer)",
    ]
    assert _ops(c.sync_weights()) == [  # the first sync: weights in, KV cache after the policy left
        "policy.backload(model)",
        "engines.wake_up(weights)",
        "policy.send_weights()",
        "policy.offload(model)",
        "engines.wake_up(kv_cache)",
        "engines.reset_prefix_cache()",
    ]
    assert _ops(c.before_generate()) == []
    assert _ops(c.after_generate()) == ["engines.reset_prefix_cache()", "engines.sleep()"]
    assert _ops(c.before_forward("critic")) == ["critic.backload(model)"]
    assert _ops(c.before_forward("ref")) == ["critic.offload(model)", "ref.backload(model)"]
    assert _ops(c.before_forward("policy")) == ["ref.offload(model)", "policy.backload(model)"]
    assert _ops(c.before_train("critic")) == ["policy.offload(model)", "critic.backload(model, optimizer)"]
    assert _ops(c.after_train("critic")) == ["critic.offload(optimizer)"]
    assert _ops(c.before_train("policy")) == ["critic.offload(model)", "policy.backload(model, optimizer)"]
    assert _ops(c.after_train("policy")) == ["policy.offload(optimizer)"]
    assert _ops(c.sync_weights()) == [
        "engines.wake_up(weights)",
        "policy.send_weights()",
        "policy.offload(model)",
        "engines.wake_up(kv_cache)",
        "engines.reset_prefix_cache()",
    ]
    assert _ops(c.before_generate()) == []  # the next step starts with everything off the GPUs


def test_an_optimizer_kept_on_the_gpu_leaves_before_the_weights_are_sent():
    c = Colocation(roles={"policy": True}, offload_after_step={"policy": False})
    c.start()
    c.sync_weights()
    c.after_generate()
    assert _ops(c.before_train("policy")) == ["policy.backload(model, optimizer)"]
    assert _ops(c.after_train("policy")) == []  # offload_after_step: false
    assert _ops(c.sync_weights())[:2] == ["policy.offload(optimizer)", "engines.wake_up(weights)"]


def test_a_second_forward_of_the_same_role_moves_nothing():
    c = _ppo()
    c.start()
    c.sync_weights()
    c.after_generate()
    assert _ops(c.before_forward("policy")) == ["policy.backload(model)"]
    assert _ops(c.before_forward("policy")) == []
    assert _ops(c.before_train("policy")) == ["policy.backload(optimizer)"]


def test_without_colocation_only_the_weights_move():
    c = _ppo(colocated=False)
    assert c.start() == [] and c.after_generate() == [] and c.before_train("policy") == []
    assert _ops(c.sync_weights()) == ["policy.send_weights()", "engines.reset_prefix_cache()"]


def test_engines_without_a_prefix_cache_are_not_asked_to_reset_one():
    """The hf engine keeps no prefix cache: no reset action in either mode, everything else unchanged."""
    for colocated in (True, False):
        with_cache, without = _ppo(colocated=colocated), _ppo(colocated=colocated, prefix_cache=False)
        for phase in ("start", "before_generate", "after_generate", "sync_weights", "before_generate"):
            want = [op for op in _ops(getattr(with_cache, phase)()) if op != "engines.reset_prefix_cache()"]
            assert _ops(getattr(without, phase)()) == want, (colocated, phase)
    assert _ops(_ppo(colocated=False, prefix_cache=False).sync_weights()) == ["policy.send_weights()"]


def test_misuse_is_refused():
    c = _ppo()
    c.start()
    with pytest.raises(RuntimeError, match="put them to sleep"):
        c.before_forward("policy")  # the engines still hold the GPUs
    c.sync_weights()
    c.after_generate()
    with pytest.raises(RuntimeError, match="sync the policy's weights"):
        c.before_generate()  # level-2 sleep dropped the engines' weights
    with pytest.raises(KeyError, match="unknown role"):
        c.before_forward("reward_model")


def test_the_device_preflight_names_what_the_cluster_lacks():
    from rlc.core.plan import Plan
    from rlc.runtime.cluster_gate import device_shortfall

    plan = Plan("job", nodes=2, gpus_per_node=8, accelerator="H100", nodes_needed=2, backend="vllm")

    def node(addr, gpus, alive=True):  # the shape of ray.nodes() entries
        return {
            "Alive": alive,
            "NodeManagerAddress": addr,
            "Resources": {"CPU": 64.0, **({"GPU": gpus} if gpus else {})},
        }

    assert device_shortfall(plan, [node("10.0.0.1", 8.0), node("10.0.0.2", 8.0)]) is None
    short = device_shortfall(plan, [node("10.0.0.1", 8.0), node("10.0.0.2", 4.0), node("10.0.0.3", 8.0, alive=False)])
    assert "2 node(s) with 8 GPUs each, but Ray has 1 such node(s) (10.0.0.1: 8 GPUs, 10.0.0.2: 4 GPUs)" in short
    assert "no live node" in device_shortfall(plan, [])
    cpu = Plan("job", nodes=1, gpus_per_node=2, accelerator="none", nodes_needed=1, backend="hf")
    assert device_shortfall(cpu, [node("127.0.0.1", 0)]) is None
