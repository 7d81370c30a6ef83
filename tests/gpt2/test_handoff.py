"""Carrying a run's checkpoint between machines (kernels.gpt2.handoff): the pieces come back
whole, a corrupted or missing piece is refused, and a run without a checkpoint is named."""

import os

import pytest

from kernels.gpt2 import handoff


def _work(tmp_path, run="tb-Z-s2"):
    work = tmp_path / "work"
    work.mkdir()
    files = {
        f"{run}.ckpt.pt": os.urandom(70_000),  # fresh bytes each run
        f"{run}.json": os.urandom(5_000),
        f"{run}.csv": os.urandom(3_000),
        f"{run}.stdout": b"step 100\n",
        "other-run.ckpt.pt": os.urandom(100),  # not this run's: stays behind
    }
    for name, data in files.items():
        (work / name).write_bytes(data)
    return work, files


def test_the_pieces_come_back_as_the_files_they_were(tmp_path):
    work, files = _work(tmp_path)
    pieces = handoff.pack(work, "tb-Z-s2", tmp_path / "out", piece_bytes=16_384)
    assert len(pieces) > 4 and all(p.stat().st_size <= 16_384 for p in pieces)
    manifest = handoff.unpack(tmp_path / "out", tmp_path / "back")
    back = {p.name: p.read_bytes() for p in (tmp_path / "back").iterdir()}
    assert back == {k: v for k, v in files.items() if k.startswith("tb-Z-s2")}
    assert manifest["run"] == "tb-Z-s2"


def test_a_corrupted_or_missing_piece_is_refused(tmp_path):
    work, _ = _work(tmp_path)
    pieces = handoff.pack(work, "tb-Z-s2", tmp_path / "out", piece_bytes=16_384)
    data = bytearray(pieces[1].read_bytes())
    data[100] ^= 0xFF  # one flipped byte inside the checkpoint's bytes
    pieces[1].write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        handoff.unpack(tmp_path / "out", tmp_path / "back")
    pieces[2].unlink()
    with pytest.raises(ValueError, match="pieces"):
        handoff.unpack(tmp_path / "out", tmp_path / "back2")


def test_a_run_without_a_checkpoint_is_named(tmp_path):
    work, _ = _work(tmp_path)
    with pytest.raises(FileNotFoundError, match="tb-P-s9.ckpt.pt"):
        handoff.pack(work, "tb-P-s9", tmp_path / "out")
