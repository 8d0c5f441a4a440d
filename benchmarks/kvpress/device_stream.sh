#!/usr/bin/env bash
# On the GPU machine (no network), one call of a chain of calls: each carries one folder (wheels,
# code.tar.gz = `git archive HEAD headhunt heads probes kernels benchmarks/kvpress` plus the
# retrieval runs' scores, examples, and consecutive pieces NAME.gz.NN of the gzipped GGUFs of
# SmolLM2-135M and Gemma 3 270M with NAME.npieces and NAME.sha256, under what a call carries).
# Everything lands in /tmp/kv/in; once a model's pieces are all there it is joined, SHA-256
# checked and built into a model folder (SmolLM2 by transformers' GGUF reader, as device.sh;
# Gemma 3 by gemma3_model.py, checked tensor by tensor against headhunt's own load). Idempotent.
#   bash device_stream.sh CALL_FOLDER            # then: export PYTHONPATH=/tmp/kv/hh:/tmp/site
set -u
C=$1
K=${K:-/tmp/kv}
SITE=${SITE:-/tmp/site}
mkdir -p $K/in
cp -r "$C"/. $K/in/
if [ ! -f $SITE/.done ] && ls $K/in/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target $SITE $K/in/whl/*.whl && touch $SITE/.done
fi
if [ -f $K/in/code.tar.gz ] && [ ! -d $K/src ]; then
  # headhunt's package laid out without installing it (its own dependencies are not needed)
  mkdir -p $K/src $K/hh && tar -xzf $K/in/code.tar.gz -C $K/src
  cp -r $K/src/headhunt $K/hh/ && for d in heads probes kernels; do cp -r $K/src/$d $K/hh/headhunt/$d; done
fi
export PYTHONPATH=$K/hh:$SITE
for f in $K/in/*.jsonl.gz; do [ -f "$f" ] && gunzip -f "$f"; done
join() {  # join NAME: the pieces NAME.gz.NN, when all there, into $K/NAME (SHA-256 checked)
  local n=$1
  [ -f $K/$n ] && return 0
  [ -f $K/in/$n.npieces ] || return 1
  [ "$(ls $K/in/$n.gz.* 2>/dev/null | wc -l)" = "$(cat $K/in/$n.npieces)" ] || return 1
  cat $(ls $K/in/$n.gz.* | sort) | gunzip > $K/$n.tmp
  if [ "$(sha256sum $K/$n.tmp | cut -c1-64)" = "$(cut -c1-64 $K/in/$n.sha256)" ]; then
    mv $K/$n.tmp $K/$n && rm -f $K/in/$n.gz.*
  else
    echo "$n: the pieces do not match the SHA-256" && rm -f $K/$n.tmp && return 1
  fi
}
if [ ! -d $K/smol ] && join smol.gguf; then
  python3 - <<PY
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained("$K", gguf_file="smol.gguf")
m.save_pretrained("$K/smol")
PY
  cp $K/in/smol_tok/* $K/smol/ && gunzip -f $K/smol/tokenizer.json.gz
fi
if [ ! -d $K/gemma ] && join gemma.gguf; then
  mkdir -p $K/gfiles && cp $K/in/gemma_files/* $K/gfiles/ && gunzip -f $K/gfiles/*.gz
  python3 $K/src/benchmarks/kvpress/gemma3_model.py --gguf $K/gemma.gguf --files $K/gfiles \
    --out $K/gemma
fi
echo "models: $(ls -d $K/smol $K/gemma 2>/dev/null | tr '\n' ' ')"
