"""Playground: up to three model sources answer the same conversation side by side, streaming at once;
prompt sets run against them in one click; an image attached to a message is seen by the vision-language columns.
Its speech mode (ui/speech_playground.py) has speech-to-text models
transcribe one clip side by side; its text-to-speech mode (ui/tts_playground.py) has CSM models speak one text side
by side; its search mode (ui/embedding_playground.py) has embedding models rank passages. The logic lives in ui/playground.py; this page lays it out.

Answers come from a serve job (an OpenAI-compatible server in a worker process), started through the
orchestrator; while it is queued or loading, a fragment refreshes its state until it is ready.

Kept whole: a Streamlit page runs top to bottom: the chat mode's layout (models, the server panel, the conversation)
with the other modes delegated to ui/ modules.
"""
from __future__ import annotations

import dataclasses
import time

import streamlit as st

from trainer_core.tryout import chat_prompt
from trainer_core.config import promptsets
from trainer_core.specs import model_source
from trainer_core.kinds.base import SEARCH, SPEAK, TRANSCRIBE
from trainer_core.auth.access import Action, allowed
from trainer_core.config import ConfigError
from trainer_core.jobs.orchestrator import RunRefused
from trainer_core.specs.model_source import ModelSource, SourceError
from trainer_core.protocol.status import JobKind
from trainer_core.views.run_rules import run_labels
from trainer_core.serving.client import Sampling
from ui import playground as pg
from ui import tool_playground as tp
from ui import embedding_playground as embedding_mode
from ui import speech_playground as speech
from ui import tts_playground as tts_mode
from ui import votes as votes_ui
from ui.playground_server import server_panel
from ui.auth import current_actor
from ui.entry import require_entrypoint
from ui.state import get_orchestrator
from ui.server_paths import shown
from ui.text import safe

require_entrypoint("pages/playground.py")

K = "pg_"
SERVER, CONVO, BATCH, TABLE = K + "server", K + "turns", K + "batch", K + "table"
TOOLS_ON, TOOLS_TEXT = K + "tools_on", K + "tools_text"
IMAGE_N = K + "image_n"  # the image picker's generation: a new key empties it once its image is sent
IMAGE_WIDTH = 160
RUNS_LISTED = 200  # recent training runs read to find the ones offered as sources
POLL_S = 0.1  # how often streaming answers are redrawn
SET_POLL_S = 0.5  # a prompt-set table is redrawn whole: less often
JOB_CHECK_S = 1.0  # how often the serve job's status is read while answers stream

orch = get_orchestrator()
actor = current_actor()
st.title("Playground")


# ====================================================================== 1. models
def source_picker(i: int, runs: dict[str, object], labels: dict[str, str]) -> ModelSource | None:
    kind = st.selectbox("Model", ["base", "run"], key=f"{K}kind_{i}",
                        format_func=lambda k: "Base model" if k == "base" else "A training run",
                        index=0 if i == 0 or not runs else 1)
    if kind == "base":
        of = st.selectbox("Base of", ["", *runs], key=f"{K}base_{i}",
                          format_func=lambda r: f"the base of {labels[r]}" if r else "Bundled SmolLM2-135M-Instruct")
        try:
            return pg.base_source(of or None)
        except SourceError as exc:
            st.error(safe(shown(exc)), icon="🚫")
            return None
    if not runs:
        st.info("No completed or stopped training run yet: train one on New run, or pick a base model.")
        return None
    run_id = st.selectbox("Run", list(runs), key=f"{K}run_{i}", format_func=lambda r: labels[r])
    step = st.selectbox("Version", pg.versions(run_id), key=f"{K}step_{i}", format_func=pg.version_label)
    return ModelSource(run_id=run_id, checkpoint=step)


listed = orch.list_runs(limit=RUNS_LISTED, kinds=[JobKind.TRAIN])
modes = pg.run_modes(orch, listed)
mode = st.segmented_control("Try", ["Chat", "Speech to text", "Text to speech", "Search"], default="Chat",
                            key=K + "mode",
                            help="Speech to text: record or upload a clip and compare Whisper models' transcripts. "
                                 "Text to speech: a tts run and its base model speak your text side by side. "
                                 "Search: an embedding run and its base model rank passages for your query")
if mode == "Search":
    finders = pg.offered_runs(listed, modes, SEARCH)
    embedding_mode.render(orch, actor, allowed(actor, Action.START), finders, run_labels(finders))
    st.stop()
if mode == "Speech to text":
    spoken = pg.offered_runs(listed, modes, TRANSCRIBE)
    speech.render(orch, actor, allowed(actor, Action.START), spoken, run_labels(spoken))
    st.stop()
if mode == "Text to speech":
    speakers = pg.offered_runs(listed, modes, SPEAK)
    tts_mode.render(orch, actor, allowed(actor, Action.START), speakers, run_labels(speakers))
    st.stop()

st.subheader("Models")
offered = pg.offered_runs(listed, modes)
run_names = run_labels(offered)
runs_by_id = {r.id: r for r in offered}
count = st.radio("Side by side", [1, 2, 3], index=1 if offered else 0, key=K + "count", horizontal=True)
picked = []
for i, col in enumerate(st.columns(count)):
    with col:
        picked.append(source_picker(i, runs_by_id, run_names))
columns, problems = pg.check_sources(picked)
for problem in problems:
    st.error(safe(shown(problem)), icon="🚫")

server = st.session_state.get(SERVER)  # {"job", "key", "columns"} of this session's server
batch_info = st.session_state.get(BATCH)  # {"kind": "chat"|"set", "batch": Batch, ...} while answers come in
busy = batch_info is not None
wanted_keys = [c.key for c in columns]
loaded_keys = [c.key for c in server["columns"]] if server else []
may_start = allowed(actor, Action.START)
load_help = ("Start a model server for these models (it queues while a run trains on the device)" if may_start
             else f"Loading models starts a job: you are {actor.role.value}; an operator or admin can")
if st.button("Load models", icon="▶️", type="primary", help=load_help,
             disabled=bool(problems) or None in picked or not may_start or busy
             or (server is not None and wanted_keys == loaded_keys and pg.job_alive(orch, server["job"]))):
    sources = [ModelSource.from_key(c.key) for c in columns]
    try:
        job_id = orch.find_server(sources, actor)  # the same models already up (another tab): reuse them
        api_key = orch.server_key(job_id) if job_id else None
        if job_id is None or api_key is None:
            if server and pg.job_alive(orch, server["job"]):
                # Other models are loaded: end that server first, else the new one would queue behind it.
                orch.stop(server["job"], actor=actor)
            job_id, api_key = orch.start_server(sources, actor=actor, purpose="playground")
    except ConfigError as exc:
        for error in exc.errors:
            st.error(f"**{safe(error.field)}**: {safe(shown(error.message))}", icon="🚫")
    except (SourceError, RunRefused) as exc:
        st.error(safe(shown(exc)), icon="🚫")
    else:
        server = st.session_state[SERVER] = {"job": job_id, "key": api_key, "columns": columns}
        st.session_state.pop(TABLE, None)
if server and wanted_keys != [c.key for c in server["columns"]] and not problems:
    st.info("The models picked above are not the ones loaded: press Load models to switch.", icon="🔄")


if not may_start:  # chatting starts a job; prompt sets and the conversation are writes too
    st.info("Viewers cannot load models (it starts a job on the device); an admin can make you an operator "
            "on the Account page.", icon="👀")
    st.stop()
if server is None:
    st.info("Pick the models to compare, then press Load models.", icon="👆")
    st.stop()
state = pg.server_state(orch, server["job"])


def finish(info: dict, answers: list[dict[str, pg.Answer]]) -> None:
    """Keep what a batch produced (a chat turn, or the prompt-set table) and forget the batch."""
    if info["kind"] == "chat":
        st.session_state.setdefault(CONVO, []).append(pg.Turn(info["user"], answers[0], info["system"],
                                                              info["sampling"], info.get("image")))
    elif info["kind"] == "tools":  # one column's answer went on after the person's tool results
        st.session_state[CONVO][-1].answers[info["key"]] = answers[0][info["key"]]
    else:
        st.session_state[TABLE] = pg.prompt_set_table(info["prompts"], info["columns"], answers)
    del st.session_state[BATCH]


server_panel(orch, server["job"], state.phase)  # ready: the chat appears below
if busy and not state.ready:  # the server went away while answers came in (another tab, a reload)
    batch_info["batch"].abandon(state.message)
    finish(batch_info, batch_info["batch"].answers())
if not state.ready:
    st.stop()
loaded = [dataclasses.replace(c, model=state.models.get(c.key, "")) for c in server["columns"]]
missing = [c.label for c in loaded if not c.model]
if missing:
    st.error(safe(f"The server does not serve {', '.join(missing)}: press Load models again."), icon="🛑")
    st.stop()

# ====================================================================== 2. settings
with st.expander("System prompt and sampling", icon="⚙️"):
    system = st.text_area("System prompt", key=K + "system", placeholder="(none)")
    row1, row2 = st.columns(4), st.columns(4)
    sampling = Sampling(
        temperature=row1[0].number_input("Temperature", value=0.7, step=0.1, key=K + "temperature",
                                         help="0 = greedy: always the most likely token (top p/k/min p do nothing)"),
        top_p=row1[1].number_input("Top p", value=0.95, step=0.05, key=K + "top_p"),
        top_k=int(row1[2].number_input("Top k", value=0, step=1, key=K + "top_k", help="0 = off")),
        min_p=row1[3].number_input("Min p", value=0.0, step=0.01, key=K + "min_p", help="0 = off"),
        repetition_penalty=row2[0].number_input("Repetition penalty", value=1.0, step=0.05, key=K + "rep"),
        max_new_tokens=int(row2[1].number_input("Max new tokens", value=256, step=32, key=K + "max_new")),
        seed=None if row2[3].checkbox("Random seed", key=K + "random_seed") else
        int(row2[2].number_input("Seed", value=0, step=1, key=K + "seed")),
    )

with st.expander("Tools", icon="🛠️", expanded=bool(st.session_state.get(TOOLS_ON))):
    offer_tools = st.toggle("Offer tools to the models", key=TOOLS_ON,
                            help="Sent as the request's tools: a model that calls one shows its call and arguments, "
                                 "and goes on once each call has a result (a mock reply, a Python function, or "
                                 "yours)")
    if TOOLS_TEXT not in st.session_state:  # prefilled once from the first run's training data, when it lists tools
        first_run = next((src.run_id for c in loaded if (src := ModelSource.from_key(c.key)).run_id), None)
        st.session_state[TOOLS_TEXT] = tp.tools_text(tp.dataset_tools(first_run) if first_run else [])
    offered_tools, tool_errors = tp.parse_tools(st.text_area(
        "Tool schemas (JSON)", key=TOOLS_TEXT, height=220,
        help='A list of OpenAI tools: [{"type": "function", "function": {"name", "description", "parameters": '
             '<JSON Schema>}}]'))
    mocks, wanted = {}, {}
    for tool in offered_tools:  # each call answered by a mock reply, a Python function, or (neither) the person
        name = tool["function"]["name"]
        reply, python, function = st.columns([2, 2, 1])
        mocks[name] = reply.text_input(f"Mock reply of {safe(name)}", key=f"{K}mock_{name}",
                                       placeholder="(empty: you answer each call to it)")
        wanted[name] = (python.text_input(
            f"Or a Python file for {safe(name)}", key=f"{K}pyfile_{name}", placeholder="(admins: tools/weather.py)",
            help="A .py file under the allowed roots whose function answers each call (its arguments as keyword "
                 "arguments; it returns the result). Admins only on a shared server. It runs in a sandboxed child "
                 "process with a time limit (FINETUNE_STUDIO_TOOL_TIMEOUT_S, 30 s): an error or a hang is the "
                 "model's result, and shown here"),
            function.text_input("Function", key=f"{K}pyfn_{name}", placeholder=name))
    functions, python_errors = tp.python_setup(actor, wanted, mocks) if offer_tools else ({}, [])
tool_setup = tp.ToolSetup(offered_tools, mocks, functions) if offer_tools else tp.ToolSetup()
setting_errors = sampling.validate() + pg.check_message(system, "system prompt") + \
    (tool_errors + python_errors if offer_tools else [])
for error in setting_errors:
    st.error(f"**{safe(error.field)}**: {safe(shown(error.message))}", icon="🚫")

placeholders: dict[str, object] = {}


def stop_batch() -> None:
    info = st.session_state.get(BATCH)
    if info:
        info["batch"].stop()


def tool_steps(answer: pg.Answer) -> None:
    """The answer's tool rounds: its words, each call with its arguments and each result, as code (model output and
    results are untrusted: never markup)."""
    for step in answer.steps:
        if step.content:
            st.markdown(safe(step.content))
        for i, call in enumerate(step.calls):
            st.caption("🛠️ Tool call")
            st.code(tp.call_text(call), language=None, wrap_lines=True)
            if step.results is not None:
                by = step.replied_by[i] if step.replied_by else tp.PERSON
                st.caption("↩️ Result" + ("" if by == tp.PERSON else " (mock reply)" if by == tp.MOCK else
                                         f" of {safe(shown(by, actor))}"))
                st.code(step.results[i], language=None, wrap_lines=True)
                if step.errors and step.errors[i]:
                    st.error(safe(shown(step.errors[i], actor)), icon="🛠️")


def results_form(column: pg.Column, answer: pg.Answer) -> None:
    """The calls waiting for the person: a result box each, and Send results (the model then goes on)."""
    calls = answer.steps[-1].calls
    results = [st.text_area(f"Result of call {i} ({safe(call['function']['name'])})",
                            key=f"{K}result_{column.key}_{len(answer.steps)}_{i}") for i, call in enumerate(calls, 1)]
    if st.button("Send results", icon="↩️", key=f"{K}send_{column.key}_{len(answer.steps)}", disabled=busy):
        errors = tp.check_results(results)
        for error in errors:
            st.error(f"**{safe(error.field)}**: {safe(error.message)}", icon="🚫")
        if not errors:
            turn = turns[-1]
            batch = pg.answer_tools(state.url, server["key"], column, turn.system, turns, results,
                                    turn.sampling or sampling, tool_setup)
            st.session_state[BATCH] = {"kind": "tools", "key": column.key, "batch": batch}
            st.rerun()


def answer_block(answer: pg.Answer) -> None:
    """One answer as text (model output is untrusted: escaped), its stats, and why it is incomplete."""
    tool_steps(answer)
    if answer.text:
        st.markdown(safe(answer.text))
    elif answer.status == pg.DONE:
        st.caption("(an empty answer)")
    if answer.stats:
        st.caption(pg.stats_line(answer))
    if answer.status == pg.INTERRUPTED:
        st.warning(safe(shown(f"Interrupted: {answer.error}")), icon="✂️")
    elif answer.status == pg.FAILED:
        st.error(safe(shown(answer.error)), icon="🛑")
    elif answer.status == pg.STOPPED:
        st.caption(safe(f"Stopped: {answer.error}") if answer.error else "Stopped.")
    elif answer.status == pg.CALLING:
        st.caption("Waiting for the tool results.")


def draw_answers(target, answers: dict[str, pg.Answer], streaming: bool = False, image: bool = False,
                 n: int | None = None) -> None:
    """The answers side by side; for a finished turn ``n``, 👍 / 👎 / ✏️ under each one (ui/votes.py)."""
    with target.container():
        for col, c in zip(st.columns(len(loaded)), loaded):
            with col:
                answer = answers.get(c.key)
                if answer is None:
                    st.caption("(not asked: this model was loaded later)")
                    continue
                if image and not c.vision:
                    st.caption("(text only: this model did not see the image)")
                if streaming and answer.status == pg.STREAMING:
                    tool_steps(answer)
                    st.markdown(safe(answer.text) + " ▌" if answer.text else "▌")
                else:
                    answer_block(answer)
                    if n is not None and n == len(turns) - 1 and answer.status == pg.CALLING:
                        results_form(c, answer)
                    elif n is not None:
                        votes_ui.render_answer_votes(feedback, actor, turns, n, c)


def user_message(text: str, image: pg.Attachment | None) -> None:
    st.markdown(safe(text))
    if image is not None:
        st.image(image.data, width=IMAGE_WIDTH)
        st.caption(safe(image.name))


def add_to_set(n: int, text: str) -> None:
    with st.popover("Add to prompt set", icon="➕"):
        names = promptsets.names()
        name = st.selectbox("Prompt set", [*names, ""], key=f"{K}addset_{n}",
                            format_func=lambda s: s or "a new set…")
        if not name:
            name = st.text_input("New set name", key=f"{K}addnew_{n}")
        if st.button("Add", key=f"{K}add_{n}"):
            try:
                promptsets.add_prompt(name, text)
            except promptsets.PromptSetError as exc:
                st.error(safe(shown(exc)), icon="🚫")
            else:
                st.success(safe(f"Added to '{name}'"), icon="✅")


# ====================================================================== 3. chat
st.subheader("Chat")
header = st.columns(len(loaded))
for col, c in zip(header, loaded):
    col.markdown(f"**{safe(c.label)}**")
turns: list[pg.Turn] = st.session_state.setdefault(CONVO, [])
feedback = votes_ui.feedback_for(orch)


def going_on(info: dict) -> dict[str, pg.Answer]:
    """The last turn's answers with the one going on after its tool results, as it streams."""
    return {**turns[-1].answers, info["key"]: info["batch"].answers()[0][info["key"]]}


for n, turn in enumerate(turns):
    with st.chat_message("user"):
        user_message(turn.user, turn.image)
        add_to_set(n, turn.user)
    if busy and batch_info["kind"] == "tools" and n == len(turns) - 1:
        placeholders["chat"] = st.empty()
        draw_answers(placeholders["chat"], going_on(batch_info), streaming=True, image=turn.image is not None)
        continue
    draw_answers(st.empty(), turn.answers, image=turn.image is not None, n=n)
    votes_ui.render_turn(feedback, actor, turns, n, loaded)
if busy and batch_info["kind"] == "chat":
    with st.chat_message("user"):
        user_message(batch_info["user"], batch_info.get("image"))
    placeholders["chat"] = st.empty()
    draw_answers(placeholders["chat"], batch_info["batch"].answers()[0], streaming=True,
                 image=batch_info.get("image") is not None)
if busy:
    st.button("Stop", icon="⏹️", key=K + "stop", on_click=stop_batch, help="Stop every answer now")

tools = st.columns([1, 1, 1, 3])
if tools[0].button("New conversation", icon="🧹", disabled=busy or not turns):
    st.session_state[CONVO] = []
    st.session_state.pop(votes_ui.MINE, None)  # its turn numbers start again
    st.rerun()
tools[1].download_button("Download JSONL", pg.conversation_jsonl(turns), icon="⬇️",
                         file_name="conversation.jsonl", mime="application/jsonl", disabled=not turns)
if tools[2].toggle("Show prompt", key=K + "show_prompt", disabled=not turns,
                   help="The last question as each model read it: rendered with the chat template used for training"):
    for col, c in zip(st.columns(len(loaded)), loaded):
        with col:
            try:
                with st.spinner("Loading the tokenizer…"):
                    rendered = chat_prompt.render(model_source.resolve(ModelSource.from_key(c.key)),
                                                  pg.messages_for(system, turns[:-1], c.key, turns[-1].user))
            except (SourceError, chat_prompt.PromptRenderError) as exc:
                st.error(safe(shown(exc)), icon="🚫")
            else:
                st.caption(safe(f"{rendered.tokens:,} tokens · {rendered.tokenizer}"))
                st.code(rendered.text, language=None, wrap_lines=True)

seeing = [c.label for c in loaded if c.vision]
upload = None
if seeing:
    upload = st.file_uploader(
        "Image for the next message", type=list(pg.IMAGE_TYPES), disabled=busy,
        key=f"{K}image_{st.session_state.get(IMAGE_N, 0)}",
        help=f"Seen by {', '.join(seeing)}; the other models get the text alone. Sent inside the request (a data: "
             "URL), never as a link")
user_text = st.chat_input("Ask every model…", disabled=busy or bool(setting_errors), key=K + "input")
if user_text:
    message_errors = pg.check_message(user_text)
    image = None
    if upload is not None and not message_errors:
        image, message_errors = pg.check_image(upload.name, upload.getvalue(), turns)
    for error in message_errors:
        st.error(f"**{safe(error.field)}**: {safe(shown(error.message))}", icon="🚫")
    if not message_errors:
        batch = pg.chat_batch(state.url, server["key"], loaded, system, turns, user_text, sampling, image, tool_setup)
        st.session_state[BATCH] = {"kind": "chat", "user": user_text, "system": system, "sampling": sampling,
                                   "image": image, "batch": batch}
        if image is not None:
            st.session_state[IMAGE_N] = st.session_state.get(IMAGE_N, 0) + 1
        st.rerun()

# ====================================================================== 4. prompt sets
st.subheader("Prompt sets")
set_names = promptsets.names()
pick = st.selectbox("Prompt set", set_names, key=K + "set")
try:
    chosen_set = promptsets.load(pick) if pick else None
except promptsets.PromptSetError as exc:
    st.error(safe(shown(exc)), icon="🚫")
    chosen_set = None
if chosen_set:
    st.caption(safe(f"{len(chosen_set.prompts)} prompts" + (" (built in)" if chosen_set.builtin else "")))
greedy = st.checkbox("Greedy (temperature 0)", value=True, key=K + "greedy",
                     help="Off: the sampling settings above")
if st.button("Run the set on every model", icon="▶️", disabled=busy or not chosen_set or bool(setting_errors)):
    run_sampling = dataclasses.replace(sampling, temperature=0.0) if greedy else sampling
    st.session_state[BATCH] = {"kind": "set", "prompts": chosen_set.prompts, "columns": loaded,
                               "batch": pg.prompt_set_batch(state.url, server["key"], loaded, system,
                                                            chosen_set.prompts, run_sampling)}
    st.rerun()
placeholders["set"] = st.empty()
table = st.session_state.get(TABLE)
if busy and batch_info["kind"] == "set":
    placeholders["set"].dataframe(pg.prompt_set_table(batch_info["prompts"], loaded, batch_info["batch"].answers()))
elif table is not None:
    placeholders["set"].dataframe(table, hide_index=True)
    st.download_button("Download CSV", table.to_csv(index=False), file_name="prompt-set.csv", mime="text/csv",
                       icon="⬇️")

with st.expander("Edit prompt sets", icon="📝"):
    saved = pg.saved_set_names()
    edit = st.selectbox("Set", ["", *saved], key=K + "edit_pick", format_func=lambda s: s or "a new set…")
    try:
        current = promptsets.load(edit).prompts if edit else ()
    except promptsets.PromptSetError as exc:  # a hand-edited file: say so; saving replaces it, Delete removes it
        st.error(safe(shown(exc)), icon="🚫")
        current = ()
    name = st.text_input("Name", value=edit, key=f"{K}edit_name_{edit}")
    prompts_text = st.text_area("Prompts, one per line", value="\n".join(current), key=f"{K}edit_prompts_{edit}")
    save_col, delete_col, _ = st.columns([1, 1, 4])
    if save_col.button("Save set", icon="💾"):
        try:
            promptsets.save(name, prompts_text.splitlines())
        except promptsets.PromptSetError as exc:
            st.error(f"**{safe(exc.field)}**: {safe(shown(exc))}", icon="🚫")
        else:
            st.session_state[K + "edited"] = f"Saved '{name.strip()}'"
            st.rerun()  # the pickers above list the new set
    if edit and delete_col.button("Delete set", icon="🗑️"):
        promptsets.delete(edit)
        st.session_state[K + "edited"] = f"Deleted '{edit}'"
        st.rerun()
    if K + "edited" in st.session_state:
        st.success(safe(st.session_state.pop(K + "edited")), icon="✅")


# ====================================================================== streaming
def follow(info: dict) -> None:
    """Redraw the answers as they stream in until every column is done; stop them if the server job ends."""
    batch: pg.Batch = info["batch"]
    checked = time.monotonic()
    while not batch.done():
        if time.monotonic() - checked > JOB_CHECK_S:
            checked = time.monotonic()
            if not pg.job_alive(orch, server["job"]):
                batch.abandon(pg.server_state(orch, server["job"]).message)
                break
        if info["kind"] == "chat":
            draw_answers(placeholders["chat"], batch.answers()[0], streaming=True)
        elif info["kind"] == "tools":
            draw_answers(placeholders["chat"], going_on(info), streaming=True)
        else:
            placeholders["set"].dataframe(pg.prompt_set_table(info["prompts"], loaded, batch.answers()))
        time.sleep(SET_POLL_S if info["kind"] == "set" else POLL_S)
    finish(info, batch.answers())
    st.rerun()


if busy:
    follow(batch_info)
