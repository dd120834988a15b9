"""Finetuning data: files read whole, one (source, target) pair per sample, by a named layout.

Files are JSON lines or one JSON list (``.json`` / ``.jsonl`` alike: the first character decides).
Layouts say which fields make the pair:

==============  =====================================================  ==========================================
layout          source                                                 target
==============  =====================================================  ==========================================
``dureaderqg``  ``答案：{answer}，上下文：{context}`` (PaddleNLP's GLM     ``在已知答案的前提下，问题：{question}``
                recipe; ``title``/``source`` name answer/context too)  (``target`` names the question too)
``adgen``       ``content``                                            ``summary``
``belle``       ``instruction`` then ``input`` on a new line           ``output``
``plain``       ``--source_field`` (``source``)                        ``--target_field`` (``target``)
==============  =====================================================  ==========================================

A sample that lacks a field is one error naming the file, the line and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

LAYOUTS = ("plain", "dureaderqg", "adgen", "belle")


class DataError(ValueError):
    """A data file that cannot be read as finetuning samples (the message names file, line and field)."""


@dataclass(frozen=True)
class Pair:
    source: str
    target: str


def read_records(path: str | Path) -> list[tuple[int, dict]]:
    """``(line number, record)`` for each sample of a JSON-lines file or a JSON list."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such data file")
    text = path.read_text(encoding="utf-8-sig")
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
        pairs = [(i + 1, r) for i, r in enumerate(records)]  # item numbers, for a list
    else:
        pairs = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                pairs.append((number, json.loads(line)))
            except json.JSONDecodeError as error:
                raise DataError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from None
    for number, record in pairs:
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: a sample must be a JSON object, not {type(record).__name__}")
    return pairs


def _field(record: dict, names: tuple[str, ...], path, number) -> str:
    for name in names:
        if name in record:
            value = record[name]
            if not isinstance(value, str):
                raise DataError(f"{path}:{number}: field {name!r} must be a string, not {type(value).__name__}")
            return value
    raise DataError(f"{path}:{number}: sample lacks the field {' / '.join(repr(n) for n in names)}")


def to_pair(record: dict, layout: str, path, number, source_field="source", target_field="target",
            require_target: bool = True) -> Pair:
    if not require_target:  # samples to predict: a missing target is an empty one
        target_names = {"plain": (target_field,), "dureaderqg": ("question", "target"), "adgen": ("summary",),
                        "belle": ("output",)}.get(layout, ())
        if not any(name in record for name in target_names):
            record = {**record, target_names[0]: ""} if target_names else record
    get = lambda *names: _field(record, names, path, number)  # noqa: E731
    if layout == "plain":
        return Pair(get(source_field), get(target_field))
    if layout == "dureaderqg":
        answer, context = get("answer", "title"), get("context", "source")
        return Pair(f"答案：{answer}，上下文：{context}", f"在已知答案的前提下，问题：{get('question', 'target')}")
    if layout == "adgen":
        return Pair(get("content"), get("summary"))
    if layout == "belle":
        extra = record.get("input") or ""
        if not isinstance(extra, str):
            raise DataError(f"{path}:{number}: field 'input' must be a string, not {type(extra).__name__}")
        instruction = get("instruction")
        return Pair(f"{instruction}\n{extra}" if extra else instruction, get("output"))
    raise DataError(f"unknown data layout {layout!r}; choose from {', '.join(LAYOUTS)}")


def read_pairs(path: str | Path, layout: str = "plain", source_field="source", target_field="target",
               require_target: bool = True) -> list[Pair]:
    """All samples of ``path`` as (source, target) pairs; an empty file is an error. With
    ``require_target=False`` (prediction) a sample may lack its target."""
    pairs = [to_pair(r, layout, path, n, source_field, target_field, require_target) for n, r in read_records(path)]
    if not pairs:
        raise DataError(f"{path}: no samples")
    return pairs
