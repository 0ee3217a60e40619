"""The teacher baseline (model/teacher.py, evaluation/music_lm_baseline.py): MusicGen reading each caption through its
own T5 encoder and projection, scored on the learning check's own code targets, equals transformers'
`MusicgenForConditionalGeneration` loss on the same windows; the empty caption is MusicGen's exact null; the
loader never builds the codec; the report and the printed block carry the figures."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import MusicgenConfig, MusicgenForCausalLM, MusicgenForConditionalGeneration, T5Config

from adapter_trainer.data.samples import Clip
from adapter_trainer.data.streaming import ExampleSpec, eval_example
from adapter_trainer.data.token_layout import IGNORE_INDEX, AudioVocab, collate
from adapter_trainer.demo.models import musicgen_small_layout_config
from adapter_trainer.evaluation.learning_check import learning_check_summary, learning_check_text
from adapter_trainer.evaluation.music_lm_baseline import music_lm_ce_per_target, music_lm_view
from adapter_trainer.evaluation.report import make_report
from adapter_trainer.evaluation.target_ce import TargetCE
from adapter_trainer.model.builders import load_musicgen_decoder, tiny_musicgen_decoder_config
from adapter_trainer.model.teacher import TeacherUnavailable, load_musicgen_teacher

pytestmark = pytest.mark.usefixtures("one_thread")

CAPTIONS = ["a calm piano melody", "", "loud rock drums with distorted guitar", "soft jazz saxophone"]
V = 300  # text ids of the adapter's layout in these windows (any vocabulary: the teacher never reads them)


def _t5_tokenizer(out: Path) -> None:
    """A small SentencePiece-unigram tokenizer of T5's conventions (<pad> 0, </s> 1 appended, <unk> 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    tok.train_from_iterator([c for c in CAPTIONS if c] * 10 + ["a bright string quartet", "slow ambient pads"], trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(out)


@pytest.fixture(scope="module")
def composite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, MusicgenForConditionalGeneration]:
    """A tiny musicgen-small-layout checkpoint written by transformers' own composite (T5 32 wide, decoder 64: so it
    has an enc_to_dec_proj), with trained-looking (non-zero, random) weights everywhere."""
    out = tmp_path_factory.mktemp("composite")
    t5 = T5Config(vocab_size=120, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, feed_forward_proj="relu")
    base = musicgen_small_layout_config(tiny_musicgen_decoder_config().to_dict(), t5.to_dict())
    cfg = MusicgenConfig(text_encoder=t5.to_dict(), audio_encoder=base.audio_encoder.to_dict(), decoder=base.decoder)
    torch.manual_seed(0)
    model = MusicgenForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # cross-attention weights are random already; make the projection's bias matter too
        model.enc_to_dec_proj.bias.normal_(0.0, 0.5)
    model.save_pretrained(out)
    _t5_tokenizer(out)
    return out, model


def _windows(seed: int = 0) -> tuple[list, ExampleSpec]:
    """The learning check's eval windows of 4 clips (different lengths: one shorter than the audio budget)."""
    rng = np.random.default_rng(seed)
    vocab = AudioVocab(text_vocab_size=V, n_codebooks=4, codebook_size=2048)
    spec = ExampleSpec(
        vocab=vocab, pattern="delay", text="caption", bos_id=1, pad_id=2, max_seq_len=48, max_caption_tokens=8
    )
    clips = [
        Clip(f"c{i}", CAPTIONS[i], (), rng.integers(0, 2048, size=(t, 4)).astype(np.int16))
        for i, t in enumerate([60, 9, 40, 25])
    ]
    examples = [eval_example(spec, [5 + i, 6, 7][: 1 + i % 3], c) for i, c in enumerate(clips)]
    return examples, spec


def test_teacher_ce_equals_transformers_composite_loss(composite) -> None:
    """Per codebook, the mean of the teacher's per-target CE equals MusicgenForConditionalGeneration's own loss (its
    decoder's: the mean over codebooks of each codebook's mean CE) on the same windows, captions as its tokenizer
    reads them, the empty caption as a zero attention mask (the composite multiplies the states by it)."""
    path, reference = composite
    teacher = load_musicgen_teacher(path)
    examples, spec = _windows()
    batch = collate(examples, pad_id=spec.pad_id)
    states, mask = teacher.condition(CAPTIONS, "cpu")
    ce = music_lm_ce_per_target(
        teacher.decoder, batch, spec.vocab, encoder_hidden_states=states, encoder_attention_mask=mask
    )
    input_ids, labels, _ = music_lm_view(batch, spec.vocab, bos_id=2048, pad_id=2048)
    scored = labels != IGNORE_INDEX  # [B, A, K]
    enc = teacher.tokenizer(CAPTIONS, padding=True, return_tensors="pt")
    ref_mask = enc["attention_mask"].clone()
    ref_mask[1] = 0  # the empty caption: the composite's own null
    with torch.no_grad():
        out = reference(
            input_ids=enc["input_ids"],
            attention_mask=ref_mask,
            decoder_input_ids=input_ids,
            labels=labels.masked_fill(labels == IGNORE_INDEX, 2048),  # its loss skips labels equal to its pad id
        )
    # our per-target CEs back in the batch layout: per codebook k, the mean over that codebook's code targets
    pos_labels = batch.labels - V - torch.arange(4) * 2048  # [B, S, K] local code ids where slot k holds codebook k
    is_target = (batch.labels != IGNORE_INDEX) & (pos_labels >= 0) & (pos_labels < 2048)
    per_codebook = torch.stack([ce[..., k][is_target[..., k]].mean() for k in range(4)])
    assert int(is_target.sum()) == int(scored.sum())
    torch.testing.assert_close(per_codebook.mean(), out.loss, rtol=1e-5, atol=1e-5)


def test_empty_caption_is_the_exact_null(composite) -> None:
    """An empty caption's row equals MusicGen with no encoder states at all (its unconditional decoder), and a real
    caption changes the CE (the teacher reads it)."""
    path, _ = composite
    teacher = load_musicgen_teacher(path)
    examples, spec = _windows(seed=1)
    batch = collate(examples, pad_id=spec.pad_id)
    states, mask = teacher.condition(["", "", "", ""], "cpu")
    assert not mask.any() and not states.any()
    null = music_lm_ce_per_target(
        teacher.decoder, batch, spec.vocab, encoder_hidden_states=states, encoder_attention_mask=mask
    )
    alone = music_lm_ce_per_target(teacher.decoder, batch, spec.vocab)
    torch.testing.assert_close(null, alone, rtol=1e-5, atol=1e-6)
    states, mask = teacher.condition(CAPTIONS, "cpu")
    read = music_lm_ce_per_target(
        teacher.decoder, batch, spec.vocab, encoder_hidden_states=states, encoder_attention_mask=mask
    )
    assert (read - alone).abs()[0].max() > 1e-3  # clip 0's caption moves its CE
    torch.testing.assert_close(read[1], alone[1], rtol=1e-5, atol=1e-6)  # clip 1's caption is empty


def test_loader_builds_no_codec_and_takes_parts_only(composite, tmp_path: Path) -> None:
    path, reference = composite
    teacher = load_musicgen_teacher(path)
    assert not any(
        type(m).__name__.startswith("Encodec")
        for part in (teacher.decoder, teacher.text_encoder)
        for m in part.modules()
    )
    for name, p in reference.text_encoder.state_dict().items():
        torch.testing.assert_close(teacher.text_encoder.state_dict()[name], p)
    torch.testing.assert_close(teacher.enc_to_dec_proj.weight, reference.enc_to_dec_proj.weight)
    torch.testing.assert_close(teacher.enc_to_dec_proj.bias, reference.enc_to_dec_proj.bias)
    assert not any(p.requires_grad for p in teacher.text_encoder.parameters())


def test_decoder_only_checkpoint_has_no_teacher(tmp_path: Path) -> None:
    MusicgenForCausalLM(tiny_musicgen_decoder_config()).save_pretrained(tmp_path / "dec")
    with pytest.raises(TeacherUnavailable, match=r"without a text encoder.*trainer.eval_teacher=false"):
        load_musicgen_teacher(tmp_path / "dec")
    assert isinstance(load_musicgen_decoder(tmp_path / "dec"), MusicgenForCausalLM)


def _target_ce(per_clip: np.ndarray, n: np.ndarray) -> TargetCE:
    return TargetCE(np.array([(per_clip * n).sum()]), np.array([n.sum()]), per_clip * n, n)


def test_report_and_block_carry_the_teacher() -> None:
    """Adapter 2.0 with true captions, 2.1 shuffled; teacher 1.9 true, 2.3 shuffled: the adapter is 0.1 nats per code
    ABOVE the teacher (worse), the teacher's caption gain (0.4) is larger than the adapter's (0.1)."""
    n = np.full(40, 50)
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.01, 40)
    r = make_report(
        step=3,
        model_true=_target_ce(2.0 + noise, n),
        model_shuf=_target_ce(2.1 + noise, n),
        unigram=_target_ce(np.full(40, 3.0), n),
        end_ce_sum=0.0,
        end_count=0,
        n_bootstrap=200,
        seed=0,
        music_lm=_target_ce(np.full(40, 2.2), n),
        teacher=(_target_ce(1.9 + noise, n), _target_ce(2.3 + noise, n)),
    )
    s = learning_check_summary(r)
    assert math.isclose(s["music_lm_text_ce"], 1.9, abs_tol=0.01) and math.isclose(
        s["music_lm_text_ce_shuffled"], 2.3, abs_tol=0.01
    )
    assert math.isclose(s["gain_over_teacher"], -0.1, abs_tol=1e-6) and s["gain_over_teacher_ci95"][1] < 0
    assert math.isclose(s["teacher_caption_gain"], 0.4, abs_tol=1e-6)
    assert math.isclose(s["music_lm_ce"], 2.2, abs_tol=1e-6)
    text = learning_check_text(r)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("  vs MusicGen")]
    assert "null 2.2000: adapter's gain +0.2" in line and f"teacher {r.music_lm_text_ce:.4f}" in line
    assert "adapter's gain -0.1000 [-0.1000, -0.1000], CE above the teacher's; caption gain below its" in line
    assert "caption gain +0.4000" in line and "caption gain +0.1000" in line
