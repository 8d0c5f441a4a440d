#!/usr/bin/env bash
# Issue 8 (scale out) on a lent 2-GPU machine, in two calls that follow each other at once
# (the embedded GGUF travels in two halves, .carry/p1 and .carry/p2):
#   call 1 (carry .carry/p1 and .whl): bash benchmarks/gpu_scale.sh 1
#       wheels and package layout; the 8B-shaped Llama split over both GPUs at long context
#       (bench_device_map.py; DM_LENGTHS, DM_SINGLE=1 for the unsplit timings too)
#   call 2 (carry .carry/p2): bash benchmarks/gpu_scale.sh 2
#       the 600-trial retrieval grid: two 1-GPU runs side by side (one per card), then 2 GPUs;
#       compare_retrieval.py; the grid again with HEADHUNT_DETERMINISTIC=1 if the runs differ
# FULL=1 (a few minutes more): the --device-map and attention tests on the GPUs (call 1),
# sinks/n-gram/MQAR 1 vs 2 GPUs (call 2).
set -u
PART=${1:-1}
REPO=$PWD
G=/tmp/m/SmolLM2-135M-Instruct.Q4_1.gguf
layout() {
  mkdir -p /tmp/pkg/headhunt
  cp -r headhunt/* /tmp/pkg/headhunt/
  for d in probes heads kernels sae app; do ln -sfn "$PWD/$d" "/tmp/pkg/headhunt/$d"; done
  export PYTHONPATH=/tmp/pkg:/tmp/site HEADHUNT_CACHE=/tmp/hhcache PYTHONUNBUFFERED=1
  export OMP_NUM_THREADS=4
}
if [ "$PART" = 1 ]; then
  mkdir -p /tmp/m && cp .carry/p1/gguf.part.aa /tmp/m/
  source benchmarks/device_setup.sh
  layout
  nvidia-smi -L | tee "$OUT/gpus.txt"
  cd /tmp
  # The 8B-shaped Llama split over both GPUs at long context.
  timeout 120 python3 "$REPO/benchmarks/bench_device_map.py" --lengths "${DM_LENGTHS:-32768}" \
    --repeats 1 --check-length 4096 ${DM_SINGLE:+--single} --out "$OUT/device_map_llama8b.json" 2>&1 |
    tee "$OUT/bench_device_map.log" | tail -8
  if [ -n "${FULL:-}" ]; then
    timeout 150 python3 -m pytest "$REPO/tests/probes/test_device_map.py" \
      "$REPO/tests/probes/test_attention.py" --device cuda -q -p no:cacheprovider 2>&1 |
      tee "$OUT/pytest_cuda.log" | tail -15
  fi
  exit 0
fi

[ -f $G ] || cat /tmp/m/gguf.part.aa .carry/p2/gguf.part.ab > $G
layout
cd /tmp  # so `python3 -m headhunt` finds the installed layout, not the checkout's headhunt/ folder
L=$(python3 -c "print(','.join(str(400 * i) for i in range(1, 21)))")
D=0,11,22,33,44,56,67,78,89,100
LOG="$OUT/retrieval_runs.log"
run() {  # run NAME [options]: one retrieval run of the 600-trial grid into /tmp/NAME
  local name=$1
  shift
  echo "== $name $* (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-all} DET=${HEADHUNT_DETERMINISTIC:-0})" >>"$LOG"
  timeout 150 python3 -m headhunt retrieval --model $G --out /tmp/$name --lengths "$L" --depths $D \
    --force "$@" 2>&1 | grep -v "trials:\|Convert" | tail -4 >>"$LOG"
}
# Two 1-GPU runs side by side, one per card (as busy a host as the 2-GPU run): run-to-run and
# card-to-card reproducibility, and the 1-GPU baseline (r1a); then 2 GPUs.
CUDA_VISIBLE_DEVICES=0 run r1a & CUDA_VISIBLE_DEVICES=1 run r1b & wait
run r2 --nproc 2
same() { cmp -s /tmp/$1/trials.jsonl /tmp/$2/trials.jsonl; }
if same r1a r2 && same r1a r1b; then
  echo "no deterministic runs (all default runs identical)" >>"$LOG"
else  # some differ: do deterministic kernels make them agree?
  export HEADHUNT_DETERMINISTIC=1
  CUDA_VISIBLE_DEVICES=0 run d1a & CUDA_VISIBLE_DEVICES=1 run d1b & wait
  run d2 --nproc 2
  unset HEADHUNT_DETERMINISTIC
fi
{
  echo '{"vs_r1a":'
  python3 "$REPO/benchmarks/compare_retrieval.py" /tmp/r1a /tmp/r2 /tmp/r1b /tmp/d1a
  echo ', "deterministic":'
  python3 "$REPO/benchmarks/compare_retrieval.py" /tmp/d1a /tmp/d1b /tmp/d2
  echo '}'
} >"$OUT/compare.json"
cp /tmp/r1a/manifest.json "$OUT/manifest_r1a.json"
cp /tmp/r2/manifest.json "$OUT/manifest_r2.json"
python3 - "$OUT/compare.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for group, rows in c.items():
    for r in rows:
        print(group, r["base"], "vs", r["other"], "| scores differ:", r["scores_differ"],
              "responses differ:", r["responses_differ"], "max diff:", round(r["max_score_diff"], 3),
              "| trials_s:", r["trials_s"], "speed-up:", round(r["speed_up"], 3))
PY
# The other data-parallel commands on the embedded model: 1 vs 2 GPUs, file by file.
other() {  # other CMD NPROC [options]
  local cmd=$1 n=$2
  shift 2
  timeout 60 python3 -m headhunt $cmd --model $G --out /tmp/$cmd$n --nproc $n --force "$@" \
    >>"$OUT/other_runs.log" 2>&1
}
if [ -n "${FULL:-}" ] && [ $SECONDS -lt "${OTHER_UNTIL:-240}" ]; then
  for n in 1 2; do
    other sinks $n --n-texts 8 --length 2048
    other ngram $n --n-seqs 16
    other mqar $n
  done
  python3 - <<'PY' | tee "$OUT/other_compare.json"
import json
from pathlib import Path
out = {}
for cmd in ("sinks", "ngram", "mqar"):
    a, b = Path(f"/tmp/{cmd}1"), Path(f"/tmp/{cmd}2")
    if not (a / "manifest.json").is_file() or not (b / "manifest.json").is_file():
        out[cmd] = "missing"
        continue
    names = sorted(p.name for p in a.iterdir() if p.name != "manifest.json" and not p.name.endswith(".html"))
    t = [json.loads((d / "manifest.json").read_text())["timings"] for d in (a, b)]
    out[cmd] = {"differ": [n for n in names if (a / n).read_bytes() != (b / n).read_bytes()],
                "files": names, "timings_1": t[0], "timings_2": t[1]}
print(json.dumps(out, indent=1))
PY
fi
echo "part 2 took $SECONDS s"
