"""The demo MusicGen's T5 encoder pretraining (demo/t5_pretrain.py, `demo_models --t5-pretrain-steps`): T5's span
corruption, a held-out slice scored before and after, determinism, steps 0 as the random init, the record."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import T5EncoderModel

from adapter_trainer import demo_models
from adapter_trainer.demo.models import PRETRAINING_JSON, _t5_training, write_musicgen
from adapter_trainer.demo.t5_pretrain import T5PretrainConfig, pretrain_t5_encoder, span_corrupt
from adapter_trainer.demo.text_encoder import FALLBACK_TEXTS, tiny_t5_encoder_config, train_t5_tokenizer
from adapter_trainer.model.teacher import load_musicgen_teacher

pytestmark = pytest.mark.usefixtures("one_thread")
CAPTIONS = list(FALLBACK_TEXTS) + [
    "A solo violin plays a sad slow melody over a soft string pad.",
    "Heavy metal with fast double kick drums, growling vocals and a shredding guitar solo.",
    "A cheerful ukulele strums over hand claps and whistling.",
    "Reggae: offbeat guitar skanks, a deep bass line and a laid back male voice.",
]
SMALL = {"steps": 24, "batch_size": 4, "warmup_steps": 4, "heldout": 4}
SENTINELS = list(range(999, 899, -1))  # stand-ins for <extra_id_0> ... <extra_id_99>


def _encoder(tok, seed: int = 2) -> T5EncoderModel:
    torch.manual_seed(seed)
    return T5EncoderModel(tiny_t5_encoder_config(len(tok))).eval().requires_grad_(False)


def test_span_corruption_hides_about_15_percent_in_sentinel_spans_and_the_target_restores_them() -> None:
    ids = list(range(10, 70))  # 60 tokens
    inp, tgt = span_corrupt(ids, SENTINELS, 1, T5PretrainConfig(), torch.Generator().manual_seed(0))
    assert inp[-1] == 1 and tgt[-1] == 1 and 1 not in inp[:-1] + tgt[:-1]
    used = [t for t in inp if t in SENTINELS]
    assert used == SENTINELS[: len(used)] == [t for t in tgt if t in SENTINELS] and len(used) == 3  # 9 noise / 3
    assert tgt[0] == SENTINELS[0] and inp[0] not in SENTINELS  # a target opens with a sentinel; kept run first
    spans, k = {}, None
    for t in tgt[:-1]:
        k = t if t in SENTINELS else k
        if t not in SENTINELS:
            spans.setdefault(k, []).append(t)
    restored = [x for t in inp[:-1] for x in (spans[t] if t in SENTINELS else [t])]
    assert restored == ids and sum(map(len, spans.values())) == 9  # round(60 * 0.15)
    again = span_corrupt(ids, SENTINELS, 1, T5PretrainConfig(), torch.Generator().manual_seed(0))
    other = span_corrupt(ids, SENTINELS, 1, T5PretrainConfig(), torch.Generator().manual_seed(1))
    assert again == (inp, tgt) and other != (inp, tgt)
    one, two = (span_corrupt(s, SENTINELS, 1, T5PretrainConfig(), torch.Generator()) for s in ([5], [5, 6]))
    assert one == ([SENTINELS[0], 1], [SENTINELS[0], 5, 1]) and len(two[1]) == 3  # short captions still corrupt


def test_pretraining_lowers_the_held_out_loss_deterministically() -> None:
    tok = train_t5_tokenizer(CAPTIONS)
    runs = []
    for seed in (0, 0, 1):
        enc = _encoder(tok)
        init = {k: v.clone() for k, v in enc.state_dict().items()}
        report = pretrain_t5_encoder(enc, tok, CAPTIONS, T5PretrainConfig(**SMALL, seed=seed), progress=False)
        runs.append((enc.state_dict(), report))
    (a, rep), (b, rep_again), (c, _) = runs
    assert rep.n_heldout == 3 and rep.n_captions == len(CAPTIONS) - 3  # heldout 4, capped at a quarter
    assert rep.heldout_loss < rep.heldout_loss_init - 0.5 and rep.final_loss < rep.first_loss
    assert rep == rep_again and all(torch.equal(a[k], b[k]) for k in a)  # same seed, same weights
    assert not torch.equal(
        a["encoder.block.0.layer.0.SelfAttention.q.weight"], c["encoder.block.0.layer.0.SelfAttention.q.weight"]
    )
    assert not torch.equal(a["shared.weight"], init["shared.weight"])
    assert all(not p.requires_grad for p in enc.parameters()) and not enc.training


def test_steps_zero_keeps_today_s_random_encoder_and_a_step_changes_it(tmp_path: Path) -> None:
    random = write_musicgen(tmp_path / "r", seed=0, texts=CAPTIONS, t5_pretrain=T5PretrainConfig(steps=0))
    assert not (random / PRETRAINING_JSON).exists()
    tok = train_t5_tokenizer(CAPTIONS)
    today = _encoder(tok).state_dict()  # build_text_path's init: seed + 2
    loaded = load_musicgen_teacher(random).text_encoder.state_dict()
    assert all(torch.equal(loaded[k], today[k]) for k in today)
    cfg = T5PretrainConfig(**{**SMALL, "steps": 2})
    trained = write_musicgen(tmp_path / "t", seed=0, texts=CAPTIONS, t5_pretrain=cfg)
    record = json.loads((trained / PRETRAINING_JSON).read_text())["text_encoder"]
    assert record["t5_weights"] == "pretrained by span corruption (T5's objective) on 9 captions, then frozen"
    assert record["pretraining"]["config"] == asdict(cfg)
    assert record["pretraining"]["report"]["n_captions"] == len(CAPTIONS) - 3
    teacher = load_musicgen_teacher(trained)
    assert not torch.equal(teacher.text_encoder.shared.weight, loaded["shared.weight"])
    assert not teacher.text_encoder.training and not teacher.text_encoder.shared.weight.requires_grad
    words = _t5_training(trained)  # what write_demo_models' README says of the T5
    assert words.startswith("pretrained by span corruption, T5's own objective, on the captions the LLM pretrains on")
    assert "(9 trained on, 3 held out), 2 steps of 4" in words and "on the 3 held-out captions" in words
    assert _t5_training(random) == "random init and frozen (musicgen-small froze its pretrained T5)"


@pytest.mark.parametrize("steps", [-1, -20])
def test_negative_steps_are_one_clear_error(steps: int, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ValueError, match=rf"T5PretrainConfig.steps={steps} must be >= 0 \(e.g. --t5-pretrain-steps"):
        T5PretrainConfig(steps=steps)
    with pytest.raises(SystemExit) as exit_info:
        demo_models.main(["--out", str(tmp_path / "m"), "--t5-pretrain-steps", str(steps)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and err[-1].endswith(
        f"T5PretrainConfig.steps={steps} must be >= 0 (e.g. --t5-pretrain-steps 225)"
    )
    assert not (tmp_path / "m").exists()
