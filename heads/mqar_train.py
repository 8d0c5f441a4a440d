"""A tiny attention-only transformer trained on MQAR on a CPU: planted ground truth for recall.

The model is a Hugging Face Llama (RoPE, RMSNorm, no MLP: each layer's MLP is replaced by a
module that returns zeros) wrapped as a :class:`~headhunt.probes.hooked.HookedModel`, so the
same analyzers (n-gram scores, recall heads, masking) run on it unchanged. It is trained on
fresh MQAR batches from :func:`headhunt.heads.mqar.generate_mqar`, loss on the query positions
only, until a held-out batch reaches ``target_accuracy``.

Which circuit it learns depends on the vocabulary, which we measured:

- With Zoology's disjoint key and value halves, layer-0 heads can tell a key from a value by its
  id; the models we trained (2 layers, 2 or 4 heads, 3 seeds) all learned a *shifted* circuit:
  at each key position layer 0 gathers the previous pair (value 1 back, key 2 back) and the
  layer-1 heads attend from a query to the position *after* its value.
- With keys and values from one shared vocabulary (``shared_vocab``, the default here) ids say
  nothing about roles, and the textbook circuit forms: previous-token heads in layer 0 write
  each key into its value's position, induction heads in layer 1 attend from the query to that
  value and copy it. The default 3-layer, 2-head model has both heads of layer 0 as
  previous-token heads, both of layer 1 as induction heads, and a layer 2 that recall does not
  need: the ground truth of the planted test.

Saved as ``model.safetensors`` + ``config.json`` (~270 KB); :func:`load_mqar_model` reads it
back.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor, nn

from headhunt.errors import HeadhuntError
from headhunt.heads.inputs.mqar_inputs import MQARBatch, MQARSpec, generate_mqar
from headhunt.probes.hooked import HookedModel


@dataclass
class MQARTrainConfig:
    """Model and training options.

    Attributes:
        vocab_size, seq_len, n_pairs, power_a: the MQAR task (Zoology's generator).
        shared_vocab: keys and values drawn from one vocabulary (see the module docstring:
            with Zoology's disjoint halves the model learns a shifted circuit instead).
        d_model, n_layers, n_heads: the model (head_dim = d_model / n_heads, no GQA).
        steps, batch_size, lr, weight_decay, warmup: AdamW with linear warmup, cosine decay.
        seed: seeds the initialisation and the data.
        target_accuracy: stop early once a held-out batch reaches it (checked every 100 steps).
        family: "llama" (attention only, no MLP: the planted default), or another transformers
            family built from its config class with its own MLPs: "lfm2" (``layer_types`` of
            "conv" / "full_attention": gated short convolutions, attention, or a hybrid) or
            "mamba2" (attention-free state-space layers), Zoology's comparison.
        layer_types: each layer's kind for a hybrid family (its length sets the depth).
    """

    vocab_size: int = 128
    seq_len: int = 64
    n_pairs: int = 8
    power_a: float = 0.01
    shared_vocab: bool = True
    d_model: int = 64
    n_layers: int = 3
    n_heads: int = 2
    steps: int = 2000
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup: int = 100
    seed: int = 0
    target_accuracy: float = 0.99
    family: str = "llama"
    layer_types: tuple[str, ...] | None = None

    def spec(self) -> MQARSpec:
        return MQARSpec(
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            n_pairs=self.n_pairs,
            power_a=self.power_a,
            shared_vocab=self.shared_vocab,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MQARTrainConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class NoMLP(nn.Module):
    """Stands in for a layer's MLP: contributes nothing, so the model is attention-only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


def mqar_tokenizer(vocab_size: int, shared_vocab: bool = False):
    """A word-level tokenizer naming the MQAR ids: ``_`` (0, filler), then ``k1..`` and ``v..``
    (Zoology's key and value halves), or ``t1..`` when keys and values share the vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    half = vocab_size // 2
    if shared_vocab:
        names = ["_"] + [f"t{i}" for i in range(1, vocab_size)]
    else:
        names = ["_"] + [f"k{i}" for i in range(1, half)]
        names += [f"v{i}" for i in range(half, vocab_size)]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(names)}, unk_token="_"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # No BOS: Zoology's sequences have none. "_" doubles as unk, so it is the one special id.
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="_")


def build_family_model(cfg: MQARTrainConfig):
    """An untrained model of ``cfg.family`` (lfm2, mamba2, ...) at ``cfg``'s width: 4x MLPs,
    as many query as KV heads; a Mamba2 layer has heads of 16 channels over twice the width."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    layers = list(cfg.layer_types) if cfg.layer_types else None
    n_layers = len(layers) if layers else cfg.n_layers
    kw: dict[str, Any] = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": n_layers,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    if cfg.family == "mamba2":
        kw.update(expand=2, head_dim=16, num_heads=2 * cfg.d_model // 16, n_groups=1)
        kw.update(state_size=64, chunk_size=64)
    else:
        kw.update(num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads)
        kw.update(intermediate_size=4 * cfg.d_model, max_position_embeddings=max(512, cfg.seq_len))
        if layers:
            kw["layer_types"] = layers
    if cfg.family not in CONFIG_MAPPING:
        raise HeadhuntError(f"transformers has no model family {cfg.family!r}")
    hf_cfg = CONFIG_MAPPING[cfg.family](**kw)
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
    model.config.architectures = [type(model).__name__]
    return model


def build_model(cfg: MQARTrainConfig):
    """The untrained attention-only Llama (a Hugging Face model, not yet wrapped), or a model
    of another family (:func:`build_family_model`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if cfg.family != "llama":
        return build_family_model(cfg)

    if cfg.d_model % cfg.n_heads:
        raise HeadhuntError(f"d_model {cfg.d_model} is not a multiple of n_heads {cfg.n_heads}")
    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=4,  # unused: the MLPs are replaced
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_heads,
        max_position_embeddings=max(512, cfg.seq_len),
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(hf_cfg)
    for layer in model.model.layers:
        layer.mlp = NoMLP()
    model.config.architectures = ["LlamaForCausalLM"]
    return model


@dataclass
class MQARPool:
    """MQAR examples of several pair counts in one set, queries padded to the largest count, so
    that one training step draws one mixed batch (Zoology's mixture of train configs, e.g.
    HazyResearch/zoology ``zoology/experiments/paper_configs/arxiv24_based_figure2/configs.py``).

    Attributes:
        ids: [m, n] input tokens.
        query_pos: [m, q] query positions, padded with 0.
        target: [m, q] the value at each query, -100 in the padding (ignored by the loss).
        n_pairs: [m] each example's pair count.
    """

    ids: Int[Tensor, "m n"]
    query_pos: Int[Tensor, "m q"]
    target: Int[Tensor, "m q"]
    n_pairs: Int[Tensor, " m"]

    def __len__(self) -> int:
        return self.ids.shape[0]

    def to(self, device: torch.device | str) -> MQARPool:
        return MQARPool(
            *(t.to(device) for t in (self.ids, self.query_pos, self.target, self.n_pairs))
        )

    def batch(self, index: Int[Tensor, " b"]) -> tuple[Tensor, Tensor, Tensor]:
        """``(ids, query_pos, target)`` of the examples at ``index`` (on the pool's device:
        no host round trip)."""
        return self.ids[index], self.query_pos[index], self.target[index]


def mqar_pool(batches: list[MQARBatch]) -> MQARPool:
    """One :class:`MQARPool` of ``batches`` (one per pair count, same sequence length)."""
    if len({b.ids.shape[1] for b in batches}) != 1:
        raise HeadhuntError("an MQAR pool needs one sequence length")
    width = max(b.query_pos.shape[1] for b in batches)

    def pad(t: Tensor, value: int) -> Tensor:
        return nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    return MQARPool(
        ids=torch.cat([b.ids for b in batches]),
        query_pos=torch.cat([pad(b.query_pos, 0) for b in batches]),
        target=torch.cat([pad(b.target, -100) for b in batches]),
        n_pairs=torch.cat([torch.full((len(b),), b.query_pos.shape[1]) for b in batches]),
    )


def query_logits(model, ids: Int[Tensor, "b n"], query_pos: Int[Tensor, "b q"]) -> Tensor:
    """[b, q, vocab] logits at the query positions only: the logits of every position
    ([b, n, vocab], vocab 8192 in Zoology) would cost more than the rest of a small model."""
    hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
    picked = hidden.gather(1, query_pos[..., None].expand(-1, -1, hidden.shape[-1]))
    return model.get_output_embeddings()(picked)


def query_loss(model, ids: Tensor, query_pos: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy at the query positions (targets of -100 are padding), as Zoology's loss on
    the labelled positions only."""
    logits = query_logits(model, ids, query_pos)
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())


def query_accuracy(model, batch: MQARBatch, batch_size: int = 256) -> float:
    """Fraction of ``batch``'s queries whose argmax over the whole vocabulary is the value."""
    device = next(model.parameters()).device
    hits = []
    with torch.no_grad():
        for s in range(0, len(batch), batch_size):
            qp = batch.query_pos[s : s + batch_size].to(device)
            logits = query_logits(model, batch.ids[s : s + batch_size].to(device), qp)
            hits.append((logits.argmax(-1).cpu() == batch.target[s : s + batch_size]).float())
    return float(torch.cat(hits).mean())


def _accuracy(model, batch) -> float:
    with torch.no_grad():
        logits = model(input_ids=batch.ids).logits
    pred = logits.gather(1, batch.query_pos[..., None].expand(-1, -1, logits.shape[-1])).argmax(-1)
    return float((pred == batch.target).float().mean())


def train_mqar_model(
    cfg: MQARTrainConfig | None = None, *, progress: bool = False
) -> tuple[HookedModel, dict[str, Any]]:
    """Train the model on fresh MQAR batches; returns it wrapped, and a training log
    (steps run, seconds, final held-out accuracy, loss curve every 100 steps)."""
    from tqdm.auto import tqdm

    cfg = cfg or MQARTrainConfig()
    spec = cfg.spec()
    model = build_model(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return 0.5 * (1 + torch.cos(torch.tensor(frac * torch.pi)).item())

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    held_out = generate_mqar(spec, 256, seed=10_000_000 + cfg.seed)
    log: dict[str, Any] = {"loss": [], "accuracy": []}
    t0 = time.perf_counter()
    step = 0
    bar = tqdm(total=cfg.steps, desc="train mqar", disable=not progress)
    for step in range(1, cfg.steps + 1):
        batch = generate_mqar(spec, cfg.batch_size, seed=cfg.seed * 1_000_003 + step)
        logits = model(input_ids=batch.ids).logits
        mask = batch.labels != -100
        loss = nn.functional.cross_entropy(logits[mask], batch.labels[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.update(1)
        if step % 100 == 0:
            model.eval()
            acc = _accuracy(model, held_out)
            model.train()
            log["loss"].append(round(loss.item(), 4))
            log["accuracy"].append(round(acc, 4))
            bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.3f}")
            if acc >= cfg.target_accuracy:
                break
    bar.close()
    model.eval()
    log.update(
        steps=step,
        seconds=round(time.perf_counter() - t0, 1),
        accuracy=log["accuracy"],
        final_accuracy=_accuracy(model, held_out),
    )
    return _wrap(model, cfg), log


def _wrap(model, cfg: MQARTrainConfig) -> HookedModel:
    return HookedModel(model=model, tokenizer=mqar_tokenizer(cfg.vocab_size), name="mqar-attn-only")


def save_mqar_model(model: HookedModel, cfg: MQARTrainConfig, folder: str | Path, **info) -> Path:
    """Write ``model.safetensors`` and ``config.json`` (the training config + ``info``)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(
        json.dumps({"train": cfg.to_dict(), **info}, indent=2) + "\n"
    )
    return folder


def load_mqar_model(folder: str | Path) -> tuple[HookedModel, MQARTrainConfig, dict[str, Any]]:
    """Read a model written by :func:`save_mqar_model`.

    Raises:
        HeadhuntError: the folder lacks the files or they do not match the config.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        meta = json.loads((folder / "config.json").read_text())
        state = load_file(str(folder / "model.safetensors"))
    except (OSError, json.JSONDecodeError) as e:
        raise HeadhuntError(f"no trained MQAR model in {folder}: {e}") from None
    cfg = MQARTrainConfig.from_dict(meta["train"])
    model = build_model(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise HeadhuntError(f"{folder} does not match its config ({missing or unexpected})")
    model.eval()
    return _wrap(model, cfg), cfg, meta
