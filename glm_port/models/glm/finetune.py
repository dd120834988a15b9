"""What GLM offers the shared finetuning (``glm_port.finetune``): loading, samples, loss inputs, generation,
saving. Every family's binding has these names; ``glm-finetune`` drives whichever family the model is."""

from __future__ import annotations

from pathlib import Path

import shim as torch
from glm_port.models.glm.config import GLMConfig
from glm_port.models.glm.model import GLMModel
from glm_port.models.glm.seq2seq import encode_pair
from glm_port.training import pad_batch
from glm_port.training import left_padded, positions_logits

EMBEDDED = "glm-tiny"
# The embedded default: small enough to learn the toy task in about a minute on 2 CPU cores.
TINY = dict(num_layers=2, hidden_size=128, num_attention_heads=4, max_sequence_length=64,
            embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)
LORA_DEFAULTS: dict = {}  # glm-finetune's own defaults (PaddleNLP's GLM recipe passes r and alpha itself)
logits = positions_logits  # GLM takes glm_port's batch layout as it is


def load(path: Path | None, device, recompute: bool = False, tokenizer_path: Path | None = None,
         meta: bool = False):
    """``(model, vocabulary)``: any GLM weights ``path`` holds, or (None) a new small GLM. The vocabulary is
    ``tokenizer_path``'s (a directory or a vocabulary file) when given, else the one recorded beside the
    weights (a Hugging Face directory's files; glm-pretrain and glm-finetune record theirs the same way).
    ``meta``: the same model built on the meta device from the config alone, no weight read (fp32; a sharded
    run's ranks other than 0, filled from rank 0's weights)."""
    from glm_port import data

    if path is None:
        vocab = data.get_tokenizer() if tokenizer_path is None else _tokenizer(tokenizer_path)
        config = GLMConfig(vocab_size=vocab.vocab_size, checkpoint_activations=recompute, **TINY)
        if meta:
            with torch.device("meta"):
                return GLMModel(config), vocab
        return GLMModel(config).to(device), vocab
    from glm_port.distributed import current_model_parallel
    from glm_port.models.glm.hf import GLMForConditionalGeneration

    vocab = _tokenizer(tokenizer_path if tokenizer_path is not None else tokenizer_home(path))  # quick: first
    if meta:
        from glm_port.models.glm.weights import find_source, source_config

        with torch.device("meta"):
            glm = GLMForConditionalGeneration(source_config(find_source(path))).glm
        glm.eval()
    else:  # under --tensor_parallel_degree the model is built split: each rank reads its slices (Megatron's rules)
        glm = GLMForConditionalGeneration.from_pretrained(path, device=device,
                                                          tensor_parallel=current_model_parallel()).glm
    if vocab.num_tokens > glm.config.vocab_size:
        raise ValueError(f"the tokenizer has {vocab.num_tokens} tokens but the model at {path} only "
                         f"{glm.config.vocab_size} embedding rows: not the vocabulary it was trained with")
    if recompute:
        glm.config = glm.transformer.config = glm.config.replace(checkpoint_activations=True)
    return glm, vocab


def tokenizer_home(path: Path) -> Path:
    """Where the tokenizer of the weights at ``path`` is recorded: the weights' directory (a weight file's
    directory), or, for one iteration of a glm-pretrain / glm-finetune checkpoint (``SAVE/20``, or a rank
    file in it), the checkpoint directory above it (``SAVE``, beside the tracker) when that records one."""
    from glm_port.checkpoint_io import RANK_FILE, TRACKERS

    path = Path(path)
    if path.is_file() and (RANK_FILE.search(path.name) or path.suffix in (".pt", ".bin", ".safetensors")):
        path = path.parent
    parent = path.parent
    if not (path / "tokenizer_config.json").is_file() and (parent / "tokenizer_config.json").is_file() and \
            any((parent / tracker).is_file() for tracker in TRACKERS):
        return parent
    return path


def _tokenizer(path: Path):
    from glm_port.models.glm.tokenizer import GLMTokenizer

    return GLMTokenizer.from_pretrained(path).vocab


def fit_lengths(model, src_length: int, tgt_length: int) -> tuple[int, int]:
    """``(src_length, tgt_length)`` within the model's positions: Part A takes positions ``0..src_length-1``,
    Part B block positions ``1..tgt_length`` (one table row each, ``max_sequence_length`` of them)."""
    limit = model.config.max_sequence_length
    return min(src_length, limit), min(tgt_length, limit)


def config_of(model) -> GLMConfig:
    return model.config


def fingerprint(vocab) -> str:
    return vocab.fingerprint


def encode(vocab, pairs, src_length: int, tgt_length: int, with_targets: bool = True):
    sources = vocab.encode_batch([p.source for p in pairs])
    targets = vocab.encode_batch([p.target for p in pairs]) if with_targets else [None] * len(pairs)
    return [encode_pair(vocab, s, t, src_length, tgt_length) for s, t in zip(sources, targets)]


def collate(samples, vocab) -> dict:
    return pad_batch(samples, vocab.pad_id)


def generate(model: GLMModel, vocab, samples, search: dict, batch_size: int, device) -> list[str]:
    """Each sample's Part A continued after ``sop`` by ``GLMForConditionalGeneration.generate``."""
    from glm_port.models.glm.hf import GLMForConditionalGeneration
    from glm_port.models.glm.tokenizer import GLMTokenizer

    tokenizer = GLMTokenizer(vocab)
    generator = GLMForConditionalGeneration(model.config, glm=model).eval()
    stops = [tokenizer.eop_token_id, tokenizer.eos_token_id]
    search = {"eos_token_id": stops, "pad_token_id": tokenizer.pad_token_id, **search}
    texts = []
    for start in range(0, len(samples), batch_size):
        ids, mask = left_padded([s.text[:s.sep] for s in samples[start:start + batch_size]], tokenizer.pad_token_id)
        inputs = tokenizer.build_inputs_for_generation({"input_ids": ids, "attention_mask": mask},
                                                       max_gen_length=search["max_new_tokens"]).to(device)
        with torch.no_grad():
            out = generator.generate(**inputs, **search)
        for row in out[:, inputs["input_ids"].size(1):].tolist():
            cut = next((k for k, t in enumerate(row) if t in (*stops, tokenizer.pad_token_id)), len(row))
            texts.append(vocab.decode(row[:cut]).strip())
    return texts


def save(model: GLMModel, vocab, directory: Path, source: Path | None) -> None:
    """A directory ``from_pretrained`` and glm-generate read: config, safetensors, the vocabulary files."""
    from glm_port.models.glm.hf import GLMForConditionalGeneration

    GLMForConditionalGeneration(model.config, glm=model).save_pretrained(directory)
    save_tokenizer(vocab, directory, source)


def save_tokenizer(vocab, directory: Path, source: Path | None) -> None:
    import shutil

    from glm_port.models.glm.tokenizer import GLMTokenizer, recorded_lowercase, tokenizer_files

    Path(directory).mkdir(parents=True, exist_ok=True)
    source = Path(source) if source is not None else None  # the weights' directory, or the tokenizer's path
    GLMTokenizer(vocab).save_pretrained(directory, lowercase=recorded_lowercase(source) if source else None)
    for file in tokenizer_files(source, source) if source is not None else []:
        if not (Path(directory) / file.name).exists():
            shutil.copy2(file, Path(directory) / file.name)
