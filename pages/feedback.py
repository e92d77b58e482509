"""Feedback: people's votes on answers (issue 34). Counts per run and per person, agreement between people and
conflicts, filters, the person's own votes (withdraw), second opinions on answers others judged, and exports as DPO
or KTO datasets with "Train on this feedback". The logic is ui/feedback_view.py and trainer_core/feedback/."""
from __future__ import annotations

import streamlit as st

from trainer_core.feedback import agreement, served, votes
from trainer_core.feedback.service import Feedback
from trainer_core.views.run_rules import run_labels
from ui import feedback_view as view
from ui.auth import current_actor
from ui.entry import require_entrypoint
from ui.state import get_orchestrator

require_entrypoint("pages/feedback.py")

orch = get_orchestrator()
actor = current_actor()
feedback = Feedback(orch.store)
st.title("Feedback")
st.caption("Votes on answers from the Playground and second opinions here: the preference data DPO and KTO train on.")

synced = served.sync(feedback)  # ratings an app posted to a serve job's endpoint since the last look
if synced.added:
    st.toast(f"{synced.added} rating(s) from served answers recorded as votes", icon="🔌")
every = feedback.all_votes()
voted_runs = orch.get_runs(sorted({r for v in every for r in votes.run_ids(v)}))
names = {**run_labels(voted_runs), agreement.BASE_ONLY: agreement.BASE_ONLY}
filters = view.render_filters(every, names)
chosen = agreement.select(every, filters)
view.render_summary(chosen, names)
view.render_export(feedback, actor, filters, lambda run_id: orch.artifacts(source_run_id=run_id))
view.render_my_votes(feedback, actor, filters)
view.render_second_opinions(feedback, actor)
