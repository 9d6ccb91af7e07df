"""Sources on object storage (S3) vs local disk."""
