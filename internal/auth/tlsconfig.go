package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"os"
	"time"
)

// Config says how an end authenticates. Its zero value is invalid: a run secret is always required.
type Config struct {
	// Secret is the run secret every peer and the master share: at least MinSecretLen random bytes
	// (see the package documentation). Required.
	Secret []byte
	// CAFile names a PEM file with the run's CA certificate. When set, both ends present a certificate
	// that this CA issued (CertFile, KeyFile) and refuse any other, in addition to proving the secret.
	// Default empty: each end presents an ephemeral self-signed certificate, and authentication rests
	// on the secret alone.
	CAFile string
	// CertFile and KeyFile name the PEM certificate issued by the run's CA and its private key.
	// Required with CAFile, ignored without it.
	CertFile, KeyFile string
}

// Validate reports the first field of c that holds an impossible value.
func (c Config) Validate() error {
	if err := CheckSecret(c.Secret); err != nil {
		return fmt.Errorf("auth config: Secret: %w", err)
	}
	if c.CAFile != "" && (c.CertFile == "" || c.KeyFile == "") {
		return errors.New("auth config: CAFile is set, so CertFile and KeyFile are required")
	}
	return nil
}

// TLS returns the TLS configurations of the listening (server) and dialling (client) ends, both
// TLS 1.3 only and offering the application protocol proto. Without a CA it generates one
// ephemeral self-signed certificate, used by the server end.
func (c Config) TLS(proto string) (server, client *tls.Config, err error) {
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	server = &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{proto}}
	// Without a CA the certificate proves nothing: the proof of the secret, bound to the session,
	// authenticates the server. The client therefore skips verification here and checks the proof.
	client = &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{proto}, InsecureSkipVerify: true}
	if c.CAFile == "" {
		cert, err := selfSigned()
		if err != nil {
			return nil, nil, err
		}
		server.Certificates = []tls.Certificate{cert}
		return server, client, nil
	}
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, nil, fmt.Errorf("auth config: CAFile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("auth config: CAFile %s: no PEM certificate in it", c.CAFile)
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("auth config: CertFile/KeyFile: %w", err)
	}
	verify := verifyByCA(pool)
	server.Certificates = []tls.Certificate{cert}
	server.ClientAuth = tls.RequireAnyClientCert
	server.VerifyConnection = verify
	client.Certificates = []tls.Certificate{cert}
	client.VerifyConnection = verify
	return server, client, nil
}

// verifyByCA checks that the peer's certificate chains to the run's CA. Peers are addressed by IP and
// move between runs, so no name is checked: the CA issues certificates to members of the run only.
func verifyByCA(pool *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: the other end presented no certificate", ErrAuth)
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
		})
		if err != nil {
			return fmt.Errorf("%w: certificate not issued by the run's CA: %v", ErrAuth, err)
		}
		return nil
	}
}

// selfSigned makes an ephemeral ECDSA P-256 certificate valid for a year.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("ephemeral certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("ephemeral certificate: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "concord ephemeral"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("ephemeral certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
