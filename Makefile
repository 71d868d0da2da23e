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

# The TensorRT path (issue 5): export → plan → convert → build → answer one question. The CPU steps run in this
# venv; the GPU steps run with TRT_PY, the Python of a TensorRT-LLM 1.2.x environment (tensorrt_llm pins
# transformers 4.57, so it cannot share this venv; there: pip install 'tensorrt_llm>=1.2,<1.3' and
# pip install --no-deps -e .):  make trtllm TRT_PY=/path/to/trtllm-env/bin/python
# Without the TensorRT stack it writes the ONNX file, the checkpoint and the trtllm-build command, then stops
# (exit status 3) at the first GPU step, saying what is missing. For the full Qwen-VL-Chat checkpoint set
# TRT_REFERENCE= (the PyTorch reference answer is slow on a CPU).
TRT_CHECKPOINT ?= data/toy-qwen-vl
TRT_IMAGE ?= data/images/blue_square.png
TRT_QUESTION ?= 图片里是什么？
TRT_WORKDIR ?= build/trtllm
TRT_PY ?= $(PY)
TRT_REFERENCE ?= --reference
TRT_ARGS = --checkpoint $(TRT_CHECKPOINT) --image $(TRT_IMAGE) --question "$(TRT_QUESTION)" --workdir $(TRT_WORKDIR)

trtllm: setup
	$(PY) -m qwenvl_lab.trtllm.pipeline --stage prepare $(TRT_REFERENCE) $(TRT_ARGS)
	$(TRT_PY) -m qwenvl_lab.trtllm.pipeline --stage gpu $(TRT_ARGS)
