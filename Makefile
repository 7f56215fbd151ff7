# Two set-up commands: `make demo` and `make test`. Both need only python3 and make.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test bench lint clean install pipeline

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,serving]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tfrs-logq demo --output-dir demo_output

# The batch pipeline (Apache Beam, local FnApiRunner) on SASRec's ML-1M, gSASRec's split.
PIPELINE_DATA ?= ../shared/data/ml-1m-sasrec
pipeline: $(STAMP)
	$(VENV)/bin/tfrs-logq pipeline run --pipeline-root pipeline_output --dataset ml-1m \
	  --data-dir $(PIPELINE_DATA) --data-format sasrec --split gsasrec

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
