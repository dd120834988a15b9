"""GLM under tensor parallel 2 with attention dropout: each rank's heads draw their dropout masks from
that rank's stream of the model-parallel RNG tracker (Megatron's ``get_cuda_rng_tracker().fork()``),
never from the default generator, which every rank shares."""

import pytest
import torch
import torch.distributed as dist

import shim.distributed as sdist
from glm_port import GLMConfig, GLMModel
from shim.checkpointing import MODEL_PARALLEL_RNG, get_cuda_rng_tracker, model_parallel_cuda_manual_seed

CONFIG = GLMConfig(vocab_size=64, num_layers=2, hidden_size=32, num_attention_heads=4, max_sequence_length=16,
                   embedding_dropout_prob=0.0, attention_dropout_prob=0.5, output_dropout_prob=0.0)
SEED = 1234
MEGATRON_OFFSET = 2718  # Megatron's model_parallel_cuda_manual_seed: the stream's seed is seed + 2718 + tp rank


def _inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (2, 8), generator=g)
    positions = torch.stack([torch.arange(8).expand(2, 8), torch.randint(0, 4, (2, 8), generator=g)], dim=1)
    return ids, positions, torch.tensor([3, 5])


def check_attention_dropout_draws_from_the_per_rank_stream():
    sdist.setup_dist_util(tensor_parallel_size=2)
    tracker = get_cuda_rng_tracker()
    try:
        torch.manual_seed(0)
        model = GLMModel(CONFIG).train()
        model_parallel_cuda_manual_seed(SEED)
        start = tracker.get_states()
        # the stream is this rank's own generator, seeded as Megatron seeds it
        expected = torch.Generator().manual_seed(SEED + MEGATRON_OFFSET + dist.get_rank()).get_state()
        assert torch.equal(start[MODEL_PARALLEL_RNG], expected)
        ranks_streams = [None, None]
        dist.all_gather_object(ranks_streams, start[MODEL_PARALLEL_RNG])
        assert not torch.equal(*ranks_streams)

        default = torch.get_rng_state()
        with torch.no_grad():
            logits = model(*_inputs())[0]
            assert torch.equal(torch.get_rng_state(), default), "attention dropout drew from the default generator"
            assert not torch.equal(tracker.get_states()[MODEL_PARALLEL_RNG], start[MODEL_PARALLEL_RNG])
            # The masks are the stream's: its state again gives the same logits, whatever the default generator.
            torch.manual_seed(99)
            tracker.set_states(start)
            assert torch.equal(model(*_inputs())[0], logits)
            # Another state of the stream, other masks: dropout is on and the stream drives it.
            tracker.set_states({MODEL_PARALLEL_RNG: torch.Generator().manual_seed(5).get_state()})
            assert not torch.allclose(model(*_inputs())[0], logits)
            assert not torch.allclose(model.eval()(*_inputs())[0], logits)
    finally:
        tracker.reset()
        sdist.reset_dist_util()


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def two_ranks(launch):
    return launch(CHECKS)


@pytest.mark.parametrize("name", list(CHECKS))
def test_on_two_ranks(two_ranks, name):
    two_ranks.assert_passed(name)
