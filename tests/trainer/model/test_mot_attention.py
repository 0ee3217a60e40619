"""MoT attention: explicit causal + padding mask, the KV cache of generation, and the audio_attention variants.

Tolerances: where two computations run the same ops on the same shapes and differ only in values that are masked
out or never read, results are compared with torch.equal. Where batch shapes differ (padded vs alone, one step at
a time vs the whole sequence, a text-only LlamaModel vs the mixed sequence), matmul blocking may differ, so fp32
results are compared with atol/rtol 1e-5 (a leak of information through the mask moves logits by ~1e-1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from adapter_trainer.data.token_layout import AudioVocab, Batch, collate, encode_example
from adapter_trainer.model.builders import load_llm, load_musicgen_decoder
from adapter_trainer.model.kv_cache import MoTKVCache
from adapter_trainer.model.mot import MoTAdapterModel, MoTConfig

V, K, C = 128_256, 4, 2048
VOCAB = AudioVocab(V, K, C)
BOS, PAD = 128_000, 128_004
VARIANTS = {"shared": {}, "lora": {"lora_rank": 4}, "separate": {}}
TOL = {"rtol": 1e-5, "atol": 1e-5}


pytestmark = pytest.mark.usefixtures("one_thread")


def make(
    model_dirs: dict[str, Path],
    variant: str = "shared",
    pattern: str = "delay",
    perturb_seed: int | None = 1,
    attn_implementation: str = "sdpa",
) -> MoTAdapterModel:
    """MoT model; perturb_seed moves every trainable tensor off its init (zero up adapters, zero LoRA B, copies)."""
    torch.manual_seed(0)
    llm = LlamaForCausalLM.from_pretrained(str(model_dirs["llm"]), attn_implementation=attn_implementation)
    mot = MoTAdapterModel(
        llm,
        load_musicgen_decoder(model_dirs["musicgen"]),
        VOCAB,
        pattern,
        MoTConfig(audio_tower="llm", audio_attention=variant, **VARIANTS[variant]),
    ).eval()
    if perturb_seed is not None:
        g = torch.Generator().manual_seed(perturb_seed)
        with torch.no_grad():
            for p in mot.parameters():
                if p.requires_grad:
                    p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return mot


def make_batch(pattern: str, n: int = 3, seed: int = 0) -> Batch:
    """Right-padded batch (collate); rows have different caption and audio lengths."""
    rng = np.random.default_rng(seed)
    exs = [
        encode_example(
            list(range(2000 + 7 * i, 2003 + 5 * i)),
            rng.integers(0, C, (5 + 3 * i, K)).astype(np.int16),
            vocab=VOCAB,
            pattern=pattern,
            bos_id=BOS,
            max_seq_len=256,
            max_caption_tokens=16,
            crop="start",
            rng=rng,
            key=f"k{i}",
        )
        for i in range(n)
    ]
    return collate(exs, pad_id=PAD)


def left_pad(batch: Batch) -> Batch:
    """The same rows with their pads moved to the front."""
    rows = [(batch.attention_mask[b].sum().item(), b) for b in range(batch.tokens.shape[0])]
    idx = torch.stack([torch.roll(torch.arange(batch.tokens.shape[1]), -int(n)) for n, _ in rows])  # [B, S]
    take = lambda t: torch.stack([t[b][idx[b]] for b in range(t.shape[0])])
    return Batch(take(batch.tokens), take(batch.is_audio), take(batch.labels), take(batch.attention_mask), batch.keys)


def real_rows(batch: Batch, logits: torch.Tensor) -> list[torch.Tensor]:
    """Per row, the logits of its real positions in order [n_b, H, size]."""
    return [logits[b][batch.attention_mask[b]] for b in range(logits.shape[0])]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_eager_and_sdpa_loaded_llm_give_the_same_logits(model_dirs: dict[str, Path], variant: str) -> None:
    """The MoT layers run their own masked attention: how the Llama was loaded does not matter."""
    batch = make_batch("delay")
    with torch.no_grad():
        a = make(model_dirs, variant, attn_implementation="sdpa")(batch.tokens, batch.is_audio, batch.attention_mask)
        b = make(model_dirs, variant, attn_implementation="eager")(batch.tokens, batch.is_audio, batch.attention_mask)
    assert torch.equal(a, b)  # same weights, same code path


@pytest.mark.parametrize("pattern", ["delay", "flatten"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_future_audio_never_changes_earlier_logits(model_dirs: dict[str, Path], variant: str, pattern: str) -> None:
    mot = make(model_dirs, variant, pattern)
    batch = make_batch(pattern, n=1)
    audio_pos = batch.is_audio[0].nonzero().squeeze(1)
    t = int(audio_pos[len(audio_pos) // 2])  # an audio position in the middle
    tokens = batch.tokens.clone()
    tokens[0, t] = torch.where(tokens[0, t] < VOCAB.audio_start - C, tokens[0, t] + 1, tokens[0, t])  # other codes
    assert not torch.equal(tokens, batch.tokens)
    with torch.no_grad():
        base = mot.forward_step(batch.tokens, batch.is_audio, batch.attention_mask)[0]
        poked = mot.forward_step(tokens, batch.is_audio, batch.attention_mask)[0]
    assert torch.equal(base[:, :t], poked[:, :t])  # same shapes; the changed key is masked for every earlier query
    assert not torch.allclose(base[:, t:], poked[:, t:], atol=1e-3)  # and the change is visible from t on


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_padding_left_or_right_never_changes_real_positions(model_dirs: dict[str, Path], variant: str) -> None:
    mot = make(model_dirs, variant, "delay")
    right = make_batch("delay")
    left = left_pad(right)
    assert not bool(left.attention_mask[:, 0].all())  # some row really is left-padded
    with torch.no_grad():
        out_r = mot.forward_step(right.tokens, right.is_audio, right.attention_mask)[0]
        out_l = mot.forward_step(left.tokens, left.is_audio, left.attention_mask)[0]
        other = right.tokens.masked_fill(~right.attention_mask[..., None], 17)  # different pad ids
        out_o = mot.forward_step(other, right.is_audio, right.attention_mask)[0]
        for b, (r, l) in enumerate(zip(real_rows(right, out_r), real_rows(left, out_l))):
            n = int(right.attention_mask[b].sum())
            alone = mot.forward_step(
                right.tokens[b : b + 1, :n], right.is_audio[b : b + 1, :n], right.attention_mask[b : b + 1, :n]
            )[0][0]  # [n, H, size] no padding at all
            torch.testing.assert_close(r, alone, **TOL)
            torch.testing.assert_close(l, alone, **TOL)
    assert torch.equal(out_r[right.attention_mask], out_o[right.attention_mask])  # pad contents are never read


@pytest.mark.parametrize("pattern", ["delay", "flatten"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kv_cache_steps_equal_full_forward(model_dirs: dict[str, Path], variant: str, pattern: str) -> None:
    """Left-padded prompt, then 1-3 positions per call: every position's logits match one full call."""
    mot = make(model_dirs, variant, pattern)
    batch = left_pad(make_batch(pattern))
    S = batch.tokens.shape[1]
    with torch.no_grad():
        full, full_cache = mot.forward_step(batch.tokens, batch.is_audio, batch.attention_mask)
        cache, pieces, start = None, [], 0
        for end in [S // 2, S // 2 + 1, S // 2 + 3, S]:
            logits, cache = mot.forward_step(
                batch.tokens[:, start:end], batch.is_audio[:, start:end], batch.attention_mask[:, :end], cache
            )
            assert cache.seq_len == end and cache.keys[0].shape[:2] == (3, mot.llm.config.num_key_value_heads)
            pieces.append(logits)
            start = end
        stepped = torch.cat(pieces, dim=1)  # [B, S, H, size]
        torch.testing.assert_close(stepped, full, **TOL)
        for k_full, k_step in zip(full_cache.keys, cache.keys):
            torch.testing.assert_close(k_step, k_full, **TOL)
        # forward() (training/eval path) gives the same logits at audio positions
        fwd = mot(batch.tokens, batch.is_audio, batch.attention_mask)
        torch.testing.assert_close(fwd[batch.is_audio], full[batch.is_audio], **TOL)


def test_cache_select_reorders_rows(model_dirs: dict[str, Path]) -> None:
    mot = make(model_dirs, "separate")
    batch = left_pad(make_batch("delay"))
    S, rev = batch.tokens.shape[1], torch.tensor([2, 0])
    with torch.no_grad():
        _, cache = mot.forward_step(
            batch.tokens[:, : S - 1], batch.is_audio[:, : S - 1], batch.attention_mask[:, : S - 1]
        )
        got, _ = mot.forward_step(
            batch.tokens[rev, S - 1 :], batch.is_audio[rev, S - 1 :], batch.attention_mask[rev], cache.select(rev)
        )
        want, _ = mot.forward_step(batch.tokens[rev], batch.is_audio[rev], batch.attention_mask[rev])
    torch.testing.assert_close(got[:, 0], want[:, -1], **TOL)
    with pytest.raises(ValueError, match="S_past"):
        mot.forward_step(batch.tokens[:, -1:], batch.is_audio[:, -1:], batch.attention_mask[:, -1:], cache)
    assert isinstance(cache, MoTKVCache)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_text_positions_are_the_frozen_llms(model_dirs: dict[str, Path], variant: str) -> None:
    """Trained-looking audio-side weights (perturbed) never reach text positions."""
    batch = make_batch("delay")
    text = ~batch.is_audio & batch.attention_mask  # [B, S] real caption positions
    ref = load_llm(model_dirs["llm"]).eval()
    with torch.no_grad():
        h1 = make(model_dirs, variant, perturb_seed=1).hidden_states(batch.tokens, batch.is_audio, batch.attention_mask)
        h2 = make(model_dirs, variant, perturb_seed=2).hidden_states(batch.tokens, batch.is_audio, batch.attention_mask)
        assert torch.equal(h1[text], h2[text])  # same ops and shapes: bit-identical whatever the audio weights are
        assert not torch.allclose(h1[batch.is_audio], h2[batch.is_audio])  # ... which did change the audio rows
        for b in range(batch.tokens.shape[0]):
            n_text = int(text[b].sum())
            ref_h = ref.model(input_ids=batch.tokens[b, :n_text, 0][None]).last_hidden_state[0]  # [n_text, D]
            torch.testing.assert_close(h1[b, :n_text], ref_h, **TOL)  # a text-only sequence: other shapes


def test_separate_projections_start_equal_to_llamas(model_dirs: dict[str, Path]) -> None:
    sep = make(model_dirs, "separate", perturb_seed=None)
    shared = make(model_dirs, "shared", perturb_seed=None)
    for layer in sep.layers:
        attn = layer.llm_layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            mine, llama = layer.audio_attn[name].weight, getattr(attn, name).weight
            assert torch.equal(mine, llama) and mine.data_ptr() != llama.data_ptr()
            assert mine.requires_grad and not llama.requires_grad
        assert torch.equal(layer.audio_attn["input_layernorm"].weight, layer.llm_layer.input_layernorm.weight)
    batch = make_batch("delay")
    with torch.no_grad():  # same weights: the separate model starts as the shared one (routed matmuls: tolerance)
        torch.testing.assert_close(
            sep(batch.tokens, batch.is_audio, batch.attention_mask),
            shared(batch.tokens, batch.is_audio, batch.attention_mask),
            **TOL,
        )


@pytest.mark.parametrize("variant", ["lora", "separate"])
def test_gradients_reach_only_trainable_parameters(model_dirs: dict[str, Path], variant: str) -> None:
    mot = make(model_dirs, variant, perturb_seed=None).train()
    frozen = {n: p.detach().clone() for n, p in mot.named_parameters(remove_duplicate=False) if not p.requires_grad}
    names = {
        "lora": ("audio_lora.q_proj.lora_A.weight", "audio_lora.v_proj.lora_B.weight"),
        "separate": (
            "audio_attn.q_proj.weight",
            "audio_attn.k_proj.weight",
            "audio_attn.v_proj.weight",
            "audio_attn.o_proj.weight",
            "audio_attn.input_layernorm.weight",
        ),
    }[variant]
    trainable = {n for n, p in mot.named_parameters() if p.requires_grad}
    assert all(f"layers.{l}.{n}" in trainable for l in range(len(mot.layers)) for n in names)
    assert set(mot.trainable_state_dict()) == trainable
    opt = torch.optim.AdamW([p for p in mot.parameters() if p.requires_grad], lr=1e-2)
    got_grad = dict.fromkeys(trainable, False)
    batch = make_batch("delay")
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        mot.compute_loss(batch).loss.backward()
        for n, p in mot.named_parameters():
            if not p.requires_grad:
                assert p.grad is None, n
            elif p.grad is not None and bool(p.grad.abs().sum() > 0):
                got_grad[n] = True
        opt.step()
    assert all(got_grad.values()), [n for n, g in got_grad.items() if not g]
    for n, p in mot.named_parameters(remove_duplicate=False):
        if n in frozen:
            assert torch.equal(p, frozen[n]), f"frozen parameter changed: {n}"
    fresh = make(model_dirs, variant, perturb_seed=None)  # checkpoint names round-trip
    fresh.load_trainable_state_dict(mot.trainable_state_dict())
    with torch.no_grad():
        mot.eval()
        assert torch.equal(
            fresh(batch.tokens, batch.is_audio, batch.attention_mask),
            mot(batch.tokens, batch.is_audio, batch.attention_mask),
        )


def test_lora_rank_belongs_to_the_lora_variant() -> None:
    from adapter_trainer.config import ConfigError, DataConfig, ModelConfig, TrainConfig, TrainerConfig, validate_config

    def cfg(**mot) -> TrainConfig:
        model = ModelConfig(llm="llm", audio_lm="mg", mot=MoTConfig(audio_tower="llm", **mot))
        return TrainConfig(data=DataConfig(shards=["s"]), model=model, trainer=TrainerConfig(output_dir="o"))

    with pytest.raises(ConfigError, match="audio_attention=lora"):
        validate_config(cfg(audio_attention="shared", lora_rank=4))
    with pytest.raises(ConfigError, match="choose one of shared, lora, separate"):
        validate_config(cfg(audio_attention="cross"))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_pretrained_copies_get_their_own_lr(model_dirs: dict[str, Path], variant: str) -> None:
    """optimizer.pretrained_copy_lr_scale: separate's copied q/k/v/o + norm step at lr x scale, new adapters at lr.
    With scale 0 the copies stay bit-identical through AdamW steps (decay included) while the adapters move."""
    from adapter_trainer.config import OptimizerConfig
    from adapter_trainer.training.optim import param_groups

    mot = make(model_dirs, variant, perturb_seed=None).train()
    copies = mot.pretrained_copy_parameters()
    names = {id(p): n for n, p in mot.named_parameters()}
    assert {names[id(p)] for p in copies} == pretrained_starts(model_dirs, variant, "musicgen")
    trainable = [p for p in mot.parameters() if p.requires_grad]
    opt_cfg = OptimizerConfig(lr=1e-2, weight_decay=0.1, pretrained_copy_lr_scale=0.0)
    groups = param_groups(trainable, copies, opt_cfg)
    in_groups = [id(p) for g in groups for p in g["params"]]
    assert sorted(in_groups) == sorted(id(p) for p in trainable)  # each trainable tensor in exactly one group
    opt = torch.optim.AdamW(groups, lr=opt_cfg.lr)
    assert [g["lr"] for g in opt.param_groups] == [1e-2, 1e-2, 0.0, 0.0]
    before = {n: p.detach().clone() for n, p in mot.named_parameters() if p.requires_grad}
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        mot.compute_loss(make_batch("delay")).loss.backward()
        opt.step()
    copy_names = {names[id(p)] for p in copies}
    for n, p in mot.named_parameters():
        if n in copy_names:
            assert torch.equal(p, before[n]), f"copy moved at lr 0: {n}"
    assert any(not torch.equal(p, before[n]) for n, p in mot.named_parameters() if n in before and n not in copy_names)


def pretrained_starts(model_dirs: dict[str, Path], variant: str, init: str) -> set[str]:
    """Names of the trainable tensors that start as pretrained weights, found by value, not by name. Every tower
    tensor first gets noise (so none is zero or equal to another), then a trainable tensor counts when it IS a tower
    tensor (trained in place) or equals one (a copy); zero-init and random-init new tensors match nothing."""
    llm, mg = load_llm(model_dirs["llm"]), load_musicgen_decoder(model_dirs["musicgen"])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in [*llm.parameters(), *mg.parameters()]:
            p.add_(torch.rand(p.shape, generator=g) + 0.5)
    in_place = {id(p) for p in [*llm.parameters(), *mg.parameters()]}
    ref = [p.detach().clone() for p in [*llm.parameters(), *mg.parameters()]]
    ref.append(torch.cat([e.weight.detach()[:C] for e in mg.model.decoder.embed_tokens]))  # code_embed's source rows
    bos_pad = [torch.stack([e.weight.detach()[r] for e in mg.model.decoder.embed_tokens]) for r in (C, C)]
    ref.append(torch.stack(bos_pad))  # special_code_embed's: MusicGen's BOS and pad rows (id C) of each codebook
    mot = MoTAdapterModel(
        llm,
        mg,
        VOCAB,
        "delay",
        MoTConfig(
            audio_tower="llm",
            audio_attention=variant,
            **VARIANTS[variant],
            audio_embed_init=init,
            audio_head_init=init,
        ),
    )
    return {
        n
        for n, p in mot.named_parameters()
        if p.requires_grad
        and (id(p) in in_place or any(r.shape == p.shape and torch.equal(r, p.detach()) for r in ref))
    }


@pytest.mark.parametrize("init", ["musicgen", "random"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_pretrained_copy_parameters_are_exactly_the_tensors_that_start_pretrained(
    model_dirs: dict[str, Path], variant: str, init: str
) -> None:
    mot = MoTAdapterModel(
        load_llm(model_dirs["llm"]),
        load_musicgen_decoder(model_dirs["musicgen"]),
        VOCAB,
        "delay",
        MoTConfig(
            audio_tower="llm",
            audio_attention=variant,
            **VARIANTS[variant],
            audio_embed_init=init,
            audio_head_init=init,
        ),
    )
    names = {id(p): n for n, p in mot.named_parameters()}
    got = {names[id(p)] for p in mot.pretrained_copy_parameters()}
    expected = pretrained_starts(model_dirs, variant, init)
    assert got == expected, (sorted(got - expected)[:5], sorted(expected - got)[:5])
    assert any(n.endswith("audio.norm.weight") for n in got)  # the expert norm starts as the Llama's post-attn norm
    assert ("code_embed" in got) == (init == "musicgen")
    assert any(".audio_attn." in n for n in got) == (variant == "separate")
    assert not any(n.endswith("audio.fc1.weight") for n in got)  # the audio FFNs stay frozen


def test_param_groups_split_only_when_there_are_copies() -> None:
    from adapter_trainer.config import OptimizerConfig
    from adapter_trainer.training.optim import param_groups

    new, copy = (
        [torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))],
        [torch.nn.Parameter(torch.ones(3))],
    )
    cfg = OptimizerConfig(lr=1.0, weight_decay=0.1, pretrained_copy_lr_scale=0.5)
    assert [len(g["params"]) for g in param_groups(new, [], cfg)] == [1, 1]
    groups = param_groups(new + copy, copy, cfg)
    assert [len(g["params"]) for g in groups] == [1, 1, 0, 1]
    assert [g.get("lr", 1.0) for g in groups] == [1.0, 1.0, 0.5, 0.5]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0, 0.1, 0.0]
