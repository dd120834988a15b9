"""ChatGLM2's state-dict adapters (``weights_io.Adapter``): THUDM's names, which are the model's, and transformers'
native ``glm`` layout (``GlmForCausalLM``: GLM-4's ``-hf`` releases, what ``glm-convert`` writes), both ways.

THUDM's checkpoints store the model's own state-dict names, plus a constant rotary buffer (``IGNORED_KEYS``) the
model computes itself: ``ADAPTER``. The transformers layout renames every tensor (``TOP``, ``PLAIN``) and stores
the fused ``query_key_value`` as ``q_proj``, ``k_proj``, ``v_proj``: ``to_glm_plan`` (ours to transformers') and
``from_glm_plan`` (transformers' to ours) give ``[(name, function reading the tensor)]`` over a source of tensors
by name (``weights_io.Tensors``, or any mapping). GLM-4 uses both (its ``weights`` module).
"""

from __future__ import annotations

import re

import torch

from glm_port.models import WeightsError
from glm_port.models.chatglm2.config import ChatGLM2Config
from glm_port.models.weights_io import Adapter

IGNORED_KEYS = ("rotary_pos_emb.inv_freq",)  # THUDM's files carry this constant buffer


def model_name(name: str) -> str | None:
    """The model's name for a THUDM checkpoint name (None: a constant buffer the model computes)."""
    return None if name.endswith(IGNORED_KEYS) else name


ADAPTER = Adapter(to_model=model_name, to_checkpoint=lambda name: name)

LAYER = re.compile(r"^transformer\.encoder\.layers\.(\d+)\.(.+)$")
GLM_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")  # transformers' layer names
PLAIN = {  # per-layer names that only change their prefix
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.dense.weight": "self_attn.o_proj.weight",
    "mlp.dense_h_to_4h.weight": "mlp.gate_up_proj.weight",
    "mlp.dense_4h_to_h.weight": "mlp.down_proj.weight",
}
TOP = {
    "transformer.embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "transformer.encoder.final_layernorm.weight": "model.norm.weight",
    "transformer.output_layer.weight": "lm_head.weight",
}


def split_qkv(config: ChatGLM2Config, qkv: torch.Tensor):
    """Q, K, V rows of a fused ``query_key_value`` weight or bias."""
    d, heads, groups = config.kv_channels, config.num_attention_heads, config.num_key_value_heads
    if config.multi_query_attention:
        return qkv.split([heads * d, groups * d, groups * d], dim=0)
    per_head = qkv.unflatten(0, (heads, 3, d))  # THUDM's layout without multi-query: [q_h; k_h; v_h] per head
    return tuple(per_head[:, i].flatten(0, 1) for i in range(3))


def _plan(source, top: dict, layer: re.Pattern, target: str, plain: dict, attention, what: str, skip=()):
    """``[(name in the other layout, function giving the tensor)]`` over ``source``'s names, in their order: ``top``
    renamed, a layer's (``layer`` matches ``(number, rest)``) ``plain`` names put under ``target`` (the other
    layout's layer prefix, ``{}`` the number), every other per-layer name as ``attention(name, rest, prefix)``
    gives it (a list of entries; None: not a weight of the layout); names ending in ``skip`` left out; a name
    of neither kind is one line naming it (``what``: the layout's name)."""
    plan = []
    for name in source.keys():
        if name in top:
            plan.append((top[name], lambda name=name: source[name]))
            continue
        match = layer.match(name)
        entries = None
        if match is not None:
            number, rest = match.groups()
            prefix = target.format(number)
            if rest in plain:
                entries = [(prefix + plain[rest], lambda name=name: source[name])]
            else:
                entries = attention(name, rest, prefix)
        elif skip and name.endswith(skip):
            continue
        if entries is None:
            raise WeightsError(f"{source.directory}: weight {name} is not a {what} weight")
        plan += entries
    return plan


def to_glm_plan(config: ChatGLM2Config, source):
    """``[(transformers name, function giving the tensor)]`` in model order."""
    def split(name, rest, prefix):
        if not rest.startswith("self_attention.query_key_value."):
            return None
        kind = rest.rsplit(".", 1)[1]
        return [(f"{prefix}self_attn.{proj}.{kind}", lambda i=i: split_qkv(config, source[name])[i])
                for i, proj in enumerate(("q_proj", "k_proj", "v_proj"))]

    return _plan(source, TOP, LAYER, "model.layers.{}.", PLAIN, split, "ChatGLM2", skip=IGNORED_KEYS)


def from_glm_plan(config: ChatGLM2Config, source):
    """``[(THUDM name, function giving the tensor)]`` of a transformers ``glm`` layout (``q|k|v_proj`` joined,
    a tied output layer untied)."""
    def join(name, rest, prefix):
        if rest.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
            return []  # joined with q_proj
        if not rest.startswith("self_attn.q_proj."):
            return None
        kind = rest.rsplit(".", 1)[1]
        parts = [f"{name.rsplit('.', 2)[0]}.{p}.{kind}" for p in ("q_proj", "k_proj", "v_proj")]
        return [(f"{prefix}self_attention.query_key_value.{kind}",
                 lambda: torch.cat([source[p] for p in parts], dim=0))]

    inverse_top = {v: k for k, v in TOP.items()}
    inverse_plain = {v: k for k, v in PLAIN.items()}
    plan = _plan(source, inverse_top, GLM_LAYER, "transformer.encoder.layers.{}.", inverse_plain, join,
                 "transformers GLM")
    if "transformer.output_layer.weight" not in {target for target, _ in plan}:  # tied GLM: untie
        plan.append(("transformer.output_layer.weight", lambda: source["model.embed_tokens.weight"]))
    return plan


__all__ = ["ADAPTER", "GLM_LAYER", "IGNORED_KEYS", "LAYER", "PLAIN", "TOP", "from_glm_plan", "model_name", "split_qkv",
           "to_glm_plan"]
