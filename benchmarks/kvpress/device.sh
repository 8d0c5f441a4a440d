#!/usr/bin/env bash
# On the GPU machine (no network): kvpress's wheels for its Python into /tmp/site, headhunt's
# package layout into /tmp/kv/hh (no install: its own dependencies are not needed), and the
# embedded model's GGUF joined from the pieces carried so far into /tmp/kv/m (SHA-256 checked),
# converted by transformers into a model folder /tmp/kv/smol. Idempotent: run at the start of
# every call; PYTHONPATH is printed for the caller to export.
set -u
ST=${ST:-.stage/kvpress}
K=/tmp/kv
mkdir -p $K/m
[ -d $ST/base ] && cp -r $ST/base/. $K/
for p in p1/a p2/b p3/c p3/sha256; do [ -f $ST/$p ] && cp $ST/$p $K/m/; done
if [ ! -f /tmp/site/.done ] && ls $K/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $K/whl/*.whl && touch /tmp/site/.done
fi
if [ -d $ST/src/headhunt ]; then
  rm -rf $K/hh && mkdir -p $K/hh && cp -r $ST/src/headhunt $K/hh/
  for d in heads probes kernels; do cp -r $ST/src/$d $K/hh/headhunt/$d; done
  cp -r $ST/src/benchmarks $K/
fi
export PYTHONPATH=$K/hh:/tmp/site
if [ ! -d $K/smol ] && [ -f $K/m/a ] && [ -f $K/m/b ] && [ -f $K/m/c ]; then
  cat $K/m/a $K/m/b $K/m/c > $K/m/smol.gguf
  if [ "$(sha256sum $K/m/smol.gguf | cut -c1-64)" = "$(cat $K/m/sha256)" ]; then
    python3 - <<PY
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained("$K/m", gguf_file="smol.gguf")
m.save_pretrained("$K/smol")
PY
    for f in tokenizer.json tokenizer_config.json generation_config.json chat_template.jinja; do
      cp $K/tok/$f $K/smol/
    done
  else
    echo "GGUF pieces do not match the SHA-256"
  fi
fi
echo "PYTHONPATH=$PYTHONPATH"
