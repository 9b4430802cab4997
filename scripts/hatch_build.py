"""Wheel build hook: put app.py beside pages/ and components/ in runhealth/_app/.

hatchling's `sources` remaps folders but not single files, and a plain `force-include` would
also copy app.py into site-packages for editable installs, where the checkout's own app.py is
the one that runs. So the mapping is added here, for regular (non-editable) wheels only.
"""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class AppScriptHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if version == "standard":
            build_data["force_include"]["app.py"] = "runhealth/_app/app.py"
