"""Failures: kill -9 of each role and a full-cluster resume, a role that hangs (SIGSTOP)."""
