package transport

import (
	"testing"
)

func quicSetup() conformanceSetup {
	tr := NewQUIC(QUICConfig{Auth: AuthConfig{Secret: testSecret}})
	return conformanceSetup{server: tr, listenAddr: "127.0.0.1:0", client: tr}
}

func TestConformanceQUIC(t *testing.T) {
	testConformance(t, func(t *testing.T) conformanceSetup { return quicSetup() })
}

func TestSessionConformanceQUIC(t *testing.T) {
	testSessionConformance(t, direct, func() sessionSetup {
		return sessionSetup{conformanceSetup: quicSetup(), datagrams: true, native: true}
	})
}
