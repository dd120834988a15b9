"""ROUGE-1/2/L and BLEU-4 as the anchors report them, computed by the metric libraries themselves.

- Chinese (``lang="zh"``): THUDM's ChatGLM2 ``ptuning/main.py`` and MindFormers: each text cut into
  words by ``jieba``, ``rouge_chinese.Rouge`` F-scores x 100 per sample, and nltk ``sentence_bleu`` on
  characters with ``SmoothingFunction().method3`` x 100; all averaged over the samples.
- English (``lang="en"``): Google's ``rouge_score`` (ROUGE-1/2/Lsum F-scores x 100 per sample, stemmed,
  averaged) and ``sacrebleu``'s corpus BLEU-4.

``lang="auto"`` picks Chinese when the references hold CJK characters, English otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
METRIC_NAMES = ("rouge-1", "rouge-2", "rouge-l", "bleu-4")


def detect_lang(references: Sequence[str]) -> str:
    return "zh" if any(_CJK.search(r) for r in references) else "en"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def chinese_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """THUDM's / MindFormers' recipe: jieba words for ROUGE, characters for BLEU-4 (method3)."""
    import jieba
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    from rouge_chinese import Rouge

    jieba.setLogLevel(60)  # jieba prints its dictionary loading on stderr otherwise
    rouge, smooth = Rouge(), SmoothingFunction().method3
    scores: dict[str, list[float]] = {name: [] for name in METRIC_NAMES}
    for prediction, reference in zip(predictions, references):
        hyp, ref = list(jieba.cut(prediction)), list(jieba.cut(reference))
        if not " ".join(hyp).strip() or not " ".join(ref).strip():
            # rouge_chinese refuses empty texts: THUDM's script scores such a pair 0.
            for name in ("rouge-1", "rouge-2", "rouge-l"):
                scores[name].append(0.0)
        else:
            result = rouge.get_scores(" ".join(hyp), " ".join(ref))[0]
            for name in ("rouge-1", "rouge-2", "rouge-l"):
                scores[name].append(result[name]["f"] * 100)
        scores["bleu-4"].append(sentence_bleu([list(reference)], list(prediction), smoothing_function=smooth) * 100)
    return {name: round(_mean(values), 4) for name, values in scores.items()}


def english_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """rouge_score's F-scores (stemmed) and sacrebleu's corpus BLEU."""
    import sacrebleu
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"], use_stemmer=True)
    scores: dict[str, list[float]] = {name: [] for name in ("rouge-1", "rouge-2", "rouge-l")}
    for prediction, reference in zip(predictions, references):
        result = scorer.score(reference, prediction)
        for name, key in (("rouge-1", "rouge1"), ("rouge-2", "rouge2"), ("rouge-l", "rougeLsum")):
            scores[name].append(result[key].fmeasure * 100)
    out = {name: round(_mean(values), 4) for name, values in scores.items()}
    out["bleu-4"] = round(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score, 4)
    return out


def score(predictions: Sequence[str], references: Sequence[str], lang: str = "auto") -> dict[str, float]:
    """ROUGE-1/2/L and BLEU-4 (x 100) of ``predictions`` against ``references``, paired in order."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if lang == "auto":
        lang = detect_lang(references)
    if lang == "zh":
        return chinese_scores(predictions, references)
    if lang == "en":
        return english_scores(predictions, references)
    raise ValueError(f"metric language must be auto, zh or en, not {lang!r}")
