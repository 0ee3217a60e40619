"""audio_metrics against its references and its refusals: the FAD of fadtk 1.1.0's own functions on the same
embeddings, fadtk's CLAP windowing, audiocraft 1.3.0's loudness normalisation and KL, LAION's 77-token captions;
a wrong model, and every bad input, is one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from adapter_trainer.audio_metrics import main
from adapter_trainer.evaluation.audio_inputs import normalise_loudness
from adapter_trainer.evaluation.audio_metrics import kl_divergence
from adapter_trainer.evaluation.frechet import frechet_distance_of
from tests.trainer.evaluation import reference_code
from tests.trainer.evaluation.test_audio_metrics import CLAP_SR, cli, models, strict, tones, write_reference, write_set

__all__ = ["models"]  # the tiny-model fixture, shared


def tiny_clap(max_length_s: int = 1, positions: int = 64, sampling_rate: int = CLAP_SR, spec_size: int = 256):
    """An in-memory tiny CLAP (character tokenizer) as evaluation.audio_models.Clap."""
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, ClapProcessor, RobertaTokenizer
    from transformers.models.clap.configuration_clap import ClapAudioConfig, ClapTextConfig

    from adapter_trainer.evaluation.audio_models import Clap

    torch.manual_seed(0)
    vocab = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3, "<mask>": 4}
    for ch in "abcdefghijklmnopqrstuvwxyzĠ":
        vocab[ch] = len(vocab)
    text = ClapTextConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=positions,
    )  # fmt: skip
    audio = ClapAudioConfig(
        num_mel_bins=32, spec_size=spec_size, patch_size=4, patch_stride=(4, 4), window_size=4, patch_embeds_hidden_size=8,
        hidden_size=16, depths=[1, 1], num_heads=[2, 2], enable_fusion=False,
    )  # fmt: skip
    model = ClapModel(ClapConfig(text_config=text.to_dict(), audio_config=audio.to_dict(), projection_dim=8)).eval()
    extractor = ClapFeatureExtractor(
        feature_size=32, sampling_rate=sampling_rate, max_length_s=max_length_s, truncation="rand_trunc"
    )
    processor = ClapProcessor(feature_extractor=extractor, tokenizer=RobertaTokenizer(vocab=vocab, merges=[]))
    return Clap(name="tiny", model=model, processor=processor, device=torch.device("cpu"))


# ---- fadtk 1.1.0 (item 5)


@pytest.mark.parametrize("n, d, seed", [(40, 8, 0), (200, 16, 1), (64, 32, 2)])
def test_frechet_distance_agrees_with_fadtks_own_function(n: int, d: int, seed: int) -> None:
    fadtk = reference_code.fadtk()
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, d)) @ rng.normal(size=(d, d))  # correlated, full rank (n > d: fadtk's sqrtm is defined)
    b = rng.normal(0.3, 1.2, size=(n + 7, d))
    mu1, cov1 = fadtk["calc_embd_statistics"](a)
    mu2, cov2 = fadtk["calc_embd_statistics"](b)
    want = float(np.real(fadtk["calc_frechet_distance"](mu1, cov1, mu2, cov2)))
    assert frechet_distance_of(a, b) == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_fadtk_windows_are_fadtks_own_windows() -> None:
    """fadtk's CLAPLaionModel._get_embedding (its code) with a model that returns the window it is given: the
    windows it cuts (10 s every 1 s, int16 round trip, the last ones zero-padded) are Clap.fadtk_windows'."""
    fadtk = reference_code.fadtk()
    clap = tiny_clap(max_length_s=10, sampling_rate=8_000, spec_size=128)

    class Identity:
        def get_audio_embedding_from_data(self, x, use_tensor=True):
            return x  # [1, window]

    class FadtkClap:
        sr, device, model = clap.sample_rate, torch.device("cpu"), Identity()
        int16_to_float32 = fadtk["CLAPLaionModel.int16_to_float32"]
        float32_to_int16 = fadtk["CLAPLaionModel.float32_to_int16"]
        _get_embedding = fadtk["CLAPLaionModel._get_embedding"]

    rng = np.random.default_rng(0)
    for seconds in (10.0, 11.5, 3.2):
        wave = (1.3 * rng.uniform(-1, 1, int(8_000 * seconds))).astype(np.float32)  # some samples beyond +-1
        want = FadtkClap()._get_embedding(wave).numpy()  # [windows, 80000]
        got = np.stack(clap.fadtk_windows(wave))
        assert got.shape == want.shape == (int(np.ceil(seconds)), 80_000)
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_fad_clap_windows_are_fadtks_windows_and_its_fad() -> None:
    """fadtk's CLAPLaionModel._get_embedding (its code: 10-s windows at a 1-s hop, int16 round trip, the last
    windows zero-padded) drives the same tiny CLAP; our windows must give the same embeddings and FAD."""
    fadtk = reference_code.fadtk()
    clap = tiny_clap(max_length_s=10, sampling_rate=8_000, spec_size=128)  # 8 kHz: 10-s windows, cheaply

    class Model:  # laion_clap.CLAP_Module's get_audio_embedding_from_data, with our CLAP on one full window
        def get_audio_embedding_from_data(self, x, use_tensor=True):
            assert x.shape == (1, clap.window_samples)  # fadtk hands over exactly one 10-s window
            return torch.from_numpy(clap.audio_embeddings([x[0].numpy()], seeds=[0]))

    class FadtkClap:
        sr, device, model = clap.sample_rate, torch.device("cpu"), Model()
        int16_to_float32 = fadtk["CLAPLaionModel.int16_to_float32"]
        float32_to_int16 = fadtk["CLAPLaionModel.float32_to_int16"]
        _get_embedding = fadtk["CLAPLaionModel._get_embedding"]

    rng = np.random.default_rng(1)
    t = np.arange(8_000 * 12) / 8_000
    gen = [(0.5 * np.sin(2 * np.pi * f * t[: int(8_000 * 11.5)])).astype(np.float32) for f in (220.0, 330.0)]
    ref = [(0.8 * rng.uniform(-1, 1, int(8_000 * 10.3))).astype(np.float32) for _ in range(2)]
    want_g = np.concatenate([FadtkClap()._get_embedding(w).numpy() for w in gen])  # [windows, D]
    want_r = np.concatenate([FadtkClap()._get_embedding(w).numpy() for w in ref])
    got_g, got_r = clap.window_embeddings(gen), clap.window_embeddings(ref)
    assert got_g.shape == (12 + 12, 8) and got_r.shape == (11 + 11, 8)
    np.testing.assert_allclose(got_g, want_g, atol=1e-6)
    np.testing.assert_allclose(got_r, want_r, atol=1e-6)
    mu1, c1 = fadtk["calc_embd_statistics"](want_g)
    mu2, c2 = fadtk["calc_embd_statistics"](want_r)
    want = float(np.real(fadtk["calc_frechet_distance"](mu1, c1, mu2, c2)))
    assert frechet_distance_of(got_g, got_r) == pytest.approx(want, rel=1e-6, abs=1e-6)


# ---- audiocraft 1.3.0 (item 3)


@pytest.mark.parametrize("sr, amp, seconds", [(32_000, 0.5, 1.0), (48_000, 0.05, 0.7), (16_000, 0.9, 2.0)])
def test_loudness_normalisation_is_audiocrafts(sr: int, amp: float, seconds: float, tmp_path: Path) -> None:
    normalize_loudness = reference_code.audiocraft()["normalize_loudness"]
    rng = np.random.default_rng(0)
    t = np.arange(int(sr * seconds)) / sr
    wave = (amp * np.sin(2 * np.pi * 330 * t) + amp * 0.3 * rng.normal(size=t.size)).astype(np.float32)
    want = normalize_loudness(torch.from_numpy(wave)[None], sr, 14.0).clamp(-1, 1)[0].numpy()
    got = normalise_loudness(wave, sr, tmp_path / "x.wav")
    np.testing.assert_allclose(got.wave, want, atol=1e-6)
    assert got.gain_db is not None and np.isfinite(got.loudness_lufs)
    quiet = (1e-4 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)  # under audiocraft's RMS floor: unchanged
    np.testing.assert_array_equal(normalise_loudness(quiet, sr, tmp_path / "q.wav").wave, quiet)
    want_q = normalize_loudness(torch.from_numpy(quiet)[None], sr, 14.0)[0].numpy()
    np.testing.assert_array_equal(want_q, quiet)


def test_kl_is_audiocrafts_kl_divergence() -> None:
    kl = reference_code.audiocraft()["kl_divergence"]
    rng = np.random.default_rng(3)
    p_gen, p_ref = rng.dirichlet(np.ones(527), size=4), rng.dirichlet(np.ones(527) * 0.1, size=4)
    want = kl(torch.from_numpy(p_gen), torch.from_numpy(p_ref)).numpy()  # pred = generated, target = reference
    np.testing.assert_allclose(kl_divergence(p_ref, p_gen), want, rtol=1e-9, atol=1e-12)


def test_captions_are_cut_at_77_tokens_as_laion_and_audiocraft_cut_them() -> None:
    clap = tiny_clap(positions=160)  # room for 158 tokens: the model's limit is not what cuts
    text = "abcdefghijklmnopqrstuvwxyz" * 5  # 130 characters, one token each
    emb = clap.text_embeddings([text, text[:75]])  # 75 characters + <s> + </s> = 77 tokens
    np.testing.assert_allclose(emb[0], emb[1], atol=1e-6)
    whole = clap.text_embeddings([text], max_tokens=158)  # what the text model's 158 positions would keep
    assert np.abs(whole[0] - emb[1]).max() > 1e-4  # the cut is what makes them equal
    assert clap.text_max_tokens() == 77 and tiny_clap(positions=64).text_max_tokens() == 62


def test_a_long_clips_clap_crop_does_not_depend_on_the_other_clips() -> None:
    from adapter_trainer.evaluation.audio_models import clip_seed

    clap = tiny_clap(max_length_s=1)
    long_a, long_b = tones(2, 3.0, seed=4)
    alone = clap.audio_embeddings([long_a], seeds=[clip_seed(0, "a")])
    after_b = clap.audio_embeddings([long_b, long_a], seeds=[clip_seed(0, "b"), clip_seed(0, "a")])
    np.testing.assert_allclose(after_b[1], alone[0], atol=1e-6)
    other_seed = clap.audio_embeddings([long_a], seeds=[clip_seed(1, "a")])
    assert np.abs(other_seed[0] - alone[0]).max() > 1e-6  # the seed does choose the crop


def test_kl_pairs_are_cropped_to_the_common_length_and_settings_are_recorded(models, tmp_path: Path) -> None:
    waves = tones(3, 1.0, seed=5)
    paths = write_set(tmp_path, waves)
    write_reference(paths["reference"], [np.concatenate([w, w[: CLAP_SR // 2]]) for w in waves])  # 1.5 s each
    assert main(cli(models, paths, tmp_path / "m.json")) == 0
    r = strict((tmp_path / "m.json").read_text())
    assert [c["kl_seconds"] for c in r["per_clip"]] == pytest.approx([1.0] * 3, abs=1e-4)
    assert r["kl_classifier"] == pytest.approx(0.0, abs=1e-3)  # the same first second on both sides
    s = r["settings"]
    assert s["normalisation"]["mode"] == "loudness" and s["normalisation"]["target_lufs"] == -14.0
    assert s["normalisation"]["applied_to"] == ["generated", "reference"]
    assert s["text_max_tokens"] == 62 and s["segment_seconds"] == pytest.approx(0.64)
    assert "fad_clap" not in r and "fad_clap_clips" in r and r["reference_kind"] == "codec-reconstruction"


# ---- refusals (items 1 and 2)


def refused(capsys, argv: list[str], *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("adapter_trainer.audio_metrics")]
    assert len(ours) == 1 and "Traceback" not in err, err  # the rest: transformers' progress bars, if any
    err = ours[0]
    for w in words:
        assert w in err, err
    return err


def test_a_wrong_model_is_refused(models, tmp_path: Path, capsys) -> None:
    from transformers import ASTConfig, ASTForAudioClassification

    paths = write_set(tmp_path, tones(3, 0.5, seed=6))
    write_reference(paths["reference"], tones(3, 0.5, seed=6))
    base = cli(models, paths, tmp_path / "m.json")
    refused(capsys, base + ["--classifier", str(models["clap"])], "'clap' model, not an AST AudioSet classifier")
    refused(capsys, base + ["--clap", str(models["ast"])], "not a CLAP model")
    few = tmp_path / "ast2"
    cfg = ASTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                    num_mel_bins=16, max_length=64, num_labels=2)  # fmt: skip
    ASTForAudioClassification(cfg).save_pretrained(few)
    (few / "preprocessor_config.json").write_text((models["ast"] / "preprocessor_config.json").read_text())
    capsys.readouterr()  # save_pretrained's progress output
    refused(capsys, base + ["--classifier", str(few)], "has 2 labels, not AudioSet's 527")
    partial = tmp_path / "ast_partial"
    ASTForAudioClassification.from_pretrained(models["ast"]).save_pretrained(partial)
    from safetensors.torch import load_file, save_file

    weights = load_file(partial / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "classifier" not in k}, partial / "model.safetensors")
    (partial / "preprocessor_config.json").write_text((models["ast"] / "preprocessor_config.json").read_text())
    capsys.readouterr()
    refused(capsys, base + ["--classifier", str(partial)], "missing", "would stay random")
    assert not (tmp_path / "m.json").exists()


def test_every_bad_input_is_one_line(models, tmp_path: Path, capsys) -> None:
    def fresh(name: str, seconds: float = 0.5) -> tuple[dict[str, Path], list[str]]:
        paths = write_set(tmp_path / name, tones(3, seconds, seed=7))
        write_reference(paths["reference"], tones(3, seconds, seed=7))
        return paths, cli(models, paths, tmp_path / name / "m.json")

    p, argv = fresh("empty")
    sf.write(p["generated"] / "gen-0001-src1.wav", np.zeros(0, np.float32), CLAP_SR)
    refused(capsys, argv, "gen-0001-src1.wav", "0 samples")
    p, argv = fresh("short")
    sf.write(p["generated"] / "gen-0001-src1.wav", np.zeros(int(0.02 * CLAP_SR), np.float32), CLAP_SR)
    refused(capsys, argv, "gen-0001-src1.wav", "under the 25 ms")
    p, argv = fresh("nan")
    w = tones(1, 0.5, seed=1)[0]
    w[100] = np.nan
    sf.write(p["reference"] / "src2.wav", w, CLAP_SR, subtype="FLOAT")
    refused(capsys, argv, "src2.wav", "NaN/Inf")
    p, argv = fresh("corrupt")
    (p["generated"] / "gen-0000-src0.wav").write_bytes(b"RIFF\x00\x00garbage")
    refused(capsys, argv, "gen-0000-src0.wav", "not a readable audio file")
    p, argv = fresh("utf8")
    p["captions"].write_bytes(p["captions"].read_bytes().replace(b"a calm piano", b"a calm \xff piano"))
    refused(capsys, argv, "line 1", "not UTF-8")
    p, argv = fresh("orphan")
    with p["captions"].open("a") as f:
        f.write(json.dumps({"key": "gen-0009-src9", "caption": "x"}) + "\n")
    refused(capsys, argv, "have no generated wav", "gen-0009-src9")
    p, argv = fresh("upper")
    (p["generated"] / "gen-0002-src2.wav").rename(p["generated"] / "gen-0002-src2.WAV")
    assert main(argv) == 0  # read, not skipped
    assert strict((tmp_path / "upper" / "m.json").read_text())["n_generated"] == 3
    capsys.readouterr()
    p, argv = fresh("devices")
    if not torch.cuda.is_available():
        refused(capsys, argv + ["--device", "cuda"], "no CUDA GPU")
    refused(capsys, argv + ["--device", "bogus"], "'bogus' is not a device")
    with pytest.raises(SystemExit) as e:
        main(argv + ["--seed", "-1"])
    assert e.value.code == 2 and "--seed -1" in capsys.readouterr().err
    blocker = tmp_path / "devices" / "file"
    blocker.write_text("")
    refused(capsys, cli(models, p, blocker / "m.json"), "cannot write there")


def test_bad_embeddings_and_sidecars_are_one_line(models, tmp_path: Path, capsys) -> None:
    paths = write_set(tmp_path, tones(3, 0.5, seed=8))
    write_reference(paths["reference"], tones(3, 0.5, seed=8))
    g, r = np.random.default_rng(0).normal(size=(2, 20, 4)).astype(np.float32)
    g[3, 1] = np.nan
    np.save(tmp_path / "g.npy", g)
    np.save(tmp_path / "r.npy", r)
    emb = ["--embeddings-generated", str(tmp_path / "g.npy"), "--embeddings-reference", str(tmp_path / "r.npy")]
    refused(capsys, cli(models, paths, tmp_path / "m.json") + emb, "g.npy", "NaN/Inf in frame 3")
    np.save(tmp_path / "g.npy", np.nan_to_num(g))
    (tmp_path / "r.json").write_text(json.dumps({"clips": [{"frames": 1}]}))
    refused(capsys, cli(models, paths, tmp_path / "m.json") + emb, "r.json", 'no string "key"')


# ---- original references and the codec floor (item 4)


def test_original_references_and_the_codec_reconstruction_floor(models, tmp_path: Path, capsys) -> None:
    """--reference-kind original with flac originals; --reconstructed (the codec's decodes of the same clips) gives
    fad_clap_clips_codec_floor: 0 when the reconstructions are the originals, larger when they are not."""
    waves = tones(3, 0.6, seed=9)
    paths = write_set(tmp_path, waves)
    for i, w in enumerate(waves):
        sf.write(paths["reference"] / f"src{i}.flac", w, CLAP_SR)
    same, noisy = tmp_path / "recon_same", tmp_path / "recon_noisy"
    same.mkdir(), noisy.mkdir()
    for i, (w, n) in enumerate(zip(waves, tones(3, 0.6, seed=10, loud_noise=True))):
        sf.write(same / f"src{i}.wav", w, CLAP_SR, subtype="FLOAT")
        sf.write(noisy / f"src{i}.wav", n, CLAP_SR, subtype="FLOAT")
    base = cli(models, paths, tmp_path / "m.json") + ["--reference-kind", "original"]
    assert main(base + ["--reconstructed", str(same)]) == 0
    r = strict((tmp_path / "m.json").read_text())
    assert r["reference_kind"] == "original" and r["n_kl_pairs"] == 3
    assert r["fad_clap_clips_codec_floor"] == pytest.approx(0.0, abs=1e-6)
    assert main(base + ["--reconstructed", str(noisy)]) == 0
    assert strict((tmp_path / "m.json").read_text())["fad_clap_clips_codec_floor"] > 1e-3
    capsys.readouterr()
    with pytest.raises(SystemExit):  # the floor is against originals only
        main(cli(models, paths, tmp_path / "m.json") + ["--reconstructed", str(same)])
