"""The dashboard's screens, one module each with a `render(rt)` function; app.py routes to them.

Each module names its `PREFIX` (widget keys), `TITLE` and `ICON` (the sidebar navigation) and
`URL_PATH`. Pages read through components/ only (ruff's banned-api keeps the store, collector
and remote transports out of here: see pages/ruff.toml).
"""
