"""Task heads: planted ground truth (a tiny model whose copying / evidence-writing heads are
set by hand), the write score's identity against a direct dense computation, the detectors'
helpers, and the method's run (ablation, retriever)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headhunt as hh
from headhunt.heads import taskheads as T
from headhunt.heads.evaluations.task_ablation import answers_right
from headhunt.heads.inputs.task_inputs import Encoder, Example
from headhunt.methods.base import read_jsonl
from headhunt.probes.attention import AttentionHook
from headhunt.probes.hooked import HookedModel
from headhunt.probes.tiny import tiny_causal_lm, tiny_llama, word_tokenizer

VALUES = ["blue", "red", "green", "river", "bread", "lamp"]  # what the planted heads retrieve
ASKING = ["what", "word", "is"]  # tokens whose rows look for a value
FILLER = [
    "it was a sunny day in the park .",
    "the city is by the garden gate .",
    "read the question and remember the answer .",
    "the best thing to do is to read a book .",
]
COPIER, READER = (1, 2), (0, 1)  # attends to the value and writes it; attends, writes nothing


def planted_model() -> HookedModel:
    """Two layers x four heads (two KV heads), one-hot embeddings, every weight zero but two
    heads. Both attend from the question's tokens and the answer row to the one value word of
    the context (content only: the query / key sit on the lowest rotary frequency, which turns
    by under 0.1 rad over these prompts). COPIER's values carry the word's identity and its
    output projection writes it back, so the model answers by copying; READER writes nothing."""
    tok = word_tokenizer()
    m = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2, d_model=128, tokenizer=tok, seed=0)
    net, d, hd = m.model, 128, 32
    vocab = {w: tok.convert_tokens_to_ids(w) for w in [*VALUES, *ASKING]}
    scale = d**0.5  # RMSNorm turns a one-hot embedding into sqrt(d) at its token
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        for name, p in net.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
        n = len(tok)
        net.model.embed_tokens.weight[torch.arange(n), torch.arange(n)] = 1.0
        net.lm_head.weight[torch.arange(n), torch.arange(n)] = 1.0
        low = hd // 2 - 1  # the lowest rotary frequency of a head
        for layer, head in (COPIER, READER):
            att = net.model.layers[layer].self_attn
            kv = head // 2
            for w in ASKING:
                att.q_proj.weight[head * hd + low, vocab[w]] = 12 / scale
            for i, w in enumerate(VALUES):
                att.k_proj.weight[kv * hd + low, vocab[w]] = 12 / scale
                if (layer, head) == COPIER:
                    att.v_proj.weight[kv * hd + i, vocab[w]] = 1 / scale
                    att.o_proj.weight[vocab[w], head * hd + i] = 10.0
    return m


def planted_examples(n: int) -> list[Example]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        value = VALUES[i % len(VALUES)]
        docs = list(rng.permutation(FILLER)[:3])
        at = int(rng.integers(0, 4))
        docs.insert(at, f"the secret word is {value} .")
        out.append(Example(f"p{i}", docs, "what is the secret word ?", value, [at],
                           "the secret word is"))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def planted():
    m = planted_model()
    enc = Encoder(m.tokenizer, m.max_context)
    return m, [enc.encode(e) for e in planted_examples(6)]


def tiny_family(family: str, seed: int) -> HookedModel:
    """A tiny Llama, or a tiny Gemma 3 (an 8-token sliding window the prompts run past)."""
    tok = word_tokenizer()
    if family == "llama":
        return tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2, tokenizer=tok, seed=seed)
    return HookedModel(model=tiny_causal_lm("gemma3_text", vocab_size=len(tok), seed=seed),
                       tokenizer=tok, name="tiny-gemma3")  # fmt: skip


def test_planted_heads_rank_first_on_every_detector(planted):
    m, encoded = planted
    results = [T.score_example(m, e, retriever_heads=[COPIER, READER]) for e in encoded]
    assert all(r.correct for r in results)  # the model answers by copying
    mats = T.head_matrices(results)
    assert set(T.top_heads(mats["copy_score"], 2)) == {COPIER, READER}
    assert mats["copy_score"][COPIER] == 1.0 and mats["copy_score"][READER] == 1.0
    assert set(T.top_heads(mats["query_focus"], 2)) == {COPIER, READER}
    assert mats["query_focus"][COPIER] > 0.3
    assert mats["query_recall1"][COPIER] == 1.0 and mats["query_ndcg10"][READER] == 1.0
    # Only the copier writes: attention without a write is not counted by the write score.
    assert T.top_heads(mats["write_score"], 1) == [COPIER]
    assert mats["write_score"][COPIER] > 1.0
    assert abs(mats["write_score"][READER]) < 1e-6
    # The retriever from the top query-focus heads finds every evidence document.
    table = T.retrieval_table(results)
    assert table["top heads"]["recall1"] == 1.0


def test_ablating_the_copier_collapses_the_task_and_others_do_not(planted):
    from headhunt.heads.evaluations.task_ablation import ablation

    m, encoded = planted
    seqs = [(e.ids, e.answer_start) for e in encoded]
    zeros = {la: torch.zeros(4, 32) for la in range(2)}
    means = {"mean": zeros, "mean-keep-first": zeros}
    assert all(answers_right(m, seqs))
    for mode in ("zero", "mean", "mean-keep-first"):
        assert not any(answers_right(m, seqs, ablation([COPIER], mode, means)))
        assert all(answers_right(m, seqs, ablation([READER, (0, 0), (1, 3)], mode, means)))


def test_batched_answers_equal_one_at_a_time(planted):
    """Right-padded batches give each sequence's own verdict (causal: padding is never seen),
    for sequences of different lengths, with and without an ablation."""
    from headhunt.heads.evaluations.task_ablation import ablation

    m, encoded = planted
    seqs = [(e.ids, e.answer_start) for e in encoded]
    seqs += [(e.ids[:-1] + [e.ids[0]], e.answer_start) for e in encoded[:3]]  # wrong answers
    assert len({len(s) for s, _ in seqs}) > 1
    hooks = ablation([COPIER], "zero", {})
    for h in ([], hooks):
        one = answers_right(m, seqs, h)
        assert answers_right(m, seqs, h, batch_size=4) == one
    assert answers_right(m, seqs, batch_size=4) == [True] * len(encoded) + [False] * 3


def test_mean_keep_first_keeps_the_first_position():
    from headhunt.heads.evaluations.task_ablation import MeanAblation

    hook = MeanAblation([(0, 1)], {0: torch.full((2, 3), 5.0)}, start=1)
    out = torch.zeros(2, 4, 2, 3)
    call = type("Call", (), {"layer": 0})()
    got = hook.after(call, out)
    assert (got[:, 0] == 0).all() and (got[:, 1:, 1] == 5).all() and (got[:, 1:, 0] == 0).all()


def test_readout_ablation_leaves_the_rows_before_each_sequences_start():
    """mean-readout / zero-readout: each sequence's rows from its own readout start on get the
    mean (or 0) for the ablated heads; every earlier row and every other head keep their own
    output, bit for bit; a pass on a cache counts rows from its first absolute position."""
    from headhunt.heads.evaluations.task_ablation import MeanAblation

    out = torch.randn(2, 6, 3, 4)
    mean = {0: torch.full((3, 4), 5.0)}
    for means, fill in ((mean, 5.0), (None, 0.0)):
        hook = MeanAblation([(0, 1), (0, 2)], means, readout=True)
        hook.for_batch([2, 4])
        call = type("Call", (), {"layer": 0, "query_position": 0})()
        got = hook.after(call, out)
        for b, start in enumerate((2, 4)):
            assert torch.equal(got[b, :start], out[b, :start])
            assert (got[b, start:, 1:] == fill).all()
            assert torch.equal(got[b, start:, 0], out[b, start:, 0])
        call.query_position = 3  # rows 3..8: sequence 0 ablated from row 0 of the pass, 1 from 1
        got = hook.after(call, out)
        assert (got[0, :, 1:] == fill).all() and (got[1, 1:, 1:] == fill).all()
        assert torch.equal(got[1, :1], out[1, :1])


MARKER = (0, 0)  # in the relay model: writes the value word where it stands, in SPARE dims
SPARE = 100  # residual dimensions past the vocabulary (72 tokens): no unembedding reads them


def relay_model() -> HookedModel:
    """The planted model with a two-step route: MARKER (layer 0) attends from every row to the
    value word and writes its identity into SPARE dimensions, and COPIER (layer 1) copies the
    value from those dimensions at the value word's row (a context row) instead of from the
    embedding. MARKER matters only at the context rows (what COPIER reads there); its output
    at the question and answer rows reaches no logit. COPIER matters only at the answer row."""
    m = planted_model()
    tok, net, hd = m.tokenizer, m.model, 32
    scale = 128**0.5
    ids = [tok.convert_tokens_to_ids(w) for w in VALUES]
    with torch.no_grad():
        att0, att1 = net.model.layers[0].self_attn, net.model.layers[1].self_attn
        low = hd // 2 - 1
        att0.q_proj.weight[MARKER[1] * hd + low, : len(tok)] = 12 / scale  # every row asks
        kv0, kv1 = MARKER[1] // 2, COPIER[1] // 2  # (READER shares MARKER's keys: it still
        for i, t in enumerate(ids):  # attends to the value and writes nothing)
            att0.v_proj.weight[kv0 * hd + i, t] = 1 / scale
            att0.o_proj.weight[SPARE + i, MARKER[1] * hd + i] = 1.0
            att1.v_proj.weight[kv1 * hd + i, t] = 0.0
            att1.v_proj.weight[kv1 * hd + i, SPARE + i] = 1 / scale
    return m


def test_mean_readout_hits_reading_heads_and_spares_context_heads():
    """Planted ground truth for the readout ablation: COPIER, needed only at the answer row,
    collapses the task under mean-readout as under mean; MARKER, needed only at the context
    rows, collapses it under mean (its mean lands at the value's row) and not under
    mean-readout, which leaves the context rows alone."""
    from headhunt.heads.evaluations.task_ablation import ablation, reference_means

    m = relay_model()
    enc = Encoder(m.tokenizer, m.max_context)
    encoded = [enc.encode(e) for e in planted_examples(12)]
    evals, ref = encoded[:6], encoded[6:]  # every value once among the evaluated
    seqs = [(e.ids, e.answer_start) for e in evals]
    rows = [e.question[0] for e in evals]
    means = reference_means(m, [e.ids for e in ref], [e.question[0] for e in ref])
    assert all(answers_right(m, seqs))

    def kept(heads, mode):
        return sum(answers_right(m, seqs, ablation(heads, mode, means), 4, rows))

    # a constant mean in place of a copied value: one answer for every example, right once
    assert kept([COPIER], "mean-readout") <= 1 and kept([COPIER], "zero-readout") == 0
    assert kept([COPIER], "mean") <= 1
    assert kept([MARKER], "mean") <= 1 and kept([MARKER], "zero") == 0
    assert kept([MARKER], "mean-readout") == 6 and kept([MARKER], "zero-readout") == 6
    assert kept([MARKER, READER, (1, 3)], "mean-readout") == 6


def test_mean_readout_leaves_every_context_row_output_untouched():
    """With every head of both layers mean-ablated at the readout rows, each layer's output
    at the context rows (before the question) equals the unablated model's, bit for bit;
    the question rows' outputs change."""
    from headhunt.heads.evaluations.task_ablation import ablation, reference_means

    m = relay_model()
    enc = Encoder(m.tokenizer, m.max_context)
    e, *ref = [enc.encode(x) for x in planted_examples(4)]
    means = reference_means(m, [r.ids for r in ref], [r.question[0] for r in ref])
    seen: dict[bool, dict[int, torch.Tensor]] = {False: {}, True: {}}

    class Record(AttentionHook):
        def __init__(self, ablated):
            self.ablated = ablated

        def after(self, call, output):
            seen[self.ablated][call.layer] = output[0].clone()
            return output

    every = [(la, h) for la in range(2) for h in range(4)]
    hooks = ablation(every, "mean-readout", means)
    for ablated, extra in ((False, []), (True, hooks)):
        answers_right(m, [(e.ids, e.answer_start)], [*extra, Record(ablated)], 1,
                      [e.question[0]])  # fmt: skip
    q = e.question[0]
    for la in range(2):
        assert torch.equal(seen[True][la][:q], seen[False][la][:q])
        assert not torch.equal(seen[True][la][q:], seen[False][la][q:])


def test_hard_multidoc_defeats_word_overlap():
    """The paraphrased question shares no attribute word with the evidence, and a distractor
    with the same full name ties it lexically: BM25 cannot be perfect."""
    from headhunt.heads.inputs.needles import default_haystack_text
    from headhunt.heads.inputs.task_inputs import PARAPHRASES, multidoc_hard

    examples = multidoc_hard(40, 12, 20, 0, default_haystack_text())
    hits = []
    for ex in examples:
        assert len(ex.documents) == 12 and ex.lead in ex.documents[ex.evidence[0]]
        assert sum(ex.answer in d for d in ex.documents) == 1
        name = ex.lead.split(" of ", 1)[1].removesuffix(" is")
        assert sum(f"of {name} is" in d for d in ex.documents) == 2  # the evidence and its twin
        assert ex.question in {q.format(p=name) for q in PARAPHRASES.values()}
        hits.append(int(np.argmax(T.bm25_scores(ex.documents, ex.question))) == ex.evidence[0])
    assert 0.2 < np.mean(hits) < 0.8


class DenseRows(AttentionHook):
    """The direct computation: dense probabilities of the answer rows (the model's own rule:
    mask, window, softcap) and each head's output there."""

    def __init__(self, rows):
        self.rows, self.p, self.v, self.out = rows, {}, {}, {}

    def before(self, call):
        self.p[call.layer] = call.probs(slice(*self.rows))[0]  # [hq, rows, nk]
        self.v[call.layer] = call.value[0].float()

    def after(self, call, output):
        self.out[call.layer] = output[0, self.rows[0] : self.rows[1]].float()
        return output


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@torch.no_grad()
def test_write_score_equals_the_direct_computation(family):
    """Per head: L+ (the evidence keys' write) and LOCOS's L- (every other key's write, times
    the row's evidence keys over its other keys, counted under the layer's own causal mask and
    window, written out here) equal a dense computation from the model's own probabilities;
    all keys together give the head's real output projected; and the linearised final norm
    gives the real gold logit."""
    if family == "llama":
        m = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2, seed=3)
    else:  # Gemma's (1 + w) norm and an 8-token sliding window, past which the prompt runs
        tok = word_tokenizer()
        net = tiny_causal_lm("gemma3_text", vocab_size=len(tok), seed=3)
        m = HookedModel(model=net, tokenizer=tok, name="tiny-gemma3")
    enc = Encoder(m.tokenizer, m.max_context).encode(planted_examples(1)[0])
    res = T.score_example(m, enc)
    a0, n = enc.answer_start, len(enc.ids)
    rows = (a0 - 1, n - 1)
    dense = DenseRows(rows)
    norm = T.final_norm(m)
    keep = T._FinalResidual(norm, rows)
    with torch.no_grad(), m.hooks(dense):
        logits = m.forward(torch.tensor([enc.ids]), use_cache=False).logits[0, a0 - 1 : n - 1]
    keep.handle.remove()
    gold = torch.tensor(enc.ids[a0:])
    direction = T.write_directions(m, norm, keep.x, gold)
    # the linearisation is exact at the real residual: x . direction is the gold logit
    assert torch.allclose((keep.x * direction).sum(-1), logits[torch.arange(len(gold)), gold],
                          atol=1e-4)  # fmt: skip
    ev = torch.zeros(len(enc.ids), dtype=torch.bool)
    for i in enc.evidence:
        ev[slice(*enc.doc_spans[i])] = True
    from headhunt.sae.activations import output_projection

    cfg = m.model.config
    pos = torch.arange(len(enc.ids))
    row = torch.arange(*rows)[:, None]

    H, hq = m.n_heads, m.n_heads
    for layer in range(m.n_layers):
        p, v = dense.p[layer], dense.v[layer]
        vals = v[torch.arange(hq) // (hq // v.shape[0])]  # [hq, nk, d]
        w_o = output_projection(m, layer).float().view(-1, H, m.head_dim)
        per_head = torch.einsum("mhd,rm->rhd", w_o, direction)

        def write(mask, p=p, vals=vals, per_head=per_head):  # [rows, hq]
            z = torch.einsum("hrk,hkd->rhd", p * mask, vals)
            return (z * per_head).sum(-1)

        seen = pos[None] <= row  # causal, and a sliding layer's window (HF: q - k < w)
        if getattr(cfg, "layer_types", None) and cfg.layer_types[layer] == "sliding_attention":
            seen &= pos[None] > row - cfg.sliding_window
        scale = (seen & ev).sum(-1) / (seen & ~ev).sum(-1)  # [rows]
        assert np.allclose(res.write_evidence[layer], write(ev).mean(0).numpy(), atol=1e-5)
        off = (write(~ev) * scale[:, None]).mean(0)
        assert np.allclose(res.write_off[layer], off.numpy(), atol=1e-5)
        real = (dense.out[layer] * per_head).sum(-1).mean(0)
        assert torch.allclose(write(torch.ones_like(ev)).mean(0), real, atol=1e-5)
    if family == "gemma3_text":  # the window hid some evidence from a sliding layer's rows
        assert cfg.sliding_window < rows[0] - enc.doc_spans[enc.evidence[0]][0]


def qrhead_filter(tokens: np.ndarray) -> float:
    """QRHead's document score written out plainly: drop the tokens at or below the mean minus
    two (unbiased) standard deviations, sum the rest (a single token has no spread: kept)."""
    if tokens.size < 2:
        return float(tokens.sum())
    floor = tokens.mean() - 2 * tokens.std(ddof=1)
    return float(sum(t for t in tokens if t > floor))


def test_qr_document_scores_drop_only_the_outlying_tokens():
    """A planted outlier (a token the null question attends to far more than the question) is
    dropped, a document without one keeps every token, a one-token document keeps its token;
    the same numbers for every head of a stack."""
    doc = [0.2, 0.1, 0.3, 0.2, 0.1, 0.2, 0.3, 0.1, 0.2, -3.0]  # the last one: the outlier
    plain = [0.05, 0.0, -0.05, 0.1]
    one = [-0.4]
    keys = torch.tensor([doc + plain + one, plain + one + doc])  # two heads, other layouts
    spans = [[(0, 10), (10, 14), (14, 15)], [(5, 15), (0, 4), (4, 5)]]
    for head in range(2):
        got = T.qr_document_scores(keys[head], spans[head])
        assert got.tolist() == pytest.approx([1.7, 0.1, -0.4])
        want = [qrhead_filter(np.array(x)) for x in (doc, plain, one)]
        assert got.tolist() == pytest.approx(want)
    stacked = T.qr_document_scores(keys[:1], spans[0])  # [heads, docs] from [heads, keys]
    assert stacked.shape == (1, 3) and stacked[0].tolist() == pytest.approx([1.7, 0.1, -0.4])


class DenseQuestion(AttentionHook):
    """The direct computation of query focus: dense probabilities of the question's rows on
    every key (the model's own rule), averaged over the rows."""

    def __init__(self, rows):
        self.rows, self.p = rows, {}

    def before(self, call):
        self.p[call.layer] = call.probs(slice(*self.rows))[0].mean(1).numpy()  # [hq, nk]


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@torch.no_grad()
def test_query_focus_and_the_retriever_equal_qrheads_rule_on_dense_rows(family):
    """Per head and document, query focus equals QRHead's filtered score of the question's
    dense attention minus the null question's, token by token; the retriever's scores filter
    the per-token sum over its heads (over all heads for ``focus_all``), not the heads' own
    scores added up. On a tiny Gemma 3 the prompt runs past its 8-token sliding window."""
    m = tiny_family(family, seed=3)
    enc = Encoder(m.tokenizer, m.max_context).encode(planted_examples(3)[2])
    heads = [(1, 2), (0, 1), (1, 0)]
    res = T.score_example(m, enc, retriever_heads=heads)
    dense = {}
    passes = (("q", enc.ids, enc.question), ("null", enc.null_ids, enc.null_question))
    for name, ids, rows in passes:
        hook = DenseQuestion(rows)
        with m.hooks(hook):
            m.forward(torch.tensor([ids]), use_cache=False)
        dense[name] = hook.p
    lo, hi = enc.context
    tokens = np.stack([dense["q"][la][:, lo:hi] - dense["null"][la][:, lo:hi]
                       for la in range(m.n_layers)])  # fmt: skip
    spans = [(s - lo, e - lo) for s, e in enc.doc_spans]
    for la in range(m.n_layers):
        for h in range(m.n_heads):
            want = [qrhead_filter(tokens[la, h, s:e]) for s, e in spans]
            np.testing.assert_allclose(res.focus[la, h], want, atol=1e-5)
    top = sum(tokens[la, h] for la, h in heads)
    np.testing.assert_allclose(res.focus_top, [qrhead_filter(top[s:e]) for s, e in spans],
                               atol=1e-5)  # fmt: skip
    every = tokens.sum((0, 1))
    np.testing.assert_allclose(res.focus_all, [qrhead_filter(every[s:e]) for s, e in spans],
                               atol=1e-5)  # fmt: skip
    # some document drops a token somewhere (else the filter was not exercised)
    raw = res.mass - res.null_mass
    assert np.abs(raw - res.focus).max() > 1e-4
    # records keep every score; a record from before the filter reads back unfiltered, and
    # one from before LOCOS's rescaling (write_other: unscaled) is not current either
    back = T.ExampleResult.from_record(res.to_record())
    np.testing.assert_allclose(back.focus, res.focus, atol=1e-6)
    np.testing.assert_allclose(back.focus_top, res.focus_top, atol=1e-6)
    assert back.current
    old = {k: v for k, v in res.to_record().items() if not k.startswith("focus")}
    assert not T.ExampleResult.from_record(old).current
    older = dict(res.to_record())
    older["write_other"] = older.pop("write_off")
    assert not T.ExampleResult.from_record(older).current


def test_ranking_metrics_and_top_heads():
    assert T.ranking_metrics([0.1, 0.9, 0.3], [1]) == (1.0, 1.0)
    r1, ndcg = T.ranking_metrics([0.9, 0.1, 0.3], [1])
    assert r1 == 0.0 and ndcg == pytest.approx(1 / np.log2(4))
    m = np.array([[0.1, np.nan], [0.5, 0.2]])
    assert T.top_heads(m, 3) == [(1, 0), (1, 1), (0, 0)]
    assert T.mean_se([1, 0, 1, 0]) == (0.5, pytest.approx(np.sqrt(1 / 12)))


def test_bm25_ranks_the_document_sharing_the_question_words():
    pytest.importorskip("bm25s")
    s = T.bm25_scores(["cats sleep all day", "the harbour of lisbon", "bread and salt"],
                      "where is the harbour?")  # fmt: skip
    assert int(np.argmax(s)) == 1


def test_run_writes_the_causal_check_and_the_retriever(planted, tmp_path):
    m, _ = planted
    rows = [
        {"context": e.documents, "question": e.question, "answer": e.answer, "lead": e.lead}
        for e in planted_examples(6)
    ]
    data = tmp_path / "task.jsonl"
    data.write_text("\n".join(__import__("json").dumps(r) for r in rows))
    cfg = {"input": str(data), "score_examples": 3, "ks": [1, 2, 8], "random_draws": 2,
           "modes": ["zero", "mean", "mean-keep-first", "mean-readout"],
           "batch_size": 4}  # fmt: skip
    run = hh.run("taskheads", cfg, model=m, out=tmp_path / "run")
    import pandas as pd

    table = pd.read_csv(run.path / "ablation.csv")
    one = table[(table.detector == "write") & (table.k == 1)]
    assert (one.accuracy == 0.0).all() and (one.full == 1.0).all()
    # random single heads rarely hit the one copier among eight heads; the mean says so
    assert table[table.k == 1].random.min() >= 0.0
    det = run.json("detectors.json")
    assert [tuple(h) for h in det["top"]["write"][:1]] == [COPIER]
    assert run.json("retrieval.json")["top heads"]["recall1"] == 1.0
    assert set(run.scores().df.metric) >= {"copy_score", "query_focus", "write_score"}
    spread = hh.methods.get("taskheads").spread(run, *COPIER)
    assert len(spread) == 3 * 6 and spread.counted.sum() == 3 * 3
    # The random control drawn outside the detector's top k never holds the copier (the one
    # head the task needs): every such draw keeps the task; draws from all heads may not.
    conditions = {c["name"]: c for c in read_jsonl(run.path / "conditions.jsonl")}
    outside = [c for n, c in conditions.items() if n.startswith("outside/")]
    assert len(outside) == 3 * 4 * 2 * 2  # detector x mode x k x draw (none at k = 8 of 8)
    for name, c in conditions.items():
        if name.startswith("outside/"):
            _, d, mode, k, _ = name.split("/")
            top = {tuple(h) for h in det["top"][d][: int(k)]}
            assert len(c["heads"]) == int(k) and not top & {tuple(h) for h in c["heads"]}
    assert (table[(table.detector == "write") & (table.k == 1)].random_outside == 1.0).all()
    assert (table[(table.detector == "copy") & (table.k == 2)].random_outside == 1.0).all()


def test_resuming_records_from_before_the_token_filter_is_refused_in_one_line(planted, tmp_path):
    """Examples scored before QRHead's filter (no ``focus`` in their records) would mix two
    definitions of query focus in one run: resuming from them is refused, never mixed."""
    import json

    from headhunt.errors import HeadhuntError

    m, _ = planted
    rows = [{"context": e.documents, "question": e.question, "answer": e.answer, "lead": e.lead}
            for e in planted_examples(4)]  # fmt: skip
    data = tmp_path / "task.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = {"input": str(data), "score_examples": 2, "ks": [1], "random_draws": 0,
           "modes": ["zero"], "detectors": ["query"], "specificity": False}  # fmt: skip
    done = hh.run("taskheads", cfg, model=m, out=tmp_path / "new", progress=False)
    old = [{k: v for k, v in r.items() if not k.startswith("focus")}
           for r in read_jsonl(done.path / "examples.jsonl")]  # fmt: skip
    partial = tmp_path / "old.partial"
    partial.mkdir()
    (partial / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old[:2]))
    with pytest.raises(HeadhuntError, match="predate QRHead's token filter") as err:
        hh.run("taskheads", cfg, model=m, out=tmp_path / "old", resume=True, progress=False)
    assert "\n" not in str(err.value)


def test_a_detectors_outside_draws_do_not_depend_on_which_detectors_run(planted, tmp_path):
    """A run of one detector (--detectors query) draws that detector's outside control as a run
    of all three does, so a smaller run repeats a larger one's draws."""
    m, _ = planted
    rows = [{"context": e.documents, "question": e.question, "answer": e.answer, "lead": e.lead}
            for e in planted_examples(4)]  # fmt: skip
    data = tmp_path / "task.jsonl"
    data.write_text("\n".join(__import__("json").dumps(r) for r in rows))
    draws = {}
    for detectors in (["copy", "query", "write"], ["query"]):
        cfg = {"input": str(data), "score_examples": 2, "ks": [2], "random_draws": 3,
               "modes": ["zero"], "detectors": detectors, "specificity": False}  # fmt: skip
        run = hh.run("taskheads", cfg, model=m, out=tmp_path / "-".join(detectors))
        draws[len(detectors)] = {c["name"]: c["heads"] for c in read_jsonl(
            run.path / "conditions.jsonl") if c["name"].startswith("outside/query/")}  # fmt: skip
    assert len(draws[1]) == 3 and draws[1] == draws[3]


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_reusing_the_documents_cache_gives_the_scores_of_two_whole_passes(family):
    """The null pass on the documents' KV cache (and the teacher-forced suffix after a cached
    prefix) gives every detector's numbers and the output sums of two whole passes; on a tiny
    Gemma 3 the prompt runs past its sliding window (8 tokens)."""
    m = tiny_family(family, seed=2 if family == "llama" else 1)
    enc = Encoder(m.tokenizer, m.max_context).encode(planted_examples(2)[1])
    assert T.shared_prefix(enc) == enc.question[0] > enc.doc_spans[-1][1] > 8
    sums = {True: T.OutputSum(), False: T.OutputSum()}
    rows: dict[bool, list[int]] = {True: [], False: []}

    class Rows(AttentionHook):
        def __init__(self, reuse):
            self.reuse = reuse

        def before(self, call):
            if call.layer == 0:
                rows[self.reuse].append(call.query.shape[2])

    got = {r: T.score_example(m, enc, extra_hooks=[sums[r], Rows(r)], reuse_prefix=r)
           for r in sums}  # fmt: skip
    p = enc.question[0]  # the documents ran once: prefix, then the two suffixes on the cache
    assert rows[True] == [p, len(enc.ids) - p] and rows[False] == [len(enc.ids)]
    a, b = got[True], got[False]
    assert a.correct == b.correct
    for name in ("copy", "mass", "null_mass", "focus", "focus_all", "write_evidence",
                 "write_off"):  # fmt: skip
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=2e-5, rtol=1e-4)
    assert sums[True].count == sums[False].count == len(enc.ids)
    for la in range(m.n_layers):
        torch.testing.assert_close(sums[True].total[la], sums[False].total[la], atol=1e-4,
                                   rtol=1e-4)  # fmt: skip
        torch.testing.assert_close(sums[True].first[la], sums[False].first[la])


def test_reference_means_are_the_heads_mean_outputs():
    """The mean a mean ablation substitutes, over a reference set: every position of every
    sequence (mean), every position but each sequence's first (mean-keep-first)."""
    from headhunt.heads.evaluations.task_ablation import reference_means

    m = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2, seed=3)
    # two sequences of one length and readout start go through one forward
    seqs = [[1, 5, 9, 4], [1, 7, 3], [1, 2, 8, 8, 6], [1, 6, 2, 3]]
    starts = [2, 1, 3, 2]
    outs: dict[int, list] = {0: [], 1: []}

    class Record(AttentionHook):
        def after(self, call, output):
            outs[call.layer].append(output[0].float())  # [t, hq, d]
            return output

    with torch.no_grad(), m.hooks(Record()):
        for s in seqs:
            m.forward(torch.tensor([s]), use_cache=False)
    means = reference_means(m, seqs, starts, batch_size=2)
    for la in (0, 1):
        every = torch.cat(outs[la])
        rest = torch.cat([o[1:] for o in outs[la]])
        readout = torch.cat([o[s:] for o, s in zip(outs[la], starts, strict=True)])
        assert torch.allclose(means["mean"][la], every.mean(0), atol=1e-5)
        assert torch.allclose(means["mean-keep-first"][la], rest.mean(0), atol=1e-5)
        assert torch.allclose(means["mean-readout"][la], readout.mean(0), atol=1e-5)


def test_closed_book_sets_deal_each_kind_to_both_and_keep_the_original_prompts():
    """The specificity control's prompts: the original 24 first in each set, no prompt in both
    or twice, and each kind's items dealt in turn to the evaluated and the reference set."""
    from headhunt.heads.inputs import task_closed_book as C

    book, ref = C.CLOSED_BOOK, C.CLOSED_BOOK_REFERENCE
    assert book[:24] == C.ORIGINAL and ref[:24] == C.ORIGINAL_REFERENCE
    prompts = [p for p, _ in book + ref]
    assert len(prompts) == len(set(prompts)) and len(book) >= 200 and len(ref) >= 200
    for kind in C.KINDS.values():
        in_book = sum(item in book[24:] for item in kind)
        in_ref = sum(item in ref[24:] for item in kind)
        assert in_book + in_ref >= len(kind) - 2  # (an item already in the originals: skipped)
        assert in_book - in_ref in (0, 1)


def test_specificity_ablates_with_the_closed_book_mean(planted, tmp_path, monkeypatch):
    """The specificity control's mean ablation puts in the heads' mean over the closed-book
    reference prompts (none of them evaluated); closed_book keeps the task's mean."""
    from headhunt.heads.evaluations import task_ablation as A
    from headhunt.heads.inputs import task_inputs as I

    assert not {p for p, _ in I.CLOSED_BOOK} & {p for p, _ in I.CLOSED_BOOK_REFERENCE}
    m, _ = planted
    made, used = [], []
    real_means, real_ablation = A.reference_means, A.ablation

    def spy_means(model, seqs, *rows):
        made.append((seqs, real_means(model, seqs, *rows)))
        return made[-1][1]

    def spy_ablation(heads, mode, means):
        used.append((mode, bool(heads), means))
        return real_ablation(heads, mode, means)

    monkeypatch.setattr(A, "reference_means", spy_means)
    monkeypatch.setattr(A, "ablation", spy_ablation)
    rows = [{"context": e.documents, "question": e.question, "answer": e.answer,
             "lead": e.lead} for e in planted_examples(4)]  # fmt: skip
    data = tmp_path / "task.jsonl"
    data.write_text("\n".join(__import__("json").dumps(r) for r in rows))
    cfg = {"input": str(data), "score_examples": 2, "ks": [1], "random_draws": 1,
           "modes": ["mean", "zero"], "random_from": ["all"]}  # fmt: skip
    run = hh.run("taskheads", cfg, model=m, out=tmp_path / "run")
    # the top-16 lists and their overlaps cover 16 heads (here all 8), whatever --ks ablated
    assert all(len(top) == 8 for top in run.json("detectors.json")["top"].values())
    assert len(made) == 1
    ref = [p + a for p, a in I.closed_book_ids(m.tokenizer, I.CLOSED_BOOK_REFERENCE)]
    assert made[0][0] == ref
    closed_means = made[0][1]
    mean_calls = [means for mode, heads, means in used if mode == "mean" and heads]
    # each mean-ablated condition (3 detectors + 1 random) twice: the task, then specificity
    assert len(mean_calls) == 2 * 4
    assert sum(means is closed_means for means in mean_calls) == 4


def test_closed_book_control_keeps_exactly_the_prompts_the_model_answers(planted, monkeypatch):
    """Planted: of four closed-book prompts, two end in the model's own greedy next word and
    two in another word; the control keeps exactly the two (at any batch size), reads out from
    the first row after the BOS, and takes its means over the reference prompts alone."""
    import torch

    from headhunt.heads.evaluations import task_ablation as A
    from headhunt.heads.inputs import task_inputs as I

    m, _ = planted
    tok = m.tokenizer
    prompts = ["the city is", "a key is", "the vault is", "one two three"]

    def greedy(prompt: str) -> str:
        ids = [tok.bos_token_id, *tok(prompt, add_special_tokens=False).input_ids]
        with torch.inference_mode():
            logits = m.model(torch.tensor([ids])).logits[0, -1]
        return tok.decode([int(logits.argmax())]).strip()

    own = [greedy(p) for p in prompts]
    other = [next(w for w in ("blue", "red", "seven") if w != o) for o in own]
    book = [(p, own[i] if i % 2 == 0 else other[i]) for i, p in enumerate(prompts)]
    reference = [("the sea is", "blue"), ("a door is", "red")]
    monkeypatch.setattr(I, "CLOSED_BOOK", book)
    monkeypatch.setattr(I, "CLOSED_BOOK_REFERENCE", reference)
    want = [(p + a, len(p)) for p, a in I.closed_book_ids(tok, book[0::2])]
    ref = [p + a for p, a in I.closed_book_ids(tok, reference)]
    direct = A.reference_means(m, ref, [1] * len(ref))
    for batch_size in (1, 3):
        kept, rows, means = A.closed_book_control(m, batch_size)
        assert kept == want and rows == [1, 1]
        assert means.keys() == direct.keys()
        for mode in means:
            for layer, mean in means[mode].items():
                torch.testing.assert_close(mean, direct[mode][layer])


def test_row_probabilities_equal_attention_probs_at():
    """The capture's rows (exp(score - lse)) are attention_probs_at's numbers, on a sliding
    layer past its window too (tiny Gemma 3)."""
    from headhunt.kernels import attention_probs_at

    tok = word_tokenizer()
    m = HookedModel(model=tiny_causal_lm("gemma3_text", vocab_size=len(tok), seed=1),
                    tokenizer=tok, name="tiny-gemma3")  # fmt: skip
    enc = Encoder(tok, m.max_context).encode(planted_examples(1)[0])
    cap = T.TaskCapture(enc.doc_spans, enc.evidence, enc.question)
    seen = []

    class Check(AttentionHook):
        def before(self, call):
            s, e = enc.question
            kw = call.kernel_kwargs()
            lse = cap._lse(call, kw, s, e).lse
            rows = cap.probs(call, lse, s, e)  # [hq, rows, keys]
            r = torch.arange(e - s).repeat_interleave(cap.hi - cap.lo)
            k = torch.arange(cap.lo, cap.hi).repeat(e - s)
            ref = attention_probs_at(call.query[:, :, s:e], call.key, lse, r, k,
                                     **T._rows_kwargs(kw, s, e))  # fmt: skip
            seen.append(call.window)
            assert torch.allclose(rows.reshape(rows.shape[0], -1), ref[0], atol=1e-6)

    with torch.no_grad(), m.hooks(Check()):
        m.forward(torch.tensor([enc.ids]), use_cache=False)
    assert None in seen and 8 in seen  # a full and a sliding layer
