#!/usr/bin/env bash
# The GPU measurements in BENCHMARKS.md (capture at long context, data parallel retrieval),
# as run on the lent 2-GPU machine after the GGUF was copied to /tmp/m. Results go to $OUT.
set -u
G=/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf
REPO=$PWD
source benchmarks/device_setup.sh
nvidia-smi -L
if [ -z "${SKIP_CAPTURE:-}" ]; then
  python3 benchmarks/bench_capture.py --model $G --length 8192 --out "$OUT/capture_smol_8k.json" 2>&1 | tail -3
  python3 benchmarks/bench_capture.py --llama8b --length 32768 --repeats 2 --eager-layer \
    --out "$OUT/capture_llama8b_32k.json" 2>&1 | tail -3
fi
cd /tmp  # so `python3 -m headhunt` finds the installed layout, not the checkout's headhunt/ folder
L=$(python3 -c "print(','.join(str(400 * i) for i in range(1, 21)))")
D=0,11,22,33,44,56,67,78,89,100
for n in 1 2; do
  python3 -m headhunt retrieval --model $G --out /tmp/r$n --lengths "$L" --depths $D --nproc $n --force \
    > "$OUT/retrieval_nproc$n.log" 2>&1
  cp /tmp/r$n/manifest.json "$OUT/manifest_nproc$n.json"
done
python3 - <<'PY'
import filecmp, json
same = {f: filecmp.cmp(f"/tmp/r1/{f}", f"/tmp/r2/{f}", shallow=False)
        for f in ("trials.jsonl", "retrieval_heads.json", "duo_attention.tsv")}
t = [json.load(open(f"/tmp/r{n}/manifest.json"))["timings"]["trials_s"] for n in (1, 2)]
print("identical files:", same, "trials_s 1 GPU / 2 GPUs:", t, "speed-up:", t[0] / t[1])
PY
timeout 240 python3 -m pytest "$REPO/tests/kernels" "$REPO/tests/probes/test_attention.py" \
  "$REPO/tests/heads/test_retrieval.py" "$REPO/tests/probes/test_capture.py" --device cuda -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_cuda.log" | tail -12
