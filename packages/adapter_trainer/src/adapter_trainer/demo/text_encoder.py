"""The demo MusicGen's own text path: a tiny frozen T5 encoder, its T5-kind tokenizer and `enc_to_dec_proj`.

facebook/musicgen-small reads a caption through t5-base (a SentencePiece Unigram vocabulary of 32,100 pieces, a
768-wide encoder, frozen during MusicGen's training) and a trained `enc_to_dec_proj` (Linear 768 -> 1024, with bias)
into every decoder layer's cross-attention. No T5 vocabulary ships offline, so the demo trains its own:

- tokenizer: a SentencePiece Unigram model trained here with the `tokenizers` library on the MusicCaps captions the
  demo corpus does not use (the rows the demo Llama pretrains on), `T5_VOCAB_PIECES` pieces, in T5's conventions:
  `<pad>` id 0, `</s>` id 1 (appended to every text), `<unk>` id 2, whitespace split + Metaspace ("▁"), no
  `<extra_id_*>` sentinels (they serve T5's span-corruption pretraining, which this T5 never had). It is saved as
  transformers' own `T5Tokenizer` (tokenizer.json + tokenizer_config.json), so `AutoTokenizer.from_pretrained` of
  the MusicGen folder loads it. Unlike t5-base's it has no normalizer: T5Tokenizer keeps only a SentencePiece
  precompiled charsmap (NFKC), which only SentencePiece's own trainer writes; a character never seen in training is
  `<unk>` (t5-base has no byte fallback either). Without captions (random-init demo models, the tests' fixtures) it is trained on
  `FALLBACK_TEXTS`, a few fixed music descriptions: a vocabulary of a few hundred pieces, in milliseconds.
- encoder: `T5EncoderModel` at `tiny_t5_encoder_config`'s sizes (d_model 128: unlike the decoder's 64, so the
  projection exists as in musicgen-small), random init and frozen: its states are a fixed random code of the
  caption's pieces, which the decoder's cross-attention and the projection learn to read (music_pretrain.py).
- projection: `nn.Linear(d_model, decoder hidden)` with bias, transformers' init (normal 0.02, bias 0).

`build_text_path` returns them as a `MusicgenTeacher` around a given decoder, the object evaluation loads back from
the saved folder (model/teacher.py): training and scoring condition through the same code.
"""

from __future__ import annotations

import json

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from torch import nn
from transformers import MusicgenForCausalLM, T5Config, T5EncoderModel, T5Tokenizer

from adapter_trainer.model.teacher import MusicgenTeacher

T5_VOCAB_PIECES = 4096  # the Unigram trainer's target (reached on the ~4,500 MusicCaps captions the corpus leaves out)
T5_MAX_LENGTH = 512  # t5-base's model_max_length
T5_SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2, as in every T5 vocabulary
SCORE_DECIMALS = 4  # Unigram log-probabilities kept to 1e-4 (see train_t5_tokenizer)
REQUIRED_CHAR_STEP = 1e-4  # tokenizers' UnigramTrainer: the score step between the characters it adds
# the tokenizer's training text when no captions are given: fixed, so a random-init folder is deterministic
FALLBACK_TEXTS = (
    "A calm solo piano piece with soft sustained chords and gentle reverb.",
    "An energetic rock song with distorted electric guitars, punchy drums and a male voice singing loudly.",
    "A lo-fi hip hop beat with a mellow bass line, vinyl crackle and a relaxed groove.",
    "Upbeat electronic dance music with a four on the floor kick, synth pads and a catchy lead melody.",
    "A slow acoustic folk ballad: fingerpicked guitar, a female vocal and a harmonica.",
    "An orchestral film score with strings, brass, timpani and a dramatic, epic mood.",
    "A jazz trio plays a swinging tune: upright bass, brushed drums and a piano solo.",
    "Ambient music with a drone, field recordings and a slowly evolving texture. Low quality recording.",
)


def tiny_t5_encoder_config(vocab_size: int) -> T5Config:
    """t5-base's layout (relu feed-forward, relative position buckets) at demo sizes: d_model 128, 2 layers, 4 heads."""
    return T5Config(
        vocab_size=vocab_size,
        d_model=128,
        d_kv=32,
        d_ff=256,
        num_layers=2,
        num_heads=4,
        feed_forward_proj="relu",
        dropout_rate=0.0,  # frozen and run in eval mode anyway
        is_encoder_decoder=False,
        use_cache=False,
    )


def train_t5_tokenizer(texts: list[str] | tuple[str, ...], vocab_size: int = T5_VOCAB_PIECES) -> T5Tokenizer:
    """A SentencePiece Unigram vocabulary trained on `texts` (tokenizers' UnigramTrainer), as transformers'
    `T5Tokenizer`: `<pad>` 0, `</s>` 1 appended to every text, `<unk>` 2, whitespace split + Metaspace.

    The trainer is not deterministic to the bit (its sums and its set of required characters run over hash maps),
    so its output is put in a canonical form: each character it had to add (score min + k * 1e-4, k = 0, 1, ... in
    hash order) gets the same scores in character order, every score is rounded to `SCORE_DECIMALS`, and pieces are
    sorted by (score, piece), as SentencePiece orders them: the same texts give the same ids. A small text gives
    fewer pieces than `vocab_size` (the trainer's ceiling)."""
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("no text to train the T5 tokenizer on")
    backend = Tokenizer(models.Unigram())
    backend.pre_tokenizer = _t5_pre_tokenizer()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=list(T5_SPECIALS), unk_token="<unk>", show_progress=False
    )
    backend.train_from_iterator(texts, trainer)
    trained = [(piece, score) for piece, score in json.loads(backend.to_str())["model"]["vocab"]]
    if [p for p, _ in trained[:3]] != list(T5_SPECIALS):
        raise RuntimeError(f"the Unigram trainer put {trained[:3]} first, not T5's {T5_SPECIALS}")
    scores = _canonical_required_chars(dict(trained[3:]))
    pieces = sorted(
        ((round(score, SCORE_DECIMALS), piece) for piece, score in scores.items()), key=lambda x: (-x[0], x[1])
    )
    vocab = [(p, 0.0) for p in T5_SPECIALS] + [(piece, score) for score, piece in pieces]
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=T5_MAX_LENGTH)


def _canonical_required_chars(scores: dict[str, float]) -> dict[str, float]:
    """The characters UnigramTrainer adds after EM (each character of the text that no kept piece covers) score
    min + k * REQUIRED_CHAR_STEP, k = 0, 1, ... in an order that changes between runs: give the same scores to the
    same characters in sorted order."""
    low = min(scores.values())
    singles = sorted((s, p) for p, s in scores.items() if len(p) == 1)
    block = []
    for score, piece in singles:
        if abs(score - (low + len(block) * REQUIRED_CHAR_STEP)) > 1e-9:
            break
        block.append(piece)
    out = dict(scores)
    for k, piece in enumerate(sorted(block)):
        out[piece] = low + k * REQUIRED_CHAR_STEP
    return out


def _t5_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """T5Tokenizer's own pre-tokenizer (transformers/models/t5/tokenization_t5.py)."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        ]
    )


def build_text_path(
    decoder: MusicgenForCausalLM, seed: int, texts: list[str] | tuple[str, ...] | None = None
) -> MusicgenTeacher:
    """Tokenizer (trained on `texts`, else `FALLBACK_TEXTS`), a random-init frozen T5 encoder sized to it and a fresh
    `enc_to_dec_proj`, around `decoder`. Deterministic given the seed and the texts; leaves the global RNG seeded."""
    tokenizer = train_t5_tokenizer(texts if texts else FALLBACK_TEXTS)
    torch.manual_seed(seed + 2)
    text_encoder = T5EncoderModel(tiny_t5_encoder_config(len(tokenizer))).eval().requires_grad_(False)
    proj = nn.Linear(text_encoder.config.d_model, decoder.config.hidden_size)
    nn.init.normal_(proj.weight, mean=0.0, std=0.02)  # transformers' init of the composite's enc_to_dec_proj
    nn.init.zeros_(proj.bias)
    return MusicgenTeacher(decoder, text_encoder, proj, tokenizer, source="demo")


def composite_state_dict(teacher: MusicgenTeacher) -> dict[str, torch.Tensor]:
    """The tensors facebook/musicgen-small's model.safetensors holds for these parts: `decoder.*`, `text_encoder.*`
    (T5EncoderModel's, its tied `encoder.embed_tokens.weight` left out as `save_pretrained` does) and
    `enc_to_dec_proj.*`; no `audio_encoder.*` (the trainer never builds a codec)."""
    state: dict[str, torch.Tensor] = {}
    parts = {"decoder.": teacher.decoder, "text_encoder.": teacher.text_encoder}
    if teacher.enc_to_dec_proj is not None:
        parts["enc_to_dec_proj."] = teacher.enc_to_dec_proj
    for prefix, module in parts.items():
        seen: set[int] = set()
        for name, t in module.state_dict().items():
            if t.data_ptr() in seen:  # a tied duplicate (T5's encoder.embed_tokens is its shared table)
                continue
            seen.add(t.data_ptr())
            state[prefix + name] = t.detach().contiguous().clone()
    return state
