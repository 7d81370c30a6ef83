"""Every exercise of the book: the book's own solution passes its check and the held-back
tests, a blank answer fails, plausible wrong answers fail, and no failure message gives the
answer away (neither the expected value nor any measured number).

The answers are taken from the chapters themselves (the cells tagged ``answer``); a blank is
that cell with its solution region cleared, as in the lab version."""

from __future__ import annotations

import io
import math
import re
from contextlib import redirect_stdout

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from course_lab_helpers import CHAPTERS, chapter_exercises, fresh_namespace, hidden_tests, run

import kernels  # noqa: F401,I001  first: the Triton interpreter switch
from kernels.course_lab import notebook
from kernels.exercise_rules import WrongAnswer

CHECK_CALL = re.compile(r"ex\.(\w+)\((\w+)\)")


# ----------------------------------------------------------------------------------------------
# plausible wrong answers, per exercise
# ----------------------------------------------------------------------------------------------
@triton.jit
def _row_max_kernel(
    x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr, OTHER: tl.constexpr, EXTRA: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols + EXTRA, other=OTHER)
    tl.store(out_ptr + row, tl.max(x, axis=0))


def _row_max(other=-float("inf"), extra=0):
    def row_max(x):
        out = torch.full((x.shape[0],), float("nan"), device=x.device)
        _row_max_kernel[(x.shape[0],)](
            x,
            out,
            x.shape[1],
            x.stride(0),
            BLOCK=triton.next_power_of_2(x.shape[1] + extra),
            OTHER=other,
            EXTRA=extra,
        )
        return out

    return row_max


def _round_half_up(b):
    return (b + 0x8000) >> 16


def _naive_merge(o_a, lse_a, o_b, lse_b):
    w_a, w_b = torch.exp(lse_a), torch.exp(lse_b)
    return (
        (w_a.unsqueeze(-1) * o_a + w_b.unsqueeze(-1) * o_b) / (w_a + w_b).unsqueeze(-1),
        torch.log(w_a + w_b),
    )


def _merge_without_rescale(o_a, lse_a, o_b, lse_b):
    return (o_a + o_b) / 2, torch.logaddexp(lse_a, lse_b)


def _offset_for_any_sign(scores, beta, eps):
    rm = scores.amax(-1)
    tied = (rm.unsqueeze(-1) - scores <= eps).sum(-1) > 1
    return torch.where(tied, beta * rm, rm)


def _offset_exact_ties(scores, beta, eps):
    rm = scores.amax(-1)
    tied = (scores == rm.unsqueeze(-1)).sum(-1) > 1
    m = torch.where(tied & (rm > 0), beta * rm, rm)
    return torch.where(tied & (rm < 0), torch.zeros_like(m), m)


def _offset_single_counts(scores, beta, eps):
    rm = scores.amax(-1)
    m = torch.where(rm > 0, beta * rm, rm)
    return torch.where(rm < 0, torch.zeros_like(m), m)


def _first_crossing(steps, failing, control, ratio):
    above = failing / control > ratio
    return int(steps[int(np.argmax(above))]) if above[-1] else None


def _ideal_error_ignoring_pull(va, vb, pull):
    mid = (va + vb) / 2
    unit = np.ldexp(1.0, np.frexp(np.abs(mid))[1] - 8)
    return np.where(mid / unit % 1 != 0, 0.5, 0.0)


def _first_index(mask, steps):
    hits = np.nonzero(mask)[0]
    return int(steps[hits[0]]) if len(hits) else None


def _last_index(mask, steps):
    hits = np.nonzero(mask)[0]
    return int(steps[hits[-1]]) if len(hits) else None


WRONG = {
    "ex-bf16-count": [127, 256, 2**16],
    "ex-bf16-round-bits": [lambda b: b >> 16, _round_half_up],  # truncation; ties away
    "ex-bf16-which-up": [{3}, {0, 1, 2, 3}, {1}],
    "ch2-grid": [lambda n, b: (n // b, n % b), lambda n, b: (-(-n // b), n % b)],
    "ch2-rowmax": [
        _row_max(other=0.0),
        _row_max(extra=1),  # other=0; off-by-one mask
        lambda x: x.amax(dim=1),
    ],  # no Triton kernel at all
    "ch3-merge": [
        _naive_merge,
        _merge_without_rescale,
        lambda oa, la, ob, lb: (_merge_without_rescale(oa, la, ob, lb)[0], torch.maximum(la, lb)),
    ],
    "ch3-bytes": [
        lambda b, h, n, d, s: b * h * n * n * s,  # one N x N matrix
        lambda b, h, n, d, s: (2 * n * n + n * d) * s,
    ],  # one head
    "ch3-causal-tiles": [
        lambda i, bm, bn, n: (i * bm) // bn + 1,  # off by one
        lambda i, bm, bn, n: -(-(i + 1) * bm // bn),
    ],  # past the last key
    "ch4-dk": [
        lambda p, q, dl, dh, a: a * p.transpose(-1, -2) @ ((dh - dl).unsqueeze(-1) * q),
        lambda p, q, dl, dh, a: p.transpose(-1, -2) @ ((dl - dh).unsqueeze(-1) * q),
    ],
    "ch4-which": [{"dQ"}, {"dQ", "dK", "dV"}, "dV"],
    "ex-sources-mirror": [1, 0],
    "ex-sources-midpoint": [_ideal_error_ignoring_pull, lambda va, vb, pull: np.zeros_like(va)],
    "ex-fixes-window": [
        lambda beta: -math.log1p(-(2.0**-9)) / (beta - 1),  # BF16's window, from the chapter
        lambda beta: -math.log1p(-(2.0**-11)) / (beta - 1),  # the wrong neighbour
        lambda beta: -math.log1p(-(2.0**-12)) / beta,
    ],
    "ex-fixes-delta": [
        lambda p, d_p: d_p.sum(-1),  # wrong δ: P forgotten
        lambda p, d_p: (p * d_p).sum(0),
    ],
    "ex-fixes-offset": [_offset_for_any_sign, _offset_exact_ties, _offset_single_counts],
    "ex-gpt2-tokens": [
        lambda s: 6_600 * 524_288 / (64 * 256) / s,  # seconds
        lambda s: 6_600 / s / 60,
    ],
    "ex-gpt2-ties": [
        lambda r: (int((torch.exp(r - r.max()) == 1).sum()), int((r == r.max()).sum())),
        lambda r: (int((r.max() - r < 2**-8).sum()), int((r == r.max()).sum())),
    ],
    "ex-gpt2-logit": [_first_crossing, lambda steps, a, b, ratio: None],
    "ex-golden-growths": [
        sum(1 / t for t in range(1, 25)),  # the first tile counted (T = 24)
        math.log(24),
        23,
        sum(1 / t for t in range(2, 33)),  # the T = 32 that chapter 8 measures, not the task's
    ],  # ln T; every tile
    "ex-golden-w1": [
        lambda a, b: float(np.mean(np.abs(a - b))),  # unsorted pairs
        lambda a, b: abs(float(a.mean() - b.mean())),  # the means only
        lambda a, b: float(np.mean(np.abs(np.sort(a) - np.sort(b)[::-1]))),
    ],
    "ex-monitor-cost": [
        lambda off, reading, every: 100 * (reading - off) / off,  # one reading step
        lambda off, reading, every: (reading - off) / every / off,  # a fraction
        lambda off, reading, every: 100 * (reading - off) / every / reading,
    ],
    "ex-monitor-ratio": [
        lambda steps, f, c, r: _first_index(f / c >= r, steps),  # touching counts
        lambda steps, f, c, r: _first_index(f / c > r, np.arange(len(steps))),  # a position
        lambda steps, f, c, r: _last_index(f / c > r, steps),
    ],  # the last step
    "ch10-intensity": [
        lambda n, d, s, g: 2 * n * g / (g + 1),  # values, not bytes
        lambda n, d, s, g: n / s,  # K and V read once per query head
        lambda n, d, s, g: n * g / ((g + 1) * s),  # 2·N²·d per query head
    ],
    "ch10-stream": [
        lambda f, host, gpu: f / gpu * 1e-6,  # the host forgotten
        lambda f, host, gpu: f / (host + gpu) * 1e-6,  # CPU waits for the GPU
        lambda f, host, gpu: f / max(host, gpu),
    ],  # FLOP per µs
    "ch10-bits": [
        {"key order"},
        {"key tile"},
        {"query tile", "key tile", "key order"},
        {"key tile", "key order", "prefix"},
        set(),
    ],
}

EXERCISES = [(number, ex) for number in sorted(CHAPTERS) for ex in chapter_exercises(number)[3]]


def _ids():
    return [ex.label for _, ex in EXERCISES]


def _cells(number, ex):
    path, nb, setup, _ = chapter_exercises(number)
    text = {
        role: notebook.source(nb["cells"][i])
        for role, i in (("answer", ex.answer), ("check", ex.check), ("hidden", ex.hidden))
        if i is not None
    }
    return path, nb, setup, text


def _no_leak(message: str, secret=None) -> None:
    # numbers with a decimal point, other than tolerances (0.5%), the constant 1.0 and an
    # exercise's displayed number ("Exercise 2.2"), should a message show one
    unlabelled = re.sub(r"Exercise \d+\.\d+", "Exercise", message)
    numbers = {n for n, percent in re.findall(r"(\d+\.\d+)(%?)", unlabelled) if not percent}
    numbers -= {"1.0"}
    assert not numbers, f"a measured number in the message: {message}"
    if secret is not None:
        assert str(secret) not in message, f"the message gives the answer away: {message}"


def test_every_exercise_has_wrong_answers_to_try():
    assert sorted(WRONG) == sorted(ex.label for _, ex in EXERCISES)


@pytest.mark.parametrize("number, ex", EXERCISES, ids=_ids())
def test_the_books_solution_passes(number, ex):
    path, nb, setup, text = _cells(number, ex)
    ns = fresh_namespace(nb, setup, path)
    run(text["answer"], ns, f"<{path.name} {ex.label} answer>")
    out = io.StringIO()
    with redirect_stdout(out):
        run(text["check"], ns, f"<{path.name} {ex.label} check>")
        if "hidden" in text:
            run(hidden_tests(text["hidden"]), ns, f"<{path.name} {ex.label} hidden>")
    assert out.getvalue().startswith("correct"), out.getvalue()


@pytest.mark.parametrize("number, ex", EXERCISES, ids=_ids())
def test_a_blank_answer_fails(number, ex):
    path, nb, setup, text = _cells(number, ex)
    ns = fresh_namespace(nb, setup, path)
    run(notebook.clear_solution(text["answer"]), ns, f"<{path.name} {ex.label} blank>")
    for role in ("check", "hidden"):
        if role in text:
            code = text[role] if role == "check" else hidden_tests(text[role])
            with pytest.raises(WrongAnswer, match="no answer yet"):
                run(code, ns, f"<{path.name} {ex.label} {role}>")


@pytest.mark.parametrize("number, ex", EXERCISES, ids=_ids())
def test_plausible_wrong_answers_fail_without_giving_the_answer_away(number, ex):
    path, nb, setup, text = _cells(number, ex)
    check, variable = CHECK_CALL.search(text["check"]).groups()
    solution = fresh_namespace(nb, setup, path)
    run(text["answer"], solution, f"<{path.name} {ex.label} answer>")
    secret = solution[variable] if not callable(solution[variable]) else None
    for wrong in WRONG[ex.label]:
        ns = fresh_namespace(nb, setup, path)
        ns[variable] = wrong
        with pytest.raises(WrongAnswer) as err:
            run(text["check"], ns, f"<{path.name} {ex.label} check>")
        _no_leak(str(err.value), secret)
        if "hidden" in text:
            with pytest.raises(WrongAnswer) as err:
                run(hidden_tests(text["hidden"]), ns, f"<{path.name} {ex.label} hidden>")
            _no_leak(str(err.value), secret)


def test_row_max_refuses_torch_reductions_and_restores_them():
    from kernels import triton_exercises

    with pytest.raises(WrongAnswer, match="switched off"):  # no source to scan
        triton_exercises.check_row_max(eval("lambda x: torch.amax(x, dim=1)"))
    with pytest.raises(WrongAnswer, match="`torch.amax` is not allowed in exercise ch2-rowmax"):
        triton_exercises.check_row_max(lambda x: torch.amax(x, dim=1))
    with pytest.raises(WrongAnswer, match="launched no Triton kernel"):
        triton_exercises.check_row_max(eval("lambda x: torch.tensor(x.tolist()).float().T[0]"))
    x = torch.randn(3, 5)  # everything is back to normal afterwards
    assert torch.equal(x.amax(dim=1), torch.max(x, dim=1).values)


def test_checks_draw_fresh_inputs_and_leave_the_global_seed_alone():
    from kernels.exercise_rules import fresh_generator, fresh_seed

    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    assert fresh_seed() != fresh_seed()
    assert not torch.equal(
        torch.rand(3, generator=fresh_generator()), torch.rand(3, generator=fresh_generator())
    )
    assert torch.equal(torch.rand(3), before)
