# Every target installs what it needs into .venv first (a fresh machine needs
# only python3 and a JDK; Spark tests also need Java 17+).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test lint demo bench broker clean

$(STAMP): pyproject.toml conf/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c conf/constraints.txt --config-settings editable_mode=compat -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

## Run the test suite (embedded broker always; real RabbitMQ too when AMQP_TEST_URL is set).
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

## The main job: embedded broker -> streaming source -> Parquet, with progress and a summary.
demo: $(STAMP)
	$(PY) examples/amqp_stream_demo.py $(DEMO_ARGS)

## Start a standalone embedded broker on 127.0.0.1:5672.
broker: $(STAMP)
	$(PY) -m spark_amqp.broker

bench: $(STAMP)
	$(PY) benchmarks/broker_throughput.py
	$(PY) benchmarks/source_throughput.py
	$(PY) benchmarks/sink_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
