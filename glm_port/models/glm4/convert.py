"""GLM-4 <-> transformers' native ``GlmForCausalLM`` (model_type "glm", as ``glm-4-9b-chat-hf`` ships): glm-convert.

The network is ChatGLM2's, so are the names: the tensors and the config go through ``chatglm2.convert``'s mapping
(``query_key_value`` split into ``q|k|v_proj`` and joined back, ``rope_theta`` = 10000 x ``rope_ratio``,
``partial_rotary_factor`` 0.5), written by its ``write_plan`` (safetensors shards into a temporary directory
renamed to DST when complete). What differs is the tokenizer:

- ``--to transformers``: THUDM's tiktoken ``tokenizer.model`` becomes a ``tokenizer.json`` (transformers'
  ``TikTokenConverter`` with GLM-4's pattern and its fourteen specials after the ranks, ``[gMASK]<sop>`` put
  before every input by its post-processor, as GLM-4's tokenizer does), with eos/pad ``<|endoftext|>``, left
  padding and the directory's chat template: ``AutoTokenizer`` loads it with no remote code. No
  ``tokenizer.model`` is copied (glm-4-9b-chat-hf has none). A ``generation_config.json`` ends replies at
  GLM-4's three stop ids.
- ``--from transformers``: the ranks are read back from the ``tokenizer.json`` (``weights.load_tokenizer``) and
  written as THUDM's ``tokenizer.model`` + ``tokenizer_config.json`` (``GLM4Tokenizer.save_pretrained``).

glm-merge and glm-export write GLM-4 in THUDM's layout, as ChatGLM2's are written (``chatglm2.convert``'s
``write_merged`` and ``save_checkpoint``: safetensors shards + index, ``config.json`` naming ``GLM4ForCausalLM``,
published whole or not at all), with GLM-4's tokenizer (``tokenizer.model`` + ``tokenizer_config.json``):

- ``merge_checkpoint``: glm-finetune ``--tensor_parallel_degree``'s shards (merged by ChatGLM2's split plan,
  ``weights.shard_source``), or a GLM-4 directory in either layout (transformers' is written back in THUDM's).
- ``save_checkpoint``: glm-export's writer, the model with its LoRA adapter folded in.
- ``check_quantize`` (and ``quantize_checkpoint``): refused in one line, before glm-export reads anything: THUDM's GLM-4 directories carry no quantized layout (no
  ``quantization_bit`` weights); quantize at load (``glm-generate --quantize``).
"""

from __future__ import annotations

from pathlib import Path

from glm_port.models import WeightsError
from glm_port.models.chatglm2.convert import (_parse_size, check_destination, from_glm_plan, to_glm_config,
                                              to_glm_plan, write_plan)
from glm_port.models.chatglm2.weights import TensorSource, read_config_json
from glm_port.models.glm4.detect import is_rank_file, is_transformers_glm

TRANSFORMERS_MODEL_TYPES = ("glm",)  # transformers' native GlmForCausalLM, what from_transformers reads


def fast_tokenizer(tokenizer, model_max_length: int | None = None):
    """``tokenizer`` (a ``GLM4Tokenizer``) as transformers' own ``PreTrainedTokenizerFast``: the same ids for
    text, specials and chats (``[gMASK]<sop>`` first, left padding with ``<|endoftext|>``, the chat template)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from glm_port.models.glm4.tokenizer import EOS_TOKEN, PAT_STR, PREFIX_TOKENS, SPECIAL_TOKENS

    backend = TikTokenConverter(tokenizer.vocab_file, pattern=PAT_STR,
                                extra_special_tokens=list(SPECIAL_TOKENS)).converted()
    prefix = " ".join(PREFIX_TOKENS)
    backend.post_processor = TemplateProcessing(
        single=f"{prefix} $A", pair=f"{prefix} $A $B {EOS_TOKEN}",
        special_tokens=[(t, tokenizer.get_command(t)) for t in (*PREFIX_TOKENS, EOS_TOKEN)])
    for token in SPECIAL_TOKENS:  # the converter numbers them after the ranks, as GLM-4 does: check it
        if backend.token_to_id(token) != tokenizer.get_command(token):
            raise WeightsError(f"{tokenizer.vocab_file}: {token} would be id {backend.token_to_id(token)} in "
                               f"tokenizer.json, not {tokenizer.get_command(token)}")
    options = {"model_max_length": model_max_length} if model_max_length else {}
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN,
                                   additional_special_tokens=list(SPECIAL_TOKENS), padding_side="left",
                                   clean_up_tokenization_spaces=False, chat_template=tokenizer.chat_template,
                                   **options)


def _source_tokenizer(src):
    """The GLM-4 tokenizer of ``src`` (its ``tokenizer.model``, or the ranks of its ``tokenizer.json``); None with
    neither file."""
    from glm_port.models.glm4.weights import load_tokenizer

    if not any((Path(src) / name).is_file() for name in ("tokenizer.model", "tokenizer.json")):
        return None
    return load_tokenizer(src)


def to_transformers(src, dst, dtype=None, max_shard_size="2GB") -> None:
    """GLM-4 directory ``src`` in THUDM's layout -> transformers ``glm`` directory ``dst`` (``GlmForCausalLM``,
    ``AutoTokenizer`` load it with no remote code)."""
    from glm_port.models.glm4.weights import read_config

    check_destination(dst, [("SRC", src)])
    config = read_config(src)  # a one-line error for a directory that is not GLM-4's
    if is_transformers_glm(read_config_json(src)):
        raise WeightsError(f"{Path(src) / 'config.json'}: already transformers' glm layout (GlmForCausalLM); "
                           f"--from transformers converts it to THUDM's")
    glm_config = to_glm_config(config)
    plan = to_glm_plan(config, TensorSource(src))
    tokenizer = _source_tokenizer(src)  # before any tensor is read: a bad tokenizer fails early
    fast = fast_tokenizer(tokenizer, config.seq_length) if tokenizer is not None else None

    def write_config(directory):
        if dtype is not None:
            glm_config.dtype = dtype
        glm_config.architectures = ["GlmForCausalLM"]
        glm_config.save_pretrained(directory)
        if fast is not None:
            fast.save_pretrained(directory)
            from transformers import GenerationConfig

            eos = config.eos_token_id
            GenerationConfig(eos_token_id=list(eos) if isinstance(eos, (list, tuple)) else eos,
                             pad_token_id=config.pad_token_id).save_pretrained(directory)

    write_plan(plan, dst, write_config, dtype, _parse_size(max_shard_size), src, desc="to transformers",
               tokenizer_files=())


def from_transformers(src, dst, dtype=None, max_shard_size="2GB") -> None:
    """transformers ``glm`` directory ``src`` holding a GLM-4 -> GLM-4 directory ``dst`` in THUDM's layout
    (``model_type: chatglm``, THUDM's tensor names, ``tokenizer.model``)."""
    from glm_port.models.glm4.weights import read_config

    check_destination(dst, [("SRC", src)])
    raw = read_config_json(src)
    if not is_transformers_glm(raw):
        raise WeightsError(f"{Path(src) / 'config.json'}: model_type {raw.get('model_type')!r} is not transformers' "
                           f"GlmForCausalLM ('glm')")
    config = read_config(src)  # GLM4Config from the GlmConfig; one line for what this port does not run
    plan = from_glm_plan(config, TensorSource(src))
    tokenizer = _source_tokenizer(src)

    def write_config(directory):
        config.save_pretrained(directory)
        if tokenizer is not None:
            tokenizer.save_pretrained(directory)  # tokenizer.model + THUDM's tokenizer_config.json

    write_plan(plan, dst, write_config, dtype, _parse_size(max_shard_size), src, desc="from transformers",
               tokenizer_files=())


def tokenizer_for(src, source, tokenizer_path):
    """The GLM-4 tokenizer to write beside the merged weights: ``tokenizer_path`` (a ``tokenizer.model`` or a
    directory with one, or with a ``tokenizer.json``), else the one beside SRC (for shards: in SRC, their iteration
    directory or its parent)."""
    from glm_port.models.chatglm2.convert import find_tokenizer, tokenizer_places
    from glm_port.models.glm4.tokenizer import GLM4Tokenizer
    from glm_port.models.glm4.weights import load_tokenizer

    def load_file(path):
        if not is_rank_file(path):
            raise WeightsError(f"--tokenizer-path {path}: not a tiktoken rank file ('base64 rank' lines), as "
                               f"GLM-4's is")
        return GLM4Tokenizer(path)

    src = Path(src)
    if tokenizer_path is None:  # transformers' layout carries a tokenizer.json and no tokenizer.model
        place = next((p for p in tokenizer_places(src, source) if (p / "tokenizer.model").is_file()
                      or (p / "tokenizer.json").is_file()), None)
        if place is not None:
            return load_tokenizer(place)
    return find_tokenizer(src, source, tokenizer_path, load_tokenizer, load_file)


def merge_checkpoint(src, dst, *, dtype=None, tokenizer_path=None, overwrite=False, max_shard_size="2GB") -> dict:
    """GLM-4 weights at ``src`` (tensor-parallel shards, or a directory in THUDM's or transformers' layout) -> one
    THUDM-layout GLM-4 directory ``dst`` (``chatglm2.convert.write_merged``); names, shapes and the tokenizer are
    checked before anything is written. Returns glm-merge's summary."""
    from glm_port.models.chatglm2.convert import write_merged
    from glm_port.models.glm4.weights import check_directory, open_weights

    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    check_destination(dst, [("SRC", src), ("--tokenizer-path", tokenizer_path)], overwrite, "--overwrite")
    config = check_directory(src)  # shards: every rank's file, names and parts' shapes; else config and names
    source = open_weights(src, config)
    config = getattr(source, "config", config)
    tokenizer = tokenizer_for(src, source, tokenizer_path)
    return write_merged(src, dst, source, config, tokenizer, "GLM4ForCausalLM", len(tokenizer),
                        f"GLM-4 tiktoken ({len(tokenizer)} ids)", dtype=dtype, tokenizer_path=tokenizer_path,
                        overwrite=overwrite, max_shard_size=max_shard_size)


def check_quantize(mode: str) -> None:
    """glm-export ``--quantize``, before anything is read: refused in one line (GLM-4's directories have no
    quantized layout)."""
    raise WeightsError(f"--quantize {mode}: glm-export writes quantized weights in THUDM's ChatGLM2 layout only; "
                       f"GLM-4's directories hold float weights: quantize a GLM-4 at load with glm-generate --quantize")


def quantize_checkpoint(state: dict, config, mode: str):
    """glm-export ``--quantize``: refused in one line (``check_quantize``)."""
    check_quantize(mode)


def save_checkpoint(state: dict, config, tokenizer, dst, *, overwrite: bool = False, inputs=(), **options) -> dict:
    """A whole GLM-4 ``state`` (THUDM's names) -> one THUDM-layout GLM-4 directory ``dst``: glm-export's writer
    (``chatglm2.convert.save_checkpoint`` with GLM-4's model class, so ``config.json`` names ``GLM4ForCausalLM``)."""
    from glm_port.models.chatglm2.convert import save_checkpoint as save_thudm_layout
    from glm_port.models.glm4.model import GLM4ForCausalLM

    return save_thudm_layout(state, config, tokenizer, dst, overwrite=overwrite, inputs=inputs,
                             model_class=GLM4ForCausalLM, **options)


__all__ = ["TRANSFORMERS_MODEL_TYPES", "check_quantize", "fast_tokenizer", "from_transformers", "merge_checkpoint",
           "quantize_checkpoint", "save_checkpoint", "to_transformers", "tokenizer_for"]
