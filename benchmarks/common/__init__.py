"""What several benchmarks share: header, corpus and configs (benchlib), one process per rank, the colocated
DataLoader baseline, a local S3."""
