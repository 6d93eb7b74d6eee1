"""Where a vLLM start sees its cache and its weights: fixed paths, because vLLM and Inductor hash them."""

from __future__ import annotations

#: Where the engine sees its cache (``VLLM_CACHE_ROOT``) in bootstrap, trials and serving. Fixed,
#: because Inductor's keys depend on the cache path; the same value as the reference adapter.
CACHE_MOUNT_PATH = "/var/cache/bless-engine"
#: Docker only: where the orchestrator mounts ``model.hf_home`` (read-only) for a Hugging Face model.
HF_HOME_MOUNT_PATH = "/var/cache/bless-hf"
#: Docker only: where the orchestrator mounts ``model.path`` (read-only) for a local model. Fixed,
#: because vLLM hashes the model string (ModelConfig.compute_hash includes ``model``).
MODEL_MOUNT_PATH = "/var/lib/bless-model"
