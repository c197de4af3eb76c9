"""What each GPU kit holds: the pinned wheels, what is deleted from them, what is zeroed, and what the device image
holds beside them (docs/gpu.md). tools/gpu_kit.py builds and checks the kits from these."""

from __future__ import annotations

from dataclasses import dataclass

from import_closure import VLLM_OFFLINE

# rlc's runtime and tests on the device, besides what its image holds (KINDS.md): the jsonschema set, ruamel.yaml,
# skyrl-gym with omegaconf and func_timeout (an sdist only, built into a wheel here), megatron-core for the three
# megatron GPU tests.
RLC_DEPS = (
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "ruamel.yaml==0.19.1",
    "omegaconf==2.4.0",
    "skyrl-gym==0.4.0",
    "func_timeout==4.3.5",
)
SDIST_ONLY = {"func_timeout"}
# What vLLM 0.26's offline `LLM` imports that the device lacks (gpu-kit.md §2). openai 2.54 rather than the newest:
# it uses the device's httpx. mistral_common (numpy<2.4) and numba's pin (numpy<2.5) are left unmet on purpose.
VLLM_DEPS = (
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",
    "fastapi==0.136.3",
    "starlette==1.10.0",
    "openai==2.54.0",
    "distro==1.9.0",
    "jiter==0.19.0",
    "sniffio==1.3.1",
    "openai-harmony==0.0.8",
    "msgspec==0.22.0",
    "pyzmq==27.3.0",
    "cbor2==6.3.0",
    "pybase64==1.5.1",
    "partial-json-parser==0.2.1.1.post7",
    "cachetools==8.0.2",
    "blake3==1.0.11",
    "setproctitle==1.3.8",
    "python-json-logger==4.2.0",
    "compressed-tensors==0.17.0",
    "loguru==0.7.3",
    "depyf==0.20.0",
    "astor==0.8.1",
    "dill==0.4.1",
)
VLLM_C = "vllm/_C_stable_libtorch.abi3.so"
# The import names of the packages the device image holds (KINDS.md's list of 2026-11-17).
DEVICE_IMAGE = frozenset(
    """absl accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated_doc anyio attr attrs botorch build certifi
    charset_normalizer chex click cloudpickle cmake colorama contourpy coverage cuda cupy cycler Cython diffrax e3nn
    einops equinox etils execnet filelock flatbuffers flax fontTools formulaic frozenlist fsspec gpytorch grpc h11 h5py
    hf_xet httpcore httpx huggingface_hub humanize hypothesis idna imageio iniconfig interface_meta jax jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy_loader lightning lightning_utilities linear_operator lineax llvmlite lxml
    markdown markdown_it markupsafe matplotlib mdurl mesonbuild ml_dtypes mpi4py mpmath msgpack multidict
    multipledispatch mypy_extensions nanobind narwhals networkx ninja numba numpy numpyro nvidia onnx onnx_ir
    onnxruntime onnxscript cv2 optax opt_einsum opt_einsum_fx optimistix orbax packaging pandas pathspec patsy peft
    PIL pip pluggy portalocker prometheus_client propcache google psutil pyarrow pybind11 cpuinfo pygments pyparsing
    pyproject_hooks pyre_extensions pytest pytest_benchmark pytest_cov pytest_mock pytest_timeout xdist dateutil
    pytorch_lightning yaml regex requests rich sacrebleu safetensors scikit_build_core skimage sklearn scipy seaborn
    sentencepiece sentence_transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
    tabulate tensorboard tensorboard_data_server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
    torch torchaudio torchdiffeq torch_geometric torchmetrics torchvision tqdm transformers treescope triton typer
    typing_extensions typing_inspect urllib3 uvloop wadler_lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
)


@dataclass(frozen=True)
class Kit:
    name: str  # its folder under .gpu-deps/
    pins: tuple[str, ...]
    prune: tuple[str, ...] = ()  # globs under the site directory, deleted
    zero: tuple[str, ...] = ()  # shared objects whose fatbin entries sm_90 never loads are zeroed
    only: tuple[str, ...] = ()  # keep only these paths (the fallback part)
    imports: tuple[str, ...] = ()  # modules whose certain imports the kit and the device image must hold (verify)
    note: str = ""

    @property
    def archive(self) -> str:
        return f"{self.name}.tar.xz"


KITS = (
    Kit(
        "kit-a",
        (*RLC_DEPS, "megatron-core==0.16.1", "ray==2.60.0"),
        prune=(
            "bin",
            "ray/jars",  # Java workers
            "ray/dashboard/client",  # the dashboard's web UI; rlc starts Ray with include_dashboard=False
            "ray/rllib",
            "ray/serve",
            "ray/llm",
            "ray/cpp",
        ),
        imports=("ray", "ray.util.placement_group", "ray.util.scheduling_strategies", "skyrl_gym"),
        note="rlc's pure-Python dependencies, megatron-core 0.16 and core Ray 2.60: `pytest -m gpu`",
    ),
    Kit(
        "kit-b",
        ("vllm==0.26.0", *VLLM_DEPS, *RLC_DEPS[:5]),
        prune=(
            "bin",
            "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",  # sm_80 only: an H100 runs FA3
            "vllm/_moe_C_stable_libtorch.abi3.so",  # mixture-of-experts kernels: dense models only
            "vllm/vllm-rs",  # the Rust server front end
            "vllm/third_party/fmha_sm100",  # Blackwell attention
            "vllm/third_party/deep_gemm",  # FP8 GEMMs
            "vllm/_flashmla_C.abi3.so",  # MLA (DeepSeek) and FP4
            "vllm/_flashmla_extension_C.abi3.so",
            "vllm/_qutlass_C.abi3.so",
            "vllm/entrypoints/serve/instrumentator/static",  # swagger UI
        ),
        zero=(VLLM_C,),
        imports=VLLM_OFFLINE,
        note="vLLM 0.26.0 for one H100 and a dense model, its small dependencies, the jsonschema set",
    ),
    Kit(
        "kit-b-orig",
        ("vllm==0.26.0",),
        only=(VLLM_C,),
        note=f"{VLLM_C} unmodified: the fallback when kit-b's zeroed copy fails to load",
    ),
)
