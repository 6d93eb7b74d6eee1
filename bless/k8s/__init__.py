"""Kubernetes: the documents of one blessing (plain dicts), with the checks Kubernetes makes of every name."""
