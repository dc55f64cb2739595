package transport

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testCA is a certificate authority made for a test, which writes PEM files into dir.
type testCA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA certificate's PEM file
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{dir: dir, cert: cert, key: key, file: filepath.Join(dir, name+"-ca.pem")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue makes a certificate for a member and returns its certificate and key files.
func (ca *testCA) issue(t *testing.T, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestAuthRunCA checks the run CA mode: members with certificates from the run's CA connect; an end
// with the right secret but a certificate from another CA is refused with ErrAuth, and the listener
// goes on serving.
func TestAuthRunCA(t *testing.T) {
	dir := t.TempDir()
	run, rogue := newTestCA(t, dir, "run"), newTestCA(t, dir, "rogue")
	srvCert, srvKey := run.issue(t, "master")
	cliCert, cliKey := run.issue(t, "peer")
	badCert, badKey := rogue.issue(t, "intruder")
	member := func(cert, key string) AuthConfig {
		return AuthConfig{Secret: testSecret, CAFile: run.file, CertFile: cert, KeyFile: key}
	}
	intruder := AuthConfig{Secret: testSecret, CAFile: rogue.file, CertFile: badCert, KeyFile: badKey}
	kinds := map[string]func(AuthConfig, func(net.Addr, error)) Transport{
		"tls": func(a AuthConfig, on func(net.Addr, error)) Transport {
			return NewTLS(TLSConfig{Auth: a, OnRefused: on})
		},
		"quic": func(a AuthConfig, on func(net.Addr, error)) Transport {
			return NewQUIC(QUICConfig{Auth: a, OnRefused: on})
		},
	}
	for name, mk := range kinds {
		t.Run(name, func(t *testing.T) {
			r := newRefusals()
			addr := serveOne(t, mk(member(srvCert, srvKey), r.add))
			c, err := mk(member(cliCert, cliKey), nil).Dial(context.Background(), addr)
			if err != nil {
				t.Fatalf("Dial by a member: %v", err)
			}
			c.Write([]byte("ping"))
			if got, err := readN(c, 4); err != nil || string(got) != "ping" {
				t.Fatalf("echo = %q, %v", got, err)
			}
			c.Close()
			if _, err := mk(intruder, nil).Dial(context.Background(), addr); !errors.Is(err, ErrAuth) {
				t.Fatalf("Dial with a certificate of another CA: %v, want ErrAuth", err)
			}
			// quic-go completes the TLS handshake before it hands a connection over, so only the TLS
			// listener sees, and reports, a refused certificate.
			if name == "tls" {
				if err := r.wait(t); !errors.Is(err, ErrAuth) {
					t.Fatalf("listener reported %v, want ErrAuth", err)
				}
			}
			checkGood(t, authKind{name, func([]byte, func(net.Addr, error)) Transport {
				return mk(member(cliCert, cliKey), nil)
			}}, addr)
		})
	}
}
