# Every target installs what it needs into .venv first (a fresh machine needs
# only python3 and a JDK; Spark tests also need Java 17+). `test` and `demo` also
# fetch the Delta Lake jars into .cache/jars with Maven (mvn), see conf/delta/pom.xml;
# `bench` also fetches RabbitMQ's PerfTest into .cache/perftest (conf/perftest/pom.xml).
# `rabbitmq` installs and starts the real RabbitMQ nodes the tests also run against (tools/rabbitmq).
# The compiled core (core/) is built with cargo (rustup's) and maturin and ziglang (from PyPI, pinned).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JARS_DIR := .cache/jars
JARS_STAMP := $(JARS_DIR)/.stamp
# The other PySpark lines the Spark tests run on (.venv is the pinned one, conf/constraints.txt).
PYSPARK_LINES := 4.0 4.1 4.2
# The Python a line's venv is made with: 4.0 on 3.12, Databricks Runtime 17.x's pair, where the machine has a
# CPython 3.12 (pyenv's; no package registry serves one); the others on $(PYTHON).
PYTHON_4.0 ?= $(or $(wildcard $(shell pyenv prefix 3.12 2>/dev/null)/bin/python3.12),$(PYTHON))
# The 4.0 line also pins the lowest versions the package declares (conf/constraints-pyspark4.0.txt): there the
# tests without Spark run too.
LOWEST_LINE := 4.0
# The Spark tests of this line run on the compiled core's pure-Python twin (SPARK_AMQP_PURE_PYTHON=1), every other
# lane with the core where it is installed: both paths under Spark in every CI run (the tests without Spark run both
# in-process: tests/streams/conftest.py, tests/stream_protocol/test_core_*.py).
PURE_PYTHON_LINE := $(LOWEST_LINE)
# The lines between the lowest and the pinned one (which bound what a line may lack or change), and CPython 3.13, run
# the Spark tests of every mode's source and sink only: not those of deployments, jobs and threads (CI time: on two
# cores, CI's Spark lanes beside each other are bound by CPU). 4.2 also runs the Delta tests.
MIDDLE_LINES := 4.1 4.2
# The hypothesis tests comparing the compiled core with Python (CORE_EXAMPLES) in the lanes of the other Pythons and
# lowest dependencies: the same abi3 core, which make test searches with 400-2,000 examples a test. They took a third of
# each lane's time at full count (about 550 of 1,650-1,800 test-seconds, ci89).
MATRIX_EXAMPLES := 100
SPARK_MODE_TESTS := tests/spark/test_source_stream.py tests/spark/test_sink.py tests/spark/test_stream_queues.py
# CPython 3.13, Debian 13's, in a chroot (tools/python3.13): the tests without Spark and the Spark mode tests, on the
# embedded broker, with PySpark 4.1 (PY313_LINE). CI pairs Python and PySpark lines instead of crossing them: 4.0 on
# 3.12, 4.1 on 3.13, 4.2 (the Delta tests) and 4.3 on 3.11, so each Python and each PySpark line is tested, for two
# lanes' CPU less (CI on two cores is bound by CPU: docs/development.md).
PY313_VENV := .venv-python3.13
PY313_LINE := 4.1
# Every variable that points the tests at a real broker: unset, the embedded broker serves them all.
AMQP_TEST_VARS := AMQP_TEST_BROKERS AMQP_TEST_URL AMQP_TEST_DENYING_URL AMQP_TEST_STREAM_BROKERS AMQP_TEST_CLUSTER_URL \
	AMQP_TEST_CLUSTER_STREAM_URL AMQP_TEST_TLS_URL AMQP_TEST_TLS_STREAM_URL AMQP_TEST_TLS_DIR AMQP_TEST_OAUTH_URL AMQP_TEST_OAUTH_STREAM_URL \
	AMQP_TEST_ARTEMIS_URL
EMBEDDED_ONLY := env $(AMQP_TEST_VARS:%=-u %)
# The newest PySpark line Delta Lake is built for (conf/delta/pom.xml): the tests marked `delta`,
# the demo and the Delta benchmarks run in its venv, where the wheel is installed as a user would.
DELTA_LINE := 4.2
DELTA_VENV := .venv-pyspark$(DELTA_LINE)
DELTA_PY := $(DELTA_VENV)/bin/python
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
WHEEL := dist/spark_amqp-$(VERSION)-py3-none-any.whl
SOURCES := pyproject.toml README.md pyspark_amqp.py $(shell find spark_amqp -name '*.py' -o -name py.typed)
# The embedded broker, a distribution of its own (broker/): tests, the demo and users' own tests install it.
BROKER_WHEEL := dist/spark_amqp_broker-$(VERSION)-py3-none-any.whl
BROKER_SOURCES := broker/pyproject.toml broker/README.md $(shell find broker/spark_amqp_broker -name '*.py' -o -name py.typed)
# The compiled core (core/: spark-amqp-core, Rust), a distribution of its own that the connector requires on Linux
# x86_64 and aarch64 under CPython. maturin builds it; ziglang links the wheels users install against glibc 2.17
# (manylinux2014), one abi3 wheel per architecture for CPython 3.11 and later. cargo keeps its build in .cache/cargo.
CORE_SOURCES := core/Cargo.toml core/Cargo.lock core/pyproject.toml core/README.md $(shell find core/src core/python -name '*.rs' -o -name '*.py' -o -name py.typed)
CORE_TAG = cp311-abi3-manylinux2014_$(1).manylinux_2_17_$(1)
CORE_WHEEL := dist/spark_amqp_core-$(VERSION)-$(call CORE_TAG,x86_64).whl
CORE_WHEEL_AARCH64 := dist/spark_amqp_core-$(VERSION)-$(call CORE_TAG,aarch64).whl
# The tests' build (make install): optimised, with overflow checks and debug assertions (Cargo profile `checked`), so
# that what the differential test reaches panics rather than wraps; the wheel users install is the release build.
CORE_CHECKED := .cache/core-checked
# $(call maturin,args[,target dir]): the aarch64 build has a target directory of its own, so that CI builds it beside
# make test's cargo runs instead of waiting on their lock.
maturin = PATH="$(abspath $(VENV))/bin:$$PATH" CARGO_TARGET_DIR="$(abspath $(or $(2),.cache/cargo))" $(VENV)/bin/maturin build --quiet -m core/Cargo.toml $(1)
# `make broker` listens here, not on 5672, so it never collides with a local RabbitMQ.
BROKER_PORT ?= 5673
# A command each lane of the tests runs under, given the lane's name first: .ci/run sets it to `tools/cpu run`, which
# accounts each lane's CPU (children included) in a cgroup of its own.
LANE ?=
lane = $(if $(LANE),$(LANE) $(1))
# Processes the tests without Spark are spread over (they mostly wait on brokers).
TEST_WORKERS ?= 4
# The JVMs the tests start (Spark's drivers, executors and jobs, each test's restarts): the client compiler only and
# the serial collector. A JVM's CPU for a local session and a few small jobs went from 25-27 s to 12.9 s (measured
# here), and the tests start dozens, on two cores; their work is small, so C2's faster code never pays off there.
# Not for the demo or the benchmarks.
TEST_JVM := -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
# And class-data sharing (tools/jvm_archive.py): an archive of the classes a venv's Spark JVMs load, for the venvs whose
# JVMs the tests start by the dozen (the pinned line's; the Delta line's, whose crash tests restart their jobs). A local
# session writing a Delta table went from 30 s of CPU to 20 s with it. A JVM whose class path differs (another venv's,
# the Java stream client's) would ignore it and the JDK's own archive with it, so each lane names the archive of its
# venv, or none.
CDS_DIR := .cache/cds
CDS_MAIN := $(CDS_DIR)/venv.jsa
CDS_DELTA := $(CDS_DIR)/venv-pyspark$(DELTA_LINE).jsa
test_jvm = $(TEST_JVM) -Xlog:cds*=off -XX:SharedArchiveFile=$(abspath $(1))
# $(call jvm_archive,python): $@ written by a run of tools/jvm_archive.py in that python's venv (its log beside it).
define jvm_archive
	@mkdir -p $(CDS_DIR)
	rm -f $@
	JAVA_TOOL_OPTIONS="$(TEST_JVM) -Xlog:cds*=off -XX:ArchiveClassesAtExit=$(abspath $@)" $(1) tools/jvm_archive.py >$@.log 2>&1 || { cat $@.log; exit 1; }
	test -s $@
endef

PERFTEST_DIR := .cache/perftest
PERFTEST_STAMP := $(PERFTEST_DIR)/.stamp
STREAMCLIENT_DIR := .cache/stream-client
STREAMCLIENT_STAMP := $(STREAMCLIENT_DIR)/.stamp
STREAMCLIENT_CLASS := $(STREAMCLIENT_DIR)/classes/StreamConsume.class
INTEROP_CLASS := $(STREAMCLIENT_DIR)/classes/StreamInterop.class

.PHONY: install jars perftest streamclient wheel core-aarch64 fuzz jvm-archives test test-prereqs test-matrix $(PYSPARK_LINES:%=test-pyspark%) test-python3.13 lint demo bench broker rabbitmq soak clean

# The core first: the connector requires it here, and it is on no package index.
$(STAMP): pyproject.toml broker/pyproject.toml conf/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c conf/constraints.txt maturin ziglang
	$(install_core)
	$(PY) -m pip install --quiet -c conf/constraints.txt -e ".[test]" -e ./broker
	# The AMQP 1.0 reference client (tests/amqp10_client/test_interop.py, benchmarks): built from its sdist, which
	# needs a C compiler, so here and not in the test extras every venv installs.
	$(PY) -m pip install --quiet -c conf/constraints.txt python-qpid-proton
	$(PY) tools/pyspark_bytecode.py
	touch $(STAMP) $(VENV)/.core

# The checked build of the core into .venv (cargo must be there: rustup's). Again after a change under core/.
define install_core
	@command -v cargo >/dev/null 2>&1 || { echo "make install builds the compiled core (core/) with cargo: install Rust with rustup" >&2; exit 1; }
	rm -rf $(CORE_CHECKED)
	$(call maturin,--profile checked --out $(CORE_CHECKED))
	$(PY) -m pip install --quiet --no-deps --force-reinstall $(CORE_CHECKED)/spark_amqp_core-*.whl
	touch $(VENV)/.core
endef

$(VENV)/.core: $(STAMP) $(CORE_SOURCES)
	$(install_core)

install: $(STAMP) $(VENV)/.core

## The wheel users install (pip's standard PEP 517 build), and the embedded broker's for their tests.
$(WHEEL): $(STAMP) $(SOURCES)
	rm -rf build
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .
	rm -rf build

$(BROKER_WHEEL): $(STAMP) $(BROKER_SOURCES)
	rm -rf broker/build
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist ./broker
	rm -rf broker/build

## The compiled core's wheels: x86_64 always, aarch64 where rustup has (or can add) its target; tested by hand under
## qemu (docs/compiled-core.md).
$(CORE_WHEEL): $(STAMP) $(CORE_SOURCES)
	$(call maturin,--release --zig --compatibility manylinux2014 --out dist)
	test -f $@

core-aarch64: $(STAMP) $(CORE_SOURCES)
	@if rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu || timeout 120 rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1; then \
		$(call maturin,--release --zig --compatibility manylinux2014 --target aarch64-unknown-linux-gnu --out dist,.cache/cargo-aarch64) && test -f $(CORE_WHEEL_AARCH64); \
	else echo "make wheel: no aarch64 wheel of the core: rustup has no aarch64-unknown-linux-gnu target and could not add it"; fi

wheel: $(WHEEL) $(BROKER_WHEEL) $(CORE_WHEEL) core-aarch64

## The compiled core's fuzz targets (core/fuzz), FUZZ_SECONDS each, under libFuzzer with AddressSanitizer, debug
## assertions and overflow checks, built by the nightly toolchain rustup has here with the flags cargo-fuzz passes
## (cargo-fuzz itself took minutes of CPU to build from crates.io in every CI run, beside the tests). The corpus grows
## in .cache/fuzz-corpus; a crash fails the run and leaves its input in core/fuzz/artifacts. CI runs it beside the tests.
FUZZ_SECONDS ?= 20
FUZZ_TARGETS := chunk record basic sink
FUZZ_RUSTFLAGS := --cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
	-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
	-Cllvm-args=-sanitizer-coverage-trace-compares -Zsanitizer=address -Cdebug-assertions -Coverflow-checks \
	-Cforce-frame-pointers
FUZZ_BIN := .cache/cargo-fuzz/x86_64-unknown-linux-gnu/release
fuzz:
	@rustup toolchain list | grep -q '^nightly' || { echo "make fuzz needs Rust's nightly toolchain: rustup toolchain install nightly" >&2; exit 1; }
	@# --target: the flags reach the targets and the crates they link, not build scripts
	RUSTFLAGS="$(FUZZ_RUSTFLAGS)" cargo +nightly build --quiet --release --locked --manifest-path core/fuzz/Cargo.toml \
		--target x86_64-unknown-linux-gnu --target-dir .cache/cargo-fuzz --bins
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p .cache/fuzz-corpus/$$t core/fuzz/artifacts/$$t; \
		if $(FUZZ_BIN)/$$t -artifact_prefix=core/fuzz/artifacts/$$t/ -max_total_time=$(FUZZ_SECONDS) .cache/fuzz-corpus/$$t \
			>.cache/fuzz-$$t.log 2>&1; then \
			echo "fuzz $$t: $$(grep -E '^Done [0-9]+ runs' .cache/fuzz-$$t.log)"; \
		else tail -40 .cache/fuzz-$$t.log; echo "fuzz $$t failed: its input is in core/fuzz/artifacts/$$t" >&2; exit 1; fi; \
	done

## A venv per PySpark line: first an "existing PySpark environment" from its constraints
## file, then the wheel installed into it as a user would, which must leave PySpark as it
## was. A wheel (not an editable install) is what Spark's workers and its module scan see.
.venv-pyspark%/.pyspark: conf/constraints-pyspark%.txt
	rm -rf .venv-pyspark$*
	$(or $(PYTHON_$*),$(PYTHON)) -m venv .venv-pyspark$*
	.venv-pyspark$*/bin/python -m pip install --quiet --upgrade pip
	.venv-pyspark$*/bin/python -m pip install --quiet -c $< "pyspark[connect]" pika pytest pytest-timeout pytest-xdist pytest-rerunfailures hypothesis
	.venv-pyspark$*/bin/python tools/pyspark_bytecode.py
	touch $@

# Stamps, not intermediates: make must not delete them (and rebuild the venv) after a run.
.PRECIOUS: .venv-pyspark%/.pyspark .venv-pyspark%/.wheel

.venv-pyspark%/.wheel: .venv-pyspark%/.pyspark $(WHEEL) $(BROKER_WHEEL) $(CORE_WHEEL)
	@before=$$(.venv-pyspark$*/bin/python -m pip show pyspark | sed -n 's/^Version: //p'); \
	.venv-pyspark$*/bin/python -m pip install --quiet -c conf/constraints-pyspark$*.txt $(CORE_WHEEL) $(WHEEL) $(BROKER_WHEEL) && \
	.venv-pyspark$*/bin/python -m pip install --quiet --no-deps --force-reinstall $(CORE_WHEEL) $(WHEEL) $(BROKER_WHEEL) && \
	after=$$(.venv-pyspark$*/bin/python -m pip show pyspark | sed -n 's/^Version: //p'); \
	echo "$(WHEEL) installed into .venv-pyspark$*: PySpark $$before before, $$after after"; \
	test "$$before" = "$$after"
	touch $@

## Delta Lake's jars for local Spark sessions (examples/sparkenv.py): Spark's own
## resolver (spark.jars.packages) is not used, Maven copies them once.
## $(call maven_copy,target,dir): a pom's runtime jars copied into dir, afresh; the stamp ($@) marks it done.
define maven_copy
	@command -v mvn >/dev/null 2>&1 || { echo "make $(1) needs Maven (mvn) and a JDK, e.g. apt-get install maven" >&2; exit 1; }
	mkdir -p $(2)
	rm -f $(2)/*.jar $@
	mvn -B -q -f $< dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(abspath $(2))
	touch $@
endef

$(JARS_STAMP): conf/delta/pom.xml
	$(call maven_copy,jars,$(JARS_DIR))

jars: $(JARS_STAMP)

## RabbitMQ's PerfTest (Java) and its dependencies, the baseline of benchmarks/stream_throughput.py:
##   java -cp '.cache/perftest/*' com.rabbitmq.perf.PerfTest --help
$(PERFTEST_STAMP): conf/perftest/pom.xml
	$(call maven_copy,perftest,$(PERFTEST_DIR))

perftest: $(PERFTEST_STAMP)

## RabbitMQ's Java stream client and its dependencies (conf/stream-client/pom.xml), and
## benchmarks/java/StreamConsume.java compiled against them: the stream-protocol baseline of
## benchmarks/stream_throughput.py --stream-url (the broker's limit).
$(STREAMCLIENT_STAMP): conf/stream-client/pom.xml
	$(call maven_copy,streamclient,$(STREAMCLIENT_DIR))

$(STREAMCLIENT_CLASS): benchmarks/java/StreamConsume.java $(STREAMCLIENT_STAMP)
	mkdir -p $(STREAMCLIENT_DIR)/classes
	javac -nowarn -d $(STREAMCLIENT_DIR)/classes -cp '$(STREAMCLIENT_DIR)/*' $<

## tests/java/StreamInterop.java: the Java client's side of tests/stream_protocol/test_java_interop.py (each
## compression codec written by one client and read by the other).
$(INTEROP_CLASS): tests/java/StreamInterop.java $(STREAMCLIENT_STAMP)
	mkdir -p $(STREAMCLIENT_DIR)/classes
	javac -nowarn -d $(STREAMCLIENT_DIR)/classes -cp '$(STREAMCLIENT_DIR)/*' $<

streamclient: $(STREAMCLIENT_CLASS) $(INTEROP_CLASS)

$(CDS_MAIN): $(STAMP) tools/jvm_archive.py
	$(call jvm_archive,$(PY))

$(CDS_DELTA): $(DELTA_VENV)/.wheel $(JARS_STAMP) tools/jvm_archive.py
	$(call jvm_archive,$(DELTA_PY))

## The tests' class-data-sharing archives (make test builds them; CI beside lint).
jvm-archives: $(CDS_MAIN) $(CDS_DELTA)

# What the Delta lane and .ci/run's other lanes need (make test builds it beside its faults lane and the tests without
# Spark, which need only the Java clients).
test-prereqs: $(JARS_STAMP) $(DELTA_VENV)/.wheel $(INTEROP_CLASS) $(PERFTEST_STAMP) $(CDS_DELTA)

## Run the test suite: the embedded broker always; real RabbitMQ too when AMQP_TEST_BROKERS (or
## AMQP_TEST_URL) is set. Three lanes at once: the tests without Spark in TEST_WORKERS processes, those that
## need Delta (on the Delta line's venv), and the cluster's (the cluster tests, then the Spark tests of production's
## faults, in one process); once the first two are over, the other Spark tests, on the pinned PySpark.
# On two cores CI is bound by CPU, and its longest chain decides its time. The faults lane (tests/cluster, marker
# `cluster`, then the Spark tests marked `faults`: failovers, a silent network, a partition, a load balancer, a node
# lost, executors lost, stream-sink jobs killed) mostly waits on its faults, so it starts first, and it is the only lane
# that touches the cluster: no test waits for the cluster's lock (tests/locks.py). (The cluster tests once ran among the
# tests without Spark while the fault tests started beside them: one waited more than its 300 s for the lock, run
# ci53.) The Delta tests run beside those without Spark, which mostly wait on brokers; no test without Spark touches
# what a Delta test uses but its broker's load, and the Artemis tests take turns with the Delta one (tests/locks.py).
# The faults lane needs only .venv, its core and its JVM archive, so it starts before what the other lanes need is built
# (the Java clients; test-prereqs: Delta's jars and venv, the wheels), which is built beside it: a CI run's faults lane
# once began 356 s in, after the wheels, the Delta venv and both archives (ci79).
# .cache/test-prereqs.done tells .ci/run that the wheels are built (it installs them into its other venvs then), and
# .cache/test-phase1.done that the tests without Spark and the Delta tests are over (its other lanes start then). Each
# lane writes its tests' durations to .cache/junit-LANE.xml; the Delta and faults lanes' output follows.
test: $(STAMP) $(VENV)/.core $(CDS_MAIN)
	@mkdir -p .cache
	@rm -f .cache/test-phase1.done .cache/test-prereqs.done
	export JAVA_TOOL_OPTIONS="$(TEST_JVM)"; \
	SPARK_AMQP_TEST_MASTER="local[16,3]" JAVA_TOOL_OPTIONS="$(call test_jvm,$(CDS_MAIN))" $(call lane,faults) $(PY) -m pytest -m "cluster or faults" --durations=10 -rfEP --junitxml=.cache/junit-faults.xml $(PYTEST_ARGS) >.cache/test-faults.log 2>&1 & faults=$$!; \
	trap 'kill $$faults 2>/dev/null' INT TERM; \
	$(MAKE) --no-print-directory $(INTEROP_CLASS) $(PERFTEST_STAMP) || { kill $$faults; exit 1; }; \
	echo "::: the compiled core's own tests (cargo test); the connector says: $$($(PY) -c 'import spark_amqp; print(spark_amqp.rows_path())')"; \
	(cd core && CARGO_TARGET_DIR="$(abspath .cache/cargo)" cargo test --quiet --no-default-features --lib) || { kill $$faults; exit 1; }; \
	{ $(MAKE) --no-print-directory test-prereqs && touch .cache/test-prereqs.done && \
	  JAVA_TOOL_OPTIONS="$(call test_jvm,$(CDS_DELTA))" $(call lane,delta) $(DELTA_PY) -m pytest -m "spark and delta" --durations=5 --junitxml=.cache/junit-delta.xml $(PYTEST_ARGS); } >.cache/test-delta.log 2>&1 & delta=$$!; \
	trap 'kill $$delta $$faults 2>/dev/null' INT TERM; \
	$(call lane,plain) $(PY) -m pytest -m "not spark and not cluster" -n $(TEST_WORKERS) --junitxml=.cache/junit-plain.xml $(PYTEST_ARGS); plain=$$?; \
	wait $$delta; delta_rc=$$?; \
	echo "::: the tests that need Delta (PySpark $(DELTA_LINE)), run beside those without Spark:"; cat .cache/test-delta.log; \
	if [ $$plain -ne 0 ] || [ $$delta_rc -ne 0 ]; then kill $$faults; exit 1; fi; \
	touch .cache/test-phase1.done; \
	JAVA_TOOL_OPTIONS="$(call test_jvm,$(CDS_MAIN))" $(call lane,spark) $(PY) -m pytest -m "spark and not delta and not faults" --durations=15 --junitxml=.cache/junit-spark.xml $(PYTEST_ARGS); spark=$$?; \
	wait $$faults; faults_rc=$$?; \
	echo "::: the cluster tests and the Spark tests of production's faults, run beside the others:"; cat .cache/test-faults.log; \
	[ $$spark -eq 0 ] && [ $$faults_rc -eq 0 ]

## RabbitMQ 3.10, 4.0 and 4.3 side by side (and a 4.3 that denies a deprecated feature), installed and
## started; then: export AMQP_TEST_BROKERS="$$(tools/rabbitmq urls)" AMQP_TEST_DENYING_URL="$$(tools/rabbitmq url 4.3-deny)"
## AMQP_TEST_STREAM_BROKERS="$$(tools/rabbitmq stream-urls)" (the same nodes' stream-protocol ports)
rabbitmq:
	tools/rabbitmq install
	tools/rabbitmq start
	tools/netfault install
	tools/haproxy install
	tools/haproxy start

## A week in an hour: every mode for an hour against the 3-node cluster, a random fault (a silent node, a partition,
## HAProxy, a node lost for good, an executor lost) every few minutes; a report of rows, losses, duplicates, pauses
## and memory in .cache/soak/. Not in CI. SOAK_ARGS="--minutes 10" for a shorter one.
soak: $(STAMP) rabbitmq
	$(PY) soak/soak.py $(SOAK_ARGS)

## The Spark tests on another PySpark line (tests marked `delta` run in `make test` on the Delta line, `pinned` on the
## pinned line only), on the embedded broker: what differs between PySpark lines does not depend on the RabbitMQ line.
## On the lowest line, the tests without Spark too: they exercise the lowest pyarrow and pamqp the most.
$(PYSPARK_LINES:%=test-pyspark%): test-pyspark%: .venv-pyspark%/.wheel
	@echo "PySpark $* on $$(.venv-pyspark$*/bin/python --version), pyarrow $$(.venv-pyspark$*/bin/python -c 'import pyarrow; print(pyarrow.__version__)')"
	$(if $(filter $*,$(LOWEST_LINE)),$(call lane,lowest-deps) $(EMBEDDED_ONLY) CORE_EXAMPLES=$(MATRIX_EXAMPLES) .venv-pyspark$*/bin/python -m pytest -m "not spark" -n $(TEST_WORKERS) -p no:cacheprovider --junitxml=.cache/junit-lowest-deps.xml $(PYTEST_ARGS))
	$(call lane,pyspark$*) $(EMBEDDED_ONLY) $(if $(filter $*,$(PURE_PYTHON_LINE)),SPARK_AMQP_PURE_PYTHON=1) JAVA_TOOL_OPTIONS="$(TEST_JVM)" .venv-pyspark$*/bin/python -m pytest $(if $(filter $*,$(MIDDLE_LINES)),$(SPARK_MODE_TESTS),tests/spark) -m "spark and not delta and not pinned" -p no:cacheprovider --junitxml=.cache/junit-pyspark$*.xml $(PYTEST_ARGS)

## The Spark tests on every other PySpark line; `make test` covers the pinned one.
test-matrix: $(PYSPARK_LINES:%=test-pyspark%)

## CPython 3.13 (tools/python3.13: Debian 13's, in a chroot; the checkout is bind-mounted at the same path).
$(PY313_VENV)/.installed: pyproject.toml broker/pyproject.toml conf/constraints-pyspark$(PY313_LINE).txt tools/python3.13 $(CORE_WHEEL)
	tools/python3.13 install
	tools/python3.13 run "rm -rf $(PY313_VENV) && python3.13 -m venv $(PY313_VENV) && $(PY313_VENV)/bin/python -m pip install --quiet --upgrade pip && $(PY313_VENV)/bin/python -m pip install --quiet -c conf/constraints-pyspark$(PY313_LINE).txt $(CORE_WHEEL) -e '.[test]' -e ./broker && $(PY313_VENV)/bin/python tools/pyspark_bytecode.py"
	touch $@

## The tests without Spark and the Spark tests of every mode's source and sink (SPARK_MODE_TESTS) on PySpark
## $(PY313_LINE), on CPython 3.13 (the embedded broker: tools/python3.13 passes no AMQP_TEST_* variable into the chroot).
test-python3.13: $(PY313_VENV)/.installed
	$(call lane,python3.13) tools/python3.13 run "$(PY313_VENV)/bin/python --version && CORE_EXAMPLES=$(MATRIX_EXAMPLES) $(PY313_VENV)/bin/python -m pytest -m 'not spark' -n $(TEST_WORKERS) -p no:cacheprovider --junitxml=.cache/junit-python3.13-plain.xml $(PYTEST_ARGS) && JAVA_TOOL_OPTIONS='$(TEST_JVM)' $(PY313_VENV)/bin/python -m pytest $(SPARK_MODE_TESTS) -m 'spark and not delta and not pinned' -p no:cacheprovider --junitxml=.cache/junit-python3.13.xml $(PYTEST_ARGS)"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

## The main job: embedded broker -> streaming source -> Delta table (exactly once), with progress and a summary,
## on the Delta line's PySpark (no Delta Lake is built for PySpark 4.3 yet).
demo: $(JARS_STAMP) $(DELTA_VENV)/.wheel
	$(DELTA_PY) examples/amqp_to_delta.py $(DEMO_ARGS)

## Start a standalone embedded broker on 127.0.0.1:$(BROKER_PORT) (not RabbitMQ's 5672).
broker: $(STAMP)
	$(PY) -m spark_amqp_broker --port $(BROKER_PORT)

## The stream benchmark needs RabbitMQ (stream queues): it runs only when AMQP_TEST_URL is set.
bench: $(STAMP) $(JARS_STAMP) $(PERFTEST_STAMP) $(DELTA_VENV)/.wheel
	$(PY) benchmarks/broker_throughput.py
	$(PY) benchmarks/source_throughput.py
	$(DELTA_PY) benchmarks/source_throughput.py --sinks noop,delta,noop,delta --journal-pairs 2
	$(PY) benchmarks/sink_throughput.py
	$(PY) benchmarks/amqp_client.py
	@if [ -n "$$AMQP_TEST_URL" ]; then echo "$(PY) benchmarks/stream_throughput.py"; $(PY) benchmarks/stream_throughput.py; \
	else echo "benchmarks/stream_throughput.py skipped: it needs RabbitMQ with stream queues in AMQP_TEST_URL"; fi

## A variable's value, for scripts that must not spell it again (.ci/run: make -s print-DELTA_LINE).
print-%:
	@echo '$($*)'

clean:
	rm -rf $(VENV) $(PY313_VENV) $(PYSPARK_LINES:%=.venv-pyspark%) build broker/build dist .pytest_cache .mypy_cache .ruff_cache .cache/cargo $(CORE_CHECKED) core/target
