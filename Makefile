# The quick start: `make serve` and `make test`. Both bootstrap what they need first.
VENV ?= .venv
ARGS ?=

.PHONY: bootstrap serve test doctor

bootstrap:
	@./scripts/bootstrap.sh

serve: bootstrap
	$(VENV)/bin/dspark serve $(ARGS)

test: bootstrap
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q $(ARGS)

doctor: bootstrap
	$(VENV)/bin/dspark doctor
