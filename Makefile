# Every target creates .venv when it is missing. CPU torch 2.13.0 goes in first (a wheel on disk here);
# users with GPUs install their own CUDA torch into .venv before `make setup`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run cluster-demo test test-all test-portability lint format bench gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

# The quick sweep (every method and baseline at n = 1, 4) on an embedded Ray, then its report; a second
# `make run` resumes the sweep in results/quick instead of starting over. `make run DASHBOARD=1` also starts
# Ray's dashboard (127.0.0.1 only); `make run VERBOSE=1` prints Ray's own output instead of results/quick/sweep.log.
QUICK := results/quick
SWEEP_FLAGS := $(if $(DASHBOARD),--dashboard) $(if $(VERBOSE),--verbose)

run: $(STAMP)
	@if [ -f $(QUICK)/sweep.json ]; then echo "resuming the sweep in $(QUICK)"; \
		$(BIN)/python platform/sweep.py --config tune_configs/quick.yaml --out $(QUICK) --resume $(SWEEP_FLAGS); \
	else $(BIN)/python platform/sweep.py --config tune_configs/quick.yaml --out $(QUICK) $(SWEEP_FLAGS); fi
	$(BIN)/python platform/report.py $(QUICK) --out $(QUICK)/report --decision-times --overwrite

# A Ray cluster of several nodes on this machine (a head without CPUs, two worker nodes of 2 CPUs), a small sweep
# on it with --address, then that cluster stopped (docs/cluster.md); CPUS=1 gives 1-CPU worker nodes.
DEMO := results/cluster-demo
CPUS ?= 2

cluster-demo: $(STAMP)
	$(BIN)/python platform/cluster_demo.py --workers 2 --cpus $(CPUS) --out $(DEMO) $(if $(wildcard $(DEMO)/sweep.json),--resume)

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

# The numeric tests (DP, decomposition, simulator, policies, decisions) under other kernels than this CPU's defaults:
# each OpenBLAS core type, each ATen CPU capability, and 1 and 2 torch threads, one setting changed at a time
# (docs/benchmarks.md: which pass and how long they take). A setting is SETTING:FLAG, FLAG the /proc/cpuinfo flag its
# kernels need: a CPU without it would stop at an illegal instruction, so that setting is skipped and says so.
NUMERIC_TESTS := tests/test_dp_optimal.py tests/test_decomposition.py tests/test_dynamics.py tests/test_classical.py \
	tests/test_policy_fast.py tests/test_decide.py tests/test_demand_model.py tests/test_lookahead.py tests/test_fit.py \
	tests/test_dp_volumes.py tests/test_joint_dp.py
PORTABILITY := OPENBLAS_CORETYPE=Haswell:avx2 OPENBLAS_CORETYPE=SkylakeX:avx512f OPENBLAS_CORETYPE=Sandybridge:avx \
	ATEN_CPU_CAPABILITY=default: ATEN_CPU_CAPABILITY=avx2:avx2

test-portability: $(STAMP)
	set -e; for entry in $(PORTABILITY); do setting=$${entry%:*}; flag=$${entry##*:}; \
		if [ -n "$$flag" ] && ! grep -qw "$$flag" /proc/cpuinfo 2>/dev/null; then echo "== $$setting: skipped (this CPU has no $$flag)"; continue; fi; \
		echo "== $$setting"; env $$setting $(BIN)/python -m pytest -m "not slow" -q $(NUMERIC_TESTS); done; \
	for threads in 1 2; do echo "== --torch-threads $$threads"; $(BIN)/python -m pytest -m "not slow" -q --torch-threads $$threads $(NUMERIC_TESTS); done

# ruff (pyproject.toml [tool.ruff]): the lint rules and the formatter's check; `make format` applies the formatter
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python bench/simulator.py
	$(BIN)/python bench/policy.py
	$(BIN)/python bench/memory.py
	$(BIN)/python bench/milp.py
	$(BIN)/python bench/rllib.py
	$(BIN)/python bench/scaling.py
	$(BIN)/python bench/decomposition.py
	$(BIN)/python bench/lookahead.py
	$(BIN)/python bench/warm_start.py
	$(BIN)/python bench/model_selection.py
	$(BIN)/python bench/serve.py
	$(BIN)/python bench/fit.py
	OMP_NUM_THREADS=1 $(BIN)/python bench/dp_estimate.py

# On a CUDA machine: the gpu tests, CPU/GPU cost agreement, paper-preset updates at n = 1,024, decision times and
# Ray Train with use_gpu, as JSON lines (docs/benchmarks.md, GPU readiness). Without CUDA it says so in one line.
gpu-check: $(STAMP)
	$(BIN)/python bench/gpu.py

clean:
	rm -rf $(VENV) .pytest_cache
