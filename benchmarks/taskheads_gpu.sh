#!/usr/bin/env bash
# Issue 26's causal check and retriever on both real models, and the 128k timing, on one lent
# GPU, in calls that follow each other at once (the machine keeps /tmp between calls). The two
# GGUFs travel as one byte stream, gemma.gguf then smol.gguf, cut into part folders of at most
# 50 MiB (a call carries 64 MiB with the tree); the first also holds SIZES (the two GGUFs'
# sizes), SHA256SUMS, the wheels (gguf, bm25s, plotly) and Gemma's known-good tokenizer
# (taskheads_gguf_fix.py says why):
#   bash benchmarks/taskheads_gpu.sh part PART_DIR [128k]   copy one part to /tmp/m (with 128k:
#                     start the 128k timing in the background first, while the GPU is idle);
#                     start each model whose bytes are all there, after the timing: the reuse
#                     check, then both tasks at once, in the background
#   bash benchmarks/taskheads_gpu.sh wait [SECONDS]  wait for all of it, pack the results
set -u
REPO=$PWD
export PYTHONPATH=/tmp/pkg:/tmp/site HEADHUNT_CACHE=/tmp/hhcache PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=4
mkdir -p /tmp/m /tmp/thruns

layout() {
  [ -d /tmp/pkg/headhunt ] && return
  mkdir -p /tmp/pkg/headhunt
  cp -r "$REPO"/headhunt/* /tmp/pkg/headhunt/
  # copies, not links: a later call replaces the checkout while the runs still import from it
  for d in probes heads kernels sae app; do cp -r "$REPO/$d" "/tmp/pkg/headhunt/$d"; done
  cp -r "$REPO/benchmarks" /tmp/pkg/benchmarks
}

bytes_of() {  # bytes_of MODEL: the stream's offset and length of the model's GGUF
  read -r gemma_bytes smol_bytes </tmp/m/SIZES
  if [ "$1" = gemma ]; then echo 0 "$gemma_bytes"; else echo "$gemma_bytes" "$smol_bytes"; fi
}

assemble() {  # assemble gemma | smol: the GGUF from the stream (Gemma: its tokenizer fixed)
  [ -f "/tmp/m/$1.gguf" ] && return 0
  local off len
  read -r off len < <(bytes_of "$1")
  cat /tmp/m/stream.* | tail -c +$((off + 1)) | head -c "$len" >"/tmp/m/$1.tmp"
  mv "/tmp/m/$1.tmp" "/tmp/m/$1.gguf"
  (cd /tmp/m && grep " $1.gguf" SHA256SUMS | sha256sum -c -) || { rm "/tmp/m/$1.gguf"; return 1; }
  [ "$1" = smol ] || (cd /tmp && set -o pipefail && python3 /tmp/pkg/benchmarks/taskheads_gguf_fix.py \
    /tmp/m/gemma.gguf /tmp/m/gemma_tokenizer.json.xz /tmp/m/gemma_fingerprint.json 2>&1 | grep -v Convert)
}

run_task() {  # run_task MODEL TASK DOCS WORDS
  local model=$1 task=$2 out=/tmp/thruns/$1-$2
  cd /tmp
  python3 -m headhunt taskheads --model /tmp/m/$model.gguf --task "$task" --docs "$3" \
    --doc-words "$4" --examples "${EXAMPLES:-132}" --score-examples 32 --ks 1,2,4,8,16 \
    --modes mean --random-from all,outside --random-draws 8 --batch-size 32 --out "$out" \
    --force >"$out.log" 2>&1
  echo "exit $?" >>"$out.log"
}

chain() {  # chain MODEL: the GGUF, the reuse check, both tasks (after the 128k timing)
  while [ -f /tmp/thruns/128k.started ] && [ ! -f /tmp/thruns/128k.done ]; do sleep 1; done
  if assemble "$1"; then
    (cd /tmp && python3 /tmp/pkg/benchmarks/taskheads_reuse_check.py "/tmp/m/$1.gguf" \
      >"/tmp/thruns/reuse_check_$1.log" 2>&1)
    run_task "$1" multidoc-hard 12 40 &
    run_task "$1" kv 10 10 &
    wait
  fi
  touch "/tmp/thruns/$1.done"
}

start() {  # start MODEL in the background once its bytes are all there
  [ -f "/tmp/thruns/$1.started" ] && return
  [ -f /tmp/m/SIZES ] || return
  local off len have
  read -r off len < <(bytes_of "$1")
  have=$(cat /tmp/m/stream.* 2>/dev/null | wc -c)
  [ "$have" -ge $((off + len)) ] || return
  touch "/tmp/thruns/$1.started"
  layout
  export -f bytes_of assemble run_task chain
  export REPO
  setsid nohup bash -c "chain $1" >"/tmp/thruns/chain_$1.log" 2>&1 &
  echo "started $1"
}

case "${1:-}" in
part)
  for f in "$2"/*; do [ -f "$f" ] && cp "$f" /tmp/m/; done
  ls "$2"/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site "$2"/*.whl
  if [ "${3:-}" = 128k ] && [ ! -f /tmp/thruns/128k.started ]; then
    layout
    touch /tmp/thruns/128k.started
    nvidia-smi -L
    setsid nohup bash -c "cd /tmp/pkg/benchmarks && python3 taskheads_128k.py --out /tmp/thruns \
      --repeats 2 >/tmp/thruns/128k.log 2>&1; touch /tmp/thruns/128k.done" >/dev/null 2>&1 &
  fi
  start gemma
  start smol
  ls -la /tmp/m | tail -4
  tail -2 /tmp/thruns/128k.log 2>/dev/null
  ;;
wait)
  for i in $(seq 1 "${2:-550}"); do
    busy=0
    [ -f /tmp/thruns/128k.started ] && [ ! -f /tmp/thruns/128k.done ] && busy=1
    for m in smol gemma; do
      [ -f "/tmp/thruns/$m.started" ] && [ ! -f "/tmp/thruns/$m.done" ] && busy=1
    done
    [ $busy = 0 ] && break
    sleep 1
  done
  nvidia-smi -L
  for log in /tmp/thruns/*.log; do echo "== $log"; grep -v "Convert\|it/s\]" "$log" | tail -4; done
  cd /tmp/thruns
  for d in */; do
    d=${d%/}
    [ -f "$d/ablation.csv" ] || continue
    tar -czf "$OUT/$d.tgz" --exclude examples.jsonl "$d" "$d.log"
  done
  cat chain_*.log reuse_check_*.log >"$OUT/reuse_check.log"
  cp taskheads_128k.json 128k.log "$OUT/" 2>/dev/null
  ls -la "$OUT"
  ;;
*)
  echo "usage: $0 part DIR [128k] | wait [SECONDS]"
  exit 2
  ;;
esac
