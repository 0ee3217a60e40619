"""Shard sets at URLs, read by the trainer: the same batches, token for token, from local, HTTP and S3 copies (world
sizes 1 and 2, DataLoader workers, a resume), a cache bound smaller than the set held, a corrupt shard never trained
on, a Hub revision pinned for the whole run, and torchrun's two ranks x two workers sharing one bounded cache."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from adapter_trainer.data.remote.cache import BOOKKEEPING_BYTES, ShardCache, ShardCacheError
from adapter_trainer.data.remote.urls import pin
from adapter_trainer.data.shards import open_shard_sets
from adapter_trainer.data.split_index import build_index
from adapter_trainer.data.streaming import TrainBatches, train_loader
from adapter_trainer.training.data_setup import plan_remote_reads
from adapter_trainer.training.distributed import RankInfo
from tests.contract.shard_fixture import write_synthetic_set
from tests.remote.disk import du_bytes
from tests.trainer.data.test_streaming import SPEC, _WordTokenizer

B, N_BATCHES = 4, 10  # 12 train shards of 4 clips: 10 micro-batches of 4 or 8 cover the set more than once


@pytest.fixture(scope="module")
def local_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("set") / "set"
    return write_synthetic_set(root, n_train=48, n_eval=8, frames=(12, 24), samples_per_shard=4)


def set_bytes(root: Path) -> int:
    return sum(s["bytes"] for split in json.loads((root / "manifest.json").read_text())["splits"].values()
               for s in split["shards"])  # fmt: skip


def upload_to_s3(s3, local: Path, bucket: str) -> str:
    url = s3.make_bucket(bucket)
    client = s3.client()
    for p in sorted(local.rglob("*")):
        if p.is_file():
            client.upload_file(str(p), bucket, f"sets/demo/{p.relative_to(local).as_posix()}")
    return f"{url}/sets/demo"


def batches(root: str, cache: ShardCache | None, *, world: int, rank: int, start: int = 0, n: int = N_BATCHES,
            workers: int = 2) -> list[tuple[list[str], torch.Tensor]]:  # fmt: skip
    """(keys, tokens) of rank `rank`'s micro-batches from `start`, read as training reads them (workers, prefetch)."""
    sets = open_shard_sets([root], model_n_codebooks=4, model_codebook_size=2048, cache=cache)
    index = build_index(sets, "train")
    ds = TrainBatches(index, _WordTokenizer(), SPEC, seed=5, batch_size=B, rank=rank, world_size=world)
    dist = RankInfo(rank=rank, world_size=world, local_rank=rank, local_world_size=world)
    prefetcher = plan_remote_reads(ds, index, dist, lookahead=3)
    loader = train_loader(ds, start=start, n_micro_batches=n, num_workers=workers, prefetch_factor=2,
                          on_position=prefetcher.advance if prefetcher else None)  # fmt: skip
    try:
        return [(list(b.keys), b.tokens.clone()) for b in loader]
    finally:
        if prefetcher is not None:  # also when a read fails: no thread outlives the test
            prefetcher.close()


def same(a, b) -> bool:
    return len(a) == len(b) and all(ka == kb and torch.equal(ta, tb) for (ka, ta), (kb, tb) in zip(a, b))


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.multiprocess)])
def test_http_and_s3_copies_give_the_local_batches_under_a_quarter_set_bound(
    world, local_set, http_server, s3_env, tmp_path
) -> None:
    shutil.copytree(local_set, http_server.root / "demo")
    urls = {"http": f"{http_server.url}/demo", "s3": upload_to_s3(s3_env, local_set, "shards")}
    bound = set_bytes(local_set) // 4 + BOOKKEEPING_BYTES  # three 4-clip shards and the cache's own files
    for rank in range(world):
        want = batches(str(local_set), None, world=world, rank=rank)
        for name, url in urls.items():
            cache = ShardCache(tmp_path / f"cache-{name}", max_bytes=bound)  # the ranks of a node share it
            got = batches(url, cache, world=world, rank=rank)
            assert same(got, want), (name, rank)
            assert cache.stats()["peak_bytes"] <= bound and cache.used_bytes() <= bound, (name, cache.stats())
            assert cache.stats()["evictions"] > 0  # the bound really was smaller than the set
            # resume at micro-batch 6 (an integer position): the same examples as the uninterrupted stream
            resumed = batches(url, cache, world=world, rank=rank, start=6 * B * world, n=N_BATCHES - 6)
            assert same(resumed, want[6:]), (name, rank)


def test_an_indexed_remote_set_starts_without_a_tar_and_gives_the_same_batches(
    local_set, http_server, tmp_path
) -> None:
    """Format 5 over HTTP under a tight bound: indexing both splits downloads the two index sidecars and no tar, and
    the batches (and a resume) equal the local scanned set's token for token (the same tars). The sidecars are kept
    within the bound when it has room for them (and evicted first when tars need it); at the smallest bound (one tar)
    they are read and not kept."""
    v5 = write_synthetic_set(tmp_path / "v5", n_train=48, n_eval=8, frames=(12, 24), samples_per_shard=4)
    assert all((v5 / p.relative_to(local_set)).read_bytes() == p.read_bytes() for p in local_set.rglob("*.tar"))
    shutil.copytree(v5, http_server.root / "v5")
    url = f"{http_server.url}/v5"
    indexes = sum(s["index"]["bytes"] for s in json.loads((v5 / "manifest.json").read_text())["splits"].values())
    quarter = set_bytes(local_set) // 4 + BOOKKEEPING_BYTES
    one_tar = max(s["bytes"] for split in json.loads((v5 / "manifest.json").read_text())["splits"].values()
                  for s in split["shards"]) + BOOKKEEPING_BYTES  # the smallest bound accepted  # fmt: skip
    want = batches(str(local_set), None, world=1, rank=0)
    for name, bound, kept in (("room", quarter + indexes, 2), ("tight", one_tar, 0)):
        cache = ShardCache(tmp_path / name, max_bytes=bound)
        sets = open_shard_sets([url], model_n_codebooks=4, model_codebook_size=2048, cache=cache)
        assert len(build_index(sets, "train")) == 48 and len(build_index(sets, "eval")) == 8
        assert cache.stats()["downloads"] == 0 and len(list((tmp_path / name / "indexes").iterdir())) == kept, name
        assert same(batches(url, cache, world=1, rank=0), want)
        assert same(batches(url, cache, world=1, rank=0, start=6 * B, n=N_BATCHES - 6), want[6:])
        assert cache.stats()["peak_bytes"] <= bound and du_bytes(tmp_path / name) <= bound, name


def test_the_ranks_of_a_node_download_each_index_sidecar_once(local_set, http_server, tmp_path) -> None:
    """Four ranks of one node (threads here, each with its own cache object on the node's cache dir) start at once on
    a cold cache: each split's sidecar is downloaded once, the others wait for it and read the node's copy."""
    import threading

    v5 = write_synthetic_set(tmp_path / "v5", n_train=48, n_eval=8, frames=(12, 24), samples_per_shard=4)
    shutil.copytree(v5, http_server.root / "v5")
    url = f"{http_server.url}/v5"
    http_server.delay("v5/*/index.safetensors", 0.5, times=8)  # a slow store: the ranks overlap
    sizes: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def rank() -> None:
        try:
            sets = open_shard_sets([url], model_n_codebooks=4, model_codebook_size=2048,
                                   cache=ShardCache(tmp_path / "node-cache"))  # fmt: skip
            sizes.append((len(build_index(sets, "train")), len(build_index(sets, "eval"))))
        except BaseException as e:  # re-raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=rank) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    assert sizes == [(48, 8)] * 4
    assert http_server.count("v5/train/index.safetensors") == 1
    assert http_server.count("v5/eval/index.safetensors") == 1


def test_a_corrupt_remote_shard_is_never_read(local_set, s3_env, tmp_path) -> None:
    url = upload_to_s3(s3_env, local_set, "corrupt")
    cache = ShardCache(tmp_path / "cache")
    batches(url, cache, world=1, rank=0, n=1, workers=0)  # indexes the set (the header scans are cached)
    client = s3_env.client()
    key = "sets/demo/train/shard-000003.tar"
    body = bytearray(client.get_object(Bucket="corrupt", Key=key)["Body"].read())
    body[700] ^= 0xFF  # inside the first sample's codes
    client.put_object(Bucket="corrupt", Key=key, Body=bytes(body))
    fresh = ShardCache(tmp_path / "fresh")  # nothing verified yet: the shard must come from the URL
    with pytest.raises(ShardCacheError, match=r"shard train/shard-000003\.tar: s3://corrupt/.*shard-000003\.tar has "
                                              r"sha256 .* manifest lists"):  # fmt: skip
        batches(url, fresh, world=1, rank=0, workers=0)
    assert not list((tmp_path / "fresh").glob("*.tar")) or all(
        p.name
        != f"{json.loads((local_set / 'manifest.json').read_text())['splits']['train']['shards'][3]['sha256']}.tar"
        for p in (tmp_path / "fresh").glob("*.tar")
    )


def test_a_hub_revision_is_pinned_to_its_commit(local_set, hub_server, tmp_path) -> None:
    files = {p.relative_to(local_set).as_posix(): p.read_bytes() for p in local_set.rglob("*") if p.is_file()}
    first = hub_server.add_repo("acme/demo-codes", files)
    url = pin("hf://datasets/acme/demo-codes")
    assert url == f"hf://datasets/acme/demo-codes@{first}"
    assert pin("hf://datasets/acme/demo-codes@main/") == url + "/"
    # main moves on (a new manifest): the pinned URL still reads the revision the run started from
    changed = dict(files, **{"manifest.json": files["manifest.json"].replace(b'"eval"', b'"eval" ', 1)})
    hub_server.add_repo("acme/demo-codes", changed)
    cache = ShardCache(tmp_path / "cache", max_bytes=set_bytes(local_set) // 3 + BOOKKEEPING_BYTES)
    got = batches(url, cache, world=1, rank=0, n=4)
    assert same(got, batches(str(local_set), None, world=1, rank=0, n=4))
    pinned = open_shard_sets([url], model_n_codebooks=4, model_codebook_size=2048, cache=cache)[0]
    local = open_shard_sets([str(local_set)], model_n_codebooks=4, model_codebook_size=2048)[0]
    assert pinned.manifest_sha256 == local.manifest_sha256  # the fingerprint's data identity: same bytes
    moved = open_shard_sets([pin("hf://datasets/acme/demo-codes")], model_n_codebooks=4, model_codebook_size=2048)
    assert moved[0].manifest_sha256 != local.manifest_sha256  # a resume on the moved branch would be refused


@pytest.mark.multiprocess
@pytest.mark.budget(120, reason="a one-process reference and a torchrun run of 2 ranks x 2 workers, musicgen tower")
def test_torchrun_two_ranks_two_workers_share_one_bounded_cache(http_server, tmp_path) -> None:
    """2 ranks x 2 workers on one node read an HTTP copy through one cache smaller than the set: the losses, eval
    and examples equal a one-process run on the local directory (rel 1e-4, as tests/trainer/training). A stalled
    download (a rank waiting minutes for an answer its forked workers had made it miss) spends no CPU: it fails
    here as a stall (tests/run_end.py) rather than passing after aiohttp's 5-minute timeout."""
    from adapter_trainer.demo.models import write_demo_models
    from tests.trainer.helpers import run_recipe_recording_keys
    from tests.trainer.training.test_distributed import GLOBAL_BATCH, STEPS, compose, losses, overrides, run_two_ranks

    models = write_demo_models(tmp_path / "models", seed=0)
    shards = write_synthetic_set(tmp_path / "shards", n_train=20, n_eval=7, frames=(12, 30), samples_per_shard=4)
    shutil.copytree(shards, http_server.root / "set")
    bound = set_bytes(shards) // 3 + BOOKKEEPING_BYTES
    ref_out, out = tmp_path / "one", tmp_path / "two"
    ref, ref_keys = run_recipe_recording_keys(
        compose(overrides(models, shards, ref_out, GLOBAL_BATCH, "trainer.num_workers=0"))
    )
    cache_dir = tmp_path / "cache"
    run_two_ranks(
        overrides(
            models,
            f"{http_server.url}/set",
            out,
            GLOBAL_BATCH // 2,
            "trainer.num_workers=2",
            f"data.cache.dir={cache_dir}",
            f"data.cache.max_bytes={bound}",
        ),  # fmt: skip
        out,
    )
    r0 = json.loads((out / "dump.json").read_text())
    r1 = json.loads((out / "dump.json.rank1").read_text())
    assert [a + b for a, b in zip(r0["keys_seen"], r1["keys_seen"])] == ref_keys
    ref_l, got_l = losses(ref_out), losses(out)
    assert sorted(got_l) == list(range(1, STEPS + 1))
    for s in ref_l:
        assert got_l[s] == pytest.approx(ref_l[s], rel=1e-4), s
    got = json.loads((out / "final_metrics.json").read_text())
    for key in ("ce", "unigram_ce", "caption_gain"):
        assert got["eval"][key] == pytest.approx(ref["eval"][key], rel=1e-4, abs=1e-5), key
    stats = ShardCache(cache_dir).stats()
    assert 0 < stats["peak_bytes"] <= bound and stats["evictions"] > 0, stats
    # the run's adapter exports: the set's manifest is read back from its URL and matches the checkpoint's
    import subprocess
    import sys

    exported = subprocess.run(
        [sys.executable, "-m", "adapter_trainer.export", str(out), "--out", str(tmp_path / "adapter")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-2000:]
    acfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert acfg["shards"]["sets"][0]["path"] == f"{http_server.url}/set"
    assert (
        acfg["shards"]["sets"][0]["manifest_sha256"]
        == hashlib.sha256((shards / "manifest.json").read_bytes()).hexdigest()
    )
    sources = json.loads((out / "data_sources.json").read_text())
    assert sources == [{"given": f"{http_server.url}/set", "read_from": f"{http_server.url}/set",
                        "manifest_sha256": json.loads((ref_out / "data_sources.json").read_text())[0]["manifest_sha256"]}]  # fmt: skip
    assert not list(cache_dir.glob("*.part"))


SPAWNED = """
import json, multiprocessing, sys
from pathlib import Path
from adapter_trainer.data.remote.cache import ShardCache
from tests.remote.test_remote_sets import batches

multiprocessing.set_start_method("spawn", force=True)
got = batches(sys.argv[1], ShardCache(Path(sys.argv[2]), max_bytes=int(sys.argv[3])), world=1, rank=0, n=6)
print(json.dumps([[keys, tokens.tolist()] for keys, tokens in got]))
"""


@pytest.mark.multiprocess
def test_spawned_workers_read_the_same_batches_through_the_cache(local_set, http_server, tmp_path) -> None:
    """DataLoader workers started with `spawn` (macOS's default) get the cache and the planner pickled, and make
    their own HTTP clients: same batches as the local directory, bound held."""
    import os
    import subprocess
    import sys

    from tests import REPO

    shutil.copytree(local_set, http_server.root / "demo")
    bound = set_bytes(local_set) // 4 + BOOKKEEPING_BYTES
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SPAWNED, f"{http_server.url}/demo", str(tmp_path / "cache"), str(bound)],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    want = batches(str(local_set), None, world=1, rank=0, n=6, workers=0)
    assert [k for k, _ in got] == [k for k, _ in want]
    assert all(torch.equal(torch.tensor(t), w) for (_, t), (_, w) in zip(got, want))
    assert ShardCache(tmp_path / "cache").stats()["peak_bytes"] <= bound


def test_a_resume_on_a_changed_set_is_refused_naming_where_the_revision_is_recorded(tmp_path) -> None:
    from adapter_trainer.training.checkpoint import ResumeError, check_fingerprint

    with pytest.raises(ResumeError, match=r"data\.manifest_sha256: checkpoint=\['a'\] run=\['b'\].*data_sources\.json"):
        check_fingerprint({"data.manifest_sha256": ["a"]}, {"data.manifest_sha256": ["b"]}, tmp_path)


def test_a_bound_below_one_shard_is_refused_before_any_fetch_and_a_tight_one_noted(local_set, http_server) -> None:
    from adapter_trainer.config import ConfigError
    from adapter_trainer.training.data_setup import check_cache_bound

    shutil.copytree(local_set, http_server.root / "demo")
    sets = open_shard_sets([f"{http_server.url}/demo"], model_n_codebooks=4, model_codebook_size=2048)
    largest = max(e.bytes for entries in sets[0].splits.values() for e in entries)
    http_server.clear_log()

    two_ranks = RankInfo(rank=0, world_size=2, local_rank=0, local_world_size=2)
    room = largest + BOOKKEEPING_BYTES  # one shard beside the cache's own files
    with pytest.raises(ConfigError, match=rf"max_bytes={room - 1} cannot hold the largest remote shard \({largest} "):
        check_cache_bound(room - 1, 2, sets, two_ranks)
    note = check_cache_bound(room + 2 * largest, 2, sets, two_ranks)
    assert note and "holds 3 shard(s)" in note and "reads up to 6 at once" in note
    assert str(6 * largest + BOOKKEEPING_BYTES) in note
    assert check_cache_bound(6 * largest + BOOKKEEPING_BYTES, 2, sets, two_ranks) is None
    assert check_cache_bound(0, 2, sets, two_ranks) is None
    assert not http_server.count("*.tar", method=None)  # decided from the manifest alone


def test_a_mixture_with_a_remote_set_reads_like_the_local_mixture(local_set, http_server, tmp_path) -> None:
    """{path: URL, weight: W} entries: the mixture's order, and so the batches, do not depend on where a set lives."""
    from adapter_trainer.data.mixture import MixtureOrder, sample_weights, split_spans
    from tests.contract.shard_fixture import synthetic_clips, write_shard_set

    other = write_shard_set(
        tmp_path / "b",
        {"train": synthetic_clips(12, frames=(12, 24), seed=7, prefix="mb"),
         "eval": synthetic_clips(4, frames=(12, 24), seed=8, prefix="mv")},
        samples_per_shard=4,
    )  # fmt: skip
    shutil.copytree(other, http_server.root / "b")

    def mixture_batches(roots: list[str], cache: ShardCache | None) -> list:
        sets = open_shard_sets(roots, model_n_codebooks=4, model_codebook_size=2048, cache=cache)
        index = build_index(sets, "train")
        spans = split_spans(sets, "train", len(index))
        order = MixtureOrder(5, spans, [1.0, 3.0], sample_weights=sample_weights(sets, index, spans, "train"))
        ds = TrainBatches(index, _WordTokenizer(), SPEC, seed=5, batch_size=B, order=order)
        prefetcher = plan_remote_reads(ds, index, RankInfo(), lookahead=3)
        loader = train_loader(ds, start=0, n_micro_batches=8, num_workers=2, prefetch_factor=2,
                              on_position=prefetcher.advance if prefetcher else None)  # fmt: skip
        try:
            return [(list(b.keys), b.tokens.clone()) for b in loader]
        finally:
            if prefetcher is not None:
                prefetcher.close()

    cache = ShardCache(tmp_path / "cache", max_bytes=set_bytes(other) // 2 + BOOKKEEPING_BYTES)
    got = mixture_batches([str(local_set), f"{http_server.url}/b"], cache)
    assert same(got, mixture_batches([str(local_set), str(other)], None))
    assert any(k.startswith("mb") for keys, _ in got for k in keys)  # the remote set is really drawn
    assert cache.stats()["peak_bytes"] <= cache.max_bytes


def test_a_failed_prefetch_is_said_in_one_line_and_the_reader_fetches_the_shard(
    local_set, http_server, tmp_path, capfd
) -> None:
    """The prefetcher meets a server error the readers do not (it passed): the run goes on, the reader fetches the
    shard itself, and close() raises nothing."""
    import time

    from adapter_trainer.data.clip_reader import ClipReader

    shutil.copytree(local_set, http_server.root / "demo")
    cache = ShardCache(tmp_path / "cache", tries=1)
    sets = open_shard_sets([f"{http_server.url}/demo"], model_n_codebooks=4, model_codebook_size=2048, cache=cache)
    index = build_index(sets, "train")
    for p in (tmp_path / "cache").glob("*.tar"):
        p.unlink()  # nothing cached: the prefetcher has work
    ds = TrainBatches(index, _WordTokenizer(), SPEC, seed=5, batch_size=B)
    http_server.fail("demo/train/*", 503, times=1000)
    prefetcher = plan_remote_reads(ds, index, RankInfo(), lookahead=2)
    prefetcher.advance(0)
    deadline = time.monotonic() + 30
    while prefetcher.failures == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    http_server.clear_faults()
    assert prefetcher.failures >= 1
    clip = ClipReader(index).read(int(ds.order.clip(0, 0)))  # the reader fetches it
    assert clip.key == ds.reader.read(int(ds.order.clip(0, 0))).key
    prefetcher.close()  # no error: the run's reads succeeded
    err = capfd.readouterr().err
    assert "prefetch of shard train/" in err and "its reader will fetch it" in err
    assert all("Traceback" not in line for line in err.splitlines())
