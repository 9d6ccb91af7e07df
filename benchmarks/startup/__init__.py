"""Start-up against the file count."""
