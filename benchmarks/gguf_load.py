"""Time a GGUF model's first load (parse its metadata with transformers, keep it, read the
weights from the GGUF) against its second (read the kept metadata, read the weights from the
GGUF), each in a fresh process, with an empty $HEADHUNT_CACHE.

    HEADHUNT_CACHE=/tmp/empty python benchmarks/gguf_load.py smollm2-135m gemma3-270m

GGUF_THREADS=1 loads with the one-thread dequantisation (default: the pool of
``gguf_weights.load_threads()``). GGUF_CODE=<folder> loads with that folder's
``gguf_weights.py`` and ``gguf_dequant.py`` in place of the installed ones (an earlier commit's
``probes/``, from ``git archive``: its weights reading timed beside today's, in the same
processes otherwise). Prints one JSON line per model: seconds of each load (wall,
load_model to return; and its CPU seconds; the imports before it timed apart), the ratios
second / first, what
the first load wrote (the metadata entry; the GGUF joined from its chunks, for a model shipped
in chunks; weight files: none) and the load average while it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

CHILD = """
import resource, sys, time
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
t0, c0 = time.perf_counter(), cpu()
import torch, transformers, transformers.modeling_utils, transformers.integrations.gguf.utils
from transformers import AutoTokenizer, Gemma3ForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM
import gguf, headhunt.probes
if sys.argv[4]:  # an earlier version of the weights reading, from that folder
    import importlib.util
    for name in ("gguf_dequant", "gguf_weights"):
        spec = importlib.util.spec_from_file_location(
            f"headhunt.probes.{name}", f"{sys.argv[4]}/{name}.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        setattr(headhunt.probes, name, module)
import headhunt.probes.gguf_weights, headhunt.probes.gguf_dequant
from headhunt.probes.hooked import load_model
if sys.argv[3] != "auto":  # the dequantisation pool's size, set (1: the one-thread load)
    headhunt.probes.gguf_weights.load_threads = lambda: int(sys.argv[3])
t1, c1 = time.perf_counter(), cpu()
m = load_model(sys.argv[1], device="cpu", dtype=sys.argv[2])
print(time.perf_counter() - t1, cpu() - c1, t1 - t0, c1 - c0, headhunt.probes.gguf_weights.__file__)
"""


def one_load(
    spec: str, dtype: str, threads: str, code: str = ""
) -> tuple[float, float, float, float, str]:
    """(wall seconds, CPU seconds) of one ``load_model`` call in a fresh process, then those of
    the imports before it: torch, transformers with its model-loading machinery and the model
    classes of the three files timed (Llama, Gemma 3, Qwen2), gguf-py, headhunt (the same for
    both loads and for any GGUF load, so timed apart), then the file gguf_weights came from.
    CPU time is what the load costs when other processes share the cores (the 2-core machine
    this was run on was)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, spec, dtype, threads, code],
        capture_output=True,
        text=True,
        check=True,
    )
    wall, cpu, import_wall, import_cpu, module = out.stdout.strip().splitlines()[-1].split(" ", 4)
    return float(wall), float(cpu), float(import_wall), float(import_cpu), module


def main() -> None:
    from headhunt.commands.cache import entries, size_of
    from headhunt.probes.gguf_weights import load_threads
    from headhunt.probes.loading import cache_root

    dtype = os.environ.get("DTYPE", "float32")
    threads = os.environ.get("GGUF_THREADS", "auto")
    code = os.environ.get("GGUF_CODE", "")
    for spec in sys.argv[1:]:
        before = {p for _, p in entries(cache_root())}
        load1 = os.getloadavg()[0]
        first, first_cpu, imp1, imp1_cpu, module = one_load(spec, dtype, threads, code)
        second, second_cpu, imp2, imp2_cpu, _ = one_load(spec, dtype, threads, code)
        new = [(k, p) for k, p in entries(cache_root()) if p not in before]
        written = [f for _, p in new for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
        print(
            json.dumps(
                {
                    "model": spec,
                    "dtype": dtype,
                    "dequant_threads": load_threads() if threads == "auto" else int(threads),
                    "gguf_weights_from": module,
                    "first_load_s": round(first, 2),
                    "second_load_s": round(second, 2),
                    "ratio": round(second / first, 3),
                    "first_load_cpu_s": round(first_cpu, 2),
                    "second_load_cpu_s": round(second_cpu, 2),
                    "cpu_ratio": round(second_cpu / first_cpu, 3),
                    "imports_s": [round(imp1, 2), round(imp2, 2)],
                    "imports_cpu_s": [round(imp1_cpu, 2), round(imp2_cpu, 2)],
                    "cpu_ratio_with_imports": round(
                        (second_cpu + imp2_cpu) / (first_cpu + imp1_cpu), 3
                    ),
                    "metadata_bytes": sum(size_of(p) for k, p in new if k == "metadata"),
                    "joined_gguf_bytes": sum(size_of(p) for k, p in new if k == "joined"),
                    "weight_files_written": [
                        str(f) for f in written if f.suffix in (".safetensors", ".bin", ".pt")
                    ],
                    "load_average_1min": [round(load1, 1), round(os.getloadavg()[0], 1)],
                    "cpu_threads": os.cpu_count(),
                    "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
