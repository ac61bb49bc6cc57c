# Sourced by the bench scripts: sets $jax_python, the Python of a virtual environment with
# JAX (bench/jax/requirements.txt), created on first use at $JAX_VENV (default /tmp/jaxenv,
# outside the repository; needs the PyPI registry once). Expects $root, the repository.
venv="${JAX_VENV:-/tmp/jaxenv}"
if ! "$venv/bin/python" -c 'import jax, numpy, safetensors' 2>/dev/null; then
    echo "setting up JAX in $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r "$root/bench/jax/requirements.txt"
fi
jax_python="$venv/bin/python"
