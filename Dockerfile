# Concord's image: the master and peer commands, statically linked, on an empty base (no shell, no
# libc: the two binaries and root certificates). The first argument names the command; both are on
# PATH:
#
#	docker build -t concord .
#	docker run --rm -p 48148:48148 -p 48180:48180 concord master --http 0.0.0.0:48180 --token run-42
#	docker run --rm --network host concord peer run --master HOST:48148 --token run-42
#
# Every flag has a CONCORD_* environment twin (shown by --help), so `-e CONCORD_TOKEN=run-42` works
# as well; deploy/ configures a fleet on Kubernetes that way, and deploy/check.sh builds and tries
# this image. GO_IMAGE names the build stage's base: any image with Go at the version go.mod asks for
# (a mirror's golang image, or a local one).
ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm

FROM ${GO_IMAGE} AS build
WORKDIR /src
ENV CGO_ENABLED=0
# The module download is its own layer: it is reused while go.mod and go.sum stay the same.
COPY go.mod go.sum ./
RUN ["go", "mod", "download"]
COPY . .
# Exec form throughout: the build stage needs Go and root certificates, not even a shell.
RUN ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", "/out/", "./cmd/master", "./cmd/peer"]

FROM scratch
COPY --from=build /out/master /out/peer /usr/local/bin/
# Root certificates, for any HTTPS endpoint a command reaches; the run's own TLS uses its secret or
# --tls-ca.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/
ENV PATH=/usr/local/bin
# Neither command needs privileges: run as an unprivileged user (the number distroless calls nonroot).
USER 65532:65532
# 48148: peers to the master (TCP for tcp and tls, UDP for quic); 48180: status page and /metrics.
EXPOSE 48148/tcp 48148/udp 48180/tcp
LABEL org.opencontainers.image.source="https://github.com/concord-ccl/concord" \
      org.opencontainers.image.description="Concord master and peer"
CMD ["master", "--help"]
