# Two commands on a fresh machine: `make run` (gateway + a mock worker) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run run-grpc gateway test typecheck contracts protos bench install clean

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

install: $(STAMP)

# The gateway on :30000 relaying to a mock worker on :30001 serving model "mock-model".
run: $(STAMP)
	@$(BIN)/python manage.py runmockworker --port 30001 --model mock-model & \
	MOCK=$$!; trap 'kill $$MOCK 2>/dev/null' EXIT INT TERM; \
	$(BIN)/python manage.py rungateway --worker-urls http://127.0.0.1:30001 $(ARGS)

# The gRPC path: the gateway as the full server in front of the gRPC engine stand-in (SGLang's
# service, driven by the Qwen3 fixture tokenizer) on :30002, serving "Qwen/Qwen3-8B".
FIXTURE_MODELS ?= fixtures/models
run-grpc: $(STAMP)
	@$(BIN)/python manage.py runmockworker --grpc --runtime sglang --port 30002 --model Qwen/Qwen3-8B \
	  --tokenizer $(FIXTURE_MODELS)/qwen3 & \
	ENGINE=$$!; trap 'kill $$ENGINE 2>/dev/null' EXIT INT TERM; \
	$(BIN)/python manage.py rungateway --worker-urls grpc://127.0.0.1:30002 $(ARGS)

# The gateway alone (pass flags with ARGS="--worker-urls http://host:port ...").
gateway: $(STAMP)
	$(BIN)/python manage.py rungateway $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(ARGS)

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
