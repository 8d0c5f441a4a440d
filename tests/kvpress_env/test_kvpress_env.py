"""headhunt's exports and presses inside kvpress 0.5.5 itself (its own environment:
`make kvpress-env`, then `.venv-kvpress/bin/python -m pytest tests/kvpress_env`). Skipped where
kvpress is not installed (the main environment: kvpress pins transformers < 5.3).

The files are loaded the way kvpress's presses read theirs (np.load of the curve,
DuoAttentionPress's own loader replaced as the export's README says), never modified, and each
press's reported ratio is checked against the KV entries measured in the cache."""

from __future__ import annotations

import numpy as np
import pytest

kvpress = pytest.importorskip("kvpress")

import torch  # noqa: E402
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

from headhunt.export import ModelShape, export  # noqa: E402

LAYERS, HEADS, KV = 2, 4, 2
SHAPE = ModelShape(LAYERS, HEADS, KV, head_dim=16)
SCORES = np.array([[0.9, 0.0, 0.1, 0.0], [0.0, 0.0, 0.0, 0.6]])  # KV maxima [0.9, 0.1], [0, 0.6]
TOKENS = 128


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        max_position_embeddings=512,
    )
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


def prefill(model, press):
    """The prefill of kvpress's pipeline (``model.model`` under the press), then the entries."""
    from headhunt.kvpress_press import kv_entries

    cache = DynamicCache()
    ids = torch.randint(0, 100, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), press(model):
        model.model(input_ids=ids, past_key_values=cache)
    held, kept = kv_entries(model, cache)
    return held, kept, cache


def masked_per_head(model, layer: int) -> np.ndarray:
    m = model.model.layers[layer].self_attn.masked_key_indices
    return np.bincount(m[1].numpy(), minlength=KV) if m is not None else np.zeros(KV, int)


def test_lukv_curve_loads_unmodified_and_prunes_its_ratio(model, tmp_path):
    from kvpress import ExpectedAttentionPress, LUKVPress

    export("lukv", tmp_path / "l", SCORES, SHAPE)
    press = LUKVPress(ExpectedAttentionPress(epsilon=2e-2), compression_ratio=0.5)
    press._budget_curves = np.load(tmp_path / "l" / "budget_curve.npy")  # as its README says
    held, kept, _ = prefill(model, press)
    assert held == LAYERS * KV * TOKENS
    assert 1 - kept / held == pytest.approx(0.5, abs=2 / held)
    first, second = masked_per_head(model, 0), masked_per_head(model, 1)
    assert first[0] < first[1] and second[1] < second[0]  # the better heads lose fewer


def test_duo_pattern_through_kvpress_reports_the_masked_share(model, tmp_path, monkeypatch):
    import json

    from kvpress import DuoAttentionPress

    folder = tmp_path / "k"
    export("kvpress", folder, SCORES, SHAPE, sink=4, recent=12, context=TOKENS)

    def local_pattern(model):  # the README's loader: DuoAttention's two files, clipped
        cfg = json.loads((folder / "config.json").read_text())
        values = np.loadtxt(folder / "full_attention_heads.tsv", delimiter="\t")
        return cfg["sink_size"], cfg["recent_size"], np.clip(values, 0, 1)

    monkeypatch.setattr(DuoAttentionPress, "load_attention_pattern", staticmethod(local_pattern))
    budget = json.loads((folder / "budget.json").read_text())["ratios"]
    for row in budget:
        if not row["reachable"]:
            continue
        press = DuoAttentionPress(head_compression_ratio=row["head_compression_ratio"])
        held, kept, _ = prefill(model, press)
        removed = 1 - kept / held
        assert press.compression_ratio == pytest.approx(removed)  # kvpress's own report
        assert removed == pytest.approx(row["entries_removed_share"])  # budget.json's
        assert kept * 2 * 16 * 2 == row["kv_bytes_kept"]  # bf16 bytes, as budget.json counts
    as_evaluated = next(r for r in budget if r["target"] == 0.5)
    assert as_evaluated["kvpress_reported_ratio"] < 0.5  # kvpress#228: heads, not bytes


def test_adakv_weights_shift_budget_and_keep_the_ratio(model, tmp_path):
    from kvpress import AdaKVPress, ExpectedAttentionPress

    from headhunt.kvpress_press import HeadWeightedPress

    files = export("adakv", tmp_path / "a", SCORES, SHAPE, floor=0.01)
    weights = np.load(files[0])
    plain = AdaKVPress(ExpectedAttentionPress(compression_ratio=0.5))
    held, kept, _ = prefill(model, plain)
    base = masked_per_head(model, 0)
    weighted = AdaKVPress(
        HeadWeightedPress(press=ExpectedAttentionPress(), weights=weights, compression_ratio=0.5)
    )
    held2, kept2, _ = prefill(model, weighted)
    assert 1 - kept / held == 1 - kept2 / held2 == pytest.approx(0.5, abs=1 / TOKENS)
    assert masked_per_head(model, 0)[0] < base[0]  # layer 0's best head keeps more


def test_head_budget_press_keeps_its_share_and_the_best_heads_whole(model):
    from headhunt.kvbudget import fold_kv
    from headhunt.kvpress_press import HeadBudgetPress

    kv = fold_kv(SCORES, KV)
    for ratio in (0.25, 0.5, 0.75):
        press = HeadBudgetPress(head_scores=kv, compression_ratio=ratio, sink=2, window=4)
        held, kept, _ = prefill(model, press)
        assert kept / held == pytest.approx(press.kept_share)
        assert press.kept_share == pytest.approx(1 - ratio, abs=2 / held)
    assert masked_per_head(model, 0)[0] < masked_per_head(model, 0)[1]
    with pytest.raises(ValueError, match="3 layers x 2 KV heads; the model has 2 x 2"):
        prefill(model, HeadBudgetPress(head_scores=np.ones((3, 2)), compression_ratio=0.5))


def test_outside_mass_of_planted_rows():
    from headhunt.kvpress_press import outside_mass

    n, sink, window = 10, 2, 3
    w = torch.zeros(1, 2, n, n)
    for i in range(n):
        w[0, 0, i, i] = 1.0  # head 0: all on itself (inside the window)
        w[0, 1, i, 0] = 0.5  # head 1: half on the sink, ...
        w[0, 1, i, max(0, i - window)] += 0.5  # ... half on the first key outside the window
    got = outside_mass(w, sink, window)
    # rows 5..9 count; row p puts 0.5 on key p - 3 >= 2: outside sink and window
    assert got.tolist() == pytest.approx([0.0, 0.5])
    tail = outside_mass(w[:, :, -4:], sink, window)  # queries aligned to the last keys
    assert tail.tolist() == pytest.approx([0.0, 0.5])
    with pytest.raises(ValueError, match="no row beyond"):
        outside_mass(w[..., :4, :4], sink, window)


def test_attention_spread_matches_the_eager_matrix(model):
    from headhunt.kvpress_press import attention_spread, outside_mass

    ids = torch.randint(0, 100, (1, 48), generator=torch.Generator().manual_seed(2))
    got = attention_spread(model, [ids[0].tolist()], sink=2, window=8)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model.model(input_ids=ids, output_attentions=True)
    model.set_attn_implementation("sdpa")
    want = np.stack([outside_mass(a, 2, 8).numpy() for a in out.attentions])
    assert got.shape == (LAYERS, HEADS)
    assert got == pytest.approx(want, abs=1e-6)
    assert (got > 0).all() and (got < 1).all()


def test_recency_press_keeps_the_most_recent_tokens_per_head_budget(model):
    from headhunt.kvpress_press import HeadBudgetPress, RecencyPress

    kv = np.array([[1.0, 0.0], [0.0, 0.0]])
    press = HeadBudgetPress(
        head_scores=kv, press=RecencyPress(), compression_ratio=0.5, sink=2, window=4
    )
    prefill(model, press)
    masked = model.model.layers[1].self_attn.masked_key_indices
    dropped = sorted(masked[2][masked[1] == 0].tolist())
    # head (0, 0) keeps all; the three others a third each: the sink and the newest tokens
    assert dropped == list(range(2, 2 + len(dropped)))
    assert len(dropped) == TOKENS - round(TOKENS * press.shares()[1, 0]) == 85


def test_duo_snap_keeps_the_pattern_full_heads_whole_and_the_ratio(model):
    """benchmarks/kvpress/compare.py's ``duo_snap``: DuoAttention's full heads (those the
    pattern ranks highest, as many as DuoAttention keeps at the ratio at 4,096 tokens) keep every
    entry; the streaming heads share the rest of the budget, tokens chosen by SnapKV."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kvpress"))
    from compare import duo_snap

    pattern = np.array([[0.9, 0.1], [0.0, 0.6]])
    press = duo_snap(pattern, 0.6, 4096)  # DuoAttention streams round(4 x 0.662) = 3 heads
    assert press.shares().ravel().tolist() == pytest.approx([1.0, 0.2, 0.2, 0.2])
    press.press.window_size = 8  # SnapKV's observation window, shorter than the 128 tokens
    held, kept, _ = prefill(model, press)
    assert kept == TOKENS + 3 * round(0.2 * TOKENS)
    assert masked_per_head(model, 0)[0] == 0 and masked_per_head(model, 0)[1] > 0


def test_union_pattern_keeps_the_best_of_both_rankings():
    """compare.py's ``union_pattern``: a head ranks by the better of its two rank shares, so the
    top of the pattern holds the top retrieval heads and the widest readers alike; tied scores
    share their rank."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kvpress"))
    from compare import rank_share, union_pattern

    assert rank_share(np.array([[0.0, 0.0], [0.5, 0.2]])).tolist() == [[0.375, 0.375], [1.0, 0.75]]
    retrieval = np.array([[0.0, 0.0, 0.9], [0.0, 0.8, 0.1]])
    spread = np.array([[0.9, 0.2, 0.1], [0.3, 0.0, 0.4]])
    pattern = union_pattern(retrieval, spread)
    top2 = set(np.argsort(pattern, axis=None)[-2:].tolist())
    assert top2 == {2, 0}  # the best copier (0, 2) and the widest reader (0, 0)
    top3 = set(np.argsort(pattern, axis=None)[-3:].tolist())
    # then rank 5/6: the second copier (1, 1) and the second widest reader (1, 2) tie; (1, 2)
    # wins on its other rank (4/6 against 1/6)
    assert top3 == {2, 0, 5}
