"""Corpora (reading, errors, the token cache) and the training batch stream (shapes, determinism, the
data-parallel split)."""

import itertools
import json
import os

import numpy as np
import pytest
import torch

from glm_port.data import build_train_batches, get_tokenizer, load_corpus, read_documents, tokenize_file
from glm_port.data import corpus as corpus_module
from glm_port.data.batches import Windows
from glm_port.data.corpus import DEFAULT_CORPUS
from glm_port.data.default_corpus import generate

TOK = get_tokenizer()


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def take(iterator, n):
    return list(itertools.islice(iterator, n))


# -- corpora -----------------------------------------------------------------------------------------------


def test_embedded_corpus_is_what_its_grammar_writes():
    assert DEFAULT_CORPUS.read_text(encoding="utf-8") == generate()
    assert DEFAULT_CORPUS.stat().st_size < 200_000
    assert len(list(read_documents(DEFAULT_CORPUS))) >= 300


def test_json_lines_and_plain_text(tmp_path):
    jsonl = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "Q: ", "text": "one."}, {"text": "two."}, {"text": ""}])
    assert list(read_documents(jsonl)) == ["Q: one.", "two."]
    custom = write_jsonl(tmp_path / "d.json", [{"body": "x"}])
    assert list(read_documents(custom, text_key="body")) == ["x"]
    txt = tmp_path / "c.txt"
    txt.write_text("first doc\nstill first\n\n\nsecond doc\n")
    assert list(read_documents(txt)) == ["first doc\nstill first", "second doc"]
    array = tmp_path / "a.json"
    array.write_text(json.dumps([{"text": "one."}, {"prompt": "P", "text": "two."}], indent=1))
    assert list(read_documents(array)) == ["one.", "Ptwo."]


def test_corpus_errors_are_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="training data not found: .*nope.jsonl"):
        load_corpus([tmp_path / "nope.jsonl"], TOK)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(ValueError, match="empty.txt: no text"):
        load_corpus(empty, TOK)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"text": "ok"}, {"content": "no text here"}])
    with pytest.raises(ValueError, match="bad.jsonl:2: no 'text' field \\(has: content\\); name the text field with --text-key"):
        load_corpus(bad, TOK)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(ValueError, match="broken.jsonl:2: not a JSON line"):
        load_corpus(broken, TOK)
    array = tmp_path / "array.json"
    array.write_text('[{"text": "ok"}, {"txt": "typo"}]')
    with pytest.raises(ValueError, match=r"array.json\[1\]: no 'text' field \(has: txt\)"):
        load_corpus(array, TOK)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9".encode("latin-1"))
    with pytest.raises(ValueError, match="latin.txt: not UTF-8 text"):
        load_corpus(latin, TOK)


@pytest.mark.parametrize("record, message", [
    ({"text": None}, "'text' is null, not a string"),
    ({"text": 42}, "'text' is a number \\(42\\), not a string"),
    ({"text": ["a", "b"]}, "'text' is a list \\(\\[\"a\", \"b\"\\]\\), not a string"),
    ({"text": {"a": 1}}, "'text' is an object \\(\\{\"a\": 1\\}\\), not a string"),
    ({"text": "ok", "prompt": 7}, "'prompt' is a number \\(7\\), not a string"),
])
def test_non_string_text_is_an_error_naming_file_line_and_key(tmp_path, record, message):
    """Not trained as the strings "None" / "42": the record's file, line and key are named."""
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "fine"}, record])
    with pytest.raises(ValueError, match=f"c.jsonl:2: {message}$"):
        load_corpus(data, TOK, cache=False)
    array = tmp_path / "a.json"
    array.write_text(json.dumps([{"text": "fine"}, record]))
    with pytest.raises(ValueError, match=f"a.json\\[1\\]: {message}$"):
        load_corpus(array, TOK, cache=False)
    assert list(read_documents(write_jsonl(tmp_path / "n.jsonl", [{"text": "x", "prompt": None}]))) == ["x"]


def test_json_errors_are_shown_whole_with_file_and_line(tmp_path):
    control = tmp_path / "control.jsonl"
    control.write_text('{"text": "ok"}\n{"text": "tab\there"}\n')  # a raw tab inside a JSON string
    with pytest.raises(ValueError) as error:
        load_corpus(control, TOK, cache=False)
    assert str(error.value) == f"{control}:2: not a JSON line (Invalid control character at: column 14)"
    array = tmp_path / "array.json"
    array.write_text('[{"text": "ok"},\n {"text": "no end}]\n')
    with pytest.raises(ValueError) as error:
        load_corpus(array, TOK, cache=False)
    assert str(error.value) == f"{array}:2: not a JSON array of records (Invalid control character at: line 2 column 20)"


def test_corpus_concatenates_files_in_order(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "ada"}, {"text": "bram"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": "cora met dov"}])
    corpus = load_corpus([a, b], TOK, cache=False)
    assert len(corpus) == 3
    assert [TOK.decode(corpus[i]) for i in range(3)] == ["ada", "bram", "cora met dov"]


def test_cache_is_reused_and_invalidated(tmp_path, monkeypatch):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "ada is the baker."}] * 3)
    first = tokenize_file(data, TOK)
    caches = list(tmp_path.glob("c.jsonl.*.glmcache.npz"))
    assert len(caches) == 1 and TOK.fingerprint in caches[0].name
    assert not list(tmp_path.glob("*.tmp")), "written atomically, no temp file left"

    calls = []
    monkeypatch.setattr(TOK.text, "encode_batch", lambda texts: calls.append(texts) or [[1]] * len(texts))
    again = tokenize_file(data, TOK)
    assert calls == [] and np.array_equal(again.ids, first.ids)

    os.utime(data, ns=(1, 1))  # touched, same bytes: still valid (content hash), and the new mtime recorded
    hashed = []
    real_hash = corpus_module._file_sha256
    monkeypatch.setattr(corpus_module, "_file_sha256", lambda p: hashed.append(p) or real_hash(p))
    assert calls == [] and np.array_equal(tokenize_file(data, TOK).ids, first.ids)
    hashed.clear()
    assert np.array_equal(tokenize_file(data, TOK).ids, first.ids) and hashed == []

    write_jsonl(data, [{"text": "finn is the smith."}] * 4)  # changed: re-tokenized
    assert np.array_equal(tokenize_file(data, TOK).ids, np.ones(4, dtype=np.int32)) and len(calls) == 1


def test_cache_is_per_tokenizer_and_text_key(tmp_path):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "ada is the baker.", "title": "bakers"}])
    tokenize_file(data, TOK)
    other = get_tokenizer()
    other.fingerprint = "0123456789abcdef"
    tokenize_file(data, other)
    titles = tokenize_file(data, TOK, text_key="title")
    assert TOK.decode(titles[0]) == "bakers"
    assert len(list(tmp_path.glob("c.jsonl.*.glmcache.npz"))) == 3


def test_read_only_data_dir_falls_back_to_user_cache(tmp_path, monkeypatch):
    data_dir = tmp_path / "ro"
    data_dir.mkdir()
    data = write_jsonl(data_dir / "c.jsonl", [{"text": "ada is the baker."}])
    real_mkstemp = corpus_module.tempfile.mkstemp

    def mkstemp(dir, **kwargs):
        if dir == data_dir:
            raise PermissionError(13, "Permission denied", str(dir))
        return real_mkstemp(dir=dir, **kwargs)

    monkeypatch.setattr(corpus_module.tempfile, "mkstemp", mkstemp)
    first = tokenize_file(data, TOK)
    assert not list(data_dir.glob("*.glmcache.npz"))
    cached = list((tmp_path / "xdg" / "glm-migrate" / "corpus").glob("*-c.jsonl.*.glmcache.npz"))
    assert len(cached) == 1
    monkeypatch.setattr(TOK.text, "encode_batch", lambda texts: pytest.fail("should have used the cache"))
    assert np.array_equal(tokenize_file(data, TOK).ids, first.ids)


def test_embedded_corpus_cache_stays_out_of_the_package(tmp_path):
    load_corpus(None, TOK)
    assert not list(DEFAULT_CORPUS.parent.glob("*.glmcache.npz"))
    assert list((tmp_path / "xdg" / "glm-migrate" / "corpus").glob("*-default_corpus.txt.*.glmcache.npz"))


# -- windows and batches ---------------------------------------------------------------------------------


def test_windows_cover_shuffled_documents():
    corpus = load_corpus(None, TOK)
    framed = [(TOK.cls_id, *corpus[i].tolist(), TOK.eos_id) for i in range(len(corpus))]
    windows = Windows(corpus, 64, seed=0, cls_id=TOK.cls_id, eos_id=TOK.eos_id)
    assert windows.per_epoch == sum(map(len, framed)) // 64
    epoch = [windows[i] for i in range(windows.per_epoch)]
    assert all(len(w) == 64 and w[0] == TOK.cls_id for w in epoch)
    assert not np.array_equal(windows[0], windows[windows.per_epoch]), "each epoch reshuffles"

    whole = Windows(corpus, sum(map(len, framed)), seed=0, cls_id=TOK.cls_id, eos_id=TOK.eos_id)
    stream = np.concatenate([whole[0], whole[1]])  # one window per epoch: the epoch's whole stream
    docs = [tuple(d) for d in np.split(stream, np.flatnonzero(stream == TOK.eos_id)[:-1] + 1)]
    assert sorted(docs[: len(framed)]) == sorted(framed) == sorted(docs[len(framed):])
    assert docs[: len(framed)] != framed and docs[: len(framed)] != docs[len(framed):]
    # windows are consecutive slices of the epoch's stream, a [CLS] put in front when one starts mid-document
    for k in range(windows.per_epoch):
        piece = whole[0][64 * k: 64 * (k + 1)]
        expected = piece if piece[0] == TOK.cls_id else np.concatenate(([TOK.cls_id], piece[:-1]))
        assert np.array_equal(windows[k], expected)


def test_batches_shapes_and_dtypes():
    batch = next(build_train_batches(None, TOK, seq_length=64, batch_size=3, seed=0))
    assert {k: (tuple(v.shape), v.dtype) for k, v in batch.items()} == {
        "text": ((3, 64), torch.long), "target": ((3, 64), torch.long), "loss_mask": ((3, 64), torch.float32),
        "attention_mask": ((3,), torch.long), "position_id": ((3, 2, 64), torch.long)}
    assert (batch["text"] < TOK.num_tokens).all() and (batch["loss_mask"].sum(1) > 0).all()


def test_batches_are_deterministic_and_seeded():
    kwargs = dict(seq_length=48, batch_size=2, masker_kwargs=dict(bert_prob=0.5, gap_sentence_prob=0.3,
                                                                   task_mask=True))
    a = take(build_train_batches(None, TOK, seed=1, **kwargs), 3)
    b = take(build_train_batches(None, TOK, seed=1, **kwargs), 3)
    c = take(build_train_batches(None, TOK, seed=2, **kwargs), 3)
    assert all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)
    assert not torch.equal(a[0]["text"], c[0]["text"])


@pytest.mark.parametrize("world_size", [2, 3])
def test_data_parallel_ranks_split_the_one_process_batch(world_size):
    """N ranks at batch b see exactly what one process sees at N*b; rank r holds rows r::N."""
    kwargs = dict(seq_length=40, seed=5, masker_kwargs=dict(bert_prob=0.6, gap_sentence_prob=0.2, task_mask=True))
    whole = take(build_train_batches(None, TOK, batch_size=2 * world_size, **kwargs), 60)
    per_rank = [take(build_train_batches(None, TOK, batch_size=2, rank=r, world_size=world_size, **kwargs), 60)
                for r in range(world_size)]
    for step, batch in enumerate(whole):  # 60 steps also cross into the second epoch
        for r in range(world_size):
            assert all(torch.equal(batch[k][r::world_size], per_rank[r][step][k]) for k in batch)


def test_start_batch_resumes_the_stream():
    kwargs = dict(seq_length=32, batch_size=2, seed=3)
    full = take(build_train_batches(None, TOK, **kwargs), 5)
    resumed = next(build_train_batches(None, TOK, start_batch=4, **kwargs))
    assert all(torch.equal(full[4][k], resumed[k]) for k in resumed)


def test_worker_processes_give_the_same_batches():
    kwargs = dict(seq_length=32, batch_size=3, seed=4, masker_kwargs=dict(bert_prob=0.5, task_mask=True))
    inline = take(build_train_batches(None, TOK, **kwargs), 6)
    workers = take(build_train_batches(None, TOK, num_workers=2, **kwargs), 6)
    assert all(torch.equal(x[k], y[k]) for x, y in zip(inline, workers) for k in x)


def test_batches_from_files(tmp_path):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": f"ada met finn {i} times. it was fun."} for i in range(40)])
    batch = next(build_train_batches([data], TOK, seq_length=32, batch_size=4, seed=0))
    assert batch["text"].shape == (4, 32)


def test_batch_argument_errors():
    with pytest.raises(ValueError, match="rank must be in"):
        build_train_batches(None, TOK, seq_length=32, batch_size=2, seed=0, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size >= 1"):
        build_train_batches(None, TOK, seq_length=32, batch_size=0, seed=0)
    with pytest.raises(TypeError):
        build_train_batches(None, TOK, seq_length=32, batch_size=2, seed=0, masker_kwargs=dict(bogus=1))


def test_command_line_tokenizes_and_shows_samples(tmp_path, capsys):
    from glm_port.data.__main__ import main

    data = write_jsonl(tmp_path / "c.jsonl", [{"body": f"ada met finn {i} times. it was fun."} for i in range(30)])
    assert main(["--train-data", str(data), "--text-key", "body", "--seq-length", "32", "--show", "1"]) == 0
    out = capsys.readouterr().out
    assert "30 documents" in out and "Part A" in out and "Part B at position" in out
    assert list(tmp_path.glob("c.jsonl.*.glmcache.npz")), "the cache is warm for training"
    assert main(["--train-data", str(tmp_path / "missing.jsonl")]) == 2
    assert "training data not found" in capsys.readouterr().err
