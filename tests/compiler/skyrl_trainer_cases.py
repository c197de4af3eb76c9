"""One failing spec per rule of compiler/rules/skyrl_trainer.py (launch.trainer: skyrl), in the shape
tests/compiler/test_rules.py uses: code -> (the key it names, the spec body with the line it points at marked)."""

SKYRL = "launch:\n  trainer: skyrl\n"
MODEL = "trainer:\n  logger: console\n  policy: {model: {path: Qwen/Qwen2.5-0.5B-Instruct}}\n"

SKYRL_TRAINER_CASES = {
    "RLC-E640": (
        "environment.sandbox.memory_mb",
        SKYRL + MODEL + "environment:\n  sandbox:\n    memory_mb: 2048  # <-\n",
    ),
    "RLC-E641": ("environment.env_class", SKYRL + MODEL + "environment:\n  env_class: calculator  # <-\n"),
    "RLC-E642": (
        "environment.sandbox.isolation",
        SKYRL + MODEL + "environment:\n  env_class: lcb\n  sandbox:\n    isolation: bubblewrap  # <-\n",
    ),
    "RLC-W640": (
        "environment.sandbox.isolation",
        SKYRL + MODEL + "environment:\n  env_class: lcb\n  sandbox:\n    isolation: unisolated  # <-\n",
    ),
    "RLC-E643": (
        "trainer.algorithm.advantage_estimator",
        SKYRL + MODEL + "  algorithm:\n    advantage_estimator: demo_advantage  # <-\n",
    ),
    "RLC-E644": (
        "launch.trainer_settings.skyrl.trainer.epoch",
        SKYRL + "  trainer_settings:\n    skyrl: {trainer.epoch: 3}  # <-\n" + MODEL,
    ),
    "RLC-W641": (
        "launch.trainer_settings.skyrl.trainer.new_key",
        SKYRL + "  trainer_version: 0.5.0\n  trainer_settings:\n    skyrl: {trainer.new_key: 3}  # <-\n" + MODEL,
    ),
    "RLC-E645": (
        "launch.trainer_settings.skyrl.trainer.epochs",
        SKYRL + "  trainer_settings:\n    skyrl: {trainer.epochs: 3}  # <-\n" + MODEL,
    ),
    "RLC-E646": (
        "generator.inference_engine.weight_sync_backend",
        SKYRL + MODEL + "generator:\n  inference_engine:\n    weight_sync_backend: gloo  # <-\n",
    ),
    "RLC-E647": (
        "cluster.accelerator",
        "cluster:\n  accelerator: none  # <-\n  gpus_per_node: 1\n  num_nodes: 1\n" + SKYRL + MODEL,
    ),
    "RLC-E648": ("trainer.policy.model.path", SKYRL + "trainer:\n  policy:\n    model:\n      path: rlc:tiny  # <-\n"),
    "RLC-E649": (
        "trainer.critic.model.path",
        SKYRL + "trainer:\n  strategy: megatron\n  critic:\n    model:\n      path: Qwen/Qwen2.5-0.5B  # <-\n",
    ),
    "RLC-W642": ("launch.trainer_version", SKYRL + "  trainer_version: 0.5.0  # <-\n" + MODEL),
}
