"""GLM's declaration (``FAMILY``), registered by ``glm_port.models`` (docs/architecture.md, "The family contract")."""

from glm_port.models import FEATURES, Family
from glm_port.models.glm import finetune, generation, hf_directory
from glm_port.models.glm.adapter import ADAPTER
from glm_port.models.glm.config import GLMConfig
from glm_port.models.glm.model import GLMModel
from glm_port.models.glm.splits import split_plan
from glm_port.models.glm.tokenizer import GLMTokenizer

FAMILY = Family(
    name="glm",
    config_class=GLMConfig,
    model_class=GLMModel,
    model_types=("glm",),
    tokenizer_class=GLMTokenizer,
    split_plan=split_plan,
    adapter=ADAPTER,
    # GLM's output is the tied embedding table: no linear to keep in float (quantize_keep)
    supports=frozenset(FEATURES) - {"prefix_tuning"},
    generation=generation,
    finetune=finetune,
    hf=hf_directory,
)

__all__ = ["FAMILY"]
