"""The upstream self-check's own pieces, without a checkout."""

import json

import pytest

from migrate.mock import selfcheck


def test_loss_lines_are_read_in_upstream_log_format():
    line = (
        " iteration        3/      20 | elapsed time per iteration (ms): 2416.9 |"
        " learning rate 9.756E-04 | lm loss 1.019575E+01 |"
    )
    assert [float(x) for x in selfcheck.LOSS.findall(line)] == [10.19575]


def test_corpus_is_json_lines_of_vocabulary_words_and_never_overwritten(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "the", "river", "##ing", "stone", "a", "9", "light"]))
    corpus = tmp_path / "data" / "test.json"
    selfcheck.ensure_corpus(vocab, corpus, documents=3)
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert len(rows) == 3 and all(row["prompt"] == "" for row in rows)
    assert set(rows[0]["text"].lower().replace(".", "").split()) <= {"the", "river", "stone", "light"}
    corpus.write_text("mine\n")
    selfcheck.ensure_corpus(vocab, corpus)
    assert corpus.read_text() == "mine\n"


def test_refuses_a_directory_that_is_not_a_glm_checkout(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        selfcheck.main([str(tmp_path)])
    assert exc.value.code == 2
    assert "is not a THUDM/GLM checkout (no pretrain_glm.py)" in capsys.readouterr().err
