"""What the tests share: fakes of bless's own interfaces, an in-memory and a real OCI registry, a lying registry,
README code blocks, trust keys and runtime helpers."""
