"""Pure analysis of what the collector stored: numbers computed, never fetched.

Modules by job:

- `stats`: exact completion-length statistics over count tables (`LengthHist`, `summarize`).
- `whatif`: what raising max_tokens would buy (censored-tail extrapolation, back-tested);
  `tailfit` and `numeric` hold its fits and numerical helpers.
- `eta`: time to finish the run now and with the what-if's extra tokens.
- `compare`: two runs side by side (shares, percentiles, the forecast against the outcome).
- `loops`: repetition-loop scoring of sampled completion text.
- `rates`: throughput and ETA from successive polls (node clocks cancel out).
- `servermetrics`: SGLang / vLLM Prometheus text interpreted into the values the store keeps.
- `lengthtime`: completion lengths per hour over the whole run (percentiles, share at the ceiling).
- `continuation`: OpenAI Batch requests that continue truncated completions.

Nothing here imports streamlit or plotly; only `lengthtime` reads and writes the store.
"""
