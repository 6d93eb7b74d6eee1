"""The flows: what a command does from start to end, built on the core and the I/O edges.

``run`` (bless run), ``serve`` (serve-full), ``gate`` (bless gate), ``sign``, ``push``, ``pull``
and ``k8s`` (bless k8s render) are flows; they never import one another. What several flows share
lives beside them: ``events`` (progress and run ids), ``safety`` (the unsafe-settings check),
``resolve`` (profile -> config hash -> blessing), ``session`` (one engine process from start to
stop) and ``trust_policy`` (``--trust`` for a blessing in a store: verify, pull, serve-full; the
bytes sign signs).
"""
