"""kernels.tools.glue stores plain Python numbers, which MyST-NB's {glue:text} can format."""

import numpy as np
import torch

from kernels.tools import glue as glue_module


def test_numpy_and_torch_scalars_are_stored_as_python_numbers(monkeypatch):
    stored = {}
    monkeypatch.setattr(
        "myst_nb.glue", lambda name, value, display=False: stored.update({name: value})
    )
    x = float(np.random.default_rng().uniform(1, 100))
    glue_module.glue("a", np.float64(x))
    glue_module.glue("b", torch.tensor(x, dtype=torch.float64))
    glue_module.glue("c", np.int64(7))
    assert stored == {"a": x, "b": x, "c": 7}
    assert all(type(v) in (float, int) for v in stored.values())
    assert repr(stored["a"]) == repr(x)  # what {glue:text}`a:.2f` parses


def test_glue_all_stores_every_number_under_its_name(monkeypatch):
    stored = {}
    monkeypatch.setattr(
        "myst_nb.glue", lambda name, value, display=False: stored.update({name: value})
    )
    x = float(np.random.default_rng().uniform(1, 100))
    glue_module.glue_all({"a": np.float64(x), "b": 3, "c": torch.tensor(x)})
    assert stored == {"a": x, "b": 3, "c": float(torch.tensor(x))}
