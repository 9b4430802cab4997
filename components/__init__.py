"""Streamlit-facing pieces of the dashboard: page setup, cached loaders, cards, plotly figures.

Pages import from here; the core (runhealth/) never imports this package.
"""
