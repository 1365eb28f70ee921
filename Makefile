# Two entry points (see README): `make demo` and `make test`. Both create the virtual environment
# in .venv on first use (torch/torchvision from the registry: a few minutes, about 5.5 GB).
VENV ?= .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test test-kernels lint bench clean gpu-check

# Each step says what it does, and pip lists what it collects and installs (one line a package, no progress
# bars: a log without a terminal stays short) instead of minutes of silence.
PIP := $(VENV)/bin/python -m pip install --progress-bar off --disable-pip-version-check
$(STAMP): pyproject.toml
	@echo "== setup 1/3: the virtual environment $(VENV)"
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	@echo "== setup 2/3: a current pip"
	$(PIP) --upgrade pip
	@echo "== setup 3/3: the project with its Japanese, Dask and test extras, torch and torchvision (the first time takes a few minutes)"
	$(PIP) -e '.[test]'
	@echo "== setup: done ($(VENV))"
	touch $(STAMP)

setup: $(STAMP)

# The demo on one portable kernel set, so that it prints the README's table digit for digit on every x86-64
# CPU with AVX2 (docs/reproducibility.md): CPU sums are ordered by the thread count and by the kernels each
# library picks for the CPU. One thread; PyTorch's AVX2 kernels; MKL's conditional numerical
# reproducibility on its COMPATIBLE branch (the branch Intel documents for Intel and compatible CPUs alike;
# on an AMD CPU MKL ignores its other branches and runs its own choice); oneDNN's AVX2 kernels. Costs about
# 11% of the demo's time on the development machine.
DEMO_KERNELS := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MKL_DYNAMIC=FALSE ATEN_CPU_CAPABILITY=avx2 \
	MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2
demo: $(STAMP)
	env $(DEMO_KERNELS) TORCHINDUCTOR_CACHE_DIR=$(INDUCTOR_CACHE)-demo $(VENV)/bin/train pipeline demo

# the suite in one worker process per logical CPU, at most 4 (pytest-xdist); a test file stays in one worker, so
# its module fixtures are built once; tests/conftest.py gives each worker its share of the torch threads
PYTEST := $(VENV)/bin/python -m pytest -q -n logical --maxprocesses 4 --dist loadfile
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PYTEST)

# Kernel sets: CPU float sums depend on the kernels that ATen, MKL and oneDNN pick for the CPU, and one machine
# can run other CPUs' kernels through variables read when the libraries load (docs/reproducibility.md):
#   native        the CPU's own choice (the variables below unset)
#   aten-default  PyTorch's own kernels without vector instructions (changes softmax and torch.randn, so
#                 every model starts from other weights)
#   mkl-onednn    MKL's conditional-numerical-reproducibility SSE2 branch and oneDNN's SSE4.1 kernels
#                 (changes every matrix product and convolution)
#   avx2          the kernels of a CPU with AVX2 and no AVX-512 (ATen and oneDNN; MKL keeps its own
#                 choice): on the development machine's Zen 4 EPYC it prints, digit for digit, the demo that
#                 issue 27 reported from a Zen 3 EPYC
KERNEL_VARS := ATEN_CPU_CAPABILITY MKL_CBWR MKL_ENABLE_INSTRUCTIONS ONEDNN_MAX_CPU_ISA DNNL_MAX_CPU_ISA
KERNELS_native :=
KERNELS_aten-default := ATEN_CPU_CAPABILITY=default
KERNELS_mkl-onednn := MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41
KERNELS_avx2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
KERNEL_SETS ?= native aten-default mkl-onednn avx2
#: what test-kernels runs under each set (pytest arguments; default: the whole suite)
KERNEL_TESTS ?=
#: the tests that train, embed or rank (what CI runs under one non-native set)
TRAIN_EVAL_TESTS := tests/test_trainer.py tests/test_rundir.py tests/test_checkpoint_safety.py \
	tests/test_train_seam_vse.py tests/test_train_liwe.py tests/test_textcls.py tests/test_family_plugin.py \
	tests/test_demo_pipeline.py tests/test_pipelines.py tests/test_compare.py tests/test_query.py \
	tests/test_gallery.py tests/test_analysis.py tests/test_evaluate*.py tests/test_order_kernel.py \
	tests/test_peer_contracts.py tests/test_similarity.py tests/test_losses.py

# torch.compile's on-disk cache does not tell kernel sets apart: a kernel compiled for AVX-512, loaded by a
# process under ATEN_CPU_CAPABILITY=avx2, computed wrong order-violation scores (tests/test_order_kernel.py,
# one thread). The evaluator keys its own folder by kernel set (vsecore.inductor_cache); these folders
# keep the test runs and the demo out of the user's own inductor cache as well. Under the user's cache
# home, not /tmp: compiled kernels are code, and the toolkit runs them only from folders of the user's own
# that nobody else can write (vsecore.trusted; a predictable /tmp name another user made first is refused).
INDUCTOR_CACHE = $${XDG_CACHE_HOME:-$$HOME/.cache}/vse-toolkit/make-inductor

# the suite under every kernel set, each to the end; fails if any set fails. First a table of which float
# results each set changes on this CPU (tests/kernel_bits.py). Run it before every submission.
#   make test-kernels KERNEL_SETS="native avx2" KERNEL_TESTS=tests/test_trainer.py
test-kernels: $(STAMP)
	$(VENV)/bin/ruff check .
	-env $(addprefix -u ,$(KERNEL_VARS)) $(VENV)/bin/python tests/kernel_bits.py \
	  $(foreach k,$(KERNEL_SETS),"$(KERNELS_$(k))")
	@failed=; $(foreach k,$(KERNEL_SETS),echo "== kernel set $(k): $(or $(KERNELS_$(k)),the CPU's own kernels)"; \
	  env $(addprefix -u ,$(KERNEL_VARS)) $(KERNELS_$(k)) TORCHINDUCTOR_CACHE_DIR=$(INDUCTOR_CACHE)-$(k) \
	    $(PYTEST) $(KERNEL_TESTS) || failed="$$failed $(k)";) \
	  if [ -n "$$failed" ]; then echo "== failed under:$$failed"; exit 1; fi; \
	  echo "== green under every kernel set: $(KERNEL_SETS)"

# every CUDA path of the toolkit in one call on synthetic data it makes itself (bench/gpu_check.py, docs/scale.md):
# extraction with crops, every family's step in float32 and bf16, the 5k evaluation, a --workers 2 loader.
# Fails in one line on the first CUDA error; the numbers go to $(GPU_CHECK_JSON)
GPU_CHECK_JSON ?= gpu_check.json
gpu-check: $(STAMP)
	$(VENV)/bin/python bench/gpu_check.py --device cuda --json $(GPU_CHECK_JSON) --overwrite

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf work runs .pytest_cache .ruff_cache
