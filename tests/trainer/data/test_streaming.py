"""Streaming input: header-only shard index, random-access reads equal to the sequential reader, bounded per-clip
memory, a deterministic global order split across ranks, and worker-built batches equal to in-process ones."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from adapter_trainer.data.clip_reader import ClipReader
from adapter_trainer.data.samples import load_split
from adapter_trainer.data.shards import open_shard_sets
from adapter_trainer.data.split_index import build_index
from adapter_trainer.data.streaming import (
    ExampleSpec,
    TrainBatches,
    caption_ids,
    default_num_workers,
    epoch_permutation,
    train_loader,
)
from adapter_trainer.data.token_layout import AudioVocab
from tests.contract.shard_fixture import synthetic_clips, write_shard_set, write_synthetic_set


def _open(*roots: Path):
    return open_shard_sets([str(r) for r in roots], model_n_codebooks=4, model_codebook_size=2048)


class _WordTokenizer:
    """A picklable stand-in for the HF tokenizer: one id per word (ids from a stable hash)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [3 + sum(map(ord, w)) % 90 for w in text.split()]}


SPEC = ExampleSpec(
    vocab=AudioVocab(text_vocab_size=100, n_codebooks=4, codebook_size=2048),
    pattern="delay",
    text="caption",
    bos_id=1,
    pad_id=2,
    max_seq_len=24,
    max_caption_tokens=6,
)


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("sets")
    a = write_synthetic_set(root / "a", n_train=21, n_eval=5, frames=(8, 30), samples_per_shard=4)
    b = write_shard_set(root / "b", {"train": synthetic_clips(7, seed=5, prefix="bb"), "eval": []}, samples_per_shard=3)
    return [a, b]


def test_index_reads_back_exactly_what_the_sequential_reader_yields(two_sets) -> None:
    sets = _open(*two_sets)
    ref = load_split(sets, "train")
    index = build_index(sets, "train")
    assert len(index) == len(ref) == 28 and len(index.shard_paths) == 6 + 3
    reader = ClipReader(index)
    for i in np.random.default_rng(0).permutation(len(ref)):  # random order: true random access
        got = reader.read(int(i))
        assert got.key == ref[i].key == index.key(int(i))
        assert got.caption == ref[i].caption and got.aspects == ref[i].aspects
        assert got.codes.dtype == np.int16 and np.array_equal(got.codes, ref[i].codes)
    assert [index.key(i) for i in range(len(index))] == [c.key for c in ref]  # same order as load_split
    assert len(build_index(sets, "eval", max_clips=3)) == 3


def test_index_keeps_under_half_a_kilobyte_per_clip_and_no_codes(two_sets) -> None:
    index = build_index(_open(*two_sets), "train")
    per_clip = index.nbytes() / len(index)
    assert per_clip <= 64, per_clip  # the per-clip location arrays (target: <= 512)
    assert not any(isinstance(v, (list, dict)) for v in vars(index).values())  # no per-clip Python objects


def test_index_opens_no_tar(two_sets, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the index reads the sidecars alone: not one byte of a tar."""
    import builtins

    read = {"n": 0}
    real_open = builtins.open

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            read["n"] += len(data)
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    def counting_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return Counting(f) if str(file).endswith(".tar") and "b" in mode else f

    sets = _open(*two_sets)
    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(tarfile, "bltn_open", counting_open)
    assert len(build_index(sets, "train")) == 28 and read["n"] == 0


def test_two_ranks_of_four_see_exactly_the_examples_of_one_process_of_eight(two_sets) -> None:
    """Global order = one-process order; rank r builds its slice of each global batch, across epoch ends too."""
    index = build_index(_open(*two_sets), "train")  # N = 28: global batch 8 crosses epochs at 24 -> 32
    one = TrainBatches(index, _WordTokenizer(), SPEC, seed=3, batch_size=8)
    ranks = [TrainBatches(index, _WordTokenizer(), SPEC, seed=3, batch_size=4, rank=r, world_size=2) for r in (0, 1)]
    assert one.global_batch == ranks[0].global_batch == 8
    seen = []
    for start in range(0, 8 * 9, 8):  # 9 micro-batches = 72 examples, 2+ epochs
        ref = one[start]
        parts = [r[start] for r in ranks]
        assert ref.keys == parts[0].keys + parts[1].keys
        for name in ("tokens", "labels", "is_audio", "attention_mask"):  # same crops, right-padded per batch
            for b in range(8):
                part = parts[b // 4]
                n = int(part.attention_mask[b % 4].sum())
                assert n == int(ref.attention_mask[b].sum())
                assert torch.equal(getattr(part, name)[b % 4, :n], getattr(ref, name)[b, :n])
        seen += ref.keys
    # epochs are permutations: every clip once per epoch, in the seeded order
    assert sorted(seen[:28]) == sorted(index.key(i) for i in range(28))
    assert seen[:28] == [index.key(int(i)) for i in epoch_permutation(3, 0, 28)]
    assert seen[28:56] == [index.key(int(i)) for i in epoch_permutation(3, 1, 28)]
    assert seen[:28] != seen[28:56]


@pytest.mark.parametrize("workers", [2])
def test_worker_built_batches_equal_in_process_batches_and_resume_mid_stream(two_sets, workers: int) -> None:
    """More workers than the set has shards for this rank (2 ranks x 2 workers, 1-shard set) must neither hang
    nor change a batch; starting the loader at a later position continues the same stream (exact resume)."""
    index = build_index(_open(two_sets[1]), "train")  # set b: 7 clips in 3 shards
    ds = TrainBatches(index, _WordTokenizer(), SPEC, seed=1, batch_size=2, rank=1, world_size=2)
    inproc = [b.keys for b in train_loader(ds, start=0, n_micro_batches=6, num_workers=0, prefetch_factor=2)]
    worker = [b.keys for b in train_loader(ds, start=0, n_micro_batches=6, num_workers=workers, prefetch_factor=2)]
    assert inproc == worker and len(inproc) == 6
    resumed = [b.keys for b in train_loader(ds, start=3 * 4, n_micro_batches=3, num_workers=workers, prefetch_factor=2)]
    assert resumed == inproc[3:]


def test_default_workers_is_bounded() -> None:
    assert 1 <= default_num_workers() <= 8
    assert default_num_workers(local_world_size=1024) == 1


def test_start_crop_prob_anchors_that_share_of_crops_at_the_clip_start(two_sets) -> None:
    """data.start_crop_prob: 0 gives exactly the crops of a run without the option, 1 starts every crop at frame 0,
    0.5 about half of them (the draw has its own stream, so the other crops are unchanged)."""
    from dataclasses import replace

    from adapter_trainer.data.streaming import train_crop

    index = build_index(_open(two_sets[0]), "train")  # clips of 8-30 frames, windows of ~15: most crops can move
    reader = ClipReader(index)

    def first_codes(spec: ExampleSpec) -> list[bool]:
        """Per example of 10 batches: does its audio start with its clip's frame 0?"""
        ds = TrainBatches(index, _WordTokenizer(), spec, seed=4, batch_size=4)
        out = []
        for start in range(0, 40, 4):
            batch = ds[start]
            for b, key in enumerate(batch.keys):
                clip = reader.read(next(i for i in range(len(index)) if index.key(i) == key))
                a = int((batch.tokens[b, :, 0] == spec.vocab.audio_start).nonzero()[0])
                first = int(batch.tokens[b, a + 1, 0]) - spec.vocab.audio_offset  # frame's codebook-0 code
                out.append(first == int(clip.codes[0, 0]) and clip.codes.shape[0] > 15)
        return out

    base = TrainBatches(index, _WordTokenizer(), SPEC, seed=4, batch_size=4)
    off = TrainBatches(index, _WordTokenizer(), replace(SPEC, start_crop_prob=0.0), seed=4, batch_size=4)
    assert all(torch.equal(base[s].tokens, off[s].tokens) for s in range(0, 40, 4))
    long_clips = sum(first_codes(replace(SPEC, start_crop_prob=1.0)))
    at_start_random = sum(first_codes(SPEC))
    at_start_half = sum(first_codes(replace(SPEC, start_crop_prob=0.5)))
    assert long_clips > 10  # every long clip's crop starts at frame 0
    assert at_start_random < long_clips / 3 and at_start_random < at_start_half < long_clips
    rng = np.random.default_rng(0)
    assert train_crop(0.0, rng) == "random" and rng.bit_generator.state == np.random.default_rng(0).bit_generator.state


def test_the_held_out_eval_reads_no_eval_clip_before_its_first_use(tmp_path: Path, monkeypatch) -> None:
    """Built at setup, the held-out scoring reads nothing of the eval split (so a start reads no eval tar before step
    1): each clip's caption is read from its json member and tokenized at the first report, once."""
    from adapter_trainer.evaluation.held_out import HeldOutEval

    reads: list[int] = []
    real = ClipReader.read_text_fields
    monkeypatch.setattr(ClipReader, "read_text_fields", lambda self, i: (reads.append(i), real(self, i))[1])
    sets = _open(write_synthetic_set(tmp_path / "s", n_train=2, n_eval=5))
    index = build_index(sets, "eval")
    tok = _WordTokenizer()
    held = HeldOutEval(index, tok, SPEC, np.zeros((4, 2048)), n_derangements=2, seed=0)
    assert reads == []
    texts = [ClipReader(index).read(i).caption for i in range(5)]
    assert [c.tolist() for c in held.captions] == [caption_ids(tok, None, SPEC, text=t) for t in texts]
    assert held.texts == texts
    assert sorted(reads) == list(range(5))  # once per clip, whatever is asked after


def test_distinct_texts_counts_a_shared_caption_once_from_the_json_members_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two train clips share one caption: 3 clips, 2 distinct captions; the codes are never decoded to count them."""
    import adapter_trainer.data.clip_reader as clip_reader_module
    from adapter_trainer.data.streaming import distinct_texts

    clips = [(k, cap, c) for (k, _, c), cap in zip(synthetic_clips(3, seed=4, prefix="dc"), ("same", "same", "other"))]
    more = synthetic_clips(9, seed=6, prefix="gn")  # 4 genre captions among 9 clips
    index = build_index(_open(write_shard_set(tmp_path / "s", {"train": clips + more}, samples_per_shard=4)), "train")

    def no_codes(*args, **kwargs):
        raise AssertionError("counting captions decoded a clip's codes")

    monkeypatch.setattr(clip_reader_module, "decode_sample", no_codes)
    monkeypatch.setattr(np, "load", no_codes)
    want = len({cap for _, cap, _ in clips + more})
    assert want == 2 + len({cap for _, cap, _ in more}) < len(index) == 12
    assert distinct_texts(index, "caption") == want
    assert distinct_texts(index, "aspects") == 1  # every synthetic clip's aspect_list is ["synthetic"]
