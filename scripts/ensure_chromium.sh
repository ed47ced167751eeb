#!/usr/bin/env bash
# Make sure Debian's headless Chromium is there for the browser test; install it when we can.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium from the system's packages (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  exit 0
fi
echo "the browser test needs Chromium: install it with 'sudo apt-get install chromium'" >&2
exit 1
