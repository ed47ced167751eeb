#!/usr/bin/env bash
# What the build needs from the system: Python >= 3.11 with venv; with --browser also a headless
# Chromium for the browser test. Installs what is missing with apt-get when run as root.
set -euo pipefail
PYTHON=${PYTHON:-python3}
want_apt=()
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "memlab's book build needs Python >= 3.11; found: $("$PYTHON" --version 2>&1)" >&2
  exit 1
fi
if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
  want_apt+=("python3-venv")
fi
if [ "${1:-}" = "--browser" ] && ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1 \
   && [ ! -x /usr/bin/chromium ] && [ -z "${MEMLAB_CHROMIUM:-}" ]; then
  want_apt+=("chromium")
fi
[ ${#want_apt[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing from the system's packages: ${want_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want_apt[@]}" >/dev/null
  exit 0
fi
echo "missing system packages: ${want_apt[*]}; install them with 'sudo apt-get install ${want_apt[*]}'" >&2
echo "(or point MEMLAB_CHROMIUM at a Chromium binary)" >&2
exit 1
