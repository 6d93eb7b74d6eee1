"""Data package: the JSON Schemas of profiles and manifests (``manifests/schema/``), shipped with bless."""
