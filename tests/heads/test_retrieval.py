"""Retrieval scoring: the hit rule, and a planted copy head the scorer must rank first."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headhunt.heads.inputs.needles import MAGIC, NEEDLES
from headhunt.heads.retrieval import (
    RetrievalConfig,
    aggregate,
    build_trials,
    kv_group_table,
    reference_json,
    run_needle_trials,
    trial_hits,
)
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.capture import Decoded
from headhunt.probes.tiny import tiny_llama, word_tokenizer

PLANTED = (1, 2)  # (layer, head) forced to copy


def test_trial_hits_rule():
    # One trial, prompt of 10 tokens, answer span [4, 7) holding tokens 40 41 42.
    prompt = torch.tensor([[1, 2, 3, 9, 40, 41, 42, 5, 6, 7]])
    tokens = torch.tensor([[40, 41, 42, 2]])  # produced, the last one a stop token
    argmax = torch.zeros(4, 1, 1, 3, dtype=torch.long)  # [steps, layers, batch, heads]
    argmax[:, 0, 0, 0] = torch.tensor([4, 5, 6, 6])  # copies every answer token
    argmax[:, 0, 0, 1] = torch.tensor([4, 4, 4, 4])  # on the span, copies only the first
    argmax[:, 0, 0, 2] = torch.tensor([0, 9, 10, 11])  # never on the span
    dec = Decoded(tokens=tokens, lengths=torch.tensor([4]), argmax=argmax)
    score, on_needle = trial_hits(dec, prompt, torch.tensor([[4, 7]]))
    assert score[0, 0].tolist() == pytest.approx([1.0, 1 / 3, 0.0])
    assert on_needle[0, 0].tolist() == pytest.approx([1.0, 1.0, 0.0])
    # Steps past a row's stop do not count.
    dec = Decoded(tokens=tokens, lengths=torch.tensor([2]), argmax=argmax)
    score, _ = trial_hits(dec, prompt, torch.tensor([[4, 7]]))
    assert score[0, 0, 0].item() == pytest.approx(2 / 3)


class PlantedCopy(AttentionHook):
    """Forces one head, at decode step t, to put its argmax on answer token t of each row."""

    def __init__(self, layer, head, spans, prompt_len):
        self.layer, self.head, self.spans, self.n = layer, head, spans, prompt_len

    def before(self, call: AttentionCall) -> None:
        if call.layer != self.layer or call.query.shape[2] != 1:
            return
        t = call.q_offset - (self.n - 1)  # decode step
        key, query = call.key.clone(), call.query.clone()
        key[:, self.head] = 0
        query[:, self.head] = 0
        for b, (s, e) in enumerate(self.spans):
            target = min(s + t, e - 1)
            key[b, self.head, target, 0] = 10.0
            query[b, self.head, 0, 0] = 10.0
        call.key, call.query = key, query


def force_copy_output(model, prompts, spans, eos):
    """Make the model emit the answer tokens, then EOS (a forward hook on the LM head)."""
    state = {"step": -1}

    def hook(module, inputs, output):
        state["step"] += 1
        if state["step"] == 0:  # prefill
            return output
        t = state["step"] - 1
        out = torch.full_like(output, -1e4)
        for b, (s, e) in enumerate(spans):
            tok = prompts[b][s + t] if s + t < e else eos
            out[b, -1, tok] = 0.0
        return out

    return model.model.lm_head.register_forward_hook(hook)


def planted_copy_trials(model, planted: tuple[int, int]) -> list[dict]:
    """Needle trials (magic numbers, 160 tokens) run with head ``planted`` made a perfect copy
    head and the model forced to emit the answer (the planted ground truth)."""
    config = RetrievalConfig(lengths=[160], depths=[20, 60], needles=["magic"], max_new_tokens=10)
    trials = build_trials(model, config)
    prompts = [t.input_ids for t in trials]
    spans = [t.span for t in trials]
    hook = PlantedCopy(*planted, spans, len(prompts[0]))
    handle = force_copy_output(model, prompts, spans, model.tokenizer.eos_token_id)
    try:
        with model.hooks(hook, layers=[planted[0]]):
            return run_needle_trials(model, trials, config, progress=False)
    finally:
        handle.remove()


def test_planted_copy_head_ranks_first():
    # Word answers (the word tokenizer decodes digits with spaces between them).
    tok = word_tokenizer(MAGIC)
    model = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=4, max_context=1024, tokenizer=tok)
    records = planted_copy_trials(model, PLANTED)
    assert all(r["counted"] for r in records), [r["response"] for r in records]
    scores = aggregate(records, model)
    top = scores.top("retrieval_score", 2)
    assert (int(top["layer"][0]), int(top["head"][0])) == PLANTED
    assert top["value"][0] == pytest.approx(1.0)
    mat = scores.matrix("retrieval_score")
    others = np.delete(mat.ravel(), PLANTED[0] * model.n_heads + PLANTED[1])
    assert others.max() < 0.1
    ref = reference_json(records, model.n_layers, model.n_heads)
    assert len(ref) == 8 and ref["1-2"] == [pytest.approx(1.0)] * len(records)


@pytest.mark.parametrize("many_layer", [False, True])
def test_skipping_stopped_rows_keeps_every_score(device, monkeypatch, many_layer):
    # Two rows copy answers of 3 and 2 tokens, then stop (EOS); the planted head's argmax
    # stays on the span's last token at the stop step itself, which counts for on_needle
    # but cannot hit. Skipping the argmax of rows that stopped must change nothing; skipping
    # one step too early (the stop step) would lower that head's on_needle.
    from headhunt.kernels import attention_stats
    from headhunt.kernels import triton_decode as td
    from headhunt.probes import capture
    from headhunt.probes.capture import greedy_decode

    def per_layer(queries, keys, key_start=0, skip_rows=None):
        stats = [attention_stats(q, k, key_stats=False) for q, k in zip(queries, keys, strict=True)]
        out = torch.stack([s.argmax[:, :, 0] for s in stats]) + key_start  # [layers, b, hq]
        return out if skip_rows is None else out.masked_fill(skip_rows[None, :, None], -1)

    tiny = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=4)  # one KV head per planted head
    tiny.model.to(device)
    if many_layer:
        monkeypatch.setattr(capture.DecodeArgmax, "_batched_ok", lambda self, call: True)
        if tiny.device.type != "cuda":
            monkeypatch.setattr(td, "decode_argmax_layers", per_layer)
    torch.manual_seed(0)
    prompts = torch.randint(5, 60, (2, 20))
    spans = [(4, 7), (10, 12)]
    layer, head = 1, 2
    eos = tiny.tokenizer.eos_token_id
    decoded = {}
    for skip in (False, True):
        handle = force_copy_output(tiny, prompts.tolist(), spans, eos)
        try:
            with tiny.hooks(PlantedCopy(layer, head, spans, 20), layers=[layer]):
                decoded[skip] = greedy_decode(
                    tiny, prompts, max_new_tokens=6, stop_ids={eos}, capture_argmax=True,
                    skip_stopped_rows=skip,
                )  # fmt: skip
        finally:
            handle.remove()
    got, full = decoded[True], decoded[False]
    assert got.lengths.tolist() == [4, 3] and got.argmax.shape[0] == 4
    stop_step = got.argmax[[3, 2], layer, [0, 1], head]
    assert stop_step.tolist() == [6, 11]  # the stop step is scored: the span's last token
    assert (got.argmax[3, :, 1] == -1).all()  # row 1's step after its stop is not
    dev = got.tokens.device
    span_t = torch.tensor(spans, device=dev)
    score, on_needle = trial_hits(got, prompts.to(dev), span_t)
    ref_score, ref_on = trial_hits(full, prompts.to(dev), span_t)
    assert torch.equal(score, ref_score) and torch.equal(on_needle, ref_on)
    assert score[:, layer, head].tolist() == [1.0, 1.0]
    assert on_needle[:, layer, head].tolist() == [1.0, 1.0]
    early = got.argmax.clone()
    early[[3, 2], :, [0, 1]] = -1  # what an off-by-one skip would have left
    _, wrong = trial_hits(Decoded(got.tokens, got.lengths, early), prompts.to(dev), span_t)
    assert not torch.equal(wrong, on_needle)


def test_wrong_answers_are_not_counted(tiny):
    config = RetrievalConfig(lengths=[128], depths=[50], needles=["passkey"], max_new_tokens=3)
    records = run_needle_trials(tiny, build_trials(tiny, config), config, progress=False)
    assert not any(r["counted"] for r in records)  # a random model does not recall
    assert aggregate(records, tiny).matrix("retrieval_score").max() == 0


def test_trials_have_exact_length_and_span(tiny):
    config = RetrievalConfig(lengths=[200, 300], depths=[0, 50, 100], max_new_tokens=4)
    trials = build_trials(tiny, config)
    assert len(trials) == 2 * 3 * len(NEEDLES)
    for t in trials:
        assert len(t.input_ids) == t.length
        s, e = t.span
        answer_ids = tiny.tokenizer(" " + t.answer, add_special_tokens=False).input_ids
        assert t.input_ids[s:e] == answer_ids
    # Depth 0 puts the needle before the haystack; depth 100 puts it at the end.
    d0 = [t for t in trials if t.depth == 0][0]
    d100 = [t for t in trials if t.depth == 1][0]
    assert d0.span[0] < d100.span[0]
    # Same seed, same trials; other seed, other answers.
    again = build_trials(tiny, config)
    assert [t.input_ids for t in again] == [t.input_ids for t in trials]
    other = build_trials(tiny, RetrievalConfig(**{**config.to_dict(), "seed": 1}))
    assert [t.answer for t in other] != [t.answer for t in trials]


def test_kv_group_table():
    mean = np.arange(12, dtype=float).reshape(2, 6)
    assert kv_group_table(mean, 2, "max").tolist() == [[2, 5], [8, 11]]
    assert kv_group_table(mean, 2, "mean").tolist() == [[1, 4], [7, 10]]


@pytest.mark.slow
def test_embedded_model_finds_sparse_retrieval_heads(smol):
    config = RetrievalConfig(
        lengths=[400], depths=[30, 70], needles=["passkey", "magic"], max_new_tokens=12
    )
    records = run_needle_trials(smol, build_trials(smol, config), config, progress=False)
    assert sum(r["counted"] for r in records) >= 2, [r["response"] for r in records]
    mat = aggregate(records, smol).matrix("retrieval_score")
    assert mat.max() > 0.3
    assert (mat > 0.1).mean() < 0.15  # sparse: a few percent of heads


@pytest.mark.slow
def test_embedded_model_scores_equal_with_stopped_rows_skipped(smol, monkeypatch):
    # The scorer skips the argmax of rows that stopped; records must equal a run that
    # takes it for every row and step (the batch's answers stop at different steps).
    from headhunt.heads import retrieval

    config = RetrievalConfig(
        lengths=[400], depths=[30, 70], needles=["passkey", "magic"], max_new_tokens=12
    )
    trials = build_trials(smol, config)
    real, seen = retrieval.greedy_decode, {}

    def decode(*args, skip_stopped_rows=False, **kwargs):
        out = real(*args, skip_stopped_rows=seen["skip"], **kwargs)
        seen.setdefault("lengths", set()).update(out.lengths.tolist())
        return out

    monkeypatch.setattr(retrieval, "greedy_decode", decode)
    records = {}
    for skip in (True, False):
        seen["skip"] = skip
        records[skip] = run_needle_trials(smol, trials, config, progress=False)
    assert len(seen["lengths"]) > 1  # some rows stopped while others decoded on
    assert records[True] == records[False]


def test_planted_copy_head_of_a_hybrid_is_found_in_its_attention_layer():
    """LFM2 with short-convolution layers 0 and 2 and attention layers 1 and 3 (one KV head per
    query head, as the planted hook needs): the head
    planted in layer 3 ranks first, the convolution layers score NaN (no heads), and the
    layers keep the model's own indices."""
    from headhunt.heads.retrieval import scored_layers_line
    from headhunt.probes.hooked import HookedModel
    from headhunt.probes.tiny import tiny_causal_lm

    tok = word_tokenizer(MAGIC)
    kinds = ["conv", "full_attention", "conv", "full_attention"]
    hf = tiny_causal_lm(
        "lfm2", vocab_size=len(tok), num_hidden_layers=4, layer_types=kinds, num_key_value_heads=4,
        max_position_embeddings=1024,
    )  # fmt: skip
    model = HookedModel(model=hf, tokenizer=tok, name="tiny-lfm2-hybrid")
    assert model.attention_layers == [1, 3]
    planted = (3, 1)
    records = planted_copy_trials(model, planted)
    assert all(r["counted"] for r in records)
    scores = aggregate(records, model)
    top = scores.top("retrieval_score", 1)
    assert (int(top["layer"][0]), int(top["head"][0])) == planted
    mat = scores.matrix("retrieval_score")
    assert np.isnan(mat[[0, 2]]).all() and not np.isnan(mat[[1, 3]]).any()
    assert np.nanmax(np.delete(mat[3], planted[1])) < 0.1 and mat[1].max() < 0.1
    assert "attention layers [1, 3] of 4" in scored_layers_line(model)
