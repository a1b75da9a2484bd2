#!/bin/sh
# Install what the network-namespace test cluster (tests/cluster) needs: sshd/ssh for the nodes, pdsh,
# OpenMPI + MPICH, Slurm + munge, the iproute2/iptables/procps tools the harness drives; chromium, the browser
# that opens report.html in its tests (driven by playwright with the system browser: no `playwright install`); and
# Prometheus (the --metrics_port test runs the binary itself: its system service is never started).
# Idempotent: installs nothing (and skips `apt-get update`) when every package is already present.
set -eu

PACKAGES="openssh-server openssh-client pdsh openmpi-bin libopenmpi-dev mpich numactl slurm-wlm munge
iproute2 iptables procps chromium prometheus"

missing=""
for pkg in $PACKAGES; do
    # dpkg-query prints "install ok installed" only for a fully installed package.
    if [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]; then
        missing="$missing $pkg"
    fi
done

if [ -z "$missing" ]; then
    echo "cluster-deps: all packages already installed"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
echo "cluster-deps: installing:$missing"
# An update is needed on fresh images (empty lists) and harmless otherwise.
$SUDO apt-get update -qq
# No service starts at install (Debian's prometheus starts its own otherwise): a policy-rc.d that says no, only
# where there is none already, removed after.
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    trap '$SUDO rm -f "$POLICY"' EXIT
fi
# shellcheck disable=SC2086  # word splitting of the package list is intended
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
