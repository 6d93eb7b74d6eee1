# The user's engine image plus bless: what the serving container of a Kubernetes pod runs.
#
#   FROM ${ENGINE_IMAGE} (e.g. vllm/vllm-openai:v0.26.0), unchanged, plus:
#   - bless in its OWN venv at /opt/bless, made with the engine image's python3 but never installed into the
#     engine's Python: bless's dependencies (typer, rich, docker, huggingface_hub, ...) must not shadow or
#     upgrade the engine's. The engine's python3 cannot import them; /opt/bless/bin/python can.
#   - /usr/local/bin/bless and /usr/local/bin/serve-full: symlinks to /opt/bless/bin/. /opt/bless/bin is not on
#     PATH (its python would shadow the engine's), and nothing is put on PYTHONPATH: bless's local runtime
#     passes PYTHONPATH through to the engine it starts.
#   - ENTRYPOINT ["serve-full"]: the container's arguments are serve-full's (e.g. --profile FILE --from DIR);
#     serve-full starts the engine as its child process (the profile's `[runtime] kind = "local"`).
#   The engine image's USER, ENV, WORKDIR and files are kept; its ENTRYPOINT and CMD are replaced.
#
# Two ways to give it bless, picked with the build argument BLESS_FROM (no network needed for the first):
#
#   BLESS_FROM=wheelhouse (default, offline): the build context is a directory holding wheelhouse/ with bless's
#   wheel and every dependency as a wheel for the engine image's Python (CPython version, glibc, arch). pip
#   installs with --no-index, so the build runs with --network none. scripts/images/build-engine-image.sh makes that
#   wheelhouse on the host and builds:
#       bash scripts/images/build-engine-image.sh vllm/vllm-openai:v0.26.0 my-vllm-bless:0.26.0
#   or by hand, from a wheelhouse made the same way:
#       docker build --network none -f deploy/images/engine.Dockerfile \
#           --build-arg ENGINE_IMAGE=vllm/vllm-openai:v0.26.0 -t my-vllm-bless:0.26.0 CONTEXT_DIR
#
#   BLESS_FROM=source (online): the build context is this repository (its .dockerignore sends only what pip
#   needs: pyproject.toml, README.md, bless/, cli/, manifests/schema/); pip builds bless and takes its
#   dependencies from PyPI:
#       docker build -f deploy/images/engine.Dockerfile --build-arg BLESS_FROM=source \
#           --build-arg ENGINE_IMAGE=vllm/vllm-openai:v0.26.0 -t my-vllm-bless:0.26.0 .
#
# Other build arguments: PYTHON, the engine image's interpreter the venv is made from (default python3 on the
# image's PATH; it needs the venv module with ensurepip, Debian/Ubuntu's python3-venv).
# Plain Dockerfile syntax: works with the legacy builder and with BuildKit. More: docs/guides/kubernetes.md.
ARG ENGINE_IMAGE

# Stage 1: the venv, in a stage of its own, so the wheelhouse or the source never becomes a layer of the image.
# The label marks its untagged leftover under the legacy builder (scripts/images/build-engine-image.sh removes it).
FROM ${ENGINE_IMAGE} AS bless-venv
LABEL org.bless.build-stage=engine-image
ARG BLESS_FROM=wheelhouse
ARG PYTHON=python3
USER root
COPY . /tmp/bless-context/
# PYTHONPATH is unset for pip and the checks: an engine image that sets it would otherwise make pip take the
# engine's packages as bless's dependencies (found on sys.path, so not installed into the venv).
RUN set -eu; \
    ctx=/tmp/bless-context; \
    case "$BLESS_FROM" in \
      wheelhouse) \
        [ -d "$ctx/wheelhouse" ] || { echo "engine.Dockerfile: BLESS_FROM=wheelhouse needs wheelhouse/ in the build context (scripts/images/build-engine-image.sh makes one); for pip from PyPI use --build-arg BLESS_FROM=source with the repository as context" >&2; exit 1; }; \
        set -- --no-index --find-links "$ctx/wheelhouse" bless-cache ;; \
      source) \
        [ -f "$ctx/pyproject.toml" ] || { echo "engine.Dockerfile: BLESS_FROM=source needs bless's repository as the build context" >&2; exit 1; }; \
        set -- "$ctx" ;; \
      *) echo "engine.Dockerfile: BLESS_FROM must be wheelhouse or source, not '$BLESS_FROM'" >&2; exit 1 ;; \
    esac; \
    command -v "$PYTHON" >/dev/null || { echo "engine.Dockerfile: no $PYTHON in $ENGINE_IMAGE (set the build argument PYTHON)" >&2; exit 1; }; \
    env -u PYTHONPATH "$PYTHON" -m venv /opt/bless \
      || { echo "engine.Dockerfile: '$PYTHON -m venv' failed: the engine image needs the venv module with ensurepip (Debian/Ubuntu: python3-venv)" >&2; exit 1; }; \
    env -u PYTHONPATH /opt/bless/bin/python -m pip install --no-cache-dir --disable-pip-version-check "$@"; \
    mkdir /tmp/bless-links; \
    ln -s /opt/bless/bin/bless /tmp/bless-links/bless; \
    ln -s /opt/bless/bin/serve-full /tmp/bless-links/serve-full; \
    env -u PYTHONPATH /tmp/bless-links/bless --version; \
    env -u PYTHONPATH /tmp/bless-links/serve-full --help >/dev/null

# Stage 2: the engine image plus the venv and the two links. No RUN: the engine image's USER stays in force and
# needs no shell. A directory copy keeps the links links.
FROM ${ENGINE_IMAGE}
COPY --from=bless-venv /opt/bless /opt/bless
COPY --from=bless-venv /tmp/bless-links/ /usr/local/bin/
ENTRYPOINT ["serve-full"]
CMD ["--help"]
