#!/usr/bin/env bash
# The compiler's and runtime's fast tests (not marked slow) on every Python from 3.10 to 3.13 found on this machine,
# one of each minor version but that of the one `make test` ran on, each in its own venv of rlc and its `test-core`
# extra: no torch (its CPU build is there for CPython 3.11 only), so the tests that need it skip with the reason.
# Pythons come from PATH (python3.X) and pyenv's versions folder. Usage: tools/ci_pythons.sh [PYTHON_MAKE_TEST_RAN_ON]
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python `make test` ran on covers its minor version (its 3.11 is Debian's; pyenv's 3.11.7 adds nothing).
tested=$("${1:-false}" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
work=$(mktemp -d /tmp/rlc-pythons.XXXXXX)
trap 'rm -rf "$work"' EXIT

candidates() {
  for v in 10 11 12 13 14; do command -v "python3.$v" || true; done
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  ls -d "$root"/versions/*/bin/python3 2>/dev/null || true
}

declare -A seen=()
found=0
failed=()
for py in $(candidates); do
  real=$(realpath "$py")
  [ -n "${seen[$real]:-}" ] && continue
  seen[$real]=1
  version=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3]) if (3, 10) <= sys.version_info[:2] <= (3, 13) else None' 2>/dev/null || true)
  case "$version" in "" | None) continue ;; esac
  minor=${version%.*}
  [ "$minor" = "$tested" ] || [ -n "${seen[$minor]:-}" ] && continue
  seen[$minor]=1
  found=$((found + 1))
  started=$SECONDS
  echo "-- Python $version ($py)"
  venv="$work/venv-$version"
  if ! "$py" -m venv "$venv"; then
    echo "Python $version cannot make a venv here (Debian: its python3.X-venv package): not tested"
    continue
  fi
  "$venv/bin/pip" install -q -e '.[test-core]' 2>&1 | grep -v "is ignored: it is neither" || true
  if ! "$venv/bin/python" -c "import rlc.compiler.cli" 2>/dev/null; then
    echo "Python $version: rlc did not install"
    failed+=("$version")
    continue
  fi
  if ! "$venv/bin/python" -m pytest tests/compiler tests/runtime -m "not slow" -q -p no:cacheprovider \
    -n 2 --dist loadfile --no-loadscope-reorder; then
    failed+=("$version")
  fi
  echo "-- Python $version: $((SECONDS - started)) s"
done
echo "other Pythons tested: $found"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed on Python ${failed[*]}"
  exit 1
fi
