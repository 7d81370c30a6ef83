"""Values as plain data, for the grader and its workers (:mod:`.isolate`, :mod:`.worker`).

:func:`encode` turns ints, floats, strings, containers, NumPy arrays and tensors into JSON-able
lists; :func:`decode` builds them back, and builds nothing else: no pickled objects cross
between the grader and a student's answer. This file imports only the standard library (NumPy
and PyTorch when a value needs them): the worker loads it by its path, without the book's
package.
"""

from __future__ import annotations

import base64
import re
import sys


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def encode(x, depth: int = 0):
    """``x`` as JSON-able plain data; anything else becomes ``["unsupported", type name]``."""
    import numpy as np

    kind = type(x)
    if depth > 30:
        return ["unsupported", "a value nested too deeply"]
    if x is None or kind in (bool, str):
        return ["py", x]
    if kind is int:
        return ["int", str(x)]
    if kind is float:
        return ["float", repr(x)]
    if kind in (tuple, list, set, frozenset):
        return [kind.__name__, [encode(v, depth + 1) for v in x]]
    if kind is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]]
    if isinstance(x, np.generic) and np.asarray(x).dtype.kind in "biufc":
        arr = np.asarray(x)
        return ["npscalar", arr.dtype.str, _b64(arr.tobytes())]
    if kind is np.ndarray and x.dtype.kind in "biufc":
        arr = np.ascontiguousarray(x)
        return ["ndarray", arr.dtype.str, list(arr.shape), _b64(arr.tobytes())]
    torch = sys.modules.get("torch")
    if torch is not None and kind in (torch.Tensor, torch.nn.Parameter):
        t = x.detach().cpu()
        name = str(t.dtype).replace("torch.", "")
        size = t.untyped_storage().nbytes() // max(t.element_size(), 1)
        if t.numel() and size <= 4 * t.numel() + 1024:
            # a view keeps its storage: a check may put a trap just past the view's end
            base = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (size,), (1,))
            layout = [list(t.stride()), t.storage_offset()]
        else:
            base, layout = t.contiguous().reshape(-1), None
        raw = (base.view(torch.int16) if t.dtype == torch.bfloat16 else base).numpy().tobytes()
        return ["tensor", name, list(t.shape), _b64(raw), layout]
    return ["unsupported", kind.__name__]


_TORCH_DTYPES = {
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
}


class _Opaque:
    """What a value that is not plain data becomes: an object of a class with its type name."""


def decode(obj):
    """The value :func:`encode` made plain; builds only builtins, NumPy arrays and tensors."""
    import numpy as np

    tag, *rest = obj
    if tag == "py":
        value = rest[0]
        if value is None or type(value) in (bool, str):
            return value
    elif tag == "int":
        return int(rest[0])
    elif tag == "float":
        return float(rest[0])
    elif tag in ("tuple", "list", "set", "frozenset"):
        items = [decode(v) for v in rest[0]]
        return {"tuple": tuple, "list": list, "set": set, "frozenset": frozenset}[tag](items)
    elif tag == "dict":
        return {decode(k): decode(v) for k, v in rest[0]}
    elif tag in ("npscalar", "ndarray"):
        dtype = np.dtype(rest[0])
        if dtype.kind not in "biufc":
            raise ValueError("not a numeric array")
        raw = base64.b64decode(rest[-1])
        if tag == "npscalar":
            return np.frombuffer(raw, dtype=dtype)[0]
        shape = [int(s) for s in rest[1]]
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    elif tag == "tensor":
        import torch

        name, shape, raw = rest[0], [int(s) for s in rest[1]], base64.b64decode(rest[2])
        layout = rest[3] if len(rest) > 3 else None
        if name not in _TORCH_DTYPES:
            raise ValueError("not a tensor dtype")
        dtype = np.dtype("int16" if name == "bfloat16" else name)
        flat = torch.from_numpy(np.frombuffer(raw, dtype=dtype).copy())
        if name == "bfloat16":
            flat = flat.view(torch.bfloat16)
        if layout is None:
            return flat.reshape(shape)
        stride, offset = [int(v) for v in layout[0]], int(layout[1])
        needed = offset + sum((n - 1) * st for n, st in zip(shape, stride)) + 1
        if min(shape, default=1) > 0 and (min(stride, default=0) < 0 or needed > flat.numel()):
            raise ValueError("a tensor view outside its storage")
        return flat.as_strided(shape, stride, offset)
    elif tag == "unsupported":
        name = re.sub(r"\W", "", str(rest[0]))[:40] or "object"
        return type(name, (_Opaque,), {})()
    raise ValueError(f"not plain data: {tag!r}")
