"""One smoke test per benchmark script: each bench_*.py runs end to end as `python benchmarks/SCRIPT ...` (the way
run_benchmarks.py runs it), at tiny sizes on tiny inputs made here (never build/demo: every run's working directory is
a temporary one), and the figures it writes are finite numbers. A script whose interface drifts from the packages'
fails here the day it drifts (bench_generate's copy of the old sampler once met a KV cache it no longer fitted), not
the day someone runs `make bench`. No timing target is checked here: those live in the benchmarks and
docs/benchmarks.md.

The script itself runs in this process, set up as the interpreter sets up a script (run_script): what a fresh
interpreter would add is only the imports of torch, transformers and the packages (4-8 s a script), which this
process has made already. The processes a script starts (each case of bench_data, bench_memory, bench_pipeline, ...,
torchrun's ranks) are processes here as in `make bench`.

The scripts that start several processes each (bench_pipeline, bench_data, bench_ddp, bench_memory, bench_download,
bench_byo, bench_remote, bench_startup, demo_recipe, bench_realsize --compare-towers: about 4.5 CPU minutes together) are marked `bench_smoke`:
`make test-bench` runs them, and CI runs it after `make test`; the lighter scripts' smoke runs stay in `make test`.

bench_gpu.py has its own smoke run (--smoke-cpu) in test_bench_gpu.py; caption_scaling.py (`make caption-scaling`)
fits a codec, pretrains an LLM, encodes, trains and generates in a dozen stages (4-6 min even at its smallest), so its
end-to-end run is marked slow (`make test-slow`); its logic is tested in test_caption_scaling.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import runpy
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
# the scripts covered elsewhere (see the module docstring)
SMOKED_ELSEWHERE = {"bench_gpu.py": "tests/benchmarks/test_bench_gpu.py"}

_spec = importlib.util.spec_from_file_location("run_benchmarks", BENCH / "run_benchmarks.py")
run_benchmarks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_benchmarks)


# ---------------------------------------------------------------------------------------------- helpers


# what every run sets in the environment (its children inherit it): one intra-op thread, no shard-index cache in the
# user's home
SCRIPT_ENV = {"OMP_NUM_THREADS": "1"}


@contextlib.contextmanager
def as_a_script(script: Path, argv: Sequence[str], cwd: Path) -> Iterator[None]:
    """This process set up as `python SCRIPT ARGV` run from `cwd` finds itself, and put back after: sys.argv, the
    script's directory first on sys.path (its sibling imports), the working directory, SCRIPT_ENV (and torch's one
    intra-op thread). The sibling modules the script imported are dropped after, so the next script imports them
    afresh, as a new interpreter would."""
    import torch

    threads_before, modules_before = torch.get_num_threads(), set(sys.modules)
    with pytest.MonkeyPatch.context() as mp:  # argv, sys.path, cwd and SCRIPT_ENV put back on exit
        mp.setattr(sys, "argv", [str(script), *argv])
        mp.syspath_prepend(str(script.parent))
        mp.chdir(cwd)
        for k, v in SCRIPT_ENV.items():
            mp.setenv(k, v)
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads_before)
            for name in set(sys.modules) - modules_before:
                if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == script.parent:
                    del sys.modules[name]


def run_script(script: Path, argv: Sequence[str], cwd: Path) -> None:
    """`python SCRIPT ARGV` from `cwd` (as_a_script), run as __main__ in this process; fails on a non-zero exit."""
    with as_a_script(script, argv, cwd):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as e:
            assert e.code in (None, 0), f"{script.name} exited {e.code}"


def run_bench(script: str, out: Path, *args: str) -> dict:
    """`python benchmarks/SCRIPT --out OUT ARGS` from OUT's (temporary) directory (run_script); returns the JSON it
    wrote."""
    out.parent.mkdir(parents=True, exist_ok=True)
    run_script(BENCH / script, ["--out", str(out), *args], out.parent)
    return json.loads(out.read_text())


def is_finite_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def assert_finite(figures: dict, keys: list[str] | tuple[str, ...]) -> None:
    """Each of `keys` is in `figures` and a finite number."""
    bad = {k: figures.get(k, "missing") for k in keys if not is_finite_number(figures.get(k))}
    assert not bad, f"not finite numbers: {bad}"


def assert_summary(got: dict, keys: tuple[str, ...]) -> None:
    """`keys` are finite, and so is every number in the summary as run_benchmarks.py merges it."""
    summary = got.get("summary", got)
    assert_finite(summary, keys)
    merged = run_benchmarks._numbers(summary)
    assert_finite(merged, list(merged))


@pytest.fixture(scope="module")
def tiny(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The demo models (tests/conftest.py) and a synthetic shard set of 8 train and 4 eval clips."""
    from tests.contract.shard_fixture import write_synthetic_set

    root = tmp_path_factory.mktemp("bench-shards")
    return {"models": models, "shards": write_synthetic_set(root / "set", n_train=8, n_eval=4, frames=(12, 20))}


@pytest.fixture(scope="module")
def codec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random EnCodec (32 kHz, 50 Hz, 4 codebooks), saved as the pipeline loads one."""
    from tests.pipeline.helpers import make_tiny_codec

    return make_tiny_codec(tmp_path_factory.mktemp("bench-codec") / "codec")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stand-in corpus of 6 x 1.5-s clips in the MusicCaps layout (wavs, musiccaps-subset.csv, corpus.json)."""
    from tokenizer_pipeline.demo.standin_corpus import build_corpus

    out = tmp_path_factory.mktemp("bench-corpus") / "corpus"
    build_corpus(REPO / "data/musiccaps/musiccaps-public.csv", out, 6, 0.25, 0, 1.5)
    return out


def trainer_overrides(tiny: dict, *extra: str) -> list[str]:
    """Hydra overrides that put +experiment=demo (each script adds it) on the tiny models and shards, small windows,
    in-process data loading and a short closing eval."""
    return [
        f"model.llm={tiny['models']['llm']}",
        f"model.audio_lm={tiny['models']['musicgen']}",
        f"data.shards=[{tiny['shards']}]",
        "data.max_seq_len=48",
        "data.max_caption_tokens=12",
        "trainer.num_workers=0",
        "trainer.eval_bootstrap=20",
        "trainer.eval_caption_shuffles=1",
        "trainer.tensorboard=false",
        *extra,
    ]


# ---------------------------------------------------------------------------------------------- the scripts


def test_bench_encode(codec: Path, corpus: Path, tmp_path: Path) -> None:
    rows = run_bench("bench_encode.py", tmp_path / "encode.json", "--codec", str(codec), "--corpus", str(corpus),
                     "--n-clips", "2", "--batch-sizes", "1,2", "--bf16-clips", "1")  # fmt: skip
    assert [r["dtype"] for r in rows] == ["float32", "float32", "bfloat16"]
    for r in rows:
        assert_finite(r, ("seconds", "clips_per_s", "x_realtime", "clip_seconds", "peak_rss_mb"))
    assert_finite(rows[-1], ("code_agreement_vs_fp32",))


def test_bench_train(tiny: dict, tmp_path: Path) -> None:
    (row,) = run_bench("bench_train.py", tmp_path / "train.json", "--steps", "2", *trainer_overrides(tiny))
    assert_finite(row, ("seconds", "s_per_step", "tokens_per_s", "peak_rss_mb"))


@pytest.mark.bench_smoke
@pytest.mark.budget(120, reason="the pipeline benchmark end to end: every stage variant over the tiny corpus")
def test_bench_pipeline(codec: Path, corpus: Path, tmp_path: Path) -> None:
    got = run_bench("bench_pipeline.py", tmp_path / "pipeline.json", "--codec", str(codec), "--corpus", str(corpus),
                    "--clips", "3", "--threads", "1", "--rss-clips", "3", "6", "--zero-cost-clips", "4")  # fmt: skip
    assert_summary(got, ("pipeline_vs_encoder_bound", "pipeline_vs_first_version", "pipeline_rss_1000_vs_100",
                         "decode_workers_speedup_2v1", "pipeline_peak_rss_mb", "first_version_peak_rss_mb"))  # fmt: skip


@pytest.mark.bench_smoke
@pytest.mark.budget(
    90, reason="bench_data twice into one folder (the rerun is the check), each with its child training runs"
)
def test_bench_data_runs_twice_into_the_same_directory(tiny: dict, tmp_path: Path) -> None:
    """The second run trains into the first one's output directories: they are emptied, never resumed or refused (the
    trainer refuses a fresh run in a directory that holds checkpoints). The second skips the data-wait run."""
    args = ("--shards", str(tiny["shards"]), "--rss-steps", "1", "--replicas", "3", *trainer_overrides(tiny))
    got = run_bench("bench_data.py", tmp_path / "data.json", "--wait-steps", "2", *args)
    assert_summary(got, ("trainer_data_wait_fraction", "trainer_rss_100x_vs_1x", "rss_1x_mb", "rss_100x_mb"))
    again = run_bench("bench_data.py", tmp_path / "data.json", "--wait-steps", "0", *args)
    assert_summary(again, ("trainer_rss_100x_vs_1x", "rss_1x_mb", "rss_100x_mb"))
    assert {p.name for p in tmp_path.iterdir()} >= {"data_wait_run", "rss_1x", "rss_100x", "demo_shards_x3"}


@pytest.mark.bench_smoke
@pytest.mark.budget(60, reason="torchrun with 2 gloo ranks of the tiny demo model")
def test_bench_ddp(tiny: dict, tmp_path: Path) -> None:
    overrides = [o for o in trainer_overrides(tiny) if not o.startswith("trainer.batch_size")]
    got = run_bench("bench_ddp.py", tmp_path / "ddp.json", "--steps", "2", *overrides)
    assert_summary(got, ("trainer_ddp_vs_one_eval_ce_rel", "eval_ce_one_process", "eval_ce_two_ranks"))


def test_bench_onthefly(tiny: dict, codec: Path, corpus: Path, tmp_path: Path) -> None:
    got = run_bench("bench_onthefly.py", tmp_path / "onthefly.json", "--steps", "1", "--codec", str(codec),
                    "--corpus", str(corpus), *trainer_overrides(tiny, "trainer.batch_size=2"))  # fmt: skip
    assert_summary(got, ("shards_vs_onthefly_step_speedup",))
    assert_finite(got["rows"][0], ("shards_s_per_step", "onthefly_s_per_step"))


def test_bench_realsize_tiny(tmp_path: Path) -> None:
    """--tiny: the real-size script at the demo model's sizes; its figures are rows only (no real-size summary key)."""
    got = run_bench("bench_realsize.py", tmp_path / "realsize.json", "--tiny", "--steps", "1", "--seq", "256")
    assert got["summary"] == {}
    assert_finite(got["rows"][0], ("peak_rss_gb", "s_per_step", "build_s"))


@pytest.mark.bench_smoke
def test_bench_realsize_compares_the_towers(tmp_path: Path) -> None:
    """--compare-towers (what `make bench` runs): each tower in its own process, the musicgen/llm ratios finite."""
    got = run_bench("bench_realsize.py", tmp_path / "realsize.json", "--tiny", "--steps", "1", "--seq", "256",
                    "--compare-towers")  # fmt: skip
    assert_summary(got, ("realsize_musicgen_vs_llm_s_per_step", "realsize_musicgen_vs_llm_peak_rss"))
    assert [r["audio_tower"] for r in got["rows"]] == ["llm", "musicgen"]
    assert got["rows"][1]["params_trainable"] < got["rows"][0]["params_trainable"]


@pytest.mark.bench_smoke
@pytest.mark.budget(60, reason="each memory case runs in its own process")
def test_bench_memory_tiny(tmp_path: Path) -> None:
    """--dims tiny, the four fp32 cases of the checkpointing ratio (batch 1, 2 x checkpointing off, on at seq 256):
    finite case and fit rows, and the real-size summary keys computed from them are finite too."""
    got = run_bench("bench_memory.py", tmp_path / "memory.json", "--dims", "tiny", "--modes", "fp32",
                    "--batches", "1,2", "--seqs", "256", "--recompute", "off,on")  # fmt: skip
    cases = [r for r in got["rows"] if r["stage"] == "realsize_memory"]
    fits = [r for r in got["rows"] if r["stage"] == "realsize_memory_fit"]
    assert len(cases) == 4 and len(fits) == 4  # peak RSS and activation fits, checkpointing off and on
    for r in cases:
        assert_finite(r, ("peak_rss_gb", "activation_peak_gb", "grad_gb", "step_s", "rss_after_build_gb"))
    for r in fits:
        assert_finite(r, ("bytes_per_position", "fixed_gb", "max_residual_gb"))
    assert got["summary"] == {}  # tiny figures are no real-size figure
    spec = importlib.util.spec_from_file_location("bench_memory", BENCH / "bench_memory.py")
    bench_memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_memory)
    at_1024 = [{**r, "seq": 1024} if r["batch"] == 2 else r for r in cases]  # the ratio's case, as at real size
    summary = bench_memory.summarize(
        at_1024, bench_memory.fits_of(cases, "peak_rss_gb"), bench_memory.fits_of(cases, "activation_peak_gb")
    )
    assert_finite(summary, ("realsize_bytes_per_position", "realsize_fixed_gb",
                            "realsize_activation_bytes_per_position", "realsize_ckpt_memory_ratio"))  # fmt: skip


@pytest.mark.bench_smoke
def test_bench_download(tmp_path: Path) -> None:
    got = run_bench("bench_download.py", tmp_path / "download.json", "--clips", "2", "--workers", "1",
                    "--source-s", "30", "--bytes-source-s", "40")  # fmt: skip
    assert_summary(got, ("download_bytes_per_clip_vs_whole", "download_bytes_per_clip_vs_whole_m4a"))
    assert_finite(got["rows"][0], ("clips_per_s", "clips_per_s_per_worker", "flac_bytes_per_clip"))


def test_bench_resample(tmp_path: Path) -> None:
    got = run_bench("bench_resample.py", tmp_path / "resample.json")  # ~8 s as it is
    for method in ("soxr_vhq", "soxr_hq", "torchaudio_kaiser", "torchaudio_default"):
        assert_finite(got[method], ("alias_17k_db", "gain_14k_db", "ms_per_10s_clip"))
        assert isinstance(got[method]["odd_rate_44101"]["ok"], bool)


def test_bench_generate(tiny: dict, tmp_path: Path) -> None:
    """Both samplers against the model's current cache interface: the copy of the replaced one included."""
    got = run_bench("bench_generate.py", tmp_path / "generate.json", "--seconds", "0.2", "--batch", "2",
                    "--repeats", "1", *trainer_overrides(tiny))  # fmt: skip
    assert_summary(got, ("generate_speedup_vs_concat_cache",))
    assert [r["sampler"] for r in got["rows"]] == ["new", "concat_cache"]
    for r in got["rows"]:
        assert_finite(r, ("positions_per_s", "seconds", "mean_frames"))


def test_bench_generate_compares_the_towers(tiny: dict, tmp_path: Path) -> None:
    """--compare-towers: the sampler on audio_tower=llm and musicgen, each run's figure and the ratio."""
    got = run_bench("bench_generate.py", tmp_path / "towers.json", "--seconds", "0.2", "--batch", "2",
                    "--repeats", "2", "--threads", "1", "--compare-towers", *trainer_overrides(tiny))  # fmt: skip
    assert_summary(got, ("generate_musicgen_over_llm",))
    assert [r["tower"] for r in got["rows"]] == ["llm", "musicgen"]
    for r in got["rows"]:
        assert_finite(r, ("positions_per_s", "seconds", "mean_frames"))
        assert len(r["positions_per_s_runs"]) == 2 and r["threads"] == 1


def test_bench_mixture(tmp_path: Path) -> None:
    got = run_bench("bench_mixture.py", tmp_path / "mixture.json", "--draws", "1000")
    assert_summary(got, ("mixture_weight_error",))


@pytest.mark.bench_smoke
def test_bench_byo(codec: Path, tmp_path: Path) -> None:
    got = run_bench("bench_byo.py", tmp_path / "byo.json", "--codec", str(codec), "--tracks", "1",
                    "--track-seconds", "10", "--repeats", "1", "--threads", "1")  # fmt: skip
    assert_summary(got, ("byo_pipeline_vs_musiccaps", "byo_audio_s_per_s", "byo_musiccaps_audio_s_per_s"))


@pytest.mark.bench_smoke
@pytest.mark.budget(
    120,
    reason="HTTP and S3 servers on loopback, each cache bound a training start whose first report also scores the "
    "null and the teacher",
)
def test_bench_remote(models: dict[str, Path], tmp_path: Path) -> None:
    """One pass of local, order, lru and whole on moto's S3 (127.0.0.1): a synthetic set of 8 train + 2 eval tars of 2
    clips, so the bound (a quarter of the set) holds 2 tars and evicts; the cache's peak stays within it; with the
    whole set's bound nothing is evicted."""
    from tests.contract.shard_fixture import write_synthetic_set

    shards = write_synthetic_set(tmp_path / "set", n_train=16, n_eval=4, frames=(12, 20), samples_per_shard=2)
    got = run_bench("bench_remote.py", tmp_path / "out" / "remote.json", "--steps", "4", "--passes", "1",
                    "--shards", str(shards), *trainer_overrides({"models": models, "shards": shards}))  # fmt: skip
    assert_summary(got, ("local_data_wait_fraction", "remote_data_wait_fraction_order", "remote_data_wait_fraction_lru",
                         "remote_peak_cache_over_bound_order", "remote_peak_cache_over_bound_lru",
                         "remote_downloads_per_epoch_order", "remote_downloads_per_epoch_lru",
                         "remote_startup_downloads_order", "remote_download_ratio_lru_vs_order"))  # fmt: skip
    assert [r["case"] for r in got["rows"]] == ["local", "order", "lru", "whole"]
    for r in got["rows"][1:]:
        assert 0 < r["peak_cache_bytes"] <= r["cache_bound_bytes"], r
        assert r["startup_downloads"] == 0, r  # a start reads the manifest and the index sidecars, no tar
    assert got["rows"][1]["evictions"] > 0 and got["rows"][3]["evictions"] == 0


@pytest.mark.bench_smoke
@pytest.mark.budget(90, reason="five trainer starts, each `python -m adapter_trainer` in its own interpreter")
def test_bench_startup(models: dict[str, Path], tmp_path: Path) -> None:
    """The set at 1x and 2x, local and over loopback HTTP at a quarter-set bound, cold, then the 1-step demo run to its
    end: startup seconds and the tar bytes the server sent; a local start downloads nothing, and a remote one reads
    its index sidecars and fewer tars before step 1 than the whole set."""
    from tests.contract.shard_fixture import write_synthetic_set

    shards = write_synthetic_set(tmp_path / "set", n_train=16, n_eval=4, frames=(12, 20), samples_per_shard=2)
    got = run_bench("bench_startup.py", tmp_path / "out" / "startup.json", "--scales", "1", "2", "--cases", "local",
                    "http_quarter", "--temps", "cold", "--no-warmup", "--shards", str(shards),
                    *trainer_overrides({"models": models, "shards": shards}))  # fmt: skip
    assert_summary(got, ("startup_s_100x_vs_1x", "startup_download_sets_quarter", "startup_demo_download_sets_all",
                         "startup_s_local_cold_x2", "startup_s_http_quarter_cold_x2", "startup_cpu_s_100x_vs_1x"))  # fmt: skip
    rows = {(r["case"], r["scale"]): r for r in got["rows"]}
    assert set(rows) == {("local", 1), ("local", 2), ("http_quarter", 1), ("http_quarter", 2),
                         ("demo_http_quarter", 1)}  # fmt: skip
    for (case, _), r in rows.items():
        assert_finite(r, ("startup_s", "setup_s", "first_step_s", "download_sets_before_step1"))
        if case == "local":
            assert r["tar_bytes_before_step1"] == r["index_bytes_before_step1"] == 0, r
        else:
            assert r["index_bytes_before_step1"] > 0 and 0 < r["tar_bytes_before_step1"] < r["set_tar_bytes"], r
    assert rows["demo_http_quarter", 1]["tar_bytes_all"] >= rows["demo_http_quarter", 1]["tar_bytes_before_step1"]


@pytest.mark.slow
def test_caption_scaling_smoke_run(tmp_path: Path) -> None:
    """The smallest curve its docstring names (2 points, 1 seed, 20 steps): 4-6 min on 2 cores, most of it the demo
    codec's fit, the LLM's pretraining and the full-size encoder, so it runs only with --run-slow."""
    out = tmp_path / "scaling"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "caption_scaling.py"), "--out", str(out), "--captions", "16", "32", "--seeds", "1",
         "--eval-captions", "8", "--steps", "20", "--schedules", "fixed", "--generate-n", "8"],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=1800,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    curve = json.loads((out / "curve.json").read_text())
    assert [p["captions"] for p in curve["points"]] == [16, 32] and not curve["missing"]
    for p in curve["points"]:
        assert_finite(p, ("gain_first10", "gain_window", "ce_rel_pct"))  # probe_fraction: None at 8 clips


@pytest.mark.bench_smoke
def test_demo_recipe_smoke_run(tiny: dict, tmp_path: Path) -> None:
    """benchmarks/demo_recipe.py (docs/results.md, "MusicGen as it ships: the teacher, and the towers"): the `llm_tower`
    variant, 2 steps, no probe: it overrides the schema's default tower (the default one every other trainer test
    runs)."""
    out = tmp_path / "recipe"
    # --parallel 2 with its one run: one intra-op thread for it (a lone run, --parallel 1, gets every core)
    run_script(BENCH / "demo_recipe.py", ["--out", str(out), "--shards", str(tiny["shards"]),
               "--models", str(tiny["models"]["llm"].parent), "--variants", "llm_tower", "--seeds", "1", "--steps",
               "2", "--generate-n", "-1", "--parallel", "2", *trainer_overrides(tiny)[3:], "trainer.eval_every=0"],
               tmp_path)  # fmt: skip
    rows = json.loads((out / "results.json").read_text())
    assert [(r["variant"], r["seed"]) for r in rows] == [("llm_tower", 1)]
    assert_finite(rows[0], ("eval_ce", "ce_rel_pct", "music_lm_ce", "gain_over_music_lm", "gain_first10"))
    assert rows[0]["trainable_params"] > 0
    assert "audio_tower: llm" in (out / "runs" / "llm_tower_s1" / "config.yaml").read_text()
    assert "| llm_tower | 1 |" in (out / "results.md").read_text()


# ---------------------------------------------------------------------------------------------- coverage, groups


def test_every_benchmark_script_has_a_smoke_test() -> None:
    """A new bench_*.py gets its test here (or names the file that has one in SMOKED_ELSEWHERE)."""
    here = Path(__file__).read_text()
    missing = [
        p.name
        for p in sorted(BENCH.glob("bench_*.py"))
        if p.name not in SMOKED_ELSEWHERE and f'run_bench("{p.name}"' not in here
    ]
    assert not missing, f"benchmark scripts without a smoke test: {missing}"
    for script, test_file in SMOKED_ELSEWHERE.items():
        assert script in (REPO / test_file).read_text()


def test_a_plain_run_leaves_the_opt_in_groups_out_and_every_group_runs_scripts_that_exist() -> None:
    """make bench: every group but resample, gpu and memory (make bench-memory: the hour-long real-size sweep)."""
    assert {"memory", "gpu", "resample"} <= set(run_benchmarks.OPT_IN)
    plain = run_benchmarks.selected_groups("all", cuda=False)
    assert plain == [g for g in run_benchmarks.GROUPS if g not in run_benchmarks.OPT_IN]
    assert run_benchmarks.selected_groups("all", cuda=True) == ["gpu"]
    assert run_benchmarks.selected_groups("memory", cuda=False) == ["memory"]
    args = run_benchmarks.argparse.Namespace(device="cpu", train_steps=20, encode_clips=8, pipeline_clips=128,
                                             byo_tracks=6, byo_repeats=2, gpu_budget_s=None)  # fmt: skip
    plan = run_benchmarks.plan(args)
    assert set(plan) == set(run_benchmarks.GROUPS)
    scripts = {g: [s for s, _, _ in plan[g]] for g in plan}
    assert scripts["memory"] == ["bench_memory.py"]
    assert "bench_memory.py" not in {s for g in plain for s in scripts[g]}
    assert all((BENCH / s).is_file() for ss in scripts.values() for s in ss)
