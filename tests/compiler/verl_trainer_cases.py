"""One failing spec per rule of compiler/rules/verl_trainer.py (launch.trainer: verl), in the shape
tests/compiler/test_rules.py uses: code -> (the key it names, the spec body with the line it points at marked)."""

VERL = "launch:\n  trainer: verl\n"
ENV = "environment:\n  env_class: verl\n"
MODEL = "  logger: console\n  policy: {model: {path: Qwen/Qwen2.5-0.5B-Instruct}}\n"

VERL_TRAINER_CASES = {
    "RLC-E660": (
        "generator.inference_engine.backend",
        VERL + ENV + "trainer:\n" + MODEL + "generator:\n  inference_engine:\n    backend: hf  # <-\n",
    ),
    "RLC-E661": (
        "trainer.placement.colocate_all",
        VERL + ENV + "trainer:\n" + MODEL + "  placement:\n    colocate_all: false  # <-\n",
    ),
    "RLC-E662": ("environment.env_class", VERL + "environment:\n  env_class: calculator  # <-\ntrainer:\n" + MODEL),
    "RLC-E663": (
        "environment.sandbox.memory_mb",
        VERL + "environment:\n  env_class: verl\n  sandbox:\n    memory_mb: 2048  # <-\ntrainer:\n" + MODEL,
    ),
    "RLC-E664": (
        "trainer.algorithm.advantage_estimator",
        VERL + ENV + "trainer:\n" + MODEL + "  algorithm:\n    advantage_estimator: maxrl  # <-\n",
    ),
    "RLC-E665": (
        "trainer.policy.optimizer_config.scheduler",
        VERL + ENV + "trainer:\n  logger: console\n  policy:\n    model: {path: Qwen/Qwen2.5-0.5B-Instruct}\n"
        "    optimizer_config:\n      scheduler: linear  # <-\n",
    ),
    "RLC-E666": (
        "launch.trainer_settings.verl",
        "launch:\n  trainer: verl\n  trainer_settings:\n    verl: {data.filter_overlong_promts: true}  # <-\n"
        + ENV
        + "trainer:\n"
        + MODEL,
    ),
    "RLC-W660": (
        "trainer.algorithm.loss_reduction",
        VERL
        + ENV
        + "trainer:\n"
        + MODEL
        + "  algorithm:\n    use_kl_loss: true\n    loss_reduction: token_mean  # <-\n",
    ),
    "RLC-W661": (
        "launch.trainer_settings.verl",
        "launch:\n  trainer: verl\n  trainer_settings:\n    verl: {custom_reward_function.zzz_new_key: 3}  # <-\n"
        + ENV
        + "trainer:\n"
        + MODEL,
    ),
}
