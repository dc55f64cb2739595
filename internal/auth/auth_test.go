package auth

import (
	"bytes"
	"errors"
	"testing"
)

func TestCheckSecret(t *testing.T) {
	if err := CheckSecret(make([]byte, MinSecretLen-1)); !errors.Is(err, ErrWeakSecret) {
		t.Fatalf("CheckSecret(15 bytes) = %v, want ErrWeakSecret", err)
	}
	if err := CheckSecret(nil); !errors.Is(err, ErrWeakSecret) {
		t.Fatalf("CheckSecret(nil) = %v, want ErrWeakSecret", err)
	}
	if err := CheckSecret(make([]byte, MinSecretLen)); err != nil {
		t.Fatalf("CheckSecret(16 bytes) = %v", err)
	}
}

func TestProofBindsEverything(t *testing.T) {
	secret, ekm := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	base := Proof(secret, ekm, Client)
	if base != Proof(secret, ekm, Client) {
		t.Fatal("Proof is not deterministic")
	}
	otherEKM := bytes.Repeat([]byte{3}, 32)
	otherSecret := bytes.Repeat([]byte{4}, 32)
	for name, p := range map[string][32]byte{
		"role":     Proof(secret, ekm, Server),
		"exporter": Proof(secret, otherEKM, Client),
		"secret":   Proof(otherSecret, ekm, Client),
	} {
		if p == base {
			t.Errorf("a different %s gives the same proof", name)
		}
	}
}

func TestMessageRoundTrip(t *testing.T) {
	var body [32]byte
	for i := range body {
		body[i] = byte(i)
	}
	b := AppendMessage(nil, KindProof, body)
	if len(b) != MessageSize {
		t.Fatalf("message of %d bytes, want %d", len(b), MessageSize)
	}
	m, err := ParseMessage(b)
	if err != nil || m.Kind != KindProof || m.Body != body {
		t.Fatalf("ParseMessage = %+v, %v", m, err)
	}
	m, err = ParseMessage(AppendMessage(nil, KindRefuse, [32]byte{ReasonBadProof}))
	if err != nil || m.Kind != KindRefuse || m.Reason != ReasonBadProof {
		t.Fatalf("ParseMessage(refusal) = %+v, %v", m, err)
	}
	bad := [][]byte{
		b[:MessageSize-1],
		append([]byte("XXXX"), b[4:]...),
		append(append([]byte("CNCA"), 2), b[5:]...),
		append(append([]byte("CNCA"), 1, 9), b[6:]...),
	}
	for i, x := range bad {
		if _, err := ParseMessage(x); !errors.Is(err, ErrAuth) {
			t.Errorf("bad message %d: %v, want ErrAuth", i, err)
		}
	}
}

func FuzzParseMessage(f *testing.F) {
	f.Add(AppendMessage(nil, KindProof, [32]byte{}))
	f.Add(AppendMessage(nil, KindRefuse, [32]byte{ReasonBadProof}))
	f.Add([]byte("CNCA"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMessage(b)
		if err != nil {
			return
		}
		// Whatever parses re-encodes to the same bytes.
		if got := AppendMessage(nil, m.Kind, m.Body); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding %x gives %x", b, got)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); !errors.Is(err, ErrWeakSecret) {
		t.Fatalf("zero Config: %v, want ErrWeakSecret", err)
	}
	c := Config{Secret: make([]byte, 32), CAFile: "ca.pem"}
	if err := c.Validate(); err == nil {
		t.Fatal("CAFile without CertFile and KeyFile: no error")
	}
	srv, cli, err := Config{Secret: make([]byte, 32)}.TLS("x")
	if err != nil || len(srv.Certificates) != 1 || cli.MinVersion != 0x0304 {
		t.Fatalf("TLS() = %v, %v, %v", srv, cli, err)
	}
}
