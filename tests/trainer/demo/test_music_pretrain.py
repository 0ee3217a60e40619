"""The demo MusicGen's pretraining (demo/music_pretrain.py, `demo_models --shards`): MusicGen's own pattern and loss,
conditioned on each clip's caption through its own text path with condition dropout to MusicGen's null, the train
split only, a record of what it was trained on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import MusicgenForCausalLM

from adapter_trainer.data.samples import Clip
from adapter_trainer.demo.models import PRETRAINING_JSON, read_music_training_set, write_demo_models
from adapter_trainer.demo.music_pretrain import (
    CaptionStates,
    MusicPretrainConfig,
    delay_pattern_windows,
    held_out_ce,
    music_lm_loss,
    pretrain_music_lm,
)
from adapter_trainer.demo.text_encoder import build_text_path
from adapter_trainer.model.builders import load_musicgen_decoder, tiny_musicgen_decoder_config
from adapter_trainer.model.teacher import MusicgenTeacher, load_musicgen_teacher
from tests import REPO

pytestmark = pytest.mark.usefixtures("one_thread")
K, C = 4, 2048


def tiny_musicgen(seed: int = 0) -> MusicgenForCausalLM:
    torch.manual_seed(seed)
    return MusicgenForCausalLM(tiny_musicgen_decoder_config())


def markov_clips(n: int, frames: int, seed: int, prefix: str = "c") -> list[Clip]:
    """Clips whose codes follow a rule MusicGen can learn: each codebook counts up by its own step from a random start."""
    rng = np.random.default_rng(seed)
    clips = []
    for i in range(n):
        start = rng.integers(0, 64, K)
        codes = (start[None, :] + np.arange(frames)[:, None] * np.arange(1, K + 1)[None, :]) % 64  # [T, K]
        clips.append(Clip(key=f"{prefix}{i}", caption="", aspects=(), codes=codes.astype(np.int16)))
    return clips


GENRES = (
    "a calm solo piano ballad",
    "loud electric guitar rock",
    "upbeat electronic dance music",
    "a sad string quartet",
)


def genre_clips(n: int, frames: int, seed: int, prefix: str) -> list[Clip]:
    """Clips whose codes only the caption tells: each genre draws every code from its own 8 of 32 codes."""
    rng = np.random.default_rng(seed)
    clips = []
    for i in range(n):
        g = int(rng.integers(len(GENRES)))
        codes = g * 8 + rng.integers(0, 8, (frames, K))  # [T, K]
        clips.append(Clip(key=f"{prefix}{i}", caption=GENRES[g], aspects=(), codes=codes.astype(np.int16)))
    return clips


def conditional_musicgen(seed: int = 0) -> MusicgenTeacher:
    return build_text_path(tiny_musicgen(seed), seed)


def test_windows_are_build_delay_pattern_mask_and_the_loss_is_musicgens() -> None:
    mg = tiny_musicgen()
    rng = np.random.default_rng(0)
    windows = [rng.integers(0, C, (T, K)) for T in (5, 9, 7)]
    input_ids, labels = delay_pattern_windows(mg, windows)  # [B*K, S], [B, S, K]
    S = 9 + K - 1
    assert input_ids.shape == (3 * K, S) and labels.shape == (3, S, K)
    pad, bos = mg.config.pad_token_id, mg.config.bos_token_id
    for b, w in enumerate(windows):
        T = w.shape[0]
        rows = input_ids.reshape(3, K, S)[b]  # [K, S]
        assert (rows[:, 0] == bos).all()  # position 0: BOS in every codebook
        for k in range(K):
            n_in = min(T, S - 1 - k)  # inputs stop one position early: the longest window's last code is a label only
            assert torch.equal(rows[k, 1 + k : 1 + k + n_in], torch.from_numpy(w[:n_in, k]))  # delayed by k + 1
            assert (rows[k, 1 : 1 + k] == pad).all()
            # labels are the next position of the same pattern: the codes, delayed by k, then pad
            assert torch.equal(labels[b, k : k + T, k], torch.from_numpy(w[:, k]))
            assert (labels[b, :k, k] == pad).all() and (labels[b, k + T :, k] == pad).all()
    with torch.no_grad():
        ours = music_lm_loss(mg, input_ids, labels)
        theirs = mg(input_ids=input_ids, labels=labels).loss
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    teacher = build_text_path(mg, 0)
    with torch.no_grad():  # conditioned: the same loss as transformers' with the encoder states passed
        teacher.enc_to_dec_proj.weight.mul_(25.0)  # a projection as large as a trained one
        states, mask = teacher.condition([*GENRES[:2], ""], "cpu")
        ours = music_lm_loss(mg, input_ids, labels, states, mask)
        theirs = mg(input_ids=input_ids, labels=labels, encoder_hidden_states=states, encoder_attention_mask=mask)
        blind = music_lm_loss(mg, input_ids, labels)
    torch.testing.assert_close(ours, theirs.loss, rtol=1e-5, atol=1e-6)
    assert abs(float(ours) - float(blind)) > 1e-3  # the condition reached the loss


def test_training_conditions_exactly_as_the_teacher_does() -> None:
    """The step's conditioning (T5 states computed once per caption, padded per batch, projected) equals
    `MusicgenTeacher.condition` on the same captions; a dropped row is the null, as an empty caption is."""
    teacher = conditional_musicgen()
    texts = [GENRES[0], GENRES[2], "", GENRES[0]]
    cache = CaptionStates(teacher, texts)
    assert set(cache.states) == {GENRES[0], GENRES[2], ""} and cache.states[""] is None
    with torch.no_grad():
        ours = teacher.project(*cache.batch(texts, [True] * 4))
        theirs = teacher.condition(texts, "cpu")
        dropped = teacher.project(*cache.batch(texts, [True, False, True, True]))
        nulled = teacher.condition([GENRES[0], "", "", GENRES[0]], "cpu")
    for a, b in ((ours, theirs), (dropped, nulled)):
        assert a[0].shape == b[0].shape  # padded to the longest caption, as the tokenizer pads a batch
        torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-6)
        assert torch.equal(a[1], b[1])
    assert (dropped[1][1] == 0).all() and (dropped[0][1] == 0).all()
    assert ours[1][1].sum() > 0 and ours[0][1].abs().sum() > 0


def test_conditional_pretraining_reads_captions_and_keeps_a_null() -> None:
    """On clips whose codes only their caption tells, held-out CE with the true captions falls well below CE under
    the null condition; the null itself was trained (condition dropout), far below the untrained model's."""
    train, held = genre_clips(64, 6, seed=0, prefix="t"), genre_clips(16, 6, seed=1, prefix="e")
    teacher = conditional_musicgen()
    proj0 = teacher.enc_to_dec_proj.weight.detach().clone()
    t5_0 = {k: v.clone() for k, v in teacher.text_encoder.state_dict().items()}
    before = held_out_ce(teacher.decoder, held, 8, teacher=teacher, null=True)
    cfg = MusicPretrainConfig(steps=80, batch_size=8, max_frames=8, lr=1e-2, warmup_steps=5, seed=0)
    report = pretrain_music_lm(teacher.decoder, train, cfg, teacher=teacher, eval_clips=held, progress=False)
    assert report.conditional and report.n_captions == 4
    # measured 2.65 with captions vs 3.71 under the null (optimum ln 8 = 2.08 vs ln 32 = 3.47 for a first frame)
    assert report.eval_ce < report.eval_ce_null - 0.5, report
    assert report.eval_ce_null < before - 3.0, (before, report)
    assert not torch.equal(teacher.enc_to_dec_proj.weight, proj0)  # the projection is trained ...
    assert all(torch.equal(v, t5_0[k]) for k, v in teacher.text_encoder.state_dict().items())  # ... T5 frozen


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_condition_dropout_gives_the_null_at_its_rate(rate: float, monkeypatch: pytest.MonkeyPatch) -> None:
    teacher = conditional_musicgen()
    rows: list[bool] = []  # per training row: did it see the null (mask 0 everywhere)?
    project = MusicgenTeacher.project

    def spy(self, states, mask):
        rows.extend((mask.sum(1) == 0).tolist())
        return project(self, states, mask)

    monkeypatch.setattr(MusicgenTeacher, "project", spy)
    cfg = MusicPretrainConfig(steps=30, batch_size=8, max_frames=4, warmup_steps=1, cond_dropout=rate)
    pretrain_music_lm(teacher.decoder, genre_clips(16, 4, 0, "t"), cfg, teacher=teacher, progress=False)
    assert len(rows) == 240
    assert abs(sum(rows) / len(rows) - rate) < 0.1, sum(rows)


def test_pretraining_with_a_foreign_teacher_is_refused() -> None:
    with pytest.raises(ValueError, match="teacher's decoder must be the model"):
        pretrain_music_lm(
            tiny_musicgen(), genre_clips(2, 4, 0, "t"), MusicPretrainConfig(steps=1), teacher=conditional_musicgen()
        )


def test_pretraining_learns_and_is_deterministic() -> None:
    train, held = markov_clips(32, 24, seed=0), markov_clips(8, 24, seed=1, prefix="e")
    cfg = MusicPretrainConfig(steps=60, batch_size=8, max_frames=16, lr=1e-2, warmup_steps=5, seed=3)
    a, b = tiny_musicgen(), tiny_musicgen()
    before = held_out_ce(a, held, cfg.max_frames)
    ra = pretrain_music_lm(a, train, cfg, eval_clips=held, eval_split="eval", progress=False)
    rb = pretrain_music_lm(b, train, cfg, eval_clips=held, eval_split="eval", progress=False)
    assert ra == rb
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert (ra.n_clips, ra.n_frames, ra.eval_clips) == (32, 32 * 24, 8)
    # the rule is learnt: held-out CE falls far below the untrained model's (~ln 2048 = 7.6)
    assert before > 7.0 and ra.eval_ce < before - 2.0, (before, ra.eval_ce)
    assert ra.final_loss < ra.first_loss - 2.0


def test_codes_outside_the_codebook_are_refused() -> None:
    bad = Clip(key="x1", caption="", aspects=(), codes=np.full((4, K), C, dtype=np.int16))
    with pytest.raises(ValueError, match="x1.*outside 0..2047"):
        pretrain_music_lm(tiny_musicgen(), [bad], MusicPretrainConfig(steps=1), progress=False)


def test_demo_models_pretrain_musicgen_on_the_train_split_only(tmp_path: Path) -> None:
    from tests.contract.shard_fixture import write_synthetic_set

    shards = write_synthetic_set(tmp_path / "set", n_train=12, n_eval=5, frames=(20, 30))
    music = read_music_training_set(shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    train_keys = {c.key for c in music.train}
    assert len(train_keys) == 12 and not train_keys & {c.key for c in music.eval}
    assert sum(s["n_samples"] for s in manifest["splits"]["train"]["shards"]) == 12
    cfg = MusicPretrainConfig(steps=4, batch_size=4, max_frames=16)
    paths = write_demo_models(tmp_path / "models", seed=0, shards=shards, music_pretrain=cfg)
    record = json.loads((paths["musicgen"] / PRETRAINING_JSON).read_text())
    assert record["report"]["n_clips"] == 12 and record["report"]["split"] == "train"
    assert record["report"]["eval_clips"] == 5 and record["report"]["eval_split"] == "eval"
    assert record["report"]["conditional"] and record["report"]["n_captions"] == len({c.caption for c in music.train})
    assert np.isfinite(record["report"]["eval_ce"]) and np.isfinite(record["report"]["eval_ce_null"])
    assert record["manifest_sha256"] == music.manifest_sha256 and record["config"]["steps"] == 4
    assert record["config"]["cond_dropout"] == 0.3 and record["text_encoder"]["t5_weights"] == "random init, frozen"
    readme = (tmp_path / "models" / "README.md").read_text()
    assert "Trained conditionally, as musicgen-small was, on the codes and captions of the 12 `train` clips" in readme
    assert "condition dropout 0.3" in readme and "with the null condition" in readme
    trained = load_musicgen_teacher(paths["musicgen"])
    random = load_musicgen_teacher(write_demo_models(tmp_path / "random", seed=0)["musicgen"])
    assert not torch.equal(trained.decoder.lm_heads[0].weight, random.decoder.lm_heads[0].weight)
    assert not torch.equal(trained.enc_to_dec_proj.weight, random.enc_to_dec_proj.weight)
    assert all(
        torch.equal(v, random.text_encoder.state_dict()[k]) for k, v in trained.text_encoder.state_dict().items()
    )
    assert torch.equal(load_musicgen_decoder(paths["musicgen"]).lm_heads[0].weight, trained.decoder.lm_heads[0].weight)
    assert not (paths["musicgen"].parent / "random").exists()


def test_a_shard_set_of_another_codec_is_refused(tmp_path: Path) -> None:
    from tests.contract.shard_fixture import write_synthetic_set

    shards = write_synthetic_set(tmp_path / "set", n_train=2, n_eval=1, codebook_size=1024)
    with pytest.raises(ValueError, match="demo MusicGen reads 4 x 2048"):
        read_music_training_set(shards)


def test_cli_without_a_shard_set_names_the_fix(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "adapter_trainer.demo_models", "--out", str(tmp_path / "m"), "--shards", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 2 and "make demo-shards" in out.stderr


@pytest.mark.parametrize("frames", [1, 2, 3])
def test_clips_shorter_than_the_delay_train_and_score(frames: int) -> None:
    """build_delay_pattern_mask returns no pattern below 2K - 1 positions: clips of 1..K-1 frames still work."""
    clips = markov_clips(4, frames, seed=0)
    mg = tiny_musicgen()
    input_ids, labels = delay_pattern_windows(mg, [c.codes for c in clips])
    assert labels.shape == (4, frames + K - 1, K) and int((labels != mg.config.pad_token_id).sum()) == 4 * frames * K
    report = pretrain_music_lm(mg, clips, MusicPretrainConfig(steps=2, batch_size=2, max_frames=8), eval_clips=clips)
    assert np.isfinite(report.eval_ce)


@pytest.mark.parametrize("field", ["steps", "warmup_steps", "batch_size", "max_frames"])
def test_a_zero_setting_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=f"MusicPretrainConfig.{field}=0 must be >= 1"):
        MusicPretrainConfig(**{field: 0})


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_a_condition_dropout_outside_0_1_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match=r"cond_dropout=.* must be in \[0, 1\)"):
        MusicPretrainConfig(cond_dropout=rate)
