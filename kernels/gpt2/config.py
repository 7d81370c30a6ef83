"""One GPT-2 run's options: :class:`TrainConfig`, the training settings and the attention specs of
its layers, checked once when it is made and written to JSON once, the form in which
:mod:`.search` hands a run to its training process (``python -m kernels.gpt2.train --config``)
and in which a run's log stores it (``config``).

The attention specs stay in their human-readable spelling (``attn="paper:delta=o,obits=4"``,
``layer_attn="0=paper:delta=o;1=sdpa"``: layer overrides, 0-based); they are parsed into
:class:`kernels.gpt2.attention.AttnSpec` here and nowhere else on the way to the model.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from .attention import AttnSpec, parse_spec
from .model import GPTConfig


@dataclass
class TrainConfig:
    name: str = "run"
    # model
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    block_size: int = 256
    attn: str = "sdpa"
    layer_attn: str = ""  # "1=paper;3=paper:delta=o_fp32" overrides single layers (0-based)
    qk_norm: bool = False
    # optimisation
    steps: int = 2000
    batch_size: int = 64  # global sequences per step (split across GPUs under DDP)
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup: int = 200
    decay_steps: int = 0  # cosine decay ends here (0 = at ``steps``); min_lr after it
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    seed: int = 0  # model initialisation
    data_seed: int = 0  # the batch order
    # data
    data: str = "stdlib"
    max_bytes: int = 0  # 0 = the whole corpus
    batch_order: str = ""  # .npy of recorded offsets; drawn from data_seed and saved if missing
    # precision and device
    autocast: str = "bf16"  # "bf16" or "off"
    device: str = "auto"
    cuda_graph: bool = False  # replay each step as a CUDA graph (one GPU): same numbers, faster
    # logging
    out_dir: str = "runs"
    log_every: int = 10
    monitor_every: int = 100  # diagnostics (norms, ties, shadow δ pass); 0 = never
    eval_every: int = 0
    max_minutes: float = 0.0  # stop this call after this wall time (0 = no limit)
    stop_at: int = 0  # stop this call at this step, to resume later (0 = never)
    stop_after_explosion: int = (
        0  # stop once the loss has stayed exploded this many steps (0 = never)
    )
    checkpoint_every: int = 0
    resume: bool = False
    progress: bool = True

    def __post_init__(self):
        if self.autocast not in ("bf16", "off"):
            raise ValueError(f"TrainConfig.autocast must be 'bf16' or 'off', got {self.autocast!r}")
        self._specs = _attention_specs(self)  # every spec parsed here, once

    def model_config(self, vocab_size: int) -> GPTConfig:
        attn, layer_attn = self._specs
        return GPTConfig(
            vocab_size=vocab_size,
            block_size=self.block_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
            attn=attn,
            layer_attn=layer_attn,
            qk_norm=self.qk_norm,
        )

    def write_json(self, path) -> None:
        """Write every option to ``path`` (JSON); :meth:`read_json` gives the same config back."""
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def read_json(cls, path) -> TrainConfig:
        """The config :meth:`write_json` wrote; an option it does not know is an error."""
        options = json.loads(Path(path).read_text())
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{path}: unknown TrainConfig options {unknown}")
        return cls(**options)


def _parsed(field: str, text: str) -> AttnSpec:
    try:
        return parse_spec(text)
    except (TypeError, ValueError) as err:
        raise ValueError(f"TrainConfig.{field}: {err}") from None


def _attention_specs(cfg: TrainConfig) -> tuple[AttnSpec, dict[int, AttnSpec]]:
    """(the spec of every layer, {layer: its own spec}) of ``cfg``, with errors that name the
    option at fault."""
    layer_attn = {}
    for item in filter(None, cfg.layer_attn.split(";")):
        layer, eq, spec = item.partition("=")
        if not eq or not layer.strip().isdigit():
            raise ValueError(f"TrainConfig.layer_attn: item {item!r} is not 'layer=spec'")
        if int(layer) >= cfg.n_layer:
            raise ValueError(
                f"TrainConfig.layer_attn: layer {layer} of a model of {cfg.n_layer} (0-based)"
            )
        layer_attn[int(layer)] = _parsed("layer_attn", spec)
    return _parsed("attn", cfg.attn), layer_attn
