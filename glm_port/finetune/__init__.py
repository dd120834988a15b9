"""Finetuning for generation, shared by every model family: data layouts, LoRA, evaluation, ``glm-finetune``."""
