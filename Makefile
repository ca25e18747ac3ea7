# The checks CI runs (.ci/run calls `make test`). Each target also runs alone.
PY ?= python3
# pytest-randomly shuffles the test order; the seed is printed so an order can be repeated.
# In-process tests run on every core (pytest-xdist); the end-to-end and fault tests run two
# at a time (a module's tests in one worker, sharing its platform), except those marked
# `serial`, which measure time or rates (a knee, a p99 ratio, an admitted rate, lease timing)
# and run alone afterwards.
ifndef SEED
SEED := $(shell $(PY) -c 'import random; print(random.randrange(10**9))')
endif

.PHONY: install native test lint typecheck imports unit integration e2e

install:
	$(PY) -m pip install -q -e '.[embedding,dev,ray]'

# The decision kernel and the gateway's request path compiled with mypyc (setup.py),
# installed apart in build/native: `python bench/decide.py --tree build/native` and
# `python bench/gateway.py --tree build/native` time it. Needs a C compiler. The build's
# own leftovers go first: setuptools would reuse an extension module left in build/lib.*
# by an earlier build, even of a module no longer in the list.
native:
	rm -rf build/native build/lib.* build/temp.* build/bdist.*
	SLUICE_COMPILE=1 $(PY) -m pip install -q --no-deps --no-build-isolation --target build/native .

lint:
	$(PY) -m ruff check sluice tests bench
	$(PY) -m ruff format --check sluice tests bench

typecheck:
	$(PY) -m mypy sluice

imports:
	lint-imports

unit:
	$(PY) -m pytest tests/unit -q

integration:
	$(PY) -m pytest tests/integration -q

e2e:
	$(PY) -m pytest tests/e2e -q

test: lint typecheck imports
	@echo "test order: pytest-randomly seed $(SEED) (make test SEED=$(SEED) repeats it)"
	$(PY) -m pytest tests/unit tests/hostile tests/integration -q -p randomly --randomly-seed=$(SEED) -n auto -p no:benchmark
	$(PY) -m pytest tests/e2e tests/faults -q -p randomly --randomly-seed=$(SEED) -m 'not serial' -n 2 --dist loadfile -p no:benchmark --durations=25
	$(PY) -m pytest tests/e2e tests/faults -q -p randomly --randomly-seed=$(SEED) -m serial --durations=25
