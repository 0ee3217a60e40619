"""`make bench-gpu` without CUDA: one line saying nothing was measured, exit 0, nothing written; with CUDA it builds
nothing first. The CPU smoke run end to end (no build/demo in reach): the JSON and markdown with every section, the
encoder on encodec_32khz's architecture, what --budget-s dropped. The budget rule on fake timings. And what the GPU run
counts, checked on CPU: FLOPs of the CUDA-side attention ops on meta tensors at cuda_1b shapes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

pytestmark = pytest.mark.budget(60, reason="the first test builds the --smoke-cpu run every section test reads")

REPO = Path(__file__).resolve().parents[2]
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU of the machine running the tests


def load(name: str):
    """benchmarks/ is a directory of scripts, not a package: load one script without touching sys.path."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_gpu, time_budget, gpu_report = load("bench_gpu"), load("time_budget"), load("gpu_report")

# cuda_1b's attention: batch 16, Llama 3.2 1B's 32 query / 8 key-value heads, seq 1024, head_dim 64
B, H, KV, S, HD = 16, 32, 8, 1024, 64


def fused_attention(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The op F.scaled_dot_product_attention dispatches to on CUDA for each kernel, called as it calls it (causal)."""
    aten = torch.ops.aten
    if kernel == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False)[0]
    return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)[0]


def meta(heads: int) -> torch.Tensor:
    return torch.empty(B, heads, S, HD, device="meta", dtype=torch.bfloat16, requires_grad=True)  # [B, h, S, hd]


@pytest.mark.parametrize("kernel", ["cudnn", "flash"])
def test_grouped_attention_flops_count_as_the_expanded_heads(kernel: str) -> None:
    """Un-expanded k/v (enable_gqa) as attend passes them at cuda_1b: torch's own counter asserts on the unequal heads
    (no MFU row ever got written); the bench's counter gives what torch counts for the same call on expanded k/v."""
    with pytest.raises(AssertionError, match="incompatible"), FlopCounterMode(display=False):
        fused_attention(kernel, meta(H), meta(KV), meta(KV))
    with bench_gpu.flop_counter() as grouped:
        fused_attention(kernel, meta(H), meta(KV), meta(KV)).sum().backward()
    with FlopCounterMode(display=False) as expanded:  # the reference: torch's formulas on H-head k/v
        fused_attention(kernel, meta(H), meta(H), meta(H)).sum().backward()
    assert grouped.get_total_flops() == expanded.get_total_flops()
    counts = {str(op): n for op, n in grouped.get_flop_counts()["Global"].items()}
    forward = counts[f"aten._scaled_dot_product_{kernel}_attention"]
    assert forward == 4 * B * H * S * S * HD  # QK^T and PV, 2 FLOPs per multiply-add, full S x S
    assert counts[f"aten._scaled_dot_product_{kernel}_attention_backward"] == 10 * B * H * S * S * HD


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, str(REPO / "benchmarks/run_benchmarks.py"), "--device", "cuda"],
        [sys.executable, str(REPO / "benchmarks/run_benchmarks.py"), "--only", "gpu"],
        [sys.executable, str(REPO / "benchmarks/bench_gpu.py"), "--out", "gpu.json"],
    ],
    ids=["run_benchmarks --device cuda", "run_benchmarks --only gpu", "bench_gpu.py"],
)
def test_without_cuda_one_line_and_exit_0(argv: list[str], tmp_path: Path) -> None:
    r = subprocess.run(argv, cwd=tmp_path, env=NO_GPU, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and "nothing was measured" in lines[0], r.stdout
    assert list(tmp_path.iterdir()) == []  # no results file, no build/bench


def test_make_bench_gpu_without_cuda() -> None:
    r = subprocess.run(
        ["make", "-s", "bench-gpu", f"PY={sys.executable}"],
        cwd=REPO,
        env=NO_GPU,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and "nothing was measured" in lines[0], r.stdout


def test_make_bench_gpu_builds_nothing_first(tmp_path: Path) -> None:
    """With CUDA, `make bench-gpu` runs the gpu group alone: no demo-settings check, no corpus or codec build. The
    interpreter is a stand-in that logs its arguments and succeeds (CUDA "available")."""
    calls = tmp_path / "calls.txt"
    fake_py = tmp_path / "python"
    fake_py.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexit 0\n')
    fake_py.chmod(0o755)
    r = subprocess.run(
        ["make", "-s", "bench-gpu", f"PY={fake_py}", f"DEMO={tmp_path / 'demo'}", "BUDGET_S=120"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert calls.read_text().splitlines() == ["benchmarks/run_benchmarks.py --device cuda --gpu-budget-s 120"]
    assert not (tmp_path / "demo").exists()


def test_a_failed_flop_count_or_a_mispredicted_kernel_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ok_kernels = {"train_unpadded": {"ran": ["cudnn"], "expected": ["cudnn"]}}
    good = {"flops": {"flops_per_position": 1.0}, "peak_bf16_flops": 989e12, "device": "H100",
            "train": [{"batch_size": 1, "mfu": 0.4}], "kernels": ok_kernels}  # fmt: skip
    monkeypatch.setattr(bench_gpu, "DEV", torch.device("cuda"))  # the checks a GPU run makes (nothing runs on it)
    assert bench_gpu.run_failures(good) == []
    failed = {**good, "flops": {"error": "AssertionError: sdpa_flop_count"}, "train": [{"batch_size": 1}]}
    assert "FLOP count failed" in bench_gpu.run_failures(failed)[0]
    no_mfu = {**good, "train": [{"batch_size": 1}]}
    assert "without MFU" in bench_gpu.run_failures(no_mfu)[0]
    wrong = {**good, "kernels": {"decode_left_padded_cache": {"ran": ["mem_efficient"], "expected": ["cudnn"]}}}
    assert "predict" in bench_gpu.run_failures(wrong)[0]


class FakeClock:
    """Seconds that pass only when a case says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_budget_drops_the_largest_sizes_first_and_records_them() -> None:
    """Batch sizes in increasing order, checkpointing off and on at each; a case costs 2 s + 3 s (off) or 4 s (on)
    per batch row. Within 60 s: off 1, on 1, off 2, on 2, off 4 run (43 s); on 4 is predicted at 20 s (10 s at batch
    2, in proportion) with 17 s left, so it and every larger case are dropped, each with its prediction."""
    clock = FakeClock()
    budget = time_budget.Budget(60, clock=clock)
    cost = {"off": lambda b: 2 + 3 * b, "on": lambda b: 2 + 4 * b}
    ran = []
    for b in (1, 2, 4, 8, 16):
        for group in ("off", "on"):

            def case(group: str = group, b: int = b) -> tuple[str, int]:
                clock.now += cost[group](b)
                return group, b

            if budget.run(group, b, case, what=f"{group} {b}") is not None:
                ran.append((group, b))
    assert ran == [("off", 1), ("on", 1), ("off", 2), ("on", 2), ("off", 4)]
    dropped = [(d["group"], d["size"]) for d in budget.dropped]
    assert dropped == [("on", 4), ("off", 8), ("on", 8), ("off", 16), ("on", 16)]
    assert budget.dropped[0]["predicted_s"] == pytest.approx(20) and budget.dropped[0]["left_s"] == pytest.approx(17)
    assert budget.dropped[1]["predicted_s"] == pytest.approx(28)  # 14 s at batch 4 x 2 (the line gives 26)
    assert clock.now == 43 <= budget.seconds
    record = budget.record()
    assert record["budget_s"] == 60 and record["dropped"] == budget.dropped
    assert record["measured"]["off"] == [
        {"size": 1, "seconds": 5},
        {"size": 2, "seconds": 8},
        {"size": 4, "seconds": 14},
    ]


def test_prediction_and_the_smallest_case_always_runs() -> None:
    assert time_budget.predict_seconds([], 4) is None
    assert time_budget.predict_seconds([(2, 3.0)], 4) == 6  # in proportion
    assert time_budget.predict_seconds([(1, 1.0), (2, 4.0)], 4) == 10  # faster than proportion: the line, 4 + 3 x 2
    assert time_budget.predict_seconds([(1, 5.0), (2, 6.0)], 4) == 12  # fixed overhead: in proportion, 6 x 2
    clock = FakeClock()
    budget = time_budget.Budget(0, clock=clock)

    def case() -> str:
        clock.now += 1.0
        return "ran"

    assert budget.run("train", 1, case) == "ran"  # no prediction yet: the group keeps one figure
    assert budget.run("train", 2, case) is None and budget.dropped[0]["predicted_s"] == 2
    assert time_budget.Budget().record()["budget_s"] is None  # no limit


def test_report_shows_every_failed_section() -> None:
    """A section that failed on the GPU is one "error: ..." line in the markdown, not a crash (the JSON is already
    written by then, but the table is the figure a reader sees)."""
    err = {"error": "RuntimeError: boom"}
    res = {"device": "NVIDIA H100 80GB HBM3", "peak_bf16_flops": 989e12, "torch": "2.11.0", "cuda": "13.0",
           "cudnn": 91000, "dims": "real", "smoke_cpu": False,
           "settings": {"experiment": "cuda_1b", "model_dtype": "float32", "precision": "bf16", "seq_len": 1024,
                        "pattern": "delay", "steps": 3, "batches": [1, 2]},
           "flops": err, "kernels": err, "generate": err, "encoder": err,
           "train": [{"batch_size": 1, "activation_checkpointing": False, **err}],
           "budget": {"budget_s": 300, "elapsed_s": 12.0, "measured": {},
                      "dropped": [{"case": "train batch 2, checkpointing off", "group": "train_ckpt_off", "size": 2,
                                   "predicted_s": 9.0, "left_s": 1.0}]}}  # fmt: skip
    md = gpu_report.markdown(res)
    assert md.count("error: RuntimeError: boom") == 5  # training row, FLOPs, kernels, generation, encoder
    assert "| 2 | off | dropped: predicted 9.0 s, 1.0 s left |" in md
    assert "| train batch 2, checkpointing off | 9.0 | 1.0 |" in md


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict, str, Path]:
    """`bench_gpu.py --smoke-cpu --budget-s 0` from an empty directory (no build/demo there or passed), offline, on one
    intra-op thread (with one per core, its small ops spin at OpenMP barriers whenever another process holds a core:
    3x the CPU time beside one other job)."""
    cwd = tmp_path_factory.mktemp("smoke")
    env = {**NO_GPU, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/bench_gpu.py"), "--smoke-cpu", "--budget-s", "0", "--out", "gpu.json"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads((cwd / "gpu.json").read_text()), (cwd / "gpu.md").read_text(), cwd


@pytest.mark.bench_smoke
def test_smoke_run_writes_every_section_without_a_demo_build(smoke) -> None:
    r, got, md, cwd = smoke
    assert sorted(p.name for p in cwd.iterdir()) == ["gpu.json", "gpu.md"]  # no build/ made or needed
    row = got["rows"][0]
    for section in ("flops", "kernels", "generate", "encoder"):
        assert "error" not in row[section], row[section]
    assert row["train"] and all("error" not in t and t["positions_per_s"] > 0 for t in row["train"])
    assert row["flops"]["flops_per_position"] > 0 and row["generate"]["positions_per_s"] > 0
    assert set(row["kernels"]) == {"train_unpadded", "train_right_padded", "train_left_padded",
                                   "decode_unpadded_cache", "decode_left_padded_cache"}  # fmt: skip
    assert {"device", "torch", "cuda", "cudnn"} <= row.keys() and row["smoke_cpu"] is True
    assert row["settings"]["audio_tower"] == "musicgen"  # cuda_1b's
    summary = got["summary"]
    assert summary["gpu_train_positions_per_s_ckpt_off"]["1"] == row["train"][0]["positions_per_s"]
    assert summary["gpu_encoder_audio_s_per_s_float32"] == row["encoder"]["audio_s_per_s_float32"] > 0
    for title in ("# bench_gpu", "## Training", "## Attention kernels", "## Generation", "## Encoder", "## Budget"):
        assert title in md and title in r.stdout
    assert "not a GPU figure" in md


@pytest.mark.bench_smoke
def test_smoke_run_budget_dropped_the_largest_sizes_and_says_so(smoke) -> None:
    r, got, md, _ = smoke
    row = got["rows"][0]
    ran = {(t["batch_size"], t["activation_checkpointing"]) for t in row["train"]}
    dropped = row["budget"]["dropped"]
    assert ran == {(1, False), (1, True)}  # the smallest size of each group always runs
    assert [(d["group"], d["size"]) for d in dropped] == [("train_ckpt_off", 2), ("train_ckpt_on", 2)]
    assert all(d["predicted_s"] > d["left_s"] for d in dropped)
    assert got["summary"]["gpu_budget_dropped_cases"] == 2
    for d in dropped:
        assert f"budget: dropped {d['case']}" in r.stdout
        assert f"| {d['case']} |" in md


@pytest.mark.bench_smoke
def test_smoke_run_encoder_is_the_encodec_32khz_architecture(smoke) -> None:
    """The config tokenizer_pipeline's CodecEncoder reports for the codec the bench built: facebook/encodec_32khz's
    (32 kHz mono, 4 codebooks x 2048 at 2.2 kbps, 50 frames/s), and codes that vary with the audio."""
    from tokenizer_pipeline.codec.encode import config_identity
    from tokenizer_pipeline.demo.demo_codec import encodec_32khz_config

    _, got, _, _ = smoke
    enc = got["rows"][0]["encoder"]
    c = enc["config"]
    assert (c["sampling_rate"], c["frame_rate"], c["bandwidth_kbps"]) == (32000, 50, 2.2)
    assert (c["n_codebooks"], c["codebook_size"]) == (4, 2048)
    assert c["codes_shape_per_clip"] == [round(enc["clip_s"] * 50), 4]  # [T, K]
    assert c["identity"] == config_identity(encodec_32khz_config())
    assert "random weights" in enc["codec"] and "untrained" in enc["bf16_code_agreement_means"]
    assert 0 <= enc["bf16_code_agreement"] <= 1
    assert all(n > 1 for n in enc["distinct_codes_fp32"])  # not the all-zero codebooks of a random init


@pytest.mark.bench_smoke
@pytest.mark.budget(90, reason="the CPU smoke run of bench_gpu.py again, on the llm tower")
def test_smoke_run_on_the_llm_tower(tmp_path: Path) -> None:
    """cuda_1b trains the musicgen tower; `--tower llm` measures the other one: every section runs on it too."""
    env = {**NO_GPU, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/bench_gpu.py"), "--smoke-cpu", "--budget-s", "0", "--out", "gpu.json",
         "--tower", "llm"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads((tmp_path / "gpu.json").read_text())["rows"][0]
    assert row["settings"]["audio_tower"] == "llm"
    for section in ("flops", "kernels", "generate", "encoder"):
        assert "error" not in row[section], row[section]
