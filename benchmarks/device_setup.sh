# Source this on the lent GPU machine (python3 with torch, transformers, triton; no internet).
# Wheels carried in .whl/ (gguf, pyyaml; pandas and its needs in .whl/opt/ when missing there);
# the package is put on PYTHONPATH through symlinks that mirror pyproject's package-dir mapping.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -c "import pandas" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/opt/*.whl
mkdir -p /tmp/pkg/headhunt
cp -r headhunt/* /tmp/pkg/headhunt/
for d in probes heads kernels sae app; do ln -sfn "$PWD/$d" "/tmp/pkg/headhunt/$d"; done
export PYTHONPATH=/tmp/pkg:/tmp/site HEADHUNT_CACHE=/tmp/hhcache PYTHONUNBUFFERED=1
