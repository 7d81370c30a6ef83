"""The paper's per-head ablation (its §3.2, Fig. 3) in the GPT-2 chapter's attention: the failing
path with chosen heads on the control's route (``fp32_heads``), the variant ``H`` that moves the
runaway head of layer 0, and the heads it moves, read from the stored runs. Fresh random inputs
each run."""

import random

import pytest
import torch

import kernels  # noqa: F401
from kernels.gpt2 import attend, parse_spec, report
from kernels.gpt2.plans import RUNAWAY_HEAD_K4, plan, variant_options


def _inputs(heads=4, n=24, d=16):
    gen = torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))
    q, k, v = (torch.randn(2, heads, n, d, generator=gen).bfloat16().float() for _ in "qkv")
    return q, k, v, torch.randn(2, heads, n, d, generator=gen)


def _out_and_grads(spec, q, k, v, d_out):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attend(*leaves, parse_spec(spec))
    return (out, *torch.autograd.grad(out, leaves, d_out))


def test_chosen_heads_take_the_controls_gradient_and_the_rest_the_failing_paths():
    q, k, v, d_out = _inputs()
    chosen = sorted(random.sample(range(4), random.randint(1, 3)))
    split = _out_and_grads("paper:delta=o,fp32_heads=" + "+".join(map(str, chosen)), q, k, v, d_out)
    failing = _out_and_grads("paper:delta=o", q, k, v, d_out)
    control = _out_and_grads("paper:delta=o_fp32", q, k, v, d_out)
    assert torch.equal(split[0], failing[0])  # the forward pass is the failing path's
    for head in range(4):
        route = control if head in chosen else failing
        for got, want in zip(split[1:], route[1:]):
            assert torch.equal(got[:, head], want[:, head]), head
    # the routes differ, so the test can tell them apart
    assert not torch.equal(failing[1], control[1])


def test_the_spec_round_trips_and_refuses_what_it_cannot_split():
    spec = parse_spec("paper:delta=o,obits=4,fp32_heads=1+3")
    assert spec.fp32_heads == (1, 3) and parse_spec(str(spec)) == spec
    for bad in (
        "paper:delta=o_fp32,fp32_heads=1",
        "paper:delta=o,fp32_heads=3+1",
        "sdpa:fp32_heads=1",
        "paper:delta=o,derr=sign,fp32_heads=0",
    ):
        with pytest.raises(ValueError, match="fp32_heads"):
            parse_spec(bad)
    q, k, v, _ = _inputs(heads=2)
    with pytest.raises(ValueError, match="past the 2 heads"):
        attend(q, k, v, parse_spec("paper:delta=o,fp32_heads=2"))


def test_the_moved_heads_are_the_stored_failing_runs_runaway_heads():
    runs = report.load_search("amp_seeds")["data"]["runs"]
    for seed, head in RUNAWAY_HEAD_K4.items():
        assert report.runaway_head(runs[f"k4-U-s{seed}"]) == head, seed
        assert report.runaway_head(runs[f"k4-F-s{seed}"]) is None  # no control runs away
    for name, opts in plan("amp_head"):
        seed = opts["seed"]
        assert opts["layer_attn"] == f"0=paper:delta=o,obits=4,fp32_heads={RUNAWAY_HEAD_K4[seed]}"
        assert name == f"k4h-H-s{seed}"
    with pytest.raises(ValueError, match="obits=4"):
        variant_options("H", 7, seed=1)
    with pytest.raises(ValueError, match="seed"):
        variant_options("H", 4, seed=0)


def test_head_groups_are_made_once_so_a_cuda_graph_can_capture_the_split():
    from kernels.gpt2.attention import _head_groups

    chosen = tuple(sorted(random.sample(range(6), random.randint(1, 5))))
    first = _head_groups(chosen, 6, torch.device("cpu"))
    assert all(a is b for a, b in zip(first, _head_groups(chosen, 6, torch.device("cpu"))))
    picked, rest, back = first
    assert picked.tolist() == list(chosen) and sorted(picked.tolist() + rest.tolist()) == list(
        range(6)
    )
    assert torch.cat([picked, rest])[back].tolist() == list(range(6))  # back to head order
