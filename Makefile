# qwenvl-lab: `make lab` opens the course, `make test` runs every test (unit tests + notebooks).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test unit notebooks lab trtllm clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# CPU build of torch from the machine's disk (an unpinned torch pulls a multi-GB CUDA build)
	$(PY) -m pip install --quiet torch==2.13.0
	# the real Qwen vocabulary (qwen.tiktoken) ships inside dashscope; its own dependencies are not needed
	$(PY) -m pip install --quiet --no-deps dashscope==2.0.2
	$(PY) -m pip install --quiet -e '.[course,test]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest tests notebooks --nbval --nbval-current-env -p no:cacheprovider

unit: setup
	$(PY) -m pytest tests -p no:cacheprovider

notebooks: setup
	$(PY) -m pytest --nbval --nbval-current-env notebooks -p no:cacheprovider

lab: setup
	$(VENV)/bin/jupyter lab notebooks

clean:
	rm -rf $(VENV) build *.egg-info
