"""The tiny GLM-4 tokenizer for the family's tests (its rank file trained here; no downloads)."""

import pytest

from glm_port.models.glm4.tiny import build_rank_file


@pytest.fixture(scope="session")
def rank_file(tmp_path_factory):
    return build_rank_file(str(tmp_path_factory.mktemp("glm4-tiny")))


@pytest.fixture()
def tok(rank_file):
    from glm_port.models.glm4 import GLM4Tokenizer

    return GLM4Tokenizer(rank_file)
