package auth

import (
	"bytes"
	"errors"
	"fmt"
	"os"
)

// LoadSecret returns the run secret given either as value or in the file named path (one of them, not
// both; a trailing newline in the file is dropped). With neither it returns nil, nil. The secret is
// checked with CheckSecret.
func LoadSecret(value, path string) ([]byte, error) {
	switch {
	case value != "" && path != "":
		return nil, errors.New("the run secret is given both directly and as a file: give one")
	case value == "" && path == "":
		return nil, nil
	}
	secret := []byte(value)
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("run secret file: %w", err)
		}
		secret = bytes.TrimRight(b, "\r\n")
	}
	if err := CheckSecret(secret); err != nil {
		return nil, err
	}
	return secret, nil
}
