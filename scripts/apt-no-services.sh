# Sourced by the install scripts: apt_install_no_services PKG... installs Debian packages non-interactively
# without letting their maintainer scripts start system services (policy-rc.d exit 101, removed again after).
apt_install_no_services() {
    local sudo="" policy=/usr/sbin/policy-rc.d created_policy=0
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod 755 "$policy"
        created_policy=1
    fi
    local rc=0
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null; } || rc=$?
    if [ $created_policy -eq 1 ]; then $sudo rm -f "$policy"; fi
    return $rc
}
