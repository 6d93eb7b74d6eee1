# Sourced by the gpu-proof-*.sh scripts (run from the repository root) on a GPU host without internet:
# the dependencies a GPU host's python3 may lack (jsonschema and its own, oras for the fleet commands the CLI
# imports) from wheels carried in .whl/, e.g. `pip download --no-deps --only-binary=:all: --python-version 3.12
# -d .whl jsonschema jsonschema-specifications referencing rpds-py attrs typing-extensions 'oras>=0.2.25,<0.3'`;
# this checkout first on PYTHONPATH; and the GPUs listed (index, UUID, model) into "$OUT/gpu.csv".
if ! python3 -c 'import jsonschema, oras' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=index,uuid,name,compute_cap,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
