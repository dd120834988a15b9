"""GLM's data pipeline: tokenizers with GLM's command tokens, blank infilling, corpora and training batches.

    tok = get_tokenizer()                      # built-in default; or ("BertWordPieceTokenizer", vocab_dir)
    batches = build_train_batches(None, tok, seq_length=128, batch_size=8, seed=1)   # embedded corpus
    batch = next(batches)                      # text, target, loss_mask, attention_mask (sep), position_id
"""

from glm_port.data._renamed import renamed
from glm_port.data.batches import DataOptions, build_batches, build_train_batches, corpus_splits, stack_batch
from glm_port.data.blocklm import BlockMasker
from glm_port.data.corpora import resolve_corpora
from glm_port.data.corpus import TokenizedCorpus, load_corpus, read_documents, tokenize_file
from glm_port.data.tokenization import DEFAULT_TOKENIZER, GLMVocab, get_tokenizer

__all__ = [
    "DEFAULT_TOKENIZER", "BlockMasker", "DataOptions", "GLMVocab", "TokenizedCorpus", "build_batches",
    "build_train_batches", "corpus_splits", "get_tokenizer", "load_corpus", "read_documents",
    "resolve_corpora", "stack_batch", "tokenize_file",
]

# The names before issue 27 (one name, one meaning): GLMTokenizer is the inference tokenizer
# (glm_port.GLMTokenizer, over a GLMVocab); collate is a family's finetune binding's.
__getattr__ = renamed(__name__, {"GLMTokenizer": "GLMVocab", "collate": "stack_batch"}, globals())
