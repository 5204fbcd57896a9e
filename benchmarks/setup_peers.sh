#!/usr/bin/env bash
# Create one virtual environment per peer system under benchmarks/.venvs/.
#
#   bash benchmarks/setup_peers.sh                 # all peers
#   bash benchmarks/setup_peers.sh cpprb torchrl   # only these
#
# Idempotent: a venv whose requirements are already installed (stamp file
# .venvs/<peer>/.reprise-requirements matches) is left alone. Delete a venv to
# rebuild it. Peers are kept apart because their pins conflict (Reverb needs
# TensorFlow 2.15 and numpy<2; TorchRL pulls the newest torch).
#
# Sizes: torchrl ~5 GB (PyPI's torch is the CUDA build; it runs on CPU),
# reverb ~1.5 GB (TensorFlow), the others a few MB. Run it under `nice` on a
# shared machine; it is network- and disk-bound.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venvs="$here/.venvs"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
    for candidate in /root/.pyenv/versions/3.11.7/bin/python3 python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then python="$candidate"; break; fi
    done
fi
version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$version" != "3.11" ]]; then
    echo "setup_peers: need Python 3.11 (dm-reverb 0.14 wheels stop there), got $version from $python" >&2
    exit 1
fi

declare -A requirements=(
    [cpprb]="cpprb numpy"
    [torchrl]="torchrl numpy"
    [reverb]="dm-reverb==0.14.0 tensorflow==2.15.1 numpy<2"
    [redis]="redis hiredis numpy"
)
all_peers=(cpprb torchrl reverb redis)
peers=("$@")
if [[ ${#peers[@]} -eq 0 ]]; then peers=("${all_peers[@]}"); fi

make_venv() {
    local peer="$1" reqs="${requirements[$1]:-}"
    if [[ -z "$reqs" ]]; then
        echo "setup_peers: unknown peer '$peer' (known: ${all_peers[*]})" >&2
        return 1
    fi
    local dir="$venvs/$peer" stamp="$venvs/$peer/.reprise-requirements"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$reqs" && -x "$dir/bin/python" ]]; then
        echo "setup_peers: $peer: up to date ($reqs)"
        return 0
    fi
    echo "setup_peers: $peer: installing $reqs"
    rm -f "$stamp"
    [[ -x "$dir/bin/python" ]] || "$python" -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --upgrade pip
    # shellcheck disable=SC2086  # the requirement list is meant to split on spaces
    "$dir/bin/python" -m pip install --quiet $reqs
    printf '%s' "$reqs" > "$stamp"
    "$dir/bin/python" -m pip freeze > "$dir/.reprise-freeze.txt"
}

install_redis_server() {
    if command -v redis-server >/dev/null 2>&1; then
        echo "setup_peers: redis-server: present ($(redis-server --version | head -c 60))"
        return 0
    fi
    if [[ $(id -u) -ne 0 ]]; then
        echo "setup_peers: redis-server missing and not root: apt-get install redis-server yourself" >&2
        return 1
    fi
    echo "setup_peers: redis-server: apt-get install"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
}

mkdir -p "$venvs"
for peer in "${peers[@]}"; do
    make_venv "$peer"
    if [[ "$peer" == redis ]]; then install_redis_server; fi
done
echo "setup_peers: done: $(cd "$venvs" && ls -d */ 2>/dev/null | tr -d / | tr '\n' ' ')"
