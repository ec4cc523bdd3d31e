"""Scaling driven by lag and alerts, shared by `keyrange run` (local/) and the operator (operator/).

- `rules`: the Prometheus alerting rules of one StreamConsumer, rendered from its spec;
- `tracker`: Alertmanager notifications -> at most one scale request per alert episode (pure);
- `receiver`: the Alertmanager webhook receiver, which hands those requests to a scale target;
- `scrape`: reading the workers' /metrics (lag per slot, the live table's figures).

Nothing here imports `local` or `operator`: both build on it.
"""
