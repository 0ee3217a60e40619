# Two stages, two processes: `make shards` writes token shards, `make train` reads only those; `make demo` runs both.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO := build/demo
# stand-in corpus: DEMO_CLIPS rows of the real CSV as DEMO_SECONDS-s clips, DEMO_EVAL_FRACTION held out (docs/results.md)
DEMO_CLIPS ?= 1040
DEMO_SECONDS ?= 2.5
DEMO_EVAL_FRACTION ?= 0.0769
# make corpus LAYOUT=audiocraft|audiofolder: the stand-in as your-own-audio layouts, TRACK_SECONDS-s stereo tracks
LAYOUT ?= musiccaps
TRACK_SECONDS ?= 30
LAYOUT_CLIPS ?= 32
LAYOUT_EVAL_FRACTION ?= 0.25
# clips whose encoder latents fit the demo codec's RVQ codebooks, and its conv width (encodec_32khz's is 64)
DEMO_CODEC_CLIPS ?= 160
DEMO_CODEC_WIDTH ?= 8
# pretraining steps of the demo models, the demo run's training steps (empty: each command's own default)
LLM_PRETRAIN_STEPS ?=
T5_PRETRAIN_STEPS ?=
MUSIC_PRETRAIN_STEPS ?=
DEMO_STEPS ?=
# make demo-quick: the same steps at these sizes, in build/demo-quick
QUICK_CLIPS ?= 240
QUICK_EVAL_FRACTION ?= 0.125
QUICK_CODEC_CLIPS ?= 160
QUICK_LLM_PRETRAIN_STEPS ?= 30
QUICK_T5_PRETRAIN_STEPS ?=
QUICK_MUSIC_PRETRAIN_STEPS ?= 600
QUICK_STEPS ?= 120
# extra Hydra overrides (make train ARGS="+experiment=demo trainer.max_steps=10"); for make bench, its flags
ARGS ?=
# real MusicCaps audio directory for `make shards`, and the shard-set output directory
DATA ?=
OUT ?= build/shards

.PHONY: help setup wheelhouse demo demo-quick bench-codec corpus codec demo-shards demo-models audio shards train verify test test-slow test-multiprocess test-bench lint format bench bench-setup bench-memory bench-gpu clean listen listen-check

# make help: the main targets in one screen (every variable: docs/configuration.md)
help:
	@echo 'make setup                      .venv with both packages (editable), pytest, ruff'
	@echo 'make demo-quick                 the offline demo end to end at a smaller size (build/demo-quick)'
	@echo 'make demo                       the offline demo end to end: corpus, codec, shards, tiny models, training'
	@echo 'make listen                     clips for the demo run'"'"'s eval captions, probed, on a static page'
	@echo 'make generate ADAPTER=DIR TEXT="calm solo piano"   wavs from an exported adapter folder'
	@echo 'make audio OUT=DIR              MusicCaps audio from YouTube (yt-dlp + ffmpeg)'
	@echo 'make shards DATA=DIR [OUT=build/shards]   encode real audio into a shard set (stage 1)'
	@echo 'make verify [OUT=build/shards]  check a shard set against the contract'
	@echo 'make train ARGS="+experiment=cuda_1b '"'"'data.shards=[build/shards]'"'"'"   train (stage 2)'
	@echo 'make test / make lint / make format   the tests (2 workers) / ruff check + format --check / apply ruff'
	@echo 'make test-multiprocess / test-bench / test-slow   opt-in tests: runs of several processes, benchmark smoke runs (CI runs both) / full-size checks'
	@echo 'make bench                      speed and memory of both stages -> build/bench/results.md'
	@echo 'make clean                      remove build/, outputs/, multirun/'
	@echo 'python -m adapter_trainer --help, python -m tokenizer_pipeline --help: the commands themselves'

# test-only tools beside the packages: pytest, ruff, Hugging Face datasets, moto's S3 server and Flask (tests/remote)
setup: $(VENV)/.installed

# ---- a GPU node without internet (docs/real-data.md, "A GPU node without internet")
# make wheelhouse: every wheel make setup WHEELS=... needs, for WHEEL_PYTHON on WHEEL_PLATFORM (scripts/wheelhouse.py)
WHEELHOUSE ?= build/wheelhouse
WHEEL_PYTHON ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
WHEEL_PLATFORM ?= manylinux_2_28_$(shell uname -m)
WITH_TORCH ?=
wheelhouse:
	$(PYTHON) scripts/wheelhouse.py build --out $(WHEELHOUSE) --python-version $(WHEEL_PYTHON) \
		--platform $(WHEEL_PLATFORM) $(if $(filter 1,$(WITH_TORCH)),--with-torch)

# make setup WHEELS=dir: install from dir with no index, reusing the torch that $(PYTHON) imports (docs/real-data.md)
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
		--out $(DEMO)/corpus-$* --n-clips $(LAYOUT_CLIPS) --layout $* --duration-s $(TRACK_SECONDS) \
		--eval-fraction $(LAYOUT_EVAL_FRACTION)
	touch $@
$(DEMO)/corpus/.done: | setup
	$(PY) -m tokenizer_pipeline.standin_corpus --csv data/musiccaps/musiccaps-public.csv \
		--out $(DEMO)/corpus --n-clips $(DEMO_CLIPS) --duration-s $(DEMO_SECONDS) --eval-fraction $(DEMO_EVAL_FRACTION)
	touch $@

# sizes that cannot give a demo, or a $(DEMO) built with other settings, stop the build before any work, naming the fix
.PHONY: demo-settings
demo-settings: | setup
	@$(PY) -m tokenizer_pipeline.standin_corpus --check-built --out $(DEMO)/corpus --build-dir $(DEMO) \
		--n-clips $(DEMO_CLIPS) --duration-s $(DEMO_SECONDS) --eval-fraction $(DEMO_EVAL_FRACTION) \
		--codec-clips $(DEMO_CODEC_CLIPS) --setting DEMO_CODEC_WIDTH=$(DEMO_CODEC_WIDTH) \
		--setting LLM_PRETRAIN_STEPS=$(LLM_PRETRAIN_STEPS) --setting T5_PRETRAIN_STEPS=$(T5_PRETRAIN_STEPS) \
		--setting MUSIC_PRETRAIN_STEPS=$(MUSIC_PRETRAIN_STEPS) --count DEMO_STEPS=$(DEMO_STEPS)

codec: demo-settings $(DEMO)/codec/config.json
$(DEMO)/codec/config.json: $(DEMO)/corpus/.done
	$(PY) -m tokenizer_pipeline.demo_codec --corpus $(DEMO)/corpus --out $(DEMO)/codec \
		--n-clips $(DEMO_CODEC_CLIPS) --num-filters $(DEMO_CODEC_WIDTH)

demo-shards: demo-settings $(DEMO)/shards/manifest.json
# clips shorter than MusicCaps' 10-s window are the stand-in's length, not a bad download: widen the tolerance
DEMO_SHARD_ARGS := csv=$(DEMO)/corpus/musiccaps-subset.csv audio_dir=$(DEMO)/corpus out_dir=$(DEMO)/shards \
	codec.name_or_path=$(DEMO)/codec duration_tolerance_s=$(shell $(PYTHON) -c 'print(round(10 - $(DEMO_SECONDS) + 0.5, 3))')
$(DEMO)/shards/manifest.json: $(DEMO)/codec/config.json
	$(PY) -m tokenizer_pipeline +preset=demo $(DEMO_SHARD_ARGS)

# tiny Llama and MusicGen's T5 on the captions not in the corpus (beside stage 1), then MusicGen on the train codes, alone
DEMO_MODEL_ARGS := --out $(DEMO)/models --captions-csv data/musiccaps/musiccaps-public.csv \
	--exclude-csv $(DEMO)/corpus/musiccaps-subset.csv $(if $(LLM_PRETRAIN_STEPS),--pretrain-steps $(LLM_PRETRAIN_STEPS)) \
	$(if $(T5_PRETRAIN_STEPS),--t5-pretrain-steps $(T5_PRETRAIN_STEPS))
demo-models: demo-settings $(DEMO)/models/.done
$(DEMO)/models/.text-done: $(DEMO)/corpus/.done
	$(PY) -m adapter_trainer.demo_models --part text $(DEMO_MODEL_ARGS)
	touch $@
$(DEMO)/models/.done: $(DEMO)/models/.text-done $(DEMO)/shards/manifest.json
	$(PY) -m adapter_trainer.demo_models --part music $(DEMO_MODEL_ARGS) --shards $(DEMO)/shards --music-pretrain-threads 2 \
		$(if $(MUSIC_PRETRAIN_STEPS),--music-pretrain-steps $(MUSIC_PRETRAIN_STEPS))
	touch $@

# the demo run reads $(DEMO)'s shards and models; make demo then exports the adapter to $(DEMO)/adapter (README's Python)
DEMO_TRAIN_ARGS := 'data.shards=[$(DEMO)/shards]' model.llm=$(DEMO)/models/llm model.audio_lm=$(DEMO)/models/musicgen \
	$(if $(DEMO_STEPS),trainer.max_steps=$(DEMO_STEPS))
demo: | setup
	@$(MAKE) --no-print-directory -j2 demo-shards demo-models  # two jobs: the LLM pretrains beside the codec and encoding
	$(PY) -m adapter_trainer +experiment=demo $(DEMO_TRAIN_ARGS) trainer.output_dir=$(DEMO)/runs/demo $(ARGS)
	$(PY) -m adapter_trainer.export $(DEMO)/runs/demo --out $(DEMO)/adapter --overwrite

demo-quick:
	@$(MAKE) --no-print-directory demo DEMO=build/demo-quick DEMO_CLIPS=$(QUICK_CLIPS) \
		DEMO_EVAL_FRACTION=$(QUICK_EVAL_FRACTION) DEMO_CODEC_CLIPS=$(QUICK_CODEC_CLIPS) \
		LLM_PRETRAIN_STEPS=$(QUICK_LLM_PRETRAIN_STEPS) T5_PRETRAIN_STEPS=$(QUICK_T5_PRETRAIN_STEPS) \
		MUSIC_PRETRAIN_STEPS=$(QUICK_MUSIC_PRETRAIN_STEPS) DEMO_STEPS=$(QUICK_STEPS)

# ---- listen: a clip per eval caption of the demo run (LISTEN_N: the first N), decoded, probed, on a static page
RUN ?= $(DEMO)/runs/demo
LISTEN_N ?= 0
LISTEN_SECONDS ?= 5
$(RUN)/final_metrics.json: | demo-shards demo-models
	$(PY) -m adapter_trainer +experiment=demo $(DEMO_TRAIN_ARGS) trainer.output_dir=$(RUN)

listen: $(RUN)/final_metrics.json
	$(PY) -m adapter_trainer.generate +experiment=demo $(DEMO_TRAIN_ARGS) trainer.output_dir=$(RUN) generate.checkpoint=latest \
		generate.captions=eval generate.n=$(LISTEN_N) generate.seconds=$(LISTEN_SECONDS) generate.overwrite=true $(ARGS)
	rm -rf $(RUN)/listen $(RUN)/audio_metrics.json
	$(PY) -m tokenizer_pipeline.decode $(RUN)/generated out_dir=$(RUN)/listen/generated
	$(PY) -m tokenizer_pipeline.decode $(DEMO)/shards out_dir=$(RUN)/listen/reference split=eval limit=$(LISTEN_N) \
		max_seconds=$(LISTEN_SECONDS)
	$(PY) -m adapter_trainer.probe --shards $(DEMO)/shards --generated $(RUN)/generated --out $(RUN)/generation_report.json
	$(MAKE) --no-print-directory listen-metrics
	$(PY) -m adapter_trainer.listen_page $(RUN) --source-audio $(DEMO)/corpus

# CLAP score, FAD and classifier KL of the decoded clips -> $(RUN)/audio_metrics.json (docs/evaluation.md)
CLAP_MODEL ?= laion/larger_clap_music
CLASSIFIER_MODEL ?= MIT/ast-finetuned-audioset-10-10-0.4593
.PHONY: listen-metrics
listen-metrics: | setup
	$(PY) -m adapter_trainer.audio_metrics --if-available --generated $(RUN)/listen/generated \
		--reference $(RUN)/listen/reference --captions $(RUN)/generated/captions.jsonl \
		--clap $(CLAP_MODEL) --classifier $(CLASSIFIER_MODEL) --out $(RUN)/audio_metrics.json

# opt-in (not in make test): render the page with headless Chromium to a PNG
listen-check: | setup
	@test -f $(RUN)/listen/index.html || { echo "no $(RUN)/listen/index.html: run make listen first" >&2; exit 2; }
	$(PY) -m adapter_trainer.listen_check $(RUN)/listen/index.html $(RUN)/listen/page.png

# ---- generate: captions -> wavs from an exported adapter folder (make generate ADAPTER=DIR TEXT="calm solo piano")
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

# ---- the caption scaling curve (docs/results.md), every stage a subprocess, resumable; SCALING_ARGS: its flags
SCALING_ARGS ?=
.PHONY: caption-scaling
caption-scaling: | setup
	$(PY) benchmarks/caption_scaling.py --out build/scaling $(SCALING_ARGS)

# ---- real data
# make audio OUT=dir: every CSV row's window from YouTube -> dir/{ytid}.flac; then make shards DATA=dir
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
# pytest exits 5 when it collected nothing: a failure; TEST_WORKERS xdist workers with TORCH_THREADS threads each
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

# opt-in heavier checks (full-size demo run); never part of make test
test-slow: | setup
	$(PY) -m pytest tests -q --run-slow -m slow

# runs of several processes (torchrun ranks, nodes, spawned workers: tests/conftest.py, multiprocess)
test-multiprocess: | setup
	$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist worksteal --run-multiprocess -m multiprocess \
		$(if $(TORCH_THREADS),--torch-threads $(TORCH_THREADS)) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-multiprocess: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# the benchmark scripts' smoke runs that start several processes each (tests/conftest.py: bench_smoke)
test-bench: | setup
	$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist worksteal --run-bench-smoke -m bench_smoke \
		$(if $(TORCH_THREADS),--torch-threads $(TORCH_THREADS)) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-bench: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# the benchmarks' own dependencies (benchmarks/requirements.txt, pinned by constraints.txt)
bench-setup: $(VENV)/.bench-installed
$(VENV)/.bench-installed: $(VENV)/.installed benchmarks/requirements.txt constraints.txt
	$(PY) -m pip install --quiet -c constraints.txt -r benchmarks/requirements.txt
	touch $@

# the codec make bench encodes with: encodec_32khz's width (64), fitted like the demo codec, so its figures are real users'
BENCH_CODEC := build/bench/codec
bench-codec: $(BENCH_CODEC)/config.json
$(BENCH_CODEC)/config.json: $(DEMO)/corpus/.done
	$(PY) -m tokenizer_pipeline.demo_codec --corpus $(DEMO)/corpus --out $(BENCH_CODEC) \
		--n-clips $(DEMO_CODEC_CLIPS) --num-filters 64

# make bench: every group but the opt-in ones (resample, gpu, memory), each script in its own process
bench: demo-shards demo-models bench-setup bench-codec
	$(PY) benchmarks/run_benchmarks.py --codec $(BENCH_CODEC) $(ARGS)

# the real-size memory sweep (bench_memory.py), merged into build/bench/results.json
bench-memory: | setup
	$(PY) benchmarks/run_benchmarks.py --only memory $(ARGS)

# CUDA figures (benchmarks/bench_gpu.py; without CUDA: one line, exit 0); BUDGET_S: its --budget-s
bench-gpu: | setup
	@$(PY) benchmarks/run_benchmarks.py --device cuda $(if $(BUDGET_S),--gpu-budget-s $(BUDGET_S))

clean:
	rm -rf build outputs multirun
