"""Source loaders: mixture-driven scaling of loader actors, the shuffle window."""
