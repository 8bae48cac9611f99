#!/usr/bin/env bash
# The test command (README.md): installs what the tests drive, then runs pytest.
#   scripts/test.sh [pytest args]
# pip: the project with its `test` extra. Debian (as root; otherwise the exact apt-get line
# is printed and the tests that need a missing package fail naming it): prometheus
# (scrapes the agent), chromium (HTML reports), tmux (`omnitrace top` in a real terminal),
# npm (Grafana's dashboard types, pinned in dashboards/schema-check/package-lock.json).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
command -v tmux >/dev/null || need+=(tmux)
command -v npm >/dev/null || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "scripts/test.sh: installing Debian packages: ${need[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "scripts/test.sh: missing Debian packages, tests that drive them will fail:" \
         "sudo apt-get install --no-install-recommends ${need[*]}" >&2
  fi
fi

python -m pip install -q -e '.[test]'
if command -v npm >/dev/null && [ -f dashboards/schema-check/package-lock.json ]; then
  npm ci --prefix dashboards/schema-check --no-audit --no-fund --silent
fi

# Two pytest-xdist workers, a test file each at a time (its module fixtures made once): the
# suite waits on servers and loads more than it computes, so two share the cores well.
# `-n 0` after it runs the tests one by one.
exec python -m pytest -q -n 2 --dist loadfile "$@"
