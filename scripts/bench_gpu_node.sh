#!/usr/bin/env bash
# make bench-gpu on a GPU node without internet whose image already has torch and transformers (a lighter path than
# make setup WHEELS=..., docs/real-data.md, "A GPU node with a ready torch image"):
#
#   scripts/bench_gpu_node.sh wheels DIR     (a machine with the package index) DIR gets the wheels of the packages
#                                            bench-gpu imports that such an image lacks, at constraints.txt's pins,
#                                            for CPython WHEEL_PYTHON (default 3.12) on manylinux_2_28_x86_64 or older
#   scripts/bench_gpu_node.sh run DIR [ARGS] (the node, repository root) installs DIR's wheels with --target into
#                                            build/node-site (no index, no dependencies, the image's packages untouched),
#                                            prints the versions imported, then runs make bench-gpu with PY=$PYTHON
#                                            (default python3) and ARGS (e.g. BUDGET_S=200); log: build/bench/gpu-node.log
#
# make setup WHEELS=... installs both packages with every dependency at constraints.txt's pins: the full wheelhouse
# (about 225 MB for CPython 3.12, imageio-ffmpeg's 68 MB and yt-dlp among them, core dependencies of
# tokenizer_pipeline that bench-gpu never imports). bench-gpu itself imports, beyond torch, torchaudio and what an
# image with transformers has (numpy, scipy, scikit-learn, safetensors, huggingface-hub >= 1.31, pyyaml, tqdm, regex,
# filelock, fsspec, packaging), only the packages below; transformers and tokenizers come at their pins, whatever
# version the image has. webdataset and braceexpand are not imported by bench-gpu but by the trainer's data modules.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(hydra-core omegaconf antlr4-python3-runtime soundfile cffi pycparser soxr transformers tokenizers
          webdataset braceexpand)

pin() {  # constraints.txt's version of $1 (names compared as PEP 503 does)
    local want; want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
    while IFS='=' read -r name _ version; do
        [[ $(echo "$name" | tr 'A-Z_.' 'a-z--') == "$want" ]] && { echo "$version"; return; }
    done < <(grep -E '^[A-Za-z0-9][A-Za-z0-9._-]*==' constraints.txt)
    echo "bench_gpu_node.sh: $1 has no pin in constraints.txt" >&2; exit 2
}

case "${1:-}" in
wheels)
    dir=${2:?usage: scripts/bench_gpu_node.sh wheels DIR}
    py=${WHEEL_PYTHON:-3.12}
    platforms=(); for g in 28 27 26 25 24 17; do platforms+=(--platform "manylinux_2_${g}_x86_64"); done
    mkdir -p "$dir"
    for p in "${PACKAGES[@]}"; do
        spec="$p==$(pin "$p")"
        # a pin the index has as a source only (antlr4-python3-runtime 4.9.3) is built here: pure Python, any node
        "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
            "${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$spec" 2>/dev/null \
        || "${PYTHON:-python3}" -m pip wheel -q --no-deps -w "$dir" "$spec"
    done
    impure=$(cd "$dir" && ls ./*.whl | grep -v -e '-none-any\.whl$' -e "-cp${py/./}-" -e '-abi3-' -e '-py2\.py3-none-manylinux' || true)
    [[ -z $impure ]] || { echo "bench_gpu_node.sh: wheels for another Python in $dir: $impure" >&2; exit 2; }
    echo "bench_gpu_node.sh: $dir: $(ls "$dir"/*.whl | wc -l) wheels for CPython $py, $(du -sh "$dir" | cut -f1)"
    ;;
run)
    dir=${2:?usage: scripts/bench_gpu_node.sh run DIR [make ARGS]}
    shift 2
    py=${PYTHON:-python3}
    site=$PWD/build/node-site
    mkdir -p build/bench
    set +e
    {
        set -e
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$dir"/*.whl
        export PYTHONPATH=$site:$PWD/packages/tokenizer_pipeline/src:$PWD/packages/adapter_trainer/src
        "$py" - <<'EOF'
import importlib.metadata as md

import torch

import adapter_trainer, tokenizer_pipeline, transformers  # noqa: E401,F401  (fails here, not in the bench)

names = ("torch", "torchaudio", "transformers", "huggingface-hub", "tokenizers", "safetensors", "numpy", "hydra-core",
         "omegaconf", "soundfile", "soxr")
print("bench_gpu_node.sh:", ", ".join(f"{n} {md.version(n)}" for n in names))
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"bench_gpu_node.sh: CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, {gpu}")
EOF
        # .venv/.installed stands for make setup, which this script replaces: -o keeps make from building it
        make -o .venv/.installed bench-gpu PY="$py" "$@"
    } 2>&1 | tee build/bench/gpu-node.log
    exit "${PIPESTATUS[0]}"
    ;;
*)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
