"""The discrete sparse autoencoder of O'Neill & Bui (2024): one SAE over every head's output,
whose argmax feature turns a head's vector into an integer code.

Architecture (their defaults): subtract a tied pre-bias, a linear encoder with bias whose rows
(one per feature) have unit norm, ReLU, a linear decoder without bias whose dictionary vectors
(one per feature) have unit norm, add the tied bias back. Loss = MSE + l1 * mean over inputs of
the feature vector's L1 norm. Full-batch Adam.

Unit norms are kept the way their code intends: the gradient component parallel to each unit
vector is removed before the step, and vectors are renormalised after it (Adam's momentum can
still change norms). Their decoder normalises the rows of the [d_in, dict] weight, i.e. across
features, not each dictionary vector; here each dictionary vector has unit norm, as the paper
describes. The tied bias starts at zero, as in their runs (no geometric median given).

Saved as ``<name>.safetensors`` (weights) + ``<name>.json`` (config); loading never unpickles.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from tqdm.auto import tqdm

from headhunt.errors import HeadhuntError
from headhunt.sae.configs import SAETraining


@dataclass
class SAEConfig(SAETraining):
    """Hyperparameters of one discrete SAE: its training (:class:`SAETraining`, defaults the
    paper's), its input width and its seed.

    Attributes:
        d_in: input width (the model's d_model).
        seed: seeds the initialisation (training is deterministic on the CPU).
    """

    d_in: int = field(kw_only=True, metadata={"help": "input width", "cli": False, "min": 1})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SAEConfig:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise HeadhuntError(f"unknown SAE config keys {sorted(unknown)}")
        return cls(**d)


class DiscreteSAE(nn.Module):
    """Tied-bias ReLU SAE with unit-norm encoder rows and decoder dictionary vectors.

    Parameters:
        b_pre: [d_in] tied bias, subtracted before encoding and added after decoding.
        w_enc: [dict, d_in] encoder, one unit-norm row per feature.
        b_enc: [dict] encoder bias.
        w_dec: [d_in, dict] decoder, one unit-norm column (dictionary vector) per feature.
    """

    def __init__(self, config: SAEConfig):
        super().__init__()
        self.config = config
        g = torch.Generator().manual_seed(config.seed)
        d, k = config.d_in, config.dict_size
        self.b_pre = nn.Parameter(torch.zeros(d))
        self.w_enc = nn.Parameter(torch.randn(k, d, generator=g))
        bound = 1 / math.sqrt(d)
        self.b_enc = nn.Parameter(torch.empty(k).uniform_(-bound, bound, generator=g))
        self.w_dec = nn.Parameter(torch.randn(d, k, generator=g))
        self.renormalise_()

    @torch.no_grad()
    def renormalise_(self) -> None:
        """Put every encoder row and decoder dictionary vector back on the unit sphere."""
        self.w_enc.div_(self.w_enc.norm(dim=1, keepdim=True).clamp_min(1e-12))
        self.w_dec.div_(self.w_dec.norm(dim=0, keepdim=True).clamp_min(1e-12))

    @torch.no_grad()
    def project_grads_(self) -> None:
        """Remove each unit vector's radial gradient component, so a step moves along the sphere."""
        for w, dim in ((self.w_enc, 1), (self.w_dec, 0)):
            if w.grad is not None:
                w.grad.sub_((w.grad * w).sum(dim, keepdim=True) * w)

    def encode(self, x: Float[Tensor, "*batch d_in"]) -> Float[Tensor, "*batch dict"]:
        """Feature activations relu((x - b_pre) W_enc^T + b_enc)."""
        return torch.relu((x - self.b_pre) @ self.w_enc.T + self.b_enc)

    def decode(self, f: Float[Tensor, "*batch dict"]) -> Float[Tensor, "*batch d_in"]:
        return f @ self.w_dec.T + self.b_pre

    def forward(
        self, x: Float[Tensor, "*batch d_in"]
    ) -> tuple[Float[Tensor, "*batch dict"], Float[Tensor, "*batch d_in"]]:
        f = self.encode(x)
        return f, self.decode(f)

    def loss(self, x: Float[Tensor, "*batch d_in"]) -> tuple[Tensor, Tensor, Tensor]:
        """(total, mse, l1 term): MSE over all elements + l1 * mean over inputs of |f|_1."""
        f, x_hat = self(x)
        mse = torch.mean((x_hat - x) ** 2)
        sparsity = f.abs().sum(-1).mean()
        return mse + self.config.l1 * sparsity, mse, sparsity

    @torch.no_grad()
    def codes(self, x: Float[Tensor, "*batch d_in"]) -> Int[Tensor, "*batch"]:
        """The discrete code of each input: the index of its most active feature (0 when no
        feature fires, as argmax of an all-zero row gives)."""
        return self.encode(x).argmax(-1)

    def save(self, path: str | Path) -> None:
        """Write ``path`` with suffix .safetensors (weights) and .json (config)."""
        from safetensors.torch import save_file

        path = Path(path)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, str(path.with_suffix(".safetensors")))
        path.with_suffix(".json").write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> DiscreteSAE:
        """Read an SAE written by :meth:`save` (safetensors + JSON; nothing is unpickled).

        Raises:
            HeadhuntError: missing or inconsistent files.
        """
        from safetensors.torch import load_file

        path = Path(path)
        cfg_path, w_path = path.with_suffix(".json"), path.with_suffix(".safetensors")
        if not cfg_path.is_file() or not w_path.is_file():
            raise HeadhuntError(f"no SAE at {path} (need {cfg_path.name} and {w_path.name})")
        try:
            config = SAEConfig.from_dict(json.loads(cfg_path.read_text()))
        except (json.JSONDecodeError, TypeError) as e:
            raise HeadhuntError(f"{cfg_path} is not an SAE config: {e}") from None
        sae = cls(config)
        try:
            sae.load_state_dict(load_file(str(w_path)))
        except RuntimeError as e:
            raise HeadhuntError(f"{w_path} does not match its config: {e}") from None
        return sae


@dataclass
class TrainResult:
    """A trained SAE and its loss curve (total loss before each step, and after the last)."""

    sae: DiscreteSAE
    losses: list[float]


def train_sae(
    x: Float[Tensor, "examples d_in"],
    config: SAEConfig,
    *,
    progress: bool = False,
) -> TrainResult:
    """Train a discrete SAE full-batch on ``x`` (rows: one head's output on one prompt).

    Args:
        x: training vectors, flattened over (example, head); training runs on x's device.
        config: hyperparameters; ``config.d_in`` must equal x's width.
        progress: show a progress bar over epochs.
    """
    if x.ndim != 2 or x.shape[1] != config.d_in:
        raise HeadhuntError(f"SAE input must be [n, {config.d_in}], got {list(x.shape)}")
    if not torch.isfinite(x).all():
        raise HeadhuntError("SAE input has NaN or infinite values")
    x = x.detach().float()
    # Initialised on the CPU (the same start on every device), then trained where x lives.
    sae = DiscreteSAE(config).to(x.device)
    opt = torch.optim.Adam(sae.parameters(), lr=config.lr)
    losses = []
    for _ in tqdm(range(config.epochs), desc="SAE", disable=not progress, leave=False):
        opt.zero_grad(set_to_none=True)
        loss, _, _ = sae.loss(x)
        loss.backward()
        sae.project_grads_()
        opt.step()
        sae.renormalise_()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        losses.append(float(sae.loss(x)[0]))
    return TrainResult(sae=sae, losses=losses)
