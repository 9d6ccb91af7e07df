"""constructor role."""
