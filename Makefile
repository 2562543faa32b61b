# Two commands on a fresh machine: `make run` (gateway + a mock worker) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run run-grpc run-zmq gateway test fuzz typecheck contracts protos bench install clean

# The first run installs everything (a few minutes): pip's own lines show how far it is.
$(STAMP): requirements.txt requirements-dev.txt
	@echo "== setting up $(VENV) (first run, or requirements changed): installing requirements-dev.txt"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --disable-pip-version-check --progress-bar off -r requirements-dev.txt
	@touch $(STAMP)
	@echo "== $(VENV) ready: run manage.py commands as $(BIN)/python manage.py ..., or after . $(BIN)/activate"

install: $(STAMP)

# Ports of make run and make run-grpc (the README's examples use the defaults).
GW_PORT ?= 30000
WORKER_PORT ?= 30001
ENGINE_PORT ?= 30002

# The gateway on :30000 relaying to a mock worker on :30001 serving model "mock-model".
run: $(STAMP)
	@$(BIN)/python manage.py runmockworker --port $(WORKER_PORT) --model mock-model & \
	MOCK=$$!; trap 'kill $$MOCK 2>/dev/null' EXIT INT TERM; \
	$(BIN)/python manage.py rungateway --port $(GW_PORT) --worker-urls http://127.0.0.1:$(WORKER_PORT) $(ARGS)

# The gRPC path: the gateway as the full server in front of the gRPC engine stand-in (SGLang's
# service, driven by the Qwen3 fixture tokenizer) on :30002, serving "Qwen/Qwen3-8B".
FIXTURE_MODELS ?= fixtures/models
run-grpc: $(STAMP)
	@$(BIN)/python manage.py runmockworker --grpc --runtime sglang --port $(ENGINE_PORT) --model Qwen/Qwen3-8B \
	  --tokenizer $(FIXTURE_MODELS)/qwen3 & \
	ENGINE=$$!; trap 'kill $$ENGINE 2>/dev/null' EXIT INT TERM; \
	$(BIN)/python manage.py rungateway --port $(GW_PORT) --worker-urls grpc://127.0.0.1:$(ENGINE_PORT) $(ARGS)

# The ZMQ path: the gateway binds the ZMQ worker ipc://$(ZMQ_PATH) (vLLM's EngineCore in headless
# mode; handshake port derived from the path) and the EngineCore stand-in, driven by the Qwen3
# fixture tokenizer, dials in. The model id and the tokenizer are --model-path (the engine has none).
ZMQ_PATH ?= /tmp/gateway-zmq-$(GW_PORT)
run-zmq: $(STAMP)
	@$(BIN)/python manage.py runmockworker --zmq --zmq-url ipc://$(ZMQ_PATH) --model Qwen/Qwen3-8B \
	  --tokenizer $(FIXTURE_MODELS)/qwen3 & \
	ENGINE=$$!; trap 'kill $$ENGINE 2>/dev/null' EXIT INT TERM; \
	$(BIN)/python manage.py rungateway --port $(GW_PORT) --worker-urls ipc://$(ZMQ_PATH) \
	  --model-path $(FIXTURE_MODELS)/qwen3 $(ARGS)

# The gateway alone (pass flags with ARGS="--worker-urls http://host:port ...").
gateway: $(STAMP)
	$(BIN)/python manage.py rungateway $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

# The fuzzers alone: schemathesis against the control plane's own description and the served OpenAI
# routes, and the hypothesis fuzzers of the hostile-input suite (also part of make test).
FUZZ := tests/hostile/test_control_plane_schema.py tests/hostile/test_openai_schema_fuzz.py \
	tests/hostile/test_data_plane_fuzz.py tests/hostile/test_conversation_routes_fuzz.py
fuzz: $(STAMP)
	$(BIN)/python -m pytest $(FUZZ) $(ARGS)

typecheck: $(STAMP)
	$(BIN)/mypy common gateway_project inference administration responses_api standins protos manage.py

# The import contract (.importlinter): layers run one way, stand-ins stay out of the product.
contracts: $(STAMP)
	$(BIN)/lint-imports

# Regenerate protos/*_pb2*.py(i) from protos/*.proto (grpcio-tools + mypy-protobuf, pinned in
# requirements-dev.txt); tests/protos checks the checked-in files are what this writes.
protos: $(STAMP)
	$(BIN)/python -m protos.generate

bench: $(STAMP)
	$(BIN)/python bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) data .pytest_cache
