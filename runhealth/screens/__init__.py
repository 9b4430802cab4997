"""Screen models: each screen's numbers as one typed record, read from the store at one instant.

`overview.overview(store, config, now)` is the Overview (tiles, banner, progress, node states,
GPU strip, throughput series); `nodes`, `gpus`, `lengths`, `samples` and `compare` are the Nodes,
GPUs, Output lengths, Samples and Compare pages' models, each read at one instant. A
page (pages/*.py) only lays its model out; the headline download and `runhealth status --json`
print the same record, so the tile, the export and the CLI cannot disagree.
"""
