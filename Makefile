# Two stages, two processes: `make shards` (tokenizer_pipeline) writes token shards,
# `make train` (adapter_trainer) reads only those shards. `make demo` runs both on the embedded default.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO := build/demo
# stand-in corpus: DEMO_CLIPS rows of the real CSV, DEMO_EVAL_FRACTION of them held out (80 of 1040), each rendered
# as a DEMO_SECONDS-s clip. 960 x 2.5 s train clips encode in the time of 240 x 10 s and follow their captions
# better (more captions, and a clip's start in more windows: docs/results.md, "Caption scaling"). The old default
# was DEMO_CLIPS=320 DEMO_SECONDS=10 DEMO_EVAL_FRACTION=0.25 DEMO_CODEC_CLIPS=40 (rm -rf build/demo first: built
# steps are kept)
DEMO_CLIPS ?= 1040
DEMO_SECONDS ?= 2.5
DEMO_EVAL_FRACTION ?= 0.0769
# make corpus LAYOUT=audiocraft|audiofolder: the stand-in corpus as your-own-audio layouts instead, full-length
# TRACK_SECONDS-s stereo 44.1 kHz tracks in build/demo/corpus-<layout> (README, "Your own audio")
LAYOUT ?= musiccaps
TRACK_SECONDS ?= 30
LAYOUT_CLIPS ?= 32
# clips whose encoder latents fit the demo codec's RVQ codebooks (160 x 2.5 s: the 400 audio-seconds of 40 x 10 s)
DEMO_CODEC_CLIPS ?= 160
# extra Hydra overrides, e.g. make train ARGS="+experiment=demo trainer.max_steps=10"; for make bench, its flags
# (make bench ARGS="--only pipeline --pipeline-clips 128")
ARGS ?=
# real MusicCaps audio directory for `make shards`, and the shard-set output directory
DATA ?=
OUT ?= build/shards

.PHONY: help setup wheelhouse demo corpus codec demo-shards demo-models audio shards train verify test test-slow test-bench lint format bench bench-setup bench-memory bench-gpu clean listen listen-check

# make help: the main targets in one screen (README, "Commands"; every variable: docs/configuration.md)
help:
	@echo 'make setup                      .venv with both packages (editable), pytest, ruff'
	@echo 'make demo                       the offline demo end to end: corpus, codec, shards, tiny models, training'
	@echo 'make listen                     clips for the demo run'"'"'s eval captions, probed, on a static page'
	@echo 'make generate ADAPTER=DIR TEXT="calm solo piano"   wavs from an exported adapter folder'
	@echo 'make audio OUT=DIR              MusicCaps audio from YouTube (yt-dlp + ffmpeg)'
	@echo 'make shards DATA=DIR [OUT=build/shards]   encode real audio into a shard set (stage 1)'
	@echo 'make verify [OUT=build/shards]  check a shard set against the contract'
	@echo 'make train ARGS="+experiment=cuda_1b '"'"'data.shards=[build/shards]'"'"'"   train (stage 2)'
	@echo 'make test / make lint / make format   the tests (2 workers) / ruff check + format --check / apply ruff'
	@echo 'make test-bench / make test-slow      the opt-in tests: benchmark smoke runs (CI runs them) / full-size checks'
	@echo 'make bench                      speed and memory of both stages -> build/bench/results.md'
	@echo 'make clean                      remove build/, outputs/, multirun/'
	@echo 'python -m adapter_trainer --help, python -m tokenizer_pipeline --help: the commands themselves'

# test-only tools next to the packages: pytest, ruff, Hugging Face `datasets` (tests/pipeline/sources check the
# audiofolder reader against datasets' own; neither package depends on it), and moto's S3 server with the Flask it
# runs on (tests/remote: an S3-compatible server on 127.0.0.1; moto[server] would add CloudFormation, Docker and
# other services' dependencies the tests never start)
setup: $(VENV)/.installed

# ---- a GPU node without internet (docs/real-data.md, "A GPU node without internet")
# make wheelhouse (on a machine with the package index; scripts/wheelhouse.py): into WHEELHOUSE, every wheel that
# make setup WHEELS=... needs, at constraints.txt's pins, for CPython WHEEL_PYTHON on WHEEL_PLATFORM: the two
# packages' dependencies (tokenizer_pipeline with [ffmpeg]), benchmarks/requirements.txt (make bench-gpu), the build
# backend (hatchling + editables), pytest and pytest-xdist (2 MB with their deps: the node can run the CUDA tests, e.g.
# tests/trainer/model); not ruff, datasets, fadtk, audiocraft (lint and CPU-side reference checks; datasets alone
# brings pyarrow and pandas), and not the torch stack (torch, torchaudio, triton, nvidia-*, cuda-*: the node's torch
# is reused). 85 wheels, 225 MB on 2026-11-26, before pytest-xdist and execnet joined (imageio-ffmpeg's ffmpeg program
# alone is 68). WITH_TORCH=1 adds the torch stack
# (109 wheels, 2.9 GB) for a node without torch.
# README.md and wheelhouse.json in the folder name its Python, platform and what it excludes.
# WHEEL_PLATFORM: wheels for glibc 2.28 or older (manylinux2014, ...), which run here and on any node that runs torch
# 2.11's own wheels (manylinux_2_28); a node with an older glibc needs e.g. WHEEL_PLATFORM=manylinux_2_17_x86_64
WHEELHOUSE ?= build/wheelhouse
WHEEL_PYTHON ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
WHEEL_PLATFORM ?= manylinux_2_28_$(shell uname -m)
WITH_TORCH ?=
wheelhouse:
	$(PYTHON) scripts/wheelhouse.py build --out $(WHEELHOUSE) --python-version $(WHEEL_PYTHON) \
		--platform $(WHEEL_PLATFORM) $(if $(filter 1,$(WITH_TORCH)),--with-torch)

# make setup WHEELS=dir (on the node, in a copy of the repository without .venv): no index at all (pip --no-index
# --find-links dir, with the pip the venv brings), the two packages editable as below, benchmarks/requirements.txt and
# pytest; the torch that $(PYTHON) imports is reused, not replaced. A venv made with --system-site-packages would see
# only the base interpreter's site-packages and miss a torch in a conda env or another venv, so node-pth writes
# .venv/.../node-torch.pth naming the site directory where $(PYTHON)'s torch (and torchaudio) live: after the venv's
# own site-packages on sys.path, so what pip installs into the venv wins, and pip counts that torch as installed. The
# constraints are constraints.txt without the torch stack's and torchcodec's pins (node-constraints, generated each
# time): they would otherwise demand torch 2.11.0 over the node's. No torch in $(PYTHON) nor in the folder (or a folder
# for another Python): one line naming the fix, exit 2. pip check covers the node's site directory too (it is part of
# this environment now). Pass WHEELS= (or export it) on the node's later make calls as well: a rebuilt .venv without
# it would look for the index.
WHEELS ?=
ifeq ($(WHEELS),)
$(VENV)/.installed: constraints.txt pyproject.toml packages/tokenizer_pipeline/pyproject.toml packages/adapter_trainer/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -c constraints.txt \
		-e packages/tokenizer_pipeline[ffmpeg,s3,http] -e packages/adapter_trainer[s3,http] pytest pytest-xdist ruff datasets \
		"moto[s3]" flask flask-cors
	# reference code for tests/trainer/evaluation (fadtk's FAD and CLAP windows, audiocraft's loudness and KL): their
	# declared deps conflict with ours (numpy<2, transformers<5, torch 2.1), so the files only, read by the tests
	$(PY) -m pip install --quiet --no-deps fadtk==1.1.0 audiocraft==1.3.0
	touch $@
else
$(VENV)/.installed: constraints.txt pyproject.toml packages/tokenizer_pipeline/pyproject.toml packages/adapter_trainer/pyproject.toml scripts/wheelhouse.py
	@$(PYTHON) scripts/wheelhouse.py node-check $(WHEELS)
	$(PYTHON) -m venv $(VENV)
	@$(PYTHON) scripts/wheelhouse.py node-pth $(VENV)
	@$(PYTHON) scripts/wheelhouse.py node-constraints constraints.txt > $(VENV)/constraints-node.txt
	$(PY) -m pip install --quiet --no-index --find-links $(WHEELS) -c $(VENV)/constraints-node.txt \
		-e packages/tokenizer_pipeline[ffmpeg] -e packages/adapter_trainer -r benchmarks/requirements.txt pytest pytest-xdist
	$(PY) -m pip check
	@$(PY) scripts/wheelhouse.py origin
	touch $@
endif

# ---- embedded default (offline): stand-in corpus -> demo codec -> shards -> tiny models -> training
ifeq ($(LAYOUT),musiccaps)
corpus: demo-settings $(DEMO)/corpus/.done
else
corpus: $(DEMO)/corpus-$(LAYOUT)/.done
endif
$(DEMO)/corpus-%/.done: | setup
	$(PY) -m tokenizer_pipeline.standin_corpus --csv data/musiccaps/musiccaps-public.csv \
		--out $(DEMO)/corpus-$* --n-clips $(LAYOUT_CLIPS) --layout $* --duration-s $(TRACK_SECONDS)
	touch $@
$(DEMO)/corpus/.done: | setup
	$(PY) -m tokenizer_pipeline.standin_corpus --csv data/musiccaps/musiccaps-public.csv \
		--out $(DEMO)/corpus --n-clips $(DEMO_CLIPS) --duration-s $(DEMO_SECONDS) --eval-fraction $(DEMO_EVAL_FRACTION)
	touch $@

# a build/demo made with other DEMO_* settings (e.g. the 320 x 10-s default before 2026-11-26) stops the build, naming
# the fix, instead of feeding its old corpus to the next steps (make keeps built steps)
.PHONY: demo-settings
demo-settings: | setup
	@$(PY) -m tokenizer_pipeline.standin_corpus --check-built --out $(DEMO)/corpus --n-clips $(DEMO_CLIPS) \
		--duration-s $(DEMO_SECONDS) --eval-fraction $(DEMO_EVAL_FRACTION)

codec: demo-settings $(DEMO)/codec/config.json
$(DEMO)/codec/config.json: $(DEMO)/corpus/.done
	$(PY) -m tokenizer_pipeline.demo_codec --corpus $(DEMO)/corpus --out $(DEMO)/codec \
		--n-clips $(DEMO_CODEC_CLIPS)

demo-shards: demo-settings $(DEMO)/shards/manifest.json
# clips shorter than MusicCaps' 10-s window are the stand-in's length, not a bad download: widen the tolerance
DEMO_SHARD_ARGS := duration_tolerance_s=$(shell $(PYTHON) -c 'print(round(10 - $(DEMO_SECONDS) + 0.5, 3))')
$(DEMO)/shards/manifest.json: $(DEMO)/codec/config.json
	$(PY) -m tokenizer_pipeline +preset=demo $(DEMO_SHARD_ARGS)

# tiny Llama pretrained (1 thread, seeded, ~2 min) on the MusicCaps captions NOT in the demo corpus; tiny MusicGen
# pretrained (1 thread, seeded, ~MUSIC_PRETRAIN_STEPS x 0.1 s) as an unconditional music LM on the demo shards' TRAIN
# codes (stage 2: it reads shards, never audio; the held-out eval clips are never trained on)
MUSIC_PRETRAIN_STEPS ?= 1500
demo-models: demo-settings $(DEMO)/models/.done
$(DEMO)/models/.done: $(DEMO)/corpus/.done $(DEMO)/shards/manifest.json
	$(PY) -m adapter_trainer.demo_models --out $(DEMO)/models \
		--captions-csv data/musiccaps/musiccaps-public.csv --exclude-csv $(DEMO)/corpus/musiccaps-subset.csv \
		--shards $(DEMO)/shards --music-pretrain-steps $(MUSIC_PRETRAIN_STEPS)
	touch $@

demo: demo-shards demo-models
	$(PY) -m adapter_trainer +experiment=demo $(ARGS)

# ---- listen: sample a clip for every eval caption of the demo run (LISTEN_N=0; N = the first N: the probe needs
# many clips, 16 detect a half-ceiling effect ~1 time in 3), decode them in the pipeline's own process, score them
# with the attribute probe and write a static page with spectrograms (open <run>/listen/index.html from file://)
RUN ?= $(DEMO)/runs/demo
LISTEN_N ?= 0
LISTEN_SECONDS ?= 5
$(RUN)/final_metrics.json: | demo-shards demo-models
	$(PY) -m adapter_trainer +experiment=demo trainer.output_dir=$(RUN)

listen: $(RUN)/final_metrics.json
	$(PY) -m adapter_trainer.generate +experiment=demo trainer.output_dir=$(RUN) generate.checkpoint=latest \
		generate.captions=eval generate.n=$(LISTEN_N) generate.seconds=$(LISTEN_SECONDS) generate.overwrite=true $(ARGS)
	rm -rf $(RUN)/listen $(RUN)/audio_metrics.json
	$(PY) -m tokenizer_pipeline.decode $(RUN)/generated out_dir=$(RUN)/listen/generated
	$(PY) -m tokenizer_pipeline.decode $(DEMO)/shards out_dir=$(RUN)/listen/reference split=eval limit=$(LISTEN_N) \
		max_seconds=$(LISTEN_SECONDS)
	$(PY) -m adapter_trainer.probe --shards $(DEMO)/shards --generated $(RUN)/generated --out $(RUN)/generation_report.json
	$(MAKE) --no-print-directory listen-metrics
	$(PY) -m adapter_trainer.listen_page $(RUN) --source-audio $(DEMO)/corpus

# CLAP score, FAD (CLAP embeddings) and classifier KL of the decoded clips -> $(RUN)/audio_metrics.json
# (docs/evaluation.md). The models load from a local directory or the HF cache only; when absent: one line, exit 0
CLAP_MODEL ?= laion/larger_clap_music
CLASSIFIER_MODEL ?= MIT/ast-finetuned-audioset-10-10-0.4593
.PHONY: listen-metrics
listen-metrics: | setup
	$(PY) -m adapter_trainer.audio_metrics --if-available --generated $(RUN)/listen/generated \
		--reference $(RUN)/listen/reference --captions $(RUN)/generated/captions.jsonl \
		--clap $(CLAP_MODEL) --classifier $(CLASSIFIER_MODEL) --out $(RUN)/audio_metrics.json

# opt-in (not in make test): render the page with headless Chromium (Debian: apt-get install -y chromium) to a PNG
listen-check: | setup
	@test -f $(RUN)/listen/index.html || { echo "no $(RUN)/listen/index.html: run make listen first" >&2; exit 2; }
	$(PY) -m adapter_trainer.listen_check $(RUN)/listen/index.html $(RUN)/listen/page.png

# ---- generate: captions -> wavs from an exported adapter folder (`python -m adapter_trainer.export RUN --out DIR`),
# no experiment, run dir or shards: `make generate ADAPTER=DIR TEXT="calm solo piano"`. Sampling in the trainer's
# process, decoding in the pipeline's own with the codec adapter_config.json records (CODEC=dir-or-id overrides it).
# Sampling defaults come from the folder's generation_config.json; ARGS adds overrides (ARGS="generate.seconds=10")
ADAPTER ?=
TEXT ?= calm solo piano
export TEXT
CODEC ?=
GEN_OUT ?= build/generated/$(notdir $(patsubst %/,%,$(ADAPTER)))
.PHONY: generate
generate: | setup
	@if [ -z "$(ADAPTER)" ]; then echo 'make generate needs ADAPTER=DIR (a folder of python -m adapter_trainer.export), e.g. make generate ADAPTER=build/demo/adapter TEXT="calm solo piano"' >&2; exit 2; fi
	mkdir -p $(GEN_OUT) && printf '%s\n' "$$TEXT" > $(GEN_OUT)/captions.txt
	$(PY) -m adapter_trainer.generate generate.adapter=$(ADAPTER) generate.captions=file \
		generate.captions_file=$(GEN_OUT)/captions.txt generate.out_dir=$(GEN_OUT)/codes generate.overwrite=true $(ARGS)
	rm -rf $(GEN_OUT)/wav
	$(PY) -m tokenizer_pipeline.decode $(GEN_OUT)/codes out_dir=$(GEN_OUT)/wav $(if $(CODEC),codec=$(CODEC))
	@echo "make generate: wav files in $(GEN_OUT)/wav: $$(cd $(GEN_OUT)/wav && ls *.wav | tr '\n' ' ')"

# ---- the caption scaling curve (docs/results.md): 240 / 960 / 3840 training captions x seeds 1234 1 2, fixed and
# scaled steps; every stage a subprocess, resumable; hours on 2 CPU cores. SCALING_ARGS: its flags (--help)
SCALING_ARGS ?=
.PHONY: caption-scaling
caption-scaling: | setup
	$(PY) benchmarks/caption_scaling.py --out build/scaling $(SCALING_ARGS)

# ---- real data
# make audio OUT=dir: every CSV row's window from YouTube -> dir/{ytid}.flac (yt-dlp + the wheel's ffmpeg);
# then make shards DATA=dir. OUT must be given: its default is the shard directory.
audio: | setup
	@if [ "$(origin OUT)" = "file" ]; then \
		echo "make audio needs OUT=/path/to/musiccaps_audio (then: make shards DATA=/path/to/musiccaps_audio)" >&2; exit 2; fi
	$(PY) -m tokenizer_pipeline.download out_dir=$(OUT) $(ARGS)

shards: | setup
	@if [ -z "$(DATA)" ]; then $(PY) -m tokenizer_pipeline --explain; exit 2; fi
	$(PY) -m tokenizer_pipeline audio_dir=$(DATA) out_dir=$(OUT) $(ARGS)

train: | setup
	$(PY) -m adapter_trainer $(ARGS)

verify: | setup
	$(PY) -m tokenizer_pipeline.verify $(OUT)

# ---- checks
# pytest exits 5 when it collected nothing: that is a failure, not a pass. TEST_WORKERS pytest-xdist workers (one per
# core of the 2-core reference machine; 0: one process), each with TORCH_THREADS intra-op threads (default 1 per
# worker; `make test TORCH_THREADS=2` checks that no verdict depends on the thread count). Every test has a time
# budget (tests/time_budget.py; TEST_BUDGET_SCALE=2 on a slower machine). The 15 slowest phases are listed at the end.
TEST_WORKERS ?= 2
TORCH_THREADS ?=
PYTEST_ARGS ?=
test: | setup
	$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist worksteal --durations=15 \
		$(if $(TORCH_THREADS),--torch-threads $(TORCH_THREADS)) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# style: ruff's linter and formatter, configured in the top-level pyproject.toml
LINT_PATHS := packages tests benchmarks scripts
lint: | setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

format: | setup
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

# opt-in heavier checks (full-size demo run); never part of `make test`
test-slow: | setup
	$(PY) -m pytest tests -q --run-slow -m slow

# the benchmark scripts' smoke runs that start several processes each (tests/conftest.py: bench_smoke); CI runs it
test-bench: | setup
	$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist worksteal --run-bench-smoke -m bench_smoke \
		$(if $(TORCH_THREADS),--torch-threads $(TORCH_THREADS)) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-bench: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# the benchmarks' own dependencies (benchmarks/requirements.txt, pinned by constraints.txt), e.g. torchaudio
bench-setup: $(VENV)/.bench-installed
$(VENV)/.bench-installed: $(VENV)/.installed benchmarks/requirements.txt constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -r benchmarks/requirements.txt
	touch $@

# make bench: every group but the opt-in ones (resample, gpu, memory), each script in its own process: 13 min on 2
# idle cores before the startup group (3-3.5 min more beside other jobs), 25-30 beside another job (per-group times:
# docs/benchmarks.md). Any group runs again at once: its output
# directories are emptied first, never resumed. tests/benchmarks/test_bench_smoke.py runs every script at tiny sizes.
bench: demo-shards demo-models bench-setup
	$(PY) benchmarks/run_benchmarks.py $(ARGS)

# the real-size memory sweep (bench_memory.py: 24 cases, each its own process, up to ~12 GB RAM; 25-60 min on 2 cores
# by load): random weights, nothing built first; merged into build/bench/results.json like any group
bench-memory: | setup
	$(PY) benchmarks/run_benchmarks.py --only memory $(ARGS)

# CUDA figures (benchmarks/bench_gpu.py): nothing built first (random weights, synthetic audio); without CUDA: one
# line, exit 0. BUDGET_S=SECONDS: its --budget-s (drops the largest training sizes first; default in bench_gpu.py)
bench-gpu: | setup
	@$(PY) benchmarks/run_benchmarks.py --device cuda $(if $(BUDGET_S),--gpu-budget-s $(BUDGET_S))

clean:
	rm -rf build outputs multirun
