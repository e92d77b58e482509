"""The New run form offers the bundled embedding model when the method is embedding (AppTest, no ML imports)."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.support.apptest import APP
from trainer_core.config import BUNDLED_MODEL
from trainer_core.methods.embedding import BUNDLED_MODEL as BUNDLED_EMBEDDING
from ui import form


def test_the_bundled_source_is_the_embedding_model_for_the_embedding_method():
    assert form.model_name("bundled", "", "embedding") == BUNDLED_EMBEDDING
    assert form.model_name("bundled", "", "dpo") == form.model_name("bundled", "") == BUNDLED_MODEL


def test_choosing_the_embedding_method_shows_the_bundled_encoder_and_builds_its_config(app_home):
    at = AppTest.from_file(APP, default_timeout=30)
    at.run()
    at.switch_page("pages/new_run.py").run()
    assert not at.exception, at.exception
    at.selectbox(key="nr_method").set_value("embedding").run()
    assert not at.exception, at.exception
    tiles = {m.label: m.value for m in at.metric}
    assert tiles["Architecture"] == "BertModel"  # read from the bundled folder's config.json
    cfg, problems = form.build_config(at.session_state, with_secrets=False)
    assert cfg is not None and (cfg.method, cfg.model_name) == ("embedding", BUNDLED_EMBEDDING), problems
    assert form.config_to_state(cfg)["nr_model_source"] == "bundled"
