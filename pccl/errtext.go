package pccl

import "strings"

// prefix starts the text of every error this package returns, once.
const prefix = "pccl: "

// cleanError returns err with a text that names the package once: errors are wrapped with context at
// several layers ("pccl: allreduce tag 3: " around "pccl: a peer left: ..."), and each sentinel names
// the package too. errors.Is and errors.As see through it to err. Nil stays nil.
func cleanError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*publicError); ok {
		return err
	}
	return &publicError{err: err}
}

// publicError is an error as the API returns it; see cleanError.
type publicError struct{ err error }

func (e *publicError) Error() string { return onePrefix(e.err.Error()) }

func (e *publicError) Unwrap() error { return e.err }

// onePrefix drops every "pccl: " of s that starts a part of the message (after ": ", "; ", a newline
// or at the start), but the very first.
func onePrefix(s string) string {
	body := s
	for strings.HasPrefix(body, prefix) {
		body = body[len(prefix):]
	}
	for _, sep := range []string{": ", "; ", "\n"} {
		for strings.Contains(body, sep+prefix) {
			body = strings.ReplaceAll(body, sep+prefix, sep)
		}
	}
	return prefix + body
}
