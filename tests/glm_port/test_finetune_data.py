"""glm-finetune's data: layouts, errors naming file/line/field, GLM's generation layout, metrics."""

import json

import numpy as np
import pytest

from glm_port.data import get_tokenizer
from glm_port.finetune import metrics
from glm_port.finetune.arguments import parse_args
from glm_port.finetune.datasets import DataError, read_pairs
from glm_port.models.glm.seq2seq import collate, encode_pair


def _write(path, records, as_list=False):
    path.write_text(json.dumps(records) if as_list else "".join(json.dumps(r) + "\n" for r in records),
                    encoding="utf-8")
    return path


def test_layouts_build_the_anchors_prompts(tmp_path):
    dureader = _write(tmp_path / "d.json", [{"context": "北京是首都", "answer": "北京", "question": "首都是哪里"}])
    pair = read_pairs(dureader, "dureaderqg")[0]
    assert pair.source == "答案：北京，上下文：北京是首都"
    assert pair.target == "在已知答案的前提下，问题：首都是哪里"
    adgen = _write(tmp_path / "a.json", [{"content": "类型#裙", "summary": "好看"}], as_list=True)
    assert read_pairs(adgen, "adgen")[0].source == "类型#裙"
    belle = _write(tmp_path / "b.json", [{"instruction": "翻译", "input": "hello", "output": "你好"},
                                         {"instruction": "问候", "input": "", "output": "你好"}])
    pairs = read_pairs(belle, "belle")
    assert [p.source for p in pairs] == ["翻译\nhello", "问候"]


def test_bad_samples_name_file_line_and_field(tmp_path):
    path = _write(tmp_path / "t.json", [{"source": "a", "target": "b"}, {"source": "c"}])
    with pytest.raises(DataError, match=r"t.json:2: sample lacks the field 'target'"):
        read_pairs(path)
    (tmp_path / "bad.json").write_text('{"source": "a", "target": "b"}\n{"source": \n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.json:2: not valid JSON"):
        read_pairs(tmp_path / "bad.json")
    _write(tmp_path / "n.json", [{"source": None, "target": "b"}])
    with pytest.raises(DataError, match=r"n.json:1: field 'source' must be a string, not NoneType"):
        read_pairs(tmp_path / "n.json")
    (tmp_path / "empty.json").write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match="no samples"):
        read_pairs(tmp_path / "empty.json")


def test_generation_layout_is_thudms():
    tok = get_tokenizer()
    source, target = tok.encode("the cat sat"), tok.encode("on the mat")
    sample = encode_pair(tok, source, target, src_length=32, tgt_length=16)
    a = 3 + len(source)
    assert sample.sep == a
    assert sample.text.tolist() == [tok.cls_id, *source, tok.gmask_id, tok.eos_id, tok.sop_id, *target]
    assert sample.target[a:].tolist() == [*target, tok.eop_id]
    assert sample.loss_mask.tolist() == [0.0] * a + [1.0] * (len(target) + 1)
    mask_position = a - 2
    assert sample.position_id[0].tolist() == [*range(a), *[mask_position] * (len(target) + 1)]
    assert sample.position_id[1].tolist() == [0] * a + list(range(1, len(target) + 2))
    # Cut to fit: the source to src_length with its 3 specials, the target to tgt_length with sop.
    short = encode_pair(tok, source, target, src_length=4, tgt_length=2)
    assert short.text.tolist() == [tok.cls_id, source[0], tok.gmask_id, tok.eos_id, tok.sop_id, target[0]]
    assert short.truncated_target


def test_collate_pads_at_the_end_without_loss():
    tok = get_tokenizer()
    samples = [encode_pair(tok, tok.encode(s), tok.encode(t), 32, 16) for s, t in (("a b c d", "x"), ("a", "y z"))]
    batch = collate(samples, tok.pad_id)
    assert batch["text"].shape[1] == max(len(s.text) for s in samples)
    assert batch["attention_mask"].tolist() == [s.sep for s in samples]
    shorter = int(np.argmin([len(s.text) for s in samples]))
    assert batch["loss_mask"][shorter].sum().item() == samples[shorter].loss_mask.sum()
    assert batch["text"][shorter, len(samples[shorter].text):].eq(tok.pad_id).all()


def test_chinese_metrics_follow_thudms_script():
    """The recipe of THUDM's ChatGLM2 ptuning/main.py, written out here with the libraries called directly."""
    import jieba
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    from rouge_chinese import Rouge

    predictions = ["这件裙子很好看", "简约的设计", "显瘦"]
    references = ["这条裙子非常好看", "设计简约大方", "宽松显瘦的版型"]
    expected = {"rouge-1": [], "rouge-2": [], "rouge-l": [], "bleu-4": []}
    for pred, label in zip(predictions, references):
        hypothesis, reference = list(jieba.cut(pred)), list(jieba.cut(label))
        result = Rouge().get_scores(" ".join(hypothesis), " ".join(reference))[0]
        for k, v in result.items():
            expected[k].append(round(v["f"] * 100, 4))
        bleu = sentence_bleu([list(label)], list(pred), smoothing_function=SmoothingFunction().method3)
        expected["bleu-4"].append(round(bleu * 100, 4))
    got = metrics.score(predictions, references)
    for name, values in expected.items():
        assert got[name] == pytest.approx(float(np.mean(values)), abs=1e-3), name


def test_english_metrics_are_the_libraries():
    import sacrebleu
    from rouge_score import rouge_scorer

    predictions, references = ["the cat sat on the mat", "a dog barks"], ["the cat is on the mat", "the dog barked"]
    got = metrics.score(predictions, references)
    assert metrics.detect_lang(references) == "en"
    scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)
    rouge2 = np.mean([scorer.score(r, p)["rouge2"].fmeasure * 100 for p, r in zip(predictions, references)])
    assert got["rouge-2"] == pytest.approx(rouge2, abs=1e-3)
    assert got["bleu-4"] == pytest.approx(sacrebleu.corpus_bleu(predictions, [references]).score, abs=1e-3)
    assert metrics.score(references, references)["rouge-l"] == pytest.approx(100.0)


def test_paddlenlp_flags_parse_and_unsupported_ones_are_refused(capsys):
    args = parse_args(["--model_name_or_path", "m", "--do_train", "--lora", "true", "--r", "4",
                       "--lora_alpha", "8", "--num_beams", "5", "--tensor_parallel_degree", "2"])
    assert args.do_train and args.lora and args.r == 4 and args.num_beams == 5
    assert args.lora_target_modules == ["query_key_value"]
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--prefix_tuning", "true"])
    assert exit_info.value.code == 2
    assert "--prefix_tuning is not supported: PaddleNLP's prefix tuning is not implemented; THUDM's P-Tuning v2 is " \
           "--pre_seq_len N" in capsys.readouterr().err


def test_english_rouge_1_2_l_are_rouge_scores_own_on_different_strings():
    """Each English ROUGE is rouge_score's own F-measure of that ROUGE (x 100, stemmed, averaged over the
    samples), on predictions that differ from their references so that ROUGE-1, -2 and -L all differ."""
    from rouge_score import rouge_scorer

    predictions = ["the quick brown fox jumped over a lazy dog today", "cats were sitting on the warm mats",
                   "a completely unrelated sentence"]
    references = ["a quick brown dog jumps over the lazy fox", "the cat sat on the mat", "nothing in common here"]
    got = metrics.score(predictions, references, "en")
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"], use_stemmer=True)
    theirs = {key: float(np.mean([scorer.score(r, p)[key].fmeasure * 100 for p, r in zip(predictions, references)]))
              for key in ("rouge1", "rouge2", "rougeLsum")}
    assert len({round(v, 3) for v in theirs.values()}) == 3, theirs  # a swapped key cannot go unseen
    assert got["rouge-1"] == pytest.approx(theirs["rouge1"], abs=1e-3)
    assert got["rouge-2"] == pytest.approx(theirs["rouge2"], abs=1e-3)
    assert got["rouge-l"] == pytest.approx(theirs["rougeLsum"], abs=1e-3)
