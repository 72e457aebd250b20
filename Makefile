# The quick start: `make serve` and `make test`. Both bootstrap what they need first.
VENV ?= .venv
ARGS ?=

.PHONY: bootstrap serve test doctor contract lossless-prefix

bootstrap:
	@./scripts/bootstrap.sh

serve: bootstrap
	$(VENV)/bin/dspark serve $(ARGS)

# The suite writes bytecode caches even where PYTHONDONTWRITEBYTECODE is set: every worker and every
# server or CLI it starts would otherwise recompile the project and re-rewrite the tests' asserts.
test: bootstrap
	env -u PYTHONDONTWRITEBYTECODE HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q $(ARGS)

doctor: bootstrap
	$(VENV)/bin/dspark doctor

# The API contract with larger Schemathesis budgets than `make test` (tests/server/test_contract.py):
# 20x the cases over the fake engine and 6x against `dspark serve` on the default model.
CONTRACT_EXAMPLES ?= 1000
CONTRACT_REAL_EXAMPLES ?= 60
contract: bootstrap
	HF_HUB_OFFLINE=1 DSPARK_CONTRACT_EXAMPLES=$(CONTRACT_EXAMPLES) DSPARK_CONTRACT_REAL_EXAMPLES=$(CONTRACT_REAL_EXAMPLES) \
		$(VENV)/bin/python -m pytest -q -n 0 tests/server/test_contract.py $(ARGS)

# The exact-distribution tests (controls included) with every prompt half-restored from the prefix
# cache (tests/engine/conftest.py); about 10 minutes on one core.
lossless-prefix: bootstrap
	HF_HUB_OFFLINE=1 DSPARK_LOSSLESS_PREFIX=1 $(VENV)/bin/python -m pytest -q tests/engine/test_lossless.py \
		tests/engine/test_lossless_lookup.py tests/engine/test_lossless_processors.py \
		tests/engine/test_lossless_grammar.py tests/engine/test_hybrid_lossless.py $(ARGS)
