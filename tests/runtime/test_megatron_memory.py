"""The memory estimate's Megatron expert parallelism against Megatron-Core itself: a tiny Qwen3-MoE built as a
GPTModel on torch's meta device by two gloo ranks, under each expert layout two GPUs allow, holds on each rank the
weights the estimate says (attention and embeddings split over tp, the routed experts over ep x etp)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from conftest import run_ranks  # noqa: E402

# All layers routed (Megatron-Core's MoE layer frequency 1), untied head, query/key norms: Qwen3-MoE's layout.
CONFIG = {
    "model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 256, "tie_word_embeddings": False,
}  # fmt: skip
LAYOUTS = [(1, 2, None), (2, 1, 1), (2, 1, 2)]  # (tp, ep, etp); None: the experts follow tp


def _count_rank(rank: int, world: int, port: int, q) -> None:
    """Each layout's parameters on this rank: (dense, routed experts) and bytes per parameter."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from rlc.runtime.workers import megatron_cpu

    megatron_cpu.enable()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    c = CONFIG
    counts = {}
    with megatron_cpu.active():
        for tp, ep, etp in LAYOUTS:
            ps.initialize_model_parallel(
                tensor_model_parallel_size=tp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp
            )
            tensor_parallel.model_parallel_cuda_manual_seed(0)
            config = TransformerConfig(
                num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"],
                num_attention_heads=c["num_attention_heads"], num_query_groups=c["num_key_value_heads"],
                kv_channels=c["head_dim"], ffn_hidden_size=c["intermediate_size"], num_moe_experts=c["num_experts"],
                moe_ffn_hidden_size=c["moe_intermediate_size"], moe_router_topk=c["num_experts_per_tok"],
                gated_linear_unit=True, add_bias_linear=False, normalization="RMSNorm", qk_layernorm=True,
                tensor_model_parallel_size=tp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                use_cpu_initialization=True, perform_initialization=False,
                params_dtype=torch.bfloat16, bf16=True,
            )  # fmt: skip
            layer = get_gpt_layer_local_spec(num_experts=c["num_experts"], qk_layernorm=True, normalization="RMSNorm")
            with torch.device("meta"):
                model = GPTModel(
                    config, layer, vocab_size=c["vocab_size"], max_sequence_length=64,
                    share_embeddings_and_output_weights=False, position_embedding_type="rope",
                )  # fmt: skip
            params = dict(model.named_parameters())
            assert all(p.is_meta for p in params.values())
            experts = sum(p.numel() for name, p in params.items() if ".mlp.experts." in name)
            total = sum(p.numel() for p in params.values())
            counts[tp, ep, etp] = (total - experts, experts, next(iter(params.values())).element_size())
            ps.destroy_model_parallel()
    q.put((rank, counts))
    dist.destroy_process_group()


def test_each_rank_holds_the_weights_the_estimate_gives_it():
    from rlc.compiler.memory import megatron_cost
    from rlc.compiler.model_size import shape_from_config
    from rlc.spec.model import default_model

    shape = shape_from_config(CONFIG)
    results = run_ranks(_count_rank, 2)
    assert set(results[0]) == set(LAYOUTS)
    for (tp, ep, etp), (dense, experts, size) in results[0].items():
        assert results[1][tp, ep, etp] == (dense, experts, size)  # every rank holds the same share
        mc = {"tensor_model_parallel_size": tp, "expert_model_parallel_size": ep, "expert_tensor_parallel_size": etp}
        trainer = {"strategy": "megatron", "policy": {"megatron_config": mc}}
        spec = default_model().to_typed({"version": 1, "trainer": trainer})
        cost = megatron_cost(spec, "policy", shape, 2)
        assert experts == shape.expert_params // (ep * (etp or tp))
        assert cost.state["weights"] == size * (dense + experts), (tp, ep, etp)
