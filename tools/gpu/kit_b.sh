#!/usr/bin/env bash
# Kit B on the lent GPU (docs/gpu.md): vLLM 0.26 on CUDA in-process, tests/runtime/test_gpu_vllm.py and the vllm_api
# tests. Carries .gpu-deps/kit-b (vLLM cut for one H100, its `_C` zeroed where sm_90 never reads, its small
# dependencies). If the zeroed `_C` does not run a kernel, the unmodified one from kit_b_orig.sh is used.
. tools/gpu/common.sh
log_to "$OUT/kit-b.log"
SITE=/tmp/rlc-site-b
C=vllm/_C_stable_libtorch.abi3.so
export PYTHONPATH=$SITE VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1
step unpack unpack .gpu-deps/kit-b/kit-b.tar.xz "$SITE"
step install install_rlc
step environment environment
probe() {  # one of _C's kernels on the GPU, in a process of its own
  timeout 120 python3 -c "
import torch, vllm._custom_ops as ops
x = torch.randn(8, 256, device='cuda', dtype=torch.bfloat16)
out = torch.empty_like(x); ops.rms_norm(out, x, torch.ones(256, device='cuda', dtype=x.dtype), 1e-6)
torch.cuda.synchronize(); assert torch.isfinite(out).all(); print('a _C kernel ran')"
}
if ! attempt probe probe; then
  [ -f /tmp/rlc-vllm-c-orig/$C ] || {
    report "the _C probe failed (the log says why); if the zeroed _C did: kit_b_orig.sh, then kit_b.sh within 30 s"
    exit 3
  }
  cp /tmp/rlc-vllm-c-orig/$C "$SITE/$C" && echo "== the unmodified _C replaces the zeroed one"
  step probe-unmodified probe
fi
# The one vllm_api test that names 0.30's exception type (0.26 raises a plain ValueError) is left out.
step tests run_tests 420 -m "gpu or vllm_api" tests/runtime/test_gpu_vllm.py tests/runtime/test_vllm_engine.py \
  --deselect tests/runtime/test_vllm_engine.py::test_vllm_refuses_greedy_requests_with_several_samples
report passed
