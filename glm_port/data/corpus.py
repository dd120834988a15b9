"""Training corpora: text files read into documents, tokenized once (with progress) and cached.

A corpus file is JSON (``.json`` / ``.jsonl``: one object per line, or one array of objects; the document
in ``text_key``, upstream's ``"text"``, after an optional ``"prompt"``) or plain text (documents separated
by blank lines).
Token ids are cached next to the file as ``<file>.<tokenizer fingerprint>-<keys>.glmcache.npz``, written
atomically; a cache is used only while the tokenizer, the text/prompt keys and the file are unchanged (same
size and mtime, or, if the mtime moved, the same content hash). When the data's directory is read-only the
cache goes to ``$XDG_CACHE_HOME/glm-migrate/corpus`` (default ``~/.cache``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from tqdm import tqdm

from glm_port.data.tokenization import DEFAULT_CORPUS, GLMVocab
from glm_port.outputs import follow_umask

JSON_SUFFIXES = (".json", ".jsonl")
_ENCODE_CHUNK = 512  # documents per encode_batch call: large enough for tokenizers' threads, small for tqdm


@dataclass(frozen=True)
class TokenizedCorpus:
    """Documents as one flat id array: document ``i`` is ``ids[offsets[i]:offsets[i + 1]]``."""

    ids: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]: self.offsets[i + 1]]

    @property
    def num_tokens(self) -> int:
        return len(self.ids)

    @classmethod
    def concatenate(cls, parts: Sequence[TokenizedCorpus]) -> TokenizedCorpus:
        starts = np.cumsum([0] + [p.num_tokens for p in parts])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, starts)])
        return cls(np.concatenate([p.ids for p in parts]), offsets)


def read_documents(path: str | Path, text_key: str = "text", prompt_key: str = "prompt") -> Iterator[str]:
    """The documents of one corpus file, in file order (empty ones skipped)."""
    return (text for text, _ in _documents_and_progress(Path(path), text_key, prompt_key))


def _documents_and_progress(path: Path, text_key: str, prompt_key: str) -> Iterator[tuple[str, int]]:
    """(document, bytes of the file read so far) pairs."""
    if not path.is_file():
        raise FileNotFoundError(f"training data not found: {path}")
    if path.suffix in JSON_SUFFIXES:
        yield from _json_documents(path, text_key, prompt_key)
    else:
        yield from _paragraphs(path)


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _paragraphs(path: Path) -> Iterator[tuple[str, int]]:
    read = 0
    for doc in _decode(path.read_bytes(), str(path)).split("\n\n"):
        read += len(doc.encode("utf-8")) + 2
        if doc.strip():
            yield doc.strip(), read


def _json_documents(path: Path, text_key: str, prompt_key: str) -> Iterator[tuple[str, int]]:
    """JSON lines, or one JSON array of records (upstream's non-"loose" JSON)."""
    with path.open("rb") as f:
        if f.read(4096).lstrip().startswith(b"["):
            f.seek(0)
            try:
                records = json.loads(_decode(f.read(), str(path)))
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{e.lineno}: not a JSON array of records ({e.msg}: line {e.lineno} column {e.colno})"
                ) from None
            size = path.stat().st_size
            for i, record in enumerate(records):
                text = _document(record, f"{path}[{i}]", text_key, prompt_key)
                if text.strip():
                    yield text, size * (i + 1) // len(records)
            return
        f.seek(0)
        read = 0
        for line_no, raw in enumerate(f, 1):
            read += len(raw)
            line = _decode(raw, f"{path}:{line_no}")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                # e.msg alone can end mid-sentence ("Invalid control character at"): give the column too
                raise ValueError(f"{path}:{line_no}: not a JSON line ({e.msg}: column {e.colno})") from None
            text = _document(record, f"{path}:{line_no}", text_key, prompt_key)
            if text.strip():
                yield text, read


def _document(record, where: str, text_key: str, prompt_key: str) -> str:
    """A record's optional prompt followed by its text; both must be strings (a prompt may be absent or null)."""
    if not isinstance(record, dict) or text_key not in record:
        keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{where}: no {text_key!r} field (has: {keys}); name the text field with --text-key")
    prompt = record.get(prompt_key)
    for key, value in ((text_key, record[text_key]), (prompt_key, prompt if prompt is not None else "")):
        if not isinstance(value, str):
            raise ValueError(f"{where}: {key!r} is {_json_type(value)}, not a string")
    return prompt + record[text_key] if prompt else record[text_key]


def _json_type(value) -> str:
    if value is None:
        return "null"
    kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}
    return f"{kind.get(type(value), type(value).__name__)} ({json.dumps(value)[:40]})"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_files(path: Path, tokenizer: GLMVocab, text_key: str, prompt_key: str) -> list[Path]:
    """Where ``path``'s cache may live, in order: next to it, then the user cache (whose name also carries
    the data's directory, to keep same-named files apart)."""
    name = f"{path.name}.{tokenizer.fingerprint}-{_short_hash(text_key, prompt_key)}.glmcache.npz"
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "glm-migrate" / "corpus"
    in_user_cache = user / f"{_short_hash(str(path.resolve().parent))}-{name}"
    if path.resolve() == DEFAULT_CORPUS.resolve():  # never litter the installed package
        return [in_user_cache]
    return [path.parent / name, in_user_cache]


def _short_hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]


def _load_cache(file: Path, stat: os.stat_result, path: Path) -> tuple[TokenizedCorpus | None, bool]:
    """(the cached corpus or None if stale or unreadable, whether the recorded size and mtime still match)."""
    try:
        with np.load(file) as cache:
            size, mtime = (int(v) for v in cache["stat"])
            same_stat = size == stat.st_size and mtime == stat.st_mtime_ns
            if size != stat.st_size or (not same_stat and str(cache["sha256"]) != _file_sha256(path)):
                return None, False
            return TokenizedCorpus(cache["ids"], cache["offsets"]), same_stat
    except (OSError, ValueError, KeyError):  # missing, truncated or foreign file: rebuild it
        return None, False


def _write_cache(file: Path, corpus: TokenizedCorpus, stat: os.stat_result, path: Path) -> bool:
    """Write atomically (temp file + rename); False when the directory is not writable."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, ids=corpus.ids, offsets=corpus.offsets, stat=np.array([stat.st_size, stat.st_mtime_ns]),
                     sha256=np.array(_file_sha256(path)))
        follow_umask(tmp)  # mkstemp makes it 0600; the umask's mode, as the corpus beside it
        os.replace(tmp, file)
        return True
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return False


def tokenize_file(path: str | Path, tokenizer: GLMVocab, *, text_key: str = "text",
                  prompt_key: str = "prompt", cache: bool = True, progress: bool = True) -> TokenizedCorpus:
    """The token ids of every document in ``path``, from the cache when it is still valid."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training data not found: {path}")
    stat = path.stat()
    files = cache_files(path, tokenizer, text_key, prompt_key) if cache else []
    for file in files:
        cached, same_stat = _load_cache(file, stat, path)
        if cached is not None:
            if not same_stat:  # touched but unchanged: record the new mtime so the next load skips the hash
                _write_cache(file, cached, stat, path)
            return cached
    # Stream in chunks and keep ids as int32 arrays: Python lists of ids would take ~9x the memory.
    documents = _documents_and_progress(path, text_key, prompt_key)
    ids, lengths = [], []
    with tqdm(total=stat.st_size, desc=f"tokenizing {path.name}", unit="B", unit_scale=True,
              disable=not progress) as bar:
        while chunk := list(itertools.islice(documents, _ENCODE_CHUNK)):
            encoded = [d for d in tokenizer.encode_batch([text for text, _ in chunk]) if d]
            lengths += [len(d) for d in encoded]
            ids.append(np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32))
            bar.update(min(chunk[-1][1], stat.st_size) - bar.n)
    if not lengths:
        raise ValueError(f"{path}: no text in this corpus (empty file or only blank documents)")
    corpus = TokenizedCorpus(np.concatenate(ids), np.concatenate(([0], np.cumsum(lengths))))
    for file in files:
        if _write_cache(file, corpus, stat, path):
            break
    return corpus


def load_corpus(paths: Sequence[str | Path] | str | Path | None, tokenizer: GLMVocab, *,
                text_key: str = "text", prompt_key: str = "prompt", cache: bool = True,
                progress: bool = True) -> TokenizedCorpus:
    """All documents of ``paths`` (files in order), or of the embedded tiny corpus when ``paths`` is None."""
    if paths is None:
        paths = [DEFAULT_CORPUS]
    elif isinstance(paths, (str, Path)):
        paths = [paths]
    if not paths:
        raise ValueError("no training data paths given")
    parts = [tokenize_file(p, tokenizer, text_key=text_key, prompt_key=prompt_key, cache=cache, progress=progress)
             for p in paths]
    return TokenizedCorpus.concatenate(parts)
