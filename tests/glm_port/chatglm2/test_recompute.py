"""ChatGLM2 activation checkpointing (glm-finetune --recompute): each GLMBlock's activations dropped in forward
and recomputed in backward, through transformers' checkpointing API; the numbers are those without it."""

import copy
import re

import pytest
import torch

from glm_port.models.chatglm2 import ChatGLM2ForCausalLM


def _enable(model):
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    return model


def _loss_and_grads(model, ids, mask, seed=0):
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _batch():
    ids = torch.tensor([[5, 17, 42, 99, 7, 30, 11, 64, 3, 8], [90, 92, 8, 9, 10, 11, 12, 13, 0, 0]])
    mask = torch.tensor([[1] * 10, [1] * 8 + [0] * 2])
    return ids, mask


@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["no-dropout", "dropout"])
def test_recompute_gives_the_loss_and_gradients_of_the_plain_forward(make_model, dropout):
    """Dropout off: equal. Dropout on (one seed): the recompute draws the forward's masks again, so equal too."""
    plain = make_model(std=0.1, hidden_dropout=dropout, attention_dropout=dropout)
    checkpointed = _enable(copy.deepcopy(plain))
    assert checkpointed.transformer.encoder.gradient_checkpointing
    ids, mask = _batch()
    loss, grads = _loss_and_grads(plain, ids, mask)
    # Each block really runs twice under checkpointing: once in forward, once more in backward.
    calls = []
    checkpointed.transformer.encoder.layers[0].mlp.register_forward_pre_hook(lambda *a: calls.append(1))
    loss_r, grads_r = _loss_and_grads(checkpointed, ids, mask)
    assert len(calls) == 2
    torch.testing.assert_close(loss_r, loss, rtol=0, atol=0)
    assert grads_r.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grads_r[name], grad, rtol=1e-6, atol=1e-7, msg=name)


def test_recompute_keeps_fewer_activations_for_backward(make_model):
    """The tensors autograd keeps for backward (counted by saved-tensor hooks) shrink to each block's input."""
    def saved_bytes(model):
        model.train()
        total = []

        def pack(tensor):
            total.append(tensor.numel() * tensor.element_size())
            return tensor

        ids, mask = _batch()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        return sum(total)

    plain = make_model(std=0.1, num_layers=4)
    checkpointed = _enable(copy.deepcopy(plain))
    assert saved_bytes(checkpointed) < 0.6 * saved_bytes(plain)


def test_a_cache_is_not_written_twice_under_recompute(make_model):
    """A training forward asked for a cache under checkpointing runs without one (a layer runs twice)."""
    model = _enable(make_model(std=0.1))
    ids, mask = _batch()
    model.train()
    out = model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=True)
    out.loss.backward()
    assert out.past_key_values is None


def test_glm_finetune_recompute_on_chatglm2_logs_the_losses_without_it(tmp_path, capsys):
    """glm-finetune --recompute used to be refused for ChatGLM2 ('does not support activation checkpointing')."""
    from glm_port.finetune.run import main

    loss = re.compile(r"^ iteration +(\d+)/ +\d+ \| .* \| lm loss (\S+) \|$", re.MULTILINE)
    runs = []
    for flags in ([], ["--recompute"]):
        main(["--model_name_or_path", "chatglm2-tiny", "--max_steps", "3", "--logging_steps", "1", "--do_eval",
              "false", "--learning_rate", "1e-2", "--output_dir", str(tmp_path / ("r" if flags else "p")), *flags])
        runs.append({int(m[1]): float(m[2]) for m in loss.finditer(capsys.readouterr().out)})
    assert sorted(runs[0]) == [1, 2, 3]
    assert runs[1] == pytest.approx(runs[0], rel=1e-5)
    assert ChatGLM2ForCausalLM.supports_gradient_checkpointing
