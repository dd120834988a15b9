"""GLM-4-9B's declaration (``FAMILY``), registered by ``glm_port.models`` (docs/architecture.md, "The family
contract"). Its network is ChatGLM2's, so is its split plan (``chatglm2/splits.py``)."""

from glm_port.models import Family
from glm_port.models.chatglm2.splits import split_plan
from glm_port.models.glm4 import chat, conversation, convert, finetune, generation, tiny, weights
from glm_port.models.glm4.adapter import ADAPTER
from glm_port.models.glm4.config import GLM4Config
from glm_port.models.glm4.detect import is_glm4
from glm_port.models.glm4.model import GLM4ForCausalLM
from glm_port.models.glm4.tokenizer import GLM4Tokenizer

FAMILY = Family(
    name="glm4",
    config_class=GLM4Config,
    model_class=GLM4ForCausalLM,
    model_types=("chatglm", "glm"),  # THUDM's directories, transformers' native GlmForCausalLM ones
    tokenizer_class=GLM4Tokenizer,
    chat_formats=conversation.CHAT_FORMATS,
    split_plan=split_plan,
    adapter=ADAPTER,
    detect=is_glm4,  # claims its directories before model_type is read (ChatGLM2's and GLM-10b's are shared)
    supports=frozenset({"tensor_parallel", "static_cache", "quantize", "lora", "recompute", "merge", "export",
                        "prefix_tuning"}),
    quantize_keep=("*output_layer", "*prefix_encoder.*"),
    generation=generation,
    finetune=finetune,
    chat=chat,
    conversation=conversation,
    tiny=tiny,
    weights=weights,
    convert=convert,
)

__all__ = ["FAMILY"]
