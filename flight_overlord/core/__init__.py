"""Pure logic shared by the roles: no I/O, no servers, fast to test."""
