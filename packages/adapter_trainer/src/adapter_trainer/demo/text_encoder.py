"""The demo MusicGen's own text path: a tiny frozen T5 encoder, its T5-kind tokenizer and `enc_to_dec_proj`.

No T5 vocabulary ships offline, so a SentencePiece Unigram tokenizer is trained on the demo captions in T5's
conventions (`<pad>` 0, `</s>` 1, `<unk>` 2, the 100 sentinels `<extra_id_N>` on top) and saved as `T5Tokenizer`.
The encoder (random init here; t5_pretrain.py pretrains it on captions) is wider (128) than the decoder (64), so the
projection exists as in musicgen-small.
"""

from __future__ import annotations

import json

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from torch import nn
from transformers import MusicgenForCausalLM, T5Config, T5EncoderModel, T5Tokenizer

from adapter_trainer.model.teacher import MusicgenTeacher

T5_VOCAB_PIECES = 4096  # the Unigram trainer's target (a small text gives fewer)
T5_MAX_LENGTH = 512  # t5-base's model_max_length
T5_SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2, as in every T5 vocabulary
T5_EXTRA_IDS = 100  # span corruption's sentinels, the vocabulary's top ids: `<extra_id_0>` the last, as in T5
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
        dropout_rate=0.0,  # frozen and run in eval mode (t5_pretrain.py pretrains it without dropout, as T5 v1.1)
        is_encoder_decoder=False,
        use_cache=False,
    )


def train_t5_tokenizer(texts: list[str] | tuple[str, ...], vocab_size: int = T5_VOCAB_PIECES) -> T5Tokenizer:
    """A SentencePiece Unigram vocabulary of up to `vocab_size` pieces trained on `texts`, then T5's
    `T5_EXTRA_IDS` sentinels (`<extra_id_99>` ... `<extra_id_0>`, the last id), as transformers' `T5Tokenizer`.

    The trainer runs over hash maps, so its output is made canonical: the characters it adds get their scores in
    character order, scores are rounded to `SCORE_DECIMALS` and pieces sorted by (score, piece): same texts, same ids."""
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
    vocab += [(f"<extra_id_{i}>", 0.0) for i in reversed(range(T5_EXTRA_IDS))]  # as t5-base's spiece.model
    return T5Tokenizer(vocab=vocab, extra_ids=T5_EXTRA_IDS, model_max_length=T5_MAX_LENGTH)


def _canonical_required_chars(scores: dict[str, float]) -> dict[str, float]:
    """The characters UnigramTrainer adds after EM score min + k * REQUIRED_CHAR_STEP in an order that changes
    between runs: give them those scores in sorted order."""
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
    """Tokenizer, random-init frozen T5 encoder and fresh `enc_to_dec_proj` around `decoder`; deterministic given
    the seed and the texts."""
    tokenizer = train_t5_tokenizer(texts if texts else FALLBACK_TEXTS)
    torch.manual_seed(seed + 2)
    text_encoder = T5EncoderModel(tiny_t5_encoder_config(len(tokenizer))).eval().requires_grad_(False)
    proj = nn.Linear(text_encoder.config.d_model, decoder.config.hidden_size)
    nn.init.normal_(proj.weight, mean=0.0, std=0.02)  # transformers' init of the composite's enc_to_dec_proj
    nn.init.zeros_(proj.bias)
    return MusicgenTeacher(decoder, text_encoder, proj, tokenizer, source="demo")


def composite_state_dict(teacher: MusicgenTeacher) -> dict[str, torch.Tensor]:
    """musicgen-small's model.safetensors tensors for these parts: `decoder.*`, `text_encoder.*` (tied duplicates left
    out, as `save_pretrained` does) and `enc_to_dec_proj.*`; no `audio_encoder.*`."""
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
