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

``conversations`` (ChatGLM3 ``finetune_demo``): the field ``conversations``, a list of ``{"role", "content"
[, "metadata"]}`` turns (roles system/user/assistant/observation; ``tools`` on the system turn), kept whole in
``Pair.messages``; ``source`` is the turn before the last assistant turn, ``target`` that turn's content.

``history_column`` (THUDM ChatGLM2 ``ptuning``'s ``--history_column``): the field holding a list of
``[query, response]`` pairs that came before the sample's prompt/response (any layout but conversations),
kept in ``Pair.history``.

A sample that lacks a field is one error naming the file, the line and the field; a conversation whose roles
do not alternate (a system turn only first; user -> assistant; assistant -> user, observation or assistant;
observation -> assistant) or that has no assistant turn is one error naming the file and the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

LAYOUTS = ("plain", "dureaderqg", "adgen", "belle", "conversations")
ROLES = ("system", "user", "assistant", "observation")
# Which role may follow which in a conversation (None: the first turn).
FOLLOWS = {None: ("system", "user"), "system": ("user",), "user": ("assistant",),
           "assistant": ("user", "observation", "assistant"), "observation": ("assistant",)}


class DataError(ValueError):
    """A data file that cannot be read as finetuning samples (the message names file, line and field)."""


@dataclass(frozen=True)
class Pair:
    source: str
    target: str
    # ``(query, response)`` turns before ``source`` (THUDM ChatGLM2's history_column); empty: one turn.
    history: tuple = ()
    # The whole conversation (``conversations`` layout): message dicts ``{"role", "content"[, "metadata"]
    # [, "tools"]}``; empty for the other layouts. ``source`` is then the turn before the last assistant turn.
    messages: tuple = ()
    where: str = field(default="", compare=False)  # "FILE:LINE", for errors found later (encoding)


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


def _history(record: dict, column: str, path, number) -> tuple:
    if column not in record or record[column] is None:
        return ()
    turns = record[column]
    if not isinstance(turns, list) or not all(
            isinstance(t, (list, tuple)) and len(t) == 2 and all(isinstance(x, str) for x in t) for t in turns):
        raise DataError(f"{path}:{number}: field {column!r} must be a list of [query, response] string pairs")
    return tuple((query, response) for query, response in turns)


def _conversation(record: dict, path, number, require_target: bool) -> Pair:
    where = f"{path}:{number}"
    turns = record.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{where}: sample lacks the field 'conversations' (a non-empty list of messages)")
    previous, messages = None, []
    for k, turn in enumerate(turns, 1):
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or \
                not isinstance(turn.get("content"), str):
            raise DataError(f"{where}: conversation turn {k} must be an object with a string 'role' and 'content'")
        role = turn["role"]
        if role not in ROLES:
            raise DataError(f"{where}: conversation turn {k} has role {role!r}; roles are {', '.join(ROLES)}")
        if role not in FOLLOWS[previous]:
            after = f"after a {previous} turn" if previous else "as the first turn"
            raise DataError(f"{where}: roles do not alternate: turn {k} is a {role} turn {after} "
                            f"(expected {' or '.join(FOLLOWS[previous])})")
        if "tools" in turn and role != "system":
            raise DataError(f"{where}: conversation turn {k}: 'tools' belong on the system turn, not a {role} turn")
        if "metadata" in turn and not isinstance(turn["metadata"], str):
            raise DataError(f"{where}: conversation turn {k}: 'metadata' must be a string")
        messages.append({key: turn[key] for key in ("role", "metadata", "content", "tools") if key in turn})
        previous = role
    last = max((k for k, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None and require_target:
        raise DataError(f"{where}: the conversation has no assistant turn to learn")
    if last is None or (not require_target and messages[-1]["role"] != "assistant"):
        source, target = messages[-1]["content"], ""  # to predict: the answer to the last turn
    else:
        source, target = messages[last - 1]["content"], messages[last]["content"]
    return Pair(source, target, messages=tuple(messages), where=where)


def to_pair(record: dict, layout: str, path, number, source_field="source", target_field="target",
            require_target: bool = True, history_column: str | None = None) -> Pair:
    if layout == "conversations":
        return _conversation(record, path, number, require_target)
    pair = _to_pair(record, layout, path, number, source_field, target_field, require_target)
    history = _history(record, history_column, path, number) if history_column else ()
    return Pair(pair.source, pair.target, history=history, where=f"{path}:{number}")


def _to_pair(record: dict, layout: str, path, number, source_field="source", target_field="target",
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
               require_target: bool = True, history_column: str | None = None) -> list[Pair]:
    """All samples of ``path`` as (source, target) pairs; an empty file is an error. With
    ``require_target=False`` (prediction) a sample may lack its target (a conversation its assistant turn)."""
    if history_column and layout == "conversations":
        raise DataError("--history_column and --dataset_layout conversations exclude each other: a conversation "
                        "holds its history")
    pairs = [to_pair(r, layout, path, n, source_field, target_field, require_target, history_column)
             for n, r in read_records(path)]
    if not pairs:
        raise DataError(f"{path}: no samples")
    return pairs
