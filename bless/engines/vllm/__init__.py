"""Adapter for vLLM (the production engine), one module per concern.

* :mod:`~bless.engines.vllm.versions` (+ ``versions.json``): what bless knows about each vLLM release,
  as data (one :class:`~bless.engines.vllm.versions.VllmVersionRules` per release: hashed/ignored env,
  markers, timings, layout, AOT defaults). Adding a release is adding an entry there.
* :mod:`~bless.engines.vllm.serve_args`: the serve-argument schema, its canonical (hashed) form, the
  argv it renders and the unsafe values in it.
* :mod:`~bless.engines.vllm.env`: the env policy (hashed, recorded-only, secret), unsafe env, pinned env.
* :mod:`~bless.engines.vllm.evidence`: log markers, the artifact layout, upper-layer rewrite rules.
* :mod:`~bless.engines.vllm.paths`: the fixed in-container paths.
* :mod:`~bless.engines.vllm.adapter`: :class:`VllmAdapter`, which ties them to one resolved release.

Everything here was derived from a real vLLM 0.20.0 run (torch 2.11, triton 3.6, an H200, a tiny
random Llama, offline) and each release's source. HOME is part of vLLM's key
(``VLLM_CONFIG_ROOT`` / ``VLLM_XLA_CACHE_PATH`` derive from it), and the Inductor keys depend on the
cache path (a moved cache loads but writes new entries): both are pinned.
"""

from __future__ import annotations

from bless.engines.base import ModelMount
from bless.engines.vllm.adapter import VllmAdapter
from bless.engines.vllm.env import VllmEnvPolicy
from bless.engines.vllm.evidence import COMPILE_MARKERS, FATAL_MARKERS, LOAD_MARKERS, UPPER_RULES, UpperRules
from bless.engines.vllm.paths import CACHE_MOUNT_PATH, HF_HOME_MOUNT_PATH, MODEL_MOUNT_PATH

__all__ = [
    "CACHE_MOUNT_PATH",
    "COMPILE_MARKERS",
    "FATAL_MARKERS",
    "HF_HOME_MOUNT_PATH",
    "LOAD_MARKERS",
    "MODEL_MOUNT_PATH",
    "UPPER_RULES",
    "ModelMount",
    "UpperRules",
    "VllmAdapter",
    "VllmEnvPolicy",
]
