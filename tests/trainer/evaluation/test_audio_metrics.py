"""`python -m adapter_trainer.audio_metrics` on tiny random-weight models of the real classes (ClapModel +
ClapProcessor with a RobertaTokenizer built from a character vocabulary, ASTForAudioClassification +
ASTFeatureExtractor), saved with save_pretrained and loaded by the CLI as local directories.

Checked against hand computations: identical generated and reference sets give FAD 0 and KL 0, a different set
gives more; the reported CLAP cosines equal cosines recomputed from the model's own embeddings; the deranged score
never uses a clip's own caption; pairing by source key; the offline-model and bad-input refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from adapter_trainer.audio_metrics import main
from adapter_trainer.evaluation.audio_metrics import clap_scores, kl_divergence
from adapter_trainer.evaluation.frechet import frechet_distance_of
from tests import REPO
from tests.trainer.evaluation import reference_code

CLAP_SR, CODEC_SR, N_CLIPS = 48_000, 32_000, 6
# the last one is longer than the tiny text model's 62 positions (the CLI truncates to the model's positions)
CAPTIONS = ["a calm piano", "fast drums", "sad violin", "happy guitar", "slow organ", "loud bass " * 10]


def strict(text: str) -> dict:
    def refuse(c: str):
        raise ValueError(f"non-strict JSON constant {c}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny CLAP (48 kHz, 1 s window) and AST (16 kHz, 0.64 s window, 527 labels) directories, seeded."""
    from transformers import (
        ASTConfig,
        ASTFeatureExtractor,
        ASTForAudioClassification,
        ClapConfig,
        ClapFeatureExtractor,
        ClapModel,
        ClapProcessor,
        RobertaTokenizer,
    )
    from transformers.models.clap.configuration_clap import ClapAudioConfig, ClapTextConfig

    root = tmp_path_factory.mktemp("audio_models")
    torch.manual_seed(0)
    vocab = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3, "<mask>": 4}
    for ch in "abcdefghijklmnopqrstuvwxyzĠ":  # Ġ: byte-level BPE's space
        vocab[ch] = len(vocab)
    tokenizer = RobertaTokenizer(vocab=vocab, merges=[])
    text = ClapTextConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    # the Swin input is spec_size x spec_size; freq_ratio = spec_size // num_mel_bins = 4 -> up to 512 frames (5 s)
    audio = ClapAudioConfig(
        num_mel_bins=32,
        spec_size=128,
        patch_size=4,
        patch_stride=(4, 4),
        window_size=4,
        patch_embeds_hidden_size=8,
        hidden_size=16,  # = patch_embeds_hidden_size * 2 ** (len(depths) - 1)
        depths=[1, 1],
        num_heads=[2, 2],
        enable_fusion=False,
    )
    clap = ClapModel(ClapConfig(text_config=text.to_dict(), audio_config=audio.to_dict(), projection_dim=8))
    extractor = ClapFeatureExtractor(feature_size=32, sampling_rate=CLAP_SR, max_length_s=1, truncation="rand_trunc")
    ClapProcessor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(root / "clap")
    clap.save_pretrained(root / "clap")
    labels = {i: f"label {i}" for i in range(527)}  # AudioSet's label count: the CLI refuses others
    ast_cfg = ASTConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_mel_bins=16,
        max_length=64,
        frequency_stride=10,
        time_stride=10,
        initializer_range=0.5,  # larger random logits: label distributions that differ between inputs
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    ASTForAudioClassification(ast_cfg).save_pretrained(root / "ast")
    ASTFeatureExtractor(num_mel_bins=16, max_length=64).save_pretrained(root / "ast")
    return {"clap": root / "clap", "ast": root / "ast"}


def tones(n: int, seconds: float, seed: int, loud_noise: bool = False) -> list[np.ndarray]:
    """n mono clips at CLAP_SR: sine tones with a little noise, or (loud_noise) mostly noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * CLAP_SR)) / CLAP_SR
    out = []
    for i in range(n):
        if loud_noise:
            out.append(0.8 * rng.uniform(-1, 1, t.size))
        else:
            out.append(0.5 * np.sin(2 * np.pi * (220.0 * (i + 1)) * t) + 0.01 * rng.normal(size=t.size))
    return [w.astype(np.float32) for w in out]


def write_set(root: Path, waves: list[np.ndarray]) -> dict[str, Path]:
    """generated/gen-NNNN-src<i>.wav at 48 kHz, reference/src<i>.wav at 32 kHz (decode's rate: resampled on read),
    captions.jsonl as adapter_trainer.generate writes it."""

    (root / "generated").mkdir(parents=True)
    (root / "reference").mkdir()
    lines = []
    for i, w in enumerate(waves):
        key = f"gen-{i:04d}-src{i}"
        sf.write(root / "generated" / f"{key}.wav", w, CLAP_SR, subtype="FLOAT")
        lines.append(json.dumps({"key": key, "caption": CAPTIONS[i], "source_key": f"src{i}"}))
    (root / "captions.jsonl").write_text("\n".join(lines) + "\n")
    return {"generated": root / "generated", "reference": root / "reference", "captions": root / "captions.jsonl"}


def write_reference(d: Path, waves: list[np.ndarray]) -> None:
    import soxr

    for i, w in enumerate(waves):
        sf.write(d / f"src{i}.wav", soxr.resample(w, CLAP_SR, CODEC_SR, quality="VHQ"), CODEC_SR, subtype="FLOAT")


def cli(models: dict[str, Path], paths: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "--generated",
        str(paths["generated"]),
        "--reference",
        str(paths["reference"]),
        "--captions",
        str(paths["captions"]),
        "--clap",
        str(models["clap"]),
        "--classifier",
        str(models["ast"]),
        "--out",
        str(out),
        "--bootstrap",
        "200",
        *extra,
    ]


def audiocraft_loudness(wave: np.ndarray, sample_rate: int) -> np.ndarray:
    """audiocraft's MusicGen evaluation normalisation (normalize_audio, strategy loudness): its normalize_loudness to
    -14 LUFS, then the clamp to [-1, 1]."""
    normalize_loudness = reference_code.audiocraft()["normalize_loudness"]
    out = normalize_loudness(torch.from_numpy(np.asarray(wave, dtype=np.float32))[None], sample_rate, 14.0)
    return out.clamp(-1, 1)[0].numpy()


def hand_clap_cosines(clap_dir: Path, wav_dir: Path, keys: list[str], captions: list[str]) -> np.ndarray:
    """cos(text, audio) per clip straight from ClapModel, on the wavs normalised by audiocraft's own code (already at
    48 kHz: no resampling involved)."""
    from transformers import ClapModel, ClapProcessor

    model, proc = ClapModel.from_pretrained(clap_dir).eval(), ClapProcessor.from_pretrained(clap_dir)
    waves = [audiocraft_loudness(sf.read(wav_dir / f"{k}.wav", dtype="float32")[0], CLAP_SR) for k in keys]
    with torch.no_grad():
        tok = proc.tokenizer(captions, padding=True, truncation=True, max_length=62, return_tensors="pt")
        t = model.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"]).pooler_output
        a = model.get_audio_features(**proc.feature_extractor(waves, sampling_rate=CLAP_SR, return_tensors="pt"))
        a = a.pooler_output
    t, a = t / t.norm(dim=-1, keepdim=True), a / a.norm(dim=-1, keepdim=True)  # [N, D]
    return (t * a).sum(-1).double().numpy()  # [N]


@pytest.fixture(scope="module")
def identical(models, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[str, Path]]:
    """The real CLI in its own process on a set whose references are the generated clips themselves."""
    root = tmp_path_factory.mktemp("identical")
    waves = tones(N_CLIPS, 0.8, seed=1)  # 0.8 s: under CLAP's 1 s window (no random crop), two AST segments
    paths = write_set(root, waves)
    write_reference(paths["reference"], waves)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "adapter_trainer.audio_metrics", *cli(models, paths, root / "out" / "m.json")]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "adapter_trainer.audio_metrics: 6 generated vs 6 reference clips" in done.stdout
    return strict((root / "out" / "m.json").read_text()), paths


def test_identical_sets_give_fad_and_kl_zero_and_the_report_is_complete(identical) -> None:
    report, _ = identical
    # the references went through 48 -> 32 -> 48 kHz resampling: equal up to the resampler's error
    assert report["fad_clap_clips"] == pytest.approx(0.0, abs=1e-3)
    assert report["kl_classifier"] == pytest.approx(0.0, abs=1e-3)
    assert report["n_generated"] == report["n_reference"] == report["n_kl_pairs"] == N_CLIPS
    assert report["kl_unpaired"] == []
    assert report["models"]["clap_sample_rate"] == CLAP_SR and report["models"]["classifier_sample_rate"] == 16_000
    clip = report["per_clip"][0]
    assert clip["key"] == "gen-0000-src0" and clip["reference_key"] == "src0" and clip["caption"] == CAPTIONS[0]
    assert len(clip["top_labels"]) == 3 and clip["top_labels"][0]["label"].startswith("label ")
    lo, hi = report["clap_score_ci"]["lo"], report["clap_score_ci"]["hi"]
    assert lo <= report["clap_score"] <= hi


def test_reported_clap_cosines_equal_the_hand_computed_ones(identical, models) -> None:
    report, paths = identical
    keys = [c["key"] for c in report["per_clip"]]
    want = hand_clap_cosines(models["clap"], paths["generated"], keys, CAPTIONS)
    got = np.array([c["clap_score"] for c in report["per_clip"]])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert report["clap_score"] == pytest.approx(float(want.mean()), abs=1e-5)
    deranged = np.array([c["clap_score_deranged"] for c in report["per_clip"]])
    assert report["clap_score_deranged"] == pytest.approx(float(deranged.mean()), abs=1e-9)
    assert report["clap_score_minus_deranged"] == pytest.approx(float((got - deranged).mean()), abs=1e-9)


def test_a_different_reference_set_gives_larger_fad_and_kl(identical, models, tmp_path: Path) -> None:
    same, _ = identical
    paths = write_set(tmp_path, tones(N_CLIPS, 0.8, seed=1))
    write_reference(paths["reference"], tones(N_CLIPS, 0.8, seed=2, loud_noise=True))
    assert main(cli(models, paths, tmp_path / "m.json")) == 0
    other = strict((tmp_path / "m.json").read_text())
    assert other["fad_clap_clips"] > same["fad_clap_clips"] + 1e-3
    assert other["kl_classifier"] > same["kl_classifier"] + 1e-3
    # the CLAP score reads only generated clips and captions: unchanged by the references
    assert other["clap_score"] == pytest.approx(same["clap_score"], abs=1e-9)


def test_the_deranged_score_never_uses_a_clips_own_caption() -> None:
    n = 7
    emb = np.eye(n)  # clip i's caption and audio share direction i: own cosine 1, any other caption 0
    own, deranged, perms = clap_scores(emb, emb, n_derangements=20, seed=3)
    np.testing.assert_allclose(own, 1.0)
    np.testing.assert_allclose(deranged, 0.0)  # one own caption in any derangement would make it positive
    assert not np.any(perms == np.arange(n))
    text = np.random.default_rng(4).normal(size=(n, 5))
    audio = np.random.default_rng(5).normal(size=(n, 5))
    _, deranged, perms = clap_scores(text, audio, n_derangements=3, seed=6)
    cos = (text / np.linalg.norm(text, axis=1, keepdims=True)) @ (
        audio / np.linalg.norm(audio, axis=1, keepdims=True)
    ).T
    np.testing.assert_allclose(deranged, np.mean([cos[perms[r], np.arange(n)] for r in range(3)], axis=0))


def test_the_deranged_score_skips_other_clips_with_the_same_caption_text() -> None:
    """generate.captions=file with generate.n above the file's line count cycles the captions: clips 0, 2, 4, 6 share
    one text. A derangement of the clip indices then hands clip 0 the caption of clip 2, its own text: the null
    must compare each clip only with captions whose text differs."""
    from adapter_trainer.evaluation.audio_metrics import AudioMetricsError

    captions = ["a calm piano", "fast drums"] * 4
    emb = np.eye(2)[[i % 2 for i in range(8)]]  # [8, 2]: a caption's text and its clips' audio share a direction
    own, deranged, _ = clap_scores(emb, emb, n_derangements=20, seed=3, captions=captions)
    np.testing.assert_allclose(own, 1.0)
    np.testing.assert_allclose(deranged, 0.0, atol=1e-12)  # an own-text caption would make it positive
    with pytest.raises(AudioMetricsError, match="caption"):
        clap_scores(emb, emb, n_derangements=2, seed=3, captions=["one text"] * 8)


def test_kl_follows_audiocrafts_definition() -> None:
    p_ref = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    p_gen = np.array([[0.25, 0.25, 0.5], [0.2, 0.3, 0.5]])
    want0 = 0.5 * np.log(0.5 / (0.25 + 1e-6)) * 2  # the 0-probability reference label adds 0
    want1 = sum(p * np.log(p / (p + 1e-6)) for p in (0.2, 0.3, 0.5))  # ~ -1e-6 * 3: the epsilon only
    np.testing.assert_allclose(kl_divergence(p_ref, p_gen), [want0, want1], rtol=1e-9, atol=1e-15)
    # audiocraft's own expression: kl_div((pred_probs + eps).log(), target_probs).sum(-1), pred = generated
    torch_kl = torch.nn.functional.kl_div(
        (torch.from_numpy(p_gen) + 1e-6).log(), torch.from_numpy(p_ref), reduction="none"
    )
    np.testing.assert_allclose(kl_divergence(p_ref, p_gen), torch_kl.sum(-1).numpy(), rtol=1e-9, atol=1e-15)


def test_unpaired_clips_are_listed_and_left_out_of_the_kl(models, tmp_path: Path) -> None:
    waves = tones(4, 0.5, seed=7)
    paths = write_set(tmp_path, waves)
    write_reference(paths["reference"], waves)
    (paths["reference"] / "src3.wav").rename(paths["reference"] / "elsewhere.wav")  # gen-0003's partner is gone
    assert main(cli(models, paths, tmp_path / "m.json")) == 0
    report = strict((tmp_path / "m.json").read_text())
    assert report["n_kl_pairs"] == 3 and report["kl_unpaired"] == ["gen-0003-src3"]
    assert report["per_clip"][3]["kl_classifier"] is None and report["n_reference"] == 4
    assert report["kl_classifier"] == pytest.approx(np.mean([c["kl_classifier"] for c in report["per_clip"][:3]]))


def test_missing_models_and_captions_are_one_line_refusals(models, tmp_path: Path, capsys) -> None:
    paths = write_set(tmp_path, tones(3, 0.3, seed=8))
    write_reference(paths["reference"], tones(3, 0.3, seed=8))
    absent = ["--clap", "nobody-here/no-such-clap-model"]
    assert main(cli(models, paths, tmp_path / "m.json") + absent) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "hf download nobody-here/no-such-clap-model" in err
    assert main(cli(models, paths, tmp_path / "m.json") + absent + ["--if-available"]) == 0
    out = capsys.readouterr().out.strip()
    assert (
        "\n" not in out
        and out.startswith("adapter_trainer.audio_metrics: skipped")
        and not (tmp_path / "m.json").exists()
    )
    paths["captions"].write_text(json.dumps({"key": "gen-0000-src0", "caption": "x"}) + "\n")
    assert main(cli(models, paths, tmp_path / "m.json")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "2 generated clip(s) have no caption line" in err


def test_fad_encodec_from_frame_embeddings_and_their_key_check(identical, models, tmp_path: Path, capsys) -> None:
    _, paths = identical
    rng = np.random.default_rng(9)
    gen_keys = sorted(p.stem for p in paths["generated"].glob("*.wav"))
    ref_keys = sorted(p.stem for p in paths["reference"].glob("*.wav"))
    g, r = rng.normal(size=(40, 4)).astype(np.float32), (rng.normal(size=(30, 4)) + 0.5).astype(np.float32)
    for name, emb, keys in (("g", g, gen_keys), ("r", r, ref_keys)):  # as tokenizer_pipeline.codec_embeddings writes
        np.save(tmp_path / f"{name}.npy", emb)
        (tmp_path / f"{name}.json").write_text(json.dumps({"clips": [{"key": k, "frames": 1} for k in keys]}))
    emb_args = ["--embeddings-generated", str(tmp_path / "g.npy"), "--embeddings-reference", str(tmp_path / "r.npy")]
    assert main(cli(models, paths, tmp_path / "m.json") + emb_args) == 0
    report = strict((tmp_path / "m.json").read_text())
    assert report["fad_codec_latents"] == pytest.approx(frechet_distance_of(g.astype(np.float64), r.astype(np.float64)))
    assert report["codec_latent_frames"] == {"generated": 40, "reference": 30, "dim": 4}
    capsys.readouterr()  # the run's model-loading output
    # embeddings of other clips than the wavs: refused, one line
    (tmp_path / "r.json").write_text(json.dumps({"clips": [{"key": k, "frames": 1} for k in gen_keys]}))
    assert main(cli(models, paths, tmp_path / "m2.json") + emb_args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "computed from other clips" in err and not (tmp_path / "m2.json").exists()


def test_fusion_clap_embeds_each_clip_independently_of_its_batch() -> None:
    """A fusion CLAP (enable_fusion, truncation="fusion", like laion/clap-htsat-fused): ClapFeatureExtractor marks a
    random clip of a batch with no clip over max_length_s as `is_longer` (a training-time trick), which sends it
    through the fusion branch; a clip's embedding then depended on which clips shared its batch. `is_longer` must
    say whether the clip itself is longer than the window."""
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, ClapProcessor, RobertaTokenizer
    from transformers.models.clap.configuration_clap import ClapAudioConfig, ClapTextConfig

    from adapter_trainer.evaluation.audio_models import Clap

    torch.manual_seed(0)
    vocab = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3, "<mask>": 4, "a": 5}
    text = ClapTextConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    # fusion stacks a 64-bin shrunk mel with the crops (ClapFeatureExtractor's fixed size): 64 mel bins
    audio = ClapAudioConfig(
        num_mel_bins=64,
        spec_size=256,
        patch_size=4,
        patch_stride=(4, 4),
        window_size=4,
        patch_embeds_hidden_size=8,
        hidden_size=16,
        depths=[1, 1],
        num_heads=[2, 2],
        enable_fusion=True,
    )
    model = ClapModel(ClapConfig(text_config=text.to_dict(), audio_config=audio.to_dict(), projection_dim=8)).eval()
    extractor = ClapFeatureExtractor(feature_size=64, sampling_rate=CLAP_SR, max_length_s=1, truncation="fusion")
    processor = ClapProcessor(feature_extractor=extractor, tokenizer=RobertaTokenizer(vocab=vocab, merges=[]))
    clap = Clap(name="fused", model=model, processor=processor, device=torch.device("cpu"))
    short = tones(3, 0.5, seed=4)  # under the 1 s window: none is "longer"
    long = tones(1, 2.5, seed=5)  # over it: the fusion branch
    together = clap.audio_embeddings(short + long, seeds=[0] * 4)  # [4, D]
    alone = np.concatenate([clap.audio_embeddings([w], seeds=[0]) for w in short + long])  # [4, D]
    np.testing.assert_allclose(together, alone, atol=1e-5)
    shorts_only = clap.audio_embeddings(short, seeds=[0] * 3)  # a batch with no longer clip
    np.testing.assert_allclose(shorts_only, alone[:3], atol=1e-5)
