"""Retrieval heads (Wu et al. 2024): the heads that copy the answer out of a long context.

A head scores a hit at a decoding step when its attention row's argmax key lies inside the
needle's answer span and the prompt token there is the token the model just produced. Each hit
adds 1 / (span length), so a trial's score is the share of the answer the head copied (it can
exceed 1: repeats are not removed, as in the reference). A trial counts only when the response
is right (ROUGE-1 recall of the answer > 0.5); a head's retrieval score is its mean over counted
trials. Heads above 0.1 are called retrieval heads.

Unlike the reference, which loops in Python over every layer and head at every decoded token
(a host-device sync per head), all trials of one length decode as a batch and every head's
argmax comes from one batched operation per decode step, all layers together on CUDA (see
:func:`headhunt.probes.capture.greedy_decode`);
prefill uses the model's SDPA kernel, so context length is bounded by the model, not by eager
attention's N x N memory.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from headhunt.heads.configs import MAX_TRIALS, RetrievalConfig  # noqa: F401  (its config)
from headhunt.heads.inputs.needles import (
    NEEDLES,
    NeedleTrial,
    TrialBuilder,
    read_haystack,
    rouge1_recall,
)
from headhunt.probes.capture import Decoded, greedy_decode, responses
from headhunt.probes.hooked import HookedModel
from headhunt.scores import HeadScores

METRIC = "retrieval_score"


# Checks on fresh trials (ablation, pruning, KV-cache evaluation) draw their needles from the
# seed plus this offset: another stream than any scoring run's, so other answers and offsets.
FRESH_SEED_OFFSET = 1_000_003


def build_trials(model: HookedModel, config: RetrievalConfig) -> list[NeedleTrial]:
    """Every trial of the grid, deterministic for a seed."""
    config.validate(model)
    builder = TrialBuilder(model.tokenizer, read_haystack(config.haystack))
    trials = []
    for length in config.lengths:
        for depth in config.depths:
            for name in config.needles:
                for rep in range(config.repeats):
                    tid = f"L{length}-D{depth:g}-{name}-{rep}"
                    rng = random.Random(f"{config.seed}/{tid}")
                    trials.append(builder.build(length, depth / 100, NEEDLES[name], rng, tid))
    return trials


def stop_token_ids(tokenizer) -> set[int]:
    """End-of-sequence ids and every token containing a newline (the reference stops there)."""
    ids = {i for i in (tokenizer.eos_token_id,) if i is not None}
    # Byte-level BPE spells a newline "\u010a" (Ċ); SentencePiece spells it "<0x0A>".
    for piece, i in tokenizer.get_vocab().items():
        if "\n" in piece or "\u010a" in piece or piece == "<0x0A>":
            ids.add(i)
    return ids


def trial_hits(
    decoded: Decoded, prompts: Tensor, spans: Tensor
) -> tuple[Float[Tensor, "b layers heads"], Float[Tensor, "b layers heads"]]:
    """Per-trial retrieval score and the share of steps whose argmax fell on the answer span.

    Args:
        decoded: output of ``greedy_decode(..., capture_argmax=True)``.
        prompts: [batch, n] prompt ids.
        spans: [batch, 2] answer span [start, end) in the prompt.
    """
    am = decoded.argmax  # [steps, layers, batch, heads]
    assert am is not None
    steps = am.shape[0]
    start = spans[:, 0].view(1, 1, -1, 1)
    end = spans[:, 1].view(1, 1, -1, 1)
    in_span = (am >= start) & (am < end)
    # Token at the argmax position (positions past the prompt are generated tokens: no hit).
    n = prompts.shape[1]
    safe = am.clamp(max=n - 1)
    b_idx = torch.arange(prompts.shape[0], device=am.device).view(1, 1, -1, 1)
    at = prompts[b_idx, safe]
    produced = decoded.tokens[:, :steps].T.reshape(steps, 1, -1, 1)
    valid = torch.arange(steps, device=am.device).view(-1, 1) < decoded.lengths.view(1, -1)
    valid = valid.view(steps, 1, -1, 1)
    hits = (in_span & (at == produced) & valid).float().sum(0)  # [layers, batch, heads]
    width = (spans[:, 1] - spans[:, 0]).float().view(1, -1, 1)
    score = (hits / width).permute(1, 0, 2)
    on_needle = (
        (in_span & valid).float().sum(0) / decoded.lengths.clamp(min=1).view(1, -1, 1)
    ).permute(1, 0, 2)
    return score, on_needle


def auto_batch_size(model: HookedModel, length: int) -> int:
    """Trials per batch: bounded by a token budget (KV cache and prefill activations)."""
    budget = 16_384 if model.device.type == "cpu" else 262_144
    return max(1, budget // length)


def plan_batches(
    model: HookedModel, trials: list[NeedleTrial], config: RetrievalConfig
) -> list[list[NeedleTrial]]:
    """Group trials into decoding batches (same length, at most the batch size). The plan
    depends only on the trials, config and device type, so sharding whole batches over
    processes reproduces a single process's numbers exactly."""
    by_length: dict[int, list[NeedleTrial]] = {}
    for t in trials:
        by_length.setdefault(t.length, []).append(t)
    batches = []
    for length, group in by_length.items():
        bs = config.batch_size or auto_batch_size(model, length)
        batches += [group[i : i + bs] for i in range(0, len(group), bs)]
    return batches


def run_needle_trials(
    model: HookedModel,
    trials: list[NeedleTrial],
    config: RetrievalConfig,
    *,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    batches: list[list[NeedleTrial]] | None = None,
) -> list[dict[str, Any]]:
    """Decode every trial (batched by length) and score all heads; returns one record per
    trial. ``batches`` overrides the plan of :func:`plan_batches` (e.g. one process's share)."""
    stop = stop_token_ids(model.tokenizer)
    batches = plan_batches(model, trials, config) if batches is None else batches
    records = []
    bar = tqdm(
        total=sum(map(len, batches)), desc="retrieval trials", unit="trial", disable=not progress
    )
    for batch in batches:
        records.extend(_score_batch(model, batch, config, stop, on_record))
        bar.update(len(batch))
    bar.close()
    return records


def generate_greedy(
    model: HookedModel, prompts: Tensor, max_new_tokens: int, stop: set[int]
) -> tuple[Tensor, Tensor]:
    """Greedy decoding through the model's own ``generate`` (its own recurrent state: Mamba's
    cache, RWKV's state), for a model with no attention layers, whose decoding headhunt's
    attention capture does not drive. Where the model's own state cannot hold its layers'
    (:func:`_own_state_fits`), every step is a full forward over the sequence so far instead:
    the same greedy tokens, no state; any other failure of ``generate`` is the model's own. Returns the new tokens [b, steps] and each row's length (through its
    first stop token, as :func:`greedy_decode`)."""
    from transformers import GenerationConfig

    tok = model.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (min(stop) if stop else 0)
    plain = GenerationConfig(  # greedy, nothing else (no penalty or sampling from the folder)
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        eos_token_id=sorted(stop),  # [] when none: None would fall back to the folder's own
        pad_token_id=pad,
    )
    if _own_state_fits(model.model.config):
        with torch.inference_mode():
            out = model.model.generate(
                prompts, attention_mask=torch.ones_like(prompts), generation_config=plain
            )
    else:
        out = _greedy_without_state(model, prompts, max_new_tokens)
    tokens = out[:, prompts.shape[1] :]
    is_stop = torch.isin(tokens, torch.tensor(sorted(stop), dtype=torch.long, device=out.device))
    first = torch.where(is_stop.any(1), is_stop.int().argmax(1) + 1, tokens.shape[1])
    return tokens, first


def _own_state_fits(config) -> bool:
    """Whether the model's own recurrent state has the shape its layers use. xLSTM's cache
    (transformers 5.24 ``xLSTMCache``) sizes its state from ``config.qk_dim`` / ``v_dim``,
    rounded up to a multiple of 64, while its layers use ``int(hidden_size * factor)``: the two
    differ unless that product is a multiple of 64 (true of xLSTM-7B, not of small configs),
    and then the model's own ``generate`` fails on its first cached step."""
    if config.model_type != "xlstm":
        return True
    return config.qk_dim == int(config.hidden_size * config.qk_dim_factor) and config.v_dim == int(
        config.hidden_size * config.v_dim_factor
    )


def _greedy_without_state(model: HookedModel, prompts: Tensor, max_new_tokens: int) -> Tensor:
    """Greedy decoding with a full forward over the sequence at every step (no cache)."""
    seq = prompts
    for _ in range(max_new_tokens):
        logits = model.forward(seq, use_cache=False, logits_to_keep=1).logits
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return seq


def _score_batch(model, batch, config, stop, on_record) -> list[dict[str, Any]]:
    prompts = torch.tensor([t.input_ids for t in batch], device=model.device)
    spans = torch.tensor([t.span for t in batch], device=model.device)
    if model.attention_free:  # needle accuracy only: no head to score
        tokens, lengths = generate_greedy(model, prompts, config.max_new_tokens, stop)
        score = on_needle = np.zeros((len(batch), model.n_layers, 0))
        texts = responses(model.tokenizer, tokens, lengths.tolist(), stop)
    else:
        # Steps past a row's stop token count for no score (trial_hits' `valid`): their
        # argmax is not computed.
        decoded = greedy_decode(
            model,
            prompts,
            max_new_tokens=config.max_new_tokens,
            stop_ids=stop,
            capture_argmax=True,
            skip_stopped_rows=True,
        )
        score, on_needle = trial_hits(decoded, prompts, spans)
        score, on_needle = score.cpu().numpy(), on_needle.cpu().numpy()
        texts = responses(model.tokenizer, decoded.tokens, decoded.lengths.tolist(), stop)
    out = []
    for j, (t, response) in enumerate(zip(batch, texts, strict=True)):
        recall = rouge1_recall(t.answer, response)
        rec = {
            "id": t.id,
            "length": t.length,
            "depth": t.depth,
            "needle": t.needle,
            "answer": t.answer,
            "response": response,
            "recall": recall,
            "counted": recall > config.min_recall,
            "span": list(t.span),
            "scores": np.round(score[j], 6).tolist(),
            "on_needle": np.round(on_needle[j], 4).tolist(),
        }
        if on_record is not None:
            on_record(rec)
        out.append(rec)
    return out


def aggregate(records: Iterable[dict[str, Any]], model: HookedModel) -> HeadScores:
    """Head scores from trial records: mean and sample std over counted trials, needle-argmax
    rate.

    Metrics: ``retrieval_score`` (the paper's score), ``retrieval_score_std``,
    ``needle_attention`` (share of decode steps whose argmax key is on the answer span, over
    counted trials; no copy condition), ``counted_trials`` (same for every head).
    """
    counted = [r for r in records if r["counted"]]
    shape = (model.n_layers, model.n_heads)
    if counted:
        s = np.array([r["scores"] for r in counted])
        a = np.array([r["on_needle"] for r in counted])
        # Sample std (ddof=1), as the dashboard's spread of the same trials; 0 for one trial.
        mean, att = s.mean(0), a.mean(0)
        std = s.std(0, ddof=1) if len(counted) > 1 else np.zeros(shape)
    else:
        mean = std = att = np.zeros(shape)
    # a hybrid's layers that are not attention have no heads: NaN, not a score of 0
    other = [i for i in range(model.n_layers) if i not in set(model.attention_layers)]
    mean, std, att = (np.array(x, dtype=float) for x in (mean, std, att))
    for x in (mean, std, att):
        x[other] = np.nan
    kv = model.score_kv_heads()  # each layer's count where it varies
    return HeadScores.concat(
        [
            HeadScores.from_matrix(METRIC, mean, n_kv_heads=kv),
            HeadScores.from_matrix("retrieval_score_std", std, n_kv_heads=kv),
            HeadScores.from_matrix("needle_attention", att, n_kv_heads=kv),
            HeadScores.from_matrix("counted_trials", np.full(shape, len(counted)), n_kv_heads=kv),
        ]
    )


def scored_layers_line(model: HookedModel) -> str:
    """One line naming the layers whose heads are scored (a hybrid's attention layers)."""
    kinds = model.layer_kinds or []
    others = sorted({kinds[i] for i in range(model.n_layers) if i not in model.attention_layers})
    return (
        f"scoring the heads of attention layers {model.attention_layers} of {model.n_layers}; "
        f"the others ({', '.join(others)}) have no attention heads and score NaN"
    )


def score_retrieval(
    model: HookedModel, config: RetrievalConfig | None = None, progress: bool = True
) -> HeadScores:
    """Score every head's retrieval behaviour over the config's grid (no files written)."""
    config = config or RetrievalConfig()
    trials = build_trials(model, config)
    return aggregate(run_needle_trials(model, trials, config, progress=progress), model)


def reference_json(
    records: Iterable[dict[str, Any]], n_layers: int, n_heads: int
) -> dict[str, list[float]]:
    """The reference's file format: {"layer-head": [per counted trial score, ...]}, 0-based."""
    counted = [r for r in records if r["counted"]]
    return {
        f"{layer}-{head}": [r["scores"][layer][head] for r in counted]
        for layer in range(n_layers)
        for head in range(n_heads)
    }


def kv_group_table(mean: np.ndarray, n_kv_heads: int, how: str = "max") -> np.ndarray:
    """Aggregate query-head scores over each KV group ([layers, kv_heads]): "max" (as
    RazorAttention does) or "mean"."""
    layers, heads = mean.shape
    g = mean.reshape(layers, n_kv_heads, heads // n_kv_heads)
    return g.max(-1) if how == "max" else g.mean(-1)
