"""glm-merge / glm-export as a user reads them (issue 26, item 10): a tensor-parallel checkpoint whose
optimizer state holds DTensors merges without torch's DeviceMesh notice per mesh, and a --lora_path that is
not there is reported as missing, not as "not a PEFT adapter"."""

import logging

import pytest
import torch
import torch.distributed as dist

from glm_port import GLMConfig, GLMModel
from glm_port.convert import export as export_cli
from glm_port.convert import merge as merge_cli
from glm_port.data.tokenization import tiny_wordpiece
from glm_port.finetune.lora import adapter_problem
from glm_port.models.glm import weights

CONFIG = GLMConfig(vocab_size=tiny_wordpiece().vocab_size, num_layers=1, hidden_size=32, num_attention_heads=2,
                   max_sequence_length=16)
NOTICE = "unpickling of the DeviceMesh occurred before the PGs were created"


def optimizer_state_with_dtensors() -> dict:
    """What a tensor-parallel run's optimizer.state_dict() holds: DTensors, their DeviceMesh pickled with them
    (made in a one-process group, gone by the time the checkpoint is read)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    assert not dist.is_initialized()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        moment = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
        return {"state": {0: {"exp_avg": moment, "exp_avg_sq": moment * 2}}, "param_groups": []}
    finally:
        dist.destroy_process_group()


def test_tp2_merge_shows_no_device_mesh_notice(tmp_path, capsys):
    torch.manual_seed(0)
    state = GLMModel(CONFIG).state_dict()
    optimizer = optimizer_state_with_dtensors()
    root = tmp_path / "tp2"
    (root / "3").mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text("3")
    for rank in range(2):
        part = {k: weights.take_slice(k, v, 2, rank).clone() for k, v in state.items()}
        torch.save({"module": part, "iteration": 3, "glm_config": CONFIG.to_dict(), "optimizer": optimizer},
                   root / "3" / f"mp_rank_{rank:02d}_model_states.pt")
    seen = []

    class Recorder(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("torch.distributed.device_mesh")
    recorder = Recorder()
    logger.addHandler(recorder)
    try:
        torch.load(root / "3" / "mp_rank_00_model_states.pt", weights_only=True)  # torch itself does log it
        assert any(NOTICE in m for m in seen), "the fixture no longer makes torch log the notice"
        seen.clear()
        merge_cli.main([str(root), str(tmp_path / "merged")])
    finally:
        logger.removeHandler(recorder)
    assert not [m for m in seen if NOTICE in m]
    assert "2 tensor-parallel shards" in capsys.readouterr().out
    assert (tmp_path / "merged" / "model.safetensors").is_file()


def test_a_missing_lora_path_is_reported_missing(tmp_path, capsys):
    weights.save_hf(GLMModel(CONFIG).state_dict(), tmp_path / "base", {"model_type": "glm", **{
        k: v for k, v in CONFIG.to_dict().items()
        if k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_sequence_length")}})
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()  # beside --output_path: an output inside --lora_path is refused first
    cases = [(tmp_path / "absent", "does not exist"),
             (tmp_path / "file", "is a file; a PEFT adapter is a directory with adapter_config.json"),
             (tmp_path / "empty", "not a PEFT adapter (no adapter_config.json)")]
    for path, message in cases:
        assert adapter_problem(path) == message
        with pytest.raises(SystemExit) as stop:
            export_cli.main(["--model_name_or_path", str(tmp_path / "base"), "--lora_path", str(path),
                             "--output_path", str(tmp_path / "out")])
        assert stop.value.code == 2
        assert capsys.readouterr().err.strip() == f"glm-export: error: --lora_path {path}: {message}"
        assert not (tmp_path / "out").exists()
