"""The training probe computes its high-precision side in fp32 even under bf16 autocast."""

import torch

from kernels.gpt2.diagnostics import AttentionProbe
from kernels.monitor.metrics import causal_scores


def test_probe_o_high_is_fp32_under_autocast():
    gen = torch.Generator().manual_seed(torch.seed())
    b, h, n, d = 2, 2, 16, 16
    q, k, v = (torch.randn(b, h, n, d, generator=gen).to(torch.bfloat16) for _ in range(3))
    x = torch.randn(b, n, h * d, generator=gen)
    probe = AttentionProbe()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        probe.observe(x, q, k, v, v.clone(), [1.0, 2.0])
    expected = torch.softmax(causal_scores(q, k), dim=-1) @ v.float()
    assert probe._out_high.dtype == torch.float32
    assert torch.equal(probe._out_high, expected)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what autocast would have made
        blurred = torch.softmax(q.float() @ k.float().transpose(-1, -2), -1) @ v.float()
    assert blurred.dtype == torch.bfloat16  # so the test can tell them apart
