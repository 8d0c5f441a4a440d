"""Per-head outputs in the residual stream: what each head writes, after its slice of W_O.

Head h of a layer writes ``z[..., h, :] @ W_O[:, h*d:(h+1)*d].T`` into the residual stream,
where ``z`` is the attention output before the output projection ([b, n, heads, d]) and
``W_O`` the projection's weight [d_model, heads*d]. One :class:`HeadOutputCapture` hook sees
every layer's ``z`` in one forward pass (the model's own SDPA kernel, no eager attention) and
keeps only the reduced per-head vectors, so memory does not grow with the sequence length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from headhunt.errors import HeadhuntError
from headhunt.probes.attention import AttentionCall, AttentionHook
from headhunt.probes.hooked import HookedModel
from headhunt.sae.prompt_pairs import length_batches

Position = Literal["mean", "last"]
_PROJ_NAMES = ("o_proj", "out_proj", "dense", "c_proj")


def output_projection(model: HookedModel, layer: int) -> Float[Tensor, "d_model qd"]:
    """W_O of one layer as [d_model, heads*head_dim] (Linear layout; GPT-2's Conv1D transposed).

    Raises:
        HeadhuntError: the attention module has no recognised output projection.
    """
    model.check_attention_layers([layer])  # a hybrid's other layers have no heads
    module = model.modules[layer]
    width = model.n_heads * model.head_dim
    for name in _PROJ_NAMES:
        proj = getattr(module, name, None)
        w = getattr(proj, "weight", None)
        if w is None:
            continue
        if tuple(w.shape) == (model.d_model, width):
            return w
        if tuple(w.shape) == (width, model.d_model):  # Conv1D stores [in, out]
            return w.T
    raise HeadhuntError(
        f"layer {layer}: no output projection of shape [{model.d_model}, {width}] "
        f"(looked for {', '.join(_PROJ_NAMES)})"
    )


def per_head(
    z: Float[Tensor, "*batch hq d"], w_o: Float[Tensor, "d_model qd"]
) -> Float[Tensor, "*batch hq d_model"]:
    """Each head's write into the residual stream: z[..., h, :] @ W_O[:, h-slice].T."""
    heads, d = z.shape[-2], z.shape[-1]
    return torch.einsum("...hd,mhd->...hm", z, w_o.reshape(w_o.shape[0], heads, d))


class HeadOutputCapture(AttentionHook):
    """Keeps each layer's pre-projection output ``z`` reduced over positions.

    ``position="mean"`` averages over all positions but the first when the sequence starts with
    BOS (a BOS position's output is the same for every prompt, so it only dilutes); "last"
    keeps the final position. Because W_O is linear, reducing ``z`` first and projecting after
    gives the same vectors as projecting every position.
    """

    def __init__(self, position: Position, skip_first: bool):
        self.position = position
        self.skip_first = skip_first
        self.z: dict[int, Tensor] = {}

    def after(self, call: AttentionCall, output: Tensor) -> Tensor:
        if self.position == "last":
            self.z[call.layer] = output[:, -1].detach().float()
        else:
            start = 1 if self.skip_first and output.shape[1] > 1 else 0
            self.z[call.layer] = output[:, start:].detach().float().mean(1)
        return output


@torch.inference_mode()
def head_outputs(
    model: HookedModel,
    seqs: Sequence[Tensor],
    *,
    position: Position = "mean",
    batch_size: int = 16,
    progress: bool = True,
    desc: str = "head outputs",
) -> Float[Tensor, "examples hq d_model"]:
    """Every head's output vector for every sequence, heads flattened as layer * n_heads + head.

    Args:
        model: the hooked model.
        seqs: 1-D token id tensors (any lengths; equal lengths are batched together).
        position: "mean" over positions (the paper's setting) or "last".
        batch_size: sequences per forward pass.
        progress: show a progress bar.
        desc: the progress bar's label.

    Returns:
        float32 [examples, n_layers * n_heads, d_model] on the CPU, in the order of ``seqs``.
    """
    if position not in ("mean", "last"):
        raise HeadhuntError(f"unknown position {position!r} (use mean or last)")
    if not seqs:
        raise HeadhuntError("no sequences to capture")
    w_o = [output_projection(model, i).detach().float() for i in range(model.n_layers)]
    bos = model.tokenizer.bos_token_id
    out = torch.empty(len(seqs), model.n_layers * model.n_heads, model.d_model)
    batches = list(length_batches(seqs, batch_size))
    for idx, ids in tqdm(batches, desc=desc, disable=not progress, leave=False):
        cap = HeadOutputCapture(
            position, skip_first=bos is not None and bool((ids[:, 0] == bos).all())
        )
        with model.hooks(cap):
            model.forward(ids, use_cache=False, logits_to_keep=1)
        # Each layer's vectors leave its own GPU (under --device-map layers sit on several).
        per_layer = [
            per_head(cap.z[i], w_o[i].to(cap.z[i].device)).cpu() for i in range(model.n_layers)
        ]
        out[idx] = torch.stack(per_layer, 1).flatten(1, 2)
    return out
