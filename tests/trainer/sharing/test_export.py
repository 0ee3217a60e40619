"""`python -m adapter_trainer.export` and `load_adapter` on a 2-step run of the tiny demo models (synthetic shards
whose manifest names a tiny real EnCodec): the folder holds the checkpoint's trainable weights, the towers' and
manifests' sha256 as computed here independently, a card `huggingface_hub.ModelCard` parses; the folder alone gives the
run's logits and, with no experiment config, the run's codes; mismatched folders are refused in one line;
`--push-to-hub` uploads to a local stand-in of the Hub's HTTP API; `make generate` leaves wav files (slow)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from adapter_trainer.config import ConfigError
from adapter_trainer.export import main
from adapter_trainer.hydra_cli import find_conf_dir
from adapter_trainer.model.adapter_io import AdapterError, load_adapter
from adapter_trainer.sharing.export import export_adapter
from tests import REPO
from tests.contract.shard_fixture import write_synthetic_set
from tests.trainer.helpers import example, tiny_demo_overrides

pytestmark = pytest.mark.usefixtures("one_thread", "reused_tokenizers")
FILES = ["README.md", "adapter.safetensors", "adapter_config.json", "generation_config.json"]


def compose(config: str, args: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        return hydra_compose(config, overrides=args)


def sha256_of(files: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(files):
        h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.pipeline.helpers import make_tiny_codec

    return make_tiny_codec(tmp_path_factory.mktemp("codec") / "tiny", seed=0, codebook_size=2048)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, codec: Path) -> Path:
    """The synthetic set, its manifest naming the tiny codec (weights sha256, identity config, a path relative to the
    set: what decode checks)."""
    from transformers import EncodecConfig

    from tokenizer_pipeline.codec.encode import config_identity

    root = write_synthetic_set(tmp_path_factory.mktemp("shards") / "set", n_train=12, n_eval=4, frames=(12, 24))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["codec"].update(
        name_or_path=str(codec),
        weights_sha256=sha256_of(list(codec.glob("*.safetensors"))),
        path_from_set=Path(os.path.relpath(codec, root)).as_posix(),
        config=config_identity(EncodecConfig.from_pretrained(codec)),
    )
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return root


def overrides(models: dict[str, Path], shards: Path, out: Path) -> list[str]:
    return tiny_demo_overrides(
        models, shards, out, "trainer.eval_bootstrap=50", "optimizer.warmup_steps=1", "data.caption_dropout=0.5"
    )


@pytest.fixture(scope="module")
def run_dir(models, shards, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from adapter_trainer.config import to_train_config
    from adapter_trainer.training.recipe import recipe_main

    out = tmp_path_factory.mktemp("run") / "run"
    recipe_main(to_train_config(compose("config", overrides(models, shards, out) + ["trainer.max_steps=2"])))
    return out


@pytest.fixture(scope="module")
def exported(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_adapter(run_dir, tmp_path_factory.mktemp("export") / "calm-adapter")


def edited_copy(src: Path, dst: Path, file: str, edit) -> Path:
    shutil.copytree(src, dst)
    data = json.loads((dst / file).read_text())
    edit(data)
    (dst / file).write_text(json.dumps(data))
    return dst


def test_export_writes_a_self_contained_folder(models, shards, codec: Path, run_dir: Path, exported: Path) -> None:
    from huggingface_hub import ModelCard
    from safetensors.torch import load_file

    assert sorted(p.name for p in exported.iterdir()) == FILES
    ckpt = run_dir / "checkpoints" / "step-000002"
    ours, theirs = load_file(str(exported / "adapter.safetensors")), load_file(str(ckpt / "adapter.safetensors"))
    fingerprint = json.loads((ckpt / "fingerprint.json").read_text())
    assert sorted(ours) == sorted(theirs) == sorted(fingerprint["trainable_shapes"])  # trainable weights only
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    acfg = json.loads((exported / "adapter_config.json").read_text())
    for role, key in (("llm", "llm"), ("audio_lm", "musicgen")):
        tower = acfg["base_models"][role]
        assert tower["name_or_path"] == str(models[key])
        assert tower["weights_sha256"] == sha256_of(list(Path(models[key]).glob("*.safetensors")))
    layout = acfg["token_layout"]
    assert [layout["text_vocab_size"], layout["n_codebooks"], layout["codebook_size"]] == fingerprint["vocab"]
    assert layout["pattern"] == "delay" and acfg["captions"]["caption_dropout"] == 0.5
    manifest = json.loads((shards / "manifest.json").read_text())
    assert acfg["codec"]["weights_sha256"] == manifest["codec"]["weights_sha256"]
    assert (exported / acfg["codec"]["path_from_set"]).resolve() == codec.resolve()  # re-based to the folder
    manifest_sha = hashlib.sha256((shards / "manifest.json").read_bytes()).hexdigest()
    assert [s["manifest_sha256"] for s in acfg["shards"]["sets"]] == fingerprint["data.manifest_sha256"]
    assert acfg["shards"]["sets"][0]["manifest_sha256"] == manifest_sha
    gen = json.loads((exported / "generation_config.json").read_text())
    assert {k: gen[k] for k in ("cfg_scale", "top_k", "top_p", "temperature", "seconds")} == {
        "cfg_scale": 3.0,
        "top_k": 250,
        "top_p": 0.0,
        "temperature": 1.0,
        "seconds": 5.0,
    }  # fmt: skip  (the run has no generated set: generate's defaults)
    card = ModelCard.load(exported / "README.md")
    assert card.data.license == "other" and "mot-adapter" in card.data.tags
    assert card.data.base_model is None  # local towers are not Hub ids
    learning = json.loads((run_dir / "final_metrics.json").read_text())["learning_check"]
    assert f"held-out audio CE {learning['eval_ce']:.4f}" in card.text and manifest_sha in card.text
    assert "No evaluation report" in card.text or "Attribute probe" not in card.text  # no probe ran: none claimed


def test_the_card_names_hub_base_models_and_musiccaps(exported: Path) -> None:
    from huggingface_hub import ModelCard

    from adapter_trainer.sharing.model_card import model_card

    acfg = json.loads((exported / "adapter_config.json").read_text())
    acfg["base_models"]["llm"]["name_or_path"] = "meta-llama/Llama-3.2-1B"
    acfg["base_models"]["audio_lm"]["name_or_path"] = "facebook/musicgen-small"
    acfg["shards"]["sets"][0]["source"] = {"csv": "data/musiccaps/musiccaps-public.csv"}
    gen = json.loads((exported / "generation_config.json").read_text())
    text = model_card(acfg, gen, {"exported_step": 2}, license="cc-by-nc-4.0", name="x")
    card = ModelCard(text)
    assert card.data.base_model == ["meta-llama/Llama-3.2-1B", "facebook/musicgen-small"]
    assert card.data.datasets == ["google/MusicCaps"] and card.data.license == "cc-by-nc-4.0"
    assert "this adapter is unmeasured" in card.text


def test_load_adapter_gives_the_run_checkpoint_s_logits(models, shards, run_dir: Path, exported: Path) -> None:
    from adapter_trainer.config import to_train_config
    from adapter_trainer.data.token_layout import collate
    from adapter_trainer.model.builders import build_mot_model
    from adapter_trainer.training.checkpoint import load_checkpoint

    cfg = to_train_config(compose("config", overrides(models, shards, run_dir)))
    built = build_mot_model(cfg.model, cfg.data.pattern, "cpu")
    batch = collate([example(built.vocab, 5, 10, seed=s) for s in (1, 2)], built.pad_id)  # [2, S, 1]
    with torch.no_grad():
        untrained = built.model.eval()(batch.tokens, batch.is_audio, batch.attention_mask)  # [B, S, H, V']
        built.model.load_trainable_state_dict(load_checkpoint(run_dir / "checkpoints" / "step-000002").adapter)
        want = built.model(batch.tokens, batch.is_audio, batch.attention_mask)
        loaded = load_adapter(exported)  # base towers from the recorded paths
        got = loaded.model(batch.tokens, batch.is_audio, batch.attention_mask)
    assert not torch.equal(untrained, want)  # the check below can fail: other weights give other logits
    assert torch.equal(got, want)  # same batch shape, same fp32 CPU kernels: exactly equal
    assert (loaded.bos_id, loaded.pad_id, loaded.vocab) == (built.bos_id, built.pad_id, built.vocab)


@pytest.mark.parametrize(
    ("file", "edit", "message"),
    [
        ("adapter_config.json", lambda c: c["codec"].update(n_codebooks=8), "codec n_codebooks 8 vs audio LM 4"),
        (
            "adapter_config.json",
            lambda c: c["token_layout"].update(text_vocab_size=1000),
            "text_vocab_size 1000 vs towers 128256",
        ),
        (
            "adapter_config.json",
            lambda c: c["base_models"]["llm"].update(weights_sha256="0" * 64),
            "base llm .* has weights sha256 [0-9a-f]{64}, but .* was trained on 0{64}",
        ),
        ("adapter_config.json", lambda c: c.update(format_version=99), "version 99"),
    ],
)
def test_a_folder_that_does_not_fit_the_towers_is_refused_in_one_line(
    exported: Path, tmp_path: Path, file: str, edit, message: str
) -> None:
    folder = edited_copy(exported, tmp_path / "bad", file, edit)
    with pytest.raises(AdapterError, match=message) as e:
        load_adapter(folder)
    assert "\n" not in str(e.value) and str(folder) in str(e.value)


def test_generate_from_the_folder_alone_gives_the_run_s_codes(
    models, shards, codec: Path, run_dir: Path, exported: Path, tmp_path: Path
) -> None:
    from adapter_trainer.data.samples import load_split
    from adapter_trainer.data.shards import read_manifest
    from adapter_trainer.generation.generate import run_generate, to_generate_config

    texts = '["a calm solo piano ballad with soft reverb","loud distorted electric guitar rock with fast drums"]'
    common = ["generate.captions=texts", f"generate.texts={texts}", "generate.n=3", "generate.seconds=0.2"]
    common += ["generate.batch_size=2", "generate.seed=7"]
    run_generate(to_generate_config(compose("generate", overrides(models, shards, run_dir) + common + [
        f"generate.out_dir={tmp_path / 'run'}"])))  # fmt: skip
    # no experiment, no data.shards, no model.*: the folder is all there is
    alone = to_generate_config(compose("generate", common + [f"generate.adapter={exported}",
                                                             f"generate.out_dir={tmp_path / 'adapter'}"]))  # fmt: skip
    assert alone.data.shards == [] and alone.model.llm == str(models["llm"])
    run_generate(alone)
    want = load_split([read_manifest(tmp_path / "run")], "generated")
    got = load_split([read_manifest(tmp_path / "adapter")], "generated")
    assert [c.caption for c in got] == [c.caption for c in want] and len(got) == 3
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a.codes, b.codes)
    m = json.loads((tmp_path / "adapter" / "manifest.json").read_text())
    assert m["generated"]["adapter"] == str(exported) and m["generated"]["checkpoint_step"] == 2
    assert (tmp_path / "adapter" / m["codec"]["path_from_set"]).resolve() == codec.resolve()  # decode finds it
    assert m["codec"]["weights_sha256"] == json.loads((shards / "manifest.json").read_text())["codec"]["weights_sha256"]


def test_command_line_sampling_defaults_come_from_generation_config(exported: Path, tmp_path: Path) -> None:
    from adapter_trainer.generation.generate import to_generate_config

    folder = edited_copy(exported, tmp_path / "a", "generation_config.json", lambda g: g.update(top_k=7, seconds=0.4))
    args = [f"generate.adapter={folder}", "generate.captions=texts", "generate.texts=[calm]", "generate.top_k=11"]
    given = {a.split("=")[0] for a in args}
    g = to_generate_config(compose("generate", args), given).generate
    assert (g.top_k, g.seconds, g.cfg_scale) == (11, 0.4, 3.0)  # given wins; the rest from the folder
    assert to_generate_config(compose("generate", args)).generate.seconds == 5.0  # Python callers: as composed
    with pytest.raises(ConfigError, match="drop model.llm"):
        to_generate_config(compose("generate", [*args, "model.llm=x"]), given | {"model.llm"})
    with pytest.raises(ConfigError, match="captions=texts"):
        to_generate_config(compose("generate", [f"generate.adapter={folder}"]), set())


def test_export_refusals_are_one_line_and_lose_nothing(run_dir: Path, exported: Path, tmp_path: Path, capsys) -> None:
    before = {p.name: p.read_bytes() for p in exported.iterdir()}
    cases = [
        ([str(tmp_path / "nope"), "--out", str(tmp_path / "o")], "does not exist"),
        ([str(run_dir), "--out", str(exported)], "is not empty; pass --overwrite"),
        ([str(run_dir), "--checkpoint", "step-000009", "--out", str(tmp_path / "o")], "--checkpoint step-000009"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert {p.name: p.read_bytes() for p in exported.iterdir()} == before
    assert not (tmp_path / "o").exists()


def test_export_refuses_a_shard_set_changed_since_training(run_dir: Path, shards: Path, tmp_path: Path) -> None:
    """The folder records the codec of the shards the run trained on: a manifest that changed since is refused."""
    changed = shutil.copytree(shards, tmp_path / "set")
    (changed / "manifest.json").write_text((changed / "manifest.json").read_text() + "\n")
    run = shutil.copytree(run_dir, tmp_path / "run")
    cfg = run / "checkpoints" / "step-000002" / "config.yaml"
    cfg.write_text(cfg.read_text().replace(str(shards), str(changed)))
    with pytest.raises(Exception, match="changed since training") as e:
        export_adapter(run, tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_push_to_hub_uploads_the_folder_to_a_hub_stand_in(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub.constants

    from tests.trainer.sharing.hub_standin import TOKEN, HubStandIn

    with HubStandIn() as hub:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)  # what HF_ENDPOINT sets
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        assert main([str(run_dir), "--out", str(tmp_path / "calm"), "--push-to-hub", "me/calm-adapter"]) == 0
        assert [(c["organization"], c["name"]) for c in hub.created] == [("me", "calm-adapter")]
        sent = hub.repos["me/calm-adapter"]
        assert sorted(sent) == FILES
        assert all(sent[name] == (tmp_path / "calm" / name).read_bytes() for name in FILES)
        assert hub.unknown == [] and [m["license"] for m in hub.validated] == ["other"]
        monkeypatch.setenv("HF_TOKEN", "hf_wrong")  # the Hub refuses: one line, the folder stays
        assert main([str(run_dir), "--out", str(tmp_path / "again"), "--push-to-hub", "me/other"]) == 2
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == FILES


@pytest.mark.slow
def test_make_generate_leaves_wav_files(exported: Path, codec: Path, tmp_path: Path) -> None:
    """`make generate ADAPTER=DIR TEXT=...`: sampling, then decode in its own process with the recorded codec."""
    out = tmp_path / "gen"
    text = 'calm solo piano, it\'s "soft"'  # quotes and a comma reach the caption intact
    proc = subprocess.run(
        ["make", "-s", "-o", ".venv/.installed", "generate", f"ADAPTER={exported}", f"TEXT={text}", f"GEN_OUT={out}",
         f"PY={sys.executable}", "ARGS=generate.seconds=0.3 generate.n=2"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    wavs = sorted((out / "wav").glob("*.wav"))
    assert len(wavs) == 2 and f"wav files in {out / 'wav'}" in proc.stdout
    decoded = json.loads((out / "wav" / "decoded.json").read_text())
    assert Path(decoded["codec"]["loaded_from"]).resolve() == codec.resolve()  # via the folder's path_from_set
    captions = [json.loads(line)["caption"] for line in (out / "codes" / "captions.jsonl").read_text().splitlines()]
    assert captions == [text, text]


def test_the_run_and_its_export_are_readable_as_the_umask_says(run_dir: Path, exported: Path, tmp_path: Path) -> None:
    """A teammate on a shared disk can load the checkpoint and the exported adapter: every file has the mode open()
    gives under the umask (safetensors alone would leave adapter.safetensors 0600): the run's under this process's
    umask, and an export made here under 027, which no earlier code path could match by chance."""
    mask = os.umask(0o027)
    try:
        again = export_adapter(run_dir, tmp_path / "shared-adapter")
    finally:
        os.umask(mask)
    modes = {str(f): f.stat().st_mode & 0o777 for f in again.rglob("*") if f.is_file()}
    assert (again / "adapter.safetensors").is_file() and set(modes.values()) == {0o640}, modes
    files = [f for root in (run_dir / "checkpoints", exported) for f in root.rglob("*") if f.is_file()]
    assert sum(f.name == "adapter.safetensors" for f in files) >= 2
    assert {str(f): f.stat().st_mode & 0o777 for f in files} == {str(f): 0o666 & ~mask for f in files}
