"""model.mot.caption_cond_rank: the caption summary added to audio rows starts as a no-op (zero up), reaches only
audio rows, gets gradients, and generation's KV cache carries it (stepped decoding = one full call, select)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from adapter_trainer.model.builders import load_musicgen_decoder
from adapter_trainer.model.mot import MoTAdapterModel, MoTConfig
from tests.trainer.model.test_mot_attention import TOL, VOCAB, left_pad, make_batch

pytestmark = pytest.mark.usefixtures("one_thread")


def make(model_dirs: dict[str, Path], rank: int, perturb: bool = True, pattern: str = "delay") -> MoTAdapterModel:
    torch.manual_seed(0)
    llm = LlamaForCausalLM.from_pretrained(str(model_dirs["llm"]))
    mot = MoTAdapterModel(
        llm, load_musicgen_decoder(model_dirs["musicgen"]), VOCAB, pattern, MoTConfig(caption_cond_rank=rank)
    ).eval()
    if perturb:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in mot.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return mot


def test_starts_as_the_model_without_it_and_reaches_only_audio_rows(model_dirs: dict[str, Path]) -> None:
    batch = make_batch("delay")
    with torch.no_grad():
        plain = make(model_dirs, 0, perturb=False)
        cond = make(model_dirs, 8, perturb=False)
        assert cond.caption_cond is not None and plain.caption_cond is None
        h0 = plain.hidden_states(batch.tokens, batch.is_audio, batch.attention_mask)
        h1 = cond.hidden_states(batch.tokens, batch.is_audio, batch.attention_mask)
        assert torch.equal(h0, h1)  # up is zero at init: exactly the model without it
        for c in cond.caption_cond:
            c.up.weight.normal_(std=0.1)
        h2 = cond.hidden_states(batch.tokens, batch.is_audio, batch.attention_mask)
    text = ~batch.is_audio & batch.attention_mask
    assert torch.equal(h2[text], h0[text])  # text rows stay the frozen LLM's
    assert not torch.allclose(h2[batch.is_audio], h0[batch.is_audio], **TOL)


def test_the_caption_reaches_the_first_audio_step_through_it(model_dirs: dict[str, Path]) -> None:
    """Two rows with the same audio and different captions: with attention alone the first audio step differs,
    and the summary path changes it further; its parameters get gradients from the loss."""
    mot = make(model_dirs, 8).train()
    batch = make_batch("delay")
    out = mot.compute_loss(batch)
    out.loss.backward()
    for c in mot.caption_cond:
        assert c.up.weight.grad is not None and c.up.weight.grad.abs().sum() > 0
        assert c.down.weight.grad is not None and c.down.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("pattern", ["delay", "flatten"])
def test_kv_cache_carries_the_summary(model_dirs: dict[str, Path], pattern: str) -> None:
    """Left-padded prompt, then a few positions per call (no text after the prompt): the same logits as one call."""
    mot = make(model_dirs, 8, pattern=pattern)
    batch = left_pad(make_batch(pattern))
    S = batch.tokens.shape[1]
    with torch.no_grad():
        full, _ = mot.forward_step(batch.tokens, batch.is_audio, batch.attention_mask)
        cache, pieces, start = None, [], 0
        for end in [S // 2, S // 2 + 1, S // 2 + 3, S]:
            logits, cache = mot.forward_step(
                batch.tokens[:, start:end], batch.is_audio[:, start:end], batch.attention_mask[:, :end], cache
            )
            pieces.append(logits)
            start = end
        torch.testing.assert_close(torch.cat(pieces, dim=1), full, **TOL)
        # select keeps each row's summary with its keys (rows reordered)
        rev = torch.tensor([2, 0])
        _, part = mot.forward_step(
            batch.tokens[:, : S - 1], batch.is_audio[:, : S - 1], batch.attention_mask[:, : S - 1]
        )
        got, _ = mot.forward_step(
            batch.tokens[rev, S - 1 :], batch.is_audio[rev, S - 1 :], batch.attention_mask[rev], part.select(rev)
        )
    torch.testing.assert_close(got[:, 0], full[rev, -1], **TOL)


def test_early_frame_weight_scales_only_the_first_frames_loss(model_dirs: dict[str, Path]) -> None:
    """trainer.early_frame_loss_weight w: loss = (sum of CE, first frames' codes counted w times) / targets; the
    per-codebook and per-example CE sums (what eval reads) stay plain."""
    from adapter_trainer.data.token_layout import target_frames

    mot = make(model_dirs, 0)
    batch = make_batch("delay")
    with torch.no_grad():
        plain = mot.compute_loss(batch)
        mot.early_frame_weight = (3, 4.0)
        weighted = mot.compute_loss(batch)
        cells = plain.ce_per_target  # [B, S, J] code CE (0 elsewhere)
        frames = target_frames(batch.tokens, batch.labels, vocab=VOCAB, pattern="delay")
        early = float(cells[(frames >= 0) & (frames < 3)].sum())
        n = int(plain.count_per_codebook.sum() + plain.end_count)
    torch.testing.assert_close(weighted.loss, plain.loss + torch.tensor(3.0 * early / n), rtol=1e-5, atol=1e-5)
    assert torch.equal(weighted.ce_sum_per_example, plain.ce_sum_per_example)


def test_new_settings_are_validated_and_fingerprinted_only_when_set(models, shards, tmp_path: Path) -> None:
    """Checkpoints written before these settings existed stay resumable (defaults are not recorded); a run that sets
    one differs from a checkpoint that did not."""
    from adapter_trainer.config import ConfigError, validate_config
    from adapter_trainer.training.checkpoint import run_fingerprint
    from tests.trainer.helpers import make_cfg

    class _Set:
        manifest_sha256 = "x"

    def fp(*overrides: str) -> dict:
        cfg = make_cfg(models, shards, tmp_path / "run", *overrides)

        class _M(torch.nn.Module):
            def trainable_state_dict(self) -> dict:
                return {}

        return run_fingerprint(cfg, VOCAB, _M(), [_Set()])

    default = fp("data.start_crop_prob=0.0")  # the dataclass defaults (the demo preset sets start crops)
    assert "data.start_crop_prob" not in default and "caption_cond_rank" not in default["model.mot"]
    assert "data.caption_word_dropout" not in default
    assert fp("data.start_crop_prob=0.5")["data.start_crop_prob"] == 0.5
    assert fp("data.caption_word_dropout=0.2")["data.caption_word_dropout"] == 0.2
    assert fp("model.mot.caption_cond_rank=4")["model.mot"]["caption_cond_rank"] == 4
    for bad, match in (
        ("data.start_crop_prob=1.5", "start_crop_prob"),
        ("data.caption_word_dropout=1.0", "caption_word_dropout"),
        ("model.mot.caption_cond_rank=-1", "caption_cond_rank"),
        ("trainer.early_frame_loss_weight=0", "early_frame_loss_weight"),
    ):
        with pytest.raises(ConfigError, match=match):
            validate_config(make_cfg(models, shards, tmp_path / "run", bad))
