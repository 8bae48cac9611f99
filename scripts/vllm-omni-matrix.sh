#!/usr/bin/env bash
# The vLLM-Omni version matrix: one venv per supported release (idempotent), the real-class
# tests against all of them, and the snapshot cost per version.
#   usage: scripts/vllm-omni-matrix.sh
#          MATRIX="0.28.0:.venv-vllm-028 0.30.0:.venv-vllm" scripts/vllm-omni-matrix.sh
# Supported: every release whose async-chunk hook points are covered by a hook table in
# patches/vllm_omni/ (0.26.x, 0.28.x, 0.30.x, 0.32.x). The default suite (.ci/run) builds
# only the two seed versions (.venv-vllm, .venv-vllm-032); the others live here.
# Each venv is ~5.8 GB from PyPI alone (~2.5-3.5 GB where a local +cpu torch wheel fits).
# VLLM_OMNI_TORCH=pypi (passed to the install script) forces the PyPI path, whose venvs
# also run the API-server tests (tests/system/vllm/test_vllm_api_hooks.py) and the benchmark
# CLI test.
set -euo pipefail
cd "$(dirname "$0")/.."
MATRIX=${MATRIX:-"0.26.0:.venv-vllm-026 0.28.0:.venv-vllm-028 0.30.0:.venv-vllm 0.32.0rc1:.venv-vllm-032"}
venvs=()
for entry in $MATRIX; do
  version=${entry%%:*} venv=${entry#*:}
  [ "${venv#/}" != "$venv" ] || venv="$PWD/$venv"
  start=$(date +%s)
  scripts/install-vllm-omni.sh "$venv" "$version" 2>&1 | tail -1
  echo "matrix: $venv ($version) ready in $(( $(date +%s) - start )) s"
  venvs+=("$venv")
done
export OMNITRACE_VLLM_VENVS=$(IFS=:; echo "${venvs[*]}")
log=$(mktemp)
set +e
python -m pytest -q -s -m vllm tests/system/vllm/test_vllm_omni.py tests/system/vllm/test_vllm_api_hooks.py >"$log" 2>&1
rc=$?
set -e
grep -E "snapshot median|passed|failed|skipped|^E " "$log" | tail -30
[ $rc -eq 0 ] && echo "matrix: all versions passed ($MATRIX)" || echo "matrix: FAILED (full log: $log)"
exit $rc
