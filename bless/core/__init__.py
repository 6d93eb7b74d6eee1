"""The core model of a blessing: profile, factors and config hash, manifest, schemas, the tree check, the path
rule, the coverage model and how untrusted names are shown. Pure where it can be: nothing here imports an engine,
a runtime, a flow or the probes (tests/unit/test_core_structure.py)."""
