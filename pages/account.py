"""Account: who you are, your API tokens for the CLI, and (admins) the users and their roles."""
from __future__ import annotations

import streamlit as st

from db import users
from trainer_core.auth.access import Action, Role, allowed
from ui import format as fmt
from ui.auth import current_actor, shared_mode, signed_in
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
# Every change is a click on a button that carries the role it was shown next to: a click from an older
# tab (or after another admin's change) is refused instead of re-applying what that tab once displayed.
_NOTICE = "account_users_notice"


def _still_admin() -> bool:
    """Checked again when a click arrives: callbacks run before the page (and its gate) does."""
    return signed_in() and allowed(current_actor(), Action.MANAGE_USERS)


def _change_role(name: str, shown: str, role: str) -> None:
    if not _still_admin():
        st.session_state[_NOTICE] = ("warning", "Only an admin can change roles.")
        return
    try:
        users.set_role(store, name, Role(role), expected=Role(shown))
    except users.RoleChanged as exc:
        st.session_state[_NOTICE] = ("warning", str(exc))
        return
    except KeyError:
        st.session_state[_NOTICE] = ("warning", f"{name} was removed meanwhile; nothing was changed.")
        return
    lower = list(Role).index(Role(role)) < list(Role).index(Role(shown))
    st.session_state[_NOTICE] = ("success", f"{name} was {shown} and is now {role}."
                                 + (" Their sessions and API tokens ended." if lower else ""))


def _remove_user(name: str) -> None:
    if not _still_admin():
        st.session_state[_NOTICE] = ("warning", "Only an admin can remove users.")
        return
    removed = users.delete_user(store, name)
    st.session_state[_NOTICE] = ("success", f"{name} was removed: their sessions and API tokens ended. Signing in "
                                 "again makes them a new user with the default role.") if removed else \
        ("warning", f"{name} was already removed.")


if allowed(actor, Action.MANAGE_USERS):
    st.subheader("Users")
    st.caption("People appear here when they first sign in, with the default role "
               "(`FINETUNE_STUDIO_DEFAULT_ROLE`, viewer unless set); add someone ahead of time to choose theirs. "
               "A lower role or removal ends that person's sessions and API tokens at once.")
    notice = st.session_state.pop(_NOTICE, None)
    if notice:
        (st.success if notice[0] == "success" else st.warning)(safe(notice[1]))
    for user in users.list_users(store):
        name_col, role_col, *action_cols = st.columns([3, 1, 1.3, 1.3, 1], vertical_alignment="center")
        name_col.markdown(f"**{safe(user.name)}** · last seen {fmt.ago(user.last_seen_at)}")
        role_col.markdown(f"**{user.role}**")
        if user.name == actor.name:
            action_cols[0].caption("you: another admin can change your role")
            continue
        others = [r.value for r in Role if r.value != user.role]
        for col, role in zip(action_cols, others):
            col.button(f"Make {role}", key=f"role_{user.name}_{role}", width="stretch",
                       on_click=_change_role, args=(user.name, user.role, role))
        action_cols[-1].button("Remove", key=f"remove_{user.name}", icon="🗑️", width="stretch",
                               on_click=_remove_user, args=(user.name,))
    with st.form("account_add_user", clear_on_submit=True):
        add_col, role_col, go_col = st.columns([4, 2, 1], vertical_alignment="bottom")
        name = add_col.text_input("Add a user", placeholder="name or e-mail, as they sign in").strip()
        role = role_col.selectbox("Role", [r.value for r in Role], index=list(Role).index(Role.OPERATOR))
        if go_col.form_submit_button("Add", icon="➕") and name:
            existing = users.get_user(store, name)
            if name == actor.name:
                st.session_state[_NOTICE] = ("warning", "You cannot change your own role; another admin can.")
            elif existing is None:
                users.ensure_user(store, name, Role(role))
                st.session_state[_NOTICE] = ("success", f"{name} was added as {role}.")
            elif existing.role == role:
                st.session_state[_NOTICE] = ("success", f"{name} is already {role}.")
            else:  # an explicit request about this user: applied to the role just read, or refused
                _change_role(name, existing.role, role)
            st.rerun()
