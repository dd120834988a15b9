"""A call the codemod cannot rewrite is reported at its line with its rule; the rest of the file is
still migrated (never a file-level error), and the site keeps every name it reads."""

from __future__ import annotations

import migrate.codemod.calls as calls  # where the call planner looks up rewrite_call


def test_unrewritable_call_is_a_site_not_a_file_error(migrate, monkeypatch):
    source = (
        "import torch\n"
        "from mpu import vocab_parallel_cross_entropy\n"
        "\n"
        "\n"
        "def loss(logits, labels, model):\n"
        "    model.cuda()\n"
        "    return vocab_parallel_cross_entropy(logits.contiguous().float(), labels)\n"
    )
    real = calls.rewrite_call

    def refuse_cross_entropy(text, *args, **kwargs):
        if text.startswith("vocab_parallel_cross_entropy"):
            raise ValueError("refused for the test")
        return real(text, *args, **kwargs)

    monkeypatch.setattr(calls, "rewrite_call", refuse_cross_entropy)
    migrated, report = migrate(source, "losses.py")
    assert report.error is None
    assert [(u["line"], u["code"]) for u in report.unconverted] == [(7, "MPU001")]
    assert "cannot rewrite `vocab_parallel_cross_entropy(" in report.unconverted[0]["reason"]
    assert "import shim as torch" in migrated and "model.to(torch.device())" in migrated  # the rest converted
    assert "from mpu import vocab_parallel_cross_entropy" in migrated  # the site still reaches its name
    assert "vocab_parallel_cross_entropy(logits.contiguous().float(), labels)" in migrated


def test_method_on_a_receiver_spanning_lines(migrate):
    source = "import torch\n\n\ndef build(make):\n    return (\n        make()\n        .cuda()\n    )\n"
    migrated, report = migrate(source, "build.py")
    assert report.error is None and report.unconverted == []
    assert "        make()\n        .to(torch.device())\n" in migrated


def test_import_module_literals_map_like_imports(migrate):
    source = 'import importlib\n\nkernel = importlib.import_module("amp_C")\nother = importlib.import_module("json")\n'
    migrated, report = migrate(source, "load.py")
    assert 'importlib.import_module("shim.kernels.amp_C")' in migrated
    assert 'importlib.import_module("json")' in migrated
    assert [(c["line"], c["code"]) for c in report.changes] == [(3, "APX011")]


def test_tree_call_rule_scoped_to_its_module(migrate):
    """MEG006 (scope = module) rewrites calls elsewhere in the defining package, not in the module itself."""
    call = "from megatron.initialize import initialize_megatron\n\ninitialize_megatron()\n"
    inside, _ = migrate(call, "megatron/training.py")
    assert "initialize_megatron(allow_no_cuda=True)" in inside
    own = "def initialize_megatron(allow_no_cuda=False):\n    pass\n\n\ninitialize_megatron()\n"
    same, report = migrate(own, "megatron/initialize.py")
    assert same == own and report.changes == []
