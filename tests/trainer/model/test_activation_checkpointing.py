"""Activation checkpointing (trainer.activation_checkpointing): each MoT layer is recomputed in backward, and the
gradients are those of the plain run.

Tolerance: atol = rtol = 1e-6 on fp32 gradients and losses. The recompute runs the same ops on the same shapes, so
they are expected bitwise equal; the tolerance only allows for a kernel that is not run-to-run deterministic.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adapter_trainer.model.mot import MoTAdapterModel
from tests.trainer.model.test_mot_attention import VARIANTS, make, make_batch

TOL = {"rtol": 1e-6, "atol": 1e-6}
pytestmark = pytest.mark.usefixtures("one_thread")


def layer_calls(mot: MoTAdapterModel) -> list[int]:
    """A counter of MoTLayer calls: a pre-hook, as the recompute stops early once it has what backward needs."""
    n = [0]
    for layer in mot.layers:
        layer.register_forward_pre_hook(lambda *_: n.__setitem__(0, n[0] + 1))
    return n


def loss_and_grads(mot: MoTAdapterModel, batch, seed: int) -> tuple[float, dict[str, torch.Tensor]]:
    mot.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the attention dropout's masks
    loss = mot.compute_loss(batch).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in mot.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_checkpointed_gradients_equal_the_plain_run(model_dirs: dict[str, Path], variant: str) -> None:
    mot = make(model_dirs, variant, "delay").train()
    for layer in mot.layers:  # dropout inside every layer: the recompute must redraw the same masks
        layer.llm_layer.self_attn.attention_dropout = 0.1
    batch = make_batch("delay")
    calls = layer_calls(mot)
    n_layers = len(mot.layers)

    loss_plain, g_plain = loss_and_grads(mot, batch, seed=3)
    assert calls[0] == n_layers
    mot.activation_checkpointing = True
    calls[0] = 0
    loss_ckpt, g_ckpt = loss_and_grads(mot, batch, seed=3)
    assert calls[0] == 2 * n_layers  # every layer ran again in backward
    _, g_other_seed = loss_and_grads(mot, batch, seed=4)

    assert loss_ckpt == pytest.approx(loss_plain, **{"rel": 1e-6, "abs": 1e-6})
    assert g_ckpt.keys() == g_plain.keys() and all(g.abs().sum() > 0 for g in g_plain.values())
    for name in g_plain:
        torch.testing.assert_close(g_ckpt[name], g_plain[name], **TOL, msg=name)
    # the dropout is live (another seed moves the gradients), so the equality above covers the RNG replay
    assert any(not torch.allclose(g_other_seed[n], g_plain[n], **TOL) for n in g_plain)


def test_no_recompute_in_eval_or_without_grad(model_dirs: dict[str, Path]) -> None:
    mot = make(model_dirs, "shared", "delay")
    mot.activation_checkpointing = True
    batch = make_batch("delay")
    calls = layer_calls(mot)
    mot.train()
    with torch.no_grad():
        mot.compute_loss(batch)
    mot.eval()
    mot.compute_loss(batch).loss.backward()
    assert calls[0] == 2 * len(mot.layers)  # each layer once per forward, never recomputed


def test_checkpointed_training_keeps_no_layer_keys_alive(model_dirs: dict[str, Path], monkeypatch) -> None:
    """With recompute, a layer's keys/values are garbage once it returns (backward recomputes them): no layer's k/v is
    alive while a later layer runs. They were returned for a cache nobody asked for (~0.8 GB at cuda_1b batch 16)."""
    import gc
    import weakref

    import adapter_trainer.model.layers as layers_module  # MoTLayer looks attend up there

    mot = make(model_dirs, "shared", "delay").train()
    mot.activation_checkpointing = True
    real_attend = layers_module.attend
    refs: list[weakref.ref] = []
    alive_at_call: list[int] = []

    def spy(q, k, v, *args, **kwargs):
        gc.collect()
        alive_at_call.append(sum(r() is not None for r in refs))  # earlier layers' keys/values still alive
        refs.extend([weakref.ref(k), weakref.ref(v)])
        return real_attend(q, k, v, *args, **kwargs)

    monkeypatch.setattr(layers_module, "attend", spy)
    mot.compute_loss(make_batch("delay")).loss.backward()
    n = len(mot.layers)
    assert len(alive_at_call) == 2 * n  # forward, then the recompute in backward
    assert alive_at_call[:n] == [0] * n, alive_at_call[:n]
