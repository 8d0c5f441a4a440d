#!/usr/bin/env bash
# Issue 26's Gemma 3 270M check with more evaluation examples and random draws, and every head
# ablated alone (taskheads_single_heads.py), on one lent GPU. Run from the repository root:
#   bash benchmarks/taskheads_gemma_gpu.sh STAGE
# STAGE (.stage/taskheads) holds src/ (a git archive of the branch) and files/ (the wheels gguf,
# bm25s and plotly; Gemma's tokenizer as transformers 5.24 builds it and its weights'
# fingerprint: taskheads_gguf_fix.py says why). The GGUF: the copy kvpress's device script
# leaves on the machine (/tmp/kv/g/gemma.gguf) when it is still there, else gzip pieces carried
# one per call (.stage/kvpress/gN/piece.NN, joined in order once all 5 are here). Every call
# is idempotent: it keeps what it was given and starts the runs once the GGUF is whole.
# Settings: EVAL_KV, EVAL_MD (evaluation examples per task), DRAWS, KS; DEADLINE (seconds after
# the start by which everything is packed: each step gets what is left, a sweep cut short keeps
# the heads it finished).
set -u
ST=$1
R=$PWD
G=/tmp/thg
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
mkdir -p $G/pieces $G/runs
# the machine's /tmp/site may hold another helper's transformers: ours go elsewhere
export PYTHONPATH=$G/pkg:$G/site HEADHUNT_CACHE=$G/cache PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4

for d in "$R"/.stage/kvpress/g[0-9]*; do [ -d "$d" ] && cp "$d"/piece.* $G/pieces/ 2>/dev/null; done
if [ -d "$R/$ST/src/headhunt" ]; then
  rm -rf $G/pkg $G/files $G/benchmarks && mkdir -p $G/pkg
  cp -r "$R/$ST/src/headhunt" $G/pkg/headhunt
  for d in probes heads kernels sae app; do cp -r "$R/$ST/src/$d" $G/pkg/headhunt/$d; done
  cp -r "$R/$ST/src/benchmarks" $G/benchmarks && cp -r "$R/$ST/files" $G/files
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target $G/site $G/files/*.whl
fi
if [ ! -f $G/gemma.gguf ]; then
  if [ -f /tmp/kv/g/gemma.gguf ] && [ "$(sha256sum /tmp/kv/g/gemma.gguf | cut -c1-64)" = $SHA ]; then
    cp /tmp/kv/g/gemma.gguf $G/gemma.gguf && echo "GGUF: kvpress's copy on this machine"
  elif [ "$(ls $G/pieces | wc -l)" = 5 ]; then
    cat $(ls $G/pieces/piece.* | sort) | gunzip >$G/gemma.tmp
    if [ "$(sha256sum $G/gemma.tmp | cut -c1-64)" = $SHA ]; then
      mv $G/gemma.tmp $G/gemma.gguf && rm -f $G/pieces/* && echo "GGUF: joined from pieces"
    else
      echo "GGUF pieces do not match the SHA-256"; rm -f $G/gemma.tmp
    fi
  fi
fi
if [ ! -f $G/gemma.gguf ] || [ ! -d $G/pkg ]; then
  echo "waiting: pieces $(ls $G/pieces | tr '\n' ' '); package $([ -d $G/pkg ] && echo yes || echo no)"
  exit 0
fi
nvidia-smi -L
cd /tmp
set -o pipefail
python3 $G/benchmarks/taskheads_gguf_fix.py $G/gemma.gguf $G/files/gemma_tokenizer.json.xz \
  $G/files/gemma_fingerprint.json 2>&1 | grep -v Convert || exit 1

left() { echo $((${DEADLINE:-560} - SECONDS - $1)); }
run_task() {  # run_task TASK DOCS WORDS EVAL
  local out=$G/runs/gemma-$1
  timeout "$(left 120)" python3 -m headhunt taskheads --model $G/gemma.gguf --task "$1" \
    --docs "$2" --doc-words "$3" --examples $((32 + $4)) --score-examples 32 --ks "${KS:-2}" --modes mean \
    --random-from all,outside --random-draws "${DRAWS:-16}" --batch-size 64 --out "$out" \
    --force >"$out.log" 2>&1
  echo "exit $?" >>"$out.log"
  timeout "$(left 15)" python3 $G/benchmarks/taskheads_single_heads.py "$out" --model $G/gemma.gguf \
    --batch-size 64 >"$out.singles.log" 2>&1
  echo "exit $?" >>"$out.singles.log"
}
run_task kv 10 10 "${EVAL_KV:-300}" &
run_task multidoc-hard 12 40 "${EVAL_MD:-200}" &
wait
cd $G/runs
for d in gemma-kv gemma-multidoc-hard; do
  tail -3 $d.log $d.singles.log | grep -v "it/s\]"
  [ -d "$d" ] && tar -czf "$OUT/$d.tgz" --exclude examples.jsonl $d $d.log $d.singles.log
done
ls -la "$OUT"
