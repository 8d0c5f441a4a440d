#!/usr/bin/env bash
# Gemma 3 270M on the GPU machine (no network), as device.sh does for the embedded model:
# kvpress's wheels into /tmp/site, headhunt's package layout into /tmp/kv/hh, the GGUF joined from
# gzip pieces carried over several calls (each call carries what fits beside the tree:
# $ST/gN/piece.NN),
# SHA-256 checked, then gemma3_model.py builds the model folder /tmp/kv/gemma (weights checked
# against headhunt's own load). Idempotent: run at the start of every call; prints PYTHONPATH.
set -u
ST=${ST:-.stage/kvpress}
K=/tmp/kv
mkdir -p $K/g $K/gfiles
for d in $ST/g[0-9]*; do [ -d "$d" ] && cp "$d"/piece.* $K/g/ 2>/dev/null; done
for d in $ST/gfiles*; do [ -d "$d" ] && cp -r "$d"/. $K/gfiles/; done
if [ ! -f /tmp/site/.done ] && ls $ST/base/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $ST/base/whl/*.whl && touch /tmp/site/.done
fi
if [ -d $ST/gsrc/headhunt ]; then
  rm -rf $K/hh && mkdir -p $K/hh && cp -r $ST/gsrc/headhunt $K/hh/
  for d in heads probes kernels; do cp -r $ST/gsrc/$d $K/hh/headhunt/$d; done
  rm -rf $K/benchmarks && cp -r $ST/gsrc/benchmarks $K/
fi
# a later call's fixes to the scripts alone (the package does not fit beside the last piece)
[ -d $ST/gfix ] && cp $ST/gfix/*.py $K/benchmarks/kvpress/
export PYTHONPATH=$K/hh:/tmp/site
for f in $K/gfiles/*.gz; do [ -f "$f" ] && gunzip -f "$f"; done
echo "pieces: $(ls $K/g | tr '\n' ' ')"
if [ ! -d $K/gemma ] && [ -f $K/gfiles/sha256 ] &&
  [ "$(ls $K/g/piece.* 2>/dev/null | wc -l)" = "$(cat $K/gfiles/npieces)" ]; then
  cat $(ls $K/g/piece.* | sort) | gunzip > $K/g/gemma.gguf
  if [ "$(sha256sum $K/g/gemma.gguf | cut -c1-64)" = "$(cut -c1-64 $K/gfiles/sha256)" ]; then
    python3 $K/benchmarks/kvpress/gemma3_model.py --gguf $K/g/gemma.gguf --files $K/gfiles \
      --out $K/gemma && rm -f $K/g/piece.*
  else
    echo "GGUF pieces do not match the SHA-256"
  fi
fi
echo "PYTHONPATH=$PYTHONPATH"
