"""The upstream harness's own pieces, without a checkout: log lines, corpus, vocabulary, bad input."""

import json
from pathlib import Path

import pytest

import harness
from harness import selfcheck, verify

UPSTREAM_CORPORA = '''
class PromptReader: pass

class TestDataset(PromptReader):
    PATH = '{path}'
    assert_str = "make sure to set PATH for wikipedia data_utils/corpora.py"
'''


def _checkout(root, corpus="/nowhere/data/test.json"):
    (root / "data_utils").mkdir(parents=True)
    (root / "data_utils" / "corpora.py").write_text(UPSTREAM_CORPORA.format(path=corpus))
    (root / "pretrain_glm.py").write_text("")
    return root


def test_loss_lines_are_read_in_upstream_log_format():
    line = (
        " iteration        3/      20 | elapsed time per iteration (ms): 2416.9 |"
        " learning rate 9.756E-04 | lm loss 1.019575E+01 |"
    )
    assert [float(x) for x in harness.LOSS.findall(line)] == [10.19575]
    assert [float(x) for x in harness.ELAPSED.findall(line)] == [2416.9]


def test_corpus_is_json_lines_of_vocabulary_words_and_never_overwritten(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "the", "river", "##ing", "stone", "a", "9", "light"]))
    corpus = tmp_path / "data" / "test.json"
    assert harness.ensure_corpus(vocab, corpus, documents=3) == corpus
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert len(rows) == 3 and all(row["prompt"] == "" for row in rows)
    assert set(rows[0]["text"].lower().replace(".", "").split()) <= {"the", "river", "stone", "light"}
    again = tmp_path / "again.json"
    harness.ensure_corpus(vocab, again, documents=3)
    assert again.read_bytes() == corpus.read_bytes()  # seeded: the same bytes every time
    corpus.write_text("mine\n")
    harness.ensure_corpus(vocab, corpus)
    assert corpus.read_text() == "mine\n"
    assert [p.name for p in corpus.parent.iterdir()] == ["test.json"]  # no temporary file left


def test_the_corpus_path_is_read_from_the_checkout(tmp_path):
    assert harness.corpus_path(_checkout(tmp_path / "a")) == Path("/nowhere/data/test.json")
    relative = _checkout(tmp_path / "b", corpus="data/test.json")
    assert harness.corpus_path(relative) == relative / "data" / "test.json"
    (tmp_path / "c" / "data_utils").mkdir(parents=True)
    (tmp_path / "c" / "data_utils" / "corpora.py").write_text("class Other:\n    PATH = 'x'\n")
    with pytest.raises(harness.HarnessError, match="no class TestDataset with a string PATH"):
        harness.corpus_path(tmp_path / "c")
    with pytest.raises(harness.HarnessError, match="cannot read"):
        harness.corpus_path(tmp_path / "missing")


def test_the_vocabulary_comes_from_the_flag_the_environment_or_the_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv(harness.VOCAB_ENV, raising=False)
    folder = tmp_path / "vocab"
    folder.mkdir()
    (folder / harness.VOCAB_NAME).write_text("the\n")
    assert harness.find_vocab(folder) == folder / harness.VOCAB_NAME
    assert harness.find_vocab(folder / harness.VOCAB_NAME) == folder / harness.VOCAB_NAME
    with pytest.raises(harness.HarnessError, match="give --vocab PATH or set GLM_VOCAB"):
        harness.find_vocab()
    with pytest.raises(harness.HarnessError, match="--vocab .*missing.txt: no such file"):
        harness.find_vocab(tmp_path / "missing.txt")
    checkout = _checkout(tmp_path / "GLM")
    (checkout / ".pytorch_pretrained_bert").mkdir()
    (checkout / ".pytorch_pretrained_bert" / harness.VOCAB_NAME).write_text("the\n")
    assert harness.find_vocab(checkout=checkout) == checkout / ".pytorch_pretrained_bert" / harness.VOCAB_NAME
    monkeypatch.setenv(harness.VOCAB_ENV, str(folder))
    assert harness.find_vocab(checkout=checkout) == folder / harness.VOCAB_NAME


def test_a_checkout_without_a_vocabulary_gets_one_linked_in(tmp_path, monkeypatch):
    monkeypatch.delenv(harness.VOCAB_ENV, raising=False)
    checkout = _checkout(tmp_path / "GLM")
    with pytest.raises(harness.HarnessError, match="no BERT vocabulary"):
        harness.prepare_tree(checkout, tmp_path / "work")
    assert not (tmp_path / "work").exists()  # refused before copying anything
    vocab = tmp_path / harness.VOCAB_NAME
    vocab.write_text("the\n")
    tree = harness.prepare_tree(checkout, tmp_path / "work", vocab)
    assert (tree / ".pytorch_pretrained_bert" / harness.VOCAB_NAME).read_text() == "the\n"
    assert (tree / "data_utils" / "corpora.py").is_file() and not (checkout / ".pytorch_pretrained_bert").exists()


@pytest.mark.parametrize("main", [selfcheck.main, verify.main], ids=["selfcheck", "verify"])
def test_refuses_a_directory_that_is_not_a_glm_checkout(main, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path)])
    assert exc.value.code == 2
    assert "is not a THUDM/GLM checkout (no pretrain_glm.py)" in capsys.readouterr().err


@pytest.mark.parametrize("main", [selfcheck.main, verify.main], ids=["selfcheck", "verify"])
def test_a_missing_vocabulary_is_a_one_line_error(main, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(harness.VOCAB_ENV, raising=False)
    with pytest.raises(SystemExit) as exc:
        main([str(_checkout(tmp_path / "GLM")), "--workdir", str(tmp_path / "work")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no BERT vocabulary: give --vocab PATH or set GLM_VOCAB" in err and "Traceback" not in err
