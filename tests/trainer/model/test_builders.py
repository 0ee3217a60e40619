"""Builders and loaders: demo models load through the real from_pretrained paths; the decoder loader builds no
codec and no T5; no downloads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, LlamaForCausalLM, MusicgenForCausalLM

from adapter_trainer.demo.models import write_demo_models, write_llm, write_musicgen
from adapter_trainer.model.builders import (
    llama3_2_1b_config,
    load_llm,
    load_musicgen_decoder,
    load_text_tokenizer,
    tiny_musicgen_decoder_config,
)
from adapter_trainer.model.teacher import load_musicgen_teacher

CAPTIONS = [
    "The low quality recording features a ballad song that contains sustained strings, mellow piano melody and soft "
    "female vocal singing over it. It sounds sad and soulful, like something you would hear at Sunday services.",
    "A male voice sings in Español; the 808s hit hard — 140 BPM, lo-fi!!  \n\nTabs\tand  double  spaces ’quotes’ 😀",
    "<|begin_of_text|> literal special text, numbers 1234567 and CAPS",
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_demo_models(tmp_path_factory.mktemp("demo_models"), seed=0)


def test_llama3_2_1b_config_sizes() -> None:
    cfg = llama3_2_1b_config()
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (128_256, 2048, 16, 32)
    assert cfg.num_key_value_heads == 8 and cfg.tie_word_embeddings and cfg.rope_parameters["rope_type"] == "llama3"


def test_tokenizer_matches_llama_models(demo: dict[str, Path]) -> None:
    from llama_models.llama3.tokenizer import Tokenizer

    ref = Tokenizer.get_instance()
    tok = load_text_tokenizer(demo["llm"])
    assert (tok.bos_token_id, tok.eos_token_id, len(tok)) == (128_000, 128_001, 128_256)
    assert tok.convert_tokens_to_ids("<|reserved_special_token_245|>") == 128_255
    assert tok.convert_tokens_to_ids("<|eot_id|>") == ref.eot_id
    for text in CAPTIONS:
        ours = tok(text)["input_ids"]
        assert ours == ref.encode(text, bos=True, eos=False, allowed_special="all"), text
        assert tok(text, add_special_tokens=False)["input_ids"] == ours[1:]
        assert tok.decode(ours[1:]) == text


def test_llm_loads_via_from_pretrained(demo: dict[str, Path]) -> None:
    llm = load_llm(demo["llm"])
    assert isinstance(llm, LlamaForCausalLM)
    assert llm.config.vocab_size == 128_256 and llm.config._attn_implementation == "sdpa"
    assert llm.lm_head.weight.data_ptr() == llm.model.embed_tokens.weight.data_ptr()  # tied, like 3.2-1B
    saved = load_file(str(demo["llm"] / "model.safetensors"))
    for name, p in llm.state_dict().items():
        if name in saved:
            assert torch.equal(p, saved[name]), name
    assert load_llm(demo["llm"], dtype="bfloat16").model.embed_tokens.weight.dtype == torch.bfloat16


def test_demo_models_deterministic(demo: dict[str, Path], tmp_path: Path) -> None:
    again = write_musicgen(tmp_path / "a", seed=0)
    other = write_musicgen(tmp_path / "b", seed=1)
    ref = load_file(str(demo["musicgen"] / "model.safetensors"))
    same, diff = load_file(str(again / "model.safetensors")), load_file(str(other / "model.safetensors"))
    assert ref.keys() == same.keys() and all(torch.equal(ref[k], same[k]) for k in ref)
    for part in ("decoder.", "text_encoder.", "enc_to_dec_proj."):  # every part follows the seed
        assert any(not torch.equal(ref[k], diff[k]) for k in ref if k.startswith(part)), part
    assert (again / "tokenizer.json").read_bytes() == (demo["musicgen"] / "tokenizer.json").read_bytes()
    assert "random" in (demo["llm"].parent / "README.md").read_text()
    llm_ref = load_file(str(demo["llm"] / "model.safetensors"))
    llm_again = load_file(str(write_llm(tmp_path / "c", seed=0, with_tokenizer=False) / "model.safetensors"))
    assert llm_ref.keys() == llm_again.keys() and all(torch.equal(llm_ref[k], llm_again[k]) for k in llm_ref)


def test_musicgen_composite_layout_loads_decoder_only(demo: dict[str, Path]) -> None:
    cfg = json.loads((demo["musicgen"] / "config.json").read_text())
    assert cfg["model_type"] == "musicgen"
    assert cfg["audio_encoder"]["model_type"] == "encodec" and cfg["audio_encoder"]["sampling_rate"] == 32000
    assert cfg["text_encoder"]["model_type"] == "t5" and cfg["text_encoder"]["d_model"] != cfg["decoder"]["hidden_size"]
    saved = load_file(str(demo["musicgen"] / "model.safetensors"))
    assert {k.split(".")[0] for k in saved} == {"decoder", "text_encoder", "enc_to_dec_proj"}  # no audio_encoder

    model = load_musicgen_decoder(demo["musicgen"])
    assert isinstance(model, MusicgenForCausalLM)
    assert model.config.num_codebooks == 4 and model.config.vocab_size == 2048
    state = model.state_dict()
    assert {f"decoder.{k}" for k in state} == {k for k in saved if k.startswith("decoder.")}
    for k, v in state.items():
        assert torch.equal(v, saved[f"decoder.{k}"]), k

    teacher = load_musicgen_teacher(demo["musicgen"])  # the same folder's text path
    assert teacher.decoder.config.hidden_size == 64 and teacher.enc_to_dec_proj.weight.shape == (64, 128)
    assert torch.equal(teacher.enc_to_dec_proj.bias, saved["enc_to_dec_proj.bias"])
    assert torch.equal(teacher.text_encoder.shared.weight, saved["text_encoder.shared.weight"])


def test_musicgen_sharded_and_decoder_only_checkpoints(demo: dict[str, Path], tmp_path: Path) -> None:
    ref = load_musicgen_decoder(demo["musicgen"]).state_dict()
    sharded = write_musicgen(tmp_path / "sharded", seed=0, max_shard_size="300KB")
    assert len(list(sharded.glob("model-*.safetensors"))) > 2 and (sharded / "model.safetensors.index.json").exists()
    got = load_musicgen_decoder(sharded).state_dict()
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    assert {k.split(".")[0] for k in index} == {"decoder", "text_encoder", "enc_to_dec_proj"}
    whole, parts = load_musicgen_teacher(demo["musicgen"]), load_musicgen_teacher(sharded)
    assert torch.equal(whole.enc_to_dec_proj.weight, parts.enc_to_dec_proj.weight)
    t5 = parts.text_encoder.state_dict()
    assert all(torch.equal(v, t5[k]) for k, v in whole.text_encoder.state_dict().items())

    dec_only = tmp_path / "decoder_only"
    fresh = MusicgenForCausalLM(tiny_musicgen_decoder_config())
    fresh.load_state_dict(ref)
    fresh.save_pretrained(dec_only)
    assert all(k.startswith(("model.decoder.", "lm_heads.")) for k in load_file(str(dec_only / "model.safetensors")))
    assert json.loads((dec_only / "config.json").read_text())["model_type"] == "musicgen_decoder"
    got = load_musicgen_decoder(dec_only).state_dict()
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_musicgen_missing_decoder_key_is_named(demo: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((demo["musicgen"] / "config.json").read_text())
    sd = load_file(str(demo["musicgen"] / "model.safetensors"))
    victim = "decoder.model.decoder.layers.3.fc1.weight"
    del sd[victim]
    save_file(sd, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.decoder\.layers\.3\.fc1\.weight"):
        load_musicgen_decoder(broken)


def test_musicgen_load_never_touches_encodec_or_t5(demo: dict[str, Path]) -> None:
    """In a fresh process: loading the decoder imports neither EnCodec's nor T5's modeling code."""
    code = f"""
import sys
from adapter_trainer.model.builders import load_musicgen_decoder
m = load_musicgen_decoder({str(demo["musicgen"])!r})
bad = [n for n in sys.modules if n.startswith(("transformers.models.encodec.modeling", "transformers.models.t5.modeling"))]
assert not bad, bad
assert type(m).__name__ == "MusicgenForCausalLM"
from transformers import EncodecModel, T5EncoderModel
assert not any(isinstance(x, (EncodecModel, T5EncoderModel)) for x in m.modules())
print("OK")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-2000:]


def test_trainer_package_never_mentions_codec_construction() -> None:
    import adapter_trainer

    src = Path(adapter_trainer.__file__).parent
    for f in src.glob("*.py"):
        text = f.read_text()
        assert "EncodecModel(" not in text and "import tokenizer_pipeline" not in text, f


def test_missing_weights_error_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="make demo-models"):
        load_llm(tmp_path / "nope")
    with pytest.raises(OSError, match="make demo-models"):
        load_musicgen_decoder(tmp_path / "nope")
    # A hub id with no network (offline mode so the test never waits on retries).
    code = (
        "from adapter_trainer.model.builders import load_llm\n"
        "try:\n    load_llm('meta-llama/Llama-3.2-1B')\n"
        "except OSError as e:\n    print('ERR', e)\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert "ERR LLM: meta-llama/Llama-3.2-1B is not in the Hugging Face cache" in out.stdout, out.stdout + out.stderr
    assert "offline mode (HF_HUB_OFFLINE=1 or TRANSFORMERS_OFFLINE=1)" in out.stdout
    assert "`hf download meta-llama/Llama-3.2-1B`" in out.stdout


def test_tiny_musicgen_config_matches_brief() -> None:
    c = tiny_musicgen_decoder_config()
    assert (c.num_codebooks, c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.ffn_dim) == (
        4,
        2048,
        64,
        6,
        4,
        256,
    )


def _caption_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ytid", "start_s", "end_s", "caption"])
        w.writerows([(y, 0, 10, c) for y, c in rows])
    return path


PRETRAIN_ROWS = [
    (f"yt{i}", c)
    for i, c in enumerate(
        [
            "A mellow piano ballad with soft female vocals and sustained strings.",
            "Fast punk rock with distorted guitars, loud drums and a shouting male singer.",
            "An ambient synth pad drone with reverb, slow and calm.",
            "A jazz trio: upright bass, brushed drums and a swinging piano solo.",
            "Latin percussion with congas and a complex rhythm, live recording.",
            "A bagpipe ensemble playing a quick melody in unison.",
        ]
    )
]


def test_read_captions_excludes_the_corpus_ytids(tmp_path: Path) -> None:
    from adapter_trainer.demo.pretrain import read_captions

    full = _caption_csv(tmp_path / "full.csv", PRETRAIN_ROWS)
    corpus = _caption_csv(tmp_path / "corpus.csv", [PRETRAIN_ROWS[1], PRETRAIN_ROWS[4]])
    captions, n_excluded = read_captions(full, corpus)
    assert n_excluded == 2 and captions == [c for i, (_, c) in enumerate(PRETRAIN_ROWS) if i not in (1, 4)]
    bad = tmp_path / "bad.csv"
    bad.write_text("id,text\nyt0,hello\n")
    with pytest.raises(ValueError, match="bad.csv row 2"):
        read_captions(bad, None)


def test_pretraining_learns_captions_deterministically_and_touches_only_seen_rows(demo: dict[str, Path]) -> None:
    from adapter_trainer.demo.pretrain import PretrainConfig, pretrain_on_captions
    from adapter_trainer.model.builders import tiny_llama_config

    tok = load_text_tokenizer(demo["llm"])
    captions = [c for _, c in PRETRAIN_ROWS]
    cfg = PretrainConfig(steps=12, batch_size=4, warmup_steps=2, seed=3)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        m = LlamaForCausalLM(tiny_llama_config())
        before = {k: v.clone() for k, v in m.state_dict().items()}
        report = pretrain_on_captions(m, tok, captions, cfg, progress=False)
        models.append(m.state_dict())
    assert report.final_loss < report.first_loss - 0.5, report  # final_loss: mean of the (here 12) last steps
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])  # same seed, one thread
    seen = sorted({t for c in captions for t in tok(c)["input_ids"]} | {tok.eos_token_id})
    emb, emb0 = models[0]["model.embed_tokens.weight"], before["model.embed_tokens.weight"]
    unseen = torch.ones(emb.shape[0], dtype=torch.bool)
    unseen[seen] = False
    assert torch.equal(emb[unseen], emb0[unseen])  # ids that never occur keep their init
    assert not torch.equal(emb[seen], emb0[seen])
    assert torch.equal(models[0]["lm_head.weight"], emb)  # still tied
    assert not torch.equal(
        models[0]["model.layers.0.self_attn.q_proj.weight"], before["model.layers.0.self_attn.q_proj.weight"]
    )


def test_write_demo_models_with_captions_records_the_pretraining(tmp_path: Path) -> None:
    from adapter_trainer.demo.pretrain import PretrainConfig
    from adapter_trainer.demo.t5_pretrain import T5PretrainConfig

    full = _caption_csv(tmp_path / "full.csv", PRETRAIN_ROWS)
    corpus = _caption_csv(tmp_path / "corpus.csv", PRETRAIN_ROWS[:2])
    paths = write_demo_models(
        tmp_path / "m",
        seed=0,
        captions_csv=full,
        exclude_csv=corpus,
        pretrain=PretrainConfig(steps=3, batch_size=2),
        t5_pretrain=T5PretrainConfig(steps=3, batch_size=2),
    )
    record = json.loads((paths["llm"] / "demo_pretraining.json").read_text())
    assert record["report"]["n_captions"] == 4 and record["config"]["steps"] == 3
    readme = (tmp_path / "m" / "README.md").read_text()
    assert "Pretrained as a language model on 4 MusicCaps captions (2 rows of the demo corpus excluded" in readme
    assert isinstance(load_llm(paths["llm"]), LlamaForCausalLM)
    # MusicGen's T5 tokenizer is trained on the same captions: the corpus's own rows are not in its vocabulary
    assert "trained on the 4 MusicCaps captions the LLM pretrains on" in readme
    from adapter_trainer.demo.text_encoder import train_t5_tokenizer

    vocab = AutoTokenizer.from_pretrained(paths["musicgen"]).get_vocab()
    assert vocab == train_t5_tokenizer([c for _, c in PRETRAIN_ROWS[2:]]).get_vocab()
    assert vocab != train_t5_tokenizer([c for _, c in PRETRAIN_ROWS]).get_vocab()


def _config_warnings(filtered: bool) -> str:
    """stderr of a fresh process (transformers warns once per message per process) that builds the demo's
    musicgen-small-layout config (the composite MusicgenConfig, whose check reports the decoder's ids) and a Llama
    config with a wrong pad id; with filtered=False the builders' filter is taken off first."""
    code = (
        "import logging\n"
        "from transformers import LlamaConfig\n"
        "from adapter_trainer.model import builders\n"
        "from adapter_trainer.demo.models import musicgen_small_layout_config\n"
        "from adapter_trainer.demo.text_encoder import tiny_t5_encoder_config\n"
        f"if not {filtered}:\n"
        "    log = logging.getLogger('transformers.configuration_utils')\n"
        "    log.filters = [f for f in log.filters if not isinstance(f, builders.MusicgenSpecialIdsFilter)]\n"
        "t5 = tiny_t5_encoder_config(100).to_dict()\n"
        "cfg = musicgen_small_layout_config(builders.tiny_musicgen_decoder_config().to_dict(), t5)\n"
        "assert cfg.decoder.pad_token_id == cfg.decoder.bos_token_id == cfg.decoder.vocab_size == 2048\n"
        "LlamaConfig(vocab_size=77, pad_token_id=99)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stderr


def test_musicgen_s_special_ids_are_not_reported_but_other_bad_ids_are() -> None:
    """MusicGen's pad/bos id 2048 is the extra row of its embedding tables (vocab_size 2048 codes + 1), so
    transformers' "outside the vocabulary" warning is silenced for exactly those two; a wrong id elsewhere still warns.
    The control (filter off) shows transformers does report them, so a reworded message would fail here."""
    llama = "pad_token_id must be `None` or an integer within the vocabulary (between 0 and 76), got 99"
    quiet, bare = _config_warnings(filtered=True), _config_warnings(filtered=False)
    assert "got 2048" not in quiet and llama in quiet, quiet
    for name in ("pad_token_id", "bos_token_id"):
        assert f"{name} must be `None` or an integer within the vocabulary (between 0 and 2047), got 2048" in bare, bare
    # the embedding tables really have the row: 2048 codes + the pad/bos row
    model = MusicgenForCausalLM(tiny_musicgen_decoder_config())
    assert {e.num_embeddings for e in model.model.decoder.embed_tokens} == {2049}
