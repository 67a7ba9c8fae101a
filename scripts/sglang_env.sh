#!/usr/bin/env bash
# Build SGLang 0.5.23's own environment for a CPU host, from PyPI only (docs/reference/sglang-cpu.md):
# torch 2.14.1 + torchvision 0.29.1 (SGLang's pin; CUDA builds that run on a CPU), sglang without
# its dependencies, then its runtime Requires-Dist minus the CUDA-only ones, plus what its start
# imports without declaring. relaxtune itself is NOT installed there: it talks HTTP to the server,
# and `relaxtune serve --python ENV/bin/python` puts the sgl_kernel stand-in on the server's path.
#
#   scripts/sglang_env.sh [ENV_DIR]
#
# ENV_DIR defaults to ~/.cache/relaxtune-ci/sglang-<key>, <key> a hash of this script (what it
# installs), so a machine that keeps its cache reuses the environment. An environment is used only
# once complete (ENV_DIR/.complete); a failed build is removed. Prints the environment's python
# on the last line; exits non-zero when the install fails. Takes about 5-10 minutes, 6.5 GB.
set -euo pipefail
SGLANG_VERSION=0.5.23
TORCH_PINS="torch==2.14.1 torchvision==0.29.1"
# SGLang's CUDA-only requirements, left out (torchaudio/torchcodec pin other torch builds; its CPU start
# imports none of them)
CUDA_ONLY="cuda-python|flash-attn-4|flashinfer[-_]python|humming-kernels|nvidia-cutlass-dsl|nvidia-mathdx|nvshmem4py-cu13|quack-kernels|sgl-.*|sglang-kernel|tilelang|torch[-_]memory[-_]saver|torchaudio|torchcodec|torch|torchvision"
# imported at start without being declared, or pinned tighter than declared (sglang-cpu.md)
EXTRAS="soundfile llguidance apache-tvm-ffi numba"
PINS="transformers==5.19.0 tokenizers==0.23.2 xgrammar==0.2.7 outlines==0.1.11 openai==2.8.0"
key="$(echo "$SGLANG_VERSION $TORCH_PINS $CUDA_ONLY $EXTRAS $PINS" | sha256sum | cut -c1-12)"  # what it installs
env_dir="${1:-${RELAXTUNE_CI_CACHE:-$HOME/.cache/relaxtune-ci}/sglang-$SGLANG_VERSION-$key}"
probe="import importlib.metadata as m; assert m.version('sglang') == '$SGLANG_VERSION'"  # no import: minutes under load
if [ -f "$env_dir/.complete" ] && "$env_dir/bin/python" -c "$probe" >/dev/null 2>&1; then
    echo "SGLang environment cached at $env_dir" >&2
    echo "$env_dir/bin/python"
    exit 0
fi
rm -rf "$env_dir"
mkdir -p "$(dirname "$env_dir")"
trap 'rc=$?; [ $rc -ne 0 ] && rm -rf "$env_dir"; exit $rc' EXIT
start=$(date +%s)
export PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m venv "$env_dir"
pip=("$env_dir/bin/python" -m pip install -q --no-input)
"${pip[@]}" --upgrade pip >&2
"${pip[@]}" $TORCH_PINS >&2
"${pip[@]}" --no-deps "sglang==$SGLANG_VERSION" >&2
# SGLang's runtime requirements (markers evaluated, extras left out) minus the CUDA-only ones
CUDA_ONLY="$CUDA_ONLY" "$env_dir/bin/python" - >"$env_dir/requirements-cpu.txt" <<'PY'
import os
import re
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement

CUDA_ONLY = re.compile(rf"^({os.environ['CUDA_ONLY']})$", re.I)
for line in requires("sglang"):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if not CUDA_ONLY.match(req.name):
        print(str(req).split(";")[0].strip())
PY
"${pip[@]}" -r "$env_dir/requirements-cpu.txt" $EXTRAS $TORCH_PINS $PINS >&2
"$env_dir/bin/python" -c "import sglang, torch; assert sglang.__version__ == '$SGLANG_VERSION', sglang.__version__" >&2
touch "$env_dir/.complete"
echo "SGLang $SGLANG_VERSION environment built at $env_dir in $(( $(date +%s) - start )) s ($(du -sh "$env_dir" | cut -f1))" >&2
echo "$env_dir/bin/python"
