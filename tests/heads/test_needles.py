"""Needle placement (issue 18.12): a haystack whose sentences end in CJK marks, or that has only
line breaks, still puts each needle at its requested depth; one with no boundary at all is
refused in one line instead of putting every needle at depth 0."""

from __future__ import annotations

import random

import pytest

from headhunt.errors import HeadhuntError
from headhunt.heads.inputs.needles import NEEDLES, TrialBuilder

CHINESE = "今天的天气很好，我们去公园散步。小猫在树下睡觉。老师在教室里讲故事！你明天会来吗？"
SHIFT = 0.5  # needles.MAX_SENTENCE_SHIFT (literal, so the test also runs on older code)
PLAIN = "the river runs past the old mill and the bread is warm on the table by the lamp"


def byte_bpe(corpus: str):
    """A small byte-level BPE tokenizer trained on ``corpus`` (as GPT-2-style tokenizers are:
    a frequent CJK mark becomes one token), wrapped as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([corpus] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def placements(builder: TrialBuilder, depths, length: int = 400) -> dict[float, float]:
    """Requested depth -> where the needle's answer landed, as a share of the haystack part."""
    out = {}
    for depth in depths:
        trial = builder.build(length, depth, NEEDLES["passkey"], random.Random(1), f"d{depth}")
        # The same draw as build's: the frame around the haystack of this trial.
        _, question, lead, _ = NEEDLES["passkey"].draw(random.Random(1))
        before, after = builder.frame(question, lead)
        hay_and_needle = length - len(before) - len(after)
        out[depth] = (trial.span[0] - len(before)) / hay_and_needle
    return out


@pytest.mark.parametrize(
    "haystack",
    [CHINESE * 40, "\n".join([PLAIN] * 200)],
    ids=["chinese-full-stops", "lines-without-full-stops"],
)
def test_needles_follow_the_requested_depth_without_latin_full_stops(haystack):
    tok = byte_bpe(haystack + " The secret passkey for the blue vault is 123456. Question")
    builder = TrialBuilder(tok, haystack, chat=False)
    got = placements(builder, [0.0, 0.25, 0.5, 0.75, 1.0])
    assert got[0.0] < 0.05
    for depth in (0.25, 0.5, 0.75, 1.0):
        # Placed after the boundary before the depth: behind it by less than the allowed shift,
        # and never ahead of it (shares of the prompt's haystack part, needle included).
        assert depth - SHIFT < got[depth] <= depth + 0.05, got
    assert got[0.25] < got[0.5] < got[0.75], got


def test_a_haystack_without_any_boundary_is_refused():
    haystack = " ".join([PLAIN] * 200)
    tok = byte_bpe(haystack + " The secret passkey for the blue vault is 123456.")
    with pytest.raises(HeadhuntError, match="no sentence ends"):
        TrialBuilder(tok, haystack, chat=False)


def test_sentences_longer_than_the_allowed_shift_are_refused():
    # One sentence end per 400 words: at 400 tokens a 50% depth has no boundary near it.
    haystack = " ".join([PLAIN] * 25) + ". "
    tok = byte_bpe(haystack * 3 + " The secret passkey for the blue vault is 123456.")
    builder = TrialBuilder(tok, haystack * 3, chat=False)
    with pytest.raises(HeadhuntError, match="no sentence end within"):
        builder.build(400, 0.9, NEEDLES["passkey"], random.Random(0), "t")
