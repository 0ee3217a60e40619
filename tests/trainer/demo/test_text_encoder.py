"""The demo MusicGen's own text path (demo/text_encoder.py): a T5-kind tokenizer trained offline, a tiny frozen T5
and `enc_to_dec_proj`, saved in facebook/musicgen-small's layout and read exactly as transformers' composite reads
them."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, MusicgenForConditionalGeneration, T5Tokenizer

from adapter_trainer.demo.models import write_musicgen
from adapter_trainer.demo.pretrain import read_captions
from adapter_trainer.demo.text_encoder import (
    FALLBACK_TEXTS,
    REQUIRED_CHAR_STEP,
    T5_EXTRA_IDS,
    T5_VOCAB_PIECES,
    _canonical_required_chars,
    train_t5_tokenizer,
)
from adapter_trainer.model.builders import load_musicgen_decoder
from adapter_trainer.model.teacher import load_musicgen_teacher
from tests import REPO

pytestmark = pytest.mark.usefixtures("one_thread")
K = 4
CAPTIONS = ["A calm solo piano piece with soft reverb.", "Loud rock: distorted electric guitars and fast drums!"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_musicgen(tmp_path_factory.mktemp("mg"), seed=0)


def _copy(folder: Path, to: Path) -> Path:
    to.mkdir()
    for f in folder.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    return to


def test_tokenizer_follows_t5_conventions_and_loads_with_auto_tokenizer(folder: Path) -> None:
    tok = AutoTokenizer.from_pretrained(folder)
    assert isinstance(tok, T5Tokenizer)
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "</s>", "<unk>"]
    cfg = json.loads((folder / "config.json").read_text())
    assert len(tok) == cfg["text_encoder"]["vocab_size"] == len(train_t5_tokenizer(FALLBACK_TEXTS))
    ids = tok(CAPTIONS[0])["input_ids"]
    assert ids[-1] == 1 and 1 not in ids[:-1] and 2 not in ids  # </s> closes the text; every character is known
    pieces = tok.convert_ids_to_tokens(ids[:-1])
    assert pieces[0].startswith("▁") and sum(p.startswith("▁") for p in pieces) == len(CAPTIONS[0].split())
    assert tok.decode(ids, skip_special_tokens=True) == CAPTIONS[0]
    assert tok("")["input_ids"] == [1]
    assert 2 in tok("ほ")["input_ids"]  # a character never seen in training is <unk> (no byte fallback, as in T5)
    batch = tok(CAPTIONS, padding=True)
    short = batch["attention_mask"][0]
    assert batch["input_ids"][0][sum(short) :] == [0] * (len(short) - sum(short))  # right-padded with <pad>


def test_the_sentinels_are_t5_s_100_extra_ids_on_top_and_survive_a_save(folder: Path) -> None:
    """As in t5-base: `<extra_id_0>` is the last id, `<extra_id_99>` the first above the trained pieces; they are
    special tokens and never change a caption's ids."""
    tok = AutoTokenizer.from_pretrained(folder)
    n = len(tok)
    assert T5_EXTRA_IDS == 100 and tok.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_99>"]) == [n - 1, n - 100]
    assert tok.convert_ids_to_tokens(list(range(n - 100, n))) == [f"<extra_id_{i}>" for i in range(99, -1, -1)]
    assert max(i for t in FALLBACK_TEXTS for i in tok(t)["input_ids"]) < n - 100  # captions use the pieces below
    ids = tok(f"{CAPTIONS[0]} <extra_id_3>")["input_ids"]
    assert ids[-2:] == [n - 4, 1] and ids[:-2] == tok(CAPTIONS[0])["input_ids"][:-1]
    assert tok.decode(ids, skip_special_tokens=True) == CAPTIONS[0]
    fresh = train_t5_tokenizer(FALLBACK_TEXTS)
    assert fresh.get_vocab() == tok.get_vocab() and fresh.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


def test_tokenizer_trained_on_musiccaps_captions_is_the_same_every_time() -> None:
    """tokenizers' UnigramTrainer gives different ids run to run on this text (scores differ in their last bits and
    the characters it adds come in hash order); the canonical form makes them equal."""
    captions, _ = read_captions(REPO / "data" / "musiccaps" / "musiccaps-public.csv", None)
    a, b = train_t5_tokenizer(captions), train_t5_tokenizer(captions)
    assert len(a) == T5_VOCAB_PIECES + T5_EXTRA_IDS
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    ids = a(captions[0])["input_ids"]
    assert 2 not in ids and len(ids) < len(captions[0].split()) * 2  # mostly whole words


def test_the_characters_the_trainer_adds_get_scores_in_character_order() -> None:
    low = -14.0
    block = {c: low + k * REQUIRED_CHAR_STEP for k, c in enumerate("QZA7")}  # as the trainer adds them: hash order
    scores = {"▁piano": -3.0, "s": -5.0, "▁tense": low, **block}
    out = _canonical_required_chars(scores)
    assert [out[c] for c in "7AQZ"] == [low + k * REQUIRED_CHAR_STEP for k in range(4)]
    assert {p: out[p] for p in ("▁piano", "s", "▁tense")} == {"▁piano": -3.0, "s": -5.0, "▁tense": low}
    shuffled = list(block)
    random.Random(0).shuffle(shuffled)
    again = {"▁piano": -3.0, "s": -5.0, "▁tense": low} | {
        c: low + k * REQUIRED_CHAR_STEP for k, c in enumerate(shuffled)
    }
    assert _canonical_required_chars(again) == out


def test_folder_holds_what_musicgen_small_s_composite_stores_and_no_codec(folder: Path, caplog) -> None:
    saved = load_file(str(folder / "model.safetensors"))
    assert {k.split(".")[0] for k in saved} == {"decoder", "text_encoder", "enc_to_dec_proj"}
    assert "text_encoder.shared.weight" in saved and saved["enc_to_dec_proj.weight"].shape == (64, 128)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["text_encoder"]["model_type"] == "t5" and cfg["text_encoder"]["d_model"] == 128
    assert cfg["decoder"]["hidden_size"] == 64 and cfg["audio_encoder"]["model_type"] == "encodec"
    _, info = MusicgenForConditionalGeneration.from_pretrained(folder, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    missing = set(info["missing_keys"])
    assert missing and all(k.startswith("audio_encoder.") for k in missing), sorted(missing)[:8]


def test_teacher_condition_and_logits_equal_transformers_composite(folder: Path, tmp_path: Path) -> None:
    """The folder's teacher (model/teacher.py) conditions and predicts exactly as transformers'
    MusicgenForConditionalGeneration built from the same folder: true captions through its text path, an empty
    caption as `get_unconditional_inputs`."""
    big = _copy(folder, tmp_path / "big-proj")  # a projection as large as a trained one: a wrong text path shows
    state = load_file(str(big / "model.safetensors"))
    state["enc_to_dec_proj.weight"] = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * 0.5
    save_file(state, str(big / "model.safetensors"), metadata={"format": "pt"})
    comp = MusicgenForConditionalGeneration.from_pretrained(big).eval()
    teacher = load_musicgen_teacher(big)
    texts = [*CAPTIONS, ""]
    rng = np.random.default_rng(0)
    codes = torch.from_numpy(rng.integers(0, 2048, (len(texts) * K, 9)))  # [B*K, S] decoder inputs
    with torch.no_grad():
        states, mask = teacher.condition(texts, "cpu")
        ours = teacher.decoder(input_ids=codes, encoder_hidden_states=states, encoder_attention_mask=mask).logits
        enc = teacher.tokenizer(CAPTIONS, padding=True, return_tensors="pt")
        theirs = comp(**enc, decoder_input_ids=codes[: 2 * K]).logits  # [2K, S, C]
        null = comp(**comp.get_unconditional_inputs(num_samples=1), decoder_input_ids=codes[2 * K :]).logits
    torch.testing.assert_close(ours[: 2 * K], theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[2 * K :], null, rtol=1e-5, atol=1e-5)
    assert (mask[2] == 0).all() and (states[2] == 0).all()
    with torch.no_grad():  # the captions matter: the first caption's codes under the null predict otherwise
        uncond = comp(**comp.get_unconditional_inputs(num_samples=1), decoder_input_ids=codes[:K]).logits
    assert (uncond - theirs[:K]).abs().max() > 1e-2


def test_loading_the_folder_reports_nothing_unexpected(folder: Path, tmp_path: Path) -> None:
    """The decoder and T5 loaders read past the composite's other parts quietly; a tensor no part expects is still
    reported."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    root = logging.getLogger("transformers")
    root.addHandler(handler)
    try:
        load_musicgen_teacher(folder)
        assert not [r for r in records if "LOAD REPORT" in r.getMessage()], [r.getMessage() for r in records]
        extra = _copy(folder, tmp_path / "extra")
        state = load_file(str(folder / "model.safetensors"))
        state["decoder.model.decoder.stray.weight"] = torch.zeros(2)
        save_file(state, str(extra / "model.safetensors"), metadata={"format": "pt"})
        load_musicgen_decoder(extra)
    finally:
        root.removeHandler(handler)
    reports = [r.getMessage() for r in records if "LOAD REPORT" in r.getMessage()]
    assert len(reports) == 1 and "model.decoder.stray.weight" in reports[0] and "text_encoder" not in reports[0]
