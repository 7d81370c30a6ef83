"""Text for the GPT-2 chapter: a real corpus, byte-level tokens, and a *recorded* batch order.

Offline default (works everywhere, no network): the Python standard library's own source files,
shipped with every interpreter. Licence: Python Software Foundation License (PSF-2.0), which
permits copying and use. The files are read in sorted order and concatenated, so the corpus is
deterministic for a given Python version (the ``fingerprint`` says which bytes were used).
Tokens are bytes (vocabulary 256): no tokenizer to install.

Online (e.g. on Colab): :func:`download_gutenberg` fetches public-domain books from Project
Gutenberg into a cache directory with a progress bar; :func:`load_corpus` with
``source="gutenberg"``
tokenises them with ``tiktoken`` (GPT-2 BPE, vocabulary 50257) if it is installed, else as bytes.
Without a network connection it falls back to the standard library and says so.

The batch order is the paper's determinism trick (§3.1): the start offsets of every sequence of
every step are drawn once from a seed, saved to disk, and replayed identically by every run that
should see the same data in the same order (unstable run, stabilised run, fp32-O control).
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# Public-domain books on Project Gutenberg (ids): Pride and Prejudice, Moby-Dick, Frankenstein,
# A Tale of Two Cities, Sherlock Holmes, War and Peace.
GUTENBERG_IDS = (1342, 2701, 84, 98, 1661, 2600)
GUTENBERG_URL = "https://www.gutenberg.org/cache/epub/{id}/pg{id}.txt"


@dataclass
class Corpus:
    train: np.ndarray  # token ids (uint16)
    val: np.ndarray
    vocab_size: int
    source: str  # what was actually used
    fingerprint: str  # sha256 of the token stream (first 16 hex digits)

    def describe(self) -> str:
        return (
            f"{self.source}: {len(self.train):,} train + {len(self.val):,} val tokens, "
            f"vocab {self.vocab_size}, sha256 {self.fingerprint}"
        )


def stdlib_files() -> list[Path]:
    """The standard library's .py files (no site-packages, no test suites), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():  # unusual layouts: fall back to where the os module lives
        root = Path(os.__file__).parent
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p in ("site-packages", "dist-packages") or p.startswith("test") for p in rel[:-1]):
            continue
        files.append(path)
    return files


def stdlib_bytes(max_bytes: int | None = None) -> bytes:
    """The concatenated bytes of the standard library's sources (optionally only the first
    ``max_bytes``)."""
    chunks, total = [], 0
    for path in stdlib_files():
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if max_bytes is not None and total >= max_bytes:
            break
    blob = b"".join(chunks)
    if not blob:
        raise RuntimeError("found no Python standard-library sources to use as a corpus")
    return blob if max_bytes is None else blob[:max_bytes]


def download_gutenberg(cache_dir: str | Path = "~/.cache/lpfa_gutenberg", ids=GUTENBERG_IDS) -> str:
    """Download public-domain books once (progress bar), return their text. Needs a network."""
    import urllib.request

    from tqdm.std import tqdm

    cache = Path(cache_dir).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    texts = []
    for book in tqdm(ids, desc="Project Gutenberg books"):
        path = cache / f"pg{book}.txt"
        if not path.exists():
            with urllib.request.urlopen(GUTENBERG_URL.format(id=book), timeout=30) as r:
                path.write_bytes(r.read())
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n\n".join(texts)


def _tokenise_text(text: str) -> tuple[np.ndarray, int, str]:
    try:
        import tiktoken

        enc = tiktoken.get_encoding("gpt2")
        return np.array(enc.encode_ordinary(text), dtype=np.uint16), enc.n_vocab, "tiktoken gpt2"
    except Exception:  # tiktoken missing or its BPE files cannot be fetched offline
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16), 256, "bytes"


def load_corpus(
    source: str = "stdlib",
    max_bytes: int | None = None,
    val_fraction: float = 0.05,
    cache_dir: str | Path = "~/.cache/lpfa_gutenberg",
) -> Corpus:
    """Load and tokenise a corpus. ``source``: "stdlib" (offline default) or "gutenberg"
    (online)."""
    if source not in ("stdlib", "gutenberg"):
        raise ValueError(f"source must be 'stdlib' or 'gutenberg', got {source!r}")
    if not 0 < val_fraction < 0.5:
        raise ValueError(f"val_fraction must be in (0, 0.5), got {val_fraction}")
    used = source
    if source == "gutenberg":
        try:
            tokens, vocab, how = _tokenise_text(download_gutenberg(cache_dir))
            used = f"Project Gutenberg books {list(GUTENBERG_IDS)} ({how})"
        except OSError as err:
            print(
                f"[data] cannot download Project Gutenberg ({err.__class__.__name__}); "
                "falling back to the offline Python standard-library corpus"
            )
            source = "stdlib"
    if source == "stdlib":
        blob = stdlib_bytes(max_bytes)
        tokens, vocab = np.frombuffer(blob, dtype=np.uint8).astype(np.uint16), 256
        used = (
            f"Python {sysconfig.get_python_version()} standard-library sources (PSF licence, bytes)"
        )
    elif max_bytes is not None:
        tokens = tokens[:max_bytes]
    n_val = max(int(len(tokens) * val_fraction), 1)
    fingerprint = hashlib.sha256(tokens.tobytes()).hexdigest()[:16]
    return Corpus(tokens[:-n_val], tokens[-n_val:], vocab, used, fingerprint)


class BatchOrder:
    """The start offsets of every sequence of every step, drawn once and then replayed.

    ``offsets[step]`` holds ``batch_size`` start positions into the training tokens. Under
    DistributedDataParallel rank r of w takes rows r, r+w, r+2w, ... so the *global* batch of a
    step is the same whatever the number of GPUs.
    """

    def __init__(self, offsets: np.ndarray):
        if offsets.ndim != 2:
            raise ValueError(f"offsets must be (steps, batch), got shape {offsets.shape}")
        self.offsets = offsets

    @classmethod
    def draw(
        cls, n_tokens: int, steps: int, batch_size: int, block_size: int, seed: int
    ) -> BatchOrder:
        if n_tokens <= block_size + 1:
            raise ValueError(f"corpus of {n_tokens} tokens is too short for context {block_size}")
        rng = np.random.default_rng(seed)
        return cls(
            rng.integers(0, n_tokens - block_size - 1, size=(steps, batch_size), dtype=np.int64)
        )

    def save(self, path) -> None:
        np.save(path, self.offsets)

    @classmethod
    def load(cls, path) -> BatchOrder:
        return cls(np.load(path))

    @property
    def steps(self) -> int:
        return self.offsets.shape[0]

    def fingerprint(self) -> str:
        return hashlib.sha256(self.offsets.tobytes()).hexdigest()[:16]

    def batch(
        self,
        tokens: np.ndarray,
        step: int,
        block_size: int,
        rank: int = 0,
        world: int = 1,
        device="cpu",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets of ``step`` for this rank, shape (batch/world,
        block_size)."""
        if not 0 <= step < self.steps:
            raise IndexError(f"step {step} is outside the recorded order of {self.steps} steps")
        starts = self.offsets[step][rank::world]
        idx = starts[:, None] + np.arange(block_size + 1)[None, :]
        chunk = torch.from_numpy(tokens[idx].astype(np.int64))
        return chunk[:, :-1].to(device), chunk[:, 1:].to(device)


def eval_batches(
    tokens: np.ndarray, n_batches: int, batch_size: int, block_size: int, device="cpu"
):
    """A fixed set of validation batches (evenly spaced, no randomness)."""
    span = len(tokens) - block_size - 1
    starts = (
        np.linspace(0, span - 1, n_batches * batch_size)
        .astype(np.int64)
        .reshape(n_batches, batch_size)
    )
    out = []
    for row in starts:
        idx = row[:, None] + np.arange(block_size + 1)[None, :]
        chunk = torch.from_numpy(tokens[idx].astype(np.int64))
        out.append((chunk[:, :-1].to(device), chunk[:, 1:].to(device)))
    return out
