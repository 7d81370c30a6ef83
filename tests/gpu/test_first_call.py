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
        switches = launch.SPEEDUPS["tune_by_bucket"], launch.SPEEDUPS["nearest_bucket"]
        folders.append((n, knobs.cache.dir, switches))
        return timed(n, shape, device)

    monkeypatch.setattr(first_call, "first_call_seconds", seconds)
    before, nearest = knobs.cache.dir, launch.SPEEDUPS["nearest_bucket"]
    report = first_call.first_calls(
        20, {"on": (21, 30), "off": (22,)}, (1, 1, 16), "cpu", log=lambda *a: None, nearest=(200,)
    )
    assert report["bucket"] == 128 and report["warm_up"]["n"] == 20
    assert [r["n"] for r in report["on"]] == [21, 30] and [r["n"] for r in report["off"]] == [22]
    assert report["nearest"] == [dict(n=200, bucket=256, seconds=report["nearest"][0]["seconds"])]
    timed_calls = (report["warm_up"], *report["on"], *report["off"], *report["nearest"])
    assert all(r["seconds"] > 0 for r in timed_calls)
    assert [(n, switch) for n, _, switch in folders] == [
        (20, (True, False)),
        (21, (True, False)),
        (30, (True, False)),
        (22, (False, False)),
        (200, (True, True)),
    ]
    assert len({folder for _, folder, _ in folders}) == 1 and folders[0][1] != before
    assert knobs.cache.dir == before and launch.SPEEDUPS["tune_by_bucket"] is True
    assert launch.SPEEDUPS["nearest_bucket"] is nearest


def test_first_calls_refuses_lengths_of_another_bucket():
    with pytest.raises(ValueError, match="bucket 1024"):
        first_call.first_calls(1000, {"on": (1030,), "off": ()}, device="cpu")
    with pytest.raises(ValueError, match="outside bucket 1024"):
        first_call.first_calls(1000, {"on": (1010,), "off": ()}, device="cpu", nearest=(1020,))
