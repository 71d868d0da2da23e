# qwenvl-lab: `make lab` opens the course, `make test` runs every test (unit tests + notebooks).
#
#   make lab                 install the course into .venv, copy the notebooks into my-notebooks/, open JupyterLab
#   make doctor              check the machine: before installing (Python, venv, make, disk, memory, the package
#                            indexes; needs nothing installed), then the installed course (torch, vocabulary, model, …)
#   make test                add the test tools, run every test: the unit tests (slow ones too) and the course notebooks
#   make unit                the unit tests without those marked slow (a few minutes; make test runs them all)
#   make browser             the course in JupyterLab in headless Chromium: every notebook run, its widgets driven
#                            (needs Debian's chromium: apt-get install chromium; adds Playwright for Python to .venv)
#   make site                the course as a website (Jupyter Book) in build/site/_build/html, notebooks with their
#                            outputs (SITE_REPOSITORY=owner/name: Binder buttons; SITE_HUB=https://…: a class hub's)
#   make site-test           build it and check every page in headless Chromium
#   make class-load          a class on one JupyterHub server, measured (root, loopback only; docs/workshop.md)
#   make workshop-figures    docs/workshop.md's memory and class-size figures from the committed class measurement
#   make wheelhouse          torch's CPU wheels and the course's dependencies for Python 3.11–3.13 on Linux, macOS,
#                            Windows, in wheelhouse/ (a USB stick for a room without fast internet; docs/install.md)
#   make screenshots         the browser test's gallery: a screenshot of every figure and widget of every notebook,
#                            in course-output/browser-gallery/index.html
#   make fuzz                the property tests with more examples (HYPOTHESIS_PROFILE=fuzz)
#   make float-order         nbval over every notebook and solution three times: as this machine runs them, with one
#                            thread (OMP_NUM_THREADS=1) and with ATen's plain kernels (ATEN_CPU_CAPABILITY=default)
#   make reset NOTEBOOK=03   restore my-notebooks/03_….ipynb from the course; your copy moves to my-notebooks/backup/
#   make clean               remove course outputs (course-output/) and build leftovers; your notebooks stay, and
#                            trained models and training states move to backups/<date>/ first
#   make clean-all           also remove .venv; my-notebooks/ (your notebook copies) moves to backups/<date>/
#
# Settings (make lab VAR=value):
#   PYTHON       the interpreter that creates .venv; default: the first of python3.13, python3.12, python3.11,
#                python3, python that is Python 3.11–3.13 (transformers 5.24 needs 3.11)
#   TORCH_INDEX  the PyTorch wheel index for Linux; default: the CPU builds (PyPI's Linux torch is a CUDA build: 2.7 GB
#                of downloads, 5.6 GB in .venv). Its build (cpu, cu130, …) is first looked for among pip's own
#                sources (pip.conf: find-links, a wheelhouse an instructor provides), then taken from the index.
#                TORCH_INDEX= (empty) installs PyPI's build. macOS and Windows always use PyPI (CPU builds there).
#   WHEELHOUSE   a folder of wheels (make wheelhouse; default: wheelhouse/ in the clone if there is one): installs
#                from it alone first, with no network, then from the indexes for anything it lacks
#   PREFLIGHT    the doctor's arguments for its check before .venv is created (default --before-install; add
#                --no-network on a machine whose pip works through find-links alone; PREFLIGHT= skips the check)
#   LAB_ARGS     more JupyterLab arguments, e.g. on a remote machine: make lab LAB_ARGS="--ip=0.0.0.0 --port=8888 --no-browser"
#                (as root, --allow-root is added by itself)
#
# Without make (Windows): docs/install.md.

PYTHON_CANDIDATES := python3.13 python3.12 python3.11 python3 python
PYTHON_OK := import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))
PYTHON ?= $(firstword $(foreach p,$(PYTHON_CANDIDATES),$(shell $(p) -c '$(PYTHON_OK)' >/dev/null 2>&1 && echo $(p))))
# any Python 3 at all: the doctor runs on it to say what is wrong and how to get a supported one
PYTHON_ANY := $(firstword $(foreach p,$(PYTHON_CANDIDATES),$(shell $(p) -c 'import sys; sys.exit(sys.version_info < (3, 6))' >/dev/null 2>&1 && echo $(p))))
TORCH_VERSION := 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PREFLIGHT ?= --before-install
LAB_ARGS ?=

VENV := .venv
BIN := $(VENV)/$(if $(filter Windows_NT,$(OS)),Scripts,bin)
PY := $(BIN)/python
VENV_STAMP := $(VENV)/.created
TORCH_STAMP := $(VENV)/.torch-$(TORCH_VERSION)
COURSE_STAMP := $(VENV)/.course
TEST_STAMP := $(VENV)/.test
BROWSER_STAMP := $(VENV)/.browser
HUB_STAMP := $(VENV)/.hub
SITE_STAMP := $(VENV)/.site
PYTEST := $(PY) -m pytest -p no:cacheprovider
# setuptools' editable install (a meta-path finder: data/ is mapped to qwenvl_lab.data) ends with an informational
# "Editable installation. Please be careful with folders in your working directory with the same name as your
# package" (setuptools.warnings.InformationOnly), which pip 26 prints as a BuildBackendWarning at every install; only
# that message is filtered out, by its text
# every install takes the tested versions (constraints.txt; pyproject.toml gives ranges). With a wheelhouse (make
# wheelhouse; WHEELHOUSE=/path, else wheelhouse/ in the clone if there is one) pip installs from it alone first, with
# no network (--no-index), and only for what it lacks from the indexes too: a shell function, pip_install ARGS…
CONSTRAINTS := constraints.txt
WHEELHOUSE ?= $(wildcard wheelhouse)
PIP := PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -c $(CONSTRAINTS) \
    $(if $(WHEELHOUSE),--find-links "$(abspath $(WHEELHOUSE))")
PIP_INSTALL = pip_install() { $(if $(WHEELHOUSE),$(PIP) --no-index "$$@" 2>/dev/null || { echo "(not all in the wheelhouse $(WHEELHOUSE): the indexes too)"; $(PIP) "$$@"; },$(PIP) "$$@"); }; pip_install
PIP_EDITABLE = $(PIP_INSTALL) -e

.PHONY: setup lab doctor reset test lint unit notebooks float-order browser screenshots fuzz clean clean-all trtllm trtllm-env regenerate site site-test class-load \
    workshop-figures wheelhouse

setup: $(COURSE_STAMP)

# Nothing is created before the doctor's first stage (standard library only) passes: Python 3.11-3.13, venv and
# ensurepip, disk, memory, the package index and the torch index (or a torch wheel among pip's find-links)
$(VENV_STAMP):
	@if [ ! -x "$(PY)" ]; then \
	    python="$(or $(PYTHON),$(PYTHON_ANY))"; \
	    if [ -z "$$python" ]; then \
	        echo "error: no Python 3 found (tried $(PYTHON_CANDIDATES)); the course needs Python 3.11-3.13:" \
	             "docs/install.md, 'Getting Python 3.11-3.13', says how to get one" >&2; exit 1; \
	    fi; \
	    if [ -n "$(PREFLIGHT)" ] || ! "$$python" -c '$(PYTHON_OK)' 2>/dev/null; then \
	        TORCH_INDEX="$(TORCH_INDEX)" WHEELHOUSE="$(WHEELHOUSE)" "$$python" -m qwenvl_lab.course.doctor --before-install $(filter-out --before-install,$(PREFLIGHT)) || { \
	            echo "error: nothing was installed; fix what the doctor says (fix: lines), then run make $(or $(MAKECMDGOALS),setup) again" >&2; \
	            exit 1; }; \
	    fi; \
	    if ! "$$python" -c '$(PYTHON_OK)'; then \
	        echo "error: PYTHON=$$python is not Python 3.11-3.13 ($$("$$python" --version 2>&1)); nothing was installed;" \
	             "name another: make $(or $(MAKECMDGOALS),setup) PYTHON=/path/to/python3.12" >&2; exit 1; \
	    fi; \
	    echo "$$python -m venv $(VENV)"; "$$python" -m venv $(VENV); \
	fi
	$(PIP_INSTALL) --upgrade pip
	touch $@

$(TORCH_STAMP): $(VENV_STAMP)
	@if [ "$$($(PY) -c 'import platform; print(platform.system(), platform.machine())')" = "Darwin x86_64" ]; then \
	    echo "error: PyTorch has no builds for Intel Macs after 2.2 and the course needs torch $(TORCH_VERSION);" \
	         "on an Apple-silicon Mac use an arm64 Python (not one under Rosetta), else a Linux machine or VM" >&2; \
	    exit 1; \
	fi
	@if [ "$$(uname -s)" = Linux ] && [ -n "$(TORCH_INDEX)" ]; then \
	    build="$(notdir $(TORCH_INDEX))"; \
	    if $(PIP_INSTALL) "torch==$(TORCH_VERSION)+$$build" 2>/dev/null; then \
	        echo "torch $(TORCH_VERSION)+$$build from pip's own sources"; \
	    else \
	        echo "torch $(TORCH_VERSION)+$$build from $(TORCH_INDEX)"; \
	        $(PIP_INSTALL) "torch==$(TORCH_VERSION)" --index-url "$(TORCH_INDEX)" || { \
	            echo "error: torch $(TORCH_VERSION)+$$build did not install from $(TORCH_INDEX). If that index cannot be" \
	                 "reached from here: make lab TORCH_INDEX= installs PyPI's torch instead (a CUDA build: 2.7 GB of" \
	                 "downloads, 5.6 GB in .venv), or put the wheel in a folder named in pip.conf's find-links" >&2; \
	            exit 1; }; \
	    fi; \
	else \
	    echo "torch $(TORCH_VERSION) from PyPI"; $(PIP_INSTALL) "torch==$(TORCH_VERSION)"; \
	fi
	touch $@

$(COURSE_STAMP): $(TORCH_STAMP) pyproject.toml $(CONSTRAINTS)
	$(PIP_EDITABLE) '.[course]'
	touch $@

$(TEST_STAMP): $(COURSE_STAMP)
	$(PIP_EDITABLE) '.[course,test]'
	touch $@

# Playwright for Python drives the machine's Chromium: pip installs no browser, and `playwright install` is never run
$(BROWSER_STAMP): $(TEST_STAMP)
	$(PIP_EDITABLE) '.[course,test,browser]'
	touch $@

lab: $(COURSE_STAMP)
	$(PY) -m qwenvl_lab.course.lab $(LAB_ARGS)

# both stages in .venv once it exists; in a bare clone the first stage, with the Python `make lab` would take
doctor:
	@python="$(if $(wildcard $(PY)),$(PY),$(or $(PYTHON),$(PYTHON_ANY)))"; \
	if [ -z "$$python" ]; then \
	    echo "error: no Python 3 found (tried $(PYTHON_CANDIDATES)); docs/install.md says how to get Python 3.11-3.13" >&2; \
	    exit 1; \
	fi; \
	echo "$$python -m qwenvl_lab.course.doctor"; \
	TORCH_INDEX="$(TORCH_INDEX)" WHEELHOUSE="$(WHEELHOUSE)" "$$python" -m qwenvl_lab.course.doctor

reset: $(COURSE_STAMP)
	@if [ -z "$(NOTEBOOK)" ]; then echo "usage: make reset NOTEBOOK=03 (a course notebook's number or name)" >&2; exit 2; fi
	$(PY) -m qwenvl_lab.course.lab --reset "$(NOTEBOOK)"

test: lint
	$(PYTEST) -m "not browser" tests notebooks --nbval --nbval-current-env

lint: $(TEST_STAMP)
	$(PY) -m ruff check qwenvl_lab tools tests notebooks
	$(PY) -m ruff format --check qwenvl_lab tools tests notebooks

unit: $(TEST_STAMP)
	$(PYTEST) -m "not browser and not slow" tests

notebooks: $(TEST_STAMP)
	$(PYTEST) --nbval --nbval-current-env notebooks

# A stored output must not depend on the order in which floats are summed (CONTRIBUTING.md): the notebooks' kernels
# run once as the machine runs them, once on one thread (other partial sums), once with ATen's kernels for no SIMD
# extension (other vector widths); every run must match the stored outputs. All three run, then the status says.
FLOAT_ORDER_RUNS := default OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default
float-order: $(TEST_STAMP)
	@failed=; for run in $(FLOAT_ORDER_RUNS); do \
	    echo "== nbval, $$run"; \
	    if [ "$$run" = default ]; then vars=; else vars=$$run; fi; \
	    env $$vars $(PYTEST) --nbval --nbval-current-env notebooks || failed="$$failed $$run"; \
	done; \
	if [ -n "$$failed" ]; then echo "stored outputs differ under:$$failed (the diffs are above)" >&2; exit 1; fi

browser: $(BROWSER_STAMP)
	@command -v chromium >/dev/null || { echo "error: no chromium on PATH; install Debian's: apt-get install chromium" >&2; exit 1; }
	QWENVL_LAB_BROWSER_TEST=required $(PYTEST) -m browser -v -s tests/test_browser.py

screenshots: $(BROWSER_STAMP)
	@command -v chromium >/dev/null || { echo "error: no chromium on PATH; install Debian's: apt-get install chromium" >&2; exit 1; }
	QWENVL_LAB_BROWSER_TEST=required $(PYTEST) -m browser -v -s tests/test_browser.py -k test_notebook_runs_in_the_browser
	@echo "the gallery: course-output/browser-gallery/index.html"

# The course as a website: Jupyter Book 1.x builds build/site/_build/html from the stored outputs (nothing runs);
# SITE_REPOSITORY (owner/name on GitHub; default: the origin remote) gives the pages their Binder launch buttons,
# SITE_HUB (a class JupyterHub's address) a button that opens the notebook there through nbgitpuller
SITE_REPOSITORY ?=
SITE_HUB ?=
$(SITE_STAMP): $(COURSE_STAMP)
	$(PIP_EDITABLE) '.[course,site]'
	touch $@

site: $(SITE_STAMP)
	$(PY) tools/website.py $(if $(SITE_REPOSITORY),--repository $(SITE_REPOSITORY)) $(if $(SITE_HUB),--hub $(SITE_HUB))

# every page in headless Chromium: renders, links and anchors resolve, figures load, Chinese text shows
# (needs Debian's chromium and a CJK font: apt-get install chromium fonts-wqy-microhei)
site-test: $(SITE_STAMP) $(BROWSER_STAMP)
	QWENVL_LAB_BROWSER_TEST=required $(PYTEST) -m browser -v tests/test_site.py

# A class on one JupyterHub server, measured (docs/workshop.md): as root on Linux, loopback only, stops by itself.
# JupyterHub and its idle culler join .venv; the proxy (npm's configurable-http-proxy) goes to .venv/hub/.
CLASS_LEARNERS ?= 4
CLASS_JSON ?= course-output/class-load.json
CLASS_ARGS ?=
CHP := $(VENV)/hub/node_modules/.bin/configurable-http-proxy

$(HUB_STAMP): $(COURSE_STAMP)
	$(PIP_EDITABLE) '.[course,hub]'
	@command -v npm >/dev/null || { echo "error: the hub's proxy needs Node.js and npm (Debian/Ubuntu: apt-get install nodejs npm)" >&2; exit 1; }
	npm install --silent --no-audit --no-fund --prefix $(VENV)/hub configurable-http-proxy@5
	$(PY) -m compileall -q qwenvl_lab
	touch $@

class-load: $(HUB_STAMP)
	@mkdir -p course-output  # the default --json's folder: the course's own (a folder you name must exist)
	$(PY) tools/classload.py --learners $(CLASS_LEARNERS) --proxy $(CHP) --json $(CLASS_JSON) --overwrite $(CLASS_ARGS)

# A room without fast internet (docs/install.md): torch's CPU wheels and every dependency of the course for each
# platform and Python a class brings, in one folder (about 1 GB a platform and Python; uv resolves each platform's
# markers, pip downloads its wheels). Learners then run make lab WHEELHOUSE=/path/to/it, or copy it to wheelhouse/.
WHEELHOUSE_DEST ?= wheelhouse
WHEELHOUSE_PLATFORMS ?= linux-x86_64 linux-aarch64 macos-arm64 windows-amd64
WHEELHOUSE_PYTHONS ?= 3.11 3.12 3.13
UV_STAMP := $(VENV)/.uv

$(UV_STAMP): $(VENV_STAMP) $(CONSTRAINTS)
	$(PIP_INSTALL) uv
	touch $@

wheelhouse: $(UV_STAMP)
	PYTHONPATH=. $(PY) tools/wheelhouse.py --dest $(WHEELHOUSE_DEST) --platforms $(WHEELHOUSE_PLATFORMS) \
	    --pythons $(WHEELHOUSE_PYTHONS) --torch-index "$(TORCH_INDEX)"

# docs/workshop.md's memory, class-size and Binder figures and the Zero-to-JupyterHub values, written from the
# committed class measurement (copy a new course-output/class-load.json to data/benchmarks/jupyterhub/class-load-cpu.json)
workshop-figures: $(VENV_STAMP)
	$(PY) tools/workshop_figures.py

fuzz: $(TEST_STAMP)
	HYPOTHESIS_PROFILE=fuzz $(PYTEST) tests/test_fuzz.py

# trained models and training states in course-output/ (and, for clean-all, my-notebooks/) move to a dated folder in
# backups/ first; everything else there is made again by the course. Any Python 3 runs it (clean-all removes .venv).
clean:
	@python="$(if $(wildcard $(PY)),$(PY),$(PYTHON_ANY))"; \
	if [ -z "$$python" ]; then echo "error: make clean needs a Python 3 to back up trained models first" >&2; exit 1; fi; \
	"$$python" tools/clean.py

clean-all:
	@python="$(if $(wildcard $(PY)),$(PY),$(PYTHON_ANY))"; \
	if [ -z "$$python" ]; then echo "error: make clean-all needs a Python 3 to back up your notebooks first" >&2; exit 1; fi; \
	"$$python" tools/clean.py --all
	rm -rf $(VENV)

# The TensorRT path: export → plan → convert → build → answer one question. The CPU steps run in this venv, the GPU
# steps in a TensorRT-LLM 1.2.1 environment (its transformers 4.57.3 cannot share this venv). `make trtllm-env` makes
# one in TRT_ENV in the order of TensorRT-LLM 1.2's install guide, after checking what that guide needs (CUDA Toolkit
# 13.1 with CUDA_HOME, a driver for it or cuda-compat-13-1, libopenmpi, Python 3.12) and saying what is missing
# before pip starts; `make trtllm` then uses it (or another: TRT_PY=/path/to/env/bin/python). docs/tensorrt.md has
# every step. Without the TensorRT stack `make trtllm` writes the ONNX file, the checkpoint and the trtllm-build
# command, says what the machine lacks, then stops (exit status 3) at the first GPU step. TRT_TP=2 splits the language
# model over two GPUs (the GPU stage then runs under $(TRT_MPIRUN)); TRT_OPTS=--strongly-typed builds the vision plan
# strongly typed. For the full Qwen-VL-Chat checkpoint set TRT_REFERENCE= (the PyTorch reference is slow on a CPU).
TRT_ENV ?= .trtllm-env
TRT_PYTHON ?= python3.12
TRT_TORCH_INDEX ?= https://download.pytorch.org/whl/cu130
TRT_CHECKPOINT ?= data/toy-qwen-vl
TRT_IMAGE ?= data/images/blue_square.png
TRT_QUESTION ?= 图片里是什么？
TRT_WORKDIR ?= course-output/trtllm
TRT_PY ?= $(if $(wildcard $(TRT_ENV)/bin/python),$(TRT_ENV)/bin/python,$(PY))
TRT_REFERENCE ?= --reference
TRT_TP ?= 1
TRT_OPTS ?=
TRT_MPIRUN ?= mpirun -n $(TRT_TP)
TRT_ARGS = --checkpoint $(TRT_CHECKPOINT) --image $(TRT_IMAGE) --question "$(TRT_QUESTION)" --workdir $(TRT_WORKDIR) \
    --tp-size $(TRT_TP) $(TRT_OPTS)

trtllm: setup
	$(PY) -m qwenvl_lab.trtllm.pipeline --stage prepare $(TRT_REFERENCE) $(TRT_ARGS)
	@PYTHONPATH=. $(TRT_PY) -m qwenvl_lab.trtllm.install_check --report
	$(if $(filter-out 1,$(TRT_TP)),$(TRT_MPIRUN) )$(TRT_PY) -m qwenvl_lab.trtllm.pipeline --stage gpu $(TRT_ARGS)

trtllm-env:
	PYTHONPATH=. $(TRT_PYTHON) -m qwenvl_lab.trtllm.install_check
	$(TRT_PYTHON) -m venv $(TRT_ENV)
	$(TRT_ENV)/bin/pip install --ignore-installed pip setuptools wheel
	$(TRT_ENV)/bin/pip install torch==2.9.1 torchvision --index-url $(TRT_TORCH_INDEX)
	$(TRT_ENV)/bin/python -c 'import torch; print("torch==" + torch.__version__)' > $(TRT_ENV)/torch-constraint.txt
	$(TRT_ENV)/bin/pip install -r requirements-trtllm.txt -c $(TRT_ENV)/torch-constraint.txt
	$(TRT_ENV)/bin/pip install --no-deps -e .

# Execute every notebook in place (widget state stored): their outputs are what nbval compares (CONTRIBUTING.md)
regenerate: $(TEST_STAMP)
	cd notebooks && ../$(PY) -m jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=900 --ExecutePreprocessor.store_widget_state=True *.ipynb solutions/*.ipynb
