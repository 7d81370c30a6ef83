"""Chapter 1's worked example and exercise checks (answers are computed from the library)."""
from __future__ import annotations

import numpy as np

from .addition import add_trace
from .formats import bits, from_bits, get_format, round_to

# Qiu & Yao's worked example (§3.3.2): an FP32 accumulator plus a BF16 value, the sum rounded to BF16.
PAPER_EXAMPLE = {"acc_pattern": "11000000000110100000111000101110", "b": -2.296875,
                 "acc_fmt": "fp32", "b_fmt": "bf16", "out_fmt": "bf16"}

# Exercise 2: round this FP32 pattern to BF16 by hand.
EXERCISE_PATTERN = "0|10000001|10110011000000000000000"

# Exercise 3: FP32 accumulator + BF16 value, rounded to BF16. Which round away from zero?
EXERCISE_SUMS = [(-2.40625, -2.296875), (-2.4071154594421387, -2.296875),
                 (1.0078125, 1.0), (1.0234375, 1.0)]


def _all_values(fmt) -> np.ndarray:
    f = get_format(fmt)
    codes = np.arange(2 ** f.total_bits, dtype=np.uint64).astype(f.uint)
    with np.errstate(invalid="ignore"):
        return codes.view(f.dtype).astype(np.float64)


def _reference(question: str):
    if question == "bf16-in-1-2":
        v = _all_values("bf16")
        return int(np.count_nonzero((v >= 1) & (v < 2)))
    if question == "round-pattern":
        return bits(round_to(from_bits(EXERCISE_PATTERN, "fp32"), "bf16"), "bf16", sep="")
    if question == "which-round-up":
        return {i for i, (acc, b) in enumerate(EXERCISE_SUMS)
                if add_trace(acc, b, "bf16", a_fmt="fp32").rounded_up}
    raise ValueError(f"unknown question {question!r}; valid questions are "
                     "'bf16-in-1-2', 'round-pattern', 'which-round-up'")


def _normalise_answer(question: str, answer):
    if question == "round-pattern":
        if not isinstance(answer, str):
            raise TypeError(f"give the BF16 pattern as a string of 16 bits, got {answer!r}")
        return "".join(ch for ch in answer if ch not in "|_ ").removeprefix("0b")
    if question == "which-round-up":
        try:
            return {int(i) for i in answer}
        except TypeError as exc:
            raise TypeError(f"give the indices as a set or list of ints, got {answer!r}") from exc
    if isinstance(answer, (bool, np.bool_)) or not isinstance(answer, (int, np.integer)):
        raise TypeError(f"give the count as an int, got {answer!r}")
    return int(answer)


_HINTS = {"bf16-in-1-2": "all numbers in [1, 2) share one exponent; how many fraction patterns are there?",
          "round-pattern": "split the 23 fraction bits into 7 kept bits, the guard bit and the rest; "
                           "a tie goes to the even neighbour",
          "which-round-up": "trace each sum: after the carry, look at the guard bit and whether any bit "
                            "below it is set"}


def check_answer(question: str, answer) -> None:
    """Check an exercise answer against a value computed from the library.

    Prints "correct" if right; raises AssertionError (with a hint) if wrong. ``answer=None`` means
    "not answered yet": a message is printed and nothing is checked.
    """
    reference = _reference(question)
    if answer is None:
        print(f"[{question}] no answer yet: replace None with yours and run this cell again.")
        return
    given = _normalise_answer(question, answer)
    if given != reference:
        raise AssertionError(f"[{question}] {answer!r} is not right. Hint: {_HINTS[question]}")
    print(f"[{question}] correct: {answer!r}")