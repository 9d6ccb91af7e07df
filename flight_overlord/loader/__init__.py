"""loader role."""
