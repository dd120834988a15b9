"""GLM's ``hf`` binding (``glm_port.models.contract.HFDirectoryBinding``): what glm-merge and glm-export assemble
a Hugging Face GLM directory from (any GLM weights read whole, the config, the writer, the tokenizer and its
files), and the tokenizer files glm-pretrain records beside its checkpoints. The names live in their own
modules (``weights``, ``hf``, ``tokenizer``, ``generation``); this module gathers them for the commands."""

from __future__ import annotations

from glm_port.models.glm.generation import load_tokenizer
from glm_port.models.glm.hf import GLMForConditionalGeneration
from glm_port.models.glm.tokenizer import TOKENIZER_FILES, GLMTokenizer, tokenizer_files
from glm_port.models.glm.weights import HF_PREFIX, find_source, iter_tensors, save_hf, source_config

model_class = GLMForConditionalGeneration
tokenizer_class = GLMTokenizer

__all__ = ["HF_PREFIX", "TOKENIZER_FILES", "find_source", "iter_tensors", "load_tokenizer", "model_class",
           "save_hf", "source_config", "tokenizer_class", "tokenizer_files"]
