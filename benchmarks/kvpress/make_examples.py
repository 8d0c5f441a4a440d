"""The examples for compare.py, built in headhunt's environment: needle trials
(heads/inputs/needles.py) and the RULER-like set (heads/inputs/ruler.py) from the bundled essays, split into
context and question token ids (kvpress's pipeline prefills the context under the press, then
answers the question by greedy decoding). Each row carries the tokens to decode, as kvpress's
own datasets do per task: 12 for a needle or one key (at most 8 answer tokens for SmolLM2),
48 for the four 6-digit values of mv_niah (42 tokens as a numbered list).

    .venv/bin/python benchmarks/kvpress/make_examples.py --model smollm2-135m --length 4096 \
        --needles 150 --tasks 30 --out benchmarks/kvpress/examples_smollm2_4k.jsonl
"""

from __future__ import annotations

import argparse
import json
import random

from headhunt.heads.inputs.needles import NEEDLES, read_haystack
from headhunt.heads.inputs.ruler import build_ruler, from_needles
from headhunt.heads.retrieval import FRESH_SEED_OFFSET, RetrievalConfig, build_trials
from headhunt.probes.hooked import load_model

MAX_NEW_TOKENS = {"mv_niah": 48}  # every other task: 12


def split_question(tokenizer, ids: list[int]) -> int:
    """Index where the question frame starts: the last token from which the decoded tail still
    holds 'Question:' (the frame of heads/inputs/needles.py: document, then the question)."""
    for i in range(len(ids) - 1, max(0, len(ids) - 400), -1):
        if "Question:" in tokenizer.decode(ids[i:]):
            return i
    raise ValueError("no question frame in the last 400 tokens")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--needles", type=int, default=10, help="needle trials")
    p.add_argument("--tasks", type=int, default=2, help="trials per RULER-like task")
    p.add_argument("--keep", default="needle,mk_niah,mv_niah", help="tasks written")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    model = load_model(a.model, device="cpu")
    tok = model.tokenizer
    depths = [0.0, 25.0, 50.0, 75.0, 100.0]
    grid = RetrievalConfig(
        lengths=[a.length],
        depths=depths,
        needles=list(NEEDLES),
        repeats=max(1, -(-a.needles // (len(depths) * len(NEEDLES)))),
        seed=a.seed + FRESH_SEED_OFFSET,  # not the trials any retrieval run scored heads on
    )
    needles = from_needles(build_trials(model, grid))
    random.Random(a.seed).shuffle(needles)
    trials = needles[: a.needles] + build_ruler(
        tok, read_haystack(None), [a.length], repeats=a.tasks, seed=a.seed
    )
    keep = set(a.keep.split(","))
    trials = [t for t in trials if t.task in keep]
    with open(a.out, "w") as f:
        for t in trials:
            cut = split_question(tok, t.input_ids)
            row = {
                "id": t.id,
                "task": t.task,
                "length": t.length,
                "context_ids": t.input_ids[:cut],
                "question_ids": t.input_ids[cut:],
                "answers": t.answers,
                "max_new_tokens": MAX_NEW_TOKENS.get(t.task, 12),
            }
            f.write(json.dumps(row) + "\n")
    print(f"{len(trials)} examples -> {a.out}")


if __name__ == "__main__":
    main()
