"""ChatGLM2 / ChatGLM3's declaration (``FAMILY``), registered by ``glm_port.models`` (docs/architecture.md, "The
family contract")."""

from glm_port.models import Family
from glm_port.models.chatglm2 import chat, conversation, convert, finetune, generation, tiny, weights
from glm_port.models.chatglm2.adapter import ADAPTER
from glm_port.models.chatglm2.config import ChatGLM2Config
from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM
from glm_port.models.chatglm2.splits import split_plan
from glm_port.models.chatglm2.tokenizer import CHAT_FORMATS, ChatGLM2Tokenizer

FAMILY = Family(
    name="chatglm2",
    config_class=ChatGLM2Config,
    model_class=ChatGLM2ForCausalLM,
    model_types=("chatglm",),
    tokenizer_class=ChatGLM2Tokenizer,
    chat_formats=CHAT_FORMATS,
    split_plan=split_plan,
    adapter=ADAPTER,
    supports=frozenset({"tensor_parallel", "static_cache", "recompute", "lora", "export", "merge", "quantize",
                        "prefix_tuning"}),
    quantize_keep=("*output_layer", "*prefix_encoder.*"),  # THUDM keeps both in float
    generation=generation,
    finetune=finetune,
    chat=chat,
    conversation=conversation,
    tiny=tiny,
    weights=weights,
    convert=convert,
)

__all__ = ["FAMILY"]
