"""Who may see which run: every run's `allowed_users`, checked for every run a page shows.

A run with no `allowed_users` is open to whoever reaches the dashboard; a run with a list is
shown only to a signed-in viewer (Streamlit's OIDC login, `[auth]` in .streamlit/secrets.toml)
whose e-mail is on it. Without `[auth]` nobody can sign in, so a restricted run is shown to no
one (fail closed). `restrict(rt)` runs before the run picker: the runtime a page gets holds only
the runs its viewer may see, so the picker, `?run=`, the Compare page's two choices, the
continuation download and "Re-sample" (which act on the picked run) all follow the same rule.
A run retired from the config (its store found beside the others') keeps the allow-list its
collector recorded in the store; one whose store records none (written before the rule was kept
there) is shown to no one, and the sidebar says how to open it (add it back to the config).
"""

from __future__ import annotations

import dataclasses

import streamlit as st

from components import context
from components.format import md_escape

NO_AUTH_TEXT = (
    "sets allowed_users, but no [auth] section is configured in .streamlit/secrets.toml, "
    "so no one can sign in: refusing to show the run."
)
UNKNOWN_RULE_TEXT = (
    "found beside the configured stores, but {its} store does not record who may see {it} (written before"
    " runhealth kept allowed_users in the store), so {it} is shown to no one. To show {it}, add {it} back to"
    " the config as a finished run: a [[runs]] table with its name, finished = true, store_path and"
    " allowed_users (empty for everyone)."
)


def unknown_rule_text(count: int) -> str:
    """Why `count` retired runs are hidden whatever the viewer, and how to open them."""
    if count == 1:
        return "1 run was " + UNKNOWN_RULE_TEXT.format(its="its", it="it")
    return f"{count} runs were " + UNKNOWN_RULE_TEXT.format(its="their", it="them")


@dataclasses.dataclass(frozen=True)
class Viewer:
    """The person asking: whether sign-in exists at all, whether they signed in, and as whom."""

    auth_configured: bool
    logged_in: bool = False
    email: str | None = None


def may_see(allowed_users: list[str], viewer: Viewer) -> bool:
    """True when `viewer` may see a run whose allow-list is `allowed_users` (empty: everyone)."""
    if not allowed_users:
        return True
    return viewer.auth_configured and viewer.logged_in and viewer.email in allowed_users


def visible_runs(runs: list[context.RunHandle], viewer: Viewer) -> list[context.RunHandle]:
    """The runs `viewer` may see, in their configured order."""
    return [h for h in runs if h.access_known and may_see(h.config.allowed_users, viewer)]


def auth_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # no secrets file at all
        return False


def current_viewer() -> Viewer:
    configured = auth_configured()
    if not configured:
        return Viewer(False)
    logged_in = bool(st.user.get("is_logged_in", False))
    email = st.user.get("email") if logged_in else None
    return Viewer(True, logged_in, str(email) if email else None)


def restrict(rt: context.Runtime, viewer: Viewer | None = None) -> context.Runtime:
    """`rt` with only the runs `viewer` (default: this session's) may see; the page shown is the
    first of them when the default run is hidden. Stops the page, saying why, when none is left."""
    viewer = viewer or current_viewer()
    runs = rt.runs or []
    if rt.config is not None and not runs:  # a runtime built without handles: its one run
        runs = [context.RunHandle(rt.config, rt.store)] if rt.store is not None else []
    shown = visible_runs(runs, viewer)
    unknown = sum(1 for h in runs if not h.access_known)
    hidden = len(runs) - len(shown) - unknown  # those a sign-in may open
    if unknown and unknown < len(runs):  # (all of them: refuse() says it on the page)
        with st.sidebar:
            st.caption(md_escape(unknown_rule_text(unknown)))
    if not shown:
        refuse(runs, viewer)
    if hidden and viewer.auth_configured and not viewer.logged_in:
        with st.sidebar:
            st.caption(f"{hidden} more run{'s' if hidden != 1 else ''} need{'s' if hidden == 1 else ''} a sign-in.")
            st.button("Log in", on_click=st.login, key="access_sidebar_login")
    if not hidden and not unknown:
        return rt
    first = next((h for h in shown if rt.config is not None and h.config.name == rt.config.name), shown[0])
    return dataclasses.replace(rt, runs=shown, config=first.config, store=first.store, collector=first.collector)


def refuse(runs: list[context.RunHandle], viewer: Viewer) -> None:
    """The page when the viewer may see none of the runs: why, and a way in where there is one."""
    unknown = sum(1 for h in runs if not h.access_known)
    if runs and unknown == len(runs):
        st.error(md_escape(unknown_rule_text(unknown)))
    elif not viewer.auth_configured:
        # Fail closed: an allow-list nobody can be checked against must not mean "everyone".
        what = "This run" if len(runs) == 1 else "Every run here"
        st.error(f"{what} {NO_AUTH_TEXT}")
    elif not viewer.logged_in:
        st.info("This run's dashboard is restricted. Sign in to continue.")
        st.button("Log in", on_click=st.login, key="page_login_button")
    else:
        st.error(md_escape(f"{viewer.email} is not in the allowed_users of any run on this dashboard."))
    st.stop()
