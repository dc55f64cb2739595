// Package auth proves, over a fresh TLS 1.3 session, that both ends hold the run secret.
//
// crypto/tls has no external pre-shared keys, so Concord authenticates on top of an ordinary
// handshake. Each end presents a certificate (an ephemeral self-signed one by default, or one issued
// by the run's CA), and once the handshake is done each end sends a proof:
//
//	ekm   = TLS exporter, label "EXPORTER-concord-auth-v1", no context, 32 bytes
//	proof = HMAC-SHA256(secret, role || ekm), role = "concord client" or "concord server"
//
// The dialling end speaks first; the listening end checks the proof and answers with its own (or a
// refusal); the dialling end checks that. The exporter is unique to one handshake, so a proof
// recorded on one connection is worthless on another (no replay), and a relay that terminates TLS on
// both sides sees two different exporters and cannot forward a proof that verifies (no relay). The
// role labels keep a listener's proof from being reflected back to it as a dialler's.
//
// # Strength of the secret
//
// Whoever completes a handshake with an honest end learns one proof and the exporter it covers, and
// can then guess secrets offline at the speed of HMAC-SHA256. The secret must therefore carry at
// least 128 bits of entropy: 16 random bytes or more, for example `openssl rand -hex 32`. Secrets
// shorter than MinSecretLen bytes are refused ([ErrWeakSecret]); no check can tell a long but
// guessable secret from a random one, so do not use passwords.
//
// # Messages
//
// Both proofs and refusals are fixed-size messages of MessageSize bytes: the magic "CNCA", a version
// byte (1), a kind byte (proof or refusal) and 32 bytes of body (the HMAC, or for a refusal the reason
// code followed by zeros). [ParseMessage] decodes one; it is fuzzed.
package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
)

// MinSecretLen is the shortest run secret accepted, in bytes (128 bits).
const MinSecretLen = 16

// ExporterLabel is the TLS exporter label the proofs are computed over.
const ExporterLabel = "EXPORTER-concord-auth-v1"

// Role labels, mixed into the proof so that one end's proof never verifies as the other's.
const (
	ClientLabel = "concord client"
	ServerLabel = "concord server"
)

// Errors that callers may test for with errors.Is.
var (
	// ErrAuth means the other end could not prove that it holds the run secret (a wrong secret, none
	// at all, a replayed or relayed proof, or a certificate the run's CA did not issue), or refused
	// this end's proof.
	ErrAuth = errors.New("authentication failed")
	// ErrPlaintext means the other end does not speak TLS: a plaintext client on a TLS port, or a TLS
	// client dialling a plaintext port.
	ErrPlaintext = errors.New("the other end does not speak TLS")
	// ErrWeakSecret means the run secret is missing or shorter than MinSecretLen bytes.
	ErrWeakSecret = errors.New("run secret too short")
)

// Role says which end of a connection computes a proof.
type Role uint8

// The two roles.
const (
	Client Role = iota + 1 // the end that dialled
	Server                 // the end that listened
)

func (r Role) label() string {
	if r == Client {
		return ClientLabel
	}
	return ServerLabel
}

// CheckSecret reports whether secret is long enough to be a run secret.
func CheckSecret(secret []byte) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("%w: %d bytes, need at least %d (128 bits of entropy, e.g. `openssl rand -hex 32`)",
			ErrWeakSecret, len(secret), MinSecretLen)
	}
	return nil
}

// Exporter returns the keying material that the proofs of the session with state cs cover.
func Exporter(cs tls.ConnectionState) ([]byte, error) {
	if cs.Version != tls.VersionTLS13 {
		return nil, fmt.Errorf("%w: TLS version %#x, want 1.3", ErrAuth, cs.Version)
	}
	ekm, err := cs.ExportKeyingMaterial(ExporterLabel, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("tls exporter: %w", err)
	}
	return ekm, nil
}

// Proof returns the proof that the end with role holds secret, bound to the session whose exporter
// output is ekm.
func Proof(secret, ekm []byte, role Role) [32]byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(role.label()))
	m.Write(ekm)
	var p [32]byte
	m.Sum(p[:0])
	return p
}

// Message kinds.
const (
	KindProof  = 1 // body: the proof
	KindRefuse = 2 // body: a reason code, then zeros
)

// Reasons a listener gives in a refusal.
const (
	ReasonBadProof = 1 // the dialler's proof did not verify
)

// MessageSize is the size of every authentication message, in bytes.
const MessageSize = 4 + 1 + 1 + 32

const (
	magic   = "CNCA"
	version = 1
)

// Message is one decoded authentication message.
type Message struct {
	Kind   uint8
	Body   [32]byte
	Reason uint8 // for KindRefuse: Body[0]
}

// AppendMessage appends the encoding of a message of kind with body to b.
func AppendMessage(b []byte, kind uint8, body [32]byte) []byte {
	b = append(b, magic...)
	b = append(b, version, kind)
	return append(b, body[:]...)
}

// ParseMessage decodes one message from b, which must hold exactly MessageSize bytes.
func ParseMessage(b []byte) (Message, error) {
	if len(b) != MessageSize {
		return Message{}, fmt.Errorf("%w: message of %d bytes, want %d", ErrAuth, len(b), MessageSize)
	}
	if string(b[:4]) != magic {
		return Message{}, fmt.Errorf("%w: not an authentication message (magic %q)", ErrAuth, b[:4])
	}
	if b[4] != version {
		return Message{}, fmt.Errorf("%w: authentication version %d, want %d", ErrAuth, b[4], version)
	}
	m := Message{Kind: b[5]}
	copy(m.Body[:], b[6:])
	switch m.Kind {
	case KindProof:
	case KindRefuse:
		m.Reason = m.Body[0]
	default:
		return Message{}, fmt.Errorf("%w: message kind %d", ErrAuth, m.Kind)
	}
	return m, nil
}

// readMessage reads one message from r.
func readMessage(r io.Reader) (Message, error) {
	var buf [MessageSize]byte
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return Message{}, fmt.Errorf("%w: the other end hung up before proving the run secret", ErrAuth)
		}
		return Message{}, err
	}
	return ParseMessage(buf[:])
}

// refusal describes a refusal received from a listener.
func refusal(reason uint8) error {
	switch reason {
	case ReasonBadProof:
		return fmt.Errorf("%w: the listener refused our proof: the run secrets differ", ErrAuth)
	}
	return fmt.Errorf("%w: the listener refused (reason %d)", ErrAuth, reason)
}

// Dial runs the dialling end of the exchange over rw, the first stream of the session whose TLS state
// is cs: it sends its proof and checks the listener's answer.
func Dial(rw io.ReadWriter, cs tls.ConnectionState, secret []byte) error {
	ekm, err := Exporter(cs)
	if err != nil {
		return err
	}
	if _, err := rw.Write(AppendMessage(nil, KindProof, Proof(secret, ekm, Client))); err != nil {
		return fmt.Errorf("send proof: %w", err)
	}
	m, err := readMessage(rw)
	if err != nil {
		return err
	}
	if m.Kind == KindRefuse {
		return refusal(m.Reason)
	}
	want := Proof(secret, ekm, Server)
	if !hmac.Equal(m.Body[:], want[:]) {
		return fmt.Errorf("%w: the listener's proof is wrong: it does not hold the run secret, or a relay sits in between", ErrAuth)
	}
	return nil
}

// Accept runs the listening end of the exchange over rw: it reads the dialler's proof and, when it
// verifies, answers with its own. A proof that fails is answered with a refusal, so that the dialler
// learns the cause, and Accept returns an error wrapping ErrAuth.
func Accept(rw io.ReadWriter, cs tls.ConnectionState, secret []byte) error {
	ekm, err := Exporter(cs)
	if err != nil {
		return err
	}
	m, err := readMessage(rw)
	if err != nil {
		return err
	}
	want := Proof(secret, ekm, Client)
	if m.Kind != KindProof || !hmac.Equal(m.Body[:], want[:]) {
		rw.Write(AppendMessage(nil, KindRefuse, [32]byte{ReasonBadProof}))
		return fmt.Errorf("%w: the dialler's proof does not verify: a wrong run secret, or a proof replayed from another session", ErrAuth)
	}
	if _, err := rw.Write(AppendMessage(nil, KindProof, Proof(secret, ekm, Server))); err != nil {
		return fmt.Errorf("send proof: %w", err)
	}
	return nil
}
