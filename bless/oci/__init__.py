"""The OCI edge: a blessing as an OCI artifact, the registry client (the one user of oras), its HTTP plumbing and
the transfer limits (how slow a registry may be)."""
