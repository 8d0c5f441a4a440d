#!/usr/bin/env bash
# Retrieval scores and the causal check on the embedded model, on one lent GPU (see README).
set -u
G=/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf
source benchmarks/device_setup.sh
cd /tmp
L=$(python3 -c "print(','.join(str(400 * i) for i in range(1, 21)))")
python3 -m headhunt retrieval --model $G --out /tmp/ret --lengths "$L" --depths 0,11,22,33,44,56,67,78,89,100 --force 2>&1 | grep -v "Convert\|trials:" | tail -30
for k in 10 20; do
  python3 -m headhunt ablate --model $G --scores /tmp/ret --out /tmp/abl$k --top-k $k --draws 5 \
    --lengths 2000,4000,8000 --depths 0,11,22,33,44,56,67,78,89,100 --batch-size 30 --force 2>&1 | grep -v "Convert\|conditions:" | tail -14
  cp /tmp/abl$k/ablation.json "$OUT/ablation_top$k.json"
done
cp /tmp/ret/manifest.json "$OUT/retrieval_manifest.json"; cp /tmp/ret/retrieval_heads.json /tmp/ret/scores.parquet "$OUT/"
