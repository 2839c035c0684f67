#!/usr/bin/env bash
# Install Debian's chromium (the headless browser the dashboard tests drive through
# Playwright's executable_path) when /usr/bin/chromium is missing. Idempotent; needs root
# (CI runs as root). Playwright's own browser download ('playwright install') is not used.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
  echo "[ci-chromium] $(/usr/bin/chromium --version 2>/dev/null | head -1) already installed" >&2
  exit 0
fi
echo "[ci-chromium] installing chromium (apt-get)" >&2
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
/usr/bin/chromium --version >&2
