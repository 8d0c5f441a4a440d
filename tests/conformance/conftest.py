"""Helpers of the conformance suite: a tiny model of a family next to its own eager copy, a
left-padded batch that runs past the sliding window / attention chunk, and the model's eager
attention with chosen heads' queries zeroed (the reference for head masking)."""

from __future__ import annotations

import copy
import signal
import sys
from dataclasses import dataclass

import pytest
import torch

BATCH, LENGTH, PAD = 2, 20, 5  # row 0 is left-padded by PAD tokens; window / chunk = 8
MASKED_HEAD = (1, 1)  # (layer, query head) zeroed by the masking check
REFERENCE = "conformance_eager_qmask"
_ZEROED: dict[int, list[int]] = {}  # layer -> query heads whose queries the reference zeroes


# Config fields some families need beyond the tiny shape of ``tiny_config`` (test fixtures,
# never read by headhunt): values their released checkpoints set and the class defaults lack.
_MAMBA = {"mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16, "mamba_chunk_size": 16}

OVERRIDES: dict[str, dict] = {
    # its RoPE is per layer type, with NoPE layers allowed (the class default, one RoPE for
    # all-full layers, does not build): sliding layers with RoPE, full ones without, as Cohere 2
    "cohere_compass_text": {
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": None,
        },
    },
    # DBRX's attention sub-config carries its RoPE base and QKV clipping (8 when released)
    "dbrx": {
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 96, "moe_top_k": 2},
    },
    "dots1": {"n_shared_experts": 1},  # no default (None) for its shared experts
    # byte-latent: small hash embeddings and global width (the defaults are 500k x 2048)
    "blt": {
        "encoder_hash_byte_group_vocab": 64,
        "encoder_config": {"hidden_size_global": 64},
        "decoder_config": {"hidden_size_global": 64},
    },
    # a vision MoE with two layers instead of 42 (its pyramid of experts is per layer)
    "dots3_note": {
        "vision_config": {
            "pyramid_num_routed": [-1, 4],
            "adapter_in_dim": 64,
            "adapter_out_dim": 64,
        },
        "audio_config": {"adapter_input_size": 64, "adapter_out_dim": 64},
    },
    # the last layers of each kind reuse the KV cache of the layer of that kind before them
    "gemma3n_text": {
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "num_kv_shared_layers": 2,
        "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0],
        "vocab_size_per_layer_input": 64,
        "hidden_size_per_layer_input": 16,
        "laurel_rank": 8,
    },
    # a drafter: every layer reads the KV cache of the model it drafts for
    "gemma4_assistant": {
        "backbone_hidden_size": 64,
        "num_centroids": 8,
        "centroid_intermediate_top_k": 2,
        "text_config": {
            "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 0,
            "enable_moe_block": False,
            "use_double_wide_mlp": False,
        },
    },
    # Gemma 4: per-layer head sizes (16 in sliding layers, 512 in full ones, the class
    # default), and the last two layers reusing the KV cache of the first two, as its small
    # released models do; per-layer embeddings sized to the tiny vocabulary (not 262144 x 512)
    "gemma4_text": {
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "num_kv_shared_layers": 2,
        "vocab_size_per_layer_input": 64,
        "hidden_size_per_layer_input": 16,
    },
    # one global, one local (windowed) layer
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "window_size": 8},
    # released LFM2 checkpoints mix short-convolution layers with attention layers
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # hybrids whose class defaults give two tiny layers no attention layer: a state-space
    # (Mamba) layer, then an attention layer, as their released models interleave them
    # (with a Mamba mixer of 4 heads, a state of 16 and chunks of 16, not 128 x 256 x 256:
    # the mixer's PyTorch fallback on a CPU is slow at the class defaults)
    "nemotron_h": {
        "layer_types": ["linear_attention", "full_attention"],
        **{"mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 1},
        "chunk_size": 16,
    },
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"], **_MAMBA},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    # attention and a Mamba mixer in parallel in every layer; the same small mixer
    "falcon_h1": {**_MAMBA, "mamba_d_ssm": 128},
    "bamba": {"attn_layer_indices": [1], **_MAMBA},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"], "attention_window_size": 8},
    # four experts, not 256 / 512 (the tiny shape's expert count is not this field here); a
    # linear-attention layer of 4 heads of 16, not 32 of 128
    "kimi_linear": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "linear_num_heads": 4,
        "linear_head_dim": 16,
    },
    "bailing_hybrid": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "head_dim": 16,
        "layer_group_size": 2,  # one linear-attention layer, then one softmax attention layer
    },
    "mamba2": {"expand": 1, "n_groups": 1},  # width x expand = heads x head size
    # a cross-attention layer (to the image) next to a self-attention layer
    "mllama": {"text_config": {"cross_attention_layers": [1]}},
    # the indexed (sparse) attention needs its indexer; the other layer is linear attention
    "qwen4_exp_text": {
        "indexer_n_heads": 4,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 8,
        "indexer_compress_ratio": 4,
        "hc_lowrank": 16,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
    },
    # a causal LM only as a decoder; axial positions that fit 256 positions and width 64
    "reformer": {
        "is_decoder": True,
        "attn_layers": ["local", "lsh"],
        "axial_pos_shape": [16, 16],
        "axial_pos_embds_dim": [32, 32],
    },
    # two MLA attentions per decoder layer, each its own cache layer (the model's layer
    # indices 2i, 2i + 1); its rotary size is head_dim, which must be the rope part's
    "longcat_flash": {
        "head_dim": 8,
        "zero_expert_num": 4,
        "expert_ffn_hidden_size": 32,
        "moe_topk": 2,
    },
    # the tiny shape's initializer range (0.2) under XGLM's name: at its default 0.02 every
    # attention row is near uniform and masking a head moves the logits by under 1e-4
    "xglm": {"init_std": 0.2},
    "xmod": {"default_language": "en_XX"},  # its forward needs a language adapter chosen
    "zaya": {"num_experts_per_tok": 1},  # the only routing it supports
    # one attention block (its weights shared) applied at two depths, each application a
    # module of its own that the forward tells its layer, as Zamba's released models do
    "zamba": {
        "num_hidden_layers": 4,
        "layers_block_type": ["linear_attention", "hybrid"] * 2,
        "layer_types": ["linear_attention", "hybrid"] * 2,
    },
    # Zamba2: the same, with per-application LoRA adapters on q, k, v and rotary positions in
    # the shared block (Zamba2-1.2B's settings: its adapters, full-width, need as many key
    # heads as query heads), and a small Mamba-2 mixer
    "zamba2": {
        "num_key_value_heads": 4,
        "num_hidden_layers": 4,
        "layers_block_type": ["linear_attention", "hybrid"] * 2,
        "layer_types": ["linear_attention", "hybrid"] * 2,
        "use_shared_attention_adapter": True,
        "adapter_rank": 8,
        "use_mem_rope": True,
        "n_mamba_heads": 4,
        "mamba_d_state": 16,
        "chunk_size": 16,
    },
}
# Inkling's sliding layers take their shape from swa_* fields: as released (Inkling: twice
# the key heads in the sliding layers; Inkling 2 and its loop: the same shape), at the tiny
# size; a window of 8 and a relative-position bias that ends 12 tokens back, so the 20-token
# rows see both ends of the bias
OVERRIDES["inkling_text"] = {
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 4,
    "swa_head_dim": 16,
    "sliding_window_size": 8,
    "rel_extent": 12,
}
# (Inkling 2's LM head scores `unpadded_vocab_size` tokens: the tiny vocabulary's 64, as
# released checkpoints score their own vocabulary, not the class default's 200058)
for _family in ("inkling2_text", "inkling2_loop_text"):
    OVERRIDES[_family] = {
        **OVERRIDES["inkling_text"],
        "swa_num_key_value_heads": 2,
        "unpadded_vocab_size": 64,
    }
# Inkling 2 Loop reapplies a middle section of its layers (6-17 of its released config, 3
# passes): here layer 1 of 3, twice, so the tiny model loops as the released one does
OVERRIDES["inkling2_loop_text"] |= {
    "num_hidden_layers": 3,
    "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding"],
    "n_layers_per_attn_res_block": 1,
    "loop_layer_index_start": 1,
    "loop_layer_index_end": 2,
    "loop_num_passes": 2,
}
# Dory runs a middle section of its layers in recurrent loops (2 loops as released): here
# layers 1-2 of 4, so its 4 modules make 6 layers (input 0, loop 1-2, loop 1-2, output 3)
OVERRIDES["dory"] = {
    "num_hidden_layers": 4,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "n_input_layers": 1,
    "n_recurrent_layers": 2,
    "n_output_layers": 1,
    "n_recurrent_loops": 2,
}
OVERRIDES["qwen4_exp"] = {"text_config": OVERRIDES["qwen4_exp_text"]}
for _family in ("gemma4", "gemma4_unified"):
    OVERRIDES[_family] = {"text_config": OVERRIDES["gemma4_text"]}
OVERRIDES["gemma4_unified_text"] = OVERRIDES["gemma4_text"]


def _unit_key_scale(model: torch.nn.Module) -> None:
    """ZAYA initialises its learned per-head key scale to 0: every key is then zero and
    attention uniform, so masking a head's query could change nothing. Trained checkpoints
    have learned scales; 1 stands in for them."""
    for name, param in model.named_parameters():
        if name.endswith("qk_norm.temp"):
            param.data.fill_(1.0)


def _trained_query_scale(model: torch.nn.Module) -> None:
    """Gemma 4 scales no score (scaling 1): its query norm's learned weight sets the logits'
    size. Initialised to 1, a 512-wide global head's logits spread by ~sqrt(512), so eager's
    float32 softmax underflows to exactly 0 on visible keys and the pattern checks could not
    tell a visible key from a masked one. A scale of 2 / sqrt(head size) stands in for the
    learned one (logits of a few units, as trained models have)."""
    for name, module in model.named_modules():
        if name.endswith("self_attn.q_norm"):
            module.weight.data.fill_(2 / module.weight.numel() ** 0.5)


def _smaller_queries(model: torch.nn.Module) -> None:
    """RemBERT's random init gives attention logits so spread that eager's float32 softmax
    underflows to exactly 0 on some visible keys, and the statistics check (which keys a query
    sees, read off eager's pattern) could not tell them from masked ones. Queries scaled by
    0.1 keep every visible key's probability above 0."""
    for name, module in model.named_modules():
        if name.endswith("attention.self"):
            module.query.weight.data.mul_(0.1)
            module.query.bias.data.mul_(0.1)


def _learned_key_scores(model: torch.nn.Module) -> None:
    """Doge's dynamic mask adds ``exp(A * softplus(dt_proj(v)))`` to every score of a key:
    with ``A`` initialised to 0 that is 1 for every key, which no softmax can see. Values of
    ``A`` as a trained model has (a few tenths, of either sign per key head) make the bias
    differ between keys, so the checks see it."""
    for name, module in model.named_modules():
        if name.endswith("self_attn") and hasattr(module, "A"):
            n = module.A.numel()
            module.A.data.copy_(torch.linspace(-0.8, 0.6, n))


# Weights some families initialise to a degenerate value (after the seeded random init).
AFTER_INIT = {"zaya": _unit_key_scale, "rembert": _smaller_queries, "doge": _learned_key_scores}
for _family in ("gemma4", "gemma4_assistant", "gemma4_text", "gemma4_unified"):
    AFTER_INIT[_family] = _trained_query_scale
AFTER_INIT["gemma4_unified_text"] = AFTER_INIT["gemma4_unified_assistant"] = _trained_query_scale


@dataclass
class Pair:
    hooked: object  # HookedModel (headhunt's attention, the model's SDPA/eager kernel)
    eager: torch.nn.Module  # the same weights, transformers' eager attention, no headhunt


def build_pair(family: str, **extra) -> Pair:
    """The family's tiny model wrapped by headhunt, and an untouched eager copy (``extra``:
    config fields set on top of the family's overrides, for a variant of the family)."""
    from headhunt.probes.hooked import HookedModel
    from headhunt.probes.tiny import tiny_causal_lm

    overrides = copy.deepcopy({**OVERRIDES.get(family, {}), **extra})
    with time_limit(60, family):
        try:
            model = tiny_causal_lm(family, **overrides)
        except TimeoutError:
            raise
        except Exception:  # transformers cannot build it here (e.g. a package is missing)
            _load_without_weights(family, overrides)  # what a user gets: load_model refuses
            raise
        AFTER_INIT.get(family, lambda _: None)(model)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    if eager.config._attn_implementation != "eager":  # a model that picks its kernel when built
        eager = _rebuilt_eager(model)
    _layer_from_forward(eager)
    if type(model).__name__ == "XLNetLMHeadModel":
        eager = OneRowAtATime(eager)
    hooked = HookedModel(model=model, tokenizer=None, name=family)
    if hooked.loop_modules is not None:
        _layer_from_application(eager)
    return Pair(hooked, eager)


class OneRowAtATime(torch.nn.Module):
    """The eager reference of a model that fails on a padded batch of several rows: each row
    alone, with its own mask. transformers' XLNet built causal adds its padding mask to its
    causal mask in place (``attn_mask += data_mask``), which cannot broadcast over a batch of
    more than one row; a single padded row runs."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    @property
    def config(self):
        return self.model.config

    def forward(self, input_ids, attention_mask=None, output_attentions=False, position_ids=None):
        from types import SimpleNamespace

        rows = [
            self.model(
                input_ids[i : i + 1],
                attention_mask=None if attention_mask is None else attention_mask[i : i + 1],
                output_attentions=output_attentions,
            )
            for i in range(input_ids.shape[0])
        ]
        attentions = None
        if output_attentions:
            attentions = tuple(
                torch.cat(layer) for layer in zip(*(r.attentions for r in rows), strict=True)
            )
        return SimpleNamespace(logits=torch.cat([r.logits for r in rows]), attentions=attentions)


def _layer_from_application(model: torch.nn.Module) -> None:
    """A looped model's modules run at several depths of one forward (Dory, HRM-Text): the
    masking reference zeroes the head of the i-th attention application of the forward, the
    layer headhunt says it is (counted here on the eager model, apart from headhunt)."""
    count = [0]

    def restart(_mod, _args):
        count[0] = 0

    def told(module, _args):
        module.conformance_layer = count[0]
        count[0] += 1

    model.register_forward_pre_hook(restart)
    for module in model.modules():
        if type(module).__name__.endswith("Attention") and hasattr(module, "layer_idx"):
            module.register_forward_pre_hook(told)


def _layer_from_forward(model: torch.nn.Module) -> None:
    """Attention modules with no layer index of their own (Zamba's shared block, applied at
    several depths) learn it at each call from the ``layer_idx`` their forward is given, so
    the masking reference zeroes the head of the layer the model says it is running."""

    def told(module, args, kwargs):
        module.layer_idx = kwargs.get("layer_idx", args[1] if len(args) > 1 else None)

    for module in model.modules():
        idx = getattr(module, "layer_idx", 0)
        if type(module).__name__.endswith("Attention") and (idx is None or idx == -1):
            module.register_forward_pre_hook(told, with_kwargs=True)


def _rebuilt_eager(model: torch.nn.Module) -> torch.nn.Module:
    """The same weights in a model built with eager attention (Falcon chooses its kernel when
    it is built and ignores a later switch)."""
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_config(
        copy.deepcopy(model.config), dtype=torch.float32, attn_implementation="eager"
    )
    eager.load_state_dict(model.state_dict())
    return eager.eval()


def _load_without_weights(family: str, overrides: dict) -> None:
    """``load_model`` on a folder with the family's tiny config, a tokenizer and an empty
    weights file: transformers builds the model before it reads any weight, so this meets
    the same failure a folder with real weights would."""
    import tempfile

    from safetensors.torch import save_file

    from headhunt.probes.hooked import load_model
    from headhunt.probes.tiny import tiny_config, word_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        tiny_config(family, **overrides).save_pretrained(folder)
        word_tokenizer().save_pretrained(folder)
        save_file({}, f"{folder}/model.safetensors", metadata={"format": "pt"})
        load_model(folder, device="cpu")


class time_limit:
    """Fail instead of hanging (some families' defaults build very large towers)."""

    def __init__(self, seconds: int, what: str):
        self.seconds, self.what = seconds, what

    def __enter__(self):
        def fail(*_):
            raise TimeoutError(f"building {self.what} took over {self.seconds} s")

        self.old = signal.signal(signal.SIGALRM, fail)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)


def vocab(hooked) -> int:
    """The text vocabulary of a hooked model (a multimodal model's is its text tower's)."""
    return hooked.model.config.get_text_config(decoder=True).vocab_size


def padded_batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [BATCH, LENGTH] (avoiding the pad/bos/eos ids 0-2) and their mask, row 0
    left-padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (BATCH, LENGTH), generator=g)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[0, :PAD] = 0
    ids[0, :PAD] = 0
    return ids, mask


def _reference_attention(module, query, key, value, attention_mask, **kwargs):
    """The model's own eager attention, with the queries of ``_ZEROED`` heads set to zero."""
    layer = getattr(module, "conformance_layer", getattr(module, "layer_idx", None))
    heads = _ZEROED.get(layer)  # (attention over depth: none)
    if heads:
        query = query.clone()
        query[:, heads] = 0
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key, value, attention_mask, **kwargs)


@pytest.fixture(scope="session")
def zeroed():
    """A context manager (eager model, heads) that zeroes those heads' queries."""
    return zeroed_query_reference()


def _query_slice(module) -> tuple[torch.nn.Module, callable] | None:
    """For an attention module that computes attention in its own code (no AttentionInterface),
    its query projection and where head h's query sits in that projection's output."""
    name = type(module).__name__
    d = getattr(module, "head_dim", None) or getattr(module, "head_size", None)
    d = d or getattr(module, "attention_head_size", None)
    if name == "Attention" and hasattr(module, "c_attn"):  # GPT-1's c_attn: [.., 3 * dim]
        d = module.split_size // module.n_head
        return module.c_attn, lambda h: slice(h * d, (h + 1) * d)
    if name in ("GPTNeoSelfAttention", "XGLMAttention"):  # q_proj: [.., heads * d]
        return module.q_proj, lambda h: slice(h * d, (h + 1) * d)
    if name in (
        "GitSelfAttention",
        "MegatronBertSelfAttention",
        "RemBertSelfAttention",
        "RoFormerSelfAttention",
        "BigBirdSelfAttention",
    ):
        return module.query, lambda h: slice(h * d, (h + 1) * d)  # query: [.., heads * d]
    if name == "MultiHeadAttention" and hasattr(module, "q_lin"):  # XLM's q_lin: [.., heads * d]
        return module.q_lin, lambda h: slice(h * d, (h + 1) * d)
    if name == "MptAttention":  # Wqkv: [.., 3 * heads * d], queries first
        return module.Wqkv, lambda h: slice(h * d, (h + 1) * d)
    if name in ("BloomAttention", "GPTNeoXJapaneseAttention"):  # [.., heads, 3, d], q first
        return module.query_key_value, lambda h: slice(3 * h * d, 3 * h * d + d)
    if name == "FalconAttention" and module.multi_query and not module.new_decoder_architecture:
        return module.query_key_value, lambda h: slice(h * d, (h + 1) * d)  # [.., heads + 2, d]
    return None


class _ZeroedWeight:
    """Some heads' slices of a query weight set to 0 until removed (XLNet's ``q`` parameter,
    [d_model, heads, d]: its query is an einsum with it, no projection module to hook)."""

    def __init__(self, weight: torch.nn.Parameter, heads: list[int]):
        self.weight, self.saved = weight, weight.data.clone()
        weight.data[:, heads] = 0

    def remove(self) -> None:
        self.weight.data.copy_(self.saved)


def _zero_module_queries(model, heads: list[tuple[int, int]]) -> list:
    """Forward hooks that zero the queries of ``heads`` in modules captured through their own
    code (the reference :func:`_reference_attention` cannot reach)."""
    handles = []
    block_of = {  # a module with no layer index of its own (GPT-1's) is its block's
        id(sub): i
        for blocks in model.modules()
        if isinstance(blocks, torch.nn.ModuleList)
        for i, block in enumerate(blocks)
        for sub in block.modules()
    }
    for module in model.modules():
        found = _query_slice(module)
        layer = getattr(module, "layer_idx", getattr(module, "layer_id", None))
        layer = block_of.get(id(module)) if layer is None else layer
        if type(module).__name__ == "XLNetRelativeAttention":
            own = [h for lay, h in heads if lay == layer]
            if own:
                handles.append(_ZeroedWeight(module.q, own))
            continue
        if found is None:
            continue
        proj, where = found
        parts = [where(h) for lay, h in heads if lay == layer]

        def zero(_mod, _args, out, parts=parts):
            out = out.clone()
            for part in parts:
                out[..., part] = 0
            return out

        if parts:
            handles.append(proj.register_forward_hook(zero))
    return handles


def zeroed_query_reference():
    """Register the masking reference; return a context manager (eager model, heads)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(REFERENCE, _reference_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(REFERENCE, eager_mask)

    class zeroed:
        def __init__(self, model, heads: list[tuple[int, int]]):
            self.model, self.heads = model, heads

        def __enter__(self):
            for layer, head in self.heads:
                _ZEROED.setdefault(layer, []).append(head)
            self.handles = _zero_module_queries(self.model, self.heads)
            if not self.handles:
                self.model.set_attn_implementation(REFERENCE)

        def __exit__(self, *exc):
            _ZEROED.clear()
            for handle in self.handles:
                handle.remove()
            if not self.handles:
                self.model.set_attn_implementation("eager")

    return zeroed
