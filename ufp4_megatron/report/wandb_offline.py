"""Reads an offline W&B run (`wandb/offline-run-*/run-*.wandb`) without network or wandb's
sync service: the file is a LevelDB-style log (32 KiB blocks of CRC-framed chunks) of
`wandb_internal_pb2.Record` protobufs after a 7-byte ':W&B' header."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

_BLOCK = 32 * 1024
_HEADER = 7  # b":W&B", magic 0xBEE1, version
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str | Path) -> Iterator:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file (no ':W&B' header)")
    pos, parts = _HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == _FULL:
            parts = chunk
        elif kind == _FIRST:
            parts = chunk
            continue
        elif kind == _MIDDLE:
            parts += chunk
            continue
        elif kind == _LAST:
            parts += chunk
        else:  # zero padding at the end of a file being written
            break
        rec = pb.Record()
        rec.ParseFromString(parts)
        yield rec


def find_run_file(run_dir: str | Path) -> Path:
    """The .wandb file of an offline run dir, or of the single one under a training run dir."""
    run_dir = Path(run_dir)
    found = sorted(run_dir.glob("run-*.wandb")) or sorted(
        run_dir.glob("**/offline-run-*/run-*.wandb")
    )
    if not found:
        raise FileNotFoundError(f"no offline W&B run file (run-*.wandb) under {run_dir}")
    return found[-1]


def read_run(path: str | Path) -> dict:
    """{'name', 'group', 'job_type', 'config', 'history': [ {key: value, ...} per logged step ],
    'summary': {key: value}, 'metrics': {name or glob: step metric} (from define_metric)}."""
    out = {
        "name": None,
        "group": None,
        "job_type": None,
        "config": {},
        "history": [],
        "summary": {},
        "metrics": {},
    }
    for rec in records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["name"], out["group"] = rec.run.display_name, rec.run.run_group
            out["job_type"] = rec.run.job_type
            for item in rec.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = {}
            for item in rec.history.item:
                key = item.key or ".".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            out["history"].append(row)
        elif kind == "summary":
            for item in rec.summary.update:
                out["summary"][item.key or ".".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "metric" and (rec.metric.name or rec.metric.glob_name):
            out["metrics"][rec.metric.name or rec.metric.glob_name] = rec.metric.step_metric
    return out
