# Two set-up commands: `make demo` and `make test`. Both need only python3 and make.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test bench lint clean install pipeline help

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,serving]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
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
	    --preset $(PIPELINE_PRESET) --serving-base-path pipeline_output/serving/ml1m; \
	else \
	  echo "$(PIPELINE_DATA) not found: running the synthetic stream (ExampleGen, Statistics)"; \
	  $(VENV)/bin/tfrs-logq pipeline run --pipeline-root pipeline_output/synthetic \
	    --dataset synthetic; \
	fi

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/bench_task.py
	$(PY) benchmarks/bench_frequency.py
	$(PY) benchmarks/bench_synthetic.py
	$(PY) benchmarks/bench_data.py
	$(PY) benchmarks/bench_sasrec.py
	$(PY) benchmarks/bench_serving.py

lint: $(STAMP)
	$(PY) -m pip install -q -e ".[dev]"
	$(VENV)/bin/ruff check tfrs_logq pipelines serving tests benchmarks

clean:
	rm -rf $(VENV) demo_output pipeline_output build *.egg-info

help:
	@echo "make demo      train none/logq/corrected on the synthetic stream (demo_output/)"
	@echo "make test      the test suite"
	@echo "make pipeline  the Beam pipeline on ML-1M into pipeline_output/, all seven components;"
	@echo "               the Trainer uses the smoke preset (minutes on 2 CPU cores, not a usable"
	@echo "               model; PIPELINE_PRESET=cpu or long for one, hours)"
	@echo "make bench     the benchmarks; make lint: ruff; make clean: remove outputs"
