"""The first-call measurement of ``kernels.gpu.check`` (kernels.gpu.first_call, issue 28), on the
CPU at tiny lengths (in the Triton interpreter nothing is autotuned, so only the logic runs):
the report's fields, a fresh Triton cache folder inside the measurement and the old one after,
the switch restored, and lengths outside the warm-up's bucket refused."""

from __future__ import annotations

import pytest
from triton import knobs

import kernels  # noqa: F401
from kernels.attention import launch
from kernels.env import native_bf16
from kernels.gpu import first_call

pytestmark = pytest.mark.skipif(native_bf16(), reason="kernels.gpu.check runs it on a GPU")


def test_first_calls_reports_each_new_length_with_the_switch_on_and_off(monkeypatch):
    folders = []
    timed = first_call.first_call_seconds

    def seconds(n, shape, device):
        folders.append((n, knobs.cache.dir, launch.SPEEDUPS["tune_by_bucket"]))
        return timed(n, shape, device)

    monkeypatch.setattr(first_call, "first_call_seconds", seconds)
    before = knobs.cache.dir
    report = first_call.first_calls(
        20, {"on": (21, 30), "off": (22,)}, (1, 1, 16), "cpu", log=lambda *a: None
    )
    assert report["bucket"] == 128 and report["warm_up"]["n"] == 20
    assert [r["n"] for r in report["on"]] == [21, 30] and [r["n"] for r in report["off"]] == [22]
    assert all(r["seconds"] > 0 for r in (report["warm_up"], *report["on"], *report["off"]))
    assert [(n, switch) for n, _, switch in folders] == [
        (20, True),
        (21, True),
        (30, True),
        (22, False),
    ]
    assert len({folder for _, folder, _ in folders}) == 1 and folders[0][1] != before
    assert knobs.cache.dir == before and launch.SPEEDUPS["tune_by_bucket"] is True


def test_first_calls_refuses_lengths_of_another_bucket():
    with pytest.raises(ValueError, match="bucket 1024"):
        first_call.first_calls(1000, {"on": (1030,), "off": ()}, device="cpu")
