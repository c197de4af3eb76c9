"""One failing spec per rule: each asserts the rule's code, the key it names and the line it points at.

The line to expect is marked in each spec with `# <-`.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest
from rlc.compiler.check import RULES
from rlc.compiler.pipeline import analyze
from skyrl_trainer_cases import SKYRL_TRAINER_CASES
from upstream_cases import UPSTREAM_CASES
from verl_trainer_cases import VERL_TRAINER_CASES

BASE_CLUSTER = "cluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 1}\n"

CASES = {
    "RLC-E101": (
        "trainer.policy_mini_batch_size",
        """
        trainer:
          train_batch_size: 64
          policy_mini_batch_size: 128  # <-
        """,
    ),
    "RLC-E102": (
        "trainer.critic_mini_batch_size",
        """
        trainer:
          critic: {model: {path: Qwen/Qwen2.5-0.5B}}
          algorithm: {advantage_estimator: gae}
          train_batch_size: 64
          critic_mini_batch_size: 128  # <-
        """,
    ),
    "RLC-E103": (
        "trainer.micro_forward_batch_size_per_gpu",
        """
        trainer:
          micro_forward_batch_size_per_gpu: 0  # <-
        """,
    ),
    "RLC-E104": (
        "trainer.policy.megatron_config.tensor_model_parallel_size",
        """
        trainer:
          strategy: megatron
          policy:
            megatron_config:
              tensor_model_parallel_size: 3  # <-
        """,
    ),
    "RLC-E105": (
        "trainer.policy_mini_batch_size",
        """
        trainer:
          train_batch_size: 64
          policy_mini_batch_size: 24  # <-
        """,
    ),
    "RLC-E106": (
        "trainer.micro_train_batch_size_per_gpu",
        """
        trainer:
          micro_train_batch_size_per_gpu: 3  # <-
        """,
    ),
    "RLC-E107": (
        "trainer.train_batch_size",
        """
        cluster: {accelerator: H100, gpus_per_node: 4, num_nodes: 1}
        trainer:
          train_batch_size: 10  # <-
          policy_mini_batch_size: 5
          micro_train_batch_size_per_gpu: 1
        generator:
          n_samples_per_prompt: 3
        """,
    ),
    "RLC-E108": (
        "trainer.critic_mini_batch_size",
        """
        trainer:
          critic: {model: {path: Qwen/Qwen2.5-0.5B}}
          algorithm: {advantage_estimator: gae}
          critic_mini_batch_size: 24  # <-
        """,
    ),
    "RLC-E109": (
        "trainer.train_batch_size",
        """
        trainer:
          train_batch_size: 1  # <-
          policy_mini_batch_size: 1
        generator:
          n_samples_per_prompt: 1
        """,
    ),
    "RLC-W101": (
        "trainer.policy_mini_batch_size",
        """
        trainer:
          train_batch_size: 40
          policy_mini_batch_size: 10  # <-
          micro_train_batch_size_per_gpu: 1
        generator:
          n_samples_per_prompt: 3
        """,
    ),
    "RLC-E110": (
        "trainer.policy.sequence_parallel_size",
        """
        trainer:
          policy:
            sequence_parallel_size: 3  # <-
        """,
    ),
    "RLC-W103": (
        "trainer.max_tokens_per_microbatch",
        """
        trainer:
          max_prompt_length: 512
          max_tokens_per_microbatch: 1024  # <-
        generator:
          sampling_params: {max_generate_length: 1024}
        """,
    ),
    "RLC-E201": (
        "generator.inference_engine.num_engines",
        """
        generator:
          inference_engine:
            num_engines: 4  # <-
        """,
    ),
    "RLC-E202": (
        "trainer.placement.ref_num_gpus_per_node",
        """
        trainer:
          placement:
            colocate_all: false
            policy_num_gpus_per_node: 4
            ref_num_gpus_per_node: 2  # <-
          micro_train_batch_size_per_gpu: 1
        generator:
          inference_engine: {num_engines: 4}
        """,
    ),
    "RLC-E203": (
        "trainer.placement.ref_num_gpus_per_node",
        """
        trainer:
          placement:
            ref_num_gpus_per_node: 4  # <-
        """,
    ),
    "RLC-E204": (
        "cluster.num_nodes",
        """
        cluster:
          gpus_per_node: 8
          num_nodes: 1  # <-
        trainer:
          placement:
            colocate_all: false
            policy_num_gpus_per_node: 8
        generator:
          inference_engine: {num_engines: 4}
        """,
    ),
    "RLC-E205": (
        "trainer.placement.policy_num_gpus_per_node",
        """
        trainer:
          placement:
            policy_num_gpus_per_node: 16  # <-
        """,
    ),
    "RLC-E206": (
        "generator.inference_engine.distributed_executor_backend",
        """
        cluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 2}
        generator:
          inference_engine:
            tensor_parallel_size: 16
            distributed_executor_backend: mp  # <-
        """,
    ),
    "RLC-W201": (
        "generator.inference_engine.tensor_parallel_size",
        """
        cluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 2}
        generator:
          inference_engine:
            tensor_parallel_size: 16  # <-
        """,
    ),
    "RLC-W202": (
        "cluster.num_nodes",
        """
        cluster:
          gpus_per_node: 8
          num_nodes: 2  # <-
        trainer:
          placement: {policy_num_gpus_per_node: 8, ref_num_gpus_per_node: 8}
        generator:
          inference_engine: {num_engines: 8}
        """,
    ),
    "RLC-E207": (
        "cluster.num_nodes",
        """
        cluster:
          gpus_per_node: 8
          num_nodes: 200000  # <-
        """,
    ),
    "RLC-E301": (
        "trainer.algorithm.advantage_estimator",
        """
        trainer:
          algorithm:
            advantage_estimator: gae  # <-
        """,
    ),
    "RLC-E302": (
        "trainer.algorithm.use_kl_in_reward",
        """
        trainer:
          algorithm:
            use_kl_in_reward: true  # <-
            use_kl_loss: true
        """,
    ),
    "RLC-E316": (
        "trainer.algorithm.advantage_estimator",
        """
        trainer:
          algorithm:
            advantage_estimator: grpo_passk  # <-
        generator:
          n_samples_per_prompt: 1
        """,
    ),
    "RLC-E317": (
        "trainer.algorithm.advantage_estimator",
        """
        trainer:
          algorithm:
            advantage_estimator: remax  # <-
          placement: {colocate_all: false}
          fully_async:
            enabled: true
        """,
    ),
    "RLC-E315": (
        "trainer.algorithm.dro.beta",
        """
        trainer:
          algorithm:
            policy_loss_type: dro  # <-
        """,
    ),
    "RLC-E303": (
        "trainer.algorithm.max_seq_len",
        """
        trainer:
          algorithm:
            loss_reduction: seq_mean_token_sum_norm  # <-
        generator:
          sampling_params:
            max_generate_length: ${oc.env:MAX_GEN_LEN}
        """,
    ),
    "RLC-E304": (
        "trainer.algorithm.off_policy_correction.tis_ratio_type",
        """
        trainer:
          algorithm:
            policy_loss_type: importance_sampling
            off_policy_correction:
              tis_ratio_type: token  # <-
        """,
    ),
    "RLC-E305": (
        "trainer.max_ckpts_to_keep",
        """
        trainer:
          max_ckpts_to_keep: 0  # <-
        """,
    ),
    "RLC-E306": (
        "trainer.resume_path",
        """
        trainer:
          resume_mode: from_path  # <-
        """,
    ),
    "RLC-E314": (
        "trainer.policy.model.path",
        """
        trainer:
          policy:
            model:
              path: null  # <-
        """,
    ),
    "RLC-E307": (
        "trainer.algorithm.advantage_estimator",
        """
        trainer:
          critic: {model: {path: Qwen/Qwen2.5-0.5B}}
          algorithm:
            advantage_estimator: gae  # <-
        generator:
          step_wise_trajectories: true
        """,
    ),
    "RLC-E308": (
        "trainer.algorithm.off_policy_correction.geo_mask_low",
        """
        trainer:
          algorithm:
            off_policy_correction:
              sequence_mask_metric: geometric
              geo_mask_low: 1.02  # <-
        """,
    ),
    "RLC-E330": (
        "trainer.algorithm.off_policy_correction.rejection_threshold_high",
        """
        trainer:
          algorithm:
            off_policy_correction:
              rejection_sampling: [token_k1, seq_mean_k3]
              rejection_threshold_high: [2.0, 0.01, 0.5]  # <-
        """,
    ),
    "RLC-E331": (
        "trainer.algorithm.off_policy_correction.tis_batch_normalize",
        """
        trainer:
          algorithm:
            off_policy_correction:
              tis_batch_normalize: true  # <-
        """,
    ),
    "RLC-E332": (
        "trainer.algorithm.bypass.loss_type",
        """
        trainer:
          algorithm:
            bypass:
              loss_type: reinforce  # <-
        """,
    ),
    "RLC-E333": (
        "trainer.algorithm.pf_ppo.weight_pow",
        """
        trainer:
          algorithm:
            pf_ppo:
              reweight_method: max_min
              weight_pow: 3.0  # <-
        """,
    ),
    "RLC-E309": (
        "trainer.algorithm.dynamic_sampling.type",
        """
        trainer:
          algorithm:
            dynamic_sampling:
              type: filter  # <-
        generator:
          n_samples_per_prompt: 1
        """,
    ),
    "RLC-E310": (
        "trainer.algorithm.temperature",
        """
        generator:
          sampling_params:
            temperature: 0.0  # <-
        """,
    ),
    "RLC-E401": (
        "generator.max_input_length",
        """
        generator:
          max_input_length: 256  # <-
        """,
    ),
    "RLC-E402": (
        "generator.sampling_params.logprobs",
        """
        generator:
          sampling_params:
            logprobs: 2  # <-
        """,
    ),
    "RLC-E910": (
        "launch.workdir",
        """
        launch: {target: slurm, workdir: "a\\nb"}  # <-
        """,
    ),
    "RLC-E920": (
        "cluster.accelerator",
        """
        cluster: {accelerator: "H100:4", gpus_per_node: 8, num_nodes: 1}  # <-
        """,
    ),
    "RLC-E921": (
        "cluster.cpus_per_node",
        """
        cluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 1, cpus_per_node: lots}  # <-
        """,
    ),
    "RLC-E911": (
        "launch.slurm.sbatch_args[1]",
        """
        launch:
          target: slurm
          slurm:
            sbatch_args:
              - --mail-type=END
              - --nodes=4  # <-
        """,
    ),
    "RLC-E912": (
        "launch.slurm.sbatch_args[1]",
        """
        launch:
          target: slurm
          slurm:
            sbatch_args:
              - --mail-type=END
              - --mail-tpye=END  # <-
        """,
    ),
    "RLC-W910": (
        "launch.install",
        """
        launch:
          target: slurm
          install: rlc[runtime]  # <-
        """,
    ),
    "RLC-W401": (
        "trainer.logger",
        """
        trainer:
          logger: wandb  # <-
        """,
    ),
    "RLC-W402": (
        "generator.append_eos_token_after_stop_str_in_multi_turn",
        """
        generator:
          append_eos_token_after_stop_str_in_multi_turn: false  # <-
          sampling_params:
            stop: ["</answer>"]
        """,
    ),
    "RLC-E403": (
        "generator.inference_engine.expert_parallel_size",
        """
        generator:
          inference_engine:
            expert_parallel_size: 4  # <-
        """,
    ),
    "RLC-E404": (
        "generator.inference_engine.external_server_urls",
        """
        generator:
          inference_engine:
            external_server_urls: ["http://10.0.0.5:8000"]  # <-
        """,
    ),
    "RLC-E405": (
        "generator.inference_engine.run_engines_locally",
        """
        trainer:
          placement: {colocate_all: false}
        generator:
          inference_engine:
            run_engines_locally: false  # <-
        """,
    ),
    "RLC-E406": (
        "generator.chat_template.name_or_path",
        """
        generator:
          chat_template:
            source: file  # <-
        """,
    ),
    "RLC-E411": (
        "generator.inference_engine.language_model_only",
        """
        trainer:
          policy:
            language_model_only: true
        generator:
          inference_engine:
            language_model_only: false  # <-
        """,
    ),
    "RLC-E407": (
        "generator.batched",
        """
        generator:
          batched: true  # <-
          max_turns: 3
          max_input_length: 2048
        """,
    ),
    "RLC-E521": (
        "trainer.critic.model.lora.rank",
        """
        trainer:
          strategy: megatron
          critic:
            model:
              path: Qwen/Qwen2.5-0.5B
              lora:
                rank: 8  # <-
        """,
    ),
    "RLC-E535": (
        "trainer.policy.megatron_config.moe_enable_routing_replay",
        """
        trainer:
          strategy: megatron
          policy:
            model: {path: Qwen/Qwen3-30B-A3B}
            megatron_config:
              moe_enable_routing_replay: true  # <-
        """,
    ),
    "RLC-E536": (
        "generator.use_conversation_multi_turn",
        """
        trainer:
          strategy: megatron
          policy:
            model: {path: Qwen/Qwen3-30B-A3B}
            megatron_config: {moe_enable_routing_replay: true}
        generator:
          use_conversation_multi_turn: false  # <-
          inference_engine: {enable_return_routed_experts: true}
        """,
    ),
    "RLC-E537": (
        "generator.inference_engine.enable_return_routed_experts",
        """
        trainer:
          strategy: megatron
          policy:
            model: {path: Qwen/Qwen2.5-0.5B}
            megatron_config: {moe_enable_routing_replay: true}
        generator:
          inference_engine:
            enable_return_routed_experts: true  # <-
        """,
    ),
    "RLC-E538": (
        "trainer.policy.megatron_config.transformer_config_kwargs",
        """
        trainer:
          strategy: megatron
          policy:
            model: {path: Qwen/Qwen3-30B-A3B}
            megatron_config:
              moe_enable_routing_replay: true
              transformer_config_kwargs:
                moe_router_fusion: true  # <-
        generator:
          inference_engine: {enable_return_routed_experts: true}
        """,
    ),
    "RLC-E504": (
        "trainer.policy.sequence_parallel_size",
        """
        trainer:
          strategy: megatron
          policy:
            sequence_parallel_size: 2  # <-
        """,
    ),
    "RLC-E505": (
        "trainer.policy.fsdp_config.fsdp_size",
        """
        trainer:
          policy:
            fsdp_config:
              fsdp_size: 3  # <-
        """,
    ),
    "RLC-E506": (
        "trainer.policy.megatron_config.tensor_model_parallel_size",
        """
        trainer:
          strategy: megatron
          policy:
            model: {path: FIXTURES/model-14-heads}
            megatron_config:
              tensor_model_parallel_size: 4  # <-
        """,
    ),
    "RLC-E540": (
        "trainer.policy.megatron_config.context_parallel_size",
        """
        trainer:
          strategy: megatron
          policy:
            model: {path: Qwen/Qwen3.5-0.8B}
            megatron_config:
              context_parallel_size: 2  # <-
        """,
    ),
    "RLC-E542": (
        "trainer.policy.megatron_config.tensor_model_parallel_size",
        """
        trainer:
          strategy: megatron
          policy:
            model: {path: Qwen/Qwen3.5-0.8B}
            megatron_config:
              tensor_model_parallel_size: 3  # <-
        """,
    ),
    "RLC-E512": (
        "trainer.policy.sequence_parallel_size",
        """
        trainer:
          policy:
            model: {path: FIXTURES/model-14-heads}
            sequence_parallel_size: 4  # <-
        """,
    ),
    "RLC-E507": (
        "trainer.policy.megatron_config.pipeline_model_parallel_size",
        """
        trainer:
          strategy: megatron
          policy:
            model: {path: Qwen/Qwen2.5-1.5B-Instruct}
            megatron_config:
              pipeline_model_parallel_size: 8  # <-
        """,
    ),
    "RLC-E516": (
        "trainer.policy.megatron_config.expert_model_parallel_size",
        """
        trainer:
          strategy: megatron
          placement: {policy_num_gpus_per_node: 6}
          policy:
            model: {path: Qwen/Qwen3-30B-A3B}
            megatron_config:
              expert_model_parallel_size: 3  # <-
        """,
    ),
    "RLC-E517": (
        "trainer.policy.megatron_config.expert_tensor_parallel_size",
        """
        trainer:
          strategy: megatron
          placement: {policy_num_gpus_per_node: 5}
          policy:
            model: {path: Qwen/Qwen3-30B-A3B}
            megatron_config:
              expert_tensor_parallel_size: 5  # <-
        """,
    ),
    "RLC-E518": (
        "trainer.policy.megatron_config.transformer_config_kwargs",
        """
        trainer:
          strategy: megatron
          placement: {policy_num_gpus_per_node: 2}
          policy:
            model: {path: Qwen/Qwen3-30B-A3B}
            megatron_config:
              tensor_model_parallel_size: 2
              transformer_config_kwargs: {sequence_parallel: false}  # <-
        """,
    ),
    "RLC-E508": (
        "generator.inference_engine.pipeline_parallel_size",
        """
        trainer:
          policy:
            model: {path: "rlc:tiny"}
        generator:
          inference_engine:
            backend: vllm
            pipeline_parallel_size: 4  # <-
        """,
    ),
    "RLC-E509": (
        "trainer.policy.model.lora.rank",
        """
        trainer:
          policy:
            model:
              lora:
                rank: 1024  # <-
                alpha: 2048
        generator:
          inference_engine:
            backend: vllm
        """,
    ),
    "RLC-E510": (
        "trainer.policy.model.lora.target_modules",
        """
        trainer:
          strategy: megatron
          policy:
            model:
              lora:
                rank: 8
                alpha: 16
                target_modules: q_proj,qkv_proj  # <-
        """,
    ),
    "RLC-E511": (
        "trainer.policy.megatron_config.transformer_config_kwargs.hidden_dropoutt",
        """
        trainer:
          strategy: megatron
          policy:
            megatron_config:
              transformer_config_kwargs:
                hidden_dropoutt: 0.0  # <-
        """,
    ),
    "RLC-W501": (
        "trainer.policy.megatron_config.expert_model_parallel_size",
        """
        trainer:
          strategy: megatron
          policy:
            megatron_config:
              expert_model_parallel_size: 3  # <-
        """,
    ),
    "RLC-E550": (
        "trainer.logprobs_chunk_size",
        """
        trainer:
          strategy: fsdp2
          logprobs_chunk_size: null  # <-
        """,
    ),
    "RLC-E551": (
        "trainer.policy.model.fake_int4_qat.enabled",
        """
        trainer:
          strategy: megatron
          policy:
            model:
              fake_int4_qat: {enabled: true}  # <-
        """,
    ),
    "RLC-E602": (
        "trainer.policy.model.lora.alpha",
        """
        trainer:
          policy:
            model:
              lora: {rank: 8, alpha: 0}  # <-
        """,
    ),
    "RLC-E311": (
        "trainer.fully_async.enabled",
        """
        trainer:
          placement: {colocate_all: true}
          fully_async:
            enabled: true  # <-
        """,
    ),
    "RLC-E312": (
        "trainer.policy_mini_batch_size",
        """
        trainer:
          placement: {colocate_all: false}
          train_batch_size: 64
          policy_mini_batch_size: 32  # <-
          fully_async: {enabled: true, num_parallel_generation_workers: 64}
        """,
    ),
    "RLC-E313": (
        "trainer.fully_async.num_parallel_generation_workers",
        """
        trainer:
          placement: {colocate_all: false}
          fully_async:
            enabled: true
            num_parallel_generation_workers: 4  # <-
        """,
    ),
    "RLC-E515": (
        "generator.inference_engine.enable_pd",
        """
        generator:
          inference_engine:
            num_engines: 4
            enable_pd: true  # <-
            num_prefill: 2
        """,
    ),
    "RLC-E520": (
        "generator.inference_engine.speculative_config",
        """
        cluster: {accelerator: none, gpus_per_node: 1, num_nodes: 1}
        trainer:
          policy:
            model: {path: "rlc:tiny-vllm"}
        generator:
          inference_engine:
            backend: vllm
            speculative_config: {method: ngram, num_speculative_tokens: 3}  # <-
        """,
    ),
    "RLC-E545": (
        "trainer.mtp.enabled",
        """
        trainer:
          strategy: fsdp2
          mtp: {enabled: true}  # <-
        """,
    ),
    "RLC-E546": (
        "trainer.policy.megatron_config.mtp_num_layers",
        """
        trainer:
          strategy: megatron
          mtp: {enabled: true}
          policy:
            megatron_config:
              mtp_num_layers: 0  # <-
        """,
    ),
    "RLC-E817": (
        "trainer.fused_lm_head_logprob",
        """
        trainer:
          strategy: fsdp2
          fused_lm_head_logprob: true  # <-
        """,
    ),
    "RLC-E570": (
        "trainer.algorithm.use_entropy_loss",
        """
        trainer:
          strategy: megatron
          fused_lm_head_logprob: true
          algorithm:
            use_entropy_loss: true  # <-
        """,
    ),
    "RLC-E571": (
        "trainer.mtp.enabled",
        """
        trainer:
          strategy: megatron
          fused_lm_head_logprob: true
          mtp: {enabled: true}  # <-
        """,
    ),
    "RLC-E547": (
        "trainer.policy.megatron_config.pipeline_model_parallel_size",
        """
        trainer:
          strategy: megatron
          mtp: {enabled: true}
          policy:
            megatron_config:
              pipeline_model_parallel_size: 2  # <-
        """,
    ),
    "RLC-E548": (
        "trainer.policy.model.path",
        """
        trainer:
          strategy: megatron
          mtp: {enabled: true}
          policy:
            model: {path: "rlc:tiny"}  # <-
        """,
    ),
    "RLC-E513": (
        "trainer.policy.model.path",
        """
        cluster: {accelerator: none, gpus_per_node: 1, num_nodes: 1}
        trainer:
          policy:
            model: {path: "rlc:tiny"}  # <-
        generator:
          inference_engine: {backend: vllm}
        """,
    ),
    "RLC-E514": (
        "generator.inference_engine.engine_init_kwargs",
        """
        cluster: {accelerator: none, gpus_per_node: 1, num_nodes: 1}
        trainer:
          policy:
            model: {path: "rlc:tiny-vllm"}
        generator:
          inference_engine:
            backend: vllm
            engine_init_kwargs: {enable_sleep_mode: true}  # <-
        """,
    ),
    "RLC-E902": (
        "environment.env_class",
        """
        environment:
          env_class: text_to_sql  # <-
        """,
    ),
    "RLC-E903": (
        "trainer.algorithm.dynamic_sampling.type",
        """
        trainer:
          algorithm:
            dynamic_sampling: {type: filter}  # <-
        generator:
          max_turns: 3
          max_input_length: 4096
          step_wise_trajectories: true
        """,
    ),
    "RLC-E904": (
        "environment.skyrl_gym.search.search_url",
        """
        environment:
          env_class: search
          skyrl_gym:
            search: {search_url: ""}  # <-
        """,
    ),
    "RLC-E319": (
        "environment.env_class",
        """
        trainer:
          algorithm:
            advantage_estimator: gdpo
            gdpo_reward_keys: [accuracy, format]
        environment:
          env_class: gsm8k  # <-
        """,
    ),
    "RLC-E905": (
        "environment.skyrl_gym.reward_function.path",
        """
        environment:
          env_class: reward_function
          skyrl_gym:
            reward_function: {path: no_such_reward_file.py}  # <-
        """,
    ),
    "RLC-E906": (
        "generator.inference_engine.weight_sync_backend",
        """
        generator:
          inference_engine:
            weight_sync_backend: delta  # <-
        """,
    ),
    "RLC-W905": (
        "environment.sandbox.isolation",
        """
        environment:
          env_class: lcb
          sandbox:
            isolation: unisolated  # <-
        """,
    ),
    "RLC-E408": (
        "generator.use_conversation_multi_turn",
        """
        generator:
          max_turns: 3
          max_input_length: 4096
          step_wise_trajectories: true
          use_conversation_multi_turn: false  # <-
        """,
    ),
    "RLC-E409": (
        "generator.chat_template.name_or_path",
        """
        trainer:
          algorithm: {off_policy_correction: {tis_ratio_type: token}}
        generator:
          chat_template:
            name_or_path: qwen3_with_thinking  # <-
        """,
    ),
    "RLC-E410": (
        "generator.chat_template.name_or_path",
        """
        generator:
          chat_template:
            name_or_path: qwen4  # <-
        """,
    ),
    "RLC-W970": (
        "launch.recovery.managed",
        """
        cluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 1, use_spot: true}
        launch:
          recovery: {managed: false}  # <-
        """,
    ),
    "RLC-W971": (
        "trainer.ckpt_path",
        """
        cluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 1, use_spot: true}
        trainer:
          ckpt_path: /ckpts  # <-
        """,
    ),
    "RLC-E970": (
        "trainer.ckpt_path",
        """
        launch:
          target: kuberay
          kuberay: {checkpoint_volume_claim: ckpts}
        trainer:
          ckpt_path: ~/ckpts  # <-
        """,
    ),
}

CASES.update(UPSTREAM_CASES)  # RLC-E801..E849: SkyRL 0.4 settings the runtime does not run yet
CASES.update(SKYRL_TRAINER_CASES)  # RLC-E640..E649, W640..W649: what SkyRL's trainer does not run
CASES.update(VERL_TRAINER_CASES)  # RLC-E660..E669, W660..W669: what verl's trainer does not run


def _write(tmp_path, body: str):
    body = textwrap.dedent(body).strip("\n").replace("FIXTURES", str(Path(__file__).resolve().parents[1] / "fixtures"))
    text = "version: 1\n"
    if not body.startswith("cluster"):
        text += BASE_CLUSTER
    text += body + "\n"
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    marker = next(i + 1 for i, line in enumerate(text.splitlines()) if "# <-" in line)
    return path, marker


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_fires_with_key_and_line(tmp_path, code):
    key, body = CASES[code]
    if "demo_" in body and importlib.util.find_spec("rlc_ext_demo") is None:  # an extension's name, SkyRL lacks
        pytest.skip("the demo extension is not installed here (pip install --no-deps -e tests/fixtures/rlc-ext-demo)")
    path, line = _write(tmp_path, body)
    env = {} if code == "RLC-W401" else {"WANDB_API_KEY": "set"}
    analysis = analyze(path, env=env)
    hits = [d for d in analysis.diagnostics if d.code == code]
    assert hits, f"{code} did not fire; got {[(d.code, d.key, d.message) for d in analysis.diagnostics]}"
    d = hits[0]
    assert d.key == key
    assert d.location.line == line, f"{code} points at line {d.location.line}, expected {line}: {d.message}"
    assert d.hint, "every diagnostic carries a fix"
    assert d.severity == ("warning" if code.startswith("RLC-W") else "error")


def test_every_rule_has_a_failing_spec():
    assert {r.code for r in RULES} <= set(CASES)


def test_every_rule_written_is_one_check_runs():
    """A rule is listed by hand (its module's RULES, check's RULES): one written but left out of a list would never
    run, so every Rule of every module of rlc.compiler.rules must be in check's RULES."""
    import importlib
    import pkgutil

    import rlc.compiler.rules
    from rlc.compiler.rules.base import Rule

    written = set()
    for info in pkgutil.iter_modules(rlc.compiler.rules.__path__):
        module = importlib.import_module(f"rlc.compiler.rules.{info.name}")
        written |= {v for v in vars(module).values() if isinstance(v, Rule)}
        written |= set(getattr(module, "RULES", ()))
    assert len(written) > 70
    assert not written - set(RULES), sorted(r.code for r in written - set(RULES))
    assert len(RULES) == len(set(RULES))


def test_base_spec_is_valid(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("version: 1\n" + BASE_CLUSTER + "trainer: {logger: console}\n")
    analysis = analyze(path, env={})
    assert analysis.ok and not analysis.diagnostics, [(d.code, d.message) for d in analysis.diagnostics]


def test_rules_are_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text()
    missing = [r.code for r in RULES if r.code not in doc]
    assert not missing, f"docs/rules.md lacks {missing}"


def test_expert_layouts_of_dense_and_cpu_moe_jobs(tmp_path):
    """RLC-E516 refuses experts split on a dense model (its config readable); an MoE model under tensor parallelism
    runs on a CPU cluster too (rlc's norms take sequence parallelism); an MoE model's expert layout that fits passes."""

    def codes(model: str, cluster: str, **megatron) -> set[str]:
        path = tmp_path / "spec.yaml"
        gpus = max(megatron.get("tensor_model_parallel_size", 1), megatron.get("expert_model_parallel_size", 1))
        body = {
            "strategy": "megatron",
            "placement": {"policy_num_gpus_per_node": gpus},
            "policy": {"model": {"path": model}, "megatron_config": megatron},
        }
        path.write_text(f"version: 1\n{cluster}trainer: {json.dumps(body)}\n")
        return {d.code for d in analyze(path, env={}).diagnostics if d.severity == "error"}

    gpu = "cluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 1}\n"
    cpu = "cluster: {accelerator: none, gpus_per_node: 2, num_nodes: 1}\n"
    assert "RLC-E516" in codes("Qwen/Qwen2.5-7B-Instruct", gpu, expert_model_parallel_size=2)
    assert not {"RLC-E516", "RLC-E517", "RLC-E518"} & codes("Qwen/Qwen3-30B-A3B", gpu, expert_model_parallel_size=2)
    assert not {"RLC-E516", "RLC-E517", "RLC-E518"} & codes("Qwen/Qwen3-30B-A3B", gpu, tensor_model_parallel_size=2)
    assert "RLC-E518" not in codes("Qwen/Qwen3-30B-A3B", cpu, tensor_model_parallel_size=2)
    assert "RLC-E518" not in codes("Qwen/Qwen2.5-7B-Instruct", cpu, tensor_model_parallel_size=2)


def test_qwen3_5_moe_splits_over_tensor_and_expert_ranks(tmp_path):
    """Qwen3.5-35B-A3B (16 heads, 2 key-value heads, 16 linear key heads, 256 experts) under SkyRL's layouts passes;
    RLC-E542 refuses a tensor size its heads do not divide, and a multiple of its 2 key-value heads is one it takes."""

    def errors(**megatron) -> dict[str, str]:
        path = tmp_path / "spec.yaml"
        gpus = megatron.get("tensor_model_parallel_size", 1) * megatron.get("pipeline_model_parallel_size", 1)
        body = {
            "strategy": "megatron",
            "placement": {"policy_num_gpus_per_node": max(gpus, megatron.get("expert_model_parallel_size", 1))},
            "policy": {"model": {"path": "Qwen/Qwen3.5-35B-A3B"}, "megatron_config": megatron},
        }
        path.write_text(
            f"version: 1\ncluster: {{accelerator: H100, gpus_per_node: 8, num_nodes: 1}}\ntrainer: {json.dumps(body)}\n"
        )
        return {d.code: d.message for d in analyze(path, env={}).diagnostics if d.severity == "error"}

    assert not errors(tensor_model_parallel_size=2, expert_model_parallel_size=8)
    assert not errors(tensor_model_parallel_size=4, expert_model_parallel_size=8, expert_tensor_parallel_size=1)
    assert "num_attention_heads=16" in errors(tensor_model_parallel_size=3, pipeline_model_parallel_size=2)["RLC-E542"]


def test_huge_batch_sizes_are_answered_at_once(tmp_path):
    import time

    path = tmp_path / "spec.yaml"
    path.write_text(
        "version: 1\n" + BASE_CLUSTER + "trainer: {logger: console, train_batch_size: 1000000000039, "
        "policy_mini_batch_size: 999999999989, micro_train_batch_size_per_gpu: 7}\n"
    )
    start = time.monotonic()
    analysis = analyze(path, env={})
    assert time.monotonic() - start < 5
    assert any(d.code == "RLC-E105" for d in analysis.diagnostics)


def test_megatron_context_parallelism_compiles(tmp_path):
    """tp·pp·cp dividing the policy's GPUs is all context parallelism asks of a spec (RLC-E104 checks it)."""
    path = tmp_path / "spec.yaml"
    path.write_text(
        "version: 1\n"
        + BASE_CLUSTER
        + textwrap.dedent("""\
        trainer:
          logger: console
          strategy: megatron
          policy:
            megatron_config: {context_parallel_size: 2}
        """)
    )
    analysis = analyze(path, env={})
    assert analysis.ok and not [d for d in analysis.diagnostics if d.severity == "error"], [
        (d.code, d.message) for d in analysis.diagnostics
    ]


def test_a_megatron_critic_compiles_and_its_layout_is_checked_as_the_policys(tmp_path):
    """PPO with the critic on Megatron compiles; the critic's own tensor_model_parallel_size is held to the model's
    heads (RLC-E506) at its key, as the policy's is."""
    body = """\
        trainer:
          logger: console
          strategy: megatron
          algorithm: {advantage_estimator: gae}
          critic:
            model: {path: FIXTURES/model-14-heads}
            megatron_config: {tensor_model_parallel_size: TP}  # <-
        """
    ok, _ = _write(tmp_path, body.replace("TP", "2"))
    analysis = analyze(ok, env={})
    assert not [d for d in analysis.diagnostics if d.severity == "error"], [
        (d.code, d.message) for d in analysis.diagnostics
    ]
    bad, _ = _write(tmp_path, body.replace("TP", "4"))
    hits = [d for d in analyze(bad, env={}).diagnostics if d.code == "RLC-E506"]
    assert [d.key for d in hits] == ["trainer.critic.megatron_config.tensor_model_parallel_size"]


@pytest.mark.parametrize("params", ["sampling_params", "eval_sampling_params"])
def test_extra_sampling_arguments_are_refused_on_the_hf_engine(tmp_path, params):
    """The hf engine samples with its own parameters only; vLLM gets additional_kwargs as they are."""
    body = f"""
        generator:
          inference_engine: {{backend: hf}}
          {params}:
            additional_kwargs: {{min_tokens: 4}}  # <-
        """
    path, line = _write(tmp_path, body)
    found = [d for d in analyze(path, env={"WANDB_API_KEY": "set"}).diagnostics if d.code == "RLC-E903"]
    assert [(d.key, d.location.line) for d in found] == [(f"generator.{params}.additional_kwargs", line)]
    assert "backend: vllm" in found[0].hint
    path.write_text(path.read_text().replace("backend: hf", "backend: vllm"))
    assert not [d for d in analyze(path, env={"WANDB_API_KEY": "set"}).diagnostics if d.code == "RLC-E903"]


def test_multi_turn_agent_specs_are_valid(tmp_path):
    """What SkyRL's agent launch scripts set (text2sql, search, multi-turn GSM8K, step-wise) passes every rule."""
    for body in (
        "generator: {max_turns: 6, max_input_length: 6000, use_conversation_multi_turn: false}\n"
        "environment: {env_class: text2sql, skyrl_gym: {text2sql: {db_path: /data/sql}}}",
        "generator: {max_turns: 4, max_input_length: 4096, sampling_params: {stop: ['</search>', '</answer>']}}\n"
        "environment: {env_class: search}",
        "generator: {max_turns: 5, max_input_length: 2048, step_wise_trajectories: true}\n"
        "environment: {env_class: gsm8k_multi_turn}",
        "generator: {chat_template: {source: name, name_or_path: qwen3_without_thinking}}",
    ):
        path = tmp_path / "spec.yaml"
        path.write_text("version: 1\n" + BASE_CLUSTER + "trainer: {logger: console}\n" + body + "\n")
        analysis = analyze(path, env={})
        assert analysis.ok and not analysis.diagnostics, (body, [(d.code, d.message) for d in analysis.diagnostics])


@pytest.mark.parametrize("launch, env, refused", [
    ("launch: {target: skypilot}", {}, True),
    ("launch: {target: skypilot, secrets: [OPENAI_API_KEY]}", {}, False),
    ("launch: {target: local}", {"OPENAI_API_KEY": "sk-here"}, False),
    ("launch: {target: skypilot}", {"OPENAI_API_KEY": "sk-here"}, True),  # set here, but not sent to the nodes
])  # fmt: skip
def test_an_llm_judge_needs_its_key_on_the_nodes(tmp_path, launch, env, refused):
    path = tmp_path / "spec.yaml"
    path.write_text(
        "version: 1\n"
        + BASE_CLUSTER
        + launch
        + "\ntrainer: {logger: console}\nenvironment: {env_class: llm_as_a_judge}\n"
    )
    found = [d for d in analyze(path, env=env).diagnostics if d.code == "RLC-E904"]
    assert bool(found) is refused
    if refused:
        assert "OPENAI_API_KEY" in found[0].message and "launch.secrets" in found[0].hint


def test_idle_gpus_get_the_counts_that_use_them_and_the_cluster_the_job_uses(tmp_path):
    """A user who set placement counts smaller than the cluster is told which keys and values use the GPUs they asked
    for (or the cluster the job fits), not to leave unset what they set (issue 49)."""
    path = tmp_path / "spec.yaml"
    path.write_text(
        "version: 1\n"
        'cluster: {accelerator: "H100:8"}\n'
        "trainer: {logger: console, placement: {policy_num_gpus_per_node: 2, ref_num_gpus_per_node: 2}}\n"
        "generator: {inference_engine: {num_engines: 2}}\n"
    )
    (w,) = [d for d in analyze(path, env={}).diagnostics if d.code == "RLC-W202"]
    assert w.key == "cluster.num_nodes" and w.severity == "warning"
    assert w.message.startswith("the job uses 2 of the cluster's 8 GPUs") and w.message.endswith("6 stay idle")
    assert w.hint == (
        "to use all 8 GPUs, set trainer.placement.policy_num_gpus_per_node: 8, "
        "trainer.placement.ref_num_gpus_per_node: 8, generator.inference_engine.num_engines: 8 (or remove "
        "trainer.placement.policy_num_gpus_per_node, trainer.placement.ref_num_gpus_per_node, "
        "generator.inference_engine.num_engines: counts left unset follow cluster); or to ask for the 2 GPUs the job "
        "uses, set cluster.accelerator: H100:2"
    )
    assert w.values["proposed_changes"] == {
        "trainer.placement.policy_num_gpus_per_node": 8,
        "trainer.placement.ref_num_gpus_per_node": 8,
        "generator.inference_engine.num_engines": 8,
    }
    # the proposal holds: the spec with it uses every GPU and is refused for nothing
    from rlc.core.overrides import parse_override

    fixed = analyze(path, [parse_override(f"{k}={v}") for k, v in w.values["proposed_changes"].items()], env={})
    assert fixed.ok and not [d for d in fixed.diagnostics if d.code == "RLC-W202"]


def test_idle_nodes_get_more_ranks_per_role_or_fewer_nodes(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(
        "version: 1\ncluster: {gpus_per_node: 8, num_nodes: 2}\n"
        "trainer: {logger: console, placement: {policy_num_gpus_per_node: 8, ref_num_gpus_per_node: 8}}\n"
        "generator: {inference_engine: {num_engines: 8}}\n"
    )
    (w,) = [d for d in analyze(path, env={}).diagnostics if d.code == "RLC-W202"]
    assert "to use all 16 GPUs, set trainer.placement.policy_num_nodes: 2, trainer.placement.ref_num_nodes: 2, " in (
        w.hint
    )
    assert "generator.inference_engine.num_engines: 16" in w.hint
    assert w.hint.endswith("or to ask for the 8 GPUs the job uses, set cluster.num_nodes: 1")


@pytest.mark.parametrize(
    "estimator, fully_async, refused",
    [
        ("optimal_token_baseline", True, True),
        ("tir_optimal_token_baseline", True, True),
        ("optimal_token_baseline", False, False),
        ("remax", False, False),
        ("grpo", True, False),
    ],
)
def test_an_estimator_reading_what_the_step_makes_is_not_trained_fully_async(tmp_path, estimator, fully_async, refused):
    """remax's greedy responses and the optimal token baselines' policy pass are made in the step (RLC-E317)."""
    path, _ = _write(
        tmp_path,
        f"""
        trainer:
          algorithm:
            advantage_estimator: {estimator}  # <-
          placement: {{colocate_all: false}}
          fully_async:
            enabled: {str(fully_async).lower()}
        """,
    )
    codes = [d.code for d in analyze(path, env={"WANDB_API_KEY": "set"}).diagnostics]
    assert ("RLC-E317" in codes) == refused, codes


@pytest.mark.parametrize(
    "path, base, fires",
    [
        ("casperhansen/Qwen3.6-35B-A3B-INT4-RTN", "Qwen/Qwen3.5-0.8B", False),  # the INT4 checkpoint is served only
        ("Qwen/Qwen3.5-0.8B", "casperhansen/Qwen3.6-35B-A3B-INT4-RTN", True),
        ("casperhansen/Qwen3.6-35B-A3B-INT4-RTN", None, True),
    ],
)
def test_language_model_only_reads_the_checkpoint_the_megatron_trainer_loads(tmp_path, path, base, fires):
    """RLC-E811 asks whether rlc can read the text model of the checkpoint the trainer loads: the policy's
    fake_int4_qat.bf16_base_path where set (SkyRL's Megatron worker loads it), not the model the engines serve."""
    qat = f"fake_int4_qat: {{bf16_base_path: {base}}}" if base else ""
    body = f"""
        trainer:
          strategy: megatron
          policy:
            language_model_only: true  # <-
            model: {{path: {path}, {qat}}}
        """
    spec, _ = _write(tmp_path, body)
    codes = {d.code for d in analyze(spec, env={"WANDB_API_KEY": "set"}).diagnostics}
    assert ("RLC-E811" in codes) == fires
