# Sourced by the kit scripts (tools/gpu/kit_*.sh) on the lent GPU machine, in the repository root; see docs/gpu.md.
# Everything they leave under $OUT comes back (at most 8 files): env.txt, report.json, junit.xml and the log.
set -uo pipefail
OUT=${OUT:-/tmp/rlc-gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
declare -A STEP_S=()

log_to() {  # log_to FILE: all output from here on goes to FILE as well; the file is complete when the script exits
  exec > >(tee "$1") 2>&1
  TEE_PID=$!
  trap 'exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null' EXIT
}

attempt() {  # attempt NAME COMMAND...: run it and log its seconds; its status is returned
  local name=$1 t=$(date +%s) rc
  shift
  echo "== $name (at $(( t - T0 )) s)"
  "$@"
  rc=$?
  STEP_S[$name]=$(( $(date +%s) - t ))
  [ $rc -eq 0 ] || echo "== $name failed ($rc)"
  return $rc
}

step() {  # step NAME COMMAND...: attempt it, and when it fails write the report and stop with its status
  attempt "$@" && return 0
  local rc=$?
  report "$1 failed ($rc)"
  exit $rc
}

unpack() {  # unpack ARCHIVE DIR: a kit part, as tools/gpu_kit.py verify does here
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2], filter='data')" "$1" "$2"
}

install_rlc() {  # rlc itself, editable, with its `rlc` script beside python3 (the e2e tests run it)
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . && return 0
  echo "an editable install failed: installing into $SITE instead"
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$SITE" . && export PATH=$SITE/bin:$PATH
}

environment() {  # what the machine is: the GPU, the packages, the versions the kit brought
  { nvidia-smi; python3 -m pip list --format=freeze; echo "PYTHONPATH=$PYTHONPATH"
    python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))"
  } > "$OUT/env.txt" 2>&1
  return 0
}

run_tests() {  # run_tests SECONDS PYTEST-ARGS...: the tests, their junit XML; the log has the rest. A test that hangs
  # fails alone after 240 s (pytest-timeout), so the junit XML is written; the outer limit is the last resort.
  timeout "$1" python3 -m pytest -p no:cacheprovider -q -rA --durations=0 --timeout 240 \
    --junitxml="$OUT/junit.xml" "${@:2}"
}

report() {  # report.json: steps with their seconds, the tests' outcomes and durations, what each test measured
  local steps="" k
  echo "== report: $1"
  for k in "${!STEP_S[@]}"; do steps+="\"$k\": ${STEP_S[$k]}, "; done
  python3 - "$OUT" "{${steps%, }}" "$1" "$(( $(date +%s) - T0 ))" <<'PY'
import json, os, sys, xml.etree.ElementTree as ET
out, steps, status, total = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
tests = []
if os.path.exists(f"{out}/junit.xml"):
    for case in ET.parse(f"{out}/junit.xml").iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time", 0))})
measured = []
if os.path.exists(f"{out}/measured.jsonl"):
    measured = [json.loads(line) for line in open(f"{out}/measured.jsonl") if line.strip()]
    os.remove(f"{out}/measured.jsonl")
json.dump({"status": status, "seconds": total, "steps": steps, "tests": tests, "measured": measured},
          open(f"{out}/report.json", "w"), indent=1)
PY
}

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RLC_GPU_REPORT=$OUT/measured.jsonl
