"""Embedded demo models: tiny stand-ins laid out exactly like the real checkpoints (`python -m
adapter_trainer.demo_models`).

`<out>/llm/`: a tiny LlamaForCausalLM with the real Llama 3 vocabulary and tokenizer, pretrained on captions outside
the demo corpus when given (pretrain.py). `<out>/musicgen/`: the facebook/musicgen-small layout (composite
MusicgenConfig, `decoder.*`, `text_encoder.*`, `enc_to_dec_proj.*` tensors, a T5-kind tokenizer): its T5 encoder
pretrained on the same captions when given (t5_pretrain.py), then its decoder on a shard set's train split when given
(music_pretrain.py). They load back through the real checkpoints' loaders; no EnCodec model is built (the
audio_encoder sub-config is configuration only).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import (
    LlamaForCausalLM,
    MusicgenConfig,
    MusicgenForCausalLM,
    PreTrainedTokenizerFast,
    T5Config,
    T5EncoderModel,
)

from adapter_trainer.data.samples import Clip, load_split
from adapter_trainer.data.shards import read_manifest
from adapter_trainer.demo.music_pretrain import MusicPretrainConfig, MusicPretrainReport, pretrain_music_lm
from adapter_trainer.demo.pretrain import PretrainConfig, PretrainReport, pretrain_on_captions, read_captions
from adapter_trainer.demo.t5_pretrain import T5PretrainConfig, T5PretrainReport, pretrain_t5_encoder
from adapter_trainer.demo.text_encoder import FALLBACK_TEXTS, build_text_path, composite_state_dict
from adapter_trainer.file_modes import follow_umask, save_safetensors
from adapter_trainer.model.builders import tiny_llama_config, tiny_musicgen_decoder_config

BOS_TOKEN, EOS_TOKEN = "<|begin_of_text|>", "<|end_of_text|>"
LLAMA3_NUM_RESERVED_SPECIAL_TOKENS = 256
PRETRAINING_JSON = "demo_pretraining.json"  # in llm/ and musicgen/: what each was pretrained on, and the losses
TEXT_ENCODER_LINE = (
    "- `text_encoder/`: that T5 encoder alone, as pretrained (`--part text` writes it beside stage 1; `musicgen/` "
    "holds a copy).\n"
)
TEXT_ENCODER_DIR = "text_encoder"  # MusicGen's pretrained T5 alone, before musicgen/ holds it (write_text_encoder)

README = """# Demo models ({kind})

Tiny stand-ins written by `python -m adapter_trainer.demo_models` (seed {seed}), laid out like the real checkpoints.
Use them to run the pipeline offline, never to judge audio quality.

- `llm/`: tiny `LlamaForCausalLM` (hidden {lc.hidden_size}, {lc.num_hidden_layers} layers) with the real Llama 3
  vocabulary ({lc.vocab_size} ids) and tokenizer (converted from `llama_models/llama3/tokenizer.model`).
  {llm_training}
- `musicgen/`: the `facebook/musicgen-small` layout (composite `MusicgenConfig`): a tiny `MusicgenForCausalLM`
  decoder ({mc.num_codebooks} codebooks x {mc.vocab_size} codes, hidden {mc.hidden_size}, {mc.num_hidden_layers}
  layers), its own text encoder, a tiny `T5EncoderModel` (d_model {t5[d_model]}, {t5[num_layers]} layers;
  {t5_training}), and `enc_to_dec_proj` ({t5[d_model]} -> {mc.hidden_size}). The T5 tokenizer is a SentencePiece
  Unigram vocabulary of {t5[vocab_size]} ids in T5's conventions (`<pad>` 0, `</s>` 1 closing every text, `<unk>` 2,
  the 100 sentinels `<extra_id_N>` on top), {t5_vocab_source} (no T5 vocabulary ships offline). No EnCodec weights:
  the `audio_encoder` sub-config is configuration only.
  {mg_training}
{text_encoder_line}
Real runs: `model.llm=/path/to/Llama-3.2-1B model.audio_lm=/path/to/musicgen-small`.
"""


def llama3_special_tokens() -> list[str]:
    """The 256 Llama 3 special tokens in id order (128000 ...), as in llama_models.llama3.tokenizer."""
    named = [BOS_TOKEN, EOS_TOKEN, "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
             "<|eot_id|>", "<|python_tag|>", "<|image|>"]  # fmt: skip
    reserved = [f"<|reserved_special_token_{2 + i}|>" for i in range(LLAMA3_NUM_RESERVED_SPECIAL_TOKENS - len(named))]
    return named + reserved


def llama3_tokenizer_model_path() -> Path:
    """Path of the real Llama 3 tiktoken file shipped by llama-models."""
    import llama_models.llama3 as llama3

    path = Path(llama3.__file__).parent / "tokenizer.model"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; install llama-models (`pip install llama-models`)")
    return path


def build_llama3_tokenizer() -> PreTrainedTokenizerFast:
    """The real Llama 3 tokenizer as a HF fast tokenizer (TikTokenConverter); prepends BOS like Llama-3.2-1B's."""
    from llama_models.llama3.tokenizer import Tokenizer as MetaTokenizer
    from tokenizers import processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = llama3_special_tokens()
    converter = TikTokenConverter(
        vocab_file=str(llama3_tokenizer_model_path()), pattern=MetaTokenizer.pat_str, extra_special_tokens=specials
    )
    backend = converter.converted()
    bos_id = backend.token_to_id(BOS_TOKEN)
    backend.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN}:0 $A:0",
                pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        model_max_length=131_072,
        clean_up_tokenization_spaces=True,
        model_input_names=["input_ids", "attention_mask"],
    )


def musicgen_small_layout_config(decoder: dict, text_encoder: dict) -> MusicgenConfig:
    """Composite config like facebook/musicgen-small's: decoder, text encoder and EnCodec 32 kHz as a plain dict."""
    audio_encoder = {  # facebook/encodec_32khz as used by musicgen-small (configuration only)
        "model_type": "encodec",
        "sampling_rate": 32000,
        "audio_channels": 1,
        "target_bandwidths": [2.2],
        "codebook_size": 2048,
        "codebook_dim": 128,
        "hidden_size": 128,
        "num_filters": 64,
        "num_residual_layers": 1,
        "upsampling_ratios": [8, 5, 4, 4],
        "norm_type": "weight_norm",
        "kernel_size": 7,
        "last_kernel_size": 7,
        "residual_kernel_size": 3,
        "dilation_growth_rate": 2,
        "use_causal_conv": False,
        "pad_mode": "reflect",
        "compress": 2,
        "num_lstm_layers": 2,
        "trim_right_ratio": 1.0,
        "normalize": False,
        "chunk_length_s": None,
        "overlap": None,
        "use_conv_shortcut": False,
    }
    return MusicgenConfig(text_encoder=text_encoder, audio_encoder=audio_encoder, decoder=decoder)


def write_llm(
    out_dir: Path,
    seed: int,
    with_tokenizer: bool = True,
    captions: list[str] | None = None,
    pretrain: PretrainConfig | None = None,
) -> Path:
    """Tiny Llama + real Llama 3 tokenizer into out_dir/llm (with_tokenizer=False skips the conversion). With
    `captions` it is pretrained on them first (settings and losses in llm/demo_pretraining.json)."""
    llm_dir = out_dir / "llm"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config()).eval()
    tokenizer = build_llama3_tokenizer() if with_tokenizer or captions is not None else None
    report = None
    if captions is not None:
        cfg = pretrain or PretrainConfig(seed=seed)
        report = pretrain_on_captions(model, tokenizer, captions, cfg)
    model.save_pretrained(llm_dir, safe_serialization=True)
    follow_umask(llm_dir)  # save_pretrained's model.safetensors is 0600
    if tokenizer is not None:
        tokenizer.save_pretrained(llm_dir)
    if report is not None:
        record = {"config": asdict(cfg), "report": asdict(report), "torch_threads": 1}
        (llm_dir / PRETRAINING_JSON).write_text(json.dumps(record, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return llm_dir


@dataclass
class MusicTrainingSet:
    """What the demo MusicGen is pretrained on: a shard set's train split, and its eval split to score afterwards."""

    shards: str  # the shard-set directory as given
    manifest_sha256: str  # its identity (the trainer's data fingerprint uses the same)
    train: list[Clip]
    eval: list[Clip]


def read_music_training_set(shards: Path, train_split: str = "train", eval_split: str = "eval") -> MusicTrainingSet:
    """The train and eval clips of a shard set (codes only), checked against the tiny MusicGen's K x C."""
    shard_set = read_manifest(shards)
    mc = tiny_musicgen_decoder_config()
    if (shard_set.n_codebooks, shard_set.codebook_size) != (mc.num_codebooks, mc.vocab_size):
        raise ValueError(
            f"{shard_set.manifest_path}: codes of {shard_set.n_codebooks} codebooks x {shard_set.codebook_size}, the "
            f"demo MusicGen reads {mc.num_codebooks} x {mc.vocab_size}; pass the demo shard set (make demo-shards)"
        )
    if train_split not in shard_set.splits:
        raise ValueError(f"{shard_set.manifest_path} has no {train_split!r} split to pretrain the demo MusicGen on")
    return MusicTrainingSet(
        shards=str(shards),
        manifest_sha256=shard_set.manifest_sha256,
        train=load_split([shard_set], train_split),
        eval=load_split([shard_set], eval_split) if eval_split in shard_set.splits else [],
    )


def write_text_encoder(
    out_dir: Path, seed: int, texts: list[str] | None, t5_pretrain: T5PretrainConfig | None = None
) -> dict:
    """MusicGen's T5 encoder, pretrained on `texts` (`t5_pretrain`, steps 0: random init, nothing written), into
    out_dir/text_encoder: it needs only captions, so make demo runs it beside stage 1. Returns the record
    musicgen/demo_pretraining.json keeps under "text_encoder"; `write_musicgen` loads these weights into its T5."""
    torch.manual_seed(seed + 1)
    teacher = build_text_path(MusicgenForCausalLM(tiny_musicgen_decoder_config()), seed, texts)  # the same init
    t5_cfg: T5Config = teacher.text_encoder.config
    t5_run = t5_pretrain or T5PretrainConfig(seed=seed)
    record = {
        "tokenizer": "SentencePiece Unigram (tokenizers' UnigramTrainer), saved as T5Tokenizer",
        "vocab_size": len(teacher.tokenizer),
        "trained_on": f"{len(texts)} captions" if texts else f"FALLBACK_TEXTS ({len(FALLBACK_TEXTS)} fixed sentences)",
        "t5": {k: getattr(t5_cfg, k) for k in ("d_model", "d_kv", "d_ff", "num_layers", "num_heads")},
        "t5_weights": "random init, frozen",
    }
    if not texts or t5_run.steps == 0:
        return record
    report = pretrain_t5_encoder(teacher.text_encoder, teacher.tokenizer, texts, t5_run)
    record["t5_weights"] = (
        f"pretrained by span corruption (T5's objective) on {report.n_captions} captions, then frozen"
    )
    record["pretraining"] = {"config": asdict(t5_run), "report": asdict(report)}
    record["texts_sha256"] = _texts_sha256(texts)
    t5_dir = out_dir / TEXT_ENCODER_DIR
    teacher.text_encoder.save_pretrained(t5_dir)
    (t5_dir / PRETRAINING_JSON).write_text(json.dumps(record, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return record


def _texts_sha256(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def _text_encoder_record(
    out_dir: Path, seed: int, texts: list[str] | None, t5_pretrain: T5PretrainConfig | None
) -> dict:
    """The record of out_dir/text_encoder when it was pretrained with these settings on as many texts; else a fresh
    `write_text_encoder`."""
    t5_run = t5_pretrain or T5PretrainConfig(seed=seed)
    path = out_dir / TEXT_ENCODER_DIR / PRETRAINING_JSON
    if texts and t5_run.steps > 0 and path.is_file():
        record = json.loads(path.read_text())
        if record["pretraining"]["config"] == asdict(t5_run) and record.get("texts_sha256") == _texts_sha256(texts):
            return record
    return write_text_encoder(out_dir, seed, texts, t5_pretrain)


def write_musicgen(
    out_dir: Path,
    seed: int,
    max_shard_size: str | None = None,
    music: MusicTrainingSet | None = None,
    pretrain: MusicPretrainConfig | None = None,
    texts: list[str] | None = None,
    t5_pretrain: T5PretrainConfig | None = None,
) -> Path:
    """Tiny MusicGen with its own text encoder, in the facebook/musicgen-small layout, into out_dir/musicgen.

    max_shard_size (e.g. "300KB") writes sharded safetensors with an index; `texts` trains the T5 tokenizer (None:
    FALLBACK_TEXTS) and pretrains the T5 encoder (`t5_pretrain`, steps 0: random init); then `music` pretrains the
    decoder and `enc_to_dec_proj` with the T5 frozen. musicgen/demo_pretraining.json records what was pretrained.
    """
    mg_dir = out_dir / "musicgen"
    mg_dir.mkdir(parents=True, exist_ok=True)
    dec_cfg = tiny_musicgen_decoder_config()
    torch.manual_seed(seed + 1)
    decoder = MusicgenForCausalLM(dec_cfg).eval()
    teacher = build_text_path(decoder, seed, texts)
    t5_cfg: T5Config = teacher.text_encoder.config
    text_record = _text_encoder_record(out_dir, seed, texts, t5_pretrain)
    if text_record.get("pretraining"):  # the weights `write_text_encoder` pretrained (beside stage 1, in make demo)
        weights = T5EncoderModel.from_pretrained(out_dir / TEXT_ENCODER_DIR).state_dict()
        teacher.text_encoder.load_state_dict(weights)
    record: dict = {"text_encoder": text_record, "torch_threads": 1}
    if music is not None:
        cfg = pretrain or MusicPretrainConfig(seed=seed)
        report = pretrain_music_lm(decoder, music.train, cfg, teacher=teacher, eval_clips=music.eval, eval_split="eval")
        record.update(
            config=asdict(cfg), report=asdict(report), shards=music.shards, manifest_sha256=music.manifest_sha256
        )
    if music is not None or text_record.get("pretraining"):
        (mg_dir / PRETRAINING_JSON).write_text(json.dumps(record, indent=2, sort_keys=True, allow_nan=False) + "\n")
    config = musicgen_small_layout_config(dec_cfg.to_dict(), t5_cfg.to_dict())
    config.save_pretrained(mg_dir)
    teacher.tokenizer.save_pretrained(mg_dir)
    state = composite_state_dict(teacher)
    meta = {"format": "pt"}
    if max_shard_size is None:
        save_safetensors(state, mg_dir / "model.safetensors", metadata=meta)
        return mg_dir
    limit = _parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_safetensors(shard, mg_dir / fname, metadata=meta)
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (mg_dir / "model.safetensors.index.json").write_text(
        json.dumps(index, indent=2, sort_keys=True, allow_nan=False) + "\n"
    )
    return mg_dir


def _parse_size(s: str) -> int:
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9}
    for u, f in units.items():
        if s.upper().endswith(u):
            return int(float(s[: -len(u)]) * f)
    return int(s)


def write_demo_models(
    out_dir: str | Path,
    seed: int = 0,
    captions_csv: str | Path | None = None,
    exclude_csv: str | Path | None = None,
    pretrain: PretrainConfig | None = None,
    shards: str | Path | None = None,
    music_pretrain: MusicPretrainConfig | None = None,
    t5_pretrain: T5PretrainConfig | None = None,
    parts: tuple[str, ...] = ("text", "music"),
) -> dict[str, Path]:
    """Write llm/, musicgen/ and README.md into out_dir; deterministic given the seed, the CSVs and the shards. The
    LLM and MusicGen's T5 encoder are pretrained on `captions_csv` less `exclude_csv`'s ytids, MusicGen's decoder on
    `shards`' train split. `parts`: ("text",) writes what needs only captions, llm/ and text_encoder/ (so it can
    run beside stage 1); ("music",) then writes musicgen/ and README.md beside them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    captions = None
    llm_dir = out / "llm"
    if "text" not in parts and not (llm_dir / "config.json").is_file():
        raise FileNotFoundError(f"{llm_dir} holds no demo LLM: write it first (python -m adapter_trainer.demo_models "
                                f"--part text, with the same --out and captions)")  # fmt: skip
    if captions_csv is None:
        if "text" in parts:
            write_llm(out, seed)
        kind, llm_training = "random init", "Random init: it carries no knowledge."
    else:
        captions, n_excluded = read_captions(Path(captions_csv), Path(exclude_csv) if exclude_csv else None)
        cfg = pretrain or PretrainConfig(seed=seed)
        if "text" in parts:
            write_llm(out, seed, captions=captions, pretrain=cfg)
            write_text_encoder(out, seed, captions, t5_pretrain)
        record = json.loads((llm_dir / PRETRAINING_JSON).read_text())
        cfg, rep = PretrainConfig(**record["config"]), PretrainReport(**record["report"])
        kind = "LLM pretrained on captions"
        llm_training = (
            f"Pretrained as a language model on {rep.n_captions} MusicCaps captions ({n_excluded} rows of the demo "
            f"corpus excluded, from `{Path(exclude_csv).name if exclude_csv else 'nothing'}`), {cfg.steps} steps of "
            f"batch {cfg.batch_size}, softmax over the {rep.n_token_ids} ids that occur: loss {rep.first_loss:.2f} -> "
            f"{rep.final_loss:.2f} nats/token. It stands in for Llama 3.2's knowledge of music vocabulary; the "
            f"trainer freezes it like the real Llama."
        )
    if "music" not in parts:
        return {"llm": llm_dir, "musicgen": out / "musicgen"}
    if shards is None:
        mg_dir = write_musicgen(out, seed, texts=captions, t5_pretrain=t5_pretrain)
        mg_training = "Random init: it carries no knowledge."
    else:
        music = read_music_training_set(Path(shards))
        mcfg = music_pretrain or MusicPretrainConfig(seed=seed)
        mg_dir = write_musicgen(out, seed, music=music, pretrain=mcfg, texts=captions, t5_pretrain=t5_pretrain)
        mrep = MusicPretrainReport(**json.loads((mg_dir / PRETRAINING_JSON).read_text())["report"])
        held = (
            f"; on the {mrep.eval_clips} held-out clips it never saw, {mrep.eval_ce:.2f} nats/code with their own "
            f"captions, {mrep.eval_ce_null:.2f} with the null condition"
            if mrep.eval_ce is not None
            else ""
        )
        mg_training = (
            f"Trained conditionally, as musicgen-small was, on the codes and captions of the {mrep.n_clips} "
            f"`{mrep.split}` clips of `{shards}` ({mrep.n_frames} frames, {mrep.n_captions} distinct captions; the "
            f"eval split is never trained on): the decoder and `enc_to_dec_proj` learn, the T5 stays frozen; "
            f"condition dropout {mcfg.cond_dropout:g} (a dropped row sees MusicGen's null: zero states, mask 0), in "
            f"MusicGen's own delay pattern, {mcfg.steps} steps of {mcfg.batch_size} windows of up to "
            f"{mcfg.max_frames} frames: loss {mrep.first_loss:.2f} -> {mrep.final_loss:.2f} nats/code{held}. It "
            f"stands in for musicgen-small's knowledge of music and its reading of captions; the trainer freezes it "
            f"and starts the adapter's audio tables from its own."
        )
    if shards is not None:
        kind = "MusicGen pretrained on codes" if captions_csv is None else f"{kind}, MusicGen on codes"
    lc, mc = tiny_llama_config(), tiny_musicgen_decoder_config()
    t5 = json.loads((mg_dir / "config.json").read_text())["text_encoder"]
    t5_vocab_source = (
        f"trained on the {len(captions)} MusicCaps captions the LLM pretrains on (the demo corpus's rows excluded)"
        if captions
        else f"trained on {len(FALLBACK_TEXTS)} fixed sentences (`text_encoder.FALLBACK_TEXTS`: no captions given)"
    )
    (out / "README.md").write_text(
        README.format(kind=kind, llm_training=llm_training, mg_training=mg_training, seed=seed, lc=lc, mc=mc, t5=t5,
                      t5_vocab_source=t5_vocab_source, t5_training=_t5_training(mg_dir),
                      text_encoder_line=TEXT_ENCODER_LINE if (out / TEXT_ENCODER_DIR).is_dir() else "")
    )  # fmt: skip
    return {"llm": llm_dir, "musicgen": mg_dir}


def _t5_training(mg_dir: Path) -> str:
    """The README's words on the T5 encoder's weights, from musicgen/demo_pretraining.json."""
    path = mg_dir / PRETRAINING_JSON
    pre = json.loads(path.read_text())["text_encoder"].get("pretraining") if path.is_file() else None
    if pre is None:
        return "random init and frozen (musicgen-small froze its pretrained T5)"
    cfg, rep = T5PretrainConfig(**pre["config"]), T5PretrainReport(**pre["report"])
    held = (
        f"; on the {rep.n_heldout} held-out captions {rep.heldout_loss_init:.2f} at random init -> "
        f"{rep.heldout_loss:.2f}"
        if rep.heldout_loss is not None
        else ""
    )
    return (
        f"pretrained by span corruption, T5's own objective, on the captions the LLM pretrains on "
        f"({rep.n_captions} trained on, {rep.n_heldout} held out), {cfg.steps} steps of {cfg.batch_size}: loss "
        f"{rep.first_loss:.2f} -> {rep.final_loss:.2f} nats per target token{held}; then frozen, as musicgen-small "
        f"froze its pretrained T5"
    )
