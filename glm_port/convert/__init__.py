"""Conversion commands: ``glm-convert`` (``native.py``: a family's directory <-> transformers' native
classes), ``glm-merge`` (any GLM weights -> one Hugging Face directory) and ``glm-export``
(a finetuned model, LoRA folded in, in a serving dtype, optionally with an ONNX / ``torch.export`` graph of
the decoding step). Both write through ``glm_port.convert.merge.write_model_directory``: one place where an
output directory is assembled and published atomically."""
