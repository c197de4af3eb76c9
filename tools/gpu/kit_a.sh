#!/usr/bin/env bash
# Kit A on the lent GPU (docs/gpu.md): `pytest -m gpu` in full. Carries .gpu-deps/kit-a (rlc's dependencies the
# machine lacks, megatron-core 0.16, core Ray 2.60).
. tools/gpu/common.sh
log_to "$OUT/kit-a.log"
SITE=/tmp/rlc-site-a
export PYTHONPATH=$SITE RAY_USAGE_STATS_ENABLED=0
step unpack unpack .gpu-deps/kit-a/kit-a.tar.xz "$SITE"
step install install_rlc
step environment environment
step tests run_tests 480 -m gpu tests/runtime/test_memory_estimate.py tests/runtime/test_weight_sync.py \
  tests/runtime/test_gpu.py tests/e2e/test_run.py
report passed
