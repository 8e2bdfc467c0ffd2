// Package redact keeps secrets out of every output: Text masks what looks
// like a secret wherever it stands (the one masking every message goes
// through), and a Set's Writer also replaces each registered secret value
// before the bytes reach a terminal or a log file.
package redact

import (
	"bytes"
	"io"
	"sync"
)

// Mask replaces a secret in output.
const Mask = "[REDACTED]"

// Set is a list of secret values to hide. The zero value is ready to use and
// safe for concurrent use.
type Set struct {
	mu      sync.RWMutex
	secrets [][]byte
}

// Add registers a secret. Values shorter than 4 bytes are ignored: masking
// them would mangle ordinary text without protecting anything.
func (s *Set) Add(secret string) {
	if len(secret) < 4 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.secrets {
		if string(b) == secret {
			return
		}
	}
	s.secrets = append(s.secrets, []byte(secret))
}

// String returns in with every registered secret masked.
func (s *Set) String(in string) string { return string(s.Bytes([]byte(in))) }

// Bytes returns p with every registered secret and every secret Text
// recognises by its shape masked (p itself is not changed).
func (s *Set) Bytes(p []byte) []byte {
	s.mu.RLock()
	out := p
	for _, sec := range s.secrets {
		if bytes.Contains(out, sec) {
			out = bytes.ReplaceAll(out, sec, []byte(Mask))
		}
	}
	s.mu.RUnlock()
	if masked := Text(string(out)); masked != string(out) {
		return []byte(masked)
	}
	return out
}

// Writer wraps w so everything written through it is masked. zerolog writes
// one event per Write call, so a secret never straddles two calls.
func (s *Set) Writer(w io.Writer) io.Writer { return &writer{set: s, w: w} }

type writer struct {
	set *Set
	w   io.Writer
}

func (w *writer) Write(p []byte) (int, error) {
	if _, err := w.w.Write(w.set.Bytes(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}
