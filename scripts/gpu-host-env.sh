# Sourced by the gpu-proof-*.sh scripts (run from the repository root) on a GPU host without internet:
# jsonschema and its dependencies from the carried wheels in .whl/ when python3 lacks them, this checkout
# first on PYTHONPATH, and the GPUs listed (index, UUID, model) into "$OUT/gpu.csv".
if ! python3 -c 'import jsonschema' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=index,uuid,name,compute_cap,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
