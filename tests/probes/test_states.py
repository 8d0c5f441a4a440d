"""State capture: exact values against HF's hidden states, per-head outputs, shards, resume,
memory-mapped reload, bad input, and flat memory in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from headhunt.errors import HeadhuntError
from headhunt.probes import states
from headhunt.probes.attention import AttentionHook
from headhunt.probes.states import CaptureConfig, StateStore, capture_states


@dataclass
class Item:
    id: str
    input_ids: list[int]
    positions: list[int]


def make_items(n: int, seed: int = 0, vocab: int = 60) -> list[Item]:
    """Texts of different lengths (so batches need padding), positions incl. a negative one."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        length = int(rng.integers(6, 20))
        ids = [1, *rng.integers(4, vocab, size=length - 1).tolist()]
        pos = sorted(rng.choice(length, size=3, replace=False).tolist())
        items.append(Item(f"t{i}", ids, [*pos, -1]))
    return items


class Recorder(AttentionHook):
    def __init__(self):
        self.out = {}

    def after(self, call, output):
        self.out[call.layer] = output.clone()
        return output


def reference(model, item: Item):
    """Per layer: the residual stream and head outputs at the item's positions, one text alone."""
    ids = torch.tensor([item.input_ids], device=model.device)
    rec = Recorder()
    with torch.inference_mode(), model.hooks(rec):
        hs = model.model.base_model(input_ids=ids, output_hidden_states=True).hidden_states
    pos = [p % len(item.input_ids) for p in item.positions]
    resid = [hs[L + 1][0, pos].float().cpu().numpy() for L in range(model.n_layers)]
    heads = [rec.out[L][0, pos].float().cpu().numpy() for L in range(model.n_layers)]
    return resid, heads


def test_capture_equals_hidden_states_and_head_outputs(tiny, tmp_path):
    items = make_items(11)
    cfg = CaptureConfig(heads=True, batch_size=3, shard_size=4)
    store = capture_states(tiny, items, tmp_path / "s", cfg, progress=False)
    assert store.n_shards == 3 and store.n_rows == 44
    rows = store.rows()
    assert rows["item"].tolist() == [i for i in range(11) for _ in range(4)]
    last = tiny.n_layers - 1
    got = {L: store.layer(L) for L in store.layers}
    got_heads = {L: store.head(L) for L in store.layers}
    for i, item in enumerate(items):
        resid, heads = reference(tiny, item)
        sel = rows["item"] == i
        assert rows["position"][sel][-1] == len(item.input_ids) - 1  # -1 resolved
        assert rows["token"][sel].tolist() == [item.input_ids[p] for p in rows["position"][sel]]
        for L in range(last):
            np.testing.assert_allclose(got[L][sel], resid[L], atol=2e-4)
        # HF's last hidden state is after the final norm; the capture keeps the residual.
        with torch.inference_mode():
            kept = torch.from_numpy(got[last][sel]).to(tiny.device)
            normed = tiny.model.model.norm(kept).float().cpu().numpy()
        np.testing.assert_allclose(normed, resid[last], atol=2e-4)
        for L in range(tiny.n_layers):
            np.testing.assert_allclose(got_heads[L][sel], heads[L], atol=2e-4)
            np.testing.assert_allclose(store.head(L, 1)[sel], heads[L][:, 1], atol=2e-4)
    # Reloading is memory-mapped, one array per shard.
    reopened = StateStore.open(tmp_path / "s")
    arrays = reopened.shard_arrays(0)
    assert all(isinstance(a, np.memmap) for a in arrays)
    assert [len(a) for a in arrays] == [16, 16, 12]


def test_chosen_layers_stop_the_forward_early(tiny, tmp_path):
    class Count(AttentionHook):
        calls = 0

        def before(self, call):
            Count.calls += 1

    items = make_items(4)
    with tiny.hooks(Count(), layers=[1]):
        store = capture_states(
            tiny, items, tmp_path / "s", CaptureConfig(layers=[0], batch_size=4), progress=False
        )
    assert Count.calls == 0  # layer 1 never ran
    assert store.layers == [0]
    with pytest.raises(HeadhuntError, match="not captured"):
        store.layer(1)
    with pytest.raises(HeadhuntError, match="per-head"):
        store.head(0)


def test_float16_storage(tiny, tmp_path):
    items = make_items(3)
    s32 = capture_states(tiny, items, tmp_path / "a", progress=False)
    s16 = capture_states(
        tiny, items, tmp_path / "b", CaptureConfig(state_dtype="float16"), progress=False
    )
    assert s16.shard_arrays(0)[0].dtype == np.float16
    assert s16.layer(0).dtype == np.float32
    np.testing.assert_allclose(s16.layer(1), s32.layer(1), rtol=2e-3, atol=2e-3)


def test_interrupted_capture_resumes_at_the_unfinished_shard(tiny, tmp_path, monkeypatch):
    items = make_items(10)
    cfg = CaptureConfig(batch_size=2, shard_size=3)
    full = capture_states(tiny, items, tmp_path / "full", cfg, progress=False)

    real, calls = states._capture_shard, []

    def flaky(*a, **k):
        calls.append(a[3])  # first item of the shard
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(states, "_capture_shard", flaky)
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        capture_states(tiny, items, out, cfg, progress=False)
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000", "shard-00001"]
    with pytest.raises(HeadhuntError, match="missing"):
        StateStore.open(out)
    # A shard cut short by a crash leaves its temporary folder (the atomic writer's
    # ``.shard-XXXXX.tmp``): it is discarded and redone.
    (out / ".shard-00002.tmp").mkdir()
    (out / ".shard-00002.tmp" / "resid-L00.npy").write_bytes(b"garbage")
    calls.clear()
    monkeypatch.setattr(
        states, "_capture_shard", lambda *a, **k: (calls.append(a[3]), real(*a, **k))
    )
    store = capture_states(tiny, items, out, cfg, progress=False)
    assert calls == [6, 9]  # only the two unfinished shards ran
    assert not (out / ".shard-00002.tmp").exists()
    for L in store.layers:
        np.testing.assert_array_equal(store.layer(L), full.layer(L))
    assert {k: v.tolist() for k, v in store.rows().items()} == {
        k: v.tolist() for k, v in full.rows().items()
    }


def test_resume_refuses_other_texts_or_options(tiny, tmp_path):
    items = make_items(4)
    capture_states(tiny, items, tmp_path / "s", progress=False)
    with pytest.raises(HeadhuntError, match="another capture"):
        capture_states(tiny, make_items(4, seed=1), tmp_path / "s", progress=False)
    with pytest.raises(HeadhuntError, match="another capture"):
        capture_states(tiny, items, tmp_path / "s", CaptureConfig(heads=True), progress=False)
    # Batch size stores nothing: another one resumes fine.
    capture_states(tiny, items, tmp_path / "s", CaptureConfig(batch_size=1), progress=False)


def test_bad_input_is_a_one_line_error(tiny, tmp_path):
    with pytest.raises(HeadhuntError, match=r"position 9 is outside its 5 tokens"):
        capture_states(tiny, [Item("a", [1, 5, 6, 7, 8], [2, 9])], tmp_path / "a", progress=False)
    with pytest.raises(HeadhuntError, match="position -6"):
        capture_states(tiny, [Item("a", [1, 5, 6, 7, 8], [-6])], tmp_path / "b", progress=False)
    with pytest.raises(HeadhuntError, match="no positions"):
        capture_states(tiny, [Item("a", [1, 5], [])], tmp_path / "c", progress=False)
    with pytest.raises(HeadhuntError, match="do not exist"):
        capture_states(tiny, make_items(2), tmp_path / "d", CaptureConfig(layers=[5]))
    with pytest.raises(HeadhuntError, match="no texts"):
        capture_states(tiny, [], tmp_path / "e")
    with pytest.raises(HeadhuntError, match="context"):
        capture_states(tiny, [Item("a", [1] * 600, [599])], tmp_path / "f", progress=False)
    with pytest.raises(HeadhuntError, match="no captured states"):
        StateStore.open(tmp_path / "nothing")
    assert not (tmp_path / "a" / "shard-00000").exists()


MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, resource, tempfile
    import numpy as np
    from headhunt.probes.tiny import tiny_llama
    from headhunt.probes.states import CaptureConfig, capture_states

    class Item:
        def __init__(self, i, ids):
            self.id, self.input_ids, self.positions = str(i), ids, list(range(32))

    model = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2, d_model=256)
    rng = np.random.default_rng(0)
    out = {}
    # Peak RSS only grows: had the 1,000-text capture held more than the 100-text one, the
    # second reading would be higher. All of it would be n * 32 rows * 2 layers * 512 floats.
    for n in (100, 1000):
        items = [Item(i, [1, *rng.integers(4, 60, size=31).tolist()]) for i in range(n)]
        with tempfile.TemporaryDirectory() as d:
            cfg = CaptureConfig(heads=True, batch_size=50, shard_size=50)
            store = capture_states(model, items, d, cfg, progress=False)
            out[n] = {"rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "rows": store.n_rows, "bytes": sum(p.stat().st_size
                      for p in store.path.rglob("*.npy"))}
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_capture_memory_is_flat_in_the_number_of_texts():
    res = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    small, large = out["100"], out["1000"]
    assert large["rows"] == 10 * small["rows"] == 32000
    assert large["bytes"] / 2**20 > 120  # what would have sat in memory
    grew = (large["rss_kb"] - small["rss_kb"]) / 1024
    assert grew < 20, f"peak RSS grew by {grew:.0f} MiB from 100 to 1000 texts"
