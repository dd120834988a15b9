"""The tiny GLM-4 tokenizer for the family's tests (its rank file trained here; no downloads), and the tiny GLM-4
written as a THUDM directory with wide weights for the P-Tuning tests (``base``; test_finetune.py has its own)."""

import pytest

from glm_port.models.glm4.tiny import build_rank_file


@pytest.fixture(scope="session")
def rank_file(tmp_path_factory):
    return build_rank_file(str(tmp_path_factory.mktemp("glm4-tiny")))


@pytest.fixture()
def tok(rank_file):
    from glm_port.models.glm4 import GLM4Tokenizer

    return GLM4Tokenizer(rank_file)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The tiny GLM-4 as a THUDM directory, its weights drawn wide (std 0.3) so that a prefix moves its logits."""
    import torch

    from glm_port.models.glm4.tiny import build_tiny, write_directory

    root = tmp_path_factory.mktemp("glm4-wide-base")
    (root / "tok").mkdir()
    model, tokenizer = build_tiny(str(root / "tok"))
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return write_directory(model, tokenizer, root / "base")
