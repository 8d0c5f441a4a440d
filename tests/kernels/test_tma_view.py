"""The 2-D views that TMA loads go through (kernels/tma.py): every head's rows must be found
where the kernels look for them, in both memory layouts a model hands over."""

import pytest
import torch

from headhunt.kernels.tma import tma_view, tma_views


@pytest.mark.parametrize("model_layout", [False, True])
def test_each_head_starts_where_the_view_says(model_layout):
    b, h, n, d = 2, 3, 5, 16
    t = torch.randn(b, n, h, d).transpose(1, 2) if model_layout else torch.randn(b, h, n, d)
    view, rb, rh, ch = tma_view(t)
    assert view.data_ptr() == t.data_ptr()  # a view, no copy
    for i in range(b):
        for j in range(h):
            rows = view[i * rb + j * rh :][:n, j * ch : j * ch + d]
            torch.testing.assert_close(rows, t[i, j], rtol=0, atol=0)


def test_other_layouts_and_the_cpu_are_refused():
    t = torch.randn(2, 3, 5, 16)
    assert tma_view(t.transpose(2, 3).contiguous().transpose(2, 3)) is None  # d not innermost
    assert tma_views(t, t) is None  # TMA needs a CUDA card of compute capability 9+
