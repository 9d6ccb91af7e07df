"""What TLS, mutual TLS and the token middleware cost."""
