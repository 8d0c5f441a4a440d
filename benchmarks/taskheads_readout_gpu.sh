#!/usr/bin/env bash
# Issue 26's causal check with the readout ablation (mean-readout: the heads' outputs replaced
# only at the rows from the question's first token through the answer), both real models,
# plain multidoc and kv, on one lent GPU, in calls that follow each other at once (the machine
# keeps /tmp between calls). The transfer chain of gpu_pieces.sh: each call carries one folder
# of the stage (STAGE/cN):
#   c0: this script, src.tgz (`git archive HEAD` of the package and two benchmarks scripts),
#       files/ (the wheels gguf, bm25s, plotly; Gemma 3's tokenizer as transformers 5.24 builds
#       it and its weights' fingerprint: taskheads_gguf_fix.py says why), settings.env, pieces;
#   every folder: this script, gpu_pieces.sh and consecutive pieces NAME.NN of the compressed
#       GGUFs (smol: xz, gemma: gzip), SmolLM2's bytes first (its runs start while Gemma's
#       still travel), with NAME.npieces in c0. A model whose pieces are all here is joined, SHA-256 checked,
#       and its runs (one per task, at once) started in the background (setsid: they outlive
#       the call).
#   bash STAGE/cN/readout_gpu.sh STAGE/cN            one call's folder
#   bash STAGE/cN/readout_gpu.sh STAGE/cN wait SECS  then wait for every run, packing what is
#       there into $OUT every 30 s (a call cut short still returns it; conditions.jsonl grows
#       one ablation at a time, k ascending)
# Settings (settings.env): TASKS (multidoc kv; TASKS_smol, TASKS_gemma: one model's own),
# MD_DOCS, MD_WORDS, KV_DOCS, MD_MODES, KV_MODES, EVAL (evaluation examples), SCORE (scoring
# examples), KS (KS_kv, KS_multidoc: one task's own, in the order they run), DRAWS, MODELS
# (smol gemma), DETECTORS (default copy,query,write).
#   bash benchmarks/taskheads_readout_gpu.sh stage STAGE SMOL_XZ GEMMA_GZ FILES SETTINGS
#       (here, not on the GPU machine) lays the folders out; PER (default 45,000,000) bytes a
#       folder: the call's tree (the repository's, about 21 MB) and the folder stay under 64 MiB.
set -u
. "$(dirname "$0")/gpu_pieces.sh"
if [ "$1" = stage ]; then
  ST=$2 XZ=$3 GZ=$4 FILES=$5 PER=${PER:-45000000}
  rm -rf "$ST" && mkdir -p "$ST/c0/files"
  git archive HEAD headhunt probes heads kernels sae app benchmarks/taskheads_gguf_fix.py \
    benchmarks/taskheads_report.py benchmarks/taskheads_qrfilter.py benchmarks/bench_capture.py \
    benchmarks/taskheads_128k.py | gzip >"$ST/c0/src.tgz"
  cp "$FILES"/*.json "$FILES"/*.xz "$FILES"/*.whl "$ST/c0/files/" && cp "$6" "$ST/c0/settings.env"
  stage_pieces "$ST" "$PER" smol "$XZ" gemma "$GZ"
  for d in "$ST"/c*; do cp "$0" "$d/readout_gpu.sh" && cp "$(dirname "$0")/gpu_pieces.sh" "$d/"; done
  du -sb "$ST"/c*
  exit 0
fi
C=$1
G=${G:-/tmp/thr}
PY=${PY:-python3}
export PYTHONPATH=$G/pkg:$G/site HEADHUNT_CACHE=$G/cache PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
take_folder "$C"

setting() {  # setting NAME TASK VAR DEFAULT: VAR_<name>_<task>, else VAR_<task>, else DEFAULT
  local a=$3_$1_${2//-/_} b=$3_${2//-/_}
  echo "${!a:-${!b:-$4}}"
}

run_task() {  # run_task NAME TASK: one taskheads run (KS, DOCS, WORDS, MODES per task or model)
  local out=$G/runs/$1-$2 docs words modes ks
  if [ "$2" = kv ]; then
    docs=$KV_DOCS words=10 modes=$KV_MODES
  else
    docs=$MD_DOCS words=$MD_WORDS modes=$MD_MODES
  fi
  ks=$(setting "$1" "$2" KS "$KS") docs=$(setting "$1" "$2" DOCS "$docs")
  words=$(setting "$1" "$2" WORDS "$words") modes=$(setting "$1" "$2" MODES "$modes")
  local common=(--model "$G/$1.gguf" --task "$2" --docs "$docs" --doc-words "$words"
    --examples $((SCORE + EVAL)) --score-examples "$SCORE" --batch-size 64)
  if [ -n "${QRFILTER:-}${AGAINST:-}" ]; then  # detection alone first, then ablate only the
    # k whose top-k set changed: QRFILTER, query's with QRHead's filter against without it
    # (taskheads_qrfilter.py, the same records); AGAINST (files/AGAINST: NAME-TASK -> a
    # committed run's top 16 of DETECTORS), that detector's against the committed run's
    $PY -m headhunt taskheads "${common[@]}" --ks 1 --modes zero --detectors "${DETECTORS:-query}" \
      --random-draws 0 --no-specificity --out "$out-detect" --force >"$out-detect.log" 2>&1
    if [ -n "${QRFILTER:-}" ]; then
      $PY $G/src/benchmarks/taskheads_qrfilter.py "$out-detect" --out "$out-detect.json" \
        >>"$out-detect.log" 2>&1
      ks=$($PY -c "import json, sys; same = json.load(open(sys.argv[1]))[0]['same_top_k']
print(','.join(k for k in sys.argv[2].split(',') if not same.get(k)))" "$out-detect.json" "$ks")
    else
      ks=$($PY -c "import json, sys; new = json.load(open(sys.argv[1]))['top'][sys.argv[3]]
old = json.load(open(sys.argv[2]))[sys.argv[4]]
print(','.join(k for k in sys.argv[5].split(',') if int(k) > 16
               or {tuple(h) for h in new[:int(k)]} != {tuple(h) for h in old[:int(k)]}))" \
        "$out-detect/detectors.json" "$G/in/files/$AGAINST" "$DETECTORS" "$1-$2" "$ks")
    fi
    echo "k to ablate: ${ks:-none}" >>"$out-detect.log"
    [ -n "$ks" ] || return 0
  fi
  $PY -m headhunt taskheads "${common[@]}" --ks "$ks" --modes "$modes" \
    --random-from "${RANDOM_FROM:-all,outside}" --random-draws "$DRAWS" \
    --detectors "${DETECTORS:-copy,query,write}" --out "$out" --force >"$out.log" 2>&1
  echo "exit $?" >>"$out.log"
}

run_model() {  # run_model NAME: its tasks (TASKS_<name>, else TASKS) at once (Gemma: its
  # tokenizer checked first)
  # shellcheck disable=SC1091
  . $G/in/settings.env
  local tvar=TASKS_$1
  cd /tmp || return
  if [ "$1" = gemma ]; then
    (set -o pipefail && $PY $G/src/benchmarks/taskheads_gguf_fix.py $G/gemma.gguf \
      $G/in/files/gemma_tokenizer.json.xz $G/in/files/gemma_fingerprint.json 2>&1 |
      grep -v Convert) >$G/runs/gemma-fix.log || { touch $G/runs/$1.done; return; }
  fi
  for t in ${!tvar:-$TASKS}; do run_task "$1" "$t" & done
  wait
  touch "$G/runs/$1.done"
}

pack() {  # what is there so far, into $OUT (examples.jsonl left out: large, rebuilt by a run)
  cd $G/runs || return
  for m in smol gemma; do
    ls -d "$m"-* >/dev/null 2>&1 || continue
    tar -czf "$OUT/$m-readout.tgz.tmp" --exclude examples.jsonl --exclude taskheads.html \
      $(ls -d "$m"-*) && mv "$OUT/$m-readout.tgz.tmp" "$OUT/$m-readout.tgz"
  done
  nvidia-smi -L >"$OUT/card.txt" 2>&1
  cd - >/dev/null || return
}

join smol lzma
join gemma gzip
for m in smol gemma; do
  if [ -f $G/$m.gguf ] && [ -d $G/pkg ] && [ ! -f $G/runs/$m.started ]; then
    touch $G/runs/$m.started
    export -f run_model run_task setting
    export G PY
    setsid nohup bash -c "run_model $m" >$G/runs/$m-chain.log 2>&1 &
    echo "started $m"
  fi
done
echo "pieces here: $(cd $G/in && ls smol.[0-9]* gemma.[0-9]* 2>/dev/null | tr '\n' ' ')"
. $G/in/settings.env
for d in $G/runs/*/; do
  [ -f "$d/conditions.jsonl" ] && echo "$d: $(wc -l <"$d/conditions.jsonl") conditions"
done
if [ "${2:-}" = wait ]; then
  for i in $(seq 1 "${3:-540}"); do
    [ $((i % 30)) = 0 ] && pack
    busy=0
    for m in ${MODELS:-smol gemma}; do [ -f "$G/runs/$m.done" ] || busy=1; done
    [ $busy = 0 ] && break
    sleep 1
  done
  pack
  if [ -n "${BENCH_128K:-}" ] && [ $busy = 0 ]; then  # alone on the card, after every run
    (cd /tmp && $PY $G/src/benchmarks/taskheads_128k.py --out "$OUT" >$G/runs/bench-128k.log 2>&1)
    echo "128k: exit $?" && pack
  fi
  for f in $G/runs/*.log; do echo "== $f"; grep -v "Convert\|it/s\]" "$f" | tail -3; done
  ls -la "$OUT"
fi
