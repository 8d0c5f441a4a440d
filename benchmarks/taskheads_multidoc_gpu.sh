#!/usr/bin/env bash
# Issue 26's causal check on the plain bundled multi-document task, both real models, on one
# lent GPU, in calls that follow each other at once (the machine keeps /tmp between calls).
# Each call carries one folder of the stage (STAGE/cN; the transfer chain of gpu_pieces.sh):
#   c0: src.tgz (`git archive HEAD` of the package and three benchmarks scripts), files/
#       (the wheels gguf, bm25s, plotly; Gemma 3's tokenizer as transformers 5.24 builds it and
#       its weights' fingerprint: taskheads_gguf_fix.py says why; settings.env), and pieces;
#   every folder: consecutive pieces NAME.NN of the compressed GGUFs (gemma: gzip, smol: xz),
#       with NAME.npieces in c0. A model whose pieces are all here is joined, SHA-256 checked,
#       and its run started in the background (setsid: it outlives the call).
#   bash benchmarks/taskheads_multidoc_gpu.sh STAGE/cN            one call's folder
#   bash benchmarks/taskheads_multidoc_gpu.sh STAGE/cN wait SECS  then wait for both runs,
#       packing what is finished into $OUT every minute (a call cut short still returns it)
# Settings (settings.env): CANDIDATES (the --docs sizes whose full accuracy is measured first
# on SWEEP examples, 100), DOCS (else chosen from them by taskheads_accuracy.py --choose), WORDS,
# EVAL (evaluation examples), KS, DRAWS, SCORE (scoring examples, 32), MODELS (gemma smol;
# a model left out must have no pieces: GEMMA_GZ /dev/null). A later folder's
# settings.env replaces the earlier one until a run starts. Gemma 3 also gets every head
# ablated alone (taskheads_single_heads.py).
#   bash benchmarks/taskheads_multidoc_gpu.sh stage STAGE GEMMA_GZ SMOL_XZ FILES SETTINGS
#       (here, not on the GPU machine) lays the folders out: FILES holds the wheels, the
#       tokenizer and the fingerprint; the pieces are cut so that every folder carries about
#       the same bytes (PER, default 45,000,000), Gemma 3's bytes first (its run starts while
#       SmolLM2's still travel).
set -u
. "$(dirname "$0")/gpu_pieces.sh"
if [ "$1" = stage ]; then
  ST=$2 GZ=$3 XZ=$4 FILES=$5 PER=${PER:-45000000}
  rm -rf "$ST" && mkdir -p "$ST/c0/files"
  git archive HEAD headhunt probes heads kernels sae app benchmarks/taskheads_gguf_fix.py \
    benchmarks/taskheads_single_heads.py benchmarks/taskheads_accuracy.py | gzip >"$ST/c0/src.tgz"
  cp "$FILES"/*.json "$FILES"/*.xz "$FILES"/*.whl "$ST/c0/files/" && cp "$6" "$ST/c0/settings.env"
  stage_pieces "$ST" "$PER" gemma "$GZ" smol "$XZ"
  du -sb "$ST"/c*
  exit 0
fi
C=$1
G=${G:-/tmp/thm}
PY=${PY:-python3}
export PYTHONPATH=$G/pkg:$G/site HEADHUNT_CACHE=$G/cache PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
take_folder "$C"

run_model() {  # run_model NAME: the taskheads run (Gemma: its tokenizer checked first)
  local out=$G/runs/$1-multidoc
  # shellcheck disable=SC1091
  . $G/in/settings.env
  cd /tmp || return
  if [ "$1" = gemma ]; then
    (set -o pipefail && $PY $G/src/benchmarks/taskheads_gguf_fix.py $G/gemma.gguf \
      $G/in/files/gemma_tokenizer.json.xz $G/in/files/gemma_fingerprint.json 2>&1 |
      grep -v Convert) >$G/runs/gemma-fix.log || { touch $G/runs/$1.swept $G/runs/$1.done; return; }
  fi
  # the full model's accuracy at each candidate size (taskheads_accuracy.py), then, once every
  # model has its own, the size its --choose rule picks, fixed before any ablation runs (none
  # of this when DOCS is set)
  if [ -z "${DOCS:-}" ]; then
    $PY $G/src/benchmarks/taskheads_accuracy.py --model $G/$1.gguf --task multidoc \
      --docs "$CANDIDATES" --doc-words "$WORDS" --examples "${SWEEP:-100}" \
      --first "${SCORE:-32}" --batch-size 32 --json "$G/runs/accuracy-$1.jsonl" \
      >"$G/runs/$1-sweep.log" 2>&1
    touch "$G/runs/$1.swept"
    for m in ${MODELS:-gemma smol}; do
      while [ ! -f "$G/runs/$m.swept" ]; do sleep 2; done
    done
    . $G/in/settings.env  # (a later call's settings, if one came)
  fi
  DOCS=${DOCS:-$(cat $G/runs/accuracy-*.jsonl | $PY $G/src/benchmarks/taskheads_accuracy.py \
    --choose /dev/stdin)}
  echo "DOCS=$DOCS from $(cat $G/runs/accuracy-*.jsonl 2>/dev/null | wc -l) settings" \
    >"$G/runs/$1-chosen.log"
  $PY -m headhunt taskheads --model $G/$1.gguf --task multidoc --docs "$DOCS" \
    --doc-words "$WORDS" --examples $((${SCORE:-32} + EVAL)) --score-examples "${SCORE:-32}" \
    --ks "$KS" --modes mean --random-from all,outside --random-draws "$DRAWS" --batch-size 64 \
    --out "$out" --force >"$out.log" 2>&1
  echo "exit $?" >>"$out.log"
  if [ "$1" = gemma ] && [ -f "$out/ablation.csv" ]; then
    $PY $G/src/benchmarks/taskheads_single_heads.py "$out" --model $G/gemma.gguf \
      --batch-size 64 >"$out.singles.log" 2>&1
    echo "exit $?" >>"$out.singles.log"
  fi
  touch "$G/runs/$1.done"
}

pack() {  # what is there so far, into $OUT (examples.jsonl left out: large, rebuilt by a run)
  cd $G/runs || return
  for m in gemma smol; do
    ls -d "$m"-* >/dev/null 2>&1 || continue
    tar -czf "$OUT/$m-multidoc.tgz.tmp" --exclude examples.jsonl $(ls -d "$m"-*) &&
      mv "$OUT/$m-multidoc.tgz.tmp" "$OUT/$m-multidoc.tgz"
  done
  cp accuracy-*.jsonl "$OUT/" 2>/dev/null
  nvidia-smi -L >"$OUT/card.txt" 2>&1
}

join gemma gzip
join smol lzma
for m in gemma smol; do
  if [ -f $G/$m.gguf ] && [ -d $G/pkg ] && [ ! -f $G/runs/$m.started ]; then
    touch $G/runs/$m.started
    export -f run_model
    export G PY
    setsid nohup bash -c "run_model $m" >$G/runs/$m-chain.log 2>&1 &
    echo "started $m"
  fi
done
echo "pieces here: $(cd $G/in && ls gemma.[0-9]* smol.[0-9]* 2>/dev/null | tr '\n' ' ')"
. $G/in/settings.env
if [ "${2:-}" = wait ]; then
  for i in $(seq 1 "${3:-540}"); do
    [ $((i % 60)) = 0 ] && pack && tail -qn1 $G/runs/*.log | grep -v "it/s"
    busy=0
    for m in ${MODELS:-gemma smol}; do [ -f "$G/runs/$m.done" ] || busy=1; done
    [ $busy = 0 ] && break
    sleep 1
  done
  pack
  for f in $G/runs/*.log; do echo "== $f"; grep -v "Convert\|it/s\]" "$f" | tail -4; done
  ls -la "$OUT"
fi
