#!/usr/bin/env bash
# Issue 26's causal check and retriever on both real models, on one lent GPU, in calls that
# follow each other at once (the machine keeps /tmp between calls). SmolLM2's GGUF travels as
# part.aa + part.ab (the first 98,362,432 bytes of a stream cut into 53 MB parts), Gemma's as
# gpart.1 ... gpart.5 with a known-good tokenizer (taskheads_gguf_fix.py says why):
#   bash benchmarks/taskheads_gpu.sh part PART_DIR        copy one part to /tmp/m (any order)
#   bash benchmarks/taskheads_gpu.sh start MODEL          the runs of MODEL (smol | gemma), in
#                                                         the background, both tasks at once
#   bash benchmarks/taskheads_gpu.sh wait                 wait for every run, pack the results
# The parts' SHA-256 sums travel with them (SHA256SUMS); a model starts once its bytes are
# there. Wheels (gguf, bm25s, plotly) are installed from any part folder that holds them.
set -u
REPO=$PWD
SMOL_BYTES=98362432
GEMMA_BYTES=253113024
export PYTHONPATH=/tmp/pkg:/tmp/site HEADHUNT_CACHE=/tmp/hhcache PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=4
mkdir -p /tmp/m /tmp/thruns

layout() {
  [ -d /tmp/pkg/headhunt ] && return
  mkdir -p /tmp/pkg/headhunt
  cp -r "$REPO"/headhunt/* /tmp/pkg/headhunt/
  # copies, not links: a later call replaces the checkout while the runs still import from it
  for d in probes heads kernels sae app; do cp -r "$REPO/$d" "/tmp/pkg/headhunt/$d"; done
}

assemble() {  # assemble smol | gemma: the GGUF from the parts, once they are all there
  if [ "$1" = smol ]; then
    [ -f /tmp/m/smol.gguf ] && return 0
    cat /tmp/m/part.aa /tmp/m/part.ab 2>/dev/null | head -c $SMOL_BYTES >/tmp/m/smol.tmp
    [ "$(stat -c %s /tmp/m/smol.tmp)" = $SMOL_BYTES ] || return 1
    mv /tmp/m/smol.tmp /tmp/m/smol.gguf
  else
    [ -f /tmp/m/gemma.gguf ] && return 0
    (cd /tmp/m && cat gpart.1 gpart.2 gpart.3 gpart.4 gpart.5 >gemma.tmp) || return 1
    [ "$(stat -c %s /tmp/m/gemma.tmp)" = $GEMMA_BYTES ] || return 1
    mv /tmp/m/gemma.tmp /tmp/m/gemma.gguf
  fi
  [ "$1" = smol ] || (cd /tmp && set -o pipefail && python3 "$REPO/benchmarks/taskheads_gguf_fix.py" /tmp/m/gemma.gguf \
    /tmp/m/gemma_tokenizer.json.xz /tmp/m/gemma_fingerprint.json 2>&1 | grep -v Convert)
}

run_task() {  # run_task MODEL TASK DOCS WORDS
  local model=$1 task=$2 out=/tmp/thruns/$1-$2
  cd /tmp
  python3 -m headhunt taskheads --model /tmp/m/$model.gguf --task "$task" --docs "$3" \
    --doc-words "$4" --examples "${EXAMPLES:-132}" --score-examples 32 --ks 1,2,4,8,16 \
    --modes mean,mean-keep-first,zero --random-draws 8 --batch-size 32 --out "$out" \
    --force >"$out.log" 2>&1
  echo "exit $?" >>"$out.log"
}

case "${1:-}" in
part)
  sha=$2/SHA256SUMS
  for f in "$2"/*part.* "$2"/gemma_*; do [ -f "$f" ] && cp "$f" /tmp/m/; done
  (cd /tmp/m && grep -F "$(cd "$REPO/$2" && ls *part.*)" "$REPO/$sha" | sha256sum -c -) || exit 1
  ls "$2"/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site "$2"/*.whl
  ls -la /tmp/m
  ;;
start)
  layout
  assemble "$2" || { echo "not all of $2's parts are here"; exit 1; }
  nvidia-smi -L
  export -f run_task
  setsid nohup bash -c "run_task $2 multidoc-hard 12 40" >/dev/null 2>&1 &
  setsid nohup bash -c "run_task $2 kv 10 10" >/dev/null 2>&1 &
  sleep 2
  ;;
wait)
  for i in $(seq 1 "${2:-550}"); do
    pgrep -f "headhunt taskheads" >/dev/null || break
    sleep 1
  done
  for log in /tmp/thruns/*.log; do echo "== $log"; grep -v "Convert\|it/s\]" "$log" | tail -6; done
  cd /tmp/thruns
  for d in */; do
    d=${d%/}
    tar -czf "$OUT/$d.tgz" --exclude examples.jsonl "$d" "$d.log"
  done
  ls -la "$OUT"
  ;;
*)
  echo "usage: $0 part DIR | start smol|gemma | wait [SECONDS]"
  exit 2
  ;;
esac
