"""Put a known-good tokenizer into the cached metadata of Gemma 3 270M's GGUF on the GPU machine.

The lent GPU machine has transformers 5.17, whose GGUF converter builds Gemma 3's tokenizer
without its merges: "The capital of France is Paris" becomes characters and short pieces
(['The', '▁c', 'ap', 'it', 'al', ...]) instead of the model's tokens (['The', '▁capital', ...]).
The model then reads text it was never trained on, and every Gemma number is wrong (the first
taskheads run there kept 0 of 24 closed-book prompts; 14 on the CPU with transformers 5.24).
transformers 5.24 (the version CI pins) converts it correctly, and headhunt now refuses the
broken one in one line (``check_gguf_tokenizer``). This script loads the GGUF once with
the machine's transformers (which keeps its parsed metadata in the cache), then replaces the
cached tokenizer.json with the one transformers 5.24 made from the same GGUF, and refuses to go
on unless the weights equal 5.24's conversion (per-tensor sums, from ``--fingerprint``) and the
tokenizer gives the expected ids.

    python3 taskheads_gguf_fix.py GGUF TOKENIZER_JSON_XZ FINGERPRINT_JSON
"""

from __future__ import annotations

import json
import lzma
import math
import sys
from pathlib import Path

from headhunt.probes.hooked import load_model
from headhunt.probes.loading import gguf_cache_folder

# "The capital of France is" and " Paris" as transformers 5.24 tokenizes them for Gemma 3.
EXPECTED = ([2, 818, 5279, 529, 7001, 563], [9079])


def main() -> int:
    gguf, tok_xz, fingerprint = (Path(a) for a in sys.argv[1:4])
    import headhunt.probes.loading as loading

    # Load past the check once: headhunt refuses the 5.17 tokenizer (check_gguf_tokenizer),
    # which is replaced below; the second load runs the check on the replacement.
    check, loading.check_gguf_tokenizer = loading.check_gguf_tokenizer, lambda *a, **k: None
    load_model(str(gguf), device="cpu", dtype="bfloat16")  # keeps the parsed metadata
    loading.check_gguf_tokenizer = check
    folder = gguf_cache_folder(gguf)
    (folder / "tokenizer.json").write_bytes(lzma.decompress(tok_xz.read_bytes()))

    m = load_model(str(gguf), device="cpu", dtype="bfloat16")
    want = json.loads(fingerprint.read_text())
    got = m.model.state_dict()
    bad = [k for k, (shape, s, a) in want.items()
           if k not in got or list(got[k].shape) != shape
           or not math.isclose(float(got[k].double().sum()), s, rel_tol=1e-9, abs_tol=1e-6)
           or not math.isclose(float(got[k].double().abs().sum()), a, rel_tol=1e-9)]  # fmt: skip
    print(f"weights: {len(want) - len(bad)} of {len(want)} tensors equal transformers 5.24's")
    from headhunt.heads.inputs.task_inputs import closed_book_ids

    ids = closed_book_ids(m.tokenizer)[0]
    print("tokens:", m.tokenizer.convert_ids_to_tokens(ids[0] + ids[1]))
    ok = not bad and tuple(ids) == EXPECTED
    print("ok" if ok else f"REFUSED: weights differ ({bad[:3]}) or tokens {ids} != {EXPECTED}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
