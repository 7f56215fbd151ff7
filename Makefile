# Two set-up commands: `make demo` and `make test`. Both need only python3 and make.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml keras-logq/pyproject.toml | cksum | cut -d' ' -f1)

# keras-logq (keras-logq/, Keras 3) on JAX and PyTorch runs in its own environment with no
# TensorFlow; its TensorFlow-backend tests run in .venv. torch==2.13.0 resolves to the CPU
# wheel in this machine's wheel directory (plain `torch` from PyPI is a multi-GB CUDA build).
KERAS_VENV     ?= .venv-keras
KERAS_PY       := $(KERAS_VENV)/bin/python
KERAS_PACKAGES ?= "keras>=3.10" "jax[cpu]>=0.4.34" "torch==2.13.0" "keras-rs>=0.4,<0.5" \
                  "numpy>=1.26" "pytest>=8"
KERAS_STAMP    := $(KERAS_VENV)/.installed-$(shell echo '$(KERAS_PACKAGES)' | cat - keras-logq/pyproject.toml | cksum | cut -d' ' -f1)
# tfrs-logq on TensorFlow 2.21 (no ScaNN: scann 1.4.2 loads only with 2.20): a second
# environment that runs the tests below; .venv keeps TF 2.20 and runs everything.
TF221_VENV     ?= .venv-tf221
TF221_PY       := $(TF221_VENV)/bin/python
TF221_STAMP    := $(TF221_VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
TF221_TESTS    ?= tests/test_tf_versions.py tests/test_losses.py tests/test_tasks.py \
                  tests/test_sampling.py tests/test_frequency.py \
                  tests/serving/test_serving_inputs.py tests/serving/test_serving_rest_api.py \
                  tests/serving/test_serving_grpc_service.py tests/serving/test_serving_faiss.py \
                  tests/tfrs_flows/test_drop_in.py \
                  tests/sasrec/test_training_cli.py::test_train_cli_smoke_writes_model_dir_and_json \
                  tests/cli/test_quiet.py
PIP_PROGRESS   := --progress-bar off

.PHONY: demo test test-suite test-slow test-keras test-keras-jax test-keras-torch-tf test-tf221 bench lint clean install pipeline help

$(STAMP): pyproject.toml
	@echo "== $(VENV): tfrs-logq with its test, serving and scann extras (TensorFlow 2.20: ScaNN"
	@echo "   loads only there; Beam, ...):"
	@echo "   pip prints a line per package, then unpacks them all (minutes, TensorFlow the most)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_PROGRESS) --upgrade pip
	$(PY) -m pip install $(PIP_PROGRESS) -e ".[test,serving,scann]"
	@echo "== $(VENV): keras-logq (editable) and keras-rs, for the Keras 3 TensorFlow-backend tests"
	$(PY) -m pip install $(PIP_PROGRESS) "keras-rs>=0.4,<0.5"
	$(PY) -m pip install $(PIP_PROGRESS) --no-deps -e keras-logq
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# `make demo` needs the package alone (TensorFlow, tf-keras, TFRS, matplotlib): without the
# full install above it installs just that (no ScaNN, Beam, TFDS, serving or test tools).
DEMO_STAMP := $(VENV)/.installed-demo-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

$(DEMO_STAMP): pyproject.toml
	@echo "== $(VENV): tfrs-logq for the demo (TensorFlow, tf-keras, TFRS, matplotlib): pip"
	@echo "   prints a line per package, then unpacks them all (minutes, TensorFlow the most)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_PROGRESS) --upgrade pip
	$(PY) -m pip install $(PIP_PROGRESS) -e .
	@echo "== $(VENV) holds the package alone: serve/evaluate need pip install -e '.[serving]',"
	@echo "   pipeline run '.[beam]', export --index scann '.[scann]' (TensorFlow 2.20; README Set-up)"
	touch $(DEMO_STAMP)

$(KERAS_STAMP): keras-logq/pyproject.toml
	@echo "== $(KERAS_VENV): keras, jax (CPU), torch (CPU), keras-rs, keras-logq; no TensorFlow"
	test -x $(KERAS_PY) || $(PYTHON) -m venv $(KERAS_VENV)
	$(KERAS_PY) -m pip install $(PIP_PROGRESS) $(KERAS_PACKAGES)
	$(KERAS_PY) -m pip install $(PIP_PROGRESS) --no-deps -e keras-logq
	rm -f $(KERAS_VENV)/.installed-*
	touch $(KERAS_STAMP)

$(TF221_STAMP): pyproject.toml
	@echo "== $(TF221_VENV): tfrs-logq on TensorFlow 2.21 and tf-keras 2.21, without ScaNN"
	test -x $(TF221_PY) || $(PYTHON) -m venv $(TF221_VENV)
	$(TF221_PY) -m pip install $(PIP_PROGRESS) "tensorflow==2.21.*" "tf-keras==2.21.*" \
	  "tensorflow-recommenders==0.7.7" -e ".[serving]" "pytest>=8" "scipy>=1.11"
	rm -f $(TF221_VENV)/.installed-*
	touch $(TF221_STAMP)

install: $(STAMP) $(KERAS_STAMP)

demo: $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	@echo "== the demo: none, logq-tfrs and corrected on the synthetic stream (a line per phase and"
	@echo "   per tenth of the steps when piped; Keras' progress bar in a terminal)"
	$(VENV)/bin/tfrs-logq demo --output-dir demo_output

# The batch pipeline (Apache Beam, local FnApiRunner) on SASRec's ML-1M, gSASRec's split:
# ExampleGen, Statistics, Trainer, Exporter, BulkInferrer, Evaluator, Pusher. The Trainer
# runs the smoke preset, so the whole pipeline takes minutes on 2 CPU cores: a check of the
# pipeline, not a usable model (PIPELINE_PRESET=cpu or long trains one, in hours). A blessed
# export is pushed to pipeline_output/serving/ml1m (tfrs-logq serve --model_name ml1m
# --model_base_path pipeline_output/serving/ml1m).
PIPELINE_DATA ?= ../shared/data/ml-1m-sasrec
PIPELINE_PRESET ?= smoke
# Without the ML-1M data it runs ExampleGen and Statistics on the synthetic stream instead.
pipeline: $(STAMP)
	if [ -d "$(PIPELINE_DATA)" ]; then \
	  $(VENV)/bin/tfrs-logq pipeline run --pipeline-root pipeline_output --dataset ml-1m \
	    --data-dir $(PIPELINE_DATA) --data-format sasrec --split gsasrec \
	    --preset $(PIPELINE_PRESET) --model_base_path pipeline_output/serving/ml1m; \
	else \
	  echo "$(PIPELINE_DATA) not found: running the synthetic stream (ExampleGen, Statistics)"; \
	  $(VENV)/bin/tfrs-logq pipeline run --pipeline-root pipeline_output/synthetic \
	    --dataset synthetic; \
	fi

# The full suite on TF 2.20, keras-logq on three backends, then a selection on TF 2.21.
# The TF 2.20 suite in TEST_WORKERS processes (pytest-xdist; 0: one process), a test file
# per worker at a time (its module fixtures built once): the suite is mostly one busy core
# (Python, tracing), so 2 workers on 2 cores take about half the time.
TEST_WORKERS ?= 2

# Then the other environments' runs (one process each: TF 2.21 and the two keras-logq lanes)
# as parallel jobs (make -j), each job's output printed whole when it ends. On 2 cores the
# lanes save about 2.5 minutes over one after the other; starting them beside the suite
# saves nothing more (the suite keeps both cores busy).
test: $(STAMP) $(KERAS_STAMP) $(TF221_STAMP)
	$(MAKE) --no-print-directory test-suite
	$(MAKE) --no-print-directory -j 3 --output-sync=target test-tf221 test-keras-jax \
	  test-keras-torch-tf

# The TF 2.20 suite alone (the first part of make test).
test-suite: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

# The tests marked slow (benchmarks' smoke runs, about 1.5 min on 2 cores), which `make
# test` leaves out; CI (.ci/run) runs them after it.
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# keras-logq: one pytest process per Keras backend. PyTorch gets one OpenMP thread: its
# threads spin on shared cores (a step measured 6-25x slower on 2 busy cores).
test-keras: test-keras-jax test-keras-torch-tf

test-keras-jax: $(KERAS_STAMP)
	@echo "== keras-logq, KERAS_BACKEND=jax ($(KERAS_VENV), no TensorFlow)"
	cd keras-logq && KERAS_BACKEND=jax $(abspath $(KERAS_PY)) -m pytest -q
	@echo "== the accelerator study (benchmarks/accelerator), KERAS_BACKEND=jax, no TensorFlow"
	KERAS_BACKEND=jax $(KERAS_PY) -m pytest -q benchmarks/accelerator/tests

test-keras-torch-tf: $(STAMP) $(KERAS_STAMP)
	@echo "== keras-logq, KERAS_BACKEND=torch ($(KERAS_VENV), no TensorFlow)"
	cd keras-logq && OMP_NUM_THREADS=1 KERAS_BACKEND=torch $(abspath $(KERAS_PY)) -m pytest -q
	@echo "== keras-logq, KERAS_BACKEND=tensorflow ($(VENV), TensorFlow 2.20)"
	cd keras-logq && KERAS_BACKEND=tensorflow $(abspath $(PY)) -m pytest -q
	@echo "== the accelerator study's held-out batch against TensorFlow's RNG ($(VENV))"
	$(PY) -m pytest -q benchmarks/accelerator/tests/test_tf_philox.py

# tfrs-logq on TensorFlow 2.21: task, losses, samplers, frequency, training smoke, a
# brute-force export (test_tf_versions.py), both protocols' request checks and a server
# answering and refusing on both (test_serving_{inputs,rest_api,grpc_service}.py), the faiss
# index that serves there in ScaNN's place, and the drop-in's contract with TFRS.
test-tf221: $(TF221_STAMP)
	@echo "== tfrs-logq on TensorFlow 2.21 ($(TF221_VENV)): $(TF221_TESTS)"
	$(TF221_PY) -m pytest -q $(TF221_TESTS)

bench: $(STAMP) $(KERAS_STAMP)
	$(PY) benchmarks/bench_task.py
	$(PY) benchmarks/bench_frequency.py
	$(PY) benchmarks/bench_synthetic.py
	$(PY) benchmarks/bench_data.py
	$(PY) benchmarks/bench_sasrec.py
	$(PY) benchmarks/bench_serving.py
	$(PY) benchmarks/bench_keras3.py

# Ruff, and the layers as import-linter contracts (pyproject.toml) on the package laid
# out as installed (pipelines/ and serving/ are tfrs_logq.pipelines and .serving).
lint: $(STAMP)
	$(PY) -m pip install -q -e ".[dev]"
	$(VENV)/bin/ruff check tfrs_logq pipelines serving lab tests benchmarks tools
	rm -rf build/layout && $(PY) tools/installed_layout.py build/layout
	cd build/layout && PYTHONPATH=. $(abspath $(VENV))/bin/lint-imports $(CURDIR)/pyproject.toml

clean:
	rm -rf $(VENV) $(KERAS_VENV) $(TF221_VENV) demo_output pipeline_output build *.egg-info \
	  keras-logq/*.egg-info

help:
	@echo "make demo      train none/logq-tfrs/corrected on the synthetic stream (demo_output/)"
	@echo "make test      the test suite (TF 2.20), keras-logq on jax/torch/tensorflow, and a"
	@echo "               selection on TF 2.21 (make test-keras, make test-tf221: those parts alone)"
	@echo "make test-slow the tests marked slow (benchmarks' smoke runs); CI runs it after make test"
	@echo "make pipeline  the Beam pipeline on ML-1M into pipeline_output/, all seven components;"
	@echo "               the Trainer uses the smoke preset (minutes on 2 CPU cores, not a usable"
	@echo "               model; PIPELINE_PRESET=cpu or long for one, hours)"
	@echo "make bench     the benchmarks; make lint: ruff; make clean: remove outputs"
