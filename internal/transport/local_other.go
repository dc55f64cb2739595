//go:build !linux

package transport

// localSupported reports whether the abstract unix socket namespace exists here.
const localSupported = false
