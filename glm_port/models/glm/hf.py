"""GLM for generation: a transformers ``PreTrainedModel`` + ``GenerationMixin`` over glm_port's GLM.

``GLMForConditionalGeneration`` holds the GLM model as ``self.glm`` (so its state dict is THUDM's
Hugging Face one: ``glm.word_embeddings.weight``, ...) and runs GLM's one forward (``GLMModel.forward``,
this class adding only default positions and the loss) with a key/value cache: a
transformers ``Cache`` (``DynamicCache`` by default) holds every layer's keys and values, so a decode
step projects only the new token. Upstream's ``mems`` hold hidden states and re-project Q/K/V over
``[mem; h]`` at every step; the math is the same (keys and values of earlier positions do not change),
the work per step is one token's.

``generate`` is transformers' ``GenerationMixin.generate`` (greedy, sampling, beam search, stopping
criteria, logits processors); this class supplies GLM's 2D positions and generation attention mask
per step in ``prepare_inputs_for_generation``. Feed it ``GLMTokenizer.build_inputs_for_generation``'s
output: ``model.generate(**inputs, max_new_tokens=...)``.
"""

from __future__ import annotations

from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

import shim as torch
import shim.nn.functional as F
from glm_port.data._renamed import renamed
from glm_port.models.glm.config import GLMConfig
from glm_port.models.glm.model import GLMModel


class GLMForConditionalGeneration(PreTrainedModel, GenerationMixin):
    """GLM with a language-model head tied to the word embeddings, a KV cache and ``generate``."""

    config_class = GLMConfig
    base_model_prefix = "glm"
    main_input_name = "input_ids"
    _no_split_modules = ["TransformerLayer"]

    def __init__(self, config: GLMConfig, glm: GLMModel | None = None):
        """``glm``: a ``GLMModel`` of ``config`` to wrap as it is (finetuning's); without one, a new ``GLMModel``
        built from ``self.config``: the wrapper and the model hold one config object."""
        super().__init__(config)
        self.glm = glm if glm is not None else GLMModel(self.config)
        self.pipeline = None  # a glm_port.distributed.PipelineStage when the layers are split into stages
        self.run_device = None  # where it runs, when the first parameter (another stage's) does not say
        self.post_init()

    @property
    def device(self):
        return self.run_device if self.run_device is not None else super().device

    @property
    def dtype(self):
        # A pipeline stage leaves other stages' weights on the meta device: ask one it holds.
        return next((p.dtype for p in self.parameters() if not p.is_meta), super().dtype)

    def _init_weights(self, module):
        """GLMModel initialises itself (upstream's scheme); loading replaces it."""

    def get_input_embeddings(self):
        return self.glm.word_embeddings

    # ---- loading ----------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path, *, dtype=None, device=None, tensor_parallel=None, quantize=None,
                        quantize_group_size=None, **overrides):
        """Load any GLM weights ``path`` holds (see ``glm_port.models.glm.weights``): a Hugging Face GLM
        directory, upstream ``mp_rank_XX_model_states.pt`` files at any model-parallel size, or a
        ``glm-pretrain --save`` directory. Weights go to ``device`` in ``dtype`` shard by shard.
        ``quantize`` ("int8" or "int4", ``quantize_group_size`` default 128): the linear layers quantized
        after loading (``Family.quantize``; the output is the tied embedding table and stays float)."""
        from glm_port.models import FAMILIES, check_quantize
        from glm_port.models.glm import weights

        problem = check_quantize(quantize, quantize_group_size)
        if problem is not None:
            raise ValueError(problem)

        dtype = overrides.pop("torch_dtype", dtype)  # transformers' older spelling
        unknown = [k for k in overrides if not hasattr(GLMConfig(), k)]
        if unknown:
            raise TypeError(f"from_pretrained got unexpected arguments: {', '.join(unknown)} (config fields and "
                            f"dtype, device, tensor_parallel are accepted)")
        model = weights.load_model(cls, path, dtype=dtype, device=device, tensor_parallel=tensor_parallel,
                                   **overrides)
        if quantize is not None:
            FAMILIES["glm"].quantize(model, quantize, quantize_group_size)
        return model

    # ---- the forward ------------------------------------------------------------------------------
    def forward(self, input_ids, position_ids=None, attention_mask=None, cache: Cache | None = None,
                use_cache: bool | None = None, logits_to_keep: int = 0, labels=None, return_dict=True, **kwargs):
        """Logits for ``input_ids`` ``[b, q]`` after the ``cache``'s ``m`` positions.

        ``position_ids``: ``[b, 2, q]`` (position, block position); default ``m..m+q-1`` and block 0.
        ``attention_mask``: the full form ``[b, 1, q, m + q]`` (True/1 = may attend), upstream's ``sep``
        form (``[b]`` or a scalar: keys before ``sep`` seen by all, the rest causal), or ``None``
        (all of the prompt seen by all: ``sep = m + q``). ``logits_to_keep``: only the last n positions'
        logits (0 = all). ``labels`` (-100 = ignored): the loss is upstream's mean over counted tokens.
        """
        batch_size, query_length = input_ids.shape
        if use_cache and cache is None:
            cache = DynamicCache()
        layer_cache = cache if use_cache is not False else None
        if position_ids is None:
            past = layer_cache.get_seq_length() if layer_cache is not None else 0
            positions = torch.arange(past, past + query_length, device=input_ids.device).expand(batch_size, -1)
            position_ids = torch.stack((positions, torch.zeros_like(positions)), dim=1)
        # GLM's one forward (GLMModel): the embeddings, this stage's layers over the cache, the logits.
        stage = self.pipeline
        logits = self.glm(input_ids, position_ids, attention_mask, cache=layer_cache, stage=stage,
                          logits_to_keep=logits_to_keep, parallel_output=False)[0]
        if stage is not None:  # every stage takes the same search step on the last stage's logits
            if logits is None:
                logits = torch.empty(batch_size, logits_to_keep or query_length, self.config.vocab_size,
                                     dtype=self.dtype, device=input_ids.device)
            logits = stage.broadcast_from_last(logits)
        loss = None
        if labels is not None:
            counted = labels != -100
            losses = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten().clamp(min=0), reduction="none")
            loss = (losses * counted.flatten()).sum() / counted.sum().clamp(min=1)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache if use_cache is not False else None)

    # ---- generation -------------------------------------------------------------------------------
    def generate(self, input_ids=None, position_ids=None, generation_attention_mask=None, **kwargs):
        """``GenerationMixin.generate`` with GLM's inputs (``build_inputs_for_generation``'s output).

        ``position_ids`` ``[b, 2, L]`` and ``generation_attention_mask`` ``[b, 1, L, L]`` cover every
        position generation may reach (L = prompt + sop + max_gen_length); GenerationMixin's own
        handling of ``position_ids`` (which appends ``last + 1``) does not fit 2D positions, so they
        travel under their own names.
        """
        for key in ("mask_positions", "prompt_length"):
            kwargs.pop(key, None)
        if position_ids is None or generation_attention_mask is None:
            raise ValueError("GLM generation needs position_ids and generation_attention_mask: "
                             "pass tokenizer.build_inputs_for_generation(...)'s output")
        kwargs.setdefault("pad_token_id", getattr(self.generation_config, "pad_token_id", None))
        return super().generate(input_ids, glm_position_ids=position_ids,
                                generation_attention_mask=generation_attention_mask, **kwargs)

    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, cache=None, attention_mask=None,
                                      glm_position_ids=None, generation_attention_mask=None, use_cache=True,
                                      is_first_iteration=False, **kwargs):
        """The step's new tokens with their 2D positions and their rows of the generation mask."""
        past = cache.get_seq_length() if cache is not None and use_cache else 0
        current = input_ids.size(1)
        if current > glm_position_ids.size(-1):
            raise ValueError(f"generation reached {current} tokens, past the {glm_position_ids.size(-1)} positions "
                             f"build_inputs_for_generation laid out: raise its max_gen_length")
        visible = generation_attention_mask[:, :, past:current, :current].bool()
        if attention_mask is not None:  # keys dropped between blanks (end tokens, padding)
            visible = visible & attention_mask[:, None, None, :current].bool()
        if cache is not None and use_cache and getattr(cache, "is_compileable", False):
            # A preallocated cache: attention reads its whole buffer, whose unwritten slots stay unseen.
            buffer = cache.get_mask_sizes(visible.size(-2), 0)[0]
            visible = F.pad(visible, (0, buffer - visible.size(-1)), value=False)
        inputs = {
            "input_ids": input_ids[:, past:],
            "position_ids": glm_position_ids[:, :, past:current],
            "attention_mask": visible,
            "use_cache": use_cache,
        }
        if cache is not None and use_cache:
            inputs["cache"] = cache
        if "logits_to_keep" in kwargs:
            inputs["logits_to_keep"] = kwargs["logits_to_keep"]
        return inputs


__getattr__ = renamed(__name__, {"GLMPretrainedConfig": "GLMConfig"}, globals())  # the name before issue 27
