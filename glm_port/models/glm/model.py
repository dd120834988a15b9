"""GLM: the model of THUDM/GLM with its parameter names, written on shim.

Parameter names follow upstream exactly, so ``mp_rank_00_model_states.pt['module']`` and a Hugging Face
GLM state dict (``glm.``-prefixed) load with ``model.load_state_dict``::

    word_embeddings.weight
    transformer.position_embeddings.weight          [max_seq + 1, h]
    transformer.block_position_embeddings.weight    [max_seq + 1, h]
    transformer.layers.{i}.input_layernorm.{weight,bias}
    transformer.layers.{i}.attention.query_key_value.{weight,bias}   [3h, h]: Q | K | V thirds
    transformer.layers.{i}.attention.dense.{weight,bias}
    transformer.layers.{i}.post_attention_layernorm.{weight,bias}
    transformer.layers.{i}.mlp.dense_h_to_4h.{weight,bias}
    transformer.layers.{i}.mlp.dense_4h_to_h.{weight,bias}
    transformer.final_layernorm.{weight,bias}

Pre-LN layers, tanh GELU, 2D positions (position + block position), logits tied to the word
embeddings, Transformer-XL style ``mems``. Under tensor parallel the linear layers and the embedding
are shards (Megatron's split: QKV per third, column-parallel h->3h and h->4h, row-parallel back) and
the logits come out vocab-sharded, as upstream's ``parallel_output``. The split is declared where each
layer is built, from GLM's split plan (``splits.SPLIT_PLAN``, the table the loaders slice and merge by)
(shim's ``Linear1D`` / ``VocabParallelEmbedding``, Megatron's ``skip_bias_add`` for the
matmuls whose bias is fused into the next op); in one process they are plain ``nn.Linear`` /
``nn.Embedding``. The launcher's layout (``glm_port.distributed.ParallelEnv``) is what makes them shards.

Each split layer carries the index of the transformer layer it belongs to (``layer_idx``; the word
embeddings: 0, LiBai's convention), which selects its pipeline stage's mesh under a layout with pipeline
stages (``shim.distributed.layer_mesh``). Layers of other stages are built on the meta device (nothing
allocated, nothing initialised); the word embeddings live on the first stage, with a copy on the last
stage for the tied output layer.
"""

from __future__ import annotations

import contextlib
import math

import shim as torch
import shim.distributed as dist
import shim.nn as nn
import shim.nn.functional as F
from glm_port.models.glm.attention import ATTENTION_IMPLS, visibility_mask
from glm_port.models.glm.config import GLMConfig
from glm_port.models.glm.splits import layer_split


# THUDM's Hugging Face code nests upstream's keys under its base_model_prefix; both spellings load.
HF_PREFIX = "glm."


def without_hf_prefix(weights: dict) -> dict:
    """``weights`` with upstream's key names (a leading ``glm.`` removed)."""
    return {k[len(HF_PREFIX):] if k.startswith(HF_PREFIX) else k: v for k, v in weights.items()}


def strip_hf_prefix(module, state_dict, prefix, *args) -> None:
    """``load_state_dict`` pre-hook: accept ``glm.``-prefixed keys as they are."""
    for key in [k for k in state_dict if k.startswith(prefix + HF_PREFIX)]:
        state_dict[prefix + key[len(prefix + HF_PREFIX):]] = state_dict.pop(key)


def _normal_(std: float):
    def init(tensor):
        return nn.init.normal_(tensor, mean=0.0, std=std)

    return init


def _linear(name, in_features, out_features, init, layer_idx, *, skip_bias_add=True):
    """Layer ``layer_idx``'s linear ``name``, ``in -> out``, split over tensor-parallel ranks as GLM's split
    plan says for its weight (``splits.SPLIT_PLAN``, the table the loaders slice by); bias returned for
    fusing unless ``skip_bias_add`` is off."""
    return nn.Linear1D(in_features, out_features, layer_idx=layer_idx, init_method=init,
                       skip_bias_add=skip_bias_add, **layer_split(layer_idx, name))


def _built_here(*layer_idx):
    """Build under this: on the meta device when this rank's pipeline stage holds none of ``layer_idx``."""
    return contextlib.nullcontext() if any(dist.holds_layer(i) for i in layer_idx) else torch.device("meta")


def _embedding_layer_idx() -> int:
    """The word embeddings' stage: the first (layer 0); on the last stage's ranks, its copy for the tied
    output layer (layer -1)."""
    return 0 if dist.holds_layer(0) or not dist.holds_layer(-1) else -1


class SelfAttention(nn.Module):
    """Multi-head self-attention over ``[mem; x]``; returns ``residual + dropout(dense(context))``."""

    def __init__(self, config: GLMConfig, output_init, layer_idx: int = 0):
        super().__init__()
        self.heads = nn.heads_per_rank(config.num_attention_heads)  # this rank's heads
        self.head_dim = config.head_dim
        # Q|K|V thirds, split per third (stride 3) so each rank holds [Q_r; K_r; V_r], upstream's mp_rank layout.
        self.query_key_value = _linear("attention.query_key_value", config.hidden_size, 3 * config.hidden_size,
                                       _normal_(config.init_method_std), layer_idx, skip_bias_add=False)
        self.dense = _linear("attention.dense", config.hidden_size, config.hidden_size, output_init, layer_idx)
        self.attention_dropout = config.attention_dropout_prob
        self.output_dropout = config.output_dropout_prob
        self.attend = ATTENTION_IMPLS[config.attention_impl]
        self.heads_split = self.heads < config.num_attention_heads

    def _heads(self, x):  # [b, s, n*d] -> [b, n, s, d]
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def forward(self, x, visible, residual, mem=None, cache=None, cache_index=0):
        """``cache`` (a transformers ``Cache``): this layer's keys and values of earlier positions; the new
        ones are appended, so a decode step projects only the new tokens (``mem`` re-projects ``[mem; x]``).
        ``cache_index``: this layer's slot in ``cache``, counted among the layers the cache holds (a pipeline
        stage's own, from 0), not ``layer_idx`` (the model's index, which picks the layer's mesh)."""
        query_length = x.size(1)
        qkv = self.query_key_value(x if mem is None else torch.cat((mem, x), dim=1))
        q, k, v = (self._heads(t) for t in qkv.chunk(3, dim=-1))
        q = q[:, :, -query_length:]
        if cache is not None:
            k, v = cache.update(k, v, cache_index)
            if k.size(-2) > visible.size(-1):  # a preallocated (static) cache: its empty slots stay unseen
                visible = F.pad(visible, (0, k.size(-2) - visible.size(-1)), value=False)
        with self._dropout_rng():
            context = self.attend(q, k, v, visible, self.attention_dropout if self.training else 0.0)
        out, bias = self.dense(context.transpose(1, 2).flatten(2))
        # Under autocast the matmul is half precision; the residual stream stays in its own dtype.
        return F.fused_bias_add_dropout(out.to(residual.dtype), bias, self.output_dropout, self.training, residual=residual)

    def _dropout_rng(self):
        """With heads split over ranks, attention dropout draws from the per-rank stream, as Megatron's
        ``get_cuda_rng_tracker().fork()``; otherwise from the default generator (nothing at all to draw in
        eval mode, so inference needs no seeded tracker)."""
        dropping = self.heads_split and self.training and self.attention_dropout > 0
        return torch.recompute.get_cuda_rng_tracker().fork() if dropping else contextlib.nullcontext()


class MLP(nn.Module):
    """h -> 4h (or ``intermediate_size``), tanh GELU, back to h; returns ``residual + dropout(mlp(x))``."""

    def __init__(self, config: GLMConfig, output_init, layer_idx: int = 0):
        super().__init__()
        h, inner = config.hidden_size, config.ffn_hidden_size
        self.dense_h_to_4h = _linear("mlp.dense_h_to_4h", h, inner, _normal_(config.init_method_std), layer_idx)
        self.dense_4h_to_h = _linear("mlp.dense_4h_to_h", inner, h, output_init, layer_idx)
        self.dropout = config.output_dropout_prob

    def forward(self, x, residual):
        hidden, bias = self.dense_h_to_4h(x)
        hidden = F.fused_bias_add_gelu(hidden, bias.to(hidden.dtype))
        out, bias = self.dense_4h_to_h(hidden)
        return F.fused_bias_add_dropout(out.to(residual.dtype), bias, self.dropout, self.training, residual=residual)


class TransformerLayer(nn.Module):
    def __init__(self, config: GLMConfig, output_init, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
        self.attention = SelfAttention(config, output_init, layer_idx)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
        self.mlp = MLP(config, output_init, layer_idx)

    def forward(self, x, visible, mem=None, cache=None, cache_index=0):
        mem = self.input_layernorm(mem) if mem is not None else None
        x = self.attention(self.input_layernorm(x), visible, residual=x, mem=mem, cache=cache, cache_index=cache_index)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class GLMTransformer(nn.Module):
    """Position embeddings, the layers and the final LayerNorm (upstream's GPT2ParallelTransformer). Its
    ``forward`` stops before the final LayerNorm, which ``GLMModel.forward`` applies to the positions it keeps."""

    def __init__(self, config: GLMConfig):
        super().__init__()
        self.config = config
        # Block positions need one more row than the sequence: Part A's block position is 0.
        rows = config.max_sequence_length + 1 if config.block_position_encoding else config.max_sequence_length
        self.position_embeddings = nn.Embedding(rows, config.hidden_size)
        nn.init.normal_(self.position_embeddings.weight, std=config.init_method_std)
        if config.block_position_encoding:
            self.block_position_embeddings = nn.Embedding(rows, config.hidden_size)
            nn.init.normal_(self.block_position_embeddings.weight, std=config.init_method_std)
        self.embedding_dropout = nn.Dropout(config.embedding_dropout_prob)
        # Residual-branch outputs start smaller, N(0, std / sqrt(2 L)), as in GPT-2 / Megatron.
        output_init = _normal_(config.init_method_std / math.sqrt(2.0 * config.num_layers))
        self.layers = nn.ModuleList()
        for index in range(config.num_layers):
            with _built_here(index):  # another pipeline stage's layer: meta, never initialised
                self.layers.append(TransformerLayer(config, output_init, layer_idx=index))
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)

    def embed_positions(self, hidden, position_ids):
        """``hidden`` (word embeddings) plus the position (and block position) embeddings, then dropout.
        ``position_ids``: ``[b, 2, s]`` (position, block position) or, without block positions, ``[b, s]``
        (or ``[b, 2, s]``, whose block row is then unused)."""
        if self.config.block_position_encoding:
            hidden = hidden + self.position_embeddings(position_ids[:, 0])
            hidden = hidden + self.block_position_embeddings(position_ids[:, 1])
        else:
            hidden = hidden + self.position_embeddings(position_ids if position_ids.dim() == 2 else position_ids[:, 0])
        return self.embedding_dropout(hidden)

    def forward(self, hidden, position_ids, visible, mems=(), return_memory=False, *, cache=None, stage=None):
        """The last layer's output (before ``final_layernorm``) and the new ``mems``.

        ``hidden``: the word embeddings, or on a later pipeline ``stage`` the previous stage's output (the
        position embeddings are the first stage's). ``visible``: the boolean mask (``visibility_mask``).
        ``cache`` (a transformers ``Cache``): keys and values of earlier positions, extended in place; each
        layer's slot is its index among the layers run here (a stage's own, numbered from 0).
        """
        if stage is None or stage.is_first:
            hidden = self.embed_positions(hidden, position_ids)
        layers = [self.layers[i] for i in (range(len(self.layers)) if stage is None else stage.layers)]
        keep_memory = cache is None and (self.config.max_memory_length > 0 or return_memory)
        layer_inputs = [hidden.detach()] if keep_memory else []
        # Layers run in chunks of checkpoint_num_layers under checkpointing, one by one otherwise and
        # whenever every layer's output is kept as memory. Never with a cache: recomputing would append twice.
        checkpointing = self._checkpointing() and cache is None
        chunk = self.config.checkpoint_num_layers if checkpointing and not keep_memory else 1
        for start in range(0, len(layers), chunk):
            chunk_layers = layers[start:start + chunk]
            layer_mems = list(mems[start:start + chunk]) if mems else [None] * len(chunk_layers)
            if checkpointing:
                hidden = torch.recompute.checkpoint(
                    _run_layers(chunk_layers), hidden, visible, *layer_mems, policy=self._checkpoint_policy()
                )
            else:
                hidden = _run_layers(chunk_layers, cache, start)(hidden, visible, *layer_mems)
            if keep_memory:
                layer_inputs.append(hidden.detach())
        new_mems = self._update_mems(layer_inputs, mems, return_memory) if keep_memory else []
        return hidden, new_mems

    def compile_layers(self, **options) -> None:
        """``torch.compile`` each layer in place (``nn.Module.compile``, so parameter names stay as they are)."""
        for layer in self.layers:
            layer.compile(**options)

    def _checkpointing(self) -> bool:
        return self.config.checkpoint_activations and self.training and torch.is_grad_enabled()

    def _checkpoint_policy(self):
        """None (recompute everything but the chunk's input) or the selective policy."""
        return torch.recompute.save_matmuls if self.config.checkpoint_policy == "selective" else None

    def _update_mems(self, hiddens, mems, return_memory):
        """Keep the last ``max_memory_length`` positions of ``[old mems; new hidden states]`` per layer."""
        query_length = hiddens[0].size(1)
        memory_length = mems[0].size(1) if mems else 0
        keep = memory_length + query_length
        if not return_memory:
            keep = min(self.config.max_memory_length, keep)
        if not mems:
            return [h[:, -keep:] for h in hiddens]
        return [torch.cat((m, h), dim=1)[:, -keep:] for m, h in zip(mems, hiddens)]


def _run_layers(layers, cache=None, first_cache_index=0):
    def run(hidden, visible, *layer_mems):
        for offset, (layer, mem) in enumerate(zip(layers, layer_mems)):
            hidden = layer(hidden, visible, mem=mem, cache=cache, cache_index=first_cache_index + offset)
        return hidden

    return run


class GLMModel(nn.Module):
    """GLM language model: ``forward(input_ids, position_ids, attention_mask, *mems) -> (logits, *mems)``.

    GLM's only forward: training, upstream's ``mems``, and generation with a key/value cache (the
    transformers model in ``hf.py`` delegates here) all run it.

    ``attention_mask`` is the ``sep`` form (``[b]`` or a scalar), the full form ``[b, 1, q, m + q]``, or
    ``None`` (everything visible); see ``attention.visibility_mask``.
    ``position_ids`` is ``[b, 2, s]`` (position, block position) with 2D positions, else ``[b, s]`` or ``[b, 2, s]``.
    ``logit_positions`` (boolean ``[b, s]``, or the index tuple of its ``nonzero(as_tuple=True)``) limits
    the logits to those positions, flattened: ``[n, V]``.
    """

    def __init__(self, config: GLMConfig):
        super().__init__()
        config.check_supported()
        self.config = config
        # Vocab-split over tensor-parallel ranks (one table in one process); on the first and the last
        # pipeline stages (input and tied output), on the meta device elsewhere.
        with _built_here(0, -1):
            self.word_embeddings = nn.VocabParallelEmbedding(
                config.vocab_size, config.hidden_size, layer_idx=_embedding_layer_idx(),
                init_method=_normal_(config.init_method_std),
            )
        self.transformer = GLMTransformer(config)
        # Hugging Face GLM checkpoints nest these weights under "glm."; accept them as they are.
        self.register_load_state_dict_pre_hook(strip_hf_prefix)

    def forward(self, input_ids, position_ids, attention_mask, *mems, return_memory=False, logit_positions=None,
                cache=None, stage=None, logits_to_keep=0, parallel_output=True):
        """``(logits, *new_mems)``.

        ``cache`` (a transformers ``Cache``): keys and values of the ``c`` earlier positions, extended with
        these; ``sep`` then counts them (``visibility_mask``'s ``cached_length``). A preallocated
        (compileable) cache with a 4-D mask spanning its buffer is used as it is: nothing reads the cache's
        length, a value on the device, so a compiled step needs no host synchronisation. ``mems`` and a
        cache do not combine.
        ``stage`` (a ``glm_port.distributed.PipelineStage``): run this stage's layers only; a later stage
        receives its input from the previous one, an earlier one sends its output on and returns ``None``
        as its logits. ``logits_to_keep``: only the last n positions' logits (0 = all).
        ``parallel_output`` (upstream's name): under tensor parallel, this rank's vocabulary slice of the
        logits (as training's loss takes them); off, all of the vocabulary.
        """
        if mems and cache is not None:
            raise ValueError("GLM's mems (hidden states) and a key/value cache do not combine: pass one")
        batch_size, query_length = input_ids.shape
        visible = self._visible(attention_mask, batch_size, query_length, mems, cache, input_ids.device)
        if stage is None or stage.is_first:
            hidden = self.word_embeddings(input_ids)
        else:
            dtype = next(p.dtype for p in self.parameters() if not p.is_meta)
            hidden = stage.recv_forward((batch_size, query_length, self.config.hidden_size), dtype, input_ids.device)
        hidden, new_mems = self.transformer(hidden, position_ids, visible, mems, return_memory=return_memory,
                                            cache=cache, stage=stage)
        if stage is not None and not stage.is_last:
            stage.send_forward(hidden)
            return (None, *new_mems)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        if logit_positions is not None:
            # Logits [n, V] for the n selected positions only. Training counts the loss
            # of Part B alone, so the vocabulary projection and the loss skip most of the sequence.
            hidden = hidden[logit_positions]
        hidden = self.transformer.final_layernorm(hidden)  # per position: after the selection, the same
        # Output layer tied to the input embeddings, no bias; vocab-sharded under tensor parallel.
        logits = self.word_embeddings.logits(hidden)
        table = self.word_embeddings.weight
        if not parallel_output and hasattr(table, "device_mesh"):  # this rank's vocabulary slice -> all of it
            from torch.distributed.tensor import DTensor, Shard

            logits = DTensor.from_local(logits, table.device_mesh, [Shard(logits.dim() - 1)],
                                        run_check=False).full_tensor()
        return (logits, *new_mems)

    @staticmethod
    def _visible(attention_mask, batch_size, query_length, mems, cache, device):
        if (cache is not None and getattr(cache, "is_compileable", False) and attention_mask is not None
                and attention_mask.dim() == 4):
            # The mask already spans the preallocated buffer (hf.prepare_inputs_for_generation).
            return attention_mask.bool().expand(batch_size, -1, -1, -1)
        memory_length = mems[0].size(1) if mems else 0
        cached_length = cache.get_seq_length() if cache is not None else 0
        return visibility_mask(attention_mask, batch_size, query_length, memory_length, cached_length, device=device)
