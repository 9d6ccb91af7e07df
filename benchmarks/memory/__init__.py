"""Memory: as sources and ranks grow, beside MosaicML Streaming, over a long soak run."""
