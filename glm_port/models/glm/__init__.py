"""The GLM family: the model for inference (``hf``), its tokenizer and weight loading."""
