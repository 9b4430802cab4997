"""runhealth: is a large LLM generation run healthy — fast, and producing good data?

The core package: configuration, the node agent and its transports, the collector and its
SQLite store, and the analytics behind the dashboard. It never imports Streamlit or plotly.
"""

__version__ = "0.1.0"
