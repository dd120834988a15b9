"""Conversion commands: ``glm-convert`` (``native.py``: a family's directory <-> transformers' native
classes), ``glm-merge`` (any GLM weights -> one Hugging Face directory) and ``glm-export``
(a finetuned model, LoRA folded in, in a serving dtype, optionally with an ONNX / ``torch.export`` graph of
the decoding step). A family is reached through its bindings only (``glm_port.models.contract``): GLM's ``hf``
binding, its directory assembled and published atomically in one place
(``glm_port.convert.merge.write_model_directory``); a family kept in its own layout (ChatGLM2) through its
``convert`` binding's writers."""
