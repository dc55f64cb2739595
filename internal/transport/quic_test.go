package transport

import (
	"testing"
	"time"
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

func TestQUICConfig(t *testing.T) {
	good := AuthConfig{Secret: testSecret}
	for i, c := range []QUICConfig{
		{Auth: good, UDPBuffer: -1},
		{Auth: good, IdleTimeout: -1},
		{Auth: good, HandshakeTimeout: -1},
		{Auth: good, MaxStreams: -1},
		{Auth: good, StreamWindow: 2 << 20, ConnWindow: 1 << 20},
		{},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("config %d: Validate accepted %+v", i, c)
		}
	}
	tr := NewQUIC(QUICConfig{Auth: good}).(*quicTransport)
	if tr.err != nil {
		t.Fatal(tr.err)
	}
	q := tr.qconf
	// Windows sized for 100 ms × 1 Gbit/s (12.5 MB in flight), datagrams on, keep-alive on.
	if q.MaxStreamReceiveWindow != 16<<20 || q.MaxConnectionReceiveWindow != 32<<20 || !q.EnableDatagrams ||
		q.KeepAlivePeriod != 5*time.Second || q.MaxIdleTimeout != 30*time.Second || q.MaxIncomingStreams != 1025 {
		t.Fatalf("quic config %+v", q)
	}
	if tr.cfg.UDPBuffer != 8<<20 || tr.cfg.Linger != 5*time.Second {
		t.Fatalf("defaults %+v", tr.cfg)
	}
	if tr.session.client.NextProtos[0] == tr.stream.client.NextProtos[0] {
		t.Fatal("sessions and byte streams share an application protocol")
	}
}

func BenchmarkStreamQUIC(b *testing.B) { benchmarkStream(b, quicSetup()) }
