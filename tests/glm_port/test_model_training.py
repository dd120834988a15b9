"""Training pieces: upstream's lr schedule, parameter groups, the masked loss, one step, precision."""

import math

import pytest
import torch

from glm_port import GLMConfig, GLMModel
from glm_port.training import weight_decay_param_groups
from glm_port.training import OptimizerSettings, Precision, annealing_lr, build_optimizer, lm_loss, train_step

TINY = GLMConfig(vocab_size=64, num_layers=2, hidden_size=32, num_attention_heads=4, max_sequence_length=16,
                 embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)


def synthetic_batch(batch=4, seq=12, vocab=64, seed=0):
    """A batch in glm_port.data's shapes: Part A up to sep, loss on Part B only."""
    g = torch.Generator().manual_seed(seed)
    sep = torch.randint(3, seq - 2, (batch,), generator=g)
    columns = torch.arange(seq).expand(batch, seq)
    return {
        "text": torch.randint(0, vocab, (batch, seq), generator=g),
        "target": torch.randint(0, vocab, (batch, seq), generator=g),
        "loss_mask": (columns >= sep[:, None]).float(),
        "attention_mask": sep,
        "position_id": torch.stack([columns, (columns - sep[:, None] + 1).clamp(min=0)], dim=1),
    }


def upstream_annealing_lr(step, start_lr, warmup_iter, end_iter, style, decay_ratio):
    """AnnealingLR.get_lr as upstream writes it (ratio inverted, cosine/linear spelled out)."""
    ratio = 1 / decay_ratio
    if warmup_iter > 0 and step <= warmup_iter:
        return start_lr * step / warmup_iter
    if style == "linear":
        return start_lr - start_lr * (1 - 1 / ratio) * (step - warmup_iter) / end_iter
    if style == "cosine":
        r = min(1.0, (step - warmup_iter) / end_iter)
        return start_lr / ratio * ((math.cos(math.pi * r) + 1) * (ratio - 1) / 2 + 1)
    return start_lr


@pytest.mark.parametrize("style", ["linear", "cosine", "constant"])
def test_lr_schedule_is_upstreams(style):
    decay_iters, warmup = 100, 0.1
    multiplier = annealing_lr(warmup * decay_iters, decay_iters, style, 0.1)
    for step in (0, 3, 10, 11, 55, 99, 100):
        expected = upstream_annealing_lr(step, 1.0, warmup * decay_iters, decay_iters - warmup * decay_iters,
                                         style, 0.1)
        assert multiplier(step) == pytest.approx(expected), step


def test_lr_schedule_hand_worked_points():
    cosine = annealing_lr(10, 100, "cosine", 0.1)
    assert (cosine(5), cosine(10), cosine(55), cosine(100), cosine(500)) == pytest.approx((0.5, 1, 0.55, 0.1, 0.1))
    exponential = annealing_lr(0, 100, "exponential", 0.01)
    assert (exponential(0), exponential(50), exponential(100)) == pytest.approx((1, 0.1, 0.01))
    with pytest.raises(ValueError, match="unknown lr decay style 'square'"):
        annealing_lr(0, 10, "square", 0.1)


def test_scheduler_steps_like_upstream():
    model = GLMModel(TINY)
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=2.0, warmup=0.5, decay_iters=4))
    lrs = [optimizer.param_groups[0]["lr"]]
    for _ in range(4):
        optimizer.step()
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.0, 1.0, 2.0, 1.1, 0.2])  # warmup 2 iters, then linear to 0.1 * lr


def test_no_weight_decay_on_biases_and_layernorm():
    model = GLMModel(TINY)
    decay, no_decay = weight_decay_param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = sorted(names[id(p)] for p in decay["params"])
    assert all(n.endswith(".weight") and "layernorm" not in n for n in decayed)
    assert "word_embeddings.weight" in decayed
    assert {names[id(p)] for p in no_decay["params"]} == {
        n for n in names.values() if n.endswith(".bias") or "layernorm" in n
    }
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)


def test_optimizer_is_adamw_math():
    model = GLMModel(TINY)
    optimizer, _ = build_optimizer(model, OptimizerSettings(lr=0.1, weight_decay=0.5, warmup=0.0))
    assert isinstance(optimizer, torch.optim.AdamW)
    weight = model.word_embeddings.weight
    before = weight.detach().clone()
    weight.grad = torch.zeros_like(weight)
    optimizer.step()  # zero gradient: only the decoupled decay moves the weight
    torch.testing.assert_close(weight.detach(), before * (1 - 0.1 * 0.5))


def test_loss_is_sum_over_mask_sum():
    torch.manual_seed(0)
    model = GLMModel(TINY)
    batch = synthetic_batch()
    _, value = lm_loss(model, batch)
    logits, = model(batch["text"], batch["position_id"], batch["attention_mask"])
    per_token = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["target"].flatten(), reduction="none")
    mask = batch["loss_mask"].flatten()
    assert value.item() == pytest.approx((per_token * mask).sum().item() / mask.sum().item(), rel=1e-5)


def test_train_step_lowers_the_loss_and_is_deterministic():
    def run():
        torch.manual_seed(0)
        model = GLMModel(TINY)
        optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=1e-2, warmup=0.0, decay_iters=20))
        batch = synthetic_batch()
        return [train_step(model, [batch], optimizer, scheduler, Precision(torch.device("cpu"))) for _ in range(15)]

    losses = run()
    assert losses[-1] < 0.5 * losses[0]
    assert run() == losses


def test_accumulation_averages_the_micro_batch_losses():
    """As upstream: each micro-batch loss is divided by the number of accumulation steps."""
    torch.manual_seed(0)
    model = GLMModel(TINY)
    batch = synthetic_batch(batch=4)
    halves = [{k: v[i::2] for k, v in batch.items()} for i in range(2)]
    expected_grads = [torch.zeros_like(p) for p in model.parameters()]
    expected_loss = 0.0
    for half in halves:
        model.zero_grad()
        loss, value = lm_loss(model, half)
        loss.backward()
        expected_loss += value.item() / 2
        for total, p in zip(expected_grads, model.parameters()):
            total += p.grad / 2
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=0.0, weight_decay=0.0, warmup=0.0))
    loss = train_step(model, halves, optimizer, scheduler, Precision(torch.device("cpu")), clip_grad=0.0)
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    for expected, p in zip(expected_grads, model.parameters()):
        torch.testing.assert_close(p.grad, expected)


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1])  # SDPA, and on CPU shim's blocked kernel
def test_bf16_autocast_trains(attention_dropout):
    torch.manual_seed(0)
    model = GLMModel(TINY.replace(attention_dropout_prob=attention_dropout))
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=1e-2, warmup=0.0, decay_iters=10))
    precision = Precision(torch.device("cpu"), torch.bfloat16)
    losses = [train_step(model, [synthetic_batch()], optimizer, scheduler, precision) for _ in range(6)]
    assert model.word_embeddings.weight.dtype == torch.float32  # master weights stay fp32
    assert losses[-1] < losses[0]
    assert precision.loss_scale is None


def test_fp16_loss_scaling_dynamic_and_static():
    torch.manual_seed(0)
    model = GLMModel(TINY)
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=1e-2, warmup=0.0, decay_iters=10))
    dynamic = Precision(torch.device("cpu"), torch.float16)
    assert dynamic.loss_scale == 2.0**32
    train_step(model, [synthetic_batch()], optimizer, scheduler, dynamic)
    assert dynamic.loss_scale < 2.0**32  # 2**32 overflows fp16 gradients: the step is skipped, the scale halves
    assert optimizer.param_groups[0]["lr"] == 1e-2 and scheduler.last_epoch == 0  # skipped: lr untouched
    static = Precision(torch.device("cpu"), torch.float16, loss_scale=128.0)
    for _ in range(2):
        train_step(model, [synthetic_batch()], optimizer, scheduler, static)
    assert static.loss_scale == 128.0 and scheduler.last_epoch == 2


def test_compiled_layers_train_as_eager():
    """``compile_layers`` (glm-pretrain --compile) through dynamo's graph capture; the backend here runs
    the captured graphs as they are, without inductor's code generation, which would take a minute."""
    graphs = []

    def run_captured(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    def run(compiled):
        torch.manual_seed(0)
        model = GLMModel(TINY.replace(attention_dropout_prob=0.1, output_dropout_prob=0.1))
        if compiled:
            model.transformer.compile_layers(backend=run_captured)
        optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=1e-2, warmup=0.0, decay_iters=10))
        return [train_step(model, [synthetic_batch()], optimizer, scheduler, Precision(torch.device("cpu")))
                for _ in range(3)]

    torch._dynamo.reset()
    try:
        assert run(compiled=True) == pytest.approx(run(compiled=False), rel=1e-6)
    finally:
        torch._dynamo.reset()
    assert graphs, "the layers were not captured"


def test_the_tensor_loss_is_the_float_loss_exactly():
    """``as_tensor`` (what TrainingLoop takes, no host sync a step) sums in float64 as the float path does."""
    results = []
    for as_tensor in (False, True):
        torch.manual_seed(0)
        model = GLMModel(TINY)
        optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=1e-2, warmup=0.0, decay_iters=10))
        halves = [synthetic_batch(batch=2, seed=s) for s in (3, 4, 5)]  # three micro-batches: a real sum
        results.append([train_step(model, halves, optimizer, scheduler, Precision(torch.device("cpu")),
                                   as_tensor=as_tensor) for _ in range(3)])
    floats, tensors = results
    assert all(isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.dim() == 0 for t in tensors)
    assert [t.item() for t in tensors] == floats


def test_the_loop_reads_the_loss_from_the_device_once_a_log_line(monkeypatch, capsys):
    """Off a terminal, TrainingLoop adds the step losses where they are and reads them at each log line only: a
    GPU step then never waits for its loss."""
    from glm_port import training
    from glm_port.distributed import ParallelEnv

    class Unread:  # a loss the loop has not read yet: counts the reads
        reads = 0

        def __init__(self, value):
            self.value = value

        def __add__(self, other):
            return Unread(self.value + (other.value if isinstance(other, Unread) else other))

        __radd__ = __add__

        def __float__(self):
            Unread.reads += 1
            return float(self.value)

    steps = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    monkeypatch.setattr(training, "train_step", lambda *args, **kwargs: Unread(next(steps)))
    model = GLMModel(TINY)
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=1e-2, warmup=0.0, decay_iters=10))
    loop = training.TrainingLoop(model, optimizer, scheduler, Precision(torch.device("cpu")),
                                 ParallelEnv(torch.device("cpu")), total_iters=6, log_interval=3)
    assert loop.run(iter(lambda: synthetic_batch(), None), 0) == 6
    assert Unread.reads == 2  # two log lines, nothing between them
    losses = [float(line.split("lm loss ")[1].split(" |")[0]) for line in capsys.readouterr().out.splitlines()
              if "lm loss" in line]
    assert losses == [2.0, 5.0]
