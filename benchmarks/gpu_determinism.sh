#!/usr/bin/env bash
# Reproducibility of bf16 GPU decoding, in two calls that follow each other at once:
#   call 1 (carry .carry/p1 and .whl): bash benchmarks/gpu_determinism.sh 1
#   call 2 (carry .carry/p2):          bash benchmarks/gpu_determinism.sh 2
# Runs benchmarks/gpu_determinism.py twice per setting (default, HEADHUNT_DETERMINISTIC=1, SDPA
# pinned to flash) as separate processes and compares the hashes.
set -u
REPO=$PWD
G=/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf
if [ "${1:-1}" = 1 ]; then
  mkdir -p /tmp/m && cp .carry/p1/gguf.part.aa /tmp/m/
  source benchmarks/device_setup.sh
  exit 0
fi
[ -f $G ] || cat /tmp/m/gguf.part.aa .carry/p2/gguf.part.ab > $G
export PYTHONPATH=/tmp/pkg:/tmp/site HEADHUNT_CACHE=/tmp/hhcache PYTHONUNBUFFERED=1
cd /tmp
one() {  # one NAME [options]
  local name=$1
  shift
  timeout 120 python3 "$REPO/benchmarks/gpu_determinism.py" --model $G --out "$OUT/$name.json" "$@" 2>&1 |
    grep -v Convert | tail -2
}
for s in default det flash; do
  opts=()
  [ $s = flash ] && opts=(--sdpa flash)
  for r in a b; do
    if [ $s = det ]; then HEADHUNT_DETERMINISTIC=1 one ${s}_$r; else one ${s}_$r "${opts[@]}"; fi
  done
  echo "== $s"
  python3 "$REPO/benchmarks/gpu_determinism.py" --compare "$OUT/${s}_a.json" "$OUT/${s}_b.json"
done
python3 -c "import json;d=json.load(open('$OUT/default_a.json'));print('prefill',d['prefill_kernels']);print('decode',d['decode_kernels'])"
echo "took $SECONDS s"
