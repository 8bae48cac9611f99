#!/usr/bin/env bash
# The vLLM-Omni version matrix: make one venv per known version (idempotent), run the
# real-class tests against all of them, and print the snapshot figures per version.
#   usage: scripts/vllm-omni-matrix.sh            (0.30.0 and 0.32.0rc1)
#          MATRIX="0.30.0:.venv-vllm 0.32.0rc1:.venv-vllm-032" scripts/vllm-omni-matrix.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MATRIX=${MATRIX:-"0.30.0:.venv-vllm 0.32.0rc1:.venv-vllm-032"}
venvs=()
for entry in $MATRIX; do
  version=${entry%%:*} venv=${entry#*:}
  start=$(date +%s)
  scripts/install-vllm-omni.sh "$venv" "$version" 2>&1 | grep -v "^WARNING: Location" | tail -1
  echo "matrix: $venv ($version) ready in $(( $(date +%s) - start )) s"
  venvs+=("$PWD/$venv")
done
export OMNITRACE_VLLM_VENVS=$(IFS=:; echo "${venvs[*]}")
log=$(mktemp)
set +e
python -m pytest -q -s -m vllm tests/test_vllm_omni.py >"$log" 2>&1
rc=$?
set -e
grep -E "snapshot median|passed|failed|skipped|^E " "$log" | tail -20
[ $rc -eq 0 ] && echo "matrix: all versions passed" || echo "matrix: FAILED (full log: $log)"
exit $rc
