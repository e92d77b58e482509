"""The Playground's embedding mode (issue 21): type a query and see the top passages of a corpus (the run's own
passages, or pasted ones) as the base model and the tuned model rank them, side by side with their scores. The
search runs in a child process (trainer_core/tryout/search.py); ``render`` lays the mode out."""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from db.entities import RunRecord
from trainer_core.specs import model_source
from trainer_core.tryout import search
from trainer_core.evaluation import retrieval
from trainer_core.specs.model_source import ModelSource, SourceError
from ui import playground as pg
from ui.text import safe

K = "pge_"
RESULTS = K + "results"


def sources_of(run_id: str, picked: list) -> list[ModelSource]:
    """The picked versions of a run as model sources: "base" is the model it was trained from."""
    out = []
    for version in picked:
        out.append(pg.base_source(run_id) if version == "base" else ModelSource(run_id=run_id, checkpoint=version))
    return out


def result_table(ranking: search.Ranking, passages: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{"rank": rank, "score": hit.score, "passage": passages[hit.index]}
                         for rank, hit in enumerate(ranking.hits, 1)], columns=["rank", "score", "passage"])


def render(orch: Any, actor: Any, may_start: bool, runs: list[RunRecord], labels: dict[str, str]) -> None:
    """The embedding mode; ``runs``: the finished embedding runs (playground.offered_runs)."""
    if not runs:
        st.info("No embedding run yet: train one with method embedding (docs/methods.md), then search with it "
                "and its base model here.", icon="🔎")
        return
    if not may_start:
        st.info("Viewers cannot search: it loads the models in a process on the host.", icon="👀")
        return
    offered = {r.id: r for r in runs}
    run_id = st.selectbox("Run", list(offered), key=K + "run", format_func=lambda r: labels[r])
    versions = ["base", *pg.versions(run_id)]
    picked = st.multiselect("Models", versions, default=versions[:2], key=K + f"versions_{run_id}", max_selections=3,
                            format_func=lambda v: "its base model" if v == "base" else pg.version_label(v))
    where = st.radio("Passages", ["run", "pasted"], horizontal=True, key=K + "where",
                     format_func={"run": "The run's own passages", "pasted": "Paste passages"}.get)
    if where == "pasted":
        passages = search.pasted_passages(st.text_area("One passage per line", key=K + "pasted", height=160))
    else:
        try:
            passages = search.run_passages(run_id)
        except (search.SearchError, SourceError) as exc:
            st.error(safe(exc), icon="🚫")
            return
    st.caption(f"{len(passages):,} passage(s)")
    query = st.text_input("Query", key=K + "query", placeholder="What is a …?")
    if st.button("Search", icon="🔎", type="primary", key=K + "go", disabled=not picked):
        try:
            sources = sources_of(run_id, picked)
            settings = retrieval.run_settings(run_id)
            request = search.Request(sources=tuple(sources), query=query, passages=tuple(passages),
                                     query_prompt=settings.get("query_prompt", ""),
                                     document_prompt=settings.get("document_prompt", ""),
                                     max_seq_length=int(settings.get("max_seq_length", 0) or 0),
                                     labels=tuple(model_source.resolve(s).label for s in sources))
            with st.spinner("Embedding the query and the passages…"):
                st.session_state[RESULTS] = (request.passages, search.search(request))
        except (search.SearchError, SourceError) as exc:
            st.error(safe(exc), icon="🚫")
            return
    found = st.session_state.get(RESULTS)
    if not found:
        return
    shown, rankings = found
    for col, ranking in zip(st.columns(len(rankings)), rankings):
        with col:
            st.markdown(f"**{safe(ranking.label)}**")
            if ranking.error:
                st.error(safe(ranking.error), icon="🛑")
                continue
            st.dataframe(result_table(ranking, list(shown)), hide_index=True, column_config={
                "rank": st.column_config.NumberColumn("#", format="%d"),
                "score": st.column_config.NumberColumn(f"Score ({ranking.similarity})", format="%.3f"),
                "passage": st.column_config.TextColumn("Passage", width="large")})
