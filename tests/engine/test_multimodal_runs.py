"""Methods run on a multimodal model's text tower (its top-level config has no text fields)."""

import headhunt as hh
from headhunt.heads.configs import NgramConfig
from headhunt.probes.hooked import HookedModel
from headhunt.probes.tiny import tiny_causal_lm, word_tokenizer


def test_ngram_runs_on_a_multimodal_model(tmp_path):
    tok = word_tokenizer()
    model = HookedModel(
        model=tiny_causal_lm("gemma3", vocab_size=len(tok)), tokenizer=tok, name="tiny-gemma3"
    )
    assert not hasattr(model.model.config, "vocab_size")  # only the text tower has one
    assert model.vocab_size == len(tok)
    config = NgramConfig(inputs=["random"], n_seqs=2, repeat_len=8, k_max=2)
    run = hh.run("ngram", config, model=model, out=tmp_path / "run")
    scores = run.scores()
    assert scores.matrix(scores.metrics[0]).shape == (model.n_layers, model.n_heads)
