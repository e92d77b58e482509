"""Plain rendering functions shared by the Live and Run pages.

They take data (a ``LiveSnapshot``, a metrics DataFrame) and draw it; they never call the
orchestrator, so tests can drive them with synthetic data through ``AppTest.from_function``.

Kept whole: plain renderers shared by Live and Run details over the same snapshot and frame types.
"""
from __future__ import annotations

from collections.abc import Iterable
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import streamlit as st

from trainer_core.views import charts
from trainer_core.jobs.alerts import LABELS as ALERT_LABELS
from trainer_core.jobs.live import LiveSnapshot
from trainer_core.jobs.resources import ResourceSample
from trainer_core.protocol.status import RunStatus
from ui import format as fmt
from ui.text import code, safe

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
ALERTS_SHOWN = 5
SMOOTHING_KINDS = {"window": "Moving avg", "ema": "EMA"}
DEFAULT_WINDOW = 10
DEFAULT_EMA = 0.6


SMALL_CHARTS_PER_ROW = 3


@dataclass(frozen=True)
class ChartOptions:
    """What the chart controls chose: x axis, smoothing of the train loss, log-scale y, and the other
    metric keys (besides the method's charts) to draw."""

    x: str = "step"
    smoothing: charts.Smoothing = field(default_factory=lambda: charts.Smoothing("window", DEFAULT_WINDOW))
    log_scale: bool = False
    extra: tuple[str, ...] = ()


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
    return f"{text} {safe(phase)}" if phase else text


def _spark(values: pd.Series) -> list[float] | None:
    if len(values) < 2:
        return None
    stride = max(1, len(values) // SPARK_POINTS)
    return values.iloc[::stride].tolist()


def render_metrics(snapshot: LiveSnapshot, specs: Iterable[Any] = charts.DEFAULT_SPECS) -> None:
    """The headline numbers of a run as ``st.metric`` tiles; then, when the method's ``specs`` tile open
    metric keys (a reward, an accuracy), a row with their latest values."""
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
    tiled = [s for s in specs if s.tile and s.key not in _FIXED_TILES]
    for start in range(0, len(tiled), 5):
        for column, spec in zip(st.columns(5), tiled[start:start + 5]):
            values = charts.finite_column(df, spec.key)
            column.metric(spec.label, _formatted(values.iloc[-1] if len(values) else None, spec.format),
                          chart_data=_spark(values), border=True, help=f"Latest {spec.key}")


_FIXED_TILES = {"loss", "eval_loss", "learning_rate", "grad_norm", "epoch", "tokens_seen", "tokens_per_s",
                "elapsed_s", "memory_mb"}  # always in the two rows above


def _formatted(value: float | None, spec: str) -> str:
    """``value`` with a spec's format (Python's format mini-language); the usual dash when there is none."""
    if value is None:
        return fmt.number(None)
    try:
        return format(float(value), spec)
    except ValueError:
        return fmt.number(value)


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


def persistent_key(key: str, default: Any) -> str:
    """A widget key whose value survives pages that do not draw the widget (Streamlit drops those)."""
    if key not in st.session_state:
        st.session_state[key] = st.session_state.get(f"_saved_{key}", default)
    return key


def persisted(key: str) -> Any:
    """The widget's value now, saved for when the widget is next drawn (see ``persistent_key``)."""
    value = st.session_state[key]
    st.session_state[f"_saved_{key}"] = value
    return value


def smoothing_control(key_prefix: str, kind_col: Any, amount_col: Any) -> charts.Smoothing:
    """Smoothing kind (radio) in ``kind_col`` and its window or EMA weight (slider) in ``amount_col``."""
    kind_key = persistent_key(f"{key_prefix}_smoothing", "window")
    kind_col.radio("Smoothing", list(SMOOTHING_KINDS), format_func=SMOOTHING_KINDS.get, horizontal=True,
                   key=kind_key, help="Moving average of the last N logged steps, or TensorBoard's "
                                      "debiased exponential moving average.")
    if persisted(kind_key) == "ema":
        weight_key = persistent_key(f"{key_prefix}_ema", DEFAULT_EMA)
        amount_col.slider("EMA weight", 0.0, 0.99, step=0.01, key=weight_key, help="0 shows the raw loss.")
        return charts.Smoothing("ema", persisted(weight_key))
    window_key = persistent_key(f"{key_prefix}_window", DEFAULT_WINDOW)
    amount_col.slider("Window (logged steps)", 1, 200, key=window_key, help="1 shows the raw loss.")
    return charts.Smoothing("window", persisted(window_key))


def chart_controls(key_prefix: str, keys: Iterable[str] = ()) -> ChartOptions:
    """Compact chart controls in one row; widget keys start with ``key_prefix``. ``keys``: the other metric
    keys the run logged (not charted by its method), offered in an "Other metrics" picker.

    Call it outside an auto-refreshing fragment, or a click reruns only that fragment (both work).
    """
    axis_col, kind_col, amount_col, log_col = st.columns([2, 2, 3, 1.4], vertical_alignment="bottom")
    x_key = persistent_key(f"{key_prefix}_x", "step")
    axis_col.selectbox("X axis", list(charts.X_AXES), format_func=charts.X_AXES.get, key=x_key)
    smoothing = smoothing_control(key_prefix, kind_col, amount_col)
    log_key = persistent_key(f"{key_prefix}_log", False)
    log_col.toggle("Log y", key=log_key, help="Logarithmic loss axis (values <= 0 are left out).")
    return ChartOptions(x=persisted(x_key), smoothing=smoothing, log_scale=persisted(log_key),
                        extra=other_metrics_picker(key_prefix, keys))


def other_metrics_picker(key_prefix: str, keys: Iterable[str], label: str = "Other metrics") -> tuple[str, ...]:
    """A multiselect of metric keys to chart besides the default ones (nothing shown when there are none)."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return ()
    key = persistent_key(f"{key_prefix}_extra", [])
    st.session_state[key] = [k for k in st.session_state[key] if k in keys]  # a key this run never logged
    st.multiselect(label, keys, key=key, placeholder="Any other metric the run logged",
                   help="Each one is charted over the chosen x axis, downsampled like the charts above.")
    return tuple(persisted(key))


def render_charts(df: pd.DataFrame, options: ChartOptions | None = None, window: int | None = None,
                  specs: Iterable[Any] = charts.DEFAULT_SPECS) -> None:
    """Loss (raw points, smoothed line, eval overlay) plus a small chart per charted metric spec (grad norm,
    learning rate and tokens/s by default) and per other metric chosen in ``options.extra``.

    ``window`` is the older way to ask for a moving average; ``options`` wins when both are given.
    """
    if df is None or df.empty or "step" not in df:
        st.caption("No metrics logged yet.")
        return
    if options is None:
        options = ChartOptions(smoothing=charts.Smoothing("window", window or DEFAULT_WINDOW))
    built = charts.live_charts(df, x=options.x, smoothing=options.smoothing, log_scale=options.log_scale,
                               specs=specs, extra=options.extra)
    st.altair_chart(built.pop("loss"), theme="streamlit", width="stretch", height=charts.LOSS_HEIGHT)
    small = list(built.values())
    for start in range(0, len(small), SMALL_CHARTS_PER_ROW):
        row = small[start:start + SMALL_CHARTS_PER_ROW]
        for column, chart in zip(st.columns(len(row)), row):
            with column:
                st.altair_chart(chart, theme="streamlit", width="stretch", height=charts.LINE_HEIGHT)


def alert_badge(count: int) -> str:
    """``:red-badge[⚠️ 3 alerts]`` for headers and markdown cells; empty when there are none."""
    if not count:
        return ""
    return f":red-badge[⚠️ {count} alert{'s' if count != 1 else ''}]"


def _alert_line(alert: Any) -> str:
    return f"**{safe(ALERT_LABELS.get(alert.kind, alert.kind))}** · {safe(alert.message)}"  # the message names the step


def render_alerts(alerts: Iterable[Any]) -> None:
    """A red badge with the count and the latest alerts (``.kind``, ``.step``, ``.message`` each)."""
    alerts = list(alerts)
    if not alerts:
        return
    latest = alerts[-ALERTS_SHOWN:][::-1]
    lines = "\n".join(f"- {_alert_line(a)}" for a in latest)
    st.markdown(f"{alert_badge(len(alerts))} latest first\n\n{lines}")
    if len(alerts) > ALERTS_SHOWN:
        with st.expander(f"All {len(alerts)} alerts"):
            # Alert objects carry a step; stored "alert" events may not
            st.dataframe(pd.DataFrame([{"step": getattr(a, "step", None),
                                        "alert": ALERT_LABELS.get(a.kind, a.kind), "message": a.message}
                                       for a in alerts]), hide_index=True)


def render_resources(sample: ResourceSample | None) -> None:
    """CPU and RAM of the worker process tree, and each GPU's utilisation and memory."""
    if sample is None:
        st.caption("Resource usage: the worker process is not running.")
        return
    gpus = sample.gpus
    cols = st.columns(2 + 2 * len(gpus) if gpus else 3)
    cols[0].metric("Worker CPU", f"{sample.cpu_percent:.0f}%", border=True,
                   help="CPU of the worker and its child processes; 100% is one core.")
    cols[1].metric("Worker RAM", fmt.memory(sample.rss_mb), border=True)
    if not gpus:
        cols[2].metric("GPU", "no GPU", border=True, help="No NVIDIA GPU is visible (or nvidia-ml-py is missing).")
        return
    for i, gpu in enumerate(gpus):  # the run's GPUs only
        util = f"{gpu.utilization_pct:.0f}%" if gpu.utilization_pct is not None else "n/a"
        cols[2 + 2 * i].metric(f"GPU {gpu.index} util", util, border=True,
                               help=gpu.name if gpu.utilization_pct is not None else
                               f"{gpu.name}: NVML reports no utilisation for this device (MIG slice or virtual GPU)")
        run_part = f"this run: {fmt.memory(gpu.run_memory_mb)}" if gpu.run_memory_mb is not None else None
        cols[3 + 2 * i].metric(f"GPU {gpu.index} memory",
                               f"{fmt.memory(gpu.memory_used_mb)} / {fmt.memory(gpu.memory_total_mb)}",
                               delta=run_part, delta_color="off", border=True,
                               help=f"{gpu.name}: memory used by every process on the device"
                                    + (f"; {run_part} (its worker processes)" if run_part else ""))


def render_outcome(status: RunStatus, error: str, log_tail: str, output_dir: str) -> None:
    """What happened at the end: the error and log when failed, the output folder when saved."""
    from ui.server_paths import shown  # server paths as the viewer's role may see them (issue 31 #9)

    if status is RunStatus.FAILED:
        st.error(safe(shown(error)) if error else "The run failed without an error message; see the worker log.",
                 icon="❌")
        if log_tail:
            with st.expander("Worker log (last lines)", expanded=True):
                st.code(shown(log_tail), language="text")
    elif status in (RunStatus.COMPLETED, RunStatus.STOPPED):
        st.success(f"Saved to {code(shown(output_dir))}" if output_dir else "Finished.", icon=status.icon)
    elif status is RunStatus.CANCELLED:
        st.info("Cancelled: nothing was saved from this run.", icon=status.icon)


def render_live(snapshot: LiveSnapshot | None, options: ChartOptions | None = None, alerts: Iterable[Any] = (),
                resources: ResourceSample | None = None, specs: Iterable[Any] = charts.DEFAULT_SPECS,
                picker: str = "") -> None:
    """Everything the live view shows for one snapshot (alerts and resources when the caller has them);
    ``specs``: the run's method's metric specs (its charts and tiles); ``picker``: the widget-key prefix of an
    "Other metrics" picker above the charts, offering the snapshot's keys that no spec charts ("": none)."""
    if snapshot is None:
        st.info(NO_RUNS)
        return
    status = RunStatus(snapshot.status)
    st.markdown(f"### {safe(snapshot.name or snapshot.run_id)}")
    details = " · ".join(safe(p) for p in (snapshot.model, snapshot.dataset, snapshot.method,
                                           f"engine: {snapshot.engine}" if snapshot.engine else "") if p)
    phase = "" if status.is_terminal() else snapshot.phase  # rows finished by older versions kept "saving"
    st.markdown(status_markdown(status, phase) + (f"  \n{details}" if details else ""))
    label = f"step {snapshot.step:,} / {snapshot.total_steps:,}" if snapshot.total_steps else f"step {snapshot.step:,}"
    st.progress(snapshot.progress, text=label)
    render_alerts(alerts)
    render_metrics(snapshot, specs)
    if resources is not None:
        render_resources(resources)
    for message in snapshot.warnings:
        st.warning(safe(message), icon="⚠️")
    render_nonfinite(snapshot.metrics)
    render_outcome(status, snapshot.error, snapshot.log_tail, snapshot.output_dir)
    if picker:
        options = dataclasses.replace(options or ChartOptions(),
                                      extra=other_metrics_picker(picker, other_keys(snapshot.metric_keys, specs)))
    render_charts(snapshot.metrics, options, specs=specs)


def run_specs(config: dict) -> tuple[Any, ...]:
    """The metric specs of a run's method, from its stored config (its charts and tiles)."""
    return charts.method_specs(config)


def other_keys(keys: Iterable[str], specs: Iterable[Any] = charts.DEFAULT_SPECS) -> list[str]:
    """The logged metric keys a picker offers: those the method's specs do not chart already."""
    charted = {s.key for s in specs if s.chart} | set(charts.LOSS_KEYS)
    return [k for k in keys if k not in charted]
