"""Part files and the manifest of a batch job: each written to a temporary name, fsynced, then
renamed into place whole, so a reader (or a restarted job) sees a part entirely or not at all.

A part ``k`` is done when its marker ``part-<k>.done`` is in place beside both of its files: its
errors file (``part-<k>.errors.jsonl``) and its output (``part-<k>.<ext>``) are renamed into place
first, the marker last, so a part whose marker is missing (a kill between the writes) or whose
files are not both there is run again whole. The manifest records the job (its
input's digest, the model versions resolved at the start, the plan's size) and the parts done;
the files are the truth, the manifest a summary rebuilt from them on each start.

The Parquet layout, one row per text: ``id`` (string; from OpenAI Batch lines the
``custom_id``, then ``input`` int32, the text's place in the line's body), one column per
output kind asked, then ``model`` (string) and ``version`` (int64). The output columns follow
modelformat/outputs.py's kinds: ``dense`` is ``embedding`` fixed_size_list<float32>[dim];
``sparse`` is ``sparse_indices`` list<int32> and ``sparse_values`` list<float32> (largest weight
first); ``multivector`` is ``token_vectors`` list<fixed_size_list<float32>[dim]>
(``output_columns``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"  # a part's error lines: part-<k>.errors.jsonl
DONE = "done"  # a part's marker: part-<k>.done, written after both of its files
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def output_columns(kind: str, dim: int) -> list[tuple[str, pa.DataType]]:
    """Return the Parquet columns of one output kind (modelformat/outputs.py's KINDS)."""
    vector = pa.list_(pa.float32(), dim)
    if kind == "dense":
        return [("embedding", vector)]
    if kind == "sparse":
        return [("sparse_indices", pa.list_(pa.int32())), ("sparse_values", pa.list_(pa.float32()))]
    if kind == "multivector":
        return [("token_vectors", pa.list_(vector))]
    raise ValueError(f"unknown output kind {kind!r}")


def parquet_schema(
    kinds: Sequence[str], dim: int, with_input: bool = False, token_dim: int | None = None
) -> pa.Schema:
    """Return the schema of a job's Parquet parts: id (and input), the kinds' columns, model,
    version; ``token_dim`` is the multi-vectors' dimension (default ``dim``)."""
    columns = [("id", pa.string())]
    if with_input:
        columns.append(("input", pa.int32()))
    for kind in kinds:
        columns += output_columns(kind, token_dim if kind == "multivector" and token_dim else dim)
    return pa.schema([*columns, ("model", pa.string()), ("version", pa.int64())])


def table(
    records: Sequence[Mapping[str, Any]],
    kinds: Sequence[str],
    with_input: bool,
    dims: tuple[int, int] = (0, 0),
) -> pa.Table:
    """Return the Parquet table of ``records`` (dicts of ``id``, ``input``, ``embedding``
    [dim], ``sparse_indices`` / ``sparse_values``, ``token_vectors`` [rows, dim], ``model``,
    ``version``), with the columns of ``kinds``; ``dims`` (the dense and the multi-vectors'
    dimension) size the columns of a part without records (every row of it failed)."""
    dim, token_dim = dims
    if records and "dense" in kinds:
        dim = int(np.shape(records[0]["embedding"])[-1])
    if records and "multivector" in kinds:
        token_dim = int(np.shape(records[0]["token_vectors"])[-1])
    schema = parquet_schema(kinds, dim, with_input, token_dim)
    arrays: list[pa.Array] = [pa.array([r["id"] for r in records], pa.string())]
    if with_input:
        arrays.append(pa.array([r["input"] for r in records], pa.int32()))
    for kind in kinds:
        if kind == "dense":
            flat = np.asarray([r["embedding"] for r in records], np.float32).reshape(-1)
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(flat), dim))
        elif kind == "sparse":
            arrays.append(_ragged([r["sparse_indices"] for r in records], np.int32, 0))
            arrays.append(_ragged([r["sparse_values"] for r in records], np.float32, 0))
        else:
            arrays.append(_ragged([r["token_vectors"] for r in records], np.float32, token_dim))
    arrays.append(pa.array([r["model"] for r in records], pa.string()))
    arrays.append(pa.array([r["version"] for r in records], pa.int64()))
    return pa.Table.from_arrays(arrays, schema=schema)


def _ragged(rows: Sequence[Any], dtype: Any, dim: int) -> pa.Array:
    """Return a list array of ``rows`` (1-d arrays; with ``dim``: [n, dim] matrices as lists
    of fixed-size lists)."""
    values = [np.asarray(row, dtype) for row in rows]
    offsets = np.zeros(len(values) + 1, np.int32)
    offsets[1:] = np.cumsum([v.shape[0] for v in values])
    flat = np.concatenate([v.reshape(-1) for v in values]) if values else np.zeros(0, dtype)
    inner: pa.Array = pa.array(flat)
    if dim:
        inner = pa.FixedSizeListArray.from_arrays(inner, dim)
    return pa.ListArray.from_arrays(pa.array(offsets), inner)


def dense_table(
    ids: Sequence[str], vectors: np.ndarray, models: Sequence[str], versions: Sequence[int]
) -> pa.Table:
    """Return the Parquet table of dense rows (``vectors`` float32 ``[rows, dim]``)."""
    dim = int(vectors.shape[1]) if vectors.ndim == 2 else 0
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    return pa.Table.from_arrays(
        [pa.array(ids, pa.string()), pa.FixedSizeListArray.from_arrays(flat, dim),
         pa.array(models, pa.string()), pa.array(versions, pa.int64())],
        schema=parquet_schema(["dense"], dim),
    )  # fmt: skip


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole: a temporary file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    _sync_dir(path.parent)


def write_table(path: Path, table: pa.Table) -> None:
    """Write ``table`` as Parquet to ``path`` whole (as ``write_atomic``)."""
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    with open(tmp, "rb") as written:
        os.fsync(written.fileno())
    os.replace(tmp, path)
    _sync_dir(path.parent)


def jsonl(lines: Iterable[Mapping[str, Any]]) -> bytes:
    """Return ``lines`` as JSON Lines bytes (numpy arrays as lists)."""
    return b"".join(orjson.dumps(line, option=_NUMPY) + b"\n" for line in lines)


def part_name(index: int, ext: str) -> str:
    """Return part ``index``'s file name (``ext``: parquet, jsonl, errors.jsonl or done)."""
    return f"part-{index:05d}.{ext}"


def done_parts(out_dir: Path, ext: str) -> set[int]:
    """Return the indices of the parts done: their marker (written last) in place, and both of
    their files (output and errors)."""
    found = set()
    for path in out_dir.glob("part-*.done"):
        stem = path.name[len("part-") : -len(".done")]
        if not stem.isdigit():
            continue
        k = int(stem)
        if (out_dir / part_name(k, ext)).exists() and (out_dir / part_name(k, ERRORS)).exists():
            found.add(k)
    return found


def mark_done(out_dir: Path, k: int, rows: int, error_lines: int) -> None:
    """Write part ``k``'s marker (after both of its files): the part is done."""
    body = {"rows": rows, "error_lines": error_lines}
    write_atomic(out_dir / part_name(k, DONE), json.dumps(body).encode() + b"\n")


def undo_part(out_dir: Path, k: int) -> None:
    """Remove part ``k``'s marker before it is written again (a rerun of a part half written)."""
    (out_dir / part_name(k, DONE)).unlink(missing_ok=True)


def read_manifest(out_dir: Path, name: str = MANIFEST) -> dict[str, Any] | None:
    """Return the manifest in ``out_dir`` (None when there is none yet)."""
    path = out_dir / name
    if not path.exists():
        return None
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return manifest


def write_manifest(out_dir: Path, manifest: Mapping[str, Any], name: str = MANIFEST) -> None:
    """Write the manifest whole."""
    write_atomic(out_dir / name, json.dumps(manifest, indent=1, sort_keys=True).encode() + b"\n")


def concatenate(paths: Sequence[Path], target: Path) -> int:
    """Write the files ``paths`` one after the other to ``target`` whole; return its lines."""
    data = b"".join(path.read_bytes() for path in paths)
    write_atomic(target, data)
    return data.count(b"\n")


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
