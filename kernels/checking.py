"""What every exercise check of the book shares.

A check (one per exercise, in the chapters' ``exercises.py`` modules) follows four rules:

* it draws **fresh random inputs** on every run from its own generator, seeded by the operating
  system (:func:`fresh_seed`), so a chapter's seeded random stream is left untouched and no
  answer can be fitted to one fixed draw;
* a blank answer (``None``, or a function whose body is still empty and so returns ``None``)
  **fails**, with "no answer yet" in the message;
* a wrong answer fails with :class:`WrongAnswer`, whose message says *what* is wrong (which
  kind of input, which quantity) and **never** the expected value, a measured value or the
  formula;
* a right answer prints one line that starts with ``correct``;
* no public function of a chapter's ``exercises`` module returns an exercise's answer: what a
  check compares with is its own private code (``_launch_grid_expected``), and an answer that
  reaches for it, or for any other function of the module, scores 0 when graded.

The autograder (:mod:`kernels.lab_kit.grading`) runs the same checks, in its own process, against
the answer running in a fresh process of its own: an answer cannot patch them.
"""
from __future__ import annotations

import secrets
import sys

import numpy as np

__all__ = ["WrongAnswer", "fresh_seed", "fresh_rng", "fresh_generator", "need", "need_function",
           "need_names", "call", "fail", "correct"]


class WrongAnswer(AssertionError):
    """An exercise answer is missing or wrong; the message says what is wrong."""


def fresh_seed() -> int:
    """A seed from the operating system: different on every call, independent of any seeding."""
    return secrets.randbits(62)


def fresh_rng() -> np.random.Generator:
    return np.random.default_rng(fresh_seed())


def fresh_generator(device="cpu"):
    """A torch generator seeded from :func:`fresh_seed` (the global torch seed is untouched)."""
    import torch
    return torch.Generator(device=device).manual_seed(fresh_seed())


def _one_line(shell, etype, value, tb, tb_offset=None):
    """IPython's display of a :class:`WrongAnswer`: its one-line message, not a traceback into
    the checks' code (the cell still fails, so a notebook run stops there)."""
    stb = [f"{etype.__name__}: {value}"]
    shell._showtraceback(etype, value, stb)
    return stb


def _short_errors_in_ipython() -> None:
    shell = None
    if "IPython" in sys.modules:
        shell = sys.modules["IPython"].get_ipython()
    if shell is not None and hasattr(shell, "set_custom_exc"):
        shell.set_custom_exc((WrongAnswer,), _one_line)


def fail(message: str):
    raise WrongAnswer(message)


def need(answer, name: str, what: str):
    """Fail with "no answer yet" while ``answer`` is None; return it otherwise."""
    if answer is None:
        fail(f"no answer yet: set {name} to {what}, then run this cell again")
    return answer


def need_function(fn, name: str):
    """Fail unless ``fn`` is a function (a blank answer is None)."""
    need(fn, name, "a function")
    if not callable(fn):
        fail(f"{name} should be a function, got a {type(fn).__name__}")
    return fn


def need_names(answer, name: str, allowed, example: str) -> set:
    """The answer as a set of names from ``allowed`` (one name alone counts as a set of one);
    fail with "no answer yet" while it is None, and say what is wrong otherwise."""
    need(answer, name, f"a set of names such as {example}")
    if isinstance(answer, str):
        answer = {answer}
    try:
        given = set(answer)
    except TypeError:
        fail(f"{name} should be a set of names, got a {type(answer).__name__}")
    if not given <= set(allowed):
        fail(f"use only the names {list(allowed)}")
    return given


def call(fn, name: str, *args, **kwargs):
    """Call the reader's function; a blank body (returns None) and an exception both fail."""
    try:
        out = fn(*args, **kwargs)
    except WrongAnswer:
        raise
    except Exception as exc:  # the reader's code raised: say so, with its own message
        fail(f"{name} raised {type(exc).__name__}: {exc}")
    if out is None:
        fail(f"no answer yet: {name} returned None (its body is still empty?)")
    return out


def correct(text: str) -> None:
    print(f"correct: {text}")


_short_errors_in_ipython()
