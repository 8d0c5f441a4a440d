"""Conformance across model families: headhunt's captures equal the model's own eager attention.

Every causal-LM family of the installed transformers is listed in :data:`FAMILIES` with what
headhunt does with it: ``"pass"`` (the conformance checks run on a tiny random model of it),
or ``"refused: <words of the one-line reason>"`` (``load_model`` / ``HookedModel`` or the first
capture refuses it, and the test checks that refusal). A family transformers adds later is in
neither, and :func:`test_every_causal_lm_family_is_accounted_for` fails until it is classified.

The table is expected test outcomes, not a table the library reads: headhunt derives what a
layer does from the call itself (see :class:`headhunt.probes.attention.AttentionCall`).
"""

from __future__ import annotations

import pytest
import torch

from headhunt.errors import HeadhuntError

from . import checks
from .conftest import build_pair

FAMILIES: dict[str, str] = {
    "afmoe": "pass",
    "apertus": "pass",
    "apertus1p5_text": "pass",
    "arcee": "pass",
    "aria_text": "pass",
    "axk1": "pass",
    "axk2": "refused: passes indices",
    "bailing_hybrid": "pass",
    "bamba": "pass",
    "bart": "refused: cross-attention or several attentions per layer",
    "beam": "pass",
    "bert": "pass",
    "bert-generation": "pass",
    "big_bird": "refused: block-sparse attention",
    "bigbird_pegasus": "refused: cross-attention or several attentions per layer",
    "biogpt": "pass",
    "bitnet": "pass",
    "blenderbot": "refused: cross-attention or several attentions per layer",
    "blenderbot-small": "refused: cross-attention or several attentions per layer",
    "bloom": "pass",
    "blt": "refused: has cross-attention",
    "camembert": "pass",
    "codegen": "pass",
    "cohere": "pass",
    "cohere2": "pass",
    "cohere2_moe": "pass",
    "cohere_compass_text": "pass",
    "cpmant": "refused: is bidirectional over its input",
    "ctrl": "pass",
    "cwm": "pass",
    "data2vec-text": "pass",
    "dbrx": "pass",
    "deepseek_v2": "pass",
    "deepseek_v3": "pass",
    "deepseek_v32": "refused: passes indices",
    "deepseek_v4": "refused: compressed keys",
    "diffllama": "refused: calls attention 2 times",
    "doge": "pass",
    "dory": "pass",
    "dots1": "pass",
    "dots3_note": "refused: sparse attention by indices as well",
    "dots3_note_text": "refused: sparse attention by indices as well",
    "electra": "pass",
    "emu3": "pass",
    "ernie": "pass",
    "ernie4_5": "pass",
    "ernie4_5_moe": "pass",
    "exaone": "pass",
    "exaone4": "pass",
    "exaone_moe": "pass",
    "falcon": "pass",
    "falcon_h1": "pass",
    "falcon_mamba": "refused: no attention layers: head scores need attention",
    "flex_olmo": "pass",
    "flint": "pass",
    "fuyu": "pass",
    "gemma": "pass",
    "gemma2": "pass",
    "gemma3": "pass",
    "gemma3_text": "pass",
    "gemma3n": "refused: requires the timm library",
    "gemma3n_text": "pass",
    "gemma4": "pass",
    "gemma4_assistant": "refused: cross-attention to the KV states of the model it drafts for",
    "gemma4_text": "pass",
    "gemma4_unified": "pass",
    "gemma4_unified_assistant": "refused: cross-attention to the KV states of the model it drafts for",
    "gemma4_unified_text": "pass",
    "git": "pass",
    "glm": "pass",
    "glm4": "pass",
    "glm4_moe": "pass",
    "glm4_moe_lite": "pass",
    "glm_moe_dsa": "refused: passes indices",
    "got_ocr2": "pass",
    "gpt-sw3": "pass",
    "gpt2": "pass",
    "gpt_bigcode": "pass",
    "gpt_neo": "pass",
    "gpt_neox": "pass",
    "gpt_neox_japanese": "pass",
    "gpt_oss": "pass",
    "gptj": "pass",
    "granite": "pass",
    "granite_swa": "pass",
    "granitemoe": "pass",
    "granitemoe_swa": "pass",
    "granitemoehybrid": "pass",
    "granitemoeshared": "pass",
    "helium": "pass",
    "hrm_text": "pass",
    "hunyuan_v1_dense": "pass",
    "hunyuan_v1_moe": "pass",
    "hy_v3": "pass",
    "hy_v4": "refused: passes indices",
    "hyperclovax": "pass",
    "inkling2_loop_text": "pass",
    "inkling2_text": "pass",
    "inkling_text": "pass",
    "internlm3": "pass",
    "iquestcoder": "pass",
    "jais2": "pass",
    "jamba": "pass",
    "jetmoe": "pass",
    "kimi_linear": "pass",
    "kolibri1": "pass",
    "laguna": "pass",
    "lara_mini": "pass",
    "lfm2": "pass",
    "lfm2_moe": "pass",
    "lfm3": "pass",
    "llama": "pass",
    "llama4": "pass",
    "llama4_text": "pass",
    "longcat_flash": "pass",
    "mamba": "refused: no attention layers: head scores need attention",
    "mamba2": "refused: no attention layers: head scores need attention",
    "marian": "refused: cross-attention or several attentions per layer",
    "mbart": "refused: cross-attention or several attentions per layer",
    "megatron-bert": "pass",
    "mellum": "pass",
    "mimo_v2_flash": "pass",
    "minicpm3": "pass",
    "minimax": "pass",
    "minimax_m2": "pass",
    "minimax_m3_vl_text": "pass",
    "ministral": "pass",
    "ministral3": "pass",
    "mistral": "pass",
    "mixtral": "pass",
    "mllama": "refused: is a cross-attention layer",
    "modernbert-decoder": "pass",
    "moshi": "pass",
    "moss_transcribe_diarize": "pass",
    "mpt": "pass",
    "musicgen": "refused: cross-attention or several attentions per layer",
    "musicgen_melody": "pass",
    "mvp": "refused: hold cross-attention",
    "nanochat": "pass",
    "nemotron": "pass",
    "nemotron_h": "pass",
    "olmo": "pass",
    "olmo2": "pass",
    "olmo3": "pass",
    "olmo_hybrid": "pass",
    "olmoe": "pass",
    "openai-gpt": "pass",
    "opt": "pass",
    "pegasus": "refused: cross-attention or several attentions per layer",
    "persimmon": "pass",
    "phi": "pass",
    "phi3": "pass",
    "phi4_multimodal": "pass",
    "phimoe": "pass",
    "plbart": "refused: cross-attention or several attentions per layer",
    "prophetnet": "refused: hold cross-attention",
    "qwen2": "pass",
    "qwen2_moe": "pass",
    "qwen3": "pass",
    "qwen3_5": "pass",
    "qwen3_5_moe": "pass",
    "qwen3_5_moe_text": "pass",
    "qwen3_5_text": "pass",
    "qwen3_moe": "pass",
    "qwen3_next": "pass",
    "qwen4_exp": "refused: sparse attention by indices",
    "qwen4_exp_text": "refused: sparse attention by indices",
    "recurrent_gemma": "pass",
    "reformer": "refused: sparse attention by indices",
    "rembert": "pass",
    "roberta": "pass",
    "roberta-prelayernorm": "pass",
    "roc_bert": "pass",
    "roformer": "pass",
    "rwkv": "refused: no attention layers: head scores need attention",
    "sarvam_mla": "pass",
    "sarvam_moe": "pass",
    "seed_oss": "pass",
    "smollm3": "pass",
    "solar_open": "pass",
    "stablelm": "pass",
    "starcoder2": "pass",
    "trocr": "refused: cross-attention or several attentions per layer",
    "vaultgemma": "pass",
    "whisper": "refused: cross-attention or several attentions per layer",
    "xglm": "pass",
    "xlm": "refused: is bidirectional (config.causal is False: a masked LM",
    "xlm-roberta": "pass",
    "xlm-roberta-xl": "pass",
    "xlnet": "refused: is bidirectional (attn_type 'bi': a permutation LM",
    "xlstm": "refused: no attention layers: head scores need attention",
    "xmod": "pass",
    "youtu": "pass",
    "zamba": "pass",
    "zamba2": "pass",
    "zaya": "pass",
}

PASSING = sorted(f for f, s in FAMILIES.items() if s == "pass")
SLOW: set[str] = set()  # none since the Mamba mixers of the tiny hybrids are small
REFUSED = sorted(f for f, s in FAMILIES.items() if s.startswith("refused: "))
# Families whose inputs are not one token row per sequence, checked in their own layout by a
# module of their own: MusicGen Melody's codebook rows (test_codebooks.py)
OWN_LAYOUT = {"musicgen_melody"}


def _marks(family: str):
    return pytest.param(family, marks=pytest.mark.slow) if family in SLOW else family


CHECKED_HERE = [_marks(f) for f in PASSING if f not in OWN_LAYOUT]


def test_every_causal_lm_family_is_accounted_for():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    installed = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    missing = sorted(installed - set(FAMILIES))
    assert not missing, f"causal-LM families neither in the suite nor refused: {missing}"
    reasons = [s.removeprefix("refused: ").strip() for s in FAMILIES.values() if s != "pass"]
    assert len(PASSING) + len(REFUSED) == len(FAMILIES) and all(reasons)
    assert len(PASSING) >= 20


@pytest.mark.parametrize("family", CHECKED_HERE)
def test_family_conforms(family, zeroed):
    pair = build_pair(family)
    checks.check_dense_rows(pair)
    checks.check_decode(pair)
    checks.check_masking(pair, zeroed)
    checks.check_ngram(pair)


@pytest.mark.parametrize("family", CHECKED_HERE)
def test_family_prefill_stats(family):
    checks.check_prefill_stats(build_pair(family))


def _imports(package: str) -> bool:
    try:
        __import__(package)
    except Exception:  # timm raises RuntimeError where its torchvision does not fit torch
        return False
    return True


@pytest.mark.parametrize("family", REFUSED)
def test_family_is_refused_in_one_line(family):
    reason = FAMILIES[family].removeprefix("refused: ")
    if family == "gemma3n" and _imports("timm"):  # refused only where timm does not import
        pytest.skip("timm imports here: test_gemma3n_multimodal runs the checks on gemma3n")
    with pytest.raises(HeadhuntError) as err:
        pair = build_pair(family)
        checks.check_dense_rows(pair)  # some refusals come at the first padded capture
        checks.check_decode(pair)  # or at the first cached decoding step
    message = str(err.value)
    assert "\n" not in message
    assert reason in message, message


def test_docs_table_matches_the_suite():
    from pathlib import Path

    doc = Path(__file__).parents[2] / "docs" / "conformance.md"
    table = {}
    for line in doc.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] != "family":
            table[cells[0]] = cells[4]
    assert table == FAMILIES


@pytest.mark.parametrize(
    "family", ["mistral", "gemma2", "gpt_oss", "llama4_text", "gemma3n_text", "gemma4_text"]
)
def test_decode_positions_stay_inside_the_window(family):
    """Decoding past the window (or chunk): every argmax key a sliding (chunked) layer reports
    is one its query can see, at absolute positions although its cache keeps only the window
    (Gemma 3n: also in the layers that read another layer's cache)."""
    from headhunt.probes.capture import greedy_decode

    from .conftest import LENGTH, padded_batch

    hm = build_pair(family).hooked
    cfg = hm.model.config
    ids, mask = padded_batch(cfg.vocab_size)
    dec = greedy_decode(hm, ids, attention_mask=mask, max_new_tokens=12, capture_argmax=True)
    types = getattr(cfg, "layer_types", None) or ["sliding_attention"] * hm.n_layers
    size = cfg.attention_chunk_size if family == "llama4_text" else cfg.sliding_window
    for t in range(dec.tokens.shape[1]):
        p = LENGTH - 1 + t
        for layer, kind in enumerate(types):
            pos = dec.argmax[t, layer]
            if kind == "sliding_attention":
                assert bool(((pos > p - size) & (pos <= p)).all()), (t, layer, pos)
            elif kind == "chunked_attention":
                # chunks are counted from each row's first real token (transformers' rule)
                first = (1 - mask).sum(-1)[:, None]
                assert bool(((pos - first) // size == (p - first) // size).all()), (t, layer)
            else:
                assert bool((pos <= p).all())


def test_one_module_object_at_several_layers_is_refused():
    """Zamba's shared block is one module per application (each told its layer by the forward),
    captured layer by layer; one module object placed at two layers has no layer of its own
    and is refused in one line."""
    from headhunt.probes.hooked import HookedModel
    from headhunt.probes.tiny import tiny_causal_lm

    from .conftest import OVERRIDES

    model = tiny_causal_lm("zamba", **OVERRIDES["zamba"])
    layers = model.model.layers
    layers[3].shared_transf = layers[1].shared_transf
    with pytest.raises(HeadhuntError) as err:
        HookedModel(model=model, tokenizer=None, name="zamba")
    assert "\n" not in str(err.value) and "runs at several layers" in str(err.value)


def test_shared_block_layers_keep_the_models_indices():
    """Each application of Zamba 2's shared block is captured as the layer the model runs it
    at (1 and 3), with its own q, k (its own LoRA adapters): the two layers' queries differ."""
    from headhunt.probes.capture import capture_qk

    hm = build_pair("zamba2").hooked
    assert hm.attention_layers == [1, 3] and hm.modules[1] is not hm.modules[3]
    ids = torch.randint(3, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    got = capture_qk(hm, ids)
    assert not torch.allclose(got[1][0], got[3][0])


def test_stateful_decoding_equals_recomputing():
    """RecurrentGemma returns no cache (its recurrent state lives in its modules): headhunt
    hands it a DynamicCache for its local-attention layer and decodes on, past its window of
    8. The greedy tokens equal a full forward's over the decoded sequence, twice in a row (the
    state left in the modules by the first decode does not leak into the second)."""
    from headhunt.probes.capture import greedy_decode

    from .conftest import padded_batch

    pair = build_pair("recurrent_gemma")
    ids, mask = padded_batch(64)
    for _ in range(2):
        dec = greedy_decode(pair.hooked, ids, attention_mask=mask, max_new_tokens=6)
        seq = torch.cat([ids, dec.tokens], 1)
        full = torch.cat([mask, torch.ones_like(dec.tokens)], 1)
        pos = (full.cumsum(-1) - 1).clamp_min(0)
        with torch.no_grad():
            logits = pair.eager(seq, attention_mask=full, position_ids=pos, use_cache=False).logits
        assert torch.equal(logits[:, ids.shape[1] - 1 : -1].argmax(-1), dec.tokens)


def test_per_layer_key_head_counts_conform(zeroed):
    """Gemma 4 with ``attention_k_eq_v`` (its larger released models): the global layers have
    fewer key heads (1, keys reused as values) than the sliding ones (2). Each layer is captured
    with its own count and passes every check; the n-gram scores of a whole run come out with
    no key-head grouping; what needs one group size for the model refuses in one line."""
    from headhunt.heads.ngram import NgramConfig, score_ngrams

    pair = build_pair("gemma4_text", attention_k_eq_v=True, num_global_key_value_heads=1)
    hm = pair.hooked
    assert hm.kv_head_counts == [2, 1, 2, 1] and hm.describe()["kv_heads"] == [2, 1, 2, 1]
    checks.check_every(pair, zeroed)
    ids = torch.randint(3, 9, (2, 16), generator=torch.Generator().manual_seed(0))
    table = score_ngrams(hm, {"random": ids}, NgramConfig(exclude_bos=False))
    assert table.matrix("induction", source="random").shape == (4, 4)
    rows = table.df[table.df.metric == "induction"].drop_duplicates(["layer", "head"])
    kv = rows.set_index(["layer", "head"]).kv_head
    assert [kv[(0, h)] for h in range(4)] == [0, 0, 1, 1]  # 2 key heads: groups of 2
    assert [kv[(1, h)] for h in range(4)] == [0, 0, 0, 0]  # 1 key head for all 4
    with pytest.raises(HeadhuntError) as err:
        _ = hm.group_size
    assert "\n" not in str(err.value) and "key heads varies per layer" in str(err.value)


def test_two_attentions_per_decoder_layer_keep_their_indices():
    """LongCat-Flash: two MLA attentions per decoder layer, cache layers 2i and 2i + 1, are
    headhunt's layers 0-3 (each module at the index the model gives it); the residual stream
    after "layer L" has no block of its own, refused in one line."""
    hm = build_pair("longcat_flash").hooked
    assert hm.attention_layers == [0, 1, 2, 3]
    assert [m.layer_idx for m in hm.attention_modules] == [0, 1, 2, 3]
    with pytest.raises(HeadhuntError) as err:
        _ = hm.blocks
    assert "\n" not in str(err.value) and "decoder layers" in str(err.value)


def test_big_bird_full_attention_conforms(zeroed):
    """BigBird's block-sparse attention is refused (the family's row); with
    ``attention_type="original_full"`` its BERT-style attention, computed in the module's
    own code, passes every check."""
    pair = build_pair("big_bird", attention_type="original_full")
    checks.check_every(pair, zeroed)


def test_gpt1_decodes_with_headhunts_cache():
    """GPT-1 keeps no KV cache: headhunt decodes it with one of its own in the routed
    modules, each step feeding one token. The tokens equal greedy full forwards over the
    sequence so far (its own way of decoding), unpadded too; a cache handed in is refused in
    one line, and no cache is left in the modules after decoding."""
    from headhunt.probes.capture import greedy_decode

    from .conftest import padded_batch

    pair = build_pair("openai-gpt")
    ids, mask = padded_batch(64)
    for m in (mask, None):
        dec = greedy_decode(pair.hooked, ids, attention_mask=m, max_new_tokens=6)
        seq = ids
        for t in range(6):
            full = None if m is None else torch.cat([m, torch.ones_like(seq[:, ids.shape[1] :])], 1)
            pos = None if full is None else (full.cumsum(-1) - 1).clamp_min(0)
            with torch.no_grad():
                out = pair.eager(seq, attention_mask=full, position_ids=pos)
            assert torch.equal(out.logits[:, -1].argmax(-1), dec.tokens[:, t]), (m is None, t)
            seq = torch.cat([seq, dec.tokens[:, t : t + 1]], 1)
    assert all(mod.headhunt_kv is None for mod in pair.hooked.attention_modules)
    with pytest.raises(HeadhuntError) as err:
        greedy_decode(pair.hooked, ids, max_new_tokens=2, cache=object())
    assert "\n" not in str(err.value) and "returns no KV cache" in str(err.value)


def test_composite_folder_loads_its_decoder(tmp_path):
    """MusicGen's folder holds a composite (text encoder, audio codec, decoder) that
    transformers maps to the decoder's causal-LM class but cannot build it from: headhunt
    builds it from the ``decoder`` sub-config, its weights read from under ``decoder.`` in the
    checkpoint (each equal to the composite's own), and then refuses its cross-attention in
    one line; a checkpoint that lacks the decoder's weights is refused, never left random."""
    from safetensors.torch import load_file, save_file
    from transformers import MusicgenForConditionalGeneration

    from headhunt.probes.hooked import load_model
    from headhunt.probes.loading import load_hf
    from headhunt.probes.tiny import tiny_config, word_tokenizer

    torch.manual_seed(0)
    composite = MusicgenForConditionalGeneration(tiny_config("musicgen")).eval()
    composite.save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    model, _ = load_hf(str(tmp_path))
    assert type(model).__name__ == "MusicgenForCausalLM"
    own = composite.decoder.state_dict()
    loaded = model.state_dict()
    assert loaded.keys() == own.keys() and all(torch.equal(loaded[k], own[k]) for k in own)
    with pytest.raises(HeadhuntError) as err:
        load_model(str(tmp_path), device="cpu")
    assert "\n" not in str(err.value) and "cross-attention" in str(err.value)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "lm_heads" not in k},
              tmp_path / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    with pytest.raises(HeadhuntError) as err:
        load_hf(str(tmp_path))
    assert "\n" not in str(err.value) and "decoder.lm_heads.0.weight" in str(err.value)


def test_position_bias_layers_are_named_and_viewed():
    """Inkling adds a bias it builds from the hidden states to every layer's scores: the
    model's facts name those layers and the path that measures them, and one head's view (its
    own blocked statistics and exact rows) equals the eager model's attention."""
    from headhunt.probes.headview import head_view

    pair = build_pair("inkling_text")
    facts = pair.hooked.describe()
    assert facts["score_bias_layers"] == [0, 1] and "torch path" in facts["score_bias"]
    line = pair.hooked.score_bias_line()
    assert line.startswith("layers 0-1 add a bias") and "\n" not in line
    assert build_pair("llama").hooked.score_bias_line() is None
    ids = torch.randint(3, 64, (20,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        att = pair.eager(ids[None], output_attentions=True).attentions
    for layer, head in ((0, 1), (1, 3)):
        view = head_view(pair.hooked, ids, layer, head, rows=[4, 15], tokens=False)
        dense = att[layer][0, head].double().numpy()
        assert (view.argmax == dense.argmax(1)).all()
        for q in (4, 15, 19):
            assert abs(view.row(q) - dense[q]).max() < 2e-5
        assert abs(view.col_sum - dense.sum(0)).max() < 1e-4


def test_doge_top_k_keys_are_refused_in_one_line():
    """Doge's per-key bias is measured (the family's row); past ``keep_window_size`` keys its
    dynamic mask keeps only each query's top-k keys, which differ between heads and leave
    holes: refused in one line that says so."""
    with pytest.raises(HeadhuntError) as err:
        checks.check_dense_rows(build_pair("doge", keep_window_size=4))
    message = str(err.value)
    assert "\n" not in message and "keep_window_size=4" in message and "top-k" in message


def test_query_heads_that_vary_per_layer_are_refused_in_one_line():
    """Inkling keeps its sliding layers' head count in fields of its own: as released they
    equal the other layers' (the family's row); a checkpoint whose sliding layers had more
    query heads is refused when wrapped, from what the calls carry."""
    with pytest.raises(HeadhuntError) as err:
        build_pair("inkling_text", swa_num_attention_heads=8, swa_num_key_value_heads=4)
    message = str(err.value)
    assert "\n" not in message and "query heads varies per layer (layer 0 has 8" in message


def test_looped_layers_mask_one_application(zeroed):
    """Dory's tiny model runs modules 0, 1, 2, 1, 2, 3: six layers in the order it applies
    them. Masking head 1 of layer 4 (module 2's second loop) equals the eager model with that
    head's query zeroed at its 5th attention call only, and differs from masking layer 2 (the
    same module's first loop). Weight pruning, the residual stream after a layer and a forward
    with another number of loops are refused in one line."""
    from headhunt.heads.interventions.masking import mask_heads
    from headhunt.heads.interventions.pruning import prune_model

    from .conftest import padded_batch

    pair = build_pair("dory")
    hm = pair.hooked
    assert hm.n_layers == 6 and hm.attention_layers == list(range(6))
    names = [n.removeprefix("model.layers.").removesuffix(".self_attn") for n in hm.loop_modules]
    assert names == ["0", "1", "2", "1", "2", "3"]
    assert hm.describe()["looped_layers"] == hm.loop_modules
    ids, mask = padded_batch(64, seed=4)
    real = mask.bool()
    with torch.no_grad():
        with mask_heads(hm, [(4, 1)]):
            late = hm.model(ids, attention_mask=mask).logits
        with mask_heads(hm, [(2, 1)]):
            early = hm.model(ids, attention_mask=mask).logits
        with zeroed(pair.eager, [(4, 1)]):
            ref = pair.eager(ids, attention_mask=mask).logits
    torch.testing.assert_close(late[real], ref[real], atol=1e-4, rtol=1e-4)
    assert (late[real] - early[real]).abs().max() > 1e-4
    for refused in (lambda: prune_model(hm, [(4, 1)]), lambda: hm.blocks):
        with pytest.raises(HeadhuntError) as err:
            refused()
        assert "\n" not in str(err.value) and "loop" in str(err.value)
    import numpy as np

    from headhunt.heads.interventions.kvcache import KVPlan, generate_with_plan

    plan = KVPlan(full=np.ones((hm.n_layers, hm.n_kv_heads), dtype=bool), sink=1, recent=4)
    with pytest.raises(HeadhuntError) as err:
        generate_with_plan(hm, ids[1:, :8], plan, max_new_tokens=2)
    assert "\n" not in str(err.value) and "loops" in str(err.value)
    hm.model.config.n_recurrent_loops = 3
    with pytest.raises(HeadhuntError) as err:
        hm.forward(ids[:1, :4], use_cache=False)
    assert "\n" not in str(err.value) and "another number of loops" in str(err.value)


def test_dory_last_loop_cache_conforms(zeroed):
    """Dory's other cache mode: only the last loop writes the cache, the earlier loops attend
    over its cached past and their own keys; every check holds per application."""
    pair = build_pair("dory", recurrent_kv_cache_mode="last_loop")
    assert pair.hooked.n_layers == 6
    checks.check_every(pair, zeroed)


def test_a_run_on_a_biased_model_says_which_layers_take_the_torch_path(tmp_path, capsys):
    """A method run on Inkling prints, once, which layers add a bias the model builds and
    that the kernels' torch path measures them; the manifest records the same."""
    import headhunt as hh
    from headhunt.probes.hooked import HookedModel
    from headhunt.probes.tiny import tiny_causal_lm, word_tokenizer

    from .conftest import OVERRIDES

    model = tiny_causal_lm("inkling_text", **OVERRIDES["inkling_text"])
    hm = HookedModel(model=model, tokenizer=word_tokenizer(), name="inkling-tiny")
    config = {"inputs": ["random"], "n_seqs": 2, "repeat_len": 10, "bos": False}
    run = hh.run("ngram", config, model=hm, out=tmp_path / "run", progress=False)
    out = capsys.readouterr().out
    assert out.count("layers 0-1 add a bias the model builds") == 1
    assert run.manifest["model"]["score_bias_layers"] == [0, 1]


def test_causal_xlm_conforms(zeroed):
    """A causal XLM (config.causal) passes every check: its module's attention is routed and,
    as it returns no KV cache, headhunt decodes it with one of its own, one token a step."""
    pair = build_pair("xlm", causal=True)
    assert pair.hooked.attention_layers == [0, 1]
    checks.check_every(pair, zeroed)


def test_causal_xlm_decodes_with_headhunts_cache():
    """Each step's logits (not only their argmax) equal the full forward's at that position,
    padded and not; without a mask every token is real, a pad id in the prompt too (the
    reference is given an all-ones mask: XLM's forward without one guesses it by counting pad
    ids)."""
    from headhunt.probes.capture import greedy_decode

    from .conftest import padded_batch

    pair = build_pair("xlm", causal=True)
    padded, mask = padded_batch(64)
    unpadded = padded.clone()
    unpadded[:, 5] = pair.eager.config.pad_index
    for m, ids in ((mask, padded), (None, unpadded)):
        seen = []
        hook = pair.hooked.model.register_forward_hook(
            lambda _mod, _args, out, seen=seen: seen.append(out.logits[:, -1])
        )
        try:
            dec = greedy_decode(pair.hooked, ids, attention_mask=m, max_new_tokens=6)
        finally:
            hook.remove()
        seq = ids
        base = torch.ones_like(ids) if m is None else m
        for t in range(6):
            full = torch.cat([base, torch.ones_like(seq[:, ids.shape[1] :])], 1)
            pos = (full.cumsum(-1) - 1).clamp_min(0)
            with torch.no_grad():
                out = pair.eager(seq, attention_mask=full, position_ids=pos)
            torch.testing.assert_close(seen[t + 1], out.logits[:, -1], atol=1e-5, rtol=1e-5)
            assert torch.equal(out.logits[:, -1].argmax(-1), dec.tokens[:, t]), (m is None, t)
            seq = torch.cat([seq, dec.tokens[:, t : t + 1]], 1)
    assert all(mod.headhunt_kv is None for mod in pair.hooked.attention_modules)


def test_causal_xlnet_conforms(zeroed):
    """A causal XLNet (attn_type 'uni', the content stream) passes every check: its relative
    attention's position terms are a score bias of the call, and, as it returns mems, not a
    KV cache, headhunt decodes it with one of its own, one token a step (the eager reference
    runs each padded row alone: transformers' XLNet fails on a padded batch of two)."""
    pair = build_pair("xlnet", attn_type="uni")
    assert pair.hooked.attention_layers == [0, 1]
    assert pair.hooked.score_bias_layers == [0, 1]
    checks.check_every(pair, zeroed)


def test_causal_xlnet_measures_a_masked_heads_own_bias(zeroed):
    """XLNet's position term ``(q + r_r_bias) . k_r`` is made from the query: a masked head's
    bias is that of its zeroed query, so the statistics taken while a head is masked (the
    rows, the lse, the argmax key) are those of the eager model with that query zeroed, and
    the segment term of token_type_ids is in the scores too."""
    from headhunt.heads.interventions.masking import mask_heads

    from .conftest import padded_batch, vocab

    pair = build_pair("xlnet", attn_type="uni")
    hm, head = pair.hooked, checks.masked_head(pair.hooked)
    ids, mask = padded_batch(vocab(hm), seed=4)
    real = mask.bool()
    rec = checks._Calls()
    with mask_heads(hm, [head]), hm.hooks(rec):
        hm.forward(ids, attention_mask=mask, use_cache=False)
    with zeroed(pair.eager, [head]), torch.no_grad():
        ref = pair.eager(ids, attention_mask=mask, output_attentions=True).attentions
    for layer, call in rec.calls.items():
        got = call.probs().transpose(1, 2)[real]
        torch.testing.assert_close(got, ref[layer].transpose(1, 2)[real], atol=2e-5, rtol=1e-4)
    masked = rec.calls[head[0]]
    assert bool((masked.query[:, head[1]] == 0).all())
    # one segment, then two: the term is in the rows (the model alone runs with a batch of one)
    types = torch.zeros(1, ids.shape[1], dtype=torch.long)
    types[0, 12:] = 1
    for given in (torch.zeros_like(types), types):
        rec = checks._Calls()
        with hm.hooks(rec):
            hm.forward(ids[1:], token_type_ids=given, use_cache=False)
        with torch.no_grad():
            out = pair.eager.model(ids[1:], token_type_ids=given, output_attentions=True)
        for layer, call in rec.calls.items():
            torch.testing.assert_close(call.probs(), out.attentions[layer], atol=2e-5, rtol=1e-4)


def test_xlnet_inputs_it_cannot_measure_are_refused_in_one_line():
    """XLNet as released (attn_type 'bi'), the permutation LM's inputs (perm_mask,
    target_mapping: the query stream), mems, and settings that change the mask or positions
    (bi_data, same_length) are each refused in one line."""
    from headhunt.probes.hooked import HookedModel
    from headhunt.probes.tiny import tiny_causal_lm

    def refusal(**config) -> str:
        with pytest.raises(HeadhuntError) as err:
            HookedModel(model=tiny_causal_lm("xlnet", **config), tokenizer=None, name="xlnet")
        assert "\n" not in str(err.value)
        return str(err.value)

    assert "is bidirectional (attn_type 'bi'" in refusal()
    assert "bi_data" in refusal(attn_type="uni", bi_data=True)
    assert "same_length" in refusal(attn_type="uni", same_length=True)
    hm = HookedModel(model=tiny_causal_lm("xlnet", attn_type="uni"), tokenizer=None, name="xlnet")
    ids = torch.randint(3, 64, (1, 6))
    with torch.no_grad():
        mems = hm.model(ids).mems
    given = {
        "perm_mask": torch.zeros(1, 6, 6),
        "target_mapping": torch.zeros(1, 1, 6),
        "mems": mems,
    }
    for name, value in given.items():
        with pytest.raises(HeadhuntError, match=f"XLNet given {name}") as err:
            hm.forward(ids, **{name: value})
        assert "\n" not in str(err.value)


def test_cpmant_is_refused_for_what_its_mask_does(monkeypatch):
    """CPM-Ant as transformers builds it is bidirectional over its input: changing the last
    token moves the first position's logits (the model alone, no headhunt), and headhunt's
    line says so. The line is read off the model's mask, not the family's name: with the mask
    made causal (CPM-Live's ``context`` 0, planted here), the first positions do not move and
    the line names what else is not routed (its relative-position bias, its prompt tokens)."""
    from transformers.models.cpmant import modeling_cpmant

    from headhunt.probes.hooked import HookedModel
    from headhunt.probes.tiny import tiny_causal_lm

    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 9]])  # nonzero: CPM-Ant pads by token id 0

    def refusal_and_moved(released: bool) -> tuple[str, torch.Tensor]:
        torch.manual_seed(0)
        model = tiny_causal_lm("cpmant").eval()
        with torch.no_grad():
            logits = model(ids, use_cache=False).logits
            # what docs/conformance.md says of it: left padding (token id 0) changes nothing;
            # a cached step is not the full forward over the same tokens (a prefix LM's)
            padded = model(torch.cat([torch.zeros_like(ids), ids], 1), use_cache=False).logits
            cache = model(ids[:, :-1], use_cache=True).cache
            step = model(ids, cache=cache, use_cache=True).logits[:, -1]
        torch.testing.assert_close(padded[:, ids.shape[1] :], logits, atol=1e-4, rtol=1e-4)
        if released:  # the cached keys never saw the new token
            assert float((step - logits[:, -1]).abs().max()) > 0.1
        else:
            torch.testing.assert_close(step, logits[:, -1], atol=1e-4, rtol=1e-4)
        moved = (logits[0] - logits[1]).abs().amax(-1)
        with pytest.raises(HeadhuntError) as err:
            HookedModel(model=model, tokenizer=None, name="cpmant")
        assert "\n" not in str(err.value)
        return str(err.value), moved

    line, moved = refusal_and_moved(released=True)
    assert float(moved[0]) > 1e-3 * float(moved[-1]) > 0  # position 0 sees token 3
    assert "is bidirectional over its input" in line
    assert "input position 0 see the later position 1" in line

    made_for = modeling_cpmant.CpmAntModel._prepare_attention_mask

    def causal_context(self, input_ids, span, context, length):
        return made_for(self, input_ids, span, torch.zeros_like(context), length)

    monkeypatch.setattr(modeling_cpmant.CpmAntModel, "_prepare_attention_mask", causal_context)
    line, moved = refusal_and_moved(released=False)
    assert float(moved[:-1].max()) == 0 < float(moved[-1])
    assert "bidirectional" not in line
    assert "relative-position bias" in line and "prompt tokens" in line
