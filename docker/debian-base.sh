#!/usr/bin/env bash
# A stand-in for the official Python base image, made from Debian's own packages, for a machine
# that reaches Debian's archive but not Docker Hub (nor a registry that mirrors it).
#
#   docker/debian-base.sh IMAGE [TOOL]      e.g. docker/debian-base.sh localhost/gpt-base:bookworm buildah
#   make build-images BASE_IMAGE=IMAGE
#
# It is NOT python:3.11.14-slim-bookworm: it is Debian bookworm's python3 (3.11.2) and pip with
# `python` and `pip` on PATH where the official image has them, and pip allowed to install as
# root (Debian's EXTERNALLY-MANAGED marker removed), which is all the Dockerfiles assume of their
# base. `make test-images` builds the images on it where the official image cannot be pulled.
# TOOL (buildah, podman or docker; default buildah) imports the root filesystem that mmdebstrap
# (apt-get install mmdebstrap) makes; an existing IMAGE is left as it is.
#
# Exit status: 0 when IMAGE exists at the end; otherwise non-zero after one line naming the step
# that failed. Cleanup (the scratch folder, an uncommitted container) never decides it.
set -euo pipefail

image=${1:?usage: docker/debian-base.sh IMAGE [TOOL]}
tool=${2:-buildah}

fail() {  # fail STEP STATUS: the one line, then that status
    echo "debian-base.sh: error: $1 failed (exit status $2); $image was not made" >&2
    exit "$2"
}

exists() {
    if [ "$tool" = buildah ]; then
        buildah inspect --type image "$image"
    else
        "$tool" image inspect "$image"
    fi >/dev/null 2>&1
}

if exists; then
    echo "debian-base.sh: $image exists; keeping it"
    exit 0
fi
command -v mmdebstrap >/dev/null || { echo "debian-base.sh: error: mmdebstrap not found (apt-get install mmdebstrap)" >&2; exit 1; }
command -v "$tool" >/dev/null || { echo "debian-base.sh: error: $tool not found" >&2; exit 1; }

work=$(mktemp -d)
ctr=""  # buildah's working container while it is not yet committed
cleanup() {
    local status=$?  # the script's own status, kept whatever the cleanup does
    set +e
    [ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

echo "debian-base.sh: making a Debian bookworm root filesystem with python3 and pip (about two minutes)"
# Check-Valid-Until off: a Debian snapshot mirror serves Release files past their Valid-Until
# date, and the Dockerfiles' `apt-get update` runs in this root filesystem.
mmdebstrap --variant=minbase --include=python3,python3-pip,ca-certificates \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --customize-hook='ln -s /usr/bin/python3 "$1/usr/local/bin/python"' \
    --customize-hook='ln -s /usr/bin/pip3 "$1/usr/local/bin/pip"' \
    --customize-hook='rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$work/rootfs.tar" || fail mmdebstrap $?
if [ "$tool" = buildah ]; then
    # buildah has no `import`: a container from scratch with the tarball added, committed.
    ctr=$(buildah from scratch) || fail "buildah from scratch" $?
    buildah add --quiet "$ctr" "$work/rootfs.tar" / >/dev/null || fail "buildah add" $?
    buildah config --cmd '["python3"]' \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr" \
        || fail "buildah config" $?
    buildah commit --quiet --rm "$ctr" "$image" >/dev/null || fail "buildah commit" $?
    ctr=""  # --rm removed it with the commit
else
    "$tool" import --change 'CMD ["python3"]' "$work/rootfs.tar" "$image" >/dev/null \
        || fail "$tool import" $?
fi
exists || fail "checking that $image exists" 1
echo "debian-base.sh: made $image"
