"""Driving the dashboard's pages through Streamlit's AppTest: open a page (with session state or query parameters),
read the elements of a kind, click a button by its label, and the New run page with its slow parts (model facts,
device memory, the data preview) replaced by recording fakes."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from streamlit.testing.v1 import AppTest

from tests.support.env import ROOT
from trainer_core.data import preview
from trainer_core.planning import memory, model_info

APP = str(ROOT / "streamlit_app.py")
TIMEOUT = 30  # seconds an AppTest run may take: the first imports pandas and altair on a loaded machine
NEW_RUN = "pages/new_run.py"


def open_page(page: str | None = None, *, timeout: float = TIMEOUT, query: dict | None = None, **session) -> AppTest:
    """The app with ``session`` state set, switched to ``page`` (a path under pages/) with ``query`` parameters;
    asserts that no script run raised."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for key, value in session.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, at.exception
    if page:
        at.switch_page(page)
        for key, value in (query or {}).items():
            at.query_params[key] = value
        at.run()
        assert not at.exception, at.exception
    return at


def open_new_run(**session) -> AppTest:
    return open_page(NEW_RUN, **session)


def texts(at: AppTest, kind: str) -> list[str]:
    """The values of every element of ``kind`` (``"error"``, ``"markdown"``, ...), in page order."""
    return [e.value for e in getattr(at, kind)]


def click(at: AppTest, label: str) -> AppTest:
    next(b for b in at.button if b.label == label).click().run()
    assert not at.exception, at.exception
    return at


def submit(at: AppTest) -> AppTest:
    """New run's Start training."""
    return click(at, "Start training")


def use_local_file(at: AppTest, path: Path) -> AppTest:
    """New run's dataset source set to a local file."""
    at.radio(key="nr_dataset_source").set_value("local")
    at.text_input(key="nr_local_datasets").input(str(path)).run()
    assert not at.exception, at.exception
    return at


TINY = model_info.ModelInfo(
    source="bundled", architecture="LlamaForCausalLM", model_type="llama", num_parameters=134_515_008,
    hidden_size=576, num_layers=30, num_attention_heads=9, num_kv_heads=3, intermediate_size=1536,
    vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True, has_chat_template=True,
    torch_dtype="bfloat16")


@pytest.fixture
def fakes(app_home, monkeypatch):
    """Model facts, device memory and the preview replaced by fakes that record what they were asked."""
    calls = SimpleNamespace(inspect=[], preview=[], result=None, free_gb=100.0)

    def inspect(name, token=None):
        calls.inspect.append(name)
        return TINY

    def build_preview(cfg, rows_shown=5, timeout_s=180):
        calls.preview.append(cfg)
        if isinstance(calls.result, Exception):
            raise calls.result
        return calls.result or fake_preview(cfg.max_seq_length)

    monkeypatch.setattr(model_info, "inspect_model", inspect)
    monkeypatch.setattr(preview, "build_preview", build_preview)
    monkeypatch.setattr(memory, "device_memory",
                        lambda cfg: memory.DeviceMemory("cpu", "test RAM", calls.free_gb, 128.0))
    return calls


def fake_preview(max_seq_length: int = 512) -> preview.Preview:
    rows = (preview.RenderedRow(index=0, text="<|user|>Hi <script>alert(1)</script>\n<|assistant|>Hello & bye",
                                segments=(("<|user|>Hi <script>alert(1)</script>\n<|assistant|>", False),
                                          ("Hello & bye", True)),
                                num_tokens=21, truncated=False),
            preview.RenderedRow(index=1, text="long", segments=(("long", True),), num_tokens=900, truncated=True))
    return preview.Preview(format="chatml", format_reason="found a 'messages' column with role/content turns",
                           tokenizer="SmolLM2-135M-Instruct", rows=rows, lengths=(21, 40, 300, 900),
                           max_seq_length=max_seq_length, truncated=1, dropped={"no assistant turn": 2},
                           total_rows=4, total_tokens=1173, trained_tokens=400, steps_per_epoch=1, eval_rows=0)
