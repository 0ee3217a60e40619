"""`python -m tokenizer_pipeline.push SET URL` and `python -m tokenizer_pipeline.verify URL`.

Destinations: a directory, moto's S3 (`s3_server`), the Hub stand-in (`hub_server`); `verify` also reads the
fault-injecting HTTP server (`http_server`). The set is tests/contract/shard_fixture.py's (3 train shards, 1 eval).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from tests.contract.shard_fixture import write_synthetic_set
from tokenizer_pipeline.push import main as push_main
from tokenizer_pipeline.remote import destinations, retry
from tokenizer_pipeline.remote.dataset_card import dataset_card
from tokenizer_pipeline.remote.push import manifest_changes
from tokenizer_pipeline.remote.urls import HubTarget, RemoteError, is_url, local_path, parse_hub
from tokenizer_pipeline.verify import main as verify_main  # the command: directories and URLs

TARS = ["train/shard-000000.tar", "train/shard-000001.tar", "train/shard-000002.tar", "eval/shard-000000.tar"]
INDEXES = ["train/index.safetensors", "eval/index.safetensors"]
SET_FILES = [*TARS, *INDEXES, "failures.jsonl", "manifest.json"]
K, C = 3, 512  # not the fixture's defaults: the dataset card must read them from the manifest


@pytest.fixture
def shard_set(tmp_path: Path) -> Path:
    """A valid set of 4 tars (6 train clips, 2 eval), plus the writer's internals a push must leave behind."""
    root = write_synthetic_set(
        tmp_path / "set", n_train=6, n_eval=2, samples_per_shard=2, frames=(4, 6), n_codebooks=K, codebook_size=C
    )
    (root / ".lock").write_bytes(b"")
    (root / ".progress").mkdir()
    (root / ".progress" / "config.json").write_text("{}")
    (root / "LICENSE.txt").write_text("CC BY-SA 4.0 (MusicCaps metadata)\n")
    return root


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three tries, millisecond waits: a test of a fault does not sleep for a minute."""
    monkeypatch.setattr(retry, "DEFAULT", retry.Policy(tries=3, base_s=0.001, cap_s=0.01, retry_after_cap_s=0.05))


def run(capsys: pytest.CaptureFixture, main, *args: str) -> tuple[int, list[str], list[str]]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err.splitlines()


def uploaded(lines: list[str]) -> set[str]:
    return {line.split()[1] for line in lines if line.startswith("uploaded ")}


def skipped(lines: list[str]) -> set[str]:
    return {line.split()[1] for line in lines if line.startswith("skipped ")}


def flip_byte(data: bytes, at: int = 700) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def set_files(root: Path, names: list[str] = SET_FILES) -> dict[str, bytes]:
    return {n: (root / n).read_bytes() for n in names}


# ------------------------------------------------------------------------------------------- a directory


def test_push_to_a_directory_copies_the_set_and_verify_passes(shard_set: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "copy"
    rc, out, err = run(capsys, push_main, str(shard_set), str(dest))
    assert (rc, err) == (0, [])
    assert uploaded(out) == {*SET_FILES, "LICENSE.txt"}
    assert out[-1].startswith(f"pushed {shard_set} to {dest}: 9 file(s) uploaded")
    assert {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} == {*SET_FILES, "LICENSE.txt"}
    assert set_files(dest) == set_files(shard_set)  # no .lock, no .progress/, no temp file left
    assert run(capsys, verify_main, f"file://{dest}")[0] == 0


def test_a_second_push_uploads_nothing(shard_set: Path, tmp_path: Path, capsys) -> None:
    run(capsys, push_main, str(shard_set), str(tmp_path / "copy"))
    rc, out, _ = run(capsys, push_main, str(shard_set), str(tmp_path / "copy"))
    assert rc == 0
    assert (uploaded(out), skipped(out)) == (set(), {*SET_FILES, "LICENSE.txt"})
    assert "0 file(s) uploaded" in out[-1]


def renames_into(dest: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files a push renames into place under `dest`, in order (the list fills as it runs)."""
    order: list[str] = []
    real = destinations.os.replace

    def replace(src, dst) -> None:
        order.append(Path(dst).relative_to(dest).as_posix())
        real(src, dst)

    monkeypatch.setattr(destinations.os, "replace", replace)
    return order


def test_the_manifest_is_renamed_into_place_last(shard_set: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    order = renames_into(tmp_path / "copy", monkeypatch)
    assert run(capsys, push_main, str(shard_set), str(tmp_path / "copy"), "--jobs", "3")[0] == 0
    assert order[-1] == "manifest.json" and set(order[:6]) == {*TARS, *INDEXES}


def test_the_index_sidecars_go_before_the_manifest(tmp_path: Path, capsys, monkeypatch) -> None:
    """Format 5: each split's index.safetensors is part of the set, sent before the manifest that lists it."""
    root = write_synthetic_set(tmp_path / "set", n_train=6, n_eval=2, samples_per_shard=2, frames=(4, 6),
                               n_codebooks=K, codebook_size=C)  # fmt: skip
    order = renames_into(tmp_path / "copy", monkeypatch)
    assert run(capsys, push_main, str(root), str(tmp_path / "copy"))[0] == 0
    assert order[-1] == "manifest.json"
    assert {"train/index.safetensors", "eval/index.safetensors"} <= set(order[:-1])
    assert run(capsys, verify_main, str(tmp_path / "copy"))[0] == 0


def test_an_interrupted_push_resumes_and_no_manifest_before_the_end(
    shard_set: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    dest = tmp_path / "copy"
    real = destinations.DirectoryDestination._send

    def send(self, f) -> None:
        if f.rel == TARS[1]:
            raise OSError(28, "No space left on device")
        real(self, f)

    monkeypatch.setattr(destinations.DirectoryDestination, "_send", send)
    rc, out, err = run(capsys, push_main, str(shard_set), str(dest), "--jobs", "1")
    assert rc == 2 and len(err) == 1 and TARS[1] in err[0] and "No space left" in err[0]
    before = {TARS[3], TARS[0]}  # the manifest lists eval first (the fixture sorts its keys)
    assert uploaded(out) == before and not (dest / "manifest.json").exists()
    monkeypatch.undo()
    monkeypatch.setattr(retry, "DEFAULT", retry.Policy(tries=1))
    rc, out, _ = run(capsys, push_main, str(shard_set), str(dest))
    assert rc == 0
    assert skipped(out) == before
    assert uploaded(out) == {*SET_FILES, "LICENSE.txt"} - before
    assert set_files(dest) == set_files(shard_set)


def test_a_corrupted_local_tar_is_refused_before_anything_is_sent(shard_set: Path, tmp_path: Path, capsys) -> None:
    tar = shard_set / TARS[2]
    tar.write_bytes(flip_byte(tar.read_bytes()))
    rc, out, err = run(capsys, push_main, str(shard_set), str(tmp_path / "copy"))
    assert rc == 2 and out == [] and len(err) == 1
    assert err[0].startswith("error: ") and TARS[2] in err[0] and "sha256" in err[0]
    assert not (tmp_path / "copy").exists()


def test_a_missing_listed_tar_is_refused_naming_it(shard_set: Path, tmp_path: Path, capsys) -> None:
    (shard_set / TARS[3]).unlink()
    rc, _, err = run(capsys, push_main, str(shard_set), str(tmp_path / "copy"))
    assert rc == 2 and len(err) == 1 and f"{TARS[3]}: listed in the manifest but missing" in err[0]


def test_an_update_prints_what_changes_and_replaces_the_manifest(shard_set: Path, tmp_path: Path, capsys) -> None:
    dest = tmp_path / "copy"
    run(capsys, push_main, str(shard_set), str(dest))
    bigger = write_synthetic_set(
        tmp_path / "bigger", n_train=8, n_eval=2, samples_per_shard=2, frames=(4, 6), n_codebooks=K, codebook_size=C
    )
    rc, out, _ = run(capsys, push_main, str(bigger), str(dest))
    assert rc == 0
    assert any("holds another manifest.json" in line for line in out)
    change = "  split train: 6 clips in 3 shards -> 8 clips in 4 shards"
    size = (bigger / "manifest.json").stat().st_size
    assert change in out and out.index(change) < out.index(f"uploaded manifest.json ({size:,} bytes)")
    assert (dest / "manifest.json").read_bytes() == (bigger / "manifest.json").read_bytes()
    assert run(capsys, verify_main, str(dest))[0] == 0


def test_manifest_changes_name_codec_and_rewritten_shards() -> None:
    old = {"format": "f", "format_version": 1, "codec": {"n_codebooks": 4}, "splits": {"train": {"n_samples": 2,
           "shards": [{"path": "train/shard-000000.tar", "sha256": "a"}]}}, "totals": {"rows": 2}}  # fmt: skip
    new = json.loads(json.dumps(old))
    new["codec"]["n_codebooks"] = 8
    new["splits"]["train"]["shards"][0]["sha256"] = "b"
    assert manifest_changes(json.dumps(old).encode(), new) == [
        "codec.n_codebooks: 4 -> 8",
        "split train: 1 shard(s) rewritten",
    ]
    assert manifest_changes(b"not json", new) == ["the destination's manifest.json is not a manifest; it is replaced"]


def test_http_is_read_only_and_the_destination_is_not_the_set(shard_set: Path, capsys) -> None:
    rc, _, err = run(capsys, push_main, str(shard_set), "https://example.org/set")
    assert rc == 2 and len(err) == 1 and "read-only" in err[0]
    rc, _, err = run(capsys, push_main, str(shard_set), str(shard_set))
    assert rc == 2 and len(err) == 1 and "the shard set itself" in err[0]


# ------------------------------------------------------------------------------------------- URLs, retries


def test_url_parsing() -> None:
    assert is_url("s3://b/p") and is_url("file:///x") and not is_url("build/shards") and not is_url("/abs/path")
    assert local_path("file:///tmp/a%20b") == Path("/tmp/a b") and local_path("s3://b/p") is None
    assert parse_hub("hf://datasets/me/set") == HubTarget("me/set", None, "")
    assert parse_hub("hf://datasets/me/set@dev/sub/dir/") == HubTarget("me/set", "dev", "sub/dir")
    assert parse_hub("hf://datasets/me/set@refs%2Fpr%2F3") == HubTarget("me/set", "refs/pr/3", "")
    with pytest.raises(RemoteError, match="hf://datasets/<owner>/<name>"):
        parse_hub("hf://models/me/model")


class _HTTPError(Exception):
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"server said {status}")
        self.response = type("R", (), {"status_code": status, "headers": headers or {}})()


def _flaky(errors: list[Exception]):
    calls = []

    def fn() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return "ok"

    return fn, calls


def test_retries_cure_503_429_and_timeouts_and_honour_retry_after() -> None:
    waits: list[float] = []
    fn, calls = _flaky([_HTTPError(503), _HTTPError(429, {"Retry-After": "7"}), TimeoutError("slow")])
    policy = retry.Policy(tries=4, base_s=1.0, cap_s=2.0, retry_after_cap_s=60)
    assert retry.with_retries(fn, what="x", url="u", policy=policy, sleep=waits.append) == "ok"
    assert len(calls) == 4 and waits[1] == 7.0
    assert 0 <= waits[0] <= 1.0 and 0 <= waits[2] <= 2.0  # full jitter under the capped exponential


@pytest.mark.parametrize("status", [401, 403, 404])
def test_auth_and_not_found_are_never_retried(status: int) -> None:
    fn, calls = _flaky([_HTTPError(status)])
    with pytest.raises(RemoteError, match=f"uploading a.tar: s3://b/a.tar: HTTP {status}"):
        retry.with_retries(fn, what="uploading a.tar", url="s3://b/a.tar", sleep=lambda s: None)
    assert len(calls) == 1


def test_retries_are_bounded_and_the_error_names_file_url_and_last_status() -> None:
    fn, calls = _flaky([_HTTPError(500), ConnectionResetError("reset"), _HTTPError(502)])
    with pytest.raises(RemoteError) as e:
        retry.with_retries(fn, what="uploading a.tar", url="s3://b/a.tar", policy=retry.Policy(tries=3), sleep=bool)
    assert len(calls) == 3 and "\n" not in str(e.value)
    assert str(e.value).startswith("uploading a.tar: s3://b/a.tar: failed 3 times, last HTTP 502")


# ------------------------------------------------------------------------------------------- missing backends


@pytest.mark.parametrize("url, extra", [("s3://bucket/set", "s3"), ("gs://bucket/set", "gcs")])
def test_a_missing_backend_is_one_line_naming_the_extra(
    shard_set: Path, url: str, extra: str, capsys, monkeypatch
) -> None:
    registry = sys.modules["fsspec.registry"]._registry  # fsspec caches the classes it has imported
    module = {"s3": "s3fs", "gcs": "gcsfs"}[extra]
    monkeypatch.setitem(sys.modules, module, None)  # `import s3fs` raises ImportError
    for scheme in ("s3", "gs"):
        monkeypatch.delitem(registry, scheme, raising=False)
    line = f"error: {url}: {url.split(':')[0]}:// needs {module}, which is not installed: pip install 'tokenizer-pipeline[{extra}]'"
    assert run(capsys, push_main, str(shard_set), url)[1:] == ([], [line])
    assert run(capsys, verify_main, url) == (2, [], [line])


# ------------------------------------------------------------------------------------------- the dataset card


def test_the_card_leaves_out_what_the_manifest_lacks() -> None:
    m = {"format": "musiccaps-encodec-shards", "format_version": 4, "codec": {"n_codebooks": 4},
         "splits": {"train": {"n_samples": 3, "shards": [{}]}}, "source": {"kind": "audiofolder"}}  # fmt: skip
    card = dataset_card(m, HubTarget("me/own", None, ""))
    assert "license:" not in card and "None" not in card and "sample rate" not in card
    assert "records no license" in card and "| train | 3 | 1 |" in card


# ------------------------------------------------------------------------------------------- S3 (moto)


@pytest.fixture
def put_order(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Keys of the objects s3fs PUTs, in the order the PUTs complete."""
    from s3fs import S3FileSystem

    order: list[str] = []
    real = S3FileSystem._put_file

    async def put_file(self, lpath, rpath, *args, **kwargs):
        out = await real(self, lpath, rpath, *args, **kwargs)
        order.append(rpath.split("/", 2)[-1])
        return out

    monkeypatch.setattr(S3FileSystem, "_put_file", put_file)
    return order


def s3_objects(s3, bucket: str, prefix: str) -> dict[str, bytes]:
    client = s3.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    return {k.removeprefix(prefix): client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def test_push_to_s3_writes_the_manifest_last_and_verify_reads_it_back(
    shard_set: Path, s3_env, put_order: list[str], capsys
) -> None:
    url = s3_env.make_bucket("sets") + "/one"
    rc, out, err = run(capsys, push_main, str(shard_set), url)
    assert (rc, err) == (0, [])
    assert s3_objects(s3_env, "sets", "one/") == set_files(shard_set, [*SET_FILES, "LICENSE.txt"])
    assert put_order[-1] == "manifest.json" and set(put_order[:6]) == {*TARS, *INDEXES}
    rc, out, err = run(capsys, verify_main, url)
    local_summary = run(capsys, verify_main, str(shard_set))[1][0]
    assert (rc, err) == (0, []) and out == [local_summary.replace(str(shard_set), url)]
    assert f"K={K}, C={C}" in out[0]
    rc, out, _ = run(capsys, push_main, str(shard_set), url)
    assert rc == 0 and uploaded(out) == set() and len(skipped(out)) == 9 and len(put_order) == 9


def test_an_interrupted_s3_push_leaves_no_manifest_and_resumes(
    shard_set: Path, s3_env, put_order: list[str], capsys, monkeypatch
) -> None:
    from botocore.exceptions import ClientError
    from s3fs import S3FileSystem

    url = s3_env.make_bucket("sets") + "/one"
    real = S3FileSystem._put_file

    async def failing(self, lpath, rpath, *args, **kwargs):
        if rpath.endswith(TARS[1]):
            raise ClientError({"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")
        return await real(self, lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(S3FileSystem, "_put_file", failing)
    rc, out, err = run(capsys, push_main, str(shard_set), url, "--jobs", "1")
    assert rc == 2 and len(err) == 1
    assert f"uploading {TARS[1]}: {url}/{TARS[1]}: failed 3 times, last HTTP 503" in err[0]
    there = set(s3_objects(s3_env, "sets", "one/"))
    assert there == uploaded(out) == {TARS[3], TARS[0]}  # eval first: the manifest's order
    monkeypatch.setattr(S3FileSystem, "_put_file", real)
    put_order.clear()
    rc, out, _ = run(capsys, push_main, str(shard_set), url)
    assert rc == 0 and skipped(out) == there and uploaded(out) == {*SET_FILES, "LICENSE.txt"} - there
    assert s3_objects(s3_env, "sets", "one/") == set_files(shard_set, [*SET_FILES, "LICENSE.txt"])


def test_a_partial_s3_destination_gets_only_the_missing_files(shard_set: Path, s3_env, capsys) -> None:
    url = s3_env.make_bucket("sets") + "/one"
    for rel in TARS[:2]:
        s3_env.client().upload_file(str(shard_set / rel), "sets", f"one/{rel}")
    rc, out, _ = run(capsys, push_main, str(shard_set), url)
    assert rc == 0 and skipped(out) == set(TARS[:2]) and uploaded(out) == {*SET_FILES, "LICENSE.txt"} - set(TARS[:2])


def test_a_corrupted_s3_tar_fails_verify_and_is_uploaded_again(shard_set: Path, s3_env, capsys) -> None:
    url = s3_env.make_bucket("sets") + "/one"
    run(capsys, push_main, str(shard_set), url)
    key = f"one/{TARS[1]}"
    s3_env.client().put_object(Bucket="sets", Key=key, Body=flip_byte((shard_set / TARS[1]).read_bytes()))
    rc, _, err = run(capsys, verify_main, url)
    assert rc == 1 and f"  - {TARS[1]}: sha256 differs from the manifest (corrupted or rewritten)" in err
    rc, out, _ = run(capsys, push_main, str(shard_set), url)
    assert rc == 0 and uploaded(out) == {TARS[1]} and len(skipped(out)) == 8
    assert s3_objects(s3_env, "sets", "one/")[TARS[1]] == (shard_set / TARS[1]).read_bytes()
    assert run(capsys, verify_main, url)[0] == 0


def test_a_corrupted_local_tar_sends_nothing_to_s3(shard_set: Path, s3_env, capsys) -> None:
    url = s3_env.make_bucket("sets") + "/one"
    tar = shard_set / TARS[0]
    tar.write_bytes(flip_byte(tar.read_bytes()))
    rc, out, err = run(capsys, push_main, str(shard_set), url)
    assert rc == 2 and out == [] and len(err) == 1 and TARS[0] in err[0]
    assert s3_objects(s3_env, "sets", "") == {}


def test_a_missing_bucket_is_one_line(shard_set: Path, s3_env, capsys) -> None:
    rc, _, err = run(capsys, push_main, str(shard_set), "s3://no-such-bucket/set")
    assert rc == 2 and len(err) == 1 and "no-such-bucket" in err[0] and "HTTP 404" in err[0]


# ------------------------------------------------------------------------------------------- verify over HTTP


def serve(shard_set: Path, http_server) -> str:
    import shutil

    shutil.copytree(shard_set, http_server.root / "set")
    return f"{http_server.url}/set"


def test_verify_over_http_retries_transient_faults(shard_set: Path, http_server, capsys) -> None:
    url = serve(shard_set, http_server)
    http_server.fail(f"set/{TARS[0]}", 503, times=2)
    http_server.fail(f"set/{TARS[1]}", 429, times=1, retry_after=0.01)
    http_server.truncate(f"set/{TARS[2]}", 100, times=1)
    http_server.drop("set/manifest.json", times=1)
    rc, out, err = run(capsys, verify_main, url)
    assert (rc, err) == (0, []) and out[0].startswith(f"OK {url}: 4 shards")
    assert http_server.count(f"set/{TARS[0]}") == 3 and http_server.count(f"set/{TARS[1]}") == 2


def test_verify_over_http_names_a_corrupted_tar_and_does_not_retry_403(shard_set: Path, http_server, capsys) -> None:
    url = serve(shard_set, http_server)
    http_server.flip(f"set/{TARS[2]}", offset=700, times=5)
    http_server.fail(f"set/{TARS[0]}", 403, times=5)
    rc, _, err = run(capsys, verify_main, url)
    assert rc == 1 and err[0].startswith(f"FAILED {url}: ")  # and the split's counts, short of the unread tar
    assert f"  - {TARS[2]}: sha256 differs from the manifest (corrupted or rewritten)" in err
    assert any(e.startswith(f"  - {TARS[0]}: not read: downloading {TARS[0]}: {url}/{TARS[0]}: HTTP 403") for e in err)
    assert http_server.count(f"set/{TARS[0]}") == 1


def test_verify_of_a_url_without_a_set_says_so(http_server, capsys) -> None:
    url = f"{http_server.url}/nothing"
    rc, _, err = run(capsys, verify_main, url)
    assert rc == 1
    assert err[1] == f"  - {url}/manifest.json missing: the set is incomplete (manifest.json is written last)"


# ------------------------------------------------------------------------------------------- the Hub (stand-in)

REPO = "me/musiccaps-codes"
HUB_URL = f"hf://datasets/{REPO}"


def test_push_to_the_hub_commits_tars_then_manifest_and_card(shard_set: Path, hub_server, capsys) -> None:
    rc, out, err = run(capsys, push_main, str(shard_set), HUB_URL)
    assert (rc, err) == (0, [])
    files = hub_server.files(REPO)
    assert {k: v for k, v in files.items() if k in SET_FILES or k == "LICENSE.txt"} == set_files(
        shard_set, [*SET_FILES, "LICENSE.txt"]
    )
    assert set(files) == {*SET_FILES, "LICENSE.txt", "README.md", ".gitattributes"}
    final, tars, initial = hub_server.commits(REPO)
    # no manifest before the last commit
    assert set(hub_server.files(REPO, tars)) == {*TARS, *INDEXES, ".gitattributes"}
    assert (
        out[-1] == f"revision {final}: train from it with python -m adapter_trainer 'data.shards=[{HUB_URL}@{final}]'"
    )
    rc, out, err = run(capsys, verify_main, f"{HUB_URL}@{final}")
    assert (rc, err) == (0, []) and out[0].startswith(f"OK {HUB_URL}@{final}: 4 shards, 8 samples")
    rc, out, _ = run(capsys, push_main, str(shard_set), HUB_URL)
    assert rc == 0 and uploaded(out) == set() and len(skipped(out)) == 10
    assert hub_server.commits(REPO)[0] == final  # nothing committed


def test_the_dataset_card_holds_the_manifest_s_codec_and_splits(shard_set: Path, hub_server, capsys) -> None:
    assert run(capsys, push_main, str(shard_set), HUB_URL)[0] == 0
    card = hub_server.files(REPO)["README.md"].decode()
    front = card.split("---\n")[1]
    assert "license: cc-by-sa-4.0\n" in front and "- text-to-audio\n" in front
    for text in (
        f"| codebooks | K = {K} codebooks × C = {C} codes |",
        "| sample rate | 32000 Hz |",
        "| frame rate | 50.0 frames/s |",
        "| train | 6 | 3 |",
        "| eval | 2 | 1 |",
        "Format `musiccaps-encodec-shards` version 5",
        f"python -m adapter_trainer 'data.shards=[{HUB_URL}@<revision>]'",
        "Creative Commons Attribution-ShareAlike 4.0",
    ):
        assert text in card, text


def test_hub_commits_are_batched_and_a_partial_repo_gets_only_the_missing_tars(
    shard_set: Path, hub_server, capsys, monkeypatch
) -> None:
    from tokenizer_pipeline.remote import hub

    monkeypatch.setattr(hub, "MAX_FILES_PER_COMMIT", 1)
    hub_server.add_repo(REPO, {TARS[0]: (shard_set / TARS[0]).read_bytes()})
    rc, out, _ = run(capsys, push_main, str(shard_set), HUB_URL)
    assert rc == 0 and skipped(out) == {TARS[0]}
    assert uploaded(out) == {*SET_FILES, "LICENSE.txt", "README.md"} - {TARS[0]}
    commits = hub_server.commits(REPO)
    assert len(commits) == 1 + 5 + 1 + 1  # the final commit, one per missing tar or index, the seed, the initial commit
    for sha in commits[1:]:
        assert "manifest.json" not in hub_server.files(REPO, sha)


def test_a_failing_hub_commit_is_one_line_and_the_next_push_completes(
    shard_set: Path, hub_server, capsys, monkeypatch
) -> None:
    hub_server.add_repo(REPO, {})
    hub_server.fail(f"api/datasets/{REPO}/commit/main", 500, times=100)
    rc, out, err = run(capsys, push_main, str(shard_set), HUB_URL)
    assert rc == 2 and uploaded(out) == set() and len(err) == 1
    assert err[0].startswith("error: tokenizer_pipeline.push: files 1-6 of 6: " + HUB_URL) and "HTTP 500" in err[0]
    assert "manifest.json" not in hub_server.files(REPO)
    hub_server.clear_faults()
    assert run(capsys, push_main, str(shard_set), HUB_URL)[0] == 0
    assert run(capsys, verify_main, HUB_URL)[0] == 0


def test_a_corrupted_tar_on_the_hub_fails_verify_and_is_committed_again(
    shard_set: Path, hub_server, capsys, tmp_path: Path, monkeypatch
) -> None:
    assert run(capsys, push_main, str(shard_set), HUB_URL)[0] == 0
    hub_server.add_repo(REPO, {TARS[3]: flip_byte((shard_set / TARS[3]).read_bytes())})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    rc, _, err = run(capsys, verify_main, HUB_URL)
    assert rc == 1 and f"  - {TARS[3]}: sha256 differs from the manifest (corrupted or rewritten)" in err
    assert list((tmp_path / "tmp").iterdir()) == []  # the downloads are gone
    rc, out, _ = run(capsys, push_main, str(shard_set), HUB_URL)
    assert rc == 0 and uploaded(out) == {TARS[3]} and len(skipped(out)) == 9
    assert run(capsys, verify_main, HUB_URL)[0] == 0


def test_verify_reads_a_hub_branch_at_one_commit(shard_set: Path, hub_server, capsys) -> None:
    assert run(capsys, push_main, str(shard_set), HUB_URL)[0] == 0
    head = hub_server.commits(REPO)[0]
    hub_server.clear_log()
    rc, out, _ = run(capsys, verify_main, HUB_URL)
    assert rc == 0 and out[0].startswith(f"OK {HUB_URL}: 4 shards")
    reads = [r.path for r in hub_server.requests if "/resolve/" in r.path]
    assert len(reads) >= 5 and all(f"/resolve/{head}/" in p for p in reads)  # manifest and 4 tars
    rc, out, err = run(capsys, verify_main, "hf://datasets/me/no-such-set")
    assert (rc, out, len(err)) == (2, [], 1) and "HTTP 404" in err[0]
