"""Plain rendering functions shared by the Live and Run pages.

They take data (a ``LiveSnapshot``, a metrics DataFrame) and draw it; they never call the
orchestrator, so tests can drive them with synthetic data through ``AppTest.from_function``.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from trainer_core import charts
from trainer_core.live import LiveSnapshot
from trainer_core.status import RunStatus
from ui import format as fmt

BADGE_COLOURS = {
    RunStatus.QUEUED: "gray",
    RunStatus.STARTING: "blue",
    RunStatus.RUNNING: "blue",
    RunStatus.STOPPING: "orange",
    RunStatus.COMPLETED: "green",
    RunStatus.STOPPED: "green",
    RunStatus.CANCELLED: "gray",
    RunStatus.FAILED: "red",
}
SPARK_POINTS = 60
NO_RUNS = "No runs yet. Start one on the **New run** page."
LOSS_HEIGHT = 380
SMALL_HEIGHT = 280


def stop_without_runs(runs: list) -> None:
    """End the page with a pointer to New run when there is nothing to show."""
    if not runs:
        st.info(NO_RUNS)
        st.stop()


def status_markdown(status: RunStatus | str, phase: str = "") -> str:
    """A coloured badge such as ``:green-badge[✅ Completed]``, followed by the phase."""
    try:
        colour = BADGE_COLOURS[RunStatus(status)]
    except ValueError:
        colour = "gray"
    text = f":{colour}-badge[{fmt.status_badge(status)}]"
    return f"{text} {phase}" if phase else text


def _spark(values: pd.Series) -> list[float] | None:
    if len(values) < 2:
        return None
    stride = max(1, len(values) // SPARK_POINTS)
    return values.iloc[::stride].tolist()


def render_metrics(snapshot: LiveSnapshot) -> None:
    """The headline numbers of a run as ``st.metric`` tiles."""
    df = snapshot.metrics
    losses = charts.finite_column(df, "loss")
    memory = charts.finite_column(df, "memory_mb")
    peak_memory = memory.max() if len(memory) else snapshot.memory_mb
    top = st.columns(5)
    top[0].metric("Loss", fmt.number(snapshot.loss), chart_data=_spark(losses), border=True,
                  help="Latest training loss; the sparkline shows its history.")
    top[1].metric("Eval loss", fmt.number(snapshot.eval_loss), border=True)
    top[2].metric("Learning rate", fmt.scientific(snapshot.learning_rate, 1), border=True)
    top[3].metric("Grad norm", fmt.number(snapshot.grad_norm), border=True)
    top[4].metric("Epoch", fmt.number(snapshot.epoch, 3), border=True)
    bottom = st.columns(5)
    bottom[0].metric("Tokens seen", fmt.compact(snapshot.tokens_seen), border=True)
    bottom[1].metric("Tokens/s", fmt.number(snapshot.tokens_per_s, 3), border=True)
    bottom[2].metric("Elapsed", fmt.duration(snapshot.elapsed_s if snapshot.started_at else None), border=True)
    eta = None if RunStatus(snapshot.status).is_terminal() else snapshot.eta_s
    bottom[3].metric("ETA", fmt.duration(eta), border=True)
    bottom[4].metric("Peak memory", fmt.memory(peak_memory), border=True)


def render_nonfinite(df: pd.DataFrame) -> None:
    """Say where the run produced NaN/inf values (they are dropped from the charts)."""
    if "nonfinite" not in df or df.empty:
        return
    flagged = df[df["nonfinite"].fillna("").astype(str) != ""]
    if flagged.empty:
        return
    first = flagged.iloc[0]
    st.warning(f"Non-finite values ({first['nonfinite']}) first at step {int(first['step'])}, "
               f"{len(flagged)} logged step(s) in all. They are left out of the charts.", icon="⚠️")


def render_charts(df: pd.DataFrame, window: int = 10) -> None:
    """Loss (raw points, moving average, eval overlay) plus grad norm, learning rate and tokens/s."""
    if df is None or df.empty or "step" not in df:
        st.caption("No metrics logged yet.")
        return
    # An explicit element height: with "content" the Streamlit theme squeezes the plot area.
    st.altair_chart(charts.loss_chart(df, window=window), theme="streamlit", width="stretch", height=LOSS_HEIGHT)
    extra = [(name, title) for name, title in (("grad_norm", "Grad norm"), ("learning_rate", "Learning rate"),
                                               ("tokens_per_s", "Tokens/s")) if len(charts.finite_column(df, name))]
    for column, (name, title) in zip(st.columns(len(extra)) if extra else [], extra):
        with column:
            st.altair_chart(charts.line_chart(df, name, title), theme="streamlit", width="stretch",
                            height=SMALL_HEIGHT)


def render_outcome(status: RunStatus, error: str, log_tail: str, output_dir: str) -> None:
    """What happened at the end: the error and log when failed, the output folder when saved."""
    if status is RunStatus.FAILED:
        st.error(error or "The run failed without an error message; see the worker log.", icon="❌")
        if log_tail:
            with st.expander("Worker log (last lines)", expanded=True):
                st.code(log_tail, language="text")
    elif status in (RunStatus.COMPLETED, RunStatus.STOPPED):
        st.success(f"Saved to `{output_dir}`" if output_dir else "Finished.", icon=status.icon)
    elif status is RunStatus.CANCELLED:
        st.info("Cancelled: nothing was saved from this run.", icon=status.icon)


def render_live(snapshot: LiveSnapshot | None) -> None:
    """Everything the live view shows for one snapshot."""
    if snapshot is None:
        st.info(NO_RUNS)
        return
    status = RunStatus(snapshot.status)
    st.markdown(f"### {snapshot.name or snapshot.run_id}")
    details = " · ".join(p for p in (snapshot.model, snapshot.dataset, snapshot.method,
                                     f"engine: {snapshot.engine}" if snapshot.engine else "") if p)
    st.markdown(status_markdown(status, snapshot.phase) + (f"  \n{details}" if details else ""))
    label = f"step {snapshot.step:,} / {snapshot.total_steps:,}" if snapshot.total_steps else f"step {snapshot.step:,}"
    st.progress(snapshot.progress, text=label)
    render_metrics(snapshot)
    for message in snapshot.warnings:
        st.warning(message, icon="⚠️")
    render_nonfinite(snapshot.metrics)
    render_outcome(status, snapshot.error, snapshot.log_tail, snapshot.output_dir)
    render_charts(snapshot.metrics)
