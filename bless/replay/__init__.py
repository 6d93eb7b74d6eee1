"""The replay protocol: trials, the reuse rule, the golden canary, GPU slots and the engine's HTTP client."""
