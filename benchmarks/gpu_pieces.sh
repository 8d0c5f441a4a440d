# Shared by the taskheads GPU scripts (taskheads_readout_gpu.sh, taskheads_multidoc_gpu.sh),
# sourced, not run. The two real models' GGUFs are more than one device call carries, so they
# travel compressed in consecutive pieces, one folder of a stage per call, and are joined and
# SHA-256 checked on the machine, which keeps /tmp between calls that follow each other at once.
#
# Here:            stage_pieces STAGE PER NAME FILE [NAME FILE ...]
#                    cuts the files, in the order given, into one stream of folders STAGE/cN of
#                    about PER bytes each (c0 less what it holds already), each holding its part
#                    of each file as NAME.NN; NAME.npieces goes into c0 (0 for an empty file).
# On the machine:  take_folder C       copies the call's folder into $G/in; on the first call,
#                    lays out the package from src.tgz in $G/pkg and installs files/*.whl
#                    into $G/site (ours, not the machine's /tmp/site, which another helper's
#                    packages may hold)
#                  join NAME gzip|lzma  joins NAME.NN into $G/NAME.gguf once all are here,
#                    checked against SHA_NAME (below)
# $G (the machine's working folder) and $PY (its python) are the caller's.

SHA_gemma=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
SHA_smol=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

stage_pieces() {
  local st=$1 per=$2 used total=0 off=0 c=0 start=0 i n f size end s e
  shift 2
  local names=() files=() sizes=() counts=()
  while [ $# -gt 0 ]; do
    names+=("$1") files+=("$2") sizes+=("$(stat -c %s "$2")") counts+=(0)
    shift 2
  done
  for size in "${sizes[@]}"; do total=$((total + size)); done
  used=$(du -cb "$st/c0" | tail -1 | cut -f1)
  while [ $off -lt $total ]; do
    end=$((off + per - (c == 0 ? used : 0)))
    end=$((end < total ? end : total))
    mkdir -p "$st/c$c"
    start=0
    for i in "${!names[@]}"; do  # the part of file i that falls in [off, end)
      n=${names[$i]} f=${files[$i]} size=${sizes[$i]}
      s=$((off > start ? off : start)) e=$((end < start + size ? end : start + size))
      if [ $s -lt $e ]; then
        tail -c +$((s - start + 1)) "$f" | head -c $((e - s)) \
          >"$st/c$c/$n.$(printf %02d "${counts[$i]}")"
        counts[$i]=$((counts[$i] + 1))
      fi
      start=$((start + size))
    done
    off=$end c=$((c + 1))
  done
  for i in "${!names[@]}"; do echo "${counts[$i]}" >"$st/c0/${names[$i]}.npieces"; done
}

take_folder() {
  mkdir -p "$G/in" "$G/runs"
  cp -r "$1"/. "$G/in/"
  if [ -f "$G/in/src.tgz" ] && [ ! -d "$G/pkg" ]; then
    mkdir -p "$G/src" "$G/pkg" && tar -xzf "$G/in/src.tgz" -C "$G/src"
    cp -r "$G/src/headhunt" "$G/pkg/headhunt"
    for d in probes heads kernels sae app; do cp -r "$G/src/$d" "$G/pkg/headhunt/$d"; done
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$G/site" "$G/in"/files/*.whl
  fi
}

join() {  # (Python's gzip and lzma: the machine need not have xz)
  local n=$1 sha=SHA_$1
  [ -f "$G/$n.gguf" ] && return 0
  [ -f "$G/in/$n.npieces" ] && [ "$(cat "$G/in/$n.npieces")" != 0 ] || return 1
  [ "$(ls "$G/in/$n".[0-9]* 2>/dev/null | wc -l)" = "$(cat "$G/in/$n.npieces")" ] || return 1
  cat $(ls "$G/in/$n".[0-9]* | sort) | $PY -c "import $2, shutil, sys; \
shutil.copyfileobj($2.open(sys.stdin.buffer), sys.stdout.buffer)" >"$G/$n.tmp"
  if [ "$(sha256sum "$G/$n.tmp" | cut -c1-64)" = "${!sha}" ]; then
    mv "$G/$n.tmp" "$G/$n.gguf" && rm -f "$G/in/$n".[0-9]* && echo "$n: joined, SHA-256 checked"
  else
    echo "$n: the pieces do not match the SHA-256" && rm -f "$G/$n.tmp" && return 1
  fi
}
