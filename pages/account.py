"""Account: who you are, your API tokens for the CLI, and (admins) the users and their roles."""
from __future__ import annotations

import streamlit as st

from db import users
from trainer_core.access import Action, Role, allowed
from ui import format as fmt
from ui.auth import current_actor, shared_mode
from ui.entry import require_entrypoint
from ui.state import get_orchestrator
from ui.text import safe

require_entrypoint("pages/account.py")

store = get_orchestrator().store
actor = current_actor()
st.title("Account")
st.markdown(f"Signed in as **{safe(actor.name)}** · role **{actor.role.value}**")
if shared_mode():
    st.link_button("Sign out", "/auth/logout", icon="🚪")
else:
    st.caption("Local mode (`make run`): you are the OS user running the dashboard, with every right. "
               "Roles apply in the shared mode (`make share`).")
st.caption("Viewers watch runs; operators also start runs and stop, cancel, resume, reorder and delete their "
           "own; admins do everything and manage users.")

# ---------------------------------------------------------------------- API tokens
st.subheader("API tokens for the CLI")
st.caption("Set `FINETUNE_STUDIO_TOKEN` in the environment of `python -m trainer_core ...` and the CLI acts as "
           "you, with your role. Only a hash of each token is stored: it is shown once, when created.")
new_token = st.session_state.pop("account_new_token", None)
if new_token:
    st.success("Copy your new token now; it will not be shown again.", icon="🔑")
    st.code(new_token, language=None)
label_col, create_col = st.columns([4, 1], vertical_alignment="bottom")
label = label_col.text_input("Label", key="account_token_label", placeholder="e.g. laptop, CI", max_chars=100)
if create_col.button("Create token", icon="➕", width="stretch"):
    users.ensure_user(store, actor.name, actor.role)
    st.session_state["account_new_token"] = users.create_token(store, actor.name, label.strip())
    st.rerun()
tokens = users.tokens_of(store, actor.name)
if not tokens:
    st.caption("No tokens yet.")
for token in tokens:
    name_col, used_col, revoke_col = st.columns([3, 3, 1], vertical_alignment="center")
    name_col.markdown(f"`fts_{token.id}_…` {safe(token.label)}")
    used_col.caption(f"created {fmt.timestamp(token.created_at)} · last used {fmt.timestamp(token.last_used_at)}")
    if revoke_col.button("Revoke", key=f"revoke_{token.id}", icon="🗑️", width="stretch"):
        users.revoke_token(store, actor.name, token.id)
        st.rerun()

# ---------------------------------------------------------------------- users (admins)
if allowed(actor, Action.MANAGE_USERS):
    st.subheader("Users")
    st.caption("People appear here when they first sign in, with the default role "
               "(`FINETUNE_STUDIO_DEFAULT_ROLE`, viewer unless set); add someone ahead of time to choose theirs.")
    roles = [r.value for r in Role]
    for user in users.list_users(store):
        name_col, role_col = st.columns([4, 2], vertical_alignment="center")
        name_col.markdown(f"**{safe(user.name)}** · last seen {fmt.ago(user.last_seen_at)}")
        chosen = role_col.selectbox("Role", roles, index=roles.index(user.role), key=f"role_{user.name}",
                                    label_visibility="collapsed", disabled=user.name == actor.name,
                                    help="You cannot change your own role." if user.name == actor.name else None)
        if chosen != user.role:
            users.set_role(store, user.name, Role(chosen))
            st.toast(f"{safe(user.name)} is now {chosen}.")
    with st.form("account_add_user", clear_on_submit=True):
        add_col, role_col, go_col = st.columns([4, 2, 1], vertical_alignment="bottom")
        name = add_col.text_input("Add a user", placeholder="name or e-mail, as they sign in")
        role = role_col.selectbox("Role", roles, index=roles.index(Role.OPERATOR.value))
        if go_col.form_submit_button("Add", icon="➕") and name.strip():
            users.ensure_user(store, name.strip(), Role(role))
            users.set_role(store, name.strip(), Role(role))
            st.rerun()
