"""Carry a resumable run's checkpoint from one lent GPU machine to the next.

A run of the testbed needs about 16 minutes; a command may take 10, and a machine that sits
idle for 30 s goes back with its disk. So the first call packs what a resume needs (the
checkpoint, the log so far) into pieces small enough to come back from ``$OUT``; here the
pieces are joined and checked; the next call carries them to a fresh machine, where the run
resumes bit-identically (:mod:`.checkpoint`). On the GPU machine, after the first call's run::

    python -m kernels.gpt2.handoff pack --work /tmp/gpt2_search/testbed --run tb-Z-s2 --out $OUT

here, from the folder the files came back to::

    python -m kernels.gpt2.handoff unpack --pieces FILES_AT --to .scratch/gpt2_search/testbed

then the second call (``carry: [".scratch/gpt2_search"]``; the repository and the checkpoint
together must stay under the 64 MiB a call carries, so move ``results/`` out of the working
tree for that call) begins with ``cp -r .scratch/gpt2_search /tmp/ &&`` and runs the same
search command again. The batch order is drawn again from its seed: compare the two calls'
``batch_order_sha``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import tarfile
from pathlib import Path

SUFFIXES = (".ckpt.pt", ".json", ".csv", ".stdout")  # what a resume reads, and the log so far
PIECE_BYTES = 15 * 2**20  # files come back at most 16 MiB each
MANIFEST = "handoff.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(work: Path, run: str, out: Path, piece_bytes: int = PIECE_BYTES) -> list[Path]:
    """Write ``run``'s resume files from ``work`` into ``out`` as a tar cut into pieces
    (``handoff.tar.000``, ...) and a manifest of each file's sha256; return the pieces."""
    work, out = Path(work), Path(out)
    files = [work / f"{run}{suffix}" for suffix in SUFFIXES]
    if not files[0].exists():
        raise FileNotFoundError(f"no checkpoint {files[0]}: was the run resumable?")
    buffer, digests = io.BytesIO(), {}
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in (f for f in files if f.exists()):
            content = path.read_bytes()
            digests[path.name] = _sha256(content)
            info = tar.gettarinfo(path, arcname=path.name)
            tar.addfile(info, io.BytesIO(content))
    data = buffer.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    pieces = []
    for i, start in enumerate(range(0, len(data), piece_bytes)):
        piece = out / f"handoff.tar.{i:03d}"
        piece.write_bytes(data[start : start + piece_bytes])
        pieces.append(piece)
    manifest = {"run": run, "bytes": len(data), "pieces": len(pieces), "sha256": digests}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return pieces


def unpack(pieces: Path, dest: Path) -> dict:
    """Join the pieces in ``pieces``, check their length and every file's sha256 against the
    manifest, and extract the files into ``dest``; return the manifest."""
    pieces, dest = Path(pieces), Path(dest)
    manifest = json.loads((pieces / MANIFEST).read_text())
    parts = sorted(pieces.glob("handoff.tar.*"))
    if len(parts) != manifest["pieces"]:
        listed = manifest["pieces"]
        raise ValueError(f"{len(parts)} pieces in {pieces}, the manifest lists {listed}")
    data = b"".join(part.read_bytes() for part in parts)
    if len(data) != manifest["bytes"]:
        raise ValueError(f"the pieces hold {len(data):,} bytes, the manifest {manifest['bytes']:,}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for member in tar.getmembers():
            if member.name not in manifest["sha256"] or "/" in member.name:
                raise ValueError(f"unexpected file {member.name!r} in the pieces")
            content = tar.extractfile(member).read()
            if _sha256(content) != manifest["sha256"][member.name]:
                raise ValueError(f"{member.name} does not match its sha256 in the manifest")
            (dest / member.name).write_bytes(content)
    return manifest


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="step", required=True)
    packing = sub.add_parser("pack", help="on the GPU machine: resume files -> pieces in OUT")
    packing.add_argument("--work", required=True)
    packing.add_argument("--run", required=True)
    packing.add_argument("--out", required=True)
    unpacking = sub.add_parser("unpack", help="here: pieces -> checked files in TO")
    unpacking.add_argument("--pieces", required=True)
    unpacking.add_argument("--to", required=True)
    args = parser.parse_args(argv)
    if args.step == "pack":
        made = pack(Path(args.work), args.run, Path(args.out))
        print(f"{args.run}: {len(made)} pieces in {args.out}")
    else:
        manifest = unpack(Path(args.pieces), Path(args.to))
        print(f"{manifest['run']}: {len(manifest['sha256'])} files checked into {args.to}")


if __name__ == "__main__":
    main()
