#!/usr/bin/env bash
# The call before kit B's when its zeroed `_C` does not load (docs/gpu.md): carries .gpu-deps/kit-b-orig and leaves
# the unmodified `_C` in /tmp/rlc-vllm-c-orig, where kit_b.sh takes it from if it comes within the machine's warm 30 s.
. tools/gpu/common.sh
log_to "$OUT/kit-b-orig.log"
step unpack unpack .gpu-deps/kit-b-orig/kit-b-orig.tar.xz /tmp/rlc-vllm-c-orig
report passed
