#!/usr/bin/env bash
# The conformance checks that need the GPU machine's stack (CUDA torch with the torchvision
# built for it, so timm imports): Gemma 3n as released (its vision tower is a timm model),
# beside the gemma3n_text rows and MusicGen Melody's codebook checks (on this transformers),
# with the versions and the card in the log. Writes
# $OUT/conformance_gpu.log (pytest -rA). Carry .whl/ with timm (and torchvision) wheels. The
# checkout's headhunt/ lacks the package-dir links of /tmp/pkg: -P and append keep it behind.
set -u
[ -d /tmp/pkg/headhunt ] || source benchmarks/device_setup.sh
export PYTHONPATH=/tmp/pkg:/tmp/site HEADHUNT_CACHE=/tmp/hhcache PYTHONUNBUFFERED=1
LOG="$OUT/conformance_gpu.log"
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import sys, torch, torchvision, transformers, timm; print('python', sys.version.split()[0], 'torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'timm', timm.__version__)"
  OMP_NUM_THREADS=8 python3 -P -m pytest --import-mode=append -p no:cacheprovider -q -rA \
    tests/conformance/test_gemma3n_multimodal.py tests/conformance/test_codebooks.py \
    tests/conformance/test_families.py -k "gemma3n or codebook or musicgen"
} 2>&1 | tee "$LOG"
