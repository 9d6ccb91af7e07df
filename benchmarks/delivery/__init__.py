"""What a trainer receives: throughput and memory per deployment, steps in flight."""
