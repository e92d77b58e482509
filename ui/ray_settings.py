"""Settings' "Ray cluster" section: the clusters and the shared storage in force (the server's environment, and
what an admin saved here), "Check cluster" (nodes, capacity and the shared-storage probe), and for admins the
saved cluster: an address and a shared path, saved only once the real check passes (the cluster answers, and a
probe on every node writes and reads a file under the path), or cleared. The environment wins over the saved
path; a saved address is allowed for runs beside the environment's (config ``ray_address_problem``)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import streamlit as st

from db import settings_store
from trainer_core.auth.access import Action, Actor, Role, allowed
from trainer_core.config import RAY_ADDRESS_ENV, RAY_ADDRESSES_ENV, SHARED_STORAGE_ENV, FieldError
from trainer_core.launchers import ray as ray_jobs
from trainer_core.launchers import ray_settings
from trainer_core.protocol.cluster_settings import SavedCluster
from ui.ray_cluster import CHECK, HOW_TO, own_and_other_addresses, show_check
from ui.auth import current_actor
from ui.text import code, safe

SAVE_RESULT = "settings_ray_save_result"  # session key: the last Save's SaveOutcome (or "cleared")
LABELS = {ray_settings.ADDRESS: "Cluster address", ray_settings.SHARED: "Shared storage path"}


@dataclass(frozen=True)
class SaveOutcome:
    errors: tuple[FieldError, ...] = ()  # the fields' problems: nothing was asked
    check: ray_jobs.ClusterCheck | None = None  # the check that ran
    saved: SavedCluster | None = None  # what was saved (None: nothing was)
    refused: str = ""  # not an admin


def save(store, actor: Actor, address: str, shared: str) -> SaveOutcome:
    """Check the fields, then the cluster and the shared path on every node, and save only when all pass. Admins
    only (checked here too: a disabled button alone lets a crafted click through)."""
    if not allowed(actor, Action.MAINTAIN):
        return SaveOutcome(refused=f"Only an admin can save the Ray cluster; {actor.name}'s role is {actor.role.value}.")
    errors = ray_settings.field_errors(address, shared)
    if errors:
        return SaveOutcome(errors=tuple(errors))
    address, shared = ray_settings.normalized(address, shared)
    before = settings_store.read_cluster(store.engine).address
    held = ray_settings.runs_held_by(store, before) if before != address else ""
    if held:
        return SaveOutcome(refused=held)
    check = ray_settings.check_before_saving(address, shared)
    if check.problems:
        return SaveOutcome(check=check)
    return SaveOutcome(check=check, saved=settings_store.save_cluster(store, address, shared, actor.name))


def clear(store, actor: Actor) -> SaveOutcome | str:
    """Clear the saved cluster ("cleared"), unless a run on it is not over or ``actor`` is no admin."""
    if not allowed(actor, Action.MAINTAIN):
        return SaveOutcome(refused=f"Only an admin can clear the Ray cluster; {actor.name}'s role is "
                                   f"{actor.role.value}.")
    held = ray_settings.runs_held_by(store, settings_store.read_cluster(store.engine).address)
    if held:
        return SaveOutcome(refused=held)
    settings_store.clear_cluster(store)
    return "cleared"


def settings_section(store, actor: Actor, may_check: bool) -> None:
    """``store``: None when the database cannot be read (nothing saved can be shown or changed). ``may_check``:
    whether this person may run "Check cluster" (it submits a probe job: operators and admins)."""
    st.subheader("Ray cluster")
    saved = settings_store.read_cluster(store.engine) if store is not None else SavedCluster()
    addresses = ray_jobs.server_addresses()
    if addresses:
        in_force(addresses, saved)
        check_cluster(addresses, may_check)
    else:
        st.info("No Ray cluster is configured: runs go to this host. To run on a cluster, " + HOW_TO
                + ", or an admin saves one below.", icon="🛰️")
    saved_cluster(store, actor, saved)


def in_force(addresses: list[str], saved: SavedCluster) -> None:
    own, others = own_and_other_addresses(addresses)
    listed = [a for a in others if a != saved.address]
    shared, source = ray_jobs.shared_storage()
    shown = ray_jobs.shown_address  # never a user and password an address may carry
    lines = [f"Cluster address: {code(shown(own)) if own else 'not set'} (`{RAY_ADDRESS_ENV}`)"]
    if listed:
        lines.append(f"Also allowed for runs (`{RAY_ADDRESSES_ENV}`): " + ", ".join(code(shown(a)) for a in listed))
    if saved.address:
        lines.append(f"Saved in Settings, also allowed for runs: {code(saved.address)}" if own else
                     f"Saved in Settings, the server's cluster (runs without a cluster of their own, and eval, export "
                     f"and serve jobs on Ray, go there): {code(saved.address)}")
    folder = code if current_actor().role is Role.ADMIN else (lambda _: "set (admins see its path)")  # issue 31 #9
    if source == "Settings":
        lines.append(f"Shared storage: {folder(shared)} (saved in Settings; `{SHARED_STORAGE_ENV}` is not set)")
    else:
        lines.append(f"Shared storage: {folder(shared) if shared else 'not set'} (`{SHARED_STORAGE_ENV}`)"
                     + (f", in force: the saved {folder(saved.shared_storage)} applies only while it is unset"
                        if shared and saved.shared_storage and saved.shared_storage != shared else ""))
    st.markdown("  \n".join(lines))
    st.caption("The server's environment wins over what is saved here; to change it, " + HOW_TO + ".")


def check_cluster(addresses: list[str], may_check: bool) -> None:
    shown = ray_jobs.shown_address
    address = (st.selectbox("Cluster to check", addresses, key="settings_ray_address", format_func=shown)
               if len(addresses) > 1 else addresses[0])
    if not may_check:
        st.info("Only operators and admins can check the cluster (the check runs a probe job on it).", icon="🔒")
    if st.button("Check cluster", icon="🛰️", disabled=not may_check, key="settings_ray_check_button",
                 help="Asks the cluster for its nodes, then runs a probe job that writes a file under the shared "
                      "storage on every node and looks for each from this host."):
        with st.spinner(f"Checking the Ray cluster at {shown(address)}..."):
            st.session_state[CHECK] = ray_jobs.inspect_cluster(address)
    check: ray_jobs.ClusterCheck | None = st.session_state.get(CHECK)
    if check is not None and check.info.address == address:
        show_check(check)


def saved_cluster(store, actor: Actor, saved: SavedCluster) -> None:
    """The saved cluster: a form for admins, read-only for everyone else."""
    st.markdown("**Saved cluster**")
    if saved:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(saved.saved_at or 0))
        st.markdown(f"Address: {code(saved.address) if saved.address else 'none'}  \nShared storage: "
                    f"{code(saved.shared_storage) if saved.shared_storage else 'none'}  \n"
                    f"Saved by {safe(saved.saved_by) or 'unknown'} on {when}, after the check passed.")
    else:
        st.caption("Nothing saved: the server's environment alone says where runs may go.")
    if store is None:
        st.info("The database cannot be read, so the saved cluster cannot be shown or changed (see Database above).",
                icon="🔒")
        return
    if not allowed(actor, Action.MAINTAIN):
        st.info("Only an admin can save or clear the Ray cluster.", icon="🔒")
        return
    state = st.session_state
    state.setdefault("settings_ray_new_address", saved.address)
    state.setdefault("settings_ray_new_shared", saved.shared_storage or ray_jobs.shared_storage()[0])
    outcome = state.get(SAVE_RESULT)
    errors = {e.field: e.message for e in outcome.errors} if isinstance(outcome, SaveOutcome) else {}
    field("settings_ray_new_address", ray_settings.ADDRESS, errors, placeholder="http://head:8265",
          help="The cluster's dashboard (Ray Jobs) address, without a user and password (those stay in the "
               f"server's {RAY_ADDRESS_ENV}): it is stored in the database.")
    field("settings_ray_new_shared", ray_settings.SHARED, errors, placeholder="/mnt/shared",
          help="The path every node mounts, the same on this host; the data root (FINETUNE_STUDIO_HOME) must be "
               "under it, since run folders live there.")
    save_col, clear_col = st.columns(2)
    if save_col.button("Check and save", icon="💾", type="primary", key="settings_ray_save"):
        with st.spinner("Checking the cluster and the shared storage on every node..."):
            state[SAVE_RESULT] = save(store, actor, state["settings_ray_new_address"], state["settings_ray_new_shared"])
        st.rerun()
    if clear_col.button("Clear the saved cluster", icon="🗑️", disabled=not saved, key="settings_ray_clear"):
        state[SAVE_RESULT] = clear(store, actor)
        st.rerun()
    show_outcome(outcome)


def field(key: str, name: str, errors: dict[str, str], **options) -> None:
    st.text_input(LABELS[name], key=key, **options)
    if name in errors:
        st.error(f"{LABELS[name]}: {safe(errors[name])}")


def show_outcome(outcome: SaveOutcome | str | None) -> None:
    if outcome == "cleared":
        st.success("The saved cluster was cleared: the server's environment alone says where runs may go.", icon="✅")
    if not isinstance(outcome, SaveOutcome):
        return
    if outcome.refused:
        st.error(safe(outcome.refused), icon="🔒")
    elif outcome.errors:
        st.error("Nothing was saved: fix the fields above.", icon="💾")
    elif outcome.saved is not None:
        st.success(f"Saved: runs may use {safe(outcome.saved.address)}, with run folders under "
                   f"{safe(outcome.saved.shared_storage)}.", icon="✅")
    elif outcome.check is not None:
        st.error(f"Nothing was saved: {failed_check(outcome.check)}.", icon="💾")
    if outcome.check is not None:
        show_check(outcome.check)


def failed_check(check: ray_jobs.ClusterCheck) -> str:
    """Which of the two checks failed, in a few words (the problems themselves follow)."""
    if check.info.problem:
        return "the cluster check failed (it does not answer)"
    blind = [n for n in check.info.nodes if n.shared]
    if blind:
        return (f"the shared-storage check failed: {len(blind)} of {len(check.info.nodes)} node(s) cannot see "
                f"{safe(check.shared)}")
    return "the shared-storage check failed (the probe job did not complete)"
