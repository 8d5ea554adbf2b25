# Sourced by the Python test scripts (scripts/python-test.sh, scripts/ray-recipe-test.sh, .ci/run):
# creates (once) the virtual environment they install into, so they never touch the system
# Python. `python_venv PACKAGE...` makes the venv ($FORKSCORE_VENV, default target/py-venv
# in the checkout) from $PYTHON (default python3), installs the
# packages that are missing (each argument: a pip requirement, `import.name:requirement` when the
# module is named otherwise) and sets PY to the venv's python.
python_venv() {
    # (in the checkout, not the shared cargo target dir: each checkout installs its own wheel)
    local venv=${FORKSCORE_VENV:-target/py-venv}
    if [ ! -x "$venv/bin/python" ]; then
        # (Debian splits the venv module out: python3-venv; virtualenv does the same job)
        "${PYTHON:-python3}" -m venv "$venv" 2>/dev/null \
            || { rm -rf "$venv"; "${PYTHON:-python3}" -m virtualenv -q "$venv"; } || {
            echo "error: cannot make a virtual environment with ${PYTHON:-python3}: install python3-venv (apt-get install python3-venv) or virtualenv (pip install --user virtualenv)" >&2
            return 1
        }
    fi
    # (not realpath: the venv's python is a symlink to the base interpreter, which must not be used)
    PY=$(cd "$venv" && pwd)/bin/python
    local missing=() spec module
    for spec in "$@"; do
        if [[ $spec == *:* ]]; then
            module=${spec%%:*}
            spec=${spec#*:}
        else
            module=${spec%%[<>=\[]*}
        fi
        "$PY" -c "import $module" 2>/dev/null || missing+=("$spec")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        "$PY" -m pip install --quiet --disable-pip-version-check "${missing[@]}"
    fi
}
