"""The discrete SAE: unit norms, training, determinism, safe save/load."""

from __future__ import annotations

import json

import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.sae.discrete import DiscreteSAE, SAEConfig, train_sae


def _data(n: int = 60, d: int = 16, seed: int = 0) -> torch.Tensor:
    # a few directions with varying scale: what head outputs look like to the SAE
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(4, d, generator=g)
    which = torch.randint(0, 4, (n,), generator=g)
    return dirs[which] * (1 + torch.rand(n, 1, generator=g)) + 0.05 * torch.randn(n, d, generator=g)


def _norms(sae: DiscreteSAE) -> tuple[torch.Tensor, torch.Tensor]:
    return sae.w_enc.detach().norm(dim=1), sae.w_dec.detach().norm(dim=0)


def test_unit_norms_at_init_and_after_training():
    cfg = SAEConfig(d_in=16, dict_size=32, epochs=60, seed=1)
    enc, dec = _norms(DiscreteSAE(cfg))
    assert torch.allclose(enc, torch.ones(32), atol=1e-5)
    assert torch.allclose(dec, torch.ones(32), atol=1e-5)
    sae = train_sae(_data(), cfg).sae
    enc, dec = _norms(sae)
    assert torch.allclose(enc, torch.ones(32), atol=1e-5)
    assert torch.allclose(dec, torch.ones(32), atol=1e-5)


def test_projected_gradient_is_tangent():
    sae = DiscreteSAE(SAEConfig(d_in=8, dict_size=12))
    sae.loss(_data(20, 8))[0].backward()
    sae.project_grads_()
    # no radial component left: the step moves along the unit sphere
    assert (sae.w_enc.grad * sae.w_enc).sum(1).abs().max() < 1e-6
    assert (sae.w_dec.grad * sae.w_dec).sum(0).abs().max() < 1e-6


def test_loss_falls():
    res = train_sae(_data(), SAEConfig(d_in=16, dict_size=32, epochs=150, seed=0))
    assert len(res.losses) == 151
    assert res.losses[-1] < 0.5 * res.losses[0]


def test_loss_terms():
    sae = DiscreteSAE(SAEConfig(d_in=4, dict_size=6, l1=0.5))
    x = torch.randn(5, 4)
    total, mse, l1 = sae.loss(x)
    f, x_hat = sae(x)
    assert torch.isclose(mse, ((x_hat - x) ** 2).mean())
    assert torch.isclose(l1, f.sum(-1).mean())  # ReLU output: |f| = f
    assert torch.isclose(total, mse + 0.5 * l1)


def test_codes_deterministic_for_a_seed():
    x = _data()
    a = train_sae(x, SAEConfig(d_in=16, dict_size=32, epochs=40, seed=3)).sae
    b = train_sae(x, SAEConfig(d_in=16, dict_size=32, epochs=40, seed=3)).sae
    c = train_sae(x, SAEConfig(d_in=16, dict_size=32, epochs=40, seed=4)).sae
    assert torch.equal(a.codes(x), b.codes(x))
    assert not torch.equal(a.w_enc, c.w_enc)
    assert a.codes(x).dtype == torch.long and a.codes(x).shape == (60,)


def test_codes_are_argmax_features():
    sae = DiscreteSAE(SAEConfig(d_in=4, dict_size=5))
    x = torch.randn(7, 4)
    assert torch.equal(sae.codes(x), sae.encode(x).argmax(-1))


def test_save_load_roundtrip(tmp_path):
    x = _data()
    sae = train_sae(x, SAEConfig(d_in=16, dict_size=32, epochs=5, seed=2)).sae
    sae.save(tmp_path / "sae")
    assert (tmp_path / "sae.safetensors").is_file()
    assert json.loads((tmp_path / "sae.json").read_text())["dict_size"] == 32
    back = DiscreteSAE.load(tmp_path / "sae")
    assert back.config == sae.config
    assert torch.equal(back.codes(x), sae.codes(x))


def test_load_errors(tmp_path):
    with pytest.raises(HeadhuntError, match="no SAE"):
        DiscreteSAE.load(tmp_path / "missing")
    DiscreteSAE(SAEConfig(d_in=4, dict_size=3)).save(tmp_path / "s")
    (tmp_path / "s.json").write_text(json.dumps({"d_in": 5, "dict_size": 3}))
    with pytest.raises(HeadhuntError, match="does not match"):
        DiscreteSAE.load(tmp_path / "s")
    (tmp_path / "s.json").write_text("{not json")
    with pytest.raises(HeadhuntError, match="not an SAE config"):
        DiscreteSAE.load(tmp_path / "s")


def test_config_roundtrip_and_validation():
    cfg = SAEConfig(d_in=10, dict_size=20, l1=0.05, seed=7)
    assert SAEConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(HeadhuntError):
        SAEConfig(d_in=10, dict_size=1)
    with pytest.raises(HeadhuntError):
        SAEConfig(d_in=10, lr=0)
    with pytest.raises(HeadhuntError, match="unknown"):
        SAEConfig.from_dict({"d_in": 3, "colour": 1})


def test_bad_training_input():
    with pytest.raises(HeadhuntError, match="must be"):
        train_sae(torch.zeros(4, 3), SAEConfig(d_in=5))
    x = torch.zeros(4, 5)
    x[0, 0] = float("nan")
    with pytest.raises(HeadhuntError, match="NaN"):
        train_sae(x, SAEConfig(d_in=5))
