"""GLM's one config: THUDM's ``config.json`` fields as a transformers ``PretrainedConfig``, and glm_port's run
settings beside them.

``GLMConfig`` is what ``GLMModel`` is built from and what ``GLMForConditionalGeneration`` (its ``config_class``),
``save_pretrained``/``from_pretrained``, glm-merge, glm-export and the checkpoints' ``'glm_config'`` read and
write. Before issue 27 a frozen dataclass (``GLMConfig``) and a transformers config (``GLMPretrainedConfig``),
converted into each other by a field table, described one GLM twice; the old name still imports, with a
``DeprecationWarning``, and is this class.
"""

from __future__ import annotations

import copy

from transformers import PretrainedConfig

from glm_port.data._renamed import renamed

# How a model is run (trained), not what it is: glm-pretrain's and glm-finetune's flags set them, and config.json
# never records them. THUDM's config.json carries two of these names (checkpoint_activations,
# checkpoint_num_layers); read from a file they do not change how glm_port runs the model, and are written back
# as read (``GLMConfig.from_dict``).
RUN_SETTINGS = ("max_memory_length", "checkpoint_activations", "checkpoint_num_layers", "checkpoint_policy")
_CARRIED = "_config_json_run_settings"  # RUN_SETTINGS names a config.json held, with its values


class GLMConfig(PretrainedConfig):
    """Shape and regularisation of a GLM: THUDM's ``config.json`` field names (upstream's flag in brackets);
    the defaults are THUDM's (GLM-Large's shape), so a config.json without a field reads as THUDM's code reads it.

    ``init_method_std`` (glm_port's, upstream's name) is ``initializer_range`` (config.json's); ``num_hidden_layers``
    and ``max_position_embeddings`` are transformers' names of ``num_layers`` and ``max_sequence_length``.
    Fields THUDM's config carries for other variants (``relative_encoding``, ``attention_scale`` other than 1,
    ``spell_length``) are read, and refused by ``check_supported`` (``GLMModel`` calls it) rather than ignored.
    Other THUDM fields (``output_predict``, ``pool_token``...) are kept as they are and written back.
    """

    model_type = "glm"
    attribute_map = {"num_hidden_layers": "num_layers", "max_position_embeddings": "max_sequence_length",
                     "init_method_std": "initializer_range"}

    def __init__(self, num_layers=24, vocab_size=30592, hidden_size=1024, num_attention_heads=16,
                 embedding_dropout_prob=0.1, attention_dropout_prob=0.1, output_dropout_prob=0.1,
                 max_sequence_length=512, block_position_encoding=True, relative_encoding=False,
                 attention_scale=1.0, layernorm_epsilon=1e-5, initializer_range=0.02, attention_impl="fused",
                 spell_length=None, intermediate_size=None, max_memory_length=0, checkpoint_activations=False,
                 checkpoint_num_layers=1, checkpoint_policy="full", **kwargs):
        self.num_layers = num_layers  # --num-layers
        self.vocab_size = vocab_size  # padded vocabulary (upstream pads to a multiple of 128)
        self.hidden_size = hidden_size  # --hidden-size
        self.num_attention_heads = num_attention_heads  # --num-attention-heads
        self.embedding_dropout_prob = embedding_dropout_prob  # --hidden-dropout
        self.attention_dropout_prob = attention_dropout_prob  # --attention-dropout
        self.output_dropout_prob = output_dropout_prob  # --hidden-dropout
        self.max_sequence_length = max_sequence_length  # --max-position-embeddings
        self.block_position_encoding = block_position_encoding  # 2D positions (--block-lm)
        self.relative_encoding = relative_encoding
        self.attention_scale = attention_scale
        self.layernorm_epsilon = layernorm_epsilon  # --layernorm-epsilon
        self.initializer_range = initializer_range  # init_method_std
        # "fused": shim's fused_masked_attention (torch's SDPA on CUDA, a blocked kernel with dropout on CPU);
        # "sdpa": torch's scaled_dot_product_attention with a boolean mask, as it is;
        # "explicit": upstream's formula scores*mask - 65504*(1-mask), kept as the reference.
        self.attention_impl = attention_impl
        self.spell_length = spell_length
        self.intermediate_size = intermediate_size  # --intermediate-size: the MLP's inner width; None = 4 * hidden
        # The run settings (RUN_SETTINGS).
        self.max_memory_length = max_memory_length  # --mem-length (Transformer-XL style memory; 0 = off)
        self.checkpoint_activations = checkpoint_activations  # --checkpoint-activations
        self.checkpoint_num_layers = checkpoint_num_layers  # --checkpoint-num-layers
        # What checkpointing keeps of a chunk (--checkpoint-policy): "full" only its input, "selective" also
        # the outputs of its matmuls, recomputing the elementwise ops and attention in backward.
        self.checkpoint_policy = checkpoint_policy
        kwargs.setdefault("tie_word_embeddings", True)
        super().__init__(**kwargs)  # init_method_std among kwargs lands in initializer_range (attribute_map)
        self._check_shape()

    # ---- checks ----------------------------------------------------------------------------------------
    def _check_shape(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden size {self.hidden_size} is not divisible by "
                f"{self.num_attention_heads} attention heads"
            )
        if self.attention_impl not in ("fused", "sdpa", "explicit"):
            raise ValueError(
                f"attention_impl must be 'fused', 'sdpa' or 'explicit', not {self.attention_impl!r}"
            )
        if self.checkpoint_policy not in ("full", "selective"):
            raise ValueError(f"checkpoint_policy must be 'full' or 'selective', not {self.checkpoint_policy!r}")
        if self.intermediate_size is not None and self.intermediate_size <= 0:
            raise ValueError(f"intermediate_size must be positive, got {self.intermediate_size}")
        for name in ("vocab_size", "num_layers", "hidden_size", "num_attention_heads", "max_sequence_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def check_supported(self) -> None:
        """A one-line ValueError for values out of range (also after fields were set one by one) and for
        THUDM variants glm_port does not run."""
        self._check_shape()
        if self.relative_encoding:
            raise ValueError("config.json: relative_encoding (Transformer-XL positions) is not supported")
        if self.attention_scale not in (None, 1, 1.0):
            raise ValueError(f"config.json: attention_scale {self.attention_scale} is not supported (only 1.0)")
        if self.spell_length:
            raise ValueError("config.json: spell_length (P-tuning prompts) is not supported")

    # ---- derived sizes ---------------------------------------------------------------------------------
    @property
    def ffn_hidden_size(self) -> int:
        """The MLP's inner width: ``intermediate_size``, else upstream's 4 * hidden_size."""
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    # ---- copies, comparison, serialisation -------------------------------------------------------------
    def replace(self, **changes) -> "GLMConfig":
        """A copy with ``changes`` (this one unchanged), checked as a new config is; a TypeError for a name
        that is no field."""
        unknown = [name for name in changes if name not in vars(self) and name not in self.attribute_map]
        if unknown:
            raise TypeError(f"GLMConfig has no field {unknown[0]!r}")
        config = copy.deepcopy(self)
        for name, value in changes.items():
            setattr(config, name, value)
        config._check_shape()
        return config

    def __eq__(self, other):
        # transformers' PretrainedConfig compares every attribute, but the dataclass transformers makes of each
        # config subclass would compare only PretrainedConfig's own fields: say which.
        return type(other) is type(self) and vars(self) == vars(other)

    __hash__ = None  # mutable, as transformers configs are

    def to_dict(self) -> dict:
        """transformers' dict (what config.json and checkpoints' ``'glm_config'`` hold) without the run settings,
        but with those a config.json held, as it held them."""
        fields = super().to_dict()
        for name in RUN_SETTINGS:
            fields.pop(name, None)
        fields.update(fields.pop(_CARRIED, None) or {})
        return fields

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """A config.json's (or a saved ``to_dict``'s) fields, as ``from_pretrained`` reads them: run-setting names
        it holds are kept to be written back, the run settings themselves left at their defaults."""
        fields = dict(config_dict)
        carried = {name: fields.pop(name) for name in RUN_SETTINGS if name in fields}
        read = super().from_dict(fields, **kwargs)
        config = read[0] if isinstance(read, tuple) else read
        if carried:
            setattr(config, _CARRIED, carried)
        return read


__getattr__ = renamed(__name__, {"GLMPretrainedConfig": "GLMConfig"}, globals())  # the name before issue 27
