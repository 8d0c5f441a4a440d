#!/usr/bin/env bash
# Retrieval scores and the causal check on the embedded model, on a lent GPU (see README), after
# the GGUF was put together in /tmp/m. SCORES=DIR reuses a retrieval run of the same grid
# (e.g. gpu_scale.sh's /tmp/r1a); with two GPUs the K = 10 and K = 20 ablations run side by side.
set -u
G=/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf
[ -d /tmp/pkg/headhunt ] || source benchmarks/device_setup.sh
export PYTHONPATH=/tmp/pkg:/tmp/site HEADHUNT_CACHE=/tmp/hhcache PYTHONUNBUFFERED=1
cd /tmp
RET=${SCORES:-/tmp/ret}
if [ -z "${SCORES:-}" ]; then
  L=$(python3 -c "print(','.join(str(400 * i) for i in range(1, 21)))")
  python3 -m headhunt retrieval --model $G --out $RET --lengths "$L" \
    --depths 0,11,22,33,44,56,67,78,89,100 --force 2>&1 | grep -v "Convert\|trials:" | tail -30
fi
N=$(nvidia-smi -L | wc -l)
ablate() {  # ablate K GPU
  CUDA_VISIBLE_DEVICES=$2 python3 -m headhunt ablate --model $G --scores $RET --out /tmp/abl$1 \
    --top-k $1 --draws 5 --lengths 2000,4000,8000 --depths 0,11,22,33,44,56,67,78,89,100 \
    --batch-size 30 --force >/tmp/abl$1.log 2>&1
  grep -v "Convert\|conditions:" /tmp/abl$1.log | tail -14
  cp /tmp/abl$1/ablation.json "$OUT/ablation_top$1.json"
}
if [ "$N" -ge 2 ]; then
  ablate 10 0 & ablate 20 1 & wait
else
  ablate 10 0; ablate 20 0
fi
cp $RET/manifest.json "$OUT/retrieval_manifest.json"
cp $RET/retrieval_heads.json $RET/scores.parquet "$OUT/"
