"""Training step time with simulated accelerators, text and VLM workloads."""
