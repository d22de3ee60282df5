# One-command set-up: `make demo` and `make test` each create .venv and install what they need.
# Java 17 is the one prerequisite the project cannot install into a virtualenv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# Python writes its .pyc files under every target, where the machine's environment says not to (this workplace's
# does): else each of the suite's processes compiles the project's modules and tests again. pytest's collection of
# the suite, one per worker, took 22 CPU-s without them and 9 with them (2026-11-29, load 12).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup java demo ui lint docs test test-mid test-fast test-throttled bench bench-quick bench-backfill bench-peer bench-streaming bench-landing bench-nightly bench-concurrent bench-daemon bench-jvm bench-statistics bench-settings bench-publish bench-metrics bench-serve bench-serve-memory bench-warm-vs-run bench-warm-profile bench-cost clean

setup: $(STAMP)

java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "error: Java 17 is required for Spark and was not found on PATH."; \
	  echo "       Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless"; exit 1; }

# uv installs what pip installed here (the same versions: pip freeze compared), in about a third of the time: 263 s
# against 742 s for a fresh .venv without caches, one after the other on the same loaded machine (2026-11-29). pip
# is the fallback (uv cannot be had, or fails part-way: pip completes the venv, compileall its bytecode).
# --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set (this workplace's machines) nothing else
# writes the .pyc files, and each process would compile its imports again (importing great_expectations took
# 19 CPU-s without them, 8 with them, at load 10).
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	{ $(BIN)/pip install -q --disable-pip-version-check uv==0.13.9 && \
	  $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e '.[test,docs]'; } || \
	{ $(BIN)/pip install -q --disable-pip-version-check -e '.[test,docs]' && { $(BIN)/python -m compileall -q $(VENV)/lib >/dev/null || true; }; }
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

demo: setup java
	$(BIN)/icemaint demo

PORT ?= 3000
ui: setup java
	$(BIN)/icemaint ui --port $(PORT)

# ruff and mypy, each configured in pyproject.toml (mypy's file list too): no Java, no Spark, no PostgreSQL.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/): the reference pages are written from the code first
# (scripts/gen_reference.py), then `--strict` fails the build on any warning (a broken link, a page left out).
docs: setup
	$(BIN)/python scripts/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .icemaint/site

# Three tiers (README, "Tests"): `make test` is everything and what CI runs; `make test-mid` leaves out the
# `slow` end-to-end tests (the production stack, the daemon's, the UI's); `make test-fast` leaves out Java.
# The suite runs on TEST_WORKERS pytest-xdist workers, each with its own Spark session; `--dist loadgroup`
# keeps the production stack's tests (fixed ports) on one of them. TEST_WORKERS=0 runs in this process.
# One worker more than cores: the end-to-end files spend much of their time waiting on other processes (a daemon's
# sensors, a killed run's JVM, a browser), time a third worker fills on 2 cores: the whole suite took 18 min 43 s
# on three workers against 24 min 6 s on two, one after the other on the idle machine (docs/operations/tests.md).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
XDIST = -n $(TEST_WORKERS) --dist loadgroup

# The production-profile tests need a real PostgreSQL, the UI tests Chromium: installed from Debian when missing.
test: setup java
	bash scripts/ensure_postgres.sh
	bash scripts/ensure_chromium.sh
	bash scripts/ensure_prometheus.sh
	$(BIN)/pytest $(XDIST) $(PYTEST_ARGS)

# Everything but the `slow` end-to-end tests: Spark, Dagster and PostgreSQL for real, no stack, no daemon.
test-mid: setup java
	bash scripts/ensure_postgres.sh
	$(BIN)/pytest $(XDIST) -m "not slow and not cluster" $(PYTEST_ARGS)

# The pure and Dagster-only tests, with no Java on PATH (the `java` marker is set by tests/conftest.py
# on every test that starts Spark) and no PostgreSQL, on the same workers as `make test`: under a minute.
NOJAVA := .icemaint/nojava-bin
test-fast: setup
	@mkdir -p $(NOJAVA) && for t in sh bash env git; do ln -sf "$$(command -v $$t)" $(NOJAVA)/$$t; done
	env -u JAVA_HOME PATH="$(CURDIR)/$(BIN):$(CURDIR)/$(NOJAVA)" $(BIN)/pytest $(XDIST) -m "not java and not postgres" $(PYTEST_ARGS)

# `make test` within a CPU quota (scripts/throttled.sh), every process it starts included: CPUS=0.5 is this
# machine's two cores four times slower, as CI's machines have been. Needs root and a writable cgroup.
CPUS ?= 0.5
test-throttled: setup java
	CPUS=$(CPUS) bash scripts/throttled.sh $(MAKE) --no-print-directory test

bench: setup java
	$(BIN)/python -m benchmarks.run
	$(MAKE) --no-print-directory bench-backfill
	$(MAKE) --no-print-directory bench-peer
	$(MAKE) --no-print-directory bench-streaming
	$(MAKE) --no-print-directory bench-nightly
	$(MAKE) --no-print-directory bench-concurrent
	$(MAKE) --no-print-directory bench-daemon
	$(MAKE) --no-print-directory bench-jvm
	$(MAKE) --no-print-directory bench-statistics
	$(MAKE) --no-print-directory bench-settings
	$(MAKE) --no-print-directory bench-publish
	$(MAKE) --no-print-directory bench-drift
	$(MAKE) --no-print-directory bench-landing
	$(MAKE) --no-print-directory bench-warm-vs-run
	$(MAKE) --no-print-directory bench-warm-profile
	$(MAKE) --no-print-directory bench-cost
	$(MAKE) --no-print-directory bench-plots

# The plots of docs/operations/benchmarks.md (docs/images/bench-*.png), drawn from benchmarks/RESULTS.md's tables.
.PHONY: bench-plots
bench-plots: setup
	$(BIN)/python -m benchmarks.plots

# 20 small tables caught up by `icemaint tick --until-idle` with max_runs_total 1, 2 and 4: tables' runs
# at once on one Spark session against one at a time (a section of benchmarks/RESULTS.md).
bench-concurrent: setup java
	$(BIN)/python -m benchmarks.concurrent_tick

# An estate catch-up under the Dagster daemon: the compaction sensor's runs one per table (the commit before
# they were joined, a temporary git worktree) against neighbouring tables joined (a section of RESULTS.md).
bench-daemon: setup java
	$(BIN)/python -m benchmarks.daemon_catchup

# One `icemaint compact` process with the JVM class archive against one without, interleaved (a section of
# benchmarks/RESULTS.md).
bench-jvm: setup java
	$(BIN)/python -m benchmarks.jvm_start

# Driver settings tried against the peer misses (JIT, collector, manifest cache, codec level) on an estate and a
# 1,000-commit date, interleaved (a section of benchmarks/RESULTS.md).
bench-settings: setup java
	$(BIN)/python -m benchmarks.driver_settings

# A publish under a claimless writer committing every 0.5 s and 0.1 s on a 3,000-snapshot table, on the Hadoop and
# the JDBC (PostgreSQL) catalogs, and the writers' failed commits, this version against the one before (a temporary
# git worktree), interleaved (a section of benchmarks/RESULTS.md). PUBLISH_ARGS="--quick" for a smoke run.
PUBLISH_ARGS ?=
bench-publish: setup java
	bash scripts/ensure_postgres.sh
	$(BIN)/python -m benchmarks.publish_race $(PUBLISH_ARGS)

# One scrape of `icemaint metrics` over a 10,000-table estate's persisted summaries and a 100,000-record audit log
# (a section of benchmarks/RESULTS.md).
bench-metrics: setup
	$(BIN)/python -m benchmarks.metrics_scrape

# `icemaint serve`'s resident memory (the process and its JVM) tick after tick over a small estate a writer keeps
# feeding (a section of benchmarks/RESULTS.md). SERVE_ARGS="--ticks 10" for a shorter run.
SERVE_ARGS ?=
bench-serve: setup java
	$(BIN)/python -m benchmarks.serve_memory $(SERVE_ARGS)

# `icemaint serve` for a duration (default 90m) over a streaming estate a writer keeps dirty: the process's and its
# JVM's memory sampled every minute into benchmarks/results/ (a section of benchmarks/RESULTS.md).
# SERVE_MEMORY_ARGS="--duration 10m" for a short run.
SERVE_MEMORY_ARGS ?=
bench-serve-memory: setup java
	$(BIN)/python -m benchmarks.serve_hours $(SERVE_MEMORY_ARGS)

# A maintenance run in a fresh process (Dagster's default launcher) against the same run in one warm process
# (serve's), alternating table by table (a section of benchmarks/RESULTS.md); and each part of a warm table-date.
bench-warm-vs-run: setup java
	$(BIN)/python -m benchmarks.warm_vs_per_run
bench-warm-profile: setup java
	$(BIN)/python -m benchmarks.warm_profile --warm-up 30 --tables 12

# The cost of one proven table-date, warm and cold, beside the peer: a section of benchmarks/RESULTS.md drawn from
# the newest figures of bench-warm-profile, bench-warm-vs-run and bench-peer (run by `make bench` after them).
bench-cost: setup
	$(BIN)/python -m benchmarks.cost_summary

# Column statistics: icemaint's against Iceberg's compute_table_stats, quiet and under a claimless writer (a
# section of benchmarks/RESULTS.md).
bench-statistics: setup java
	$(BIN)/python -m benchmarks.column_stats

# Layout drift: the files a filtered scan opens before and after the layout rewrite of three evolved tables (days ->
# hours, an added sort order, oversized backfill files) (a section of benchmarks/RESULTS.md).
.PHONY: bench-drift
bench-drift: setup java
	$(BIN)/python -m benchmarks.layout_drift

# Landed files per second and the table's files: one ingest batch against an append per landed file (a section of
# benchmarks/RESULTS.md). LANDING_ARGS="--files 50" for a smoke run.
LANDING_ARGS ?=
bench-landing: setup java
	$(BIN)/python -m benchmarks.landing $(LANDING_ARGS)

# One date built by ~3,000 single-file commits: planning before, after compaction, after the full
# maintenance (a section of benchmarks/RESULTS.md).
bench-streaming: setup java
	$(BIN)/python -m benchmarks.streaming

# 100 tables x 3 dates: icemaint's date-scoped catch-up vs a nightly whole-table rewrite_data_files
# (a section of benchmarks/RESULTS.md).
bench-nightly: setup java
	bash scripts/ensure_debian_packages.sh libxerial-sqlite-jdbc-java
	$(BIN)/python -m benchmarks.nightly

# Side by side with iceberg-zamboni (installed into its own virtualenv under benchmarks/.work), one shared
# SQL catalog on a throwaway PostgreSQL server (PEER_ARGS="--catalog sqlite": SQLite, Debian's SQLite JDBC
# driver for our side): a section of benchmarks/RESULTS.md.
# PEER_ARGS="--quick" for a smoke run, PEER_ARGS="--shapes files_100,estate_100" for some shapes.
PEER_ARGS ?=
bench-peer: setup java
	bash scripts/ensure_debian_packages.sh libxerial-sqlite-jdbc-java
	bash scripts/ensure_postgres.sh
	$(BIN)/python -m benchmarks.peer $(PEER_ARGS)

bench-quick: setup java
	$(BIN)/python -m benchmarks.run --quick

# 10 dates of one table as one batched backfill run vs 10 separate runs (a process each): BACKFILL.md
bench-backfill: setup java
	$(BIN)/python -m benchmarks.backfill_batch

# A soak, not part of `make test`: writers with and without the claim on three tables, the real tick
# loop, random SIGKILLs of the maintenance process; a one-line verdict, appended to reliability/RESULTS.md.
MINUTES ?= 30
.PHONY: soak
soak: setup java
	$(BIN)/python -m reliability.soak --minutes $(MINUTES)

# The local production stack (scripts/stack.py): PostgreSQL, SeaweedFS (S3 + Iceberg REST catalog) and a
# Spark standalone cluster of two workers on 127.0.0.1; writes examples/production.yaml and
# .icemaint/stack/env (the secrets: `source` it).
.PHONY: stack-up stack-down stack-status
stack-up: setup java
	bash scripts/ensure_postgres.sh
	$(BIN)/python scripts/stack.py up

stack-down: setup
	$(BIN)/python scripts/stack.py down

stack-status: setup
	$(BIN)/python scripts/stack.py status

# icemaint on the local production stack (S3 + REST catalog + Spark standalone, 2 workers): compaction of
# 3,000 small files against the bare CALL, and orphan listing cost against objects under the prefix; writes
# its section of benchmarks/RESULTS.md. Reuses a running stack (left running), else starts and stops one.
STACK_FILES ?= 3000
.PHONY: bench-stack
bench-stack: setup java
	$(BIN)/python -m benchmarks.stack_bench --files $(STACK_FILES)

clean:
	rm -rf .icemaint

# The streaming soak, not part of `make test`: a writer that never stops (a commit a second into the current date of
# a simulated calendar, late rows, deletes; it ignores the claim), `icemaint tick` every ~20 s, then rows, publishes,
# each date's compaction lag and retention checked; a one-line verdict, appended to reliability/RESULTS.md.
.PHONY: soak-streaming
soak-streaming: setup java
	$(BIN)/python -m reliability.soak_streaming --minutes $(if $(filter command line,$(origin MINUTES)),$(MINUTES),20)
