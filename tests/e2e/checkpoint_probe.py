"""Run inside a migrated THUDM/GLM tree: checkpoints cross between its GLMModel and glm_port's.

    python checkpoint_probe.py PORTED_TREE UPSTREAM_CHECKPOINT_FILE SCRATCH_DIR

1. the upstream checkpoint (saved by the migrated pretrain_glm.py) loads into glm_port's
   GLMModel through glm_port.checkpoint_io.load_checkpoint; both models give the same logits;
2. a checkpoint glm_port.checkpoint_io.save_checkpoint writes loads into the migrated tree's
   GLMModel through the tree's own utils.load_checkpoint; both give the same logits.
Prints one line per direction with the largest logit difference; exits non-zero on a mismatch.
A separate process because the tree's top-level modules (``mpu``, ``model``, ``utils``) would
collide with other trees' in the test process.
"""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import torch

import shim.distributed as dist
from glm_port.checkpoint_io import load_checkpoint as port_load
from glm_port.checkpoint_io import save_checkpoint as port_save
from glm_port.models.glm.config import GLMConfig
from glm_port.models.glm.model import GLMModel as PortGLM

TOLERANCE = 1e-5
# The tiny pretrain flags: 2 layers, hidden 64, 4 heads, seq 128, BERT vocab padded to 30592.
CONFIG = GLMConfig(vocab_size=30592, num_layers=2, hidden_size=64, num_attention_heads=4, max_sequence_length=128,
                   embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)  # fmt: skip


def upstream_model():
    from model.modeling_glm import GLMModel  # the migrated tree's

    c = CONFIG
    return GLMModel(num_layers=c.num_layers, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                    num_attention_heads=c.num_attention_heads, embedding_dropout_prob=0.0,
                    attention_dropout_prob=0.0, output_dropout_prob=0.0, max_sequence_length=c.max_sequence_length,
                    max_memory_length=0, checkpoint_activations=False, block_position_encoding=True).eval()  # fmt: skip


def sample(batch: int = 2, seq: int = 32):
    """Token ids, 2D positions and a ``sep`` mask of GLM's blank-infilling shape."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 30522, (batch, seq), generator=g)
    sep = torch.tensor([20, 24])
    positions = torch.arange(seq).repeat(batch, 1)
    blocks = torch.zeros(batch, seq, dtype=torch.long)
    for b, s in enumerate(sep.tolist()):
        positions[b, s:] = s - 1  # Part B takes its mask's position...
        blocks[b, s:] = torch.arange(1, seq - s + 1)  # ...and block positions 1..n
    return ids, torch.stack([positions, blocks], dim=1), sep


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(*inputs)[0].float()


def compare(name: str, a: torch.Tensor, b: torch.Tensor) -> bool:
    diff = (a - b).abs().max().item()
    ok = a.shape == b.shape and diff <= TOLERANCE * max(1.0, a.abs().max().item())
    print(f"{'PASS' if ok else 'FAIL'} {name}: logits {list(a.shape)}, max |difference| {diff:.2e}")
    return ok


def main(tree: Path, upstream_checkpoint: Path, scratch: Path) -> int:
    sys.path.insert(0, str(tree))
    import mpu
    from utils import load_checkpoint as upstream_load

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    mpu.initialize_model_parallel(1)
    mpu.model_parallel_cuda_manual_seed(1234)  # attention dropout (0 here) forks the tracker's stream
    inputs = sample()

    # Upstream -> glm_port.
    theirs = upstream_model()
    theirs.load_state_dict(torch.load(upstream_checkpoint, map_location="cpu", weights_only=False)["module"])
    ours = PortGLM(CONFIG).eval()
    port_load(upstream_checkpoint, ours)
    ok = compare("upstream checkpoint in glm_port", logits(theirs, inputs), logits(ours, inputs))

    # glm_port -> upstream, through the tree's own loader (which loads with strict=False: check the keys too).
    torch.manual_seed(1)
    ours = PortGLM(CONFIG).eval()
    saved = scratch / "glm_port_checkpoint"
    port_save(saved, 3, ours.state_dict(), config=CONFIG)
    theirs = upstream_model()
    assert set(theirs.state_dict()) == set(ours.state_dict()), "the two models name their weights differently"
    args = Namespace(load=str(saved), deepspeed=False, finetune=True, no_load_optim=True, no_load_rng=True,
                     no_load_lr_scheduler=True)  # fmt: skip
    upstream_load(theirs, None, None, args)
    ok &= compare("glm_port checkpoint in upstream", logits(ours, inputs), logits(theirs, inputs))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*map(Path, sys.argv[1:4])))
