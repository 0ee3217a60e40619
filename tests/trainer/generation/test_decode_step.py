"""The decoding fast path (MoTAdapterModel.decode_step): the logits of forward_step for one audio position per row,
with no host read of device data, so a CUDA decoding step never waits for the GPU; the sampler reads state only every
`stop_check_every` steps.

A host read is counted at the dispatcher, as the ops that need the device's values on the host: `_local_scalar_dense`
(bool(), item(), int()), nonzero, masked_select, unique, equal, boolean-mask indexing. On CUDA each is a sync.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from adapter_trainer.data.token_layout import collate
from adapter_trainer.generation.sampling import SamplingConfig, generate_codes
from adapter_trainer.model.kv_cache import MoTKVCache
from tests.trainer.helpers import example, tiny_mot

TOL = dict(rtol=1e-5, atol=1e-5)  # fp32, the same ops in the same order (expected bitwise equal)
SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "equal", "is_nonzero")


class HostReads(TorchDispatchMode):
    """Counts the ops that copy device values to the host (each a device sync on CUDA), by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        bool_index = name in ("index", "index_put_", "index_put") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []) or []
        )
        if name in SYNC_OPS or bool_index:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def mot(pattern: str, variant: str):
    """The tiny model with every trainable tensor moved off its init (zero up adapters would hide the audio path)."""
    from transformers import LlamaForCausalLM, MusicgenForCausalLM

    from adapter_trainer.data.token_layout import AudioVocab
    from adapter_trainer.model.builders import tiny_llama_config, tiny_musicgen_decoder_config
    from adapter_trainer.model.mot import MoTAdapterModel, MoTConfig
    from tests.trainer.helpers import TEXT_VOCAB

    vocab = AudioVocab(text_vocab_size=TEXT_VOCAB, n_codebooks=4, codebook_size=2048)  # tiny_mot's
    torch.manual_seed(0)
    lc = tiny_llama_config()
    lc.vocab_size = TEXT_VOCAB
    cfg = MoTConfig(audio_tower="llm", audio_attention=variant, lora_rank=4 if variant == "lora" else 0)
    model = MoTAdapterModel(
        LlamaForCausalLM(lc), MusicgenForCausalLM(tiny_musicgen_decoder_config()), vocab, pattern, cfg
    )
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return model.eval(), vocab


def prompts(vocab, pattern: str, left: bool):
    """Two rows of different lengths; left=True moves the pads to the front (CFG's prompts are left-padded)."""
    b = collate(
        [example(vocab, 5, 4, seed=1, pattern=pattern), example(vocab, 2, 3, seed=2, pattern=pattern)], pad_id=0
    )
    if not left:
        n = int(b.attention_mask.sum(1).min())
        return b.tokens[:, :n], b.is_audio[:, :n], b.attention_mask[:, :n]
    shift = [int(b.attention_mask[r].sum()) for r in range(2)]
    roll = lambda t: torch.stack([t[r].roll(-shift[r], 0) for r in range(2)])
    return roll(b.tokens), roll(b.is_audio), roll(b.attention_mask)


@pytest.mark.parametrize("left", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("variant,pattern", [("shared", "delay"), ("lora", "flatten"), ("separate", "delay")])
def test_decode_step_equals_forward_step_and_reads_nothing(variant, pattern, left) -> None:
    model, vocab = mot(pattern, variant)
    tokens, is_audio, mask = prompts(vocab, pattern, left)  # the last position of each row is audio
    B, S, J = tokens.shape
    with torch.no_grad():
        _, cache_a = model.forward_step(tokens[:, :-2], is_audio[:, :-2], mask[:, :-2], MoTKVCache.allocate(S))
        _, cache_b = model.forward_step(tokens[:, :-2], is_audio[:, :-2], mask[:, :-2], MoTKVCache.allocate(S))
        for p in (S - 2, S - 1):
            step = tokens[:, p : p + 1]  # [B, 1, J] audio ids
            one = torch.ones(B, 1, dtype=torch.bool)
            with HostReads() as slow:
                want, cache_a = model.forward_step(step, one, mask[:, : p + 1], cache_a)
            with HostReads() as fast:
                got, cache_b = model.decode_step(step, mask[:, : p + 1], cache_b)
            torch.testing.assert_close(got, want, **TOL)
            assert fast.ops == [], fast.ops
            assert len(slow.ops) >= 4, slow.ops  # what a step cost before: ids, routing, mask, CaptionCond
    assert cache_b.seq_len == S


def test_decode_step_refuses_a_prompt() -> None:
    model, vocab = tiny_mot("delay")
    tokens, is_audio, mask = prompts(vocab, "delay", left=False)
    with torch.no_grad():
        _, cache = model.forward_step(tokens[:, :-2], is_audio[:, :-2], mask[:, :-2])
        with pytest.raises(ValueError, match="one position"):
            model.decode_step(tokens[:, -2:], mask, cache)


def test_the_sampler_reads_the_device_only_at_its_stop_checks() -> None:
    """Host reads do not grow with the number of steps (stop checks off): every step is sync-free, CFG rows included."""
    model, vocab = tiny_mot("delay", seed=1)
    model.eval()
    sampling = SamplingConfig(temperature=1.0, top_k=50, top_p=0.0, cfg_scale=3.0)

    def reads(max_frames: int, every: int) -> int:
        with HostReads() as h:
            generate_codes(
                model, [[11, 12, 13], [14]], vocab=vocab, pattern="delay", bos_id=1, pad_id=0, max_frames=max_frames,
                sampling=sampling, row_seeds=[1, 2], new_cache=MoTKVCache.allocate, stop_check_every=every,
            )  # fmt: skip
        return len(h.ops)

    assert reads(3, every=1000) == reads(9, every=1000)
    assert reads(9, every=4) - reads(9, every=1000) == 2  # steps 4 and 8 (of 11): one read each
