"""Read a ``torch.save``'d state_dict (a ``.pt`` file) without torch: a restricted unpickler.

The product never imports torch (requirements-dev.txt has it for tests only), yet FlagEmbedding's
BGE-M3 layout keeps its two heads as ``torch.save(linear.state_dict())`` files
(``sparse_linear.pt``, ``colbert_linear.pt``). Such a file is a zip archive: ``<name>/data.pkl``
(a pickle of the dict), ``<name>/data/<key>`` (each storage's raw bytes) and
``<name>/byteorder``. The pickle names a handful of globals (``collections.OrderedDict``,
``torch._utils._rebuild_tensor_v2``, the typed storages ``torch.FloatStorage`` ...) and refers
to the storages by persistent id ``("storage", <storage type>, <key>, <location>, <numel>)``.

``read_state_dict`` allows exactly those globals (anything else — a pickle that would run code,
an unknown dtype, a storage outside the archive — is an ExportError naming the file) and maps each
storage to a numpy array: float32, float16 and bfloat16 (widened to float32: numpy has none).
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from export.errors import ExportError

# torch's typed storage names -> (numpy dtype of the raw bytes, whether it is bfloat16)
STORAGES = {"FloatStorage": ("<f4", False), "HalfStorage": ("<f2", False),
            "BFloat16Storage": ("<u2", True)}  # fmt: skip


class _Storage:
    """A storage's type as the pickle names it (``torch.FloatStorage`` ...)."""

    def __init__(self, name: str) -> None:
        self.name = name


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple[int, ...],
                    stride: tuple[int, ...], *_rest: Any) -> np.ndarray:  # fmt: skip
    """Return the tensor ``size``/``stride`` view of ``storage`` from ``offset``, as a copy."""
    if any(n < 0 for n in size) or any(s < 0 for s in stride) or len(size) != len(stride):
        raise ValueError(f"bad tensor geometry size {size} stride {stride}")
    if not all(size):
        return np.zeros(size, storage.dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if offset < 0 or last >= len(storage):
        raise ValueError(f"tensor of size {size} reaches past its storage ({len(storage)} values)")
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=[s * storage.itemsize for s in stride]
    )
    return np.array(view)


def _rebuild_parameter(data: np.ndarray, *_rest: Any) -> np.ndarray:
    return data


ALLOWED = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, root: str) -> None:
        super().__init__(io.BytesIO(data))
        self.archive, self.root = archive, root

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in STORAGES:
            return _Storage(name)
        found = ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        return found

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        kind, key, numel = pid[1], str(pid[2]), int(pid[4])
        if not isinstance(kind, _Storage):
            raise pickle.UnpicklingError(f"storage type {kind!r} is not one of {list(STORAGES)}")
        dtype, bf16 = STORAGES[kind.name]
        try:
            raw = self.archive.read(f"{self.root}/data/{key}")
        except KeyError as exc:
            raise pickle.UnpicklingError(f"storage {key} is not in the archive") from exc
        values = np.frombuffer(raw, dtype=dtype)
        if len(values) < numel:
            raise pickle.UnpicklingError(f"storage {key} has {len(values)} values, not {numel}")
        values = values[:numel]
        return (values.astype(np.uint32) << 16).view(np.float32) if bf16 else values


def read_state_dict(path: str | Path) -> dict[str, np.ndarray]:
    """Return the tensors of the ``torch.save``'d state_dict at ``path`` (float32/float16
    arrays; bfloat16 widened to float32). Raises ExportError naming the file for anything else."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise ExportError(f"{path}: not a torch.save zip archive (no <name>/data.pkl)")
            root = pickles[0][: -len("/data.pkl")]
            order = f"{root}/byteorder"
            if order in archive.namelist() and archive.read(order).strip() != b"little":
                raise ExportError(f"{path}: big-endian storages are not read")
            state = _Unpickler(archive.read(pickles[0]), archive, root).load()
    except ExportError:
        raise
    except FileNotFoundError as exc:
        raise ExportError(f"missing file: {path}") from exc
    except (OSError, zipfile.BadZipFile) as exc:
        raise ExportError(f"cannot read {path}: {exc} (torch.save's zip format expected)") from exc
    except (pickle.UnpicklingError, ValueError, TypeError, AttributeError, EOFError) as exc:
        raise ExportError(f"{path}: refused: {exc} (only a state_dict of float32, float16 or "
                          "bfloat16 tensors is read)") from exc  # fmt: skip
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in state.items()
    ):
        raise ExportError(f"{path}: not a state_dict (a dict of tensor names to tensors)")
    return dict(state)
