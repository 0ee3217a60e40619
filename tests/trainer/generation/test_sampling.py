"""Sampling logic on a scripted fake model that implements forward_step (tiny, fast): layouts, stopping, CFG,
top-k / top-p, seeds. The real MoT model's KV cache is exercised in test_generate.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adapter_trainer.data.token_layout import AudioVocab, DelayPattern
from adapter_trainer.generation.sampling import (
    SamplingConfig,
    apply_cfg,
    filter_logits,
    generate_codes,
    left_pad,
    sample_rows,
    warp,
)

V, K, C = 50, 3, 16
VOCAB = AudioVocab(text_vocab_size=V, n_codebooks=K, codebook_size=C)
BOS, PAD = 1, 2
GREEDY = SamplingConfig(temperature=0.0, top_k=0, top_p=0.0, cfg_scale=1.0)


def target_code(frame: int, k: int, conditioned: bool) -> int:
    return (frame * 7 + k + (5 if conditioned else 0)) % C


class FakeStepModel:
    """Logits peak (value 5) at target_code(frame, k, row has a caption); head 0 proposes END at step `end_step`.

    The cache is the full token history; every call checks the attention-mask contract of forward_step.
    """

    def __init__(self, pattern: str, end_step: int | None = None, flat_logits: bool = False) -> None:
        self.pattern, self.end_step, self.flat = pattern, end_step, flat_logits
        self.fed: list[torch.Tensor] = []  # per call: tokens [R, S_new, J]
        self.prompts: torch.Tensor | None = None

    def forward_step(self, tokens, is_audio, attention_mask, cache):
        R, S_new, J = tokens.shape
        past = 0 if cache is None else cache["tokens"].shape[1]
        assert attention_mask.shape == (R, past + S_new), (attention_mask.shape, R, past, S_new)
        assert is_audio.shape == (R, S_new)
        hist = tokens if cache is None else torch.cat([cache["tokens"], tokens], 1)
        mask = attention_mask
        if cache is None:
            self.prompts = hist[..., 0].clone()
        self.fed.append(tokens.clone())
        step = len(self.fed) - 1  # the audio step the last position predicts
        n_real = mask[:, : self.prompts.shape[1]].sum(1)  # [R] prompt tokens without left pads
        H, size = (K, C + 1) if self.pattern == "delay" else (1, K * C + 1)
        logits = torch.zeros(R, S_new, H, size)
        if self.flat:
            return logits, {"tokens": hist}
        for r in range(R):
            cond = bool(n_real[r] > 2)  # BOS + caption + AUDIO_START
            if self.pattern == "delay":
                for k in range(K):
                    logits[r, -1, k, target_code(step - k, k, cond)] = 5.0
                logits[r, -1, 0, C] = 10.0 if step == self.end_step else -10.0
            else:
                frame, k = divmod(step, K)
                logits[r, -1, 0, k * C + target_code(frame, k, cond)] = 5.0
                logits[r, -1, 0, K * C] = 10.0 if step == self.end_step else -10.0
        return logits, {"tokens": hist}


def expected(T: int, cond: bool = True) -> np.ndarray:
    return np.array([[target_code(t, k, cond) for k in range(K)] for t in range(T)], dtype=np.int16)  # [T, K]


def run(model, captions, *, pattern="delay", max_frames=6, sampling=GREEDY, seeds=None):
    return generate_codes(
        model,
        captions,
        vocab=VOCAB,
        pattern=pattern,
        bos_id=BOS,
        pad_id=PAD,
        max_frames=max_frames,
        sampling=sampling,
        row_seeds=seeds or list(range(len(captions))),
    )


def test_delay_greedy_reaches_max_frames_and_feeds_the_delay_pattern() -> None:
    m = FakeStepModel("delay")
    res = run(m, [[10, 11, 12], [13]], max_frames=6)
    for codes in res.codes:
        np.testing.assert_array_equal(codes, expected(6))
    assert res.ended == [False, False] and res.steps == 6 + K - 1
    # what went back into the model after the prompt is DelayPattern.build of the codes (PAD outside), minus the last step
    fed = torch.cat(m.fed[1:], dim=1)[0]  # [steps - 1, K]
    offsets = V + C * torch.arange(K)
    want = DelayPattern(K).build(torch.from_numpy(expected(6).astype(np.int64)) + offsets, pad_value=VOCAB.audio_pad)
    torch.testing.assert_close(fed, want[:-1])


def test_delay_stops_at_audio_end_and_finishes_the_delayed_tail() -> None:
    m = FakeStepModel("delay", end_step=4)
    res = run(m, [[10, 11]], max_frames=20)
    np.testing.assert_array_equal(res.codes[0], expected(4))
    assert res.ended == [True]
    assert res.steps == 4 + K - 1  # frames 0..3 plus the K - 1 steps that finish codebooks 1..K-1
    # the END step (4) fed back as training lays it out (token_layout): END in slot 0, codebooks 1.. still hold codes
    end_step = m.fed[1 + 4][0, 0]
    assert int(end_step[0]) == VOCAB.audio_end
    assert all(V <= int(x) < VOCAB.audio_start for x in end_step[1:])
    # the tail steps after it: slot 0 PAD, the rest finish the delayed codebooks
    for s in range(5, res.steps - 1):
        fed = m.fed[1 + s][0, 0]
        assert int(fed[0]) == VOCAB.audio_pad and all(V <= int(x) < VOCAB.audio_start for x in fed[s - 4 + 1 :])


def test_flatten_greedy_and_end() -> None:
    res = run(FakeStepModel("flatten"), [[10]], pattern="flatten", max_frames=4)
    np.testing.assert_array_equal(res.codes[0], expected(4))
    res = run(FakeStepModel("flatten", end_step=2 * K), [[10]], pattern="flatten", max_frames=9)
    np.testing.assert_array_equal(res.codes[0], expected(2))
    assert res.ended == [True]


def test_cfg_adds_empty_caption_rows_and_mixes_logits() -> None:
    cond, uncond = torch.tensor([2.0, 0.0, 1.0]), torch.tensor([0.0, 1.0, 1.0])
    torch.testing.assert_close(apply_cfg(cond, uncond, 3.0), torch.tensor([6.0, -2.0, 1.0]))
    torch.testing.assert_close(apply_cfg(cond, uncond, 1.0), cond)
    m = FakeStepModel("delay")
    res = run(m, [[10, 11], [12, 13, 14]], sampling=SamplingConfig(temperature=0.0, top_k=0, cfg_scale=3.0))
    prompts = m.prompts  # [2B, P] left-padded
    assert prompts.shape[0] == 4
    assert prompts[2:, -2:].tolist() == [[BOS, VOCAB.audio_start]] * 2  # uncond rows: the empty caption
    assert prompts[2:, :-2].eq(PAD).all() and prompts[0, 0] == PAD  # left padding
    for codes in res.codes:  # cond peaks at target(cond) with 5, uncond at target(uncond): guidance keeps cond's
        np.testing.assert_array_equal(codes, expected(6, cond=True))
    # both branches were fed the same sampled tokens
    for step in m.fed[1:]:
        torch.testing.assert_close(step[:2], step[2:])


def test_filter_logits_top_k_and_top_p() -> None:
    x = torch.tensor([[3.0, 1.0, 2.0, 0.0, -1.0]])
    assert torch.isfinite(filter_logits(x, 2, 0.0)).tolist() == [[True, False, True, False, False]]
    p = torch.softmax(x, -1)[0]  # mass of 3.0 is ~0.64, of 3.0 + 2.0 ~0.88
    assert torch.isfinite(filter_logits(x, 0, 0.5)).tolist() == [[True, False, False, False, False]]
    assert torch.isfinite(filter_logits(x, 0, float(p[0]) + 0.01)).tolist() == [[True, False, True, False, False]]
    assert torch.isfinite(filter_logits(x, 0, 0.0)).all()


def test_top_k_sampling_only_draws_from_the_top_k() -> None:
    torch.manual_seed(0)
    table = torch.randn(C + 1)  # the same logits at every step, head and row

    class Table(FakeStepModel):
        def forward_step(self, tokens, is_audio, attention_mask, cache):
            logits, cache = super().forward_step(tokens, is_audio, attention_mask, cache)
            return table.expand_as(logits).clone(), cache

    res = run(
        Table("delay", flat_logits=True),
        [[10]] * 4,
        max_frames=30,
        sampling=SamplingConfig(temperature=1.0, top_k=3, cfg_scale=1.0),
    )
    top3 = set(torch.topk(table[:C], 3).indices.tolist())  # END is never allowed on heads 1..K-1
    drawn = set(np.concatenate([c.reshape(-1) for c in res.codes]).tolist())
    assert drawn <= top3 and len(drawn) > 1


def test_seeded_rows_reproduce_and_do_not_depend_on_the_batch() -> None:
    s = SamplingConfig(temperature=1.0, top_k=0, cfg_scale=1.0)
    a = run(FakeStepModel("delay", flat_logits=True), [[10], [11], [12]], sampling=s, seeds=[7, 8, 9])
    b = run(FakeStepModel("delay", flat_logits=True), [[11]], sampling=s, seeds=[8])
    c = run(FakeStepModel("delay", flat_logits=True), [[10], [11], [12]], sampling=s, seeds=[7, 8, 9])
    np.testing.assert_array_equal(a.codes[1], b.codes[0])
    for x, y in zip(a.codes, c.codes):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.codes[0], a.codes[2])  # uniform logits: different seeds give different clips


def test_left_pad_and_bad_arguments() -> None:
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[True] * 3, [False, False, True]]
    with pytest.raises(ValueError, match="row_seeds"):
        run(FakeStepModel("delay"), [[1]], seeds=[1, 2])
    with pytest.raises(ValueError, match="max_frames"):
        run(FakeStepModel("delay"), [[1]], max_frames=0)


class Ambiguous(FakeStepModel):
    """Captioned rows prefer the unconditioned code (5.0) over their own (4.5); empty-caption rows only know the former.
    Plain sampling picks the shared code; guidance (uncond + 3 * (cond - uncond)) picks what the caption adds."""

    def forward_step(self, tokens, is_audio, attention_mask, cache):
        logits, cache = super().forward_step(tokens, is_audio, attention_mask, cache)
        step = len(self.fed) - 1
        n_real = attention_mask[:, : self.prompts.shape[1]].sum(1)
        logits[:, -1, :, :C] = 0.0
        for r in range(logits.shape[0]):
            for k in range(K):
                logits[r, -1, k, target_code(step - k, k, False)] = 5.0
                if n_real[r] > 2:
                    logits[r, -1, k, target_code(step - k, k, True)] = 4.5
        return logits, cache


def test_guidance_changes_the_choice_towards_the_caption() -> None:
    plain = run(Ambiguous("delay"), [[10, 11]], sampling=SamplingConfig(temperature=0.0, top_k=0, cfg_scale=1.0))
    np.testing.assert_array_equal(plain.codes[0], expected(6, cond=False))
    guided = run(Ambiguous("delay"), [[10, 11]], sampling=SamplingConfig(temperature=0.0, top_k=0, cfg_scale=3.0))
    np.testing.assert_array_equal(guided.codes[0], expected(6, cond=True))


def _transformers_warp(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' sampling chain: Temperature -> TopK -> TopP (the order audiocraft uses too)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    out = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        out = TopKLogitsWarper(top_k)(None, out)
    if top_p:
        out = TopPLogitsWarper(top_p)(None, out)
    return out


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(0.5, 0, 0.9), (1.0, 5, 0.0), (0.7, 8, 0.8), (1.3, 0, 0.5)]
)
def test_warp_matches_transformers_temperature_then_top_k_then_top_p(temperature, top_k, top_p) -> None:
    """Fixed random logits have no ties, so the kept set is unique (with ties at the k-th value top-k keeps them all,
    as transformers does; ties at the nucleus' edge may fall either way, depending on the sort)."""
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(3))  # [rows, V]
    ours = warp(logits, SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p))
    want = _transformers_warp(logits, temperature, top_k, top_p)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(want))
    torch.testing.assert_close(ours[torch.isfinite(ours)], want[torch.isfinite(want)], rtol=1e-6, atol=1e-6)


def test_temperature_comes_before_the_nucleus_when_sampling() -> None:
    """At temperature 0.5, top_p 0.9 the tempered nucleus of these logits holds 3 tokens; the raw one holds 5 (the
    old order, nucleus then temperature, sampled from those 5)."""
    x = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0]])
    cfg = SamplingConfig(temperature=0.5, top_k=0, top_p=0.9, cfg_scale=1.0)
    kept = torch.isfinite(_transformers_warp(x, 0.5, 0, 0.9))[0]
    assert int(kept.sum()) == 3 and int(torch.isfinite(filter_logits(x, 0, 0.9)).sum()) == 5
    u = torch.rand(4000, 1, generator=torch.Generator().manual_seed(0))  # [N, H=1]
    drawn = sample_rows(x.expand(4000, 1, 7), cfg, u)[:, 0]  # [N]
    assert set(drawn.tolist()) == set(kept.nonzero()[:, 0].tolist())


def test_a_draw_never_lands_on_a_disallowed_id_even_if_the_cdf_is_not_monotone(monkeypatch) -> None:
    """CUDA's parallel cumsum sums each position in its own order, so the running sums after the last allowed id (all
    adding probability 0) may come out a few ulps ABOVE the sum at that id; a uniform near 1 then lands on an id whose
    warped logit is -inf (a code of another codebook in flatten, which loses the whole batch at decode). Injected
    here as such a rounding would make it; searchsorted and the rest run for real."""
    import adapter_trainer.generation.sampling as sampling

    logits = torch.full((1, 1, 8), float("-inf"))
    logits[0, 0, :4] = 0.0  # ids 0-3 allowed, 4-7 disallowed (probability 0)
    real = sampling._cdf

    def rounded(probs: torch.Tensor) -> torch.Tensor:
        cdf = real(probs).clone()  # [1, 1, 8]
        cdf[..., 4:] = cdf[..., 3:4] + 1e-6  # the zero-probability tail summed in another order
        return cdf

    monkeypatch.setattr(sampling, "_cdf", rounded)
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=0.0, cfg_scale=1.0)
    u = torch.tensor([[1.0 - 1e-7]])  # [1, 1]
    drawn = sample_rows(logits, cfg, u)  # [1, 1]
    assert int(drawn) < 4, int(drawn)
    monkeypatch.setattr(sampling, "_cdf", real)
    assert int(sample_rows(logits, cfg, u)) == 3  # the same draw on the exact cdf: the last allowed id


def test_nan_logits_keep_every_draw_allowed_and_are_counted() -> None:
    """NaN logits (a broken step) draw the best allowed id instead of losing the batch; the count says how many."""
    model = FakeStepModel("flatten", flat_logits=True)
    real_step = model.forward_step

    def nan_step(tokens, is_audio, attention_mask, cache):
        logits, cache = real_step(tokens, is_audio, attention_mask, cache)
        return logits.fill_(float("nan")), cache

    model.forward_step = nan_step
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=0.0, cfg_scale=1.0)
    with pytest.warns(UserWarning, match="non-finite logit"):  # reported, not swallowed
        res = generate_codes(
            model, [[5, 6]], vocab=VOCAB, pattern="flatten", bos_id=BOS, pad_id=PAD, max_frames=3, sampling=cfg,
            row_seeds=[0],
        )  # fmt: skip
    assert res.codes[0].shape == (3, K)  # every position got a code of its own codebook: the clip decodes
    # every draw while the clip was open had NaN logits: 3 frames of K codes, then the step max_frames stops it
    assert res.invalid_draws == [3 * K + 1]
