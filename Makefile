# Two commands do all setup on a fresh machine: `make demo` and `make test`.
# torch is pinned, and comes from PyTorch's CPU wheel index: on Linux the torch of the public
# index is the CUDA build (several GB with its nvidia-* wheels). The index is the one PyTorch's
# install page (https://pytorch.org/get-started/locally/: Linux, pip, CPU) gives:
#   pip3 install torch --index-url https://download.pytorch.org/whl/cpu
# TORCH_INDEX=auto (the default) first asks pip, without any index, whether a torch wheel of
# that version is reachable already (pip's --find-links, a local wheel directory): then it is
# used, and nothing is downloaded; otherwise the CPU index is. Overrides:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu   # always the CPU index
#   make test TORCH_INDEX=                                       # only pip's own sources
#   make test TORCH=/path/to/torch-2.13.0+cpu-...whl TORCH_INDEX=  # one local wheel file
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TORCH_VERSION   ?= 2.13.0
TORCH           ?= torch==$(TORCH_VERSION)
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX     ?= auto
STAMP  := $(VENV)/.safetorch-installed

# $(call install_torch,PYTHON): install $(TORCH) into that Python's environment (see above).
define install_torch
	index='$(TORCH_INDEX)'; \
	if [ "$$index" = auto ]; then \
	  if $(1) -m pip install --quiet --dry-run --ignore-installed --no-index --no-deps "$(TORCH)" > /dev/null 2>&1; \
	  then index=; else index='$(TORCH_CPU_INDEX)'; fi; \
	fi; \
	echo "installing $(TORCH) from $${index:-pip's configured sources}"; \
	$(1) -m pip install --quiet $${index:+--index-url "$$index"} "$(TORCH)"
endef

.PHONY: venv demo test lint unit dist sdist-test gpu-check bench test-compat test-triton clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(call install_torch,$(PY))
	$(PY) -m pip install --quiet -e ".[dev]" "$(TORCH)"
	touch $(STAMP)

demo: venv
	$(VENV)/bin/safetorch doctor
	$(PY) examples/demo.py
	@echo "\n=== safetorch check examples/legacy ==="
	$(VENV)/bin/safetorch check --exit-zero examples/legacy

lint: venv
	$(VENV)/bin/ruff check safetorch tests benchmarks examples
	$(VENV)/bin/ruff format --check safetorch tests benchmarks examples
	$(VENV)/bin/mypy

unit: venv
	$(PY) -m pytest -q -p no:cacheprovider

test: lint unit dist

# The packages a user installs: sdist and wheel built offline (no build isolation: the venv's
# setuptools), checked as a package index renders them (twine --strict), LICENSE in both, and
# the sdist holds every tracked file (what its tests read). The wheel is built from the sdist.
DIST := build/dist
dist: venv
	rm -rf $(DIST) && mkdir -p $(DIST)
	$(PY) -m build --no-isolation --outdir $(DIST) . > build/dist.log 2>&1 || { cat build/dist.log; exit 1; }
	$(VENV)/bin/twine check --strict $(DIST)/*
	tar -tzf $(DIST)/*.tar.gz | sed 's|^[^/]*/||' | sort > build/sdist-files.txt
	grep -qx LICENSE build/sdist-files.txt
	$(PY) -m zipfile -l $(DIST)/*.whl | grep 'dist-info/licenses/LICENSE ' > /dev/null
	$(PY) -m zipfile -l $(DIST)/*.whl | grep 'safetorch/py.typed ' > /dev/null
	if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then \
	  git ls-files | grep -vx .gitignore | sort | comm -23 - build/sdist-files.txt > build/sdist-missing.txt; \
	  test ! -s build/sdist-missing.txt || { echo "not in the sdist (MANIFEST.in):"; cat build/sdist-missing.txt; exit 1; }; \
	fi

# Opt-in (the whole suite once more): the tests run from the unpacked sdist, its own copy of
# safetorch first on the path.
sdist-test: dist
	rm -rf build/sdist-test && mkdir -p build/sdist-test
	tar -xzf $(DIST)/*.tar.gz -C build/sdist-test
	cd build/sdist-test/safetorch-* && PYTHONPATH=. $(abspath $(PY)) -m pytest -q -p no:cacheprovider $(SDIST_TESTS)

# Runs on a lent GPU machine with its own python3 (no venv): tests/gpu + CUDA benchmarks.
gpu-check:
	bash benchmarks/gpu_check.sh

# Opt-in (not part of `make test`): the fused checked-index kernel (safetorch/_triton_index.py)
# on CPU tensors under Triton's interpreter, in a venv of its own with triton (not a safetorch
# dependency: torch's CUDA wheels ship it). torch is pinned and found as above.
TRITON_VENV  := build/triton-venv
TRITON_PY    := $(TRITON_VENV)/bin/python
TRITON_STAMP := $(TRITON_VENV)/.safetorch-installed

$(TRITON_STAMP): pyproject.toml
	test -x $(TRITON_PY) || $(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_PY) -m pip install --quiet --upgrade pip
	$(call install_torch,$(TRITON_PY))
	$(TRITON_PY) -m pip install --quiet "$(TORCH)" "triton>=3.0" numpy pytest hypothesis wrapt packaging
	touch $(TRITON_STAMP)

test-triton: $(TRITON_STAMP)
	TRITON_INTERPRET=1 PYTHONPATH=. $(TRITON_PY) -m pytest -q -p no:cacheprovider tests/tensor/test_triton_index.py

bench: venv
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

# Opt-in compatibility matrix (never part of `make test` or .ci/run): every row (a Python and a
# torch; Python 3.9 with the lowest torch, the newest torch with cp39 wheels and every dependency
# at its floor) runs the whole suite twice; a test whose outcome differs is flaky (row red).
# A subset: make test-compat COMPAT_ROWS="3.9:2.8.0 2.14.1"
test-compat:
	bash tools/compat.sh $(COMPAT_ROWS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
