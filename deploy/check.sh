#!/usr/bin/env bash
# Builds the image from the repository's Dockerfile with podman, then checks it:
#   * it is small, and master and peer (with their subcommands) run in it;
#   * it has no shell (an empty base: the commands are static);
#   * a master and two peers started from it, configured only through CONCORD_* variables as
#     deploy/kubernetes does, finish a short checked AllReduce run over tls (host network, loopback).
#
# GO_IMAGE names the build stage's base. By default the script makes one from this machine's Go
# toolchain (localhost/concord-go), for machines that reach no container registry; the host's module
# and build caches are lent to the build, so it needs no network. Run it as root; podman and runc
# are installed with apt when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
SECONDS=0

max_image_mib=64
image=localhost/concord:check

if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
	echo "== installing podman and runc"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends podman runc >/dev/null
fi

# runc rather than crun: crun refuses hosts whose cgroups are mounted in hybrid (v1 and v2) mode.
# Explicit rlimits, no higher than this shell's: the default ones ask for more than a host without
# CAP_SYS_RESOURCE may grant.
nofile=$(ulimit -Sn)
pod=(podman --runtime runc)
limits=(--ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)

started=()
scratch=$(mktemp -d)
cleanup() {
	for id in "${started[@]}"; do
		"${pod[@]}" rm -f "$id" >/dev/null 2>&1 || true
	done
	rm -rf "$scratch"
}
trap cleanup EXIT

go mod download
go_image=${GO_IMAGE:-}
if [ -z "$go_image" ]; then
	go_image=localhost/concord-go:$(go env GOVERSION)
	if ! "${pod[@]}" image exists "$go_image"; then
		echo "== build-stage base $go_image from $(go env GOROOT)"
		# Go's tree (less its own tests), root certificates and an empty /tmp: all that `go build`
		# with CGO_ENABLED=0 needs. GOPROXY=off: modules come from the lent cache only.
		mkdir -m 1777 "$scratch/tmp"
		tar -C / --exclude=usr/local/go/test --exclude=usr/local/go/api -cf - usr/local/go etc/ssl/certs/ca-certificates.crt \
			-C "$scratch" tmp |
			"${pod[@]}" import -q \
				--change 'ENV PATH=/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin' \
				--change 'ENV HOME=/root' --change 'ENV GOPATH=/go' --change 'ENV GOTOOLCHAIN=local' --change 'ENV GOPROXY=off' \
				- "$go_image" >/dev/null
	fi
fi

echo "== podman build (build stage: $go_image)"
build_start=$SECONDS
"${pod[@]}" rmi -f "$image" >/dev/null 2>&1 || true # the previous check's image, not left dangling
# --layers=false: no per-step layer commits, which cost more than they save on a fresh machine.
"${pod[@]}" build -q --layers=false "${limits[@]}" --build-arg "GO_IMAGE=$go_image" \
	-v "$(go env GOMODCACHE):/go/pkg/mod" -v "$(go env GOCACHE):/root/.cache/go-build" \
	-t "$image" . >/dev/null
echo "built in $((SECONDS - build_start))s"

size=$("${pod[@]}" image inspect --format '{{.Size}}' "$image")
echo "image size: $((size / 1024 / 1024)) MiB (limit $max_image_mib MiB)"
if [ "$size" -gt $((max_image_mib * 1024 * 1024)) ]; then
	echo "the image is larger than $max_image_mib MiB"; exit 1
fi

echo "== the commands run in the image"
for args in "master --help" "peer --help" "peer run --help" "peer train --help"; do
	# shellcheck disable=SC2086
	out=$("${pod[@]}" run --rm "${limits[@]}" "$image" $args 2>&1) || { echo "$args: $out"; exit 1; }
	want="${args% --help} - "
	grep -qF -- "$want" <<<"$out" || { echo "$args: no line with '$want':"; echo "$out"; exit 1; }
	echo "ok: $args"
done
if "${pod[@]}" run --rm "${limits[@]}" "$image" sh -c true >/dev/null 2>&1; then
	echo "the image has a shell; it should hold the two commands only"; exit 1
fi
echo "ok: no shell"

echo "== a run from the image: a master and two peers over tls, configured through CONCORD_* only"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$scratch/secret"
chmod 0644 "$scratch/secret" # the image's user is not root
common=(-e CONCORD_TOKEN=check-run -e CONCORD_TRANSPORT=tls -e CONCORD_SECRET_FILE=/etc/concord/secret
	-v "$scratch/secret:/etc/concord/secret:ro" -e CONCORD_LOG_FORMAT=json)
id=$("${pod[@]}" run -d --network host "${limits[@]}" "${common[@]}" \
	-e CONCORD_LISTEN=127.0.0.1:0 -e CONCORD_HTTP=127.0.0.1:0 "$image" master)
started+=("$id")
addr=""
for _ in $(seq 100); do
	addr=$("${pod[@]}" logs "$id" 2>&1 | sed -n 's/.*"msg":"master listening","addr":"\([^"]*\)".*/\1/p' | head -1)
	[ -n "$addr" ] && break
	sleep 0.1
done
if [ -z "$addr" ]; then
	echo "the master did not report its address:"; "${pod[@]}" logs "$id"; exit 1
fi
echo "master at $addr"
peers=()
for _ in 1 2; do
	id=$("${pod[@]}" run -d --network host "${limits[@]}" "${common[@]}" \
		-e CONCORD_MASTER="$addr" -e CONCORD_STEPS=20 -e CONCORD_SIZE=65536 "$image" peer run)
	started+=("$id")
	peers+=("$id")
done
for id in "${peers[@]}"; do
	rc=$(timeout 120 "${pod[@]}" wait "$id" || echo timeout)
	if [ "$rc" != 0 ]; then
		echo "peer ${id:0:12} ended with $rc:"; "${pod[@]}" logs "$id" 2>&1 | tail -20; exit 1
	fi
done
echo "ok: both peers finished 20 checked AllReduce steps"
echo "== image check passed in ${SECONDS}s"
