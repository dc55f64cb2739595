package transport

import (
	"testing"
)

// testSecret is the run secret of the tests: 32 bytes.
var testSecret = []byte("0123456789abcdef0123456789abcdef")

func tlsSetup() conformanceSetup {
	tr := NewTLS(TLSConfig{Auth: AuthConfig{Secret: testSecret}})
	return conformanceSetup{server: tr, listenAddr: "127.0.0.1:0", client: tr}
}

func TestConformanceTLS(t *testing.T) {
	testConformance(t, func(t *testing.T) conformanceSetup { return tlsSetup() })
}

func TestSessionConformanceTLS(t *testing.T) {
	testSessionConformance(t, direct, func() sessionSetup {
		return sessionSetup{conformanceSetup: tlsSetup()}
	})
}

func BenchmarkStreamTLS(b *testing.B) { benchmarkStream(b, tlsSetup()) }

// BenchmarkStreamTLSFrames writes the AllReduce's 1 MiB frames.
func BenchmarkStreamTLSFrames(b *testing.B) { benchmarkStreamOf(b, tlsSetup(), 1<<20) }
